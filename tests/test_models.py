"""Unit tests for `heatinv.models`: building the MLP/CNN, safe loading of users' files, the cached reference.

`reference_model` is exercised on a tiny synthetic dataset so training takes well under a
second; the cache is checked without timing, by counting (or forbidding) calls to `fit`.
"""

from __future__ import annotations

import logging
import os
import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from heatinv import models
from heatinv.data import Dataset
from heatinv.explanation_cache import model_fingerprint
from heatinv.layers import SoftplusBeta
from heatinv.models import (
    PATIENCE,
    Architecture,
    accuracy,
    build_model,
    fingerprint,
    keras_reason,
    load_model_file,
    load_weights_file,
    reference_model,
    train_reference,
    validation_split,
    with_input_shape,
)

TINY = Architecture("mlp", hidden=(8,))


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    """60 train / 20 test random images with labels 0..9."""
    rng = np.random.default_rng(0)
    return Dataset(
        rng.uniform(0, 1, (60, 28, 28, 1)).astype(np.float32),
        np.tile(np.arange(10), 6).astype(np.int64),
        rng.uniform(0, 1, (20, 28, 28, 1)).astype(np.float32),
        np.tile(np.arange(10), 2).astype(np.int64),
        name="synthetic",
    )


@pytest.fixture
def count_fit(monkeypatch):
    """Counts calls to ``keras.Model.fit`` (still training); returns the list of calls."""
    calls = []
    original = keras.Model.fit

    def fit(self, *args, **kwargs):
        calls.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "fit", fit)
    return calls


def lambda_model() -> keras.Model:
    layers = [keras.layers.Flatten(), keras.layers.Lambda(lambda t: t * 2.0), keras.layers.Dense(10)]
    return keras.Sequential([keras.Input((28, 28, 1)), *layers])


def test_mlp_layout_and_size():
    model = build_model(Architecture("mlp", hidden=(300, 100)))
    assert model.count_params() == 784 * 300 + 300 + 300 * 100 + 100 + 100 * 10 + 10 == 266610
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    assert [layer.units for layer in dense] == [300, 100, 10]
    assert dense[-1].activation.__name__ == "linear"
    assert model(np.zeros((2, 28, 28, 1), np.float32)).shape == (2, 10)


def test_output_activation_and_hidden_activation_follow_the_architecture():
    model = build_model(Architecture("mlp", hidden=(4,), activation="relu", output_activation="softmax"))
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    assert dense[-1].activation.__name__ == "softmax"
    out = model(np.random.default_rng(0).uniform(size=(3, 28, 28, 1)).astype(np.float32)).numpy()
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)


def test_cnn_layout():
    model = build_model(Architecture("cnn", filters=(4, 8)), num_classes=7)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    pools = [layer for layer in model.layers if isinstance(layer, keras.layers.MaxPooling2D)]
    assert [layer.filters for layer in convs] == [4, 8]
    assert len(pools) == 2
    assert model(np.zeros((1, 28, 28, 1), np.float32)).shape == (1, 7)
    # 28 -> 14 -> 7 after two poolings: the classifier sees 7 * 7 * 8 features.
    assert model.layers[-1].kernel.shape == (7 * 7 * 8, 7)


@pytest.mark.parametrize("shape", [(3, 32, 32), (2, 2, 1)])
def test_cnn_refuses_images_its_poolings_would_shrink_to_nothing(shape):
    with pytest.raises(ValueError, match=rf"at least 4x4 pixels; the data gives {shape[0]}x{shape[1]}.*model.pool=strided"):
        build_model(Architecture("cnn", filters=(16, 32)), 3, input_shape=shape)
    build_model(Architecture("cnn", filters=(16, 32), pool="strided"), 3, input_shape=shape)  # "same" padding: never empty
    # 4x4 is just enough for two 2x2 poolings: 4 -> 2 -> 1.
    assert build_model(Architecture("cnn", filters=(16, 32)), 3, input_shape=(4, 4, 1)).layers[-1].kernel.shape == (32, 3)


