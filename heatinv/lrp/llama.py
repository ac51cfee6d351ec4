"""keras-hub's Llama decoder block as one LRP step: rotary attention, grouped keys, a gated MLP.

``LlamaTransformerDecoder`` (keras-hub's Llama, and the decoder-only language models built the
same way) computes, for the tokens ``x`` ``[batch, tokens, dim]``, in inference mode:

    h = RMSNorm1(x)
    q = rot(h W_q),  k = rot(h W_k),  v = h W_v              (EinsumDense, no bias)
    S = q k^T / sqrt(head_dim),  A = softmax(S)             (causal, padding columns masked)
    y = x + (A v) W_o                                        (keys and values repeated per group)
    g = RMSNorm2(y)
    out = y + ((g W_up) * silu(g W_gate)) W_down

``rot`` rotates each pair of features ``(i, i + head_dim/2)`` of the token at position ``p`` by
the angle ``p * f_i`` (rotary position embeddings): a linear map by constants. Relevance flows
back through the same operations (Achtibat et al. 2024, as LXT 2.1 explains Llama): the
projections by the composite's dense rule (LRP-0 in ``attnlrp``), the rotation by LRP-0
(``R_in = x J^T (R / stab(rot(x)))``, ``J^T`` the rotation by ``-p f_i``), the repetition of
keys and values by summing the copies' relevance, the attention products and softmax as in
:mod:`heatinv.lrp.attention`, the gate's product by the uniform rule (half to ``g W_up``, half
to ``silu(g W_gate)``), SiLU by the identity rule, the RMSNorms with ``1/sigma`` held constant,
and the residual sums in proportion. CP-LRP (Ali et al. 2022) holds the attention weights and
the gate constant: ``v`` and ``g W_up`` get all of their products' relevance.

keras-hub computes the RMSNorms and the softmax in float32 whatever the model's dtype; heatinv
computes them in the input's dtype, so a float64 model's logits differ from keras-hub's by the
float32 rounding (about 1e-7 relative) and equal them in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from heatinv.lrp.attention import masked_score
from heatinv.lrp.rules import layer_norm_rule, softmax_rule, stabilized_ratio, sum_rule, uniform_rule

SCORES = "bquh,bkuh->buqk"
"""``q k^T`` per head, as keras-hub's LlamaAttention writes it."""
COMBINE = "buqk,bkuh->bquh"
"""``A v`` per head."""


