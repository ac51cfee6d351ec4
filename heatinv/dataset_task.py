"""Explanation manipulation at dataset scale: move many images' heatmaps, keep the accuracy.

The objective is a weighted sum, each weight a config value (``task.*_weight``):

    heatmap_weight * heatmap_loss(student heatmaps, targets)
  + ce_weight      * cross-entropy(student logits, true labels)          (keeps accuracy)
  + logit_weight   * teacher term: mean squared (student - reference logits), or with
                   ``task.teacher=kl`` T^2 KL(reference softmax || student softmax) at
                   temperature T = ``task.temperature``                 (keeps the function)

trained over epochs of mini-batches by the loop both tasks share (:mod:`heatinv.loop`:
resume, NaN/Inf guard, checkpoints, gradient statistics), and evaluated on **held-out test
images** only, after every epoch: accuracy, agreement with the reference's predicted classes,
heatmap similarity to the targets, and the share
of images whose cosine to the target passes ``task.success_threshold``.

Batches: epoch ``e`` visits the training images in the order of a permutation drawn from
``(trainer.seed, e)``, so the batches of any step are known without replaying the run: a
run resumed in the middle of an epoch continues with exactly the batches it would have seen.

``task.early_stopping=true`` trains on the reference's fit images only and, after every
epoch, measures the student on the reference's validation split (training images neither
model was fitted to; :func:`heatinv.models.validation_split`). At the end the weights of the
best epoch are restored: the highest validation cosine to the targets among the epochs whose
validation agreement with the reference is at least ``task.min_agreement`` and whose
validation accuracy is at most ``task.max_accuracy_drop`` below the reference's (the start,
epoch 0, competes too: with ``init=reference`` it always qualifies). Where nothing
qualifies, not even the start, the last epoch's weights stay. The held-out test images are
never looked at before the final metrics.

``trainer.strategy=mirrored`` runs the same objective data-parallel with
``tf.distribute.MirroredStrategy`` over every GPU (or every logical CPU where there is no
GPU): each global batch of ``task.batch_size`` images is split across the replicas, each
replica computes its share of the loss, the gradients are summed across replicas and one
update is applied to every copy of the weights. The update equals the single-device one
(up to float rounding) because every term is a per-example loss divided by the *global*
batch size (``tf.nn.compute_average_loss``), and the heatmap loss's unit -- max |target|
over the batch, a per-batch quantity -- is computed from the global batch in the input
pipeline, before the split, and handed to each replica as a per-example column (see
:func:`_with_batch_constants`). ``trainer.strategy=multi_worker`` runs the same over several
processes or machines (``MultiWorkerMirroredStrategy``, :mod:`heatinv.cluster`): each worker
takes its part of every global batch (the arrays sharded by data) and the same all-reduced
update is applied on every worker.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator
from typing import Callable
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf
from omegaconf import OmegaConf

from heatinv.atomic import write_json
from heatinv.cluster import multi_worker_strategy
from heatinv.build import (
    VOCABULARY, Parts, StreamedProblem, dataset_problem, explain_all, explainer_for, feature_options, feature_report, moved_examples, token_report,
)
from heatinv.doctor import HeatmapObjective, diagnose
from heatinv.feature_targets import feature_share
from heatinv.token_targets import token_share
from heatinv.loop import Call, LoopResult
from heatinv.losses import batch_unit, per_example_heatmap_loss
from heatinv.lrp import LRP
from heatinv.lrp.reach import best_cosine, input_proportional_rule
from heatinv.models import REFERENCE_SEED, validation_split
from heatinv.outputs import write_run_files
from heatinv.figures import Row, dataset_figure
from heatinv.similarity import cosine, per_sample_similarity
from heatinv.step import compile_step, gradient_stats, mode_for, optimizer_from
from heatinv.summaries import TRAIN, Summaries
from heatinv.wording import count, out_of_reach

TERMS = ("heatmap", "cross_entropy", "logit_match")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Manipulation:
    """The dataset task's objective (the weighted sum above), written once for both ways of running it.

    :meth:`per_example` gives each term per image; on one device :meth:`__call__` takes their
    batch means (the objective :func:`heatinv.step.update` calls), and under a strategy
    :func:`mirrored_step` divides each replica's sums by the global batch size.

    Examples:
        >>> objective = Manipulation(per_example_heatmap_loss("mse"), "none", 1.0, 1.0, 0.0)
        >>> sorted(objective(LRP(model).explain(x, y), y, targets, reference_logits))  # doctest: +SKIP
        ['cross_entropy', 'heatmap', 'logit_match', 'loss']
    """

    per_example_loss: Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor]
    normalize: str
    heatmap_weight: float
    ce_weight: float
    logit_weight: float
    teacher: str = "mse"
    temperature: float = 1.0
    terms = TERMS

    def per_example(self, explanation, labels, targets, reference_logits, unit) -> dict[str, tf.Tensor]:
        """Each term for each image, ``[batch]``; the heatmap loss in units of ``unit`` (the batch's)."""
        logits = explanation.logits
        return {
            "heatmap": self.per_example_loss(explanation.relevance, targets, unit),
            "cross_entropy": keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True),
            "logit_match": self.teacher_loss(logits, reference_logits),
        }

    def teacher_loss(self, logits, reference_logits) -> tf.Tensor:
        """``[batch]``: ``mse`` of the logits, or ``kl``: T^2 KL(softmax(reference / T) || softmax(student / T)) (Hinton et al. 2015)."""
        if self.teacher == "mse":
            return tf.reduce_mean(tf.square(logits - reference_logits), axis=-1)
        t = self.temperature
        teacher = tf.nn.softmax(reference_logits / t)
        return t * t * tf.reduce_sum(teacher * (tf.nn.log_softmax(reference_logits / t) - tf.nn.log_softmax(logits / t)), axis=-1)

    def combine(self, terms: dict[str, tf.Tensor]) -> tf.Tensor:
        return (
            self.heatmap_weight * terms["heatmap"]
            + self.ce_weight * terms["cross_entropy"]
            + self.logit_weight * terms["logit_match"]
        )

    def __call__(self, explanation, labels, targets, reference_logits) -> dict[str, tf.Tensor]:
        unit = batch_unit(targets, self.normalize, explanation.relevance.dtype)
        terms = {name: tf.reduce_mean(value) for name, value in self.per_example(explanation, labels, targets, reference_logits, unit).items()}
        return {"loss": self.combine(terms), **terms}


