"""Max pooling: winner takes all, each output's relevance to the input that won its window.

The routing must pick the input max pooling picked, first among ties, in both directions:
the heatmap routes relevance to the winners, and the inverse step differentiates that
routing (and the forward pass's pooling) again. Where TensorFlow's CPU kernel computes the
gradient, the winners are its ``MaxPoolGrad``'s; under XLA or with a GPU they are found by
comparisons (:func:`_route_to_winners`). For square windows of a power-of-two size the
winners' mask is found once per layer (:func:`winners_mask`) and serves the forward pass's
gradient and the routing's two directions, which otherwise take a ``MaxPoolGrad`` each;
where TensorFlow runs oneDNN's kernels, whose ``MaxPoolGrad`` is faster than spreading
values over the mask, the mask serves the routing's derivative alone.
"""

from __future__ import annotations

import functools
from typing import Callable

import tensorflow as tf
from tensorflow.python.eager import record  # whether a tape records a tensor: no public API
from tensorflow.python.ops import control_flow_util  # whether a trace is XLA-compiled: no public API

from heatinv.lrp.rules import adjoint
from heatinv.onednn import onednn_enabled


def winner_takes_all(
    a: tf.Tensor, relevance: tf.Tensor, pool: Callable[[tf.Tensor], tf.Tensor], mask: tf.Tensor | None = None
) -> tf.Tensor:
    """Max pooling: each output's relevance goes to the input that won the max (ties: the first).

    Max pooling's own gradient does exactly that on a CPU: TensorFlow's CPU kernel
    (``MaxPoolGrad``) hands each window's gradient to its first maximal input, row-major, and
    its derivative gathers from the same inputs (``MaxPoolGradGrad``, or for square windows of
    a power-of-two size a cheaper equivalent, :func:`_route_through_mask`).
    Under XLA, or where a GPU is visible, windows that tile the input (``pool.window`` is
    set for this input: stride equal to pool size) are routed by comparisons instead (square 2-D windows,
    float16/32) or ``argmax`` (any other), with a selection, so that ties still go to the
    first input and the second derivative is exact: XLA's float32 kernel for the second
    derivative of max pooling packs values into 16 bits and was measured 10 % off, and it
    has no float64 kernel at all; the GPU kernels' choice among ties is not checked here.
    ``mask``: :func:`winners_mask` of ``a``, where the forward pass found it already.
    """
    # The routing is piecewise constant in ``a``: no gradient flows to it, and none is computed
    # (through max pooling's gradient, differentiated, a zero gradient took another two
    # MaxPoolGrad ops per layer).
    a = tf.stop_gradient(a)
    window = pool.window(a) if hasattr(pool, "window") else None
    if window is not None and _gradient_kernel_differs():
        return _route_to_winners(a, relevance, window)
    size = mask_window(pool, a)
    if size is None or not record.should_record_backprop([relevance]):
        return adjoint(pool, a, relevance)  # nothing differentiates it: MaxPoolGrad alone is cheapest
    return _route_through_mask(a, relevance, pool, winners_mask(pool, a) if mask is None else mask, size)


def mask_window(pool: Callable[[tf.Tensor], tf.Tensor], a: tf.Tensor) -> int | None:
    """The window's size where max pooling on ``a`` is routed through its winners' mask, else None.

    Square 2-D windows of a power-of-two size that tile the input, float32/64, on TensorFlow's
    CPU kernel (not under XLA, no GPU visible).
    """
    window = pool.window(a) if hasattr(pool, "window") else None
    if window is None or _gradient_kernel_differs() or a.dtype not in (tf.float32, tf.float64):
        return None
    size = window[0]
    square = len(window) == 2 and window[1] == size > 1 and size & (size - 1) == 0
    return size if square else None


def winners_mask(pool: Callable[[tf.Tensor], tf.Tensor], a: tf.Tensor) -> tf.Tensor:
    """1 at each window's winner (TensorFlow's CPU kernel's choice: the first maximal input, row-major), 0 elsewhere."""
    a = tf.stop_gradient(a)
    return adjoint(pool, a, tf.ones_like(pool(a)))


