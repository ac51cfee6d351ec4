"""One check per cause of vanishing gradients; each returns the findings it can prove.

A check speaks only when its numbers show the cause: a healthy configuration gets no
finding. The checks read two probes of the same objective, one in float32 and one in
float64 (see :mod:`heatinv.doctor.objectives`).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from heatinv.doctor.findings import Finding
from heatinv.doctor.objectives import ExplanationObjective, HeatmapObjective, Probe, SaliencyObjective, ends_in_softmax
from heatinv.lrp import target_mask
from heatinv.lrp.attention import Attention
from heatinv.lrp.canonical import Elementwise, Linear, Pool
from heatinv.lrp.keras_hub import EncoderBlock
from heatinv.lrp.llama import DecoderBlock

DEAD_UNITS_FRACTION = 0.9
"""A layer is reported when at least this share of its units is inactive for the whole batch."""

KERAS_PROBABILITY_CLIP = 1e-7
"""Keras's cross-entropy clips probabilities to [eps, 1 - eps] with this eps."""

FAR_BELOW_ZERO = -0.5
"""Dead units whose largest ReLU input is below this are past reviving with a smooth activation: softplus
with beta 10 has a slope below sigmoid(-5) = 0.0067 there, and 2e-9 at -2."""

SATURATED_ATTENTION = 0.999
"""An attention row is saturated where one token gets at least this share of its weight."""

SATURATED_ROWS = 0.5
"""A layer's attention is reported where at least this share of its (unmasked) rows is saturated."""

VANISHED_SIGNAL_RATIO = 1e-6
"""A forward signal has vanished where a layer's mean |z| is below this share of the first layer's."""


_RELU_FUNCTIONS = (keras.activations.relu, keras.ops.relu, tf.nn.relu, keras.activations.relu6, keras.ops.relu6, tf.nn.relu6)
"""The ReLU (and ReLU6, as dead below 0) as a Keras activation, a Keras op or a TensorFlow function
(``activation=tf.nn.relu``)."""


def _relu_like(fn) -> bool:
    return any(fn is relu for relu in _RELU_FUNCTIONS)


def _followed_by_relu(steps, i: int) -> bool:
    """Whether step ``i`` (a Linear) ends in a ReLU: its own activation or its only reader's, also
    through a max pooling (the largest of values <= 0 is <= 0)."""
    if _relu_like(steps[i].activation):
        return True
    layer = _activation_after(steps, i)
    if isinstance(layer, keras.layers.ReLU):
        return layer.negative_slope == 0
    return isinstance(layer, keras.layers.Activation) and _relu_like(layer.activation)


def _activation_after(steps, i: int):
    """The layer of step ``i``'s only reader when that is an activation, looking past max poolings
    (which keep a unit's sign and its cap); else None."""
    readers = [step for step in steps if i in step.sources]
    while len(readers) == 1 and isinstance(readers[0], Pool) and readers[0].kind == "max":
        j = steps.index(readers[0])
        readers = [step for step in steps if j in step.sources]
    return readers[0].layer if len(readers) == 1 and isinstance(readers[0], Elementwise) else None


def _relu_cap(steps, i: int) -> float | None:
    """The upper clip of the ReLU after Linear step ``i`` (6 for ReLU6), or None; through a max pooling,
    as :func:`_followed_by_relu` looks."""
    if getattr(steps[i].activation, "__name__", "") == "relu6":
        return 6.0
    layer = _activation_after(steps, i)
    if isinstance(layer, keras.layers.ReLU) and layer.max_value is not None:
        return float(layer.max_value)
    if isinstance(layer, keras.layers.Activation) and getattr(layer.activation, "__name__", "") == "relu6":
        return 6.0
    return None


def _pre_activations(steps, probe: Probe):
    """(index, step, z) for every Linear step, z = a W + b with BatchNorm folded."""
    for i, step in enumerate(steps):
        if isinstance(step, Linear):
            yield i, step, probe.fwd.products[i] + probe.fwd.params[i][1]


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def unconnected(probe: Probe, objective=None) -> list[Finding]:
    findings = []
    for name, gradient in probe.gradients.items():
        if gradient is None and name == "input" and isinstance(objective, ExplanationObjective):
            # d logit / d x of a network linear in x is its weights: no path from x to the explanation
            findings.append(
                Finding(
                    "unconnected",
                    name,
                    "The gradient explanation d logit / d x does not depend on the input: the network is linear in "
                    "it (no activation between input and logit), so the saliency is its weights, the same for "
                    "every x, and the tape finds no path from x to the loss (None, or zeros).",
                    "Moving the input cannot change this explanation: change the weights instead (a weights "
                    "objective), or explain a network with activations.",
                )
            )
        elif gradient is None:
            findings.append(
                Finding(
                    "unconnected",
                    name,
                    f"{name} has no path to the loss: the tape returns None for it (shown as zeros with "
                    "unconnected_gradients=ZERO), whatever the data.",
                    "Keep only variables the loss uses (set layer.trainable = False for the others), and "
                    "compute the loss from this model's output inside the tape.",
                )
            )
    return findings


