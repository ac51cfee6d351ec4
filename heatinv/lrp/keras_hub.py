"""keras-hub's transformer layers as LRP steps: encoders, decoders, position tables, and model adapters.

keras-hub (``pip install keras-hub``) writes its layers as Python ``call`` methods over Keras
layers and ops, so the graph walk sees one call where there are many operations. These steps
compute what those ``call`` methods compute, from the same sub-layers' live variables, and
hand relevance back through the parts with the rules of the parts:

- ``keras_hub.layers.TransformerEncoder``: :class:`EncoderBlock` (its MultiHeadAttention by
  :class:`heatinv.lrp.attention.Attention`, its LayerNormalizations by
  :func:`heatinv.lrp.rules.layer_norm_rule`, its two Dense layers by the composite's dense
  rule, its residual sums by :func:`heatinv.lrp.rules.sum_rule`);
- ``keras_hub.layers.PositionEmbedding``: :class:`Positions`, the position table shaped like
  its input, which gives the input no relevance (only its shape is read);
- ``keras_hub.layers.TokenAndPositionEmbedding``: an Embed step with its position table
  (:class:`heatinv.lrp.canonical.Embed`);
- the ViT's ``ViTPatchingAndEmbedding``: :class:`PatchEmbedding` (a convolution, a learned class
  token and a position table), and its ``ViTEncoder``: one :class:`EncoderBlock` (pre-norm) per
  ``ViTEncoderBlock`` and a LayerNormalization;
- Llama's ``LlamaTransformerDecoder``: :class:`heatinv.lrp.llama.DecoderBlock`; its
  ``LlamaLayerNorm`` (RMSNorm): a Normalize step; a ``ReversibleEmbedding`` called with
  ``reverse=True`` (a language model's logits): a Linear step (:func:`next_token_model`).

Which keras-hub layers these are is decided by class, from ``keras_hub`` where it is
imported (a model holding its layers imports it); heatinv itself does not import it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from heatinv.lrp.attention import Attention
from heatinv.lrp.rules import layer_norm_rule, sum_rule

COVERED = (
    "TransformerEncoder", "PositionEmbedding", "TokenAndPositionEmbedding", "ReversibleEmbedding", "ViTPatchingAndEmbedding",
    "ViTEncoder", "LlamaTransformerDecoder", "LlamaLayerNorm",
)
"""The keras-hub layers heatinv explains; any other keras-hub layer is refused by name."""


def hub_class(layer, name: str) -> bool:
    """Whether ``layer`` is keras-hub's layer ``name`` (False where keras-hub is not imported)."""
    hub = sys.modules.get("keras_hub")
    cls = getattr(getattr(hub, "layers", None), name, None) if hub is not None else None
    return cls is not None and isinstance(layer, cls)


def position_table(layer, like: tf.Tensor) -> tf.Tensor:
    """The first ``tokens`` rows of a keras-hub PositionEmbedding's table, in ``like``'s dtype."""
    return tf.cast(layer.position_embeddings[: tf.shape(like)[-2]], like.dtype)


@dataclass
class Positions:
    """keras-hub's PositionEmbedding: ``P[:tokens]`` broadcast to its input's shape.

    The input gives the shape only: it gets no relevance. (The model adds the output to the
    token vectors; the sum hands the table its share, which stops here.)
    """

    layer: keras.layers.Layer
    sources: tuple[int, ...]

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return tf.broadcast_to(position_table(self.layer, x), tf.shape(x))

    @property
    def name(self) -> str:
        return self.layer.name


@dataclass
class EncoderValues:
    """An EncoderBlock call's forward values, in the order its ``call`` computes them."""

    x: tf.Tensor
    attention_input: tf.Tensor
    attention: Any
    first_sum: tf.Tensor
    feedforward_input: tf.Tensor
    hidden: tf.Tensor
    hidden_product: tf.Tensor
    feedforward: tf.Tensor
    feedforward_product: tf.Tensor
    second_sum: tf.Tensor


