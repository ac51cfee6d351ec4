"""Checkpoints, resume, and a run directory whose results are never silently overwritten.

A checkpoint holds the student's weights, the optimizer's state (Adam's moments and step
count) and the number of completed steps, so a resumed run continues exactly where the
checkpoint left it. ``tf.train.CheckpointManager`` writes each checkpoint completely before
it updates its index file, so a crash mid-write leaves the previous checkpoint in charge.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

import keras
import tensorflow as tf

RESULT_FILES = ("metrics.json", "student.keras", "heatmaps.png")


class RunDirectoryError(ValueError):
    """The run directory holds results that this run would overwrite."""


class RunInterrupted(Exception):
    """SIGTERM (pre-emption, ``kill``) or Ctrl-C stopped the run between two steps, after a checkpoint."""

    def __init__(self, out: str, completed: int, checkpoint: str, signum: int):
        self.out, self.completed, self.checkpoint, self.signum = out, completed, checkpoint, signum
        super().__init__(
            f"{signal.Signals(signum).name} received: stopped after step {completed} and saved checkpoint "
            f"{checkpoint}. Resume with the same command plus: hydra.run.dir={out} trainer.resume=true"
        )


class StopRequests:
    """While active, SIGTERM and SIGINT only record themselves; the loop stops at the next step boundary.

    Raising from the signal handler instead could interrupt a step after its update was
    applied but before it was counted, and a resumed run would then repeat that update.
    """

    def __init__(self):
        self.signal: int | None = None
        self._previous: dict[int, object] = {}

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._record)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def guard_run_directory(out: str, resume: bool, overwrite: bool) -> None:
    """Refuse to start over a finished run unless asked to resume or overwrite."""
    found = [name for name in RESULT_FILES if os.path.exists(os.path.join(out, name))]
    if found and not (resume or overwrite):
        raise RunDirectoryError(
            f"Run directory {out} already holds results ({', '.join(found)}). Nothing was changed. Continue it "
            "with trainer.resume=true, replace its results with trainer.overwrite=true, or choose another "
            "directory with hydra.run.dir=..."
        )


class Checkpointer:
    """Save every ``every`` steps (0: never) under ``<out>/checkpoints``; restore the latest."""

    def __init__(self, out: str, student: keras.Model, optimizer: keras.optimizers.Optimizer, every: int):
        self.every = every
        self.completed = tf.Variable(0, dtype=tf.int64, trainable=False, name="completed_steps")
        self.checkpoint = tf.train.Checkpoint(student=student, optimizer=optimizer, completed=self.completed)
        self.manager = tf.train.CheckpointManager(self.checkpoint, os.path.join(out, "checkpoints"), max_to_keep=2)

    def restore(self) -> int:
        """Load the latest checkpoint; return the steps it had completed (0 when there is none)."""
        latest = self.manager.latest_checkpoint
        if latest is None:
            return 0
        self.checkpoint.restore(latest).assert_existing_objects_matched()
        return int(self.completed.numpy())

    def save(self, completed: int) -> str:
        self.completed.assign(completed)
        return self.manager.save(checkpoint_number=completed)

    def maybe_save(self, completed: int) -> None:
        if self.every and completed % self.every == 0:
            self.save(completed)