def integer_input(x) -> list[Finding]:
    dtype = tf.as_dtype(np.asarray(x).dtype if not isinstance(x, tf.Tensor) else x.dtype)
    if dtype.is_floating:
        return []
    return [
        Finding(
            "unconnected",
            "input",
            f"The input has dtype {dtype.name}: integer tensors carry no gradient, so the gradient with "
            "respect to the input is None.",
            "Cast before the tape and watch the float tensor: x = tf.cast(x, tf.float32) / 255; tape.watch(x).",
        )
    ]


def _count_non_finite(values) -> int:
    values = np.asarray(values, np.float64)
    return int(values.size - np.count_nonzero(np.isfinite(values)))


def _largest(values) -> str:
    return _fmt(float(np.max(np.abs(np.asarray(values, np.float64))))) if np.size(values) else "none"


def _forward_places(steps, probe: Probe):
    """(where, layer, values) from the input through every layer's output."""
    yield "the input", "input", probe.fwd.inputs[0]
    for step, output in zip(steps, probe.fwd.values):
        yield f"the output of layer {step.layer.name}", step.layer.name, output


def _weight_places(steps):
    """(where, layer, values) for every weight of the model's layers (a folded BatchNorm's too), once each."""
    seen = set()
    for step in steps:
        for layer in (getattr(step, "layer", None), getattr(step, "batch_norm", None)):
            for weight in getattr(layer, "weights", []) if isinstance(layer, keras.layers.Layer) else []:
                if id(weight) not in seen:
                    seen.add(id(weight))
                    yield f"the weight {weight.path}", layer.name, weight.numpy()


def non_finite(objective, steps, probe: Probe) -> list[Finding]:
    """NaN or Inf anywhere from the input to the gradients, reported once, where it first appears.

    The places are visited in the order the computation runs: the input, the weights, each
    layer's output, the heatmap, the target, the residual heatmap - target, the loss, the gradients.
    """
    target = getattr(objective, "target", None)
    forward = list(_forward_places(steps, probe))
    places = forward[:1] + list(_weight_places(steps)) + forward[1:]
    if probe.heatmap is not None:
        heatmap = probe.heatmap.numpy().astype(np.float64)
        places.append(("the heatmap", None, heatmap))
        if target is not None:
            places.append(("the target", None, target))
            with np.errstate(over="ignore", invalid="ignore"):
                residual = (probe.heatmap - tf.cast(target, probe.heatmap.dtype)).numpy()
            places.append(("the residual heatmap - target", None, residual))
    places.append(("the loss", None, probe.loss))
    places += [(f"the gradient of {name}", name, g) for name, g in probe.gradients.items() if g is not None]
    for where, layer, values in places:
        bad = _count_non_finite(values)
        if bad:
            return [_non_finite_finding(where, layer, values, bad, objective, probe, steps)]
    return []


GROWN_WEIGHT = 1e6
"""A weight beyond this in magnitude is no trained network's: an optimizer step too large put it there."""


def _largest_weight(steps, name: str) -> float:
    weights = [w.numpy() for step in steps if step.name == name for w in getattr(step.layer, "weights", [])]
    return max((float(np.max(np.abs(w))) for w in weights if w.size), default=0.0)


def _non_finite_finding(where: str, layer, values, bad: int, objective, probe: Probe, steps=()) -> Finding:
    dtype = probe.dtype.name
    x = probe.fwd.inputs[0]
    size = int(np.size(values))
    if size == 1:
        head = f"{where} is {float(np.asarray(values).reshape(-1)[0])} in {dtype}"
    else:
        head = f"{bad} of the {size} values of {where} are NaN or Inf in {dtype}"
    if where == "the input":
        return Finding(
            "non-finite", layer, f"{head}: every value computed from it can be NaN or Inf.",
            "Replace the non-finite values before the run (np.nan_to_num), or fix the file they came from.",
        )
    if where.startswith("the weight "):
        return Finding(
            "non-finite", layer, f"{head}: every value computed from it can be NaN or Inf.",
            "Give the layer finite weights: load them from before they went bad (an earlier checkpoint, or "
            "init=reference), or initialize it again. heatinv's trainer skips every update whose gradients are "
            "NaN or Inf, so its students keep finite weights.",
        )
    if where.startswith("the output of layer") and _largest_weight(steps, layer) > GROWN_WEIGHT:
        return Finding(
            "non-finite", layer,
            f"{head}, while the input is finite (largest |value| {_largest(x)}) and the layer's weights reach "
            f"|w| = {_fmt(_largest_weight(steps, layer))}: its sums overflow {dtype}. Weights this large are what "
            "too large an optimizer step leaves.",
            "Lower optimizer.lr (or bound each step: optimizer.global_clipnorm=1.0), and start again from "
            "finite, sized weights (init=reference, or a fresh start).",
        )
    if where.startswith("the output of layer"):
        return Finding(
            "non-finite", layer,
            f"{head}, while the input is finite (largest |value| {_largest(x)}): the layer's sums overflow "
            f"{dtype} (largest finite value {np.finfo(probe.dtype.as_numpy_dtype).max:.2g}).",
            "Rescale the input to the data's range [0, 1] (e.g. x / np.abs(x).max()); if the weights grew "
            "until they overflow, lower optimizer.lr.",
        )
    if where in ("the residual heatmap - target", "the loss"):
        heatmap, target = probe.heatmap, getattr(objective, "target", None)
        scale = f"largest |heatmap| {_largest(heatmap)}, largest |target| {_largest(target)}" if heatmap is not None else f"largest |input| {_largest(x)}"
        return Finding(
            "non-finite", layer,
            f"{head}, while everything before it is finite ({scale}): the loss squares and sums values beyond "
            f"what {dtype} holds.",
            "Rescale the input to [0, 1] (the heatmap scales with it) and the target to the heatmap's size, or "
            "compute in float64: trainer.precision=float64.",
        )
    if where in ("the heatmap", "the target"):
        fix = (
            "Replace the target's non-finite values (np.nan_to_num) or regenerate it."
            if where == "the target"
            else "Use a stabilized rule: lrp.composite=epsilon lrp.epsilon=1e-6; if the layer outputs are large, "
            "rescale the input to [0, 1]."
        )
        return Finding("non-finite", None, f"{head}, while the layers' outputs are finite.", fix)
    return Finding(
        "non-finite",
        layer,
        f"{head}, while the loss is finite ({_fmt(probe.loss)}). A division by a zero denominator (LRP-0's "
        "R / z with z = 0, or tf.where(z != 0, a / z, 0), whose gradient is NaN) is the usual source.",
        "Divide by a stabilized denominator, z + eps * sign(z) with sign(0) = +1, as heatinv's rules "
        "do: lrp.composite=epsilon lrp.epsilon=1e-6.",
    )


