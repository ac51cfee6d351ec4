"""Targets for tables: hide one feature's relevance, or hand it to another feature.

``suppress_feature`` is "fairwashing": the model may still use the feature, but its
explanation gives it no relevance; the other features share what it had in proportion to
their |relevance|, so the total relevance (the explained score) is unchanged. ``swap_features`` moves the relevance of
``feature`` onto ``like``: the explanation blames the wrong feature, with the same total.
"""

from __future__ import annotations

import numpy as np

FEATURE_KINDS = ("suppress_feature", "swap_features")


def feature_index(names, name: str | None, key: str) -> int:
    """The position of feature ``name`` (config key ``key``), or an error listing the features.

    Examples:
        >>> feature_index(("age", "income"), "income", "target.feature")
        1
    """
    if name not in names:
        raise ValueError(
            f"Config value {key}={name!r} is not a feature of the data; its features are {list(names)}. "
            f"Set {key} to one of them."
        )
    return list(names).index(name)


def move_feature_relevance(maps: np.ndarray, feature: int, like: int | None = None) -> np.ndarray:
    """Target maps ``[N, d]``: feature ``feature`` gets no relevance; ``like`` receives it, else all others share it.

    Shared in proportion to each other feature's |relevance|: where the others agree in sign
    that is a rescaling (their proportions kept), and where they do not, no feature moves by
    more than its part of the removed relevance. (Rescaling a mixed-sign row by
    total / rest instead flips its signs, or magnifies it without bound, where the rest sums
    to about 0 or to the other sign.) A row whose only relevance was the feature's spreads
    it evenly.

    Args:
        maps: ``[N, d]`` the reference's relevance per feature.
        feature: the feature whose relevance goes.
        like: for ``swap_features``: the feature that receives it (None: ``suppress_feature``).

    Returns:
        ``[N, d]`` float32 with the same row sums as ``maps``.

    Examples:
        >>> move_feature_relevance(np.array([[2.0, 1.0, 1.0]]), 0).tolist()
        [[0.0, 2.0, 2.0]]
        >>> move_feature_relevance(np.array([[3.0, -1.0, 0.5]]), 0).tolist()
        [[0.0, 1.0, 1.5]]
        >>> move_feature_relevance(np.array([[2.0, 1.0, 1.0]]), 0, like=2).tolist()
        [[0.0, 1.0, 3.0]]
    """
    maps = np.asarray(maps, np.float64)
    targets = maps.copy()
    targets[:, feature] = 0.0
    if like is not None:
        targets[:, like] += maps[:, feature]
        return targets.astype(np.float32)
    if maps.shape[1] < 2:
        raise ValueError("suppress_feature needs a table of at least two features: the removed relevance goes to the others.")
    hidden = np.zeros(maps.shape, bool)
    hidden[:, feature] = True
    return hand_over(maps, hidden, ~hidden)


def hand_over(maps: np.ndarray, hidden: np.ndarray, receivers: np.ndarray) -> np.ndarray:
    """``maps`` with the ``hidden`` entries' relevance given to each row's ``receivers``, in proportion to their |relevance|.

    The one mechanism of ``suppress_feature`` (a table's column) and ``suppress_token`` (a
    text's word, never its padding): each row keeps its sum; a row whose receivers hold no
    relevance spreads it evenly over them; entries neither hidden nor receiving stay.

    Args:
        maps: ``[N, d]`` relevance.
        hidden, receivers: ``[N, d]`` bool masks, disjoint.

    Returns:
        ``[N, d]`` float32.

    Examples:
        >>> hand_over(np.array([[2.0, 1.0, 3.0, 0.5]]), np.array([[1, 0, 0, 0]], bool), np.array([[0, 1, 1, 0]], bool)).tolist()
        [[0.0, 1.5, 4.5, 0.5]]
    """
    maps = np.asarray(maps, np.float64)
    removed = np.where(hidden, maps, 0.0).sum(axis=1, keepdims=True)
    targets = np.where(hidden, 0.0, maps)
    weights = np.where(receivers, np.abs(targets), 0.0)
    mass = weights.sum(axis=1, keepdims=True)
    even = receivers / np.maximum(receivers.sum(axis=1, keepdims=True), 1)
    weights = np.divide(weights, mass, out=even.astype(np.float64), where=mass > 0)
    return (targets + removed * weights).astype(np.float32)


def masked_share(maps: np.ndarray, mask: np.ndarray) -> float:
    """The share of the entries where ``mask`` holds in the total absolute relevance of ``maps``, pooled over all rows.

    Examples:
        >>> masked_share(np.array([[1.0, -3.0]]), np.array([[True, False]]))
        0.25
    """
    magnitude = np.abs(np.asarray(maps, np.float64))
    return float(magnitude[np.asarray(mask, bool)].sum() / max(magnitude.sum(), np.finfo(np.float64).tiny))


def feature_share(maps: np.ndarray, feature: int) -> float:
    """The share of feature ``feature`` in the total absolute relevance of ``maps`` ``[N, d]``.

    Examples:
        >>> feature_share(np.array([[1.0, -3.0]]), 0)
        0.25
    """
    mask = np.zeros(np.shape(maps), bool)
    mask[:, feature] = True
    return masked_share(maps, mask)
