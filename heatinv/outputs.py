"""A run's result files, each written whole or not at all: ``metrics.json``, ``student.keras``, ``heatmaps.png``."""

from __future__ import annotations

import os

import keras
import numpy as np

from heatinv.atomic import atomic_path, write_json
from heatinv.render import write_png


def write_run_files(out: str, metrics: dict, student: keras.Model, heatmaps_rgb: np.ndarray) -> None:
    """Write the three result files of a run into ``out`` (both tasks).

    Example:
    >>> write_run_files(out, {"cosine": 0.99}, student, panel(tiles))  # doctest: +SKIP
    """
    write_json(os.path.join(out, "metrics.json"), metrics)
    with atomic_path(os.path.join(out, "student.keras")) as tmp:
        student.save(tmp)
    write_png(os.path.join(out, "heatmaps.png"), heatmaps_rgb)
