"""Turn a Keras model into the graph of steps LRP walks, with BatchNorm folded in.

:func:`canonize` reads the model's calls (:func:`heatinv.lrp.graph.layer_graph`) and gives
each one a step; every step names its ``sources``, the steps whose outputs it reads
(:data:`~heatinv.lrp.graph.MODEL_INPUT` for the model input). The kinds:

- :class:`Linear`: a Dense, EinsumDense, Conv, DepthwiseConv or half of a SeparableConv (its
  depthwise and its pointwise map are two steps), with its own activation and the
  BatchNormalization that alone reads its output folded into its kernel and bias;
- :class:`Embed`: an Embedding of the model's integer input (token ids);
- :class:`Normalize`: LayerNormalization or RMSNormalization (AttnLRP's rule);
- :class:`heatinv.lrp.attention.Attention`: a MultiHeadAttention call;
- :class:`Pool`: average pooling (the ``norm`` rule) or max pooling (winner takes all);
- :class:`Elementwise`: an activation, or a Keras op between a tensor and a constant
  (``x + 3``); relevance passes it unchanged;
- :class:`Affine`: a per-channel affine map without a rule of its own (BatchNormalization
  that cannot be folded, Rescaling, Normalization); relevance passes it unchanged;
- :class:`Shift`: a learned shift of its input (:class:`heatinv.layers.PositionEmbedding`),
  which absorbs its share of the relevance;
- :class:`Reshape`: Flatten or Reshape; relevance is reshaped back;
- :class:`Rearrange`: padding, cropping, a permutation or a slice (``x[:, 0]``); relevance
  moves back with the entries it belongs to (the map's adjoint);
- :class:`Merge`: Add, Average, Subtract, Concatenate, Multiply.

Dropout, SpatialDropout, Identity, InputLayer, noise and random augmentation layers
(:data:`AUGMENTATION`) vanish: LRP explains the model in inference mode.

The folded kernel and bias are computed from the live Keras variables each time
:meth:`Linear.params` is called, inside the caller's tape or trace, so gradients reach the
layer's kernel, bias and the BatchNorm's gamma and beta, and nothing is ever assigned into a
variable: there is nothing to undo, and an optimizer never updates a stale copy.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Callable, Union

import keras
import tensorflow as tf

from heatinv.layers import PositionEmbedding, SoftplusBeta
from heatinv.lrp import einsum
from heatinv.lrp.attention import Attention
from heatinv.lrp.graph import MODEL_INPUT, UnsupportedLayerError, layer_graph
from heatinv.lrp.keras_hub import COVERED, EncoderBlock, PatchEmbedding, Positions, hub_class, position_table, vit_encoder_steps
from heatinv.lrp.llama import DecoderBlock
from heatinv.lrp.one_channel import patches_of, single_channel_transpose, single_channel_transpose_each
from heatinv.onednn import onednn_enabled

SUPPORTED = (
    "Dense, EinsumDense (any equation and bias_axes), MultiHeadAttention (self- and cross-attention, "
    "use_causal_mask, sliding_window, any dropout), LayerNormalization and RMSNormalization (over the last "
    "axis), Embedding (of the model's integer input), heatinv.layers.PositionEmbedding, keras-hub's "
    "TransformerEncoder, PositionEmbedding, TokenAndPositionEmbedding, ViT layers, LlamaTransformerDecoder, LlamaLayerNorm "
    "and ReversibleEmbedding (its logits too), Conv1D/2D (strides, dilation, groups), DepthwiseConv1D/2D, SeparableConv1D/2D, "
    "MaxPooling1D/2D, AveragePooling1D/2D, GlobalAveragePooling1D/2D, GlobalMaxPooling1D/2D, "
    "Flatten, Reshape, Permute, ZeroPadding1D/2D, Cropping1D/2D, a constant slice (x[:, 0]), Add, Average, Subtract, "
    "Concatenate, Multiply, keras.ops.mean, Dropout, SpatialDropout1D/2D, Identity, InputLayer, noise and random augmentation "
    "(GaussianNoise, RandomFlip, RandomRotation, ...: identity in inference), Activation (any "
    "activation), ReLU, LeakyReLU, ELU, Softmax, heatinv.layers.SoftplusBeta, BatchNormalization "
    "(over the last axis), Rescaling, Normalization, and Keras ops between one tensor and a "
    "constant (+, -, *, /) or between two tensors (+, -, *)"
)

_CHANNELS_LAST = {3: "NWC", 4: "NHWC"}
"""Named, not left to the default: an eager tape records only the attributes given, and the
gradient of a convolution's gradient reads ``data_format`` (None otherwise: an AttributeError)."""

_DENSE = (keras.layers.Dense,)
_EINSUM = (keras.layers.EinsumDense,)
_REVERSIBLE = getattr(keras.layers, "ReversibleEmbedding", None)
"""An Embedding that also computes logits ``x E^T`` (``reverse=True``): a language model's output layer."""
_NORMALIZE = tuple(getattr(keras.layers, name) for name in ("LayerNormalization", "RMSNormalization") if hasattr(keras.layers, name))
_CONV = (keras.layers.Conv1D, keras.layers.Conv2D)
_DEPTHWISE = (keras.layers.DepthwiseConv1D, keras.layers.DepthwiseConv2D)
_SEPARABLE = (keras.layers.SeparableConv1D, keras.layers.SeparableConv2D)
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
_ELEMENTWISE = (
    keras.layers.Activation,
    keras.layers.ReLU,
    keras.layers.LeakyReLU,
    keras.layers.ELU,
    keras.layers.Softmax,
    SoftplusBeta,
)
AUGMENTATION = tuple(
    getattr(keras.layers, name)
    for name in (
        "GaussianNoise", "GaussianDropout", "AlphaDropout", "RandomFlip", "RandomRotation", "RandomTranslation",
        "RandomZoom", "RandomShear", "RandomPerspective", "RandomElasticTransform", "RandomContrast",
        "RandomBrightness", "RandomHue", "RandomSaturation", "RandomSharpness", "RandomGrayscale",
        "RandomColorJitter", "RandomColorDegeneration", "RandomInvert", "RandomErasing", "RandomGaussianBlur",
        "AugMix", "CutMix", "MixUp", "RandAugment",
    )
    if hasattr(keras.layers, name)  # the newer ones are not in every Keras 3
)
"""Layers that change their input in training only (noise, random augmentation): identity in inference.

RandomCrop is not one of them: in inference it crops (or resizes) to its size."""

_VANISH = (
    keras.layers.Dropout,
    keras.layers.SpatialDropout1D,
    keras.layers.SpatialDropout2D,
    keras.layers.Identity,
    keras.layers.InputLayer,
    *AUGMENTATION,
)
_RESHAPE = (keras.layers.Flatten, keras.layers.Reshape)
_REARRANGE = (
    keras.layers.ZeroPadding1D,
    keras.layers.ZeroPadding2D,
    keras.layers.Cropping1D,
    keras.layers.Cropping2D,
    keras.layers.Permute,
)
_AFFINE = (keras.layers.BatchNormalization, keras.layers.Rescaling, keras.layers.Normalization)
_MERGE = {
    keras.layers.Add: "add",
    keras.layers.Average: "average",
    keras.layers.Subtract: "subtract",
    keras.layers.Concatenate: "concatenate",
    keras.layers.Multiply: "multiply",
}
_OP_MERGE = {"Add": "add", "Subtract": "subtract", "Multiply": "multiply"}
"""Keras ops (``keras.ops.add`` ...) that act as a merge when both operands are tensors."""
_OP_WITH_CONSTANT = ("Add", "Subtract", "Multiply", "Divide", "TrueDivide")
"""Keras ops that act elementwise when one operand is a constant."""
_GATES = (keras.activations.sigmoid, keras.activations.hard_sigmoid)