def rotate(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
    """Rotary position embedding: ``x cos + half(x) sin``, ``half(x) = [-x2, x1]`` for the halves ``x1, x2``.

    ``x``: ``[batch, tokens, heads, head_dim]``; ``cos``, ``sin``: broadcastable to it. With
    ``-sin`` it is the transpose (the inverse rotation).

    Examples:
        >>> x = tf.constant([[[[1.0, 0.0]]]])
        >>> rotate(x, tf.constant(0.0), tf.constant(1.0)).numpy().ravel().tolist()
        [0.0, 1.0]
    """
    first, second = tf.split(x, 2, axis=-1)
    return x * cos + tf.concat([-second, first], axis=-1) * sin


def repeat_heads(x: tf.Tensor, groups: int) -> tf.Tensor:
    """Each of the ``[batch, tokens, heads, dim]`` heads repeated ``groups`` times in a row (``ops.repeat``).

    Examples:
        >>> repeat_heads(tf.reshape(tf.range(2.0), [1, 1, 2, 1]), 2).numpy().ravel().tolist()
        [0.0, 0.0, 1.0, 1.0]
    """
    return x if groups == 1 else tf.repeat(x, groups, axis=2)


def sum_heads(relevance: tf.Tensor, groups: int) -> tf.Tensor:
    """The adjoint of :func:`repeat_heads`: each head's copies' relevance summed.

    Examples:
        >>> sum_heads(tf.reshape(tf.range(4.0), [1, 1, 4, 1]), 2).numpy().ravel().tolist()
        [1.0, 5.0]
    """
    if groups == 1:
        return relevance
    shape = tf.shape(relevance)
    grouped = tf.reshape(relevance, [shape[0], shape[1], -1, groups, relevance.shape[-1]])
    return tf.reduce_sum(grouped, axis=3)


@dataclass
class DecoderValues:
    """A DecoderBlock call's forward values, in the order its ``call`` computes them."""

    x: tf.Tensor
    first_norm: tuple
    attention_input: tf.Tensor
    products: tuple[tf.Tensor, tf.Tensor, tf.Tensor]
    rotation: tuple[tf.Tensor, tf.Tensor]
    query: tf.Tensor
    key: tf.Tensor
    value: tf.Tensor
    raw_scores: tf.Tensor
    scores: tf.Tensor
    mask: tf.Tensor
    weights: tf.Tensor
    context: tf.Tensor
    attention_product: tf.Tensor
    first_sum: tf.Tensor
    second_norm: tuple
    feedforward_input: tf.Tensor
    gate_product: tf.Tensor
    gate: tf.Tensor
    up: tf.Tensor
    gated: tf.Tensor
    down: tf.Tensor
    second_sum: tf.Tensor


@dataclass
class DecoderBlock:
    """keras-hub's ``LlamaTransformerDecoder`` in inference mode (dropout off, no cache).

    Attributes:
        layer: the keras-hub layer.
        sources: the step feeding it, and the step computing its ``decoder_padding_mask`` where given.
        norms: its two LlamaLayerNorms as :class:`~heatinv.lrp.canonical.Normalize` steps.
        projections: the attention's query, key, value and output EinsumDense layers as
            :class:`~heatinv.lrp.canonical.Linear` steps.
        feedforward: its gate, up (``intermediate``) and down (``output``) Dense layers as Linear steps.
    """

    layer: keras.layers.Layer
    sources: tuple[int, ...]
    norms: tuple[Any, Any]
    projections: tuple[Any, Any, Any, Any]
    feedforward: tuple[Any, Any, Any]

    @property
    def name(self) -> str:
        return self.layer.name

    @property
    def attention(self) -> keras.layers.Layer:
        return self.layer._self_attention_layer

    def forward(self, x: tf.Tensor, padding: tf.Tensor | None = None, keras_mask: tf.Tensor | None = None) -> DecoderValues:
        """``padding``: the call's ``decoder_padding_mask`` ``[batch, tokens]`` (nonzero: a token), masking the
        attention's columns; without it the input's Keras mask does, as keras-hub merges them."""
        dtype = x.dtype
        norm1, norm2 = self.norms
        first_norm = norm1.parts(x)
        h = norm1(x, first_norm)
        query_map, key_map, value_map, output_map = self.projections
        products = tuple(linear.affine(h, linear.params(dtype)[0], None) for linear in (query_map, key_map, value_map))
        cos, sin = self._rotation(products[0], dtype)
        query, key = rotate(products[0], cos, sin), rotate(products[1], cos, sin)
        groups = self.attention.num_key_value_groups
        raw_scores = tf.einsum(SCORES, query, repeat_heads(key, groups))
        scores = raw_scores * keras.ops.cast(self.attention._inv_norm_factor, dtype)  # through floatx, as keras-hub's
        mask = self._mask(x, padding if padding is not None else keras_mask)
        weights = tf.nn.softmax(tf.where(mask, scores, tf.cast(masked_score(dtype, fused=False), dtype)), axis=-1)
        weights = tf.where(mask, weights, tf.zeros_like(weights))
        context = tf.einsum(COMBINE, weights, repeat_heads(products[2], groups))
        attention_product = output_map.affine(context, output_map.params(dtype)[0], None)
        first_sum = attention_product + x
        second_norm = norm2.parts(first_sum)
        g = norm2(first_sum, second_norm)
        gate_map, up_map, down_map = self.feedforward
        gate_product = gate_map.affine(g, gate_map.params(dtype)[0], None)
        gate = self.layer.activation(gate_product)
        up = up_map.affine(g, up_map.params(dtype)[0], None)
        gated = up * gate
        down = down_map.affine(gated, down_map.params(dtype)[0], None)
        return DecoderValues(
            x, first_norm, h, products, (cos, sin), query, key, products[2], raw_scores, scores, mask, weights, context,
            attention_product, first_sum, second_norm, g, gate_product, gate, up, gated, down, down + first_sum,
        )

    def output(self, values: DecoderValues) -> tf.Tensor:
        return values.second_sum

    def _rotation(self, like: tf.Tensor, dtype: tf.DType) -> tuple[tf.Tensor, tf.Tensor]:
        """``cos``, ``sin`` ``[1, tokens, 1, head_dim]`` of positions 0, 1, ... as the layer's rotary embedding computes them."""
        cos, sin = self.attention.rotary_embedding_layer._compute_cos_sin_embedding(like, start_index=0)
        return tf.cast(cos, dtype), tf.cast(sin, dtype)

    @staticmethod
    def _mask(x: tf.Tensor, columns: tf.Tensor | None) -> tf.Tensor:
        """Where attention is allowed, ``[batch or 1, 1, tokens, tokens]``: causal, padding columns removed."""
        tokens = tf.range(tf.shape(x)[1])
        mask = (tokens[:, None] >= tokens[None, :])[None, None]
        if columns is not None:
            mask = mask & tf.cast(columns, tf.bool)[:, None, None, :]
        return mask

    def relevance(self, values: DecoderValues, relevance: tf.Tensor, composite) -> list:
        """The relevance of the block's input (and None for the padding mask), from that of its output."""
        rule, stabilizer, dtype = composite.dense, composite.stabilizer, relevance.dtype
        constant = composite.attention == "cp"

        def dense(linear, a, r, product):
            known = {"product": product} if rule.takes_product else {}
            return rule(a, *linear.params(dtype), r, linear, **known)

        def norm(parts, a, r):
            return layer_norm_rule(a, r, *parts, stabilizer)

        gate_map, up_map, down_map = self.feedforward
        to_down, to_y = sum_rule([values.down, values.first_sum], relevance, stabilizer)
        to_gated = dense(down_map, values.gated, to_down, values.down)
        # uniform rule on the product (CP-LRP: the gate is constant), identity rule on SiLU
        to_up, to_gate = (to_gated, None) if constant else (to_gated / 2, to_gated / 2)
        to_g = dense(up_map, values.feedforward_input, to_up, values.up)
        if to_gate is not None:
            to_g = to_g + dense(gate_map, values.feedforward_input, to_gate, values.gate_product)
        to_first_sum = to_y + norm(values.second_norm, values.first_sum, to_g)
        to_attention, to_x = sum_rule([values.attention_product, values.x], to_first_sum, stabilizer)
        to_h = self._attention_relevance(values, to_attention, dense, constant, stabilizer)
        return [to_x + norm(values.first_norm, values.x, to_h), *[None] * (len(self.sources) - 1)]

    def _attention_relevance(self, values: DecoderValues, relevance: tf.Tensor, dense, constant: bool, stabilizer: float):
        """The relevance of the attention's input ``h``, from that of its output."""
        query_map, key_map, value_map, output_map = self.projections
        groups = self.attention.num_key_value_groups
        to_context = dense(output_map, values.context, relevance, values.attention_product)
        values_repeated = repeat_heads(values.value, groups)
        q_product, k_product, v_product = values.products
        if constant:
            _, to_value = uniform_rule(COMBINE, values.weights, values_repeated, to_context, stabilizer, (0.0, 1.0), values.context)
            return dense(value_map, values.attention_input, sum_heads(to_value, groups), v_product)
        to_weights, to_value = uniform_rule(COMBINE, values.weights, values_repeated, to_context, stabilizer, product=values.context)
        to_scores = softmax_rule(values.scores, values.weights, to_weights)
        to_scores = tf.where(values.mask, to_scores, tf.zeros_like(to_scores))
        to_query, to_key = uniform_rule(
            SCORES, values.query, repeat_heads(values.key, groups), to_scores, stabilizer, product=values.raw_scores
        )
        cos, sin = values.rotation

        def unrotate(before, after, r):  # LRP-0 through the rotation
            return before * rotate(stabilized_ratio(r, after, stabilizer), cos, -sin)

        to_q = unrotate(q_product, values.query, to_query)
        to_k = unrotate(k_product, values.key, sum_heads(to_key, groups))
        return (
            dense(query_map, values.attention_input, to_q, q_product)
            + dense(key_map, values.attention_input, to_k, k_product)
            + dense(value_map, values.attention_input, sum_heads(to_value, groups), v_product)
        )
