"""heatinv.invert: the single task from Python, on a model and arrays in memory.

It must be the command line's trainer (the same final loss and cosine for the same model,
input, target and settings), leave the caller's model as it was, write a run folder only
where asked, and refuse wrong shapes and settings naming what was given and what was expected.
"""

from __future__ import annotations

import os
import tempfile

import keras
import numpy as np
import pytest

import heatinv
from heatinv.checkpoints import RunDirectoryError
from heatinv.config import ConfigError
from heatinv.data import load_digits
from heatinv.lrp import UnsupportedLayerError


def small_model(input_shape=(8, 8, 1), seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)],
        name="small",
    )


def image(shape=(8, 8, 1), seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(size=shape).astype("float32")


def test_the_notebook_story_in_a_few_lines(tmp_path, monkeypatch):
    """invert, then read the metrics, the history and the figure; the caller's model is untouched and no file is left."""
    model, x = small_model(), image()
    before = [w.copy() for w in model.get_weights()]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's own: other workers' runs make folders too
    result = heatinv.invert(model, x, "frame", steps=60, composite="epsilon_plus", learning_rate=1e-2)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert result.student is not model
    assert result.metrics["steps"] == 60 and result.metrics["cosine"] > 0.9
    assert result.metrics["student_accuracy"] is None and result.metrics["reference_accuracy"] is None  # no data given
    assert [h["step"] for h in result.history][-1] == 60 and result.history[-1]["cosine"] > result.history[0]["cosine"]
    assert {k: v.shape for k, v in result.heatmaps.items()} == {"initial": (1, 8, 8, 1), "final": (1, 8, 8, 1), "target": (1, 8, 8, 1)}
    assert result.label == int(np.argmax(model(x[None])[0]))
    np.testing.assert_allclose(result.heatmaps["final"], heatinv.lrp.relevance(result.student, x[None], result.label, "epsilon_plus"),
                               rtol=1e-5, atol=1e-7)
    assert result.plot().axes and result._repr_png_().startswith(b"\x89PNG")
    assert not [name for name in os.listdir(tmp_path) if name.startswith("heatinv-invert-")]


def test_invert_and_the_command_line_give_the_same_run(tmp_path, composed):
    """One trainer: the same model file, image, target, label and settings through both doors.

    Measured: the final loss and cosine equal to the last bit (rtol 1e-6 asserted)."""
    from heatinv.train import run

    digits = load_digits()
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input(digits.input_shape), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10)], name="digits_mlp")
    model.save(tmp_path / "model.keras")
    x, target = digits.x_test[0], np.zeros(digits.input_shape[:2], "float32")
    target[2:6, 2:6] = 1.0 / 16
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "target.npy", target)
    cfg, out = composed(
        "model=file", f"model.path={tmp_path / 'model.keras'}", "init=reference", "target=file",
        f"target.path={tmp_path / 'target.npy'}", f"target.image={tmp_path / 'x.npy'}", "target.label=4",
        "trainer.steps=30", "trainer.log_every=10", "lrp=epsilon_plus", "optimizer.lr=0.01",
    )
    by_command_line = run(cfg)
    result = heatinv.invert(
        model, x, target, label=4, steps=30, log_every=10, composite="epsilon_plus", learning_rate=0.01,
        data=(digits.x_test, digits.y_test),
    )
    for key in ("loss", "cosine", "ssim", "reference_accuracy", "student_accuracy"):
        assert result.metrics[key] == pytest.approx(by_command_line[key], rel=1e-6), key
    assert result.metrics["steps"] == by_command_line["steps"] == 30


def test_a_logdir_gets_the_command_lines_run_folder_and_is_not_overwritten(tmp_path):
    model, x = small_model(), image()
    heatinv.invert(model, x, "square", steps=4, log_every=2, logdir=str(tmp_path / "run"))
    written = set(os.listdir(tmp_path / "run"))
    assert {"metrics.json", "student.keras", "heatmaps.png", "heatmaps.svg", "doctor.json", "tensorboard", "checkpoints"} <= written
    with pytest.raises(RunDirectoryError, match=r"invert\(\) logdir=.*holds a run already.*overwrite=True"):
        heatinv.invert(model, x, "square", steps=4, logdir=str(tmp_path / "run"))
    heatinv.invert(model, x, "square", steps=4, logdir=str(tmp_path / "run"), overwrite=True)


