"""Property-based tests: arbitrary arrays, shapes and dtypes give a valid result or the documented error.

Each test states, from the documentation, which outcome an input must have: a result (with
its shape, dtype and values checked) or one specific error type and message. Hypothesis is
derandomized (the same examples on every run and machine) and bounded (``max_examples``)
so CI time stays fixed; ``@example`` pins valid and invalid inputs that must always be tried.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conftest import dense_model
from heatinv.lrp import COMPOSITES, relevance
from heatinv.maps_io import read_map

SETTINGS = settings(
    max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

dtypes = st.sampled_from(["float32", "float64", "float16", "int8", "int16", "int64", "uint8", "uint16", "bool", "complex64", "U3"])
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=30)
FLOAT32_MAX = float(np.finfo(np.float32).max)


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(dtypes))
    shape = draw(shapes)
    if dtype.kind == "U":
        return np.full(shape, "ab", dtype=dtype)
    elements = None
    if dtype.kind == "f":
        elements = st.floats(allow_nan=True, allow_infinity=True, width=dtype.itemsize * 8)
    return draw(hnp.arrays(dtype, shape, elements=elements))


# --- maps_io.read_map ---------------------------------------------------------------


def _squeezed(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _fits(shape, expected) -> bool:
    """read_map's documented rule: the same shape up to size-1 axes, or the same number of
    values where one side is flat (after dropping size-1 axes)."""
    same_size = math.prod(shape) == math.prod(expected)
    flat = len(_squeezed(shape)) <= 1 or len(_squeezed(expected)) <= 1
    return _squeezed(shape) == _squeezed(expected) or (same_size and flat)


def _npy_error(array: np.ndarray, expected) -> str | None:
    """The message (a regex) of the ValueError read_map documents for this array, or None."""
    if array.dtype.kind not in "biuf":
        return "has dtype"
    with np.errstate(over="ignore", invalid="ignore"):
        if not np.isfinite(array.astype(np.float32)).all():
            return r"NaN or infinite value\(s\) in float32"
    if array.size and np.abs(array.astype(np.float64)).max() > math.sqrt(FLOAT32_MAX / array.size):
        return "holds values up to"
    if expected is not None and not _fits(array.shape, expected):
        return "has shape"
    return None


def _saved(folder: str, array: np.ndarray) -> str:
    path = os.path.join(folder, "map.npy")
    np.save(path, array)
    return path


@SETTINGS
@given(array=arrays(), expected=st.sampled_from([None, (28, 28, 1), (784,)]))
@example(array=np.random.default_rng(0).normal(size=(28, 28)).astype(np.float32), expected=(28, 28, 1))
@example(array=np.arange(784, dtype=np.int16).reshape(1, 28, 28, 1), expected=(784,))
@example(array=np.ones((784, 1), bool), expected=(28, 28, 1))
@example(array=np.zeros((0, 3)), expected=None)
@example(array=np.array([1.0, 1e39]), expected=None)  # finite in float64, inf in float32
@example(array=np.full((28, 28), 1e38, np.float32), expected=(28, 28, 1))  # beyond the magnitude limit
@example(array=np.zeros((14, 56)), expected=(28, 28, 1))  # same size, different layout
@example(array=np.ones(3, np.complex64), expected=None)
def test_npy_loader_returns_the_values_or_the_documented_error(array, expected):
    error = _npy_error(array, expected)
    with tempfile.TemporaryDirectory() as folder:
        path = _saved(folder, array)
        if error is not None:
            with pytest.raises(ValueError, match=error) as caught:
                read_map(path, expected_shape=expected, what="target.path")
            assert "map.npy" in str(caught.value) and "target.path" in str(caught.value)
            return
        result = read_map(path, expected_shape=expected, what="target.path")
    assert result.dtype == np.float32 and np.isfinite(result).all()
    assert result.shape == (expected if expected is not None else array.shape)
    np.testing.assert_array_equal(result.reshape(-1), array.astype(np.float32).reshape(-1))  # row-major, unchanged


@SETTINGS
@given(payload=st.binary(max_size=300))
@example(payload=b"")
@example(payload=b"hello world")
@example(payload=b"PK\x03\x04 a broken zip")  # np.load itself raises BadZipFile here
@example(payload=b"\x93NUMPY\x01\x00 a broken header")
@example(payload=b"\x80 not really a pickle")
def test_npy_loader_refuses_arbitrary_bytes_as_unreadable(payload):
    # bytes that open with pickle's PROTO marker (0x80) are refused as pickled, unread
    message = "holds pickled Python objects" if payload.startswith(b"\x80") else "could not be read as a .npy file"
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "junk.npy")
        with open(path, "wb") as f:
            f.write(payload)
        with pytest.raises(ValueError, match=re.escape(f"junk.npy' {message}")):
            read_map(path)


def test_npy_loader_refuses_pickled_objects(tmp_path):
    saved = tmp_path / "objects.npy"
    np.save(saved, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    raw = tmp_path / "raw.npy"
    raw.write_bytes(pickle.dumps({"a": 1}))
    for path in (saved, raw):
        with pytest.raises(ValueError, match="holds pickled Python objects"):
            read_map(str(path))


def _luminance(pixels: np.ndarray) -> np.ndarray:
    """The documented PNG conversion: gray (alpha dropped) or 0.299 R + 0.587 G + 0.114 B, over 255."""
    values = pixels.astype(np.float64) / 255.0
    if values.shape[-1] <= 2:
        return values[..., :1]
    return 0.299 * values[..., :1] + 0.587 * values[..., 1:2] + 0.114 * values[..., 2:3]


@SETTINGS
@given(image=hnp.arrays(np.uint8, st.tuples(st.integers(1, 40), st.integers(1, 40), st.sampled_from([1, 2, 3, 4]))))
@example(image=np.full((28, 28, 3), 255, np.uint8))
@example(image=np.random.default_rng(0).integers(0, 256, (28, 28, 4)).astype(np.uint8))
@example(image=np.zeros((28, 27, 1), np.uint8))
def test_png_loader_returns_the_luminance_or_the_shape_error(image):
    encoded = tf.io.encode_png(image).numpy()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "map.png")
        with open(path, "wb") as f:
            f.write(encoded)
        if image.shape[:2] != (28, 28):
            with pytest.raises(ValueError, match=re.escape(f"has shape {image.shape[:2] + (1,)}, expected (28, 28, 1)")):
                read_map(path, expected_shape=(28, 28, 1))
            return
        result = read_map(path, expected_shape=(28, 28, 1))
    assert result.dtype == np.float32 and result.shape == (28, 28, 1)
    np.testing.assert_allclose(result, _luminance(image), rtol=0, atol=1e-6)  # float32 rounding of values in [0, 1]


# --- the engine's input validation ----------------------------------------------------

CLASSES = 3
_MODEL = None


def _model():
    global _MODEL
    if _MODEL is None:
        _MODEL = dense_model("float32")  # 6 features, 3 classes
    return _MODEL


def _engine_error(x, target) -> tuple[type, str] | None:
    """The error type and message (a regex) :func:`heatinv.lrp.relevance` documents, or None."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        return TypeError, "needs a floating input"
    if x.ndim != 2 or x.shape[1] != 6:
        return ValueError, "does not fit model"
    batch = x.shape[0]
    if isinstance(target, int):
        return None if 0 <= target < CLASSES else (ValueError, "out of range")
    t = np.asarray(target)
    if t.dtype.kind in "iu":
        if t.ndim == 2 and t.shape[1] == CLASSES:  # a one-hot
            return None if t.shape[0] == batch else (ValueError, "for a batch of")
        if t.ndim == 2 and t.shape[1] == 1:  # a column of labels
            t = t[:, 0]
        if t.ndim > 1:
            return ValueError, r"An integer target is a class index: a scalar, a \[batch\] vector"
        if t.ndim == 1 and t.shape[0] != batch:
            return ValueError, "for a batch of"
        return (ValueError, "out of range") if t.size and (t.min() < 0 or t.max() >= CLASSES) else None
    if t.dtype.kind in "fb" and t.ndim == 2 and t.shape[1] == CLASSES:
        return None if t.shape[0] == batch else (ValueError, "for a batch of")
    return ValueError, "A non-integer target must be a one-hot"


