"""LRP on layer graphs: skips, concatenation, depthwise blocks, gates, shared layers, nested models.

Checked against an independent NumPy reference (``numpy_graph.py``), hand-computed merge
rules, finite differences in float64, conservation, and equivalent models built another way.
"""

from __future__ import annotations

import contextlib
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import numpy_graph
from heatinv.lrp import LRP, UnsupportedLayerError, relevance
from heatinv.lrp.canonical import Merge, canonize
from heatinv.lrp import propagate
from heatinv.lrp.composites import resolve
from heatinv.lrp.propagate import carry_bounds, forward, logit_step, nonnegative_steps, rectified_steps
from heatinv.lrp.rules import concatenation_rule, known_zero, product_rule, sum_rule

L = keras.layers


@contextlib.contextmanager
def floatx(dtype: str):
    """Layers built inside get ``dtype``: Keras caches its global dtype policy on first use,
    so setting floatx alone is not enough once any model has been built in the process."""
    previous_floatx, previous_policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)
    try:
        yield
    finally:
        keras.config.set_floatx(previous_floatx)
        keras.config.set_dtype_policy(previous_policy)


def _finish(model: keras.Model, bias: bool, seed: int) -> keras.Model:
    """Non-trivial BatchNorm statistics and biases (none at all when ``bias`` is False)."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            n = layer.moving_mean.shape
            if layer.scale:
                layer.gamma.assign(rng.uniform(0.5, 1.5, n))
            if layer.center:
                layer.beta.assign(rng.normal(0, 0.2, n))
            # a folded BatchNorm's mean becomes a bias
            layer.moving_mean.assign(rng.normal(0, 0.2, n) if bias else np.zeros(n))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, n))
        elif getattr(layer, "use_bias", False):
            layer.bias.assign(rng.normal(0, 0.1, layer.bias.shape))
    return model


def residual(bias: bool = True, seed: int = 0) -> keras.Model:
    """Folded BN, an identity and a projection shortcut, and a BN after an Add (not foldable)."""
    keras.utils.set_random_seed(seed)
    x = inputs = keras.Input((8, 8, 2))
    x = L.ReLU()(L.BatchNormalization(center=bias)(L.Conv2D(4, 3, padding="same", use_bias=bias)(x)))
    y = L.BatchNormalization(center=bias)(L.Conv2D(4, 3, padding="same", use_bias=bias)(x))
    x = L.ReLU()(L.BatchNormalization(center=bias)(L.Add()([x, y])))
    shortcut = L.Conv2D(6, 1, strides=2, use_bias=bias)(x)
    y = L.Conv2D(6, 3, strides=2, padding="same", activation="relu", use_bias=bias)(x)
    x = L.GlobalAveragePooling2D()(L.Add()([shortcut, y]))
    return _finish(keras.Model(inputs, L.Dense(3, use_bias=bias)(x)), bias, seed)


def concatenation(bias: bool = True, seed: int = 0) -> keras.Model:
    """One tensor read by three layers: two convolutions and the concatenation itself."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 2))
    t = L.Conv2D(4, 1, activation="relu", use_bias=bias)(inputs)
    a = L.Conv2D(3, 3, padding="same", activation="relu", use_bias=bias)(t)
    b = L.Conv2D(2, 1, use_bias=bias)(t)
    x = L.Concatenate()([a, t, b])
    x = L.GlobalAveragePooling2D()(L.Conv2D(4, 1, activation="relu", use_bias=bias)(x))
    return _finish(keras.Model(inputs, L.Dense(3, use_bias=bias)(x)), bias, seed)


def mobilenet_block(bias: bool = True, seed: int = 0) -> keras.Model:
    """ZeroPadding2D, strided conv, ReLU6, DepthwiseConv2D, Add, all BatchNorms folded."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((9, 9, 3))
    x = L.ZeroPadding2D(((0, 1), (0, 1)))(inputs)
    x = L.ReLU(6.0)(L.BatchNormalization(center=bias)(L.Conv2D(8, 3, strides=2, use_bias=bias)(x)))
    y = L.ReLU(6.0)(L.BatchNormalization(center=bias)(L.DepthwiseConv2D(3, padding="same", use_bias=bias)(x)))
    y = L.BatchNormalization(center=bias)(L.Conv2D(8, 1, use_bias=bias)(y))
    x = L.GlobalAveragePooling2D()(L.Add()([x, y]))
    return _finish(keras.Model(inputs, L.Dense(3, use_bias=bias)(x)), bias, seed)


def squeeze_excite(bias: bool = True, seed: int = 0) -> keras.Model:
    """A squeeze-and-excitation gate: Multiply of a signal and a sigmoid of its pooled copy."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 3))
    x = L.Conv2D(4, 3, padding="same", activation="relu", use_bias=bias)(inputs)
    g = L.GlobalAveragePooling2D(keepdims=True)(x)
    g = L.Conv2D(2, 1, activation="relu", use_bias=bias)(g)
    g = L.Conv2D(4, 1, activation="sigmoid", use_bias=bias)(g)
    x = L.Multiply()([x, g])
    x = L.Flatten()(L.Conv2D(2, 1, activation="relu", use_bias=bias)(x))
    return _finish(keras.Model(inputs, L.Dense(3, use_bias=bias)(x)), bias, seed)


GRAPHS = {"residual": residual, "concatenation": concatenation, "mobilenet_block": mobilenet_block,
          "squeeze_excite": squeeze_excite}


def graph(name: str, dtype: str = "float64", bias: bool = True) -> keras.Model:
    with floatx(dtype):
        return GRAPHS[name](bias)


def inputs_for(model, rng, batch=2, low=0.0, high=1.0):
    return rng.uniform(low, high, size=(batch, *model.input_shape[1:]))


# --- merge rules by hand --------------------------------------------------------------------

X1, X2, R = [2.0, -1.0], [1.0, 3.0], [3.0, 4.0]


