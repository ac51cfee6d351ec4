"""BatchNormalization statistics of a trained model, recomputed over the training data ("precise BN").

During training a BatchNormalization layer normalizes with each batch's own mean and variance
and keeps a moving average of them for inference. A model trained from scratch for a few
dozen steps leaves that average stale: Keras's applications use ``momentum=0.99`` (0.999 in
MobileNetV2), so after 80 steps 0.999**80 = 92 % of MobileNetV2's moving averages are still
their initial 0 and 1, and inference normalizes with statistics the features never had. Wu
and Johnson (2021, "Rethinking 'Batch' in BatchNorm") estimate the population statistics
after training instead, from the final weights: this module does that.
"""

from __future__ import annotations

import keras
import numpy as np


def batch_norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """Every BatchNormalization layer of ``model``, nested models included, in call order.

    Examples:
        >>> len(batch_norm_layers(keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None, classes=3)))
        52
    """
    found = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            found.append(layer)
        elif isinstance(layer, keras.Model):
            found.extend(batch_norm_layers(layer))
    return found


def set_population_statistics(model: keras.Model, batches) -> int:
    """Write the training features' mean and variance into every BatchNormalization's moving statistics.

    The model runs in training mode over ``batches``, as it did while it was fitted (each
    BatchNormalization normalizing with its batch's statistics), and each layer's inputs are
    pooled over all the batches: ``moving_mean`` becomes their mean and ``moving_variance``
    their (biased, as Keras's batch variance) variance per channel, both accumulated in
    float64. The model's weights are otherwise unchanged.

    Args:
        model: a functional Keras model whose BatchNormalization layers are each called once.
        batches: an iterable of ``(x, y)`` or ``x`` batches of the training data.

    Returns:
        The number of BatchNormalization layers updated (0: the model has none; nothing runs).

    Examples:
        >>> set_population_statistics(model, dataset.batches("train", 32))  # doctest: +SKIP
        52
    """
    layers = batch_norm_layers(model)
    if not layers:
        return 0
    for layer in layers:
        if layer.axis not in (-1, len(layer.input.shape) - 1):
            raise ValueError(f"{layer.name}: population statistics are computed over the last axis only (axis={layer.axis}).")
    features = keras.Model(model.inputs, [layer.input for layer in layers])
    sums = [np.zeros(layer.moving_mean.shape, np.float64) for layer in layers]
    squares = [np.zeros(layer.moving_mean.shape, np.float64) for layer in layers]
    counts = [0] * len(layers)
    for batch in batches:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        # training=True: each layer normalizes with its batch's statistics, as in the fit (its
        # moving statistics are updated too, and overwritten below).
        outputs = features(x, training=True)
        for i, value in enumerate(outputs if isinstance(outputs, (list, tuple)) else [outputs]):
            flat = np.asarray(value, np.float64).reshape(-1, value.shape[-1])
            sums[i] += flat.sum(axis=0)
            squares[i] += np.square(flat).sum(axis=0)
            counts[i] += len(flat)
    if not counts[0]:
        raise ValueError("No training batches to compute the BatchNormalization statistics from.")
    for layer, total, square, count in zip(layers, sums, squares, counts):
        mean = total / count
        variance = np.maximum(square / count - np.square(mean), 0.0)  # rounding can leave -1e-17
        layer.moving_mean.assign(mean.astype(layer.moving_mean.dtype))
        layer.moving_variance.assign(variance.astype(layer.moving_variance.dtype))
    return len(layers)
