"""A decoder-only language model: keras-hub's Llama explained for its next token, checked against LXT.

The model (``attention_models.hub_llama``) is keras-hub's LlamaCausalLM at a tiny config with
random weights: RMSNorm, rotary position embeddings, grouped keys and values, a gated SiLU MLP,
causal attention, logits by the (tied or separate) reverse embedding.
``heatinv.lrp.keras_hub.next_token_model`` makes it a model of the ids whose output is the
next token's logits. Checks: the engine computes keras-hub's function; the rotation and its
transpose; LXT 2.1's AttnLRP and CP-LRP on a PyTorch twin with the same weights (``tests/lxt_twins.py``);
float64 finite differences of the weight gradients; eager = ``tf.function`` = XLA; padding.

Run with ``-s`` to see the errors and sums measured.
"""

from __future__ import annotations

import importlib.util

import keras
import numpy as np
import pytest
import tensorflow as tf

import attention_models as models
import lxt_twins
from heatinv.lrp import LRP, UnsupportedLayerError, relevance
from heatinv.lrp.canonical import canonize
from heatinv.lrp.llama import rotate
from heatinv.lrp.propagate import forward

pytestmark = pytest.mark.skipif(importlib.util.find_spec("keras_hub") is None, reason="keras-hub is not installed: pip install -e \".[hub]\"")

IDS = np.array([[3, 5, 7, 9, 2, 11], [0, 0, 4, 1, 8, 6]], "int32")
"""Two contexts of six tokens; the second padded on the left (id 0), as next_token_model expects."""
TARGETS = [17, 4]
CONFIGS = {"grouped": {"key_value_heads": 2}, "tied_one_group": {"tied": True, "key_value_heads": 4}}
_built: dict = {}


def language_model(config: str, dtype: str = "float64"):
    """(the causal LM, its next-token model), built once per config and dtype."""
    if (config, dtype) not in _built:
        from heatinv.lrp.keras_hub import next_token_model

        lm = models.hub_llama(dtype, **CONFIGS[config])
        _built[config, dtype] = lm, next_token_model(lm)
    return _built[config, dtype]


def keras_hub_logits(lm, ids: np.ndarray) -> np.ndarray:
    """The causal LM's own logits after the last position."""
    return lm({"token_ids": ids, "padding_mask": (ids != 0).astype("int32")}).numpy()[:, -1]


