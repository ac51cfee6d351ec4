"""heatinv from Python: :func:`invert` one input's heatmap of a Keras model in memory.

The command line's single task (``python -m heatinv.train``) and :func:`invert` are one
trainer: both compose the ``train`` config, build a :class:`heatinv.single.SingleTask` and run
it with :func:`heatinv.train.run_task` (the compiled step, the doctor, the NaN guard, the
checkpoints, the TensorBoard summaries, the figure). :func:`invert` takes the model, the input
and the target as arrays instead of files, starts from the model's own weights
(``init=reference``) and returns what the run found instead of leaving it in files only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import keras
import numpy as np

from heatinv.build import Parts
from heatinv.data import Dataset
from heatinv.data.dataset import value_range
from heatinv.models import accuracy, copy_with_weights
from heatinv.run_result import RunResult
from heatinv.settings import IN_MEMORY, NO_RESUME, SINGLE_GROUPS, configured, run_folder, run_held
from heatinv.single import SingleTask
from heatinv.targets import PATTERNS, Target, channels_as_map, pattern_map

REFUSED = {
    "kind": "the target argument says what the target is.",
    "label": "use the label= argument.",
    "index": "the input is the x argument.",
    "image": "the input is the x argument.",
    "path": "give the target map as the target argument (an array).",
    "pattern": 'give the pattern as the target argument (target="frame").',
    "like": "it belongs to the dataset task (heatinv.manipulate).",
    "top_k": "it belongs to the dataset task (heatinv.manipulate).",
    "feature": "move a table's feature with heatinv.manipulate (target=\"suppress_feature\"), or give the map.",
    "resume": NO_RESUME,
    "strategy": "a single inversion runs on one device.",
}
"""Settings :func:`invert` takes as arguments or does not use, with what to do instead."""


@dataclass
class Inversion(RunResult):
    """What :func:`invert` found: :class:`heatinv.run_result.RunResult` (``student``, ``metrics``,
    ``history``, ``figure``, ``plot()``) and the problem's arrays.

    Attributes:
        heatmaps: ``initial`` (the model's), ``final`` (the student's) and ``target``, each
            ``[1, *map shape]``.
        x: the input explained, ``[1, *input shape]``.
        label: the class explained.
    """

    heatmaps: dict[str, np.ndarray] = field(default_factory=dict)
    x: np.ndarray | None = None
    label: int | None = None


def invert(
    model: keras.Model,
    x,
    target,
    *,
    label: int | None = None,
    composite: str = "epsilon_gamma_box",
    loss: str = "mse",
    steps: int = 300,
    optimizer: str = "adam",
    learning_rate: float | None = None,
    data: tuple | None = None,
    logdir: str | None = None,
    seed: int = 0,
    low=None,
    high=None,
    **settings,
) -> Inversion:
    """Optimize a copy of ``model``'s weights until its LRP heatmap of ``x`` matches ``target``.

    Runs the command line's single task (:mod:`heatinv.single`): the same compiled step, the
    doctor before the first update, the NaN/Inf guard and the same metrics. Without
    ``logdir`` the run's files go to a temporary folder, removed at the end.

    Args:
        model: a Keras model heatinv can explain (:func:`heatinv.lrp.relevance`); not modified.
        x: one input: ``[H, W, C]`` or ``[1, H, W, C]`` (``[H, W]`` for one channel), or
            ``[d]`` / ``[1, d]`` features.
        target: the heatmap to reach, an array of the map's shape with or without the batch
            and channel axes (``[H, W]`` for a grey or a colour image: the heatmap of a colour
            image is summed over its channels unless ``channels="keep"``), or a pattern's name
            (``"square"``, ``"cross"``, ``"frame"``: total relevance 1).
        label: the class whose heatmap moves; default the model's prediction for ``x``.
        composite: the LRP composite (``configs/lrp``: ``epsilon_gamma_box``, ``epsilon_plus``,
            ``attnlrp``, ...).
        loss: ``"mse"``, ``"l1"`` or ``"huber"``.
        steps: optimizer updates.
        optimizer: ``"adam"`` or ``"sgd"``.
        learning_rate: default the optimizer config's (1e-3 for Adam).
        data: held-out ``(x, y)`` arrays: the model's and the student's accuracy on them join
            the metrics (``reference_accuracy``, ``student_accuracy``); None without.
        logdir: a folder for the run's files, as the command line writes them (TensorBoard
            events, ``metrics.json``, ``student.keras``, ``heatmaps.png``, checkpoints). An
            existing run there is refused unless ``overwrite=True``.
        seed: Keras's global seed, set first (as the command line sets ``trainer.seed``).
        low: the input box's lower end for the ``zbox`` rule of the ``*_box`` composites (a
            float, or one per channel or feature); default the smallest value of ``x`` and
            ``data``'s inputs, as the command line takes the data's range.
        high: the input box's upper end, as ``low``; default the largest value.
        **settings: any other key of the ``trainer``, ``lrp``, ``loss``, ``optimizer`` or
            ``target`` config groups by its last name, e.g. ``epsilon=1e-3``,
            ``jit_compile=False``, ``log_every=10``, ``precision="float64"``, ``delta=0.05``,
            ``channels="keep"``, ``scale=2.0`` (a pattern's total), ``overwrite=True``. Keys the
            arguments above set, or that a single inversion does not use, are refused.

    Returns:
        An :class:`Inversion`: ``.student``, ``.metrics``, ``.history``, ``.heatmaps``, ``.plot()``.

    Raises:
        ValueError: ``x`` or ``target`` of the wrong shape (both shapes named), an unknown
            setting or value.
        heatinv.lrp.UnsupportedLayerError: a layer the engine cannot explain (named).
        heatinv.loop.GradientsVanished: the gradients vanished; its message is the doctor's report.

    Examples:
        >>> import heatinv, keras, numpy as np
        >>> keras.utils.set_random_seed(0)
        >>> model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
        ...                           keras.layers.Dense(3)])
        >>> x = np.random.default_rng(0).uniform(size=(8, 8, 1)).astype("float32")
        >>> result = heatinv.invert(model, x, "frame", steps=50, composite="epsilon_plus", learning_rate=1e-2)
        >>> result.history[0]["cosine"] < 0.5 < 0.9 < result.metrics["cosine"], result.heatmaps["final"].shape
        (True, (1, 8, 8, 1))
        >>> figure = result.plot()  # input, target, initial and final heatmaps
    """
    keras.utils.set_random_seed(seed)
    input_shape = _input_shape(model)
    tokens = np.issubdtype(np.dtype(model.inputs[0].dtype), np.integer)  # token ids, explained token by token
    x = _one_input(x, input_shape, np.int32 if tokens else np.float32)
    if isinstance(target, str) and (target not in PATTERNS or len(input_shape) != 3):
        raise ValueError(
            f"invert() target={target!r}: a pattern is one of {list(PATTERNS)} and is drawn on images; "
            f"the model takes inputs of shape {input_shape}. Give the target heatmap as an array instead."
        )
    if label is None:
        label = int(np.argmax(np.asarray(model(x, training=False))[0]))
    groups = ["model=file", "init=reference", f"loss={loss}", f"lrp={composite}", f"optimizer={optimizer}",
              f"target={'pattern' if isinstance(target, str) else 'file'}"]
    values = {
        "model.path": IN_MEMORY, "trainer.steps": steps, "trainer.seed": seed, "target.label": label,
        **({"target.pattern": target} if isinstance(target, str) else {"target.path": IN_MEMORY}),
        **({"optimizer.lr": learning_rate} if learning_rate is not None else {}),
    }
    with run_folder(logdir, "heatinv-invert-") as out:
        refused = {**REFUSED, **({} if isinstance(target, str) else {"scale": "it sizes a pattern; scale the target array."})}
        values = {**values, "paths.output_dir": out, "paths.root": out}
        cfg = configured(groups, values, settings, "invert()", SINGLE_GROUPS, refused)
        cfg.data.name = "arrays"  # after validation: the run's config says where its data came from
        parts = _parts(model, x, label, data, cfg.trainer.precision)
        if not tokens:  # token ids have no box
            inputs = x if parts.dataset is None else np.concatenate([x, parts.dataset.x_test])
            data_low, data_high = value_range(inputs, inputs)
            cfg.lrp.low = _box(data_low if low is None else low)
            cfg.lrp.high = _box(data_high if high is None else high)
        channels = cfg.target.channels
        task = SingleTask(cfg, parts, _target(target, x, label, channels, cfg.target.scale))
        metrics = run_held(cfg, parts, task, out, logdir, "invert()")
        heatmaps = {"initial": task.initial, "final": task.final_map, "target": task.target.heatmap}
        return Inversion(task.student, metrics, task.history, task.figure, logdir, heatmaps, x, label)


def _input_shape(model: keras.Model) -> tuple[int, ...]:
    inputs = getattr(model, "inputs", None)
    if not inputs or len(inputs) != 1 or any(size is None for size in inputs[0].shape[1:]):
        raise ValueError(
            f"invert() takes a model of one input of known shape (an image [H, W, C] or features [d]); model "
            f"{model.name!r} takes {[tuple(i.shape) for i in inputs] if inputs else 'no defined input (build or call it first)'}."
        )
    return tuple(inputs[0].shape[1:])


def _one_input(x, input_shape: tuple[int, ...], dtype) -> np.ndarray:
    """``x`` as ``[1, *input_shape]`` in ``dtype`` (float32, int32 token ids): the batch axis (and one channel) added where left out."""
    array = np.asarray(x, dtype=dtype)
    for shape in (input_shape, (1, *input_shape)) + ((input_shape[:-1], (1, *input_shape[:-1])) if input_shape[-1] == 1 else ()):
        if array.shape == shape:
            return array.reshape((1, *input_shape))
    raise ValueError(
        f"invert() x has shape {array.shape}; the model takes inputs of shape {input_shape}: give one input of that "
        f"shape, or [1, {', '.join(map(str, input_shape))}]."
    )


def _target(target, x: np.ndarray, label: int, channels: str, scale: float) -> Target:
    """The target heatmap ``[1, *map shape]`` (a colour image's summed over channels unless ``channels="keep"``)."""
    shape = x.shape[1:]
    map_shape = shape[:-1] + (1,) if len(shape) == 3 and channels == "sum" else shape
    if isinstance(target, str):
        drawn = scale * pattern_map(target, shape[0], 1.0, width=shape[1])
        heatmap, source = np.repeat(drawn / map_shape[-1], map_shape[-1], axis=-1), f"{target} pattern"
    else:
        given = np.asarray(target, dtype=np.float32)
        raw = channels_as_map(given[0] if given.ndim == len(shape) + 1 and given.shape[0] == 1 else given, shape, map_shape)
        expected = (map_shape, (*map_shape[:-1],)) if len(shape) == 3 and map_shape[-1] == 1 else (map_shape,)
        heatmap = next((raw.reshape(map_shape) for e in expected if raw.shape == e), None)
        if heatmap is None:
            summed = " (a colour image's channels summed: channels='sum')" if map_shape != shape else ""
            optional = " and the channel axis" if len(expected) > 1 else ""
            raise ValueError(
                f"invert() target has shape {given.shape}; the heatmap of an input of shape {shape} has shape "
                f"{map_shape}{summed}. Give the target in that shape, with or without the batch axis{optional}."
            )
        if not np.any(heatmap) or not np.all(np.isfinite(heatmap)):
            raise ValueError(
                "invert() target is all zeros or holds NaN/Inf: there is nothing to match. Give the finite heatmap "
                "the model should produce."
            )
        source = f"a {'x'.join(map(str, given.shape))} array"
    return Target(x, heatmap[None].astype(np.float32), int(label), source)


def _parts(model: keras.Model, x: np.ndarray, label: int, data, precision: str) -> Parts:
    """The model as reference, a copy of it with its weights as the student, ``data`` as the held-out examples."""
    dataset = None
    if data is not None:
        x_test, y_test = (np.asarray(a) for a in data)
        shapes = (x.shape[1:], x.shape[1:-1]) if x.shape[-1] == 1 and x.ndim == 4 else (x.shape[1:],)
        if len(x_test) != len(y_test) or x_test.shape[1:] not in shapes or y_test.ndim != 1:
            raise ValueError(
                f"invert() data holds x of shape {x_test.shape} and y of shape {y_test.shape}; expected held-out inputs "
                f"[N, {', '.join(map(str, x.shape[1:]))}] and their N integer labels."
            )
        x_test, y_test = x_test.astype(x.dtype).reshape((-1, *x.shape[1:])), y_test.astype(np.int64).reshape(-1)
        classes = tuple(map(str, range(int(model.outputs[0].shape[-1]))))
        dataset = Dataset(x_test, y_test, x_test, y_test, "arrays", classes)  # the held-out examples as both splits: no training here
    reference_accuracy = None if dataset is None else accuracy(model, dataset.x_test, dataset.y_test)
    return Parts(dataset, model, reference_accuracy, copy_with_weights(model, precision))


def _box(value) -> float | list[float]:
    """A box bound as the config holds it: a float, or one float per channel or feature."""
    value = np.asarray(value, np.float64)
    return float(value) if value.ndim == 0 else [float(v) for v in value.ravel()]
