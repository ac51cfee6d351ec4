"""Tests for heatinv.data: bundled digits, local MNIST files, index lookup."""

import os

import numpy as np
import pytest

from heatinv import data
from heatinv.data.digits import _upsample_bilinear


@pytest.fixture(scope="module")
def digits():
    return data.load_digits()


def _write_fake_mnist(path, n_train=6, n_test=4, **overrides):
    rng = np.random.default_rng(1)
    arrays = {
        "x_train": rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        "y_train": np.arange(n_train, dtype=np.uint8) % 10,
        "x_test": rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        "y_test": np.arange(n_test, dtype=np.uint8) % 10,
    }
    arrays.update(overrides)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    np.savez(path, **arrays)
    return arrays


# --- load_digits -----------------------------------------------------------


def test_digits_shapes_dtypes_and_range(digits):
    assert digits.name == "digits"
    assert digits.num_classes == 10
    assert digits.x_train.shape == (1347, 28, 28, 1)
    assert digits.x_test.shape == (450, 28, 28, 1)
    assert digits.y_train.shape == (1347,)
    assert digits.y_test.shape == (450,)
    assert digits.x_train.dtype == np.float32 and digits.x_test.dtype == np.float32
    assert digits.y_train.dtype == np.int64 and digits.y_test.dtype == np.int64
    for x in (digits.x_train, digits.x_test):
        assert x.min() == 0.0 and x.max() == 1.0


def test_digits_split_is_stratified_and_covers_all_images(digits):
    train_counts = np.bincount(digits.y_train, minlength=10)
    test_counts = np.bincount(digits.y_test, minlength=10)
    assert train_counts.sum() + test_counts.sum() == 1797
    fractions = test_counts / (train_counts + test_counts)
    assert np.all(np.abs(fractions - 0.25) < 0.01)


def test_digits_train_and_test_do_not_overlap(digits):
    train = {x.tobytes() for x in digits.x_train}
    assert not any(x.tobytes() in train for x in digits.x_test)


def test_digits_deterministic_and_independent_of_global_seed(digits):
    np.random.seed(123)
    again = data.load_digits()
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(again, key), getattr(digits, key))


def test_digits_fill_a_centred_20x20_box_like_mnist(digits):
    mass = digits.x_train[..., 0].sum(axis=0)
    rows, cols = np.nonzero(mass)
    assert rows.min() >= 4 and rows.max() <= 23
    assert cols.min() >= 4 and cols.max() <= 23
    # Strokes reach close to the box edges, so the digit fills the frame.
    assert rows.max() - rows.min() >= 17 and cols.max() - cols.min() >= 17


def test_digits_upsampling_matches_tf_bilinear_resize():
    import tensorflow as tf

    images = np.random.default_rng(0).uniform(size=(3, 8, 8)).astype(np.float32)
    ours = _upsample_bilinear(images, 20)
    theirs = tf.image.resize(images[..., None], (20, 20), method="bilinear").numpy()[..., 0]
    np.testing.assert_allclose(ours, np.clip(theirs, 0, 1), atol=1e-5)


