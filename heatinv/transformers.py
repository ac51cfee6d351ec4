"""Small transformers of Keras layers that heatinv explains: a ViT for images, an encoder for token ids.

Both are pre-norm encoders (LayerNormalization before attention and before the GELU MLP, a
residual sum after each): the attention reads the normed tensor alone, so a padding mask
survives the residual sum (Keras's MultiHeadAttention removes the mask of the tensor it
reads). Positions are learned (:class:`heatinv.layers.PositionEmbedding`).
"""

from __future__ import annotations

import keras

from heatinv.layers import PositionEmbedding


def encoder_block(x, *, heads: int, mlp_ratio: int = 2, dropout: float = 0.0, name: str = "block"):
    """``x + MHA(LN(x))``, then ``+ MLP(LN(.))``: one pre-norm encoder block on ``[batch, tokens, dim]``."""
    dim = x.shape[-1]
    if dim % heads:
        raise ValueError(f"A block of width {dim} cannot be split into {heads} heads; give a width divisible by the heads.")
    h = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{name}_norm1")(x)
    h = keras.layers.MultiHeadAttention(heads, dim // heads, dropout=dropout, name=f"{name}_attention")(h, h)
    x = keras.layers.Add(name=f"{name}_residual1")([x, h])
    h = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{name}_norm2")(x)
    h = keras.layers.Dense(mlp_ratio * dim, activation="gelu", name=f"{name}_mlp1")(h)
    h = keras.layers.Dense(dim, name=f"{name}_mlp2")(h)
    return keras.layers.Add(name=f"{name}_residual2")([x, h])


def vit(
    input_shape: tuple[int, int, int], num_classes: int, *, patch: int = 4, dim: int = 64, depth: int = 4, heads: int = 4,
    dropout: float = 0.0,
) -> keras.Model:
    """A Vision Transformer: ``patch x patch`` patches embedded by a strided Conv2D, mean-pooled tokens.

    Args:
        input_shape: ``(height, width, channels)``, each side a multiple of ``patch``.
        num_classes: the logits' width.
        patch, dim, depth, heads, dropout: the patch side, token width, blocks, heads per
            attention and attention dropout.

    Returns:
        A functional model ``[batch, height, width, channels] -> [batch, num_classes]`` (logits).

    Examples:
        >>> vit((28, 28, 1), 10, dim=16, depth=1, heads=2).output.shape
        (None, 10)
    """
    height, width, _ = input_shape
    if height % patch or width % patch:
        raise ValueError(f"A ViT with {patch}x{patch} patches needs sides that are multiples of {patch}; got {input_shape}.")
    tokens = (height // patch) * (width // patch)
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(dim, patch, strides=patch, name="patches")(inputs)
    x = keras.layers.Reshape((tokens, dim), name="tokens")(x)
    x = PositionEmbedding(tokens, name="positions")(x)
    return keras.Model(inputs, _encoder(x, num_classes, depth, heads, dropout), name="vit")


def text_classifier(
    tokens: int, vocabulary: int, num_classes: int, *, dim: int = 64, depth: int = 4, heads: int = 4, dropout: float = 0.0,
) -> keras.Model:
    """A transformer encoder of token ids (0 is padding, masked in attention and in the mean).

    Args:
        tokens: the longest sequence.
        vocabulary: the number of token ids, padding included.
        num_classes, dim, depth, heads, dropout: as for :func:`vit`.

    Returns:
        A functional model ``[batch, tokens]`` int ids ``-> [batch, num_classes]`` (logits).

    Examples:
        >>> text_classifier(12, 100, 2, dim=16, depth=1, heads=2).output.shape
        (None, 2)
    """
    inputs = keras.Input((tokens,), dtype="int32")
    x = keras.layers.Embedding(vocabulary, dim, mask_zero=True, name="embedding")(inputs)
    x = PositionEmbedding(tokens, name="positions")(x)
    return keras.Model(inputs, _encoder(x, num_classes, depth, heads, dropout), name="text_classifier")


def _encoder(x, num_classes: int, depth: int, heads: int, dropout: float):
    """The blocks, a final LayerNormalization, the mean over the tokens (padding skipped) and the logits."""
    for i in range(depth):
        x = encoder_block(x, heads=heads, dropout=dropout, name=f"block{i}")
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="norm")(x)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.layers.Dense(num_classes, name="logits")(x)
