"""Tests for heatinv.maps_io: safe loading of user-supplied maps."""

import re

import numpy as np
import pytest
import tensorflow as tf

from heatinv import maps_io


def _save_npy(path, array, **kwargs):
    with open(path, "wb") as handle:
        np.save(handle, array, **kwargs)
    return str(path)


def _save_png(path, pixels):
    path.write_bytes(tf.io.encode_png(pixels).numpy())
    return str(path)


# --- .npy ----------------------------------------------------------------------


def test_npy_round_trip_keeps_sign_and_scale(tmp_path):
    heatmap = np.random.default_rng(0).normal(size=(28, 28, 1)) * 1e-3
    got = maps_io.read_map(_save_npy(tmp_path / "h.npy", heatmap))
    assert got.dtype == np.float32 and got.shape == (28, 28, 1)
    np.testing.assert_allclose(got, heatmap, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.float64, np.bool_])
def test_npy_numeric_dtypes_become_float32(tmp_path, dtype):
    got = maps_io.read_map(_save_npy(tmp_path / "h.npy", np.ones((3, 3), dtype)))
    assert got.dtype == np.float32 and np.all(got == 1.0)


@pytest.mark.parametrize(
    "shape", [(28, 28, 1), (28, 28), (1, 28, 28, 1), (1, 28, 28), (784,), (1, 784), (784, 1)]
)
def test_npy_shapes_that_fit_are_reshaped(tmp_path, shape):
    values = np.arange(784, dtype=np.float32)
    got = maps_io.read_map(_save_npy(tmp_path / "h.npy", values.reshape(shape)), expected_shape=(28, 28, 1))
    assert got.shape == (28, 28, 1)
    # Row-major order is preserved whichever layout was saved.
    np.testing.assert_array_equal(got.ravel(), values)


def test_image_shaped_array_fits_a_flat_expected_shape(tmp_path):
    got = maps_io.read_map(_save_npy(tmp_path / "h.npy", np.zeros((28, 28))), expected_shape=(784,))
    assert got.shape == (784,)


@pytest.mark.parametrize("shape", [(28, 28, 3), (14, 56), (2, 28, 28, 1), (783,)])
def test_npy_shapes_that_do_not_fit_are_refused(tmp_path, shape):
    path = _save_npy(tmp_path / "h.npy", np.zeros(shape))
    with pytest.raises(ValueError) as info:
        maps_io.read_map(path, expected_shape=(28, 28, 1))
    message = str(info.value)
    assert "h.npy" in message and str(shape) in message and "(28, 28, 1)" in message


def test_object_array_is_refused_for_safety(tmp_path):
    path = _save_npy(tmp_path / "h.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError) as info:
        maps_io.read_map(path)
    message = str(info.value)
    assert "h.npy" in message and "refused for safety" in message and "np.save" in message


NON_NUMERIC = [np.array(["a", "b"]), np.array([1 + 2j]), np.zeros(2, dtype="datetime64[s]")]


@pytest.mark.parametrize("array", NON_NUMERIC)
def test_non_numeric_dtype_is_refused(tmp_path, array):
    path = _save_npy(tmp_path / "h.npy", array)
    with pytest.raises(ValueError, match=re.escape(f"has dtype {array.dtype}")):
        maps_io.read_map(path)


def test_nan_and_inf_are_counted(tmp_path):
    path = _save_npy(tmp_path / "h.npy", np.array([np.nan, 1.0, np.inf, -np.inf]))
    with pytest.raises(ValueError, match="contains 3 NaN or infinite") as info:
        maps_io.read_map(path, what="target.path")
    assert "h.npy" in str(info.value) and "target.path" in str(info.value)


def test_corrupt_npy_is_a_value_error(tmp_path):
    path = tmp_path / "h.npy"
    path.write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(ValueError, match="could not be read as a .npy"):
        maps_io.read_map(str(path))


def test_npz_archive_named_npy_is_refused(tmp_path):
    path = tmp_path / "h.npy"
    with open(path, "wb") as handle:
        np.savez(handle, a=np.zeros(3))
    with pytest.raises(ValueError, match=".npz archive"):
        maps_io.read_map(str(path))


# --- .png ----------------------------------------------------------------------


def test_grayscale_png_is_scaled_to_unit_range(tmp_path):
    pixels = np.array([[0, 51, 255]], np.uint8)[..., None]
    got = maps_io.read_map(_save_png(tmp_path / "g.png", pixels))
    assert got.dtype == np.float32 and got.shape == (1, 3, 1)
    np.testing.assert_allclose(got[0, :, 0], [0.0, 0.2, 1.0], atol=1e-6)


def test_sixteen_bit_png(tmp_path):
    pixels = tf.constant([[[0], [32768], [65535]]], tf.uint16)
    got = maps_io.read_map(_save_png(tmp_path / "g.png", pixels))
    np.testing.assert_allclose(got[0, :, 0], [0.0, 32768 / 65535, 1.0], atol=1e-6)


def test_rgb_png_uses_luminance(tmp_path):
    pixels = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255]]], np.uint8)
    got = maps_io.read_map(_save_png(tmp_path / "c.png", pixels))
    np.testing.assert_allclose(got[0, :, 0], [0.299, 0.587, 0.114, 1.0], atol=1e-6)
    # TF's weights start 0.2989 (white -> 0.9999); ours sum to exactly 1.
    expected = tf.image.rgb_to_grayscale(pixels.astype(np.float32) / 255.0).numpy()
    np.testing.assert_allclose(got, expected, atol=2e-4)


