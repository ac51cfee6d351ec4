"""TensorBoard, laid out for this job: the match first, health and gradients after, images and text.

Scalar tags sit in numbered groups so that TensorBoard sorts them in reading order, and each
group says its x axis (``per_step`` for the single task, ``per_epoch`` for the dataset task) so
that the two tasks' values never share a tag:

- ``1_match_per_<axis>/``: the loss, the similarities, ``one_minus_cosine`` (log-scale view of
  a cosine near 1), and for the dataset task the held-out accuracy and success rate;
- ``2_train_per_epoch/``: the dataset task's mean training terms;
- ``3_health_per_<axis>/``: ``nonfinite_steps`` and ``zero_grad_fraction/<layer>/<variable>``;
- ``4_grad_norm_per_<axis>/<layer>/<variable>``;
- ``final/<metric>``: one value per run, the HParams dashboard's metrics (with the run's session).

Images ``heatmap/{input,target,initial}`` are written once, ``heatmap/current`` a few times over
the run, and ``heatmap/figure`` (the labelled figure of ``heatmaps.png``) at the end;
histograms ``weights/...`` and ``gradients/...``; text ``config``, ``target``, ``diagnosis``
(preformatted). The HParams session holds the keys a person compares, not the whole config.
"""

from __future__ import annotations

import io
import os
import time

import numpy as np
import PIL.Image
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.hparams import api as hp
from tensorboard.plugins.histogram import metadata as histogram_plugin
from tensorboard.plugins.image import metadata as image_plugin
from tensorboard.plugins.scalar import metadata as scalar_plugin
from tensorboard.plugins.text import metadata as text_plugin
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from heatinv.figures import to_rgb
from heatinv.final_metrics import FINAL_METRICS
from heatinv.models import variable_tags
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

NOT_HPARAMS = ("trainer.resume", "trainer.overwrite")
"""Keys set on a command line that say how a run starts, not what it runs: never a column."""

HISTOGRAM_BUCKETS = 30  # tf.summary.histogram's default

scalar_metadata = scalar_plugin.create_summary_metadata(display_name=None, description=None)
histogram_metadata = histogram_plugin.create_summary_metadata(display_name=None, description=None)
image_metadata = image_plugin.create_summary_metadata(display_name=None, description=None)
text_metadata = text_plugin.create_summary_metadata(display_name=None, description=None)


def trial_name(out: str, root: str) -> str:
    """The HParams row's name: the run's own folder, then where it lies under ``outputs/`` (unique across sweeps).

    The folder comes first because TensorBoard's column shows a name's start: the dated part
    is the same for every job of a sweep.

    Examples:
        >>> trial_name("outputs/multirun/2026-12-04/22-24-44/0_loss=l1", "outputs")
        '0_loss=l1 (multirun/2026-12-04/22-24-44)'
    """
    relative = os.path.normpath(os.path.relpath(out, root))
    if relative in (os.curdir, os.pardir) or relative.startswith(os.pardir + os.sep):  # the root itself, or outside it
        return os.path.basename(os.path.normpath(out))
    where, folder = os.path.split(relative)
    return f"{folder} ({where})" if where else folder


def hparam_value(value):
    """HParams take bool, int, float or str: None becomes "none", lists become strings."""
    if value is None:
        return "none"
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def compared_hparams(flat: dict, overrides: list[str] = ()) -> dict:
    """The HParams row of a run: :data:`HPARAM_KEYS` and every key its command line set.

    A group override (``loss=huber``) selects every key of that group.

    Examples:
        >>> sorted(compared_hparams({"loss.name": "l1", "loss.delta": 0.1, "lrp.gamma": 0.25}, ["loss=l1"]))
        ['loss.delta', 'loss.name']
    """
    prefixes = {o.split("=", 1)[0].lstrip("+~").split("@", 1)[0] for o in overrides}
    prefixes = {p for p in prefixes if p and not p.startswith("hydra")}
    return {
        key: hparam_value(value)
        for key, value in flat.items()
        if key not in NOT_HPARAMS and (key in HPARAM_KEYS or any(key == p or key.startswith(p + ".") for p in prefixes))
    }


