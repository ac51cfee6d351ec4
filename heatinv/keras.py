"""Training against explanations with Keras's ``fit``: :class:`ExplanationTrainer`.

An objective with an explanation term (Anders et al.'s manipulation, Ross et al.'s "right
for the right reasons", explanation-guided training) is, in Keras, a model whose loss adds
that term. :class:`ExplanationTrainer` wraps a student and adds to the compiled loss the
distance between the student's LRP heatmap of the true class and a target, computed with
heatinv's engine inside Keras's own training step: Keras's callbacks, ``jit_compile``,
``steps_per_execution``, mixed precision and ``tf.distribute`` strategies work as for any
model.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from heatinv.losses import LOSSES, batch_unit, per_example_heatmap_loss
from heatinv.lrp import LRP
from heatinv.similarity import cosine

MASKED = "masked"
"""The explanation loss of a mask target: the share of the heatmap's ``|R|`` on the mask (0: none there)."""


def masked_share(heatmap: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """The batch mean of ``sum |R| mask / sum |R|``: how much of each heatmap lies where the mask is 1.

    Examples:
        >>> float(masked_share(tf.constant([[1.0, -3.0]]), tf.constant([[0.0, 1.0]])))
        0.75
    """
    magnitude = tf.abs(heatmap)
    axes = list(range(1, heatmap.shape.rank))
    inside = tf.reduce_sum(magnitude * tf.cast(mask, heatmap.dtype), axis=axes)
    return tf.reduce_mean(inside / (tf.reduce_sum(magnitude, axis=axes) + tf.constant(1e-12, heatmap.dtype)))


@keras.saving.register_keras_serializable(package="heatinv")
class ExplanationTrainer(keras.Model):
    """A student whose ``fit`` adds an explanation term to its loss.

    The loss of a batch is the compiled loss (and the student's regularization losses) plus
    ``explanation_weight`` times the explanation loss between the student's heatmap of each
    example's label (:class:`heatinv.lrp.LRP`, inference mode) and its target. The data
    gives ``(x, y, target)`` (a ``tf.data.Dataset``, or arrays as ``fit(x, y, sample_weight=targets)``:
    Keras passes a third element along as the sample weight; here it is the target), or
    ``(x, y)`` with ``target`` a function ``target(x, y) -> maps``. The student is trained in
    place, as ``fit`` trains any model; ``trainer.student`` is a plain Keras model.

    Args:
        student: a model heatinv can explain, computing logits ``[batch, classes]``.
        composite: the LRP composite (``epsilon_gamma_box``, ``epsilon_plus``, ``attnlrp``, ...).
        target: a function ``(x, y) -> [batch, *map shape]`` for data without targets.
        low: the input box's lower end for the ``zbox`` rule of the ``*_box`` composites: the
            data's smallest value (default 0, images; give your data's range).
        high: the input box's upper end: the data's largest value (default 1).
        epsilon: the epsilon rule's epsilon (:class:`heatinv.lrp.LRP`).
        gamma: the gamma rule's gamma (:class:`heatinv.lrp.LRP`).

    Examples:
        >>> import keras, numpy as np, tensorflow as tf
        >>> from heatinv.keras import ExplanationTrainer
        >>> keras.utils.set_random_seed(0)
        >>> student = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
        >>> trainer = ExplanationTrainer(student, composite="epsilon")
        >>> trainer.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        ...                 explanation_loss="masked", explanation_weight=1.0, metrics=["accuracy"])
        >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> mask = np.tile([[0, 0, 0, 1]], (64, 1)).astype("float32")  # no relevance on the last feature
        >>> history = trainer.fit(tf.data.Dataset.from_tensor_slices((x, y, mask)).batch(16), epochs=2, verbose=0)
        >>> sorted(history.history)
        ['accuracy', 'explanation_loss', 'loss']
    """

    def __init__(
        self,
        student: keras.Model,
        composite: str = "epsilon_gamma_box",
        target: Callable | None = None,
        low: float = 0.0,
        high: float = 1.0,
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.student = student
        self.composite, self.target_function = composite, target
        self.settings = {"low": low, "high": high, "epsilon": epsilon, "gamma": gamma}
        self.explainer = LRP(student, composite, **self.settings)
        self.explanation_loss_tracker = keras.metrics.Mean(name="explanation_loss")
        self.cosine_tracker = None
        self.explanation_loss, self.explanation_loss_name, self.explanation_weight = _global_unit_loss("mse"), "mse", 1.0
        self.built = student.built  # its variables are the student's (BackupAndRestore loads into a built model)

    def compile(self, optimizer="rmsprop", loss=None, *, explanation_loss="mse", explanation_weight: float = 1.0, **kwargs):
        """Keras's ``compile`` and the explanation term.

        Args:
            optimizer: as :meth:`keras.Model.compile`.
            loss: as :meth:`keras.Model.compile`; ``loss=None``: the explanation term alone.
            **kwargs: as :meth:`keras.Model.compile` (``metrics``, ``jit_compile``,
                ``steps_per_execution``, ...).
            explanation_loss: ``"mse"``, ``"l1"`` or ``"huber"`` between heatmap and target map (in units
                of the batch's largest ``|target|``, as the command line's heatmap loss), ``"masked"``
                (the target is a mask: the share of ``|R|`` on it, :func:`masked_share`), or a
                function ``(heatmap, target) -> scalar``.
            explanation_weight: the term's weight in the loss.
        """
        self.explanation_loss_name = None if callable(explanation_loss) else explanation_loss
        if callable(explanation_loss):
            self.explanation_loss = explanation_loss
        elif explanation_loss == MASKED:
            self.explanation_loss = masked_share
        elif explanation_loss in LOSSES:
            self.explanation_loss = _global_unit_loss(explanation_loss)
        else:
            raise ValueError(
                f"ExplanationTrainer.compile: explanation_loss={explanation_loss!r} is not one of "
                f"{[*LOSSES, MASKED]} or a function (heatmap, target) -> scalar."
            )
        self.explanation_weight = float(explanation_weight)
        # a mask is no map to compare with: the cosine is watched for map targets only
        self.cosine_tracker = None if explanation_loss == MASKED else keras.metrics.Mean(name="explanation_cosine")
        super().compile(optimizer=optimizer, loss=loss, **kwargs)

    def call(self, x, training=False):
        return self.student(x, training=training)

    def train_step(self, data):
        return super().train_step(self._with_targets(data))

    def test_step(self, data):
        return super().test_step(self._with_targets(data))

    def _with_targets(self, data):
        """``(x, (y, target))``: the target rides with the labels through Keras's step to :meth:`compute_loss`."""
        x, y, target = keras.utils.unpack_x_y_sample_weight(data)
        return x, (y, self._target(x, y, target))

    def get_compile_config(self) -> dict:
        config = super().get_compile_config()
        if not config:
            return config
        if self.explanation_loss_name is None:
            raise TypeError(
                "An ExplanationTrainer compiled with an explanation_loss function cannot be saved with its compile "
                "settings (the function is code). Save its weights (ModelCheckpoint(..., save_weights_only=True))."
            )
        return {**config, "explanation_loss": self.explanation_loss_name, "explanation_weight": self.explanation_weight}

    def compile_from_config(self, config: dict) -> None:
        config = dict(config)
        explanation = {key: config.pop(key) for key in ("explanation_loss", "explanation_weight") if key in config}
        self.compile(**keras.saving.deserialize_keras_object(config), **explanation)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def _target(self, x, y, given):
        if given is not None:
            return given
        if self.target_function is None:
            raise ValueError(
                "ExplanationTrainer got batches of (x, y) and has no target function: give batches of (x, y, target) "
                "or ExplanationTrainer(student, target=lambda x, y: ...)."
            )
        return self.target_function(x, y)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The compiled loss (and regularization) plus ``explanation_weight`` times the explanation loss.

        Each replica's terms are scaled by ``1 / replicas`` as Keras scales its own losses, so the
        summed gradients are the global batch's (the tracked values are the terms themselves).
        """
        if isinstance(y, tuple):
            labels, target = y
        else:  # Keras's own pass that builds the metrics under a strategy: the batch as it comes, (x, y, target)
            labels, target, sample_weight = y, self._target(x, y, sample_weight), None
        if self.loss is not None or self.losses:
            loss = super().compute_loss(x, labels, y_pred, sample_weight, training)
        else:  # the explanation term alone
            loss = tf.zeros((), y_pred.dtype)
        heatmap = self.explainer(x, _classes(labels))
        target = _as_heatmap(tf.cast(target, heatmap.dtype), heatmap)
        term = tf.cast(self.explanation_loss(heatmap, target), loss.dtype)
        self.explanation_loss_tracker.update_state(term)
        if self.cosine_tracker is not None:
            self.cosine_tracker.update_state(cosine(heatmap, target))
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return loss + tf.cast(self.explanation_weight / replicas, loss.dtype) * term

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        return super().compute_metrics(x, y[0] if isinstance(y, tuple) else y, y_pred, sample_weight)

    def get_config(self) -> dict:
        if self.target_function is not None:
            raise TypeError(
                "An ExplanationTrainer with a target function cannot be saved whole (the function is code). Save its "
                "weights (ModelCheckpoint(..., save_weights_only=True)) or the student (trainer.student.save(...))."
            )
        return {
            **super().get_config(),
            "student": keras.saving.serialize_keras_object(self.student),
            "composite": self.composite,
            **self.settings,
        }

    @classmethod
    def from_config(cls, config: dict, custom_objects=None) -> "ExplanationTrainer":
        config = dict(config)
        student = keras.saving.deserialize_keras_object(config.pop("student"), custom_objects=custom_objects)
        return cls(student, **config)


def _classes(labels: tf.Tensor) -> tf.Tensor:
    """The explained classes ``[batch]`` int32: integer labels (``[batch]`` or ``[batch, 1]``), or one-hot rows."""
    if labels.shape.rank == 2 and labels.shape[-1] != 1:
        labels = tf.argmax(labels, axis=-1)
    return tf.cast(tf.reshape(labels, [-1]), tf.int32)


def _as_heatmap(target: tf.Tensor, heatmap: tf.Tensor) -> tf.Tensor:
    """``target`` in the heatmap's shape (a single channel's axis may be left out); any other shape refused."""
    if target.shape.rank == heatmap.shape.rank - 1 and heatmap.shape[-1] == 1:
        target = target[..., None]
    if target.shape.rank != heatmap.shape.rank or not target.shape[1:].is_compatible_with(heatmap.shape[1:]):
        raise ValueError(
            f"ExplanationTrainer: the batch's third element has shape {target.shape}; a target for heatmaps of shape "
            f"{heatmap.shape} must have that shape (a single channel's axis may be left out). Keras's class_weight and "
            "sample_weight also arrive as a third element: they are not supported here."
        )
    return target


def _global_unit_loss(name: str):
    """The command line's heatmap loss ``name`` in units of the largest ``|target|`` of the whole batch.

    Under a ``tf.distribute`` strategy each replica sees part of the batch; the unit is the
    maximum over all replicas, so the replicas' terms add up to the single-device loss.
    """
    per_example = per_example_heatmap_loss(name)

    def loss(heatmap: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        unit = batch_unit(target, dtype=heatmap.dtype)
        replica = tf.distribute.get_replica_context()
        if replica is not None and replica.num_replicas_in_sync > 1:
            unit = tf.reduce_max(replica.all_gather(unit[None], axis=0))  # ReduceOp has no maximum
        return tf.reduce_mean(per_example(heatmap, target, unit))

    return loss
