"""Transformers: AttnLRP and CP-LRP on Keras attention models, checked by hand, against NumPy and LXT.

The models (``tests/attention_models.py``) are tiny float64 ViTs and text classifiers with
random weights. Checks, from the most elementary up:

- the engine's forward pass computes the Keras model (both MultiHeadAttention paths, masks);
- a one-head, two-token attention whose relevance is written out by hand, for both composites;
- an independent NumPy implementation of the attention block's rules;
- LXT 2.1 on a PyTorch twin with the same weights (``tests/lxt_twins.py``), several targets;
- float64 finite differences of the weight and input gradients of a loss on the heatmap;
- eager, ``tf.function`` and XLA agree;
- conservation where it must hold (CP-LRP without biases or LayerNorm), measured where it does not.

Run with ``-s`` to see the errors measured.
"""

from __future__ import annotations

import importlib.util

import keras
import numpy as np
import pytest
import tensorflow as tf

import attention_models as models
import lxt_twins
from heatinv.layers import PositionEmbedding
from heatinv.lrp import LRP, UnsupportedLayerError, relevance, resolve
from heatinv.lrp.canonical import canonize
from heatinv.lrp.keras_hub import token_model
from heatinv.lrp.propagate import forward
from heatinv.lrp.rules import layer_norm_rule

DTYPE = "float64"

# Measured (these seeds): the twins' logits agree with Keras's to <= 5e-16 relative; the
# heatmaps to <= 5.1e-9 relative L2 per example (LXT's identity rule divides by z + 1e-10,
# heatinv's LRP-0 by z + 1e-12 sign(z)). Wrong conventions tried by hand gave 1e-2 to 1: the
# exact 1/sqrt(key_dim) instead of Keras's float32-rounded one (2e-9 on the logits, caught by
# TWIN_TOLERANCE), the uniform rule's halves dropped at q and k (0.3-0.9), the LayerNorm's
# centering left out of its rule (0.1-0.5).
TOLERANCE = 1e-6
TWIN_TOLERANCE = 1e-12

CASES = {
    "vit": lambda: (models.vit(), models.images()),
    "vit_einsum_first_dropout": lambda: (models.vit(patches="einsum", pooling="first", dropout=0.1), models.images()),
    "text_first": lambda: (models.text(), models.token_ids()),
    "text_causal_last_silu": lambda: (models.text(causal=True, pooling="last", activation="silu"), models.token_ids()),
    "text_cross_attention": lambda: (models.text(pooling="cross"), models.token_ids()),
}
_built: dict = {}


def case(name: str):
    if name not in _built:
        _built[name] = CASES[name]()
    return _built[name]


