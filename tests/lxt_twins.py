"""A Keras transformer run again in PyTorch with the same float64 weights, explained by LXT 2.1's AttnLRP.

LXT (Achtibat et al., the reference implementation of AttnLRP) computes relevance as input
times a modified gradient: its rules replace the backward pass of some operations. The twin
calls LXT's own code at each of them:

- LayerNormalization: ``lxt.efficient.patches.layer_norm_forward`` (sigma held constant);
- element-wise activations (GELU, tanh, SiLU): ``non_linear_forward``, the identity rule;
- attention: the twin's eager attention (``q k^T`` scaled, masked softmax, ``A v``) wrapped by
  ``wrap_attention_forward`` (AttnLRP: the gradient at q and k divided by 4, at v by 2) or
  ``cp_wrap_attention_forward`` (CP-LRP: q and k detached);
- keras-hub's Llama decoder: ``gated_mlp_forward`` / ``cp_gated_mlp_forward`` (SiLU by the
  identity rule, the gate's product by the uniform rule / the gate constant), the attention
  wrapped as above after the rotation and the repetition of keys and values per group, and
  RMSNorm as ``rms_norm_forward`` computes it (``1/sigma`` detached), written out here in the
  twin's dtype because LXT's function casts to float32;
- everything else (Linear/EinsumDense/Conv, sums, means, slices, reshapes, the rotation) takes
  the plain gradient, which is LRP-0.

The twin walks the Keras model's call graph (``heatinv.lrp.graph.layer_graph``: only the
order of the calls, none of heatinv's rules) and runs each call as torch ops, converting the
weights: a Keras kernel ``[in, out]`` is used as is with ``x @ W``, EinsumDense and
MultiHeadAttention's projections through ``torch.einsum`` with their own equations, Conv2D's
HWIO kernel as OIHW on NCHW. The twin is checked first: its logits equal Keras's.

Relevance of an image model: ``x * x.grad``. Of a token model: the embedding output times its
gradient, summed over the embedding dimension (how LXT's examples report tokens).

The rotation's angles are read from the keras-hub layer (``_compute_cos_sin_embedding``: the
model's constants, computed in float32 as keras-hub does); the twin applies them itself. keras-hub
computes RMSNorm, the softmax and the gate's SiLU in float32 even in a float64 model, the twin in
float64: a Llama twin's logits equal Keras's to about 1e-7 relative, not 1e-16.

Keras masks: the twin computes the masks Keras records in the graph (``ids != 0`` for a
GlobalAveragePooling1D's mean) but not the ones Keras passes at run time to an attention, so
it computes the Keras model only for inputs without padding.

``lxt/efficient/__init__.py`` imports LXT's Hugging Face model maps, which import
transformers, and its Zennit patches, which import Zennit (and so torchvision, whose wheel does
not load against torch's CPU build); :func:`import_lxt` puts an empty stand-in for
``lxt.efficient.models`` into ``sys.modules`` while LXT is imported (nothing here uses those
maps) and imports Zennit first as the Zennit cross-check does. Nothing here is part of heatinv.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import types

import keras
import numpy as np

from heatinv.layers import PositionEmbedding
from heatinv.lrp.graph import MODEL_INPUT, layer_graph

LXT_MISSING = next(
    (
        f"{name} is not installed; the LXT cross-check needs torch and LXT: pip install -e \".[crosscheck]\" "
        "then pip install --no-deps lxt==2.1 (the README's test command does both)"
        for name in ("torch", "lxt")
        if importlib.util.find_spec(name) is None
    ),
    None,
)
"""Why the cross-check cannot run here, or None when torch and LXT are installed."""


def import_lxt() -> types.ModuleType:
    """``lxt.efficient.patches``, imported without LXT's Hugging Face model maps."""
    if "lxt.efficient.patches" in sys.modules:
        return sys.modules["lxt.efficient.patches"]
    if importlib.util.find_spec("zennit") is not None:
        import zennit_models

        zennit_models.import_zennit()
    stub = None
    if "lxt.efficient.models" not in sys.modules and importlib.util.find_spec("transformers") is None:
        stub = types.ModuleType("lxt.efficient.models")
        stub.get_default_map = lambda module: {}
        sys.modules["lxt.efficient.models"] = stub
    try:
        return importlib.import_module("lxt.efficient.patches")
    finally:
        if stub is not None:
            sys.modules.pop("lxt.efficient.models", None)