@dataclass(frozen=True)
class LayerKind:
    """Keras layers that pass relevance the same way: one row of the documentation's layers table.

    Attributes:
        name: what the layers are, in a few words.
        classes: the Keras classes (their subclasses too, unless they override ``call``).
        relevance: how relevance passes through them, in Markdown.
    """

    name: str
    classes: tuple[type, ...]
    relevance: str


LAYER_KINDS: tuple[LayerKind, ...] = (
    LayerKind("dense", (*_DENSE, *_EINSUM), "the composite's `dense` rule (`first` where the input reaches it without another linear layer); an EinsumDense of any equation and `bias_axes`"),
    LayerKind("convolution", (*_CONV, *_DEPTHWISE, *_SEPARABLE), "the composite's `conv` rule (`first` likewise), with strides, dilation and groups; a SeparableConv as a depthwise then a pointwise step"),
    LayerKind("attention", (keras.layers.MultiHeadAttention,), "the composite's attention rule: AttnLRP (softmax rule, uniform rule on `q k^T` and `A v`) or CP-LRP (`A` held constant); its projections by the `dense` rule; self- and cross-attention, causal and sliding-window masks"),
    LayerKind("normalization", _NORMALIZE, "over the last axis, `gamma / sigma` held constant (AttnLRP's LayerNorm rule)"),
    LayerKind("embedding", (keras.layers.Embedding,), "of the model's integer input: relevance stops at each token's vector and is summed over it"),
    LayerKind("learned shift", (PositionEmbedding,), "`x + b`: split as in a sum, `b` absorbs its share"),
    LayerKind("average pooling", _AVERAGE, "in proportion to each input's share of the window's sum (Zennit's norm rule)"),
    LayerKind("max pooling", _MAX, "winner takes all: each window's relevance to its first maximal input"),
    LayerKind("activation", _ELEMENTWISE, "passed unchanged (any Keras activation; ReLU with `max_value`)"),
    LayerKind("affine", _AFFINE, "BatchNormalization after a Dense/Conv without activation is folded into it; elsewhere, and Rescaling and Normalization, pass relevance unchanged"),
    LayerKind("reshape", _RESHAPE, "reshaped back to the input's shape"),
    LayerKind("rearrange", _REARRANGE, "each entry's relevance back to where it came from; padding's zeros get none"),
    LayerKind("merge", tuple(_MERGE), "Add, Average, Subtract: in proportion to each operand's share of the sum; Concatenate: by position; Multiply: a sigmoid gate gets none, otherwise split equally"),
    LayerKind("inference identity", _VANISH, "nothing to do: dropout, noise and random augmentation are the identity in inference"),
)
"""Every Keras layer class the engine explains, grouped by how relevance passes; :func:`canonize` refuses others."""

OP_KINDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("a tensor and a constant", _OP_WITH_CONSTANT, "passed unchanged, as by an activation (`x + 3`, `x * (1/6)`)"),
    ("two tensors", tuple(_OP_MERGE), "as the merge layer of its kind"),
    ("a mean over an axis", ("Mean",), "as average pooling (keras-hub's ViT pools its tokens so)"),
    ("a constant slice", ("GetItem",), "each entry of the slice takes its relevance back, the others none (`x[:, 0]`: a [CLS] token)"),
)
"""Keras ops written into a functional model that the engine explains: (what they combine, op class names, how)."""

_EXPLAINED = tuple(cls for kind in LAYER_KINDS for cls in kind.classes)


