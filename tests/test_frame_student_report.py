"""scripts/frame_student_report.py: its cosines and unit counts against hand computations.

The cosine is checked on a linear model, whose ``epsilon_gamma_box`` map is the z^B rule of
its only layer, written out in NumPy; the unit counts on a ReLU6 layer whose three channels
are dead, capped and alive by construction.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from drawn_shapes import write_folder
from heatinv.targets import pattern_map

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "frame_student_report.py")


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("frame_student_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def linear_model(seed: int = 0) -> keras.Model:
    inputs = keras.Input((32, 32, 3))
    logits = keras.layers.Dense(3, use_bias=False)(keras.layers.Flatten()(inputs))
    model = keras.Model(inputs, logits)
    kernel = np.random.default_rng(seed).normal(size=(32 * 32 * 3, 3)).astype("float32")
    model.set_weights([kernel])
    return model


def test_frame_cosine_is_the_z_box_map_of_a_linear_model(report):
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (5, 32, 32, 3)).astype("float32")
    labels = np.array([0, 1, 2, 1, 0])
    model = linear_model()
    cosine, logits = report.frame_cosines(model, x, labels)

    w = model.get_weights()[0].astype("float64")
    flat = x.reshape(5, -1).astype("float64")
    frame = pattern_map("frame", 32)[..., 0].ravel().astype("float64")
    for n, label in enumerate(labels):
        # z^B with the box [0, 1]: x w - low w+ - high w-, shares of the logit.
        contribution = flat[n] * w[:, label] - np.minimum(w[:, label], 0.0)
        relevance = contribution / contribution.sum() * (flat[n] @ w[:, label])
        summed = relevance.reshape(32, 32, 3).sum(axis=-1).ravel()
        expected = summed @ frame / (np.linalg.norm(summed) * np.linalg.norm(frame))
        np.testing.assert_allclose(cosine[n], expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(logits[n], flat[n] @ w, rtol=1e-4)


def test_unit_report_counts_dead_capped_and_live_channels(report):
    inputs = keras.Input((4,))
    dense = keras.layers.Dense(3)
    outputs = keras.layers.ReLU(max_value=6.0, name="relu6")(dense(inputs))
    model = keras.Model(inputs, outputs)
    kernel = np.array([[-1, 0, 1], [-1, 0, 0], [-1, 0, 0], [-1, 0, 0]], "float32")
    model.set_weights([kernel, np.array([-0.1, 10.0, -0.5], "float32")])  # dead, capped at 6, alive
    x = np.random.default_rng(2).uniform(0, 1, (64, 4)).astype("float32")

    [(name, at_zero, at_cap, dead)] = report.unit_report(model, x)
    assert name == "relu6"
    live_zeros = np.sum(x[:, 0] <= 0.5)
    assert at_zero == pytest.approx((64 + live_zeros) / (3 * 64))
    assert at_cap == pytest.approx(1 / 3)
    assert dead == pytest.approx(1 / 3)


def test_the_script_reports_each_class_of_a_folder(tmp_path):
    folder = write_folder(str(tmp_path / "shapes"), count=30)
    path = str(tmp_path / "linear.keras")
    linear_model().save(path)
    done = subprocess.run([sys.executable, SCRIPT, folder, path], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{path}: held-out cosine to the frame" in done.stdout
    for name in ("cross", "disk", "square"):
        assert f"  class {name}: cosine mean" in done.stdout
