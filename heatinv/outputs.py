"""A run's result files, each written whole or not at all: ``metrics.json``, ``student.keras``, ``heatmaps.png`` + ``.svg``."""

from __future__ import annotations

import os

import keras
from matplotlib.figure import Figure

from heatinv.atomic import atomic_path, write_json
from heatinv.figures import save


def write_run_files(out: str, metrics: dict, student: keras.Model, heatmaps: Figure) -> list[str]:
    """Write the result files of a run into ``out`` (both tasks).

    Args:
        out: the run directory.
        metrics: what ``metrics.json`` holds.
        student: the final student.
        heatmaps: the run's figure (:mod:`heatinv.figures`), written as PNG and SVG.

    Returns:
        The figure's two paths.

    Examples:
        >>> write_run_files(out, {"cosine": 0.99}, student, heatmap_figure(x, t, t0, t1))  # doctest: +SKIP
    """
    with atomic_path(os.path.join(out, "student.keras")) as tmp:
        student.save(tmp)
    paths = save(heatmaps, os.path.join(out, "heatmaps"))
    # Last: a run with metrics.json has all its results (a resume treats it as finished).
    write_json(os.path.join(out, "metrics.json"), metrics)
    return paths
