"""Datasets for heatinv: bundled digits, local MNIST, a user's .npz, image folder, table or CSV.

Every loader returns the same `Dataset`, so models, targets and the training loop never need
to know which source they got:

- `x_*`: float32 images `[N, H, W, C]` or feature vectors `[N, d]`; for an image folder an
  `ImageFiles` that decodes only the images indexed (`x[a:b]`) or batched (`Dataset.batches`);
- `y_*`: int64 `[N]`, labels `0..num_classes-1`;
- `class_names`, `feature_names` (tables), `low`/`high`: the data's range (the `zbox` box).

Nothing here touches the network: `digits` and the tabular builtins ship inside
scikit-learn, every other source is a local file or folder.

Example:

>>> ds = load_dataset("digits")
>>> ds.x_train.shape[1:], ds.num_classes
((28, 28, 1), 10)
>>> i = first_index_of(ds, digit=3)
>>> int(ds.y_test[i])
3
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import zipfile

import numpy as np

IMAGE_SIZE = 28
NUM_CLASSES = 10
DATASET_NAMES = ("digits", "mnist", "npz", "folder", "tabular", "csv")
TABULAR_NAMES = ("breast_cancer", "wine")
DIGIT_NAMES = tuple(str(d) for d in range(NUM_CLASSES))

# MNIST digits sit in a 20x20 box centred in the 28x28 frame; upsampling the
# 8x8 digits to the same box makes the two datasets look alike to a model.
_DIGITS_BOX = 20
_SPLIT_SEED = 0
_MNIST_KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split of images `[N, H, W, C]` or feature vectors `[N, d]`.

    `eq=False` because comparing numpy arrays with `==` is elementwise, so a
    generated `__eq__` would raise instead of returning a bool.

    Attributes:
        x_train: float32 `[N_train, *input_shape]`, or the `ImageFiles` of an image folder.
        y_train: int64 `[N_train]` in `0..num_classes-1`.
        x_test: float32 `[N_test, *input_shape]`.
        y_test: int64 `[N_test]` in `0..num_classes-1`.
        name: the source (`"digits"`, `"mnist"`, `"breast_cancer"`, a file's name...); recorded in run metadata.
        class_names: one name per class (default `"0"`, `"1"`, ...).
        feature_names: for feature vectors, one name per feature (default `"x0"`, `"x1"`, ...).
        low, high: the smallest and largest input value, a float or one per channel (images)
            or feature (tables): the box of the `zbox` rule.

    Example:

    >>> ds = load_digits()
    >>> ds.x_test.dtype, ds.y_test.dtype, ds.num_classes, ds.low, ds.high
    (dtype('float32'), dtype('int64'), 10, 0.0, 1.0)
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str
    class_names: tuple[str, ...] | None = None
    feature_names: tuple[str, ...] | None = None
    low: float | np.ndarray = 0.0
    high: float | np.ndarray = 1.0

    def __post_init__(self) -> None:
        # Catch a malformed split here, not as a shape error deep in Keras.
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            if x.ndim not in (2, 4) or x.shape[1:] != self.x_train.shape[1:]:
                raise ValueError(
                    f"Dataset '{self.name}': x_{split} has shape {x.shape}, expected images "
                    f"[N, H, W, C] or feature vectors [N, d], the same for both splits "
                    f"(x_train is {self.x_train.shape}). Add the channel axis to grayscale "
                    "images ([N, H, W] -> [N, H, W, 1])."
                )
            if y.shape != (x.shape[0],):
                raise ValueError(
                    f"Dataset '{self.name}': y_{split} has shape {y.shape} but "
                    f"x_{split} holds {x.shape[0]} examples; expected one label "
                    "per example as a 1-D array. Pass labels as integers, not "
                    "one-hot vectors."
                )
        if self.class_names is None:
            count = int(max(self.y_train.max(initial=0), self.y_test.max(initial=0))) + 1
            object.__setattr__(self, "class_names", tuple(str(i) for i in range(count)))
        if self.feature_names is None and self.x_train.ndim == 2:
            object.__setattr__(self, "feature_names", tuple(f"x{i}" for i in range(self.x_train.shape[1])))
        for split in ("train", "test"):
            y = getattr(self, f"y_{split}")
            if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                raise ValueError(
                    f"Dataset '{self.name}': y_{split} holds labels in [{y.min()}, {y.max()}], but there are "
                    f"{self.num_classes} classes ({list(self.class_names)[:10]}); labels must be integers "
                    f"0..{self.num_classes - 1}. Renumber the labels so each class has one index."
                )
        if self.num_classes < 2 or len(np.unique(self.y_train)) < 2:
            raise ValueError(
                f"Dataset '{self.name}': the training split has only class(es) "
                f"{sorted(set(self.y_train.tolist()))}; a classifier needs at least two classes. "
                "Add examples of another class (for an image folder: a second subfolder)."
            )

    @property
    def num_classes(self) -> int:
        """Number of classes: one per name in `class_names`."""
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example: `(H, W, C)` or `(d,)`."""
        return tuple(self.x_train.shape[1:])

    @property
    def is_image(self) -> bool:
        """Whether the examples are images `[H, W, C]` (else feature vectors `[d]`)."""
        return self.x_train.ndim == 4

    @property
    def streamed(self) -> bool:
        """Whether the images are files decoded batch by batch (an image folder), not arrays in memory."""
        return isinstance(self.x_train, ImageFiles)

    def batches(self, split: str, batch_size: int, order: np.ndarray | None = None, shuffle_seed: int | None = None):
        """A `tf.data` pipeline of `(x [b, *input_shape] float32, labels [b] int32)` batches of a split.

        An image folder's batches are decoded one at a time, as the pipeline is read.

        Args:
            split: `"train"` or `"test"`.
            batch_size: examples per batch (the last may be smaller).
            order: the positions to visit, in this order (default: all, in split order).
            shuffle_seed: if given, each pass over the pipeline visits `order` in a new
                order drawn from this seed (for `model.fit`'s epochs).

        Returns:
            The `tf.data.Dataset`.

        Example:

        >>> x, y = next(iter(load_digits().batches("test", 8)))
        >>> tuple(x.shape), y.dtype.name
        ((8, 28, 28, 1), 'int32')
        """
        import tensorflow as tf

        x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
        if isinstance(x, ImageFiles):
            return x.batches(y, batch_size, order, shuffle_seed)
        order = np.arange(len(y)) if order is None else np.asarray(order)
        pipeline = tf.data.Dataset.from_tensor_slices((x[order], y[order].astype(np.int32)))
        if shuffle_seed is not None:
            pipeline = pipeline.shuffle(len(order), seed=shuffle_seed, reshuffle_each_iteration=True)
        return pipeline.batch(batch_size)


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
    return Dataset(x_train, y_train, x_test, y_test, name="mnist", class_names=DIGIT_NAMES)


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