@pytest.mark.parametrize(
    "contributions, want",
    [
        # Add: z = [3, 2]; R_1 = [2 * 3/3, -1 * 4/2], R_2 = [1 * 3/3, 3 * 4/2]
        ((X1, X2), ([2.0, -2.0], [1.0, 6.0])),
        # Average: contributions x/2, z = [1.5, 1]; the same shares as Add
        (([1.0, -0.5], [0.5, 1.5]), ([2.0, -2.0], [1.0, 6.0])),
        # Subtract: contributions x1, -x2, z = [1, -4]; R_1 = [2 * 3, -1 * 4/-4], R_2 = [-1 * 3, -3 * 4/-4]
        ((X1, [-1.0, -3.0]), ([6.0, 1.0], [-3.0, 3.0])),
    ],
)
def test_sum_rule_by_hand(contributions, want):
    got = sum_rule([tf.constant(c, tf.float64) for c in contributions], tf.constant(R, tf.float64))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5)  # stab adds 1e-6 to |z| >= 1


def test_concatenation_rule_by_hand():
    a, b = tf.zeros([1, 2, 1]), tf.zeros([1, 2, 3])
    r = tf.constant([[[1.0, -2.0, 3.0, 4.0], [5.0, 6.0, -7.0, 8.0]]])
    got = concatenation_rule([a, b], r, axis=-1)
    np.testing.assert_array_equal(got[0].numpy(), [[[1.0], [5.0]]])
    np.testing.assert_array_equal(got[1].numpy(), [[[-2.0, 3.0, 4.0], [6.0, -7.0, 8.0]]])


def test_product_rule_by_hand():
    signal, gate = tf.constant([[[[-2.0, 3.0]]] * 2]), tf.constant([[[[0.2, 0.9]]]])  # gate broadcast over rows
    r = tf.constant([[[[1.0, -4.0]], [[2.0, 5.0]]]])
    to_signal, to_gate = product_rule([signal, gate], r, (False, True))
    np.testing.assert_array_equal(to_signal.numpy(), r.numpy())
    assert to_gate is None
    # no gate: half each; the broadcast operand sums its half over the rows it was spread on
    first, second = product_rule([signal, gate], r, (False, False))
    np.testing.assert_array_equal(first.numpy(), r.numpy() / 2)
    np.testing.assert_array_equal(second.numpy(), [[[[1.5, 0.5]]]])


# --- whole graphs ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("composite", ["epsilon", "epsilon_gamma_box", "epsilon_plus", "epsilon_alpha2_beta1"])
def test_engine_matches_numpy_reference(name, composite, rng):
    model = graph(name)
    x = inputs_for(model, rng, low=-1.0, high=2.0)
    got = relevance(model, x, [0, 2], composite, low=-1.0, high=2.0)
    want = numpy_graph.relevance(model, x, [0, 2], composite, low=-1.0, high=2.0)
    # float64 on both sides; measured agreement ~1e-14 relative
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-12 * np.abs(want).max())
    assert np.abs(want).max() > 0


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_forward_reproduces_the_model(name, rng):
    model = graph(name)
    x = inputs_for(model, rng)
    np.testing.assert_allclose(forward(canonize(model), tf.constant(x)).outputs, model(x), rtol=1e-10, atol=1e-12)


def _loss(lrp, x, target_map):
    return tf.reduce_sum(tf.square(lrp(x, [0, 2]) - target_map))


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("composite", ["epsilon_gamma_box", "epsilon_plus"])
def test_weight_and_input_gradients_match_finite_differences(name, composite, rng):
    model = graph(name)
    lrp = LRP(model, composite)
    x = tf.constant(inputs_for(model, rng))
    target_map = tf.constant(rng.normal(0, 0.05, x.shape))
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = _loss(lrp, x, target_map)
    grads = tape.gradient(loss, model.trainable_variables + [x])
    # The heatmap loss is strongly curved near small denominators (gradients up to 1e6 in the
    # residual graph, central differences with h = 1e-5 off by 4e-3 relative); h = 1e-7 was
    # measured within 5e-8 relative of the tape, and its rounding error is ~1e-7 absolute.
    h = 1e-7
    for variable, grad in zip(model.trainable_variables, grads):
        assert grad is not None, variable.path
        flat = variable.numpy().reshape(-1)
        for index in rng.choice(flat.size, size=min(2, flat.size), replace=False):
            original = flat[index]
            values = []
            for delta in (h, -h):
                flat[index] = original + delta
                variable.assign(flat.reshape(variable.shape))
                values.append(float(_loss(lrp, x, target_map)))
            flat[index] = original
            variable.assign(flat.reshape(variable.shape))
            assert grad.numpy().reshape(-1)[index] == pytest.approx((values[0] - values[1]) / (2 * h), rel=1e-5, abs=1e-6), (
                variable.path
            )
    direction = rng.normal(size=x.shape)
    plus, minus = float(_loss(lrp, x + h * direction, target_map)), float(_loss(lrp, x - h * direction, target_map))
    assert float(tf.reduce_sum(grads[-1] * direction)) == pytest.approx((plus - minus) / (2 * h), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_eager_function_and_xla_agree(name, rng):
    model = graph(name)
    lrp = LRP(model, "epsilon_gamma_box")
    target_map = tf.constant(rng.normal(0, 0.05, (2, *model.input_shape[1:])))

    def step(x):
        with tf.GradientTape() as tape:
            loss = _loss(lrp, x, target_map)
        return [lrp(x, [0, 2]), *tape.gradient(loss, model.trainable_variables)]

    x = tf.constant(inputs_for(model, rng))
    eager, graph_mode, xla = step(x), tf.function(step)(x), tf.function(step, jit_compile=True)(x)
    for a, b, c in zip(eager, graph_mode, xla):
        scale = float(np.abs(a.numpy()).max())
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-9, atol=1e-10 * scale)
        np.testing.assert_allclose(c.numpy(), a.numpy(), rtol=1e-9, atol=1e-10 * scale)


