"""Bad input gets one clear paragraph (what, where, the fix), a non-zero exit, and no results written.

In-process tests check each message and the exception's type; subprocess tests check the
command line's exit code, that no Python traceback is shown, and that no ``metrics.json`` is
left behind, once per type the command line's exit-2 handler catches (ConfigError and
FileNotFoundError here; ValueError in test_extreme_values.py, RunDirectoryError in
test_reliability.py): every bad input with such a type takes the same path out.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import compose_run, expect, train_command
from heatinv.config import ConfigError
from heatinv.lrp import UnsupportedLayerError


def test_missing_target_file(config, tmp_path):
    expect(FileNotFoundError, config("target=file", f"target.path={tmp_path}/nope.npy"),
           f"no file at '{tmp_path}/nope.npy' given as target.path", "set target.path=", "relative paths",
           out=tmp_path / "run")


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["target=file", "target.path={tmp}/nope.npy"], "no file at '{tmp}/nope.npy' given as target.path"),
        (["target=file", "target.path={tmp}/small.npy"], "(10, 10)"),
        (["target=file", "target.path={tmp}/map.npy", "target.image={tmp}/nope.npy"], "given as target.image"),
        (["target=pattern", "target.pattern=file", "target.path={tmp}/nope.npy"], "given as target.path"),
        (["task=dataset", "target=pattern", "target.pattern=file", "target.path={tmp}/small.npy"], "(10, 10)"),
        (["task=dataset", "target=pattern", "target.pattern=file", "target.path={tmp}/flat.npy"], "flat.npy (target.path) sums to 0"),
    ],
)
def test_target_files_are_read_before_the_reference_trains(tmp_path, overrides, fragment):
    """A missing target file was reported only after the reference model had trained (minutes for a CNN)."""
    np.save(tmp_path / "small.npy", np.ones((10, 10), "float32"))
    np.save(tmp_path / "map.npy", np.ones((28, 28), "float32"))
    flat = np.zeros((28, 28), "float32")
    flat[0, 0], flat[1, 1] = 1.0, -1.0
    np.save(tmp_path / "flat.npy", flat)
    cache = tmp_path / "cache"
    cfg = compose_run(tmp_path / "run", cache, *(o.format(tmp=tmp_path) for o in overrides))
    expect((FileNotFoundError, ValueError), cfg, fragment.format(tmp=tmp_path), out=tmp_path / "run")
    assert not cache.exists() or not any(cache.iterdir()), "a reference was trained (and cached) first"


def test_missing_model_file(config, tmp_path):
    expect(FileNotFoundError, config("model=file", f"model.path={tmp_path}/nope.keras"),
           f"Model file {tmp_path}/nope.keras (model.path) does not exist", "Point model.path at", ".keras or .h5")


def test_missing_mnist_file_says_where_to_put_it(config, tmp_path):
    expect(FileNotFoundError, config("data=mnist", f"data.path={tmp_path}/mnist.npz"),
           "no MNIST file found", f"'{tmp_path}/mnist.npz'", "~/.keras/datasets/mnist.npz", "data.path=", "data=digits")


def test_target_with_the_wrong_shape(config, tmp_path):
    np.save(tmp_path / "t.npy", np.ones((10, 10), "float32"))
    expect(ValueError, config("target=file", f"target.path={tmp_path}/t.npy"), "t.npy", "(10, 10)", "(28, 28, 1)")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_target_with_non_finite_values(config, tmp_path, bad):
    target = np.ones((28, 28), "float32")
    target[3, 4] = bad
    np.save(tmp_path / "t.npy", target)
    message = expect(ValueError, config("target=file", f"target.path={tmp_path}/t.npy"), "t.npy",
                     "contains 1 NaN or infinite value(s)", "(3, 4)", "np.nan_to_num")
    assert repr(float(bad)) in message  # the value itself


def test_all_zero_target(config, tmp_path):
    np.save(tmp_path / "t.npy", np.zeros((28, 28), "float32"))
    expect(ValueError, config("target=file", f"target.path={tmp_path}/t.npy"), "all zeros", "t.npy (target.path)", "np.save")


def test_png_with_the_wrong_size(config, tmp_path):
    (tmp_path / "t.png").write_bytes(tf.io.encode_png(np.full((20, 20, 1), 200, np.uint8)).numpy())
    expect(ValueError, config("target=file", f"target.path={tmp_path}/t.png"), "t.png", "(28, 28, 1)")


def test_png_that_is_not_an_image(config, tmp_path):
    (tmp_path / "t.png").write_bytes(b"not a png at all")
    expect(ValueError, config("target=file", f"target.path={tmp_path}/t.png"), "t.png",
           "could not be read as a .png file", "re-export it")


def test_npy_holding_objects_is_refused(config, tmp_path):
    np.save(tmp_path / "t.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    expect(ValueError, config("target=file", f"target.path={tmp_path}/t.npy"), "t.npy", "pickle")


def test_model_with_a_lambda_layer_is_refused_by_safe_mode(config, tmp_path):
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Lambda(lambda v: v * 2),
                              keras.layers.Dense(10)])
    model.save(tmp_path / "lambda.keras")
    expect(ValueError, config("model=file", f"model.path={tmp_path}/lambda.keras"), "lambda.keras", "safe_mode")


def test_model_with_an_unsupported_layer(config, tmp_path):
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(8),
                              keras.layers.UnitNormalization(name="un"), keras.layers.Dense(10)])
    model.save(tmp_path / "un.keras")
    expect(UnsupportedLayerError, config("model=file", f"model.path={tmp_path}/un.keras"), "'un'", "UnitNormalization",
           "Supported layers")


def test_model_file_with_two_outputs(config, tmp_path):
    inputs = keras.Input((28, 28, 1))
    hidden = keras.layers.Dense(8)(keras.layers.Flatten()(inputs))
    keras.Model(inputs, [keras.layers.Dense(10)(hidden), keras.layers.Dense(1)(hidden)]).save(tmp_path / "two.keras")
    expect(ValueError, config("model=file", f"model.path={tmp_path}/two.keras"), "two.keras", "2 outputs",
           "[(None, 10), (None, 1)]", "keras.Model(model.inputs[0], model.outputs[k])")


def test_model_file_whose_input_is_not_an_image(config, tmp_path):
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(10)])
    model.save(tmp_path / "five.keras")
    expect(ValueError, config("model=file", f"model.path={tmp_path}/five.keras"), "five.keras", "(None, 28, 28, 1)")


@pytest.mark.parametrize(
    "override, key",
    [("trainer.steps=0", "trainer.steps"), ("optimizer.lr=-1", "optimizer.lr"), ("target.label=-1", "target.label"),
     ("lrp.low=2", "lrp.low")],
)
def test_out_of_range_config_values(config, override, key):
    expect(ConfigError, config(override), key)


@pytest.mark.parametrize(
    "overrides, fix",
    [(("task=dataset", "target=digit7"), "task=single"), (("task=single", "target=swap"), "task=dataset")],
)
def test_a_target_of_the_other_task_names_the_task_that_takes_it(config, overrides, fix):
    expect(ConfigError, config(*overrides), "does not go with", f"switch task ({fix})", "e.g. target=pattern")


def test_a_table_is_offered_a_target_for_tables(config):
    expect(ConfigError, config("data=tabular", "task=dataset", "target=digit7"), "does not go with",
           "e.g. target=suppress_feature target.feature=<name>")


def _cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        train_command(tmp_path / "run", tmp_path / "cache", *overrides),
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )


@pytest.mark.slow
def test_command_line_config_error_exits_2_with_the_message_and_no_traceback(tmp_path):
    done = _cli(tmp_path, "trainer.steps=0")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "trainer.steps" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow
def test_command_line_key_of_an_unpicked_choice_exits_2_naming_the_choice(tmp_path):
    """`target.pattern=frame` without `target=pattern` trained digit7's own heatmap for 300 steps."""
    done = _cli(tmp_path, "target.pattern=frame")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "target.pattern=frame is read only with target=pattern, and this run has target.kind='class'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("metrics.json"))


@pytest.mark.slow
def test_command_line_missing_model_file_is_one_message_exit_2_and_no_results(tmp_path):
    missing = "/nonexistent.keras"
    done = _cli(tmp_path, "model=file", f"model.path={missing}")
    assert done.returncode == 2, done.stderr[-2000:]
    messages = [line for line in done.stderr.splitlines() if line.startswith("heatinv:")]
    assert len(messages) == 1, done.stderr[-3000:]
    (message,) = messages
    assert missing in message and "model.path" in message
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("metrics.json"))


def test_an_unknown_data_name_says_where_each_kind_of_data_goes(config):
    expect(ConfigError, config("data=tabular", "data.name=iris"), "data.name='iris'", "data.name=breast_cancer or wine",
           "data=csv data.path=<file>.csv data.label_column=<column>", "data=folder")
