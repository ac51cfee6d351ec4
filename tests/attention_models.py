"""Tiny transformers in Keras for the attention tests: a ViT and text classifiers, seeded, any dtype.

Each builder returns a functional model with random weights (normal, std 0.5: softmax rows
neither uniform nor one-hot, GELU on both of its sides). The variants exercise what the
AttnLRP issue names: pre-norm and post-norm blocks, MultiHeadAttention with dropout 0 (Keras's
fused ``dot_product_attention``) and > 0 (its einsum path), ``key_dim`` != ``value_dim``,
causal masks, cross-attention with and without a separate key, EinsumDense with a per-position
bias as the position embedding, heatinv's PositionEmbedding, GELU/tanh/SiLU, mean pooling and
the first token.
"""

from __future__ import annotations

import keras
import numpy as np

from heatinv.layers import PositionEmbedding


def _block(x, name: str, dtype: str, *, heads=2, key_dim=3, value_dim=None, dropout=0.0, causal=False, pre_norm=True,
           activation="gelu", epsilon=1e-3):
    dim = x.shape[-1]

    def attention(h):
        mha = keras.layers.MultiHeadAttention(heads, key_dim, value_dim=value_dim, dropout=dropout, dtype=dtype, name=f"{name}_mha")
        return mha(h, h, use_causal_mask=causal) if causal else mha(h, h)

    def norm(h, which):
        return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=f"{name}_ln{which}")(h)

    def mlp(h):
        h = keras.layers.Dense(2 * dim, activation=activation, dtype=dtype, name=f"{name}_fc1")(h)
        return keras.layers.Dense(dim, dtype=dtype, name=f"{name}_fc2")(h)

    def add(a, b, which):
        return keras.layers.Add(dtype=dtype, name=f"{name}_add{which}")([a, b])

    if pre_norm:
        x = add(x, attention(norm(x, 1)), 1)
        return add(x, mlp(norm(x, 2)), 2)
    x = norm(add(x, attention(x), 1), 1)
    return norm(add(x, mlp(x), 2), 2)


def vit(dtype: str = "float64", seed: int = 0, *, image=8, patch=4, dim=6, depth=2, classes=3, dropout=0.0,
        patches="conv", pooling="mean") -> keras.Model:
    """A pre-norm ViT on ``[image, image, 1]``: conv or EinsumDense patches, GELU MLPs, mean or first-token pooling.

    ``patches="einsum"``: the image cut into patches by Reshape/Permute, embedded by an
    EinsumDense whose bias has one vector per patch (the position embedding); ``"conv"``: a
    strided Conv2D and heatinv's PositionEmbedding.
    """
    side, count = image // patch, (image // patch) ** 2
    inputs = keras.Input((image, image, 1), dtype=dtype)
    if patches == "conv":
        x = keras.layers.Conv2D(dim, patch, strides=patch, dtype=dtype, name="patches")(inputs)
        x = keras.layers.Reshape((count, dim), dtype=dtype)(x)
        x = PositionEmbedding(count, dtype=dtype, name="positions")(x)
    else:
        x = keras.layers.Reshape((side, patch, side, patch), dtype=dtype)(inputs)
        x = keras.layers.Permute((1, 3, 2, 4), dtype=dtype)(x)
        x = keras.layers.Reshape((count, patch * patch), dtype=dtype)(x)
        x = keras.layers.EinsumDense("abc,cd->abd", output_shape=(count, dim), bias_axes="bd", dtype=dtype, name="patches")(x)
    for i in range(depth):
        x = _block(x, f"block{i}", dtype, dropout=dropout, value_dim=4 if i == 1 else None, epsilon=1e-5)
    x = keras.layers.LayerNormalization(epsilon=1e-5, dtype=dtype, name="final_ln")(x)
    x = keras.layers.GlobalAveragePooling1D(dtype=dtype)(x) if pooling == "mean" else x[:, 0]
    outputs = keras.layers.Dense(classes, dtype=dtype, name="head")(x)
    return randomize(keras.Model(inputs, outputs, name=f"vit_{patches}_{pooling}"), seed)


