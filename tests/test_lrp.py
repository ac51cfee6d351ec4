"""The LRP engine as a differentiable function: gradients, execution modes, canonizing, errors.

Per-rule values against an independent NumPy implementation live in ``test_rules.py``;
here the engine is checked against mathematics that does not depend on the rules'
details: finite differences, conservation, the model's own forward pass, and the same
numbers in eager, ``tf.function`` and XLA.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import numpy_lrp
from conftest import MODELS, conv_model, dense_model, inputs_for
from heatinv.lrp import COMPOSITES, LRP, NonFiniteHeatmapWarning, UnsupportedLayerError, relevance
from heatinv.lrp.canonical import canonize
from heatinv.lrp.one_channel import transpose_by_depthwise, transpose_by_taps
from heatinv.lrp.propagate import forward
from heatinv.models import with_dtype


def _heatmap_loss(lrp: LRP, x, target_map, target):
    return tf.reduce_sum(tf.square(lrp(x, target) - target_map))


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("composite", ["epsilon", "epsilon_gamma_box", "epsilon_alpha2_beta1", "epsilon_plus_flat"])
def test_weight_and_input_gradients_match_finite_differences(kind, composite, rng):
    model = MODELS[kind]("float64")
    lrp = LRP(model, composite)
    x = tf.constant(inputs_for(model, rng, batch=2))
    target_map = tf.constant(rng.normal(0, 0.05, x.shape))
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = _heatmap_loss(lrp, x, target_map, [0, 2])
    grads = tape.gradient(loss, model.trainable_variables + [x])
    h = 1e-6
    checked = 0
    for variable, grad in zip(model.trainable_variables, grads):
        assert grad is not None, variable.path
        flat = variable.numpy().reshape(-1)
        for index in rng.choice(flat.size, size=min(3, flat.size), replace=False):
            original = flat[index]
            values = []
            for delta in (h, -h):
                flat[index] = original + delta
                variable.assign(flat.reshape(variable.shape))
                values.append(float(_heatmap_loss(lrp, x, target_map, [0, 2])))
            flat[index] = original
            variable.assign(flat.reshape(variable.shape))
            numeric = (values[0] - values[1]) / (2 * h)
            analytic = grad.numpy().reshape(-1)[index]
            # Measured over these 8 cases (float64, h = 1e-6): relative error up to 3.0e-5
            # (conv, epsilon), absolute up to 4.1e-11 on entries below 1e-6.
            assert analytic == pytest.approx(numeric, rel=1e-4, abs=3e-10), (variable.path, index)
            checked += 1
    # input gradient, direction-wise
    direction = rng.normal(size=x.shape)
    plus = float(_heatmap_loss(lrp, x + h * direction, target_map, [0, 2]))
    minus = float(_heatmap_loss(lrp, x - h * direction, target_map, [0, 2]))
    # measured: up to 1.2e-8 relative (conv, epsilon_plus_flat)
    assert float(tf.reduce_sum(grads[-1] * direction)) == pytest.approx((plus - minus) / (2 * h), rel=1e-7)
    assert checked >= 3 * 4


@pytest.mark.parametrize("composite", ["epsilon_gamma_box", "epsilon_alpha2_beta1"])
def test_weight_gradients_through_the_forward_passs_a_w_plus_match_finite_differences(composite, rng, monkeypatch):
    """From batch 4 on, a conv layer after a ReLU gets ``a W`` and ``a W+`` from one map of the
    forward pass (``STACKED_PRODUCTS_MIN_BATCH``) where oneDNN's kernels are off (so here,
    on any CPU); its kernel's gradient goes through both."""
    from heatinv.lrp import propagate
    from heatinv.lrp.propagate import STACKED_PRODUCTS_MIN_BATCH, positive_product_steps

    monkeypatch.setattr(propagate, "onednn_enabled", lambda: False)
    keras.utils.set_random_seed(5)
    model = keras.Sequential([
        keras.Input((12, 12, 2), dtype="float64"),
        keras.layers.Conv2D(3, 3, padding="same", activation="relu", dtype="float64"),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", dtype="float64"),
        keras.layers.Flatten(dtype="float64"),
        keras.layers.Dense(3, dtype="float64"),
    ])
    lrp = LRP(model, composite)
    x = tf.constant(rng.uniform(size=(STACKED_PRODUCTS_MIN_BATCH, 12, 12, 2)))
    assert forward(lrp.steps, x, positive_product_steps(lrp.steps, lrp.composite)).positives  # the path under test
    target_map = tf.constant(rng.normal(0, 0.05, x.shape))
    kernel = model.layers[1].kernel
    with tf.GradientTape() as tape:
        loss = _heatmap_loss(lrp, x, target_map, 1)
    grad = tape.gradient(loss, kernel).numpy().reshape(-1)
    flat, h = kernel.numpy().reshape(-1), 1e-6
    for index in rng.choice(flat.size, size=4, replace=False):
        values = []
        for delta in (h, -h):
            shifted = flat.copy()
            shifted[index] += delta
            kernel.assign(shifted.reshape(kernel.shape))
            values.append(float(_heatmap_loss(lrp, x, target_map, 1)))
        kernel.assign(flat.reshape(kernel.shape))
        assert grad[index] == pytest.approx((values[0] - values[1]) / (2 * h), rel=1e-4, abs=3e-10), index
    assert np.abs(grad).max() > 1e-6


