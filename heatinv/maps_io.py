"""Reading user-supplied heatmaps and images from `.npy` and `.png` files.

Files are parsed as data only: `.npy` is loaded with `allow_pickle=False`,
so a file can never run code, and PNGs are decoded by `tf.io.decode_png`.

- `.npy`: any numeric (or boolean) array, returned as float32 with its sign
  and scale intact. Use this for signed relevance maps. Values must be finite
  in float32 and small enough that float32 can square and sum them over the
  map (see `magnitude_limit`), or the similarity metrics and the first layer
  overflow.
- `.png`: 8- or 16-bit grayscale, gray+alpha, RGB or RGBA. Values are scaled
  to `[0, 1]`; colour is converted to luminance (`0.299 R + 0.587 G +
  0.114 B`, ITU-R BT.601) and alpha is dropped. The result is `[H, W, 1]`
  (an input image for a colour model, `image=True`: `[H, W, 3]` RGB).
  A PNG cannot carry negative relevance, and a rendered blue-white-red
  heatmap does not convert back to relevance through luminance; save signed
  targets as `.npy`.

Examples:
    >>> import numpy as np
    >>> np.save("/tmp/target.npy", np.zeros((28, 28), np.float32))  # doctest: +SKIP
    >>> read_map("/tmp/target.npy", expected_shape=(28, 28, 1)).shape  # doctest: +SKIP
    (28, 28, 1)
"""

from __future__ import annotations

import math
import os

import numpy as np
import tensorflow as tf

SUPPORTED_EXTENSIONS = (".npy", ".png")

# ITU-R BT.601 luma weights. tf.image.rgb_to_grayscale rounds red to 0.2989,
# which maps white to 0.9999; these sum to 1 so white stays exactly 1.
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float64)
_UINT16_MAX = 65535.0


def read_map(
    path: str,
    expected_shape: tuple[int, ...] | None = None,
    what: str | None = None,
    image: bool = False,
) -> np.ndarray:
    """Reads a heatmap or image from `.npy` or `.png` as float32.

    Args:
        path: the file; `~` is expanded and relative paths resolve against
            the current working directory.
        expected_shape: if given, e.g. `(28, 28, 1)`, the result has exactly
            this shape. Arrays that differ only by size-1 axes (`(28, 28)`,
            `(1, 28, 28, 1)`) or are flat with the same number of values
            (`(784,)`) are reshaped to it, in row-major order.
        what: the config key that named the file, e.g. `"target.path"`,
            quoted in error messages so the user knows what to change.
        image: the file is a model input (`target.image`), read as the data
            loaders read images: a `uint8` array is scaled to `[0, 1]`, and
            a PNG for an `expected_shape` of 3 channels is read as RGB (alpha
            dropped; a grayscale PNG in all three).

    Returns:
        float32 array: the `.npy` array's own shape, `[H, W, 1]` for a PNG,
        or `expected_shape` when given.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: unsupported extension, unreadable or pickled content,
            non-numeric values, values that are NaN/Inf in float32, values
            beyond `magnitude_limit`, or a shape that does not fit
            `expected_shape`.

    Examples:
        >>> read_map("target.png", expected_shape=(28, 28, 1), what="target.path")  # doctest: +SKIP
    """
    source = _describe(path, what)
    resolved = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(resolved):
        raise _missing_file_error(path, resolved, what)
    extension = os.path.splitext(resolved)[1].lower()
    if extension == ".npy":
        array = _read_npy(resolved, source)
        array = array / 255.0 if image and array.dtype == np.uint8 else array.astype(np.float64)
    elif extension == ".png":
        rgb = image and expected_shape is not None and len(expected_shape) == 3 and expected_shape[-1] == 3
        array = _read_png(resolved, source, channels=3 if rgb else 1)
    else:
        raise ValueError(
            f"heatinv/maps_io.py: {source} has extension {extension or '(none)'!r}, "
            f"which is not supported; expected one of {list(SUPPORTED_EXTENSIONS)}. "
            "Save the map with np.save('map.npy', array.astype('float32')) "
            "(keeps sign and scale), or as a grayscale PNG."
        )
    _check_finite(array, source)
    _check_magnitude(array, source)
    array = array.astype(np.float32)
    if expected_shape is not None:
        array = fit_shape(array, expected_shape, source)
    return array


