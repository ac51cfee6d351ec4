"""The inverse step: heatmap, loss, gradients, update; plain Python, compiled once.

:func:`train_step` knows nothing of compilation; :func:`compile_step` wraps it in
``tf.function`` (optionally XLA) exactly once. The step returns tensors only; the loop
reads them on the host when it logs, so no per-step Python work or host round trip is
added to the compiled path.
"""

from __future__ import annotations

from typing import Callable

import keras
import tensorflow as tf

from heatinv.losses import HeatmapLoss
from heatinv.lrp import LRP

MODES = ("eager", "function", "xla")


def train_step(
    student: keras.Model,
    explainer: LRP,
    loss_fn: HeatmapLoss,
    optimizer: keras.optimizers.Optimizer,
    x: tf.Tensor,
    label: tf.Tensor,
    target: tf.Tensor,
) -> dict[str, tf.Tensor | list[tf.Tensor]]:
    """One update of the student's weights towards ``target``.

    Args:
        x: ``[batch, 28, 28, 1]`` input (its dtype sets the working precision).
        label: ``[batch]`` int, the explained class.
        target: heatmap with the shape of ``x``.

    Returns:
        ``loss`` (scalar), ``heatmap`` (before the update), ``logits``, ``gradients``
        (one per trainable variable, zeros where no path exists), ``grad_norms`` and
        ``zero_fractions`` (``[variables]``).
    """
    variables = student.trainable_variables
    with tf.GradientTape() as tape:
        explanation = explainer.explain(x, label)
        loss = loss_fn(explanation.relevance, target)
    gradients = tape.gradient(loss, variables)
    # An unconnected variable (None) is reported as an all-zero gradient for the doctor.
    gradients = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, variables)]
    optimizer.apply_gradients(zip(gradients, variables))
    return {
        "loss": tf.cast(loss, tf.float32),
        "heatmap": explanation.relevance,
        "logits": explanation.logits,
        "gradients": gradients,
        "grad_norms": tf.stack([tf.norm(tf.cast(g, tf.float32)) for g in gradients]),
        "zero_fractions": tf.stack([tf.reduce_mean(tf.cast(tf.equal(g, 0), tf.float32)) for g in gradients]),
    }


def compile_step(
    student: keras.Model,
    explainer: LRP,
    loss_fn: HeatmapLoss,
    optimizer: keras.optimizers.Optimizer,
    mode: str = "function",
) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], dict]:
    """``step(x, label, target)``: :func:`train_step` run eagerly, as a graph, or with XLA.

    The optimizer's variables are built first, so the first trace creates none.

    Example:
    >>> step = compile_step(model, LRP(model), heatmap_loss("mse"), keras.optimizers.Adam())  # doctest: +SKIP
    >>> step(x, label, target)["loss"]  # doctest: +SKIP
    """
    if mode not in MODES:
        raise ValueError(f"Unknown step mode {mode!r}; expected one of {list(MODES)}.")
    optimizer.build(student.trainable_variables)

    def step(x, label, target):
        return train_step(student, explainer, loss_fn, optimizer, x, label, target)

    if mode == "eager":
        return step
    return tf.function(step, jit_compile=mode == "xla", reduce_retracing=True)


def make_optimizer(name: str, lr: float, momentum: float = 0.0) -> keras.optimizers.Optimizer:
    """``adam`` or ``sgd`` (with momentum)."""
    if name == "adam":
        return keras.optimizers.Adam(lr)
    if name == "sgd":
        return keras.optimizers.SGD(lr, momentum=momentum)
    raise ValueError(f"Unknown optimizer {name!r}; expected 'adam' or 'sgd'.")