def _read_npz(file: str, mnist: bool = True) -> dict[str, np.ndarray]:
    try:
        loaded = np.load(file, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise _npz_error(file, str(err), mnist) from err
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise _npz_error(file, "a single .npy array, not an .npz archive", mnist)
    with loaded:
        found = sorted(loaded.files)
        missing = [k for k in _MNIST_KEYS if k not in found]
        if missing:
            raise _npz_error(file, f"keys {found}, missing {missing}", mnist)
        try:
            return {k: loaded[k] for k in _MNIST_KEYS}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
            # Object arrays land here: allow_pickle=False refuses them.
            raise _npz_error(file, str(err), mnist) from err


def _npz_error(file: str, found: str, mnist: bool = True) -> ValueError:
    if not mnist:
        return ValueError(
            f"heatinv/data.py load_npz: '{file}' (data.path) is not a usable dataset archive; found: {found}. "
            "Expected an .npz with plain numeric arrays x_train, x_test (uint8 or float images [N, H, W, C], "
            "or features [N, d]) and y_train, y_test (integer labels 0..k-1), saved with np.savez."
        )
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


def load_npz(path: str) -> Dataset:
    """Loads a user's `.npz` with `x_train, y_train, x_test, y_test`; any image size or feature count.

    Images are `[N, H, W, C]` (or `[N, H, W]`, given one channel), feature vectors `[N, d]`;
    `uint8` values are scaled to `[0, 1]` (range `[0, 1]`), floats are kept (range: their
    minimum and maximum per channel or feature). Labels are integers `0..k-1`; the number of
    classes `k` is the largest label plus one.

    Args:
        path: the `.npz` file (`data.path`).

    Returns:
        A `Dataset` named after the file.

    Example:

    >>> ds = load_npz("shapes.npz")  # doctest: +SKIP
    >>> ds.input_shape, ds.num_classes  # doctest: +SKIP
    ((32, 32, 3), 3)
    """
    file = _existing(path, "data.path", "an .npz file with x_train, y_train, x_test, y_test")
    arrays = _read_npz(file, mnist=False)
    xs = {}
    for key in ("x_train", "x_test"):
        x = arrays[key]
        if x.ndim == 3:
            x = x[..., None]
        if x.ndim not in (2, 4):
            raise _npz_error(file, f"{key} with shape {x.shape}, expected images [N, H, W, C] or features [N, d]", mnist=False)
        if x.ndim == 4 and x.shape[1] in (1, 3, 4) and x.shape[3] not in (1, 3, 4):
            raise _npz_error(
                file, f"{key} with shape {x.shape}, channels first (PyTorch's [N, C, H, W]) while heatinv takes channels "
                f"last [N, H, W, C] (save np.transpose({key}, (0, 2, 3, 1)) instead)", mnist=False,
            )
        if not (x.dtype == np.uint8 or np.issubdtype(x.dtype, np.floating)):
            raise _npz_error(file, f"{key} with dtype {x.dtype}, expected uint8 images or float values", mnist=False)
        if np.issubdtype(x.dtype, np.floating) and not np.all(np.isfinite(x)):
            raise _npz_error(file, f"{key} with NaN or infinite values", mnist=False)
        xs[key] = x
    if (xs["x_test"].dtype == np.uint8) != (xs["x_train"].dtype == np.uint8):
        raise _npz_error(
            file, f"x_train of dtype {xs['x_train'].dtype} and x_test of dtype {xs['x_test'].dtype}: uint8 images are "
            "scaled to [0, 1] and floats taken as they are, so the two splits would not be on one scale; save both "
            "in one dtype (x.astype('float32') / 255 for uint8 images in [0, 1])", mnist=False,
        )
    if xs["x_test"].shape[1:] != xs["x_train"].shape[1:]:
        raise _npz_error(
            file, f"x_test with examples of shape {xs['x_test'].shape[1:]} while x_train's are {xs['x_train'].shape[1:]}; "
            "both splits must hold examples of one shape", mnist=False,
        )
    ys = {}
    for key, x in (("y_train", xs["x_train"]), ("y_test", xs["x_test"])):
        y = arrays[key]
        if y.shape == (len(x), 1):  # a column of labels, as keras.datasets.cifar10 gives them
            y = y.reshape(-1)
        if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
            found = f"{key} with shape {arrays[key].shape} and dtype {y.dtype}, expected [{len(x)}] integer labels"
            if y.ndim == 2 and len(y) == len(x):
                found += f" (one-hot or scores per class? save {key}.argmax(axis=1) instead)"
            elif y.shape == (len(x),) and np.issubdtype(y.dtype, np.floating) and np.all(np.mod(y, 1) == 0):
                as_int = f"{key}.reshape(-1).astype('int64')" if arrays[key].ndim == 2 else f"{key}.astype('int64')"
                found += f" (whole numbers stored as floats: save {as_int} instead)"
            raise _npz_error(file, found, mnist=False)
        if y.size and y.min() < 0:
            raise _npz_error(file, f"{key} with a negative label {y.min()}, expected labels 0..k-1", mnist=False)
        ys[key] = y.astype(np.int64)
    if ys["y_test"].size and ys["y_test"].max() > ys["y_train"].max():
        raise ValueError(
            f"heatinv/data.py load_npz: '{file}' (data.path) has held-out label {ys['y_test'].max()} but the "
            f"training labels only go up to {ys['y_train'].max()}: labels out of range. Every class must appear "
            "in y_train; renumber the labels 0..k-1."
        )
    present = np.unique(ys["y_train"])
    if present.size and present.size != present[-1] + 1:  # labels 0..k-1 all present: k distinct values up to k-1
        missing = np.setdiff1d(np.arange(min(int(present[-1]) + 1, present.size + 10)), present)[:10]
        shown = ", ".join(map(str, missing)) + (", ..." if present[-1] + 1 - present.size > len(missing) else "")
        held_only = np.intersect1d(missing, ys["y_test"])
        fix = (
            f"label {', '.join(map(str, held_only))} has held-out examples only: move some of them to the training "
            "split, or drop that class; then renumber" if held_only.size else "Renumber"
        )
        raise ValueError(
            f"heatinv/data.py load_npz: '{file}' (data.path) has no training example of label {shown}, while its "
            f"labels go up to {present[-1]}: heatinv takes the labels as classes 0..k-1, each in y_train. {fix} "
            "them: _, y = np.unique(np.concatenate([y_train, y_test]), return_inverse=True), then split y back into "
            "y_train and y_test."
        )
    uint8 = xs["x_train"].dtype == np.uint8
    x_train, x_test = (xs[k].astype(np.float32) / (255.0 if uint8 else 1.0) for k in ("x_train", "x_test"))
    low, high = (0.0, 1.0) if uint8 else _value_range(x_train, x_test)
    name = os.path.splitext(os.path.basename(file))[0]
    return Dataset(x_train, ys["y_train"], x_test, ys["y_test"], name=name, low=low, high=high)


COLOR_MODES = {"rgb": 3, "grayscale": 1}
"""``data.color_mode`` -> the channels an image folder's images are decoded to (Keras's names)."""


def load_folder(path: str, image_size: tuple[int, int], test_split: float, seed: int = 0, color_mode: str = "rgb") -> Dataset:
    """An image folder with one subfolder per class, streamed: its files are listed, never all decoded at once.

    `x_train` and `x_test` are `ImageFiles`: indexing or `Dataset.batches` decodes just the
    images asked for (RGB or grayscale, bilinear resize to `image_size`, pixels scaled to `[0, 1]`, as
    `keras.utils.image_dataset_from_directory` reads them), so a folder larger than memory
    works. What stays in memory: the file paths and labels. The class names are the
    subfolders' names, sorted; the range is `[0, 1]` without a scan. The held-out split is
    `int(test_split * count)` images drawn with `seed`: two calls give the same split.

    Args:
        path: the folder (`data.path`).
        image_size: `(height, width)` every image is resized to (`data.image_size`).
        test_split: the held-out fraction, in (0, 1) (`data.test_split`).
        seed: the split's seed.
        color_mode: `"rgb"` (3 channels) or `"grayscale"` (1), as Keras's loader takes it
            (`data.color_mode`); a colour image read in grayscale is converted.

    Returns:
        A `Dataset` named after the folder.

    Example:

    >>> ds = load_folder("shapes/", (32, 32), 0.2)  # doctest: +SKIP
    >>> ds.input_shape, ds.class_names  # doctest: +SKIP
    ((32, 32, 3), ('circle', 'square', 'triangle'))
    """
    folder = os.path.abspath(os.path.expanduser(path)) if path else ""
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.isfile(folder) else "does not exist"
        other = {".csv": " (a table: data=csv)", ".npz": " (arrays: data=npz)"}.get(os.path.splitext(folder)[1].lower(), "")
        raise FileNotFoundError(
            f"heatinv/data.py load_folder: the image folder '{path}' (data.path) {what}{other}. Point "
            "data.path at a folder with one subfolder of images per class (e.g. shapes/circle/*.png, "
            "shapes/square/*.png)."
        )
    # Hidden folders (.ipynb_checkpoints, .git) are no classes, as in keras.utils.image_dataset_from_directory.
    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)) and not d.startswith("."))
    if len(classes) < 2:
        raise ValueError(
            f"heatinv/data.py load_folder: the image folder '{folder}' (data.path) has {len(classes)} class "
            f"subfolder(s) {classes}; a classifier needs at least two. Put each class's images in a subfolder "
            "of its own (e.g. shapes/circle/, shapes/square/)."
        )
    if not 0.0 < float(test_split) < 1.0:
        raise ValueError(
            f"heatinv/data.py load_folder: data.test_split={test_split!r} is outside (0, 1); it is the "
            "fraction of the images held out for testing. Use e.g. data.test_split=0.2."
        )
    if color_mode not in COLOR_MODES:
        raise ValueError(f"heatinv/data.py load_folder: color_mode={color_mode!r}; expected one of {list(COLOR_MODES)}.")
    (train_paths, y_train), (test_paths, y_test) = _split_files(folder, classes, float(test_split), seed)
    size, channels = tuple(image_size), COLOR_MODES[color_mode]
    name = os.path.basename(folder.rstrip(os.sep))
    return Dataset(
        ImageFiles(train_paths, size, channels), y_train, ImageFiles(test_paths, size, channels), y_test, name=name,
        class_names=tuple(classes),
    )


IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


def _split_files(folder: str, classes: list[str], test_split: float, seed: int):
    """``((train paths, labels), (test paths, labels))``: every image file under each class subfolder, split with ``seed``.

    The held-out split is ``int(test_split * count)`` images of a permutation drawn from
    ``seed`` alone, so the same folder and seed always give the same split.
    """
    paths, labels = [], []
    for label, name in enumerate(classes):
        count = len(paths)
        found = []
        for root, folders, files in os.walk(os.path.join(folder, name)):
            # Hidden entries are copies and metadata (Jupyter's checkpoints, macOS's ._name.png), not images.
            folders[:] = [d for d in folders if not d.startswith(".")]
            found.append((root, sorted(f for f in files if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith("."))))
        for root, names in sorted(found):
            paths += [os.path.join(root, f) for f in names]
            labels += [label] * len(names)
        if len(paths) == count:
            raise ValueError(
                f"heatinv/data.py load_folder: the class subfolder '{os.path.join(folder, name)}' (data.path) holds no "
                f"images (.png/.jpg/.jpeg/.bmp/.gif); every subfolder of '{folder}' is a class, and a class "
                "without images cannot be learned. Put its images there, or move the empty folder out."
            )
    dangling = [path for path in paths if not os.path.exists(path)]
    if dangling:
        raise ValueError(
            f"heatinv/data.py load_folder: the image folder '{folder}' (data.path) holds {len(dangling)} link(s) to "
            f"files that do not exist, the first '{dangling[0]}' -> '{_link_target(dangling[0])}'. Remove the broken "
            "links, or restore the files they point to."
        )
    held_out = int(test_split * len(paths))
    if held_out < 1 or held_out >= len(paths):
        raise ValueError(
            f"heatinv/data.py load_folder: the image folder '{folder}' (data.path) holds {len(paths)} images "
            f"(.png/.jpg/.jpeg/.bmp/.gif) in {classes}; data.test_split={test_split} holds out {held_out} of them, "
            "leaving none to train or none to test. Add images, or change data.test_split."
        )
    order = np.random.default_rng([seed, len(paths)]).permutation(len(paths))
    paths, labels = np.array(paths, dtype=object)[order], np.array(labels, np.int64)[order]
    split = len(paths) - held_out
    return (tuple(paths[:split]), labels[:split]), (tuple(paths[split:]), labels[split:])