@dataclass
class Linear:
    """A Dense, EinsumDense, Conv or DepthwiseConv layer (or one half of a SeparableConv), BatchNorm folded.

    Attributes:
        layer: the Keras layer.
        batch_norm: the BatchNormalization folded into it, or None.
        sources: the step feeding it.
        part: ``"whole"``, ``"depthwise"`` / ``"pointwise"`` for a SeparableConv's halves, or
            ``"reverse"`` for a ReversibleEmbedding called with ``reverse=True``: the logits of
            a language model, ``x E^T`` (a Dense layer without bias whose kernel is the table's
            transpose, or the layer's own reverse table where its weights are not tied).
    """

    layer: keras.layers.Layer
    batch_norm: keras.layers.BatchNormalization | None = None
    sources: tuple[int, ...] = (MODEL_INPUT,)
    part: str = "whole"

    @property
    def kind(self) -> str:
        """``"dense"`` or ``"conv"``: which of the composite's rules it gets."""
        return "dense" if isinstance(self.layer, (*_DENSE, *_EINSUM)) or self.part == "reverse" else "conv"

    @property
    def map(self) -> str:
        """The linear map: ``"dense"``, ``"einsum"``, ``"conv"`` (grouped or not) or ``"depthwise"``."""
        if isinstance(self.layer, _DENSE) or self.part == "reverse":
            return "dense"
        if isinstance(self.layer, _EINSUM):
            return "einsum"
        if isinstance(self.layer, _DEPTHWISE) or self.part == "depthwise":
            return "depthwise"
        return "conv"

    @property
    def name(self) -> str:
        return self.layer.name if self.part == "whole" else f"{self.layer.name}/{self.part}"

    @property
    def activation(self) -> Callable[[tf.Tensor], tf.Tensor] | None:
        if self.part in ("depthwise", "reverse"):
            return None
        fn = self.layer.activation
        if fn is keras.activations.leaky_relu:
            return functools.partial(leaky_relu, slope=0.2)  # keras.activations.leaky_relu's default
        return None if fn is keras.activations.linear else fn

    @property
    def stackable(self) -> bool:
        """Whether the rules may compute their several maps as one, kernels side by side.

        True for a Conv without groups: one convolution instead of two or three, where the
        kernel is small next to the input (:func:`heatinv.lrp.rules.stacks` decides per call). A
        depthwise or grouped map ties its outputs to input channels, so stacking would mix
        them. Dense is left unstacked: a product's cost is its kernel's bytes either way,
        and stacking adds a copy of the kernel per call; the mlp's z^B heatmap at batch 1
        took 0.6x the time unstacked (``scripts/engine_speed_before_after.py --before HEAD
        --models mlp --composites epsilon_gamma_box,epsilon_plus,epsilon --batches 1,64``,
        2 CPU cores: 0.59-0.77x for epsilon_gamma_box, 0.95-1.3x, no consistent
        direction, for the others).
        """
        return self.map == "conv" and getattr(self.layer, "groups", 1) == 1

    def params(self, dtype: tf.DType) -> tuple[tf.Tensor, tf.Tensor]:
        """The (kernel, bias) the step computes with: live variables, BatchNorm folded, in ``dtype``."""
        layer = self.layer
        if self.part == "depthwise":
            kernel = tf.cast(layer.depthwise_kernel, dtype)
        elif self.part == "pointwise":
            kernel = tf.cast(layer.pointwise_kernel, dtype)
        elif self.part == "reverse":
            kernel = tf.cast(tf.transpose(layer.embeddings) if layer.tie_weights else layer.reverse_embeddings, dtype)
        else:
            kernel = tf.cast(layer.kernel, dtype)
        outputs = kernel.shape[-2] * kernel.shape[-1] if self.map == "depthwise" else kernel.shape[-1]
        if getattr(layer, "bias", None) is not None and self.part != "depthwise":
            bias = tf.cast(layer.bias, dtype)  # EinsumDense: shaped to broadcast over its output
        else:
            bias = tf.zeros([] if self.map == "einsum" else [outputs], dtype)
        if self.batch_norm is None:
            return kernel, bias
        if self.map == "depthwise":
            # output channel c * multiplier + j comes from kernel[..., c, j]
            flat = tf.reshape(kernel, kernel.shape[:-2].as_list() + [outputs])
            flat, bias = fold_batch_norm(flat, bias, self.batch_norm)
            return tf.reshape(flat, kernel.shape), bias
        return fold_batch_norm(kernel, bias, self.batch_norm)

    def affine(self, x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor | None) -> tf.Tensor:
        """The layer's linear map with the given kernel and bias (no activation)."""
        if self.map == "einsum":
            z = tf.einsum(self.layer.equation, x, kernel)
        elif self.map == "dense":
            # matmul for the usual rank-2 input: tensordot's gradient copies the kernel into a transpose
            z = tf.matmul(x, kernel) if x.shape.rank == 2 else tf.tensordot(x, kernel, axes=[[x.shape.rank - 1], [0]])
        elif self.map == "depthwise":
            z = self._depthwise(x, kernel)
        elif self.part == "pointwise":
            z = tf.nn.convolution(x, kernel, padding="VALID", data_format=_CHANNELS_LAST[x.shape.rank])
        elif self._by_taps(kernel):
            (z,) = self.affine_each(x, [kernel])
        else:
            groups = getattr(self.layer, "groups", 1)
            pieces = zip(_split_channels(x, groups), tf.split(kernel, groups, axis=-1))
            z = _concat_channels([self._convolve(piece, k) for piece, k in pieces])
        return z if bias is None else z + bias

    def affine_each(self, x: tf.Tensor, kernels: list) -> list[tf.Tensor]:
        """``[x K_j for each j]`` (no bias) as one map: the kernels side by side, or, where the
        map :attr:`runs_by_taps`, one matrix product per kernel on the input's patches, taken once.

        Examples:
            >>> layer = Linear(keras.layers.Conv2D(2, 3, padding="same"))
            >>> layer.layer.build((None, 5, 5, 1))
            >>> x, kernel = tf.random.normal([1, 5, 5, 1]), tf.random.normal([3, 3, 1, 2])
            >>> product, positive = layer.affine_each(x, [kernel, tf.maximum(kernel, 0.0)])
            >>> bool(tf.reduce_max(tf.abs(product - tf.nn.convolution(x, kernel, padding="SAME"))) < 1e-5)
            True
        """
        if not self._by_taps(kernels[0]):
            return tf.split(self.affine(x, tf.concat(kernels, axis=-1), None), len(kernels), axis=-1)
        kh, kw = kernels[0].shape[:2]
        patches = patches_of(x, (kh, kw), self.layer.padding.upper())
        rows = tf.reshape(patches, [-1, kh * kw])
        spatial = [size if size is not None else tf.shape(patches)[i] for i, size in ((1, patches.shape[1]), (2, patches.shape[2]))]
        return [tf.reshape(rows @ tf.reshape(k, [kh * kw, k.shape[-1]]), [-1, *spatial, k.shape[-1]]) for k in kernels]

    @property
    def runs_by_taps(self) -> bool:
        """Whether the layer's own map runs tap by tap: a 2D convolution of one input channel, stride 1.

        A first layer on grey images, where oneDNN's kernels are off
        (:func:`heatinv.onednn.onednn_enabled`): ``x K`` as a matrix product of the input's
        patches (:func:`heatinv.lrp.one_channel.patches_of`) with the kernel. TensorFlow's
        own convolution of one channel runs at a fraction of its speed on more: at ``[256,
        28, 28, 1]`` to 16 channels, 17.0 ms forward and 11.4 ms for the filter gradient
        against 12.3 ms for the patches (once for all products) and 5.2 and 3.2 ms per
        product, on the 2-core AMD EPYC of the speed notes (``git log -- docs/notes/speed.md``); with oneDNN's kernels the
        convolution took 5.6 and 3.4 ms.
        """
        whole_conv = self.map == "conv" and self.part == "whole"  # a SeparableConv's halves have no `kernel`
        return (
            whole_conv and self._to_one_channel(self.layer.kernel) and getattr(self.layer, "groups", 1) == 1
            and not onednn_enabled()
        )

    def _by_taps(self, kernel: tf.Tensor) -> bool:
        """Whether this map with ``kernel`` runs tap by tap (not where a rule's inputs are side by side)."""
        return self.runs_by_taps and kernel.shape[-2] == 1

    def transpose(self, s, kernel, like: tf.Tensor) -> tf.Tensor:
        """``W^T s``: the adjoint of :meth:`affine`, shaped like the layer input ``like``.

        Written as an explicit transposed product/convolution rather than a nested tape:
        eager TensorFlow cannot differentiate the gradient of a convolution a second time.
        Where :attr:`stackable`, ``s`` and ``kernel`` may be lists of one length, for the sum
        ``sum_j K_j^T s_j`` as one map: the cotangents and kernels side by side, except on a
        first layer of one channel, whose two forms
        (:func:`heatinv.lrp.one_channel.single_channel_transpose`) take the pairs as they are
        (the copies side by side and their gradient's slices took 4-8 % of alpha-beta's step
        at batch 256 with oneDNN's kernels off, 8 % with them on). With ``s`` one tensor and
        ``kernel`` a list, the list ``[K_j^T s for each j]`` (see :meth:`_transpose_each`).
        """
        if isinstance(kernel, (list, tuple)) and not isinstance(s, (list, tuple)):
            return self._transpose_each(s, list(kernel), like)
        if isinstance(s, (list, tuple)):
            if self._to_one_channel(kernel[0]):
                return single_channel_transpose(s, kernel, self.layer.padding.upper())
            s, kernel = tf.concat(s, axis=-1), tf.concat(kernel, axis=-1)
        if self.map == "einsum":
            return einsum.adjoint(self.layer.equation, s, kernel, like, operand=0)
        if self.map == "dense":
            if s.shape.rank == 2:
                return tf.matmul(s, kernel, transpose_b=True)
            return tf.tensordot(s, kernel, axes=[[s.shape.rank - 1], [1]])
        if self.map == "depthwise":
            return self._depthwise_transpose(s, kernel, like)
        if self.part == "pointwise":
            return tf.nn.conv_transpose(s, kernel, output_shape=tf.shape(like), strides=1, padding="VALID")
        groups = getattr(self.layer, "groups", 1)
        pieces = zip(
            _split_channels(s, groups), tf.split(kernel, groups, axis=-1), _split_channels(like, groups)
        )
        return _concat_channels([self._convolve_transpose(piece, k, part) for piece, k, part in pieces])

    def _transpose_each(self, s: tf.Tensor, kernels: list, like: tf.Tensor) -> list[tf.Tensor]:
        """``[K_j^T s for each j]`` as one map, the kernels side by side, split after.

        On a first layer of one channel where oneDNN's kernels run, one depthwise map per
        kernel instead (:func:`heatinv.lrp.one_channel.single_channel_transpose_each`):
        oneDNN's transposed map from 16 channels to 2 took 5.0 ms at ``[256, 28, 28]`` against
        3.3-4.1 for two depthwise maps summed over their channels, and it ran alone in z^B's
        step.
        """
        if self._to_one_channel(kernels[0]) and onednn_enabled():
            return single_channel_transpose_each(s, kernels, self.layer.padding.upper())
        stacked_like = None if like is None else tf.concat([like] * len(kernels), axis=-1)
        return tf.split(self.transpose(s, tf.concat(kernels, axis=-2), stacked_like), len(kernels), axis=-1)

    def _convolve(self, x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
        layer = self.layer
        return tf.nn.convolution(
            x, kernel, strides=list(layer.strides), padding=layer.padding.upper(), dilations=list(layer.dilation_rate),
            data_format=_CHANNELS_LAST[x.shape.rank],
        )

    def _convolve_transpose(self, s: tf.Tensor, kernel: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
        if self._to_one_channel(kernel):
            return single_channel_transpose(s, kernel, self.layer.padding.upper())
        # TensorFlow's float64 CPU kernel refuses dilation > 1, so dilate the kernel instead.
        return tf.nn.conv_transpose(
            s,
            dilate_kernel(kernel, self.layer.dilation_rate),
            output_shape=tf.shape(like),
            strides=list(self.layer.strides),
            padding=self.layer.padding.upper(),
        )

    def _to_one_channel(self, kernel) -> bool:
        """Whether the map with ``kernel`` is a 2D convolution, stride 1, from one channel (its
        transposed map :func:`heatinv.lrp.one_channel.single_channel_transpose`'s); ``kernel``:
        a group's piece, or the layer's."""
        layer = self.layer
        return (
            self.map == "conv" and self.part != "pointwise" and len(kernel.shape) == 4 and kernel.shape[-2] == 1
            and set(layer.strides) == {1} and set(layer.dilation_rate) == {1}
        )

    def _depthwise(self, x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
        layer = self.layer
        one_d = x.shape.rank == 3  # a 1D depthwise convolution is a 2D one of height 1
        if one_d:
            x, kernel = x[:, None], kernel[None]
        strides, rates = _pair(layer.strides, one_d), _rates(layer.dilation_rate, one_d)
        z = tf.nn.depthwise_conv2d(
            x, dilate_kernel(kernel, rates), strides=[1, *strides, 1], padding=layer.padding.upper()
        )
        return z[:, 0] if one_d else z

    def _depthwise_transpose(self, s: tf.Tensor, kernel: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
        layer = self.layer
        one_d = like.shape.rank == 3
        if one_d:
            s, kernel, like = s[:, None], kernel[None], like[:, None]
        strides, rates = _pair(layer.strides, one_d), _rates(layer.dilation_rate, one_d)
        r = tf.nn.depthwise_conv2d_backprop_input(
            tf.shape(like),
            dilate_kernel(kernel, rates),
            s,
            strides=[1, *strides, 1],
            padding=layer.padding.upper(),
        )
        return r[:, 0] if one_d else r


def _pair(values, one_d: bool) -> tuple[int, int]:
    """2D strides or rates; a 1D map becomes a 2D one of height 1.

    TensorFlow's depthwise kernel needs equal strides, so a 1D stride is used along the
    height of 1 too, where it changes nothing.
    """
    values = tuple(values)
    return values if not one_d else (values[0], values[0])


def _rates(values, one_d: bool) -> tuple[int, int]:
    values = tuple(values)
    return (1, values[0]) if one_d else values


def _split_channels(x: tf.Tensor, groups: int) -> list[tf.Tensor]:
    return [x] if groups == 1 else tf.split(x, groups, axis=-1)


def _concat_channels(pieces: list[tf.Tensor]) -> tf.Tensor:
    return pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=-1)


@dataclass
class Pool:
    """A pooling layer: ``average`` (norm rule) or ``max`` (winner takes all)."""

    layer: keras.Operation
    kind: str
    sources: tuple[int, ...] = (MODEL_INPUT,)
    arguments: object | None = field(default=None, repr=False)

    def __call__(self, x: tf.Tensor, mask: tf.Tensor | None = None) -> tf.Tensor:
        """The pooling; ``mask``: the input's Keras mask, which GlobalAveragePooling1D averages over.
        A ``keras.ops.mean`` written into the model is an average over its axes."""
        if self.arguments is not None:
            args, kwargs = self.arguments.fill_in({id(self.arguments.keras_tensors[0]): x})
            return self.layer(*args, **kwargs)
        return self.layer.call(x) if mask is None else self.layer.call(x, mask=mask)

    @property
    def name(self) -> str:
        return self.layer.name

    def window(self, x: tf.Tensor) -> tuple[int, ...] | None:
        """The pool size when windows tile ``x``, this call's input, without overlap or padding, else None.

        Read from ``x``, not from the layer: a layer called twice sees inputs of other sizes.
        Channels-last layers only: the routings that use it lay out windows as ``[batch,
        ..., channels]``; a channels-first layer is routed through its own gradient.
        """
        size, strides = getattr(self.layer, "pool_size", None), getattr(self.layer, "strides", None)
        if size is None or tuple(size) != tuple(strides):
            return None
        if getattr(self.layer, "data_format", "channels_last") != "channels_last":
            return None
        spatial = x.shape[1:-1]
        if self.layer.padding == "same" and any(d is None or d % s for d, s in zip(spatial, size)):
            return None
        return tuple(size)


@dataclass
class Elementwise:
    """An activation layer, or a Keras op with a constant; relevance passes it unchanged.

    Attributes:
        layer: the Keras layer or op.
        sources: the step feeding it.
        arguments: for a Keras op, the recorded arguments holding its constant operand.
    """

    layer: keras.Operation
    sources: tuple[int, ...] = (MODEL_INPUT,)
    arguments: object | None = None

    def __call__(self, x: tf.Tensor, mask: tf.Tensor | None = None) -> tf.Tensor:
        """The activation; ``mask``: the input's Keras mask, which a Softmax layer applies."""
        if self.arguments is not None:
            args, kwargs = self.arguments.fill_in({id(self.arguments.keras_tensors[0]): x})
            return self.layer(*args, **kwargs)
        if mask is not None and isinstance(self.layer, keras.layers.Softmax):
            return self.layer.call(x, mask=mask)
        slope = _leaky_slope(self.layer)
        return self.layer.call(x) if slope is None else leaky_relu(x, slope)

    @property
    def name(self) -> str:
        return self.layer.name


@dataclass
class Affine:
    """BatchNormalization that cannot be folded, Rescaling or Normalization: ``x * scale + shift``.

    Relevance passes it unchanged, as Zennit passes a BatchNorm it cannot merge; computed
    in the input's dtype from the live variables (BatchNorm in inference mode).
    """

    layer: keras.layers.Layer
    sources: tuple[int, ...] = (MODEL_INPUT,)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        layer, dtype = self.layer, x.dtype
        if isinstance(layer, keras.layers.BatchNormalization):
            scale = tf.math.rsqrt(
                tf.cast(layer.moving_variance, dtype) + tf.convert_to_tensor(layer.epsilon, dtype=dtype)
            )
            if layer.scale:
                scale = scale * tf.cast(layer.gamma, dtype)
            y = (x - tf.cast(layer.moving_mean, dtype)) * scale
            return y + tf.cast(layer.beta, dtype) if layer.center else y
        if isinstance(layer, keras.layers.Rescaling):
            return x * tf.cast(layer.scale, dtype) + tf.cast(layer.offset, dtype)
        spread = tf.maximum(tf.sqrt(tf.cast(layer.variance, dtype)), tf.cast(keras.config.epsilon(), dtype))
        mean = tf.cast(layer.mean, dtype)
        return mean + x * spread if layer.invert else (x - mean) / spread

    @property
    def name(self) -> str:
        return self.layer.name


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
    sources: tuple[int, ...] = (MODEL_INPUT,)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return self.layer.call(x)

    @property
    def name(self) -> str:
        return self.layer.name


@dataclass
class Rearrange:
    """ZeroPadding, Cropping, Permute or a constant slice: entries move (or padding zeros appear); no weights.

    Relevance follows its entry back through the map's adjoint (cropping undoes padding,
    padding undoes cropping, the inverse permutation undoes a permutation, a slice's entries
    take theirs back and the others get none).

    Attributes:
        layer: the Keras layer, or the ``GetItem`` op of a slice.
        sources: the step feeding it.
        arguments: for the op, its recorded arguments holding the slice.
    """

    layer: keras.Operation
    sources: tuple[int, ...] = (MODEL_INPUT,)
    arguments: object | None = field(default=None, repr=False)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        if self.arguments is not None:
            args, kwargs = self.arguments.fill_in({id(self.arguments.keras_tensors[0]): x})
            return self.layer(*args, **kwargs)
        return self.layer.call(x)

    @property
    def name(self) -> str:
        return self.layer.name


@dataclass
class Merge:
    """A layer or op that combines several tensors: Add, Average, Subtract, Concatenate, Multiply.

    Attributes:
        layer: the Keras layer or op.
        kind: ``"add"``, ``"average"``, ``"subtract"``, ``"concatenate"`` or ``"multiply"``.
        sources: the steps feeding it, in operand order.
        gates: for ``multiply``, which operands are gates (computed by a sigmoid or
            hard-sigmoid); empty for the other kinds.
        arguments: for a Keras op, its recorded arguments.
    """

    layer: keras.Operation
    kind: str
    sources: tuple[int, ...]
    gates: tuple[bool, ...] = ()
    arguments: object | None = field(default=None, repr=False)

    def __call__(self, *operands: tf.Tensor) -> tf.Tensor:
        if self.arguments is not None:
            tensors = self.arguments.keras_tensors
            args, kwargs = self.arguments.fill_in({id(t): value for t, value in zip(tensors, operands)})
            return self.layer(*args, **kwargs)
        return self.layer.call(list(operands))

    @property
    def axis(self) -> int:
        """The concatenation axis."""
        return self.layer.axis

    @property
    def name(self) -> str:
        return self.layer.name


CONSTANT_IDS = ("ZerosLike", "OnesLike", "FullLike")
"""Ops whose ids do not depend on the input's values: an Embedding of them is a table whose rows absorb relevance."""


@dataclass
class Discrete:
    """A Keras op that computes a mask or ids: ``ids != 0`` for an Embedding's ``mask_zero``, masks
    combined, segment ids of zeros.

    Keras records mask ops in the graph where a layer takes a mask as an argument
    (GlobalAveragePooling1D's ``mask``, keras-hub's TransformerEncoder's ``padding_mask``); a step
    that reads one as its last source takes it as that mask, and an Embedding reads computed ids.
    No relevance flows through it.
    """

    layer: keras.Operation
    sources: tuple[int, ...]
    arguments: object | None = field(default=None, repr=False)

    def __call__(self, *operands: tf.Tensor) -> tf.Tensor:
        args, kwargs = self.arguments.fill_in({id(t): value for t, value in zip(self.arguments.keras_tensors, operands)})
        return self.layer(*args, **kwargs)

    @property
    def name(self) -> str:
        return self.layer.name


@dataclass
class Embed:
    """An Embedding of the model's integer input: token ids ``[batch, tokens]`` to vectors.

    Relevance stops at the token vectors, ``[batch, tokens, dim]``: the ids have none of their
    own (a token's relevance is that vector's, summed over its entries, as LXT reports it).
    ``positions``: keras-hub's PositionEmbedding inside a TokenAndPositionEmbedding, whose table
    is added to the vectors and absorbs its share.
    """

    layer: keras.layers.Embedding
    sources: tuple[int, ...] = (MODEL_INPUT,)
    positions: keras.layers.Layer | None = None

    def lookup(self, ids: tf.Tensor) -> tf.Tensor:
        """The token vectors, before any position table is added."""
        return tf.gather(self.layer.embeddings, tf.cast(ids, tf.int32))

    def __call__(self, ids: tf.Tensor) -> tf.Tensor:
        vectors = self.lookup(ids)
        return vectors if self.positions is None else vectors + position_table(self.positions, vectors)

    def mask(self, ids: tf.Tensor) -> tf.Tensor | None:
        """Where the ids are not padding (``mask_zero=True``: id 0 is padding), else None."""
        return tf.not_equal(ids, 0) if self.layer.mask_zero else None

    @property
    def name(self) -> str:
        return self.layer.name


@dataclass
class Normalize:
    """LayerNormalization or RMSNormalization over the last axis, in inference mode.

    ``y = C(x) * gamma / sigma + beta``, ``C`` the centering (LayerNormalization) or the
    identity (RMSNormalization, and LayerNormalization's ``rms_scaling``); the rule
    (:func:`heatinv.lrp.rules.layer_norm_rule`) holds ``gamma / sigma`` constant.
    """

    layer: keras.layers.Layer
    sources: tuple[int, ...] = (MODEL_INPUT,)

    def parts(self, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor | None, bool]:
        """``(scale, shift, centered)`` for the input ``x``: ``y = C(x) * scale + shift``, as Keras computes them."""
        layer, dtype = self.layer, x.dtype
        epsilon = tf.convert_to_tensor(layer.epsilon if layer.epsilon is not None else keras.config.epsilon(), dtype)
        if isinstance(layer, keras.layers.LayerNormalization) and not layer.rms_scaling:
            mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
            del mean
            centered = True
        elif isinstance(layer, keras.layers.LayerNormalization):
            variance, centered = tf.math.reduce_variance(x, axis=-1, keepdims=True), False
        else:  # RMSNormalization: the mean of the squares
            variance, centered = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True), False
        scale = tf.math.rsqrt(variance + epsilon)
        gamma = getattr(layer, "gamma", None) if isinstance(layer, keras.layers.LayerNormalization) else layer.scale
        if gamma is not None:
            scale = scale * tf.cast(gamma, dtype)
        beta = getattr(layer, "beta", None) if isinstance(layer, keras.layers.LayerNormalization) and not layer.rms_scaling else None
        return scale, None if beta is None else tf.cast(beta, dtype), centered

    def __call__(self, x: tf.Tensor, parts: tuple | None = None) -> tf.Tensor:
        """``parts``: :meth:`parts` of ``x``, where computed already."""
        scale, shift, centered = self.parts(x) if parts is None else parts
        y = (x - tf.reduce_mean(x, axis=-1, keepdims=True) if centered else x) * scale
        return y if shift is None else y + shift

    @property
    def name(self) -> str:
        return self.layer.name


@dataclass
class Shift:
    """A learned shift ``y = x + b`` (:class:`heatinv.layers.PositionEmbedding`).

    Relevance splits as in a sum (:func:`heatinv.lrp.rules.sum_rule`): ``b`` absorbs its
    share, as a bias does under LRP-0.
    """

    layer: keras.layers.Layer
    sources: tuple[int, ...] = (MODEL_INPUT,)

    def shift(self, x: tf.Tensor) -> tf.Tensor:
        """``b`` for the input ``x``: the first ``tokens`` positions' vectors."""
        return tf.cast(self.layer.embeddings[: tf.shape(x)[-2]], x.dtype)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return x + self.shift(x)

    @property
    def name(self) -> str:
        return self.layer.name


Step = Union[
    Linear, Pool, Elementwise, Affine, Reshape, Rearrange, Merge, Embed, Normalize, Shift, Attention, Discrete, EncoderBlock, Positions,
    DecoderBlock,
]


def takes_mask(step: Step) -> bool:
    """Whether the step's layer applies a Keras mask itself (GlobalAveragePooling1D, Softmax); others ignore it."""
    layer = step.layer
    if not isinstance(layer, keras.layers.Layer):
        return False
    return "mask" in inspect.signature(layer.call).parameters and not isinstance(layer, keras.layers.BatchNormalization)


def output_mask(step: Step, operands: list, masks: list) -> tf.Tensor | None:
    """The Keras mask of ``step``'s output, from its inputs' masks, as Keras passes masks along.

    An Embedding with ``mask_zero`` starts one; a layer that supports masking computes its own
    (its ``compute_mask``: most pass their first input's on, a merge layer combines them, a global
    pooling gives none); a Keras op and a layer that does not support masking drop it;
    MultiHeadAttention's output takes its query's. (MultiHeadAttention also removes the masks
    of its input tensors: :func:`heatinv.lrp.propagate.forward` follows that.)
    """
    if isinstance(step, Embed):
        return step.mask(operands[0])
    if isinstance(step, Attention):
        return masks[0]
    if isinstance(step, (Discrete, Positions)):
        return None
    layer = step.layer
    if not isinstance(layer, keras.layers.Layer) or not layer.supports_masking or all(m is None for m in masks):
        return None
    if isinstance(step, Merge):
        return layer.compute_mask(operands, masks)
    return layer.compute_mask(operands[0], masks[0])


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

    Examples:
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


def canonize(model: keras.Model) -> list[Step]:
    """The model as LRP steps in topological order; the last step computes the output.

    BatchNorm is folded into the Dense/Conv step before it when it alone reads that step's
    output and the step has no activation; Dropout, Identity and InputLayer are dropped.

    Examples:
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu")])
        >>> [type(step).__name__ for step in canonize(model)]
        ['Linear']
    """
    calls = layer_graph(model)
    readers = [0] * len(calls)
    for call in calls:
        for source in call.sources:
            if source != MODEL_INPUT:
                readers[source] += 1
    steps: list[Step] = []
    step_of = {MODEL_INPUT: MODEL_INPUT}  # call index -> index of the step computing its output
    for index, call in enumerate(calls):
        layer = call.operation
        sources = tuple(step_of[source] for source in call.sources)
        if call.discrete:
            steps.append(Discrete(layer, sources, call.arguments))
            step_of[index] = len(steps) - 1
            continue
        if type(layer).__module__.startswith("keras_hub") and not _has_rule(type(layer)):
            steps.extend(_hub_steps(layer, call, sources, steps))
            step_of[index] = len(steps) - 1
            continue
        _check_own_call(layer)
        if isinstance(layer, keras.layers.MultiHeadAttention):
            steps.append(_attention(layer, call, sources))
            step_of[index] = len(steps) - 1
            continue
        reads_ids = isinstance(layer, keras.layers.Embedding) and not type(layer).__module__.startswith("keras_hub")
        if sources and all(source != MODEL_INPUT and isinstance(steps[source], Discrete) for source in sources) and not reads_ids:
            raise UnsupportedLayerError(
                f"{type(layer).__name__} {layer.name!r} computes from boolean or integer tensors only; heatinv reads "
                "them as Keras masks (an Embedding's mask_zero) or as ids an Embedding looks up, not as values to explain."
            )
        single = call.sources[0] if len(call.sources) == 1 else None
        if isinstance(layer, _VANISH):
            step_of[index] = sources[0]
            continue
        if isinstance(layer, keras.layers.BatchNormalization):
            _check_channel_axis(layer)
            if single is not None and single != MODEL_INPUT and readers[single] == 1 and _foldable(steps[sources[0]]):
                target = steps[sources[0]]
                steps[sources[0]] = Linear(target.layer, layer, target.sources, target.part)
                step_of[index] = sources[0]
                continue
            steps.append(Affine(layer, sources))
        elif isinstance(layer, (*_DENSE, *_EINSUM, *_CONV, *_DEPTHWISE)):
            _check_linear(layer)
            steps.append(Linear(layer, sources=sources))
        elif isinstance(layer, _NORMALIZE):
            _check_last_axis(layer)
            steps.append(Normalize(layer, sources))
        elif _REVERSIBLE is not None and isinstance(layer, _REVERSIBLE) and _reverse(call):
            _check_reverse(layer)
            steps.append(Linear(layer, sources=sources, part="reverse"))
        elif isinstance(layer, keras.layers.Embedding):
            constant_ids = sources != (MODEL_INPUT,) and isinstance(steps[sources[0]], Discrete) and (
                type(steps[sources[0]].layer).__name__ in CONSTANT_IDS
            )
            if sources != (MODEL_INPUT,) and not constant_ids:
                raise UnsupportedLayerError(
                    f"Embedding {layer.name!r} reads another layer's or op's output; heatinv explains an Embedding of "
                    "the model's input (its integer token ids), or of ids that are the same for every input (one "
                    "segment: keras.ops.zeros_like(ids)). Change the ids before the model, and give it them."
                )
            steps.append(Embed(layer, sources))
        elif isinstance(layer, PositionEmbedding):
            steps.append(Shift(layer, sources))
        elif isinstance(layer, _SEPARABLE):
            _check_linear(layer)
            steps.append(Linear(layer, sources=sources, part="depthwise"))
            steps.append(Linear(layer, sources=(len(steps) - 1,), part="pointwise"))
        elif isinstance(layer, _AVERAGE):
            steps.append(Pool(layer, "average", sources))
        elif isinstance(layer, _MAX):
            steps.append(Pool(layer, "max", sources))
        elif isinstance(layer, _ELEMENTWISE):
            steps.append(Elementwise(layer, sources))
        elif isinstance(layer, _AFFINE):
            steps.append(Affine(layer, sources))
        elif isinstance(layer, _RESHAPE):
            steps.append(Reshape(layer, sources))
        elif isinstance(layer, _REARRANGE):
            steps.append(Rearrange(layer, sources))
        elif not isinstance(layer, keras.layers.Layer) and type(layer).__name__ == "Mean" and len(sources) == 1:
            steps.append(Pool(layer, "average", sources, call.arguments))  # keras-hub's ViT averages its tokens so
        elif not isinstance(layer, keras.layers.Layer) and type(layer).__name__ == "GetItem" and len(sources) == 1:
            steps.append(Rearrange(layer, sources, call.arguments))
        elif type(layer) in _MERGE:
            kind = _MERGE[type(layer)]
            steps.append(Merge(layer, kind, sources, _gates(steps, sources) if kind == "multiply" else ()))
        elif not isinstance(layer, keras.layers.Layer) and type(layer).__name__ in _OP_WITH_CONSTANT and len(sources) == 1:
            steps.append(Elementwise(layer, sources, call.arguments))
        elif not isinstance(layer, keras.layers.Layer) and type(layer).__name__ in _OP_MERGE and len(sources) == 2:
            kind = _OP_MERGE[type(layer).__name__]
            gates = _gates(steps, sources) if kind == "multiply" else ()
            steps.append(Merge(layer, kind, sources, gates, call.arguments))
        else:
            raise UnsupportedLayerError(_no_rule(layer))
        step_of[index] = len(steps) - 1
    if not any(isinstance(step, Linear) for step in steps):
        raise UnsupportedLayerError(f"Model {model.name!r} has no Dense or Conv layer to explain.")
    if step_of[len(calls) - 1] != len(steps) - 1:
        # The output call vanished (a trailing Dropout): the output is an earlier step's.
        raise UnsupportedLayerError(
            f"Model {model.name!r} ends in a {type(calls[-1].operation).__name__}, which does nothing in "
            "inference mode; remove it from the end of the model."
        )
    return steps


def _check_own_call(layer) -> None:
    """Refuse a user's subclass of a supported layer whose ``call`` is its own.

    Layers are matched to rules by class, so such a subclass would be explained as its
    parent, a function other than the one the model computes.

    Raises:
        UnsupportedLayerError: the layer's class overrides ``call`` of the Keras (or heatinv) layer it extends.
    """
    if not isinstance(layer, keras.layers.Layer) or isinstance(layer, keras.Model):
        return
    cls = type(layer)
    parent = next(c for c in cls.__mro__ if c.__module__.split(".")[0] in ("keras", "heatinv"))
    if cls is parent or cls.call is parent.call or not _has_rule(parent):
        return
    raise UnsupportedLayerError(
        f"Layer {layer.name!r} of class {cls.__name__} extends {parent.__name__} but overrides call(), so "
        f"heatinv's rule for {parent.__name__} would explain another function than the one the layer "
        "computes. Write what call() adds with supported layers (for example keras.layers.Add, Multiply, "
        "Activation or Rescaling after the layer) and rebuild the model; or, if call() computes exactly what "
        f"{parent.__name__} does, remove the override."
    )


def _has_rule(cls: type) -> bool:
    """Whether layers of class ``cls`` become a step (or vanish) in :func:`canonize`."""
    return issubclass(cls, _EXPLAINED)


def _no_rule(layer) -> str:
    """Why ``layer`` stops the graph walk, and what to do instead."""
    name = type(layer).__name__
    as_layer = getattr(keras.layers, name, None)
    if not isinstance(layer, keras.layers.Layer) and isinstance(as_layer, type) and _has_rule(as_layer):
        # keras.ops.concatenate and keras.layers.Concatenate share the class name; only the layer has a rule
        return (
            f"Keras op {layer.name!r} ({name}) has no LRP rule in heatinv; the layer of its kind has one. Use "
            f"keras.layers.{name} instead of the op, and rebuild the model."
        )
    if not isinstance(layer, keras.layers.Layer) and hasattr(keras.activations, name.lower()):
        return (
            f"Keras op {layer.name!r} ({name}) has no LRP rule in heatinv. Use the layer "
            f"keras.layers.Activation({name.lower()!r}) instead, and rebuild the model."
        )
    what = "Layer" if isinstance(layer, keras.layers.Layer) else "Keras op"
    return (
        f"{what} {layer.name!r} of class {name} has no LRP rule in heatinv, so the model cannot be explained "
        "through it. Rebuild the model from supported layers, apply a preprocessing layer to the data "
        f"before the model, or explain the part after it as a model of its own. Supported layers: {SUPPORTED}."
    )


def _foldable(step: Step) -> bool:
    # An EinsumDense's output channels need not be its kernel's last axis, which the fold scales.
    return isinstance(step, Linear) and step.map != "einsum" and step.activation is None and step.batch_norm is None


def _attention(layer: keras.layers.MultiHeadAttention, call, sources: tuple) -> Attention:
    """The step of a MultiHeadAttention call: which sources feed its query, value and key."""
    arguments = call.arguments
    args, kwargs = list(arguments.args), dict(arguments.kwargs)
    names = ("query", "value", "key")
    given = {name: args[i] if i < len(args) else kwargs.pop(name, None) for i, name in enumerate(names)}
    for name in names[: len(args)]:
        kwargs.pop(name, None)
    unsupported = sorted(
        key for key, value in kwargs.items()
        if key in ("attention_mask", "query_mask", "value_mask", "key_mask") and value is not None
        or key == "return_attention_scores" and value
    )
    if unsupported or isinstance(kwargs.get("use_causal_mask"), keras.KerasTensor):
        raise UnsupportedLayerError(
            f"MultiHeadAttention {layer.name!r} is called with {', '.join(unsupported) or 'a tensor use_causal_mask'}; "
            "heatinv explains attention masked by use_causal_mask=True, the layer's sliding_window, and padding "
            "masked through Keras masks: give the Embedding mask_zero=True (id 0 is padding) instead of a mask argument."
        )
    problems = []
    if len(layer.attention_axes or (1,)) != 1 or layer.query_dense.kernel.shape.rank != 3:
        problems.append(f"attention_axes={layer.attention_axes} (heatinv explains attention over the tokens of [batch, tokens, dim] inputs)")
    if getattr(layer, "_use_gate", False):
        problems.append("use_gate=True")
    if problems:
        raise UnsupportedLayerError(f"MultiHeadAttention {layer.name!r} uses " + ", ".join(problems) + ".")
    source_of = {id(tensor): source for tensor, source in zip(arguments.keras_tensors, sources)}
    roles = [source_of[id(given["query"])], source_of[id(given["value"])]]
    if given["key"] is not None:
        roles.append(source_of[id(given["key"])])
    projections = _projections(layer)
    return Attention(layer, tuple(roles), projections, causal=bool(kwargs.get("use_causal_mask", False)))


def checked_linear(layer: keras.layers.Layer, sources: tuple[int, ...] = (MODEL_INPUT,)) -> Linear:
    """A Linear step of a Dense or EinsumDense inside a bigger layer, checked as the graph's own are (not quantized)."""
    _check_linear(layer)
    return Linear(layer, sources=sources)


def _projections(mha: keras.layers.MultiHeadAttention) -> tuple:
    """The query, key, value and output EinsumDense layers of an attention, as checked Linear steps."""
    _check_attention_class(mha)
    return tuple(checked_linear(dense) for dense in (mha.query_dense, mha.key_dense, mha.value_dense, mha.output_dense))


def _check_attention_class(mha: keras.layers.MultiHeadAttention) -> None:
    """Refuse a subclass that computes its attention its own way (its ``call`` is checked with every layer's)."""
    own = [name for name in ("_compute_attention", "_masked_softmax")
           if getattr(type(mha), name) is not getattr(keras.layers.MultiHeadAttention, name)]
    if own:
        raise UnsupportedLayerError(
            f"Layer {mha.name!r} of class {type(mha).__name__} extends MultiHeadAttention but overrides {', '.join(own)}, "
            "so heatinv's rules for MultiHeadAttention would explain another function than the one it computes."
        )


def _hub_steps(layer: keras.layers.Layer, call, sources: tuple[int, ...], steps: list) -> list[Step]:
    """The steps of a keras-hub layer's call (:mod:`heatinv.lrp.keras_hub`), or a refusal naming it.

    A TransformerEncoder's ``padding_mask`` argument, computed from the ids, is its second source.
    """
    given = {key for key, value in (call.arguments.kwargs if call.arguments is not None else {}).items() if value is not None}
    masks = [source for source in sources[1:] if source != MODEL_INPUT and isinstance(steps[source], Discrete)]
    extra = sorted(given - {"training", *({"padding_mask", "decoder_padding_mask"} if masks else ())})
    if extra or len(sources) - len(masks) != 1:
        raise UnsupportedLayerError(
            f"keras-hub {type(layer).__name__} {layer.name!r} is called with {', '.join(extra) or f'{len(sources)} tensors'}; "
            "heatinv explains keras-hub layers called on one tensor, padding masked through the Keras mask of an "
            "Embedding with mask_zero=True (or keras-hub's TokenAndPositionEmbedding with mask_zero=True)."
        )
    if hub_class(layer, "TokenAndPositionEmbedding"):
        if sources != (MODEL_INPUT,):
            raise UnsupportedLayerError(f"keras-hub TokenAndPositionEmbedding {layer.name!r} must read the model's input (token ids).")
        return [Embed(layer.token_embedding, sources, positions=layer.position_embedding)]
    if hub_class(layer, "PositionEmbedding"):
        return [Positions(layer, sources)]
    if hub_class(layer, "TransformerEncoder"):
        mha = layer._self_attention_layer
        projections = _projections(mha)
        norms = (Normalize(layer._self_attention_layer_norm), Normalize(layer._feedforward_layer_norm))
        dense = (checked_linear(layer._feedforward_intermediate_dense), checked_linear(layer._feedforward_output_dense))
        return [EncoderBlock(layer, sources, Attention(mha, (sources[0], sources[0]), projections), norms, dense, layer.normalize_first)]
    if type(layer).__name__ == "ViTPatchingAndEmbedding" and layer.data_format == "channels_last":
        return [PatchEmbedding(layer, sources, checked_linear(layer.patch_embedding))]
    if type(layer).__name__ == "ViTEncoder":
        return vit_encoder_steps(layer, sources[0], len(steps), _projections, checked_linear, Normalize)
    if type(layer).__name__ == "LlamaTransformerDecoder":
        mha = layer._self_attention_layer
        projections = tuple(checked_linear(dense) for dense in (mha._query_dense, mha._key_dense, mha._value_dense, mha._output_dense))
        norms = (Normalize(layer._self_attention_layernorm), Normalize(layer._feedforward_layernorm))
        feedforward = tuple(
            checked_linear(dense)
            for dense in (layer._feedforward_gate_dense, layer._feedforward_intermediate_dense, layer._feedforward_output_dense)
        )
        return [DecoderBlock(layer, sources, norms, projections, feedforward)]
    if type(layer).__name__ == "LlamaLayerNorm":
        return [Normalize(layer, sources)]
    raise UnsupportedLayerError(
        f"keras-hub layer {layer.name!r} of class {type(layer).__name__} has no LRP rule in heatinv; of keras-hub's "
        f"layers heatinv explains {', '.join(COVERED)}. Rebuild that part from Keras layers (MultiHeadAttention, "
        "LayerNormalization, Dense, Embedding) or explain the part after it as a model of its own."
    )


def _reverse(call) -> bool:
    """Whether a ReversibleEmbedding's call computes logits (``reverse=True``, by name or second argument)."""
    if call.arguments is None:
        return False
    args = call.arguments.args
    return bool(call.arguments.kwargs.get("reverse", args[1] if len(args) > 1 else False))


def _check_reverse(layer) -> None:
    """Refuse what a ReversibleEmbedding adds to ``x E^T`` in reverse: a soft cap (a tanh) or another dtype."""
    problems = [f"{name}={getattr(layer, name)!r}" for name in ("logit_soft_cap", "reverse_dtype") if getattr(layer, name, None) is not None]
    if problems or getattr(layer, "quantization_mode", None) is not None:
        raise UnsupportedLayerError(
            f"ReversibleEmbedding {layer.name!r} computes its logits with {', '.join(problems) or 'a quantized table'}; "
            "heatinv explains the logits x E^T of a float table without a soft cap or a dtype of their own."
        )


def _check_last_axis(layer: keras.layers.Layer) -> None:
    axis = layer.axis if isinstance(layer.axis, int) else (layer.axis[0] if len(layer.axis) == 1 else None)
    rank = len(layer.input.shape) if hasattr(layer, "input") else None
    if axis is None or (axis != -1 and rank is not None and axis != rank - 1):
        raise UnsupportedLayerError(
            f"{type(layer).__name__} {layer.name!r} normalizes axis {layer.axis}; heatinv handles normalization "
            "over the last axis (the features of each token or position) only."
        )


def _gates(steps: list[Step], sources: tuple[int, ...]) -> tuple[bool, ...]:
    """Which operands of a product are gates: computed by a sigmoid or a hard-sigmoid."""
    return tuple(source != MODEL_INPUT and _is_gate(steps, source) for source in sources)


def _is_gate(steps: list[Step], index: int) -> bool:
    step = steps[index]
    if isinstance(step, Linear):
        return step.activation in _GATES
    if not isinstance(step, Elementwise):
        return False
    layer = step.layer
    if isinstance(layer, keras.layers.Activation):
        return layer.activation in _GATES
    return _is_hard_sigmoid_from_ops(steps, index)


def _is_hard_sigmoid_from_ops(steps: list[Step], index: int) -> bool:
    """``relu6(x + 3) / 6`` written with Keras ops, as MobileNetV3 writes its hard-sigmoid."""
    scaled = steps[index]
    if scaled.arguments is None or type(scaled.layer).__name__ not in ("Multiply", "Divide", "TrueDivide"):
        return False
    relu = steps[scaled.sources[0]] if scaled.sources[0] != MODEL_INPUT else None
    if not (isinstance(relu, Elementwise) and isinstance(relu.layer, keras.layers.ReLU) and relu.layer.max_value == 6):
        return False
    shifted = steps[relu.sources[0]] if relu.sources[0] != MODEL_INPUT else None
    return isinstance(shifted, Elementwise) and shifted.arguments is not None and type(shifted.layer).__name__ == "Add"


def _check_equation(layer: keras.layers.EinsumDense) -> None:
    first, second, output = einsum.parse(layer.equation)
    summed_alone = [index for index in first if index not in second + output and index != "."]
    if summed_alone and "." in first:
        raise UnsupportedLayerError(
            f"EinsumDense {layer.name!r} sums its input over {', '.join(summed_alone)} and broadcasts with '...' "
            f"({layer.equation!r}); heatinv's adjoint of such an equation needs named axes. Write the equation "
            "without '...'."
        )


def _check_channel_axis(batch_norm: keras.layers.BatchNormalization) -> None:
    axis = batch_norm.axis if isinstance(batch_norm.axis, int) else batch_norm.axis[0]
    rank = len(batch_norm.input.shape) if hasattr(batch_norm, "input") else None
    if axis != -1 and rank is not None and axis != rank - 1:
        raise UnsupportedLayerError(
            f"BatchNormalization {batch_norm.name!r} normalizes axis {axis}; heatinv handles only a "
            "BatchNormalization over the last (channel) axis."
        )


def _check_linear(layer: keras.layers.Layer) -> None:
    if getattr(layer, "quantization_mode", None) is not None:
        raise UnsupportedLayerError(
            f"Layer {layer.name!r} ({type(layer).__name__}) is quantized ({layer.quantization_mode}); heatinv "
            "explains floating-point kernels. Explain the model before quantizing it."
        )
    if isinstance(layer, _EINSUM):
        _check_equation(layer)
        return
    if isinstance(layer, _DENSE):
        return
    problems = []
    if layer.data_format != "channels_last":
        problems.append(f"data_format={layer.data_format!r} (use 'channels_last')")
    if layer.padding not in ("valid", "same"):
        problems.append(f"padding={layer.padding!r} (use 'valid' or 'same')")
    if isinstance(layer, (*_DEPTHWISE, *_SEPARABLE)):
        strides = tuple(layer.strides)
        if len(set(strides)) > 1:
            problems.append(f"strides={strides} (TensorFlow's depthwise convolution needs equal strides)")
        if max(strides) > 1 and max(layer.dilation_rate) > 1:
            problems.append("both strides and dilation above 1 (use one of them)")
    if problems:
        raise UnsupportedLayerError(f"Layer {layer.name!r} ({type(layer).__name__}) uses " + ", ".join(problems) + ".")