def text(dtype: str = "float64", seed: int = 0, *, vocab=20, tokens=6, dim=6, depth=2, classes=3, causal=False,
         dropout=0.0, pooling="first", activation="gelu", mask_zero=False) -> keras.Model:
    """A BERT-style classifier of token ids: embeddings, post-norm blocks, a pooled token, a tanh pooler.

    ``pooling``: ``"first"`` (BERT's [CLS]), ``"last"`` (a causal model's last token),
    ``"cross"`` (the first token attends to all through a cross-attention whose key input is
    the layer-normed sequence) or ``"mean"`` (GlobalAveragePooling1D, over the tokens that are
    not padding where ``mask_zero``). ``tokens=None``: any length.
    """
    inputs = keras.Input((tokens,), dtype="int32")
    x = keras.layers.Embedding(vocab, dim, mask_zero=mask_zero, dtype=dtype, name="tokens")(inputs)
    x = PositionEmbedding(tokens or 16, dtype=dtype, name="positions")(x)
    x = keras.layers.LayerNormalization(dtype=dtype, name="embedding_ln")(x)
    for i in range(depth):
        x = _block(x, f"block{i}", dtype, causal=causal, dropout=dropout, pre_norm=False, activation=activation)
    if pooling == "first":
        x = x[:, 0]
    elif pooling == "last":
        x = x[:, -1]
    elif pooling == "mean":
        x = keras.layers.GlobalAveragePooling1D(dtype=dtype)(x)
    else:
        keys = keras.layers.LayerNormalization(dtype=dtype, name="keys_ln")(x)
        cross = keras.layers.MultiHeadAttention(2, 3, value_dim=2, dtype=dtype, name="pool_mha")
        x = keras.layers.Flatten(dtype=dtype)(cross(x[:, :1], x, key=keys))
    x = keras.layers.Dense(dim, activation="tanh", dtype=dtype, name="pooler")(x)
    outputs = keras.layers.Dense(classes, dtype=dtype, name="head")(x)
    return randomize(keras.Model(inputs, outputs, name=f"text_{pooling}{'_causal' if causal else ''}"), seed)


