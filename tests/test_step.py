"""The inverse step: eager, graph and XLA agree; N steps per call equal N calls; no retraces."""

from __future__ import annotations

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import conv_model, dense_model, inputs_for
from heatinv.losses import HeatmapMatch, heatmap_loss
from heatinv.lrp import LRP
from heatinv.step import (
    XLA_MAX_CONV_WEIGHTS,
    XLA_MIN_UPDATES,
    apply_gradients,
    auto_mode,
    compile_step,
    fused_kind,
    gradient_stats,
    schedule,
    train_step,
)


def _problem(kind: str, rng, dtype: str = "float64", batch: int = 3):
    """A model, its input batch, labels and a target map from another model's heatmap."""
    make = dense_model if kind == "dense" else (lambda d, seed: conv_model(d, seed, pool="average"))
    model, other = make(dtype, 0), make(dtype, 1)
    x = tf.constant(inputs_for(model, rng, batch))
    label = tf.constant(np.arange(batch) % 3, tf.int32)
    target = LRP(other, "epsilon_gamma_box")(x, label)
    return model, x, label, target


def _copy(model: keras.Model) -> keras.Model:
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    return clone


def _step(model, mode="function", n=1, optimizer=None, composite="epsilon_gamma_box"):
    optimizer = optimizer or keras.optimizers.Adam(1e-2)
    return compile_step(model, LRP(model, composite), HeatmapMatch(heatmap_loss("mse")), optimizer, mode, n), optimizer


def _weights(model):
    return [v.numpy() for v in model.trainable_variables]


@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_eager_function_and_xla_agree_on_one_step(kind, rng):
    model, x, label, target = _problem(kind, rng)
    results, weights = {}, {}
    for mode in ("eager", "function", "xla"):
        copy = _copy(model)
        step, _ = _step(copy, mode)
        results[mode] = step(x, label, target)
        weights[mode] = _weights(copy)
    eager = results["eager"]
    scale = max(float(np.abs(g.numpy()).max()) for g in eager["gradients"])
    assert scale > 0 and float(eager["loss"]) > 0
    for mode in ("function", "xla"):
        got = results[mode]
        np.testing.assert_allclose(float(got["loss"]), float(eager["loss"]), rtol=1e-6)  # a float32 cast of a float64 loss
        np.testing.assert_allclose(got["heatmap"].numpy(), eager["heatmap"].numpy(), rtol=1e-10, atol=1e-14)
        for a, b in zip(eager["gradients"], got["gradients"]):
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-9, atol=1e-11 * scale)
        for a, b in zip(weights["eager"], weights[mode]):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(got["grad_norms"].numpy(), eager["grad_norms"].numpy(), rtol=1e-6)
        np.testing.assert_array_equal(got["zero_fractions"].numpy(), eager["zero_fractions"].numpy())


def test_compiled_result_has_train_steps_keys_and_values(rng):
    model, x, label, target = _problem("dense", rng)
    copy = _copy(model)
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(copy.trainable_variables)
    plain = train_step(copy, LRP(copy, "epsilon_gamma_box"), HeatmapMatch(heatmap_loss("mse")), optimizer, x, label, target)
    step, _ = _step(_copy(model))
    result = step(x, label, target)
    assert set(result) == set(plain)
    assert len(result["gradients"]) == len(model.trainable_variables)
    for key in ("grad_norms", "zero_fractions"):
        np.testing.assert_allclose(result[key].numpy(), plain[key].numpy(), rtol=1e-6)
        assert result[key].shape == (len(model.trainable_variables),)


