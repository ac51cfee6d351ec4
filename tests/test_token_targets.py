"""Targets on token sequences (heatinv.token_targets), checked against their definitions entry by entry."""

from __future__ import annotations

import numpy as np
import pytest

from heatinv.dataset_targets import dataset_targets
from heatinv.token_targets import move_token_relevance, positions_map, token_id, token_share


def _moved_by_definition(row, ids, token):
    """One example, loop by loop: the word's relevance to the other non-padding tokens in proportion to |R|."""
    row, out = [float(v) for v in row], []
    removed = sum(v for v, i in zip(row, ids) if i == token)
    receivers = [k for k, i in enumerate(ids) if i not in (0, token)]
    mass = sum(abs(row[k]) for k in receivers)
    for k, (v, i) in enumerate(zip(row, ids)):
        if i == token or i == 0 and k not in receivers:
            out.append(0.0 if i == token else v)
        elif mass > 0:
            out.append(v + removed * abs(v) / mass)
        else:
            out.append(v + removed / len(receivers))
    return out


def test_a_words_relevance_goes_to_the_other_tokens_in_proportion_and_never_to_padding():
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 6, size=(40, 9))
    ids[:, 6:] = 0  # padding at the end
    ids[::5, :6] = np.where(ids[::5, :6] == 3, 4, ids[::5, :6])  # some examples without the word
    maps = rng.normal(size=ids.shape)
    maps[ids == 0] = 0.0
    maps[7, ids[7] != 3] = 0.0  # an example whose only relevance is the word's
    ids[7, 0] = 3
    maps[7, 0] = 2.0
    moved = move_token_relevance(maps, ids, 3)
    expected = np.array([_moved_by_definition(r, i, 3) for r, i in zip(maps, ids)])
    np.testing.assert_allclose(moved, expected, rtol=1e-5, atol=1e-6)
    assert np.all(moved[ids == 3] == 0) and np.all(moved[ids == 0] == 0)
    np.testing.assert_allclose(moved.sum(axis=1), maps.sum(axis=1), rtol=1e-5, atol=1e-6)  # the explained score stays
    without = ~np.any(ids == 3, axis=1)
    np.testing.assert_allclose(moved[without], maps[without], rtol=1e-6)


def test_the_share_the_positions_and_the_words_id():
    maps, ids = np.array([[1.0, -3.0, 2.0], [4.0, 0.0, 0.0]]), np.array([[7, 5, 7], [5, 7, 0]])
    assert token_share(maps, ids, 7) == pytest.approx(3.0 / 10.0)
    np.testing.assert_array_equal(positions_map([1, 2], np.array([4, 5, 6, 0]), 3.0), [[0.0, 1.5, 1.5, 0.0]])
    with pytest.raises(ValueError, match=r"target.positions=\[3\].*\[3\] are padding.*e.g. target.positions=\[0,1\]"):
        positions_map([3], np.array([4, 5, 6, 0]), 1.0)
    with pytest.raises(ValueError, match=r"'bda' is not a word.*e.g. \['bad'\]"):
        token_id(("", "[UNK]", "good", "bad"), "bda")


def test_a_swapped_class_mean_lies_on_each_examples_own_tokens():
    ids = np.array([[3, 4, 5, 0], [3, 4, 0, 0], [6, 7, 8, 9]])
    maps = np.array([[1.0, 2.0, 1.0, 0.0], [2.0, -1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    targets, chosen = dataset_targets("swap", np.array([1, 1, 0]), maps, [1], like=0, ids=ids)
    assert chosen.tolist() == [True, True, False]
    np.testing.assert_allclose(targets[0], [4 / 3, 4 / 3, 4 / 3, 0.0], rtol=1e-6)  # its total 4, on its three tokens
    np.testing.assert_allclose(targets[1], [0.5, 0.5, 0.0, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(targets[2], maps[2])


def test_a_figure_of_no_text_still_draws_its_title():
    from heatinv.figures import texts_figure

    figure = texts_figure([], "held-out: suppress_token 'foreign'")
    figure.canvas.draw()  # raised "bottom cannot be >= top" before
    assert figure._suptitle.get_text().startswith("held-out")