@pytest.mark.parametrize(
    "name, composite",
    [*[(name, "epsilon_gamma_box") for name in sorted(GRAPHS)], ("residual", "epsilon_alpha2_beta1"),
     ("residual", {"first": None, "dense": "epsilon", "conv": "gamma"})],
    ids=[*[f"{name}-epsilon_gamma_box" for name in sorted(GRAPHS)], "residual-epsilon_alpha2_beta1", "residual-gamma_on_the_input"],
)
def test_recompute_gives_the_same_heatmap_and_gradients(name, composite, rng):
    model = graph(name)
    kept, recomputed = LRP(model, composite), LRP(model, composite, recompute=True)
    target_map = tf.constant(rng.normal(0, 0.05, (2, *model.input_shape[1:])))

    def step(lrp, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = _loss(lrp, x, target_map)
        return [lrp(x, [0, 2]), *tape.gradient(loss, model.trainable_variables + [x])]

    # the signed batch takes the sign check's other branch on the first layer
    for x in (tf.constant(inputs_for(model, rng)), tf.constant(inputs_for(model, rng, low=-1.0))):
        want = step(kept, x)
        modes = ({}, {"jit_compile": False}, {"jit_compile": True}) if composite == "epsilon_gamma_box" and name == "residual" else ({}, {})
        for mode in modes:
            got = step(recomputed, x) if mode is modes[0] else tf.function(step, **mode)(recomputed, x)
            for a, b, variable in zip(want, got, ["heatmap", *[v.path for v in model.trainable_variables], "input"]):
                scale = float(np.abs(a.numpy()).max())
                np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-9, atol=1e-10 * scale, err_msg=f"{variable} {mode}")


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_conservation_without_biases(name, rng):
    """Without biases LRP-0 and every merge rule conserve: the heatmap sums to the logit.

    Only the stabilizers leak, about ``1e-6 / |z|`` at each sum and pooling; inputs in
    [0, 1000] make the ``|z|`` large. Measured leak: at most 1.5e-6 relative (ReLU6 caps
    some ``z`` in the MobileNet block), up to 1e-4 with inputs in [0, 1]. (z+ is left out:
    it loses the relevance of units whose positive contributions are all zero.)
    """
    model = graph(name, bias=False)
    x = tf.constant(inputs_for(model, rng, high=1000.0))
    explanation = LRP(model, "zero").explain(x, [0, 2])
    np.testing.assert_allclose(
        tf.reduce_sum(explanation.relevance, axis=[1, 2, 3]).numpy(), explanation.start.numpy(), rtol=1e-5
    )


def test_float32_heatmap_follows_float64(rng):
    model = graph("mobilenet_block", "float32")
    x = inputs_for(model, rng)
    r32 = relevance(model, x.astype("float32"), 0).numpy()
    r64 = relevance(model, x, 0).numpy()
    assert r32.dtype == np.float32
    # float32 rounding amplified by 1/z; measured ~1e-5 relative to the largest entry
    np.testing.assert_allclose(r32, r64, atol=1e-3 * np.abs(r64).max())


# --- graph structure: shared layers, nested models, gates, bounds ---------------------------


def test_a_layer_called_twice_equals_two_layers_with_its_weights(rng):
    with floatx("float64"):
        keras.utils.set_random_seed(1)
        shared = L.Dense(4, activation="relu")
        inputs = keras.Input((5,))
        a = L.Dense(4, activation="relu")(inputs)
        model = keras.Model(inputs, L.Dense(2)(L.Add()([shared(a), shared(shared(a))])))
        first, second, third = L.Dense(4, activation="relu"), L.Dense(4, activation="relu"), L.Dense(4, activation="relu")
        head = L.Dense(2)
        b = model.layers[1](inputs)
        twin = keras.Model(inputs, head(L.Add()([first(b), third(second(b))])))
    for layer in (first, second, third):
        layer.set_weights(shared.get_weights())
    head.set_weights(model.layers[-1].get_weights())
    x = rng.normal(size=(3, 5))
    for composite in ("epsilon", "epsilon_gamma_box"):
        np.testing.assert_allclose(relevance(model, x, 1, composite, low=-3, high=3).numpy(),
                                   relevance(twin, x, 1, composite, low=-3, high=3).numpy(), rtol=1e-12)


def test_a_max_pooling_called_twice_on_other_sizes_routes_each_call_by_its_own_input(rng):
    """The layer's first call tiles its 8x8 input, the second (5x5, "same") does not: under XLA
    each call is routed by its own input's shape, as in eager (it read the first call's shape)."""
    keras.utils.set_random_seed(4)
    pool, inputs = L.MaxPooling2D(2, padding="same"), keras.Input((8, 8, 3))
    tiled = pool(L.Conv2D(4, 3, padding="same", activation="relu")(inputs))
    padded = pool(L.Conv2D(4, 4, activation="relu")(inputs))
    model = keras.Model(inputs, L.Dense(3)(L.Concatenate()([L.Flatten()(tiled), L.Flatten()(padded)])))
    lrp, x = LRP(model, "epsilon"), tf.constant(rng.uniform(size=(2, 8, 8, 3)).astype("float32"))
    eager = lrp(x, 1)
    xla = tf.function(lambda v: lrp(v, 1), jit_compile=True)(x)
    np.testing.assert_allclose(xla.numpy(), eager.numpy(), atol=1e-6 * float(tf.reduce_max(tf.abs(eager))))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_model_of_any_input_size_with_max_pooling_is_explained_in_a_trace_of_any_size(jit_compile, rng):
    """A ``[None, None, None, 3]`` signature: the routings take the spatial sizes from the tensor."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential([
        keras.Input((None, None, 3)), L.Conv2D(4, 3, padding="same", activation="relu"), L.MaxPooling2D(2),
        L.Conv2D(4, 3, activation="relu"), L.GlobalAveragePooling2D(), L.Dense(3),
    ])
    lrp = LRP(model, "epsilon")
    traced = tf.function(lambda v: lrp(v, 1), input_signature=[tf.TensorSpec([None, None, None, 3])], jit_compile=jit_compile)
    for size in (16, 11):  # 11: the pooling crops a row and a column
        x = tf.constant(rng.uniform(size=(2, size, size, 3)).astype("float32"))
        eager = lrp(x, 1)
        np.testing.assert_allclose(traced(x).numpy(), eager.numpy(), atol=1e-6 * float(tf.reduce_max(tf.abs(eager))))


def test_nested_functional_model_equals_the_flat_model(rng):
    flat = graph("residual")
    inner = keras.Model(flat.inputs, flat.layers[-2].output)  # everything but the Dense head
    outer_input = keras.Input(flat.input_shape[1:])
    nested = keras.Model(outer_input, flat.layers[-1](inner(outer_input)))
    x = inputs_for(flat, rng)
    np.testing.assert_array_equal(relevance(nested, x, 1).numpy(), relevance(flat, x, 1).numpy())


@pytest.mark.parametrize("inner_kind", ["functional", "sequential"])
def test_a_nested_model_after_a_layer_reads_that_layers_output(inner_kind, rng):
    """The flat chain of the same weights, by the NumPy reference: the inner model's first layer reads the outer Dense."""
    with floatx("float64"):
        keras.utils.set_random_seed(6)
        if inner_kind == "functional":
            inner_input = keras.Input((8,))
            inner = keras.Model(inner_input, L.Dense(4, activation="relu")(L.Dense(5, activation="relu")(inner_input)))
        else:
            inner = keras.Sequential([keras.Input((8,)), L.Dense(5, activation="relu"), L.Dense(4, activation="relu")])
        outer_input = keras.Input((6,))
        nested = keras.Model(outer_input, L.Dense(3)(inner(L.Dense(8, activation="relu")(outer_input))))
        flat = keras.Sequential([keras.Input((6,)), L.Dense(8, activation="relu"), L.Dense(5, activation="relu"),
                                 L.Dense(4, activation="relu"), L.Dense(3)])
    flat.set_weights([w + rng.normal(0, 0.1, w.shape) for w in nested.get_weights()])  # non-zero biases
    nested.set_weights(flat.get_weights())
    x = rng.uniform(size=(3, 6))
    for composite in ("epsilon", "epsilon_gamma_box"):
        np.testing.assert_allclose(relevance(nested, x, [0, 1, 2], composite).numpy(),
                                   numpy_graph.relevance(flat, x, [0, 1, 2], composite), rtol=1e-9, atol=1e-12)