def _link_target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # no link: the file went away while the folder was listed
        return "(removed)"


def decoder(image_size: tuple[int, int], channels: int = 3):
    """A ``tf.data`` map function ``path -> image [H, W, channels]`` in ``[0, 1]``: decoded, bilinearly resized.

    The same steps as ``keras.utils.image_dataset_from_directory`` (``decode_image`` with
    ``channels``: 3 for RGB, 1 for grayscale; ``resize`` bilinear to ``image_size``), scaled
    from 0..255 to ``[0, 1]``. In grayscale, BMP and GIF files, which TensorFlow decodes only
    in colour (Keras's loader fails on them), are decoded as RGB and made one channel by
    ``tf.image.rgb_to_grayscale``.
    """
    import tensorflow as tf  # here, so that importing heatinv.data stays cheap

    height, width = int(image_size[0]), int(image_size[1])

    def in_colour_only(contents):
        return tf.logical_or(tf.strings.substr(contents, 0, 2) == b"BM", tf.strings.substr(contents, 0, 3) == b"GIF")

    def decode(path):
        contents = tf.io.read_file(path)
        if channels == 1:
            image = tf.cond(
                in_colour_only(contents),
                lambda: tf.image.rgb_to_grayscale(tf.image.decode_image(contents, channels=3, expand_animations=False)),
                lambda: tf.image.decode_image(contents, channels=1, expand_animations=False),
            )
        else:
            image = tf.image.decode_image(contents, channels=channels, expand_animations=False)
        image = tf.image.resize(image, (height, width), method="bilinear")
        image.set_shape((height, width, channels))
        return image / 255.0

    return decode