def test_second_order_gradient_matches_finite_differences(rng):
    """d/dx of (dL/dW . v): the gradient of a weight gradient, as explanation manipulation needs."""
    model = dense_model("float64")
    lrp = LRP(model, "epsilon")
    x = tf.constant(inputs_for(model, rng, batch=2))
    target_map = tf.constant(rng.normal(0, 0.05, x.shape))
    kernel = model.layers[0].kernel
    v = tf.constant(rng.normal(size=kernel.shape))

    def directional(x_):
        with tf.GradientTape() as inner:
            loss = _heatmap_loss(lrp, x_, target_map, 1)
        return tf.reduce_sum(inner.gradient(loss, kernel) * v)

    with tf.GradientTape() as outer:
        outer.watch(x)
        value = directional(x)
    analytic = outer.gradient(value, x)
    theoretical, numerical = tf.test.compute_gradient(directional, [x], delta=1e-6)
    # the tape inside and outside tf.test.compute_gradient: measured identical
    np.testing.assert_allclose(analytic.numpy().reshape(-1), theoretical[0].reshape(-1), rtol=1e-12)
    # central differences with delta 1e-6: measured 2.4e-7 relative, 1.4e-10 absolute (entries up to 1.1)
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=2e-6, atol=1e-9)
    assert np.abs(analytic.numpy()).max() > 0


def _maps_and_two_derivatives(maps, tensors: list, weights: list, directions: list) -> list:
    """``maps(*tensors)`` (a list), the gradient of ``sum_j sum(map_j ** 2 * weight_j)`` with respect
    to ``tensors``, and the gradient of that gradient along ``directions``."""
    with tf.GradientTape(persistent=True) as outer:
        outer.watch(tensors)
        with tf.GradientTape() as inner:
            inner.watch(tensors)
            values = maps(*tensors)
            loss = tf.add_n([tf.reduce_sum(tf.square(v) * w) for v, w in zip(values, weights)])
        first = inner.gradient(loss, tensors)
        directional = tf.add_n([tf.reduce_sum(g * v) for g, v in zip(first, directions)])
    return [*values, *first, *outer.gradient(directional, tensors)]


@pytest.mark.parametrize("form", [transpose_by_taps, transpose_by_depthwise], ids=["taps", "depthwise"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("size", [(3, 3), (2, 4)])
def test_single_channel_transpose_equals_conv_transpose_to_the_second_derivative(form, padding, size, rng):
    """Both forms of a map to one channel: its value, its gradients (written out) and their gradients."""
    kernel = tf.constant(rng.normal(size=(*size, 1, 5)))
    like_shape = [2, 7, 6, 1]
    s_shape = tf.nn.convolution(tf.zeros(like_shape, tf.float64), kernel, padding=padding).shape
    s, weights = tf.constant(rng.normal(size=s_shape)), tf.constant(rng.normal(size=like_shape))
    v_s, v_kernel = tf.constant(rng.normal(size=s_shape)), tf.constant(rng.normal(size=kernel.shape))

    def derivatives(transpose):
        return _maps_and_two_derivatives(lambda s, k: [transpose(s, k)], [s, kernel], [weights], [v_s, v_kernel])

    got = derivatives(lambda s, k: form(s, k, padding))
    want = derivatives(lambda s, k: tf.nn.conv_transpose(s, k, like_shape, 1, padding))
    for name, g, w in zip(["value", "d/ds", "d/dkernel", "d2/ds", "d2/dkernel"], got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
        assert np.abs(w.numpy()).max() > 0.1, name


@pytest.mark.parametrize("onednn", [False, True], ids=["taps", "depthwise"])
def test_a_sum_of_single_channel_maps_equals_the_sum_of_conv_transposes_to_the_second_derivative(onednn, rng, monkeypatch):
    """Pairs ``(s_j, K_j)`` given apart, as both forms take them (no copy side by side)."""
    import heatinv.lrp.one_channel as one_channel

    monkeypatch.setattr(one_channel, "onednn_enabled", lambda: onednn)
    like_shape, s_shape = [2, 7, 6, 1], [2, 7, 6, 3]
    tensors = [tf.constant(rng.normal(size=shape)) for shape in (s_shape, s_shape, (3, 3, 1, 3), (3, 3, 1, 3))]
    weights = tf.constant(rng.normal(size=like_shape))
    directions = [tf.constant(rng.normal(size=t.shape)) for t in tensors]

    def derivatives(transpose_sum):
        return _maps_and_two_derivatives(lambda *t: [transpose_sum(*t)], tensors, [weights], directions)

    got = derivatives(lambda s1, s2, k1, k2: one_channel.single_channel_transpose([s1, s2], [k1, k2], "SAME"))
    want = derivatives(
        lambda s1, s2, k1, k2: tf.nn.conv_transpose(s1, k1, like_shape, 1, "SAME") + tf.nn.conv_transpose(s2, k2, like_shape, 1, "SAME")
    )
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-12, err_msg=f"derivative {k}")
        assert np.abs(w.numpy()).max() > 0.1, k


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("size", [(3, 3), (2, 4)])
def test_single_channel_maps_of_one_cotangent_equal_conv_transposes_to_the_second_derivative(padding, size, rng):
    """``[K_j^T s for each j]`` by depthwise maps, their gradient written out with the kernels side by side."""
    import heatinv.lrp.one_channel as one_channel

    like_shape = [2, 7, 6, 1]
    kernels = [tf.constant(rng.normal(size=(*size, 1, 3))) for _ in range(2)]
    s = tf.constant(rng.normal(size=tf.nn.convolution(tf.zeros(like_shape, tf.float64), kernels[0], padding=padding).shape))
    tensors = [s, *kernels]
    weights = [tf.constant(rng.normal(size=like_shape)) for _ in kernels]
    directions = [tf.constant(rng.normal(size=t.shape)) for t in tensors]

    def derivatives(transpose_each):
        return _maps_and_two_derivatives(lambda s, *ks: transpose_each(s, list(ks)), tensors, weights, directions)

    got = derivatives(lambda s, ks: one_channel.single_channel_transpose_each(s, ks, padding))
    want = derivatives(lambda s, ks: [tf.nn.conv_transpose(s, k, like_shape, 1, padding) for k in ks])
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-12, err_msg=f"output {k}")
        assert np.abs(w.numpy()).max() > 0.1, k


@pytest.mark.parametrize("onednn", [False, True])
def test_a_one_channel_layers_maps_of_one_cotangent_take_the_form_for_tensorflows_kernels(onednn, monkeypatch):
    """Depthwise maps under oneDNN's kernels; without them one transposed map, the kernels side by side."""
    import heatinv.lrp.canonical as canonical

    monkeypatch.setattr(canonical, "onednn_enabled", lambda: onednn)
    called = []
    monkeypatch.setattr(canonical, "single_channel_transpose_each", lambda s, ks, padding: called.append(len(ks)) or [s[..., :1]] * len(ks))
    layer = canonize(keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, padding="same")]))[0]
    s, kernel = tf.ones([1, 4, 4, 2]), tf.ones([3, 3, 1, 2])
    maps = layer.transpose(s, [kernel, 2 * kernel], tf.zeros([1, 4, 4, 1]))
    assert called == ([2] if onednn else [])
    assert [m.shape for m in maps] == [(1, 4, 4, 1)] * 2


