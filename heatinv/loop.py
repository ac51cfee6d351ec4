"""The training loop both tasks share: resume, steps, NaN/Inf guard, checkpoints, SIGTERM, summaries, progress.

A task (:class:`heatinv.single.SingleTask`, :class:`heatinv.dataset_task.DatasetTask`) says
what differs: its objective and its batches (``calls``), what it logs at a log step, and
how it diagnoses a run whose gradients vanished. Everything else is here, once:

- resume: the newest checkpoint that reads back whole (:class:`heatinv.checkpoints.Checkpointer`);
- each call's updates, timed without the first call (which traces and compiles the step);
- the NaN/Inf guard: a step with a non-finite loss or gradient skips its update, and
  ``trainer.max_nonfinite`` of them in a row stop the run; a step whose gradients are all
  exactly zero stops it too (:class:`GradientsVanished`, with the task's diagnosis);
- checkpoints every ``trainer.checkpoint_seconds`` of wall time (and every
  ``trainer.checkpoint_every`` steps, when set) and at the end; SIGTERM or Ctrl-C stop
  between two calls with a checkpoint (:class:`heatinv.checkpoints.RunInterrupted`);
- gradient norms and zero fractions and the task's summaries at each log step, histograms
  and images at about :data:`RARE_LOGS` of them, and a progress display that starts once
  the step is compiled;
- the bookkeeping's cost: the loop's wall time, and how much of it went to summaries and
  to checkpoints (``metrics.json``), so ``steps_per_second`` is not read as the run's speed.

``HEATINV_TEST_SIGNAL_AT_STEP=N:SIGNAL`` (test-only: the fault-injection tests set it in a
child process's environment) makes the run send itself ``SIGNAL`` once step ``N`` is done
and checkpointed where due, so a test kills or stops a run at a known step instead of racing it.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from heatinv.checkpoints import Checkpointer, RunInterrupted, StopRequests
from heatinv.doctor import Finding, format_report
from heatinv.progress import Progress
from heatinv.summaries import Summaries

TEST_SIGNAL_VARIABLE = "HEATINV_TEST_SIGNAL_AT_STEP"
RARE_LOGS = 5
"""About how many log steps of a run also write histograms, images and every similarity (the costly summaries)."""

log = logging.getLogger(__name__)


class GradientsVanished(RuntimeError):
    """Every gradient of a step was zero, or too many steps in a row were non-finite; carries the diagnosis."""

    def __init__(self, step: int, findings: list[Finding], why: str | None = None):
        self.step, self.findings = step, findings
        when = why or ("before the first update" if step == 0 else f"every gradient of step {step} is zero")
        if findings:
            super().__init__(format_report(findings, when))
        else:  # a clean bill beside a stop would contradict it
            super().__init__(
                f"heatinv doctor: {when}\nDifferentiated again outside the compiled step, what the doctor probes (the "
                "heatmap loss; with task=dataset its heatmap term on a few held-out examples, not the cross-entropy "
                "or teacher terms) has non-zero, finite gradients: no cause the doctor knows. Look at the run's "
                "learning rate and loss weights (a step that overflows makes NaN), and at the examples the step saw; "
                "please report the case if neither explains it."
            )


@dataclass
class Call:
    """One call of the compiled step: ``steps`` updates on ``batch``, ``done`` steps after it.

    ``log`` marks a log step (the task's summaries, gradient statistics); the loop marks
    about :data:`RARE_LOGS` of them ``rare`` (histograms, images).
    """

    steps: int
    done: int
    log: bool
    batch: tuple
    rare: bool = False


class Task(Protocol):
    """What differs between the two tasks; :func:`heatinv.train.run_task` and :func:`train` use only this.

    Attributes:
        what: names the loop in the progress display.
        axis: what TensorBoard's step counts (``"step"`` or ``"epoch"``, see :meth:`log_step`).
        total: steps of the whole run.
        student: the model the steps update (under a strategy, its mirrored copy).
        optimizer: its optimizer (checkpointed with it).
        state: the task's own trackables to checkpoint (e.g. running epoch sums).
        variables: the student's trainable variables (gradient statistics' tags).
        stopped_before_start: the task refused to take a first step (the doctor's pre-flight finding).
    """

    what: str
    axis: str
    total: int
    student: object
    optimizer: object
    state: dict
    variables: list
    stopped_before_start: bool

    def begin(self, summaries: Summaries) -> None:
        """Write what is known before the first step (config, target, initial metrics)."""

    def calls(self, start: int) -> Iterator[Call]:
        """The calls from step ``start`` to ``total``: the same at every resume point."""

    def step(self, call: Call) -> dict:
        """Run ``call``: ``loss``, ``terms``, ``nonfinite`` and, when measured, ``grad_norms``/``zero_fractions``."""

    def log(self, summaries: Summaries, call: Call, result: dict) -> dict[str, float]:
        """The task's summaries at a log step; returns values for the progress display."""

    def log_step(self, done: int) -> int:
        """TensorBoard's step for ``done`` steps (the step, or the epoch)."""

    def diagnose(self) -> list[Finding]:
        """Why gradients vanished, for a stopped run."""

    def finish(self, summaries: Summaries, loop: LoopResult) -> dict:
        """The final metrics (and last summaries), from the final weights."""

    def write(self, out: str, metrics: dict) -> None:
        """The run's files."""


@dataclass
class LoopResult:
    """What the loop measured; the task's final metrics add to it.

    Attributes:
        start: steps done before this process (a resumed run), 0 for a fresh one.
        steps: steps done at the end.
        seconds: time in the step calls, without the first call.
        loop_seconds: wall time of the whole loop, first call, summaries and checkpoints included.
        summaries_seconds: of it, in summaries and the task's log steps (its evaluations included).
        checkpoints_seconds: of it, in checkpoints.
        first_call_seconds: the first call (tracing and compiling included), None without calls.
        first_call_steps: the updates of that first call.
        nonfinite_steps: updates skipped for a NaN/Inf loss or gradient since the run began (before a resume too).
        stopped: the step the run stopped at, when gradients vanished; else None.
        why: the reason, for the report.
        findings: the task's diagnosis when it stopped.
        last: the last call's result (None without calls).
        history: at each log step of this process, ``{"step": ..., "loss": ..., **the task's values}``
            (the loss: the mean since the previous log step; the values as the task logs them).
    """

    start: int
    steps: int = 0
    seconds: float = 0.0
    loop_seconds: float = 0.0
    summaries_seconds: float = 0.0
    checkpoints_seconds: float = 0.0
    first_call_seconds: float | None = None
    first_call_steps: int = 0
    nonfinite_steps: int = 0
    stopped: int | None = None
    why: str | None = None
    findings: list[Finding] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    last: dict | None = None

    def timing(self) -> dict:
        """The step's speed (``seconds``, ``steps_per_second``: the step calls without the first)
        and the run's (``loop_seconds``, ``loop_steps_per_second``: everything), with the
        bookkeeping's share (``summaries_seconds``, ``checkpoints_seconds``)."""
        timed = self.steps - self.start - self.first_call_steps
        done = self.steps - self.start
        return {
            "seconds": self.seconds,
            "steps_per_second": timed / self.seconds if self.seconds else None,  # None: no step timed after the first call
            "first_call_seconds": self.first_call_seconds,
            "loop_seconds": self.loop_seconds,
            "loop_steps_per_second": done / self.loop_seconds if self.loop_seconds else None,
            "summaries_seconds": self.summaries_seconds,
            "checkpoints_seconds": self.checkpoints_seconds,
        }


def train(task: Task, checkpointer: Checkpointer, start: int, trainer, summaries: Summaries, variables) -> LoopResult:
    """Run ``task`` from step ``start`` to ``task.total``.

    Args:
        task: the single or dataset task.
        checkpointer: saves the student, the optimizer and the task's state.
        start: steps already done (the restored checkpoint's), 0 for a fresh run.
        trainer: the ``trainer`` config group (``checkpoint_seconds``, ``checkpoint_every``, ``max_nonfinite``).
        summaries: the run's TensorBoard writer.
        variables: the student's trainable variables (gradient statistics' tags).

    Returns:
        A :class:`LoopResult`; the task's files are written by the caller.

    Examples:
        >>> result = train(task, checkpointer, checkpointer.restore(), cfg.trainer, summaries, variables)  # doctest: +SKIP
    """
    # A resumed run goes on counting the skipped updates where its checkpoint left them.
    loop = LoopResult(start=start, steps=start, nonfinite_steps=checkpointer.nonfinite_steps)
    signal_at = _test_signal()
    progress = None
    streak, last_checkpoint = checkpointer.nonfinite_streak, start
    window_sum, window_calls = 0.0, 0  # the finite losses of the calls since the last logged one
    every, seconds = trainer.checkpoint_every, trainer.checkpoint_seconds
    rare_every = max(1, math.ceil(task.total / RARE_LOGS))
    began = last_saved = time.perf_counter()

    def save(step: int) -> str:
        nonlocal last_saved
        started = time.perf_counter()
        summaries.flush()  # a run resumed from this checkpoint keeps every summary up to it
        path = checkpointer.save(step, loop.nonfinite_steps, streak)
        last_saved = time.perf_counter()
        loop.checkpoints_seconds += last_saved - started
        return path

    if start < task.total:  # a run the doctor stopped before its first update has no step to compile
        log.info("heatinv: compiling the step (the first call traces it)")
    with StopRequests() as requests:
        for call in task.calls(start):
            if requests.signal is not None:
                # Between calls: the weights hold exactly the updates of the steps done so far.
                raise RunInterrupted(checkpointer.out, loop.steps, save(loop.steps), requests.signal)
            started = time.perf_counter()
            result = task.step(call)
            loss = float(result["loss"])  # one host read per call
            if loop.first_call_seconds is None:
                loop.first_call_seconds, loop.first_call_steps = time.perf_counter() - started, call.steps
                # Estimates start here: the first call's compiling says nothing about the rest.
                progress = Progress(task.what, task.total, "steps", start=start)
            else:
                loop.seconds += time.perf_counter() - started
            previous, loop.steps, loop.last = loop.steps, call.done, result
            nonfinite = int(result["nonfinite"])
            loop.nonfinite_steps += nonfinite
            streak = streak + nonfinite if nonfinite == call.steps else nonfinite
            too_many = trainer.max_nonfinite and streak >= trainer.max_nonfinite
            if too_many or (not nonfinite and _all_zero(result)):
                if too_many:
                    loop.why = (
                        f"{streak} steps in a row up to step {call.done} had a NaN/Inf loss or gradient "
                        "(their updates were skipped)"
                    )
                else:
                    loop.why = f"every gradient of step {call.done} is zero"
                loop.findings = task.diagnose()
                summaries.preformatted("diagnosis", format_report(loop.findings, loop.why), step=call.done)
                loop.stopped = call.done
                break
            if math.isfinite(loss):
                window_sum, window_calls = window_sum + loss, window_calls + 1
            # The mean since the last logged call, as Keras's bar shows an epoch's: the dataset task's
            # batches differ, and its last batch's loss is noise beside the epoch's line.
            values = {"loss": window_sum / window_calls if window_calls else loss}
            if call.log:
                window_sum, window_calls = 0.0, 0
                logged = time.perf_counter()
                call.rare = call.done // rare_every > previous // rare_every or call.done >= task.total
                values.update(task.log(summaries, call, result))
                at = task.log_step(call.done)
                loop.history.append({"step": at, **values})
                if "zero_fractions" in result:
                    summaries.health(at, loop.nonfinite_steps, variables, result["grad_norms"].numpy(), result["zero_fractions"].numpy())
                    if call.rare and "gradients" in result:
                        summaries.histograms(at, variables, result["gradients"])
                else:
                    summaries.health(at, loop.nonfinite_steps)
                loop.summaries_seconds += time.perf_counter() - logged
            # After the call's summaries: a run resumed from this checkpoint does not write them again.
            if (every and call.done // every > last_checkpoint // every) or (seconds and time.perf_counter() - last_saved >= seconds):
                save(call.done)
                last_checkpoint = call.done
            progress.update(call.done, values)
            if signal_at is not None and call.done >= signal_at[0]:
                os.kill(os.getpid(), signal_at[1])  # test-only, see the module docstring
                signal_at = None
    if loop.stopped is None and loop.steps > last_checkpoint and (every or seconds):
        save(loop.steps)  # a finished run can be extended (more steps, trainer.resume=true)
    loop.loop_seconds = time.perf_counter() - began
    return loop


def _all_zero(result: dict) -> bool:
    """Every gradient of the call's last update exactly zero (read from the step's small summaries)."""
    return "zero_fractions" in result and bool(np.all(result["zero_fractions"].numpy() == 1.0))


def _test_signal() -> tuple[int, int] | None:
    """``(step, signal number)`` from ``HEATINV_TEST_SIGNAL_AT_STEP=N:SIGNAL``; None when unset."""
    value = os.environ.get(TEST_SIGNAL_VARIABLE)
    if not value:
        return None
    step, _, name = value.partition(":")
    try:
        return int(step), int(signal.Signals[name or "SIGTERM"])
    except (ValueError, KeyError):
        raise ValueError(
            f"{TEST_SIGNAL_VARIABLE}={value!r} is not STEP:SIGNAL (e.g. 70:SIGKILL); it is a test-only hook, unset it."
        ) from None