@pytest.mark.parametrize("mode", ["eager", "function", "xla", "xla_loop"])
def test_multi_step_equals_single_steps(mode, rng):
    """As Keras's test_steps_per_execution_steps_count: N updates per call == N calls of one."""
    n = 4
    model, x, label, target = _problem("dense", rng)
    single_model, multi_model = _copy(model), _copy(model)
    single, single_opt = _step(single_model, mode.replace("_loop", ""), 1)
    if mode == "xla_loop":
        multi_opt = keras.optimizers.Adam(1e-2)
        multi = compile_step(multi_model, LRP(multi_model, "epsilon_gamma_box"), HeatmapMatch(heatmap_loss("mse")), multi_opt, "xla", n, xla_loop=True)
    elif mode == "xla":  # the graph loop around the XLA update (the default for convolutional models)
        multi_opt = keras.optimizers.Adam(1e-2)
        multi = compile_step(multi_model, LRP(multi_model, "epsilon_gamma_box"), HeatmapMatch(heatmap_loss("mse")), multi_opt, "xla", n, xla_loop=False)
    else:
        multi, multi_opt = _step(multi_model, mode, n)
    singles = [single(x, label, target) for _ in range(n)]
    result = multi(x, label, target)
    if mode == "xla_loop":  # finite updates: the unguarded loop's call stands, nothing is redone
        assert multi._guarded.experimental_get_tracing_count() == 0
    assert int(single_opt.iterations.numpy()) == int(multi_opt.iterations.numpy()) == n
    for a, b in zip(_weights(single_model), _weights(multi_model)):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
    last = singles[-1]
    assert float(result["loss"]) == pytest.approx(float(last["loss"]), rel=1e-7)
    np.testing.assert_allclose(result["heatmap"].numpy(), last["heatmap"].numpy(), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(result["logits"].numpy(), last["logits"].numpy(), rtol=1e-10, atol=1e-14)
    for a, b in zip(last["gradients"], result["gradients"]):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(result["grad_norms"].numpy(), last["grad_norms"].numpy(), rtol=1e-6)
    # the optimizer's state too, so later steps stay equal
    for a, b in zip(single_opt.variables, multi_opt.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-12, atol=1e-14)


def test_multi_step_runs_any_count_without_retracing(rng):
    model, x, label, target = _problem("conv", rng, dtype="float32")
    step, optimizer = _step(model, "function", 5)
    counts = []
    for steps in (None, 1, 3, 5, 2):
        step(x, label, target, steps=steps)
        counts.append(int(optimizer.iterations.numpy()))
    assert counts == [5, 6, 9, 14, 16]
    # new values for every input: still the same trace
    step(x + 0.01, label, target * 1.5)
    assert step.function.experimental_get_tracing_count() == 1
    xla, _ = _step(_copy(model), "xla", 5)
    for steps in (None, 1, 3):
        xla(x + 0.01 * steps if steps else x, label, target, steps=steps)
    assert xla.function.experimental_get_tracing_count() == 1
    assert xla._update.experimental_get_tracing_count() == 1  # the XLA update the loop calls
    with pytest.raises(ValueError, match="positive"):
        step(x, label, target, steps=0)


def test_single_step_does_not_retrace(rng):
    model, x, label, target = _problem("dense", rng, dtype="float32")
    step, _ = _step(model, "function")
    for i in range(4):
        step(x + 0.01 * i, label, target * (1 + i))
    assert step.function.experimental_get_tracing_count() == 1


def test_xla_loop_is_chosen_for_dense_models_only(rng):
    dense, _, _, _ = _problem("dense", rng, dtype="float32")
    conv, _, _, _ = _problem("conv", rng, dtype="float32")
    assert _step(dense, "xla", 4)[0].xla_loop
    assert not _step(conv, "xla", 4)[0].xla_loop
    assert not _step(dense, "function", 4)[0].xla_loop and not _step(dense, "xla", 1)[0].xla_loop
    forced = compile_step(conv, LRP(conv), HeatmapMatch(heatmap_loss("mse")), keras.optimizers.Adam(), "xla", 4, xla_loop=True)
    assert forced.xla_loop


def test_loss_decreases_over_20_steps(rng):
    model, x, label, target = _problem("dense", rng, dtype="float32")
    step, _ = _step(model, "function", 5, optimizer=keras.optimizers.Adam(1e-2))
    first = float(step(x, label, target, steps=1)["loss"])
    losses = [float(step(x, label, target)["loss"]) for _ in range(4)]  # 20 more updates
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.5 * first, (first, losses)


def test_schedule_stops_at_every_log_step():
    calls = list(schedule(103, 10, log_every=25))
    assert sum(n for n, _, _ in calls) == 103
    logged = [done for _, done, log in calls if log]
    assert logged == [1, 25, 50, 75, 100, 103]
    assert all(1 <= n <= 10 for n, _, _ in calls)
    assert list(schedule(4, 1, log_every=2)) == [(1, 1, True), (1, 2, True), (1, 3, False), (1, 4, True)]
    assert list(schedule(0, 5, 5)) == []
    with pytest.raises(ValueError):
        list(schedule(5, 0, 5))


# --------------------------------------------------------------------------- the fused optimizer update


def _adam_reference(w, grads, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = m + (g - m) * (1 - beta_1)
        v = v + (g * g - v) * (1 - beta_2)
        alpha = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        w = w - m * alpha / (np.sqrt(v) + epsilon)
    return w


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
def test_fused_adam_is_adams_formula_in_float64(mode, rng):
    w = rng.normal(size=(5, 4))
    grads = [rng.normal(size=w.shape) for _ in range(6)]
    variable = keras.Variable(w, dtype="float64")
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build([variable])
    assert fused_kind(optimizer, [variable]) == "adam"
    apply = lambda g: apply_gradients(optimizer, [g], [variable])  # noqa: E731
    if mode != "eager":
        apply = tf.function(apply, jit_compile=mode == "xla")
    for g in grads:
        apply(tf.constant(g))
    lr = float(np.float32(0.01))  # Keras keeps the learning rate in a float32 variable
    np.testing.assert_allclose(variable.numpy(), _adam_reference(w, grads, lr), rtol=1e-13, atol=1e-15)
    assert int(optimizer.iterations.numpy()) == len(grads)


def _sgd_reference(w, grads, lr, momentum=0.0):
    """SGD as Keras defines it: ``m <- momentum * m - lr * g; w <- w + m`` (plain SGD: ``w <- w - lr * g``)."""
    m = np.zeros_like(w)
    for g in grads:
        m = momentum * m - lr * g
        w = w + m
    return w


@pytest.mark.parametrize(
    "make, reference",
    [
        (lambda: keras.optimizers.Adam(0.01), lambda w, gs: _adam_reference(w, gs, float(np.float32(0.01)))),
        (lambda: keras.optimizers.SGD(0.01), lambda w, gs: _sgd_reference(w, gs, float(np.float32(0.01)))),
        (lambda: keras.optimizers.SGD(0.01, momentum=0.9),
         lambda w, gs: _sgd_reference(w, gs, float(np.float32(0.01)), float(np.float32(0.9)))),
    ],
    ids=["adam", "sgd", "momentum"],
)
def test_fused_update_in_float32_is_the_optimizers_formula(make, reference, rng):
    """Five fused float32 updates against the formula written out in NumPy float64."""
    init = [rng.normal(size=(6, 4)).astype("float32"), rng.normal(size=(4,)).astype("float32")]
    variables = [keras.Variable(w) for w in init]
    optimizer = make()
    optimizer.build(variables)
    assert fused_kind(optimizer, variables) is not None
    grads = [[rng.normal(size=w.shape).astype("float32") for w in init] for _ in range(5)]
    for step_grads in grads:
        apply_gradients(optimizer, [tf.constant(g) for g in step_grads], variables)
    for i, (w, variable) in enumerate(zip(init, variables)):
        expected = reference(w.astype("float64"), [step_grads[i].astype("float64") for step_grads in grads])
        # Measured: at most 2.1e-7 absolute off the float64 formula (float32 rounding of
        # 5 updates of size ~1e-2 on weights of size ~1); a wrong formula is off by >= 1e-3.
        np.testing.assert_allclose(variable.numpy(), expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.Adam(0.01, clipnorm=1.0),
        lambda: keras.optimizers.Adam(0.01, amsgrad=True),
        lambda: keras.optimizers.AdamW(0.01),
        lambda: keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
        lambda: keras.optimizers.RMSprop(0.01),
    ],
    ids=["clipnorm", "amsgrad", "adamw", "nesterov", "rmsprop"],
)
def test_other_optimizers_go_through_keras(make, rng):
    init = rng.normal(size=(3, 2)).astype("float32")
    ours, theirs = keras.Variable(init), keras.Variable(init)
    ours_opt, theirs_opt = make(), make()
    ours_opt.build([ours])
    theirs_opt.build([theirs])
    assert fused_kind(ours_opt, [ours]) is None
    grad = tf.constant(rng.normal(size=init.shape).astype("float32"))
    apply_gradients(ours_opt, [grad], [ours])
    theirs_opt.apply_gradients([(grad, theirs)])
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def _applier(optimizer, variables, mode):
    def apply(gradients, skip):
        apply_gradients(optimizer, gradients, variables, skip=skip)

    return apply if mode == "eager" else tf.function(apply, jit_compile=mode == "xla")


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.Adam(0.01),
        lambda: keras.optimizers.SGD(0.01),
        lambda: keras.optimizers.SGD(0.01, momentum=0.9),
        lambda: keras.optimizers.RMSprop(0.01),
    ],
    ids=["adam", "sgd", "momentum", "rmsprop"],
)
def test_a_skipped_update_changes_nothing(make, mode, rng):
    """``skip``: weights, slots and iterations keep their values; the run goes on as if the step never was.

    Two copies get the same finite gradients; one also gets a NaN/Inf gradient with
    ``skip=True`` between them. The skipped update must change nothing, and after the
    next real update the two copies must be equal bit for bit.
    """
    init = [rng.normal(size=(6, 4)).astype("float32"), rng.normal(size=(4,)).astype("float32")]
    runs = []
    for _ in range(2):
        variables = [keras.Variable(w) for w in init]
        optimizer = make()
        optimizer.build(variables)
        runs.append((variables, optimizer, _applier(optimizer, variables, mode)))

    def state(variables, optimizer):
        return [v.numpy() for v in variables] + [v.numpy() for v in optimizer.variables]

    steps = [[tf.constant(rng.normal(size=w.shape).astype("float32")) for w in init] for _ in range(2)]
    # NaN everywhere in the kernel's gradient, Inf in two entries of the bias's
    poisoned = [tf.fill(init[0].shape, np.float32(np.nan)), tf.where(tf.range(4) < 2, np.float32(np.inf), steps[0][1])]
    for variables, optimizer, apply in runs:
        apply(steps[0], tf.constant(False))
    skipping_variables, skipping_optimizer, skipping_apply = runs[1]
    before = state(skipping_variables, skipping_optimizer)
    skipping_apply(poisoned, tf.constant(True))
    for kept, was in zip(state(skipping_variables, skipping_optimizer), before):
        np.testing.assert_array_equal(kept, was)
    for variables, optimizer, apply in runs:
        apply(steps[1], tf.constant(False))
    for a, b in zip(state(*runs[0][:2]), state(*runs[1][:2])):
        np.testing.assert_array_equal(a, b)
    assert int(runs[1][1].iterations.numpy()) == 2