def relative_errors(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return np.sqrt(((actual - expected) ** 2).sum(axis=1) / (expected**2).sum(axis=1))


# --- the forward pass ---------------------------------------------------------------------


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_the_engine_computes_keras_hubs_llama(config):
    """float32: keras-hub's function to float32 rounding. float64: keras-hub computes RMSNorm, softmax and
    SiLU in float32 whatever the model's dtype, heatinv in float64; measured at most 5.6e-7 (float32) and
    2.3e-7 (float64) relative."""
    for dtype, tolerance in (("float32", 1e-5), ("float64", 1e-6)):
        lm, model = language_model(config, dtype)
        expected = keras_hub_logits(lm, IDS)
        # the wrapper adds nothing (the logits of one position instead of all: another rounding)
        np.testing.assert_allclose(model(IDS).numpy(), expected, rtol=0, atol=1e-6 * np.abs(expected).max())
        outputs = forward(canonize(model), tf.constant(IDS)).outputs.numpy()
        error = np.abs(outputs - expected).max() / np.abs(expected).max()
        print(f"{config} {dtype}: heatinv's logits vs keras-hub's, max relative {error:.1e}")
        assert error <= tolerance


def test_the_rotation_is_keras_hubs_and_its_transpose_rotates_back():
    lm, _ = language_model("grouped")
    rotary = lm.backbone.transformer_layers[0]._self_attention_layer.rotary_embedding_layer
    rng = np.random.default_rng(0)
    x, y = (tf.constant(rng.normal(size=(2, 6, 4, 4))) for _ in range(2))
    cos, sin = rotary._compute_cos_sin_embedding(x, start_index=0)
    np.testing.assert_allclose(rotate(x, cos, sin).numpy(), rotary(x).numpy(), rtol=0, atol=1e-15)
    # <rot(x), y> = <x, rot^T(y)>, and rot^T rot = identity
    np.testing.assert_allclose(tf.reduce_sum(rotate(x, cos, sin) * y), tf.reduce_sum(x * rotate(y, cos, -sin)), rtol=1e-12)
    np.testing.assert_allclose(rotate(rotate(x, cos, sin), cos, -sin).numpy(), x.numpy(), rtol=0, atol=1e-6)  # float32 angles


# --- against LXT --------------------------------------------------------------------------


@pytest.mark.skipif(lxt_twins.LXT_MISSING is not None, reason=str(lxt_twins.LXT_MISSING))
@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_next_token_heatmaps_equal_lxt(config, composite):
    """Measured: <= 5e-10 relative L2 per context (the twin's logits equal keras-hub's to 1e-7, its float32 rounding)."""
    lm, model = language_model(config)
    twin = lxt_twins.Twin(model, "attnlrp" if composite == "attnlrp" else "cp")
    expected, twin_logits = twin.relevance(IDS, TARGETS)
    keras_logits = keras_hub_logits(lm, IDS)
    np.testing.assert_allclose(twin_logits, keras_logits, rtol=0, atol=1e-6 * np.abs(keras_logits).max())
    errors = relative_errors(relevance(model, IDS, TARGETS, composite=composite).numpy(), expected)
    print(f"Llama {config}/{composite}: relative L2 error vs LXT {errors.max():.1e}")
    assert errors.max() <= 1e-6


@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
def test_padding_gets_no_relevance_and_sums_are_reported(composite):
    lm, model = language_model("grouped")
    R = relevance(model, IDS, TARGETS, composite=composite).numpy()
    np.testing.assert_array_equal(R[1, :2], 0.0)
    assert np.all(np.abs(R[:, 2:]) > 0)
    logits = forward(canonize(model), tf.constant(IDS)).outputs.numpy()[np.arange(2), TARGETS]  # in float64 throughout
    print(f"Llama {composite}: sum of token relevance {R.sum(axis=1).round(4)} for logits {logits.round(4)}")
    if composite == "cp_lrp":
        # Llama has no biases and RMSNorm no shift; with the attention weights and the gate constant every
        # step conserves. AttnLRP's softmax rule does not (measured here: 0.41 and -1.44 for 0.53 and -3.84).
        np.testing.assert_allclose(R.sum(axis=1), logits, rtol=1e-9)


# --- gradients ----------------------------------------------------------------------------


@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
def test_weight_gradients_equal_finite_differences(composite):
    """Two entries of every weight of the tied model, central differences in float64, h = 1e-6."""
    _, model = language_model("tied_one_group")
    explainer = LRP(model, composite)
    probe = tf.constant(np.random.default_rng(4).normal(size=IDS.shape))

    def loss():
        return tf.reduce_sum(explainer(IDS, TARGETS) * probe)

    with tf.GradientTape() as tape:
        value = loss()
    gradients = [tf.convert_to_tensor(g) for g in tape.gradient(value, model.trainable_variables)]
    rng = np.random.default_rng(5)
    for variable, gradient in zip(model.trainable_variables, gradients):
        flat = np.asarray(gradient).reshape(-1)
        for index in rng.choice(np.flatnonzero(flat) if variable.path.endswith("embeddings") else flat.size, 2, replace=False):
            numeric = models.central_difference(variable, index, loss)
            assert flat[index] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (variable.path, index)
    scales = [g for v, g in zip(model.trainable_variables, gradients) if v.path.endswith("scale")]
    assert len(scales) == 5 and all(np.abs(np.asarray(g)).max() > 0 for g in scales)  # sigma is constant only in the rule


@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
def test_eager_function_and_xla_agree(composite):
    _, model = language_model("grouped")
    models.assert_eager_function_and_xla_agree(model, LRP(model, composite), IDS, TARGETS)


# --- refusals -----------------------------------------------------------------------------


def test_a_soft_capped_reverse_embedding_is_refused_by_name():
    ids = keras.Input((None,), dtype="int32")
    table = keras.layers.ReversibleEmbedding(20, 8, logit_soft_cap=30.0, name="capped")
    model = keras.Model(ids, table(keras.layers.Dense(8)(table(ids))[:, -1], reverse=True))
    with pytest.raises(UnsupportedLayerError, match=r"ReversibleEmbedding 'capped'.*logit_soft_cap=30.0"):
        canonize(model)


def test_next_token_model_names_what_it_needs():
    from heatinv.lrp.keras_hub import next_token_model

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="plain")
    with pytest.raises(ValueError, match=r"next_token_model takes a keras-hub causal LM.*'plain'"):
        next_token_model(model)