def test_squeeze_excite_sigmoid_is_a_gate_and_gets_no_relevance():
    merge = next(step for step in canonize(graph("squeeze_excite")) if isinstance(step, Merge))
    assert merge.gates == (False, True)


def test_hard_sigmoid_written_with_keras_ops_is_a_gate(rng):
    """MobileNetV3 writes ``relu6(x + 3) / 6`` with Keras ops; it gates like a sigmoid."""
    with floatx("float64"):
        keras.utils.set_random_seed(2)
        inputs = keras.Input((4, 4, 2))
        x = L.Conv2D(3, 1, use_bias=False)(inputs)
        gate = L.ReLU(6.0)(x + 3.0) * (1.0 / 6.0)
        y = L.Multiply()([x, gate])
        model = keras.Model(inputs, L.Dense(2, use_bias=False)(L.Flatten()(y)))
    steps = canonize(model)
    assert next(step for step in steps if isinstance(step, Merge)).gates == (False, True)
    x = inputs_for(model, rng)
    np.testing.assert_allclose(forward(steps, tf.constant(x)).outputs, model(x), rtol=1e-12)
    explanation = LRP(model, "zero").explain(x, 0)  # signal takes all: nothing leaks into the gate
    np.testing.assert_allclose(tf.reduce_sum(explanation.relevance, axis=[1, 2, 3]), explanation.start, rtol=1e-9)


@pytest.mark.parametrize("kind", ["add", "subtract", "multiply"])
def test_a_merge_written_as_a_keras_op_is_its_layer(kind, rng):
    """``h1 - h2`` (or ``+``, ``*``) between two tensors: Keras's own output, and the heatmap of the merge layer."""
    written_as = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b}[kind]
    layer = {"add": L.Add, "subtract": L.Subtract, "multiply": L.Multiply}[kind]

    def build(merge) -> keras.Model:
        keras.utils.set_random_seed(5)
        inputs = keras.Input((5, 5, 2))
        h1 = L.Conv2D(3, 3, padding="same", activation="relu")(inputs)
        h2 = L.Conv2D(3, 1, activation="relu")(inputs)
        return keras.Model(inputs, L.Dense(2)(L.Flatten()(merge(h1, h2))))

    with floatx("float64"):
        written, layered = build(written_as), build(lambda a, b: layer()([a, b]))
    layered.set_weights(written.get_weights())
    steps = canonize(written)
    assert [step.kind for step in steps if isinstance(step, Merge) and step.arguments is not None] == [kind]
    x = inputs_for(written, rng)
    np.testing.assert_allclose(forward(steps, tf.constant(x)).outputs, written(x), rtol=1e-12)
    for composite in ("epsilon", "epsilon_gamma_box"):
        np.testing.assert_allclose(relevance(written, x, 0, composite), relevance(layered, x, 0, composite), rtol=1e-10)


@pytest.mark.parametrize("scale, offset", [(2.0, -1.0), (-2.0, 1.0)])
def test_zbox_bounds_are_carried_through_rescaling(scale, offset, rng):
    """Bounds in input space give the heatmap of the model that takes rescaled input directly."""
    with floatx("float64"):
        keras.utils.set_random_seed(3)
        inputs = keras.Input((5, 5, 2))
        conv, head = L.Conv2D(3, 3, activation="relu"), L.Dense(2)
        model = keras.Model(inputs, head(L.Flatten()(conv(L.Rescaling(scale, offset)(inputs)))))
        direct = keras.Model(inputs, head(L.Flatten()(conv(inputs))))
    x = inputs_for(model, rng)
    got = relevance(model, x, 1, "epsilon_gamma_box", low=0.0, high=1.0)
    want = relevance(direct, scale * x + offset, 1, "epsilon_gamma_box", low=min(offset, scale + offset),
                     high=max(offset, scale + offset))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)