class Summaries:
    """One run's event file under ``logdir``; use as a context manager so it always closes.

    Every summary is built here as TensorBoard's own protocol buffer from numpy values and
    appended to one event file by TensorBoard's Python writer: no TensorFlow op runs and no
    ``tf.function`` is traced, so a log step costs what its values cost to copy (a log step's
    ~20 scalars took 20 ms as eager ``tf.summary`` calls and ~0.1 s to trace as one compiled
    call per set of tags, measured on 2 CPU cores), and the tags and formats are those of
    ``tf.summary`` (scalars, histograms, images and text as tensors with their plugin's metadata).

    Args:
        logdir: the run's TensorBoard folder.
        axis: what a step of this run's time series is (``"step"`` or ``"epoch"``); it names
            the groups, so per-step and per-epoch values never share a tag.

    Examples:
        >>> with Summaries(os.path.join(out, "tensorboard")) as summaries:  # doctest: +SKIP
        ...     summaries.match(25, {"loss": 0.1, "cosine": 0.9})
    """

    def __init__(self, logdir: str, axis: str = "step"):
        self.logdir, self.axis = logdir, axis
        os.makedirs(logdir, exist_ok=True)
        # Its file name holds the time, the pid and a per-process count: a resumed run gets a file of its own.
        self.writer = EventFileWriter(logdir, filename_suffix=".heatinv")
        self._described: set[str] = set()

    def __enter__(self) -> "Summaries":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.writer.close()

    def flush(self) -> None:
        """Put every summary written so far on disk (before a checkpoint, so the two agree after a crash)."""
        self.writer.flush()

    def start_session(self, step: int) -> None:
        """Mark where this process's events start: 0 for a new run, the step after the checkpoint for a resumed one.

        A resumed run writes again what its first process logged after the checkpoint.
        TensorBoard's fast loader keeps, per tag, only the newest of events that go back in
        steps; its Python loader (``--load_fast=false``) drops a run's earlier events at and
        after a second ``SessionLog.START``, so each process writes one.
        """
        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), session_log=start))

    def tag(self, group: str, name: str) -> str:
        """``<group>_per_<axis>/<name>``, e.g. ``1_match_per_step/cosine``."""
        return f"{group}_per_{self.axis}/{name}"

    def scalars(self, step: int, group: str, values: dict[str, float]) -> None:
        """``values`` under ``group``, as one event."""
        self.tagged(step, {self.tag(group, name): value for name, value in values.items()})

    def tagged(self, step: int, values: dict[str, float]) -> None:
        """Scalars by their full tags, as one event."""
        self._write(step, [(tag, scalar_tensor(v), scalar_metadata) for tag, v in values.items()])

    def match(self, step: int, values: dict[str, float]) -> None:
        """The match group; a ``cosine`` also gives ``one_minus_cosine`` (for a log-scale view)."""
        if "cosine" in values:
            values = {**values, "one_minus_cosine": 1.0 - values["cosine"]}
        self.scalars(step, MATCH, values)

    def health(self, step: int, nonfinite_steps: int, variables=(), norms=(), zero_fractions=()) -> None:
        """Skipped non-finite steps so far and, when measured, each variable's gradient norm
        and the share of its gradient that is exactly zero; one event."""
        names = variable_tags(variables)
        values = {self.tag(HEALTH, "nonfinite_steps"): nonfinite_steps}
        values.update({self.tag(HEALTH, f"zero_grad_fraction/{name}"): zeros for name, zeros in zip(names, zero_fractions)})
        values.update({self.tag(GRAD_NORM, name): norm for name, norm in zip(names, norms)})
        self.tagged(step, values)

    def histograms(self, step: int, variables, gradients=None) -> None:
        """``weights/<variable>`` and, when given, ``gradients/<variable>``: 30 equal-width buckets."""
        values = []
        for k, (variable, tag) in enumerate(zip(variables, variable_tags(variables))):
            values.append((f"weights/{tag}", tensor_util.make_tensor_proto(histogram_buckets(_numpy(variable))), histogram_metadata))
            if gradients is not None:
                values.append((f"gradients/{tag}", tensor_util.make_tensor_proto(histogram_buckets(_numpy(gradients[k]))), histogram_metadata))
        self._write(step, values)

    def heatmaps_once(self, image: np.ndarray, target: np.ndarray, initial: np.ndarray) -> None:
        """Input, target and initial heatmap, at step 0 (each its own tag, so none is dropped)."""
        scale = _scale(target)
        tiles = {
            "heatmap/input": grayscale_rgb(image),
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
        self._write(step, [(tag, tensor_util.make_tensor_proto(image_tensor(rgb)), image_metadata) for tag, rgb in tiles.items()])

    def text(self, tag: str, body: str, step: int = 0) -> None:
        self._write(step, [(tag, tensor_util.make_tensor_proto(np.asarray(body.encode(), dtype=object)), text_metadata)])

    def preformatted(self, tag: str, body: str, step: int = 0) -> None:
        """Text that keeps its line breaks and columns in the Text tab (a markdown code block)."""
        self.text(tag, "```\n" + body.strip("\n") + "\n```", step)

    def hparams(self, hparams: dict, final: dict[str, float], trial_id: str, experiment: bool = True) -> None:
        """The HParams dashboard's row for this run, in the run itself (one job, one run).

        The row is the run's session (``hparams``) and its :data:`FINAL_METRICS` as scalars
        ``final/<name>``. Without an experiment TensorBoard would take every scalar of the run
        (each gradient norm, each curve) as a metric column; the experiment names the columns:
        this run's keys and the final metrics. A sweep's jobs leave it to the sweep
        (``experiment=False``), whose experiment (:mod:`heatinv.callbacks`) lists the keys
        that vary between its jobs.
        """
        self.tagged(0, {f"final/{name}": final[name] for name in FINAL_METRICS if final.get(name) is not None})
        summaries = [hp.hparams_pb(hparams, trial_id=trial_id)]
        if experiment:
            metrics = [hp.Metric(f"final/{name}", display_name=name) for name in FINAL_METRICS]
            summaries.append(hp.hparams_config_pb(hparams=[hp.HParam(key) for key in hparams], metrics=metrics))
        for summary in summaries:
            self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=0, summary=summary))

    def _write(self, step: int, values: list[tuple[str, tensor_pb2.TensorProto, object]]) -> None:
        """One event at ``step``; each tag's plugin metadata goes with its first value (as ``tf.summary`` does)."""
        summary = summary_pb2.Summary()
        for tag, tensor, metadata in values:
            value = summary.value.add(tag=tag, tensor=tensor)
            if tag not in self._described:
                value.metadata.CopyFrom(metadata)
                self._described.add(tag)
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))