def _amplifying_chain(dtype: str) -> keras.Model:
    """16 Dense(1)+ReLU layers whose pre-activation, 2^-10 each, is a 1024th of their input's contribution.

    Every value is exact in float32, and LRP-0 multiplies relevance by 1024 at each layer:
    1024^16 * 2^-9 overflows float32 and stays far inside float64.
    """
    model = keras.Sequential(
        [keras.Input((1,), dtype=dtype)]
        + [keras.layers.Dense(1, activation="relu", dtype=dtype) for _ in range(16)]
        + [keras.layers.Dense(2, dtype=dtype)]
    )
    for k, layer in enumerate(model.layers[:-1]):
        layer.set_weights([np.array([[1.0 if k == 0 else 1024.0]]), np.array([-(1 - 2.0**-10)])])
    model.layers[-1].set_weights([np.array([[1.0, 2.0]]), np.zeros(2)])
    return model


def test_an_eager_heatmap_that_overflows_warns_with_its_cause_and_the_fix():
    x = np.ones((2, 1))
    with pytest.warns(NonFiniteHeatmapWarning, match=r"2 of 2 examples .*outputs are finite, so relevance left float32's range.*float64"):
        heatmap = LRP(_amplifying_chain("float32"), "zero")(x.astype("float32"), 1)
    assert not np.isfinite(heatmap.numpy()).any()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteHeatmapWarning)
        explanation = LRP(_amplifying_chain("float64"), "zero").explain(x, 1)
    # each of the 16 layers multiplies by a w / z = 1024 (LRP-0's stabilizer: 1e-9 of z each)
    np.testing.assert_allclose(explanation.relevance.numpy()[:, 0], explanation.start.numpy() * 2.0**160, rtol=1e-7)
    assert float(explanation.relevance[0, 0]) > 1e45


def test_an_eager_heatmap_of_a_model_with_nan_outputs_warns_that_the_outputs_are_nan():
    model = dense_model("float32")
    model.layers[-1].kernel.assign(np.full(model.layers[-1].kernel.shape, np.nan, "float32"))
    with pytest.warns(NonFiniteHeatmapWarning, match=r"the model's own outputs are NaN or Inf"):
        LRP(model, "epsilon")(np.ones((1,) + tuple(model.inputs[0].shape[1:]), "float32"), 0)


def _amplifying_positions() -> keras.Model:
    """The amplifying chain as 1x1 Conv1D layers on two positions, so each position is a chain of its own."""
    model = keras.Sequential(
        [keras.Input((2, 1))]
        + [keras.layers.Conv1D(1, 1, activation="relu") for _ in range(16)]
        + [keras.layers.Flatten(), keras.layers.Dense(2)]
    )
    for k, layer in enumerate(model.layers[:16]):
        layer.set_weights([np.array([[[1.0 if k == 0 else 1024.0]]]), np.array([-(1 - 2.0**-10)])])
    model.layers[-1].set_weights([np.array([[1.0, 2.0], [1.0, 2.0]]), np.zeros(2)])
    return model