@dataclass
class EncoderBlock:
    """keras-hub's TransformerEncoder, in inference mode (dropout off), self-attention only.

    ``normalize_first=False`` (post-norm, BERT): ``y = LN1(x + MHA(x, x))``,
    ``out = LN2(y + D2(D1(y)))``. ``normalize_first=True`` (pre-norm):
    ``y = x + MHA(LN1(x), LN1(x))``, ``out = y + D2(D1(LN2(y)))``. The attention is masked as
    keras-hub masks it: padding (the input's Keras mask) in rows and columns.

    Attributes:
        layer: the keras-hub layer.
        sources: the step feeding it.
        attention: its MultiHeadAttention as an :class:`~heatinv.lrp.attention.Attention`.
        norms: its two LayerNormalizations as :class:`~heatinv.lrp.canonical.Normalize` steps.
        dense: its two Dense layers as :class:`~heatinv.lrp.canonical.Linear` steps.
    """

    layer: keras.layers.Layer
    sources: tuple[int, ...]
    attention: Attention
    norms: tuple[Any, Any]
    dense: tuple[Any, Any]
    normalize_first: bool

    @property
    def name(self) -> str:
        return self.layer.name

    def forward(self, x: tf.Tensor, mask: tf.Tensor | None = None, padding: tf.Tensor | None = None) -> EncoderValues:
        """``mask``: the input's Keras mask (rows and columns of the attention); ``padding``: the call's
        ``padding_mask`` argument (columns, as keras-hub merges it into the attention mask)."""
        first = self.normalize_first
        norm1, norm2 = self.norms
        attention_input = norm1(x) if first else x
        attention = self.attention.forward(attention_input, attention_input, masks=(mask, mask, padding))
        first_sum = self.attention.output(attention) + x
        feedforward_input = norm2(first_sum) if first else norm1(first_sum)
        (up, down), dtype = self.dense, x.dtype
        kernel, bias = up.params(dtype)
        hidden_product = up.affine(feedforward_input, kernel, None)
        hidden = hidden_product + bias
        hidden = hidden if up.activation is None else up.activation(hidden)
        kernel, bias = down.params(dtype)
        feedforward_product = down.affine(hidden, kernel, None)
        feedforward = feedforward_product + bias
        second_sum = feedforward + feedforward_input if not first else feedforward + first_sum
        return EncoderValues(
            x, attention_input, attention, first_sum, feedforward_input, hidden, hidden_product, feedforward,
            feedforward_product, second_sum,
        )

    def output(self, values: EncoderValues) -> tf.Tensor:
        return values.second_sum if self.normalize_first else self.norms[1](values.second_sum)

    def __call__(self, x: tf.Tensor, mask: tf.Tensor | None = None, padding: tf.Tensor | None = None) -> tf.Tensor:
        return self.output(self.forward(x, mask, padding))

    def relevance(self, values: EncoderValues, relevance: tf.Tensor, composite) -> list[tf.Tensor]:
        """The relevance of the block's input, from that of its output."""
        first, (norm1, norm2), (up, down) = self.normalize_first, self.norms, self.dense
        rule, stabilizer, dtype = composite.dense, composite.stabilizer, relevance.dtype

        def dense(linear, a, r, product):
            known = {"product": product} if rule.takes_product else {}
            return rule(a, *linear.params(dtype), r, linear, **known)

        def norm(step, a, r):
            scale, shift, centered = step.parts(a)
            return layer_norm_rule(a, r, scale, shift, centered, stabilizer)

        if not first:
            relevance = norm(norm2, values.second_sum, relevance)
        # the residual around the feed-forward part: its output and its input
        to_feedforward, to_residual = sum_rule(
            [values.feedforward, values.feedforward_input if not first else values.first_sum], relevance, stabilizer
        )
        to_hidden = dense(down, values.hidden, to_feedforward, values.feedforward_product)
        to_input = dense(up, values.feedforward_input, to_hidden, values.hidden_product)
        if first:
            to_first_sum = to_residual + norm(norm2, values.first_sum, to_input)
        else:
            to_first_sum = norm(norm1, values.first_sum, to_residual + to_input)
        to_attention, to_x = sum_rule([self.attention.output(values.attention), values.x], to_first_sum, stabilizer)
        shares = self.attention.relevance(values.attention, to_attention, rule, composite.attention, stabilizer)
        to_attention_input = tf.add_n([share for share in shares if share is not None])  # CP-LRP: the query gets none
        if first:
            to_attention_input = norm(norm1, values.x, to_attention_input)
        return [to_x + to_attention_input]