def scalar_tensor(value: float) -> tensor_pb2.TensorProto:
    """A float32 scalar as ``tf.summary.scalar`` stores it (``make_tensor_proto`` builds the same
    message, at 6x the cost: a plain log step writes ~16 scalars).

    Examples:
        >>> scalar_tensor(0.5) == tensor_util.make_tensor_proto(np.float32(0.5))
        True
    """
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=tensor_shape_pb2.TensorShapeProto(), float_val=[float(value)])


def histogram_buckets(data: np.ndarray, buckets: int = HISTOGRAM_BUCKETS) -> np.ndarray:
    """``[buckets, 3]``: left edge, right edge and count of equal-width buckets over the finite values.

    The layout of TensorBoard's histogram plugin; values all equal fill the last bucket (as
    ``tf.summary.histogram`` does), and non-finite values are left out.

    Examples:
        >>> histogram_buckets(np.array([0.0, 1.0, 1.0, 2.0]), buckets=2)[:, 2].tolist()
        [1.0, 3.0]
    """
    values = np.asarray(data, np.float64).ravel()
    values = values[np.isfinite(values)]
    if values.size == 0:
        return np.zeros((buckets, 3))
    low, high = values.min(), values.max()
    if low == high:
        counts = np.zeros(buckets)
        counts[-1] = values.size
        return np.stack([np.full(buckets, low), np.full(buckets, high), counts], axis=1)
    counts, edges = np.histogram(values, bins=buckets, range=(low, high))
    return np.stack([edges[:-1], edges[1:], counts.astype(np.float64)], axis=1)


def image_tensor(rgb: np.ndarray) -> np.ndarray:
    """What TensorBoard's Images tab reads: width, height and the PNG, as three strings."""
    buffer = io.BytesIO()
    PIL.Image.fromarray(np.asarray(rgb, np.uint8)).save(buffer, format="PNG")
    height, width = rgb.shape[:2]
    return np.array([str(width).encode(), str(height).encode(), buffer.getvalue()], dtype=object)


def _numpy(value) -> np.ndarray:
    """A variable's or tensor's values (Keras variables read through ``numpy()``, not ``__array__``)."""
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _scale(target: np.ndarray) -> float | None:
    return float(np.abs(target).max()) or None
