"""Checkpoints, resume, and a run directory whose results are never silently overwritten.

A checkpoint holds the student's weights, the optimizer's state (Adam's moments and step
count) and the number of completed steps, so a resumed run continues exactly where the
checkpoint left it. ``tf.train.CheckpointManager`` writes each checkpoint completely before
it updates its index file, so a crash mid-write leaves the previous checkpoint in charge; and
a resume reads every tensor of a checkpoint before it uses it, so a checkpoint damaged later
(a full disk, a copy cut short) is skipped for the one before it. The config a run's
checkpoints belong to is kept next to them, and a resume that would continue them with a
different model, data, target or objective is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
from types import FrameType

import keras
import tensorflow as tf
from omegaconf import OmegaConf

from heatinv.atomic import atomic_path
from heatinv.config import MAY_CHANGE_ON_RESUME, flat_config
from heatinv.wording import run_dir_override

log = logging.getLogger(__name__)

RESULT_FILES = ("metrics.json", "student.keras", "heatmaps.png")
CHECKPOINTS = "checkpoints"
RUN_WRITES = RESULT_FILES + ("heatmaps.svg", "heatmaps.html", "vocabulary.json", "doctor.json", "tensorboard", CHECKPOINTS)
"""Everything a run writes into its directory but Hydra's ``.hydra/`` and ``train.log``."""


class RunDirectoryError(ValueError):
    """The run directory holds results that this run would overwrite."""


@contextlib.contextmanager
def held_run_directory(out: str):
    """Hold ``out`` for this run while it works: a second run started into it meanwhile is refused.

    An advisory lock (``flock``) on the folder itself: nothing is written into it, and the
    system lets go of it when the process ends, however it ends (SIGKILL included), so no
    stale lock can refuse a resume. Without it, two runs started into one ``hydra.run.dir``
    both wrote their results, checkpoints and TensorBoard events there.

    Raises:
        RunDirectoryError: another process holds ``out``.
    """
    handle = os.open(out, os.O_RDONLY)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirectoryError(
                f"Run directory {out} is in use by another heatinv run that has not ended. Its files were left as they "
                "are. Wait for that run to end (then resume or extend it there), or start this one in another folder: "
                "hydra.run.dir=<new folder>."
            ) from None
        except OSError as error:  # a file system without locks (some network file systems)
            log.warning(f"heatinv: cannot lock {out} ({error.strerror}): a second run started into it would not be stopped")
        yield
    finally:
        os.close(handle)


class RunInterrupted(Exception):
    """SIGTERM (pre-emption, ``kill``) or Ctrl-C stopped the run between two steps, after a checkpoint."""

    def __init__(self, out: str, completed: int, checkpoint: str, signum: int):
        self.out, self.completed, self.checkpoint, self.signum = out, completed, checkpoint, signum
        super().__init__(self.resume_with(run_dir_override(out)))

    def stopped(self) -> str:
        """What happened: the signal, the step, the checkpoint."""
        return f"{signal.Signals(self.signum).name} received: stopped after step {self.completed} and saved checkpoint {self.checkpoint}."

    def resume_with(self, where: str) -> str:
        """The message, with ``where`` (``hydra.run.dir=...``, or a sweep's ``hydra.sweep.dir=...``) in its command."""
        return f"{self.stopped()} Resume with the same command plus: {where} trainer.resume=true"


class RunFinished(RunDirectoryError):
    """``trainer.resume=true`` on a run that is finished: its checkpoint is at the last step, its results written."""

    def __init__(self, message: str, out: str):
        self.out = out
        super().__init__(message)


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
    """Refuse to start over a finished or an interrupted run unless asked to resume or overwrite,
    and to resume where there is no checkpoint. Nothing is removed here: ``overwrite`` clears
    the old run (:func:`clear_run_directory`) only once the new one is built.
    """
    found = [name for name in RESULT_FILES if os.path.exists(os.path.join(out, name))]
    folder = os.path.join(out, CHECKPOINTS)
    saved = checkpoint_numbers(folder)
    if found and not (resume or overwrite):
        extend = (
            "Extend it with trainer.resume=true and a larger trainer.steps (task.epochs for task=dataset), replace"
            if saved
            else "It has no checkpoint to continue from (it stopped early, or ran without checkpoints). Replace"
        )
        raise RunDirectoryError(
            f"Run directory {out} already holds results ({', '.join(found)}). Its files were left as they are. {extend} its "
            "results with trainer.overwrite=true, or choose another directory with hydra.run.dir=..."
        )
    if resume and not saved:
        raise ResumeError(
            f"trainer.resume=true, but {out} holds no checkpoint (no {CHECKPOINTS}/ckpt-*), so there is no run to "
            "resume there. Point hydra.run.dir at the folder of the run to continue (the one its console's last "
            "lines named), or start it without trainer.resume."
        )
    if saved and not (resume or overwrite):
        raise RunDirectoryError(
            f"Run directory {out} holds the checkpoints of an earlier run ({folder}). Its files were left as they are. Continue "
            "it with trainer.resume=true, start over with trainer.overwrite=true, or choose another directory with "
            "hydra.run.dir=..."
        )