def test_gradient_stats_counts_zeros():
    stats = gradient_stats([tf.constant([0.0, 3.0, 4.0, 0.0]), tf.zeros([2, 2])])
    np.testing.assert_allclose(stats["grad_norms"].numpy(), [5.0, 0.0])
    np.testing.assert_allclose(stats["zero_fractions"].numpy(), [0.5, 1.0])


# --------------------------------------------------------------------------- trainer.jit_compile=auto


def _merge_model(dtype: str = "float32") -> keras.Model:
    """A conv model with a residual Add: a graph with a merge."""
    inputs = keras.Input((8, 8, 2), dtype=dtype)
    h = keras.layers.Conv2D(2, 3, padding="same", activation="relu", dtype=dtype)(inputs)
    h = keras.layers.Add(dtype=dtype)([h, inputs])
    h = keras.layers.Flatten(dtype=dtype)(h)
    return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(h))


@pytest.fixture
def onednn(monkeypatch):
    """Sets what :func:`heatinv.onednn.onednn_enabled` reports: the rule must not depend on the test machine's CPU."""
    import heatinv.step

    def set_state(state):
        monkeypatch.setattr(heatinv.step, "onednn_enabled", lambda: state)

    return set_state


@pytest.mark.parametrize(
    ("kind", "batch", "steps_per_execution", "onednn_on", "expected"),
    [
        ("dense", 1, 1, False, "xla"),
        ("dense", 1, 25, False, "xla"),
        ("dense", 1, 25, True, "xla"),
        ("dense", 64, 25, True, "function"),
        ("conv", 1, 25, True, "xla"),
        ("conv", 1, 25, False, "function"),
        ("conv", 64, 25, True, "function"),
        ("merge", 1, 25, True, "function"),
    ],
)
def test_auto_picks_xla_by_the_models_graph_and_batch(kind, batch, steps_per_execution, onednn_on, expected, onednn):
    onednn(onednn_on)
    model = {"dense": dense_model, "conv": conv_model, "merge": lambda: _merge_model()}[kind]()
    mode, why = auto_mode(LRP(model), batch, steps_per_execution)
    assert mode == expected and why
    step = compile_step(model, LRP(model), HeatmapMatch(heatmap_loss("mse")), keras.optimizers.Adam(), "auto", steps_per_execution, batch=batch)
    assert step.mode == expected and step.why.startswith("trainer.jit_compile=auto: ")


