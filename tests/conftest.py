"""Shared fixtures: a seeded RNG and one registry of tiny Keras models every test reuses."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# AutoGraph failures must raise instead of silently running the Python function.
os.environ.setdefault("AUTOGRAPH_STRICT_CONVERSION", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


def _randomize(model: keras.Model, rng: np.random.Generator) -> keras.Model:
    """Non-zero biases and non-trivial BatchNorm statistics, so no term is vacuous."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights(
                [
                    rng.uniform(0.5, 1.5, gamma.shape).astype(gamma.dtype),
                    rng.normal(0, 0.2, beta.shape).astype(beta.dtype),
                    rng.normal(0, 0.2, mean.shape).astype(mean.dtype),
                    rng.uniform(0.5, 2.0, var.shape).astype(var.dtype),
                ]
            )
        elif getattr(layer, "use_bias", False):
            kernel, bias = layer.get_weights()
            layer.set_weights([kernel, rng.normal(0, 0.1, bias.shape).astype(bias.dtype)])
    return model


def dense_model(dtype: str = "float32", seed: int = 0, final_activation: str | None = None) -> keras.Model:
    """Dense-ReLU-Dense-ReLU-Dense on 6 features, 3 classes."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((6,), dtype=dtype),
            keras.layers.Dense(8, activation="relu", dtype=dtype),
            keras.layers.Dense(5, activation="relu", dtype=dtype),
            keras.layers.Dense(3, activation=final_activation, dtype=dtype),
        ]
    )
    return _randomize(model, np.random.default_rng(seed))


def conv_model(dtype: str = "float32", seed: int = 0, pool: str = "max", channels: int = 2) -> keras.Model:
    """Conv-BN-ReLU-Pool-Conv-ReLU-AvgPool-Flatten-Dense on 8x8x``channels`` inputs, 3 classes (functional).

    ``pool="average"`` swaps the max pooling out: XLA has no float64 kernel for the second
    derivative of max pooling (MaxPoolGradGrad). ``channels=1`` (grayscale) takes the
    first layer's transposed maps through ``single_channel_transpose``.
    """
    pooling = {"max": keras.layers.MaxPooling2D, "average": keras.layers.AveragePooling2D}[pool]
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, channels), dtype=dtype)
    h = keras.layers.Conv2D(4, 3, padding="same", dtype=dtype)(inputs)
    h = keras.layers.BatchNormalization(dtype=dtype)(h)
    h = keras.layers.ReLU(dtype=dtype)(h)
    h = pooling(2, dtype=dtype)(h)
    h = keras.layers.Conv2D(3, 3, strides=1, padding="same", activation="relu", dtype=dtype)(h)
    h = keras.layers.AveragePooling2D(2, dtype=dtype)(h)
    h = keras.layers.Flatten(dtype=dtype)(h)
    outputs = keras.layers.Dense(3, dtype=dtype)(h)
    return _randomize(keras.Model(inputs, outputs), np.random.default_rng(seed))


MODELS = {"dense": dense_model, "conv": conv_model, "conv_grayscale": functools.partial(conv_model, channels=1)}


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def inputs_for(model: keras.Model, rng: np.random.Generator, batch: int = 3) -> np.ndarray:
    """A batch in [0, 1] (the zbox default range), in the model's input dtype."""
    shape = (batch,) + tuple(model.inputs[0].shape[1:])
    return rng.uniform(0.0, 1.0, shape).astype(model.inputs[0].dtype)


SMOKE = "debug=smoke"
"""The one "shrink it for tests" setting: ``configs/debug/smoke.yaml`` (a tiny model, a few steps)."""