def test_an_example_with_some_non_finite_entries_is_counted():
    x = np.array([[[1.0], [0.0]], [[0.0], [0.0]]], "float32")  # only the first example's first position overflows
    with pytest.warns(NonFiniteHeatmapWarning, match=r"The heatmap of 1 of 2 examples has NaN or Inf"):
        heatmap = LRP(_amplifying_positions(), "zero")(x, 1).numpy()
    assert not np.isfinite(heatmap[0, 0, 0]) and heatmap[0, 1, 0] == 0.0 and (heatmap[1] == 0.0).all()


def test_a_non_finite_warning_from_explain_points_at_the_callers_line():
    with pytest.warns(NonFiniteHeatmapWarning) as record:
        LRP(_amplifying_positions(), "zero").explain(np.ones((1, 2, 1), "float32"), 1)
    assert record[0].filename == __file__


def test_a_non_finite_warning_from_relevance_points_at_the_callers_line():
    with pytest.warns(NonFiniteHeatmapWarning) as record:
        relevance(_amplifying_positions(), np.ones((1, 2, 1), "float32"), 1, "zero")
    assert record[0].filename == __file__


def test_a_traced_heatmap_is_not_checked():
    x = np.ones((2, 1), "float32")
    lrp = LRP(_amplifying_chain("float32"), "zero")
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteHeatmapWarning)
        assert not np.isfinite(tf.function(lambda v: lrp(v, 1))(x).numpy()).any()


def test_target_none_names_the_forms_and_the_predicted_class():
    model = dense_model("float32")
    with pytest.raises(ValueError, match=r"target=None: name the class to explain.*tf.argmax\(model\(x\), axis=-1\)"):
        LRP(model)(np.ones((1,) + tuple(model.inputs[0].shape[1:]), "float32"), None)


def _step_outputs(model, lrp, target_map):
    def step(x):
        with tf.GradientTape() as tape:
            R = lrp(x, 1)
            loss = tf.reduce_sum(tf.square(R - target_map))
        return [R, loss] + tape.gradient(loss, model.trainable_variables)

    return step


@pytest.mark.parametrize("kind", ["dense", "conv", "conv_grayscale"])
@pytest.mark.parametrize("composite", sorted(COMPOSITES))
def test_eager_function_and_xla_agree(kind, composite, rng):
    """float64, so the comparison is not drowned by float32 rounding amplified by 1/z."""
    model = MODELS[kind]("float64") if kind == "dense" else MODELS[kind]("float64", pool="average")
    lrp = LRP(model, composite)
    x = tf.constant(inputs_for(model, rng))
    step = _step_outputs(model, lrp, tf.constant(rng.normal(0, 0.05, x.shape)))
    eager = step(x)
    graph = tf.function(step)(x)
    xla = tf.function(step, jit_compile=True)(x)
    # Gradients that are zero in exact arithmetic (biases under LRP-0) come out as rounding
    # noise, so entries are compared on the scale of the largest gradient. Measured over all
    # 14 cases: graph 5.3e-15, XLA 4.8e-14 of that scale (heatmap and loss: of their own).
    gradient_scale = max(float(np.abs(g.numpy()).max()) for g in eager[2:])
    for i, (a, b, c) in enumerate(zip(eager, graph, xla)):
        scale = gradient_scale if i >= 2 else float(np.abs(a.numpy()).max())
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=5e-13 * scale, rtol=0)
        np.testing.assert_allclose(c.numpy(), a.numpy(), atol=5e-13 * scale, rtol=0)
    assert float(tf.reduce_max(tf.abs(eager[0]))) > 0


@pytest.mark.parametrize("composite", ["epsilon_gamma_box", "epsilon_plus"])
def test_xla_float32_with_max_pooling_agrees_on_heatmap_and_loss(composite, rng):
    model = conv_model("float32", pool="max")
    lrp = LRP(model, composite)
    x = tf.constant(inputs_for(model, rng))
    step = _step_outputs(model, lrp, tf.constant(rng.normal(0, 0.05, x.shape).astype("float32")))
    eager, xla = step(x), tf.function(step, jit_compile=True)(x)
    # Measured (both composites, input seeds 1234 and 1-4): XLA vs eager heatmap within 6.1e-7
    # of its max, loss within 3.2e-7 relative, gradients within 6.4e-7 of the largest gradient
    # entry. Gradients that are zero in exact arithmetic (the last bias) are float32 noise
    # (~1e-7), so all gradients are compared on the scale of the largest one.
    scale = float(np.abs(eager[0].numpy()).max())
    np.testing.assert_allclose(xla[0].numpy(), eager[0].numpy(), atol=5e-6 * scale, rtol=0)
    np.testing.assert_allclose(xla[1].numpy(), eager[1].numpy(), rtol=3e-6)
    gradient_scale = max(float(np.abs(g.numpy()).max()) for g in eager[2:])
    for a, b in zip(eager[2:], xla[2:]):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=5e-6 * gradient_scale, rtol=0)


