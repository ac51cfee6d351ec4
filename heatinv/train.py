"""The main job: optimize a model's weights until its LRP heatmap matches a target.

    python -m heatinv.train target=digit7 loss=l1
    python -m heatinv.train -m loss=l1,mse,huber

:func:`run` does the work and takes any config with the schema of
:class:`heatinv.config.TrainConfig` (tests call it without Hydra); :func:`main` is the thin
Hydra entry point. The task returns ``1 - cosine`` so a sweeper can minimize it.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile

from heatinv.startup import start_tensorflow

start_tensorflow()  # before the imports below bring TensorFlow in: no CUDA notices on a CPU machine

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from heatinv.build import Parts, build_parts  # noqa: E402
from heatinv.cluster import WorkerLost, describe_cluster, multi_worker_strategy  # noqa: E402
from heatinv.job_log import DONE_MARK  # noqa: E402
from heatinv.checkpoints import (  # noqa: E402
    CHECKPOINTS,
    Checkpointer,
    RESULT_FILES,
    RunDirectoryError,
    RunFinished,
    RunInterrupted,
    check_resumable,
    check_inputs_outside_run_writes,
    check_resume_step,
    clear_run_directory,
    keep_hydra_record,
    checkpoint_numbers,
    guard_run_directory,
    held_run_directory,
    restore_hydra_record,
    save_run_config,
)
from heatinv.config import ConfigError, flat_config, register, validate  # noqa: E402
from heatinv.loop import GradientsVanished, train  # noqa: E402
from heatinv.lrp import UnsupportedLayerError  # noqa: E402
from heatinv.dataset_task import DatasetTask  # noqa: E402
from heatinv.single import SingleTask  # noqa: E402
from heatinv.summaries import Summaries, compared_hparams, trial_name  # noqa: E402
from heatinv.wording import count, run_dir_override  # noqa: E402

log = logging.getLogger(__name__)


def run(cfg) -> dict:
    """Run one job of either task; write TensorBoard events, ``metrics.json``, ``student.keras``, ``heatmaps.png``.

    The run flows one way: the run directory checked (and, on resume, the config compared
    with the checkpoints'), data and models built, the task's target and compiled step
    built, the newest whole checkpoint restored, the loop run, the outputs written.

    Returns:
        The metrics written to ``metrics.json`` (``objective`` is what a sweeper minimizes).

    Raises:
        GradientsVanished: the run stopped because its gradients vanished or stayed non-finite
            (its files are written first).
        RunInterrupted: SIGTERM or Ctrl-C stopped it after a checkpoint.

    Examples:
        >>> metrics = run(compose("train", overrides=["debug=smoke"]))  # doctest: +SKIP
    """
    validate(cfg)
    if cfg.trainer.strategy == "multi_worker":
        return _run_in_cluster(cfg)
    return _run_held(cfg.paths.output_dir, cfg)


def _run_held(out: str, cfg, announce: bool = True) -> dict:
    """The run in ``out``, which it holds (:func:`held_run_directory`) while it works."""
    os.makedirs(out, exist_ok=True)
    with held_run_directory(out):
        return _run_in(out, cfg, announce)


def _run_in_cluster(cfg) -> dict:
    """One worker's part of a multi-worker job: the chief runs in the run directory, the others beside it."""
    import tensorflow as tf

    cluster = describe_cluster()
    log.info(f"heatinv: {cluster}")
    multi_worker_strategy(cfg.trainer.collective_timeout)  # every worker waits here until all have joined
    run_dir = cfg.paths.output_dir
    try:
        return _run_held(run_dir, cfg) if cluster.chief else _run_as_worker(cfg)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError, tf.errors.AbortedError,
            tf.errors.InternalError) as error:
        raise WorkerLost(cluster, run_dir, cfg.trainer.collective_timeout, error) from error


def _run_as_worker(cfg) -> dict:
    """A worker that is not the chief: the same steps, its files in a temporary folder removed at the end.

    On ``trainer.resume=true`` it starts from the chief's checkpoints (the run directory on a
    file system the workers share), copied into that folder.
    """
    chief_out = cfg.paths.output_dir
    # The chief's checks, read only: where the chief refuses to start, so does every worker
    # (instead of building and then waiting for a chief that is gone).
    guard_run_directory(chief_out, cfg.trainer.resume, cfg.trainer.overwrite)
    if cfg.trainer.resume:
        check_resumable(chief_out, cfg)
    scratch = tempfile.mkdtemp(prefix="heatinv-worker-")
    try:
        if cfg.trainer.resume:
            shutil.copytree(os.path.join(chief_out, CHECKPOINTS), os.path.join(scratch, CHECKPOINTS))  # the run's config too
        cfg.paths.output_dir = scratch
        log.info(f"heatinv: this worker's files go to {scratch} (removed at the end); the chief writes {chief_out}")
        return _run_held(scratch, cfg, announce=False)
    except RunInterrupted as stopped:  # the chief's checkpoint is the one to resume from, not this folder's
        raise RunInterrupted(chief_out, stopped.completed, f"(the chief's newest, in {chief_out})", stopped.signum) from None
    finally:
        cfg.paths.output_dir = chief_out
        shutil.rmtree(scratch, ignore_errors=True)


