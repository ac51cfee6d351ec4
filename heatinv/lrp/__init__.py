"""Differentiable Layer-wise Relevance Propagation for Keras 3 models.

Every operation is an ordinary TensorFlow op on the model's live variables, so a
``tf.GradientTape`` differentiates the heatmap with respect to the weights and the input,
eagerly, inside ``tf.function`` and with ``jit_compile=True``. Transformers (attention,
LayerNorm, token ids) are explained by AttnLRP or CP-LRP (``composite="attnlrp"``,
``"cp_lrp"``; :mod:`heatinv.lrp.attention`).

Examples:
    >>> import numpy as np, keras
    >>> from heatinv.lrp import relevance
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
    ...                           keras.layers.Dense(3)])
    >>> R = relevance(model, np.ones((2, 4), "float32"), target=1, composite="epsilon")
    >>> R.shape
    TensorShape([2, 4])
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util  # whether a trace is XLA-compiled: no public API

from heatinv.lrp.canonical import SUPPORTED, Discrete, Embed, UnsupportedLayerError, canonize, fold_batch_norm
from heatinv.lrp.graph import MODEL_INPUT
from heatinv.lrp.composites import COMPOSITES, Composite, resolve
from heatinv.lrp.propagate import OUTPUTS, backward, carry_bounds, forward, logit_step, positive_product_steps
from heatinv.lrp.rules import RULES, make_rule, stabilize
from heatinv.wording import count

__all__ = [
    "COMPOSITES",
    "LRP",
    "RULES",
    "SUPPORTED",
    "Composite",
    "Explanation",
    "NonFiniteHeatmapWarning",
    "UnsupportedLayerError",
    "canonize",
    "fold_batch_norm",
    "make_rule",
    "model_input",
    "relevance",
    "resolve",
    "stabilize",
]


@dataclass
class Explanation:
    """A heatmap with the forward values it came from.

    Attributes:
        relevance: ``[batch, *input_shape]``, same dtype as the input; for a model of token
            ids, ``[batch, tokens]`` in the embedding's dtype: each token's vector's relevance,
            summed over the embedding dimension.
        logits: ``[batch, classes]``, pre-activation of the last Dense/Conv layer.
        outputs: ``[batch, classes]``, the model's output (after any final activation).
        start: ``[batch]``, the relevance that entered the network (the explained score).
        embedding: for a model of token ids, ``[batch, tokens, dim]``, the relevance of the
            Embedding's output (before a position embedding is added); else None.
    """

    relevance: tf.Tensor
    logits: tf.Tensor
    outputs: tf.Tensor
    start: tf.Tensor
    embedding: tf.Tensor | None = None


class LRP:
    """An LRP explainer bound to a model and a composite; build once, call in a step.

    Args:
        model: a built Keras 3 model, Sequential or functional (one input, one output; see
            :data:`SUPPORTED` for the layers).
        composite: a name from :data:`COMPOSITES` (``attnlrp`` and ``cp_lrp`` for transformers)
            or a mapping ``{"first", "dense", "conv"}`` of rule names (or ``{"name": rule,
            **params}``), optionally with ``"attention"`` (``"attnlrp"`` or ``"cp"``) and
            ``"stabilizer"`` (:mod:`heatinv.lrp.composites`).
        low: the input range's lower end, for the ``zbox`` rule.
        high: the input range's upper end, for the ``zbox`` rule.
        epsilon: the epsilon rule's epsilon.
        gamma: the gamma rule's gamma.
        alpha: the alpha-beta rule's alpha (when named without parameters).
        beta: the alpha-beta rule's beta (when named without parameters).
        output: ``"logit"`` starts from the target's pre-activation score of the last layer
            (a final softmax or ReLU cannot zero the map); ``"activation"`` from its
            post-activation output.
        recompute: for the gradient of the heatmap (the inverse step), keep only each conv
            layer's input and relevance, and compute its rule again in the backward pass,
            instead of keeping the rule's intermediates. The heatmap and its gradients are
            the same; memory for time (ResNet50 at 224x224, batch 8, on a 2-core CPU: the
            inverse step's peak 1.77x -> 1.30x a training step's, its time 1.31x). First-order
            gradients only (``tf.recompute_grad``).

    Examples:
        >>> lrp = LRP(model, composite="epsilon_plus")  # doctest: +SKIP
        >>> R = lrp(x, target=3)   # doctest: +SKIP
    """

    def __init__(
        self,
        model: keras.Model,
        composite: str | Mapping = "epsilon_gamma_box",
        *,
        low: float = 0.0,
        high: float = 1.0,
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        alpha: float = 2.0,
        beta: float = 1.0,
        output: str = "logit",
        recompute: bool = False,
    ):
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}.")
        self.model = model
        self.output = output
        self.recompute = recompute
        self.steps = canonize(model)
        self.top = logit_step(self.steps)
        self.tokens = reads_tokens(self.steps)
        self.composite = resolve(composite, low=low, high=high, epsilon=epsilon, gamma=gamma, alpha=alpha, beta=beta)

    def on(self, model: keras.Model) -> "LRP":
        """This explainer's rules on another model of the same layers, e.g. its float64 copy.

        Examples:
            >>> from heatinv.models import with_dtype
            >>> lrp64 = LRP(model).on(with_dtype(model, "float64"))  # doctest: +SKIP
        """
        other = copy.copy(self)
        other.model = model
        other.steps = canonize(model)
        other.top = logit_step(other.steps)
        other.tokens = reads_tokens(other.steps)
        return other

    def __call__(self, x, target) -> tf.Tensor:
        """The heatmap ``R``, same shape and dtype as ``x``."""
        return self.explain(x, target).relevance

    def explain(self, x, target) -> Explanation:
        """The heatmap together with logits, outputs and the explained score.

        Called eagerly, it warns (``NonFiniteHeatmapWarning``) when the heatmap has NaN or Inf
        entries, naming whether the model's outputs were already non-finite or relevance left
        the dtype's range on its way back; traced (``tf.function``), it checks nothing.
        """
        x = model_input(x, self.model, tokens=self.tokens)
        fwd = forward(self.steps, x, () if self.recompute else positive_product_steps(self.steps, self.composite))
        mask = target_mask(target, fwd.logits)
        if self.output == "logit":
            entering, start = fwd.logits * mask, self.top
        else:
            entering, start = fwd.outputs * mask, len(self.steps) - 1
        bounds = None
        if self.composite.first is not None and self.composite.first.name == "zbox" and not self.tokens:
            first = self.composite.first.keywords
            bounds = carry_bounds(self.steps, x, first.get("low", 0.0), first.get("high", 1.0))
        R = backward(self.steps, fwd, entering, self.composite, start, bounds, recompute=self.recompute)
        embedding = None
        if self.tokens:
            embedding, R = R, tf.reduce_sum(R, axis=-1)
        if tf.executing_eagerly():
            _warn_if_not_finite(R, fwd.logits)
        return Explanation(R, fwd.logits, fwd.outputs, tf.reduce_sum(entering, axis=-1), embedding)


class NonFiniteHeatmapWarning(UserWarning):
    """An eagerly computed heatmap has NaN or Inf entries."""


def _warn_if_not_finite(relevance: tf.Tensor, logits: tf.Tensor) -> None:
    per_example = tf.reshape(tf.math.is_finite(relevance), [relevance.shape[0], -1])
    bad = int(tf.reduce_sum(tf.cast(~tf.reduce_all(per_example, axis=1), tf.int32)))
    if not bad:
        return
    if not bool(tf.reduce_all(tf.math.is_finite(logits))):
        cause = "the model's own outputs are NaN or Inf for these inputs; check the inputs and the weights"
    else:
        largest = np.finfo(relevance.dtype.as_numpy_dtype).max
        cause = (
            f"the model's outputs are finite, so relevance left {relevance.dtype.name}'s range (largest "
            f"{largest:.3g}) on its way back, amplified where a rule divides by a pre-activation far smaller "
            "than the contributions it sums. Explain the model in float64 to see the values (LRP(model, "
            "composite).on(heatinv.models.with_dtype(model, 'float64')) on float64 inputs), or use rules that "
            "stabilize more (a larger epsilon, or a composite with the gamma or alpha-beta rule for conv layers)"
        )
    warnings.warn(
        f"The heatmap of {bad} of {relevance.shape[0]} examples has NaN or Inf entries: {cause}.",
        NonFiniteHeatmapWarning,
        stacklevel=_first_level_outside_the_engine(),
    )


def _first_level_outside_the_engine() -> int:
    """``warnings.warn``'s stacklevel of the first caller outside ``heatinv/lrp/``, from its caller's frame.

    The entry points (``relevance``, ``LRP.__call__``, ``LRP.explain``) sit at different depths
    above the check, and the warning is about the line that called one of them.
    """
    engine = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == engine:
        frame, level = frame.f_back, level + 1
    return level


def relevance(
    model: keras.Model,
    x,
    target,
    composite: str | Mapping = "epsilon_gamma_box",
    *,
    low: float = 0.0,
    high: float = 1.0,
    epsilon: float = 1e-6,
    gamma: float = 0.25,
    alpha: float = 2.0,
    beta: float = 1.0,
    output: str = "logit",
) -> tf.Tensor:
    """The LRP heatmap of ``model`` for class ``target`` at ``x``; differentiable.

    Args:
        model: a built Keras 3 model (a graph of supported layers, one input, one output).
        x: ``[batch, *input_shape]`` floating input.
        target: the class to explain: an int, ``[batch]`` or ``[batch, 1]`` ints, or a one-hot ``[batch, classes]``
            (see :func:`target_mask`).
        composite: see :class:`LRP`.
        low: see :class:`LRP`.
        high: see :class:`LRP`.
        epsilon: see :class:`LRP`.
        gamma: see :class:`LRP`.
        alpha: see :class:`LRP`.
        beta: see :class:`LRP`.
        output: see :class:`LRP`.

    Returns:
        ``R`` with the shape and dtype of ``x``.

    Examples:
        >>> R = relevance(model, x, target=7, composite="epsilon_gamma_box")  # doctest: +SKIP
    """
    lrp = LRP(model, composite, low=low, high=high, epsilon=epsilon, gamma=gamma, alpha=alpha, beta=beta, output=output)
    return lrp(x, target)


def reads_tokens(steps) -> bool:
    """Whether the model's input is token ids: an Embedding reads it (and nothing else does).

    Raises:
        UnsupportedLayerError: an Embedding and another layer both read the input.
    """
    readers = [step for step in steps if MODEL_INPUT in step.sources and not isinstance(step, Discrete)]
    embeds = [step for step in readers if isinstance(step, Embed)]
    if embeds and len(embeds) != len(readers):
        other = next(step for step in readers if not isinstance(step, Embed))
        raise UnsupportedLayerError(
            f"The model input feeds Embedding {embeds[0].name!r} and {other.name!r} too; heatinv explains a model "
            "whose token ids go to Embedding layers only."
        )
    return bool(embeds)


def model_input(x, model: keras.Model, *, tokens: bool = False) -> tf.Tensor:
    """``x`` as a tensor, checked to be a floating batch of the model's input shape (integer token ids where ``tokens``).

    Examples:
        >>> model_input(np.ones((2, 4), "float32"), keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])).shape
        TensorShape([2, 4])
    """
    x = tf.convert_to_tensor(x)
    if tokens and not x.dtype.is_integer:
        raise TypeError(
            f"Model {model.name!r} reads token ids through an Embedding: give an integer [batch, tokens] array, "
            f"got dtype {x.dtype.name}. Convert it first, e.g. ids.astype('int32')."
        )
    if not tokens and not x.dtype.is_floating:
        raise TypeError(
            f"LRP needs a floating input (float32 or float64), got dtype {x.dtype.name}; an integer "
            "input has no gradient. Convert it first, e.g. x.astype('float32') / 255."
        )
    expected = tuple(model.inputs[0].shape) if getattr(model, "inputs", None) else None
    if expected is not None:
        given = tuple(x.shape)
        fits = len(given) == len(expected) and all(e is None or g is None or e == g for e, g in zip(expected[1:], given[1:]))
        if not fits:
            raise ValueError(
                f"Input of shape {given} does not fit model {model.name!r}, which expects "
                f"{expected} (None = any). {_shape_fix(given, expected)}"
            )
    return x


def _shape_fix(given: tuple, expected: tuple) -> str:
    """What to do to an input of shape ``given`` for a model that takes ``expected`` (batch first)."""

    def fits(shape, wanted):
        return len(shape) == len(wanted) and all(w is None or s == w for s, w in zip(shape, wanted))

    if fits(given, expected[1:]):
        return "It is one example without the batch axis: x[None] gives a batch of one."
    if expected[-1] == 1 and fits(given, expected[:-1]):
        return "It lacks the channel axis (one channel): x[..., None] adds it."
    return f"Reshape it to (batch, {', '.join(str(d) for d in expected[1:])})."


def target_mask(target, logits: tf.Tensor) -> tf.Tensor:
    """A ``[batch, classes]`` selector from class indices or a one-hot matrix.

    Args:
        target: an int (every example), an int ``[batch]`` vector or ``[batch, 1]`` column
            (Keras's sparse labels), or a one-hot ``[batch, classes]`` (float, bool or int;
            any weights, e.g. to explain a sum of classes).
        logits: ``[batch, classes]``.

    Returns:
        ``[batch, classes]`` in the logits' dtype.

    Raises:
        UnsupportedLayerError: the logits are not ``[batch, classes]`` (a per-timestep or
            per-pixel output).
        ValueError: a class index out of range, where its value is known when tracing (a
            number, a list, an array, an eager or constant tensor). A tensor argument of a
            ``tf.function`` is checked when the function runs (``InvalidArgumentError``),
            except under XLA, which drops assertions: there an index out of range selects
            nothing.

    Examples:
        >>> target_mask([2, 0], tf.zeros([2, 3])).numpy()
        array([[0., 0., 1.],
               [1., 0., 0.]], dtype=float32)
    """
    if logits.shape.rank != 2:
        raise UnsupportedLayerError(
            f"heatinv explains one score per class and example, from logits of shape [batch, classes]; this "
            f"model's last Dense/Conv layer gives {tuple(logits.shape)} (None = any). Reduce the other axes "
            "before it (Flatten or GlobalAveragePooling, then keras.layers.Dense(classes))."
        )
    classes, batch = logits.shape[-1], logits.shape[0]
    if target is None:
        raise ValueError(
            "target=None: name the class to explain, as an int (every example), a [batch] vector of class "
            f"indices or a one-hot [batch, {classes}]. For each example's predicted class: "
            "target=tf.argmax(model(x), axis=-1)."
        )
    target = tf.convert_to_tensor(target)
    if target.dtype.is_integer and target.shape.rank == 2 and target.shape[-1] == classes and classes > 1:
        target = tf.cast(target, logits.dtype)  # an integer one-hot
    if target.dtype.is_integer:
        if target.shape.rank == 2 and target.shape[-1] == 1:
            known = tf.get_static_value(target)  # which a slice would hide from the check when tracing
            target = target[:, 0] if known is None else tf.constant(known[:, 0])
        if target.shape.rank not in (0, 1):
            raise ValueError(
                f"An integer target is a class index: a scalar, a [batch] vector or a [batch, 1] column, or a "
                f"one-hot [batch, {classes}]; got shape {tuple(target.shape)}."
            )
        if target.shape.rank == 1:
            _check_batch(target.shape[0], batch)
        target = _in_range(target, classes, logits)
        if target.shape.rank == 0:
            target = tf.fill(tf.shape(logits)[:1], target)
        return tf.one_hot(tf.cast(target, tf.int64), classes, dtype=logits.dtype)  # one_hot takes (u)int8, int32, int64
    if not (target.dtype.is_floating or target.dtype == tf.bool) or target.shape.rank != 2 or target.shape[-1] != classes:
        raise ValueError(
            f"A non-integer target must be a one-hot (float) array of shape [batch, {classes}], got "
            f"{target.dtype.name} of shape {tuple(target.shape)}."
        )
    _check_batch(target.shape[0], batch)
    return tf.cast(target, logits.dtype)


def _in_range(indices: tf.Tensor, classes: int, logits: tf.Tensor) -> tf.Tensor:
    """``indices``, checked to lie in ``0..classes-1`` now where known, else when the graph runs."""
    valid = "the only class index is 0" if classes == 1 else f"class indices are 0 to {classes - 1}"
    values = tf.get_static_value(indices)
    if values is not None:
        values = np.asarray(values)
        wrong = np.unique(values[(values < 0) | (values >= classes)])
        if wrong.size:
            shown = ", ".join(str(v) for v in wrong[:10]) + (", ..." if wrong.size > 10 else "")
            raise ValueError(
                f"The target names class {shown}, out of range for a model with "
                f"{count(classes, 'output unit')}: {valid}."
            )
        return indices
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        return indices  # XLA drops assertions (with a warning per compile)
    # One assertion (a cast makes negative indices huge): the check is a few ops per call of a compiled step.
    fits = tf.reduce_all(tf.cast(indices, tf.uint64) < classes)
    if indices.shape.rank == 1:
        fits = tf.logical_and(fits, tf.equal(tf.shape(indices)[0], tf.shape(logits)[0]))
    checks = [
        tf.debugging.Assert(
            fits,
            [f"The target names a class out of range ({valid}), or has another number of entries than the batch has "
             "inputs (give one per input); the target:", indices],
        )
    ]
    with tf.control_dependencies(checks):
        return tf.identity(indices)


def _check_batch(given, expected) -> None:
    if given is not None and expected is not None and given != expected:
        raise ValueError(f"The target has {count(given, 'entry', 'entries')} for a batch of {count(expected, 'input')}; give one per input.")
