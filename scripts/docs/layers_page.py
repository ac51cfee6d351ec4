"""The supported-layers page, written from the engine's own registry (``heatinv.lrp.canonical.LAYER_KINDS``).

A layer added to the engine appears here when the site is built; nothing is listed by hand.
"""

from __future__ import annotations

from heatinv.lrp.canonical import LAYER_KINDS, OP_KINDS
from heatinv.lrp.keras_hub import COVERED

INTRO = """# Supported layers

The engine explains a Keras 3 Sequential or functional model (one input, one output,
nested models expanded) built from the layers below; a subclass of one of them is explained
as its parent unless it overrides `call`, which is refused. Anything else raises
`UnsupportedLayerError` naming the layer, its class and what to do. This page is generated
from the engine's registry (`heatinv.lrp.canonical.LAYER_KINDS`) when the site is built.
"""


def _module_path(cls: type) -> str:
    if cls.__module__.startswith("keras"):
        return f"keras.layers.{cls.__name__}"
    return f"{cls.__module__}.{cls.__name__}"


def layers_page() -> str:
    """The page's Markdown: a table of layer classes by kind, the Keras ops, the keras-hub layers.

    Returns:
        Markdown text, one table row per kind of layer.
    """
    lines = [INTRO, "## Keras layers", "", "| Kind | Layers | How relevance passes |", "|---|---|---|"]
    for kind in LAYER_KINDS:
        names = ", ".join(f"`{_module_path(cls)}`" for cls in kind.classes)
        lines.append(f"| {kind.name} | {names} | {kind.relevance} |")
    lines += [
        "",
        "## Keras ops",
        "",
        "Ops written into a functional model between Keras tensors (`x + 3`, `keras.ops.multiply(a, b)`):",
        "",
        "| Between | Ops | How relevance passes |",
        "|---|---|---|",
    ]
    for between, names, how in OP_KINDS:
        lines.append(f"| {between} | {', '.join(f'`{name}`' for name in names)} | {how} |")
    lines += [
        "",
        "## keras-hub layers",
        "",
        'With the `hub` extra (`pip install -e ".[hub]"`), these keras-hub layers are explained; any other '
        "keras-hub layer is refused by name: " + ", ".join(f"`{name}`" for name in COVERED) + ".",
        "",
    ]
    return "\n".join(lines)