def _torch():
    import torch

    return torch


def _tensor(value, dtype: str = "float64") -> object:
    return _torch().tensor(np.asarray(value, dtype=dtype))


def tf_gelu(x):
    """TensorFlow's float64 GELU: ``x`` times ``1/sqrt(2)`` rounded to float32, as ``tf.nn.gelu`` does."""
    torch = _torch()
    return 0.5 * x * (1.0 + torch.erf(x * float(np.float32(1.0 / math.sqrt(2.0)))))


def tf_gelu_tanh(x):
    """TensorFlow's tanh-approximated GELU (``approximate=True``; keras-hub's ``gelu_approximate``): its
    0.044715 is cast through float32, as ``tf.cast`` of a Python float does."""
    torch = _torch()
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + float(np.float32(0.044715)) * x**3)))


ACTIVATIONS = {
    "gelu": tf_gelu,
    "gelu_approximate": tf_gelu_tanh,
    "tanh": lambda x: _torch().tanh(x),
    "silu": lambda x: x * _torch().sigmoid(x),
    "relu": lambda x: _torch().relu(x),
}


class _Activation:
    """Holder LXT's ``non_linear_forward`` reads: ``original_forward`` is the activation."""

    def __init__(self, function):
        self.original_forward = function


class _LayerNorm:
    """Holder LXT's ``layer_norm_forward`` reads: ``eps``, ``weight``, ``bias``."""

    def __init__(self, layer: keras.layers.LayerNormalization, dtype: str):
        self.eps = float(layer.epsilon)
        self.weight = _tensor(layer.gamma.numpy(), dtype) if layer.scale else None
        self.bias = _tensor(layer.beta.numpy(), dtype) if layer.center else None


class _GatedMLP:
    """Holder LXT's ``gated_mlp_forward`` reads: ``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn``."""

    def __init__(self, gate, up, down, act_fn):
        self.gate_proj, self.up_proj, self.down_proj, self.act_fn = gate, up, down, act_fn


def rotate(x, cos, sin):
    """Hugging Face's ``apply_rotary_pos_emb``: ``x cos + rotate_half(x) sin``, ``rotate_half(x) = [-x2, x1]``."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + _torch().cat([-second, first], dim=-1) * sin


def eager_attention(module, query, key, value, mask, scale):
    """Attention as Hugging Face's eager attention computes it: ``softmax(q k^T * scale) v``, masked."""
    torch = _torch()
    scores = torch.einsum("btnh,bsnh->bnts", query, key) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return torch.einsum("bnts,bsnh->btnh", weights, value)