def test_first_rule_goes_to_every_linear_layer_the_input_reaches(rng):
    """Two convolutions read the input (one after padding): both get the first rule."""
    with floatx("float64"):
        keras.utils.set_random_seed(4)
        inputs = keras.Input((4, 4, 1))
        padded = L.ZeroPadding2D(1)(inputs)
        x = L.Concatenate()([L.Conv2D(2, 3)(padded), L.Conv2D(2, 1, activation="relu")(inputs)])
        x = L.Conv2D(2, 1)(x)  # not a first layer: it reads the input through the others
        model = keras.Model(inputs, L.Dense(2)(L.Flatten()(x)))
    _finish(model, True, 4)
    x = inputs_for(model, rng)
    for composite in ({"first": "flat", "dense": "epsilon", "conv": "epsilon"}, "epsilon_gamma_box"):
        got = relevance(model, x, 0, composite, low=-1.0, high=2.0).numpy()
        np.testing.assert_allclose(got, numpy_graph.relevance(model, x, 0, composite, low=-1.0, high=2.0), rtol=1e-9)
        without_first = relevance(model, x, 0, {"dense": "epsilon", "conv": "epsilon" if "first" in composite else "gamma"})
        assert not np.allclose(got, without_first.numpy(), rtol=1e-3)


def test_batch_norm_after_an_activation_passes_relevance(rng):
    with floatx("float64"):
        keras.utils.set_random_seed(5)
        inputs = keras.Input((4,))
        model = keras.Model(inputs, L.Dense(2)(L.BatchNormalization()(L.Dense(3, activation="relu")(inputs))))
    _finish(model, True, 5)
    x = rng.normal(size=(2, 4))
    np.testing.assert_allclose(forward(canonize(model), tf.constant(x)).outputs, model(x), rtol=1e-12)
    assert np.all(np.isfinite(relevance(model, x, 0).numpy()))


# --- refusals -------------------------------------------------------------------------------


def test_group_normalization_is_refused_with_its_name_and_the_supported_list():
    inputs = keras.Input((4, 6))
    x = L.GroupNormalization(groups=2, name="gn")(L.Dense(6)(inputs))
    model = keras.Model(inputs, L.Dense(2)(L.Flatten()(x)))
    with pytest.raises(UnsupportedLayerError, match=r"'gn' of class GroupNormalization.*Supported layers: Dense"):
        relevance(model, np.ones((1, 4, 6), "float32"), 0)


def test_a_recurrent_layer_is_refused():
    inputs = keras.Input((4, 6))
    x = L.SimpleRNN(3, return_sequences=True, name="rnn")(inputs)
    model = keras.Model(inputs, L.Dense(2)(L.Flatten()(x)))
    with pytest.raises(UnsupportedLayerError, match=r"'rnn' of class SimpleRNN"):
        relevance(model, np.ones((1, 4, 6), "float32"), 0)


class _ShiftedConv(L.Conv2D):
    def call(self, x):
        return super().call(x) + 5.0


class _DoubledDense(L.Dense):
    def call(self, x):
        return 2.0 * super().call(x)


class _NamedDense(L.Dense):
    """A subclass that keeps Dense's call: explained as a Dense."""


@pytest.mark.parametrize("layer, parent", [(_ShiftedConv(4, 3, name="mine"), "Conv2D"), (_DoubledDense(4, name="mine"), "Dense")])
def test_a_subclass_of_a_supported_layer_with_its_own_call_is_refused(layer, parent):
    """It was explained as its parent: a model output of 6.26 gave a start of 0.07, silently."""
    inputs = keras.Input((6, 6, 3)) if parent == "Conv2D" else keras.Input((5,))
    x = layer(inputs)
    model = keras.Model(inputs, L.Dense(2)(L.Flatten()(x) if parent == "Conv2D" else x))
    with pytest.raises(UnsupportedLayerError, match=rf"'mine' of class {type(layer).__name__} extends {parent} but overrides call\(\)"):
        LRP(model)


def test_a_subclass_of_a_supported_layer_that_keeps_its_call_is_explained(rng):
    inputs = keras.Input((5,))
    model = keras.Model(inputs, L.Dense(2)(_NamedDense(4, activation="relu")(inputs)))
    x = rng.normal(size=(2, 5)).astype("float32")
    explanation = LRP(model, "zero").explain(x, 1)
    np.testing.assert_allclose(explanation.outputs.numpy(), model(x).numpy(), rtol=1e-6)


def test_unsupported_keras_op_is_refused():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, L.Dense(2)(keras.ops.exp(L.Dense(3)(inputs))))
    with pytest.raises(UnsupportedLayerError, match=r"Keras op .* of class Exp"):
        relevance(model, np.ones((1, 4), "float32"), 0)


@pytest.mark.parametrize(
    "op, layer",
    [(lambda x: keras.ops.concatenate([x, x], axis=-1), "keras.layers.Concatenate"), (keras.ops.relu, "Activation('relu')")],
)
def test_a_keras_op_with_a_layer_of_its_kind_names_that_layer(op, layer):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, L.Dense(2)(op(L.Dense(3)(inputs))))
    with pytest.raises(UnsupportedLayerError, match=re.escape(layer)):
        LRP(model)


def test_an_output_with_more_axes_than_batch_and_classes_is_refused():
    """A per-timestep Dense gives ``[batch, steps, classes]``: a target per example would select along the steps."""
    inputs = keras.Input((5, 6))
    model = keras.Model(inputs, L.Dense(3)(L.Dense(4, activation="relu")(inputs)))
    for batch in (2, 5):  # at batch 5 the one-hot broadcast along the 5 steps without an error
        with pytest.raises(UnsupportedLayerError, match=r"\[batch, classes\].* gives \(%d, 5, 3\)" % batch):
            relevance(model, np.ones((batch, 5, 6), "float32"), 0)


def test_pooling_after_the_last_convolution_is_refused_with_the_fix():
    inputs = keras.Input((6, 6, 1))
    model = keras.Model(inputs, L.GlobalAveragePooling2D(name="gap")(L.Conv2D(3, 1)(inputs)))
    with pytest.raises(UnsupportedLayerError, match=r"'gap' .*ends the model.*keras.layers.Dense\(classes\)"):
        LRP(model)


def test_two_inputs_are_refused():
    a, b = keras.Input((3,)), keras.Input((3,))
    model = keras.Model([a, b], L.Dense(2)(L.Add()([a, b])))
    with pytest.raises(UnsupportedLayerError, match="2 inputs and 1 output;"):
        LRP(model)


