"""The main job: optimize a model's weights until its LRP heatmap matches a target.

    python -m heatinv.train target=digit7 loss=l1
    python -m heatinv.train -m loss=l1,mse,huber

:func:`run` does the work and takes any config with the schema of
:class:`heatinv.config.TrainConfig` (tests call it without Hydra); :func:`main` is the thin
Hydra entry point. The task returns ``1 - cosine`` so a sweeper can minimize it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import hydra
import keras
import numpy as np
import tensorflow as tf
from omegaconf import DictConfig, OmegaConf

from heatinv.checkpoints import Checkpointer, RunDirectoryError, RunInterrupted, StopRequests, guard_run_directory
from heatinv.config import ConfigError, register, validate
from heatinv.data import load_dataset
from heatinv.doctor import Finding, HeatmapObjective, diagnose, format_report
from heatinv.losses import heatmap_loss
from heatinv.lrp import LRP, UnsupportedLayerError
from heatinv.models import Architecture, accuracy, build_model, load_model_file, reference_model
from heatinv.render import diverging_rgb, grayscale_rgb, panel, write_png
from heatinv.manipulate import run_dataset
from heatinv.similarity import similarity_numpy
from heatinv.step import compile_step, make_optimizer, schedule
from heatinv.summaries import Summaries, flat_config, trial_name
from heatinv.targets import Target, build_target


NOTHING_TO_LEARN = ("zero-residual", "dead-output", "all-zero")
"""Findings that leave the step nothing to follow: a run with one of them stops before step 1."""


class GradientsVanished(RuntimeError):
    """Every gradient of a step was zero or non-finite; carries the doctor's findings."""

    def __init__(self, step: int, findings: list[Finding], why: str | None = None):
        self.step, self.findings = step, findings
        when = why or ("before the first update" if step == 0 else f"every gradient of step {step} is zero")
        super().__init__(format_report(findings, when))


@dataclass
class Models:
    reference: keras.Model
    reference_accuracy: float
    student: keras.Model


def explainer_for(model: keras.Model, cfg) -> LRP:
    """The LRP explainer the config describes, bound to ``model``."""
    c = cfg.lrp
    return LRP(model, c.composite, low=c.low, high=c.high, epsilon=c.epsilon, gamma=c.gamma, output=c.output)


def architecture(cfg) -> Architecture:
    m = cfg.model
    return Architecture(m.name, tuple(m.hidden), tuple(m.filters), m.activation, m.output_activation, m.l2, m.beta)


def build_models(cfg, dataset) -> Models:
    """The reference (trained, cached; or the user's file) and the student to optimize."""
    if cfg.model.name == "file":
        reference = load_model_file(cfg.model.path)
        check_model_fits(reference, dataset, cfg.model.path)
        reference_acc = accuracy(reference, dataset.x_test, dataset.y_test)
        student = keras.models.clone_model(reference)  # fresh initial weights, same architecture
    else:
        reference, reference_acc = reference_model(
            architecture(cfg), dataset, cfg.model.reference_epochs, cfg.paths.cache_dir, seed=0
        )
        student = build_model(architecture(cfg), dataset.num_classes, seed=cfg.trainer.seed)
    if cfg.init.kind == "reference":
        student.set_weights(reference.get_weights())
    return Models(reference, reference_acc, student)


def check_model_fits(model: keras.Model, dataset, path: str) -> None:
    """A user's model must take the dataset's images and score its classes."""
    expected_in = (None,) + tuple(dataset.x_test.shape[1:])
    given_in = tuple(model.inputs[0].shape) if getattr(model, "inputs", None) else None
    given_out = tuple(model.outputs[0].shape) if getattr(model, "outputs", None) else None
    if given_in != expected_in or given_out is None or given_out[-1] != dataset.num_classes:
        raise ValueError(
            f"Model file {path} (model.path) takes inputs of shape {given_in} and gives outputs of shape "
            f"{given_out}; the {dataset.name} data needs inputs {expected_in} and {dataset.num_classes} outputs. "
            "Rebuild the model for 28x28x1 images and 10 classes (a Flatten layer first for an MLP)."
        )


def make_target(cfg, dataset, reference: keras.Model) -> Target:
    t = cfg.target
    return build_target(
        t.kind,
        dataset,
        explainer_for(reference, cfg) if t.kind == "digit" else None,
        digit=t.digit,
        index=t.index,
        path=t.path,
        image=t.image,
        pattern=t.pattern,
        scale=t.scale,
    )