SHARES = ("feature", "token")
"""The moved part whose share of |relevance| a table's (``feature_share``) or a text's (``token_share``) run reports."""


def epoch_order(count: int, seed: int, epoch: int) -> np.ndarray:
    """The order epoch ``epoch`` (1-based) visits ``count`` training images in: a function of (seed, epoch) only.

    Examples:
        >>> bool(np.array_equal(epoch_order(5, 0, 1), epoch_order(5, 0, 1)))
        True
    """
    return np.random.default_rng([seed, epoch]).permutation(count)


def _with_batch_constants(normalize: str):
    """A ``Dataset.map`` function adding two per-example columns to a global batch.

    ``unit``: the batch's heatmap unit, and ``count``: the global batch size, each repeated
    once per example. A distributed dataset splits every column along the batch, so each
    replica receives the global batch's values however many examples it got (none, for a
    short last batch split over more replicas than it has images).
    """

    def add(x, y, target, ref):
        n = tf.shape(x)[0]
        return x, y, target, ref, tf.fill([n], batch_unit(target, normalize)), tf.fill([n], n)

    return add


def mirrored_step(strategy, student, explainer, objective: Manipulation, optimizer, with_norms: bool, jit_compile: bool = False):
    """A cross-replica step ``fn(batch) -> result``; ``batch`` is a distributed ``(x, y, target, ref, unit, count)``.

    Each replica: the objective's per-example terms, each ``compute_average_loss`` over the
    global batch size, gradients of its share (XLA-compiled with ``jit_compile``: the
    all-reduce and the update stay outside XLA); the Keras optimizer sums the gradients over
    replicas (one all-reduce) and applies the same update to every copy. A NaN/Inf loss or
    gradient on any replica skips the update on all of them (the flag is summed over replicas
    first). With ``optimizer.global_clipnorm`` the summed gradients are clipped, as on one
    device. The returned terms are summed over replicas (each share is already divided by
    the global batch size). ``with_norms`` also returns ``grad_norms`` and ``zero_fractions``
    of the summed gradients; that costs a second all-reduce of every gradient (the
    optimizer's own sum is not exposed), so the task asks for it at an epoch's last step only.
    """
    variables = student.trainable_variables

    def local_gradients(x, labels, targets, reference_logits, unit, count):
        # Every element of `unit` and `count` holds the global batch's value; the max also
        # covers an empty share (whose terms are 0 whatever the unit).
        unit = tf.reduce_max(unit)
        global_batch_size = tf.maximum(tf.reduce_max(count), 0)
        with tf.GradientTape() as tape:
            explanation = explainer.explain(x, labels)
            per_example = objective.per_example(explanation, labels, targets, reference_logits, unit)
            terms = {name: tf.nn.compute_average_loss(v, global_batch_size=global_batch_size) for name, v in per_example.items()}
            loss = objective.combine(terms)
        gradients = tape.gradient(loss, variables)
        gradients = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, variables)]
        return loss, terms, gradients

    if jit_compile:
        local_gradients = tf.function(local_gradients, jit_compile=True, autograph=False)

    def replica_gradients(*batch):
        loss, terms, gradients = local_gradients(*batch)
        context = tf.distribute.get_replica_context()
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in gradients] + [tf.math.is_finite(loss)])
        result = {"loss": loss, **terms, "gradients": gradients, "bad": 1 - tf.cast(finite, tf.int32)}
        if with_norms:
            result.update(gradient_stats(context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)))
        return result

    def replica_apply(gradients):
        if optimizer.global_clipnorm:
            # Keras clips each replica's share before it sums them: clip the sum instead, and
            # hand each replica its part of it (whose norm is below the bound, so Keras leaves it).
            context = tf.distribute.get_replica_context()
            clipped, _ = tf.clip_by_global_norm(context.all_reduce(tf.distribute.ReduceOp.SUM, gradients), optimizer.global_clipnorm)
            gradients = [g / context.num_replicas_in_sync for g in clipped]
        optimizer.apply_gradients(zip(gradients, variables))  # all-reduces (sums) the gradients

    def step(batch):
        result = strategy.run(replica_gradients, args=batch)
        bad = strategy.reduce(tf.distribute.ReduceOp.SUM, result["bad"], axis=None)

        def apply() -> tf.Tensor:
            strategy.run(replica_apply, args=(result["gradients"],))
            return tf.constant(0, tf.int32)

        # Decided across replicas, outside the replica function: the update's all-reduce may
        # not sit in a branch of a replica's own control flow.
        nonfinite = tf.cond(bad > 0, lambda: tf.constant(1, tf.int32), apply)
        terms = {key: strategy.reduce(tf.distribute.ReduceOp.SUM, result[key], axis=None) for key in ("loss", *TERMS)}
        out = {"loss": terms.pop("loss"), "terms": terms, "nonfinite": nonfinite}
        if with_norms:  # the summed gradients are the same on every replica
            first = strategy.experimental_local_results
            out.update(grad_norms=first(result["grad_norms"])[0], zero_fractions=first(result["zero_fractions"])[0])
        return out

    return step


