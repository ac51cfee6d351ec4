"""LRP in training mode (``batch_statistics=True``): each BatchNorm folded from the batch's own statistics.

Checked against two things the engine does not compute itself: Keras's own forward pass in
training mode (the logits), and the inference-mode heatmap of a copy of the model whose
moving statistics are set to that batch's (by
:func:`heatinv.precise_batch_norm.set_population_statistics` over the one batch, which runs
Keras in training mode). Both hold for an ordinary, a depthwise and a separable convolution,
and the gradient with respect to the weights flows through the statistics (finite
differences in float64).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from heatinv.lrp import LRP
from heatinv.precise_batch_norm import set_population_statistics


def bn_model(dtype: str = "float32") -> keras.Model:
    """Conv, depthwise and separable convolutions each followed by a BatchNorm far from its moving statistics."""
    x = inputs = keras.Input((8, 8, 3), dtype=dtype)
    x = keras.layers.Conv2D(6, 3, strides=2, padding="same", dtype=dtype)(x)
    x = keras.layers.BatchNormalization(epsilon=1e-3, dtype=dtype)(x)
    x = keras.layers.ReLU(6.0, dtype=dtype)(x)
    x = keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2, use_bias=False, dtype=dtype)(x)
    x = keras.layers.BatchNormalization(epsilon=1e-3, dtype=dtype)(x)
    x = keras.layers.ReLU(dtype=dtype)(x)
    x = keras.layers.SeparableConv2D(5, 3, padding="same", dtype=dtype)(x)
    x = keras.layers.BatchNormalization(epsilon=1e-3, dtype=dtype)(x)
    x = keras.layers.ReLU(dtype=dtype)(x)
    x = keras.layers.GlobalAveragePooling2D(dtype=dtype)(x)
    model = keras.Model(inputs, keras.layers.Dense(4, dtype=dtype)(x))
    rng = np.random.default_rng(1)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):  # gamma, beta and moving statistics all off their defaults
            shape = layer.gamma.shape
            layer.set_weights([rng.uniform(0.5, 2, shape), rng.normal(size=shape), rng.normal(size=shape), rng.uniform(0.5, 3, shape)])
    return model


def images(count: int = 6, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(2).uniform(0, 1, size=(count, 8, 8, 3)).astype(dtype)


@pytest.mark.parametrize("composite", ["epsilon_gamma_box", "epsilon_plus", "epsilon_alpha2_beta1"])
def test_batch_statistics_explain_the_model_as_keras_runs_it_in_training_mode(composite):
    model, x = bn_model(), images()
    explanation = LRP(model, composite, batch_statistics=True).explain(x, target=1)
    # The model's output is its logits here (a linear last layer).
    np.testing.assert_allclose(explanation.logits, model(x, training=True), rtol=1e-4, atol=1e-5)
    assert not np.allclose(explanation.logits, model(x, training=False), atol=1e-2)

    same_statistics = keras.models.clone_model(model)
    same_statistics.set_weights(model.get_weights())
    assert set_population_statistics(same_statistics, [x]) == 3
    expected = LRP(same_statistics, composite).explain(x, target=1)
    np.testing.assert_allclose(explanation.relevance, expected.relevance, rtol=1e-4, atol=1e-6)
    inference = LRP(model, composite)(x, target=1)
    assert not np.allclose(explanation.relevance, inference, atol=1e-3)


def test_the_heatmap_gradient_flows_through_the_batch_statistics():
    """Each BatchNorm's statistics depend on the convolution's kernel: the heatmap's gradient with respect
    to it, from the engine's tape, equals central finite differences in float64."""
    model, x = bn_model("float64"), tf.constant(images(dtype=np.float64))
    explainer = LRP(model, "epsilon_gamma_box", batch_statistics=True)
    weights = np.random.default_rng(3).normal(size=(6, 8, 8, 1))
    kernel = model.layers[1].kernel

    def loss() -> tf.Tensor:
        return tf.reduce_sum(explainer(x, target=2) * weights)

    with tf.GradientTape() as tape:
        value = loss()
    gradient = tape.gradient(value, kernel).numpy()
    original, step = kernel.numpy(), 1e-6
    for index in [(0, 0, 0, 0), (1, 2, 1, 3), (2, 1, 2, 5)]:
        shifted = original.copy()
        shifted[index] += step
        kernel.assign(shifted)
        up = float(loss())
        shifted[index] -= 2 * step
        kernel.assign(shifted)
        down = float(loss())
        kernel.assign(original)
        np.testing.assert_allclose(gradient[index], (up - down) / (2 * step), rtol=1e-5, atol=1e-8)