def relative_errors(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    axes = tuple(range(1, expected.ndim))
    return np.sqrt(((actual - expected) ** 2).sum(axis=axes) / (expected**2).sum(axis=axes))


def lxt_relevance(model, x, targets, composite: str) -> np.ndarray:
    """LXT's heatmap on the twin, after checking that the twin computes the Keras model's logits."""
    expected, twin_logits = lxt_twins.Twin(model, "attnlrp" if composite == "attnlrp" else "cp").relevance(x, targets)
    keras_logits = model(x).numpy()
    np.testing.assert_allclose(twin_logits, keras_logits, rtol=0, atol=TWIN_TOLERANCE * np.abs(keras_logits).max())
    return expected


def assert_equals_lxt(model, x, composite: str, label: str) -> None:
    """heatinv's heatmap of classes 0 and 2 equals LXT's (``TOLERANCE``); ``-s`` prints the error."""
    errors = relative_errors(relevance(model, x, [0, 2], composite=composite).numpy(), lxt_relevance(model, x, [0, 2], composite))
    print(f"{label}/{composite}: relative L2 error vs LXT {errors.max():.1e}")
    assert errors.max() <= TOLERANCE


# --- the forward pass ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_engine_computes_the_keras_model(name):
    model, x = case(name)
    steps = canonize(model)
    outputs = forward(steps, tf.constant(x)).outputs
    np.testing.assert_allclose(outputs.numpy(), model(x).numpy(), rtol=0, atol=1e-13)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_both_attention_paths_and_a_sliding_window_are_computed_as_keras_does(dropout):
    """Dropout 0 takes Keras's fused ``dot_product_attention``, > 0 its einsum path (off in inference)."""
    inputs = keras.Input((5, 4), dtype=DTYPE)
    mha = keras.layers.MultiHeadAttention(2, 3, value_dim=2, dropout=dropout, sliding_window=2, dtype=DTYPE)
    causal = keras.layers.MultiHeadAttention(1, 2, dropout=dropout, dtype=DTYPE)
    x = mha(inputs, inputs)
    x = causal(x, x, use_causal_mask=True)
    model = models.randomize(keras.Model(inputs, keras.layers.Dense(2, dtype=DTYPE)(keras.layers.Flatten(dtype=DTYPE)(x))), 3)
    data = np.random.default_rng(0).normal(size=(3, 5, 4))
    outputs = forward(canonize(model), tf.constant(data)).outputs
    np.testing.assert_allclose(outputs.numpy(), model(data).numpy(), rtol=0, atol=1e-13)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_padding_masks_are_computed_as_keras_does(dropout):
    """Keras 3.15 at run time: MultiHeadAttention removes the mask of its input tensor, so the
    residual sum after it has none and the second block attends to padding; the mean still
    skips padding (its mask is computed from the ids in the graph). heatinv computes the same."""
    model = models.text(mask_zero=True, pooling="mean", tokens=None, dropout=dropout)
    ids = np.array([[3, 5, 7, 0, 0], [4, 0, 0, 0, 0]], "int32")
    outputs = forward(canonize(model), tf.constant(ids)).outputs
    np.testing.assert_allclose(outputs.numpy(), model(ids).numpy(), rtol=0, atol=1e-13)


@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
def test_padding_gets_no_relevance_and_changes_no_other(composite):
    """With the Embedding's ``mask_zero``, padding is masked in attention and in the mean: a padded
    sequence's tokens get the relevance they get without the padding, and the padding none.

    One block: with two, Keras itself lets the second attend to padding (see above)."""
    model = models.text(mask_zero=True, pooling="mean", tokens=None, depth=1)
    padded = relevance(model, np.array([[3, 5, 7, 0, 0]], "int32"), 1, composite=composite).numpy()
    alone = relevance(model, np.array([[3, 5, 7]], "int32"), 1, composite=composite).numpy()
    np.testing.assert_array_equal(padded[:, 3:], 0.0)
    np.testing.assert_allclose(padded[:, :3], alone, rtol=1e-12, atol=1e-15)


# --- by hand ------------------------------------------------------------------------------


def two_token_model():
    """One head, key_dim 2, identity projections without bias: ``O = softmax(x x^T / sqrt 2) x``, logit ``sum w * O``."""
    inputs = keras.Input((2, 2), dtype=DTYPE)
    mha = keras.layers.MultiHeadAttention(1, 2, use_bias=False, dtype=DTYPE)
    flat = keras.layers.Flatten(dtype=DTYPE)(mha(inputs, inputs))
    model = keras.Model(inputs, keras.layers.Dense(1, use_bias=False, dtype=DTYPE)(flat))
    for dense in (mha.query_dense, mha.key_dense, mha.value_dense):
        dense.kernel.assign(np.eye(2).reshape(2, 1, 2))
    mha.output_dense.kernel.assign(np.eye(2).reshape(1, 2, 2))
    model.layers[-1].kernel.assign(np.array([[1.0], [2.0], [3.0], [4.0]]))
    return model


def test_two_token_attention_by_hand():
    """x = I: S = I / sqrt 2 (Keras rounds 1/sqrt 2 to float32), A = [[a, 1-a], [1-a, a]], a = sigmoid(c), O = A.

    The Dense layer gives R_O = w * A (LRP-0, no bias), the output projection (identity)
    passes it. CP-LRP: v = x gets all of ``A v``: R_x[s, s] = sum_t R_O[t, s], 0 off the
    diagonal. AttnLRP: v gets half of that; ``A`` gets R_A = R_O / 2; the softmax rule gives
    R_S[t, t] = c (R_A[t, t] - a sum_s R_A[t, s]) (S is 0 off the diagonal, and so is R_S);
    ``q k^T`` hands half of R_S[t, t] to q[t, t] and half to k[t, t], both read from x[t, t].
    """
    model = two_token_model()
    x = np.eye(2)[None]
    c = float(np.float32(1 / np.sqrt(2)))
    a = 1 / (1 + np.exp(-c))
    A = np.array([[a, 1 - a], [1 - a, a]])
    R_O = np.array([[1.0, 2.0], [3.0, 4.0]]) * A
    cp = np.diag(R_O.sum(axis=0))
    R_A = R_O / 2
    R_S = c * (np.diag(R_A) - a * R_A.sum(axis=1))
    attnlrp = np.diag(R_O.sum(axis=0) / 2 + R_S)
    # LRP-0's stabilizer (1e-12) moves the values by ~1e-11 of themselves
    np.testing.assert_allclose(relevance(model, x, 0, composite="cp_lrp").numpy()[0], cp, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(relevance(model, x, 0, composite="attnlrp").numpy()[0], attnlrp, rtol=1e-10, atol=1e-15)
    logit = float(model(x)[0, 0])
    assert cp.sum() == pytest.approx(logit, rel=1e-10)  # CP-LRP conserves here
    assert attnlrp.sum() != pytest.approx(logit, rel=1e-3)  # the softmax rule does not


# --- an independent NumPy reference -------------------------------------------------------


def numpy_attention_relevance(x, W, relevance_out, causal, attention):
    """The attention block's input relevance, written out in NumPy with explicit sums.

    ``W``: the four projections as (kernel, bias) NumPy pairs in Keras's shapes (q/k/v kernel
    ``[d, heads, dim]``, output ``[heads, dim_v, d]``). LRP-0 on every product:
    ``R_in[i] = sum_j x[i] w[i, j] R[j] / z[j]`` with ``z`` including the bias.
    """
    (Wq, bq), (Wk, bk), (Wv, bv), (Wo, bo) = W
    T, heads, key_dim = x.shape[0], Wq.shape[1], Wq.shape[2]
    scale = float(np.float32(1 / np.sqrt(key_dim)))
    q = np.einsum("td,dnh->tnh", x, Wq) + bq
    k = np.einsum("td,dnh->tnh", x, Wk) + bk
    v = np.einsum("td,dnh->tnh", x, Wv) + bv
    qs = q * scale
    S = np.einsum("tnh,snh->nts", qs, k)
    allowed = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
    A = np.exp(np.where(allowed, S, -np.inf) - np.where(allowed, S, -np.inf).max(-1, keepdims=True))
    A = A / A.sum(-1, keepdims=True)
    O = np.einsum("nts,snh->tnh", A, v)
    out = np.einsum("tnh,nhd->td", O, Wo) + bo
    # output projection
    R_O = np.einsum("tnh,nhd,td->tnh", O, Wo, relevance_out / out)
    # A v: O[t,n,h] = sum_s A[n,t,s] v[s,n,h]
    ratio = R_O / O
    share = 1.0 if attention == "cp" else 0.5
    R_v = share * np.einsum("nts,snh,tnh->snh", A, v, ratio)
    R_x = np.einsum("td,dnh,tnh->td", x, Wv, R_v / v)
    if attention == "attnlrp":
        R_A = 0.5 * np.einsum("nts,snh,tnh->nts", A, v, ratio)
        R_S = S * (R_A - A * R_A.sum(-1, keepdims=True))
        R_S = np.where(allowed, R_S, 0.0)
        ratio_S = np.where(allowed, R_S / np.where(allowed, S, 1.0), 0.0)
        R_q = 0.5 * np.einsum("tnh,snh,nts->tnh", qs, k, ratio_S)
        R_k = 0.5 * np.einsum("tnh,snh,nts->snh", qs, k, ratio_S)
        R_x = R_x + np.einsum("td,dnh,tnh->td", x, Wq, R_q / q) + np.einsum("td,dnh,tnh->td", x, Wk, R_k / k)
    return R_x


@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_block_equals_a_numpy_reference(attention, causal):
    inputs = keras.Input((4, 5), dtype=DTYPE)
    mha = keras.layers.MultiHeadAttention(2, 3, value_dim=2, dtype=DTYPE)
    out = mha(inputs, inputs, use_causal_mask=True) if causal else mha(inputs, inputs)
    model = models.randomize(keras.Model(inputs, keras.layers.Dense(3, use_bias=False, dtype=DTYPE)(keras.layers.Flatten(dtype=DTYPE)(out))), 5)
    x = np.random.default_rng(2).normal(size=(2, 4, 5))
    targets = np.array([0, 2])
    actual = relevance(model, x, targets, composite="attnlrp" if attention == "attnlrp" else "cp_lrp").numpy()
    weights = [(d.kernel.numpy(), d.bias.numpy()) for d in (mha.query_dense, mha.key_dense, mha.value_dense, mha.output_dense)]
    head = model.layers[-1].kernel.numpy()
    for i, target in enumerate(targets):
        out_i = mha(x[i : i + 1], x[i : i + 1], use_causal_mask=causal).numpy()[0]
        relevance_out = out_i * head[:, target].reshape(out_i.shape)  # LRP-0 of the bias-free head
        expected = numpy_attention_relevance(x[i], weights, relevance_out, causal, attention)
        assert relative_errors(actual[i : i + 1], expected[None])[0] < 1e-10


# --- LXT ----------------------------------------------------------------------------------


@pytest.mark.skipif(lxt_twins.LXT_MISSING is not None, reason=str(lxt_twins.LXT_MISSING))
@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_heatmaps_equal_lxt(name, composite):
    model, x = case(name)
    targets = np.array([0, 2])
    explanation = LRP(model, composite).explain(x, targets)
    expected = lxt_relevance(model, x, targets, composite)
    assert np.all(np.abs(expected).sum(axis=tuple(range(1, expected.ndim))) > 0)
    errors = relative_errors(explanation.relevance.numpy(), expected)
    sums = explanation.relevance.numpy().reshape(len(x), -1).sum(1) / explanation.start.numpy()
    print(f"{name}/{composite}: relative L2 error vs LXT {errors.max():.1e}; sum R / logit {np.round(sums, 3)}")
    assert errors.max() <= TOLERANCE


# --- gradients ----------------------------------------------------------------------------


def heatmap_loss(model, x, composite, probe):
    return tf.reduce_sum(relevance(model, x, [0, 1], composite=composite) * probe)


@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
@pytest.mark.parametrize("name", ["vit", "text_first"])
def test_weight_gradients_equal_finite_differences(name, composite):
    """Two entries of every weight, central differences in float64, h = 1e-6."""
    model, x = case(name)
    x = x[:2]
    probe = tf.constant(np.random.default_rng(4).normal(size=relevance(model, x, [0, 1], composite=composite).shape))
    with tf.GradientTape() as tape:
        loss = heatmap_loss(model, x, composite, probe)
    gradients = [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]  # the embeddings': IndexedSlices
    rng = np.random.default_rng(5)
    checked = 0
    for variable, gradient in zip(model.trainable_variables, gradients):
        assert gradient is not None, variable.path
        flat = np.asarray(gradient).reshape(-1)
        for index in rng.choice(flat.size, size=min(2, flat.size), replace=False):
            numeric = models.central_difference(variable, index, lambda: heatmap_loss(model, x, composite, probe))
            assert flat[index] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (variable.path, index)
            checked += 1
    gammas = [g for v, g in zip(model.trainable_variables, gradients) if v.path.endswith("gamma")]
    assert gammas and all(np.abs(np.asarray(g)).max() > 0 for g in gammas)  # sigma is constant only in the rule
    assert checked > 40


@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
def test_input_gradient_equals_finite_differences(composite):
    model, x = case("vit")
    probe = tf.constant(np.random.default_rng(6).normal(size=x.shape))
    inputs = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        loss = heatmap_loss(model, inputs, composite, probe)
    gradient = tape.gradient(loss, inputs).numpy()
    for index in [(0, 1, 2, 0), (1, 7, 3, 0), (0, 4, 4, 0)]:
        shifted = [x.copy(), x.copy()]
        shifted[0][index] += 1e-6
        shifted[1][index] -= 1e-6
        numeric = (float(heatmap_loss(model, shifted[0], composite, probe)) - float(heatmap_loss(model, shifted[1], composite, probe))) / 2e-6
        assert gradient[index] == pytest.approx(numeric, rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
def test_eager_function_and_xla_agree(composite):
    model, x = case("text_causal_last_silu")
    models.assert_eager_function_and_xla_agree(model, LRP(model, composite), x, [0, 1])


# --- conservation -------------------------------------------------------------------------


def test_cp_lrp_conserves_without_biases_or_layer_norm():
    """No bias absorbs relevance and no softmax rule is applied: every step conserves."""
    inputs = keras.Input((5, 4), dtype=DTYPE)
    x = inputs
    for _ in range(2):
        h = keras.layers.MultiHeadAttention(2, 3, use_bias=False, dtype=DTYPE)(x, x)
        x = keras.layers.Add(dtype=DTYPE)([x, h])
        x = keras.layers.Dense(4, activation="gelu", use_bias=False, dtype=DTYPE)(x)
    flat = keras.layers.GlobalAveragePooling1D(dtype=DTYPE)(x)
    model = models.randomize(keras.Model(inputs, keras.layers.Dense(3, use_bias=False, dtype=DTYPE)(flat)), 8)
    data = np.random.default_rng(3).normal(size=(3, 5, 4))
    explanation = LRP(model, "cp_lrp").explain(data, [0, 1, 2])
    sums = explanation.relevance.numpy().reshape(3, -1).sum(1)
    np.testing.assert_allclose(sums, explanation.start.numpy(), rtol=1e-9)
    attnlrp = LRP(model, "attnlrp").explain(data, [0, 1, 2])
    ratio = attnlrp.relevance.numpy().reshape(3, -1).sum(1) / attnlrp.start.numpy()
    print(f"AttnLRP on the same model: sum R / logit {np.round(ratio, 3)}")  # the softmax rule does not conserve
    assert np.abs(ratio - 1).max() > 1e-3


# --- tokens -------------------------------------------------------------------------------


def test_token_ids_give_one_relevance_per_token():
    model, ids = case("text_first")
    explanation = LRP(model, "attnlrp").explain(ids, [1, 2])
    assert explanation.relevance.shape == ids.shape
    assert explanation.embedding.shape == (*ids.shape, 6)
    np.testing.assert_allclose(explanation.relevance.numpy(), explanation.embedding.numpy().sum(-1), rtol=1e-12)
    np.testing.assert_allclose(relevance(model, ids, [1, 2], composite="attnlrp").numpy(), explanation.relevance.numpy())
    # the embedding matrix gets a gradient through the looked-up vectors
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(LRP(model, "attnlrp")(ids, [1, 2]) ** 2)
    gradient = tape.gradient(loss, model.get_layer("tokens").embeddings)
    assert np.abs(tf.convert_to_tensor(gradient).numpy()).max() > 0


def test_float_token_ids_are_refused_with_the_fix():
    model, ids = case("text_first")
    with pytest.raises(TypeError, match=r"token ids through an Embedding.*ids.astype\('int32'\)"):
        relevance(model, ids.astype("float64"), 0, composite="attnlrp")


def test_image_models_refuse_token_ids_as_before():
    model, _ = case("vit")
    with pytest.raises(TypeError, match="floating input"):
        relevance(model, np.zeros((1, 8, 8, 1), "int32"), 0, composite="attnlrp")


def test_position_embedding_round_trips_through_a_keras_file(tmp_path):
    model, ids = case("text_first")
    path = tmp_path / "text.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(loaded.get_layer("positions"), PositionEmbedding)
    np.testing.assert_allclose(relevance(loaded, ids, 0, composite="attnlrp").numpy(), relevance(model, ids, 0, composite="attnlrp").numpy())


# --- what is refused ----------------------------------------------------------------------


def test_an_attention_mask_argument_is_refused_naming_the_layer():
    ids = keras.Input((4,), dtype="int32")
    x = keras.layers.Embedding(10, 4)(ids)
    x = keras.layers.MultiHeadAttention(1, 2, name="masked")(x, x, attention_mask=keras.layers.Dense(4)(x))
    model = keras.Model(ids, keras.layers.Dense(2)(keras.layers.Flatten()(x)))
    with pytest.raises(UnsupportedLayerError, match=r"'masked' is called with attention_mask.*use_causal_mask"):
        LRP(model, "attnlrp")


def test_a_gated_attention_and_a_norm_over_another_axis_are_refused():
    inputs = keras.Input((4, 3))
    gated = keras.layers.MultiHeadAttention(1, 2, use_gate=True, name="gated")(inputs, inputs)
    with pytest.raises(UnsupportedLayerError, match="'gated' uses use_gate=True"):
        LRP(keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(gated))), "attnlrp")
    normed = keras.layers.LayerNormalization(axis=1, name="norm1")(inputs)
    with pytest.raises(UnsupportedLayerError, match=r"'norm1' normalizes axis \[1\]; heatinv handles normalization over the last axis"):
        LRP(keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(normed))), "attnlrp")


