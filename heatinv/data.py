"""Datasets for heatinv: scikit-learn's bundled digits and a local MNIST file.

Both loaders return the same `Dataset` layout, so models and the training
loop never need to know which source they got:

- `x_*`: float32 `[N, 28, 28, 1]`, values in `[0, 1]`.
- `y_*`: int64 `[N]`, labels `0..9`.

Nothing here touches the network. `load_digits` works offline because the
8x8 digits ship inside scikit-learn; `load_mnist` reads an `mnist.npz` that is
already on disk and refuses to download one.

Example:

>>> ds = load_dataset("digits")
>>> ds.x_train.shape[1:], ds.num_classes
((28, 28, 1), 10)
>>> i = first_index_of(ds, digit=3)
>>> int(ds.y_test[i])
3
"""

from __future__ import annotations

import dataclasses
import os
import zipfile

import numpy as np

IMAGE_SIZE = 28
NUM_CLASSES = 10
DATASET_NAMES = ("digits", "mnist")

# MNIST digits sit in a 20x20 box centred in the 28x28 frame; upsampling the
# 8x8 digits to the same box makes the two datasets look alike to a model.
_DIGITS_BOX = 20
_SPLIT_SEED = 0
_MNIST_KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split of 28x28 grayscale digit images.

    `eq=False` because comparing numpy arrays with `==` is elementwise, so a
    generated `__eq__` would raise instead of returning a bool.

    Attributes:
        x_train: float32 `[N_train, 28, 28, 1]` in `[0, 1]`.
        y_train: int64 `[N_train]` in `0..9`.
        x_test: float32 `[N_test, 28, 28, 1]` in `[0, 1]`.
        y_test: int64 `[N_test]` in `0..9`.
        name: `"digits"` or `"mnist"`; recorded in run metadata.

    Example:

    >>> ds = load_digits()
    >>> ds.x_test.dtype, ds.y_test.dtype, ds.num_classes
    (dtype('float32'), dtype('int64'), 10)
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str

    def __post_init__(self) -> None:
        # Catch a malformed split here, not as a shape error deep in Keras.
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            if x.ndim != 4 or x.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE, 1):
                raise ValueError(
                    f"Dataset '{self.name}': x_{split} has shape {x.shape}, "
                    f"expected [N, {IMAGE_SIZE}, {IMAGE_SIZE}, 1]. Build the "
                    "Dataset through load_digits/load_mnist, or reshape the "
                    "images to single-channel 28x28 before constructing it."
                )
            if y.shape != (x.shape[0],):
                raise ValueError(
                    f"Dataset '{self.name}': y_{split} has shape {y.shape} but "
                    f"x_{split} holds {x.shape[0]} images; expected one label "
                    "per image as a 1-D array. Pass labels as integers, not "
                    "one-hot vectors."
                )

    @property
    def num_classes(self) -> int:
        """Number of classes: always 10 (digits 0..9) for both sources."""
        return NUM_CLASSES


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

    Example:

    >>> ds = load_digits()
    >>> ds.x_train.shape, ds.x_test.shape
    ((1347, 28, 28, 1), (450, 28, 28, 1))
    """
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(
            f"heatinv/data.py load_digits: test_fraction={test_fraction!r} is "
            "outside the open interval (0, 1). It is the fraction of each "
            "class held out for testing; use a value such as 0.25."
        )
    # Imported here so that importing heatinv.data stays cheap.
    from sklearn.datasets import load_digits as _sklearn_digits

    bunch = _sklearn_digits()
    images = bunch.images.astype(np.float32) / 16.0
    labels = bunch.target.astype(np.int64)
    x = _pad_to_frame(_upsample_bilinear(images, _DIGITS_BOX), IMAGE_SIZE)
    train_idx, test_idx = _stratified_split(labels, float(test_fraction))
    return Dataset(
        x_train=x[train_idx, :, :, None],
        y_train=labels[train_idx],
        x_test=x[test_idx, :, :, None],
        y_test=labels[test_idx],
        name="digits",
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


def _stratified_split(labels: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-class random split with a private, fixed generator."""
    rng = np.random.default_rng(_SPLIT_SEED)
    train, test = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_test = int(round(len(members) * test_fraction))
        test.append(members[:n_test])
        train.append(members[n_test:])
    # Shuffle across classes so batches are not sorted by label.
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def load_mnist(path: str | None = None) -> Dataset:
    """Loads MNIST from a local Keras `mnist.npz`; never downloads.

    The file must hold `x_train`, `y_train`, `x_test`, `y_test` as saved by
    `keras.datasets.mnist` (uint8 images `[N, 28, 28]`, integer labels).
    Images are scaled to `[0, 1]`; float images already in `[0, 1]` and
    `[N, 28, 28, 1]` images are accepted too.

    Args:
        path: the `.npz` file, or a directory containing `mnist.npz`. If
            None, tries `$KERAS_HOME/datasets/mnist.npz` (when `KERAS_HOME`
            is set) and then `~/.keras/datasets/mnist.npz`, where Keras
            caches its download.

    Returns:
        A `Dataset` named `"mnist"`.

    Raises:
        FileNotFoundError: no file at any of the paths tried.
        ValueError: the file is not a readable npz, or its arrays are
            missing, pickled, or of the wrong shape or values.

    Example:

    >>> ds = load_mnist("~/.keras/datasets/mnist.npz")  # doctest: +SKIP
    >>> ds.x_train.shape  # doctest: +SKIP
    (60000, 28, 28, 1)
    """
    file = _find_mnist_file(path)
    arrays = _read_npz(file)
    x_train = _mnist_images(file, "x_train", arrays["x_train"])
    x_test = _mnist_images(file, "x_test", arrays["x_test"])
    y_train = _mnist_labels(file, "y_train", arrays["y_train"], len(x_train))
    y_test = _mnist_labels(file, "y_test", arrays["y_test"], len(x_test))
    return Dataset(x_train, y_train, x_test, y_test, name="mnist")


