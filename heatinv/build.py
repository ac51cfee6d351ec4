"""What a run needs, built from its config: data, the reference and student models, the explainer, targets.

Both tasks (one heatmap, a whole data set) and ``python -m heatinv.doctor`` build their parts
here, so the doctor diagnoses exactly what ``python -m heatinv.train`` would train. Nothing in
this module trains the student or writes a run's files.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from heatinv.data import Dataset, load_dataset
from heatinv.dataset_targets import dataset_targets
from heatinv.lrp import LRP
from heatinv.models import Architecture, accuracy, build_model, load_model_file, reference_model
from heatinv.progress import Progress
from heatinv.targets import Target, build_target


@dataclass
class Parts:
    """The data and models every run starts from.

    Attributes:
        dataset: the training and held-out images.
        reference: the trained reference (or the user's model file).
        reference_accuracy: its held-out accuracy.
        student: the model whose weights the run optimizes.
    """

    dataset: Dataset
    reference: keras.Model
    reference_accuracy: float
    student: keras.Model


def build_parts(cfg) -> Parts:
    """A fresh Keras state seeded with ``trainer.seed``, the data, the reference and the student.

    Example:
    >>> parts = build_parts(cfg)  # doctest: +SKIP
    >>> parts.student.count_params() == parts.reference.count_params()  # doctest: +SKIP
    True
    """
    keras.backend.clear_session()  # Hydra's basic launcher runs a sweep's jobs in one process
    keras.utils.set_random_seed(cfg.trainer.seed)
    dataset = load_dataset(cfg.data.name, cfg.data.path)
    if cfg.model.name == "file":
        reference = load_model_file(cfg.model.path)
        check_model_fits(reference, dataset, cfg.model.path)
        reference_acc = accuracy(reference, dataset.x_test, dataset.y_test)
        student = keras.models.clone_model(reference)  # fresh initial weights, same architecture
    else:
        reference, reference_acc = reference_model(
            architecture(cfg), dataset, cfg.model.reference_epochs, cfg.paths.cache_dir, seed=0
        )
        student = build_model(architecture(cfg), dataset.num_classes, seed=cfg.trainer.seed)
    if cfg.init.kind == "reference":
        student.set_weights(reference.get_weights())
    if cfg.trainer.precision == "float64":
        student = in_float64(student)
    return Parts(dataset, reference, reference_acc, student)


def in_float64(model: keras.Model) -> keras.Model:
    """The same model with float64 inputs, variables and arithmetic, and the same weights.

    ``trainer.precision=float64`` trains this copy: feeding float64 inputs to a float32
    model would still compute (and round) in float32.

    Example:
    >>> {w.dtype for w in in_float64(build_model(Architecture("mlp", hidden=(4,)))).weights}  # doctest: +SKIP
    {'float64'}
    """
    clone = keras.models.clone_model(
        model,
        input_tensors=keras.Input(model.inputs[0].shape[1:], dtype="float64"),
        clone_function=lambda layer: layer.__class__.from_config({**layer.get_config(), "dtype": "float64"}),
    )
    clone.set_weights(model.get_weights())
    return clone


def architecture(cfg) -> Architecture:
    """The ``model`` config group as an :class:`~heatinv.models.Architecture`."""
    m = cfg.model
    return Architecture(m.name, tuple(m.hidden), tuple(m.filters), m.activation, m.output_activation, m.l2, m.beta)


def check_model_fits(model: keras.Model, dataset: Dataset, path: str) -> None:
    """A user's model must take the dataset's images and score its classes."""
    expected_in = (None,) + tuple(dataset.x_test.shape[1:])
    given_in = tuple(model.inputs[0].shape) if getattr(model, "inputs", None) else None
    given_out = tuple(model.outputs[0].shape) if getattr(model, "outputs", None) else None
    if given_in != expected_in or given_out is None or given_out[-1] != dataset.num_classes:
        raise ValueError(
            f"Model file {path} (model.path) takes inputs of shape {given_in} and gives outputs of shape "
            f"{given_out}; the {dataset.name} data needs inputs {expected_in} and {dataset.num_classes} outputs. "
            "Rebuild the model for 28x28x1 images and 10 classes (a Flatten layer first for an MLP)."
        )


def explainer_for(model: keras.Model, cfg) -> LRP:
    """The LRP explainer the ``lrp`` config group describes, bound to ``model``."""
    c = cfg.lrp
    return LRP(model, c.composite, low=c.low, high=c.high, epsilon=c.epsilon, gamma=c.gamma, output=c.output)


def single_target(cfg, dataset: Dataset, reference: keras.Model) -> Target:
    """The single task's input image, label and target heatmap (``target`` config group)."""
    t = cfg.target
    return build_target(
        t.kind,
        dataset,
        explainer_for(reference, cfg) if t.kind == "digit" else None,
        digit=t.digit,
        index=t.index,
        path=t.path,
        image=t.image,
        pattern=t.pattern,
        scale=t.scale,
    )


@dataclass
class DatasetProblem:
    """The dataset task's targets, from the reference's heatmaps.

    Attributes:
        train_targets: ``[N, H, W, 1]`` the heatmap each training image should get.
        train_logits: ``[N, classes]`` the reference's logits (the logit-match term).
        test_maps: ``[M, H, W, 1]`` the reference's held-out heatmaps (for the figure).
        test_targets: ``[M, H, W, 1]`` held-out targets.
        test_chosen: ``[M]`` bool, the held-out images whose heatmaps should move.
        description: e.g. ``pattern (classes [1])``.
    """

    train_targets: np.ndarray
    train_logits: np.ndarray
    test_maps: np.ndarray
    test_targets: np.ndarray
    test_chosen: np.ndarray
    description: str


def dataset_problem(cfg, dataset: Dataset, reference: keras.Model) -> DatasetProblem:
    """Explain every image with the reference and build the dataset task's targets from it."""
    t = cfg.target
    classes = None if cfg.task.classes is None else list(cfg.task.classes)
    explainer = explainer_for(reference, cfg)
    train_maps, train_logits = explain_all(explainer, dataset.x_train, dataset.y_train, "the training set")
    test_maps, _ = explain_all(explainer, dataset.x_test, dataset.y_test, "the held-out set")
    options = dict(pattern=t.pattern, pattern_path=t.path, like=t.like, top_k=t.top_k)
    train_targets, _ = dataset_targets(t.kind, dataset.y_train, train_maps, classes, **options)
    test_targets, test_chosen = dataset_targets(
        t.kind, dataset.y_test, test_maps, classes, like_heatmaps=(dataset.y_train, train_maps), **options
    )
    description = f"{t.kind} ({'all classes' if classes is None else 'classes ' + str(classes)})"
    return DatasetProblem(train_targets, train_logits.astype(np.float32), test_maps, test_targets, test_chosen, description)


def explain_all(
    explainer: LRP, x: np.ndarray, labels: np.ndarray, what: str | None = None, batch_size: int = 256
) -> tuple[np.ndarray, np.ndarray]:
    """Heatmaps (for each image's label) and logits of a whole array, in compiled batches.

    Args:
        what: names the images in a progress report (None: no report).

    Returns:
        ``(heatmaps [N, *input_shape], logits [N, classes])``.

    Example:
    >>> maps, logits = explain_all(LRP(model), dataset.x_test, dataset.y_test)  # doctest: +SKIP
    """
    explain = _compiled_explain(explainer, x.shape[1:])
    progress = Progress(f"explaining {what}", len(x), "images") if what else None
    maps, logits = [], []
    for start in range(0, len(x), batch_size):
        R, z = explain(x[start : start + batch_size], labels[start : start + batch_size].astype(np.int32))
        maps.append(R.numpy())
        logits.append(z.numpy())
        if progress:
            progress.update(min(start + batch_size, len(x)))
    return np.concatenate(maps), np.concatenate(logits)


_EXPLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _compiled_explain(explainer: LRP, input_shape) -> tf.types.experimental.GenericFunction:
    """One compiled ``(batch, labels) -> (heatmaps, logits)`` per explainer and input shape, reused across calls.

    The dataset task explains the held-out set after every epoch; a new ``tf.function`` each
    time would retrace every time.
    """
    functions = _EXPLAIN.setdefault(explainer, {})
    key = tuple(input_shape)
    if key not in functions:
        signature = [tf.TensorSpec((None,) + key, tf.float32), tf.TensorSpec((None,), tf.int32)]
        owner = weakref.ref(explainer)  # the cache must not keep the explainer (and its model) alive

        @tf.function(input_signature=signature)
        def explain(batch, batch_labels):
            explanation = owner().explain(batch, batch_labels)
            return explanation.relevance, explanation.logits

        functions[key] = explain
    return functions[key]