def test_cnn_average_pooling_takes_each_windows_mean():
    model = build_model(Architecture("cnn", filters=(4, 8), pool="avg"), num_classes=7)
    assert not any(isinstance(layer, keras.layers.MaxPooling2D) for layer in model.layers)
    x = np.random.default_rng(1).uniform(size=(2, 28, 28, 1)).astype(np.float32)
    conv = keras.Model(model.inputs, model.get_layer("conv_1").output)(x).numpy()
    pooled = keras.Model(model.inputs, model.get_layer("pool_1").output)(x).numpy()
    # NumPy: each 2x2 tile's mean. Measured max difference 0 (float32); 1e-6 allows other summation orders.
    want = conv.reshape(2, 14, 2, 14, 2, 4).mean(axis=(2, 4))
    np.testing.assert_allclose(pooled, want, rtol=0, atol=1e-6)
    assert model.layers[-1].kernel.shape == (7 * 7 * 8, 7)


def test_cnn_strided_convolutions_replace_the_pooling():
    model = build_model(Architecture("cnn", filters=(4, 8), pool="strided"), num_classes=7)
    assert not any(isinstance(layer, (keras.layers.MaxPooling2D, keras.layers.AveragePooling2D)) for layer in model.layers)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert [tuple(layer.strides) for layer in convs] == [(2, 2), (2, 2)]
    # 28 -> 14 -> 7 by the two strides: the classifier sees 7 * 7 * 8 features, as with pooling.
    assert model.layers[-1].kernel.shape == (7 * 7 * 8, 7)
    x = np.random.default_rng(2).uniform(size=(1, 28, 28, 1)).astype(np.float32)
    first = keras.Model(model.inputs, model.get_layer("conv_1").output)(x).numpy()
    # NumPy: the stride-1 "same" convolution (zero padding 1) sampled at every second pixel.
    kernel, bias = (w.numpy() for w in convs[0].weights)
    padded = np.pad(x[0, :, :, 0], 1)
    full = np.stack([
        sum(padded[i : i + 28, j : j + 28] * kernel[i, j, 0, f] for i in range(3) for j in range(3)) + bias[f]
        for f in range(4)
    ], axis=-1)
    # Keras pads "same" with stride 2 on 28 pixels by 0 before and 1 after, so output k sees
    # input rows 2k..2k+2, the stride-1 map's row 2k + 1 (row 2k is off by 0.43). Measured max
    # difference 9e-8 (float32).
    np.testing.assert_allclose(first[0], np.maximum(full[1::2, 1::2], 0), rtol=0, atol=1e-5)


def test_unknown_pooling_is_refused():
    with pytest.raises(ValueError, match="model.pool"):
        build_model(Architecture("cnn", pool="median"))


def test_l2_zero_means_no_regularizer():
    assert all(getattr(layer, "kernel_regularizer", None) is None for layer in build_model(Architecture(l2=0.0)).layers)
    assert build_model(Architecture(l2=1e-3)).layers[-1].kernel_regularizer is not None


def test_l2_penalizes_every_kernel_not_only_the_output():
    for arch in (Architecture("mlp", hidden=(8, 4), l2=1e-3), Architecture("cnn", filters=(2, 3), l2=1e-3)):
        model = build_model(arch, seed=0)
        kernels = [np.asarray(w, np.float64) for w in model.weights if w.path.endswith("kernel")]
        assert len(kernels) == 3, arch.name
        # Keras's L2: l2 * sum(w ** 2) per kernel; biases unpenalized.
        want = sum(1e-3 * np.sum(k**2) for k in kernels)
        assert float(sum(model.losses)) == pytest.approx(want, rel=1e-5), arch.name


