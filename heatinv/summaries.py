"""TensorBoard, laid out for this job: the match first, health and gradients after, images and text.

Scalar tags sit in numbered groups so that TensorBoard sorts them in reading order, and each
group says its x axis (``per_step`` for the single task, ``per_epoch`` for the dataset task) so
that the two tasks' values never share a tag:

- ``1_match_per_<axis>/``: the loss, the similarities, ``one_minus_cosine`` (log-scale view of
  a cosine near 1), and for the dataset task the held-out accuracy and success rate;
- ``2_train_per_epoch/``: the dataset task's mean training terms;
- ``3_health_per_<axis>/``: ``nonfinite_steps`` and ``zero_grad_fraction/<layer>/<variable>``;
- ``4_grad_norm_per_<axis>/<layer>/<variable>``;
- ``final/<metric>``: one value per run, for the HParams dashboard (in ``<logdir>/hparams``).

Images ``heatmap/{input,target,initial}`` are written once, ``heatmap/current`` a few times over
the run, and ``heatmap/figure`` (the labelled figure of ``heatmaps.png``) at the end;
histograms ``weights/...`` and ``gradients/...``; text ``config``, ``target``, ``diagnosis``
(preformatted). The HParams session holds the keys a person compares, not the whole config.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from omegaconf import OmegaConf
from tensorboard.plugins.hparams import api as hp

from heatinv.figures import to_rgb
from heatinv.final_metrics import FINAL_METRICS
from heatinv.models import variable_tag
from heatinv.render import diverging_rgb, grayscale_rgb

MATCH, TRAIN, HEALTH, GRAD_NORM = "1_match", "2_train", "3_health", "4_grad_norm"

HPARAM_KEYS = (
    "task.kind",
    "model.name",
    "target.kind",
    "init.kind",
    "loss.name",
    "lrp.composite",
    "optimizer.name",
    "optimizer.lr",
    "trainer.steps",
    "task.epochs",
)
"""Keys every run's HParams row shows (what a person tells runs apart by); overridden keys are added."""


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


def compared_hparams(flat: dict, overrides: list[str] = ()) -> dict:
    """The HParams row of a run: :data:`HPARAM_KEYS` and every key its command line set.

    A group override (``loss=huber``) selects every key of that group.

    Example:
    >>> sorted(compared_hparams({"loss.name": "l1", "loss.delta": 0.1, "lrp.gamma": 0.25}, ["loss=l1"]))
    ['loss.delta', 'loss.name']
    """
    prefixes = {o.split("=", 1)[0].lstrip("+~").split("@", 1)[0] for o in overrides}
    prefixes = {p for p in prefixes if p and not p.startswith("hydra")}
    return {
        key: hparam_value(value)
        for key, value in flat.items()
        if key in HPARAM_KEYS or any(key == p or key.startswith(p + ".") for p in prefixes)
    }