def compose_run(out, cache, *overrides: str):
    """The ``train`` config as the command line composes it, shrunk by ``debug=smoke``, writing to ``out``.

    Every test that runs the trainer in-process composes its config here; ``overrides`` come
    last, so a test can undo any part of the smoke setting (e.g. ``trainer.steps=40``).
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from heatinv.config import register

    register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="heatinv.configs", version_base="1.3"):
            return compose(
                "train",
                overrides=[SMOKE, f"paths.output_dir={out}", f"paths.cache_dir={cache}", f"paths.root={out}", *overrides],
            )
    finally:
        GlobalHydra.instance().clear()


def train_command(run_dir, cache, *overrides: str) -> list[str]:
    """``python -m heatinv.train`` with the smoke setting, writing to ``run_dir`` (for subprocess tests)."""
    import sys

    return [sys.executable, "-m", "heatinv.train", SMOKE, f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache}", *overrides]


@pytest.fixture(scope="session")
def reference_cache(tmp_path_factory):
    """One reference-model cache for the session: each reference architecture trains once."""
    return tmp_path_factory.mktemp("reference-cache")


@pytest.fixture
def composed(tmp_path_factory, reference_cache):
    """``composed(*overrides) -> (cfg, out)``: :func:`compose_run` with a fresh output dir and the session's cache."""

    def make(*overrides: str):
        out = tmp_path_factory.mktemp("run")
        return compose_run(out, reference_cache, *overrides), out

    return make


@pytest.fixture
def config(tmp_path, reference_cache):
    """``config(*overrides)``: the smoke-sized config writing to ``tmp_path / "run"``."""
    return lambda *overrides: compose_run(tmp_path / "run", reference_cache, *overrides)


def expect(error_type, cfg, *fragments: str, out=None) -> str:
    """Run ``cfg``; it must raise ``error_type`` with one paragraph holding every fragment, and leave no metrics.json in ``out``."""
    from heatinv.train import run

    with pytest.raises(error_type) as caught:
        run(cfg)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert "\n" not in message.strip(), "one paragraph"
    if out is not None:
        assert not (out / "metrics.json").exists()
    return message


# --------------------------------------------------------------------------- one loss sweep, two launchers
SWEEP_LOSSES = ("l1", "mse", "huber")
SWEEP_SHRINK = (SMOKE, "trainer.steps=3")


def loss_sweep(cwd, cache, *launcher: str):
    """``python -m heatinv.train -m loss=l1,mse,huber`` (3 steps each) in ``cwd``; returns the process and the sweep dir.

    Run as a user runs it, in a scratch working directory with no ``configs/`` folder: the
    configs must come from the installed ``heatinv.configs`` package.
    """
    import subprocess
    import sys

    sweep_dir = os.path.join(str(cwd), "sweep")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "HYDRA_FULL_ERROR": "0"}
    command = [sys.executable, "-m", "heatinv.train", "-m", f"loss={','.join(SWEEP_LOSSES)}", *SWEEP_SHRINK,
               f"hydra.sweep.dir={sweep_dir}", f"paths.cache_dir={cache}", *launcher]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600), sweep_dir


@pytest.fixture(scope="session")
def basic_sweep(tmp_path_factory):
    """The loss sweep with Hydra's basic launcher (all jobs in one process) and a cold cache in its folder."""
    cwd = tmp_path_factory.mktemp("basic")
    return loss_sweep(cwd, cwd / "cache")


@pytest.fixture(scope="session")
def joblib_sweep(tmp_path_factory, basic_sweep):
    """The same sweep with the joblib launcher (two workers), shared by tests/test_sweeps.py and tests/test_launchers.py.

    It uses the basic sweep's (warm) reference cache: both sweeps then explain the same
    reference, so their numbers can be compared, and the workers do not each train it again
    (two workers writing one cache entry at once is test_models.py's
    test_reference_cache_survives_a_concurrent_writer).
    """
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason='needs the "joblib" extra: pip install -e ".[joblib]"')
    _, basic_dir = basic_sweep
    cache = os.path.join(os.path.dirname(basic_dir), "cache")
    return loss_sweep(tmp_path_factory.mktemp("joblib"), cache, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
