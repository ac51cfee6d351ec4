"""Figures a person reads: labelled heatmap panels with a shared colour bar (matplotlib).

Relevance is drawn as LRP papers draw it: blue-white-red, white at zero, one symmetric scale
for every heatmap panel of a figure so that colours compare across panels. A panel whose
values are tiny next to that scale would be a blank tile, and one whose values are several
times the scale a saturated one; such a panel is drawn amplified or attenuated by a power of
ten instead, and its title says by how much (``x100``, ``x0.1``).

The figures are :class:`matplotlib.figure.Figure` objects built without ``pyplot`` (no global
state, no display needed); :func:`save` writes them as PNG and SVG, :func:`to_rgb` renders one
for TensorBoard.

Examples:
    >>> import numpy as np
    >>> x = np.random.rand(28, 28)
    >>> target = np.random.randn(28, 28)
    >>> fig = heatmap_figure(x, target, 0.01 * target, target, {"cosine": 0.99})
    >>> [ax.get_title() for ax in fig.axes[:5]]
    ['input', 'target', 'initial (x100)', 'final', 'target - final']
    >>> save(fig, "/tmp/heatmaps")  # doctest: +SKIP
    ['/tmp/heatmaps.png', '/tmp/heatmaps.svg']
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

COLORMAP = "bwr"
TINY = 0.05
"""A panel whose largest |value| is below this share of the figure's scale is drawn amplified."""
SATURATED = 2.0
"""A panel whose largest |value| is above this many times the figure's scale is drawn attenuated.

Faint panels stay readable down to a few percent of the bar, so only tiny ones are
amplified; a panel past the bar loses its structure to one colour soon after, as a
manipulated student's map can (its total is its logit, free under a sum-normalized loss).
"""

SCORE_ORDER = ("cosine", "ssim", "pearson", "spearman", "loss")


RESCALED_NOTE = "a panel marked xN shows its values times N on the colour bar"


def heatmap_figure(
    image: np.ndarray,
    target: np.ndarray,
    initial: np.ndarray,
    final: np.ndarray,
    scores: Mapping[str, float] | None = None,
    title: str | None = None,
) -> Figure:
    """Input, target, initial, final and ``target - final`` heatmaps of one run, labelled.

    Args:
        image: the explained input, ``[H, W]``, ``[H, W, 1]`` (gray) or ``[H, W, 3]`` (RGB) in [0, 1].
        target, initial, final: heatmaps ``[H, W]`` or ``[H, W, C]`` (summed over channels).
        scores: similarity figures for the caption (``cosine``, ``ssim``, ...); others are ignored.
        title: the figure's title (e.g. what the target is).

    Returns:
        A figure with five image axes and one colour bar; the heatmaps share the symmetric
        scale ``[-v, v]`` with ``v`` the target's largest |value|.

    Examples:
        >>> fig = heatmap_figure(x, t, t, t)  # doctest: +SKIP
    """
    maps = [_as_map(m, name) for m, name in ((target, "target"), (initial, "initial"), (final, "final"))]
    target_map, initial_map, final_map = maps
    scale = _peak(target_map) or _peak(final_map) or 1.0
    fig = Figure(figsize=(12.5, 3.3), layout="constrained")
    axes = fig.subplots(1, 5)
    _draw_image(axes[0], image, "input")
    panels = [("target", target_map), ("initial", initial_map), ("final", final_map), ("target - final", target_map - final_map)]
    shown, rescaled = None, False
    for ax, (name, values) in zip(axes[1:], panels):
        shown, factor = _draw_map(ax, values, scale, name)
        rescaled |= factor != 1
    fig.colorbar(shown, ax=list(axes[1:]), shrink=0.85, label="relevance")
    if title:
        fig.suptitle(title, fontsize=11)
    caption = _caption(scores)
    if rescaled:
        caption += ("\n" if caption else "") + RESCALED_NOTE
    if caption:
        fig.text(0.5, -0.02, caption, ha="center", va="top", fontsize=10)
    return fig


@dataclass
class Row:
    """One test example of a dataset figure.

    Attributes:
        image: ``[H, W]``, ``[H, W, 1]`` or ``[H, W, 3]`` in [0, 1].
        reference, target, student: heatmaps ``[H, W]`` or ``[H, W, C]``.
        label: the example's class, as shown.
        cosine: the student heatmap's cosine similarity to the target.
    """

    image: np.ndarray
    reference: np.ndarray
    target: np.ndarray
    student: np.ndarray
    label: str
    cosine: float