class Twin:
    """The Keras model's function in torch, with LXT's AttnLRP or CP-LRP on its backward pass.

    Args:
        model: a Keras model of the layers this file knows (float64 for the cross-check).
        attention: ``"attnlrp"`` or ``"cp"``.
        dtype: the twin's weights' and inputs' dtype (``"float32"`` for timing against heatinv).
        rules: False for the plain gradient (LXT's rules left out), the yardstick of a timing.
    """

    def __init__(self, model: keras.Model, attention: str = "attnlrp", dtype: str = "float64", rules: bool = True):
        patches = import_lxt()
        self.patches, self.dtype, self.rules, self.attention = patches, dtype, rules, attention
        self.calls = layer_graph(model)
        wrap = patches.wrap_attention_forward if attention == "attnlrp" else patches.cp_wrap_attention_forward
        self.attend = wrap(eager_attention) if rules else eager_attention
        self.tokens = any(
            isinstance(call.operation, keras.layers.Embedding) or type(call.operation).__name__ == "TokenAndPositionEmbedding"
            for call in self.calls if call.sources == (MODEL_INPUT,)
        )
        # Every weight converted once, in Keras's layout: x @ W for [in, out] kernels, einsum for the others.
        self.weights = {
            variable.path: _tensor(variable.numpy(), dtype)
            for call in self.calls if isinstance(call.operation, keras.layers.Layer)
            for variable in call.operation.weights
        }
        norms = [call.operation for call in self.calls if isinstance(call.operation, keras.layers.LayerNormalization)]
        for call in self.calls:
            if type(call.operation).__name__ == "TransformerEncoder":  # keras-hub's: its norms are attributes
                norms += [call.operation._self_attention_layer_norm, call.operation._feedforward_layer_norm]
            if type(call.operation).__name__ == "ViTEncoder":
                blocks = call.operation.encoder_layers
                norms += [n for block in blocks for n in (block.layer_norm_1, block.layer_norm_2)] + [call.operation.layer_norm]
        self.norms = {id(layer): _LayerNorm(layer, dtype) for layer in norms}  # keras-hub's repeat their names

    def relevance(self, x: np.ndarray, targets) -> tuple[np.ndarray, np.ndarray]:
        """(relevance, logits): relevance ``[batch, *input]`` for images, ``[batch, tokens]`` for token ids."""
        torch = _torch()
        if self.tokens:
            leaf = None
            values = {MODEL_INPUT: torch.tensor(np.asarray(x), dtype=torch.long)}
        else:
            leaf = torch.tensor(np.asarray(x, dtype=self.dtype), requires_grad=True)
            values = {MODEL_INPUT: leaf}
        self.embedded = None
        for index, call in enumerate(self.calls):
            operands = [values[source] for source in call.sources]
            values[index] = self._run(call, operands)
        embedded = self.embedded
        logits = values[len(self.calls) - 1]
        selected = logits[torch.arange(len(targets)), torch.tensor(np.asarray(targets), dtype=torch.long)]
        selected.sum().backward()
        if self.tokens:
            relevance = (embedded * embedded.grad).sum(-1)
        else:
            relevance = leaf * leaf.grad
        return relevance.detach().numpy(), logits.detach().numpy()

    def _weight(self, variable):
        return self.weights[variable.path]

    def _token_vectors(self, layer, ids):
        """The looked-up vectors, a leaf whose gradient gives the tokens' relevance."""
        self.embedded = self._weight(layer.embeddings)[ids].detach().requires_grad_(True)
        return self.embedded

    def _layer_norm(self, layer, x):
        norm = self.norms[id(layer)]
        if not self.rules:
            return _torch().nn.functional.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)
        return self.patches.layer_norm_forward(norm, x)

    def _block(self, first, norms, mha, dense, x, padding=None):
        """keras-hub's TransformerEncoder.call (and its ViT's encoder block, pre-norm), in torch."""
        norm1, norm2 = norms
        residual = x
        h = self._layer_norm(norm1, x) if first else x
        h = self._multi_head(mha, h, h, None, None, padding)
        x = h + residual
        if not first:
            x = self._layer_norm(norm1, x)
        residual = x
        h = self._layer_norm(norm2, x) if first else x
        up, down = dense
        h = self._activate(h @ self._weight(up.kernel) + self._weight(up.bias), up.activation)
        x = h @ self._weight(down.kernel) + self._weight(down.bias) + residual
        return x if first else self._layer_norm(norm2, x)

    def _run(self, call, operands):
        torch = _torch()
        layer = call.operation
        p = self.patches
        if isinstance(layer, keras.layers.Embedding) and call.arguments.kwargs.get("reverse"):  # a language model's logits
            table = layer.embeddings if layer.tie_weights else layer.reverse_embeddings
            return operands[0] @ (self._weight(table).T if layer.tie_weights else self._weight(table))
        if type(layer).__name__ == "LlamaTransformerDecoder":  # keras-hub's
            return self._llama_block(layer, operands[0], operands[1] if len(operands) > 1 else None)
        if type(layer).__name__ == "LlamaLayerNorm":
            return self._rms_norm(layer, operands[0])
        if isinstance(layer, keras.layers.Embedding):
            if call.sources != (MODEL_INPUT,):  # computed ids (segments): a table lookup, no token's relevance
                return self._weight(layer.embeddings)[operands[0]]
            return self._token_vectors(layer, operands[0])
        if isinstance(layer, keras.layers.Dropout):
            return operands[0]
        if type(layer).__name__ == "TokenAndPositionEmbedding":  # keras-hub's
            vectors = self._token_vectors(layer.token_embedding, operands[0])
            return vectors + self._weight(layer.position_embedding.position_embeddings)[: vectors.shape[1]]
        if type(layer).__name__ == "PositionEmbedding" and hasattr(layer, "position_embeddings"):  # keras-hub's
            x = operands[0]
            return self._weight(layer.position_embeddings)[: x.shape[1]].expand(x.shape)
        if type(layer).__name__ == "TransformerEncoder":  # keras-hub's, as its call computes it
            dense = (layer._feedforward_intermediate_dense, layer._feedforward_output_dense)
            norms = (layer._self_attention_layer_norm, layer._feedforward_layer_norm)
            padding = operands[1] if len(operands) > 1 else None
            return self._block(layer.normalize_first, norms, layer._self_attention_layer, dense, operands[0], padding)
        if type(layer).__name__ == "ViTPatchingAndEmbedding":  # keras-hub's ViT: patches, class token, positions
            conv = layer.patch_embedding
            z = torch.nn.functional.conv2d(
                operands[0].permute(0, 3, 1, 2), self._weight(conv.kernel).permute(3, 2, 0, 1), stride=tuple(conv.strides)
            ).permute(0, 2, 3, 1)
            z = z + self._weight(conv.bias) if conv.use_bias else z
            tokens = z.reshape(z.shape[0], -1, z.shape[-1])
            if layer.use_class_token:
                tokens = torch.cat([self._weight(layer.class_token).expand(z.shape[0], 1, -1), tokens], dim=1)
            return tokens + self._weight(layer.position_embedding.embeddings)[None]
        if type(layer).__name__ == "ViTEncoder":
            x = operands[0]
            for block in layer.encoder_layers:
                norms, dense = (block.layer_norm_1, block.layer_norm_2), (block.mlp.dense_1, block.mlp.dense_2)
                x = self._block(True, norms, block.mha, dense, x, None)
            return self._layer_norm(layer.layer_norm, x)
        if type(layer).__name__ == "Mean":
            axis = layer.axis  # the op holds its axes
            return operands[0].mean(dim=tuple(axis) if isinstance(axis, (list, tuple)) else axis, keepdim=layer.keepdims)
        if isinstance(layer, PositionEmbedding):
            x = operands[0]
            return x + self._weight(layer.embeddings)[: x.shape[1]]
        if isinstance(layer, keras.layers.Conv2D):
            kernel = self._weight(layer.kernel).permute(3, 2, 0, 1)
            z = torch.nn.functional.conv2d(operands[0].permute(0, 3, 1, 2), kernel, stride=tuple(layer.strides))
            z = z.permute(0, 2, 3, 1)
            return self._activate(z + self._weight(layer.bias) if layer.use_bias else z, layer.activation)
        if isinstance(layer, keras.layers.Dense):
            z = operands[0] @ self._weight(layer.kernel)
            return self._activate(z + self._weight(layer.bias) if layer.use_bias else z, layer.activation)
        if isinstance(layer, keras.layers.EinsumDense):
            return self._activate(self._einsum_dense(layer, operands[0]), layer.activation)
        if isinstance(layer, keras.layers.LayerNormalization):
            return self._layer_norm(layer, operands[0])
        if isinstance(layer, keras.layers.MultiHeadAttention):
            return self._attention(layer, call, operands)
        if type(layer).__name__ == "Add":  # the layer (any number of operands), or the op x + y
            return sum(operands[1:], operands[0])
        if isinstance(layer, keras.layers.GlobalAveragePooling1D):
            if len(operands) == 2:  # the mask Keras recorded as its argument
                weights = operands[1].to(operands[0].dtype)[..., None]
                return (operands[0] * weights).sum(dim=1) / weights.sum(dim=1)
            return operands[0].mean(dim=1)
        if call.discrete:  # a Keras mask's op: ids != 0, masks combined
            name = type(layer).__name__
            if name == "NotEqual":
                return operands[0] != call.arguments.args[1]
            if name == "LogicalOr":
                return operands[0] | operands[1]
            if name == "LogicalAnd":
                return operands[0] & operands[1]
            if name == "ZerosLike":
                return torch.zeros_like(operands[0])
            if name == "Cast":
                return operands[0].long()
        if isinstance(layer, (keras.layers.Reshape, keras.layers.Flatten)):
            x = operands[0]
            shape = (-1,) if isinstance(layer, keras.layers.Flatten) else tuple(layer.target_shape)
            return x.reshape((x.shape[0], *shape))
        if isinstance(layer, keras.layers.Permute):
            return operands[0].permute(0, *layer.dims)
        if type(layer).__name__ == "GetItem":
            return operands[0][call.arguments.args[1]]
        raise NotImplementedError(f"The LXT twin has no torch version of {type(layer).__name__} {layer.name!r}.")

    def _rms_norm(self, layer, x):
        """LXT's ``rms_norm_forward`` in the twin's dtype: ``x * rsqrt(mean(x^2) + eps)`` (detached) ``* scale``."""
        scale = _torch().rsqrt(x.pow(2).mean(-1, keepdim=True) + layer.epsilon)
        return self._weight(layer.scale) * (x * (scale.detach() if self.rules else scale))

    def _llama_block(self, layer, x, padding):
        """keras-hub's LlamaTransformerDecoder.call, as Hugging Face's LlamaDecoderLayer computes it."""
        torch = _torch()
        attention = layer._self_attention_layer
        h = self._rms_norm(layer._self_attention_layernorm, x)
        q = self._einsum_dense(attention._query_dense, h)
        k = self._einsum_dense(attention._key_dense, h)
        v = self._einsum_dense(attention._value_dense, h)
        cos, sin = (
            _tensor(np.asarray(t), self.dtype) for t in attention.rotary_embedding_layer._compute_cos_sin_embedding(q.detach().numpy())
        )
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        groups = attention.num_key_value_groups
        k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
        t = q.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).tril()[None, None]
        if padding is not None:
            mask = mask & (padding != 0)[:, None, None, :]
        scale = float(np.asarray(attention._inv_norm_factor, dtype=keras.config.floatx()))  # cast through floatx, as keras-hub
        x = self._einsum_dense(attention._output_dense, self.attend(attention, q, k, v, mask, scale)) + x
        g = self._rms_norm(layer._feedforward_layernorm, x)

        def project(dense):
            return lambda a: a @ self._weight(dense.kernel)

        mlp = _GatedMLP(
            project(layer._feedforward_gate_dense), project(layer._feedforward_intermediate_dense),
            project(layer._feedforward_output_dense), ACTIVATIONS["silu"],
        )
        if not self.rules:
            return mlp.down_proj(mlp.act_fn(mlp.gate_proj(g)) * mlp.up_proj(g)) + x
        forward = self.patches.gated_mlp_forward if self.attention == "attnlrp" else self.patches.cp_gated_mlp_forward
        return forward(mlp, g) + x

    def _activate(self, z, activation):
        name = activation.__name__
        if name == "linear":
            return z
        if not self.rules:
            return ACTIVATIONS[name](z)
        return self.patches.non_linear_forward(_Activation(ACTIVATIONS[name]), z)

    def _attention(self, layer, call, operands):
        arguments = call.arguments
        given = dict(zip(("query", "value", "key"), arguments.args))
        given.update({k: v for k, v in arguments.kwargs.items() if k in ("query", "value", "key")})
        source_of = {id(t): operand for t, operand in zip(arguments.keras_tensors, operands)}
        query, value = source_of[id(given["query"])], source_of[id(given["value"])]
        key = source_of[id(given["key"])] if given.get("key") is not None else None
        return self._multi_head(layer, query, value, key, bool(arguments.kwargs.get("use_causal_mask")))

    def _multi_head(self, layer, query, value, key, causal, padding=None):
        """``padding``: ``[batch, tokens]``, nonzero where a token is no padding (keras-hub's padding_mask: columns)."""
        torch = _torch()
        key = value if key is None else key
        q = self._einsum_dense(layer.query_dense, query)
        k = self._einsum_dense(layer.key_dense, key)
        v = self._einsum_dense(layer.value_dense, value)
        mask = None
        if causal:
            t, s = q.shape[1], k.shape[1]
            mask = torch.ones(t, s, dtype=torch.bool).tril()[None, None]
        if padding is not None:
            columns = (padding != 0)[:, None, None, :]
            mask = columns if mask is None else mask & columns
        context = self.attend(layer, q, k, v, mask, keras_scale(layer))
        return self._einsum_dense(layer.output_dense, context)

    def _einsum_dense(self, layer: keras.layers.EinsumDense, x):
        z = _torch().einsum(layer.equation, x, self._weight(layer.kernel))
        return z + self._weight(layer.bias) if layer.bias is not None else z


def keras_scale(layer: keras.layers.MultiHeadAttention) -> float:
    """The ``1/sqrt(key_dim)`` a float64 MultiHeadAttention multiplies by: Keras casts the Python float
    through float32 (fused path, dropout 0) or through its floatx (einsum path)."""
    exact = 1.0 / math.sqrt(float(layer.key_dim))
    through = "float32" if layer.dropout == 0 else keras.config.floatx()
    return float(np.asarray(exact, dtype=through))


