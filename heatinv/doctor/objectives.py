"""What the doctor differentiates: the same objective in float32 and float64.

Each objective's :meth:`probe` returns a :class:`Probe`: the loss, the gradients it is
about (``None`` where there is no path), and the forward pass the checks read.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from heatinv.losses import heatmap_loss
from heatinv.lrp import LRP, NonFiniteHeatmapWarning, target_mask
from heatinv.lrp.canonical import Linear, canonize
from heatinv.lrp.propagate import Forward, forward
from heatinv.models import variable_tags, with_dtype


@dataclass
class Probe:
    """One evaluation of an objective.

    Attributes:
        loss: the objective's value.
        gradients: name -> gradient (None where the tape found no path); names are
            ``<layer>/<variable>`` or ``input``.
        fwd: the forward pass (step inputs, folded parameters, logits, outputs).
        heatmap: the explanation, where the objective has one.
        dtype: the working precision.
        score: ``[batch]``, the relevance that entered the network (an LRP heatmap's explained score).
    """

    loss: float
    gradients: dict[str, tf.Tensor | None]
    fwd: Forward
    heatmap: tf.Tensor | None
    dtype: tf.DType
    score: tf.Tensor | None = None


def _gradients_by_name(names, gradients) -> dict[str, tf.Tensor | None]:
    return dict(zip(names, gradients))


@dataclass
class HeatmapObjective:
    """Match an LRP heatmap to ``target``; gradients with respect to the model's weights."""

    target: np.ndarray
    explainer: LRP
    loss: str = "mse"
    delta: float = 0.1
    normalize: str = "none"

    wrt = "weights"

    def probe(self, model: keras.Model, x, label, dtype: tf.DType) -> Probe:
        explainer = self.explainer
        x = x if explainer.tokens else tf.cast(x, dtype)  # token ids stay integers
        if any(tf.as_dtype(v.dtype) != dtype for v in model.trainable_variables):
            # Differentiated through a cast, a variable's gradient is rounded to its own dtype: a
            # float64 probe needs float64 variables, a float32 probe of a float16 model float32 ones.
            model = with_dtype(model, dtype.name)
            explainer = explainer.on(model)
        variables = model.trainable_variables
        loss_fn = heatmap_loss(self.loss, self.delta, self.normalize)
        # the doctor names non-finite heatmaps itself, with their cause
        with tf.GradientTape() as tape, warnings.catch_warnings():
            warnings.simplefilter("ignore", NonFiniteHeatmapWarning)
            explanation = explainer.explain(x, label)
            _check_broadcasts(np.shape(self.target), tuple(explanation.relevance.shape))
            loss = loss_fn(explanation.relevance, tf.cast(self.target, dtype))
        # an Embedding's gradient comes as IndexedSlices: dense, as the checks read every gradient
        gradients = [None if g is None else tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
        names = variable_tags(variables)
        fwd = forward(explainer.steps, x)
        return Probe(float(loss), _gradients_by_name(names, gradients), fwd, explanation.relevance, dtype, explanation.start)


def _check_broadcasts(target: tuple, heatmap: tuple, what: str = "heatmap") -> None:
    """A target of the heatmap's (``what``'s) shape, or one that broadcasts to it (one channel for all)."""
    try:
        fits = np.broadcast_shapes(target, heatmap) == heatmap
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"The objective's target has shape {target} and the {what} {heatmap}: give one target value per "
            f"{what} value (a target of one channel is used for every channel)."
        )


@dataclass
class SaliencyObjective:
    """A plain loss of the model's output; gradients with respect to the input.

    ``loss="crossentropy"``: a model whose last layer ends in a softmax is scored the way
    Keras users do it, ``categorical_crossentropy(y, probabilities)`` (which clips
    probabilities to ``[1e-7, 1 - 1e-7]``), any other model with ``from_logits=True``.
    ``loss="logit"``: the class's pre-activation score itself, as saliency maps use it.
    """

    loss: str = "crossentropy"

    wrt = "input"

    def __post_init__(self) -> None:
        if self.loss not in ("crossentropy", "logit"):
            raise ValueError(f"SaliencyObjective's loss must be 'crossentropy' or 'logit', got {self.loss!r}.")

    def probe(self, model: keras.Model, x, label, dtype: tf.DType) -> Probe:
        steps = canonize(model)
        x = tf.cast(x, dtype)
        with tf.GradientTape() as tape:
            tape.watch(x)
            fwd = forward(steps, x)
            onehot = target_mask(label, fwd.logits)
            if self.loss == "logit":
                loss = -tf.reduce_sum(fwd.logits * onehot, axis=-1)
            elif ends_in_softmax(steps):
                loss = keras.losses.categorical_crossentropy(onehot, fwd.outputs)
            else:
                loss = keras.losses.categorical_crossentropy(onehot, fwd.outputs, from_logits=True)
            loss = tf.reduce_mean(loss)
        return Probe(float(loss), {"input": tape.gradient(loss, x)}, fwd, None, dtype)


@dataclass
class ExplanationObjective:
    """Move a gradient explanation ``d logit / d x`` towards ``target`` by changing the input.

    The derivative of this objective with respect to ``x`` is a second derivative of the
    network: it is what input-manipulation attacks on explanations follow.
    """

    target: np.ndarray

    wrt = "input"

    def probe(self, model: keras.Model, x, label, dtype: tf.DType) -> Probe:
        steps = canonize(model)
        x = tf.cast(x, dtype)
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                fwd = forward(steps, x)
                score = tf.reduce_sum(fwd.logits * target_mask(label, fwd.logits))
            saliency = inner.gradient(score, x)
            _check_broadcasts(np.shape(self.target), tuple(saliency.shape), "saliency map")
            loss = tf.reduce_mean(tf.square(saliency - tf.cast(self.target, dtype)))
        return Probe(float(loss), {"input": outer.gradient(loss, x)}, fwd, saliency, dtype)


def ends_in_softmax(steps) -> bool:
    """Whether the model's output passes through a softmax (as an activation or a layer)."""
    last = steps[-1]
    if isinstance(last, Linear):
        return last.layer.activation is keras.activations.softmax
    layer = last.layer
    return isinstance(layer, keras.layers.Softmax) or getattr(layer, "activation", None) is keras.activations.softmax