def magnitude_limit(size: int) -> float:
    """The largest |value| a map of `size` values may hold: sqrt(float32 max / size).

    heatinv computes in float32. The similarity metrics (cosine, Pearson) sum the
    squares of a map's `size` values, and the first layer sums `size` products of
    the input with its weights: a map whose values all reach this bound squares
    and sums to float32's largest finite number (3.4e38); beyond it the sum is
    inf (a 28x28 target at 1.01 times the bound gave cosine -0.0 instead of
    -0.0207 at 0.99 times). For a 28x28 map the bound is 6.6e17; the data sets'
    images lie in [0, 1].

    Args:
        size: the number of values in the map (at least 1).

    Returns:
        The bound, a float.

    Examples:
        >>> f"{magnitude_limit(784):.2g}"
        '6.6e+17'
    """
    return math.sqrt(float(np.finfo(np.float32).max) / max(int(size), 1))


def fit_shape(array: np.ndarray, expected_shape: tuple[int, ...], source: str = "the array") -> np.ndarray:
    """Reshapes `array` to `expected_shape` if it fits unambiguously.

    Accepted: the same shape; the same shape up to size-1 axes; or a flat
    array (after squeezing) with the same number of values, or vice versa.
    Anything else, e.g. `(28, 28, 3)` for `(28, 28, 1)` or `(14, 56)` for
    `(28, 28)`, is refused rather than silently scrambled.

    Args:
        array: the values.
        expected_shape: tuple of positive ints.
        source: how to name the array in an error message.

    Returns:
        `array` reshaped to `expected_shape`.

    Examples:
        >>> fit_shape(np.zeros(784), (28, 28, 1)).shape
        (28, 28, 1)
    """
    expected_shape = _check_expected_shape(expected_shape)
    if array.shape == expected_shape:
        return array
    seen = _squeezed(array.shape)
    wanted = _squeezed(expected_shape)
    same_size = array.size == math.prod(expected_shape)
    if seen == wanted or (same_size and (len(seen) <= 1 or len(wanted) <= 1)):
        return array.reshape(expected_shape)
    raise ValueError(
        f"heatinv/maps_io.py: {source} has shape {array.shape}, expected "
        f"{expected_shape}. Accepted are that shape, the same shape with extra "
        f"or missing size-1 axes, or a flat array of {math.prod(expected_shape)} "
        f"values. Save it at the model's input resolution, {expected_shape} (e.g. the "
        f"first entry of a [1, {', '.join(map(str, expected_shape))}] batch)."
    )


def _describe(path: str, what: str | None) -> str:
    return f"'{path}' ({what})" if what else f"'{path}'"


def _missing_file_error(path: str, resolved: str, what: str | None) -> FileNotFoundError:
    key = f" given as {what}" if what else ""
    fix = f"set {what}=/absolute/path/to/map.npy" if what else "pass an absolute path"
    return FileNotFoundError(
        f"heatinv/maps_io.py: no file at '{path}'{key} (resolved to "
        f"'{resolved}' from working directory '{os.getcwd()}'). Expected an "
        f"existing {' or '.join(SUPPORTED_EXTENSIONS)} file. Check the "
        f"spelling, or {fix}; relative paths depend on where the run starts."
    )


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK"
_PICKLE_MAGIC = b"\x80"  # a pickle of protocol 2 or later opens with PROTO


