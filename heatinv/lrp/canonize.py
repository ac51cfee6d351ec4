"""Turn a Keras model into the chain of steps LRP walks, with BatchNorm folded in.

A step is one of four kinds:

- :class:`Linear`: a Dense or Conv layer (kernel, bias, and its own activation), with the
  BatchNormalization that directly follows it folded into its kernel and bias;
- :class:`Pool`: average pooling (the ``norm`` rule) or max pooling (winner takes all);
- :class:`Elementwise`: an activation; relevance passes through it unchanged;
- :class:`Reshape`: Flatten or Reshape; relevance is reshaped back.

Dropout and InputLayer vanish: LRP explains the model in inference mode.

The folded kernel and bias are computed from the live Keras variables each time
:meth:`Linear.params` is called, inside the caller's tape or trace, so gradients reach the
layer's kernel, bias and the BatchNorm's gamma and beta, and nothing is ever assigned into a
variable: there is nothing to undo, and an optimizer never updates a stale copy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Union

import keras
import tensorflow as tf

from heatinv.layers import SoftplusBeta

SUPPORTED = (
    "Dense, Conv1D, Conv2D, MaxPooling1D/2D, AveragePooling1D/2D, GlobalAveragePooling1D/2D, "
    "GlobalMaxPooling1D/2D, Flatten, Reshape, Dropout, InputLayer, Activation, ReLU, LeakyReLU, "
    "Softmax, heatinv.layers.SoftplusBeta, and BatchNormalization directly after a Dense/Conv layer without activation"
)

_CONV = (keras.layers.Conv1D, keras.layers.Conv2D)
_AVERAGE = (
    keras.layers.AveragePooling1D,
    keras.layers.AveragePooling2D,
    keras.layers.GlobalAveragePooling1D,
    keras.layers.GlobalAveragePooling2D,
)
_MAX = (
    keras.layers.MaxPooling1D,
    keras.layers.MaxPooling2D,
    keras.layers.GlobalMaxPooling1D,
    keras.layers.GlobalMaxPooling2D,
)
_ELEMENTWISE = (keras.layers.Activation, keras.layers.ReLU, keras.layers.LeakyReLU, keras.layers.Softmax, SoftplusBeta)
_VANISH = (keras.layers.Dropout, keras.layers.InputLayer)
_RESHAPE = (keras.layers.Flatten, keras.layers.Reshape)


class UnsupportedLayerError(TypeError):
    """A layer heatinv's LRP engine has no rule for."""


