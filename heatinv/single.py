"""The single task: one image's heatmap moves to one target.

Its objective is the heatmap loss alone (:class:`heatinv.losses.HeatmapMatch`) and its batch
is the same image every step; the loop (:mod:`heatinv.loop`) does the rest. Before the first
update the doctor diagnoses the student; a finding that leaves nothing to learn stops the run
before step 1.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import tensorflow as tf
from omegaconf import OmegaConf

from heatinv.atomic import atomic_path, write_json
from heatinv.data.text import words
from heatinv.build import VOCABULARY, Parts, explainer_for, single_target
from heatinv.doctor import HeatmapObjective, diagnose, format_report
from heatinv.loop import Call, LoopResult
from heatinv.losses import HeatmapMatch, heatmap_loss
from heatinv.lrp.reach import best_cosine, input_proportional_rule
from heatinv.models import accuracy
from heatinv.outputs import write_run_files
from heatinv.figures import feature_figure, heatmap_figure, token_figure, token_html
from heatinv.similarity import cosine_numpy, similarity_numpy
from heatinv.step import compile_step, mode_for, optimizer_from, schedule
from heatinv.summaries import Summaries
from heatinv.targets import Target
from heatinv.wording import count, out_of_reach

log = logging.getLogger(__name__)

REACH_WARNING = 0.99
"""The best reachable cosine below which the task warns that its target is out of the rule's reach."""

NOTHING_TO_LEARN = ("zero-residual", "dead-output", "vanished-signal", "all-zero")
"""Findings that leave the step nothing to follow: a run with one of them stops before step 1."""