def test_colour_images_tables_and_float64():
    colour = small_model((6, 6, 3))
    result = heatinv.invert(colour, image((6, 6, 3)), np.ones((6, 6)), steps=4, composite="epsilon_plus")
    assert result.heatmaps["final"].shape == (1, 6, 6, 1)  # summed over the colour channels
    kept = heatinv.invert(colour, image((6, 6, 3)), np.ones((6, 6)), steps=4, composite="epsilon_plus", channels="keep")
    assert kept.heatmaps["target"].shape == (1, 6, 6, 3)
    table = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    result = heatinv.invert(table, [0.1, 0.5, 0.2, 0.9, 0.3], [0, 0, 1.0, 0, 0], steps=4, composite="epsilon", precision="float64")
    assert result.heatmaps["final"].shape == (1, 5) and result.student.weights[0].dtype == "float64"


def test_wrong_shapes_and_settings_name_what_was_given_and_expected():
    model, x = small_model(), image()
    with pytest.raises(ValueError, match=r"target has shape \(7, 7\).*\(8, 8, 1\)"):
        heatinv.invert(model, x, np.ones((7, 7)), steps=2)
    with pytest.raises(ValueError, match=r"x has shape \(8, 8, 3\).*\(8, 8, 1\)"):
        heatinv.invert(model, np.ones((8, 8, 3)), "frame", steps=2)
    with pytest.raises(ValueError, match=r"'circle'.*\['square', 'cross', 'frame'\]"):
        heatinv.invert(model, x, "circle", steps=2)
    with pytest.raises(ValueError, match="all zeros"):
        heatinv.invert(model, x, np.zeros((8, 8)), steps=2)
    with pytest.raises(ConfigError, match=r"epsilonn=0.1 is no key.*Did you mean epsilon"):
        heatinv.invert(model, x, "frame", steps=2, epsilonn=0.1)
    with pytest.raises(ConfigError, match=r"pattern='cross' is not taken here: give the pattern as the target argument"):
        heatinv.invert(model, x, "square", steps=2, pattern="cross")
    with pytest.raises(ConfigError, match=r"scale=5 is not taken here: it sizes a pattern"):
        heatinv.invert(model, x, np.ones((8, 8)), steps=2, scale=5)
    with pytest.raises(ConfigError, match=r"resume=True is not taken here: a run started from Python does not resume"):
        heatinv.invert(model, x, "frame", steps=2, resume=True)
    with pytest.raises(ValueError, match=r"data holds x of shape \(4, 8, 8, 1\) and y of shape \(4, 3\)"):
        heatinv.invert(model, x, "frame", steps=2, data=(np.ones((4, 8, 8, 1)), np.eye(3)[[0, 1, 2, 0]]))
    with pytest.raises(ConfigError, match=r"steps=-1 must be > 0"):
        heatinv.invert(model, x, "frame", steps=-1)
    recurrent = keras.Sequential([keras.Input((8, 8)), keras.layers.SimpleRNN(4, name="rnn"), keras.layers.Dense(2)])
    with pytest.raises(UnsupportedLayerError, match="'rnn'"):
        heatinv.invert(recurrent, np.ones((8, 8)), np.ones((8, 8)), steps=2)


def test_a_text_classifier_of_token_ids_is_inverted_token_by_token():
    from heatinv.transformers import text_classifier

    keras.utils.set_random_seed(0)
    model = text_classifier(6, 20, 2, dim=8, depth=1, heads=2)
    ids = np.array([3, 5, 7, 9, 0, 0])  # two padding tokens
    target = np.array([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # all on the second word
    result = heatinv.invert(model, ids, target, steps=60, learning_rate=1e-2)
    assert result.x.dtype == np.int32 and result.heatmaps["final"].shape == (1, 6)
    assert result.metrics["cosine"] > 0.99 and np.all(result.heatmaps["final"][0, 4:] == 0.0)  # padding gets none
    assert result.plot().axes  # the words (#id without a vocabulary) coloured by relevance