def dataset_figure(rows: Sequence[Row], title: str | None = None) -> Figure:
    """A grid of test examples: input, reference heatmap, target, student heatmap.

    Each row's three heatmaps share one symmetric scale (the largest |value| of its reference
    and target), so the student is drawn on the target's scale; a colour bar per row gives it.
    A panel far below or above that scale is drawn amplified or attenuated by a power of ten,
    its own label at its top right saying so (``x100``, ``x0.1``).

    Args:
        rows: the examples, one row each (at least one).
        title: the figure's title.

    Returns:
        A figure with ``4 * len(rows)`` image axes and ``len(rows)`` colour bars.

    Examples:
        >>> fig = dataset_figure([Row(x, r, t, s, "7", 0.93)])  # doctest: +SKIP
    """
    if not rows:
        raise ValueError("dataset_figure needs at least one row; got none.")
    fig = Figure(figsize=(9.5, 2.2 * len(rows) + 0.6), layout="constrained")
    axes = np.asarray(fig.subplots(len(rows), 4, squeeze=False))
    columns = ("input", "reference", "target", "student")
    rescaled = False
    for r, row in enumerate(rows):
        reference, target, student = (_as_map(m, n) for m, n in ((row.reference, "reference"), (row.target, "target"), (row.student, "student")))
        scale = max(_peak(reference), _peak(target)) or _peak(student) or 1.0
        _draw_image(axes[r, 0], row.image, columns[0] if r == 0 else "")
        axes[r, 0].set_ylabel(f"class {row.label}\ncos {row.cosine:.3f}", fontsize=9)
        shown = None
        for c, values in enumerate((reference, target, student), start=1):
            shown, factor = _draw_map(axes[r, c], values, scale, "")
            # The column's name heads the first row; a factor, which is each panel's own, is marked
            # inside its panel, so that neither "target (x10)" nor a title beside it reads as the column's.
            axes[r, c].set_title(columns[c] if r == 0 else "", fontsize=10)
            if factor != 1:
                _mark_factor(axes[r, c], factor)
            rescaled |= factor != 1
        fig.colorbar(shown, ax=list(axes[r, 1:]), shrink=0.9, label="relevance")
    if title:
        fig.suptitle(title, fontsize=11)
    if rescaled:
        fig.text(0.5, -0.01, RESCALED_NOTE, ha="center", va="top", fontsize=10)
    return fig


def save(fig: Figure, stem: str) -> list[str]:
    """Write ``fig`` as ``<stem>.png`` and ``<stem>.svg``, each whole or not at all.

    Args:
        fig: the figure.
        stem: the path without extension; missing folders are created.

    Returns:
        The two paths written.

    Examples:
        >>> save(heatmap_figure(x, t, t, t), "outputs/run/heatmaps")  # doctest: +SKIP
    """
    directory = os.path.dirname(os.path.abspath(stem))
    os.makedirs(directory, exist_ok=True)
    written = []
    for extension, dpi in (("png", 110), ("svg", None)):
        path = f"{stem}.{extension}"
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        try:
            # bbox_inches="tight" keeps the caption, which sits below the axes
            fig.savefig(tmp, format=extension, dpi=dpi, bbox_inches="tight", facecolor="white")
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        written.append(path)
    return written


def to_rgb(fig: Figure, dpi: int = 80) -> np.ndarray:
    """The figure rendered to a uint8 ``[H, W, 3]`` array (for TensorBoard's Images tab)."""
    fig.set_dpi(dpi)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _draw_image(ax, image: np.ndarray, title: str) -> None:
    image = np.asarray(image, dtype=np.float64)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if not (image.ndim == 2 or (image.ndim == 3 and image.shape[-1] == 3)):
        raise ValueError(f"The input image has shape {image.shape}; expected [H, W], [H, W, 1] or [H, W, 3].")
    low, high = np.nanmin(image), np.nanmax(image)
    if low < 0 or high > 1:  # standardized or raw data: show its own range
        image = (image - low) / ((high - low) or 1.0)
    # as the data holds it, 0 black (a grayscale photo drawn inverted would read as its negative)
    ax.imshow(np.clip(image, 0, 1), cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=1, interpolation="none")
    _frame(ax, title)