def test_composite_mappings_take_attention_and_stabilizer():
    composite = resolve({"dense": "epsilon", "conv": "zero", "attention": "cp", "stabilizer": 1e-9})
    assert (composite.attention, composite.stabilizer, composite.dense.name) == ("cp", 1e-9, "epsilon")
    with pytest.raises(ValueError, match=r"'attention' is one of \['attnlrp', 'cp'\]; got 'uniform'"):
        resolve({"dense": "zero", "conv": "zero", "attention": "uniform"})
    with pytest.raises(ValueError, match="'stabilizer' is a number > 0"):
        resolve({"dense": "zero", "conv": "zero", "stabilizer": 0})


# --- keras-hub's layers ---------------------------------------------------------------------

needs_hub = pytest.mark.skipif(importlib.util.find_spec("keras_hub") is None, reason="keras-hub is not installed: pip install -e \".[hub]\"")
PADDED = np.array([[3, 5, 7, 9, 2, 0, 0, 0], [4, 1, 8, 0, 0, 0, 0, 0]], "int32")


@needs_hub
@pytest.mark.parametrize("positions", ["joint", "separate"])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("normalize_first", [False, True])
def test_keras_hub_layers_are_computed_as_keras_hub_computes_them(normalize_first, dropout, positions):
    """Padded ids, Keras masks on: keras-hub's TransformerEncoder masks padding in its attention (the
    separate PositionEmbedding drops the mask, as keras-hub warns, and then nothing is masked)."""
    model = models.hub_text(normalize_first=normalize_first, dropout=dropout, positions=positions)
    outputs = forward(canonize(model), tf.constant(PADDED)).outputs
    np.testing.assert_allclose(outputs.numpy(), model(PADDED).numpy(), rtol=0, atol=1e-13)


