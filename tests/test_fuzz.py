"""Property-based tests: arbitrary arrays, shapes and dtypes give a valid result or the documented error.

Bounded (``max_examples``) so CI time stays fixed; a crash, a hang or an undocumented
exception type fails the test.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conftest import dense_model
from heatinv.lrp import relevance
from heatinv.maps_io import read_map

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

dtypes = st.sampled_from(["float32", "float64", "float16", "int8", "int64", "uint8", "bool", "complex64", "U3"])
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=30)


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


@SETTINGS
@given(array=arrays(), expected=st.sampled_from([None, (28, 28, 1), (784,)]))
def test_npy_loader_returns_a_finite_float_map_or_a_documented_error(array, expected):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "map.npy")
        np.save(path, array)
        try:
            result = read_map(path, expected_shape=expected, what="target.path")
        except ValueError as error:
            assert path in str(error) or "map.npy" in str(error)
            return
        assert result.dtype == np.float32 and np.isfinite(result).all()
        if expected is not None:
            assert result.shape == expected


@SETTINGS
@given(payload=st.binary(max_size=300))
def test_npy_loader_survives_arbitrary_bytes(payload):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "junk.npy")
        with open(path, "wb") as f:
            f.write(payload)
        with pytest.raises(ValueError):
            read_map(path)


def test_npy_loader_refuses_pickled_objects(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="(?i)pickle"):
        read_map(str(path))


@SETTINGS
@given(image=hnp.arrays(np.uint8, hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=40)))
def test_png_loader_returns_the_expected_shape_or_a_documented_error(image):
    if image.ndim == 3 and image.shape[-1] not in (1, 2, 3, 4):
        image = image[..., :1]
    if image.ndim == 2:
        image = image[..., None]
    encoded = tf.io.encode_png(image).numpy()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "map.png")
        with open(path, "wb") as f:
            f.write(encoded)
        try:
            result = read_map(path, expected_shape=(28, 28, 1))
        except ValueError as error:
            assert "map.png" in str(error)
            return
        assert result.shape == (28, 28, 1) and 0.0 <= result.min() and result.max() <= 1.0


_MODEL = None


def _model():
    global _MODEL
    if _MODEL is None:
        _MODEL = dense_model("float32")
    return _MODEL


@SETTINGS
@given(x=arrays(), target=st.one_of(st.integers(-5, 8), arrays()))
def test_engine_input_validation_gives_a_heatmap_or_a_documented_error(x, target):
    model = _model()
    try:
        R = relevance(model, x, target, composite="epsilon")
    except (TypeError, ValueError) as error:
        assert str(error)
        return
    assert R.shape == np.shape(x) and R.dtype == tf.as_dtype(np.asarray(x).dtype)