@dataclass
class Linear:
    """A Dense or Conv layer, optionally with a folded BatchNormalization."""

    layer: keras.layers.Layer
    batch_norm: keras.layers.BatchNormalization | None = None

    @property
    def kind(self) -> str:
        return "conv" if isinstance(self.layer, _CONV) else "dense"

    @property
    def name(self) -> str:
        return self.layer.name

    @property
    def activation(self) -> Callable[[tf.Tensor], tf.Tensor] | None:
        fn = self.layer.activation
        if fn is keras.activations.leaky_relu:
            return functools.partial(leaky_relu, slope=0.2)  # keras.activations.leaky_relu's default
        return None if fn is keras.activations.linear else fn

    def params(self, dtype: tf.DType) -> tuple[tf.Tensor, tf.Tensor]:
        """The (kernel, bias) the step computes with: live variables, BatchNorm folded, in ``dtype``."""
        kernel = tf.cast(self.layer.kernel, dtype)
        if self.layer.use_bias:
            bias = tf.cast(self.layer.bias, dtype)
        else:
            bias = tf.zeros([kernel.shape[-1]], dtype)
        if self.batch_norm is None:
            return kernel, bias
        return fold_batch_norm(kernel, bias, self.batch_norm)

    def affine(self, x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor | None) -> tf.Tensor:
        """The layer's linear map with the given kernel and bias (no activation)."""
        if self.kind == "dense":
            # matmul for the usual rank-2 input: tensordot's gradient copies the kernel into a transpose
            z = tf.matmul(x, kernel) if x.shape.rank == 2 else tf.tensordot(x, kernel, axes=[[x.shape.rank - 1], [0]])
        else:
            z = tf.nn.convolution(
                x,
                kernel,
                strides=list(self.layer.strides),
                padding=self.layer.padding.upper(),
                dilations=list(self.layer.dilation_rate),
            )
        return z if bias is None else z + bias

    def transpose(self, s: tf.Tensor, kernel: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
        """``W^T s``: the adjoint of :meth:`affine`, shaped like the layer input ``like``.

        Written as an explicit transposed product/convolution rather than a nested tape:
        eager TensorFlow cannot differentiate the gradient of a convolution a second time.
        """
        if self.kind == "dense":
            if s.shape.rank == 2:
                return tf.matmul(s, kernel, transpose_b=True)
            return tf.tensordot(s, kernel, axes=[[s.shape.rank - 1], [1]])
        # TensorFlow's float64 CPU kernel refuses dilation > 1, so dilate the kernel instead.
        return tf.nn.conv_transpose(
            s,
            dilate_kernel(kernel, self.layer.dilation_rate),
            output_shape=tf.shape(like),
            strides=list(self.layer.strides),
            padding=self.layer.padding.upper(),
        )


@dataclass
class Pool:
    """A pooling layer: ``average`` (norm rule) or ``max`` (winner takes all)."""

    layer: keras.layers.Layer
    kind: str

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return self.layer.call(x)

    @property
    def window(self) -> tuple[int, ...] | None:
        """The pool size when windows tile the input without overlap or padding, else None."""
        size, strides = getattr(self.layer, "pool_size", None), getattr(self.layer, "strides", None)
        if size is None or tuple(size) != tuple(strides):
            return None
        spatial = self.layer.input.shape[1:-1]
        if self.layer.padding == "same" and any(d is None or d % s for d, s in zip(spatial, size)):
            return None
        return tuple(size)


@dataclass
class Elementwise:
    """An activation layer; relevance passes it unchanged."""

    layer: keras.layers.Layer

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        slope = _leaky_slope(self.layer)
        return self.layer.call(x) if slope is None else leaky_relu(x, slope)


def leaky_relu(x: tf.Tensor, slope: float) -> tf.Tensor:
    """``x`` where ``x > 0``, else ``slope * x``, with ``slope`` in ``x``'s dtype.

    ``tf.nn.leaky_relu`` (which Keras's LeakyReLU calls) stores ``alpha`` as a 32-bit float
    attribute, so in float64 it multiplies by ``float32(slope)`` (0.1 -> 0.10000000149):
    a ~1e-9 relative error that the norm rule of a following average pooling amplifies.
    """
    return tf.where(x > 0, x, x * tf.convert_to_tensor(slope, dtype=x.dtype))


def _leaky_slope(layer: keras.layers.Layer) -> float | None:
    """The slope of a layer that Keras computes with ``tf.nn.leaky_relu``, else None."""
    if isinstance(layer, keras.layers.LeakyReLU):
        return float(layer.negative_slope)
    if (
        isinstance(layer, keras.layers.ReLU)
        and layer.negative_slope != 0
        and layer.max_value is None
        and layer.threshold == 0
    ):
        return float(layer.negative_slope)
    if isinstance(layer, keras.layers.Activation) and layer.activation is keras.activations.leaky_relu:
        return 0.2
    return None


@dataclass
class Reshape:
    """Flatten or Reshape; relevance is reshaped back to the input's shape."""

    layer: keras.layers.Layer

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return self.layer.call(x)


Step = Union[Linear, Pool, Elementwise, Reshape]


def dilate_kernel(kernel: tf.Tensor, rates: tuple[int, ...]) -> tf.Tensor:
    """Insert ``rate - 1`` zeros between kernel taps along each spatial axis.

    A convolution with the dilated kernel and dilation 1 equals the dilated convolution.
    """
    for axis, rate in enumerate(rates):
        if rate == 1:
            continue
        size = kernel.shape[axis]
        moved = tf.experimental.numpy.moveaxis(kernel, axis, 0)[:, None]
        padded = tf.pad(moved, [[0, 0], [0, rate - 1]] + [[0, 0]] * (moved.shape.rank - 2))
        flat = tf.reshape(padded, [size * rate] + moved.shape[2:].as_list())[: (size - 1) * rate + 1]
        kernel = tf.experimental.numpy.moveaxis(flat, 0, axis)
    return kernel


def fold_batch_norm(
    kernel: tf.Tensor, bias: tf.Tensor, batch_norm: keras.layers.BatchNormalization
) -> tuple[tf.Tensor, tf.Tensor]:
    """Fold an inference-mode BatchNorm into the linear map before it.

    ``BN(z) = (z - mean) * g / sqrt(var + eps) + beta`` with ``z = a W + b`` equals
    ``a W' + b'`` with ``W' = W * scale`` and ``b' = (b - mean) * scale + beta``,
    ``scale = g / sqrt(var + eps)``, scaling the kernel's last (output-channel) axis, for a
    kernel of any rank.

    Example:
    >>> bn = keras.layers.BatchNormalization(); bn.build((None, 3))
    >>> k, b = fold_batch_norm(tf.ones([2, 3]), tf.zeros([3]), bn)
    >>> k.shape, b.shape
    (TensorShape([2, 3]), TensorShape([3]))
    """
    dtype = kernel.dtype
    variance = tf.cast(batch_norm.moving_variance, dtype)
    mean = tf.cast(batch_norm.moving_mean, dtype)
    scale = tf.math.rsqrt(variance + tf.convert_to_tensor(batch_norm.epsilon, dtype=dtype))
    if batch_norm.scale:
        scale = scale * tf.cast(batch_norm.gamma, dtype)
    shift = (bias - mean) * scale
    if batch_norm.center:
        shift = shift + tf.cast(batch_norm.beta, dtype)
    return kernel * scale, shift


def layer_chain(model: keras.Model) -> list[keras.layers.Layer]:
    """The model's layers in forward order, nested models expanded; a single chain is required."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a Keras model, got {type(model).__name__}.")
    if not model.built:
        raise ValueError(
            f"Model {model.name!r} is not built; call it on a batch or give it an Input first."
        )
    if isinstance(model, keras.Sequential):
        layers = list(model.layers)
    elif isinstance(model, keras.Model) and hasattr(model, "_operations") and hasattr(model, "inputs"):
        layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
        _check_single_chain(model, layers)
    else:
        raise UnsupportedLayerError(
            f"Model {model.name!r} is a subclassed keras.Model: heatinv needs the layer graph. "
            "Rebuild it as keras.Sequential or with the functional API."
        )
    chain = []
    for layer in layers:
        chain.extend(layer_chain(layer) if isinstance(layer, keras.Model) else [layer])
    return chain


def _check_single_chain(model: keras.Model, layers: list[keras.layers.Layer]) -> None:
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise UnsupportedLayerError(
            f"Model {model.name!r} has {len(model.inputs)} inputs and {len(model.outputs)} outputs; "
            "heatinv explains models with one input and one output."
        )
    previous = model.inputs[0]
    for layer in layers:
        inputs = layer.input
        if isinstance(inputs, (list, tuple)) or inputs is not previous:
            raise UnsupportedLayerError(
                f"Layer {layer.name!r} ({type(layer).__name__}) of model {model.name!r} does not take "
                "the previous layer's output: heatinv explains a single chain of layers "
                "(no branches, skips or shared layers)."
            )
        previous = layer.output


def canonize(model: keras.Model) -> list[Step]:
    """The model as a list of LRP steps (BatchNorm folded, Dropout/InputLayer dropped).

    Example:
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu")])
    >>> [type(step).__name__ for step in canonize(model)]
    ['Linear']
    """
    steps: list[Step] = []
    for layer in layer_chain(model):
        if isinstance(layer, (keras.layers.Dense, *_CONV)):
            _check_linear(layer)
            steps.append(Linear(layer))
        elif isinstance(layer, keras.layers.BatchNormalization):
            steps[-1:] = [_fold_into(steps[-1] if steps else None, layer)]
        elif isinstance(layer, _AVERAGE):
            steps.append(Pool(layer, "average"))
        elif isinstance(layer, _MAX):
            steps.append(Pool(layer, "max"))
        elif isinstance(layer, _ELEMENTWISE):
            steps.append(Elementwise(layer))
        elif isinstance(layer, _RESHAPE):
            steps.append(Reshape(layer))
        elif isinstance(layer, _VANISH):
            continue
        else:
            raise UnsupportedLayerError(
                f"Layer {layer.name!r} of class {type(layer).__name__} has no LRP rule in heatinv. "
                f"Supported layers: {SUPPORTED}."
            )
    if not any(isinstance(step, Linear) for step in steps):
        raise UnsupportedLayerError(f"Model {model.name!r} has no Dense or Conv layer to explain.")
    return steps


def _check_linear(layer: keras.layers.Layer) -> None:
    if isinstance(layer, _CONV):
        problems = []
        if layer.data_format != "channels_last":
            problems.append(f"data_format={layer.data_format!r} (use 'channels_last')")
        if layer.padding not in ("valid", "same"):
            problems.append(f"padding={layer.padding!r} (use 'valid' or 'same')")
        if getattr(layer, "groups", 1) != 1:
            problems.append(f"groups={layer.groups} (use 1)")
        if problems:
            raise UnsupportedLayerError(
                f"Layer {layer.name!r} ({type(layer).__name__}) uses " + ", ".join(problems) + "."
            )


def _fold_into(previous: Step | None, batch_norm: keras.layers.BatchNormalization) -> Linear:
    axis = batch_norm.axis if isinstance(batch_norm.axis, int) else batch_norm.axis[0]
    rank = len(batch_norm.input.shape) if hasattr(batch_norm, "input") else None
    if axis != -1 and rank is not None and axis != rank - 1:
        raise UnsupportedLayerError(
            f"BatchNormalization {batch_norm.name!r} normalizes axis {axis}; heatinv folds only a "
            "BatchNormalization over the last (channel) axis."
        )
    if not isinstance(previous, Linear) or previous.activation is not None or previous.batch_norm:
        after = "the model's input" if previous is None else f"layer {previous.layer.name!r}"
        raise UnsupportedLayerError(
            f"BatchNormalization {batch_norm.name!r} follows {after}; heatinv folds a "
            "BatchNormalization into the Dense/Conv layer directly before it, which must have no "
            "activation of its own (put the activation after the BatchNormalization)."
        )
    return Linear(previous.layer, batch_norm)
