"""Tests for heatinv.render: colormaps, tile layout and atomic PNG writing."""

import os

import numpy as np
import pytest
import tensorflow as tf

from heatinv import atomic, render


def test_zero_is_white_max_is_red_min_is_blue():
    heatmap = np.array([[0.0, 2.0, -2.0]])
    rgb = render.diverging_rgb(heatmap)
    assert rgb.dtype == np.uint8 and rgb.shape == (1, 3, 3)
    assert rgb[0, 0].tolist() == [255, 255, 255]
    red, blue = rgb[0, 1], rgb[0, 2]
    assert red[0] == 255 and red[1] < 30 and red[2] < 30
    assert blue[2] == 255 and blue[0] < 30 and blue[1] < 30


def test_colormap_is_symmetric_around_zero():
    values = np.linspace(-3.0, 3.0, 61)[None, :]
    rgb = render.diverging_rgb(values).astype(int)
    mirrored = render.diverging_rgb(-values).astype(int)
    # Flipping the sign swaps the red and blue channels, green unchanged.
    np.testing.assert_array_equal(rgb[..., 0], mirrored[..., 2])
    np.testing.assert_array_equal(rgb[..., 1], mirrored[..., 1])
    np.testing.assert_array_equal(rgb[..., 2], mirrored[..., 0])


def test_colormap_is_monotone_in_magnitude():
    values = np.linspace(0.0, 1.0, 11)[None, :]
    green = render.diverging_rgb(values, vmax=1.0)[0, :, 1].astype(int)
    assert np.all(np.diff(green) < 0)


def test_default_vmax_is_largest_magnitude():
    heatmap = np.array([[0.5, -4.0]])
    rgb = render.diverging_rgb(heatmap)
    assert rgb[0, 1].tolist() == [0, 0, 255]
    assert rgb[0, 0, 0] == 255 and rgb[0, 0, 1] > 200


def test_explicit_vmax_saturates_beyond_it():
    rgb = render.diverging_rgb(np.array([[5.0, 0.5]]), vmax=1.0)
    assert rgb[0, 0].tolist() == [255, 0, 0]
    assert rgb[0, 1].tolist() == [255, 128, 128]


def test_all_zero_map_is_white_and_accepts_channel_axis():
    rgb = render.diverging_rgb(np.zeros((28, 28, 1)))
    assert rgb.shape == (28, 28, 3)
    assert np.all(rgb == 255)


def test_non_finite_pixels_are_black_and_do_not_set_the_scale():
    rgb = render.diverging_rgb(np.array([[np.nan, np.inf, 1.0]]))
    assert rgb[0, 0].tolist() == [0, 0, 0]
    assert rgb[0, 1].tolist() == [0, 0, 0]
    assert rgb[0, 2].tolist() == [255, 0, 0]


@pytest.mark.parametrize("vmax", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_vmax_is_refused(vmax):
    with pytest.raises(ValueError, match="vmax"):
        render.diverging_rgb(np.ones((2, 2)), vmax=vmax)


def test_batched_heatmap_is_refused():
    with pytest.raises(ValueError, match=r"\(4, 28, 28, 1\)"):
        render.diverging_rgb(np.zeros((4, 28, 28, 1)))


def test_grayscale():
    image = np.array([[0.0, 0.5, 1.0, 2.0]])
    rgb = render.grayscale_rgb(image)
    assert rgb.dtype == np.uint8 and rgb.shape == (1, 4, 3)
    assert rgb[0, :, 0].tolist() == [0, 128, 255, 255]
    assert np.all(rgb[..., 0] == rgb[..., 1]) and np.all(rgb[..., 1] == rgb[..., 2])
    assert render.grayscale_rgb(image[..., None], invert=True)[0, :, 0].tolist() == [255, 128, 0, 0]


def test_panel_shape_scaling_and_gaps():
    a = np.zeros((2, 3, 3), np.uint8)
    b = np.full((2, 3, 3), 100, np.uint8)
    out = render.panel([a, b, a], scale=2, gap=1)
    assert out.shape == (4, 3 * 6 + 2 * 1, 3) and out.dtype == np.uint8
    assert np.all(out[:, :6] == 0)
    assert np.all(out[:, 6] == 255)  # gap column
    assert np.all(out[:, 7:13] == 100)
    assert np.all(out[:, 13] == 255)


def test_panel_upscaling_is_nearest_neighbour():
    tile = np.zeros((2, 2, 3), np.uint8)
    tile[0, 1] = [10, 20, 30]
    out = render.panel([tile], scale=3, gap=5)
    assert out.shape == (6, 6, 3)
    assert np.all(out[:3, 3:] == [10, 20, 30])
    assert np.all(out[3:, :] == 0) and np.all(out[:3, :3] == 0)


def test_grid_stacks_rows_and_pads_short_rows_white():
    tile = np.zeros((28, 28, 3), np.uint8)
    out = render.grid([[tile, tile, tile], [tile]], scale=1, gap=2)
    assert out.shape == (28 * 2 + 2, 28 * 3 + 2 * 2, 3)
    assert np.all(out[28:30] == 255)  # gap row
    assert np.all(out[30:, 28:] == 255)  # padding of the short row
    assert np.all(out[30:, :28] == 0)


def test_layout_errors():
    tile = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match=r"tile \[0\]\[1\]"):
        render.panel([tile, np.zeros((5, 4, 3), np.uint8)])
    with pytest.raises(ValueError, match="uint8"):
        render.panel([tile.astype(np.float32)])
    with pytest.raises(ValueError, match="empty"):
        render.panel([])
    with pytest.raises(ValueError, match="scale"):
        render.panel([tile], scale=0)
    with pytest.raises(ValueError, match="gap"):
        render.panel([tile], gap=-1)


def test_write_png_round_trip_and_no_temp_files(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, size=(10, 7, 3), dtype=np.uint8)
    path = tmp_path / "nested" / "figure.png"
    render.write_png(str(path), rgb)
    decoded = tf.io.decode_png(path.read_bytes()).numpy()
    np.testing.assert_array_equal(decoded, rgb)
    assert os.listdir(path.parent) == ["figure.png"]


def test_write_png_replaces_existing_file(tmp_path):
    path = tmp_path / "figure.png"
    render.write_png(str(path), np.zeros((2, 2, 3), np.uint8))
    render.write_png(str(path), np.full((3, 3, 3), 9, np.uint8))
    assert tf.io.decode_png(path.read_bytes()).numpy().shape == (3, 3, 3)
    assert os.listdir(tmp_path) == ["figure.png"]


def test_write_png_uses_normal_permissions(tmp_path):
    path = tmp_path / "figure.png"
    render.write_png(str(path), np.zeros((2, 2, 3), np.uint8))
    mask = os.umask(0)
    os.umask(mask)
    assert (path.stat().st_mode & 0o777) == (0o666 & ~mask)


def test_write_png_refuses_bad_arrays_and_leaves_nothing(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        render.write_png(str(tmp_path / "x.png"), np.zeros((2, 2, 3), np.float32))
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        render.write_png(str(tmp_path / "x.png"), np.zeros((2, 2), np.uint8))
    assert os.listdir(tmp_path) == []


def test_write_png_cleans_up_when_the_rename_fails(tmp_path, monkeypatch):
    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        render.write_png(str(tmp_path / "x.png"), np.zeros((2, 2, 3), np.uint8))
    assert os.listdir(tmp_path) == []
