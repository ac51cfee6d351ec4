"""Explanation manipulation at dataset scale: move many images' heatmaps, keep the accuracy.

The objective is a weighted sum, each weight a config value (``task.*_weight``):

    heatmap_weight * heatmap_loss(student heatmaps, targets)
  + ce_weight      * cross-entropy(student logits, true labels)          (keeps accuracy)
  + logit_weight   * mean squared (student logits - reference logits)   (keeps the function)

trained over epochs of ``tf.data`` mini-batches with the same compiled-step design as the
main job, and evaluated on **held-out test images** only: accuracy, heatmap similarity to
the targets, and the share of images whose cosine to the target passes
``task.success_threshold``.

``trainer.strategy=mirrored`` runs the same objective data-parallel with
``tf.distribute.MirroredStrategy`` over every GPU (or every logical CPU where there is no
GPU): each global batch of ``task.batch_size`` images is split across the replicas, each
replica computes its share of the loss, the gradients are summed across replicas and one
update is applied to every copy of the weights. The update equals the single-device one
(up to float rounding) because every term is a per-example loss divided by the *global*
batch size (``tf.nn.compute_average_loss``), and the heatmap loss's unit -- max |target|
over the batch, a per-batch quantity -- is computed from the global batch in the input
pipeline, before the split, and handed to each replica as a per-example column (see
:func:`_with_batch_constants`).
"""

from __future__ import annotations

import os
import time

import keras
import numpy as np
import tensorflow as tf
from omegaconf import OmegaConf

from heatinv.dataset_targets import dataset_targets
from heatinv.losses import batch_unit, heatmap_loss, per_example_heatmap_loss
from heatinv.lrp import LRP
from heatinv.render import diverging_rgb, grayscale_rgb, grid, write_png
from heatinv.similarity import per_sample_similarity
from heatinv.step import make_optimizer
from heatinv.summaries import Summaries, flat_config, trial_name


def explain_all(explainer: LRP, x: np.ndarray, labels: np.ndarray, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Heatmaps (for each image's label) and logits of a whole array, in compiled batches."""
    signature = [tf.TensorSpec((None,) + x.shape[1:], tf.float32), tf.TensorSpec((None,), tf.int32)]

    @tf.function(input_signature=signature)
    def explain(batch, batch_labels):
        explanation = explainer.explain(batch, batch_labels)
        return explanation.relevance, explanation.logits

    maps, logits = [], []
    for start in range(0, len(x), batch_size):
        R, z = explain(x[start : start + batch_size], labels[start : start + batch_size].astype(np.int32))
        maps.append(R.numpy())
        logits.append(z.numpy())
    return np.concatenate(maps), np.concatenate(logits)


def manipulation_step(student, explainer, loss_fn, optimizer, weights, x, labels, targets, reference_logits) -> dict:
    """One update on a mini-batch; returns each term of the objective (plain Python, compiled by the caller)."""
    heatmap_weight, ce_weight, logit_weight = weights
    variables = student.trainable_variables
    with tf.GradientTape() as tape:
        explanation = explainer.explain(x, labels)
        heatmap_term = loss_fn(explanation.relevance, targets)
        ce_term = tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(labels, explanation.logits, from_logits=True)
        )
        logit_term = tf.reduce_mean(tf.square(explanation.logits - reference_logits))
        loss = heatmap_weight * heatmap_term + ce_weight * ce_term + logit_weight * logit_term
    gradients = tape.gradient(loss, variables)
    gradients = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, variables)]
    optimizer.apply_gradients(zip(gradients, variables))
    return {
        "loss": loss,
        "heatmap": heatmap_term,
        "cross_entropy": ce_term,
        "logit_match": logit_term,
        "grad_norms": tf.stack([tf.norm(g) for g in gradients]),
    }


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


