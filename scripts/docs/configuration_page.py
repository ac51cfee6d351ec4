"""The configuration reference, written from the typed schema (:mod:`heatinv.config`) and ``configs/``.

Each key's type and default come from the schema's dataclasses, its allowed values from
``heatinv.config.CHOICES`` and ``POSITIVE``, its description from the comment on its line in
the schema, and each group's options from the YAML files in ``configs/<group>/``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

from heatinv import config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

INTRO = """# Configuration reference

`python -m heatinv.train` composes its configuration with Hydra from `configs/train.yaml`, one
option per group (`data=csv`, `model=cnn`, ...), and then any `key=value` overrides. Hydra
checks every key and type against the schema in `heatinv/config.py` when the configuration is
composed (a typo or a wrong type stops the run before anything starts); the ranges below are
checked next, with an error that names the key, the value and what is allowed. This page is
generated from that schema and from `configs/` when the site is built.
"""


def _comments(cls: type) -> dict[str, str]:
    """Each field's trailing comment in the schema's source: the key's description."""
    found = {}
    for line in inspect.getsource(cls).splitlines():
        match = re.match(r"\s+(\w+): .*?  # (.*)$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def _type_name(annotation: str) -> str:
    """``Optional[str]`` as ``str or null``, as the key is written in YAML."""
    optional = re.fullmatch(r"Optional\[(.*)\]", annotation)
    return f"{optional.group(1)} or null" if optional else annotation


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return ""
    if value == "???":
        return "set by `configs/paths/`"
    return f"`{'null' if value is None else value}`"


def _allowed(key: str) -> str:
    if key in config.CHOICES:
        return ", ".join(f"`{choice}`" for choice in config.CHOICES[key])
    if key in config.POSITIVE:
        return "> 0"
    return ""


def _group_options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIGS / group).glob("*.yaml"))


def configuration_page() -> str:
    """The page's Markdown: the config groups with their options, then every key of every section.

    Returns:
        Markdown text; one table per section of :class:`heatinv.config.TrainConfig`.
    """
    defaults = re.findall(r"^\s+- (\w+): (\w+)", (CONFIGS / "train.yaml").read_text(), re.M)
    lines = [INTRO, "## Groups", "", "| Group | Default | Options |", "|---|---|---|"]
    for group, default in defaults:
        if (CONFIGS / group).is_dir():
            shown = "none" if default == "null" else f"`{default}`"
            lines.append(f"| `{group}` | {shown} | {', '.join(f'`{name}`' for name in _group_options(group))} |")
    hints = typing.get_type_hints(config.TrainConfig)
    for section in dataclasses.fields(config.TrainConfig):
        schema = hints[section.name]
        if not dataclasses.is_dataclass(schema):
            continue
        comments = _comments(schema)
        source_hints = {field.name: field.type for field in dataclasses.fields(schema)}
        lines += ["", f"## `{section.name}`", "", "| Key | Type | Default | Allowed | Meaning |", "|---|---|---|---|---|"]
        for field in dataclasses.fields(schema):
            key = f"{section.name}.{field.name}"
            if field.name not in comments:
                raise ValueError(f"{schema.__name__}.{field.name} in heatinv/config.py has no comment saying what {key} is.")
            meaning = comments[field.name].replace("|", "\\|")
            lines.append(
                f"| `{key}` | `{_type_name(source_hints[field.name])}` | {_default(field)} | {_allowed(key)} | {meaning} |"
            )
    lines.append("")
    return "\n".join(lines)
