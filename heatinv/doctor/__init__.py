"""The zero-gradient doctor: find, name and fix every reason a gradient comes back all zeros.

The objective is evaluated twice, in float32 and in float64, and each check in
:mod:`heatinv.doctor.checks` reports a cause only when the numbers show it.

Examples:
    >>> from heatinv.doctor import diagnose, format_report, HeatmapObjective
    >>> from heatinv.lrp import LRP
    >>> findings = diagnose(model, x, label, HeatmapObjective(target, LRP(model)))  # doctest: +SKIP
    >>> print(format_report(findings))  # doctest: +SKIP
"""

from __future__ import annotations

from heatinv.startup import start_tensorflow

start_tensorflow()  # `python -m heatinv.doctor` imports this package first: quiet TensorFlow's start-up here

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from heatinv.doctor import checks
from heatinv.doctor.findings import CODES, Finding, format_report
from heatinv.doctor.objectives import ExplanationObjective, HeatmapObjective, SaliencyObjective
from heatinv.lrp import model_input, reads_tokens
from heatinv.lrp.canonical import canonize


__all__ = [
    "CODES",
    "ExplanationObjective",
    "Finding",
    "HeatmapObjective",
    "SaliencyObjective",
    "diagnose",
    "format_report",
]


def diagnose(model: keras.Model, x, label, objective, precision: str = "float32") -> list[Finding]:
    """Differentiate ``objective`` at ``x`` and return every cause of vanishing gradients found.

    Args:
        model: a built Keras model that heatinv's LRP engine explains (chains and graphs alike).
        x: ``[batch, *input_shape]`` input.
        label: the explained class: an int, ``[batch]`` or ``[batch, 1]`` ints, or a one-hot ``[batch, classes]``.
        objective: :class:`HeatmapObjective` (gradients with respect to the weights),
            :class:`SaliencyObjective` or :class:`ExplanationObjective` (with respect to the input).
        precision: the working precision, ``float32`` or ``float64``; float32 is also
            compared with float64 to find underflow.

    Returns:
        A list of :class:`Finding`; empty when gradients flow. A finding's ``fix`` names the
        setting as ``python -m heatinv.train`` takes it; in Python the same setting is the
        argument of that name (``lrp.output=logit`` is ``LRP(model, output="logit")``,
        ``model.output_activation=linear`` a last layer without activation).

    Raises:
        ValueError: ``x`` does not fit the model, the objective's target does not fit its
            heatmap, or its explainer is bound to another model.
    """
    if objective.wrt == "input":  # an objective of the weights casts the input itself
        findings = checks.integer_input(x)
        if findings:
            return findings
    if precision not in ("float32", "float64"):
        raise ValueError(f"precision must be 'float32' or 'float64', got {precision!r}.")
    steps = canonize(model)
    tokens = reads_tokens(steps)
    model_input(x if tokens else tf.cast(x, tf.float32), model, tokens=tokens)  # the shape; an integer image was named above or is cast
    explainer = getattr(objective, "explainer", None)
    if explainer is not None and explainer.model is not model:
        raise ValueError(
            f"The objective's explainer is bound to model {explainer.model.name!r}, not to the diagnosed model "
            f"{model.name!r}: its heatmap would not depend on this model's weights. Build it with LRP(model)."
        )
    probe = objective.probe(model, x, label, tf.as_dtype(precision))
    blank = checks.blank_input(objective, probe)
    if blank:  # the one cause: the rest it sets off (z = 0, units without input) would mislead
        return blank
    findings = (
        checks.unconnected(probe, objective)
        + checks.non_finite(objective, steps, probe)
        + checks.zero_residual(objective, probe)
        + checks.dead_output(objective, steps, probe, label)
        + checks.dead_units(steps, probe)
        + checks.lrp_zero_division(objective, steps, probe)
        + checks.softmax_saturated(objective, steps, probe, label)
        + checks.piecewise_linear(objective, steps, probe)
        + checks.absorbed_relevance(probe, objective, steps)
        + checks.attention_saturated(objective, steps, probe)
    )
    if checks.all_zero(probe):  # a fading forward pass is the cause an underflow below would show
        findings += checks.vanished_signal(steps, probe)
    # A zero residual is exact only at the working precision: in float64 the target's own
    # rounding reappears as a residual, which is not an underflow.
    # Non-finite values make the float32/float64 comparison unknown.
    # A saturated softmax has float64 gradients as small as its probabilities: float64 is no fix.
    if precision == "float32" and not any(f.code in ("zero-residual", "non-finite", "softmax-saturated") for f in findings):
        findings += checks.underflow(probe, objective.probe(model, x, label, tf.float64))
    if _computes_in_float16(steps, x):  # probed in float32: what float16 would round away is measured here
        findings += checks.float16_underflow(probe if precision == "float32" else objective.probe(model, x, label, tf.float32))
    if not findings and checks.all_zero(probe):
        findings.append(
            Finding(
                "all-zero",
                None,
                f"Every gradient is exactly 0 in {precision} (loss {probe.loss:.3g}) and none of the known causes "
                "was found.",
                "Please report this case with the model and input: the doctor should learn its cause.",
            )
        )
    return findings


def _computes_in_float16(steps, x) -> bool:
    """Whether a layer computes in float16 (a float16 or mixed_float16 policy) or ``x`` is float16."""
    given = getattr(x, "dtype", None)
    if given is not None and tf.as_dtype(given) == tf.float16:
        return True
    return any(getattr(step.layer, "compute_dtype", None) == "float16" for step in steps)
