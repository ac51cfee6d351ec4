"""Heatmap losses: how far the student's heatmap is from the target.

Heatmaps are small numbers (a 784-pixel map of a logit of ~10 has entries below 0.05). So
both maps are measured in units of the target's largest magnitude before the loss is taken:
the loss's size, and how it meets Adam's epsilon, then no longer depend on the heatmap's
scale (on raw maps MSE gradients fall to ~1e-8, where Adam's epsilon damps the steps), and
Huber's ``delta`` is a fraction of the target's peak (with ``delta=1`` on raw maps Huber
would be MSE/2 everywhere).
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

LOSSES = ("l1", "mse", "huber")
NORMALIZATIONS = ("none", "sum", "max")

HeatmapLoss = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def normalize_map(heatmap: tf.Tensor, how: str) -> tf.Tensor:
    """Scale each sample's map by its total ``sum`` of |R| or its ``max`` |R| (or ``none``)."""
    if how == "none":
        return heatmap
    if how not in NORMALIZATIONS:
        raise ValueError(f"Unknown normalization {how!r}; expected one of {list(NORMALIZATIONS)}.")
    axes = list(range(1, heatmap.shape.rank))
    reduce = tf.reduce_sum if how == "sum" else tf.reduce_max
    scale = reduce(tf.abs(heatmap), axis=axes, keepdims=True)
    return heatmap / (scale + tf.constant(1e-12, heatmap.dtype))


def heatmap_loss(name: str, delta: float = 0.1, normalize: str = "none") -> HeatmapLoss:
    """A loss ``fn(heatmap, target) -> scalar`` on maps in units of max |target|, averaged.

    Example:
    >>> fn = heatmap_loss("huber", delta=0.1)
    >>> float(fn(tf.zeros([1, 4]), tf.constant([[0.0, 0.0, 0.0, 1.0]])))
    0.02375
    """
    if name not in LOSSES:
        raise ValueError(f"Unknown loss {name!r}; expected one of {list(LOSSES)}.")
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"Unknown normalization {normalize!r}; expected one of {list(NORMALIZATIONS)}.")

    def loss(heatmap: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        heatmap = normalize_map(heatmap, normalize)
        target = normalize_map(tf.cast(target, heatmap.dtype), normalize)
        unit = tf.reduce_max(tf.abs(target)) + tf.constant(1e-12, heatmap.dtype)
        residual = (heatmap - target) / unit
        if name == "l1":
            return tf.reduce_mean(tf.abs(residual))
        if name == "mse":
            return tf.reduce_mean(tf.square(residual))
        d = tf.convert_to_tensor(delta, heatmap.dtype)
        small = tf.abs(residual) <= d
        return tf.reduce_mean(tf.where(small, 0.5 * tf.square(residual), d * (tf.abs(residual) - 0.5 * d)))

    return loss