def blank_input(objective, probe: Probe) -> list[Finding]:
    """An all-zero input under a first-layer rule that multiplies by it (epsilon, z+, LRP-0, gamma):
    the heatmap is 0 whatever the weights. What else a blank input sets off (z = 0 for LRP-0,
    units without input) follows from it, and is left unsaid."""
    if not isinstance(objective, HeatmapObjective) or not all_zero(probe):
        return []
    x = probe.fwd.inputs[0].numpy()
    if np.any(x):
        return []
    values = f"The input is all 0 ({x[0].size} values per example)"
    if probe.score is not None and not np.any(probe.score.numpy()):
        return [
            Finding(
                "blank-input",
                None,
                f"{values}, and so is the explained score (the biases add up to 0 for it): no relevance enters "
                "the network, the heatmap is all 0 and every gradient with it.",
                "Explain a real input (target.index, or target.image).",
            )
        ]
    return [
        Finding(
            "blank-input",
            None,
            f"{values}: the first layer's rule gives each input value a share of the relevance proportional to "
            "it, so the heatmap is all 0 and every gradient with it, whatever the weights.",
            "Explain a real input (target.index, or target.image), or give the first layer a rule that spreads "
            "relevance by the weights rather than by the input: lrp.composite=epsilon_gamma_box (zbox, the default) "
            "or epsilon_plus_flat (flat).",
        )
    ]


def lrp_zero_division(objective, steps, probe: Probe) -> list[Finding]:
    if not isinstance(objective, HeatmapObjective):
        return []
    findings = []
    first = min(i for i, s in enumerate(steps) if isinstance(s, Linear))
    for i, step, z in _pre_activations(steps, probe):
        rule = objective.explainer.composite.rule_for(step.kind, is_first=i == first)
        zeros = int(tf.reduce_sum(tf.cast(tf.equal(z, 0), tf.int32)))
        if rule.name == "zero" and zeros:
            findings.append(
                Finding(
                    "nan-division",
                    step.name,
                    f"z = a W + b is exactly 0 for {zeros} of {int(tf.size(z))} outputs of {step.name} (a blank "
                    "input or zero-initialized biases); LRP-0's R / z is 0/0 there: NaN in hand-written code, "
                    "and no relevance and no gradient through those units here.",
                    "Use a stabilized rule: lrp.composite=epsilon with lrp.epsilon=1e-6 (or larger), or give "
                    "the layer non-zero biases.",
                )
            )
    return findings


def zero_residual(objective, probe: Probe) -> list[Finding]:
    """The explanation already equals the target, and so every gradient is exactly 0.

    Only where the gradients are 0: a residual of a millionth of the target's peak still gives
    L1 full-size gradients, which are no vanishing gradient.
    """
    if not isinstance(objective, (HeatmapObjective, ExplanationObjective)) or probe.heatmap is None:
        return []
    target = np.asarray(objective.target, np.float64)
    residual = float(np.max(np.abs(probe.heatmap.numpy().astype(np.float64) - target)))
    scale = float(np.max(np.abs(target))) or 1.0
    # A NaN residual is unknown, not zero, and an Inf target's peak makes every residual "small".
    if not (np.isfinite(scale) and residual <= 1e-6 * scale and all_zero(probe)):
        return []
    if isinstance(objective, ExplanationObjective):
        return [
            Finding(
                "zero-residual",
                None,
                f"The gradient explanation already equals the target: max |saliency - target| = {_fmt(residual)} "
                f"({_fmt(residual / scale)} of the target's peak), and the squared error's gradient is exactly 0 there.",
                "There is nothing to learn from this target: give a target the input does not already produce.",
            )
        ]
    return [
        Finding(
            "zero-residual",
            None,
            f"The heatmap already equals the target: max |heatmap - target| = {_fmt(residual)} "
            f"({_fmt(residual / scale)} of the target's peak). L1, MSE and Huber all have an exactly zero "
            "gradient at a zero residual (L1's sign(0) = 0), and near it L1 gives full-size sign noise "
            "while MSE's gradient shrinks with the residual.",
            "There is nothing to learn from this target: pick one the model does not already produce "
            "(target=pattern or target=file; target=class is the reference's own heatmap, which a student "
            "started from the reference, init=reference, already gives), or start from other weights "
            "(init=random); near convergence prefer loss=mse or loss=huber over loss=l1.",
        )
    ]