class ImageFiles:
    """The images of an image folder's split, decoded only when asked for: an array that is never whole in memory.

    Indexing (``files[i]``, ``files[a:b]``, ``files[[i, j]]``) reads, decodes and resizes just
    those files, as ``keras.utils.image_dataset_from_directory`` would (RGB or grayscale, bilinear,
    ``image_size``), and scales the pixels to ``[0, 1]``; :meth:`batches` gives a ``tf.data``
    pipeline that decodes one batch at a time. Converting the whole split to one numpy array
    (``np.asarray(files)``) is refused: a folder larger than memory must never be read at once.

    Attributes:
        paths: one file per image, in split order.
        image_size: ``(height, width)`` every image is resized to.
        channels: 3 (RGB) or 1 (grayscale).
        largest_read: the most images one indexing call has decoded (streaming's own check).

    Example:

    >>> files = ImageFiles(("shapes/disk/0.png", "shapes/cross/1.png"), (32, 32))  # doctest: +SKIP
    >>> files.shape, files[0:1].shape  # doctest: +SKIP
    ((2, 32, 32, 3), (1, 32, 32, 3))
    """

    ndim = 4
    dtype = np.dtype(np.float32)

    def __init__(self, paths: tuple[str, ...], image_size: tuple[int, int], channels: int = 3):
        self.paths = tuple(paths)
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.channels = int(channels)
        self.largest_read = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.paths), *self.image_size, self.channels)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index) -> np.ndarray:
        if isinstance(index, (int, np.integer)):
            return self[[int(index)]][0]
        chosen = np.arange(len(self.paths))[index]
        self.largest_read = max(self.largest_read, len(chosen))
        if len(chosen) == 0:
            return np.zeros((0, *self.shape[1:]), np.float32)
        import tensorflow as tf

        paths = [self.paths[i] for i in chosen]
        decode = decoder(self.image_size, self.channels)
        pipeline = tf.data.Dataset.from_tensor_slices(paths).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        with reading(self):
            return next(iter(pipeline.batch(len(paths)))).numpy()

    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            f"heatinv/data.py ImageFiles: the {len(self.paths)} images of an image folder are read in batches "
            "(files[a:b], or ImageFiles.batches), never converted whole to one array: a folder may be larger "
            "than memory."
        )

    def batches(self, labels: np.ndarray, batch_size: int, order: np.ndarray | None = None, shuffle_seed: int | None = None):
        """A ``tf.data`` pipeline of ``(images [b, H, W, channels] in [0, 1], labels [b] int32)`` batches.

        Args:
            labels: ``[N]`` the split's labels.
            batch_size: images per batch (the last may be smaller).
            order: the positions to visit, in order (default: all, in split order).
            shuffle_seed: if given, each pass visits `order` in a new order drawn from it;
                only the file names are shuffled, before any image is decoded.

        Returns:
            The pipeline; it decodes each batch's files when the batch is asked for.
        """
        import tensorflow as tf

        order = np.arange(len(self.paths)) if order is None else np.asarray(order)
        paths = tf.constant(np.array(self.paths, dtype=object)[order].astype(str))
        batch_labels = tf.constant(np.asarray(labels)[order].astype(np.int32))
        decode = decoder(self.image_size, self.channels)
        pipeline = tf.data.Dataset.from_tensor_slices((paths, batch_labels))
        if shuffle_seed is not None:
            pipeline = pipeline.shuffle(len(order), seed=shuffle_seed, reshuffle_each_iteration=True)
        pipeline = pipeline.map(lambda path, label: (decode(path), label), num_parallel_calls=tf.data.AUTOTUNE)
        return pipeline.batch(batch_size)


