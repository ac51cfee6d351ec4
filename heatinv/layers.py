"""Layers heatinv adds to Keras: a ReLU smoothed by a softplus with a sharpness ``beta``, a learned position embedding."""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="heatinv")
class SoftplusBeta(keras.layers.Layer):
    """``softplus(beta * x) / beta``: tends to ReLU as ``beta`` grows, with a non-zero curvature.

    A ReLU network's gradient is piecewise constant in its input, so any explanation built
    from it has a zero derivative with respect to the input almost everywhere; replacing
    ReLU by this softplus gives those second derivatives back (Dombrowski et al., 2019,
    "Explanations can be manipulated and geometry is to blame").

    Examples:
        >>> float(SoftplusBeta(beta=10.0)(tf.constant([1.0]))[0])  # doctest: +ELLIPSIS
        1.0000...
    """

    def __init__(self, beta: float = 10.0, **kwargs):
        super().__init__(**kwargs)
        if not beta > 0:
            raise ValueError(f"SoftplusBeta needs beta > 0, got beta={beta!r}.")
        self.beta = float(beta)

    def call(self, x):
        beta = tf.convert_to_tensor(self.beta, dtype=x.dtype)
        return tf.math.softplus(beta * x) / beta

    def get_config(self) -> dict:
        return {**super().get_config(), "beta": self.beta}


@keras.saving.register_keras_serializable(package="heatinv")
class PositionEmbedding(keras.layers.Layer):
    """A learned vector per position added to a sequence: ``y[:, t] = x[:, t] + P[t]``.

    Keras has no such layer; a transformer's learned position embedding (BERT, ViT) is one.
    LRP treats ``P`` as a bias: it absorbs its share of the relevance, and a token's relevance
    is that of its own embedding (:class:`heatinv.lrp.canonical.Shift`).

    Input and output: ``[batch, tokens, dim]``, ``tokens`` at most ``length``.

    Examples:
        >>> layer = PositionEmbedding(length=4)
        >>> layer(tf.zeros([2, 3, 5])).shape
        TensorShape([2, 3, 5])
    """

    def __init__(self, length: int, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if not (isinstance(length, int) and length > 0):
            raise ValueError(f"PositionEmbedding needs a positive int length (the longest sequence), got {length!r}.")
        self.length = length
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True  # a padding mask from the Embedding before it passes on

    def build(self, input_shape):
        tokens, dim = input_shape[-2], input_shape[-1]
        if tokens is not None and tokens > self.length:
            raise ValueError(f"PositionEmbedding {self.name!r} has {self.length} positions; its input has {tokens} tokens.")
        self.embeddings = self.add_weight(shape=(self.length, dim), initializer=self.initializer, name="embeddings")

    def call(self, x):
        tokens = tf.shape(x)[-2]
        return x + tf.cast(self.embeddings[:tokens], x.dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "length": self.length, "initializer": keras.initializers.serialize(self.initializer)}
