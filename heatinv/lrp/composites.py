"""Composites: which rule each linear layer gets, and how relevance crosses attention.

A composite gives a rule to the first linear layer (``first``, optional), to Dense and
EinsumDense layers (``dense``) and to Conv layers (``conv``); the first layer falls back to
its type's rule when ``first`` is absent. Each rule is a name from
:data:`heatinv.lrp.rules.RULES` or a mapping ``{"name": ..., **parameters}``; parameters not
given come from the defaults passed to :func:`resolve` (``epsilon``, ``gamma``, ``low``,
``high``, ``alpha``, ``beta``). Two optional keys serve transformers: ``attention``, how
relevance crosses the attention weights (``"attnlrp"``, the default, or ``"cp"``:
:data:`heatinv.lrp.attention.ATTENTION_RULES`), and ``stabilizer``, the epsilon of the
rules that divide by a sum without weights (residual sums, average pooling, LayerNorm, the
attention products; :data:`heatinv.lrp.rules.STABILIZER` by default).

The named composites follow the recommendations of Montavon et al. (2019) and the
composites of the same names in Zennit; ``attnlrp`` is AttnLRP (Achtibat et al. 2024) as
LXT 2.1 computes it, LRP-0 on every linear layer, and ``cp_lrp`` CP-LRP (Ali et al. 2022).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

from heatinv.lrp.attention import ATTENTION_RULES
from heatinv.lrp.rules import RULES, STABILIZER, ZERO_STABILIZER, Rule, make_rule

RuleSpec = Union[str, Mapping]

COMPOSITES: dict[str, dict[str, RuleSpec | None]] = {
    "zero": {"first": None, "dense": "zero", "conv": "zero"},
    "epsilon": {"first": None, "dense": "epsilon", "conv": "epsilon"},
    "zplus": {"first": None, "dense": "zplus", "conv": "zplus"},
    "epsilon_plus": {"first": None, "dense": "epsilon", "conv": "zplus"},
    "epsilon_gamma_box": {"first": "zbox", "dense": "epsilon", "conv": "gamma"},
    "epsilon_plus_flat": {"first": "flat", "dense": "epsilon", "conv": "zplus"},
    "epsilon_alpha2_beta1": {"first": None, "dense": "epsilon", "conv": {"name": "alpha_beta", "alpha": 2.0, "beta": 1.0}},
    "attnlrp": {"first": None, "dense": "zero", "conv": "zero", "attention": "attnlrp", "stabilizer": ZERO_STABILIZER},
    "cp_lrp": {"first": None, "dense": "zero", "conv": "zero", "attention": "cp", "stabilizer": ZERO_STABILIZER},
}
"""Registry of named composites; ``configs/lrp/*.yaml`` holds one file per name."""


@dataclass(frozen=True)
class Composite:
    """Resolved rules: one for the first linear layer (or None), one per layer kind, and the transformer settings."""

    first: Rule | None
    dense: Rule
    conv: Rule
    attention: str = "attnlrp"
    stabilizer: float = STABILIZER

    def rule_for(self, kind: str, is_first: bool) -> Rule:
        """The rule for a linear layer of ``kind`` ('dense' or 'conv')."""
        if is_first and self.first is not None:
            return self.first
        return self.dense if kind == "dense" else self.conv


def resolve(composite: str | Mapping, **defaults: float) -> Composite:
    """Build a :class:`Composite` from a registered name or a ``first``/``dense``/``conv`` mapping.

    Examples:
        >>> c = resolve({"first": "zbox", "dense": "epsilon", "conv": {"name": "gamma", "gamma": 0.5}})
        >>> c.first.name, c.dense.name, c.conv.name
        ('zbox', 'epsilon', 'gamma')
    """
    if isinstance(composite, str):
        if composite not in COMPOSITES:
            raise ValueError(
                f"Unknown LRP composite {composite!r}; expected one of {sorted(COMPOSITES)}, or a "
                "mapping with keys 'first' (optional), 'dense' and 'conv'."
            )
        spec = COMPOSITES[composite]
    elif isinstance(composite, Mapping):
        unknown = set(composite) - {"first", "dense", "conv", "attention", "stabilizer"}
        missing = {"dense", "conv"} - set(composite)
        if unknown or missing:
            raise ValueError(
                f"A composite mapping needs keys 'dense' and 'conv' (and optionally 'first', 'attention', "
                f"'stabilizer'); got {sorted(composite)}."
            )
        spec = composite
    else:
        raise TypeError(f"composite must be a name or a mapping, got {type(composite).__name__}.")
    first = spec.get("first")
    attention = spec.get("attention", "attnlrp")
    if attention not in ATTENTION_RULES:
        raise ValueError(f"A composite's 'attention' is one of {list(ATTENTION_RULES)}; got {attention!r}.")
    stabilizer = spec.get("stabilizer", STABILIZER)
    if not (isinstance(stabilizer, (int, float)) and stabilizer > 0):
        raise ValueError(f"A composite's 'stabilizer' is a number > 0 (it keeps divisions finite); got {stabilizer!r}.")
    return Composite(
        first=None if first is None else _rule(first, defaults),
        dense=_rule(spec["dense"], defaults),
        conv=_rule(spec["conv"], defaults),
        attention=attention,
        stabilizer=float(stabilizer),
    )


def _rule(spec: RuleSpec, defaults: Mapping[str, float]) -> Rule:
    if isinstance(spec, str):
        return make_rule(spec, **defaults)
    params = dict(spec)
    if "name" not in params:
        raise ValueError(f"A rule mapping needs a 'name' key, got {dict(spec)!r}.")
    name = params.pop("name")
    # The composite-wide defaults serve every rule; a key given to this rule must be one it takes.
    takes = RULES[name][1] if name in RULES else ()
    unknown = sorted(set(params) - set(takes))
    if unknown:
        raise ValueError(
            f"LRP rule {name!r} takes {list(takes) or 'no parameters'}; the composite gives it {unknown} as well "
            f"(in {dict(spec)!r}). Check the spelling, or drop the key."
        )
    return make_rule(name, **{**defaults, **params})
