"""heatinv from Python: :func:`manipulate` the explanations of a data set, the command line's dataset task.

:func:`manipulate` composes the ``train`` config with ``task=dataset``, builds a
:class:`heatinv.dataset_task.DatasetTask` on the given model and data and runs it with
:func:`heatinv.train.run_task`, as ``python -m heatinv.train task=dataset model=file ...`` does.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

from heatinv.build import Parts, check_target_fits_data, default_box_to_data_range
from heatinv.data import Dataset, load_dataset
from heatinv.data.dataset import stratified_split, value_range
from heatinv.data.text import numbered_vocabulary
from heatinv.dataset_task import DatasetTask
from heatinv.models import accuracy, copy_with_weights
from heatinv.run_result import RunResult
from heatinv.settings import DATASET_GROUPS, IN_MEMORY, NO_RESUME, configured, run_folder, run_held

TARGETS = ("swap", "pattern", "suppress", "suppress_feature", "swap_features", "suppress_token")
"""The dataset task's targets (``configs/target``)."""

REFUSED = {
    "kind": "the target argument says what the target is.",
    "label": "choose the classes that move with classes=[...].",
    "index": "every held-out example is evaluated.",
    "image": "the data argument holds the inputs.",
    "path": "the data argument holds the inputs; a pattern is named by pattern=.",
    "resume": NO_RESUME,
}
"""Settings :func:`manipulate` takes as arguments or does not use, with what to do instead."""


def manipulate(
    reference: keras.Model,
    data,
    *,
    target: str = "swap",
    classes: list | None = None,
    epochs: int = 20,
    batch_size: int = 64,
    composite: str = "epsilon_gamma_box",
    loss: str = "mse",
    optimizer: str = "adam",
    learning_rate: float | None = None,
    test_split: float = 0.2,
    vocabulary=None,
    feature_names=None,
    logdir: str | None = None,
    seed: int = 0,
    **settings,
) -> RunResult:
    """Fine-tune a copy of ``reference`` until its heatmaps of a data set move to the target's, accuracy kept.

    The command line's dataset task (:mod:`heatinv.dataset_task`): its objective (the heatmap
    term, cross-entropy, distillation to the reference), its held-out metrics (cosine, success
    rate, accuracy, agreement with the reference) and figure. The student starts from the
    reference's weights. Without ``logdir`` the run's files go to a temporary folder.

    Args:
        reference: the trained model whose explanations move; not modified.
        data: ``(x, y)`` arrays (split into training and held-out examples by ``test_split``,
            per class), ``((x_train, y_train), (x_test, y_test))``, a ``tf.data.Dataset`` of
            ``(x, y)`` (read whole into memory, then split), or the path of an image folder (a
            subfolder per class) or an ``.npz`` (``x_train``, ``y_train``, ``x_test``, ``y_test``).
        target: ``"swap"`` (the chosen classes' heatmaps look like class ``like``'s),
            ``"pattern"`` (``pattern="square"|"cross"|"frame"``), ``"suppress"`` (the top
            ``top_k`` pixels emptied), for tables ``"suppress_feature"`` / ``"swap_features"``
            (``feature=``, ``like=``), for a model of token ids ``"suppress_token"`` (``token=``, a word).
        classes: the classes whose heatmaps move (indices or names); None: all.
        epochs: passes over the training data in the fine-tuning.
        batch_size: examples per update in the fine-tuning.
        composite: as :func:`heatinv.invert`.
        loss: as :func:`heatinv.invert`.
        optimizer: as :func:`heatinv.invert`.
        learning_rate: as :func:`heatinv.invert`.
        seed: as :func:`heatinv.invert`.
        test_split: the held-out share where ``data`` is not split already.
        vocabulary: for a model of token ids (its input integer ``[N, T]``, 0 padding): the
            word of each id (default: id ``i`` is the word ``"#i"``).
        feature_names: for a table (``x`` of shape ``[N, features]``): one name per column, which
            ``feature=`` and ``like=`` name and the figure shows (default ``"x0"``, ``"x1"``, ...).
        logdir: a folder for the run's files, as the command line writes them.
        **settings: any other key of the ``trainer``, ``lrp``, ``loss``, ``optimizer``,
            ``target`` or ``task`` config groups by its last name, e.g. ``like=0``,
            ``pattern="frame"``, ``heatmap_weight=1000``, ``early_stopping=True``,
            ``teacher="kl"``, ``normalize="max"``.

    Returns:
        A :class:`heatinv.run_result.RunResult`: ``.student``, ``.metrics`` (held-out
        ``cosine``, ``success_rate``, ``student_accuracy``, ``agreement``, ...), ``.history``
        (per epoch), ``.plot()``.

    Examples:
        >>> import heatinv  # doctest: +SKIP
        >>> result = heatinv.manipulate(cnn, (x, y), target="swap", classes=[1], like=0, epochs=30)  # doctest: +SKIP
        >>> result.metrics["cosine"], result.metrics["student_accuracy"]  # doctest: +SKIP
    """
    if target not in TARGETS:
        raise ValueError(f"manipulate() target={target!r} is not one of {list(TARGETS)}.")
    keras.utils.set_random_seed(seed)
    input_shape = tuple(reference.inputs[0].shape[1:])
    groups = ["task=dataset", "model=file", "init=reference", f"target={target}", f"loss={loss}", f"lrp={composite}",
              f"optimizer={optimizer}"]
    with run_folder(logdir, "heatinv-manipulate-") as out:
        values = {
            "model.path": IN_MEMORY, "task.epochs": epochs, "task.batch_size": batch_size, "task.classes": classes,
            "trainer.seed": seed, "data.test_split": test_split, "paths.output_dir": out, "paths.root": out,
            "paths.cache_dir": os.path.join(out, "cache"),
            **({"optimizer.lr": learning_rate} if learning_rate is not None else {}),
        }
        cfg = configured(groups, values, settings, "manipulate()", DATASET_GROUPS, REFUSED)
        if cfg.trainer.strategy == "multi_worker":
            raise ValueError(
                "manipulate() strategy='multi_worker' is not available from Python: a multi-worker job starts its "
                "strategy before TensorFlow's devices and has one process per worker. Run the dataset task on the "
                "command line with trainer.strategy=multi_worker (docs/sweeps.md), or use strategy='mirrored' here."
            )
        tokens = _token_model(reference)
        if vocabulary is not None and not tokens:
            raise ValueError(
                f"manipulate() vocabulary= names the ids of a model of token ids; this model takes inputs of shape "
                f"{input_shape} ({reference.inputs[0].dtype}). Leave vocabulary out."
            )
        dataset = _dataset(data, input_shape, test_split, seed, tokens, vocabulary, feature_names)
        cfg.data.name = dataset.name  # after validation: the run's config says where its data came from
        default_box_to_data_range(cfg, dataset)
        check_target_fits_data(cfg, dataset)
        student = copy_with_weights(reference, cfg.trainer.precision)
        parts = Parts(dataset, reference, accuracy(reference, dataset.x_test, dataset.y_test), student)
        task = DatasetTask(cfg, parts)
        metrics = run_held(cfg, parts, task, out, logdir, "manipulate()")
        return RunResult(parts.student, metrics, task.history, task.final_figure, logdir)