def run(cfg) -> dict:
    """Run one inversion; write TensorBoard events, ``metrics.json``, ``student.keras``, ``heatmaps.png``.

    Returns:
        The metrics written to ``metrics.json``.
    """
    validate(cfg)
    out = cfg.paths.output_dir
    os.makedirs(out, exist_ok=True)
    guard_run_directory(out, cfg.trainer.resume, cfg.trainer.overwrite)
    keras.backend.clear_session()  # Hydra's basic launcher runs a sweep's jobs in one process
    keras.utils.set_random_seed(cfg.trainer.seed)

    dataset = load_dataset(cfg.data.name, cfg.data.path)
    models = build_models(cfg, dataset)
    if cfg.task.kind == "dataset":
        metrics = run_dataset(
            cfg,
            dataset,
            models.reference,
            models.reference_accuracy,
            models.student,
            lambda model: explainer_for(model, cfg),
            lambda metrics, student, rgb: write_run_files(out, metrics, student, rgb),
        )
        print(
            f"heatinv: held-out cosine {metrics['cosine']:.4f}, success rate {metrics['success_rate']:.3f}; "
            f"accuracy reference {metrics['reference_accuracy']:.3f}, student {metrics['student_accuracy']:.3f}",
            flush=True,
        )
        return {**metrics, "objective": 1.0 - metrics["cosine"]}
    target = make_target(cfg, dataset, models.reference)
    student = models.student
    explainer = explainer_for(student, cfg)

    dtype = tf.float64 if cfg.trainer.precision == "float64" else tf.float32
    x = tf.constant(target.image, dtype)
    label = tf.constant([target.label], tf.int32)
    target_map = tf.constant(target.heatmap, dtype)
    optimizer = make_optimizer(cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.momentum)
    loss_fn = heatmap_loss(cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
    step = compile_step(
        student,
        explainer,
        loss_fn,
        optimizer,
        "xla" if cfg.trainer.jit_compile else "function",
        steps_per_execution=cfg.trainer.steps_per_execution,
    )

    initial = explainer(x, label).numpy()
    objective = HeatmapObjective(target.heatmap, explainer, cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
    findings = diagnose(student, target.image, target.label, objective, cfg.trainer.precision)
    if findings:
        print(format_report(findings, "before the first update"), flush=True)
    steps, log_every = cfg.trainer.steps, cfg.trainer.log_every
    stopped = None
    if any(finding.code in NOTHING_TO_LEARN for finding in findings):
        # Exact zeros in eager can be rounding noise in the compiled step, which Adam would
        # blow up into full-size steps: stop before the first update instead.
        stopped = steps = 0
    checkpointer = Checkpointer(out, student, optimizer, cfg.trainer.checkpoint_every)
    done = checkpointer.restore() if cfg.trainer.resume else 0
    if done:
        print(f"heatinv: resuming {out} after step {done} of {steps}", flush=True)
    variables = student.trainable_variables
    progress = keras.utils.Progbar(steps, stateful_metrics=["loss", "cosine"], verbose=1 if sys.stdout.isatty() else 2)
    result = None
    with Summaries(os.path.join(out, "tensorboard")) as summaries:
        summaries.text("config", "```\n" + OmegaConf.to_yaml(cfg, resolve=False) + "\n```")
        summaries.text("target", target.source)
        summaries.text("diagnosis", format_report(findings, "before the first update"))
        seconds, skipped, streak, why = 0.0, 0, 0, None
        first_call, first_steps = None, 0
        last_checkpoint = done
        with StopRequests() as requests:
            for n, i, log in schedule(steps, cfg.trainer.steps_per_execution, log_every, start=done):
                if requests.signal is not None:
                    # Between calls: the weights hold exactly the updates of the steps done so far.
                    raise RunInterrupted(out, i - n, checkpointer.save(i - n), requests.signal)
                started = time.perf_counter()
                result = step(x, label, target_map, n)
                loss = float(result["loss"])  # one host read per call, for the progress bar
                if first_call is None:  # the first call also traces and compiles the step
                    first_call, first_steps = time.perf_counter() - started, n
                else:
                    seconds += time.perf_counter() - started
                nonfinite = int(result["nonfinite"])
                skipped += nonfinite
                streak = streak + nonfinite if nonfinite == n else nonfinite
                too_many = cfg.trainer.max_nonfinite and streak >= cfg.trainer.max_nonfinite
                if too_many or (not nonfinite and _all_zero(result)):
                    findings = diagnose(student, target.image, target.label, objective, cfg.trainer.precision)
                    if too_many:
                        why = f"{streak} steps in a row up to step {i} had a NaN/Inf loss or gradient (their updates were skipped)"
                    else:
                        why = f"every gradient of step {i} is zero"
                    summaries.text("diagnosis", format_report(findings, why), step=i)
                    stopped = steps = i
                    break
                if cfg.trainer.checkpoint_every and i // cfg.trainer.checkpoint_every > last_checkpoint // cfg.trainer.checkpoint_every:
                    checkpointer.save(i)
                    last_checkpoint = i
                # The last step's values are logged after the loop, from the final weights.
                if log and i < steps:
                    scores = similarity_numpy(result["heatmap"], target_map)
                    values = {"loss": loss, "nonfinite_steps": skipped, **{f"similarity/{k}": v for k, v in scores.items()}}
                    summaries.scalars(i, values)
                    summaries.gradients(i, variables, result["grad_norms"].numpy(), result["zero_fractions"].numpy())
                    summaries.histograms(i, variables, result["gradients"])
                    summaries.heatmaps(i, target.image, target.heatmap, result["heatmap"].numpy())
                    progress.update(i, [("loss", loss), ("cosine", scores["cosine"])])

        final_map = explainer(x, label).numpy()
        final_loss = float(loss_fn(tf.constant(final_map), target_map))
        scores = similarity_numpy(final_map, target.heatmap)
        metrics = {
            "loss": final_loss,
            **scores,
            "objective": 1.0 - scores["cosine"],
            "steps": steps,
            "seconds": seconds,
            "steps_per_second": (steps - done - first_steps) / seconds if seconds else float("nan"),
            "first_call_seconds": first_call,
            "reference_accuracy": models.reference_accuracy,
            "student_accuracy": accuracy(student, dataset.x_test, dataset.y_test),
            "target": target.source,
            "diagnosis": [finding.as_dict() for finding in findings],
            "stopped_at_step": stopped,
            "nonfinite_steps": skipped,
        }
        summaries.scalars(steps, {"loss": final_loss, **{f"similarity/{k}": v for k, v in scores.items()}})
        if result is not None:
            summaries.gradients(steps, variables, result["grad_norms"].numpy(), result["zero_fractions"].numpy())
            summaries.histograms(steps, variables, result["gradients"])
            progress.update(steps, [("loss", final_loss), ("cosine", scores["cosine"])])
        summaries.heatmaps(steps, target.image, target.heatmap, final_map)
        summaries.hparams(flat_config(cfg), metrics, trial_id=trial_name(out, cfg.paths.root))

    write_outputs(out, metrics, student, target, initial, final_map)
    write_json(os.path.join(out, "doctor.json"), [finding.as_dict() for finding in findings])
    if stopped is not None:
        raise GradientsVanished(stopped, findings, why if stopped else None)
    print(summary_line(metrics), flush=True)
    return metrics


def _all_zero(result: dict) -> bool:
    """Every gradient of the call's last update exactly zero (read from the step's small summaries)."""
    return bool(np.all(result["zero_fractions"].numpy() == 1.0))


def summary_line(metrics: dict) -> str:
    return (
        f"heatinv: cosine {metrics['cosine']:.4f}  ssim {metrics['ssim']:.3f}  pearson {metrics['pearson']:.4f}  "
        f"spearman {metrics['spearman']:.3f}  loss {metrics['loss']:.3g}  after {metrics['steps']} steps "
        f"({metrics['steps_per_second']:.0f}/s); accuracy reference {metrics['reference_accuracy']:.3f}, "
        f"student {metrics['student_accuracy']:.3f}"
    )


def write_json(path: str, data) -> None:
    """Write JSON whole or not at all: to a temporary name in the same folder, then rename."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def write_outputs(out: str, metrics: dict, student: keras.Model, target: Target, initial, final) -> None:
    """The single-heatmap run's files; the panel shows input, target, initial, final, difference."""
    vmax = float(np.abs(target.heatmap).max())
    tiles = [
        grayscale_rgb(target.image[0]),
        diverging_rgb(target.heatmap[0], vmax),
        diverging_rgb(initial[0], vmax),
        diverging_rgb(final[0], vmax),
        diverging_rgb(final[0] - target.heatmap[0], vmax),
    ]
    write_run_files(out, metrics, student, panel(tiles))


def write_run_files(out: str, metrics: dict, student: keras.Model, heatmaps_rgb: np.ndarray) -> None:
    """metrics.json, student.keras and heatmaps.png, each written whole or not at all."""
    write_json(os.path.join(out, "metrics.json"), metrics)
    tmp_model = os.path.join(out, ".student.tmp.keras")
    student.save(tmp_model)
    os.replace(tmp_model, os.path.join(out, "student.keras"))
    write_png(os.path.join(out, "heatmaps.png"), heatmaps_rgb)


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
