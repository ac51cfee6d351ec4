"""Values outside the range the model works in are refused when they are loaded (issue #17).

An image of 1e38 used to reach the doctor, which blamed a zero division and a zero
residual. Now the loaders refuse, with the file, the value and the fix: values that are
NaN or Inf in float32, and values beyond :func:`heatinv.maps_io.magnitude_limit`, where
float32 cannot square and sum the map. The command line exits 2 with that paragraph and
writes no results.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from heatinv import data, maps_io
from heatinv.similarity import similarity


def _save(path, array) -> str:
    np.save(path, array)
    return str(path)


def test_magnitude_limit_is_where_float32_stops_summing_squares():
    limit = maps_io.magnitude_limit(784)
    assert limit == pytest.approx(math.sqrt(3.4028234663852886e38 / 784), rel=1e-12)
    # the bound is tight: just below it a 28x28 map's squares sum to a finite number, just above to inf
    below, above = np.full(784, limit * 0.999, np.float32), np.full(784, limit * 1.001, np.float32)
    assert np.isfinite(np.sum(np.square(below), dtype=np.float32))
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.sum(np.square(above), dtype=np.float32))


def test_beyond_the_limit_a_metric_silently_goes_wrong():
    """Why the loader refuses: heatinv's cosine of a target past the bound is -0.0, not its value."""
    heatmap = np.random.default_rng(0).normal(size=(1, 28, 28, 1)).astype(np.float32)
    limit = maps_io.magnitude_limit(784)
    exact = float(np.sum(heatmap.astype(np.float64)) / (np.linalg.norm(heatmap.astype(np.float64)) * 28.0))
    inside = float(similarity(heatmap, np.full_like(heatmap, limit * 0.99))["cosine"])
    outside = float(similarity(heatmap, np.full_like(heatmap, limit * 1.01))["cosine"])
    assert inside == pytest.approx(exact, rel=1e-4) and abs(exact) > 1e-2
    assert outside == 0.0


def test_image_of_1e38_is_refused_with_the_file_the_value_and_the_fix(tmp_path):
    path = _save(tmp_path / "huge.npy", np.full((28, 28), 1e38, np.float32))
    with pytest.raises(ValueError) as caught:
        maps_io.read_map(path, expected_shape=(28, 28, 1), what="target.image")
    message = str(caught.value)
    for fragment in ("huge.npy", "target.image", "1e+38", "+-6.6e+17", "[0, 1]", "np.abs(array).max()"):
        assert fragment in message, (fragment, message)
    assert "\n" not in message


def test_values_just_inside_the_limit_load_unchanged(tmp_path):
    limit = maps_io.magnitude_limit(784)
    array = np.zeros((28, 28), np.float64)
    array[0, 0], array[27, 27] = 0.99 * limit, -0.99 * limit
    got = maps_io.read_map(_save(tmp_path / "edge.npy", array), expected_shape=(28, 28, 1))
    assert got.dtype == np.float32 and got[0, 0, 0] == np.float32(0.99 * limit)


@pytest.mark.parametrize(
    "value, shown",
    [(np.inf, "inf"), (-np.inf, "-inf"), (np.nan, "nan"), (1e39, "1e+39")],  # 1e39 is finite in float64, inf in float32
)
def test_values_that_are_not_finite_in_float32_are_refused(tmp_path, value, shown):
    array = np.ones((28, 28), np.float64)
    array[4, 7] = value
    with pytest.raises(ValueError) as caught:
        maps_io.read_map(_save(tmp_path / "bad.npy", array), what="target.image")
    message = str(caught.value)
    for fragment in ("bad.npy", "target.image", "1 NaN or infinite value(s) in float32", "(4, 7)", f"is {shown}",
                     "np.nan_to_num"):
        assert fragment in message, (fragment, message)


def _fake_mnist(path, x_train) -> str:
    labels = np.arange(len(x_train)) % 10
    np.savez(path, x_train=x_train, y_train=labels, x_test=np.zeros((3, 28, 28), np.uint8), y_test=np.arange(3))
    return str(path)


@pytest.mark.parametrize(
    "value, fragment",
    [(np.nan, "1 NaN or infinite values"), (np.inf, "1 NaN or infinite values"), (1e38, "values in [0.5, 1e+38]"),
     (-0.5, "values in [-0.5, 0.5]")],
)
def test_mnist_images_outside_0_1_are_refused_with_the_value(tmp_path, value, fragment):
    x = np.full((4, 28, 28), 0.5, np.float32)
    x[1, 2, 3] = value
    with pytest.raises(ValueError) as caught:
        data.load_mnist(_fake_mnist(tmp_path / "mnist.npz", x))
    message = str(caught.value)
    for part in ("mnist.npz", "x_train", fragment, "x / 255", "data=digits"):
        assert part in message, (part, message)


def test_mnist_float_images_in_0_1_still_load(tmp_path):
    x = np.random.default_rng(0).uniform(0, 1, (4, 28, 28)).astype(np.float32)
    ds = data.load_mnist(_fake_mnist(tmp_path / "mnist.npz", x))
    np.testing.assert_array_equal(ds.x_train[..., 0], x)


# --- through the command line -------------------------------------------------------


def _train(tmp_path, cache, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", "heatinv.train", "model.hidden=[16,8]", "model.reference_epochs=1", "trainer.steps=2",
         f"hydra.run.dir={tmp_path / 'run'}", f"paths.cache_dir={cache}", *overrides],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
    )


@pytest.mark.slow
def test_command_line_refuses_the_image_with_exit_2_and_no_results(tmp_path, reference_cache):
    """One run through the command line's exit-2 handler; the other refusals of ``target.image``
    (NaN, inf, float32 overflow) raise the same ValueError from the same read and are checked
    in-process above (test_values_that_are_not_finite_in_float32_are_refused)."""
    image, fragments = np.full((28, 28), 1e38, np.float32), ("holds values up to 1e+38", "+-6.6e+17", "np.abs(array).max()")
    heatmap = _save(tmp_path / "heatmap.npy", np.random.default_rng(0).normal(0, 0.01, (28, 28)).astype(np.float32))
    bad = _save(tmp_path / "image.npy", image)
    done = _train(tmp_path, reference_cache, "target=file", f"target.path={heatmap}", f"target.image={bad}")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    for fragment in ("image.npy", "target.image", *fragments):
        assert fragment in done.stderr, (fragment, done.stderr[-3000:])
    for result in ("metrics.json", "student.keras", "heatmaps.png", "doctor.json"):
        assert not (tmp_path / "run" / result).exists(), result


def test_png_images_are_always_in_range(tmp_path):
    """A PNG decodes to [0, 1], so the range checks never refuse one (the 16-bit extreme included)."""
    pixels = np.full((28, 28, 1), 65535, np.uint16)
    path = tmp_path / "white.png"
    path.write_bytes(tf.io.encode_png(pixels).numpy())
    got = maps_io.read_map(str(path), expected_shape=(28, 28, 1))
    assert got.max() == 1.0
