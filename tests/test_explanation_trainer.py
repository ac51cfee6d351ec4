"""heatinv.keras.ExplanationTrainer: Keras's fit with an explanation term, and Keras's own callbacks.

Checked: the term moves the heatmaps; the same single problem through ``fit`` and through
:func:`heatinv.invert` ends at the same heatmap; TensorBoard, ModelCheckpoint, EarlyStopping,
TerminateOnNaN, BackupAndRestore after a SIGKILL mid-epoch (in fresh processes), XLA,
``steps_per_execution`` and MirroredStrategy on two logical CPUs (a fresh process).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import heatinv
from heatinv.data import load_digits
from heatinv.keras import ExplanationTrainer
from heatinv.losses import heatmap_loss
from heatinv.lrp import LRP
from heatinv.similarity import cosine_numpy
from heatinv.targets import pattern_map

FIT = os.path.join(os.path.dirname(__file__), "explanation_fit.py")
_digits: dict = {}


def digits(n: int = 128):
    """``(x, y, frame targets)`` of the first ``n`` training digits."""
    if "data" not in _digits:
        _digits["data"] = load_digits()
    data = _digits["data"]
    x, y = data.x_train[:n], data.y_train[:n].astype("int32")
    return x, y, np.repeat(pattern_map("frame", x.shape[1], width=x.shape[2])[None], n, axis=0)


def student(input_shape, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10)], name="student")


def trainer_for(model, weight: float = 10.0, **compile_args) -> ExplanationTrainer:
    trainer = ExplanationTrainer(model, composite="epsilon_gamma_box")
    trainer.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    explanation_loss="mse", explanation_weight=weight, metrics=["accuracy"], **compile_args)
    return trainer


def batches(x, y, t, size: int = 32):
    return tf.data.Dataset.from_tensor_slices((x, y, t)).batch(size)


def test_fit_moves_the_heatmaps_and_reports_the_term():
    x, y, t = digits()
    trainer = trainer_for(student(x.shape[1:]))
    history = trainer.fit(batches(x, y, t), validation_data=batches(x, y, t), epochs=4, verbose=0).history
    assert {"loss", "accuracy", "explanation_loss", "explanation_cosine", "val_explanation_cosine"} <= set(history)
    assert history["explanation_loss"][-1] < 0.8 * history["explanation_loss"][0]  # measured 0.73
    assert history["explanation_cosine"][-1] > history["explanation_cosine"][0] + 0.2
    R = LRP(trainer.student, "epsilon_gamma_box")(x, y).numpy()
    np.testing.assert_allclose(cosine_numpy(R, t).mean(), trainer.evaluate(batches(x, y, t), return_dict=True, verbose=0)[
        "explanation_cosine"], rtol=1e-4)


def test_fit_and_invert_reach_the_same_heatmap():
    """One image, the heatmap loss alone (``loss=None``), Adam, 40 steps, through both doors.

    Measured: the final heatmap loss (9.1e-4) 1.7e-6 relative apart, the cosine (0.994) 3e-9."""
    x, y, t = digits(1)
    target = np.zeros_like(t)
    target[0, 4:12, 4:12] = 1 / 64
    model = student(x.shape[1:], seed=3)
    result = heatinv.invert(model, x[0], target[0], label=int(y[0]), steps=40, composite="epsilon_gamma_box", learning_rate=1e-2,
                            low=0.0, high=1.0)  # the box ExplanationTrainer takes by default (invert: the input's range)
    trainer = ExplanationTrainer(model, composite="epsilon_gamma_box")  # trains `model` in place: invert ran on its copy first
    trainer.compile(keras.optimizers.Adam(1e-2), loss=None, explanation_loss="mse")
    trainer.fit(batches(x, y, target).repeat(40), epochs=1, verbose=0)
    R = LRP(model, "epsilon_gamma_box")(x, y)
    assert float(heatmap_loss("mse")(R, target)) == pytest.approx(result.metrics["loss"], rel=1e-5)
    assert float(cosine_numpy(R.numpy(), target)[0]) == pytest.approx(result.metrics["cosine"], rel=1e-5)


def test_keras_callbacks_tensorboard_checkpoint_early_stopping_and_nan(tmp_path):
    x, y, t = digits()
    trainer = trainer_for(student(x.shape[1:]))
    weights_by_epoch = []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: weights_by_epoch.append(trainer.get_weights()))
    callbacks = [
        keras.callbacks.TensorBoard(str(tmp_path / "tb")),
        keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), monitor="val_explanation_loss", mode="min",
                                        save_best_only=True),
        keras.callbacks.EarlyStopping(monitor="val_explanation_cosine", mode="max", patience=1, restore_best_weights=True,
                                      start_from_epoch=0),
        record,
    ]
    # validation on other digits: a noisy monitor that stops early
    history = trainer.fit(batches(x, y, t), validation_data=batches(*digits(160)[:2], digits(160)[2]), epochs=8,
                          callbacks=callbacks, verbose=0).history
    events = glob.glob(str(tmp_path / "tb" / "train" / "events.*"))
    tags = {value.tag for event in tf.compat.v1.train.summary_iterator(events[0]) for value in event.summary.value}
    assert {"epoch_explanation_loss", "epoch_explanation_cosine", "epoch_loss"} <= tags
    best = int(np.argmax(history["val_explanation_cosine"]))
    assert all(np.array_equal(a, b) for a, b in zip(trainer.get_weights(), weights_by_epoch[best]))
    reloaded = keras.saving.load_model(str(tmp_path / "best.keras"), safe_mode=True)
    assert isinstance(reloaded, ExplanationTrainer) and reloaded.composite == "epsilon_gamma_box"
    saved_at = int(np.argmin(history["val_explanation_loss"]))
    np.testing.assert_array_equal(reloaded.student.get_weights()[0], weights_by_epoch[saved_at][0])

    def poisoned(x, y):  # a target of NaN: the loss is NaN from the first batch
        return tf.fill(tf.shape(x), np.nan)

    nan_trainer = ExplanationTrainer(student(x.shape[1:]), composite="epsilon_gamma_box", target=poisoned)
    nan_trainer.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    nan_history = nan_trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=3, verbose=0,
                                  callbacks=[keras.callbacks.TerminateOnNaN()]).history
    assert len(nan_history["loss"]) == 1 and np.isnan(nan_history["loss"][0])
    with pytest.raises(TypeError, match="target function cannot be saved whole"):
        nan_trainer.get_config()


def test_xla_and_steps_per_execution_make_the_same_updates():
    x, y, t = digits()
    weights = []
    for options in ({"jit_compile": False}, {"jit_compile": True}, {"jit_compile": False, "steps_per_execution": 4}):
        trainer = trainer_for(student(x.shape[1:]), **options)
        trainer.fit(batches(x, y, t), epochs=2, verbose=0)
        weights.append(np.concatenate([w.ravel() for w in trainer.student.get_weights()]))
    # Measured: XLA's rounding moves weights by at most 1.4e-6; steps_per_execution changes nothing.
    np.testing.assert_allclose(weights[1], weights[0], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(weights[2], weights[0])


def test_backup_and_restore_resumes_after_sigkill_to_the_uninterrupted_weights(tmp_path):
    """A process killed in its second epoch, started again: BackupAndRestore redoes that epoch from its start."""

    def fit(*args, check=True):
        done = subprocess.run([sys.executable, FIT, *args], capture_output=True, text=True, timeout=300)
        if check:
            assert done.returncode == 0, done.stderr[-3000:]
        return done

    fit(str(tmp_path / "whole.npz"))
    killed = fit(str(tmp_path / "resumed.npz"), "--backup", str(tmp_path / "backup"), "--kill-at", "1:4", check=False)
    assert killed.returncode == -9 and not (tmp_path / "resumed.npz").exists()
    resumed = fit(str(tmp_path / "resumed.npz"), "--backup", str(tmp_path / "backup"))
    assert "epochs run 2" in resumed.stdout  # epoch 1 again, and 2
    whole, again = np.load(tmp_path / "whole.npz"), np.load(tmp_path / "resumed.npz")
    for name in whole.files:
        np.testing.assert_array_equal(again[name], whole[name][-len(again[name]):] if name == "explanation_loss" else whole[name])


def test_mirrored_strategy_on_two_logical_cpus_makes_the_single_device_updates(tmp_path):
    """Targets of another size per label, so each replica's half-batch has its own largest |target|: the loss unit
    is the whole batch's. Measured: the weights after three epochs agree to 4.1e-8 (3.1e-3 apart with each
    replica's own unit)."""
    for replicas in ("1", "2"):
        done = subprocess.run([sys.executable, FIT, str(tmp_path / f"{replicas}.npz"), "--replicas", replicas],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and f"replicas {replicas}" in done.stdout, done.stderr[-3000:]
    single, mirrored = np.load(tmp_path / "1.npz"), np.load(tmp_path / "2.npz")
    for name in single.files:
        np.testing.assert_allclose(mirrored[name], single[name], rtol=1e-5, atol=1e-5)


def test_wrong_uses_are_refused_with_the_fix():
    x, y, _ = digits(8)
    trainer = ExplanationTrainer(student(x.shape[1:]), composite="epsilon_gamma_box")
    with pytest.raises(ValueError, match=r"explanation_loss='cosine' is not one of \['l1', 'mse', 'huber', 'masked'\]"):
        trainer.compile("adam", explanation_loss="cosine")
    trainer.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=r"batches of \(x, y\) and has no target function"):
        trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), epochs=1, verbose=0)


