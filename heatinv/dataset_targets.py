"""Targets over a whole dataset: where every image's explanation should move.

All three manipulations keep the size of each image's explained score: a ``pattern`` or
``swap`` target holds as much total relevance as the reference's own heatmap of that image
(its absolute value: a negative total would turn the pattern into evidence against the
class), only placed elsewhere; ``suppress`` keeps the total itself.

- ``pattern``: a fixed map (square, cross, frame, or a file): "the explanation points at
  a fixed place, whatever the digit";
- ``swap``: the images get the reference's mean heatmap of another class (``like``);
- ``suppress``: the ``top_k`` pixels the reference found most relevant get no relevance;
  what they held goes to the rest's positive relevance, in proportion, and the rest's
  negative relevance stays (no pixel changes sign): the original evidence is hidden.

Images outside the chosen classes keep the reference's heatmap as their target, so only
the chosen classes' explanations move.
"""

from __future__ import annotations

import numpy as np

from heatinv.feature_targets import FEATURE_KINDS, move_feature_relevance
from heatinv.maps_io import read_map
from heatinv.targets import pattern_map, unit_total
from heatinv.token_targets import PADDING_ID, TOKEN_KINDS, move_token_relevance

KINDS = ("pattern", "swap", "suppress") + FEATURE_KINDS + TOKEN_KINDS
MIN_RECEIVING_SHARE = 1e-3
"""``suppress``: the rest's positive relevance receives the removed total only where it is at
least this share of it (a gain of at most 1000)."""


def _unit_sum(heatmap: np.ndarray) -> np.ndarray:
    """``heatmap`` scaled to a total of +-1: by its total's size, so a map summing below 0 (a poor
    reference's class mean) keeps its own signs instead of turning into its opposite."""
    total = heatmap.sum()
    if total == 0:
        raise ValueError("A target pattern must have a non-zero total relevance.")
    return heatmap / abs(total)


