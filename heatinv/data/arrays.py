"""Arrays a user has: a local Keras `mnist.npz` (never downloaded) or their own `.npz`, read with `allow_pickle=False`.

Examples:
    >>> ds = load_npz("shapes.npz")  # doctest: +SKIP
    >>> ds.input_shape, ds.num_classes  # doctest: +SKIP
    ((32, 32, 3), 3)
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from heatinv.data.dataset import Dataset, existing_file, value_range
from heatinv.data.digits import DIGIT_NAMES, IMAGE_SIZE, NUM_CLASSES

_MNIST_KEYS = ("x_train", "y_train", "x_test", "y_test")


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

    Examples:
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
        f"heatinv/data/arrays.py load_mnist: no MNIST file found; tried {tried}. "
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
            f"heatinv/data/arrays.py load_npz: '{file}' (data.path) is not a usable dataset archive; found: {found}. "
            "Expected an .npz with plain numeric arrays x_train, x_test (uint8 or float images [N, H, W, C], "
            "or features [N, d]) and y_train, y_test (integer labels 0..k-1), saved with np.savez."
        )
    return ValueError(
        f"heatinv/data/arrays.py load_mnist: '{file}' is not a usable MNIST archive; "
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
            f"heatinv/data/arrays.py load_mnist: '{file}' holds {key} with {found}; the models "
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

    Examples:
        >>> ds = load_npz("shapes.npz")  # doctest: +SKIP
        >>> ds.input_shape, ds.num_classes  # doctest: +SKIP
        ((32, 32, 3), 3)
    """
    file = existing_file(path, "data.path", "an .npz file with x_train, y_train, x_test, y_test")
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
            f"heatinv/data/arrays.py load_npz: '{file}' (data.path) has held-out label {ys['y_test'].max()} but the "
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
            f"heatinv/data/arrays.py load_npz: '{file}' (data.path) has no training example of label {shown}, while its "
            f"labels go up to {present[-1]}: heatinv takes the labels as classes 0..k-1, each in y_train. {fix} "
            "them: _, y = np.unique(np.concatenate([y_train, y_test]), return_inverse=True), then split y back into "
            "y_train and y_test."
        )
    uint8 = xs["x_train"].dtype == np.uint8
    x_train, x_test = (xs[k].astype(np.float32) / (255.0 if uint8 else 1.0) for k in ("x_train", "x_test"))
    low, high = (0.0, 1.0) if uint8 else value_range(x_train, x_test)
    name = os.path.splitext(os.path.basename(file))[0]
    return Dataset(x_train, ys["y_train"], x_test, ys["y_test"], name=name, low=low, high=high)
