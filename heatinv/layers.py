"""Layers heatinv adds to Keras: a ReLU smoothed by a softplus with a sharpness ``beta``."""

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

    Example:
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