@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_auto_leaves_a_short_run_without_xla(kind, onednn):
    """XLA's compiling is paid once: a run shorter than the bound is faster without it."""
    onednn(True)
    model = {"dense": dense_model, "conv": conv_model}[kind]()
    short, long_enough = auto_mode(LRP(model), 1, 25, XLA_MIN_UPDATES - 1), auto_mode(LRP(model), 1, 25, XLA_MIN_UPDATES)
    assert short[0] == "function" and f"{XLA_MIN_UPDATES - 1} updates, fewer than the {XLA_MIN_UPDATES}" in short[1]
    chain = {"dense": "a chain of layers", "conv": "a convolutional chain under oneDNN's kernels"}[kind]
    assert long_enough == auto_mode(LRP(model), 1, 25) == ("xla", f"batch 1, {chain}, 25 updates per call")
    step = compile_step(model, LRP(model), HeatmapMatch(heatmap_loss("mse")), keras.optimizers.Adam(), "auto", 25, batch=1, updates=300)
    assert step.mode == "function" and "300 updates, fewer than" in step.why


@pytest.mark.parametrize(("state", "named"), [(False, "TensorFlow's oneDNN kernels off"), (None, "oneDNN's state unknown")])
@pytest.mark.parametrize("layer", ["conv", "pool"])
def test_auto_leaves_convolutional_models_without_xla_where_onednn_is_off(layer, state, named, onednn):
    """Without oneDNN the cnn's graph step beat its XLA step at batch 1 (1.2-1.65x, AMD EPYC)."""
    onednn(state)
    inputs = keras.Input((8, 8, 2))
    h = keras.layers.Conv2D(3, 3, activation="relu")(inputs) if layer == "conv" else keras.layers.MaxPooling2D()(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(h)))
    assert auto_mode(LRP(model), 1, 25, updates=10 * XLA_MIN_UPDATES) == ("function", f"a convolutional model, {named}, 25 updates per call")