def image_key(files: ImageFiles) -> str:
    """How ``files`` are read, for a cache key: the size, and the channels where not RGB (so RGB's keys stay as they were)."""
    return repr(files.image_size) + ("" if files.channels == 3 else f" {files.channels} channels")


@contextlib.contextmanager
def reading(files: ImageFiles):
    """Turns a file TensorFlow cannot decode, met while reading ``files``, into an error naming that file.

    TensorFlow's own error names no file; the first unreadable one is found by decoding the
    files one at a time (only once something failed).

    Example:

    >>> with reading(dataset.x_train):  # doctest: +SKIP
    ...     model.fit(dataset.batches("train", 32))
    """
    import tensorflow as tf

    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        decode = decoder(files.image_size, files.channels)
        for bad in files.paths:
            try:
                decode(tf.constant(bad))
            except tf.errors.InvalidArgumentError as found:
                reason = re.sub(r"\{\{.*?\}\}|\[Op:.*?\]|name: *$", "", found.message).strip()
                break
        else:
            raise
        raise ValueError(
            f"heatinv/data.py: the image folder (data.path) holds '{bad}', which TensorFlow cannot decode as an "
            f"image ({reason}). Remove or replace that file; every file with an image extension "
            f"({', '.join(IMAGE_EXTENSIONS)}) must be a readable image."
        ) from error


def load_tabular(name: str, test_fraction: float = 0.25) -> Dataset:
    """Loads scikit-learn's bundled `breast_cancer` or `wine` table, standardized, with feature names.

    The split is stratified and fixed (like `load_digits`); every feature is standardized
    with the training split's mean and standard deviation, so nothing of the held-out
    examples leaks into the inputs. `low`/`high` are each feature's range over both splits.

    Args:
        name: `"breast_cancer"` or `"wine"` (`data.name`).
        test_fraction: the held-out fraction of each class.

    Returns:
        A `Dataset` of feature vectors named `name`.

    Example:

    >>> ds = load_tabular("wine")
    >>> ds.input_shape, ds.num_classes, ds.feature_names[0]
    ((13,), 3, 'alcohol')
    """
    from sklearn import datasets

    loaders = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine}
    if name not in loaders:
        raise ValueError(
            f"heatinv/data.py load_tabular: data.name={name!r} is not a bundled table; expected one of "
            f"{list(TABULAR_NAMES)}, or data=csv data.path=<file>.csv for your own table."
        )
    bunch = loaders[name]()
    return _standardized_table(
        bunch.data, bunch.target.astype(np.int64), name, tuple(map(str, bunch.target_names)), tuple(map(str, bunch.feature_names)), test_fraction
    )


