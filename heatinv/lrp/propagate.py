"""Walk a canonized chain: a forward pass that keeps each step's input, then relevance back.

Everything here is plain TensorFlow on the live variables, so the relevance is
differentiable (to any order) with respect to the weights and the input, eagerly, under
``tf.function`` and with XLA.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from heatinv.lrp.canonize import Elementwise, Linear, Pool, Reshape, Step
from heatinv.lrp.composites import Composite
from heatinv.lrp.rules import norm, winner_takes_all

OUTPUTS = ("logit", "activation")


@dataclass
class Forward:
    """What the backward pass needs from the forward pass.

    Attributes:
        inputs: the input of every step, ``inputs[i]`` feeds ``steps[i]``.
        params: (kernel, bias) of every Linear step (BatchNorm folded), else None.
        logits: pre-activation of the last Linear step, shape ``[batch, classes]``.
        outputs: the model's output (after any final activation).
    """

    inputs: list[tf.Tensor]
    params: list[tuple[tf.Tensor, tf.Tensor] | None]
    logits: tf.Tensor
    outputs: tf.Tensor


def forward(steps: list[Step], x: tf.Tensor) -> Forward:
    """Run the chain in inference mode on ``x``, in ``x``'s dtype."""
    inputs, params = [], []
    logits = None
    for step in steps:
        inputs.append(x)
        if isinstance(step, Linear):
            kernel, bias = step.params(x.dtype)
            params.append((kernel, bias))
            x = logits = step.affine(x, kernel, bias)
            if step.activation is not None:
                x = step.activation(x)
        else:
            params.append(None)
            x = step(x)
    return Forward(inputs, params, logits, x)


def last_linear(steps: list[Step]) -> int:
    """Index of the last Linear step; the steps after it must be activations."""
    index = max(i for i, step in enumerate(steps) if isinstance(step, Linear))
    for step in steps[index + 1 :]:
        if not isinstance(step, Elementwise):
            raise ValueError(
                f"Layer {step.layer.name!r} ({type(step.layer).__name__}) follows the last Dense/Conv "
                "layer; heatinv starts relevance at that layer's output, so only activations may follow it."
            )
    return index


def backward(
    steps: list[Step],
    fwd: Forward,
    relevance: tf.Tensor,
    composite: Composite,
    start: int,
) -> tf.Tensor:
    """Propagate ``relevance`` from the output of ``steps[start]`` down to the input.

    Activations pass relevance unchanged, so relevance of a step's pre-activation (logits)
    and of its activation take the same walk.
    """
    first_linear = min(i for i, step in enumerate(steps) if isinstance(step, Linear))
    for i in range(start, -1, -1):
        step, a = steps[i], fwd.inputs[i]
        if isinstance(step, Linear):
            kernel, bias = fwd.params[i]
            rule = composite.rule_for(step.kind, is_first=i == first_linear)
            relevance = rule(a, kernel, bias, relevance, step)
        elif isinstance(step, Pool):
            redistribute = norm if step.kind == "average" else winner_takes_all
            relevance = redistribute(a, relevance, step)
        elif isinstance(step, Reshape):
            relevance = tf.reshape(relevance, tf.shape(a))
        # Elementwise: relevance passes unchanged.
    return relevance