def test_auto_leaves_large_convolutional_chains_without_xla(onednn):
    onednn(True)
    inputs = keras.Input((8, 8, 2))
    h = keras.layers.Conv2D(1100, 3, activation="relu")(inputs)
    h = keras.layers.Conv2D(100, 3)(h)  # 1100 * 3 * 3 * 100 weights: over the bound
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(h)))
    assert model.count_params() > XLA_MAX_CONV_WEIGHTS
    mode, why = auto_mode(LRP(model), 1, 25)
    assert mode == "function" and f"{model.count_params()} weights" in why


@pytest.mark.parametrize(("setting", "expected"), [("1", True), ("0", False)])
def test_onednn_enabled_follows_tensorflows_setting(setting, expected):
    """``TF_ENABLE_ONEDNN_OPTS`` decides before TensorFlow is imported: a fresh process each."""
    code = "from heatinv.onednn import onednn_enabled; print(onednn_enabled())"
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "TF_CPP_MIN_LOG_LEVEL": "3"}
    printed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=300).stdout
    assert printed.strip().splitlines()[-1] == str(expected)


def test_auto_needs_the_batch():
    model = dense_model()
    with pytest.raises(ValueError, match="batch"):
        compile_step(model, LRP(model), HeatmapMatch(heatmap_loss("mse")), keras.optimizers.Adam(), "auto", 4)


class HostTerm(HeatmapMatch):
    """The heatmap loss plus a zero computed on the host (``tf.numpy_function``), an op XLA cannot compile."""

    def __call__(self, explanation, label, target):
        terms = dict(super().__call__(explanation, label, target))
        zero = tf.numpy_function(lambda: np.zeros((), terms["loss"].dtype.as_numpy_dtype), [], terms["loss"].dtype, stateful=False)
        terms["loss"] = terms["loss"] + tf.stop_gradient(tf.reshape(zero, []))
        return terms