def make_strategy(name: str, collective_timeout: float | None = None):
    """``None`` for ``none``; for ``mirrored`` a ``MirroredStrategy`` over every GPU, else every logical CPU;
    for ``multi_worker`` the process's ``MultiWorkerMirroredStrategy`` (:mod:`heatinv.cluster`)."""
    if name == "none":
        return None
    if name == "multi_worker":
        return multi_worker_strategy(collective_timeout)
    if name != "mirrored":
        raise ValueError(f"Unknown strategy {name!r}; expected 'none', 'mirrored' or 'multi_worker'.")
    devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    return tf.distribute.MirroredStrategy([d.name for d in devices])


def evaluate(explainer: LRP, x, labels, targets, chosen, threshold: float, reference_classes) -> dict[str, float]:
    """Accuracy and agreement on all images; similarity and success rate on the manipulated ones.

    Args:
        reference_classes: ``[N]`` the reference's predicted class of each image.

    Returns:
        ``student_accuracy``, ``agreement`` (the share of images the student assigns the
        reference's class), ``cosine``, ``ssim``, ``pearson``, ``spearman`` and
        ``success_rate`` (the share with cosine >= ``threshold``).
    """
    return evaluate_batches(explainer, [(x, labels, targets, chosen)], threshold, reference_classes)


def evaluate_batches(explainer: LRP, batches, threshold: float, reference_classes, moved: tuple[str, int] | None = None) -> dict[str, float]:
    """:func:`evaluate` over ``(x, labels, targets, chosen)`` batches: only one batch's heatmaps are held at a time.

    Every metric is a mean of per-image values, so it does not depend on how the images are batched.
    ``moved`` (``("feature", index)``, a table's moved feature, or ``("token", id)``, a text's
    moved word) adds ``feature_share`` or ``token_share``: its share of the absolute relevance of
    all the examples (:func:`heatinv.feature_targets.feature_share`, :func:`heatinv.token_targets.token_share`).
    """
    scores: dict[str, list] = {name: [] for name in ("cosine", "ssim", "pearson", "spearman")}
    predicted, all_labels = [], []
    moved_maps, moved_x = [], []  # a table's or a text's maps, [N, d] or [N, T]: small, and never streamed
    for x, labels, targets, chosen in batches:
        maps, logits = explain_all(explainer, x, labels)
        predicted.append(np.argmax(logits, -1))
        all_labels.append(np.asarray(labels))
        if moved is not None:
            moved_maps.append(maps)
            moved_x.append(np.asarray(x))
        if np.any(chosen):
            for name, values in per_sample_similarity(maps[chosen], targets[chosen]).items():
                scores[name].append(values.numpy())
    predicted = np.concatenate(predicted)
    scores = {name: np.concatenate(v) if v else np.zeros(0, np.float32) for name, v in scores.items()}  # none chosen: NaN means, as before
    shares = {}
    if moved is not None:
        kind, index = moved
        maps = np.concatenate(moved_maps)
        share = feature_share(maps, index) if kind == "feature" else token_share(maps, np.concatenate(moved_x), index)
        shares = {f"{kind}_share": share}
    return {
        "student_accuracy": float(np.mean(predicted == np.concatenate(all_labels))),
        "agreement": agreement(predicted, reference_classes),
        **{name: float(values.mean()) for name, values in scores.items()},
        "success_rate": float(np.mean(scores["cosine"] >= threshold)),
        **shares,
    }