def test_two_outputs_are_refused_with_the_fix():
    inputs = keras.Input((3,))
    h = L.Dense(4)(inputs)
    model = keras.Model(inputs, [L.Dense(2)(h), L.Dense(3)(h)])
    with pytest.raises(UnsupportedLayerError, match=r"1 input and 2 outputs;.*keras.Model\(model.inputs, model.outputs\[k\]\)"):
        LRP(model)


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__(name="mine")
        self.head = L.Dense(3)

    def call(self, x):
        return self.head(x)


def test_a_subclassed_model_is_refused_with_the_fix():
    model = _Subclassed()
    model(np.ones((1, 6), "float32"))
    with pytest.raises(UnsupportedLayerError, match=r"Model 'mine' is a subclassed keras.Model.*keras.Sequential or with the functional API"):
        relevance(model, np.ones((1, 6), "float32"), 0)


def test_a_model_not_built_is_refused_with_the_fix():
    model = keras.Sequential([L.Dense(3)], name="unbuilt")
    with pytest.raises(ValueError, match=r"Model 'unbuilt' is not built; call it on a batch or give it an Input"):
        relevance(model, np.ones((1, 6), "float32"), 0)


def test_a_layer_instead_of_a_model_is_refused():
    with pytest.raises(TypeError, match="Expected a Keras model, got Dense"):
        relevance(L.Dense(3), np.ones((1, 6), "float32"), 0)


def test_an_op_with_two_outputs_is_refused():
    inputs = keras.Input((6,))
    left, right = keras.ops.split(L.Dense(4)(inputs), 2, axis=-1)
    model = keras.Model(inputs, L.Dense(2)(L.Add()([left, right])))
    with pytest.raises(UnsupportedLayerError, match=r"has 2 outputs; heatinv explains layers and ops with one output"):
        relevance(model, np.ones((1, 6), "float32"), 0)


def test_a_nested_model_of_two_inputs_and_outputs_is_expanded_like_its_layers():
    """A nested functional model may take and give several tensors (keras-hub's backbones do): the
    heatmap equals that of the same layers written flat, with the same weights."""
    a, b = keras.Input((4,)), keras.Input((4,))
    pair = keras.Model([a, b], {"sum": L.Add()([a, b]), "scaled": L.Dense(4, name="scale")(b)}, name="pair")
    inputs = keras.Input((6,))
    first, second = L.Dense(4, name="first")(inputs), L.Dense(4, name="second")(inputs)
    out = pair([first, second])
    model = keras.Model(inputs, L.Dense(2, name="head")(L.Concatenate()([out["sum"], out["scaled"]])))
    flat_first, flat_second = L.Dense(4)(inputs), L.Dense(4)(inputs)
    flat_out = L.Concatenate()([L.Add()([flat_first, flat_second]), L.Dense(4)(flat_second)])
    flat = keras.Model(inputs, L.Dense(2)(flat_out))
    names = ["first", "second", "scale", "head"]
    for name, layer in zip(names, [l for l in flat.layers if isinstance(l, L.Dense)]):
        source = model.get_layer(name) if name != "scale" else pair.get_layer("scale")
        layer.set_weights(source.get_weights())
    x = np.random.default_rng(0).normal(size=(2, 6)).astype("float32")
    np.testing.assert_allclose(flat(x), model(x), rtol=1e-6)
    np.testing.assert_allclose(relevance(model, x, [0, 1], "epsilon"), relevance(flat, x, [0, 1], "epsilon"), rtol=1e-5, atol=1e-7)


def test_doctor_reads_the_graph_and_finds_dead_units_in_a_branch(rng):
    from heatinv.doctor import SaliencyObjective, diagnose

    keras.utils.set_random_seed(6)
    inputs = keras.Input((6, 6, 1))
    x = L.Conv2D(3, 3, padding="same", activation="relu")(inputs)
    dead = L.Conv2D(3, 3, padding="same", name="dead")
    y = L.Add()([x, L.ReLU()(dead(x))])
    model = keras.Model(inputs, L.Dense(4)(L.Flatten()(y)))
    x = rng.uniform(size=(3, 6, 6, 1)).astype("float32")
    assert not [f for f in diagnose(model, x, 1, SaliencyObjective()) if f.code == "dead-units"]
    dead.bias.assign(-100 * np.ones(3))  # the ReLU after it, its only reader, is now always off
    findings = [f for f in diagnose(model, x, 1, SaliencyObjective()) if f.code == "dead-units"]
    assert [f.layer for f in findings] == ["dead"]


@pytest.mark.slow
def test_trainer_runs_a_graph_model_file(composed, tmp_path):
    """``model=file`` with a residual, concatenating model: the trainer needs nothing else."""
    import math

    from heatinv.train import run

    keras.utils.set_random_seed(7)
    inputs = keras.Input((28, 28, 1))
    x = L.Conv2D(4, 3, strides=2, activation="relu")(inputs)
    y = L.BatchNormalization()(L.Conv2D(4, 3, padding="same")(x))
    x = L.Concatenate()([L.Add()([x, y]), x])
    model = keras.Model(inputs, L.Dense(10)(L.GlobalAveragePooling2D()(x)))
    path = tmp_path / "graph.keras"
    model.save(path)
    cfg, out = composed("model=file", f"model.path={path}", "trainer.steps=2", "trainer.log_every=1",
                        "model.reference_epochs=1")
    metrics = run(cfg)
    assert metrics["steps"] == 2 and math.isfinite(metrics["loss"]) and math.isfinite(metrics["cosine"])
    student = keras.saving.load_model(out / "student.keras", safe_mode=True)
    assert any(isinstance(layer, L.Add) for layer in student.layers)


# --- the other layers: each linear map's transpose is its adjoint, and the model is reproduced ---