def _mnist_candidates(path: str | None) -> list[str]:
    if path is not None:
        path = os.path.abspath(os.path.expanduser(path))
        return [os.path.join(path, "mnist.npz") if os.path.isdir(path) else path]
    candidates = []
    keras_home = os.environ.get("KERAS_HOME")
    if keras_home:
        candidates.append(os.path.join(os.path.expanduser(keras_home), "datasets", "mnist.npz"))
    candidates.append(os.path.join(os.path.expanduser("~"), ".keras", "datasets", "mnist.npz"))
    return candidates


def _find_mnist_file(path: str | None) -> str:
    candidates = _mnist_candidates(path)
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    tried = ", ".join(f"'{c}'" for c in candidates)
    raise FileNotFoundError(
        f"heatinv/data.py load_mnist: no MNIST file found; tried {tried}. "
        "heatinv never downloads datasets. To fix, copy a Keras mnist.npz "
        "(keys x_train, y_train, x_test, y_test) to "
        "~/.keras/datasets/mnist.npz, or pass data.path=/path/to/mnist.npz, "
        "or use the bundled offline dataset with data=digits."
    )


def _read_npz(file: str) -> dict[str, np.ndarray]:
    try:
        loaded = np.load(file, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise _npz_error(file, str(err)) from err
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise _npz_error(file, "a single .npy array, not an .npz archive")
    with loaded:
        found = sorted(loaded.files)
        missing = [k for k in _MNIST_KEYS if k not in found]
        if missing:
            raise _npz_error(file, f"keys {found}, missing {missing}")
        try:
            return {k: loaded[k] for k in _MNIST_KEYS}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
            # Object arrays land here: allow_pickle=False refuses them.
            raise _npz_error(file, str(err)) from err


def _npz_error(file: str, found: str) -> ValueError:
    return ValueError(
        f"heatinv/data.py load_mnist: '{file}' is not a usable MNIST archive; "
        f"found: {found}. Expected an .npz with plain numeric arrays x_train, "
        "y_train, x_test, y_test (pickled object arrays are refused), as "
        "written by keras.datasets.mnist. Replace the file with a genuine "
        "Keras mnist.npz, or use data=digits."
    )


def _mnist_images(file: str, key: str, x: np.ndarray) -> np.ndarray:
    if x.ndim == 4 and x.shape[-1] == 1:
        x = x[..., 0]
    if x.ndim != 3 or x.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise _npz_error(file, f"{key} with shape {x.shape}, expected [N, 28, 28]")
    if x.dtype == np.uint8:
        return (x.astype(np.float32) / 255.0)[..., None]
    if not np.issubdtype(x.dtype, np.floating):
        raise _npz_error(file, f"{key} with dtype {x.dtype}, expected uint8 (or floats in [0, 1])")
    # NaN fails every comparison, so check it first and by name: it is not "in range".
    bad = int(x.size - np.count_nonzero(np.isfinite(x)))
    if bad or (x.size and not (0.0 <= x.min() and x.max() <= 1.0)):
        found = f"{bad} NaN or infinite values" if bad else f"values in [{x.min():.3g}, {x.max():.3g}]"
        raise ValueError(
            f"heatinv/data.py load_mnist: '{file}' holds {key} with {found}; the models "
            "work on images in [0, 1] (uint8 0..255 is scaled to it). Save the images "
            "as uint8, or as floats in [0, 1] (e.g. x / 255 for 0..255 data, with NaN "
            "replaced), or use data=digits."
        )
    return x.astype(np.float32)[..., None]


def _mnist_labels(file: str, key: str, y: np.ndarray, n: int) -> np.ndarray:
    if y.shape != (n,):
        raise _npz_error(file, f"{key} with shape {y.shape}, expected [{n}] (one integer label per image)")
    if not np.issubdtype(y.dtype, np.integer):
        raise _npz_error(file, f"{key} with dtype {y.dtype}, expected integer labels")
    if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES):
        raise _npz_error(file, f"{key} with labels in [{y.min()}, {y.max()}], expected 0..9")
    return y.astype(np.int64)