def _run_in(out: str, cfg, announce: bool = True) -> dict:
    if cfg.trainer.resume and _in_sweep() and not _started(out):
        # Resuming a sweep finishes it: its jobs that never started start now, over anything
        # a start cut short before its first checkpoint wrote (TensorBoard's step-0 events).
        log.info(f"heatinv: trainer.resume=true: {out} holds no checkpoint or result of this job; it starts from step 0")
        cfg.trainer.resume, cfg.trainer.overwrite = False, True
    check_inputs_outside_run_writes(out, _input_paths(cfg))
    guard_run_directory(out, cfg.trainer.resume, cfg.trainer.overwrite)
    changed = check_resumable(out, cfg) if cfg.trainer.resume else []
    # as given: building fills in defaults (lrp.low/high from the data) that a resume's config leaves unset
    as_given = copy.deepcopy(cfg)
    log.info(f"heatinv: loading the {cfg.data.name} data and the {cfg.model.name} models")
    metrics = run_task(cfg, build_parts(cfg), changed, as_given)
    if announce:
        announce_files(out)
    return metrics


def announce_files(out: str) -> None:
    """Log where a finished run's files are, and how to look at them.

    Examples:
        >>> announce_files("outputs/2026-12-07/12-00-00")  # doctest: +SKIP
    """
    log.info(f"{DONE_MARK}{out} (heatmaps.png, metrics.json, student.keras)")
    log.info(f"heatinv: look at them with  tensorboard --logdir {shlex.quote(os.path.join(out, 'tensorboard'))}")


def run_task(cfg, parts: Parts, changed: list[str] = (), as_given=None, task=None) -> dict:
    """The task of ``cfg`` on ``parts``, from its target to its files (the second half of :func:`run`).

    Args:
        cfg: a validated config whose run directory was checked.
        parts: the data and models (:func:`heatinv.build.build_parts`, or a test's own).
        changed: settings a resume changes (said when resuming).
        as_given: ``cfg`` before building filled in its defaults, kept with a new run's
            checkpoints (default: ``cfg``).
        task: the task, where built already (:func:`heatinv.inversion.invert`'s); default: ``cfg``'s.

    Returns:
        The metrics written to ``metrics.json``.
    """
    out, trainer = cfg.paths.output_dir, cfg.trainer
    if task is None:
        task = DatasetTask(cfg, parts) if cfg.task.kind == "dataset" else SingleTask(cfg, parts)
    if not trainer.resume:
        # only now, once built: a config that fails to build leaves an old run whole, its checkpoints' config too
        if trainer.overwrite:
            clear_run_directory(out)
        save_run_config(out, cfg if as_given is None else as_given)
    checkpointer = Checkpointer(out, task.student, task.optimizer, **task.state)
    start = 0
    if trainer.resume:
        start = checkpointer.restore()
        if cfg.task.kind == "dataset":
            check_resume_step(out, start, "task.epochs", cfg.task.epochs, task.steps_per_epoch)
        else:
            check_resume_step(out, start, "trainer.steps", trainer.steps)
        log.info(f"heatinv: resuming {out} after step {start} of {task.total}")
        if changed:
            log.info(f"heatinv: resuming with changed settings: {'; '.join(changed)}")
    if (record := _hydra_record(out)) is not None:
        keep_hydra_record(out, record)  # this start runs: Hydra's record of it is the run's

    with Summaries(os.path.join(out, "tensorboard"), task.axis) as summaries:
        summaries.start_session(task.log_step(start) + 1 if start else 0)
        if not start:
            # A resumed run's step-0 summaries were written when it began: written again at
            # step 0 they would read as a restart, and TensorBoard would drop the curves before it.
            task.begin(summaries)
        loop = train(task, checkpointer, start, trainer, summaries, task.variables)
        metrics = task.finish(summaries, loop)
        hparams = compared_hparams(flat_config(cfg), _command_line_overrides())
        summaries.hparams(hparams, metrics, trial_id=trial_name(out, cfg.paths.root), experiment=not _in_sweep())
    task.write(out, metrics)
    if loop.stopped is not None:
        raise GradientsVanished(loop.stopped, loop.findings, loop.why)
    if task.stopped_before_start:
        raise GradientsVanished(0, task.findings)
    log.info(task.summary_line(metrics))
    # The dataset task evaluates the held-out images at each log step, inside that time.
    logged = "summaries and held-out evaluations" if "evaluation_seconds" in metrics else "summaries"
    done = metrics["steps"] - loop.start
    ran = count(done, "step") + (f" after resuming at step {loop.start}" if loop.start else "")
    log.info(
        f"heatinv: {ran} in {metrics['loop_seconds']:.1f} s "
        f"(the step {metrics['seconds']:.1f} s, {logged} {metrics['summaries_seconds']:.1f} s, "
        f"checkpoints {metrics['checkpoints_seconds']:.1f} s, compiling {metrics['first_call_seconds'] or 0.0:.1f} s)"
    )
    return metrics