def test_softplus_mlp_puts_softplus_of_its_beta_after_each_linear_hidden_layer():
    model = build_model(Architecture("mlp", hidden=(5, 4), activation="softplus", beta=3.0), seed=0)
    x = np.random.default_rng(3).uniform(size=(2, 28, 28, 1)).astype(np.float32)
    for i in (1, 2):
        assert model.get_layer(f"dense_{i}").activation.__name__ == "linear"
        pre = keras.Model(model.inputs[0], model.get_layer(f"dense_{i}").output)(x).numpy().astype(np.float64)
        post = keras.Model(model.inputs[0], model.get_layer(f"softplus_{i}").output)(x).numpy()
        # log(1 + exp(3 z)) / 3; with beta=1 it would differ by up to log(2) - log(2)/3 near 0.
        np.testing.assert_allclose(post, np.logaddexp(0.0, 3.0 * pre) / 3.0, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("beta", [0.0, -1.0, float("nan")])
def test_softplus_beta_refuses_a_beta_not_above_zero(beta):
    with pytest.raises(ValueError, match=r"SoftplusBeta needs beta > 0"):
        SoftplusBeta(beta=beta)


def test_softplus_beta_is_softplus_of_beta_x_over_beta_in_float64_and_relu_as_beta_grows():
    x = np.array([-50.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 50.0])
    got = SoftplusBeta(beta=3.0, dtype="float64")(tf.constant(x)).numpy()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.logaddexp(0.0, 3.0 * x) / 3.0, rtol=1e-12, atol=0)
    default = SoftplusBeta(dtype="float64")(tf.constant(x)).numpy()
    np.testing.assert_allclose(default, np.logaddexp(0.0, 10.0 * x) / 10.0, rtol=1e-12)
    # 0 <= softplus(b x)/b - relu(x) <= log(2)/b; exp(b x) alone overflows float32 here.
    sharp = SoftplusBeta(beta=1e4)(tf.constant(x, tf.float32)).numpy()
    gap = sharp.astype(np.float64) - np.maximum(x, 0.0)
    assert np.isfinite(sharp).all() and np.all(gap >= -1e-5) and np.all(gap <= np.log(2.0) / 1e4 + 1e-5)


def test_a_saved_softplus_model_loads_with_its_beta(tmp_path):
    model = build_model(Architecture("mlp", hidden=(5,), activation="softplus", beta=3.0), seed=0)
    model.save(tmp_path / "model.keras")
    loaded = load_model_file(str(tmp_path / "model.keras"))
    assert [layer.beta for layer in loaded.layers if isinstance(layer, SoftplusBeta)] == [3.0]
    x = np.random.default_rng(0).uniform(size=(2, 28, 28, 1)).astype(np.float32)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-6)


def test_with_input_shape_keeps_a_model_already_built_for_the_shape_and_rebuilds_one_that_is_not():
    model = build_model(Architecture("cnn", filters=(2,)), 3, seed=0, input_shape=(8, 8, 1))
    assert with_input_shape(model, (8, 8, 1)) is model  # no copy: the caller's model, its variables
    inputs = keras.Input((None, None, 1))
    open_model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(inputs)))
    built = with_input_shape(open_model, (8, 8, 1))
    x = np.random.default_rng(4).uniform(size=(2, 8, 8, 1)).astype(np.float32)
    kernel, bias = open_model.get_weights()
    np.testing.assert_allclose(built(x).numpy(), x.mean(axis=(1, 2)) @ kernel + bias, rtol=1e-5, atol=1e-6)


def test_seed_fixes_the_initial_weights():
    a, b, c = (build_model(TINY, seed=s).get_weights() for s in (3, 3, 4))
    for wa, wb in zip(a, b):
        np.testing.assert_array_equal(wa, wb)
    assert not np.array_equal(a[0], c[0])


def test_unknown_architecture_is_refused():
    with pytest.raises(ValueError, match=r"'resnet'.*'mlp', 'cnn' or one of \['vgg16'"):
        build_model(Architecture("resnet"))


def test_accuracy_matches_numpy(dataset):
    model = build_model(TINY, seed=0)
    logits = model(dataset.x_test).numpy()
    expected = float(np.mean(np.argmax(logits, axis=1) == dataset.y_test))
    assert accuracy(model, dataset.x_test, dataset.y_test, batch_size=7) == pytest.approx(expected)


@pytest.mark.parametrize("extension", [".keras", ".h5"])
def test_load_model_file_round_trip(tmp_path, extension):
    model = build_model(TINY, seed=1)
    path = tmp_path / f"model{extension}"
    model.save(path)
    loaded = load_model_file(str(path))
    x = np.random.default_rng(0).uniform(size=(2, 28, 28, 1)).astype(np.float32)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-6)