def test_auto_falls_back_without_xla_when_xla_cannot_compile_the_step(rng, caplog):
    model, x, label, target = _problem("dense", rng, batch=1)
    plain_model = _copy(model)
    plain = compile_step(plain_model, LRP(plain_model, "epsilon_gamma_box"), HostTerm(heatmap_loss("mse")), keras.optimizers.Adam(1e-2), "function", 3)
    expected = plain(x, label, target)
    auto = compile_step(model, LRP(model, "epsilon_gamma_box"), HostTerm(heatmap_loss("mse")), keras.optimizers.Adam(1e-2), "auto", 3, batch=1)
    assert auto.mode == "xla"  # the rule's choice for a model without convolutions
    with caplog.at_level("WARNING", logger="heatinv.step"):
        result = auto(x, label, target)
    notes = [r.getMessage() for r in caplog.records if r.name == "heatinv.step"]
    assert len(notes) == 1 and "XLA cannot compile this step" in notes[0] and "\n" not in notes[0]
    assert auto.mode == "function" and "XLA failed to compile it" in auto.why
    # The failed XLA call updated nothing: the fallback's 3 updates are the graph step's 3.
    assert float(result["loss"]) == float(expected["loss"])
    for a, b in zip(_weights(plain_model), _weights(model)):
        np.testing.assert_array_equal(b, a)
    auto(x, label, target)  # later calls run the graph step without another note
    assert len([r for r in caplog.records if r.name == "heatinv.step"]) == 1


def test_jit_compile_true_does_not_fall_back(rng):
    model, x, label, target = _problem("dense", rng, batch=1)
    step = compile_step(model, LRP(model, "epsilon_gamma_box"), HostTerm(heatmap_loss("mse")), keras.optimizers.Adam(1e-2), "xla", 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="PyFunc"):
        step(x, label, target)


@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_xla_gives_the_results_of_jit_compile_false(kind, rng):
    """float32, batch 1, 10 updates in two calls of 5: XLA (auto's pick for the dense chain,
    ``trainer.jit_compile=true`` for the conv model) against false (graph)."""
    model, x, label, target = _problem(kind, rng, dtype="float32", batch=1)
    runs, compiled = {}, "auto" if kind == "dense" else "xla"
    for mode in (compiled, "function"):
        copy = _copy(model)
        step = compile_step(copy, LRP(copy, "epsilon_gamma_box"), HeatmapMatch(heatmap_loss("mse")), keras.optimizers.Adam(1e-2), mode, 5, batch=1)
        results = [step(x, label, target) for _ in range(2)]
        runs[mode] = (step.mode, [float(r["loss"]) for r in results], _weights(copy))
    assert runs[compiled][0] == "xla" and runs["function"][0] == "function"
    # Measured (seeds 0-2, both kinds): losses up to 5.4e-7 relative apart; weights up to
    # 1.8e-4 apart, under 2 % of one Adam step (lr 1e-2), where a gradient near zero makes
    # Adam's m / sqrt(v) sensitive to rounding. A lost or wrong update would move ~1e-2.
    np.testing.assert_allclose(runs[compiled][1], runs["function"][1], rtol=5e-6)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(runs["function"][2], _weights(model)))
    assert moved > 5e-2
    for a, b in zip(runs["function"][2], runs[compiled][2]):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-3)


def _poisoned_while_iterations_is_2(optimizer, poison: str, weight: tf.Variable):
    """The MSE heatmap objective, made non-finite while ``optimizer.iterations == 2``.

    A skipped update does not advance ``iterations``, so once poisoned it stays poisoned.
    ``poison``: ``nan_loss`` (the loss NaN, and so every gradient); ``inf_loss_finite_gradients``
    (the loss Inf, the gradients finite); ``finite_loss_nan_gradient``: ``sqrt(|v - v| + c) -
    sqrt(c)`` is 0, and its gradient ``inf * sign(0)``, NaN, where ``c = 0``.
    """
    match = HeatmapMatch(heatmap_loss("mse"))

    def poisoned(explanation, label, target):
        terms = match(explanation, label, target)
        dtype = terms["loss"].dtype
        now = tf.equal(optimizer.iterations, 2)
        if poison == "nan_loss":
            return {**terms, "loss": terms["loss"] * tf.where(now, tf.constant(np.nan, dtype), tf.constant(1.0, dtype))}
        if poison == "inf_loss_finite_gradients":
            return {**terms, "loss": terms["loss"] + tf.where(now, tf.constant(np.inf, dtype), tf.constant(0.0, dtype))}
        c = tf.where(now, tf.constant(0.0, weight.dtype), tf.constant(1.0, weight.dtype))
        zero = tf.sqrt(tf.abs(tf.reduce_sum(weight - tf.stop_gradient(weight))) + c) - tf.sqrt(c)
        return {**terms, "loss": terms["loss"] + tf.cast(zero, dtype)}

    return poisoned


