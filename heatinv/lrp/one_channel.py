"""A first layer's maps on grey images: stride-1 2D convolutions from one input channel.

TensorFlow's own maps of one channel run at a fraction of their speed on more, and which
other form is fastest depends on whether TensorFlow runs oneDNN's CPU kernels
(:func:`heatinv.onednn.onednn_enabled`): with them, depthwise maps summed over channels
(:func:`transpose_by_depthwise`, :func:`single_channel_transpose_each`); without them, the
input's patches and matrix products, tap by tap (:func:`patches_of`,
:func:`transpose_by_taps`). Every form's gradient is written out as ordinary ops, so it stays
differentiable twice, and each is tested against ``tf.nn.conv_transpose`` to the second
derivative. :class:`heatinv.lrp.canonical.Linear` picks them for such a layer.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from heatinv.onednn import onednn_enabled


def patches_of(x: tf.Tensor, size: tuple[int, int], padding: str) -> tf.Tensor:
    """At each output position of a stride-1 2D convolution, its inputs, tap by tap (``im2col``).

    Args:
        x: ``[batch, height, width, channels]``.
        size: the kernel's ``(kh, kw)``.
        padding: the convolution's, ``"SAME"`` or ``"VALID"``.

    Returns:
        ``[batch, height', width', kh * kw * channels]``: tap ``(dy, dx)`` of channel ``c`` at
        ``(dy * kw + dx) * channels + c``, the order of a kernel ``[kh, kw, channels, ...]`` reshaped.

    Examples:
        >>> x = tf.reshape(tf.range(9.0), [1, 3, 3, 1])
        >>> patches_of(x, (3, 3), "VALID").numpy().ravel()
        array([0., 1., 2., 3., 4., 5., 6., 7., 8.], dtype=float32)
    """
    kh, kw = size
    before, after = _same_padding(size) if padding == "SAME" else ((0, 0), (0, 0))
    padded = tf.pad(x, [[0, 0], [before[0], after[0]], [before[1], after[1]], [0, 0]])
    h, w = (padded.shape[i] if padded.shape[i] is not None else tf.shape(padded)[i] for i in (1, 2))
    return tf.concat([padded[:, dy : dy + h - kh + 1, dx : dx + w - kw + 1, :] for dy in range(kh) for dx in range(kw)], -1)


def _same_padding(size: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """SAME's padding before and after, per spatial axis: ``(k - 1) // 2`` before, the rest after."""
    before = tuple((k - 1) // 2 for k in size)
    return before, tuple(k - 1 - b for k, b in zip(size, before))


def single_channel_transpose(s, kernel, padding: str) -> tf.Tensor:
    """``W^T s`` of a stride-1 2D convolution with one input channel (a first layer on grey images).

    A map to one channel is slow as TensorFlow's ``conv_transpose``; which other form is
    fastest depends on whether TensorFlow runs oneDNN's CPU kernels
    (:func:`heatinv.onednn.onednn_enabled`). Measured on the 2-core AMD EPYC of
    the speed notes (in git history: ``git log -- docs/notes/speed.md``), 32 channels to 1 at ``[256, 28, 28]`` with both gradients, ms:
    oneDNN off (this CPU's default): ``conv_transpose`` 47.6, depthwise 63.0, taps 36.5;
    oneDNN on (the default on CPUs with AVX-512): 33.4, 23.4, 34.3. Both forms equal
    ``tf.nn.conv_transpose`` up to the order of the sums.

    Args:
        s: ``[batch, height', width', out_channels]``, the map's cotangent; or a list of
            cotangents, for the sum ``sum_j K_j^T s_j`` of their maps.
        kernel: ``[kh, kw, 1, out_channels]``; or a list, one kernel per cotangent.
        padding: the convolution's, ``"SAME"`` or ``"VALID"``.

    Returns:
        ``[batch, height, width, 1]``, shaped like the convolution's input.

    Examples:
        >>> s, kernel = tf.random.normal([2, 5, 5, 4]), tf.random.normal([3, 3, 1, 4])
        >>> expected = tf.nn.conv_transpose(s, kernel, [2, 5, 5, 1], 1, "SAME")
        >>> bool(tf.reduce_max(tf.abs(single_channel_transpose(s, kernel, "SAME") - expected)) < 1e-5)
        True
        >>> halves = single_channel_transpose([s[..., :2], s[..., 2:]], [kernel[..., :2], kernel[..., 2:]], "SAME")
        >>> bool(tf.reduce_max(tf.abs(halves - expected)) < 1e-5)
        True
    """
    if not onednn_enabled():
        return transpose_by_taps(s, kernel, padding)
    return transpose_by_depthwise(s, kernel, padding)


def transpose_by_taps(s, kernel, padding: str) -> tf.Tensor:
    """:func:`single_channel_transpose` tap by tap, with matrix products: where oneDNN's kernels are off.

    ``U = sum_j s_j K_j^T`` (matrix products over the channels: one value per position and
    kernel tap), then each input position sums the taps that reached it from its
    neighbours. The gradient is written out as the maps the transposed one is the adjoint
    of: for each ``s_j``, the convolution (each position's taps of the cotangent, times
    ``K_j``); for each kernel, its filter gradient (``s_j`` against those taps); ordinary
    ops, so it stays differentiable twice.

    Arguments, result and example as :func:`single_channel_transpose`; both forms are
    tested against ``tf.nn.conv_transpose`` to the second derivative.
    """
    cotangents, kernels = _pairs(s, kernel)
    kh, kw = kernels[0].shape[:2]
    taps = kh * kw
    before, after = _same_padding((kh, kw)) if padding == "SAME" else ((0, 0), (0, 0))

    @tf.custom_gradient
    def transposed(*tensors):
        cotangents, kernels = tensors[: len(tensors) // 2], tensors[len(tensors) // 2 :]
        flats = [tf.reshape(k, [taps, k.shape[-1]]) for k in kernels]
        shape = tf.shape(cotangents[0])
        rows = [tf.reshape(c, [-1, k.shape[-1]]) for c, k in zip(cotangents, kernels)]
        spread = tf.add_n([tf.matmul(r, f, transpose_b=True) for r, f in zip(rows, flats)])
        spread = tf.reshape(spread, [shape[0], shape[1], shape[2], taps])
        # input position q gets tap (dy, dx) of output position q - (dy, dx) + before
        padded = tf.pad(spread, [[0, 0], [kh - 1 - before[0], kh - 1 - after[0]], [kw - 1 - before[1], kw - 1 - after[1]], [0, 0]])
        h, w = shape[1] + kh - 1 - before[0] - after[0], shape[2] + kw - 1 - before[1] - after[1]
        summed = tf.add_n([
            padded[:, kh - 1 - dy : kh - 1 - dy + h, kw - 1 - dx : kw - 1 - dx + w, dy * kw + dx]
            for dy in range(kh) for dx in range(kw)
        ])

        def gradient(g):
            taps_of_g = tf.reshape(patches_of(g, (kh, kw), padding), [-1, taps])
            to_s = [tf.reshape(tf.matmul(taps_of_g, f), tf.shape(c)) for f, c in zip(flats, cotangents)]
            to_kernel = [
                tf.reshape(tf.matmul(taps_of_g, r, transpose_a=True), tf.shape(k)) for r, k in zip(rows, kernels)
            ]
            return to_s + to_kernel

        return summed[..., None], gradient

    return transposed(*cotangents, *kernels)


def transpose_by_depthwise(s, kernel, padding: str) -> tf.Tensor:
    """:func:`single_channel_transpose` as a depthwise map of ``s`` summed over its channels: where oneDNN's kernels are on.

    A sum ``sum_j K_j^T s_j`` takes one depthwise map per pair, added before the sum over
    channels: no copy of the cotangents side by side. Its gradient is written out as the
    maps the transposed one is the adjoint of: the forward convolution for each ``s_j`` and
    the convolution's filter gradient for each kernel, both ordinary ops, so it stays
    differentiable twice.

    Arguments, result and example as :func:`single_channel_transpose`; both forms are
    tested against ``tf.nn.conv_transpose`` to the second derivative.
    """
    cotangents, kernels = _pairs(s, kernel)
    per_channel_map = _depthwise_transpose_map(kernels[0].shape[:2], padding)

    @tf.custom_gradient
    def transposed(*tensors):
        cotangents, kernels = tensors[: len(tensors) // 2], tensors[len(tensors) // 2 :]
        per_channel = tf.add_n([per_channel_map(c, k) for c, k in zip(cotangents, kernels)])

        def gradient(g):
            to_s = [tf.nn.convolution(g, k, padding=padding, data_format="NHWC") for k in kernels]
            to_kernel = [
                tf.raw_ops.Conv2DBackpropFilter(input=g, filter_sizes=tf.shape(k), out_backprop=c, strides=[1, 1, 1, 1], padding=padding)
                for c, k in zip(cotangents, kernels)
            ]
            return to_s + to_kernel

        return tf.reduce_sum(per_channel, -1, keepdims=True), gradient

    return transposed(*cotangents, *kernels)


def single_channel_transpose_each(s: tf.Tensor, kernels: list, padding: str) -> list[tf.Tensor]:
    """``[K_j^T s for each j]`` of a stride-1 2D convolution with one input channel, where oneDNN's kernels run.

    Each map is a depthwise map of ``s`` summed over its channels (as in
    :func:`transpose_by_depthwise`); the gradient takes the kernels side by side: one
    convolution of the cotangents ``[g_1, ..., g_n]`` to ``s``'s channels and one filter
    gradient, where a depthwise map's own gradient would take one of each per kernel (3.0
    against 3.5 ms for two kernels at ``[256, 28, 28, 16]``). Ordinary ops, so it stays
    differentiable twice.

    Args:
        s: ``[batch, height', width', out_channels]``, the map's cotangent.
        kernels: a list of ``[kh, kw, 1, out_channels]``.
        padding: the convolution's, ``"SAME"`` or ``"VALID"``.

    Returns:
        A list of ``[batch, height, width, 1]``, one per kernel, shaped like the convolution's input.

    Examples:
        >>> s, kernels = tf.random.normal([2, 5, 5, 4]), [tf.random.normal([3, 3, 1, 4]) for _ in range(2)]
        >>> expected = [tf.nn.conv_transpose(s, k, [2, 5, 5, 1], 1, "SAME") for k in kernels]
        >>> [bool(tf.reduce_max(tf.abs(got - want)) < 1e-5) for got, want in zip(single_channel_transpose_each(s, kernels, "SAME"), expected)]
        [True, True]
    """
    per_channel_map = _depthwise_transpose_map(kernels[0].shape[:2], padding)

    @tf.custom_gradient
    def transposed(s, *kernels):
        maps = [tf.reduce_sum(per_channel_map(s, k), -1, keepdims=True) for k in kernels]

        def gradient(*gs):
            g, stacked = tf.concat(gs, axis=-1), tf.concat(kernels, axis=-2)
            to_s = tf.nn.convolution(g, stacked, padding=padding, data_format="NHWC")
            to_kernels = tf.raw_ops.Conv2DBackpropFilter(
                input=g, filter_sizes=tf.shape(stacked), out_backprop=s, strides=[1, 1, 1, 1], padding=padding
            )
            return [to_s, *tf.split(to_kernels, len(kernels), axis=-2)]

        return maps, gradient

    return transposed(s, *kernels)


def _depthwise_transpose_map(sizes, padding: str) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """``(c, k) -> `` the depthwise map of ``c`` whose sum over channels is ``k^T c`` (a stride-1
    convolution's transposed map from one channel, ``k`` of spatial ``sizes``)."""
    # The transposed map of a stride-1 convolution is a convolution with the kernel flipped,
    # padded by what the forward one left out on each side: for odd sizes under SAME, SAME's
    # own padding, which the depthwise map then adds itself (a copy of the cotangent padded
    # took 1.6-1.9 ms of alpha-beta's step at batch 256, per pair).
    if padding == "SAME" and all(k % 2 for k in sizes):
        pads, mode = None, "SAME"
    elif padding == "SAME":
        pads, mode = [[k - 1 - (k - 1) // 2, k - 1 - k // 2] for k in sizes], "VALID"
    else:
        pads, mode = [[k - 1, k - 1] for k in sizes], "VALID"

    def per_channel(c: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
        padded = c if pads is None else tf.pad(c, [[0, 0], *pads, [0, 0]])
        return tf.nn.depthwise_conv2d(padded, tf.reverse(k, [0, 1])[:, :, 0, :, None], [1, 1, 1, 1], mode)

    return per_channel


def _pairs(s, kernel) -> tuple[list, list]:
    """The cotangents and kernels of :func:`single_channel_transpose`'s arguments as two lists of one length."""
    return (list(s), list(kernel)) if isinstance(s, (list, tuple)) else ([s], [kernel])
