"""scikit-learn's bundled 8x8 digits, made 28x28 MNIST-like images.

Examples:
    >>> ds = load_digits()
    >>> ds.input_shape, ds.class_names[:3]
    ((28, 28, 1), ('0', '1', '2'))
"""

from __future__ import annotations

import numpy as np

from heatinv.data.dataset import Dataset, stratified_split

IMAGE_SIZE = 28
NUM_CLASSES = 10
DIGIT_NAMES = tuple(str(d) for d in range(NUM_CLASSES))

# MNIST digits sit in a 20x20 box centred in the 28x28 frame; upsampling the
# 8x8 digits to the same box makes the two datasets look alike to a model.
_DIGITS_BOX = 20


def load_digits(test_fraction: float = 0.25) -> Dataset:
    """Loads scikit-learn's bundled 8x8 digits as 28x28 MNIST-like images.

    The 8x8 images (values 0..16) are scaled to `[0, 1]`, bilinearly
    upsampled to 20x20 and zero-padded to 28x28, like MNIST's centred 20x20
    digit box. The split is stratified per class and fixed: it uses its own
    `np.random.default_rng(0)`, so global seeds do not change it and two calls
    return identical arrays. Of the 1797 images, `test_fraction=0.25` gives
    1347 train / 450 test.

    Args:
        test_fraction: fraction of each class held out for the test split,
            strictly between 0 and 1.

    Returns:
        A `Dataset` named `"digits"`.

    Examples:
        >>> ds = load_digits()
        >>> ds.x_train.shape, ds.x_test.shape
        ((1347, 28, 28, 1), (450, 28, 28, 1))
    """
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(
            f"heatinv/data/digits.py load_digits: test_fraction={test_fraction!r} is "
            "outside the open interval (0, 1). It is the fraction of each "
            "class held out for testing; use a value such as 0.25."
        )
    # Imported here so that importing heatinv.data stays cheap.
    from sklearn.datasets import load_digits as _sklearn_digits

    bunch = _sklearn_digits()
    images = bunch.images.astype(np.float32) / 16.0
    labels = bunch.target.astype(np.int64)
    x = _pad_to_frame(_upsample_bilinear(images, _DIGITS_BOX), IMAGE_SIZE)
    train_idx, test_idx = stratified_split(labels, float(test_fraction))
    return Dataset(
        x_train=x[train_idx, :, :, None],
        y_train=labels[train_idx],
        x_test=x[test_idx, :, :, None],
        y_test=labels[test_idx],
        name="digits",
        class_names=DIGIT_NAMES,
    )


def _upsample_bilinear(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize `[N, h, w] -> [N, size, size]`, half-pixel centres.

    Matches `tf.image.resize(..., method="bilinear")` but stays in numpy so
    the result does not depend on which device TensorFlow picks.
    """
    rows = _interpolation_matrix(images.shape[1], size)
    cols = _interpolation_matrix(images.shape[2], size)
    out = np.einsum("ih,nhw,jw->nij", rows, images, cols)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def _interpolation_matrix(n_in: int, n_out: int) -> np.ndarray:
    """`[n_out, n_in]` weights of 1-D linear interpolation, edges clamped."""
    centres = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    centres = np.clip(centres, 0.0, n_in - 1)
    lower = np.floor(centres).astype(int)
    upper = np.minimum(lower + 1, n_in - 1)
    frac = centres - lower
    matrix = np.zeros((n_out, n_in), dtype=np.float64)
    matrix[np.arange(n_out), lower] += 1.0 - frac
    matrix[np.arange(n_out), upper] += frac
    return matrix


def _pad_to_frame(images: np.ndarray, frame: int) -> np.ndarray:
    """Zero-pads `[N, s, s]` images to `[N, frame, frame]`, centred."""
    before = (frame - images.shape[1]) // 2
    after = frame - images.shape[1] - before
    return np.pad(images, ((0, 0), (before, after), (before, after)))