@needs_hub
@pytest.mark.parametrize("normalize_first", [False, True])
def test_keras_hub_padding_gets_no_relevance(normalize_first):
    model = models.hub_text(normalize_first=normalize_first)
    R = relevance(model, PADDED, [0, 1], composite="attnlrp").numpy()
    np.testing.assert_array_equal(R[0, 5:], 0.0)
    np.testing.assert_array_equal(R[1, 3:], 0.0)
    assert np.all(np.abs(R[0, :5]) > 0)


@needs_hub
@pytest.mark.skipif(lxt_twins.LXT_MISSING is not None, reason=str(lxt_twins.LXT_MISSING))
@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
@pytest.mark.parametrize("normalize_first", [False, True])
def test_keras_hub_heatmaps_equal_lxt(normalize_first, composite):
    """Measured: at most 2.2e-9 relative L2 (the twin runs keras-hub's TransformerEncoder.call in torch)."""
    model = models.hub_text(normalize_first=normalize_first, mask_zero=False)
    ids = np.array([[3, 5, 7, 9, 2, 1, 6, 4], [4, 1, 8, 2, 2, 3, 9, 9]], "int32")
    assert_equals_lxt(model, ids, composite, f"keras-hub normalize_first={normalize_first}")


@needs_hub
def test_other_keras_hub_layers_are_refused_by_name():
    import keras_hub

    ids = keras.Input((8,), dtype="int32")
    x = keras.layers.Embedding(50, 8)(ids)
    x = keras_hub.layers.TransformerDecoder(16, 2, name="decoder")(x)
    model = keras.Model(ids, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x)))
    with pytest.raises(UnsupportedLayerError, match=r"keras-hub layer 'decoder' of class TransformerDecoder.*TransformerEncoder"):
        LRP(model, "attnlrp")