def test_digits_are_sklearns_images_over_16_resized_like_tf_with_their_labels(digits):
    """Each image is scikit-learn's 8x8 digit / 16 (values 0..16), TF-bilinear-resized to 20x20 and centred in 28x28."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    raw = load_digits()
    resized = tf.image.resize(raw.images[..., None] / 16.0, (20, 20), method="bilinear").numpy()
    expected = np.pad(np.clip(resized, 0, 1), ((0, 0), (4, 4), (4, 4), (0, 0))).reshape(len(raw.images), -1)
    ours = np.concatenate([digits.x_train, digits.x_test]).reshape(len(expected), -1).astype(np.float64)
    labels = np.concatenate([digits.y_train, digits.y_test])
    # Nearest expected image of each loaded one, by squared distance.
    distance = (ours**2).sum(1)[:, None] + (expected**2).sum(1)[None, :] - 2 * ours @ expected.T
    nearest = distance.argmin(axis=1)
    np.testing.assert_allclose(ours, expected[nearest], atol=1e-5)
    np.testing.assert_array_equal(labels, raw.target[nearest])
    assert len(set(nearest.tolist())) >= 1790  # (digits holds a few exact duplicates)


def test_digits_split_is_shuffled_across_classes(digits):
    """Neither split comes sorted by class: a batch of the first 32 examples holds most classes."""
    for y in (digits.y_train, digits.y_test):
        # In a random order of 10 classes about 9 in 10 neighbours differ; sorted by class, 9 in all.
        assert np.mean(y[1:] != y[:-1]) > 0.8
        assert len(set(y[:32].tolist())) >= 6


def test_digits_test_fraction_changes_split_size():
    ds = data.load_digits(test_fraction=0.5)
    assert abs(len(ds.y_test) - 1797 / 2) < 10
    assert len(ds.y_test) + len(ds.y_train) == 1797


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_digits_rejects_bad_test_fraction(fraction):
    with pytest.raises(ValueError, match="test_fraction"):
        data.load_digits(test_fraction=fraction)


def test_dataset_rejects_malformed_arrays():
    x = np.zeros((2, 28, 28, 1), np.float32)
    with pytest.raises(ValueError, match="x_train"):
        data.Dataset(x[..., 0], np.zeros(2, np.int64), x, np.zeros(2, np.int64), name="bad")
    with pytest.raises(ValueError, match="y_test"):
        data.Dataset(x, np.zeros(2, np.int64), x, np.zeros(3, np.int64), name="bad")


# --- load_mnist --------------------------------------------------------------


def test_mnist_reads_a_local_npz(tmp_path):
    file = tmp_path / "mnist.npz"
    arrays = _write_fake_mnist(file)
    ds = data.load_mnist(str(file))
    assert ds.name == "mnist"
    assert ds.x_train.shape == (6, 28, 28, 1) and ds.x_test.shape == (4, 28, 28, 1)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    np.testing.assert_allclose(ds.x_train[..., 0], arrays["x_train"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(ds.y_test, arrays["y_test"])


def test_mnist_accepts_a_directory(tmp_path):
    _write_fake_mnist(tmp_path / "mnist.npz")
    assert data.load_mnist(str(tmp_path)).x_train.shape[0] == 6


def test_mnist_default_location_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KERAS_HOME", raising=False)
    (tmp_path / ".keras" / "datasets").mkdir(parents=True)
    _write_fake_mnist(tmp_path / ".keras" / "datasets" / "mnist.npz")
    assert data.load_mnist().x_test.shape[0] == 4


def test_mnist_missing_default_explains_and_never_downloads(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "kh"))
    with pytest.raises(FileNotFoundError) as info:
        data.load_mnist()
    message = str(info.value)
    assert os.path.join(str(tmp_path), ".keras", "datasets", "mnist.npz") in message
    assert os.path.join(str(tmp_path), "kh", "datasets", "mnist.npz") in message
    assert "never downloads" in message
    assert "data.path=" in message and "data=digits" in message
    assert not (tmp_path / ".keras").exists()


def test_mnist_missing_explicit_path_names_it(tmp_path):
    missing = tmp_path / "nope.npz"
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        data.load_mnist(str(missing))


def test_mnist_missing_key(tmp_path):
    file = tmp_path / "mnist.npz"
    _write_fake_mnist(file, y_test=None)
    with pytest.raises(ValueError, match="y_test") as info:
        data.load_mnist(str(file))
    assert "mnist.npz" in str(info.value)


def test_mnist_wrong_image_shape(tmp_path):
    file = tmp_path / "mnist.npz"
    _write_fake_mnist(file, x_train=np.zeros((6, 32, 32), np.uint8))
    with pytest.raises(ValueError, match=r"x_train with shape \(6, 32, 32\)"):
        data.load_mnist(str(file))


def test_mnist_label_count_mismatch(tmp_path):
    file = tmp_path / "mnist.npz"
    _write_fake_mnist(file, y_train=np.zeros(5, np.uint8))
    with pytest.raises(ValueError, match="y_train"):
        data.load_mnist(str(file))


def test_mnist_refuses_object_arrays(tmp_path):
    file = tmp_path / "mnist.npz"
    labels = np.empty(6, dtype=object)
    labels[:] = [str(i) for i in range(6)]
    _write_fake_mnist(file, y_train=labels)
    with pytest.raises(ValueError, match="pickle"):
        data.load_mnist(str(file))


def test_mnist_refuses_a_non_archive(tmp_path):
    file = tmp_path / "mnist.npz"
    file.write_bytes(b"this is not a zip file")
    with pytest.raises(ValueError, match="not a usable MNIST archive"):
        data.load_mnist(str(file))


def test_mnist_refuses_a_bare_npy(tmp_path):
    file = tmp_path / "mnist.npz"
    with open(file, "wb") as handle:
        np.save(handle, np.zeros(3))
    with pytest.raises(ValueError, match="single .npy array"):
        data.load_mnist(str(file))


# --- load_dataset and first_index_of -------------------------------------------


def test_load_dataset_dispatches(tmp_path):
    assert data.load_dataset("digits").name == "digits"
    _write_fake_mnist(tmp_path / "mnist.npz")
    assert data.load_dataset("mnist", str(tmp_path / "mnist.npz")).name == "mnist"


def test_load_dataset_unknown_name_lists_choices():
    with pytest.raises(ValueError, match="'digits', 'mnist'"):
        data.load_dataset("cifar")


def test_first_index_of(digits):
    for digit in range(10):
        positions = np.flatnonzero(digits.y_test == digit)
        assert data.first_index_of(digits, digit) == positions[0]
        assert data.first_index_of(digits, digit, index=3) == positions[3]
    i = data.first_index_of(digits, 4, index=1, split="train")
    assert digits.y_train[i] == 4
    assert i == np.flatnonzero(digits.y_train == 4)[1]


def test_first_index_of_out_of_range_says_how_many(digits):
    count = int(np.sum(digits.y_test == 2))
    with pytest.raises(ValueError, match=f"has {count} images of digit 2"):
        data.first_index_of(digits, 2, index=count)
    with pytest.raises(ValueError, match="index=-1"):
        data.first_index_of(digits, 2, index=-1)


@pytest.mark.parametrize("digit", [10, -1, 2.0])
def test_first_index_of_bad_digit(digits, digit):
    with pytest.raises(ValueError, match="digit="):
        data.first_index_of(digits, digit)


def test_first_index_of_bad_split(digits):
    with pytest.raises(ValueError, match="split="):
        data.first_index_of(digits, 1, split="validation")