def test_max_pooling_routes_relevance_exactly_under_xla(rng):
    from heatinv.lrp.max_pool import winner_takes_all

    a = tf.constant(rng.normal(size=(2, 8, 8, 3)).astype("float32"))
    R = tf.constant(rng.normal(size=(2, 4, 4, 3)).astype("float32"))
    c = tf.constant(rng.normal(size=(2, 8, 8, 3)).astype("float32"))

    def f(a, R):
        with tf.GradientTape() as tape:
            tape.watch([a, R])
            out = tf.reduce_sum(winner_takes_all(a, R, lambda v: tf.nn.max_pool2d(v, 2, 2, "VALID")) * c)
        return [out] + tape.gradient(out, [R])

    eager, xla = f(a, R), tf.function(f, jit_compile=True)(a, R)
    for u, v in zip(eager, xla):
        np.testing.assert_array_equal(u.numpy(), v.numpy())
    # conservation of the routing: every pooled output's relevance lands on exactly one input
    routed = winner_takes_all(a, R, lambda v: tf.nn.max_pool2d(v, 2, 2, "VALID"))
    np.testing.assert_allclose(tf.reduce_sum(routed), tf.reduce_sum(R), rtol=1e-5)
    assert int(tf.math.count_nonzero(routed)) == R.shape.num_elements()


def test_no_retrace_for_a_new_batch_size(rng):
    model = conv_model()
    lrp = LRP(model, "epsilon_gamma_box")
    traces = []

    @tf.function(input_signature=[tf.TensorSpec((None, 8, 8, 2), tf.float32), tf.TensorSpec((None,), tf.int32)])
    def explain(x, target):
        traces.append(1)
        return lrp(x, target)

    for batch in (1, 4, 7):
        R = explain(inputs_for(model, rng, batch), np.zeros(batch, "int32"))
        assert R.shape == (batch, 8, 8, 2)
    assert len(traces) == 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_relevance_keeps_shape_and_dtype(dtype, rng):
    model = conv_model()
    x = inputs_for(model, rng).astype(dtype)
    R = relevance(model, x, 0)
    assert R.shape == x.shape and R.dtype == tf.as_dtype(dtype)


def test_conservation_epsilon_without_biases(rng):
    model = dense_model("float64")
    for layer in model.layers:
        layer.bias.assign(tf.zeros_like(layer.bias))
    x = inputs_for(model, rng)
    lrp = LRP(model, "zero")
    explanation = lrp.explain(x, [0, 1, 2])
    # measured 1.9e-11 relative: LRP-0's 1e-12 stabilizer in three layers
    np.testing.assert_allclose(tf.reduce_sum(explanation.relevance, axis=1), explanation.start, rtol=2e-10)
    np.testing.assert_allclose(explanation.start, model(x).numpy()[np.arange(3), [0, 1, 2]], rtol=1e-12)


def test_batch_norm_folding_reproduces_the_model_and_trains_its_variables(rng):
    model = conv_model("float64")
    x = inputs_for(model, rng)
    steps = canonize(model)
    assert not any(isinstance(layer, keras.layers.BatchNormalization) for layer in (s.layer for s in steps))
    # measured 5.7e-16 of the largest output (float64)
    reference = model(x, training=False).numpy()
    np.testing.assert_allclose(forward(steps, tf.constant(x)).outputs, reference, rtol=0, atol=1e-14 * np.abs(reference).max())
    bn = next(layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(relevance(model, x, 1)))
    grads = tape.gradient(loss, [bn.gamma, bn.beta])
    assert all(g is not None and float(tf.reduce_max(tf.abs(g))) > 0 for g in grads)


def test_batch_norm_on_dense_any_rank_is_folded(rng):
    model = keras.Sequential(
        [keras.Input((5,), dtype="float64"), keras.layers.Dense(4, dtype="float64"),
         keras.layers.BatchNormalization(dtype="float64"), keras.layers.Activation("relu", dtype="float64"),
         keras.layers.Dense(2, dtype="float64")]
    )
    bn = model.layers[1]
    bn.set_weights([np.full(4, 2.0), np.full(4, 0.3), np.full(4, -0.1), np.full(4, 4.0)])
    x = rng.uniform(size=(3, 5))
    np.testing.assert_allclose(forward(canonize(model), tf.constant(x)).outputs, model(x), rtol=1e-14)  # measured: equal


def test_blank_input_with_zero_biases_gives_no_nan():
    """LRP-0 meets 0/0 here; the signed stabilizer keeps values and gradients finite."""
    model = dense_model("float32")
    for layer in model.layers:
        layer.bias.assign(tf.zeros_like(layer.bias))
    x = tf.zeros((2, 6))
    with tf.GradientTape() as tape:
        tape.watch(x)
        R = relevance(model, x, 0, composite="zero")
        loss = tf.reduce_sum(tf.square(R - 0.1))
    grads = tape.gradient(loss, model.trainable_variables + [x])
    assert np.isfinite(R.numpy()).all()
    assert all(np.isfinite(g.numpy()).all() for g in grads)


