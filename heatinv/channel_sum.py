"""Heatmaps of colour images summed over the channels: the map a person looks at.

LRP gives every input value its own relevance, so a ``[H, W, 3]`` image gets three maps.
People read one map per pixel, and a target drawn for a pixel says nothing about how it
splits over red, green and blue; so by default the trainer compares ``sum over channels``
(``target.channels=sum``), which keeps the total relevance (conservation) unchanged.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from heatinv.lrp import LRP, Explanation


class ChannelSumLRP(LRP):
    """An :class:`~heatinv.lrp.LRP` explainer whose heatmaps are ``[batch, H, W, 1]``: summed over channels.

    Examples:
        >>> explainer = ChannelSumLRP(model)  # doctest: +SKIP
        >>> explainer(images, labels).shape  # doctest: +SKIP
        TensorShape([8, 32, 32, 1])
    """

    def explain(self, x, target) -> Explanation:
        explanation = super().explain(x, target)
        summed = tf.reduce_sum(explanation.relevance, axis=-1, keepdims=True)
        return dataclasses.replace(explanation, relevance=summed)
