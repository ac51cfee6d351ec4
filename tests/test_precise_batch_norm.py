"""The reference recipe's BatchNormalization statistics: the training features' own, computed here in NumPy.

A tiny conv + BatchNorm model stands in for a Keras application (the recipe builds it through
a patched ``build_model``). After :func:`heatinv.models.train_reference`, each BatchNorm's
moving mean and variance must equal the mean and variance of its inputs over the fitted
images, which this file computes independently: the 1x1 convolutions as NumPy products, each
batch of 32 normalized with its own statistics (training mode), as the fit saw them.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from heatinv import models
from heatinv.data import Dataset
from heatinv.models import (
    FIT_BATCH_NORM_MOMENTUM,
    Architecture,
    train_reference,
    validation_split,
)
from heatinv.precise_batch_norm import batch_norm_layers

EPSILON = 1e-3  # Keras's BatchNormalization default


def conv_bn_model(input_shape, num_classes: int) -> keras.Model:
    """1x1 conv -> BN -> ReLU -> 1x1 conv -> BN -> global average -> dense, with Keras's slow momentum 0.99."""
    x = inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(4, 1, name="conv_1")(x)
    x = keras.layers.BatchNormalization(momentum=0.99, epsilon=EPSILON, name="bn_1")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(3, 1, name="conv_2")(x)
    x = keras.layers.BatchNormalization(momentum=0.99, epsilon=EPSILON, name="bn_2")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="output")(x))


def numpy_statistics(model: keras.Model, x: np.ndarray, batch: int = 32):
    """Per BatchNorm layer, ``(mean, variance)`` of its inputs over ``x`` fed in batches, in training mode, in float64."""
    w1, b1 = (np.asarray(v, np.float64) for v in model.get_layer("conv_1").weights)
    w2, b2 = (np.asarray(v, np.float64) for v in model.get_layer("conv_2").weights)
    gamma, beta = (np.asarray(v, np.float64) for v in model.get_layer("bn_1").weights[:2])
    first, second = [], []
    for start in range(0, len(x), batch):
        a = np.einsum("nhwc,cd->nhwd", x[start : start + batch].astype(np.float64), w1[0, 0]) + b1
        mean, var = a.mean(axis=(0, 1, 2)), a.var(axis=(0, 1, 2))  # the batch's own, biased as Keras's
        h = np.maximum(gamma * (a - mean) / np.sqrt(var + EPSILON) + beta, 0)
        first.append(a.reshape(-1, a.shape[-1]))
        second.append((np.einsum("nhwc,cd->nhwd", h, w2[0, 0]) + b2).reshape(-1, w2.shape[-1]))
    return [(np.concatenate(f).mean(axis=0), np.concatenate(f).var(axis=0)) for f in (first, second)]


def test_reference_recipe_sets_batch_norm_statistics_to_the_training_features(monkeypatch):
    rng = np.random.default_rng(0)
    # 100 training images (85 fitted: batches of 32, 32, 21) with a channel offset, so the
    # statistics are far from the initial mean 0 and variance 1.
    x = (rng.normal(size=(120, 4, 4, 2)) * [2.0, 0.5] + [3.0, -1.0]).astype(np.float32)
    y = (x[:, :, :, 0].mean(axis=(1, 2)) > 3.0).astype(np.int64)
    dataset = Dataset(x[:100], y[:100], x[100:], y[100:], name="synthetic")
    monkeypatch.setattr(models, "build_model", lambda arch, num_classes, input_shape, **_: conv_bn_model(input_shape, num_classes))
    momenta = []
    fit_of_keras = keras.Model.fit

    def fit(self, *args, **kwargs):  # the momentum the fit runs with
        momenta.append([layer.momentum for layer in batch_norm_layers(self)])
        return fit_of_keras(self, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "fit", fit)
    model = train_reference(Architecture("mlp"), dataset, epochs=3, seed=0)

    assert momenta == [[FIT_BATCH_NORM_MOMENTUM] * 2]
    fitted, _ = validation_split(100, seed=0)
    for layer, (mean, variance) in zip(batch_norm_layers(model), numpy_statistics(model, x[fitted])):
        assert layer.momentum == 0.99  # the layer's own, back after the fit
        # measured: 1.6e-7 (means) and 2.0e-7 (variances up to 2.8) apart, Keras computing in float32
        np.testing.assert_allclose(layer.moving_mean.numpy(), mean, rtol=0, atol=1e-6)
        np.testing.assert_allclose(layer.moving_variance.numpy(), variance, rtol=0, atol=1e-6)
        assert np.abs(mean).max() > 0.5 and np.abs(variance - 1).max() > 0.5  # far from the initial statistics