def load_csv(path: str, label_column: str | None, test_fraction: float = 0.25) -> Dataset:
    """Loads a CSV table with a header row: numeric feature columns and a label column.

    The labels may be any text (`yes`/`no`, `3`, `setosa`); the classes are their sorted
    distinct values (numbers by value: `2` before `10`). Split and standardization as in `load_tabular`.

    Args:
        path: the `.csv` file (`data.path`).
        label_column: the header of the label column (`data.label_column`).

    Returns:
        A `Dataset` of feature vectors named after the file.

    Example:

    >>> ds = load_csv("patients.csv", "outcome")  # doctest: +SKIP
    """
    import csv

    file = _existing(path, "data.path", "a .csv file with a header row")
    try:
        with open(file, newline="", encoding="utf-8-sig") as handle:  # -sig: Excel's "CSV UTF-8" starts with a byte-order mark
            rows = list(csv.reader(handle))
    except UnicodeDecodeError as error:
        raise ValueError(
            f"heatinv/data.py load_csv: '{file}' (data.path) is not UTF-8 text (byte {error.object[error.start]:#04x} at "
            f"position {error.start}). Save it as UTF-8: Excel's \"CSV UTF-8\", or pandas df.to_csv(path, index=False)."
        ) from error
    if not any(rows[1:]):
        has = "is empty" if not rows else f"has a header ({', '.join(rows[0])}) but no rows"
        raise ValueError(f"heatinv/data.py load_csv: '{file}' (data.path) {has}. Give a table with one row per example.")
    header = [h.strip() for h in rows[0]]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise ValueError(
            f"heatinv/data.py load_csv: '{file}' (data.path) names more than one column {', '.join(map(repr, repeated))}, "
            "so a feature (target.feature) or the label column could not be told apart by name. Give each column "
            "a name of its own in the header row."
        )
    if label_column not in header:
        other = next((name for sign, name in ((";", "semicolons"), ("\t", "tabs")) if len(header) == 1 and sign in header[0]), None)
        fix = (
            f"The header is one column holding {other}: heatinv reads comma-separated values; save the table "
            "with commas (pandas: df.to_csv(path, index=False))."
            if other else "Set data.label_column to the column holding each row's class."
        )
        raise ValueError(
            f"heatinv/data.py load_csv: '{file}' (data.path) has no column {label_column!r} "
            f"(data.label_column); its columns are {header}. {fix}"
        )
    body = [row for row in rows[1:] if row]
    if any(len(row) != len(header) for row in body):
        line = next(i for i, row in enumerate(rows[1:], 2) if row and len(row) != len(header))
        raise ValueError(
            f"heatinv/data.py load_csv: '{file}' (data.path) line {line} has a different number of fields "
            f"than its header ({len(header)}). Fix that row."
        )
    label_at = header.index(label_column)
    features = [h for i, h in enumerate(header) if i != label_at]
    x = _csv_numbers(file, rows, header, label_at)
    raw = [row[label_at].strip() for row in body]
    if "" in raw:
        line = 2 + next(i for i, row in enumerate(rows[1:]) if row and not row[label_at].strip())
        raise ValueError(
            f"heatinv/data.py load_csv: '{file}' (data.path) line {line} has no label (its {label_column!r} cell, "
            "data.label_column, is empty). Label every row, or drop the unlabelled ones."
        )
    names, y = _label_classes(raw)
    return _standardized_table(x, y, os.path.splitext(os.path.basename(file))[0], names, tuple(features), test_fraction)


