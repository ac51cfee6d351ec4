"""Explanation manipulation at dataset scale: move many images' heatmaps, keep the accuracy.

The objective is a weighted sum, each weight a config value (``task.*_weight``):

    heatmap_weight * heatmap_loss(student heatmaps, targets)
  + ce_weight      * cross-entropy(student logits, true labels)          (keeps accuracy)
  + logit_weight   * mean squared (student logits - reference logits)   (keeps the function)

trained over epochs of ``tf.data`` mini-batches with the same compiled-step design as the
main job, and evaluated on **held-out test images** only: accuracy, heatmap similarity to
the targets, and the share of images whose cosine to the target passes
``task.success_threshold``.
"""

from __future__ import annotations

import os
import time

import keras
import numpy as np
import tensorflow as tf
from omegaconf import OmegaConf

from heatinv.dataset_targets import dataset_targets
from heatinv.losses import heatmap_loss
from heatinv.lrp import LRP
from heatinv.render import diverging_rgb, grayscale_rgb, grid, write_png
from heatinv.similarity import per_sample_similarity
from heatinv.step import make_optimizer
from heatinv.summaries import Summaries, flat_config


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

    explainer = explainer_for(student)
    optimizer = make_optimizer(cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.momentum)
    optimizer.build(student.trainable_variables)
    loss_fn = heatmap_loss(cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
    weights = (task.heatmap_weight, task.ce_weight, task.logit_weight)
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
    batches = (
        tf.data.Dataset.from_tensor_slices(
            (dataset.x_train, dataset.y_train.astype(np.int32), train_targets, train_logits.astype(np.float32))
        )
        .shuffle(len(dataset.x_train), seed=cfg.trainer.seed, reshuffle_each_iteration=True)
        .batch(task.batch_size)
        .prefetch(2)
    )
    checkpoint = tf.train.Checkpoint(student=student, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(out, "checkpoints"), max_to_keep=2)

    initial = evaluate(explainer, dataset.x_test, dataset.y_test, test_targets, test_chosen, task.success_threshold)
    print(f"heatinv: before: cosine {initial['cosine']:.3f}, accuracy {initial['student_accuracy']:.3f}", flush=True)
    seconds, step_count = 0.0, 0
    variables = student.trainable_variables
    with Summaries(os.path.join(out, "tensorboard")) as summaries:
        summaries.text("config", "```\n" + OmegaConf.to_yaml(cfg, resolve=False) + "\n```")
        summaries.scalars(0, {f"test/{k}": v for k, v in initial.items()})
        for epoch in range(1, task.epochs + 1):
            started = time.perf_counter()
            totals: dict[str, tf.Tensor] = {}
            n = 0
            for x, y, target, ref in batches:
                result = step(x, y, target, ref)
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
        summaries.hparams(flat_config(cfg), metrics, trial_id=os.path.relpath(out, cfg.paths.root))
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