def dead_output(objective, steps, probe: Probe, label) -> list[Finding]:
    top = max(i for i, s in enumerate(steps) if isinstance(s, Linear))
    if not _followed_by_relu(steps, top):
        return []
    logits = probe.fwd.logits.numpy()
    labels = _label_indices(label, logits)
    if isinstance(objective, HeatmapObjective):
        if objective.explainer.output != "activation":
            return []
        scores = logits[np.arange(len(logits)), labels]
        dead = scores <= 0
        if not dead.any():
            return []
        return [
            Finding(
                "dead-output",
                steps[top].name,
                f"For {int(dead.sum())} of {len(dead)} inputs the target class's pre-activation is <= 0 "
                f"(largest {_fmt(float(scores[dead].max()))}), so its final ReLU outputs 0: the relevance "
                "that enters the network is 0, "
                + ("the heatmap is all zeros and every gradient is exactly 0." if dead.all() else
                   "so their heatmaps are all zeros and they add nothing to the gradient."),
                "Explain the pre-activation score: lrp.output=logit (heatinv's default), or build the model "
                "with a linear output: model.output_activation=linear.",
            )
        ]
    if not (isinstance(objective, SaliencyObjective) and objective.loss == "crossentropy"):
        return []  # the logit and a gradient explanation are read before the final ReLU
    dead = np.all(logits <= 0, axis=-1)
    if not dead.any():
        return []
    return [
        Finding(
            "dead-output",
            steps[top].name,
            f"For {int(dead.sum())} of {len(dead)} inputs all {logits.shape[-1]} outputs are 0 behind the final "
            "ReLU: nothing the loss sees depends on the input there, so its gradient is exactly 0.",
            "Give the model a linear output (model.output_activation=linear) and apply softmax in the loss "
            "(from_logits=True).",
        )
    ]


def _label_indices(label, outputs: np.ndarray) -> np.ndarray:
    """``[batch]`` class indices of ``label`` in any form the explainer takes (:func:`heatinv.lrp.target_mask`)."""
    return np.argmax(target_mask(label, tf.constant(outputs)).numpy(), axis=-1)


def dead_units(steps, probe: Probe) -> list[Finding]:
    top = max(i for i, s in enumerate(steps) if isinstance(s, Linear))
    findings = []
    for i, step, z in _pre_activations(steps, probe):
        if i == top or not _followed_by_relu(steps, i):
            continue
        if not np.any(probe.fwd.inputs[i].numpy()):  # dead because nothing reaches it: the layer below is reported
            continue
        units = tf.reshape(z, [-1, z.shape[-1]])  # every position of a conv map is a sample of its channel
        cap = _relu_cap(steps, i)
        capped = tf.reduce_all(units >= cap, axis=0).numpy() if cap is not None else np.zeros(units.shape[-1], bool)
        inactive = tf.reduce_all(units <= 0, axis=0).numpy()
        fraction = float((inactive | capped).mean())
        if fraction < DEAD_UNITS_FRACTION:
            continue
        if capped.any():
            findings.append(_capped_units(step, units, inactive, capped, cap))
            continue
        what = "All" if fraction == 1.0 else f"{fraction:.0%} ({int(inactive.sum())})"
        consequence = (
            "nothing reaches the layers below, so their gradients are exactly 0"
            if fraction == 1.0
            else f"gradients reach the layers below only through the other {int((~inactive).sum())}"
        )
        largest = float(tf.reduce_max(tf.boolean_mask(units, inactive, axis=1)))
        if largest < FAR_BELOW_ZERO:
            fix = (
                f"Their inputs are far below 0, where a smooth activation's slope (softplus with beta 10: "
                f"sigmoid(10 z) < {_fmt(1 / (1 + np.exp(-10 * FAR_BELOW_ZERO)))}) is about 0 too: bring the offset "
                f"of {step.name} back to about 0 (its bias: layer.bias.assign(tf.zeros_like(layer.bias)), or its "
                "bias_initializer; for a layer without bias, the beta and moving_mean of the BatchNorm after it), or "
                "start from other weights (another trainer.seed, or init=reference)."
            )
        else:
            fix = (
                "Start elsewhere (another trainer.seed, or init=reference), lower optimizer.lr, or use a smooth "
                "activation: model.activation=softplus model.beta=10."
            )
        findings.append(
            Finding(
                "dead-units",
                step.name,
                f"{what} of the {inactive.size} units of {step.name} are inactive (ReLU input <= 0, largest "
                f"{_fmt(largest)}) for every input in the batch; {consequence}.",
                fix,
            )
        )
    return findings