def max_pool_with_mask(pool: Callable[[tf.Tensor], tf.Tensor], a: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor | None]:
    """``pool(a)`` and, where a tape records ``a`` and :func:`mask_window` applies, its winners' mask (else None).

    With a mask, the pooling's gradient is the cotangent spread to the mask's winners,
    equal to ``MaxPoolGrad``'s, and :func:`winner_takes_all` takes the same mask: the
    winners are found once for the forward pass's gradient and the routing's two directions.
    Where oneDNN's kernels run (:func:`heatinv.onednn.onednn_enabled`), the pooling keeps
    its own gradient, oneDNN's ``MaxPoolGrad``, and the mask serves the routing.

    Examples:
        >>> pool = lambda x: tf.nn.max_pool2d(x, 2, 2, "VALID")
        >>> pool.window = lambda x: (2, 2)
        >>> a = tf.constant([[1.0, 3.0], [3.0, 0.0]])[None, :, :, None]
        >>> with tf.GradientTape() as tape:
        ...     tape.watch(a)
        ...     pooled, mask = max_pool_with_mask(pool, a)
        >>> mask[0, :, :, 0].numpy().tolist(), tape.gradient(pooled, a)[0, :, :, 0].numpy().tolist()
        ([[0.0, 1.0], [0.0, 0.0]], [[0.0, 1.0], [0.0, 0.0]])
    """
    size = mask_window(pool, a)
    if size is None or not record.should_record_backprop([a]):
        return pool(a), None
    mask = winners_mask(pool, a)
    if onednn_enabled():
        return pool(a), mask

    @tf.custom_gradient
    def pooled(a):
        def gradient(g):
            return _to_winners(g, mask, size)

        return pool(a), gradient

    return pooled(a), mask


def _route_through_mask(
    a: tf.Tensor, relevance: tf.Tensor, pool: Callable[[tf.Tensor], tf.Tensor], mask: tf.Tensor, size: int
) -> tf.Tensor:
    """Square 2-D windows of a power-of-two size that tile the input, on TensorFlow's CPU kernel.

    The routing is the relevance spread to the winners of ``mask`` (:func:`winners_mask`, max
    pooling's own gradient of ones), or, where oneDNN's kernels run, max pooling's own gradient
    of the relevance, which puts it at the same winners in one op: the cnn's inverse step took
    0.95-0.98 of the time with it and the pooling's own gradient (:func:`max_pool_with_mask`) on
    a 2-core AMD EPYC with AVX-512, epsilon_plus and epsilon_gamma_box at batch 64 and 256
    (0.90-0.95 in a first run). Its derivative gathers each window's winner, as the window's sum
    of the mask times the cotangent, an average pooling times the area: one non-zero term,
    scaled by a power of two and back, exact for float32/64 down to the smallest normal number
    times the area (below it, the CPU flushes to zero anyway; float16, whose range ends far
    sooner, keeps TensorFlow's kernel). Both directions pick the same input among ties, and a
    losing input's relevance or cotangent is dropped even when it is not finite. TensorFlow's
    own ``MaxPoolGrad`` and ``MaxPoolGradGrad`` find the winners anew in each direction: the
    second was a tenth of the cnn's inverse step at batch 256.
    """

    @tf.custom_gradient
    def route(relevance):
        def gradient(g):
            picked = tf.math.multiply_no_nan(g, mask)  # 0 * inf at a losing input is 0, not NaN
            return tf.nn.avg_pool2d(picked, size, size, "VALID") * (size * size)

        routed = adjoint(pool, a, relevance) if onednn_enabled() else _to_winners(relevance, mask, size)
        return routed, gradient

    return route(relevance)


def _to_winners(values: tf.Tensor, mask: tf.Tensor, size: int) -> tf.Tensor:
    """Each of ``values`` spread over its window and kept at the window's winner in ``mask`` (a loser's inf or NaN dropped)."""
    return tf.math.multiply_no_nan(_spread_over_windows(values, size, mask), mask)


def _spread_over_windows(relevance: tf.Tensor, size: int, like: tf.Tensor) -> tf.Tensor:
    """Each of ``relevance``'s values repeated over its ``size x size`` window, zero-padded to ``like``'s shape."""
    shape = tf.shape(relevance)
    spread = tf.broadcast_to(relevance[:, :, None, :, None, :], [shape[0], shape[1], size, shape[2], size, shape[3]])
    spread = tf.reshape(spread, [shape[0], shape[1] * size, shape[2] * size, shape[3]])
    if all(d is not None and d % size == 0 for d in like.shape[1:3]):
        return spread
    rest = tf.shape(like)[1:3] - tf.shape(spread)[1:3]
    return tf.pad(spread, [[0, 0], [0, rest[0]], [0, rest[1]], [0, 0]])