def test_right_for_the_right_reasons_example_ignores_the_confounder():
    """``scripts/right_for_the_right_reasons.py`` at 8 epochs (the README's figures are its 30).

    Measured at 8 epochs: without swatches 0.773 (cross-entropy only) and 0.920 held-out accuracy;
    relevance on the corners 0.092 and 0.007."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "scripts"))
    try:
        import right_for_the_right_reasons as example
    finally:
        sys.path.pop(0)
    results = example.main(["--epochs", "8"])
    plain, explained = results["cross-entropy only"], results["with the explanation term"]
    assert explained["share on corners"] < 0.2 * plain["share on corners"]
    assert explained["no swatch"] > plain["no swatch"] + 0.05


def test_labels_of_one_column_one_hot_labels_and_targets_without_the_channel_axis():
    """``[N, 1]`` labels explain their class (not class 0); one-hot rows their argmax; a map may leave out one channel."""
    x, y, t = digits(32)
    model = student(x.shape[1:])
    heatmaps = {}
    for name, labels, targets in (("flat", y, t), ("column", y[:, None], t[..., 0]), ("one-hot", np.eye(10)[y], t)):
        trainer = ExplanationTrainer(model, composite="epsilon_gamma_box")
        loss = keras.losses.CategoricalCrossentropy(from_logits=True) if name == "one-hot" else keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        trainer.compile(keras.optimizers.SGD(0.0), loss)  # no update: the three must explain the same classes
        heatmaps[name] = trainer.evaluate(batches(x, labels, targets), return_dict=True, verbose=0)["explanation_cosine"]
    assert heatmaps["flat"] == pytest.approx(heatmaps["column"], rel=1e-6) == pytest.approx(heatmaps["one-hot"], rel=1e-6)
    trainer = ExplanationTrainer(model, composite="epsilon_gamma_box")
    trainer.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=r"third element has shape \(None, 28, 28, 2\).*class_weight"):
        trainer.fit(batches(x[:8], y[:8], np.concatenate([t[:8], t[:8]], axis=-1)), epochs=1, verbose=0)


def test_the_compile_settings_are_saved_with_the_model(tmp_path):
    x, y, t = digits(32)
    trainer = ExplanationTrainer(student(x.shape[1:]), composite="epsilon_gamma_box")
    trainer.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), explanation_loss="masked",
                    explanation_weight=7.0)
    trainer.fit(batches(x, y, t), epochs=1, verbose=0)
    trainer.save(tmp_path / "trainer.keras")
    reloaded = keras.saving.load_model(tmp_path / "trainer.keras", safe_mode=True)
    assert reloaded.explanation_loss_name == "masked" and reloaded.explanation_weight == 7.0
    assert reloaded.evaluate(batches(x, y, t), return_dict=True, verbose=0)["explanation_loss"] == pytest.approx(
        trainer.evaluate(batches(x, y, t), return_dict=True, verbose=0)["explanation_loss"], rel=1e-6)
