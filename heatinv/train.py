"""The main job: optimize a model's weights until its LRP heatmap matches a target.

    python -m heatinv.train target=digit7 loss=l1
    python -m heatinv.train -m loss=l1,mse,huber

:func:`run` does the work and takes any config with the schema of
:class:`heatinv.config.TrainConfig` (tests call it without Hydra); :func:`main` is the thin
Hydra entry point. The task returns ``1 - cosine`` so a sweeper can minimize it.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from heatinv.build import Parts, build_parts
from heatinv.checkpoints import (
    Checkpointer,
    RunDirectoryError,
    RunInterrupted,
    check_resumable,
    guard_run_directory,
    save_run_config,
)
from heatinv.config import ConfigError, register, validate
from heatinv.loop import GradientsVanished, train
from heatinv.lrp import UnsupportedLayerError
from heatinv.manipulate import DatasetTask
from heatinv.single import SingleTask
from heatinv.summaries import Summaries, flat_config, trial_name


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

    Example:
    >>> metrics = run(compose("train", overrides=["debug=smoke"]))  # doctest: +SKIP
    """
    validate(cfg)
    out = cfg.paths.output_dir
    os.makedirs(out, exist_ok=True)
    guard_run_directory(out, cfg.trainer.resume, cfg.trainer.overwrite)
    changed = check_resumable(out, cfg) if cfg.trainer.resume else []
    return run_task(cfg, build_parts(cfg), changed)


def run_task(cfg, parts: Parts, changed: list[str] = ()) -> dict:
    """The task of ``cfg`` on ``parts``, from its target to its files (the second half of :func:`run`).

    Args:
        cfg: a validated config whose run directory was checked.
        parts: the data and models (:func:`heatinv.build.build_parts`, or a test's own).
        changed: settings a resume changes (said when resuming).

    Returns:
        The metrics written to ``metrics.json``.
    """
    out, trainer = cfg.paths.output_dir, cfg.trainer
    task = DatasetTask(cfg, parts) if cfg.task.kind == "dataset" else SingleTask(cfg, parts)
    checkpointer = Checkpointer(out, task.student, task.optimizer, **task.state)
    start = 0
    if trainer.resume:
        start = checkpointer.restore()
        print(f"heatinv: resuming {out} after step {start} of {task.total}", flush=True)
        if changed:
            print(f"heatinv: resuming with changed settings: {'; '.join(changed)}", flush=True)
    else:
        save_run_config(out, cfg)

    with Summaries(os.path.join(out, "tensorboard")) as summaries:
        task.begin(summaries)
        loop = train(task, checkpointer, start, trainer, summaries, task.variables)
        metrics = task.finish(summaries, loop)
        summaries.hparams(flat_config(cfg), metrics, trial_id=trial_name(out, cfg.paths.root))
    task.write(out, metrics)
    if loop.stopped is not None:
        raise GradientsVanished(loop.stopped, loop.findings, loop.why)
    if task.stopped_before_start:
        raise GradientsVanished(0, task.findings)
    print(task.summary_line(metrics), flush=True)
    return metrics


@hydra.main(version_base="1.3", config_path="pkg://heatinv.configs", config_name="train")
def _hydra_main(cfg: DictConfig) -> float:
    try:
        return run(cfg)["objective"]
    except RunInterrupted as interrupted:
        print(f"heatinv: {interrupted}", file=sys.stderr, flush=True)
        sys.exit(128 + interrupted.signum)
    except GradientsVanished as stop:
        when = "before the first update" if stop.step == 0 else f"at step {stop.step}"
        print(f"heatinv: stopped {when}.\n{stop}", file=sys.stderr, flush=True)
        if _in_sweep():
            raise  # Hydra records the job as failed and the sweep's other jobs go on
        sys.exit(3)
    except (ConfigError, RunDirectoryError, FileNotFoundError, UnsupportedLayerError, ValueError, TypeError) as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"heatinv: {error}", file=sys.stderr, flush=True)
        if _in_sweep():
            raise
        sys.exit(2)


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
