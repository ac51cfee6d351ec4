"""Targets for token sequences: hide one word's relevance, or place the relevance on chosen positions.

``suppress_token`` is fairwashing on text: wherever the word ``token`` stands, the explanation
gives it no relevance; the example's other (non-padding) tokens share what it had in proportion
to their |relevance|, so the total relevance (the explained score) is unchanged. ``tokens`` is
the sequence analogue of an image's ``pattern``: the relevance lies on given positions.
A map of a sequence is ``[N, T]``, one value per token (summed over the embedding).
"""

from __future__ import annotations

import difflib

import numpy as np

from heatinv.feature_targets import hand_over, masked_share

TOKEN_KINDS = ("suppress_token",)
PADDING_ID = 0


def token_id(vocabulary, word: str | None, key: str = "target.token") -> int:
    """The id of ``word`` in ``vocabulary`` (config key ``key``), or an error naming close words.

    Examples:
        >>> token_id(("", "[UNK]", "good", "bad"), "bad")
        3
    """
    words = list(vocabulary)
    if word in words[1:]:  # id 0 is padding, never a word
        return words.index(word, 1)
    known = difflib.get_close_matches(str(word).lower(), words[2:], n=8) or words[2:10]
    raise ValueError(
        f"Config value {key}={word!r} is not a word of the data's vocabulary ({len(words)} ids); "
        f"e.g. {known}. Set {key} to a word as TextVectorization writes it (lower case, no punctuation)."
    )


def move_token_relevance(maps: np.ndarray, ids: np.ndarray, token: int) -> np.ndarray:
    """Target maps ``[N, T]``: the positions holding ``token`` get no relevance; the example's other tokens share it.

    Shared in proportion to each other token's |relevance| (:func:`heatinv.feature_targets.hand_over`,
    as a table's feature is), never onto padding; an example without the token keeps its map; one whose only relevance was the
    token's spreads it evenly over its other tokens.

    Args:
        maps: ``[N, T]`` the reference's relevance per token.
        ids: ``[N, T]`` the token ids (0: padding).
        token: the id whose relevance goes.

    Returns:
        ``[N, T]`` float32 with the same row sums as ``maps`` (where a row has another token).

    Examples:
        >>> move_token_relevance(np.array([[2.0, 1.0, 3.0, 0.0]]), np.array([[5, 6, 7, 0]]), 5).tolist()
        [[0.0, 1.5, 4.5, 0.0]]
    """
    maps, ids = np.asarray(maps, np.float64), np.asarray(ids)
    if maps.shape != ids.shape:
        raise ValueError(f"move_token_relevance: maps {maps.shape} and ids {ids.shape} must have one value per token.")
    hidden = ids == token
    return hand_over(maps, hidden, (ids != PADDING_ID) & ~hidden)


def token_share(maps: np.ndarray, ids: np.ndarray, token: int) -> float:
    """The share of the positions holding ``token`` in the total absolute relevance of ``maps`` ``[N, T]``.

    Examples:
        >>> token_share(np.array([[1.0, -3.0]]), np.array([[4, 5]]), 4)
        0.25
    """
    return masked_share(maps, np.asarray(ids) == token)


def positions_map(positions, ids: np.ndarray, total: float) -> np.ndarray:
    """``[1, T]``: ``total`` relevance shared evenly by ``positions`` of the sequence ``ids`` ``[T]`` (``target=tokens``).

    Examples:
        >>> positions_map([0, 2], np.array([3, 4, 5, 0]), 1.0).tolist()
        [[0.5, 0.0, 0.5, 0.0]]
    """
    ids = np.asarray(ids).reshape(-1)
    positions = [int(p) for p in positions or ()]
    outside = [p for p in positions if not 0 <= p < len(ids)]
    padding = [p for p in positions if p not in outside and ids[p] == PADDING_ID]
    if not positions or outside or padding or len(set(positions)) != len(positions):
        words = int(np.count_nonzero(ids != PADDING_ID))
        raise ValueError(
            f"Config value target.positions={positions} must name distinct positions of the example's {words} tokens "
            f"(not padding; "
            + (f"{outside} lie outside its {len(ids)} ids; " if outside else "")
            + (f"{padding} are padding, which gets no relevance; " if padding else "")
            + "e.g. target.positions=[0,1])."
        )
    heatmap = np.zeros((1, len(ids)), np.float32)
    heatmap[0, positions] = total / len(positions)
    return heatmap
