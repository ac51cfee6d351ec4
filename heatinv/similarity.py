"""Heatmap similarity metrics: the one place they are computed.

TensorBoard summaries, `metrics.json` and console logs all call
`similarity` (or `similarity_numpy`), so a number means the same thing
wherever it is reported.

Every metric compares a batch of heatmaps with a batch of targets of the same
shape `[batch, ...]` sample by sample; `similarity` then averages over the
batch. All are pure TensorFlow ops and run eagerly, inside `tf.function`, and
under `jit_compile=True`. Degenerate inputs (all-zero or constant maps) give
finite values, never NaN, because denominators are floored at a small
epsilon.

- `cosine`: cosine of the angle between the flattened maps, in `[-1, 1]`.
  0 when either map is all zeros.
- `pearson`: Pearson correlation of the flattened maps (cosine of the
  mean-centred maps), in `[-1, 1]`. 0 when either map is constant.
- `spearman`: Pearson correlation of the ranks of the flattened values. Tied
  values get their average rank (as `scipy.stats.rankdata` does by default),
  which matters because LRP maps often contain many exact zeros. Ranks carry
  no gradient, so `spearman` is a metric, not a loss.
- `ssim`: structural similarity, with the target taken as the reference
  image. Heatmaps are signed and have no fixed range, so both maps are
  first shifted by the target's per-sample minimum (the target then lies in
  `[0, L]`, like an ordinary image) and the SSIM dynamic range `L` is the
  target's value range `max - min`, floored at epsilon. The shift matters:
  SSIM's luminance term assumes non-negative intensities, and on raw signed
  maps a negated heatmap scores about +0.5 (two negative factors multiply
  to a positive score); after the shift it scores clearly negative. The
  heatmap is judged on the target's scale, so SSIM is not scale-invariant.
  Image-shaped inputs (`[B, H, W, C]`, or `[B, H, W]`, or `[B, D]` with `D`
  a perfect square, reshaped to `[B, sqrt(D), sqrt(D), 1]`) use
  `tf.image.ssim` with its Gaussian window (sigma 1.5) of size
  `min(11, H, W)`. Other inputs use the same formula over one global window
  covering the whole map.

Examples:
    >>> import numpy as np
    >>> maps = np.random.default_rng(0).normal(size=(4, 28, 28, 1))
    >>> scores = similarity_numpy(maps, maps)
    >>> sorted(scores)
    ['cosine', 'pearson', 'spearman', 'ssim']
    >>> round(scores["pearson"], 4)
    1.0
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

# Floor for norms and for the SSIM range. Small enough not to bias real LRP
# maps (whose norms are O(0.1..10)), large enough that its square (1e-24)
# and the SSIM constants built from it stay normal float32 numbers.
EPSILON = 1e-12

_SSIM_K1 = 0.01
_SSIM_K2 = 0.03
_SSIM_MAX_FILTER = 11


def similarity(heatmap, target) -> dict[str, tf.Tensor]:
    """All similarity metrics, each averaged over the batch.

    Args:
        heatmap: `[batch, ...]` float tensor or array.
        target: same shape as `heatmap`.

    Returns:
        Dict with keys `cosine`, `ssim`, `pearson`, `spearman`; each value is
        a scalar float32 tensor.

    Examples:
        >>> h = tf.random.normal([8, 28, 28, 1])
        >>> float(similarity(h, -h)["cosine"])
        -1.0
    """
    scores = per_sample_similarity(heatmap, target)
    return {name: tf.reduce_mean(value) for name, value in scores.items()}


def per_sample_similarity(heatmap, target) -> dict[str, tf.Tensor]:
    """All similarity metrics, one value per sample.

    Args:
        heatmap: `[batch, ...]` float tensor or array.
        target: same shape as `heatmap`.

    Returns:
        Dict with keys `cosine`, `ssim`, `pearson`, `spearman`; each value is
        a float32 tensor of shape `[batch]`.

    Examples:
        >>> h = tf.random.normal([8, 784])
        >>> per_sample_similarity(h, h)["spearman"].shape
        TensorShape([8])
    """
    heatmap, target = _prepare(heatmap, target)
    return {
        "cosine": cosine(heatmap, target),
        "ssim": ssim(heatmap, target),
        "pearson": pearson(heatmap, target),
        "spearman": spearman(heatmap, target),
    }


def similarity_numpy(heatmap, target) -> dict[str, float]:
    """`similarity` run eagerly, returning plain Python floats.

    For `metrics.json` and console output, where tensors do not serialise.

    Args:
        heatmap: `[batch, ...]` array.
        target: same shape as `heatmap`.

    Returns:
        Dict with keys `cosine`, `ssim`, `pearson`, `spearman` mapping to
        floats.

    Examples:
        >>> import numpy as np
        >>> similarity_numpy(np.ones((1, 4)), np.ones((1, 4)))["cosine"]
        1.0
    """
    return {name: float(value) for name, value in similarity(heatmap, target).items()}


def cosine(heatmap, target) -> tf.Tensor:
    """Per-sample cosine similarity of flattened maps, `[batch]`.

    Examples:
        >>> cosine(tf.ones([2, 3]), 2.0 * tf.ones([2, 3])).numpy()
        array([1., 1.], dtype=float32)
    """
    heatmap, target = _prepare(heatmap, target)
    return _cosine_rows(_flatten(heatmap), _flatten(target))


def cosine_numpy(heatmap, target) -> np.ndarray:
    """:func:`cosine` in NumPy (float64), for a value read at a log step without tracing a graph.

    Examples:
        >>> cosine_numpy(np.ones((2, 3)), -np.ones((2, 3))).tolist()
        [-1.0, -1.0]
    """
    a = np.asarray(heatmap, np.float64).reshape(len(heatmap), -1)
    b = np.asarray(target, np.float64).reshape(len(target), -1)
    if a.shape != b.shape:
        raise ValueError(f"cosine_numpy: heatmap has shape {np.shape(heatmap)}, target {np.shape(target)}; expected identical shapes.")
    norms = np.sqrt(np.maximum((a * a).sum(-1), EPSILON**2)) * np.sqrt(np.maximum((b * b).sum(-1), EPSILON**2))
    return np.clip((a * b).sum(-1) / norms, -1.0, 1.0)


def pearson(heatmap, target) -> tf.Tensor:
    """Per-sample Pearson correlation of flattened maps, `[batch]`.

    Examples:
        >>> pearson([[1.0, 2.0, 3.0]], [[10.0, 20.0, 30.0]]).numpy()
        array([1.], dtype=float32)
    """
    heatmap, target = _prepare(heatmap, target)
    return _pearson_rows(_flatten(heatmap), _flatten(target))


def spearman(heatmap, target) -> tf.Tensor:
    """Per-sample Spearman rank correlation (average ranks for ties), `[batch]`.

    Examples:
        >>> spearman([[1.0, 2.0, 3.0]], [[1.0, 4.0, 9.0]]).numpy()
        array([1.], dtype=float32)
    """
    heatmap, target = _prepare(heatmap, target)
    heatmap, target = _flatten(heatmap), _flatten(target)
    correlation = _pearson_rows(average_ranks(heatmap), average_ranks(target))
    # NaN has no rank (a sort puts it anywhere): a map holding one has no rank correlation either
    finite = tf.reduce_all(tf.math.is_finite(heatmap), axis=-1) & tf.reduce_all(tf.math.is_finite(target), axis=-1)
    return tf.where(finite, correlation, tf.constant(np.nan, correlation.dtype))


def ssim(heatmap, target) -> tf.Tensor:
    """Per-sample SSIM of heatmap against the target, `[batch]`.

    Both maps are shifted by the target's minimum and `L` is the target's
    value range; see the module docstring for why and for the window.

    Examples:
        >>> h = tf.random.normal([2, 28, 28, 1])
        >>> ssim(h, h).numpy().round(4)
        array([1., 1.], dtype=float32)
    """
    heatmap, target = _prepare(heatmap, target)
    flat_target = _flatten(target)
    value_range = _value_range(flat_target)
    # Put the target in [0, L] and move the heatmap with it; see the module
    # docstring for why SSIM needs this on signed maps.
    offset = tf.reduce_min(flat_target, axis=-1)
    offset = tf.reshape(offset, [-1] + [1] * (target.shape.rank - 1))
    heatmap, target = heatmap - offset, target - offset
    heatmap_images, target_images = _as_images(heatmap), _as_images(target)
    if heatmap_images is None:
        return _global_ssim(_flatten(heatmap), _flatten(target), value_range)
    height, width = heatmap_images.shape[1], heatmap_images.shape[2]
    return tf.image.ssim(
        heatmap_images,
        target_images,
        max_val=tf.reshape(value_range, [-1, 1, 1, 1]),
        filter_size=min(_SSIM_MAX_FILTER, height, width),
        k1=_SSIM_K1,
        k2=_SSIM_K2,
    )


def average_ranks(values) -> tf.Tensor:
    """1-based ranks along the last axis, ties sharing their average rank.

    Uses a sort plus two binary searches (`O(n log n)`), not an `n x n`
    comparison, so it stays cheap for large batches.

    Args:
        values: `[batch, n]` float tensor.

    Returns:
        `[batch, n]` float32 ranks.

    Examples:
        >>> average_ranks([[10.0, 0.0, 0.0, 5.0]]).numpy()
        array([[4. , 1.5, 1.5, 3. ]], dtype=float32)
    """
    values = tf.convert_to_tensor(values, dtype=tf.float32)
    ordered = tf.sort(values, axis=-1)
    below = tf.searchsorted(ordered, values, side="left")
    at_or_below = tf.searchsorted(ordered, values, side="right")
    # Tied values occupy positions below+1 .. at_or_below; take the mean.
    return tf.cast(below + at_or_below + 1, tf.float32) / 2.0


def _prepare(heatmap, target) -> tuple[tf.Tensor, tf.Tensor]:
    heatmap = tf.cast(tf.convert_to_tensor(heatmap), tf.float32)
    target = tf.cast(tf.convert_to_tensor(target), tf.float32)
    if heatmap.shape.rank is None or heatmap.shape.rank < 2:
        raise ValueError(
            f"heatinv/similarity.py: heatmap has shape {heatmap.shape}, "
            "expected a batch [batch, ...] of rank 2 or more. Add a leading "
            "batch axis, e.g. heatmap[None], to compare a single map."
        )
    if not heatmap.shape.is_compatible_with(target.shape):
        raise ValueError(
            f"heatinv/similarity.py: heatmap has shape {heatmap.shape} but "
            f"target has shape {target.shape}; expected identical shapes "
            "[batch, ...]. Broadcast or tile the target to the heatmap's "
            "batch size, e.g. tf.repeat(target, batch, axis=0)."
        )
    return heatmap, target


def _flatten(x: tf.Tensor) -> tf.Tensor:
    return tf.reshape(x, [tf.shape(x)[0], -1])


def _safe_norm(rows: tf.Tensor) -> tf.Tensor:
    # Floor before sqrt so both value and gradient stay finite at zero.
    return tf.sqrt(tf.maximum(tf.reduce_sum(tf.square(rows), axis=-1), EPSILON**2))


def _cosine_rows(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    # Product of two norms rather than sqrt of a product: no overflow for
    # large-valued maps. The clip removes float32 rounding past +-1, so
    # identical maps report exactly 1.
    value = tf.reduce_sum(a * b, axis=-1) / (_safe_norm(a) * _safe_norm(b))
    return tf.clip_by_value(value, -1.0, 1.0)


def _pearson_rows(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    a = a - tf.reduce_mean(a, axis=-1, keepdims=True)
    b = b - tf.reduce_mean(b, axis=-1, keepdims=True)
    return _cosine_rows(a, b)


def _value_range(rows: tf.Tensor) -> tf.Tensor:
    spread = tf.reduce_max(rows, axis=-1) - tf.reduce_min(rows, axis=-1)
    return tf.maximum(spread, EPSILON)


def _as_images(x: tf.Tensor) -> tf.Tensor | None:
    """`[B, H, W, C]` view of `x` if it is image-like with static H, W."""
    rank = x.shape.rank
    if rank == 3:
        x = x[..., None]
    elif rank == 2:
        side = _square_side(x.shape[1])
        if side is None:
            return None
        x = tf.reshape(x, [-1, side, side, 1])
    elif rank != 4:
        # Rank 5+ has no single obvious image layout; use the global window.
        return None
    if x.shape[1] is None or x.shape[2] is None:
        return None
    return x


def _square_side(size: int | None) -> int | None:
    if size is None or size < 1:
        return None
    side = math.isqrt(size)
    return side if side * side == size else None


def _global_ssim(a: tf.Tensor, b: tf.Tensor, value_range: tf.Tensor) -> tf.Tensor:
    """SSIM formula with one window spanning each whole flattened map."""
    c1 = tf.square(_SSIM_K1 * value_range)
    c2 = tf.square(_SSIM_K2 * value_range)
    mean_a = tf.reduce_mean(a, axis=-1)
    mean_b = tf.reduce_mean(b, axis=-1)
    centred_a = a - mean_a[:, None]
    centred_b = b - mean_b[:, None]
    var_a = tf.reduce_mean(tf.square(centred_a), axis=-1)
    var_b = tf.reduce_mean(tf.square(centred_b), axis=-1)
    covariance = tf.reduce_mean(centred_a * centred_b, axis=-1)
    luminance = (2.0 * mean_a * mean_b + c1) / (tf.square(mean_a) + tf.square(mean_b) + c1)
    structure = (2.0 * covariance + c2) / (var_a + var_b + c2)
    return luminance * structure