@SETTINGS
@given(x=arrays(), target=st.one_of(st.integers(-5, 8), arrays()))
@example(x=np.ones((2, 6), np.float32), target=1)
@example(x=np.ones((2, 6), np.float64), target=np.array([0, 2]))
@example(x=np.ones((2, 6), np.float32), target=np.eye(3, dtype=np.float32)[[2, 0]])
@example(x=np.ones((0, 6), np.float32), target=0)
@example(x=np.ones((2, 6), np.int64), target=0)
@example(x=np.ones((6,), np.float32), target=0)
@example(x=np.ones((2, 6), np.float32), target=3)
@example(x=np.ones((2, 6), np.float32), target=np.array([0, 1, 2]))
@example(x=np.ones((2, 6), np.float32), target=np.array([0.0, 1.0]))
def test_engine_input_validation_gives_a_heatmap_or_the_documented_error(x, target):
    error = _engine_error(x, target)
    if error is not None:
        with pytest.raises(error[0], match=error[1]):
            relevance(_model(), x, target, composite="epsilon")
        return
    R = relevance(_model(), x, target, composite="epsilon")
    assert R.shape == np.shape(x) and R.dtype == tf.as_dtype(np.asarray(x).dtype)


@SETTINGS
@given(
    x=hnp.arrays(
        st.sampled_from([np.float32, np.float64]),
        st.tuples(st.integers(1, 4), st.just(6)),
        elements=st.floats(-10, 10, width=32),
    ),
    target=st.integers(0, CLASSES - 1),
    composite=st.sampled_from(sorted(COMPOSITES)),
)
@example(x=np.zeros((1, 6), np.float32), target=0, composite="zero")  # blank input: LRP-0 meets 0/0
@example(x=np.full((2, 6), -10.0), target=2, composite="epsilon_gamma_box")
def test_engine_gives_finite_heatmaps_on_bounded_inputs(x, target, composite):
    R = relevance(_model(), x, target, composite=composite, low=-10.0, high=10.0)
    assert R.shape == x.shape and R.dtype == tf.as_dtype(x.dtype)
    assert np.isfinite(R.numpy()).all()