def zoo_2d(bias: bool = True) -> keras.Model:
    keras.utils.set_random_seed(8)
    inputs = keras.Input((11, 11, 4))
    # dilated: the depthwise half's transposed map must dilate its kernel too (same shapes either way)
    x = L.SeparableConv2D(6, 3, depth_multiplier=2, dilation_rate=2, padding="same", activation="relu", use_bias=bias)(inputs)
    x = L.Conv2D(6, 3, groups=3, dilation_rate=2, activation="elu", use_bias=bias)(x)
    x = L.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2, use_bias=bias)(x)
    x = L.Cropping2D(((1, 0), (0, 1)))(L.ReLU(max_value=4.0)(x))
    x = L.AveragePooling2D(3, strides=1, padding="same")(x)
    x = L.MaxPooling2D(2, strides=1)(L.SpatialDropout2D(0.5)(x))
    x = L.Permute((2, 1, 3))(L.Identity()(x))
    return keras.Model(inputs, L.Dense(3, use_bias=bias)(L.Flatten()(x)))


def zoo_1d(bias: bool = True) -> keras.Model:
    keras.utils.set_random_seed(9)
    inputs = keras.Input((12, 3))
    x = L.ZeroPadding1D((2, 1))(inputs)
    x = L.DepthwiseConv1D(3, strides=2, depth_multiplier=2, activation="swish", use_bias=bias)(x)
    x = L.SeparableConv1D(4, 3, dilation_rate=2, padding="same", activation="relu", use_bias=bias)(x)
    x = L.Conv1D(4, 2, groups=2, activation="gelu", use_bias=bias)(L.Cropping1D((1, 0))(x))
    x = L.MaxPooling1D(3, strides=2, padding="same")(x)
    return keras.Model(inputs, L.Dense(3, use_bias=bias)(L.GlobalAveragePooling1D()(x)))


ZOO = {"zoo_2d": zoo_2d, "zoo_1d": zoo_1d}


