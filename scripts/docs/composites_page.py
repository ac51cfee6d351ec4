"""The composites table, written from the engine's registry (``heatinv.lrp.COMPOSITES``)."""

from __future__ import annotations

from heatinv.lrp import COMPOSITES
from heatinv.lrp.rules import STABILIZER

INTRO = """# Composites

A composite names the rule each kind of layer gets: `first` for the linear layers the input
reaches directly (none: they get their kind's rule), `dense` for Dense and EinsumDense, `conv`
for the convolutions, and for transformers the attention rule and the stabilizer of every
other division. Pass a name (`LRP(model, "epsilon_plus")`, `lrp=epsilon_plus` on the command
line) or a mapping of the same keys (`{"first": "zbox", "dense": "epsilon", "conv":
{"name": "gamma", "gamma": 0.5}}`). The [rules](../rules.md) page has each rule's formula.
This page is generated from `heatinv.lrp.COMPOSITES` when the site is built.
"""


def _rule(spec) -> str:
    if spec is None:
        return "(its kind's)"
    if isinstance(spec, str):
        return f"`{spec}`"
    params = ", ".join(f"{key}={value}" for key, value in spec.items() if key != "name")
    return f"`{spec['name']}` ({params})"


def composites_page() -> str:
    """The page's Markdown: one table row per registered composite.

    Returns:
        Markdown text.
    """
    lines = [INTRO, "| Composite | first | dense | conv | attention | stabilizer |", "|---|---|---|---|---|---|"]
    for name, spec in COMPOSITES.items():
        stabilizer = spec.get("stabilizer", STABILIZER)
        lines.append(
            f"| `{name}` | {_rule(spec.get('first'))} | {_rule(spec['dense'])} | {_rule(spec['conv'])} "
            f"| `{spec.get('attention', 'attnlrp')}` | {stabilizer:g} |"
        )
    lines.append("")
    return "\n".join(lines)
