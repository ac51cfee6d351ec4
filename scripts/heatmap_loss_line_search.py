"""Does a step along the heatmap loss's gradient lower it? A line search on one batch of a dataset experiment.

    python scripts/heatmap_loss_line_search.py experiment=pattern_frame_folder_mobilenetv2

Composes the trainer's config from the given overrides, takes the first ``task.batch_size``
training images with their targets, and measures the student's heatmap term (the task's
per-image loss, in units of the batch's target peak) at its start, then after single steps of
several sizes from the start: along the normalized gradient (``w - s g / |g|``, gradient
descent) and along its sign (``w - s sign(g)``, the direction of Adam's first update). Prints
the map's shape (how peaked it is, the student's normalized map on and off the target's
support) and the variables with the largest gradient norms. A loss that falls for the
smallest steps only says the map is a rough function of the weights at that scale.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf
from hydra import compose, initialize_config_module

from heatinv.build import StreamedProblem, build_parts, dataset_problem, explainer_for
from heatinv.config import register
from heatinv.losses import batch_unit, normalize_map, per_example_heatmap_loss


def main(overrides: list[str]) -> dict:
    """Print the measurements; return ``{"start": loss, "gradient": {step: loss}, "sign": {step: loss}}``."""
    register()
    # paths.root's default reads Hydra's runtime folder, which a compose outside a run lacks.
    if not any(o.startswith("paths.root=") for o in overrides):
        overrides = [f"paths.root={os.path.join(os.getcwd(), 'outputs')}", *overrides]
    with initialize_config_module(config_module="heatinv.configs", version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    parts = build_parts(cfg)
    problem = dataset_problem(cfg, parts.dataset, parts.reference)
    size = cfg.task.batch_size
    if isinstance(problem, StreamedProblem):
        batch = next(iter(problem.batches(parts.dataset, "train", size, np.arange(size))))
        x, labels, targets = batch.x, batch.labels, batch.targets
    else:
        x, labels, targets = parts.dataset.x_train[:size], parts.dataset.y_train[:size], problem.train_targets[:size]
    x, labels, targets = tf.constant(x), tf.constant(labels), tf.constant(targets, tf.float32)
    student, explainer = parts.student, explainer_for(parts.student, cfg)
    per_example = per_example_heatmap_loss(cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
    unit = batch_unit(targets, cfg.loss.normalize)

    def heatmap_loss(relevance: tf.Tensor) -> tf.Tensor:
        return tf.reduce_mean(per_example(relevance, targets, unit))

    with tf.GradientTape() as tape:
        explanation = explainer.explain(x, labels)
        loss = heatmap_loss(explanation.relevance)
    gradients = tape.gradient(loss, student.trainable_variables)
    maps = np.abs(explanation.relevance.numpy().reshape(size, -1))
    normalized = normalize_map(explanation.relevance, cfg.loss.normalize).numpy().reshape(size, -1)
    support = targets.numpy().reshape(size, -1) != 0
    print(f"heatmap loss at the start: {float(loss):.6f}")
    print(f"peak |R| / mean |R| per image: {np.mean(maps.max(1) / maps.mean(1)):.1f}; the 1 % largest |R| hold "
          f"{np.mean(np.sort(maps, 1)[:, -max(1, maps.shape[1] // 100):].sum(1) / maps.sum(1)):.3f} of it")
    print(f"target support: {support.mean():.3f} of the pixels; the student's normalized map there {normalized[support].mean():.4f}, "
          f"elsewhere |.| {np.abs(normalized[~support]).mean():.4f}")
    norms = sorted(((float(tf.norm(g)), v.path) for v, g in zip(student.trainable_variables, gradients)), reverse=True)
    print("largest gradient norms: " + ", ".join(f"{path} {norm:.3g}" for norm, path in norms[:4]))
    start = [v.numpy() for v in student.trainable_variables]
    length = np.sqrt(sum(float(tf.reduce_sum(tf.square(g))) for g in gradients))
    directions = {
        "gradient": [g.numpy() / length for g in gradients],
        "sign": [np.sign(g.numpy()) for g in gradients],
    }
    found = {"start": float(loss), "gradient": {}, "sign": {}}
    for name, steps in (("gradient", (1e-4, 1e-3, 1e-2, 1e-1)), ("sign", (1e-5, 1e-4, 1e-3))):
        for s in steps:
            for variable, w, d in zip(student.trainable_variables, start, directions[name]):
                variable.assign(w - s * d)
            after = float(heatmap_loss(explainer(x, labels)))
            found[name][s] = after
            print(f"step {s:g} along the {name}: heatmap loss {after:.6f} ({after - float(loss):+.2e})")
    for variable, w in zip(student.trainable_variables, start):
        variable.assign(w)
    return found


if __name__ == "__main__":
    main(sys.argv[1:])