def test_a_model_without_batch_norm_is_left_alone():
    from heatinv.precise_batch_norm import set_population_statistics

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert set_population_statistics(model, [np.ones((2, 3), np.float32)]) == 0


def batch_norm_on_inputs(features: int, **options) -> keras.Model:
    """Input -> BN -> Dense: the BN's inputs are the images themselves, whose statistics NumPy computes directly."""
    inputs = keras.Input((features,))
    return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.BatchNormalization(**options)(inputs)))


def test_population_statistics_are_the_mean_and_biased_variance_of_all_batches():
    from heatinv.precise_batch_norm import set_population_statistics

    # An offset of 1000 and a spread of 1: float32 sums of squares would lose the variance.
    x = np.random.default_rng(0).normal([1000.0, -3.0, 0.0], [1.0, 0.5, 2.0], (80, 3)).astype(np.float32)
    model = batch_norm_on_inputs(3)
    batches = [(x[:32], np.zeros(32)), x[32:64], [x[64:], np.zeros(16)]]  # (x, y) tuples and lists, and bare x
    assert set_population_statistics(model, batches) == 1
    (layer,) = batch_norm_layers(model)
    np.testing.assert_allclose(layer.moving_mean.numpy(), x.astype(np.float64).mean(axis=0), rtol=1e-7, atol=0)
    np.testing.assert_allclose(layer.moving_variance.numpy(), x.astype(np.float64).var(axis=0), rtol=1e-6, atol=0)


def test_a_constant_channel_gets_a_variance_of_zero_not_a_rounding_below():
    from heatinv.precise_batch_norm import set_population_statistics

    model = batch_norm_on_inputs(1)
    # 100 copies of this value: the float64 E[x^2] - E[x]^2 comes out -7e-15
    assert set_population_statistics(model, [np.full((100, 1), 6.369617, np.float32)]) == 1
    assert batch_norm_layers(model)[0].moving_variance.numpy()[0] == 0.0


def test_no_batches_is_refused_and_leaves_the_statistics():
    from heatinv.precise_batch_norm import set_population_statistics

    model = batch_norm_on_inputs(3)
    with pytest.raises(ValueError, match="No training batches"):
        set_population_statistics(model, [])
    (layer,) = batch_norm_layers(model)
    assert (layer.moving_mean.numpy() == 0).all() and (layer.moving_variance.numpy() == 1).all()


def test_a_batch_norm_over_another_axis_than_the_last_is_refused():
    from heatinv.precise_batch_norm import set_population_statistics

    inputs = keras.Input((4, 3))
    model = keras.Model(inputs, keras.layers.BatchNormalization(axis=1)(inputs))
    with pytest.raises(ValueError, match="last axis only"):
        set_population_statistics(model, [np.ones((2, 4, 3), np.float32)])


def test_batch_norm_layers_of_a_nested_model_are_found():
    inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3), keras.layers.BatchNormalization(name="inner_bn")])
    inputs = keras.Input((3,))
    outer = keras.layers.BatchNormalization(name="outer_bn")(inner(inputs))
    assert [layer.name for layer in batch_norm_layers(keras.Model(inputs, outer))] == ["inner_bn", "outer_bn"]