def _capped_units(step, units, below: np.ndarray, capped: np.ndarray, cap: float) -> Finding:
    """Units flat for the whole batch, some of them at a ReLU6's cap: the slope is 0 on both sides."""
    flat = below | capped
    what = "All" if flat.all() else f"{flat.mean():.0%} ({int(flat.sum())})"
    smallest = float(tf.reduce_min(tf.boolean_mask(units, capped, axis=1)))
    return Finding(
        "dead-units",
        step.name,
        f"{what} of the {flat.size} units of {step.name} are flat for every input in the batch: {int(capped.sum())} at "
        f"or above the cap of {cap:g} of their ReLU (input >= {cap:g}, smallest {_fmt(smallest)}), {int(below.sum())} "
        "at or below 0; the slope is 0 on both sides, so "
        + ("nothing reaches the layers below." if flat.all() else f"gradients pass only through the other {int((~flat).sum())}."),
        f"Bring the pre-activations of {step.name} inside (0, {cap:g}): lower its bias or the scale of its weights or "
        "input, or start from other weights (another trainer.seed, or init=reference).",
    )


def softmax_saturated(objective, steps, probe: Probe, label) -> list[Finding]:
    if not isinstance(objective, SaliencyObjective) or objective.loss != "crossentropy":
        return []
    if not ends_in_softmax(steps):
        return _softmax_of_logits_saturated(probe)
    p = probe.fwd.outputs.numpy()
    labelled = p[np.arange(len(p)), _label_indices(label, p)]
    saturated = (1.0 - labelled) <= KERAS_PROBABILITY_CLIP  # the labelled class, not any: a confident wrong class has a large gradient
    if not saturated.any():
        return []
    others = np.sort(p, axis=-1)[:, -2]
    gradient = max(float(tf.reduce_max(tf.abs(g))) for g in probe.gradients.values() if g is not None)
    size = "exactly 0" if gradient == 0 else f"at most {_fmt(gradient)}"
    # The batch's gradient speaks for the saturated inputs only when they are the whole batch.
    said = f" and its gradient is {size}" if saturated.all() else ""
    return [
        Finding(
            "softmax-saturated",
            steps[-1].name,
            f"The softmax output of the labelled class is within {KERAS_PROBABILITY_CLIP:g} of 1 for "
            f"{int(saturated.sum())} of {len(labelled)} inputs in {probe.dtype.name} (its probability "
            f"{labelled[saturated].max():.8f}, the next {_fmt(float(others[saturated].min()))}): the loss is "
            f"{_fmt(probe.loss)}{said}. Through a softmax this confident the cross-entropy's gradient is the size of the other "
            f"probabilities, and cross-entropy on probabilities clips them to [{KERAS_PROBABILITY_CLIP:g}, "
            f"1 - {KERAS_PROBABILITY_CLIP:g}], which cuts it to exactly 0 (Keras 2 and graph-mode code).",
            "Differentiate the logit (the class's pre-softmax score) instead of a loss of its probability; "
            "where a loss is needed, compute it from logits with from_logits=True so no clip cuts it to 0. "
            "In heatinv, lrp.output=logit explains the logit. float64 does not help: the clip is in the loss.",
        )
    ]


def _softmax_of_logits_saturated(probe: Probe) -> list[Finding]:
    """Cross-entropy from logits: its gradient ``p - y`` is exactly 0 where the softmax rounds to one-hot.

    For a whole batch where every gradient is 0; for some of its inputs where the gradient with
    respect to the input, which has a row per input, is 0 in just those rows (their float64
    gradients are as small as their probabilities, so it is no underflow that float64 mends).
    """
    # p - y is exactly 0 where every other probability is exactly 0 at the working precision
    saturated = np.count_nonzero(tf.nn.softmax(probe.fwd.logits).numpy(), axis=-1) == 1
    if not all_zero(probe):
        per_input = probe.gradients.get("input")
        if per_input is None or per_input.shape[0] != len(saturated):
            return []
        saturated &= ~np.any(per_input.numpy().reshape(len(saturated), -1), axis=1)
    if not saturated.any():
        return []
    logits = probe.fwd.logits.numpy().astype(np.float64)
    # the others' probabilities in float64, each exp(l - l_top) over a denominator of 1 + that sum
    rest = np.sort(np.exp(logits - logits.max(axis=-1, keepdims=True)), axis=-1)[:, :-1].sum(axis=-1)
    gap = np.sort(logits, axis=-1)
    gap = gap[:, -1] - gap[:, -2]
    return [
        Finding(
            "softmax-saturated",
            None,
            f"The softmax of the logits is one-hot in {probe.dtype.name} for {int(saturated.sum())} of "
            f"{len(rest)} inputs (the top logit leads the next by {_fmt(float(gap[saturated].min()))}; the other "
            f"probabilities sum to {_fmt(float(rest[saturated].max()))} in float64): the cross-entropy's gradient "
            "from logits, p - y, is that small, and exactly 0 here.",
            "Differentiate the logit (the class's pre-softmax score) instead of the cross-entropy: "
            "SaliencyObjective(loss='logit'); in heatinv, lrp.output=logit explains the logit. float64 gives "
            "gradients only as large as those probabilities.",
        )
    ]


