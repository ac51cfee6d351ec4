"""heatinv.transformers: the ViT and the text encoder are explained, and padding stays out of the text's relevance."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from heatinv import transformers
from heatinv.lrp import LRP


def test_vit_logits_and_heatmap_shapes():
    keras.utils.set_random_seed(0)
    model = transformers.vit((8, 8, 1), 3, patch=4, dim=8, depth=2, heads=2)
    x = np.random.default_rng(0).uniform(size=(2, 8, 8, 1)).astype("float32")
    explanation = LRP(model, "attnlrp").explain(x, [0, 2])
    assert explanation.relevance.shape == x.shape
    np.testing.assert_allclose(explanation.outputs.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(explanation.relevance.numpy())) and np.abs(explanation.relevance.numpy()).sum() > 0


def test_vit_refuses_a_side_that_is_no_multiple_of_the_patch():
    with pytest.raises(ValueError, match=r"4x4 patches needs sides that are multiples of 4; got \(10, 8, 1\)"):
        transformers.vit((10, 8, 1), 3, patch=4)


@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
def test_text_padding_is_masked_in_every_block(composite):
    """Pre-norm blocks keep the padding mask past each residual sum (Keras's attention removes
    the mask of the tensor it reads, here the normed one): through two blocks, a padded sequence
    gives the logits and token relevance of the same tokens in a model of their length with the
    same weights, and padding gets nothing."""
    keras.utils.set_random_seed(0)
    model = transformers.text_classifier(6, 20, 3, dim=8, depth=2, heads=2)
    short = transformers.text_classifier(3, 20, 3, dim=8, depth=2, heads=2)
    short.set_weights([w[:3] if w.shape == (6, 8) else w for w in model.get_weights()])  # the position table's rows
    padded = LRP(model, composite).explain(np.array([[3, 5, 7, 0, 0, 0]]), 1)
    alone = LRP(short, composite).explain(np.array([[3, 5, 7]]), 1)
    np.testing.assert_allclose(padded.logits.numpy(), alone.logits.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(padded.relevance.numpy()[:, 3:], 0.0)
    np.testing.assert_allclose(padded.relevance.numpy()[:, :3], alone.relevance.numpy(), rtol=1e-4, atol=1e-6)


def test_model_vit_is_explained_by_attnlrp_unless_the_command_line_names_a_composite(config):
    assert config("model=vit").lrp.composite == "attnlrp"
    assert config("model=vit", "lrp=epsilon_plus").lrp.composite == "epsilon_plus"
    assert config().lrp.composite == "epsilon_gamma_box"  # the other models keep the default


def test_vit_patch_leaves_at_most_64_tokens():
    from heatinv.models import vit_patch

    assert [vit_patch(shape) for shape in ((28, 28, 1), (32, 32, 3), (224, 224, 3), (8, 12, 1))] == [4, 4, 28, 2]
    with pytest.raises(ValueError, match=r"17x19 images.*model.patch"):
        vit_patch((17, 19, 1))


def test_the_main_job_runs_on_a_vit(config):
    """A smoke-sized run (one reference epoch, four steps) of ``model=vit``: the reference, the student and the step."""
    from heatinv.train import run

    metrics = run(config("model=vit", "model.dim=8", "model.depth=1", "model.heads=2", "target=digit7"))
    assert metrics["steps"] == 4 and np.isfinite(metrics["cosine"])
    # The digits' blank border patches make z = 0 exactly with the initial zero biases: named, not stopped.
    assert {finding["code"] for finding in metrics["diagnosis"]} <= {"nan-division"}