def load_dataset(name: str, path: str | None = None) -> Dataset:
    """Loads a dataset by its config name.

    Args:
        name: `"digits"` (offline, bundled with scikit-learn) or `"mnist"`
            (a local `mnist.npz`, see `load_mnist`).
        path: passed to `load_mnist`; ignored for `"digits"`, so one config
            can carry a `data.path` whichever dataset is chosen.

    Returns:
        The `Dataset`.

    Example:

    >>> load_dataset("digits").name
    'digits'
    """
    if name == "digits":
        return load_digits()
    if name == "mnist":
        return load_mnist(path)
    raise ValueError(
        f"heatinv/data.py load_dataset: unknown dataset name {name!r}. "
        f"Expected one of {list(DATASET_NAMES)}. Set data=digits (offline, "
        "bundled) or data=mnist (needs a local mnist.npz)."
    )


def first_index_of(dataset: Dataset, digit: int, index: int = 0, split: str = "test") -> int:
    """Position of the `index`-th image of class `digit` in a split.

    Used to pick a reproducible input image by label rather than by raw
    position, which would change with the dataset.

    Args:
        dataset: the `Dataset` to search.
        digit: class label, `0..num_classes-1`.
        index: which occurrence, counting from 0.
        split: `"test"` or `"train"`.

    Returns:
        An int `i` with `dataset.y_<split>[i] == digit`.

    Example:

    >>> ds = load_digits()
    >>> i = first_index_of(ds, digit=7, index=2)
    >>> int(ds.y_test[i])
    7
    """
    if split not in ("train", "test"):
        raise ValueError(
            f"heatinv/data.py first_index_of: split={split!r}, expected "
            "'train' or 'test'."
        )
    if not _is_int(digit) or not 0 <= digit < dataset.num_classes:
        raise ValueError(
            f"heatinv/data.py first_index_of: digit={digit!r} is not a class "
            f"label of dataset '{dataset.name}'; expected an integer in "
            f"0..{dataset.num_classes - 1}."
        )
    labels = dataset.y_test if split == "test" else dataset.y_train
    positions = np.flatnonzero(labels == digit)
    if not _is_int(index) or not 0 <= index < len(positions):
        raise ValueError(
            f"heatinv/data.py first_index_of: index={index!r} is out of range; "
            f"the {split} split of '{dataset.name}' has {len(positions)} images "
            f"of digit {digit}, so index must be in 0..{len(positions) - 1}."
        )
    return int(positions[index])


def _is_int(value) -> bool:
    # bool is an int subclass, but digit=True is a config mistake, not 1.
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
