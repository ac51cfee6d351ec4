"""heatinv.manipulate: the dataset task from Python, on a model and data in memory.

The same problem through ``manipulate`` and through ``python -m heatinv.train task=dataset
model=file data=npz ...`` must give the same metrics; the data's forms must give the same
split; the reference stays as it was; wrong data and targets are refused naming what was given.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import heatinv
from heatinv.config import ConfigError
from heatinv.data import load_digits

SETTINGS = {"epochs": 2, "batch_size": 64, "heatmap_weight": 100.0}


def small_data():
    digits = load_digits()
    return (digits.x_train[:300], digits.y_train[:300]), (digits.x_test[:120], digits.y_test[:120])


def reference_model(input_shape) -> keras.Model:
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.Flatten(),
                              keras.layers.Dense(10)], name="reference")
    (x, y), _ = small_data()
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=3, verbose=0)
    return model


def test_manipulate_and_the_command_line_give_the_same_run(tmp_path, composed):
    """Measured: every held-out metric equal (rtol 1e-6 asserted)."""
    from heatinv.train import run

    (x_train, y_train), (x_test, y_test) = small_data()
    np.savez(tmp_path / "digits.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    reference = reference_model(x_train.shape[1:])
    reference.save(tmp_path / "reference.keras")
    before = [w.copy() for w in reference.get_weights()]
    cfg, _ = composed(
        "task=dataset", "data=npz", f"data.path={tmp_path / 'digits.npz'}", "model=file", f"model.path={tmp_path / 'reference.keras'}",
        "init=reference", "target=swap", "target.like=0", "task.classes=[1]", "task.epochs=2", "task.batch_size=64",
        "task.heatmap_weight=100.0",
    )
    by_command_line = run(cfg)
    result = heatinv.manipulate(reference, str(tmp_path / "digits.npz"), target="swap", like=0, classes=[1], **SETTINGS)
    assert all(np.array_equal(a, b) for a, b in zip(before, reference.get_weights()))
    for key in ("cosine", "initial_cosine", "success_rate", "student_accuracy", "reference_accuracy", "agreement"):
        assert result.metrics[key] == pytest.approx(by_command_line[key], rel=1e-6), key
    assert [h["step"] for h in result.history] == [1, 2] and result.plot().axes


def test_the_data_forms_give_the_same_split_and_run():
    (x_train, y_train), (x_test, y_test) = small_data()
    x, y = np.concatenate([x_train, x_test]), np.concatenate([y_train, y_test])
    reference = reference_model(x.shape[1:])
    arrays = heatinv.manipulate(reference, (x[..., 0], y), target="pattern", pattern="frame", **SETTINGS)  # grey [N, H, W]
    batched = heatinv.manipulate(reference, tf.data.Dataset.from_tensor_slices((x, y)).batch(50), target="pattern",
                                 pattern="frame", **SETTINGS)
    for key in ("cosine", "student_accuracy", "agreement"):
        assert batched.metrics[key] == arrays.metrics[key], key
    assert arrays.metrics["cosine"] > arrays.metrics["initial_cosine"]


def test_wrong_targets_and_data_are_refused_naming_them():
    (x_train, y_train), _ = small_data()
    reference = keras.Sequential([keras.Input(x_train.shape[1:]), keras.layers.Flatten(), keras.layers.Dense(10)])
    with pytest.raises(ValueError, match=r"target='blur' is not one of \['swap', 'pattern'"):
        heatinv.manipulate(reference, (x_train, y_train), target="blur")
    with pytest.raises(ValueError, match=r"y of shape \(300, 10\); expected one integer label per example"):
        heatinv.manipulate(reference, (x_train, np.eye(10)[y_train]), epochs=1)
    with pytest.raises(ConfigError, match=r"label=3 is not taken here: choose the classes that move with classes="):
        heatinv.manipulate(reference, (x_train, y_train), epochs=1, label=3)
    with pytest.raises(ValueError, match=r"strategy='multi_worker' is not available from Python.*command line"):
        heatinv.manipulate(reference, (x_train, y_train), epochs=1, strategy="multi_worker")
    with pytest.raises(ValueError, match=r"x_train holds examples of shape \(14, 14, 1\).*\(28, 28, 1\)"):
        heatinv.manipulate(reference, (x_train[:, ::2, ::2], y_train), epochs=1)


def test_a_text_models_word_is_hidden_from_python():
    import keras

    from heatinv.data import load_dataset
    from heatinv.transformers import text_classifier

    data = load_dataset("protected_text", length=16)
    keras.utils.set_random_seed(0)
    model = text_classifier(16, len(data.vocabulary), 2, dim=8, depth=1, heads=2)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data.x_train, data.y_train, epochs=2, batch_size=64, verbose=0)
    before = model.get_weights()
    result = heatinv.manipulate(model, ((data.x_train, data.y_train), (data.x_test, data.y_test)), target="suppress_token",
                                token="foreign", vocabulary=data.vocabulary, composite="attnlrp", epochs=2, heatmap_weight=10.0,
                                logit_weight=1.0, normalize="max")
    metrics = result.metrics
    assert metrics["target"] == "suppress_token 'foreign' (all classes)"
    assert 0 <= metrics["token_share"] < metrics["reference_token_share"] <= 1  # two epochs already move some of it
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))  # the caller's model is not changed
    with pytest.raises(ValueError, match=r"target.token='#99' is not a word"):
        heatinv.manipulate(model, (data.x_test, data.y_test), target="suppress_token", token="#99", epochs=1)


def test_a_tables_column_is_named_and_hidden_from_python():
    from heatinv.data import load_tabular

    table = load_tabular("breast_cancer")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((len(table.feature_names),)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(table.x_train, table.y_train, epochs=5, verbose=0)
    data = ((table.x_train, table.y_train), (table.x_test, table.y_test))
    result = heatinv.manipulate(model, data, target="suppress_feature", feature="worst area", feature_names=table.feature_names,
                                composite="epsilon", epochs=2, heatmap_weight=10.0, normalize="max")
    assert result.metrics["target"].startswith("suppress_feature 'worst area'")
    assert result.metrics["feature_share"] < result.metrics["reference_feature_share"]
    with pytest.raises(ValueError, match=r"feature_names= has 2 names; the model takes 30 features"):
        heatinv.manipulate(model, data, target="suppress_feature", feature="a", feature_names=["a", "b"], epochs=1)
    with pytest.raises(ValueError, match=r"target.feature='x23' is not"):
        heatinv.manipulate(model, data, target="suppress_feature", feature="x23", feature_names=table.feature_names, epochs=1)
