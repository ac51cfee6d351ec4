"""Heatmap losses: how far the student's heatmap is from the target.

Heatmaps are small numbers (a 784-pixel map of a logit of ~10 has entries below 0.05). So
both maps are measured in units of the target's largest magnitude before the loss is taken:
the loss's size, and how it meets Adam's epsilon, then no longer depend on the heatmap's
scale (on raw maps MSE gradients fall to ~1e-8, where Adam's epsilon damps the steps), and
Huber's ``delta`` is a fraction of the target's peak (with ``delta=1`` on raw maps Huber
would be MSE/2 everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass
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


def batch_unit(target: tf.Tensor, normalize: str = "none", dtype: tf.DType | None = None) -> tf.Tensor:
    """The loss's unit: max |target| over the whole batch (after ``normalize``), never zero."""
    dtype = dtype or (target.dtype if target.dtype.is_floating else tf.float32)
    target = normalize_map(tf.cast(target, dtype), normalize)
    return tf.reduce_max(tf.abs(target)) + tf.constant(1e-12, dtype)


def per_example_heatmap_loss(name: str, delta: float = 0.1, normalize: str = "none"):
    """``fn(heatmap, target, unit) -> [batch]``: the loss of each example, in units of ``unit``.

    Taking the unit as an argument lets a replica that sees part of a batch use the whole
    batch's unit (``trainer.strategy=mirrored``); :func:`heatmap_loss` is its batch mean
    with :func:`batch_unit`.
    """
    if name not in LOSSES:
        raise ValueError(f"Unknown loss {name!r}; expected one of {list(LOSSES)}.")
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"Unknown normalization {normalize!r}; expected one of {list(NORMALIZATIONS)}.")

    def loss(heatmap: tf.Tensor, target: tf.Tensor, unit: tf.Tensor) -> tf.Tensor:
        heatmap = normalize_map(heatmap, normalize)
        target = normalize_map(tf.cast(target, heatmap.dtype), normalize)
        residual = (heatmap - target) / tf.cast(unit, heatmap.dtype)
        if name == "l1":
            elementwise = tf.abs(residual)
        elif name == "mse":
            elementwise = tf.square(residual)
        else:
            d = tf.convert_to_tensor(delta, heatmap.dtype)
            small = tf.abs(residual) <= d
            elementwise = tf.where(small, 0.5 * tf.square(residual), d * (tf.abs(residual) - 0.5 * d))
        return tf.reduce_mean(elementwise, axis=list(range(1, elementwise.shape.rank)))

    return loss


def heatmap_loss(name: str, delta: float = 0.1, normalize: str = "none") -> HeatmapLoss:
    """A loss ``fn(heatmap, target) -> scalar`` on maps in units of max |target|, averaged.

    Examples:
        >>> fn = heatmap_loss("huber", delta=0.1)
        >>> round(float(fn(tf.zeros([1, 4]), tf.constant([[0.0, 0.0, 0.0, 1.0]]))), 6)
        0.02375
    """
    per_example = per_example_heatmap_loss(name, delta, normalize)

    def loss(heatmap: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        return tf.reduce_mean(per_example(heatmap, target, batch_unit(target, normalize, heatmap.dtype)))

    return loss


@dataclass(frozen=True)
class HeatmapMatch:
    """The single-heatmap task's objective: the heatmap loss alone (see :func:`heatinv.step.update`).

    Examples:
        >>> objective = HeatmapMatch(heatmap_loss("mse"))
        >>> objective.terms, sorted(objective(LRP(model).explain(x, label), label, target))  # doctest: +SKIP
        ((), ['loss'])
    """

    loss_fn: HeatmapLoss
    terms = ()

    def __call__(self, explanation, label: tf.Tensor, target: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"loss": self.loss_fn(explanation.relevance, target)}
