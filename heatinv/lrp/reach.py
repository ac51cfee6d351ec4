"""Which heatmaps a composite can give at all, whatever the weights.

A first-layer rule that shares relevance in proportion to the input (LRP-0, epsilon, z+,
gamma, alpha-beta: every term of ``R_i`` carries the factor ``x_i``) leaves the heatmap 0
wherever the input is 0. A target with relevance there is out of reach, and by Cauchy-Schwarz
the cosine of any such heatmap ``h`` to the target ``t`` is at most ``||t_S|| / ||t||``, ``S``
the entries where the input is not 0.
"""

from __future__ import annotations

import numpy as np

from heatinv.lrp.canonical import Linear, Rearrange, Reshape
from heatinv.lrp.graph import MODEL_INPUT
from heatinv.lrp.propagate import first_linear_steps
from heatinv.lrp.rules import UNSCALED_RULES


def input_proportional_rule(explainer) -> str | None:
    """The first-layer rule that makes every heatmap 0 where the input is 0, or None where there is none.

    It holds when each Dense/Conv layer the input reaches first gets a rule outside
    :data:`~heatinv.lrp.rules.UNSCALED_RULES` and reads the input directly or through steps
    that only move entries (Flatten, Reshape, ZeroPadding, Cropping, Permute): a Rescaling or
    Normalization can turn a 0 into a value that gets relevance, and is not followed here.

    Examples:
        >>> input_proportional_rule(LRP(mlp, "epsilon")), input_proportional_rule(LRP(mlp, "epsilon_gamma_box"))  # doctest: +SKIP
        ('epsilon', None)
    """
    steps = explainer.steps
    moved_only = {MODEL_INPUT}
    for i, step in enumerate(steps):
        if isinstance(step, (Reshape, Rearrange)) and step.sources[0] in moved_only:
            moved_only.add(i)
    rules = set()
    for i in sorted(first_linear_steps(steps)):
        step = steps[i]
        rule = explainer.composite.rule_for(step.kind, is_first=True).name
        if rule in UNSCALED_RULES or step.sources[0] not in moved_only:
            return None
        rules.add(rule)
    return ", ".join(sorted(rules)) or None


def best_cosine(x: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per example, the largest cosine to its target of any heatmap that is 0 where the input is 0.

    Args:
        x: ``[N, *input_shape]`` inputs.
        targets: ``[N, *input_shape]``, or ``[N, H, W, 1]`` for channel-summed maps of
            ``[N, H, W, C]`` images (a pixel is 0 when all its channels are).

    Returns:
        ``[N]`` float64, ``||t_S|| / ||t||``; NaN where the target is all 0.

    Examples:
        >>> best_cosine(np.array([[0.0, 2.0]]), np.array([[3.0, 4.0]])).tolist()
        [0.8]
    """
    x, targets = np.asarray(x), np.asarray(targets, np.float64)
    if targets.shape == x.shape:
        nonzero = x != 0
    elif targets.shape[:-1] == x.shape[:-1] and targets.shape[-1] == 1:
        nonzero = np.any(x != 0, axis=-1, keepdims=True)
    else:
        raise ValueError(
            f"best_cosine: inputs {x.shape} and targets {targets.shape}; expected equal shapes, or "
            "[N, H, W, C] images with [N, H, W, 1] channel-summed targets."
        )
    flat = targets.reshape(len(targets), -1)
    whole = np.sqrt((flat**2).sum(-1))
    kept = np.sqrt(((flat * nonzero.reshape(len(targets), -1)) ** 2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(whole > 0, kept / whole, np.nan)