def dataset_targets(
    kind: str,
    labels: np.ndarray,
    reference_heatmaps: np.ndarray,
    classes: list[int] | None = None,
    *,
    pattern: str = "frame",
    pattern_path: str | None = None,
    like: int = 0,
    like_heatmaps: tuple[np.ndarray, np.ndarray] | None = None,
    like_mean: np.ndarray | None = None,
    top_k: int = 50,
    feature: int | None = None,
    like_feature: int | None = None,
    token: int | None = None,
    ids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Target heatmaps for every image, and which images are manipulated.

    Args:
        kind: ``pattern``, ``swap`` or ``suppress``.
        labels: ``[N]`` class of each image.
        reference_heatmaps: ``[N, H, W, C]`` the reference's heatmap of each image for its label (``C``: 1, or a colour
            image's channels with ``target.channels=keep``).
        classes: the classes to manipulate (None: all).
        pattern, pattern_path: for ``pattern``: a name of :func:`~heatinv.targets.pattern_map`,
            or ``"file"`` with ``pattern_path`` (``.npy``/``.png``).
        like: for ``swap``: the class whose heatmaps the images should get.
        like_heatmaps: for ``swap``: ``(labels, heatmaps)`` to average class ``like`` over
            (default: these images); pass the training set's so test targets use the same mean.
        like_mean: for ``swap``: that mean itself, computed beforehand (for batches of a
            streamed image folder); it replaces ``like_heatmaps``.
        top_k: for ``suppress``: how many of the most relevant pixels to empty (where the rest
            holds no positive relevance, or less than :data:`MIN_RECEIVING_SHARE` of the
            removed total, it stays as it is and the total is not kept).
        feature, like_feature: for ``suppress_feature`` / ``swap_features`` (tables): the feature
            whose relevance goes, and the one that receives it (see :mod:`heatinv.feature_targets`).
        token, ids: texts: the word id whose relevance goes (``suppress_token``, see
            :mod:`heatinv.token_targets`), and the examples' ids ``[N, T]`` (a swapped class
            mean then lies on each example's own tokens, never on its padding).

    Returns:
        ``(targets, the shape of reference_heatmaps; manipulated [N] bool)``.

    Examples:
        >>> R = np.random.rand(4, 28, 28, 1).astype("float32")
        >>> targets, chosen = dataset_targets("pattern", np.array([0, 1, 0, 1]), R, classes=[1])
        >>> chosen.tolist(), bool(np.allclose(targets[1].sum(), R[1].sum(), rtol=1e-4))
        ([False, True, False, True], True)
    """
    if kind not in KINDS:
        raise ValueError(f"Unknown dataset target {kind!r}; expected one of {list(KINDS)}.")
    chosen = np.ones(len(labels), bool) if classes is None else np.isin(labels, classes)
    # The size of the explained score, never its sign, and each map scaled by the size of its
    # own total: neither a negative score (a true-class logit below 0) nor a class mean summing
    # below 0 flips a pattern or a swapped map into its opposite ("evidence against").
    totals = np.abs(reference_heatmaps.reshape(len(labels), -1).sum(axis=1))
    totals = totals.reshape((-1,) + (1,) * (reference_heatmaps.ndim - 1))
    targets = reference_heatmaps.copy()
    if kind in FEATURE_KINDS:
        moved = move_feature_relevance(reference_heatmaps, feature, like_feature if kind == "swap_features" else None)
        targets[chosen] = moved[chosen]
    elif kind in TOKEN_KINDS:
        if ids is None:
            raise ValueError(f"target={kind} needs the examples' token ids (ids).")
        targets[chosen] = move_token_relevance(reference_heatmaps, ids, token)[chosen]
    elif kind == "pattern":
        shape = reference_heatmaps.shape[1:]
        if pattern == "file":
            unit = unit_total(read_map(pattern_path, expected_shape=shape, what="target.path"), pattern_path)
        else:
            unit = _unit_sum(np.repeat(pattern_map(pattern, shape[0], width=shape[1]), shape[-1], axis=-1))
        targets[chosen] = (unit[None] * totals)[chosen]
    elif kind == "swap":
        if like_mean is None:
            source_labels, source_maps = like_heatmaps if like_heatmaps is not None else (labels, reference_heatmaps)
            if not np.any(source_labels == like):
                raise ValueError(f"target.like={like}: no images of class {like} to take heatmaps from.")
            like_mean = source_maps[source_labels == like].mean(axis=0)
        if ids is None:
            moved = _unit_sum(like_mean)[None] * totals
        else:  # a sequence: the class mean on the example's own tokens, each example's part summing to +-1
            on_tokens = np.where(np.asarray(ids) != PADDING_ID, like_mean[None], 0.0)
            # a part whose signs nearly cancel is scaled by its size instead: by its sum it would grow without bound
            sums = np.maximum(np.abs(on_tokens.sum(axis=1, keepdims=True)), MIN_RECEIVING_SHARE * np.abs(on_tokens).sum(axis=1, keepdims=True))
            moved = np.divide(on_tokens, sums, out=np.zeros_like(on_tokens), where=sums > 0) * totals
        targets[chosen] = moved[chosen]
    else:
        flat = reference_heatmaps.reshape(len(labels), -1)
        top = np.argsort(-flat, axis=1)[:, :top_k]
        kept = flat.copy()
        np.put_along_axis(kept, top, 0.0, axis=1)
        # The removed total goes to the rest's positive relevance, in proportion; its negative
        # relevance stays. Scaling the whole rest instead flips every sign where the top_k hold
        # more than the total (sign-mixed CNN heatmaps: 87 % of the digits test images).
        positive = np.clip(kept, 0.0, None)
        positive_totals = positive.sum(axis=1, keepdims=True)
        removed = flat.sum(axis=1, keepdims=True) - kept.sum(axis=1, keepdims=True)
        # Where the rest holds (almost) nothing positive, it stays as it is and the total is not
        # kept: spreading the removed total over a few pixels of rounding noise would make
        # them the target's peaks (the digits' heatmaps need gains of at most 7.4).
        receivers = positive_totals > MIN_RECEIVING_SHARE * np.abs(removed)
        gain = np.divide(removed, positive_totals, out=np.zeros_like(positive_totals), where=receivers)
        targets[chosen] = (kept + positive * gain).reshape(reference_heatmaps.shape)[chosen]
    return targets.astype(np.float32), chosen