BERT_IDS = np.array([[2, 5, 7, 9, 3, 0, 0, 0], [2, 8, 4, 3, 0, 0, 0, 0]], "int32")


@needs_hub
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_keras_hub_bert_classifier_of_token_ids_is_computed_as_keras_hub_computes_it(dropout):
    """token_model gives the classifier its padding mask (ids != 0) and one segment; the engine walks
    the nested backbone (three inputs, two outputs) and equals the classifier on its dict of inputs."""
    classifier = models.hub_bert(dropout=dropout)
    given = {"token_ids": BERT_IDS, "padding_mask": (BERT_IDS != 0).astype("int32"), "segment_ids": np.zeros_like(BERT_IDS)}
    outputs = forward(canonize(token_model(classifier)), tf.constant(BERT_IDS)).outputs
    np.testing.assert_allclose(outputs.numpy(), classifier(given).numpy(), rtol=0, atol=1e-13)
    R = relevance(token_model(classifier), BERT_IDS, [0, 2], composite="attnlrp").numpy()
    np.testing.assert_array_equal(R[0, 5:], 0.0)
    np.testing.assert_array_equal(R[1, 4:], 0.0)


@needs_hub
@pytest.mark.skipif(lxt_twins.LXT_MISSING is not None, reason=str(lxt_twins.LXT_MISSING))
@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
def test_keras_hub_bert_heatmaps_equal_lxt(composite):
    """Measured: 2.0e-9 relative L2 (the twin masks the padding columns as keras-hub's encoder does)."""
    assert_equals_lxt(token_model(models.hub_bert()), BERT_IDS, composite, "keras-hub BERT")