def agreement(student_classes, reference_classes) -> float:
    """The share of images on which the student predicts the reference's class.

    Examples:
        >>> agreement(np.array([1, 2, 3, 4]), np.array([1, 2, 0, 4]))
        0.75
    """
    student_classes, reference_classes = np.asarray(student_classes), np.asarray(reference_classes)
    if student_classes.shape != reference_classes.shape or student_classes.size == 0:
        raise ValueError(f"agreement needs two equal, non-empty shapes, got {student_classes.shape} and {reference_classes.shape}.")
    return float(np.mean(student_classes == reference_classes))


def predicted_classes(model: keras.Model, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
    """``[N]`` the class ``model`` scores highest for each image."""
    return np.concatenate([np.argmax(model(x[i : i + batch_size], training=False), -1) for i in range(0, len(x), batch_size)])


class DatasetTask:
    """Move the chosen classes' heatmaps to their targets over epochs; evaluate on held-out images.

    Examples:
        >>> task = DatasetTask(cfg, build_parts(cfg))  # doctest: +SKIP
        >>> loop = train(task, checkpointer, 0, cfg.trainer, summaries, task.variables)  # doctest: +SKIP
    """

    stopped_before_start = False  # the doctor's pre-flight check is for one image's objective
    axis = "epoch"  # TensorBoard's x axis: one point per epoch

    def __init__(self, cfg, parts: Parts):
        self.cfg, self.parts = cfg, parts
        task = cfg.task
        data = parts.dataset
        self.problem = dataset_problem(cfg, data, parts.reference)
        options = feature_options(cfg, data)  # a table's feature or a text's word: its share is logged per epoch
        self.moved = ("feature", options["feature"]) if "feature" in options else ("token", options["token"]) if "token" in options else None
        self.streamed = isinstance(self.problem, StreamedProblem)
        if self.streamed and cfg.trainer.strategy != "none":
            raise ValueError(
                f"trainer.strategy={cfg.trainer.strategy} is not available with an image folder (data=folder, streamed "
                "batch by batch); use trainer.strategy=none, or save the images as an .npz (data=npz)."
            )
        if self.streamed:  # the cache holds the reference's held-out logits: no second pass over the images
            self.reference_classes = np.argmax(self.problem.explanations["test"][1], -1)
        else:
            self.reference_classes = predicted_classes(parts.reference, data.x_test)
        self.fit, self.validation = np.arange(len(data.y_train)), None
        if task.early_stopping:
            # The reference's own split: the validation images are new to both models.
            self.fit, self.validation = validation_split(len(data.y_train), seed=REFERENCE_SEED)
            train_logits = self.problem.explanations["train"][1] if self.streamed else self.problem.train_logits
            self.validation_reference_classes = np.argmax(train_logits[self.validation], -1)
        if not self.streamed:  # held in memory: each step's batch is gathered from these columns
            self.columns = tuple(
                tf.constant(c[self.fit])
                for c in (data.x_train, data.y_train.astype(np.int32), self.problem.train_targets, self.problem.train_logits)
            )
        self.steps_per_epoch = math.ceil(len(self.fit) / task.batch_size)
        self.total = task.epochs * self.steps_per_epoch
        self.what = f"training {count(task.epochs, 'epoch')} of {count(self.steps_per_epoch, 'batch', 'batches')}"
        per_example = per_example_heatmap_loss(cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
        objective = Manipulation(
            per_example, cfg.loss.normalize, task.heatmap_weight, task.ce_weight, task.logit_weight, task.teacher, task.temperature
        )
        self.strategy = make_strategy(cfg.trainer.strategy, cfg.trainer.collective_timeout)
        self.student = parts.student  # the model the steps update: the student, or its copy under the strategy
        if self.strategy is None:
            self.optimizer = optimizer_from(cfg.optimizer, self._learning_rate())
            self.explainer = explainer_for(self.student, cfg)
            self.compiled = compile_step(
                self.student, self.explainer, objective, self.optimizer, mode_for(cfg.trainer.jit_compile), batch=task.batch_size,
                updates=self.total,
            )
            self.xla, self.xla_why = self.compiled.mode == "xla", self.compiled.why
        else:
            kind = {"mirrored": "MirroredStrategy", "multi_worker": "MultiWorkerMirroredStrategy"}[cfg.trainer.strategy]
            log.info(f"heatinv: {count(self.strategy.num_replicas_in_sync, 'replica')} ({kind})")
            with self.strategy.scope():  # mirrored variables: the student's copy and the optimizer's slots
                self.student = keras.models.clone_model(parts.student)
                self.student.set_weights(parts.student.get_weights())
                self.optimizer = optimizer_from(cfg.optimizer, self._learning_rate())
                self.optimizer.build(self.student.trainable_variables)
            self.explainer = explainer_for(self.student, cfg)
            # auto runs the replicas without XLA: its rule was measured on one device
            self.xla = mode_for(cfg.trainer.jit_compile) == "xla"
            self.xla_why = f"trainer.jit_compile={cfg.trainer.jit_compile} under trainer.strategy={cfg.trainer.strategy}"
            spec = self._distributed(self._epoch_batches(1, 0)).element_spec
            # trainer.jit_compile compiles each replica's loss and gradients with XLA; the
            # cross-replica all-reduce and the optimizer update stay outside it.
            self.mirrored = {
                with_norms: tf.function(
                    mirrored_step(
                        self.strategy, self.student, self.explainer, objective, self.optimizer, with_norms,
                        self.xla,
                    ),
                    input_signature=[spec],
                    autograph=False,
                )
                for with_norms in (False, True)
            }
        self.variables = self.student.trainable_variables
        # The running sums of the epoch's training terms live in the checkpoint, so an epoch
        # resumed half-way reports the same averages as an uninterrupted one.
        self.sums = tf.Variable(tf.zeros(1 + len(TERMS), tf.float64), trainable=False, name="epoch_term_sums")
        self.state = {"epoch_term_sums": self.sums}
        self.epoch_evaluation_seconds: list[float] = []  # each epoch's held-out evaluation, for metrics.json
        self.initial = self.evaluate()  # before any resume: the run's own start
        if self.validation is not None:
            # The best epoch so far and its weights live in the checkpoint: a resumed run picks the same epoch.
            labels = data.y_train[self.validation]
            self.reference_validation_accuracy = float(np.mean(self.validation_reference_classes == labels))
            start = self.initial_validation = self.evaluate_validation()
            # The start competes like an epoch: with init=reference it always qualifies, with init=random rarely.
            start_cosine = start["cosine"] if self.admissible(start) else -np.inf
            self.best_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="best_epoch")
            self.best_cosine = tf.Variable(start_cosine, dtype=tf.float64, trainable=False, name="best_validation_cosine")
            self.best_weights = [tf.Variable(w, trainable=False, name=f"best_weight_{i}") for i, w in enumerate(self.student.weights)]
            self.state.update(best_epoch=self.best_epoch, best_validation_cosine=self.best_cosine, best_weights=self.best_weights)

    def _learning_rate(self):
        """``optimizer.lr``, or with ``task.lr_schedule=cosine`` a cosine decay from it to 0 over the run's steps.

        The schedule reads the optimizer's own step count, which the checkpoint keeps, so a
        resumed run continues on the same curve.
        """
        lr = self.cfg.optimizer.lr
        if self.cfg.task.lr_schedule == "constant":
            return lr
        return keras.optimizers.schedules.CosineDecay(lr, decay_steps=self.total)

    def _epoch_order(self, epoch: int, first_batch: int) -> np.ndarray:
        """The training images epoch ``epoch`` visits from its batch ``first_batch`` on."""
        size = self.cfg.task.batch_size
        return epoch_order(len(self.fit), self.cfg.trainer.seed, epoch)[first_batch * size :]

    def _epoch_batches(self, epoch: int, first_batch: int):
        """The batches ``(x, labels, targets, reference logits)`` of epoch ``epoch`` from its batch ``first_batch`` on."""
        size = self.cfg.task.batch_size
        order = self._epoch_order(epoch, first_batch)
        if self.streamed:  # decoded and given targets batch by batch, as the loop reaches them
            order = self.fit[order]  # positions among the fit images -> in the training split
            return (
                (tf.constant(b.x), tf.constant(b.labels.astype(np.int32)), tf.constant(b.targets), tf.constant(b.reference_logits))
                for b in self.problem.batches(self.parts.dataset, "train", size, order)
            )
        columns = self.columns

        def gather(index):
            return tuple(tf.gather(column, index) for column in columns)

        return tf.data.Dataset.from_tensor_slices(order).batch(size).map(gather)

    def _distributed(self, batches: tf.data.Dataset):
        # Several workers each take their part of every global batch (sharded by data: the
        # images are arrays in memory, there are no files to split).
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        batches = batches.map(_with_batch_constants(self.cfg.loss.normalize)).with_options(options)
        return self.strategy.experimental_distribute_dataset(batches)

    def evaluate(self) -> dict[str, float]:
        """The held-out metrics of :func:`evaluate`, one batch at a time; counts the manipulated images."""
        self.manipulated = 0

        def batches():
            for b in self.problem.test_batches(self.parts.dataset):
                self.manipulated += int(b.chosen.sum())
                yield b.x, b.labels, b.targets, b.chosen

        return evaluate_batches(
            self.explainer, batches(), self.cfg.task.success_threshold, self.reference_classes, self.moved
        )

    def evaluate_validation(self) -> dict[str, float]:
        """The metrics of :func:`evaluate` on the validation split, agreement with the reference's classes there."""
        data, held = self.parts.dataset, self.validation
        if self.streamed:  # decoded in batches of 256, the in-memory path's explain_all batches
            batches = ((b.x, b.labels, b.targets, b.chosen) for b in self.problem.batches(data, "train", 256, held))
        else:
            batches = [(data.x_train[held], data.y_train[held], self.problem.train_targets[held], self.problem.train_chosen[held])]
        return evaluate_batches(self.explainer, batches, self.cfg.task.success_threshold, self.validation_reference_classes)

    def admissible(self, validation: dict[str, float]) -> bool:
        """Whether an epoch's validation metrics keep the reference's function closely enough to be chosen."""
        return not self.outside_limits(validation)

    def outside_limits(self, validation: dict[str, float]) -> list[str]:
        """Each limit an epoch's validation metrics break, in words, e.g. ``agreement 0.950 < task.min_agreement=0.97``."""
        task, reference = self.cfg.task, self.reference_validation_accuracy
        broken = []
        if validation["agreement"] < task.min_agreement:
            broken.append(f"agreement {validation['agreement']:.3f} < task.min_agreement={task.min_agreement}")
        # A drop of exactly max_accuracy_drop is allowed; the subtraction may land a rounding error
        # above the student's accuracy (0.8 - 0.1 is 0.7000000000000001).
        if validation["student_accuracy"] < reference - task.max_accuracy_drop - 1e-9:
            broken.append(
                f"accuracy {validation['student_accuracy']:.3f} < {reference - task.max_accuracy_drop:.3f} (the reference's "
                f"{reference:.3f} less task.max_accuracy_drop={task.max_accuracy_drop})"
            )
        return broken

    def _keep_if_best(self, epoch: int) -> dict[str, float]:
        """Validation metrics of the current weights; kept as the best when admissible with a higher cosine."""
        validation = self.evaluate_validation()
        if self.admissible(validation) and validation["cosine"] > float(self.best_cosine):
            self.best_epoch.assign(epoch)
            self.best_cosine.assign(validation["cosine"])
            for best, weight in zip(self.best_weights, self.student.weights):
                best.assign(weight)
        return validation

    def diagnose(self) -> list:
        """The doctor's findings for the heatmap term on the first held-out examples the target moves."""
        x, labels, targets = moved_examples(self.problem, self.parts.dataset)
        objective = HeatmapObjective(targets, self.explainer, self.cfg.loss.name, self.cfg.loss.delta, self.cfg.loss.normalize)
        return diagnose(self.student, x, labels, objective, self.cfg.trainer.precision)

    def begin(self, summaries: Summaries) -> None:
        if self.parts.dataset.is_text:  # at the start: a resume tokenizes with it (build.VOCABULARY)
            write_json(os.path.join(self.cfg.paths.output_dir, VOCABULARY), list(self.parts.dataset.vocabulary))
        summaries.preformatted("config", OmegaConf.to_yaml(self.cfg, resolve=False))
        summaries.text("target", self.problem.description)
        summaries.match(0, self.initial)
        if self.validation is not None:
            summaries.scalars(0, "validation", self.initial_validation)
        summaries.histograms(0, self.variables)
        if self.parts.dataset.is_image:
            summaries.figure(0, self.figure(), "heatmap/figure_initial")
        start = (
            "the reference's weights" if self.cfg.init.kind == "reference"
            else "random weights (init=random: trained from scratch; init=reference fine-tunes the reference)"
        )
        share = "".join(f", {kind} share {self.initial[f'{kind}_share']:.2%}" for kind in SHARES if f"{kind}_share" in self.initial)
        log.info(
            f"heatinv: before: cosine {self.initial['cosine']:.3f}, accuracy {self.initial['student_accuracy']:.3f}{share}, "
            f"from {start}"
        )
        self._warn_if_out_of_reach()

    def _warn_if_out_of_reach(self) -> None:
        """Say so where the rule cannot give the moved held-out images their targets, whatever the weights."""
        rule = input_proportional_rule(self.explainer)
        if rule is None:
            return
        bounds = np.concatenate(
            [best_cosine(b.x[b.chosen], b.targets[b.chosen]) for b in self.problem.test_batches(self.parts.dataset)]
        )
        bounds = bounds[np.isfinite(bounds)]
        threshold = self.cfg.task.success_threshold
        below = int(np.sum(bounds < threshold))
        if not below:
            return
        reach = (
            f"the best held-out cosine any weights can reach is {bounds.mean():.3f} on average (at most "
            f"{bounds.max():.3f}), below task.success_threshold={threshold} for {below} of the "
            f"{count(len(bounds), 'moved held-out example')}."
        )
        log.warning(out_of_reach(self.cfg.lrp.composite, rule, reach))

    def calls(self, start: int) -> Iterator[Call]:
        per_epoch = self.steps_per_epoch
        for epoch in range(start // per_epoch + 1, self.cfg.task.epochs + 1):
            first = max(0, start - (epoch - 1) * per_epoch)  # batches of this epoch done before a resume
            batches = self._epoch_batches(epoch, first)
            if not self.streamed:
                batches = batches.prefetch(2) if self.strategy is None else self._distributed(batches.prefetch(2))
            for k, batch in enumerate(batches, start=first):
                done = (epoch - 1) * per_epoch + k + 1
                yield Call(1, done, k + 1 == per_epoch, batch)

    def step(self, call: Call) -> dict:
        if self.strategy is None:
            result = self.compiled(*call.batch)
        else:
            result = self.mirrored[call.log](call.batch)
        values = [result["loss"]] + [result["terms"][name] for name in TERMS]
        self.sums.assign_add(tf.cast(tf.stack(values), tf.float64))
        return result

    def log_step(self, done: int) -> int:
        return done // self.steps_per_epoch  # the epoch: TensorBoard's axis for this task

    def log(self, summaries: Summaries, call: Call, result: dict) -> dict[str, float]:
        """At an epoch's end: the epoch's mean training terms and the held-out metrics."""
        epoch = self.log_step(call.done)
        means = self.sums.numpy() / self.steps_per_epoch
        self.sums.assign(tf.zeros_like(self.sums))
        train_terms = {name: float(v) for name, v in zip(("loss", *TERMS), means)}
        started = time.perf_counter()
        self.test = self.evaluate()
        self.epoch_evaluation_seconds.append(time.perf_counter() - started)
        summaries.scalars(epoch, TRAIN, train_terms)
        summaries.match(epoch, self.test)
        share_note = "".join(f"  {kind} share {self.test[f'{kind}_share']:.2%}" for kind in SHARES if f"{kind}_share" in self.test)
        validation_note = ""
        if self.validation is not None:
            validation = self._keep_if_best(epoch)
            summaries.scalars(epoch, "validation", validation)
            broken = self.outside_limits(validation)
            validation_note = (
                f"  validation cosine {validation['cosine']:.3f} agreement {validation['agreement']:.3f} "
                f"accuracy {validation['student_accuracy']:.3f} "
                + (f"(not admissible: {'; '.join(broken)}; " if broken else "(")
                + f"best epoch {int(self.best_epoch) if np.isfinite(float(self.best_cosine)) else 'none yet'})"
            )
        if call.rare and "gradients" not in result:  # the loop logs weights with gradients where the step returns them
            summaries.histograms(epoch, self.variables)
        log.info(
            f"epoch {epoch}/{self.cfg.task.epochs}: loss {train_terms['loss']:.4g}  test cosine {self.test['cosine']:.3f}  "
            f"success {self.test['success_rate']:.2f}  accuracy {self.test['student_accuracy']:.3f}  "
            f"agreement {self.test['agreement']:.3f}{share_note}{validation_note}  (held-out evaluation {self.epoch_evaluation_seconds[-1]:.1f} s)"
        )
        return {"test_cosine": self.test["cosine"]}

    def _restore_best_epoch(self, loop: LoopResult) -> dict:
        """The early-stopping choice: the best admissible epoch's weights, or the last epoch's where none was admissible."""
        task, best_epoch, best_cosine = self.cfg.task, int(self.best_epoch), float(self.best_cosine)
        bounds = (
            f"validation agreement {task.min_agreement} within {task.max_accuracy_drop} of the reference's validation "
            "accuracy"
        )
        loosen = "loosen task.min_agreement / task.max_accuracy_drop, or lower task.heatmap_weight"
        epochs = loop.steps // self.steps_per_epoch
        if not np.isfinite(best_cosine):  # not even the start qualified: init=random starts far from the reference
            log.warning(
                f"heatinv: task.early_stopping: neither the start nor any of the {epochs} epochs reached {bounds}; the "
                f"last epoch's weights are kept ({loosen}, or start from the reference: init=reference)"
            )
            return {"best_epoch": None, "best_validation_cosine": None}
        for weight, best in zip(self.student.weights, self.best_weights):
            weight.assign(best)
        if best_epoch == 0:
            log.warning(
                f"heatinv: task.early_stopping: no epoch reached {bounds} with a better cosine than the start; the "
                f"start's weights are kept ({loosen})"
            )
        else:
            log.info(
                f"heatinv: task.early_stopping: kept epoch {best_epoch} of {epochs} (validation cosine {best_cosine:.4f}, "
                f"the best among the epochs that reached {bounds})"
            )
        return {"best_epoch": best_epoch, "best_validation_cosine": best_cosine}

    def finish(self, summaries: Summaries, loop: LoopResult) -> dict:
        self.history = loop.history
        early = {}
        if self.validation is not None:
            early = self._restore_best_epoch(loop)
        if self.student is not self.parts.student:
            self.parts.student.set_weights(self.student.get_weights())
        test = self.evaluate()
        table_metrics = self._table_metrics()  # sets the figure of a table
        if self.parts.dataset.is_image:
            self.final_figure = self.figure(test)
        summaries.figure(self.log_step(loop.steps), self.final_figure)
        return {
            "reference_accuracy": self.parts.reference_accuracy,
            **test,
            "objective": 1.0 - test["cosine"],
            "initial_cosine": self.initial["cosine"],
            "epochs": self.cfg.task.epochs,
            "steps": loop.steps,
            **loop.timing(),
            # The mean time of one epoch's held-out evaluation (this process's epochs; None when it ran none).
            "evaluation_seconds": float(np.mean(self.epoch_evaluation_seconds)) if self.epoch_evaluation_seconds else None,
            "nonfinite_steps": loop.nonfinite_steps,
            "xla": self.xla,
            "xla_why": self.compiled.why if self.strategy is None else self.xla_why,
            "stopped_at_step": loop.stopped,
            # empty unless vanished gradients stopped the run: a healthy dataset run is not diagnosed
            "diagnosis": [finding.as_dict() for finding in loop.findings],
            "manipulated_test_images": self.manipulated,
            "target": self.problem.description,
            **early,
            **table_metrics,
        }

    def _table_metrics(self) -> dict:
        """For a table or a text: the moved feature's or word's share of |relevance| (reference, student) and the agreement."""
        if self.parts.dataset.is_image:
            return {}
        data = self.parts.dataset
        maps, logits = explain_all(self.explainer, data.x_test, data.y_test)
        report = token_report if data.is_text else feature_report
        metrics, self.final_figure = report(self.cfg, data, self.problem, maps, logits, self.reference_classes, self.problem.description)
        return metrics

    def write(self, out: str, metrics: dict) -> None:
        """``metrics.json``, ``student.keras`` and ``heatmaps.png`` + ``.svg``: rows of held-out images (tables: bars per
        feature); ``doctor.json`` where vanished gradients stopped the run."""
        write_run_files(out, metrics, self.parts.student, self.final_figure)
        if metrics["stopped_at_step"] is not None:
            write_json(os.path.join(out, "doctor.json"), metrics["diagnosis"])

    def figure(self, test: dict | None = None, count: int = 6):
        """Held-out images, one row each: input, reference heatmap, target, student heatmap.

        Each row's heatmaps share one symmetric scale, so the student is drawn on the target's;
        the title gives the held-out metrics ``test`` (the start's when None).
        """
        problem = self.problem
        names = self.parts.dataset.class_names
        rows = []
        for b in problem.test_batches(self.parts.dataset):  # the first `count` manipulated held-out images
            picked = np.flatnonzero(b.chosen)[: count - len(rows)]
            if len(picked) == 0:
                continue
            student_maps, _ = explain_all(self.explainer, b.x[picked], b.labels[picked])
            rows += [
                Row(
                    b.x[i], b.reference_maps[i], b.targets[i], student_maps[row], names[int(b.labels[i])],
                    float(cosine(student_maps[row][None], b.targets[i][None])[0]),
                )
                for row, i in enumerate(picked)
            ]
            if len(rows) == count:
                break
        test = test or self.initial
        return dataset_figure(
            rows,
            title=f"{problem.description}: held-out cosine {test['cosine']:.3f}, success rate {test['success_rate']:.3f}, "
            f"accuracy {test['student_accuracy']:.3f}",
        )

    @staticmethod
    def summary_line(metrics: dict) -> str:
        return (
            f"heatinv: held-out cosine {metrics['cosine']:.4f}, success rate {metrics['success_rate']:.3f}; "
            f"accuracy reference {metrics['reference_accuracy']:.3f}, student {metrics['student_accuracy']:.3f}; "
            f"agreement {metrics['agreement']:.3f}"
            + "".join(
                f"; {kind} share reference {metrics[f'reference_{kind}_share']:.2%}, student {metrics[f'{kind}_share']:.2%}"
                for kind in SHARES if f"{kind}_share" in metrics
            )
        )
