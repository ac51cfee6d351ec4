"""What a run needs, built from its config: data, the reference and student models, the explainer, targets.

Both tasks (one heatmap, a whole data set) and ``python -m heatinv.doctor`` build their parts
here, so the doctor diagnoses exactly what ``python -m heatinv.train`` would train. Nothing in
this module trains the student or writes a run's files.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import weakref
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf
from omegaconf import OmegaConf

from heatinv.channel_sum import ChannelSumLRP
from heatinv.config import ConfigError
from heatinv.data import COLOR_MODES, TEXT_NAMES, Dataset, load_dataset, reading
from heatinv.feature_targets import FEATURE_KINDS, feature_index
from heatinv.token_targets import TOKEN_KINDS, token_id, token_share
from heatinv.dataset_targets import dataset_targets
from heatinv.explanation_cache import cached_explanations
from heatinv.lrp import LRP
from heatinv.models import (
    REFERENCE_SEED,
    Architecture,
    accuracy,
    build_model,
    load_model_file,
    reference_model,
    smoothed,
    vocabulary_size,
    with_dtype,
    with_input_shape,
)
from heatinv.progress import Progress
from heatinv.maps_io import read_map
from heatinv.targets import Target, build_target, file_map, pattern_file, target_image, unit_total
from heatinv.wording import as_command_line

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)


@dataclass
class Parts:
    """The data and models every run starts from.

    Attributes:
        dataset: the training and held-out images (None: :func:`heatinv.inversion.invert` without data).
        reference: the trained reference (or the user's model file).
        reference_accuracy: its held-out accuracy (None without data).
        student: the model whose weights the run optimizes.
    """

    dataset: Dataset | None
    reference: keras.Model
    reference_accuracy: float | None
    student: keras.Model


def _class_list(names, shown: int = 12) -> str:
    """``0 '0', 1 '1', ...``: the index target.label and task.classes take, and the class's name."""
    pairs = [f"{i} {name!r}" for i, name in enumerate(names)]
    return ", ".join(pairs if len(pairs) <= shown else [*pairs[: shown - 1], "...", pairs[-1]])


def build_parts(cfg) -> Parts:
    """A fresh Keras state seeded with ``trainer.seed``, the data, the reference and the student.

    Examples:
        >>> parts = build_parts(cfg)  # doctest: +SKIP
        >>> parts.student.count_params() == parts.reference.count_params()  # doctest: +SKIP
        True
    """
    keras.backend.clear_session()  # Hydra's basic launcher runs a sweep's jobs in one process
    keras.utils.set_random_seed(cfg.trainer.seed)
    d = cfg.data
    dataset = load_dataset(
        d.name, d.path, image_size=tuple(d.image_size), test_split=d.test_split, label_column=d.label_column, seed=cfg.trainer.seed,
        color_mode=d.color_mode, text_column=d.text_column, max_tokens=d.max_tokens, length=d.length,
        vocabulary=saved_vocabulary(cfg),
    )
    log.info(
        f"heatinv: data {dataset.name}: {len(dataset.x_train)} training and {len(dataset.x_test)} held-out examples of "
        f"shape {dataset.input_shape}, {dataset.num_classes} classes ({_class_list(dataset.class_names)})"
    )
    default_box_to_data_range(cfg, dataset)
    check_target_fits_data(cfg, dataset)
    if cfg.model.name == "file":
        reference = load_model_file(cfg.model.path)
        check_model_fits(reference, dataset, cfg.model.path)
        reference = with_input_shape(reference, dataset.input_shape)
        reference_acc = accuracy(reference, dataset.x_test, dataset.y_test)
        _warn_if_no_better_than_guessing(reference_acc, dataset, f"model.path={cfg.model.path}")
        student = keras.models.clone_model(reference)  # fresh initial weights, same architecture
        if cfg.model.activation == "softplus":  # the file's model stays the reference, explained as saved
            student = smoothed(student, cfg.model.beta)
    else:
        reference, reference_acc = reference_model(
            architecture(cfg), dataset, cfg.model.reference_epochs, cfg.paths.cache_dir, seed=REFERENCE_SEED, weights=cfg.model.weights
        )
        if cfg.model.weights:
            _warn_if_no_better_than_guessing(reference_acc, dataset, f"model.weights={cfg.model.weights}")
        student = build_model(
            architecture(cfg), dataset.num_classes, seed=cfg.trainer.seed, input_shape=dataset.input_shape,
            vocabulary=vocabulary_size(dataset),
        )
    if cfg.init.kind == "reference":
        student.set_weights(reference.get_weights())
    if cfg.trainer.precision == "float64":
        student = with_dtype(student, "float64")
    return Parts(dataset, reference, reference_acc, student)


VOCABULARY = "vocabulary.json"
"""A text run's vocabulary, written when it begins: the words of its token ids, reused on resume."""


def saved_vocabulary(cfg) -> list[str] | None:
    """A resumed text run's vocabulary (its ids must mean the words they meant), else None."""
    if cfg.data.name not in TEXT_NAMES or not cfg.trainer.resume:  # the run folder is read only where needed: a script's may be unset
        return None
    path = os.path.join(cfg.paths.output_dir, VOCABULARY)
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def _warn_if_no_better_than_guessing(acc: float, dataset: Dataset, given: str) -> None:
    """A model of the user's own that scores no better than always naming the commonest class.

    Its heatmaps explain noise. The usual cause is a range: heatinv gives images in [0, 1],
    while a Keras model trained on ``image_dataset_from_directory``'s 0-255 pixels carries its
    own ``Rescaling(1/255)``.
    """
    guess = float(np.max(np.bincount(dataset.y_test, minlength=dataset.num_classes))) / len(dataset.y_test)
    if acc > guess:
        return
    images = (
        " (an image folder's and uint8 images are scaled to [0, 1]; keras.utils.image_dataset_from_directory gives "
        "0-255, so a model with its own Rescaling(1/255) sees them 255 times too dark: give such images as an .npz "
        "of float32 values 0-255, data=npz, which are taken as they are)"
        if dataset.is_image else ""
    )
    log.warning(
        f"heatinv: the model of {given} classifies {acc:.1%} of the {dataset.name} data's held-out examples right, "
        f"no better than always naming its commonest class ({guess:.1%}): its heatmaps will explain noise. Was it "
        f"trained on this data, in this range? Here the inputs range from {np.min(dataset.low):.3g} to "
        f"{np.max(dataset.high):.3g}{images}."
    )


def default_box_to_data_range(cfg, dataset: Dataset) -> None:
    """Set ``lrp.low``/``lrp.high`` left unset (null) to the data's range, and say so.

    The ``zbox`` rule's box must hold every input it explains; the data's own range (per
    channel or feature where it differs) does, whatever the data. A value the user set stays.
    """
    from omegaconf import open_dict

    if dataset.is_text:  # token ids have no box: the zbox rule does not apply to them
        return
    for key, value in (("low", dataset.low), ("high", dataset.high)):
        if cfg.lrp[key] is None:
            plain = float(value) if np.ndim(value) == 0 else [round(float(v), 6) for v in np.ravel(value)]
            with open_dict(cfg):
                cfg.lrp[key] = plain
            shown = plain if np.ndim(value) == 0 else f"{len(plain)} values, one per channel/feature, from {min(plain):.3g} to {max(plain):.3g}"
            log.info(f"heatinv: lrp.{key} = {shown} (the {dataset.name} data's range; set lrp.{key} to override)")
    low, high = np.asarray(cfg.lrp.low, np.float64), np.asarray(cfg.lrp.high, np.float64)
    if low.shape != high.shape and low.size > 1 and high.size > 1 or not np.all(low <= high):
        raise ConfigError(
            f"Config values lrp.low={cfg.lrp.low} and lrp.high={cfg.lrp.high} do not make an input box (low <= high, "
            f"a float or one value per channel/feature); the {dataset.name} data ranges from {np.min(dataset.low):.3g} "
            f"to {np.max(dataset.high):.3g}. Set both, or leave them unset (null) to use the data's range."
        )


def check_target_fits_data(cfg, dataset: Dataset) -> None:
    """The target can be made for this data: a pattern needs images; the single task's held-out
    example (``target.label``, ``target.index``) must exist.

    Checked before the reference trains, so a label of another data set (``target=digit7``,
    the default, is class 7 of the digits) fails at once, with the classes this data has.
    """
    target = cfg.target
    if target.kind == "pattern" and not dataset.is_image:
        fix = (
            "For texts use target=tokens target.positions=[...] (task=single) or target=suppress_token target.token=<word> "
            "(either task)." if dataset.is_text else
            "For a table use target=class (task=single), or target=suppress_feature / target=swap_features with "
            "target.feature=<name> (either task)."
        )
        raise ConfigError(
            f"target=pattern draws on images; the {dataset.name} data gives "
            f"{'token ids' if dataset.is_text else 'feature vectors'} of shape {dataset.input_shape}. {fix}"
        )
    shape = dataset.input_shape
    _read_target_files(cfg, dataset)
    feature_options(cfg, dataset)  # the feature names of a table's target
    entries = int(np.prod(shape[:-1] if dataset.is_image and target.channels == "sum" else shape))
    if target.kind == "suppress" and target.top_k >= entries:
        what = "features" if not dataset.is_image else "pixels" if target.channels == "sum" else "pixel channels"
        raise ConfigError(
            f"Config value target.top_k={target.top_k} would empty all {entries} {what} of a {dataset.name} heatmap, "
            f"leaving no relevance to compare. Set target.top_k below {entries} "
            f"(e.g. target.top_k={max(1, entries // 10)})."
        )
    names = ", ".join(f"{i} ({name})" if str(name) != str(i) else str(i) for i, name in enumerate(dataset.class_names))
    if cfg.task.kind == "dataset":
        _check_dataset_classes(cfg, dataset, names)
        return
    label = target_class(cfg, dataset)
    if target.get("image"):
        return
    if label >= dataset.num_classes:
        example = "target=class target.label=0" if target.kind == "class" else f"target.label=0 (with target={target.kind})"
        default = " (target=digit7, the default, is the digits' shorthand for target=class target.label=7)" if label == 7 else ""
        raise ConfigError(
            f"Config value target.label={target.label} is not a class of the {dataset.name} data, whose labels are "
            f"{names}{default}. Pick one of this data's classes, e.g. {example}."
        )
    count = int(np.count_nonzero(np.asarray(dataset.y_test) == label))
    if count == 0:
        held = ", ".join(str(c) for c in np.unique(np.asarray(dataset.y_test)))
        where = f"the held-out examples are of classes {held}. Pick one of those" if held else "it has no held-out examples at all. Add some"
        raise ConfigError(
            f"Config value target.label={target.label!r} is a class of the {dataset.name} data with no held-out "
            f"example, so there is no image of it to explain; {where}, or hold out examples of this class too."
        )
    if target.index >= count:
        raise ConfigError(
            f"Config value target.index={target.index} asks for held-out example {target.index} (counting from 0) of "
            f"class {target.label!r}, but the {dataset.name} data holds {count} held-out examples of that class; pick "
            f"target.index from 0 to {count - 1}, or another target.label."
        )


def class_index(value, key: str, dataset: Dataset) -> int:
    """A class that ``key`` names (``target.label``, ``target.like``, ``task.classes``) as its index.

    Given as an index, or by its name in the data (a csv's label, a folder's subfolder).

    Examples:
        >>> class_index("yes", "target.label", load_csv("t.csv", "outcome"))  # doctest: +SKIP
        1
    """
    if not isinstance(value, str):
        return int(value)
    if value in dataset.class_names:
        return list(dataset.class_names).index(value)
    raise ConfigError(
        f"Config value {key}={value!r} is not a class of the {dataset.name} data, whose classes are "
        f"{_class_list(dataset.class_names)}. Give one of these names, or its index (e.g. {key}="
        f"{'[0]' if key == 'task.classes' else 0})."
    )


def target_class(cfg, dataset: Dataset) -> int:
    """``target.label`` as a class index (:func:`class_index`)."""
    return class_index(cfg.target.label, "target.label", dataset)


def moved_classes(cfg, dataset: Dataset) -> list[int] | None:
    """``task.classes`` as class indices, or None for all classes."""
    return None if cfg.task.classes is None else [class_index(c, "task.classes", dataset) for c in cfg.task.classes]


def like_class(cfg, dataset: Dataset) -> int:
    """``swap``'s ``target.like`` as a class index."""
    return class_index(cfg.target.like, "target.like", dataset)


def _read_target_files(cfg, dataset: Dataset) -> None:
    """Read the target's own files as the target will, so a missing or misfitting one fails before the reference trains."""
    target, shape = cfg.target, dataset.input_shape
    map_shape = shape[:-1] + (1,) if dataset.is_image and target.channels == "sum" else shape
    if target.kind == "file":
        file_map(target.path, shape, map_shape)
        if target.image:
            target_image(target.image, shape)
    elif target.kind == "pattern" and target.pattern == "file":
        if cfg.task.kind == "single":
            pattern_file(target.path, shape)
        else:
            unit_total(read_map(target.path, expected_shape=map_shape, what="target.path"), target.path)


def _check_dataset_classes(cfg, dataset: Dataset, names: str) -> None:
    """``task.classes`` and ``swap``'s ``target.like`` name classes this data has, and a swap moves something."""
    classes = moved_classes(cfg, dataset) or []
    asked = [("task.classes", as_command_line(cfg.task.classes), c) for c in classes]
    like = like_class(cfg, dataset) if cfg.target.kind == "swap" else None
    if like is not None:
        asked.append(("target.like", cfg.target.like, like))
    for key, value, label in asked:
        if not 0 <= label < dataset.num_classes:
            raise ConfigError(
                f"Config value {key}={value} names class {label}, which the {dataset.name} data does not have; its "
                f"labels are {names}. Pick from these (e.g. {key}={'[0]' if key == 'task.classes' else 0})."
            )
        if key == "task.classes" and not np.any(np.asarray(dataset.y_test) == label):
            raise ConfigError(
                f"Config value task.classes={value} names class {label}, which the {dataset.name} data's held-out "
                f"split does not hold, so no held-out heatmap of it could be measured. Name classes the held-out "
                f"split has (labels {sorted(set(np.asarray(dataset.y_test).tolist()))}), or give that class "
                "held-out examples."
            )
        if key == "target.like" and not np.any(np.asarray(dataset.y_train) == label):
            raise ConfigError(
                f"Config value target.like={value!r}: the {dataset.name} data has no training example of that class to "
                f"take the mean heatmap from. Pick a class with training examples: {names}."
            )
    if like is not None and classes and set(classes) == {like}:
        other = next(i for i in range(dataset.num_classes) if i not in classes)
        raise ConfigError(
            f"Config values target.like={cfg.target.like!r} and task.classes={as_command_line(cfg.task.classes)} make class "
            f"{_class_name(classes[0], dataset.class_names)}'s heatmaps look like its own mean: nothing would be "
            f"manipulated. Move another class, e.g. task.classes=[{other}], or take the mean of another (target.like)."
        )


def architecture(cfg) -> Architecture:
    """The ``model`` config group as an :class:`~heatinv.models.Architecture`."""
    m = cfg.model
    return Architecture(
        m.name, tuple(m.hidden), tuple(m.filters), m.activation, m.output_activation, m.l2, m.beta, m.pool, m.patch, m.dim,
        m.depth, m.heads,
    )


def check_model_fits(model: keras.Model, dataset: Dataset, path: str) -> None:
    """A user's model must take the dataset's inputs (a size left open, None, fits any) and score its classes."""
    inputs, outputs = list(getattr(model, "inputs", None) or []), list(getattr(model, "outputs", None) or [])
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(
            f"Model file {path} (model.path) has {len(inputs)} inputs of shapes {[tuple(x.shape) for x in inputs]} "
            f"and {len(outputs)} outputs of shapes {[tuple(y.shape) for y in outputs]}; heatinv explains a model with "
            "one input and one output of class scores. Save the part to explain as its own model, e.g. "
            "keras.Model(model.inputs[0], model.outputs[k]).save('<name>.keras'), and point model.path at it."
        )
    expected_in = (None,) + dataset.input_shape
    given_in, given_out = tuple(inputs[0].shape), tuple(outputs[0].shape)
    fits = len(given_in) == len(expected_in) and all(g is None or g == e for g, e in zip(given_in, expected_in))
    if not fits or given_out[-1] != dataset.num_classes:
        raise ValueError(
            f"Model file {path} (model.path) takes inputs of shape {given_in} and gives outputs of shape "
            f"{given_out}; the {dataset.name} data needs inputs {expected_in} and {dataset.num_classes} outputs "
            f"(shape (None, {dataset.num_classes})). Rebuild the model for inputs {dataset.input_shape} and "
            f"{dataset.num_classes} classes, or choose the data it was made for (data=...){_folder_hint(given_in, dataset)}."
        )


def _folder_hint(given_in: tuple, dataset: Dataset) -> str:
    """For an image folder whose images the model takes at another size or in another colour mode: the settings that read them so."""
    if not dataset.streamed or len(given_in) != 4 or None in given_in[1:]:
        return ""
    mode = {channels: name for name, channels in COLOR_MODES.items()}.get(given_in[3])
    size = f"data.image_size=[{given_in[1]},{given_in[2]}]" if tuple(given_in[1:3]) != tuple(dataset.input_shape[:2]) else None
    color = f"data.color_mode={mode}" if given_in[3] != dataset.input_shape[-1] else None
    if (given_in[3] != dataset.input_shape[-1] and mode is None) or not (size or color):
        return ""  # channels no colour mode gives, or the size and channels fit: the class count does not
    if size and color:
        return f", or have the folder's images read as the model takes them: {size} {color}"
    if size:
        return f", or have the folder's images resized to the model's size: {size}"
    return f", or have the folder's images read in the model's colour mode: {color}"


def explainer_for(model: keras.Model, cfg) -> LRP:
    """The LRP explainer the ``lrp`` config group describes, bound to ``model``."""
    c = cfg.lrp
    # Unset outside build_parts (a test composing a config by hand): the [0, 1] of images.
    low = 0.0 if c.low is None else np.asarray(c.low, np.float32)
    high = 1.0 if c.high is None else np.asarray(c.high, np.float32)
    shape = tuple(model.inputs[0].shape)
    summed = cfg.target.channels == "sum" and len(shape) == 4 and shape[-1] > 1
    explainer = ChannelSumLRP if summed else LRP
    return explainer(model, c.composite, low=low, high=high, epsilon=c.epsilon, gamma=c.gamma, output=c.output, recompute=c.recompute)


def single_target(cfg, dataset: Dataset, reference: keras.Model) -> Target:
    """The single task's input image, label and target heatmap (``target`` config group)."""
    t = cfg.target
    return build_target(
        t.kind,
        dataset,
        explainer_for(reference, cfg) if t.kind in ("class",) + FEATURE_KINDS + TOKEN_KINDS else None,
        label=target_class(cfg, dataset),
        index=t.index,
        path=t.path,
        image=t.image,
        pattern=t.pattern,
        scale=t.scale,
        channels=t.channels,
        positions=t.positions,
        **feature_options(cfg, dataset),
    )


def feature_options(cfg, dataset: Dataset) -> dict:
    """``feature`` and ``like_feature`` positions for the tabular targets, ``token`` (an id) for the text ones (``{}`` for the others)."""
    t = cfg.target
    if t.kind in TOKEN_KINDS:
        if not dataset.is_text:
            raise ValueError(
                f"target={t.kind} moves the relevance of a word of texts; the {dataset.name} data gives "
                f"{'images' if dataset.is_image else 'feature vectors'} of shape {dataset.input_shape}. Use texts "
                "(data=text, data=tokens or data=protected_text), or for a table target=suppress_feature."
            )
        token = token_id(dataset.vocabulary, t.token)
        if cfg.task.kind == "dataset" and not np.any(np.asarray(dataset.x_train) == token):
            raise ConfigError(
                f"Config value target.token={t.token!r} is a word of the vocabulary that no training example of the "
                f"{dataset.name} data holds, so no explanation would move. Name a word the texts use."
            )
        return {"token": token}
    if t.kind == "tokens" and not dataset.is_text:
        raise ValueError(
            f"target=tokens places relevance on token positions; the {dataset.name} data gives examples of shape "
            f"{dataset.input_shape}, not texts. For images use target=pattern."
        )
    if t.kind not in FEATURE_KINDS:
        return {}
    if dataset.is_image or dataset.is_text:
        raise ValueError(
            f"target={t.kind} moves the relevance of a table's feature; the {dataset.name} data gives "
            f"{'images' if dataset.is_image else 'token ids'} of shape "
            f"{dataset.input_shape}. Use a table (data=tabular or data=csv), or target=pattern/swap/suppress "
            "(texts: target=suppress_token)."
        )
    feature = feature_index(dataset.feature_names, t.feature, "target.feature")
    like = feature_index(dataset.feature_names, t.like, "target.like") if t.kind == "swap_features" else None
    return {"feature": feature, "like_feature": like}


@dataclass
class ProblemBatch:
    """A batch of held-out (or training) examples with what the dataset task compares on them.

    Attributes:
        x: ``[b, *input_shape]`` the examples.
        labels: ``[b]`` their classes.
        reference_maps: ``[b, H, W, 1]`` (or ``[b, d]``) the reference's heatmaps.
        reference_logits: ``[b, classes]`` the reference's logits.
        targets: the heatmaps the student should give.
        chosen: ``[b]`` bool, the examples whose heatmaps should move.
    """

    x: np.ndarray
    labels: np.ndarray
    reference_maps: np.ndarray
    reference_logits: np.ndarray
    targets: np.ndarray
    chosen: np.ndarray


@dataclass
class DatasetProblem:
    """The dataset task's targets, from the reference's heatmaps of every image, held in memory.

    Attributes:
        train_targets: ``[N, H, W, 1]`` the heatmap each training image should get.
        train_logits: ``[N, classes]`` the reference's logits (the logit-match term).
        train_chosen: ``[N]`` bool, the training images whose heatmaps should move.
        test_maps: ``[M, H, W, 1]`` the reference's held-out heatmaps (for the figure).
        test_logits: ``[M, classes]`` the reference's held-out logits.
        test_targets: ``[M, H, W, 1]`` held-out targets.
        test_chosen: ``[M]`` bool, the held-out images whose heatmaps should move.
        description: e.g. ``pattern frame (classes [1])``.
    """

    train_targets: np.ndarray
    train_logits: np.ndarray
    train_chosen: np.ndarray
    test_maps: np.ndarray
    test_logits: np.ndarray
    test_targets: np.ndarray
    test_chosen: np.ndarray
    description: str

    def test_batches(self, dataset: Dataset, batch_size: int = 256) -> Iterator[ProblemBatch]:
        """The held-out split in batches, with its reference heatmaps and targets (slices of the arrays)."""
        for start in range(0, len(dataset.y_test), batch_size):
            part = slice(start, start + batch_size)
            yield ProblemBatch(
                dataset.x_test[part], dataset.y_test[part], self.test_maps[part], self.test_logits[part],
                self.test_targets[part], self.test_chosen[part],
            )


@dataclass
class StreamedProblem:
    """The dataset task's targets for an image folder, batch by batch, from the frozen reference's cached explanations.

    Nothing of the whole split is held: the reference's heatmaps and logits of each split are
    computed once and read memory-mapped from the cache
    (:func:`~heatinv.explanation_cache.cached_explanations`); each batch is decoded, reads its
    own rows, and gets its targets from :func:`~heatinv.dataset_targets.dataset_targets`, whose
    every target depends on its own image only (``swap``'s class mean is computed once, in ``options``).

    Attributes:
        explainer: the reference's explainer.
        kind, classes, options: the arguments of ``dataset_targets``.
        description: e.g. ``pattern frame (classes [1])``.
        explanations: ``{split: (heatmaps, logits)}``, the memory-mapped cache entries.
    """

    explainer: LRP
    kind: str
    classes: list[int] | None
    options: dict
    description: str
    explanations: dict

    def batches(self, dataset: Dataset, split: str, batch_size: int, order: np.ndarray | None = None) -> Iterator[ProblemBatch]:
        """A split's batches (in ``order``), each decoded and given its cached reference explanations and targets as it is reached."""
        all_maps, all_logits = self.explanations[split]
        positions = np.arange(len(all_maps)) if order is None else np.asarray(order)
        with reading(getattr(dataset, f"x_{split}")):
            pipeline = dataset.batches(split, batch_size, positions).prefetch(2)
            for start, (x, labels) in zip(range(0, len(positions), batch_size), pipeline):
                rows = positions[start : start + batch_size]
                maps, logits = np.asarray(all_maps[rows]), np.asarray(all_logits[rows])
                labels = labels.numpy().astype(np.int64)
                targets, chosen = dataset_targets(self.kind, labels, maps, self.classes, **self.options)
                yield ProblemBatch(x.numpy(), labels, maps, logits, targets, chosen)

    def test_batches(self, dataset: Dataset, batch_size: int = 256) -> Iterator[ProblemBatch]:
        """The held-out split in batches, with its reference heatmaps and targets."""
        return self.batches(dataset, "test", batch_size)


def dataset_problem(cfg, dataset: Dataset, reference: keras.Model) -> DatasetProblem | StreamedProblem:
    """The dataset task's targets from the reference's heatmaps: all at once, or batch by batch for an image folder."""
    t = cfg.task
    target = cfg.target
    classes = moved_classes(cfg, dataset)
    like = like_class(cfg, dataset) if target.kind == "swap" else target.like
    explainer = explainer_for(reference, cfg)
    options = dict(
        pattern=target.pattern, pattern_path=target.path, like=like, top_k=target.top_k, **feature_options(cfg, dataset)
    )
    names = dataset.class_names
    chosen = "all classes" if classes is None else "classes [" + ", ".join(_class_name(c, names) for c in classes) + "]"
    description = f"{target_detail(target, names, like if target.kind == 'swap' else None)} ({chosen})"
    if dataset.streamed:
        explain = _compiled_explain(explainer, dataset.input_shape)
        lrp_settings = OmegaConf.to_container(cfg.lrp, resolve=True)
        explanations = {
            split: cached_explanations(explain, explainer, dataset, split, cfg.paths.cache_dir, lrp_settings) for split in ("train", "test")
        }
        if target.kind == "swap":
            options["like_mean"] = class_mean(explanations["train"][0], dataset.y_train, like)
        return StreamedProblem(explainer, target.kind, classes, options, description, explanations)
    train_maps, train_logits = explain_all(explainer, dataset.x_train, dataset.y_train, "the training set")
    test_maps, test_logits = explain_all(explainer, dataset.x_test, dataset.y_test, "the held-out set")
    ids = {"train": dataset.x_train, "test": dataset.x_test} if dataset.is_text else {"train": None, "test": None}
    train_targets, train_chosen = dataset_targets(target.kind, dataset.y_train, train_maps, classes, ids=ids["train"], **options)
    test_targets, test_chosen = dataset_targets(
        target.kind, dataset.y_test, test_maps, classes, like_heatmaps=(dataset.y_train, train_maps), ids=ids["test"], **options
    )
    return DatasetProblem(
        train_targets, train_logits.astype(np.float32), train_chosen, test_maps, test_logits, test_targets, test_chosen, description
    )


DATASET_EXAMPLES = 16
"""``task=dataset``: how many held-out examples a diagnosis differentiates the heatmap term on (a
batch, so a finding can say for how many of them a cause holds)."""


def moved_examples(problem: DatasetProblem | StreamedProblem, dataset: Dataset, count: int = DATASET_EXAMPLES):
    """The first ``count`` held-out examples whose heatmaps the dataset task's target moves.

    Returns:
        ``(x [n, *input_shape], labels [n], targets [n, *map_shape])``, ``n <= count``.

    Raises:
        ConfigError: the target moves no held-out example (``task.classes`` absent from the split).
    """
    xs, labels, targets = [], [], []
    found = 0
    for batch in problem.test_batches(dataset):
        keep = np.flatnonzero(batch.chosen)[: count - found]
        xs.append(batch.x[keep])
        labels.append(batch.labels[keep])
        targets.append(batch.targets[keep])
        found += len(keep)
        if found == count:
            break
    if not found:
        raise ConfigError(
            f"The dataset task's target ({problem.description}) moves no held-out example of the {dataset.name} data, "
            "so there is no heatmap term to differentiate. Name in task.classes classes the held-out split has."
        )
    return np.concatenate(xs), np.concatenate(labels), np.concatenate(targets)


def _class_name(index: int, names) -> str:
    """``1``, or ``1 (disk)`` where the class has a name of its own."""
    name = str(names[index]) if names is not None and 0 <= index < len(names) else str(index)
    return str(index) if name == str(index) else f"{index} ({name})"


def target_detail(target, class_names=None, like: int | None = None) -> str:
    """The dataset task's target in words, e.g. ``pattern frame``, ``swap like class 0 (cat)``, ``suppress_feature 'worst area'``.

    ``like``: swap's class as an index, where ``target.like`` names it (:func:`like_class`).
    """
    match target.kind:
        case "pattern":
            detail = f"file {target.path}" if target.pattern == "file" else f"{target.pattern}"
        case "swap":
            detail = f"like class {_class_name(target.like if like is None else like, class_names)}"
        case "suppress":
            detail = f"top {target.top_k}"
        case "suppress_feature":
            detail = f"{target.feature!r}"
        case "swap_features":
            detail = f"{target.feature!r} like {target.like!r}"
        case "suppress_token":
            detail = f"{target.token!r}"
        case _:
            raise ValueError(f"target.kind={target.kind!r}: not a dataset target kind.")
    return f"{target.kind} {detail}"


def class_mean(maps: np.ndarray, labels: np.ndarray, label: int, batch_size: int = 256) -> np.ndarray:
    """The mean of ``maps`` (``[N, ...]``, e.g. a memory-mapped cache entry) over the images of class ``label``.

    Summed in float64, ``batch_size`` rows at a time, so a memory-mapped split is never read whole.

    Examples:
        >>> class_mean(np.arange(6.0).reshape(3, 2), np.array([0, 1, 0]), 0).tolist()
        [2.0, 3.0]
    """
    positions = np.flatnonzero(labels == label)
    if len(positions) == 0:
        raise ValueError(f"target.like={label}: no training images of class {label} to take heatmaps from.")
    total = sum(np.asarray(maps[positions[i : i + batch_size]], np.float64).sum(axis=0) for i in range(0, len(positions), batch_size))
    return (total / len(positions)).astype(np.float32)


def explain_all(
    explainer: LRP, x: np.ndarray, labels: np.ndarray, what: str | None = None, batch_size: int = 256
) -> tuple[np.ndarray, np.ndarray]:
    """Heatmaps (for each example's label) and logits of a whole array, in compiled batches.

    Args:
        what: names the examples (images, or a table's rows) in a progress report (None: no report).

    Returns:
        ``(heatmaps [N, *input_shape], logits [N, classes])``.

    Examples:
        >>> maps, logits = explain_all(LRP(model), dataset.x_test, dataset.y_test)  # doctest: +SKIP
    """
    explain = _compiled_explain(explainer, x.shape[1:], tf.int32 if np.issubdtype(x.dtype, np.integer) else tf.float32)
    progress = Progress(f"explaining {what}", len(x), "images" if x.ndim == 4 else "examples") if what else None
    maps, logits = [], []
    for start in range(0, len(x), batch_size):
        R, z = explain(x[start : start + batch_size], labels[start : start + batch_size].astype(np.int32))
        maps.append(R.numpy())
        logits.append(z.numpy())
        if progress:
            progress.update(min(start + batch_size, len(x)))
    return np.concatenate(maps), np.concatenate(logits)


_EXPLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _compiled_explain(explainer: LRP, input_shape, dtype=tf.float32) -> tf.types.experimental.GenericFunction:
    """One compiled ``(batch, labels) -> (heatmaps, logits)`` per explainer, input shape and dtype, reused across calls.

    ``dtype``: ``tf.float32``, or ``tf.int32`` for token ids (an embedding's input stays ids).

    The dataset task explains the held-out set after every epoch; a new ``tf.function`` each
    time would retrace every time.
    """
    functions = _EXPLAIN.setdefault(explainer, {})
    key = (tuple(input_shape), dtype)
    if key not in functions:
        signature = [tf.TensorSpec((None,) + key[0], dtype), tf.TensorSpec((None,), tf.int32)]
        owner = weakref.ref(explainer)  # the cache must not keep the explainer (and its model) alive

        @tf.function(input_signature=signature, autograph=False)
        def explain(batch, batch_labels):
            explanation = owner().explain(batch, batch_labels)
            return explanation.relevance, explanation.logits

        functions[key] = explain
    return functions[key]


def feature_report(cfg, dataset: Dataset, problem: DatasetProblem, student_maps: np.ndarray, student_logits: np.ndarray,
                   reference_classes: np.ndarray, what: str) -> tuple[dict, "Figure"]:
    """A table's held-out metrics and its figure: the moved feature's share of |relevance| and the agreement.

    Returns:
        ``(metrics, figure)``: ``reference_feature_share`` and ``feature_share`` (of the
        feature ``target.feature``, over the held-out examples), ``agreement`` (the share of
        held-out examples where student and reference predict the same class), and bars of the
        mean relevance per feature (reference, target, student).
    """
    from heatinv.feature_targets import feature_share
    from heatinv.figures import feature_figure

    metrics = {"agreement": float(np.mean(np.asarray(reference_classes) == np.argmax(student_logits, axis=-1)))}
    if cfg.target.kind in FEATURE_KINDS:
        feature = feature_options(cfg, dataset)["feature"]
        metrics["reference_feature_share"] = feature_share(problem.test_maps, feature)
        metrics["feature_share"] = feature_share(student_maps, feature)
    chosen = problem.test_chosen
    maps = {
        "reference": problem.test_maps[chosen].mean(axis=0),
        "target": problem.test_targets[chosen].mean(axis=0),
        "student": student_maps[chosen].mean(axis=0),
    }
    figure = feature_figure(dataset.feature_names, maps, f"mean relevance per feature, held-out: {what}")
    return metrics, figure


def token_report(cfg, dataset: Dataset, problem: DatasetProblem, student_maps: np.ndarray, student_logits: np.ndarray,
                 reference_classes: np.ndarray, what: str, shown: int = 4) -> tuple[dict, "Figure"]:
    """A text's held-out metrics and its figure: the moved word's share of |relevance| and the agreement.

    Returns:
        ``(metrics, figure)``: ``agreement``; for ``suppress_token``, ``reference_token_share``
        and ``token_share`` (of the word ``target.token``, over the held-out texts); and the
        first ``shown`` moved held-out texts (those holding the word, for ``suppress_token``),
        each coloured by the reference's, the target's and the student's relevance.
    """
    from heatinv.data.text import words
    from heatinv.figures import texts_figure

    metrics = {"agreement": float(np.mean(np.asarray(reference_classes) == np.argmax(student_logits, axis=-1)))}
    picked = problem.test_chosen
    if cfg.target.kind in TOKEN_KINDS:
        token = feature_options(cfg, dataset)["token"]
        metrics["reference_token_share"] = token_share(problem.test_maps, dataset.x_test, token)
        metrics["token_share"] = token_share(student_maps, dataset.x_test, token)
        picked = picked & np.any(dataset.x_test == token, axis=1)
    texts = [
        (
            f"held-out #{i}, class {_class_name(int(dataset.y_test[i]), dataset.class_names)}",
            words(dataset.x_test[i], dataset.vocabulary),
            {"reference": problem.test_maps[i], "target": problem.test_targets[i], "student": student_maps[i]},
        )
        for i in np.flatnonzero(picked)[:shown]
    ]
    shares = (
        f"; {cfg.target.token!r} share of |relevance| {metrics['reference_token_share']:.2%} (reference), "
        f"{metrics['token_share']:.2%} (student)" if "token_share" in metrics else ""
    )
    return metrics, texts_figure(texts, f"held-out: {what}{shares}")
