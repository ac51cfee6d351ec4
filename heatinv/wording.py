"""Words for the console and error messages: counts (``1 epoch``, ``3 epochs``), values and overrides as typed."""

from __future__ import annotations

import re
import shlex

from omegaconf import OmegaConf


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1.

    Examples:
        >>> count(1, "epoch"), count(3, "batch", "batches")
        ('1 epoch', '3 batches')
    """
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def run_dir_override(out: str, key: str = "hydra.run.dir") -> str:
    """``key=<out>`` (``hydra.run.dir``, or a sweep's ``hydra.sweep.dir``) as one shell word that Hydra reads back as ``out``.

    A run folder named after its overrides (``23-37-04_loss=l1,optimizer.lr=0.1``) holds
    ``=`` and ``,``, which Hydra's override grammar reads as syntax unless the value is quoted.

    Examples:
        >>> print(run_dir_override("outputs/d/23-37-04"))
        hydra.run.dir=outputs/d/23-37-04
        >>> print(run_dir_override("outputs/d/23-37-04_loss=l1"))
        "hydra.run.dir='outputs/d/23-37-04_loss=l1'"
    """
    if re.fullmatch(r"[\w./:@+~-]+", out):
        return f"{key}={out}"
    # In Hydra's quoted strings a backslash escapes only a quote or the backslashes before one.
    escaped = re.sub(r"(\\*)('|$)", lambda m: 2 * m.group(1) + ("\\'" if m.group(2) else ""), out)
    quoted = f"{key}='{escaped}'"
    return f'"{quoted}"' if not re.search(r'["$`\\!]', quoted) else shlex.quote(quoted)


def as_command_line(value) -> str:
    """A config value as it is typed on the command line (lists without quotes, booleans lowercase).

    Examples:
        >>> as_command_line(["square", 0, True]), as_command_line(0.5), as_command_line(False)
        ('[square, 0, true]', '0.5', 'false')
    """
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(map(as_command_line, value))}]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def out_of_reach(composite: str, rule: str, reach: str) -> str:
    """The warning for a target that the first layer's rule cannot reach, whatever the weights.

    ``reach`` says the best cosine and to what it falls short, in the task's words.

    Examples:
        >>> print(out_of_reach("epsilon", "epsilon", "the best cosine any weights can reach is 0.500.").split(", which")[0])
        heatinv: the target is out of the rule's reach: lrp=epsilon gives the first layer the epsilon rule
    """
    return (
        f"heatinv: the target is out of the rule's reach: lrp={composite} gives the first layer the {rule} rule, which "
        "shares relevance in proportion to the input, so every heatmap is 0 where the input is 0, whatever the weights. "
        f"The target puts relevance there: {reach} Give the first layer a rule that spreads relevance by the weights: "
        "lrp=epsilon_gamma_box (zbox) or lrp=epsilon_plus_flat (flat)."
    )