def zoo(name: str, bias: bool = True) -> keras.Model:
    with floatx("float64"):
        return _finish(ZOO[name](bias), bias, 8)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_linear_transpose_is_the_adjoint_of_its_map(name, rng):
    """``<W a, s> = <a, W^T s>`` for random ``a`` and ``s``: the transpose the rules use is exact."""
    from heatinv.lrp.canonical import Linear

    model = zoo(name)
    steps = canonize(model)
    fwd = forward(steps, tf.constant(inputs_for(model, rng)))
    linear = [i for i, step in enumerate(steps) if isinstance(step, Linear)]
    assert {steps[i].map for i in linear} == {"dense", "conv", "depthwise"}
    for i in linear:
        kernel, _ = fwd.params[i]
        a = tf.constant(rng.normal(size=fwd.inputs[i].shape))
        z = steps[i].affine(a, kernel, None)
        s = tf.constant(rng.normal(size=z.shape))
        np.testing.assert_allclose(float(tf.reduce_sum(z * s)), float(tf.reduce_sum(a * steps[i].transpose(s, kernel, a))),
                                   rtol=1e-12)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_forward_reproduces_the_model(name, rng):
    model = zoo(name)
    x = inputs_for(model, rng)
    np.testing.assert_allclose(forward(canonize(model), tf.constant(x)).outputs, model(x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_gradients_match_finite_differences(name, rng):
    model = zoo(name)
    lrp = LRP(model, "epsilon_gamma_box")
    x = tf.constant(inputs_for(model, rng))
    target_map = tf.constant(rng.normal(0, 0.05, x.shape))
    with tf.GradientTape() as tape:
        loss = _loss(lrp, x, target_map)
    grads = tape.gradient(loss, model.trainable_variables)
    h = 1e-7  # as in test_weight_and_input_gradients_match_finite_differences
    for variable, grad in zip(model.trainable_variables, grads):
        assert grad is not None, variable.path
        flat = variable.numpy().reshape(-1)
        index = int(rng.integers(flat.size))
        original, values = flat[index], []
        for delta in (h, -h):
            flat[index] = original + delta
            variable.assign(flat.reshape(variable.shape))
            values.append(float(_loss(lrp, x, target_map)))
        flat[index] = original
        variable.assign(flat.reshape(variable.shape))
        assert grad.numpy().reshape(-1)[index] == pytest.approx((values[0] - values[1]) / (2 * h), rel=1e-5, abs=1e-6), (
            variable.path
        )


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_conserves_without_biases(name, rng):
    """LRP-0, the norm rule of average pooling and max pooling's routing conserve relevance."""
    model = zoo(name, bias=False)
    x = tf.constant(inputs_for(model, rng, high=1000.0))  # see test_conservation_without_biases
    explanation = LRP(model, "zero").explain(x, [0, 2])
    axes = list(range(1, x.shape.rank))
    np.testing.assert_allclose(tf.reduce_sum(explanation.relevance, axis=axes).numpy(), explanation.start.numpy(), rtol=1e-5)


def test_nonnegative_steps_by_hand():
    """Which layer inputs the sign-split rules may treat as ``>= 0``, worked out by hand."""
    inputs = keras.Input((8, 8, 2))
    relu_conv = L.Conv2D(3, 3, padding="same", activation="relu", name="relu_conv")(inputs)
    pooled = L.MaxPooling2D(2, name="pool")(relu_conv)  # pooling of a ReLU output: >= 0
    linear = L.Conv2D(3, 1, name="linear")(pooled)  # no activation: signed
    leaky = L.LeakyReLU(0.1, name="leaky")(linear)  # negative slope: signed
    relu6 = L.ReLU(6.0, name="relu6")(linear)
    added = L.Add(name="add")([pooled, relu6])  # sum of two >= 0 tensors
    subtracted = L.Subtract(name="subtract")([pooled, relu6])  # difference: signed
    concatenated = L.Concatenate(name="concat")([added, leaky])  # one signed operand: signed
    merged = L.Concatenate(name="merged")([concatenated, subtracted])
    outputs = L.Dense(2, name="out")(L.Flatten(name="flatten")(merged))
    steps = canonize(keras.Model(inputs, outputs))
    names = {steps[i].name for i in nonnegative_steps(steps)}
    assert names == {"relu_conv", "pool", "relu6", "add"}


def test_rectified_steps_by_hand():
    """Which layers get no relevance where ``z <= 0`` (gamma skips its ``z < 0`` terms), worked out by hand."""
    inputs = keras.Input((8, 8, 2))
    first = L.Conv2D(3, 3, padding="same", activation="relu", name="first")(inputs)
    pooled = L.MaxPooling2D(2, name="pool")(first)  # routes to the input holding the output's value
    folded = L.ReLU(name="folded_relu")(L.BatchNormalization(name="bn")(L.Conv2D(3, 1, name="folded")(pooled)))
    linear = L.Conv2D(3, 1, name="linear")(pooled)  # no ReLU: z < 0 outputs carry relevance
    after_add = L.ReLU(name="relu_after_add")(L.Add(name="add")([linear, folded]))  # the ReLU is the sum's, not linear's
    shared = L.Conv2D(3, 1, name="shared")(pooled)  # read by a ReLU and by a layer that is not one
    leaky = L.LeakyReLU(0.1, name="leaky")(L.Conv2D(3, 1, activation="relu", name="under_leaky")(pooled))
    gated = L.Conv2D(3, 1, activation="relu", name="gated")(pooled)  # its relevance is the product's, unscaled
    gate = L.Conv2D(3, 1, activation="sigmoid", name="gate")(pooled)
    merged = L.Concatenate(name="concat")(
        [after_add, L.ReLU(name="shared_relu")(shared), shared, leaky, L.Multiply(name="times")([gated, gate])]
    )
    outputs = L.Dense(2, name="out")(L.Flatten(name="flatten")(merged))
    steps = canonize(keras.Model(inputs, outputs))
    rectified = lambda composite: {steps[i].name for i in rectified_steps(steps, resolve(composite), logit_step(steps))}
    assert rectified("epsilon_gamma_box") == {"first", "folded"}
    # flat does not scale by its input: the layers reading the pooling hand relevance to zeros
    assert rectified({"dense": "epsilon", "conv": "flat"}) == {"folded"}


def input_beside_a_relu() -> keras.Model:
    """A ReLU output concatenated with the model input: the layer reading both gets z^B, which
    hands zeros relevance (its bound terms), so the ReLU's convolution must not skip anything."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 1))
    first = L.Conv2D(2, 3, padding="same", name="first")(inputs)
    relu = L.Conv2D(2, 3, padding="same", activation="relu", name="relu")(first)
    mixed = L.Conv2D(2, 1, name="mixed")(L.Concatenate()([inputs, relu]))  # reached by the input: z^B
    return _finish(keras.Model(inputs, L.Dense(2)(L.Flatten()(mixed))), True, 0)


def test_a_relu_read_through_a_zbox_layer_is_not_rectified():
    with floatx("float64"):
        steps = canonize(input_beside_a_relu())
    assert {steps[i].name for i in rectified_steps(steps, resolve("epsilon_gamma_box"), logit_step(steps))} == set()
    # with epsilon on that layer instead, the ReLU's zeros get no relevance
    rectified = rectified_steps(steps, resolve({"first": "epsilon", "dense": "epsilon", "conv": "gamma"}), logit_step(steps))
    assert {steps[i].name for i in rectified} == {"relu"}


@pytest.mark.parametrize("name", [*sorted(GRAPHS), "input_beside_a_relu"])
def test_skipping_the_rectified_terms_changes_neither_heatmap_nor_gradients(name, rng, monkeypatch):
    """gamma with and without its ``z < 0`` terms behind a ReLU: the same map and weight gradients (float64).

    The ReLU layer of ``input_beside_a_relu`` must not skip them: with the analysis forced to
    return it, this test fails there.
    """
    with floatx("float64"):
        model = input_beside_a_relu() if name == "input_beside_a_relu" else GRAPHS[name](True)
    x = tf.constant(inputs_for(model, rng))
    target_map = tf.constant(rng.normal(0, 0.05, x.shape))
    steps = canonize(model)
    if name in GRAPHS:
        assert rectified_steps(steps, resolve("epsilon_gamma_box"), logit_step(steps))  # something is skipped here

    def map_and_gradients():
        lrp = LRP(model, "epsilon_gamma_box")
        with tf.GradientTape() as tape:
            heatmap = lrp(x, [0, model.outputs[0].shape[-1] - 1])  # the first and the last class
            loss = tf.reduce_sum(tf.square(heatmap - target_map))
        return [heatmap, *tape.gradient(loss, model.trainable_variables)]

    skipped = map_and_gradients()
    monkeypatch.setattr(propagate, "rectified_steps", lambda *args: set())
    full = map_and_gradients()
    for got, want in zip(skipped, full):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-13 * float(tf.reduce_max(tf.abs(want))))


def test_a_zero_bound_reaches_the_first_layers_as_a_number(rng):
    """``low = 0`` passes padding as the number 0 (zbox skips its term); rescaling makes it a tensor.

    The heatmaps with the term skipped are checked against the NumPy reference and Zennit
    (``epsilon_gamma_box`` with its default ``low = 0``); this checks the skip is seen at all.
    """
    inputs = keras.Input((4, 4, 1))
    padded = L.Conv2D(2, 3, name="after_padding")(L.ZeroPadding2D(1)(inputs))
    rescaled = L.Conv2D(2, 3, padding="same", name="after_rescaling")(L.Rescaling(2.0, -1.0)(inputs))
    model = keras.Model(inputs, L.Dense(2)(L.Flatten()(L.Concatenate()([padded, rescaled]))))
    steps = canonize(model)
    x = tf.constant(rng.uniform(size=(2, 4, 4, 1)), tf.float32)
    bounds = {steps[i].name: box for i, box in carry_bounds(steps, x, 0.0, 1.0).items()}
    low, high = bounds["after_padding"]
    assert known_zero(low) and low == 0.0
    assert tf.is_tensor(high) and high.shape == (1, 6, 6, 1) and float(tf.reduce_max(high)) == 1.0
    low, high = bounds["after_rescaling"]  # 2 * 0 - 1: no longer zero
    assert tf.is_tensor(low) and float(tf.reduce_max(low)) == -1.0
    low, high = {steps[i].name: box for i, box in carry_bounds(steps, x, 0.5, 1.0).items()}["after_padding"]
    assert tf.is_tensor(low) and not known_zero(low)
