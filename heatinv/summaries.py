"""TensorBoard: scalars, per-layer gradient norms, heatmap images, histograms, config, HParams.

Tags written (see the README):
``loss``, ``similarity/{cosine,ssim,pearson,spearman}``, ``grad_norm/<layer>/<variable>``,
``zero_grad_fraction/<layer>/<variable>``, images ``heatmap/{input,target,current,difference}``,
histograms ``weights/...`` and ``gradients/...``, text ``config`` and ``diagnosis``, and the
HParams session with the flattened config and final metrics ``final/<metric>``.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from omegaconf import OmegaConf
from tensorboard.plugins.hparams import api as hp

from heatinv.final_metrics import FINAL_METRICS
from heatinv.models import variable_tag
from heatinv.render import diverging_rgb, grayscale_rgb



def trial_name(out: str, root: str) -> str:
    """The HParams row's name: the run directory relative to ``outputs/`` (unique across sweeps)."""
    relative = os.path.relpath(out, root)
    return os.path.basename(os.path.normpath(out)) if relative.startswith(".") else relative


def hparam_value(value):
    """HParams take bool, int, float or str: None becomes "none", lists become strings."""
    if value is None:
        return "none"
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def flat_config(cfg) -> dict:
    """``{"loss.name": "mse", ...}`` without paths, for HParams and metrics.json."""
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("paths", None)
    flat: dict = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}{key}.", value)
        else:
            flat[prefix[:-1]] = node

    walk("", container)
    return flat


class Summaries:
    """One run's event files under ``logdir``; use as a context manager so it always closes."""

    def __init__(self, logdir: str):
        self.writer = tf.summary.create_file_writer(logdir)

    def __enter__(self) -> "Summaries":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        with self.writer.as_default(step=step):
            for tag, value in values.items():
                tf.summary.scalar(tag, value)

    def gradients(self, step: int, variables, norms: np.ndarray, zero_fractions: np.ndarray) -> None:
        with self.writer.as_default(step=step):
            for variable, norm, zeros in zip(variables, norms, zero_fractions):
                tag = variable_tag(variable)
                tf.summary.scalar(f"grad_norm/{tag}", float(norm))
                tf.summary.scalar(f"zero_grad_fraction/{tag}", float(zeros))

    def histograms(self, step: int, variables, gradients) -> None:
        with self.writer.as_default(step=step):
            for variable, gradient in zip(variables, gradients):
                tag = variable_tag(variable)
                tf.summary.histogram(f"weights/{tag}", variable)
                tf.summary.histogram(f"gradients/{tag}", gradient)

    def heatmaps(self, step: int, image: np.ndarray, target: np.ndarray, current: np.ndarray) -> None:
        """Target, current and difference on one symmetric colour scale centred at zero."""
        vmax = float(np.abs(target).max()) or None
        tiles = {
            "heatmap/input": grayscale_rgb(image[0]),
            "heatmap/target": diverging_rgb(target[0], vmax),
            "heatmap/current": diverging_rgb(current[0], vmax),
            "heatmap/difference": diverging_rgb(current[0] - target[0], vmax),
        }
        with self.writer.as_default(step=step):
            for tag, rgb in tiles.items():
                tf.summary.image(tag, rgb[None], step=step)

    def text(self, tag: str, body: str, step: int = 0) -> None:
        with self.writer.as_default(step=step):
            tf.summary.text(tag, body)

    def hparams(self, flat_config: dict, final: dict[str, float], trial_id: str) -> None:
        """The HParams dashboard's row for this run: config values and final metrics."""
        with self.writer.as_default(step=0):
            hp.hparams({key: hparam_value(value) for key, value in flat_config.items()}, trial_id=trial_id)
            for name in FINAL_METRICS:
                if name in final:
                    tf.summary.scalar(f"final/{name}", final[name])