def test_token_model_names_what_it_needs():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="plain")
    with pytest.raises(ValueError, match=r"token_model takes a model whose inputs are a dict with 'token_ids'.*'plain'"):
        token_model(model)


@needs_hub
@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_keras_hub_vit_classifier_is_computed_as_keras_hub_computes_it(pooling):
    """Its Input is float32 whatever the layers' dtype: images exact in float32 keep the comparison in float64."""
    model = models.hub_vit(pooling=pooling)
    x = models.images().astype("float32").astype("float64")
    np.testing.assert_allclose(forward(canonize(model), tf.constant(x)).outputs.numpy(), model(x).numpy(), rtol=0, atol=1e-13)
    for composite in ("attnlrp", "cp_lrp", "epsilon_gamma_box"):
        R = relevance(model, x, [0, 2], composite=composite).numpy()
        assert R.shape == x.shape and np.all(np.isfinite(R)) and np.abs(R).sum() > 0


@needs_hub
@pytest.mark.skipif(lxt_twins.LXT_MISSING is not None, reason=str(lxt_twins.LXT_MISSING))
@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_keras_hub_vit_heatmaps_equal_lxt(pooling, composite):
    """Measured: at most 5.1e-9 relative L2."""
    x = models.images().astype("float32").astype("float64")
    assert_equals_lxt(models.hub_vit(pooling=pooling), x, composite, f"keras-hub ViT {pooling}")