@pytest.mark.parametrize("poison", ["nan_loss", "inf_loss_finite_gradients", "finite_loss_nan_gradient"])
@pytest.mark.parametrize("make", [lambda: keras.optimizers.Adam(1e-2), lambda: keras.optimizers.SGD(1e-2)], ids=["adam", "sgd"])
def test_xla_loop_skips_the_same_nonfinite_updates_as_the_guard_at_every_update(make, poison, rng):
    """The XLA loop checks once per call; a call with a NaN update is redone with the guard.

    The objective is poisoned while ``optimizer.iterations == 2``, and a skipped update does
    not advance it: of 5 updates the first two are made, the other three skipped. An Inf loss
    with finite gradients needs the guard to read the loss; a finite loss with a NaN gradient
    needs the loop to look at the weights, not only the losses.
    """
    model, x, label, target = _problem("dense", rng)
    copies = [_copy(model), _copy(model)]
    steps, optimizers = [], []
    for copy, mode, n in zip(copies, ["function", "xla"], [1, 5]):
        optimizer = make()
        poisoned = _poisoned_while_iterations_is_2(optimizer, poison, copy.trainable_variables[0])
        steps.append(compile_step(copy, LRP(copy, "epsilon_gamma_box"), poisoned, optimizer, mode, n, xla_loop=True))
        optimizers.append(optimizer)
    guarded, looped = steps
    singles = [guarded(x, label, target) for _ in range(5)]
    assert looped._guarded is not None and looped._guarded.experimental_get_tracing_count() == 0
    result = looped(x, label, target)
    assert looped._guarded.experimental_get_tracing_count() == 1  # the call was redone with the guard
    assert [int(s["nonfinite"]) for s in singles] == [0, 0, 1, 1, 1] and int(result["nonfinite"]) == 3
    assert int(optimizers[0].iterations.numpy()) == int(optimizers[1].iterations.numpy()) == 2
    for a, b in zip(_weights(copies[0]), _weights(copies[1])):
        assert np.all(np.isfinite(b))
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
    for a, b in zip(optimizers[0].variables, optimizers[1].variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-12, atol=1e-14)
    again = looped(x, label, target, steps=1)  # iterations is still 2: NaN again, skipped again
    assert int(again["nonfinite"]) == 1


def test_an_eager_call_of_several_updates_counts_every_skipped_one(rng):
    """``steps_per_execution=5`` eagerly, the loss NaN while ``iterations == 2``: two updates made, three skipped."""
    model, x, label, target = _problem("dense", rng)
    optimizer = keras.optimizers.SGD(1e-2)
    poisoned = _poisoned_while_iterations_is_2(optimizer, "nan_loss", model.trainable_variables[0])
    step = compile_step(model, LRP(model, "epsilon_gamma_box"), poisoned, optimizer, "eager", 5)
    assert int(step(x, label, target)["nonfinite"]) == 3 and int(optimizer.iterations.numpy()) == 2


def test_xla_loop_keeps_a_call_whose_float64_loss_is_finite_beyond_float32s_range(rng):
    """The check reads the loss in its own dtype: ~1e40 is finite in float64 (inf as float32), so nothing is redone."""
    model, x, label, target = _problem("dense", rng)
    match = HeatmapMatch(heatmap_loss("mse"))

    def huge(explanation, label, target):
        terms = match(explanation, label, target)
        return {**terms, "loss": terms["loss"] * tf.constant(1e45, tf.float64)}

    step = compile_step(model, LRP(model, "epsilon_gamma_box"), huge, keras.optimizers.Adam(1e-3), "xla", 3, xla_loop=True)
    assert 3.5e38 < float(huge(LRP(model, "epsilon_gamma_box").explain(x, label), label, target)["loss"]) < 1e300
    result = step(x, label, target)
    assert int(result["nonfinite"]) == 0 and all(np.all(np.isfinite(w)) for w in _weights(model))
    assert step._guarded.experimental_get_tracing_count() == 0