def test_logit_output_survives_a_dead_final_relu(rng):
    model = dense_model("float32", final_activation="relu")
    last = model.layers[-1]
    last.bias.assign(tf.fill(last.bias.shape, -100.0))  # every output unit dead
    x = inputs_for(model, rng)
    assert float(tf.reduce_max(tf.abs(relevance(model, x, 0, output="activation")))) == 0.0
    assert float(tf.reduce_max(tf.abs(relevance(model, x, 0, output="logit")))) > 0.0


def test_softmax_head_activation_output_starts_from_probabilities(rng):
    model = dense_model("float64", final_activation="softmax")
    x = inputs_for(model, rng)
    explanation = LRP(model, "epsilon", output="activation").explain(x, 2)
    np.testing.assert_allclose(explanation.start, model(x).numpy()[:, 2], rtol=1e-12)


@pytest.mark.parametrize(
    "target", [1, np.array([1, 1, 1]), np.eye(3)[[1, 1, 1]].astype("float32"), tf.constant([1, 1, 1])]
)
def test_target_forms_agree(target, rng):
    model = dense_model()
    x = inputs_for(model, rng)
    np.testing.assert_array_equal(relevance(model, x, target), relevance(model, x, 1))  # the same ops: measured equal


@pytest.mark.parametrize("target", [3, [0, 3], np.array([0, 3]), tf.constant([0, 3]), tf.constant(-1)])
def test_a_target_out_of_range_is_refused_in_every_form(target):
    """``tf.one_hot`` turns an index out of range into a row of zeros: an all-zero heatmap, silently."""
    model = dense_model()  # 3 classes
    with pytest.raises(ValueError, match=r"out of range for a model with 3 output units: class indices are 0 to 2"):
        relevance(model, np.ones((2, 6), "float32"), target)


@pytest.mark.parametrize("target", [np.eye(3, dtype="int32")[[1, 1]], [[0, 1, 0], [0, 1, 0]], np.array([[1], [1]])])
def test_an_integer_one_hot_and_a_column_of_labels_are_targets(target, rng):
    # keras.datasets gives labels as a [batch, 1] column; tf.one_hot(..., dtype=tf.int32) an integer one-hot
    model = dense_model()  # 3 classes
    x = inputs_for(model, rng)[:2]
    np.testing.assert_array_equal(relevance(model, x, target), relevance(model, x, 1))


@pytest.mark.parametrize("dtype", ["bool", "int32", "float32", "float64"])
def test_a_one_hot_of_any_dtype_selects_its_classes_for_a_float64_model(dtype, rng):
    model = dense_model("float64")
    x = inputs_for(model, rng)[:2]
    chosen = np.array([[1, 0, 1], [0, 1, 0]])  # two classes: their sum is explained
    got = relevance(model, x, chosen.astype(dtype), "epsilon").numpy()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, numpy_lrp.relevance(model, x, chosen.astype("float64"), "epsilon"), rtol=1e-9, atol=1e-12)


def test_a_column_of_labels_for_a_model_of_one_output_unit_selects_that_unit(rng):
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,), dtype="float64"), keras.layers.Dense(4, activation="relu", dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    x = rng.uniform(size=(2, 6))
    got = relevance(model, x, np.array([[0], [0]]), "epsilon").numpy()
    np.testing.assert_allclose(got, numpy_lrp.relevance(model, x, 0, "epsilon"), rtol=1e-9, atol=1e-12)
    assert np.abs(got).max() > 0


def test_a_one_hot_of_another_batch_size_is_refused():
    with pytest.raises(ValueError, match=r"The target has 1 entry for a batch of 2 inputs; give one per input"):
        relevance(dense_model(), np.ones((2, 6), "float32"), np.eye(3, dtype="float32")[[1]])


def test_an_error_names_ten_wrong_class_indices_and_marks_the_rest():
    target = np.arange(3, 14)  # 11 indices out of range for 3 classes
    with pytest.raises(ValueError, match=r"names class 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, \.\.\., out of range"):
        relevance(dense_model(), np.ones((11, 6), "float32"), target)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"])
def test_class_indices_of_every_integer_dtype_are_targets(dtype, rng):
    model = dense_model()  # tf.one_hot takes four of these dtypes: the others raised TensorFlow's error
    x = inputs_for(model, rng)[:2]
    np.testing.assert_array_equal(relevance(model, x, np.array([1, 1], dtype)), relevance(model, x, 1))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_constant_column_of_labels_is_checked_when_tracing(jit_compile):
    """The column's slice hid its values from the check: a ValueError became an assertion when run, and none under XLA."""
    model = dense_model()  # 3 classes
    explain = tf.function(lambda x: LRP(model, "epsilon")(x, [[5], [0]]), jit_compile=jit_compile)
    with pytest.raises(ValueError, match="The target names class 5, out of range"):
        explain(np.ones((2, 6), "float32"))


def test_a_model_of_one_output_unit_is_told_its_only_class_index():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, activation="sigmoid")])
    with pytest.raises(ValueError, match="The target names class 1, out of range for a model with 1 output unit: the only class index is 0"):
        relevance(model, np.ones((2, 6), "float32"), 1)