def test_rgba_and_gray_alpha_png_drop_alpha(tmp_path):
    rgba = np.array([[[255, 255, 255, 0], [0, 0, 0, 255]]], np.uint8)
    got = maps_io.read_map(_save_png(tmp_path / "a.png", rgba))
    np.testing.assert_allclose(got[0, :, 0], [1.0, 0.0], atol=1e-6)
    gray_alpha = np.array([[[128, 0], [255, 10]]], np.uint8)
    got = maps_io.read_map(_save_png(tmp_path / "ga.png", gray_alpha))
    np.testing.assert_allclose(got[0, :, 0], [128 / 255, 1.0], atol=1e-6)


def test_colour_png_heatmap_is_luminance_even_for_a_three_channel_shape(tmp_path):
    """Only a model input (image=True) keeps a PNG's colours; as a heatmap it is [H, W, 1] luminance, which a
    3-channel expected shape refuses rather than taking a rendered heatmap's colours for per-channel relevance."""
    pixels = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [200, 100, 50]]], np.uint8)
    path = _save_png(tmp_path / "c.png", pixels)
    with pytest.raises(ValueError, match=r"has shape \(1, 4, 1\), expected \(1, 4, 3\)"):
        maps_io.read_map(path, expected_shape=(1, 4, 3))
    luminance = pixels.astype(np.float64) @ np.array([0.299, 0.587, 0.114]) / 255
    np.testing.assert_allclose(maps_io.read_map(path, expected_shape=(1, 4, 1))[..., 0], luminance, atol=1e-6)
    np.testing.assert_allclose(maps_io.read_map(path, expected_shape=(1, 4, 3), image=True), pixels / 255, atol=1e-6)


def test_png_with_expected_shape(tmp_path):
    pixels = np.zeros((28, 28, 3), np.uint8)
    got = maps_io.read_map(_save_png(tmp_path / "c.png", pixels), expected_shape=(1, 28, 28, 1))
    assert got.shape == (1, 28, 28, 1)
    with pytest.raises(ValueError, match=r"\(28, 28, 1\), expected \(32, 32, 1\)"):
        maps_io.read_map(str(tmp_path / "c.png"), expected_shape=(32, 32, 1))


def test_upper_case_extension(tmp_path):
    got = maps_io.read_map(_save_png(tmp_path / "G.PNG", np.zeros((2, 2, 1), np.uint8)))
    assert got.shape == (2, 2, 1)


def test_corrupt_png_is_a_value_error(tmp_path):
    path = tmp_path / "g.png"
    path.write_bytes(b"not a png")
    with pytest.raises(ValueError, match="could not be read as a .png") as info:
        maps_io.read_map(str(path), what="target.path")
    assert "g.png" in str(info.value)


# --- other errors ------------------------------------------------------------------


def test_missing_file_names_path_and_config_key(tmp_path):
    path = str(tmp_path / "nope.npy")
    with pytest.raises(FileNotFoundError) as info:
        maps_io.read_map(path, what="target.path")
    message = str(info.value)
    assert path in message and "target.path" in message


def test_missing_file_without_config_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.png"):
        maps_io.read_map(str(tmp_path / "nope.png"))


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        maps_io.read_map(str(tmp_path))


@pytest.mark.parametrize("name", ["h.txt", "h.jpg", "h"])
def test_unsupported_extension_lists_supported(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"0")
    with pytest.raises(ValueError, match=r"\['.npy', '.png'\]") as info:
        maps_io.read_map(str(path))
    assert name in str(info.value)


@pytest.mark.parametrize("expected_shape", [(), (28, 0), (28, -1), (28.0, 28)])
def test_bad_expected_shape(tmp_path, expected_shape):
    path = _save_npy(tmp_path / "h.npy", np.zeros((28, 28)))
    with pytest.raises(ValueError, match="expected_shape"):
        maps_io.read_map(path, expected_shape=expected_shape)


def test_fit_shape_directly():
    assert maps_io.fit_shape(np.zeros((1, 5, 1)), (5,)).shape == (5,)
    with pytest.raises(ValueError, match="the array has shape"):
        maps_io.fit_shape(np.zeros((2, 3)), (3, 2))


def test_a_map_of_another_shape_is_told_the_shape_to_save():
    """The fix named a single-channel [1, 28, 28, 1] batch whatever the expected shape (an RGB image's, say)."""
    with pytest.raises(ValueError, match=r"Save it at the model's input resolution, \(24, 24, 3\) \(e\.g\. the first entry of a \[1, 24, 24, 3\] batch\)"):
        maps_io.fit_shape(np.zeros((28, 28)), (24, 24, 3))