UNDERFLOW_NAMED = 3
"""Up to this many variables get an ``underflow`` finding each; more get one finding for all."""


def underflow(probe32: Probe, probe64: Probe) -> list[Finding]:
    lost_by_name = []
    for name, g32 in probe32.gradients.items():
        g64 = probe64.gradients.get(name)
        if g32 is None or g64 is None:
            continue
        g32, g64 = g32.numpy(), g64.numpy()
        if not (np.isfinite(g32).all() and np.isfinite(g64).all()):
            continue  # a comparison with NaN or Inf proves nothing either way
        # Underflow proper: the float64 value is below float32's smallest normal number. A
        # larger float64 value with a float32 zero is cancellation (a gradient that is zero in
        # exact arithmetic, such as the last bias under LRP-0), not underflow.
        lost = (g32 == 0) & (g64 != 0) & (np.abs(g64) < np.finfo(np.float32).tiny)
        alive = g64 != 0
        if not alive.any() or lost.sum() < 0.5 * alive.sum():
            continue
        lost_by_name.append((name, int(lost.sum()), int(alive.sum()), float(np.abs(g64[lost]).max())))
    return _underflow_findings(
        lost_by_name,
        lambda name, lost, alive, largest: (
            f"{lost} of the {alive} non-zero float64 gradient entries of {name} are exactly 0 in float32 (float64 "
            f"magnitudes up to {_fmt(largest)}): they underflow float32."
        ),
        lambda count, examples, lost, alive, largest: (
            f"The gradients of {count} of the {len(probe32.gradients)} variables underflow float32 "
            f"({examples}, ...): {lost} of their {alive} non-zero float64 entries are exactly 0 in float32 (float64 "
            f"magnitudes up to {_fmt(largest)})."
        ),
        "Compute in float64: trainer.precision=float64 (or rescale the loss so its gradients are larger).",
    )


def _underflow_findings(lost_by_name: list[tuple[str, int, int, float]], each, grouped, fix: str) -> list[Finding]:
    """An ``underflow`` finding per variable ``(name, lost, alive, largest)``, or one for them all beyond
    :data:`UNDERFLOW_NAMED`; ``each`` and ``grouped`` word the message."""
    if len(lost_by_name) <= UNDERFLOW_NAMED:
        return [Finding("underflow", name, each(name, lost, alive, largest), fix) for name, lost, alive, largest in lost_by_name]
    lost, alive = sum(n for _, n, _, _ in lost_by_name), sum(n for _, _, n, _ in lost_by_name)
    largest = max(m for *_, m in lost_by_name)
    examples = ", ".join(name for name, *_ in lost_by_name[:UNDERFLOW_NAMED])
    return [Finding("underflow", None, grouped(len(lost_by_name), examples, lost, alive, largest), fix)]


def float16_underflow(probe32: Probe) -> list[Finding]:
    """Gradients of a float16 model, measured on its float32 copy, that float16 rounds to 0; grouped
    into one finding beyond :data:`UNDERFLOW_NAMED` variables, as float32's are."""
    zero_in_float16 = 2.0**-25  # half float16's smallest subnormal: anything smaller rounds to 0
    lost_by_name = []
    for name, g in probe32.gradients.items():
        if g is None:
            continue
        g = np.abs(g.numpy().astype(np.float64))
        alive = g != 0
        lost = alive & (g < zero_in_float16)
        if not alive.any() or lost.sum() < 0.5 * alive.sum():
            continue
        lost_by_name.append((name, int(lost.sum()), int(alive.sum()), float(g[lost].max())))
    where = "in the float32 copy the doctor differentiates: the model computes in float16, where they round to exactly 0"
    return _underflow_findings(
        lost_by_name,
        lambda name, lost, alive, largest: (
            f"{lost} of the {alive} non-zero gradient entries of {name} are below {zero_in_float16:.3g} (largest of "
            f"them {_fmt(largest)}) {where}."
        ),
        lambda count, examples, lost, alive, largest: (
            f"The gradients of {count} of the {len(probe32.gradients)} variables ({examples}, ...) are below "
            f"{zero_in_float16:.3g}: {lost} of their {alive} non-zero entries (largest of them {_fmt(largest)}) {where}."
        ),
        "Compute in float32 (keras.config.set_dtype_policy('float32') before building the model), or keep "
        "float16 with loss scaling, keras.optimizers.LossScaleOptimizer, which scales the loss up so its "
        "gradients stay within float16's range.",
    )


_PIECEWISE_LINEAR_ACTIVATIONS = ("linear", "relu", "relu6", "leaky_relu")