def test_a_target_passed_to_a_tf_function_is_checked_when_it_runs():
    """A label tensor given as the function's argument is not known when tracing: checked in the graph."""
    model = dense_model()  # 3 classes
    explain = tf.function(LRP(model, "epsilon").__call__, input_signature=[tf.TensorSpec([None, 6]), tf.TensorSpec([None], tf.int32)])
    x = np.ones((2, 6), "float32")
    assert np.abs(explain(x, tf.constant([2, 0])).numpy()).sum() > 0
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"out of range \(class indices are 0 to 2\).*\[9 0\]"):
        explain(x, tf.constant([9, 0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"out of range.*\[-1 0\]"):
        explain(x, tf.constant([-1, 0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="another number of entries than the batch"):
        explain(x, tf.constant([0, 1, 2]))
    every = tf.function(lambda x: LRP(model, "epsilon")(x, 5), input_signature=[tf.TensorSpec([None, 6])])
    with pytest.raises(ValueError, match="The target names class 5, out of range"):  # a constant: refused when tracing
        every.get_concrete_function()


def test_unsupported_layer_names_layer_class_and_supported_list():
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4), keras.layers.UnitNormalization(name="norm_me"), keras.layers.Dense(2)]
    )
    with pytest.raises(UnsupportedLayerError, match=r"'norm_me' of class UnitNormalization.*Supported layers: Dense"):
        relevance(model, np.ones((1, 6), "float32"), 0)


def test_bad_inputs_get_clear_errors():
    model = dense_model()
    with pytest.raises(TypeError, match="floating input"):
        relevance(model, np.ones((1, 6), "int32"), 0)
    with pytest.raises(ValueError, match=r"does not fit model.*Reshape it to \(batch, 6\)"):
        relevance(model, np.ones((1, 5), "float32"), 0)
    with pytest.raises(ValueError, match=r"without the batch axis: x\[None\]"):
        relevance(model, np.ones((6,), "float32"), 0)
    with pytest.raises(ValueError, match=r"lacks the channel axis \(one channel\): x\[\.\.\., None\]"):
        grayscale = keras.Sequential([keras.Input((12, 12, 1)), keras.layers.Conv2D(2, 3), keras.layers.Flatten(), keras.layers.Dense(3)])
        relevance(grayscale, np.ones((2, 12, 12), "float32"), 0)
    with pytest.raises(ValueError, match="out of range"):
        relevance(model, np.ones((1, 6), "float32"), 3)
    with pytest.raises(ValueError, match="Unknown LRP composite"):
        relevance(model, np.ones((1, 6), "float32"), 0, composite="nope")
    with pytest.raises(ValueError, match="alpha - beta = 1"):
        relevance(model, np.ones((1, 6), "float32"), 0, composite={"dense": {"name": "alpha_beta", "alpha": 2, "beta": 2}, "conv": "zero"})


def test_an_unknown_output_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"output must be one of .*'logit'.*'activation'.*got 'softmax'"):
        LRP(dense_model(), "epsilon", output="softmax")


def test_a_colour_image_without_its_channel_axis_is_told_to_reshape():
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 3), keras.layers.Flatten(), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match=r"Reshape it to \(batch, 8, 8, 3\)\.$"):
        relevance(model, np.ones((2, 8, 8), "float32"), 0)


@pytest.mark.parametrize(
    ("rule", "parameters", "spelled_out"),
    [
        ("epsilon", {"epsilon": 0.5}, {"name": "epsilon", "epsilon": 0.5}),
        ("gamma", {"gamma": 0.7}, {"name": "gamma", "gamma": 0.7}),
        ("alpha_beta", {"alpha": 3.0, "beta": 2.0}, {"name": "alpha_beta", "alpha": 3.0, "beta": 2.0}),
    ],
)
def test_relevance_hands_each_rule_parameter_to_its_rule(rule, parameters, spelled_out, rng):
    model = dense_model("float64")
    x = inputs_for(model, rng)
    got = relevance(model, x, 1, {"dense": rule, "conv": rule}, **parameters).numpy()
    np.testing.assert_allclose(got, numpy_lrp.relevance(model, x, 1, {"dense": spelled_out, "conv": spelled_out}),
                               rtol=1e-9, atol=1e-12)
    assert not np.allclose(got, relevance(model, x, 1, {"dense": rule, "conv": rule}).numpy(), rtol=1e-3)  # the default differs


def test_relevance_hands_the_input_range_to_the_first_layers_zbox(rng):
    model = dense_model("float64")
    x = inputs_for(model, rng) * 3.0 - 1.0  # in [-1, 2], outside the default range
    composite = {"first": "zbox", "dense": "epsilon", "conv": "epsilon"}
    np.testing.assert_allclose(relevance(model, x, 2, composite, low=-1.0, high=2.0).numpy(),
                               numpy_lrp.relevance(model, x, 2, composite, low=-1.0, high=2.0), rtol=1e-9, atol=1e-12)