def mirrored_step(
    strategy, student, explainer, per_example_loss, optimizer, weights, with_norms: bool, jit_compile: bool = False
):
    """A cross-replica step ``fn(batch) -> terms``; ``batch`` is a distributed ``(x, y, target, ref, unit, count)``.

    Each replica: per-example losses, each term ``compute_average_loss`` over the global
    batch size, gradients of its share (XLA-compiled with ``jit_compile``: the all-reduce and
    the update stay outside XLA); the Keras optimizer sums the gradients over replicas (one
    all-reduce) and applies the same update to every copy. The returned terms are
    summed over replicas (each share is already divided by the global batch size).
    ``with_norms`` also returns ``grad_norms``, the norms of the summed gradients as in
    :func:`manipulation_step`; that costs a second all-reduce of every gradient (the
    optimizer's own sum is not exposed), so the loop asks for it on an epoch's last step only.
    """
    heatmap_weight, ce_weight, logit_weight = weights
    variables = student.trainable_variables

    def local_gradients(x, labels, targets, reference_logits, unit, count):
        # Every element of `unit` and `count` holds the global batch's value; the max also
        # covers an empty share (whose terms are 0 whatever the unit).
        unit = tf.reduce_max(unit)
        global_batch_size = tf.maximum(tf.reduce_max(count), 0)
        with tf.GradientTape() as tape:
            explanation = explainer.explain(x, labels)
            heatmap_term = tf.nn.compute_average_loss(
                per_example_loss(explanation.relevance, targets, unit), global_batch_size=global_batch_size
            )
            ce_term = tf.nn.compute_average_loss(
                keras.losses.sparse_categorical_crossentropy(labels, explanation.logits, from_logits=True),
                global_batch_size=global_batch_size,
            )
            logit_term = tf.nn.compute_average_loss(
                tf.reduce_mean(tf.square(explanation.logits - reference_logits), axis=-1),
                global_batch_size=global_batch_size,
            )
            loss = heatmap_weight * heatmap_term + ce_weight * ce_term + logit_weight * logit_term
        gradients = tape.gradient(loss, variables)
        gradients = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, variables)]
        return loss, heatmap_term, ce_term, logit_term, gradients

    if jit_compile:
        local_gradients = tf.function(local_gradients, jit_compile=True)

    def replica_step(*batch):
        loss, heatmap_term, ce_term, logit_term, gradients = local_gradients(*batch)
        result = {"loss": loss, "heatmap": heatmap_term, "cross_entropy": ce_term, "logit_match": logit_term}
        if with_norms:
            summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, gradients)
            result["grad_norms"] = tf.stack([tf.norm(g) for g in summed])
        optimizer.apply_gradients(zip(gradients, variables))  # all-reduces (sums) the gradients
        return result

    def step(batch):
        result = strategy.run(replica_step, args=batch)
        terms = {
            key: strategy.reduce(tf.distribute.ReduceOp.SUM, result[key], axis=None)
            for key in ("loss", "heatmap", "cross_entropy", "logit_match")
        }
        if with_norms:  # the summed gradients are the same on every replica
            terms["grad_norms"] = strategy.experimental_local_results(result["grad_norms"])[0]
        return terms

    return step


def make_strategy(name: str):
    """``None`` for ``none``; for ``mirrored`` a ``MirroredStrategy`` over every GPU, else every logical CPU."""
    if name == "none":
        return None
    if name != "mirrored":
        raise ValueError(f"Unknown strategy {name!r}; expected 'none' or 'mirrored'.")
    devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    return tf.distribute.MirroredStrategy([d.name for d in devices])


def evaluate(explainer: LRP, x, labels, targets, chosen, threshold: float) -> dict[str, float]:
    """Accuracy on all images; similarity and success rate on the manipulated ones."""
    maps, logits = explain_all(explainer, x, labels)
    scores = per_sample_similarity(maps[chosen], targets[chosen])
    cosine = scores["cosine"].numpy()
    return {
        "student_accuracy": float(np.mean(np.argmax(logits, -1) == labels)),
        "cosine": float(cosine.mean()),
        "ssim": float(scores["ssim"].numpy().mean()),
        "pearson": float(scores["pearson"].numpy().mean()),
        "spearman": float(scores["spearman"].numpy().mean()),
        "success_rate": float(np.mean(cosine >= threshold)),
    }


