"""What a run started from Python returns: the student, the metrics, the history, the figure."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import keras
from matplotlib.figure import Figure


@dataclass
class RunResult:
    """A finished run of :func:`heatinv.invert` or :func:`heatinv.manipulate`.

    Attributes:
        student: the optimized copy of the model (the model passed in is untouched).
        metrics: the run's final metrics, the keys of its ``metrics.json``.
        history: one dict per logged step (the dataset task: per epoch): ``step`` (the updates
            done), ``loss`` (the mean over the updates since the last logged step) and the
            task's values: the single task's ``cosine`` is that of the heatmap its last update
            started from (after ``step - 1`` updates, as TensorBoard's curve), the dataset
            task's ``test_cosine`` is measured after the epoch.
        figure: the run's labelled figure, ``heatmaps.png``.
        logdir: the run folder where one was given, else None.
    """

    student: keras.Model
    metrics: dict
    history: list[dict]
    figure: Figure = field(repr=False)
    logdir: str | None = None

    def plot(self, path: str | None = None) -> Figure:
        """The run's figure (a notebook shows it); with ``path`` also saved there (format from the suffix)."""
        if path is not None:
            self.figure.savefig(path)
        return self.figure

    def _repr_png_(self) -> bytes:  # a notebook shows the result as its figure
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        return buffer.getvalue()
