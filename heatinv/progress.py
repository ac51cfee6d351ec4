"""Progress of every long stretch: a Keras progress bar in a terminal, a line every few seconds in a log.

In a terminal the bar redraws in place. Where output goes to a file (Slurm, Hydra's joblib
workers, ``> log``) a redrawn bar would be thousands of lines, and Keras's non-terminal mode
prints only at the end; :class:`Progress` prints one line at most every ``every`` seconds
instead, and one when the stretch ends. Lines go through :mod:`logging` (logger
``heatinv.progress``), so under Hydra they reach the console and the job's ``train.log``
alike; the redrawn bar is for the terminal only, and its last state is logged as one line.
"""

from __future__ import annotations

import logging
import sys
import time

import keras

REPORT_SECONDS = 10.0

log = logging.getLogger(__name__)


class Progress:
    """``done`` of ``total`` units of one stretch of work (training steps, images, epochs).

    Args:
        what: the stretch, as the report names it (``"reference training"``).
        total: the number of units.
        unit: the units' name, plural (``"steps"``).
        every: seconds between two lines in a log (not a terminal).
        stream: where a bar is drawn when it is a terminal (else lines are logged).
        start: units done before this stretch (a resumed run, or a first call timed apart):
            rates and estimates count from here.

    Examples:
        >>> progress = Progress("explaining the training set", 1797, "images")  # doctest: +SKIP
        >>> progress.update(256)  # doctest: +SKIP
    """

    def __init__(self, what: str, total: int, unit: str = "steps", every: float = REPORT_SECONDS, stream=None, start: int = 0):
        self.what, self.total, self.unit, self.every = what, int(total), unit, every
        self.stream = stream or sys.stdout
        self.started = self.last_line = time.monotonic()
        self.start = int(start)
        self.bar = None
        log.info(f"heatinv: {what}")
        if self.stream.isatty():
            # The bar's estimate counts from its first update: it starts with the units before `start` left out.
            self.bar = keras.utils.Progbar(self.total - self.start, unit_name=unit.rstrip("s") or "step", verbose=1)

    def update(self, done: int, values: dict[str, float] | None = None) -> None:
        """Report ``done`` units (cumulative) and the current ``values`` (e.g. the loss)."""
        values = values or {}
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(done - self.start, list(values.items()), finalize=done >= self.total)
            if done >= self.total:
                self._line(done, now, values, to_console=False)
            return
        if done < self.total and now - self.last_line < self.every:
            return
        self.last_line = now
        self._line(done, now, values)

    def _line(self, done: int, now: float, values: dict[str, float], to_console: bool = True) -> None:
        shown = "".join(f", {name} {value:.4g}" for name, value in values.items())
        percent = 100.0 * done / self.total if self.total else 100.0
        line = f"heatinv: {self.what}: {done}/{self.total} {self.unit} ({percent:.0f}%), {now - self.started:.0f} s{shown}"
        log.info(line, extra={} if to_console else {"file_only": True})


class FitProgress(keras.callbacks.Callback):
    """:class:`Progress` for ``model.fit``, counting batches over all epochs."""

    def __init__(self, what: str, epochs: int, batches_per_epoch: int):
        super().__init__()
        self.progress = Progress(what, epochs * batches_per_epoch, "batches")
        self.batches_per_epoch, self.epoch = batches_per_epoch, 0

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        loss = (logs or {}).get("loss")
        values = {"loss": float(loss)} if loss is not None else None
        self.progress.update(self.epoch * self.batches_per_epoch + batch + 1, values)


class ConsoleFilter(logging.Filter):
    """Keeps records marked ``file_only`` off the console (configs/hydra/default.yaml): what the
    console already shows another way (a progress bar's last state, an error printed on stderr)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "file_only", False)