def run_dataset(cfg, dataset, reference, reference_accuracy: float, student, explainer_for, write_outputs) -> dict:
    """Train ``student`` so the chosen classes' heatmaps move to their targets; evaluate on test images.

    ``explainer_for(model)`` builds the configured LRP explainer; ``write_outputs(metrics,
    student, grid_rgb)`` writes the run's files.
    """
    task, t = cfg.task, cfg.target
    out = cfg.paths.output_dir
    classes = None if task.classes is None else list(task.classes)
    reference_explainer = explainer_for(reference)
    train_maps, train_logits = explain_all(reference_explainer, dataset.x_train, dataset.y_train)
    test_maps, _ = explain_all(reference_explainer, dataset.x_test, dataset.y_test)
    options = dict(pattern=t.pattern, pattern_path=t.path, like=t.like, top_k=t.top_k)
    train_targets, _ = dataset_targets(t.kind, dataset.y_train, train_maps, classes, **options)
    test_targets, test_chosen = dataset_targets(
        t.kind, dataset.y_test, test_maps, classes, like_heatmaps=(dataset.y_train, train_maps), **options
    )

    weights = (task.heatmap_weight, task.ce_weight, task.logit_weight)
    columns = (dataset.x_train, dataset.y_train.astype(np.int32), train_targets, train_logits.astype(np.float32))
    batches = (
        tf.data.Dataset.from_tensor_slices(columns)
        .shuffle(len(dataset.x_train), seed=cfg.trainer.seed, reshuffle_each_iteration=True)
        .batch(task.batch_size)
    )
    strategy = make_strategy(cfg.trainer.strategy)
    trained = student  # the model the steps update: `student` itself, or its copy under the strategy
    if strategy is None:
        explainer = explainer_for(student)
        optimizer = make_optimizer(cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.momentum)
        optimizer.build(student.trainable_variables)
        loss_fn = heatmap_loss(cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
        signature = [
            tf.TensorSpec((None,) + dataset.x_train.shape[1:], tf.float32),
            tf.TensorSpec((None,), tf.int32),
            tf.TensorSpec((None,) + dataset.x_train.shape[1:], tf.float32),
            tf.TensorSpec((None, train_logits.shape[1]), tf.float32),
        ]
        step = tf.function(
            lambda x, y, target, ref: manipulation_step(student, explainer, loss_fn, optimizer, weights, x, y, target, ref),
            input_signature=signature,
            jit_compile=bool(cfg.trainer.jit_compile),
        )
        batches = batches.prefetch(2)
        run_step = lambda batch, last: step(*batch)  # noqa: E731
    else:
        print(f"heatinv: {strategy.num_replicas_in_sync} replicas (MirroredStrategy)", flush=True)
        with strategy.scope():  # mirrored variables: the student's copy and the optimizer's slots
            trained = keras.models.clone_model(student)
            trained.set_weights(student.get_weights())
            optimizer = make_optimizer(cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.momentum)
            optimizer.build(trained.trainable_variables)
        explainer = explainer_for(trained)
        per_example = per_example_heatmap_loss(cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
        batches = strategy.experimental_distribute_dataset(
            batches.map(_with_batch_constants(cfg.loss.normalize)).prefetch(2)
        )
        # trainer.jit_compile compiles each replica's loss and gradients with XLA; the
        # cross-replica all-reduce and the optimizer update stay outside it.
        compiled = {
            with_norms: tf.function(
                mirrored_step(
                    strategy, trained, explainer, per_example, optimizer, weights, with_norms, bool(cfg.trainer.jit_compile)
                ),
                input_signature=[batches.element_spec],
            )
            for with_norms in (False, True)
        }
        run_step = lambda batch, last: compiled[last](batch)  # noqa: E731
    checkpoint = tf.train.Checkpoint(student=trained, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(out, "checkpoints"), max_to_keep=2)

    initial = evaluate(explainer, dataset.x_test, dataset.y_test, test_targets, test_chosen, task.success_threshold)
    print(f"heatinv: before: cosine {initial['cosine']:.3f}, accuracy {initial['student_accuracy']:.3f}", flush=True)
    seconds, step_count = 0.0, 0
    steps_per_epoch = -(-len(dataset.x_train) // task.batch_size)
    variables = student.trainable_variables
    with Summaries(os.path.join(out, "tensorboard")) as summaries:
        summaries.text("config", "```\n" + OmegaConf.to_yaml(cfg, resolve=False) + "\n```")
        summaries.scalars(0, {f"test/{k}": v for k, v in initial.items()})
        for epoch in range(1, task.epochs + 1):
            started = time.perf_counter()
            totals: dict[str, tf.Tensor] = {}
            n = 0
            for batch in batches:
                result = run_step(batch, n + 1 == steps_per_epoch)
                for key in ("loss", "heatmap", "cross_entropy", "logit_match"):
                    totals[key] = totals.get(key, 0.0) + result[key]
                n += 1
            seconds += time.perf_counter() - started
            step_count += n
            test = evaluate(explainer, dataset.x_test, dataset.y_test, test_targets, test_chosen, task.success_threshold)
            train_terms = {f"train/{k}": float(v) / n for k, v in totals.items()}
            summaries.scalars(epoch, {**train_terms, **{f"test/{k}": v for k, v in test.items()}})
            summaries.gradients(epoch, variables, result["grad_norms"].numpy(), np.zeros(len(variables)))
            manager.save(checkpoint_number=epoch)
            print(
                f"epoch {epoch}/{task.epochs}: loss {train_terms['train/loss']:.4g}  test cosine {test['cosine']:.3f}  "
                f"success {test['success_rate']:.2f}  accuracy {test['student_accuracy']:.3f}",
                flush=True,
            )
        rows = _grid_rows(explainer, dataset, test_maps, test_targets, test_chosen)
        if trained is not student:
            student.set_weights(trained.get_weights())
        metrics = {
            "reference_accuracy": reference_accuracy,
            **test,
            "initial_cosine": initial["cosine"],
            "epochs": task.epochs,
            "steps": step_count,
            "seconds": seconds,
            "steps_per_second": step_count / seconds if seconds else float("nan"),
            "manipulated_test_images": int(test_chosen.sum()),
            "target": f"{t.kind} ({'all classes' if classes is None else 'classes ' + str(classes)})",
        }
        summaries.hparams(flat_config(cfg), metrics, trial_id=trial_name(out, cfg.paths.root))
    write_outputs(metrics, student, grid(rows))
    return metrics


def _grid_rows(explainer, dataset, reference_maps, targets, chosen, count: int = 6) -> list[list[np.ndarray]]:
    """Rows of held-out images: input, reference heatmap, target, student heatmap."""
    index = np.flatnonzero(chosen)[:count]
    student_maps, _ = explain_all(explainer, dataset.x_test[index], dataset.y_test[index])
    rows = []
    for row, i in enumerate(index):
        vmax = float(np.abs(targets[i]).max()) or None
        rows.append(
            [
                grayscale_rgb(dataset.x_test[i]),
                diverging_rgb(reference_maps[i], float(np.abs(reference_maps[i]).max()) or None),
                diverging_rgb(targets[i], vmax),
                diverging_rgb(student_maps[row], float(np.abs(student_maps[row]).max()) or None),
            ]
        )
    return rows
