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