def _piecewise_linear(steps) -> bool:
    """Whether every activation before the logits is linear or a ReLU (ReLU6, leaky ReLU): then the logits are
    piecewise linear in the input (a softmax after them is not differentiated by a gradient explanation)."""
    top = max(i for i, s in enumerate(steps) if isinstance(s, Linear))
    for step in steps[:top]:
        if isinstance(step, Linear):
            activation = step.activation
        elif isinstance(step, Elementwise) and isinstance(step.layer, keras.layers.ReLU):
            continue
        elif isinstance(step, Elementwise) and isinstance(step.layer, keras.layers.Activation):
            activation = step.layer.activation
        elif isinstance(step, Elementwise):
            activation = step.layer  # an op (keras.ops.relu) or another layer (SoftplusBeta: smooth)
        else:
            continue
        if activation is not None and not _relu_like(activation) and getattr(activation, "__name__", "") not in _PIECEWISE_LINEAR_ACTIVATIONS:
            return False
    return True


def piecewise_linear(objective, steps, probe: Probe) -> list[Finding]:
    if not isinstance(objective, ExplanationObjective):
        return []
    gradient = probe.gradients.get("input")
    if gradient is None or not np.all(gradient.numpy() == 0):  # NaN is not zero
        return []
    if not _piecewise_linear(steps):  # a tanh or softplus network's zero gradient has another cause
        return []
    return [
        Finding(
            "piecewise-linear",
            None,
            "The network is piecewise linear (ReLU), so its gradient explanation is piecewise constant in "
            "the input: the derivative of the explanation loss with respect to the input is exactly 0 "
            f"(max |gradient| = 0, loss {_fmt(probe.loss)}).",
            "Optimize through a smoothed copy: model.activation=softplus model.beta=10 (SoftplusBeta, "
            "Dombrowski et al. 2019), then check the result on the original ReLU model.",
        )
    ]


def vanished_signal(steps, probe: Probe) -> list[Finding]:
    """Every gradient is 0 because the forward pass itself fades out: layer after layer, z is a
    small fraction of what came before (an untrained network whose BatchNorm layers, in
    inference mode, still hold their initial statistics), so the explained score, the
    relevance and every gradient through them round to 0. Called for an all-zero probe, beside
    what the other checks found (an underflow it causes, say).

    A fade, not a cut: the last two layers still carry a signal (a layer whose z is exactly 0,
    such as a zeroed kernel, stops it instead, and is left to ``all-zero``).
    """
    sizes = [(step.name, float(np.mean(np.abs(z.numpy())))) for _, step, z in _pre_activations(steps, probe)]
    if len(sizes) < 3:
        return []
    (first_name, first), (last_name, last) = sizes[0], sizes[-1]
    floor = VANISHED_SIGNAL_RATIO * first
    if not first > 0 or not all(0 < size < floor for _, size in sizes[-2:]):  # NaN compares false: not proven
        return []
    faded = next(name for name, size in sizes if size < floor)
    logits = float(np.max(np.abs(probe.fwd.logits.numpy())))
    heatmap_zero = probe.heatmap is not None and not np.any(probe.heatmap.numpy())
    lost = "the heatmap and every gradient are" if heatmap_zero else "every gradient is"
    return [
        Finding(
            "vanished-signal",
            faded,
            f"The forward signal fades out: the mean |z| of a layer falls from {_fmt(first)} ({first_name}) to "
            f"{_fmt(last)} ({last_name}), below a millionth of the first from {faded} on; the logits are at most "
            f"{_fmt(logits)} in size, and {lost} exactly 0 in {probe.dtype.name}. An untrained network whose "
            "BatchNorm layers still hold their initial statistics (moving mean 0, variance 1), used in inference "
            "mode, shrinks its signal this way.",
            "Start from trained weights (init=reference), or give the BatchNorm layers statistics of the data "
            "(train the model on it first).",
        )
    ]


ABSORBED_FRACTION = 1e-6
"""A heatmap whose |values| sum to less than this share of its explained score has lost it on the way down."""