def check_inputs_outside_run_writes(out: str, inputs: dict[str, str | None]) -> None:
    """Refuse a run whose results would be written over a file it reads (``model.path=student.keras``
    in the run directory itself), before anything is read or written.

    Args:
        out: the run directory.
        inputs: config key -> the path it names (None where unset).
    """
    written = {os.path.realpath(os.path.join(out, name)) for name in RUN_WRITES}
    for key, path in inputs.items():
        if not path:
            continue
        real = os.path.realpath(os.path.expanduser(str(path)))
        clash = next((w for w in written if real == w or real.startswith(w + os.sep)), None)
        if clash:
            raise RunDirectoryError(
                f"{key}={path} lies where this run writes its own {os.path.relpath(clash, os.path.realpath(out))} "
                f"(run directory {out}): the run would replace the file it reads. Choose another directory with "
                f"hydra.run.dir=..., or move or rename the file."
            )


def clear_run_directory(out: str) -> None:
    """Remove what an earlier run wrote (:data:`RUN_WRITES`).

    Called when a run that starts over (``trainer.overwrite=true``) is built, so that a config
    that fails to build leaves the old results as they were; afterwards no resume can pick up
    an old checkpoint, and TensorBoard shows no old curve or HParams row beside the new run's.
    """
    for name in RUN_WRITES:
        path = os.path.join(out, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


HYDRA_RECORD = "hydra"
"""``checkpoints/hydra/``: a copy of Hydra's ``.hydra/`` files of the start that ran."""


def keep_hydra_record(out: str, subdir: str) -> None:
    """Copy Hydra's record of this start (``<out>/<subdir>/*.yaml``) next to the run's checkpoints.

    Hydra writes its record before the run can refuse to start; :func:`restore_hydra_record`
    puts this copy back, so a refused start leaves the record of the run that is there.
    """
    _copy_files(os.path.join(out, subdir), os.path.join(out, CHECKPOINTS, HYDRA_RECORD))


def restore_hydra_record(out: str, subdir: str) -> bool:
    """Put back the Hydra record :func:`keep_hydra_record` kept, if any; whether it did."""
    return _copy_files(os.path.join(out, CHECKPOINTS, HYDRA_RECORD), os.path.join(out, subdir))


def _copy_files(source: str, destination: str) -> bool:
    """Copy the files of folder ``source`` into ``destination``, each whole; whether there was a ``source``."""
    if not os.path.isdir(source):
        return False
    for entry in os.scandir(source):
        if entry.is_file():
            with atomic_path(os.path.join(destination, entry.name)) as tmp:
                shutil.copyfile(entry.path, tmp)
    return True


def results_written(out: str) -> bool:
    """Whether every result file of a run is in ``out`` (``metrics.json`` is written last)."""
    return all(os.path.exists(os.path.join(out, name)) for name in RESULT_FILES)


def checkpoint_numbers(folder: str) -> list[int]:
    """The numbers of the checkpoints in ``folder`` (``ckpt-<n>.index`` or ``ckpt-<n>.data-*``), newest first.

    Read from the files themselves, not from TensorFlow's ``checkpoint`` state file, which a
    crash or a copy can leave behind or without the checkpoints it names.
    """
    numbers = set()
    for path in glob.glob(os.path.join(folder, "ckpt-*")):
        match = re.fullmatch(r"ckpt-(\d+)\.(index|data-\d+-of-\d+)", os.path.basename(path))
        if match:
            numbers.add(int(match.group(1)))
    return sorted(numbers, reverse=True)


def unreadable(prefix: str) -> str | None:
    """Why the checkpoint ``prefix`` does not read back whole (every tensor read), or None when it does."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as error:  # TensorFlow raises several types for missing and cut files
        return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    return None


class ResumeError(RunDirectoryError):
    """``trainer.resume=true`` cannot be honoured: no usable checkpoint, or a config that changes the run."""


class Checkpointer:
    """Save under ``<out>/checkpoints`` (the last two kept); restore the newest checkpoint that reads back whole.

    A checkpoint holds the student, the optimizer and the task's own ``state`` (trackables,
    e.g. the dataset task's running epoch sums), the number of completed steps, and the
    count of skipped NaN/Inf updates (:attr:`nonfinite_steps`, :attr:`nonfinite_streak`: the
    run's total and the current run of them in a row, 0 for a fresh run).
    """

    def __init__(self, out: str, student: keras.Model, optimizer: keras.optimizers.Optimizer, **state):
        self.out = out
        self.folder = os.path.join(out, CHECKPOINTS)
        self.completed = tf.Variable(0, dtype=tf.int64, trainable=False, name="completed_steps")
        self.nonfinite = tf.Variable(0, dtype=tf.int64, trainable=False, name="nonfinite_steps")
        self.streak = tf.Variable(0, dtype=tf.int64, trainable=False, name="nonfinite_streak")
        parts = dict(student=student, optimizer=optimizer, completed=self.completed, **state)
        self.checkpoint = tf.train.Checkpoint(**parts, nonfinite=self.nonfinite, streak=self.streak)
        # Checkpoints written before the counts were kept: everything else, the counts left at 0.
        self._without_counts = tf.train.Checkpoint(**parts)
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.folder, max_to_keep=2)

    @property
    def nonfinite_steps(self) -> int:
        return int(self.nonfinite.numpy())

    @property
    def nonfinite_streak(self) -> int:
        return int(self.streak.numpy())

    def restore(self) -> int:
        """Load the newest whole checkpoint; return the steps it had completed.

        A damaged checkpoint (a cut or missing file) is named in a one-line warning and the
        previous one is tried.

        Raises:
            ResumeError: there is no checkpoint, none reads back whole, or the newest whole one does
                not fit the student or optimizer.
        """
        numbers = checkpoint_numbers(self.folder)
        if not numbers:
            raise ResumeError(
                f"trainer.resume=true, but {self.folder} holds no checkpoint (ckpt-*), so there is nothing to resume. "
                "Start the run without trainer.resume (or with trainer.overwrite=true to replace what the directory "
                "holds), or point hydra.run.dir at the run to continue."
            )
        damaged = []
        for number in numbers:
            prefix = os.path.join(self.folder, f"ckpt-{number}")
            why = unreadable(prefix)
            if why is None:
                saved = {name.split("/")[0] for name, _ in tf.train.list_variables(prefix)}
                checkpoint = self.checkpoint if "nonfinite" in saved else self._without_counts
                try:
                    checkpoint.restore(prefix).assert_existing_objects_matched()
                except AssertionError as error:
                    # TensorFlow's first clause counts the unmatched objects; its list of them is long
                    found = str(error).split(", likely")[0].splitlines()[0][:200]
                    raise ResumeError(
                        f"trainer.resume=true, but checkpoint {prefix} does not fit this run's student or optimizer "
                        f"({found}). The config is the one it was written with, so a file the run reads changed "
                        "since (model.path, for one). Restore that file, or start over with trainer.overwrite=true."
                    ) from error
                return int(self.completed.numpy())
            damaged.append(prefix)
            print(f"heatinv: warning: checkpoint {prefix} is damaged ({why}); skipped.", file=sys.stderr, flush=True)
        files = sorted(os.path.basename(path) for path in glob.glob(os.path.join(self.folder, "ckpt-*")))
        raise ResumeError(
            f"trainer.resume=true, but no checkpoint in {self.folder} reads back whole ({', '.join(files)}: "
            f"{', '.join(os.path.basename(p) for p in damaged)} damaged). Start over with trainer.overwrite=true "
            "(the damaged checkpoints are removed), or restore the files from a copy."
        )

    def save(self, completed: int, nonfinite_steps: int = 0, nonfinite_streak: int = 0) -> str:
        """Write checkpoint ``ckpt-<completed>`` (whole before it is listed) and return its prefix."""
        self.completed.assign(completed)
        self.nonfinite.assign(nonfinite_steps)
        self.streak.assign(nonfinite_streak)
        return self.manager.save(checkpoint_number=completed)


RUN_CONFIG = "config.yaml"


def check_resume_step(out: str, completed: int, setting: str, value: int, steps_each: int = 1) -> None:
    """A resume goes on from the checkpoint after step ``completed`` to the step ``setting=value`` gives.

    Refused where that would go back (the results would claim fewer steps than the model
    was trained, and TensorBoard would drop the curves between them), and where the run is
    finished with its results written (a resume would only write them again, with its own
    timings of no steps in place of the run's).

    Args:
        setting: the key that sets the run's length: ``trainer.steps`` or ``task.epochs``.
        value: its value in this config.
        steps_each: steps per unit of ``setting`` (an epoch's batches).

    Examples:
        >>> check_resume_step("outputs/digit3", 3550, "trainer.steps", 300)  # doctest: +SKIP
        ResumeError: trainer.resume=true: the newest checkpoint in outputs/digit3 is after step 3550, past ...
    """
    total = value * steps_each
    asked = f"{setting}={value}" + (f" ({steps_each} steps each)" if steps_each > 1 else "")
    if completed > total:
        least = -(-completed // steps_each)
        if least * steps_each == completed and _finished_at(out, completed):
            least += 1  # a length that ends at the checkpoint is the finished run itself
        raise ResumeError(
            f"trainer.resume=true: the newest checkpoint in {out} is after step {completed}, past the {total} steps "
            f"that {asked} asks for; a resumed run goes on from its checkpoint, never back. Its files were left as they are. "
            f"Resume with {setting}={least} or more."
        )
    if completed == total and _finished_at(out, completed):
        raise RunFinished(
            f"Run directory {out} holds a finished run: its newest checkpoint is after step {completed} of the {total} "
            f"that {asked} asks for, and its results are written. Its files were left as they are. To extend it, resume with "
            f"{setting}={value + 1} or more; to start over, use trainer.overwrite=true.",
            out,
        )


def save_run_config(out: str, cfg) -> None:
    """Keep the config a run's checkpoints belong to (``<out>/checkpoints/config.yaml``).

    Hydra rewrites ``<out>/.hydra/config.yaml`` at every start, a resumed one included, so the
    config the checkpoints were made with is kept next to them.
    """
    with atomic_path(os.path.join(out, CHECKPOINTS, RUN_CONFIG)) as tmp:
        OmegaConf.save(cfg, tmp, resolve=False)


def check_resumable(out: str, cfg) -> list[str]:
    """Compare ``cfg`` with the config the run's checkpoints were made with.

    Returns:
        ``"key: old -> new"`` for each changed key that a resume may change (the caller says them).

    Raises:
        ResumeError: a key that changes the model, data, target or objective differs (each
            listed as old -> new), or the run directory has no saved config.
    """
    path = os.path.join(out, CHECKPOINTS, RUN_CONFIG)
    if not os.path.isfile(path):
        raise ResumeError(
            f"trainer.resume=true, but {path} is missing: the run's checkpoints cannot be matched with this config. "
            "Start over with trainer.overwrite=true, or choose another directory with hydra.run.dir=..."
        )
    old, new = flat_config(OmegaConf.load(path)), flat_config(cfg)
    changed = [key for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    described = {key: f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in changed}
    refused = [described[key] for key in changed if key not in MAY_CHANGE_ON_RESUME]
    if refused:
        raise ResumeError(
            f"Cannot resume {out}: this config changes the model, data, target or objective its checkpoints were "
            f"made with ({'; '.join(refused)}). Resume with the run's own values (see {path}), or start over with "
            "trainer.overwrite=true, or choose another directory with hydra.run.dir=..."
        )
    finished = _finished_run(out)
    if finished:  # said before anything loads (a resumed sweep's finished jobs)
        steps, steps_each = finished
        length = "task.epochs" if new.get("task.kind") == "dataset" else "trainer.steps"
        check_resume_step(out, steps, length, new[length], steps_each)
    if "task.epochs" in changed and new.get("task.lr_schedule") == "cosine":
        way = "higher" if new["task.epochs"] > old["task.epochs"] else "lower"
        described["task.epochs"] += (
            " (task.lr_schedule=cosine decays over the new total, so the learning rate at the resumed step is "
            f"recomputed on it: {way} than where the old schedule had brought it)"
        )
    # trainer.resume and trainer.overwrite say how this start treats the folder, not how the run trains
    return [described[key] for key in changed if key not in ("trainer.resume", "trainer.overwrite")]


def _finished_at(out: str, completed: int) -> bool:
    """Whether the run in ``out`` finished at step ``completed``: its results are of that step (an
    extension cut short leaves the results of the run it extends, of an earlier step)."""
    finished = _finished_run(out)
    return finished is not None and finished[0] == completed


def _finished_run(out: str) -> tuple[int, int] | None:
    """``(last step, steps per epoch or 1)`` of a run that finished (its results written, its newest
    checkpoint of that step), from its ``metrics.json``; None for any other run."""
    try:
        with open(os.path.join(out, "metrics.json")) as f:
            metrics = json.load(f)
    except (OSError, ValueError):
        return None
    saved = checkpoint_numbers(os.path.join(out, CHECKPOINTS))
    steps, epochs = metrics.get("steps"), metrics.get("epochs")
    if not (results_written(out) and saved and metrics.get("stopped_at_step") is None and steps == saved[0] and steps):
        return None
    return steps, steps // epochs if epochs else 1