def test_rms_normalization_is_computed_as_keras_does_and_passes_relevance_on():
    """RMSNormalization has no centering and no shift: with 1/sigma held constant its rule hands each
    entry the relevance of its output (LRP-0 of ``z = a * scale``: ``a * scale * R / z``)."""
    inputs = keras.Input((3, 4), dtype=DTYPE)
    x = keras.layers.RMSNormalization(dtype=DTYPE, name="rms")(keras.layers.Dense(4, dtype=DTYPE)(inputs))
    model = models.randomize(keras.Model(inputs, keras.layers.Dense(2, dtype=DTYPE)(keras.layers.Flatten(dtype=DTYPE)(x))), 2)
    data = np.random.default_rng(1).normal(size=(2, 3, 4))
    explainer = LRP(model, "attnlrp")
    fwd = forward(explainer.steps, tf.constant(data))
    np.testing.assert_allclose(fwd.outputs.numpy(), model(data).numpy(), rtol=0, atol=1e-13)
    index = next(i for i, step in enumerate(explainer.steps) if step.name == "rms")
    a = fwd.inputs[index]
    scale, shift, centered = explainer.steps[index].parts(a)
    assert shift is None and not centered
    R = np.random.default_rng(2).normal(size=a.shape)
    np.testing.assert_allclose(layer_norm_rule(a, tf.constant(R), scale, shift, centered, 1e-12).numpy(), R, rtol=1e-9)