def _mark_factor(ax, factor: float) -> None:
    """``xN`` in the panel's top-right corner, on a white patch that keeps it legible over the map."""
    ax.text(
        0.97, 0.97, f"x{factor:g}", transform=ax.transAxes, ha="right", va="top", fontsize=9,
        bbox={"facecolor": "white", "edgecolor": "0.6", "boxstyle": "round,pad=0.2"},
    )


def _draw_map(ax, values: np.ndarray, scale: float, title: str):
    peak = _peak(values)
    factor = 1
    if 0 < peak < TINY * scale:
        factor = 10 ** math.floor(math.log10(scale / peak))
    elif peak > SATURATED * scale:
        factor = 10.0 ** -math.ceil(math.log10(peak / scale))
    image = ax.imshow(values * factor, cmap=COLORMAP, vmin=-scale, vmax=scale, interpolation="none")
    if title:
        title = f"{title} (x{factor:g})" if factor != 1 else title
    elif factor != 1:
        title = f"x{factor:g}"
    _frame(ax, title)
    return image, factor


def _frame(ax, title: str) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=10)


def _as_map(values: np.ndarray, name: str) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 3:
        values = values.sum(axis=-1)  # relevance of a pixel = sum over its channels
    if values.ndim != 2:
        raise ValueError(f"The {name} heatmap has shape {values.shape}; expected [H, W] or [H, W, C] (one example).")
    return values


def _peak(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size else 0.0


def _caption(scores: Mapping[str, float] | None) -> str:
    if not scores:
        return ""
    parts = [f"{name} {scores[name]:.6g}" for name in SCORE_ORDER if name in scores and scores[name] is not None]
    return "   ".join(parts)


def token_figure(words: Sequence[str], maps: Mapping[str, np.ndarray], title: str | None = None, width: int = 72) -> Figure:
    """A text's words, one row per map (e.g. target, initial, student), each word's box coloured by its relevance.

    LXT's and Captum's convention: red for positive, blue for negative relevance, white for
    none, on one symmetric scale shared by the rows; padding (``<pad>``) is left out.

    Args:
        words: one word per token.
        maps: ``{label: [tokens] relevance}``.
        title: the figure's title.
        width: characters per line (the words are set in a monospaced font).

    Examples:
        >>> fig = token_figure(["a", "good", "film"], {"target": np.array([0.0, 1.0, 0.0]), "student": np.array([0.1, 0.8, -0.1])})
        >>> len(fig.axes)
        1
    """
    return texts_figure([(None, words, maps)], title, width)


def texts_figure(texts: Sequence[tuple[str | None, Sequence[str], Mapping[str, np.ndarray]]], title: str | None = None,
                 width: int = 72) -> Figure:
    """Several texts as :func:`token_figure` draws one, stacked: each ``(caption, words, maps)`` on its own scale.

    Examples:
        >>> fig = texts_figure([("#0", ["good"], {"target": np.array([1.0])}), ("#1", ["bad"], {"target": np.array([-1.0])})])
        >>> len(fig.axes)
        1
    """
    import matplotlib

    colours = matplotlib.colormaps[COLORMAP]
    drawn, top = [], 0.0  # (caption, words, values, peak, placed, lines, top) per text
    for caption, words, maps in texts:
        kept = [i for i, word in enumerate(words) if word != "<pad>"]
        values = {label: np.asarray(v, np.float64).reshape(-1) for label, v in maps.items()}
        peak = max(float(np.max(np.abs(v[kept]))) for v in values.values()) if kept else 0.0
        placed, column, line = [], 0, 1  # (token, column, line) in characters and lines of one row
        for i in kept:
            if column and column + len(words[i]) > width:
                column, line = 0, line + 1
            placed.append((i, column, line))
            column += len(words[i]) + 2
        lines = line + 1  # the label's line and the text's
        top -= 1.2 if caption else 0.0
        drawn.append((caption, words, values, peak, placed, lines, top))
        top -= lines * len(values)
    height = max(-0.3 * top + 0.7, 1.5)  # no text at all still leaves room for the title
    fig = Figure(figsize=(0.11 * width + 0.5, height))
    ax = fig.add_subplot()
    ax.set_axis_off()
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.2 / height, top=1 - (0.5 if title else 0.2) / height)
    for caption, words, values, peak, placed, lines, start in drawn:
        if caption:
            ax.text(0, start + 1.0, caption, fontsize=9, fontstyle="italic", va="center")
        for row, (label, v) in enumerate(values.items()):
            row_top = start - row * lines
            ax.text(0, row_top, label, fontsize=9, fontweight="bold", va="center")
            for i, column, line in placed:
                shade = 0.5 + 0.5 * v[i] / peak if peak > 0 else 0.5
                ax.text(column + 1, row_top - line, words[i], fontsize=9, family="monospace", va="center",
                        bbox={"facecolor": colours(shade), "edgecolor": "none", "pad": 1.5})
    ax.set_xlim(0, width + 2)
    ax.set_ylim(top, 0.6)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def token_html(words: Sequence[str], maps: Mapping[str, np.ndarray], title: str | None = None) -> str:
    """:func:`token_figure` as an HTML page: each word a span on its relevance's colour, the value in its tooltip.

    Examples:
        >>> "background:" in token_html(["good", "<pad>"], {"target": np.array([1.0, 0.0])})
        True
    """
    import html

    import matplotlib
    from matplotlib.colors import to_hex

    kept = [i for i, word in enumerate(words) if word != "<pad>"]
    values = {label: np.asarray(v, np.float64).reshape(-1) for label, v in maps.items()}
    peak = max(float(np.max(np.abs(v[kept]))) for v in values.values()) if kept else 0.0
    colours = matplotlib.colormaps[COLORMAP]
    rows = []
    for label, v in values.items():
        spans = " ".join(
            f'<span style="background:{to_hex(colours(0.5 + 0.5 * v[i] / peak if peak > 0 else 0.5))};padding:1px 3px" '
            f'title="{v[i]:.4g}">{html.escape(words[i])}</span>'
            for i in kept
        )
        rows.append(f"<p><b>{html.escape(label)}</b><br>{spans}</p>")
    head = f"<h3>{html.escape(title)}</h3>" if title else ""
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>heatinv</title></head>'
        f'<body style="font-family:monospace">{head}{"".join(rows)}'
        f"<p>red: positive relevance, blue: negative (one scale, largest |value| {peak:.4g})</p></body></html>\n"
    )