class Summaries:
    """One run's event files under ``logdir``; use as a context manager so it always closes.

    Args:
        logdir: the run's TensorBoard folder.
        axis: what a step of this run's time series is (``"step"`` or ``"epoch"``); it names
            the groups, so per-step and per-epoch values never share a tag.
    """

    def __init__(self, logdir: str, axis: str = "step"):
        self.logdir, self.axis = logdir, axis
        self.writer = tf.summary.create_file_writer(logdir)
        self._compiled: dict[tuple[str, ...], object] = {}

    def __enter__(self) -> "Summaries":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()

    def tag(self, group: str, name: str) -> str:
        """``<group>_per_<axis>/<name>``, e.g. ``1_match_per_step/cosine``."""
        return f"{group}_per_{self.axis}/{name}"

    def scalars(self, step: int, group: str, values: dict[str, float]) -> None:
        """``values`` under ``group``, written by one compiled function per set of tags.

        Written one eager ``tf.summary.scalar`` at a time, a log step's ~20 scalars took
        20 ms (measured on 2 CPU cores), which at every 25th step of a fast run is a large
        share of its time; compiled, they take under 2 ms.
        """
        self.tagged(step, {self.tag(group, name): value for name, value in values.items()})

    def tagged(self, step: int, values: dict[str, float]) -> None:
        """Scalars by their full tags, in one compiled call (see :meth:`scalars`)."""
        tags = tuple(values)
        write = self._compiled.get(tags)
        if write is None:
            write = self._compiled[tags] = self._scalar_writer(tags)
        write(tf.constant(step, tf.int64), tf.constant([float(v) for v in values.values()], tf.float32))

    def _scalar_writer(self, tags: tuple[str, ...]):
        writer = self.writer

        @tf.function(autograph=False)
        def write(step, values):
            with writer.as_default(step=step):
                for k, tag in enumerate(tags):
                    tf.summary.scalar(tag, values[k])

        return write

    def match(self, step: int, values: dict[str, float]) -> None:
        """The match group; a ``cosine`` also gives ``one_minus_cosine`` (for a log-scale view)."""
        if "cosine" in values:
            values = {**values, "one_minus_cosine": 1.0 - values["cosine"]}
        self.scalars(step, MATCH, values)

    def health(self, step: int, nonfinite_steps: int, variables=(), norms=(), zero_fractions=()) -> None:
        """Skipped non-finite steps so far and, when measured, each variable's gradient norm
        and the share of its gradient that is exactly zero; one compiled call."""
        names = [variable_tag(variable) for variable in variables]
        values = {self.tag(HEALTH, "nonfinite_steps"): nonfinite_steps}
        values.update({self.tag(HEALTH, f"zero_grad_fraction/{name}"): zeros for name, zeros in zip(names, zero_fractions)})
        values.update({self.tag(GRAD_NORM, name): norm for name, norm in zip(names, norms)})
        self.tagged(step, values)

    def histograms(self, step: int, variables, gradients=None) -> None:
        with self.writer.as_default(step=step):
            for k, variable in enumerate(variables):
                tag = variable_tag(variable)
                tf.summary.histogram(f"weights/{tag}", variable)
                if gradients is not None:
                    tf.summary.histogram(f"gradients/{tag}", gradients[k])

    def heatmaps_once(self, image: np.ndarray, target: np.ndarray, initial: np.ndarray) -> None:
        """Input, target and initial heatmap, at step 0 (each its own tag, so none is dropped)."""
        scale = _scale(target)
        tiles = {
            "heatmap/input": grayscale_rgb(image, invert=True),
            "heatmap/target": diverging_rgb(target, scale),
            "heatmap/initial": diverging_rgb(initial, scale),
        }
        self._images(0, tiles)

    def current_heatmap(self, step: int, target: np.ndarray, current: np.ndarray) -> None:
        """The heatmap at ``step`` on the target's symmetric scale (blue-white-red, white at zero)."""
        self._images(step, {"heatmap/current": diverging_rgb(current, _scale(target))})

    def figure(self, step: int, fig, tag: str = "heatmap/figure") -> None:
        """A matplotlib figure (:mod:`heatinv.figures`) in the Images tab."""
        self._images(step, {tag: to_rgb(fig)})

    def _images(self, step: int, tiles: dict[str, np.ndarray]) -> None:
        with self.writer.as_default(step=step):
            for tag, rgb in tiles.items():
                tf.summary.image(tag, rgb[None], step=step)

    def text(self, tag: str, body: str, step: int = 0) -> None:
        with self.writer.as_default(step=step):
            tf.summary.text(tag, body)

    def preformatted(self, tag: str, body: str, step: int = 0) -> None:
        """Text that keeps its line breaks and columns in the Text tab (a markdown code block)."""
        self.text(tag, "```\n" + body.strip("\n") + "\n```", step)

    def hparams(self, hparams: dict, final: dict[str, float], trial_id: str) -> None:
        """The HParams dashboard's row for this run, in the run's own ``hparams`` folder.

        TensorBoard takes a row's metric columns from every scalar under the row's folder; in
        a folder of their own the row's metrics are the :data:`FINAL_METRICS` the run measured
        (``final/<name>``), not every gradient norm. A sweep's experiment
        (:mod:`heatinv.callbacks`) names the columns of its jobs.
        """
        writer = tf.summary.create_file_writer(os.path.join(self.logdir, "hparams"))
        with writer.as_default(step=0):
            hp.hparams(hparams, trial_id=trial_id)
            for name in FINAL_METRICS:
                if name in final:
                    tf.summary.scalar(f"final/{name}", final[name])
        writer.close()


def _scale(target: np.ndarray) -> float | None:
    return float(np.abs(target).max()) or None
