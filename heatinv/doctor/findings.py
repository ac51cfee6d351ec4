"""What the doctor reports: a finding per cause, with the numbers and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from heatinv.wording import count

CODES = {
    "zero-residual": "the heatmap already equals the target, so the loss has a zero gradient",
    "dead-output": "the target class's output is zero behind a final ReLU, so no relevance enters",
    "dead-units": "a layer's units are inactive for the whole batch",
    "blank-input": "the input is all 0, and the first layer's rule gives each input a share proportional to it",
    "softmax-saturated": "a probability rounds to 1 (or 0), so the loss's gradient through the softmax vanishes",
    "underflow": "gradients are zero in float32 but not in float64 (or, for a float16 model, too small for float16)",
    "unconnected": "a variable or the input has no path to the loss",
    "nan-division": "LRP-0 divides by z = 0 (0/0): no relevance and no gradient through those units",
    "non-finite": "NaN or Inf, reported where it first appears (input, a weight, a layer's output, heatmap, target, residual, loss or a gradient)",
    "piecewise-linear": "the input-derivative of a ReLU network's gradient explanation is zero",
    "vanished-signal": "the forward pass fades out (each layer's z a fraction of the last), so every gradient rounds to zero",
    "absorbed-relevance": "the heatmap keeps almost none of the explained score (biases absorbed it), so its gradients are about 0",
    "attention-saturated": "attention rows put almost all their weight on one token: the softmax passes the query and key weights almost no gradient, and (cp_lrp) the other tokens no relevance",
    "all-zero": "every gradient is exactly zero and none of the causes above was found",
}
"""Every code the doctor can report, with one line on what it means."""


@dataclass(frozen=True)
class Finding:
    """One reason gradients vanish, proven by the numbers in ``message``.

    Attributes:
        code: a key of :data:`CODES`; stable, for scripts.
        layer: the layer, variable or tensor it concerns (None for the whole model).
        message: plain words with the measured numbers.
        fix: the config override or code change that removes it.
    """

    code: str
    layer: str | None
    message: str
    fix: str

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"Unknown finding code {self.code!r}; expected one of {sorted(CODES)}.")

    def as_dict(self) -> dict:
        return asdict(self)


def format_report(findings: list[Finding], context: str = "") -> str:
    """A readable report: one numbered paragraph per finding, or a clean bill of health."""
    head = f"heatinv doctor{': ' + context if context else ''}"
    if not findings:
        return f"{head}\nNo problems found: the gradients are non-zero and finite."
    lines = [head, f"{count(len(findings), 'finding')}:"]
    for i, finding in enumerate(findings, 1):
        where = f" [{finding.layer}]" if finding.layer else ""
        lines.append(f"{i}. {finding.code}{where}: {finding.message}")
        lines.append(f"   fix: {finding.fix}")
    return "\n".join(lines)