@dataclass
class PatchEmbedding:
    """keras-hub's ViTPatchingAndEmbedding: ``[cls, patches W + b] + P`` (channels last).

    The image's patches go through the layer's Conv2D (the composite's rule for a first conv
    layer), the learned class token is put in front, a position table is added. Relevance: the
    sum splits in proportion (the table absorbs its share), the class token keeps its own (it is
    a weight), the patch tokens' relevance goes back through the convolution to the pixels.

    Attributes:
        layer: the keras-hub layer.
        sources: the step feeding it (the image).
        conv: its Conv2D as a :class:`~heatinv.lrp.canonical.Linear` step.
    """

    layer: keras.layers.Layer
    sources: tuple[int, ...]
    conv: Any

    @property
    def name(self) -> str:
        return self.layer.name

    def parts(self, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``(z, tokens, positions)``: the convolution's output, the tokens before and the table."""
        kernel, bias = self.conv.params(x.dtype)
        z = self.conv.affine(x, kernel, bias)
        tokens = tf.reshape(z, [tf.shape(z)[0], -1, z.shape[-1]])
        if self.layer.use_class_token:
            token = tf.cast(self.layer.class_token, x.dtype)
            tokens = tf.concat([tf.tile(token, [tf.shape(z)[0], 1, 1]), tokens], axis=1)
        positions = tf.cast(self.layer.position_embedding.embeddings, x.dtype)[None]
        return z, tokens, positions

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        _, tokens, positions = self.parts(x)
        return tokens + positions

    def relevance(self, x: tf.Tensor, parts: tuple, relevance: tf.Tensor, composite) -> list[tf.Tensor]:
        """The image's relevance; ``parts``: :meth:`parts` of ``x`` from the forward pass."""
        z, tokens, positions = parts
        to_tokens = sum_rule([tokens, positions], relevance, composite.stabilizer)[0]
        if self.layer.use_class_token:
            to_tokens = to_tokens[:, 1:]
        rule = composite.rule_for("conv", is_first=True)
        kernel, bias = self.conv.params(x.dtype)
        return [rule(x, kernel, bias, tf.reshape(to_tokens, tf.shape(z)), self.conv)]


def vit_encoder_steps(layer, source: int, first_index: int, projections_of, linear, normalize: type) -> list:
    """keras-hub's ViTEncoder as steps: a pre-norm :class:`EncoderBlock` per block, then its LayerNormalization.

    ``first_index``: the index the first of them will have; ``projections_of``, ``linear``,
    ``normalize``: the engine's builders of an attention's projections, of a checked Linear
    step and its Normalize step class (passed in, not imported: they import this module).
    """
    steps = []
    for block in layer.encoder_layers:
        projections = projections_of(block.mha)
        norms = (normalize(block.layer_norm_1), normalize(block.layer_norm_2))
        dense = (linear(block.mlp.dense_1), linear(block.mlp.dense_2))
        steps.append(EncoderBlock(block, (source,), Attention(block.mha, (source, source), projections), norms, dense, True))
        source = first_index + len(steps) - 1
    steps.append(normalize(layer.layer_norm, (source,)))
    return steps

def token_model(model: keras.Model, padding_id: int = 0) -> keras.Model:
    """A keras-hub text model of a dict of inputs as a model of token ids alone, for LRP.

    keras-hub's text backbones and classifiers (BERT, RoBERTa, ...) take ``{"token_ids",
    "padding_mask", "segment_ids"}``; heatinv explains a model of one input. The returned model
    takes ``[batch, tokens]`` ids and computes the padding mask (``ids != padding_id``) and segment
    ids (all 0: one segment) from them, so only the ids carry relevance.

    Args:
        model: a functional keras-hub model (a task such as ``BertTextClassifier`` without its
            preprocessor, or a backbone) whose inputs are a dict holding ``token_ids``.
        padding_id: the id of the padding token.

    Returns:
        A functional model ``[batch, tokens]`` int32 ids ``->`` ``model``'s output.

    Examples:
        >>> classifier = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)  # doctest: +SKIP
        >>> R = relevance(token_model(classifier), ids, target=1, composite="attnlrp")  # doctest: +SKIP
    """
    try:
        structure = model.input
    except (AttributeError, ValueError):  # a model never called (a Sequential) has no input structure
        structure = None
    if not isinstance(structure, dict) or "token_ids" not in structure:
        raise ValueError(
            f"token_model takes a model whose inputs are a dict with 'token_ids' (keras-hub's text models); model "
            f"{model.name!r} takes {type(structure).__name__} {structure!r}."
        )
    unknown = sorted(set(structure) - {"token_ids", "padding_mask", "segment_ids"})
    if unknown:
        raise ValueError(f"token_model fills 'padding_mask' and 'segment_ids' from the ids; model {model.name!r} also takes {unknown}.")
    ids, given = _inputs_of_ids(structure, padding_id)
    return keras.Model(ids, model(given), name=f"{model.name}_of_token_ids")


def _inputs_of_ids(structure: dict, padding_id: int) -> tuple:
    """``(ids, inputs)``: an input of token ids and the dict a keras-hub model takes, its padding
    mask (``ids != padding_id``) and segment ids (one segment) computed from the ids."""
    ids = keras.Input((None,), dtype=structure["token_ids"].dtype, name="token_ids")
    given = {"token_ids": ids}
    if "padding_mask" in structure:
        given["padding_mask"] = keras.ops.cast(keras.ops.not_equal(ids, padding_id), structure["padding_mask"].dtype)
    if "segment_ids" in structure:
        given["segment_ids"] = keras.ops.zeros_like(ids, dtype=structure["segment_ids"].dtype)
    return ids, given


def next_token_model(causal_lm: keras.Model, padding_id: int = 0) -> keras.Model:
    """A keras-hub causal language model as a model of the next token's logits, for LRP.

    keras-hub's causal LMs (``LlamaCausalLM``, ...) take ``{"token_ids", "padding_mask"}`` and
    return logits for every position, ``[batch, tokens, vocabulary]``. The returned model takes
    ``[batch, tokens]`` ids, masks the padding (``ids != padding_id``) and returns the logits
    after the last position, ``[batch, vocabulary]``: the relevance of a target id is each
    context token's share in predicting it, what LXT's users compute with AttnLRP. Pad a batch
    of different lengths on the left, so that the last position is each sequence's last token.

    Args:
        causal_lm: a keras-hub causal LM without its preprocessor, or its backbone; its
            backbone's ``token_embedding`` (a ReversibleEmbedding) computes the logits.
        padding_id: the id of the padding token.

    Returns:
        A functional model ``[batch, tokens]`` int32 ids ``->`` ``[batch, vocabulary]`` logits.

    Examples:
        >>> lm = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)  # doctest: +SKIP
        >>> R = relevance(next_token_model(lm), ids, target=next_id, composite="attnlrp")  # doctest: +SKIP
    """
    backbone = getattr(causal_lm, "backbone", causal_lm)
    structure = getattr(backbone, "input", None) if isinstance(backbone, keras.Model) else None
    embedding = getattr(backbone, "token_embedding", None)
    reversible = getattr(keras.layers, "ReversibleEmbedding", None)
    if not isinstance(structure, dict) or "token_ids" not in structure or reversible is None or not isinstance(embedding, reversible):
        raise ValueError(
            f"next_token_model takes a keras-hub causal LM (or its backbone) whose backbone takes a dict with 'token_ids' "
            f"and computes logits with its ReversibleEmbedding 'token_embedding'; got {type(causal_lm).__name__} "
            f"{getattr(causal_lm, 'name', '')!r}."
        )
    unknown = sorted(set(structure) - {"token_ids", "padding_mask"})
    if unknown:
        raise ValueError(f"next_token_model fills 'padding_mask' from the ids; the backbone of {causal_lm.name!r} also takes {unknown}.")
    ids, given = _inputs_of_ids(structure, padding_id)
    hidden = backbone(given)
    logits = embedding(hidden[:, -1, :], reverse=True)
    return keras.Model(ids, logits, name=f"{causal_lm.name}_next_token")