def _read_npy(path: str, source: str) -> np.ndarray:
    # np.load guesses the format from these bytes: anything without numpy's or zip's
    # magic it takes for a pickle, and a broken zip escapes as BadZipFile. Decide here.
    with open(path, "rb") as handle:
        start = handle.read(len(_NPY_MAGIC))
    if start.startswith(_ZIP_MAGIC):
        raise _unreadable_error(source, "npy", "an .npz archive (zip), not a single array")
    if not start.startswith(_NPY_MAGIC) and not start.startswith(_PICKLE_MAGIC):
        raise _unreadable_error(source, "npy", f"it starts with {start!r}, not numpy's magic {_NPY_MAGIC!r}")
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as err:
        if "pickle" in str(err).lower() or "object" in str(err).lower():
            raise ValueError(
                f"heatinv/maps_io.py: {source} holds pickled Python objects "
                f"(numpy says: {err}). Pickled content is refused for safety, "
                "because unpickling can run arbitrary code. Save a plain "
                "numeric array instead: np.save(path, "
                "np.asarray(heatmap, dtype=np.float32))."
            ) from err
        raise _unreadable_error(source, "npy", err) from err
    except (OSError, EOFError) as err:
        raise _unreadable_error(source, "npy", err) from err
    if array.dtype.kind not in "biuf":  # bool, signed/unsigned int, float
        raise ValueError(
            f"heatinv/maps_io.py: {source} has dtype {array.dtype}; expected "
            "real numbers (float, int or bool). Save the map as a float "
            "array: np.save(path, np.asarray(heatmap, dtype=np.float32))."
        )
    # In its own dtype: read_map scales uint8 images, and casts to float32 only after checking
    # the values in float64, so that the error messages show them as saved.
    return array


def _read_png(path: str, source: str, channels: int = 1) -> np.ndarray:
    with open(path, "rb") as handle:
        contents = handle.read()
    try:
        # Decoding as uint16 scales 8-bit files by 257, so one division
        # brings both bit depths to [0, 1].
        pixels = tf.io.decode_png(contents, channels=0, dtype=tf.uint16).numpy()
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as err:
        raise _unreadable_error(source, "png", err.message) from err
    values = pixels.astype(np.float64) / _UINT16_MAX
    if values.shape[-1] <= 2:  # gray, or gray + alpha
        return np.repeat(values[..., :1], channels, axis=-1)
    return values[..., :3] if channels == 3 else values[..., :3] @ _LUMA[:, None]  # RGB, or RGBA


def _unreadable_error(source: str, kind: str, detail) -> ValueError:
    fix = {
        "npy": "re-save it with np.save(path, np.asarray(heatmap, dtype=np.float32))",
        "png": "re-export it as an 8- or 16-bit PNG, or save the array as .npy",
    }[kind]
    return ValueError(
        f"heatinv/maps_io.py: {source} could not be read as a .{kind} file "
        f"({detail}). Expected a valid .{kind} file; {fix}."
    )


def _check_finite(array: np.ndarray, source: str) -> None:
    """Finite after the cast to float32 (a float64 1e39 becomes inf there)."""
    with np.errstate(over="ignore"):
        finite = np.isfinite(array.astype(np.float32))
    bad = int(array.size - np.count_nonzero(finite))
    if bad:
        first = np.unravel_index(int(np.argmin(finite.reshape(-1))), array.shape)
        raise ValueError(
            f"heatinv/maps_io.py: {source} contains {bad} NaN or infinite "
            f"value(s) in float32 out of {array.size} (the first, at index "
            f"{tuple(int(i) for i in first)}, is {float(array[first])!r}; float32 "
            "ends at 3.4e38); expected finite numbers. Replace "
            "them before saving, e.g. np.nan_to_num(heatmap, nan=0.0, "
            "posinf=0.0, neginf=0.0), or regenerate the map."
        )


def _check_magnitude(array: np.ndarray, source: str) -> None:
    if not array.size:
        return
    limit = magnitude_limit(array.size)
    flat = np.abs(array.reshape(-1))
    worst = int(np.argmax(flat))
    if flat[worst] > limit:
        where = tuple(int(i) for i in np.unravel_index(worst, array.shape))
        raise ValueError(
            f"heatinv/maps_io.py: {source} holds values up to {float(flat[worst]):.3g} "
            f"in magnitude (at index {where}); a map of {array.size} values must "
            f"stay within +-{limit:.2g}, or float32 overflows when heatinv's "
            "similarity metrics square and sum it and when the first layer sums "
            "the input times its weights. The data sets' images lie in [0, 1]. Rescale the map "
            "before saving, e.g. np.save(path, array / np.abs(array).max())."
        )


def _check_expected_shape(expected_shape) -> tuple[int, ...]:
    shape = tuple(expected_shape)
    positive_ints = all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in shape)
    if not shape or not positive_ints:
        raise ValueError(
            f"heatinv/maps_io.py: expected_shape={expected_shape!r}; expected "
            "a non-empty tuple of positive integers, e.g. (28, 28, 1)."
        )
    return tuple(int(d) for d in shape)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)