def test_an_explainer_moved_to_another_model_leaves_the_original_on_its_own(rng):
    model, other = dense_model("float32", seed=0), with_dtype(dense_model("float32", seed=1), "float64")
    lrp = LRP(model, "epsilon")
    moved = lrp.on(other)
    x = inputs_for(model, rng).astype("float64")
    r64, r32 = moved(x, 1).numpy(), lrp(x.astype("float32"), 1).numpy()
    assert (r64.dtype, r32.dtype) == (np.float64, np.float32)
    np.testing.assert_allclose(r64, numpy_lrp.relevance(other, x, 1, "epsilon"), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(r32, numpy_lrp.relevance(model, x, 1, "epsilon"), rtol=1e-4, atol=1e-6)


def test_nested_sequential_is_expanded(rng):
    inner = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu")])
    outer = keras.Sequential([keras.Input((6,)), inner, keras.layers.Dense(2)])
    x = inputs_for(outer, rng)
    np.testing.assert_allclose(forward(canonize(outer), tf.constant(x)).outputs, outer(x), rtol=1e-7)  # measured: equal


@pytest.mark.parametrize(
    "shape, window",
    [((2, 8, 8, 3), (2, 2)), ((2, 9, 7, 2), (3, 2)), ((3, 10, 4), (2,)), ((1, 6, 6, 1), (3, 3))],
)
def test_tiled_max_pooling_routes_like_its_gradient(shape, window, rng):
    """The argmax routing equals max pooling's own gradient (ties excluded by random inputs)."""
    from heatinv.lrp.max_pool import _route_to_winners
    from heatinv.lrp.rules import adjoint

    a = tf.constant(rng.normal(size=shape))
    pool = (lambda v: tf.nn.max_pool1d(v, window, window, "VALID")) if len(window) == 1 else (
        lambda v: tf.nn.max_pool2d(v, window, window, "VALID")
    )
    R = tf.constant(rng.normal(size=pool(a).shape))
    np.testing.assert_array_equal(_route_to_winners(a, R, window).numpy(), adjoint(pool, a, R).numpy())


def _augmentation_layer(cls):
    """An instance of a noise or augmentation layer class, with the least arguments it takes."""
    for kwargs in ({}, {"factor": 0.2}, {"rate": 0.1}, {"stddev": 0.1}, {"height_factor": 0.2, "width_factor": 0.2}):
        try:
            return cls(**kwargs)
        except (TypeError, ValueError):
            continue
    raise AssertionError(f"{cls.__name__}: no arguments found to build it")


def test_noise_and_augmentation_layers_vanish_as_in_inference(rng):
    """A model with RandomFlip (Keras's image tutorials put augmentation inside the model) had no LRP rule."""
    from heatinv.lrp.canonical import AUGMENTATION

    assert len(AUGMENTATION) >= 9  # GaussianNoise, GaussianDropout, AlphaDropout and Random{Flip,...} are in every Keras 3
    inputs = keras.Input((8, 8, 3))
    conv, dense = keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.Dense(3)
    plain = keras.Model(inputs, dense(keras.layers.Flatten()(conv(inputs))))
    x = rng.uniform(0, 1, (2, 8, 8, 3)).astype("float32")
    expected = relevance(plain, x, 1)
    for cls in AUGMENTATION:
        augmented = keras.Model(inputs, dense(keras.layers.Flatten()(conv(_augmentation_layer(cls)(inputs)))))
        # the premise, on this Keras: the layer is the identity in inference
        np.testing.assert_array_equal(augmented(x, training=False), plain(x), err_msg=cls.__name__)
        np.testing.assert_array_equal(relevance(augmented, x, 1), expected, err_msg=cls.__name__)


@pytest.mark.parametrize(("onednn", "form"), [(True, "depthwise"), (False, "taps"), (None, "taps")])
def test_single_channel_transpose_takes_the_form_for_tensorflows_kernels(onednn, form, monkeypatch):
    """The depthwise form under oneDNN's kernels, the taps form without them (or where TensorFlow cannot tell)."""
    import heatinv.lrp.one_channel as one_channel

    monkeypatch.setattr(one_channel, "onednn_enabled", lambda: onednn)
    called = []
    monkeypatch.setattr(one_channel, "transpose_by_depthwise", lambda *args: called.append("depthwise"))
    monkeypatch.setattr(one_channel, "transpose_by_taps", lambda *args: called.append("taps"))
    one_channel.single_channel_transpose(tf.zeros([1, 4, 4, 2]), tf.zeros([3, 3, 1, 2]), "SAME")
    assert called == [form]


def test_onednn_enabled_says_off_when_the_environment_turns_oneDNN_off():
    """The variable is read once, when TensorFlow loads: only a fresh process sees it."""
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
    said = subprocess.run([sys.executable, "-c", "from heatinv.onednn import onednn_enabled; print(onednn_enabled())"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert said.stdout.strip() == "False", said.stderr[-2000:]


def test_onednn_enabled_cannot_tell_on_a_tensorflow_without_the_flag(monkeypatch):
    from tensorflow.python.util import _pywrap_util_port

    from heatinv.onednn import onednn_enabled

    monkeypatch.delattr(_pywrap_util_port, "IsMklEnabled")
    assert onednn_enabled() is None
