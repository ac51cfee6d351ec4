"""Keras ``MultiHeadAttention`` as one LRP step: its forward pass kept, its relevance by AttnLRP or CP-LRP.

The layer computes, for a query input ``x_q`` and a value input ``x_v`` (the key input is
the value input unless given):

    q = x_q W_q + b_q,  k = x_k W_k + b_k,  v = x_v W_v + b_v        (EinsumDense)
    S = (q / sqrt(key_dim)) k^T                                      (per head)
    A = softmax(S) over the keys, masked positions 0
    O = A v,  output = O W_o + b_o                                    (EinsumDense)

Relevance flows back through the same ops (Achtibat et al. 2024): the four projections by
the composite's dense rule (LRP-0 in ``attnlrp``), ``A v`` and ``q k^T`` by the uniform rule
(half to each factor, :func:`heatinv.lrp.rules.uniform_rule`), the softmax by AttnLRP's
rule (:func:`heatinv.lrp.rules.softmax_rule`), and the scaling of ``q`` passes relevance
unchanged. CP-LRP (Ali et al. 2022) holds ``A`` constant: ``v`` gets all of ``A v``'s
relevance and ``q``, ``k`` none. Every value is an ordinary tensor of the forward pass, so
a tape around the heatmap differentiates through ``A`` and the projections' weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from heatinv.lrp.rules import softmax_rule, uniform_rule

ATTENTION_RULES = ("attnlrp", "cp")
"""How relevance crosses the attention weights: AttnLRP's uniform and softmax rules, or CP-LRP's constant ``A``."""

def masked_score(dtype: tf.DType, fused: bool) -> float:
    """What Keras puts in place of a masked score: its fused ``dot_product_attention`` 0.7 of the largest
    float (of float16's 65500 in float16, TensorFlow backend), its ``keras.layers.Softmax`` -1e9 (-3e4)."""
    half = dtype == tf.float16
    if fused:
        return -0.7 * (65500.0 if half else 3.38953e38)
    return -3e4 if half else -1e9


@dataclass
class AttentionValues:
    """What the relevance pass needs of one attention call's forward pass.

    Attributes:
        inputs: the query, value and key inputs ``[batch, tokens, dim]``.
        products: the query, key and value projections' ``x W`` (no bias), for their rules.
        projected: ``q / sqrt(key_dim)``, ``k``, ``v``: ``[batch, tokens, heads, dim]``.
        scores: ``S``, ``[batch, heads, query tokens, key tokens]``, before masking.
        mask: where attention is allowed, broadcastable to ``S``, or None.
        weights: ``A``, masked positions 0.
        context: ``O = A v``, ``[batch, query tokens, heads, value_dim]``.
        output_product: ``O W_o`` (no bias).
    """

    inputs: tuple[tf.Tensor, tf.Tensor, tf.Tensor]
    products: tuple[tf.Tensor, tf.Tensor, tf.Tensor]
    projected: tuple[tf.Tensor, tf.Tensor, tf.Tensor]
    scores: tf.Tensor
    mask: tf.Tensor | None
    weights: tf.Tensor
    context: tf.Tensor
    output_product: tf.Tensor


@dataclass
class Attention:
    """A ``keras.layers.MultiHeadAttention`` call on ``[batch, tokens, dim]`` inputs.

    Attributes:
        layer: the Keras layer.
        sources: the steps feeding the query and value inputs, and the key input where the
            call names one.
        projections: the query, key, value and output ``EinsumDense`` layers as linear steps
            (:class:`heatinv.lrp.canonical.Linear`).
        causal: the call's ``use_causal_mask``.
    """

    layer: keras.layers.MultiHeadAttention
    sources: tuple[int, ...]
    projections: tuple[Any, Any, Any, Any]
    causal: bool = False

    @property
    def name(self) -> str:
        return self.layer.name

    def __call__(self, *operands: tf.Tensor, masks=()) -> tf.Tensor:
        return self.output(self.forward(*operands, masks=masks))

    def forward(self, query: tf.Tensor, value: tf.Tensor, key: tf.Tensor | None = None, masks=()) -> AttentionValues:
        """The layer's computation in inference mode (dropout off), keeping what the rules need.

        ``masks``: the Keras masks of the query, value (and key) inputs, ``[batch, tokens]`` or None.
        Masked positions get a score Keras's way: with dropout 0 (the fused path) a huge negative
        score and no zeroing afterwards (a query whose keys are all masked attends uniformly),
        with dropout > 0 (the einsum path, ``keras.layers.Softmax``) ``-1e9`` and weights set
        to 0 afterwards.
        """
        key = value if key is None else key
        query_map, key_map, value_map, _ = self.projections
        dtype = query.dtype
        products, projected = [], []
        for linear, x in ((query_map, query), (key_map, key), (value_map, value)):
            kernel, bias = linear.params(dtype)
            products.append(linear.affine(x, kernel, None))
            projected.append(products[-1] + bias)
        q, k, v = projected
        q = q * self.scale(dtype)
        scores = tf.einsum(self.layer._dot_product_equation, k, q)
        mask = self._mask(query, key, *masks)
        fused = self.layer.dropout == 0.0
        masked = scores if mask is None else tf.where(mask, scores, tf.cast(masked_score(dtype, fused), dtype))
        weights = tf.nn.softmax(masked, axis=-1)
        if mask is not None and not fused:
            weights = tf.where(mask, weights, tf.zeros_like(weights))
        context = tf.einsum(self.layer._combine_equation, weights, v)
        output_map = self.projections[3]
        output_product = output_map.affine(context, output_map.params(dtype)[0], None)
        return AttentionValues((query, value, key), tuple(products), (q, k, v), scores, mask, weights, context, output_product)

    def scale(self, dtype: tf.DType) -> tf.Tensor:
        """``1 / sqrt(key_dim)`` in ``dtype`` as the layer computes it.

        Keras casts the Python float to the compute dtype, which goes through float32 in
        its fused path (dropout 0: ``tf.cast`` of a Python float) and through Keras's floatx
        in its einsum path (``keras.ops.cast``): in float64 the scale differs from the exact
        one by up to 6e-8 relative (1.8e-8 for key_dim 3), and so do the layer's outputs.
        """
        inverse = self.layer._inverse_sqrt_key_dim
        if self.layer.dropout > 0.0:
            return keras.ops.cast(inverse, dtype)
        return tf.cast(inverse, dtype)

    def output(self, values: AttentionValues) -> tf.Tensor:
        """The layer's output from its kept values: ``O W_o + b_o``."""
        return values.output_product + self.projections[3].params(values.context.dtype)[1]

    def _mask(self, query: tf.Tensor, key: tf.Tensor, query_mask=None, value_mask=None, key_mask=None) -> tf.Tensor | None:
        """Where attention is allowed, ``[batch or 1, 1, T, S]``, as Keras combines its masks; or None.

        The query's Keras mask removes rows, the value's and key's columns; ``use_causal_mask``
        and ``sliding_window`` add theirs.
        """
        rows = tf.range(tf.shape(query)[1])[:, None]
        columns = tf.range(tf.shape(key)[1])[None, :]
        mask = None

        def both(a, b):
            return b if a is None else a & b

        if query_mask is not None:
            mask = tf.cast(query_mask, tf.bool)[:, :, None]
        for given in (value_mask, key_mask):
            if given is not None:
                mask = both(mask, tf.cast(given, tf.bool)[:, None, :])
        if self.causal:
            mask = both(mask, (rows >= columns)[None])
        window = getattr(self.layer, "_sliding_window", None)
        if window is not None:
            mask = both(mask, (tf.abs(rows - columns) < window)[None])
        return None if mask is None else mask[:, None]

    def relevance(self, values: AttentionValues, relevance: tf.Tensor, rule, attention: str, stabilizer: float) -> list:
        """The relevance of the query, value (and key) inputs, in the order of :attr:`sources`.

        Args:
            values: the call's forward values.
            relevance: of the layer's output, ``[batch, query tokens, dim]``.
            rule: the composite's rule for the projections (a Dense rule).
            attention: ``"attnlrp"`` or ``"cp"`` (:data:`ATTENTION_RULES`).
            stabilizer: of the products' divisions.
        """
        query_map, key_map, value_map, output_map = self.projections
        dtype = relevance.dtype

        def through(linear, x, r, product):
            if r is None:
                return None
            known = {"product": product} if rule.takes_product else {}
            return rule(x, *linear.params(dtype), r, linear, **known)

        to_context = through(output_map, values.context, relevance, values.output_product)
        q, k, v = values.projected
        combine, dot_product = self.layer._combine_equation, self.layer._dot_product_equation
        if attention == "cp":
            _, to_v = uniform_rule(combine, values.weights, v, to_context, stabilizer, (0.0, 1.0), product=values.context)
            to_q = to_k = None
        else:
            to_weights, to_v = uniform_rule(combine, values.weights, v, to_context, stabilizer, product=values.context)
            to_scores = softmax_rule(values.scores, values.weights, to_weights)
            if values.mask is not None:
                to_scores = tf.where(values.mask, to_scores, tf.zeros_like(to_scores))
            to_k, to_q = uniform_rule(dot_product, k, q, to_scores, stabilizer, product=values.scores)
        query, value, key = values.inputs
        q_product, k_product, v_product = values.products
        shares = [through(query_map, query, to_q, q_product), through(value_map, value, to_v, v_product)]
        to_key = through(key_map, key, to_k, k_product)
        if len(self.sources) == 3:
            return [*shares, to_key]
        if to_key is not None:  # the key input is the value input
            shares[1] = to_key if shares[1] is None else shares[1] + to_key
        return shares