def randomize(model: keras.Model, seed: int, scale: float = 0.5) -> keras.Model:
    """Every weight drawn from N(0, scale^2), LayerNorm gammas around 1; ``model`` changed in place."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        values = rng.normal(0.0, scale, weight.shape)
        if weight.path.endswith("gamma"):
            values = 1.0 + values / 2
        weight.assign(values.astype(weight.dtype))
    return model


def images(batch: int = 2, seed: int = 1, image: int = 8) -> np.ndarray:
    """Inputs for :func:`vit`: uniform in [-1, 1]."""
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (batch, image, image, 1))


def token_ids(batch: int = 2, seed: int = 1, tokens: int = 6, vocab: int = 20) -> np.ndarray:
    """Inputs for :func:`text`: int32 ids."""
    return np.random.default_rng(seed).integers(0, vocab, (batch, tokens)).astype("int32")


def hub_text(dtype: str = "float64", seed: int = 0, *, normalize_first=False, mask_zero=True, dropout=0.0,
             positions="joint") -> keras.Model:
    """A text classifier of keras-hub layers: TokenAndPositionEmbedding (or Embedding plus PositionEmbedding,
    ``positions="separate"``), two TransformerEncoders with GELU, a mean over the tokens. Needs keras-hub."""
    import keras_hub

    ids = keras.Input((8,), dtype="int32")
    if positions == "joint":
        x = keras_hub.layers.TokenAndPositionEmbedding(50, 8, 8, mask_zero=mask_zero, dtype=dtype)(ids)
    else:
        vectors = keras.layers.Embedding(50, 8, mask_zero=mask_zero, dtype=dtype)(ids)
        x = vectors + keras_hub.layers.PositionEmbedding(8, dtype=dtype)(vectors)
    for _ in range(2):
        x = keras_hub.layers.TransformerEncoder(16, 2, normalize_first=normalize_first, dropout=dropout, activation="gelu",
                                                dtype=dtype)(x)
    x = keras.layers.GlobalAveragePooling1D(dtype=dtype)(x)
    return randomize(keras.Model(ids, keras.layers.Dense(3, dtype=dtype)(x), name="hub_text"), seed)


def hub_bert(dtype: str = "float64", seed: int = 1, *, dropout=0.0) -> keras.Model:
    """keras-hub's BertTextClassifier at a tiny config (2 layers, 2 heads, width 16), random weights, no
    preprocessor: inputs ``{"token_ids", "segment_ids", "padding_mask"}``. Needs keras-hub."""
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=16,
        dropout=dropout, dtype=dtype,
    )
    classifier = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=3, preprocessor=None, dtype=dtype)
    return randomize(classifier, seed)


def hub_vit(dtype: str = "float64", seed: int = 1, *, pooling="token") -> keras.Model:
    """keras-hub's ViTImageClassifier at a tiny config (8x8x1 images, 4x4 patches, 2 layers, width 8), random
    weights, no preprocessor; ``pooling``: ``"token"`` (the class token) or ``"gap"``. Needs keras-hub."""
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=(8, 8, 1), patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16, dtype=dtype
    )
    classifier = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=3, pooling=pooling, preprocessor=None, dtype=dtype)
    return randomize(classifier, seed)


def hub_llama(dtype: str = "float64", seed: int = 2, *, tied: bool = False, key_value_heads: int = 2) -> keras.Model:
    """keras-hub's LlamaCausalLM at a tiny config (2 layers, 4 query heads sharing ``key_value_heads`` key and
    value heads, width 16, vocabulary 50), random weights (RMSNorm scales around 1), no preprocessor:
    inputs ``{"token_ids", "padding_mask"}``, logits for every position. Needs keras-hub."""
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=50, num_layers=2, num_query_heads=4, hidden_dim=16, intermediate_dim=32,
        num_key_value_heads=key_value_heads, tie_word_embeddings=tied, dtype=dtype,
    )
    lm = randomize(keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None, dtype=dtype), seed)
    rng = np.random.default_rng(seed + 1)
    for weight in lm.weights:
        if weight.path.endswith("scale"):
            weight.assign((1.0 + rng.normal(0.0, 0.25, weight.shape)).astype(weight.dtype))
    return lm


def assert_eager_function_and_xla_agree(model: keras.Model, explainer, x, targets) -> None:
    """The heatmap of ``x`` and the weight gradients of its squared sum: eager = ``tf.function`` (1e-12) = XLA (1e-10).

    One scale for the heatmap, one for all gradients: some gradients are rounding noise around
    an exact 0 (a key bias shifts every score of a query alike, which the softmax ignores).
    """
    import tensorflow as tf

    def step(inputs):
        with tf.GradientTape() as tape:
            R = explainer(inputs, targets)
            loss = tf.reduce_sum(R**2)
        return [R, *(tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables))]

    eager = step(x)
    graph = tf.function(step)(tf.constant(x))
    xla = tf.function(step, jit_compile=True)(tf.constant(x))
    scales = [np.abs(eager[0].numpy()).max()] + [max(np.abs(g.numpy()).max() for g in eager[1:])] * (len(eager) - 1)
    for a, b, c, scale in zip(eager, graph, xla, scales):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-12 * scale)
        np.testing.assert_allclose(c.numpy(), a.numpy(), rtol=0, atol=1e-10 * scale)


def central_difference(variable, index: int, loss, step: float = 1e-6) -> float:
    """``(loss(w + h e) - loss(w - h e)) / 2h`` for entry ``index`` of the flattened ``variable``; the variable restored."""
    original = variable.numpy()
    values = []
    for shift in (step, -step):
        shifted = original.copy().reshape(-1)
        shifted[index] += shift
        variable.assign(shifted.reshape(original.shape))
        values.append(float(loss()))
    variable.assign(original)
    return (values[0] - values[1]) / (2 * step)
