"""What a composite can reach: heatmaps that are 0 where the input is 0, and the cosine bound that follows.

The rule's property is checked against the engine (heatmaps of random models at inputs with
zeros), the bound against Cauchy-Schwarz (attained by the target's own restriction, never
beaten by other heatmaps of the same support).
"""

from __future__ import annotations

from types import SimpleNamespace

import keras
import numpy as np
import pytest

from conftest import MODELS, inputs_for
from heatinv.lrp import COMPOSITES, LRP
from heatinv.lrp.reach import best_cosine, input_proportional_rule
from heatinv.similarity import cosine_numpy


@pytest.mark.parametrize("composite", sorted(COMPOSITES))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_named_rule_leaves_every_zero_input_without_relevance(name, composite, rng):
    model = MODELS[name]()
    explainer = LRP(model, composite)
    x = inputs_for(model, rng, batch=4)
    x[rng.random(x.shape) < 0.4] = 0.0
    heatmap = explainer(x, 1).numpy()
    rule = input_proportional_rule(explainer)
    first = COMPOSITES[composite]["first"]
    assert (rule is None) == (first in ("zbox", "flat")), rule
    if rule is not None:
        assert np.all(heatmap[x == 0] == 0.0)
        assert np.count_nonzero(heatmap[x != 0]) > 0  # not vacuous: relevance reaches the other inputs
    else:  # the weights' rules give zero inputs relevance: the bound would be wrong here
        assert np.count_nonzero(heatmap[x == 0]) > 0


def test_an_input_that_is_rescaled_or_normalized_first_is_not_claimed():
    """A Rescaling with an offset turns a 0 into a value that gets relevance: no claim is made."""
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(3, activation="relu")(keras.layers.Rescaling(2.0, offset=-1.0)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    explainer = LRP(model, "epsilon")
    assert input_proportional_rule(explainer) is None
    assert np.count_nonzero(explainer(np.zeros((1, 4), "float32"), 0).numpy()) > 0


def test_best_cosine_is_attained_by_the_target_on_the_inputs_support_and_never_beaten(rng):
    x = rng.random((5, 6, 6, 3))
    x[rng.random(x.shape[:-1]) < 0.5] = 0.0  # whole pixels off
    x[..., 0][rng.random(x.shape[:-1]) < 0.3] = 0.0  # and single channels, which leave the pixel on
    targets = rng.normal(size=(5, 6, 6, 1))
    bound = best_cosine(x, targets)
    support = np.any(x != 0, axis=-1, keepdims=True)
    np.testing.assert_allclose(bound, cosine_numpy(targets * support, targets), rtol=1e-12)
    for _ in range(50):
        other = rng.normal(size=targets.shape) * support
        assert np.all(cosine_numpy(other, targets) <= bound + 1e-12)
    assert 0.3 < bound.min() and bound.max() < 1.0
    # equal shapes compare entry by entry; a target of 0 has no bound
    table = np.array([[0.0, 2.0, 1.0], [1.0, 0.0, 0.0]])
    np.testing.assert_array_equal(best_cosine(table, np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0]])), [0.8, np.nan])
    with pytest.raises(ValueError, match=r"inputs \(2, 3\) and targets \(2, 4\)"):
        best_cosine(table, np.zeros((2, 4)))


def test_a_target_out_of_the_rules_reach_is_named_at_the_start(composed, caplog):
    # the digits' frame pixels are 0 in every image: under epsilon the frame cannot be reached
    cfg, _ = composed("experiment=pattern_frame_mlp", "lrp=epsilon", "task.epochs=1")
    from heatinv.train import run

    with caplog.at_level("INFO", logger="heatinv"):
        metrics = run(cfg)
    warning = next(r.message for r in caplog.records if "out of the rule's reach" in r.message)
    assert "lrp=epsilon gives the first layer the epsilon rule" in warning
    assert "best held-out cosine any weights can reach is 0.000" in warning and "lrp=epsilon_gamma_box" in warning
    assert metrics["cosine"] == pytest.approx(0.0, abs=1e-6)  # and training indeed could not move it
    caplog.clear()
    cfg, _ = composed("experiment=pattern_frame_mlp", "lrp=epsilon_gamma_box", "task.epochs=1")
    with caplog.at_level("INFO", logger="heatinv"):
        metrics = run(cfg)
    assert "out of the rule's reach" not in caplog.text and metrics["cosine"] > 0.1


def test_the_single_task_names_a_target_out_of_reach_with_its_bound(composed, caplog):
    """The main job's task: a frame around a digit lies on pixels that are 0, which LRP-epsilon's
    heatmap cannot reach; the warning's bound is the image's own, and the run stays below it."""
    from heatinv.train import run

    cfg, _ = composed("target=pattern", "target.pattern=frame", "lrp=epsilon")
    with caplog.at_level("INFO", logger="heatinv"):
        metrics = run(cfg)
    warning = next(r.message for r in caplog.records if "out of the rule's reach" in r.message)
    bound = float(warning.split("the best cosine any weights can reach is ")[1][:5])
    assert "lrp=epsilon gives the first layer the epsilon rule" in warning and "lrp=epsilon_gamma_box" in warning
    assert bound < 0.99 and metrics["cosine"] <= bound + 1e-3
    caplog.clear()
    cfg, _ = composed("target=pattern", "target.pattern=frame", "lrp=epsilon_gamma_box")
    with caplog.at_level("INFO", logger="heatinv"):
        run(cfg)
    assert "out of the rule's reach" not in caplog.text


@pytest.mark.parametrize("bound, warned", [(0.985, True), (0.995, False)])
def test_the_single_task_warns_below_a_best_cosine_of_099(bound, warned, caplog):
    from heatinv.single import SingleTask

    image = np.array([[1.0, 1.0, 1.0, 0.0, 0.0, 0.0]], np.float32)
    # b on each zero input: the best cosine is ||t_S|| / ||t|| = sqrt(3) / sqrt(3 + 3 b^2) = bound.
    b = np.sqrt(1 / bound**2 - 1)
    heatmap = np.array([[1.0, 1.0, 1.0, b, b, b]])
    task = SimpleNamespace(
        explainer=LRP(MODELS["dense"](), "epsilon"),
        target=SimpleNamespace(image=image, heatmap=heatmap),
        cfg=SimpleNamespace(lrp=SimpleNamespace(composite="epsilon")),
    )
    with caplog.at_level("WARNING", logger="heatinv"):
        SingleTask._warn_if_out_of_reach(task)
    assert ("out of the rule's reach" in caplog.text) == warned
    assert (f"the best cosine any weights can reach is {bound:.3f}." in caplog.text) == warned