def _token_model(model: keras.Model) -> bool:
    """Whether ``model`` reads token ids (an integer input)."""
    return np.issubdtype(np.dtype(model.inputs[0].dtype), np.integer)


def _dataset(
    data, input_shape: tuple[int, ...], test_split: float, seed: int, tokens: bool = False, vocabulary=None, feature_names=None
) -> Dataset:
    """``data`` as a :class:`heatinv.data.Dataset` of examples shaped ``input_shape`` (``tokens``: ids, named by
    ``vocabulary``; a table's columns by ``feature_names``)."""
    if feature_names is not None and len(input_shape) != 1:
        raise ValueError(
            f"manipulate() feature_names= names the columns of a table; this model takes inputs of shape {input_shape}, "
            "not [features]. Leave feature_names= out."
        )
    if feature_names is not None and len(feature_names) != input_shape[0]:
        raise ValueError(
            f"manipulate() feature_names= has {len(feature_names)} names; the model takes {input_shape[0]} features. "
            "Give one name per column."
        )
    if feature_names is not None and isinstance(data, (str, os.PathLike)):
        raise ValueError(f"manipulate() data={os.fspath(data)!r} is a file; feature_names= names the columns of arrays. Leave it out.")
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if tokens:  # an .npz of ids (and optionally their words), as data=tokens reads it
            if vocabulary is not None:
                raise ValueError(f"manipulate() data={path!r} is a file: its words are its own 'vocabulary' array. Leave vocabulary= out.")
            return load_dataset("tokens", path)
        if os.path.isdir(path):
            color = "grayscale" if input_shape[-1] == 1 else "rgb"
            return load_dataset("folder", path, image_size=input_shape[:2], test_split=test_split, seed=seed, color_mode=color)
        return load_dataset("npz", path)
    if isinstance(data, tf.data.Dataset):
        shape = data.element_spec[0].shape
        grey_batch = len(shape) == len(input_shape) and input_shape[-1] == 1 and shape[0] is None  # [batch, H, W]
        if len(shape) == len(input_shape) + 1 or grey_batch:  # batched: one more axis than an example's
            data = data.unbatch()
        pairs = list(data.as_numpy_iterator())
        data = (np.stack([x for x, _ in pairs]), np.array([y for _, y in pairs]))
    first, second = data
    if isinstance(first, (tuple, list)) and len(first) == 2:  # ((x_train, y_train), (x_test, y_test))
        (x_train, y_train), (x_test, y_test) = first, second
    else:
        x, y = np.asarray(first), np.asarray(second)
        if y.ndim != 1 or len(y) != len(x):
            raise ValueError(
                f"manipulate() data holds x of shape {x.shape} and y of shape {y.shape}; expected one integer label per "
                "example, y of shape [N] (not one-hot)."
            )
        train, test = stratified_split(y, test_split)
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    arrays = []
    for name, x in (("x_train", x_train), ("x_test", x_test)):
        x = np.asarray(x, np.int32 if tokens else np.float32)
        if not tokens and x.shape[1:] == input_shape[:-1] and input_shape[-1] == 1:
            x = x[..., None]
        if x.shape[1:] != input_shape:
            raise ValueError(
                f"manipulate() data: {name} holds examples of shape {x.shape[1:]}; the model takes inputs of shape {input_shape}."
            )
        arrays.append(x)
    y_train, y_test = (np.asarray(y).astype(np.int64).reshape(-1) for y in (y_train, y_test))
    if tokens:
        largest = int(max(a.max(initial=0) for a in arrays))
        words = tuple(vocabulary) if vocabulary is not None else numbered_vocabulary(largest)
        if len(words) <= largest:
            raise ValueError(f"manipulate() vocabulary= has {len(words)} words but the ids reach {largest}; give one word per id.")
        return Dataset(arrays[0], y_train, arrays[1], y_test, "arrays", vocabulary=words, low=0.0, high=float(len(words)))
    low, high = value_range(*arrays)
    names = None if feature_names is None else tuple(map(str, feature_names))
    return Dataset(arrays[0], y_train, arrays[1], y_test, "arrays", feature_names=names, low=low, high=high)