def _label_classes(labels: list[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """The classes of a csv's labels and each row's class index.

    Labels that are all numbers are classes by value, in order (``2`` before ``10``; ``1`` and
    ``1.0`` one class, named by its shortest spelling); any other labels are classes as text,
    sorted.

    Example:
    >>> _label_classes(["10", "2", "2.0", "10"])
    (('2', '10'), array([1, 0, 0, 1]))
    """
    try:
        values = {label: float(label) for label in set(labels)}
    except ValueError:
        values = None
    if values is None or not all(np.isfinite(v) for v in values.values()):  # "nan" has no place among numbers
        names = tuple(sorted(set(labels)))
        return names, np.array([names.index(label) for label in labels], np.int64)
    spellings: dict[float, list[str]] = {}
    for label, value in values.items():
        spellings.setdefault(value, []).append(label)
    order = sorted(spellings)
    names = tuple(min(spellings[value], key=lambda text: (len(text), text)) for value in order)
    index = {value: i for i, value in enumerate(order)}
    return names, np.array([index[values[label]] for label in labels], np.int64)


def _csv_numbers(file: str, rows: list[list[str]], header: list[str], label_at: int) -> np.ndarray:
    """The feature columns of a csv's rows as float64 ``[n, d]``; the first cell that is no finite number is an error."""
    x = []
    for line, row in enumerate(rows[1:], 2):
        if not row:
            continue
        values = []
        for i, cell in enumerate(row):
            if i == label_at:
                continue
            try:
                value = float(cell)
            except ValueError:
                value = None
            if value is None or not np.isfinite(value):
                what = "an empty cell (a missing value)" if not cell.strip() else f"{cell.strip()!r}, which is not a finite number"
                raise ValueError(
                    f"heatinv/data.py load_csv: '{file}' (data.path) line {line}, column {header[i]!r} holds {what}; "
                    f"every column but the label ({header[label_at]!r}) must hold numbers. Fill or drop the rows with "
                    "missing values, and encode text columns as numbers (e.g. one 0/1 column per category)."
                )
            values.append(value)
        x.append(values)
    return np.array(x, np.float64)


def _standardized_table(x, y, name, class_names, feature_names, test_fraction) -> Dataset:
    if len(class_names) < 2:
        raise ValueError(
            f"heatinv/data.py: the table '{name}' has only the class(es) {list(class_names)}; a classifier "
            "needs at least two. Check the label column (data.label_column)."
        )
    train, test = _stratified_split(y, test_fraction)
    if len(test) == 0:
        counts = np.bincount(y, minlength=len(class_names))
        looks_measured = (
            f" Its label column has {len(class_names)} different values in {len(y)} rows: a measurement rather than "
            "a class?" if len(class_names) > len(y) / 2 else ""
        )
        raise ValueError(
            f"heatinv/data.py: the table '{name}' ({len(y)} rows, {len(class_names)} classes of {counts.min()} to "
            f"{counts.max()} rows) leaves no row to test: {test_fraction:.0%} of each class is held out, rounded, "
            f"which is no row at all here.{looks_measured} Add rows, or choose a label column "
            "of classes (data.label_column)."
        )
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    std = np.where(std > 0, std, 1.0)  # a constant column stays 0 rather than dividing by zero
    x = ((x - mean) / std).astype(np.float32)
    low, high = _value_range(x[train], x[test])
    return Dataset(x[train], y[train], x[test], y[test], name=name, class_names=class_names,
                   feature_names=feature_names, low=low, high=high)


def _value_range(x_train: np.ndarray, x_test: np.ndarray) -> tuple:
    """Per-channel (last axis) minimum and maximum over both splits; one float each where they agree."""
    axes = tuple(range(x_train.ndim - 1))
    low = np.minimum(x_train.min(axis=axes), x_test.min(axis=axes)).astype(np.float32)
    high = np.maximum(x_train.max(axis=axes), x_test.max(axis=axes)).astype(np.float32)
    if np.all(low == low[0]) and np.all(high == high[0]):
        return float(low[0]), float(high[0])
    return low, high


def _existing(path: str | None, key: str, what: str) -> str:
    file = os.path.abspath(os.path.expanduser(path)) if path else ""
    if not os.path.isfile(file):
        raise FileNotFoundError(f"heatinv/data.py: {key}={path!r} is not a file. Point {key} at {what}.")
    return file


def load_dataset(
    name: str,
    path: str | None = None,
    *,
    image_size: tuple[int, int] = (32, 32),
    test_split: float = 0.2,
    label_column: str | None = None,
    seed: int = 0,
    color_mode: str = "rgb",
) -> Dataset:
    """Loads a dataset by its config name (the `data` group).

    Args:
        name: `"digits"`, `"mnist"`, `"npz"`, `"folder"`, `"csv"`, or a bundled table
            (`"breast_cancer"`, `"wine"`).
        path: the file or folder for `mnist`, `npz`, `folder`, `csv`; ignored otherwise.
        image_size, test_split, seed, color_mode: for `folder`.
        label_column: for `csv`.

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
    if name == "npz":
        return load_npz(path)
    if name == "folder":
        return load_folder(path, image_size, test_split, seed, color_mode)
    if name == "csv":
        return load_csv(path, label_column)
    if name in TABULAR_NAMES:
        return load_tabular(name)
    raise ValueError(
        f"heatinv/data.py load_dataset: unknown dataset name {name!r}. "
        f"Expected one of {list(DATASET_NAMES[:-2]) + list(TABULAR_NAMES) + ['csv']}. Set data=digits "
        "(offline, bundled), data=mnist (a local mnist.npz), data=npz, data=folder, data=csv "
        "(data.path=...) or data=tabular data.name=breast_cancer."
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