@pytest.mark.parametrize("extension", [".keras", ".h5"])
def test_load_model_file_refuses_lambda_layers(tmp_path, extension):
    path = tmp_path / f"lambda{extension}"
    lambda_model().save(path)
    with pytest.raises(ValueError) as info:
        load_model_file(str(path))
    message = str(info.value)
    assert "Lambda" in message and "safe_mode" in message
    assert str(path) in message and "model.path" in message


def test_load_model_file_names_a_missing_path(tmp_path):
    missing = tmp_path / "no" / "such.keras"
    with pytest.raises(FileNotFoundError) as info:
        load_model_file(str(missing))
    assert str(missing) in str(info.value) and "model.path" in str(info.value)


def test_load_model_file_refuses_a_file_that_is_not_a_model(tmp_path):
    path = tmp_path / "notes.keras"
    path.write_text("not a zip archive")
    with pytest.raises(ValueError, match="notes.keras"):
        load_model_file(str(path))


def test_a_zip_archive_that_is_no_keras_model_is_named_so(tmp_path):
    fake = tmp_path / "arrays.keras"
    with open(fake, "wb") as handle:
        np.savez(handle, x=np.zeros(3))  # an .npz is a zip archive too
    with pytest.raises(ValueError, match=r"arrays.keras \(model.path\) is a zip archive without the config.json"):
        load_model_file(str(fake))


def test_load_model_file_says_what_the_file_is_instead(tmp_path):
    fake = tmp_path / "fake.keras"
    fake.write_text("not a zip archive")
    with pytest.raises(ValueError) as info:
        load_model_file(str(fake))
    assert "is not a .keras archive" in str(info.value) and "File not found" not in str(info.value)
    with pytest.raises(ValueError, match="is a folder .* model.save"):
        load_model_file(str(tmp_path))
    unzipped = tmp_path / "unzipped"
    build_model(TINY, seed=1).save(unzipped, zipped=False)  # Keras's own folder format loads
    assert load_model_file(str(unzipped)).count_params() == build_model(TINY, seed=1).count_params()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(b"not an HDF5 file")
    with pytest.raises(ValueError, match=r"cut.h5 \(model.path\) is not an HDF5 file"):
        load_model_file(str(cut))
    weights = tmp_path / "tiny.weights.h5"
    build_model(TINY, seed=1).save_weights(weights)
    with pytest.raises(ValueError, match=r"holds weights only .* model.weights=<file>.weights.h5"):
        load_model_file(str(weights))
    table = tmp_path / "patients.csv"
    table.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"ends with \.csv; Keras reads models saved as \.keras"):
        load_model_file(str(table))


def test_weights_that_do_not_fit_name_the_variable_and_both_shapes(tmp_path):
    path = tmp_path / "wide.weights.h5"
    build_model(Architecture("mlp", hidden=(12,)), seed=1).save_weights(path)
    with pytest.raises(ValueError) as info:
        load_weights_file(build_model(Architecture("mlp", hidden=(8,)), seed=1), str(path), "mlp")
    message = str(info.value)
    assert "does not fit model=mlp built for" in message
    assert re.search(r"dense_\d/kernel has shape \(784, 8\) in the model and \(784, 12\) in the file\.", message), message
    assert "\n" not in message and "value=[" not in message


def test_keras_reason_is_one_sentence_without_printed_arrays_and_cut_at_its_limit():
    error = ValueError("Layer 'dense' expected 2 variables,\n  but received 0.\n<Variable path=dense/bias, value=[0.1 0.2 0.3]> ok")
    reason = keras_reason(error)
    assert reason == "Layer 'dense' expected 2 variables, but received 0. <Variable path=dense/bias, > ok."
    long = ValueError(" ".join(["word"] * 300))  # 1499 characters
    cut = keras_reason(long, limit=40)
    assert cut == "word word word word word word word word ..."
    assert keras_reason(ValueError("Done.")) == "Done."


def test_weights_file_must_be_a_weights_h5_on_disk(tmp_path):
    model = build_model(TINY, seed=1)
    whole = tmp_path / "tiny.h5"
    model.save(whole)  # a whole model, legacy HDF5: not model.save_weights's file
    for path in (whole, tmp_path / "missing.weights.h5"):
        with pytest.raises(FileNotFoundError, match=r"\(model.weights\) is not a \.weights\.h5 file on disk"):
            load_weights_file(model, str(path), "mlp")