def _input_paths(cfg) -> dict[str, str | None]:
    """The files and folders a run reads, by config key."""
    return {
        "data.path": cfg.data.path,
        "model.path": cfg.model.get("path"),
        "model.weights": cfg.model.get("weights"),
        "target.path": cfg.target.get("path"),
        "target.image": cfg.target.get("image"),
    }


def _started(out: str) -> bool:
    """Whether a run left a checkpoint or a result in ``out``."""
    return bool(checkpoint_numbers(os.path.join(out, CHECKPOINTS))) or any(
        os.path.exists(os.path.join(out, name)) for name in RESULT_FILES
    )


def _kept(finished: RunFinished) -> float:
    """A resumed sweep's finished job: its results stay as they are, its objective is read back for the sweeper."""
    with open(os.path.join(finished.out, "metrics.json")) as f:
        objective = json.load(f)["objective"]
    objective = float("nan") if objective is None else objective  # strict JSON keeps a NaN as null
    log.info(f"heatinv: {finished.out} had finished; its results are kept (objective {objective:.6g})")
    log.info(f"{DONE_MARK}{finished.out} (kept)")
    return objective


def _command_line_overrides() -> list[str]:
    """The job's overrides (``loss=l1``), for its HParams row; none when not run by Hydra (tests)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _hydra_record(out: str) -> str | None:
    """The folder of this job's Hydra record (``.hydra``), relative to the run directory ``out``; None
    outside Hydra, without a record, or where the run writes elsewhere than Hydra's folder (``paths.output_dir``)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    return hydra.output_subdir if os.path.realpath(hydra.runtime.output_dir) == os.path.realpath(out) else None


@hydra.main(version_base="1.3", config_path="pkg://heatinv.configs", config_name="train")
def _hydra_main(cfg: DictConfig) -> float:
    try:
        return _run_and_report(cfg)
    finally:
        # Hydra rewrites its record (.hydra/) at every start: a start refused before it ran puts back
        # the record of the run that is there (kept when that run started; the same files once this one has).
        if (record := _hydra_record(cfg.paths.output_dir)) is not None:
            restore_hydra_record(cfg.paths.output_dir, record)


def _run_and_report(cfg: DictConfig) -> float:
    """:func:`run`, with each way it can end said on stderr and given its exit code (a sweep's job: returned or raised)."""
    try:
        return run(cfg)["objective"]
    except RunFinished as finished:
        if not _in_sweep():
            _error(f"heatinv: {finished}")
            sys.exit(2)
        return _kept(finished)
    except RunInterrupted as interrupted:
        if _in_sweep():
            from hydra.core.hydra_config import HydraConfig

            # An Optuna search too: its seeded sampler proposes the same trials again, in order.
            sweep = run_dir_override(os.path.abspath(HydraConfig.get().sweep.dir), "hydra.sweep.dir")
            _error(f"heatinv: {interrupted.resume_with(sweep)} (finished jobs are kept, unstarted ones start)")
        else:
            _error(f"heatinv: {interrupted}")
        sys.exit(128 + interrupted.signum)
    except KeyboardInterrupt:
        if _in_sweep():
            raise  # the whole sweep stops
        _error(f"heatinv: {_interrupted_outside_the_loop(cfg.paths.output_dir)}")
        sys.exit(128 + signal.SIGINT)
    except WorkerLost as lost:
        _error(f"heatinv: {lost}")
        sys.exit(4)
    except GradientsVanished as stop:
        when = "before the first update" if stop.step == 0 else f"at step {stop.step}"
        _error(f"heatinv: stopped {when}.\n{stop}")
        if _in_sweep():
            raise  # Hydra records the job as failed and the sweep's other jobs go on
        sys.exit(3)
    except (ConfigError, RunDirectoryError, FileNotFoundError, UnsupportedLayerError, ValueError, TypeError) as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        _error(f"heatinv: {error}")
        if _in_sweep():
            raise
        sys.exit(2)


def _interrupted_outside_the_loop(out: str) -> str:
    """What Ctrl-C outside the training loop (loading data, training the reference, writing results) leaves, and what to run."""
    saved = checkpoint_numbers(os.path.join(out, CHECKPOINTS))
    if saved:
        return (
            f"interrupted (Ctrl-C) outside the training loop; the newest checkpoint, after step {saved[0]}, is kept. "
            f"Continue from it with the same command plus: {run_dir_override(out)} trainer.resume=true"
        )
    return (
        f"interrupted (Ctrl-C) outside the training loop, with no checkpoint in {out}. Run the command again to "
        "start over (a reference model that finished training is cached and reused)."
    )


def _error(message: str) -> None:
    """``message`` on stderr, and in the job's log file (the console handler writes to stdout)."""
    print(message, file=sys.stderr, flush=True)
    log.error(message, extra={"file_only": True})


def _in_sweep() -> bool:
    """Whether this job runs in a multirun, where exiting would end the sweep's other jobs."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def main() -> None:
    """Console entry point (``python -m heatinv.train`` / ``heatinv-train``)."""
    register()
    _hydra_main()


if __name__ == "__main__":
    main()