class SingleTask:
    """Optimize ``parts.student`` until its heatmap of the target's image matches the target.

    The target is the ``target`` config group's, or one given (:func:`heatinv.inversion.invert`'s
    arrays). Without data (``parts.dataset`` None: :func:`heatinv.inversion.invert` without
    held-out examples) the accuracies are None and a table's features are named ``x0, x1, ...``.

    Examples:
        >>> task = SingleTask(cfg, build_parts(cfg))  # doctest: +SKIP
        >>> loop = train(task, checkpointer, 0, cfg.trainer, summaries, task.variables)  # doctest: +SKIP
    """

    axis = "step"  # TensorBoard's x axis: one point per log step

    def __init__(self, cfg, parts: Parts, target: Target | None = None):
        self.cfg, self.parts = cfg, parts
        self.target = single_target(cfg, parts.dataset, parts.reference) if target is None else target
        self.student = parts.student
        self.explainer = explainer_for(self.student, cfg)
        dtype = tf.float64 if cfg.trainer.precision == "float64" else tf.float32
        self.x = tf.constant(self.target.image, tf.int32 if self.explainer.tokens else dtype)
        self.label = tf.constant([self.target.label], tf.int32)
        self.target_map = tf.constant(self.target.heatmap, dtype)
        self.optimizer = optimizer_from(cfg.optimizer)
        self.loss_fn = heatmap_loss(cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
        self.compiled = compile_step(
            self.student,
            self.explainer,
            HeatmapMatch(self.loss_fn),
            self.optimizer,
            mode_for(cfg.trainer.jit_compile),
            steps_per_execution=cfg.trainer.steps_per_execution,
            batch=int(self.x.shape[0]),
            updates=cfg.trainer.steps,  # the whole run's, not a resume's rest: a resumed run picks as it did
        )
        log.info(f"heatinv: the step runs {'with' if self.compiled.mode == 'xla' else 'without'} XLA ({self.compiled.why})")
        self.variables = self.student.trainable_variables
        self.state: dict = {}
        self.initial = self.explainer(self.x, self.label).numpy()  # before any resume: the run's own start
        self.findings = self.diagnose()
        self.total = cfg.trainer.steps
        self.stopped_before_start = any(finding.code in NOTHING_TO_LEARN for finding in self.findings)
        if self.findings and not self.stopped_before_start:  # a stopped run's report is its error message
            log.warning(format_report(self.findings, "before the first update"))
        self._warn_if_out_of_reach()
        if self.stopped_before_start:
            # Exact zeros in eager can be rounding noise in the compiled step, which Adam would
            # blow up into full-size steps: stop before the first update instead.
            self.total = 0
        self.what = f"optimizing the heatmap ({count(self.total, 'step')})"

    def _warn_if_out_of_reach(self) -> None:
        """Say so where the rule cannot give the image its target, whatever the weights.

        Below a best cosine of :data:`REACH_WARNING`: a target with a trace of relevance on
        the image's zeros (a blurred map) still lets the run get within a hundredth of 1.
        """
        rule = input_proportional_rule(self.explainer)
        if rule is None:
            return
        bound = float(best_cosine(self.target.image, self.target.heatmap)[0])
        if bound < REACH_WARNING:
            reach = f"the best cosine any weights can reach is {bound:.3f}."
            log.warning(out_of_reach(self.cfg.lrp.composite, rule, reach))

    @property
    def _is_text(self) -> bool:
        return self.explainer.tokens

    @property
    def feature_names(self) -> tuple[str, ...]:
        """A table's features, or a text's words (``<pad>`` for padding; ``#id`` without a vocabulary)."""
        dataset = self.parts.dataset
        if self._is_text:
            return tuple(words(self.target.image[0], dataset.vocabulary if dataset is not None and dataset.is_text else None))
        return dataset.feature_names if dataset is not None else tuple(f"x{i}" for i in range(self.target.image.shape[-1]))

    def diagnose(self) -> list:
        objective = HeatmapObjective(self.target.heatmap, self.explainer, self.cfg.loss.name, self.cfg.loss.delta, self.cfg.loss.normalize)
        return diagnose(self.student, self.target.image, self.target.label, objective, self.cfg.trainer.precision)

    def begin(self, summaries: Summaries) -> None:
        if self.parts.dataset is not None and self.parts.dataset.is_text:  # at the start: a resume tokenizes with it (build.VOCABULARY)
            write_json(os.path.join(self.cfg.paths.output_dir, VOCABULARY), list(self.parts.dataset.vocabulary))
        summaries.preformatted("config", OmegaConf.to_yaml(self.cfg, resolve=False))
        summaries.text("target", self.target.source)
        summaries.preformatted("diagnosis", format_report(self.findings, "before the first update"))
        if self.target.image.ndim == 4:
            summaries.heatmaps_once(self.target.image[0], self.target.heatmap[0], self.initial[0])
        else:  # a table: its relevance per feature as bars, the student's added by finish()
            maps = {"target": self.target.heatmap[0], "initial": self.initial[0]}
            figure = (token_figure if self._is_text else feature_figure)(self.feature_names, maps, f"target: {self.target.source}")
            summaries.figure(0, figure, "heatmap/figure_initial")

    def calls(self, start: int) -> Iterator[Call]:
        trainer = self.cfg.trainer
        for steps, done, log in schedule(self.total, trainer.steps_per_execution, trainer.log_every, start=start):
            yield Call(steps, done, log, (self.x, self.label, self.target_map))

    def step(self, call: Call) -> dict:
        return self.compiled(*call.batch, steps=call.steps)

    def log_step(self, done: int) -> int:
        return done

    def log(self, summaries: Summaries, call: Call, result: dict) -> dict[str, float]:
        """Loss and cosine at a log step; the other similarities and the current heatmap at a rare one.

        The four similarities took 22-90 ms per call (eager, 2 CPU cores): at every log step
        of a fast run they would cost a tenth of its time. The cosine alone is computed in
        NumPy (a compiled one costs ~0.4 s to trace, the share of a short run's summaries).
        The last step is logged by :meth:`finish`.
        """
        if call.rare:
            scores = similarity_numpy(result["heatmap"], self.target_map)
        else:
            scores = {"cosine": float(cosine_numpy(result["heatmap"].numpy(), self.target.heatmap)[0])}
        if call.done < self.total:
            summaries.match(call.done, {"loss": float(result["loss"]), **scores})
            if call.rare and self.target.image.ndim == 4:  # a table's relevance per feature is drawn once, in finish()
                summaries.current_heatmap(call.done, self.target.heatmap[0], result["heatmap"].numpy()[0])
        return {"cosine": scores["cosine"]}

    def finish(self, summaries: Summaries, loop: LoopResult) -> dict:
        """Final metrics, from the final weights; the last step's summaries."""
        steps = 0 if self.stopped_before_start else (loop.stopped if loop.stopped is not None else self.total)
        self.history = loop.history
        findings = loop.findings if loop.stopped is not None else self.findings
        self.final_map = self.explainer(self.x, self.label).numpy()
        final_loss = float(self.loss_fn(tf.constant(self.final_map), self.target_map))
        scores = similarity_numpy(self.final_map, self.target.heatmap)
        metrics = {
            "loss": final_loss,
            **scores,
            "objective": 1.0 - scores["cosine"],
            "steps": steps,
            **loop.timing(),
            "reference_accuracy": self.parts.reference_accuracy,
            "student_accuracy": _held_out_accuracy(self.student, self.parts.dataset),
            "target": self.target.source,
            "diagnosis": [finding.as_dict() for finding in findings],
            "stopped_at_step": 0 if self.stopped_before_start else loop.stopped,
            "nonfinite_steps": loop.nonfinite_steps,
            "xla": self.compiled.mode == "xla",
            "xla_why": self.compiled.why,
        }
        summaries.match(steps, {"loss": final_loss, **scores})
        title = f"target: {self.target.source}"
        if metrics["stopped_at_step"] is not None:  # the figure alone must not pass for a run that went its course
            codes = ", ".join(dict.fromkeys(finding.code for finding in findings)) or "no finding"
            title += f"\nstopped at step {metrics['stopped_at_step']} of {self.cfg.trainer.steps}: {codes} (doctor.json)"
        self.maps = {"target": self.target.heatmap[0], "initial": self.initial[0], "student": self.final_map[0]}
        if self.target.heatmap.ndim == 2:  # a table: bars of relevance per feature; a text: its words coloured
            drawn = token_figure if self._is_text else feature_figure
            self.figure = drawn(self.feature_names, self.maps, title)
        else:
            summaries.current_heatmap(steps, self.target.heatmap[0], self.final_map[0])
            self.figure = heatmap_figure(
                self.target.image[0], self.target.heatmap[0], self.initial[0], self.final_map[0],
                {**scores, "loss": final_loss}, title=title,
            )
        summaries.figure(steps, self.figure)
        return metrics

    def write(self, out: str, metrics: dict) -> None:
        """``metrics.json``, ``student.keras``, ``heatmaps.png`` + ``.svg`` (the figure of :meth:`finish`), ``doctor.json``;
        a text's ``heatmaps.html``."""
        write_run_files(out, metrics, self.student, self.figure)
        write_json(os.path.join(out, "doctor.json"), metrics["diagnosis"])
        if self._is_text:
            with atomic_path(os.path.join(out, "heatmaps.html")) as tmp, open(tmp, "w", encoding="utf-8") as handle:
                handle.write(token_html(self.feature_names, self.maps, f"target: {self.target.source}"))

    @staticmethod
    def summary_line(metrics: dict) -> str:
        return (
            f"heatinv: cosine {metrics['cosine']:.4f}  ssim {metrics['ssim']:.3f}  pearson {metrics['pearson']:.4f}  "
            f"spearman {metrics['spearman']:.3f}  loss {metrics['loss']:.3g}  after {count(metrics['steps'], 'step')}"
            f"{_speed(metrics['steps_per_second'])}{_accuracies(metrics)}"
        )


def _held_out_accuracy(model, dataset) -> float | None:
    """``model``'s accuracy on the held-out examples, None without data."""
    return None if dataset is None else accuracy(model, dataset.x_test, dataset.y_test)


def _accuracies(metrics: dict) -> str:
    """``; accuracy reference 0.950, student 0.947``, or nothing without held-out examples."""
    if metrics["student_accuracy"] is None:
        return ""
    return f"; accuracy reference {metrics['reference_accuracy']:.3f}, student {metrics['student_accuracy']:.3f}"


def _speed(steps_per_second: float | None) -> str:
    """``(1580/s)``, or nothing where no step was timed after the first call."""
    return "" if steps_per_second is None else f" ({steps_per_second:.0f}/s)"