def test_weights_of_another_architecture_give_one_error_not_a_warning_per_layer(tmp_path):
    """An application's layers each warned ("Skipping nested container ...", 105 for MobileNetV2) before the error."""
    path = tmp_path / "conv.weights.h5"
    keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(4, 3), keras.layers.Flatten(), keras.layers.Dense(3)]).save_weights(path)
    model = build_model(Architecture("mobilenetv2"), 3, seed=1, input_shape=(32, 32, 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="does not fit model=mobilenetv2 built for inputs"):
            load_weights_file(model, str(path), "mobilenetv2")
    assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []


def test_a_load_that_succeeds_keeps_what_keras_warned(tmp_path, monkeypatch):
    """Keras loads past a nested container it skips (those layers keep their initial weights), with a warning."""
    path = tmp_path / "tiny.weights.h5"
    model = build_model(Architecture("mlp", hidden=(8,)), seed=1)
    model.save_weights(path)

    def load_with_a_warning(self, file):
        warnings.warn("Skipping nested container 'x': layers retain their freshly-initialized weights", UserWarning)

    monkeypatch.setattr(keras.Model, "load_weights", load_with_a_warning)
    with pytest.warns(UserWarning, match="Skipping nested container"):
        load_weights_file(model, str(path), "mlp")


def test_reference_model_trains_once_then_loads_from_cache(dataset, tmp_path, count_fit, monkeypatch):
    cache = tmp_path / "cache"
    first, first_accuracy = reference_model(TINY, dataset, epochs=1, cache_dir=str(cache), seed=0)
    assert len(count_fit) == 1
    files = sorted(os.listdir(cache))
    assert len(files) == 1 and files[0].startswith("reference-mlp-") and files[0].endswith(".keras")
    stamp = os.stat(cache / files[0]).st_mtime_ns

    def fit(self, *args, **kwargs):
        raise AssertionError("reference_model retrained a model that should have come from the cache")

    monkeypatch.setattr(keras.Model, "fit", fit)
    second, second_accuracy = reference_model(TINY, dataset, epochs=1, cache_dir=str(cache), seed=0)
    assert second is not first
    for a, b in zip(first.get_weights(), second.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert second_accuracy == first_accuracy
    # the run that trained the reference and the runs that load it key the explanation cache alike
    assert model_fingerprint(second) == model_fingerprint(first)
    assert os.listdir(cache) == files  # no partial files, no second entry
    assert os.stat(cache / files[0]).st_mtime_ns == stamp


def test_reference_cache_key_covers_the_config(dataset, tmp_path, count_fit):
    smaller = Dataset(dataset.x_train[:30], dataset.y_train[:30], dataset.x_test, dataset.y_test, name="synthetic")
    base = {"arch": TINY, "data": dataset, "epochs": 1, "seed": 0}
    changes = {
        "base": {},
        "epochs": {"epochs": 2},
        "seed": {"seed": 1},
        "hidden": {"arch": Architecture("mlp", hidden=(9,))},
        "output_activation": {"arch": Architecture("mlp", hidden=(8,), output_activation="relu")},
        "pool": {"arch": Architecture("mlp", hidden=(8,), pool="avg")},
        "dataset": {"data": smaller},
        "labels": {"data": Dataset(dataset.x_train, dataset.y_train[::-1].copy(), dataset.x_test, dataset.y_test, name="synthetic")},
    }
    for n, (what, change) in enumerate(changes.items(), start=1):
        c = {**base, **change}
        reference_model(c["arch"], c["data"], c["epochs"], str(tmp_path), c["seed"])
        # Each changed config is trained into its own entry, never loaded from another's.
        assert len(count_fit) == n, what
        assert len(os.listdir(tmp_path)) == n, what


def test_a_new_reference_recipe_trains_a_new_entry(dataset, tmp_path, count_fit, monkeypatch):
    reference_model(TINY, dataset, 1, str(tmp_path))
    monkeypatch.setattr(models, "REFERENCE_RECIPE", "a later recipe")
    reference_model(TINY, dataset, 1, str(tmp_path))
    assert len(count_fit) == 2 and len(os.listdir(tmp_path)) == 2


def test_reference_accuracy_is_the_test_images_whether_trained_cached_or_given_weights(dataset, tmp_path):
    # Test labels unlike the training labels, so that the two splits' accuracies differ.
    shifted = Dataset(dataset.x_train, dataset.y_train, dataset.x_test, (dataset.y_test + 3) % 10, name="synthetic")

    def numpy_accuracy(model, x, y):
        return float(np.mean(np.argmax(model(x).numpy(), axis=1) == y))

    trained, trained_accuracy = reference_model(TINY, shifted, 3, str(tmp_path / "cache"))
    want = numpy_accuracy(trained, shifted.x_test, shifted.y_test)
    assert numpy_accuracy(trained, shifted.x_train, shifted.y_train) != want  # the check can tell the splits apart
    assert trained_accuracy == pytest.approx(want)
    assert reference_model(TINY, shifted, 3, str(tmp_path / "cache"))[1] == pytest.approx(want)
    weights = tmp_path / "reference.weights.h5"
    trained.save_weights(weights)
    _, given_accuracy = reference_model(TINY, shifted, 3, str(tmp_path / "unused"), weights=str(weights))
    assert given_accuracy == pytest.approx(want)


def test_the_training_fingerprint_covers_the_labels(dataset):
    relabelled = Dataset(dataset.x_train, dataset.y_train[::-1].copy(), dataset.x_test, dataset.y_test, name="synthetic")
    same = Dataset(dataset.x_train.copy(), dataset.y_train.copy(), dataset.x_test, dataset.y_test, name="synthetic")
    assert fingerprint(same) == fingerprint(dataset) != fingerprint(relabelled)


def test_cached_reference_loads_in_safe_mode(dataset, tmp_path, count_fit):
    # Train one entry, then swap a Lambda model in under its name: loading it must be refused.
    reference_model(TINY, dataset, 1, str(tmp_path))
    (entry,) = os.listdir(tmp_path)
    lambda_model().save(tmp_path / entry)
    with pytest.raises(ValueError, match="Lambda"):
        reference_model(TINY, dataset, 1, str(tmp_path))
    assert len(count_fit) == 1  # refused from the cache, not retrained


def test_reference_cache_survives_a_concurrent_writer(dataset, tmp_path, monkeypatch):
    # Replays the interleaving of two sweep jobs deterministically: job A saves its temporary
    # file; job B (same config) then trains, saves and renames its own; then A renames.
    original_save = keras.Model.save
    interleaved = []

    def save(self, filepath, *args, **kwargs):
        original_save(self, filepath, *args, **kwargs)
        if not interleaved:
            interleaved.append(filepath)
            reference_model(TINY, dataset, 1, str(tmp_path))  # job B, start to finish

    monkeypatch.setattr(keras.Model, "save", save)
    model, _ = reference_model(TINY, dataset, 1, str(tmp_path))  # job A
    assert interleaved, "the interleaving did not happen"
    assert model(dataset.x_test[:1]).shape == (1, 10)
    (entry,) = [name for name in os.listdir(tmp_path) if not name.startswith(".")]
    keras.saving.load_model(tmp_path / entry, safe_mode=True)


def test_validation_split_is_a_seeded_partition_of_the_training_indices():
    fit, val = validation_split(200, seed=3)
    assert len(val) == 30 and len(fit) == 170  # 15 %
    assert set(fit).isdisjoint(val) and set(fit) | set(val) == set(range(200))
    again_fit, again_val = validation_split(200, seed=3)
    np.testing.assert_array_equal(val, again_val)
    assert not np.array_equal(val, validation_split(200, seed=4)[1])


def test_validation_split_keeps_one_validation_image_however_few_there_are():
    for count in (2, 3):  # 15 % of them rounds to 0
        fit, val = validation_split(count, seed=0)
        assert len(val) == 1 and sorted([*fit, *val]) == list(range(count))


def test_training_the_reference_leaves_op_determinism_as_it_found_it(dataset):
    from tensorflow.python.framework import config as tf_config

    try:
        for enabled in (False, True):
            if enabled:
                tf.config.experimental.enable_op_determinism()
            else:
                tf_config.disable_op_determinism()
            train_reference(TINY, dataset, epochs=1, seed=0)
            # As found: a run that did not ask for determinism keeps TensorFlow's faster kernels afterwards.
            assert tf_config.is_op_determinism_enabled() == enabled
    finally:
        tf_config.disable_op_determinism()


def test_reference_validates_on_training_images_never_on_the_test_set(dataset, monkeypatch):
    # The test images of the fixture are drawn apart from the training images; every image the
    # reference's fit sees (to train or to validate) must be a training image.
    seen = {}
    original = keras.Model.fit

    def fit(self, x, y, *args, validation_data=None, **kwargs):
        seen.update(x=np.asarray(x), y=np.asarray(y), val=validation_data)
        return original(self, x, y, *args, validation_data=validation_data, **kwargs)

    monkeypatch.setattr(keras.Model, "fit", fit)
    train_reference(TINY, dataset, epochs=2, seed=0)
    x_val, y_val = seen["val"]
    rows = {row.tobytes(): label for row, label in zip(dataset.x_train, dataset.y_train)}
    test_rows = {row.tobytes() for row in dataset.x_test}
    for images, labels in ((seen["x"], seen["y"]), (np.asarray(x_val), np.asarray(y_val))):
        assert all(rows.get(image.tobytes()) == label for image, label in zip(images, labels))
        assert not test_rows & {image.tobytes() for image in images}
    assert len(x_val) + len(seen["x"]) == len(dataset.x_train) and len(x_val) > 0
    assert not set(map(np.ndarray.tobytes, seen["x"])) & set(map(np.ndarray.tobytes, np.asarray(x_val)))


def test_reference_stops_early_and_keeps_its_best_validation_epoch(dataset, monkeypatch, caplog):
    # On random labels the validation loss cannot keep improving: training must stop long
    # before 200 epochs, and the weights must be the best epoch's (EarlyStopping restores them).
    histories = []
    original = keras.Model.fit

    def fit(self, *args, **kwargs):
        history = original(self, *args, **kwargs)
        histories.append(history.history)
        return history

    monkeypatch.setattr(keras.Model, "fit", fit)
    with caplog.at_level(logging.INFO, logger="heatinv.models"):
        model = train_reference(TINY, dataset, epochs=200, seed=0)
    (history,) = histories
    val = history["val_loss"]
    assert len(val) < 200 and len(val) - 1 - int(np.argmin(val)) == PATIENCE
    fit_idx, val_idx = validation_split(len(dataset.x_train), 0)
    x_val, y_val = dataset.x_train[val_idx], dataset.y_train[val_idx]
    logits = model(x_val, training=False)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y_val, logits) + sum(model.losses)
    # Keras's val_loss adds the L2 penalty; measured agreement with a recomputation ~1e-7.
    assert float(loss) == pytest.approx(min(val), rel=1e-5)
    # The log (the console and train.log) says where the progress display stopped and which epoch was kept.
    said = re.search(
        r"the reference mlp trained (\d+) of at most 200 epochs; kept epoch (\d+), the lowest validation loss \(([^)]+)\)",
        caplog.text,
    )
    assert said, "no line on how the reference's training ended"
    assert int(said[1]) == len(val) and int(said[2]) == int(np.argmin(val)) + 1
    assert float(said[3]) == pytest.approx(min(val), rel=1e-3)  # printed to 4 digits


REPRODUCE = """
import sys, numpy as np
from heatinv.data import load_digits
from heatinv.models import Architecture, train_reference
model = train_reference(Architecture("cnn", filters=(4, 8)), load_digits(), epochs=3, seed=0)
np.savez(sys.argv[1], *model.get_weights())
"""


@pytest.mark.slow
def test_reference_training_is_reproducible_in_fresh_processes(tmp_path):
    import subprocess
    import sys

    weights = []
    for n in range(2):
        path = tmp_path / f"weights{n}.npz"
        done = subprocess.run([sys.executable, "-c", REPRODUCE, str(path)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        with np.load(path) as saved:
            weights.append([saved[k] for k in sorted(saved.files, key=lambda k: int(k.split("_")[1]))])
    assert len(weights[0]) == 6
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)  # bit for bit, not merely close