def absorbed_relevance(probe: Probe, objective=None, steps=()) -> list[Finding]:
    """An LRP heatmap that keeps almost none of the score that entered: its gradients, though not
    0, are as small, and the heatmap is about 0 whatever the weights do. Left to the other checks
    where every gradient is exactly 0. Says what absorbed it: biases where there are any, and
    the z+ rule where a layer has it (it passes on only positive contributions)."""
    if probe.heatmap is None or probe.score is None or all_zero(probe):
        return []
    score = np.abs(probe.score.numpy().astype(np.float64))
    kept = np.abs(probe.heatmap.numpy().astype(np.float64)).reshape(len(score), -1).sum(axis=1)  # all of it, either sign
    lost = (score > 0) & (kept < ABSORBED_FRACTION * score)  # NaN compares false: not proven
    if not lost.any():
        return []
    logits = probe.fwd.logits.numpy().astype(np.float64)
    spread = float(np.max(np.ptp(logits, axis=0))) if len(logits) > 1 else None
    varies = "" if spread is None else f"; across the batch no logit varies by more than {_fmt(spread)}"
    zplus = _layers_with_rule(objective, steps, "zplus")
    biased = not steps or any(
        probe.fwd.params[i] is not None and np.any(probe.fwd.params[i][1].numpy()) for i, s in enumerate(steps) if isinstance(s, Linear)
    )
    measured = (
        f"For {int(lost.sum())} of {len(score)} inputs the heatmap's |values| sum to less than {ABSORBED_FRACTION:g} of the "
        f"explained score (at most {_fmt(float(np.max(kept[lost] / score[lost])))} of it; scores up to "
        f"{_fmt(float(score[lost].max()))})"
    )
    if zplus and not biased:
        return [
            Finding(
                "absorbed-relevance",
                None,
                f"{measured}: the z+ rule of {', '.join(zplus)} passes on only the positive contributions a_j w_jk > 0, "
                f"and this score has almost none there (the layers have no biases to absorb it), so the heatmap and its "
                f"gradients are about 0{varies}.",
                "Explain a class whose score the layer's inputs raise, or use a rule that keeps the negative "
                "contributions there: lrp.composite=epsilon (or epsilon_alpha2_beta1).",
            )
        ]
    also = f"; the z+ rule of {', '.join(zplus)} drops the negative contributions too" if zplus else ""
    return [
        Finding(
            "absorbed-relevance",
            None,
            f"{measured}: the biases and stabilizers absorbed the rest on the way down{also}, so the "
            f"heatmap and its gradients are about 0{varies}. A score made of biases, not of the input, looks "
            "like this: a model whose BatchNorm statistics do not fit the data (in inference mode), or one that "
            "has not learned the data.",
            "Check the model's accuracy on this data (the log gives the reference's) and explain one trained on it, "
            "whose BatchNorm layers hold statistics of this data (as training leaves them; or one pass over the data "
            "with training=True and each BatchNorm's momentum 0); with a large lrp.epsilon, lower it.",
        )
    ]


def attention_saturated(objective, steps, probe: Probe) -> list[Finding]:
    """Attention rows that put all but :data:`SATURATED_ATTENTION` of their weight on one token.

    Through such a row the softmax's derivative ``A (1 - A)`` is about 0, so the heatmap's
    gradient reaches the query and key weights only through the other rows; under ``cp_lrp``
    (``A`` held constant) the row hands no relevance to the other tokens either. Reported per
    layer where at least :data:`SATURATED_ROWS` of the rows are saturated.
    """
    findings = []
    composite = getattr(getattr(objective, "explainer", None), "composite", None)
    constant = composite is not None and composite.attention == "cp"
    for name, weights, mask in _attention_weights(steps, probe.fwd):
        weights = weights.numpy().astype(np.float64)
        rows = np.ones(weights.shape[:-1], bool) if mask is None else np.broadcast_to(mask.numpy(), weights.shape).any(axis=-1)
        peak = weights.max(axis=-1)
        saturated = (peak >= SATURATED_ATTENTION) & rows
        if rows.sum() == 0 or saturated.sum() < SATURATED_ROWS * rows.sum():
            continue
        # the softmax's Jacobian dA_i/dS_j = A_i (delta_ij - A_j): no entry of a row above peak (1 - peak)
        derivative = float(np.max(peak[saturated] * (1.0 - peak[saturated])))
        relevance = (
            " Under cp_lrp the attention weights are held constant, so each of those rows hands all its relevance to one "
            "token and none to the others." if constant else ""
        )
        findings.append(
            Finding(
                "attention-saturated",
                name,
                f"{int(saturated.sum())} of {int(rows.sum())} attention rows (query tokens x heads x batch) put at least "
                f"{SATURATED_ATTENTION:g} of their weight on one token (the smallest such peak {float(peak[saturated].min()):.6f}). "
                f"The softmax's derivative there is at most {_fmt(derivative)} (A (1 - A)), so the heatmap's gradient barely "
                f"reaches the query and key weights through those rows.{relevance}",
                "Bring the attention scores closer together: smaller query and key weights (an initializer or L2 on "
                "them), a LayerNormalization before the attention, fewer training epochs of the reference; with "
                "cp_lrp, explain with lrp.composite=attnlrp, which passes relevance through the softmax.",
            )
        )
    return findings


def _attention_weights(steps, fwd):
    """``(layer name, A [batch, heads, queries, keys], where attention is allowed or None)`` of each attention."""
    for i, step in enumerate(steps):
        kept = fwd.kept.get(i)
        if isinstance(step, Attention):
            yield step.name, kept.weights, kept.mask
        elif isinstance(step, EncoderBlock):
            yield step.attention.name, kept.attention.weights, kept.attention.mask
        elif isinstance(step, DecoderBlock):
            yield step.attention.name, kept.weights, kept.mask


def _layers_with_rule(objective, steps, name: str) -> list[str]:
    """The linear layers whose rule in ``objective``'s composite is ``name``."""
    composite = getattr(getattr(objective, "explainer", None), "composite", None)
    linear = [i for i, s in enumerate(steps) if isinstance(s, Linear)]
    if composite is None or not linear:
        return []
    return [steps[i].name for i in linear if composite.rule_for(steps[i].kind, is_first=i == linear[0]).name == name]


def all_zero(probe: Probe) -> bool:
    """Whether every gradient is None or exactly zero (NaN is not zero)."""
    return all(g is None or np.all(g.numpy() == 0) for g in probe.gradients.values())