def feature_figure(
    feature_names: Sequence[str], maps: Mapping[str, np.ndarray], title: str | None = None, top: int = 15
) -> Figure:
    """Relevance per feature of a table, as grouped horizontal bars (e.g. reference, target, student).

    Shows the ``top`` features with the largest absolute relevance in any of the maps, largest
    first, so a hidden or swapped feature stays in view.

    Args:
        feature_names: one name per feature.
        maps: ``{label: [d] relevance}``; each is one bar per feature.
        title: the figure's title.
        top: how many features to show.

    Returns:
        The figure (save with :func:`save`, or :func:`to_rgb`).

    Examples:
        >>> fig = feature_figure(["age", "income"], {"reference": np.array([0.7, 0.3]), "student": np.array([0.0, 1.0])})
        >>> len(fig.axes)
        1
    """
    values = {label: np.asarray(v, np.float64).reshape(-1) for label, v in maps.items()}
    peak = np.max(np.abs(np.stack(list(values.values()))), axis=0)
    shown = np.argsort(-peak, kind="stable")[:top][::-1]
    fig = Figure(figsize=(7, 0.35 * len(shown) + 1.2))
    fig.subplots_adjust(left=0.4)  # room for long feature names
    ax = fig.add_subplot()
    height = 0.8 / len(values)
    for k, (label, v) in enumerate(values.items()):
        ax.barh(np.arange(len(shown)) + k * height, v[shown], height=height, label=label)
    ax.set_yticks(np.arange(len(shown)) + 0.4 - height / 2, [feature_names[i] for i in shown], fontsize=8)
    ax.axvline(0.0, color="black", linewidth=0.6)
    total = len(peak)
    ax.set_xlabel("relevance" if len(shown) == total else f"relevance (the {len(shown)} of {total} features largest in any map)")
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title, fontsize=10)
    return fig