# --- found by review: each failed before its fix ----------------------------------------------


def test_an_embedding_of_ids_changed_by_an_op_is_refused_by_name():
    ids = keras.Input((4,), dtype="int32")
    x = keras.layers.Embedding(10, 4, name="clipped")(keras.ops.minimum(ids, 9))
    model = keras.Model(ids, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x)))
    with pytest.raises(UnsupportedLayerError, match=r"Embedding 'clipped' reads another layer's or op's output"):
        LRP(model, "attnlrp")


def test_zbox_composites_on_transformers_give_a_map_or_a_clear_refusal():
    model, ids = case("text_first")
    R = relevance(model, ids, 0, composite="epsilon_gamma_box").numpy()  # token ids: no first layer, no box
    assert R.shape == ids.shape and np.all(np.isfinite(R))
    inputs = keras.Input((3, 4), dtype=DTYPE)
    normed = keras.layers.LayerNormalization(dtype=DTYPE, name="early_norm")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, dtype=DTYPE)(keras.layers.Flatten(dtype=DTYPE)(normed)))
    with pytest.raises(UnsupportedLayerError, match=r"'early_norm' \(LayerNormalization\) comes before the first Dense/Conv"):
        relevance(model, np.ones((1, 3, 4)), 0, composite="epsilon_gamma_box")


def test_a_padding_mask_reaching_a_pooling_that_ignores_masks_is_left_alone():
    ids = keras.Input((6,), dtype="int32")
    x = keras.layers.Embedding(10, 4, mask_zero=True, dtype=DTYPE)(ids)
    x = keras.layers.AveragePooling1D(2, dtype=DTYPE)(keras.layers.Dense(4, dtype=DTYPE)(x))
    model = models.randomize(keras.Model(ids, keras.layers.Dense(2, dtype=DTYPE)(keras.layers.Flatten(dtype=DTYPE)(x))), 3)
    data = np.array([[3, 4, 5, 0, 0, 0]], "int32")
    np.testing.assert_allclose(forward(canonize(model), tf.constant(data)).outputs.numpy(), model(data).numpy(), rtol=0, atol=1e-13)


def test_quantized_attention_projections_are_refused():
    inputs = keras.Input((3, 4))
    mha = keras.layers.MultiHeadAttention(1, 2, name="mha")
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(mha(inputs, inputs))))
    mha.query_dense.quantize("int8")
    with pytest.raises(UnsupportedLayerError, match=r"is quantized \(int8\)"):
        LRP(model, "attnlrp")


def test_an_attention_subclass_with_its_own_attention_is_refused():
    class Tempered(keras.layers.MultiHeadAttention):
        def _masked_softmax(self, scores, attention_mask=None):
            return super()._masked_softmax(scores * 2.0, attention_mask)

    inputs = keras.Input((3, 4))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(Tempered(1, 2, name="tempered")(inputs, inputs))))
    with pytest.raises(UnsupportedLayerError, match=r"'tempered' of class Tempered extends MultiHeadAttention but overrides _masked_softmax"):
        LRP(model, "attnlrp")