def _gradient_kernel_differs() -> bool:
    """Whether max pooling's gradient may not be TensorFlow's CPU kernel: under XLA, or with a GPU."""
    in_xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    return in_xla or bool(tf.config.list_logical_devices("GPU"))


def _route_to_winners(a: tf.Tensor, relevance: tf.Tensor, window: tuple[int, ...]) -> tf.Tensor:
    """Winner-takes-all for non-overlapping windows, with ordinary ops (ties: first in window)."""
    spatial = len(window)
    sizes = _spatial_sizes(a, spatial)
    outputs = [size // w for size, w in zip(sizes, window)]
    cropped = a[(slice(None),) + tuple(slice(0, o * w) for o, w in zip(outputs, window))]
    # space_to_depth needs a block of at least 2, and TensorFlow's GPU kernels of it take
    # float16/32 only (float64 would run on the CPU, copied there and back, in every heatmap).
    if spatial == 2 and window[0] == window[1] > 1 and a.dtype in (tf.float16, tf.float32):
        routed = _route_in_depth(cropped, relevance, window[0])
    else:
        routed = _route_by_argmax(cropped, relevance, window)
    padding = [[0, 0]] + [[0, size - o * w] for size, o, w in zip(sizes, outputs, window)] + [[0, 0]]
    return tf.pad(routed, padding)


def _spatial_sizes(a: tf.Tensor, spatial: int) -> list:
    """``a``'s spatial sizes: numbers where the trace knows them, scalar tensors where it does not (a model of any input size)."""
    dynamic = tf.shape(a)
    return [size if size is not None else dynamic[1 + i] for i, size in enumerate(a.shape[1 : 1 + spatial])]


def _route_in_depth(a: tf.Tensor, relevance: tf.Tensor, size: int) -> tf.Tensor:
    """Square 2-D windows: ``space_to_depth`` lays each window's inputs side by side (row-major).

    The first input equal to its window's maximum takes the relevance, and
    ``depth_to_space`` puts the pieces back in place. Four-dimensional ops only: on the
    cnn at batch 64 this took half the CPU time of :func:`_route_by_argmax`, whose six-
    dimensional transposes and ``argmax`` over the window dominated the heatmap (with XLA
    the two are within 1.3x of each other, both fast).
    """
    candidates = tf.split(tf.nn.space_to_depth(a, size), size * size, axis=-1)
    best = functools.reduce(tf.maximum, candidates)
    taken = tf.zeros_like(best, dtype=tf.bool)
    pieces = []
    for candidate in candidates[:-1]:
        wins = tf.logical_and(tf.equal(candidate, best), tf.logical_not(taken))
        pieces.append(tf.where(wins, relevance, tf.zeros_like(relevance)))
        taken = tf.logical_or(taken, wins)
    pieces.append(tf.where(taken, tf.zeros_like(relevance), relevance))  # the last input, where none before won
    return tf.nn.depth_to_space(tf.concat(pieces, axis=-1), size)


def _route_by_argmax(a: tf.Tensor, relevance: tf.Tensor, window: tuple[int, ...]) -> tf.Tensor:
    """Any window shape: ``argmax`` over each window's inputs, gathered by transposes."""
    spatial = len(window)
    outputs = [size // w for size, w in zip(_spatial_sizes(a, spatial), window)]
    channels = a.shape[-1]
    # [B, o1, w1, o2, w2, ..., C] -> [B, o1, o2, ..., C, w1 * w2 * ...]
    split = [-1] + [d for o, w in zip(outputs, window) for d in (o, w)] + [channels]
    order = [0] + [1 + 2 * i for i in range(spatial)] + [1 + 2 * spatial] + [2 + 2 * i for i in range(spatial)]
    windows = tf.transpose(tf.reshape(a, split), order)
    area = 1
    for w in window:
        area *= w
    windows = tf.reshape(windows, tf.concat([tf.shape(windows)[: spatial + 2], [area]], axis=0))
    winners = tf.one_hot(tf.argmax(windows, axis=-1), area, dtype=relevance.dtype)
    routed = winners * relevance[..., None]
    routed = tf.reshape(routed, tf.concat([tf.shape(routed)[: spatial + 2], window], axis=0))
    inverse = [0] + [x for i in range(spatial) for x in (1 + i, spatial + 2 + i)] + [1 + spatial]
    return tf.reshape(tf.transpose(routed, inverse), [-1] + [o * w for o, w in zip(outputs, window)] + [channels])
