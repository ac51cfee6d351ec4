"""The doctor: each cause of vanishing gradients is built, found, and cleared by its fix.

A finding must be true: every test that triggers a code also shows the gradients really
vanish, and every fix test shows the finding is gone and the gradients are back.
"""

from __future__ import annotations

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from heatinv.doctor import (
    CODES,
    ExplanationObjective,
    Finding,
    HeatmapObjective,
    SaliencyObjective,
    diagnose,
    format_report,
)
from heatinv.doctor import checks
from heatinv.doctor.objectives import Probe
from heatinv.lrp import LRP
from heatinv.lrp.canonical import canonize
from heatinv.models import Architecture, build_model


def codes(findings: list[Finding]) -> list[str]:
    return [f.code for f in findings]


def max_abs(probe_gradients) -> float:
    return max(float(tf.reduce_max(tf.abs(g))) for g in probe_gradients.values() if g is not None)


def _input_gradient(model, x, score_fn) -> np.ndarray:
    """The gradient of ``score_fn(model(x))`` with respect to the input ``x``."""
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        score = score_fn(model(x))
    return tape.gradient(score, x).numpy()


@pytest.fixture
def mlp() -> keras.Model:
    return build_model(Architecture(hidden=(32, 16)), seed=0)


@pytest.fixture
def image(rng) -> np.ndarray:
    return rng.uniform(0, 1, (1, 28, 28, 1)).astype("float32")


def test_healthy_configuration_has_no_findings(mlp, image, rng):
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    assert diagnose(mlp, image, 7, HeatmapObjective(target, LRP(mlp))) == []


def test_zero_residual_found_and_fixed(mlp, image, rng):
    lrp = LRP(mlp)
    own = lrp(image, 7).numpy()
    objective = HeatmapObjective(own, lrp, loss="l1")
    assert codes(diagnose(mlp, image, 7, objective)) == ["zero-residual"]
    assert max_abs(objective.probe(mlp, image, 7, tf.float32).gradients) == 0.0
    other = build_model(Architecture(hidden=(32, 16)), seed=1)  # fix: start from other weights
    assert diagnose(other, image, 7, HeatmapObjective(own, LRP(other), loss="l1")) == []


def test_dead_output_found_and_fixed_by_logit_output(image, rng):
    model = build_model(Architecture(hidden=(32, 16), output_activation="relu"), seed=0)
    model.layers[-1].bias.assign(tf.fill([10], -100.0))
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    dead = HeatmapObjective(target, LRP(model, output="activation"))
    findings = diagnose(model, image, 3, dead)
    assert codes(findings) == ["dead-output"] and findings[0].layer == model.layers[-1].name
    assert "lrp.output=logit" in findings[0].fix
    assert max_abs(dead.probe(model, image, 3, tf.float32).gradients) == 0.0
    fixed = HeatmapObjective(target, LRP(model, output="logit"))
    assert "dead-output" not in codes(diagnose(model, image, 3, fixed))
    assert max_abs(fixed.probe(model, image, 3, tf.float32).gradients) > 0


def test_dead_output_with_linear_output_is_not_reported(image, rng):
    model = build_model(Architecture(hidden=(32, 16), output_activation="linear"), seed=0)
    model.layers[-1].bias.assign(tf.fill([10], -100.0))
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    assert diagnose(model, image, 3, HeatmapObjective(target, LRP(model, output="activation"))) == []


def test_dead_units_found_and_fixed(mlp, image, rng):
    first = mlp.layers[1]
    assert isinstance(first, keras.layers.Dense)
    healthy_bias = first.bias.numpy()
    first.bias.assign(tf.fill(first.bias.shape, -100.0))
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    objective = HeatmapObjective(target, LRP(mlp))
    findings = diagnose(mlp, image, 7, objective)
    assert "dead-units" in codes(findings)
    finding = next(f for f in findings if f.code == "dead-units")
    assert finding.layer == first.name and "All of the 32 units" in finding.message
    first.bias.assign(healthy_bias)
    assert "dead-units" not in codes(diagnose(mlp, image, 7, objective))


def _saturated_softmax_model() -> keras.Model:
    model = build_model(Architecture(hidden=(32, 16), output_activation="softmax"), seed=0)
    model.layers[-1].kernel.assign(model.layers[-1].kernel * 1000.0)
    return model


def test_softmax_saturated_found_and_fixed_by_logits(image):
    model = _saturated_softmax_model()
    winner = int(np.argmax(model(image)))
    objective = SaliencyObjective()
    findings = diagnose(model, image, winner, objective)
    assert "softmax-saturated" in codes(findings)
    finding = next(f for f in findings if f.code == "softmax-saturated")
    assert "from_logits=True" in finding.fix
    # Keras 3 recovers the logits behind its own softmax, so the gradient is tiny, not 0.
    vanishing = max_abs(objective.probe(model, image, winner, tf.float32).gradients)
    assert vanishing < 1e-15 and f"{vanishing:.3g}" in finding.message
    # the fix: differentiate the class's logit rather than a loss of its probability
    fixed = SaliencyObjective(loss="logit")
    assert diagnose(model, image, winner, fixed) == []
    assert max_abs(fixed.probe(model, image, winner, tf.float32).gradients) > 1e-3


def _underflowing_model() -> keras.Model:
    """Three linear layers with weights ~1e-17: products of ~1e-51 underflow float32 only."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(8), keras.layers.Dense(8), keras.layers.Dense(10)]
    )
    for layer in model.layers[1:]:
        layer.kernel.assign(layer.kernel * 1e-17)
    return model


def test_underflow_found_and_fixed_by_float64(image):
    model = _underflowing_model()
    objective = SaliencyObjective()
    findings = diagnose(model, image, 3, objective)
    assert codes(findings) == ["underflow"] and findings[0].layer == "input"
    assert "trainer.precision=float64" in findings[0].fix
    assert max_abs(objective.probe(model, image, 3, tf.float32).gradients) == 0.0
    assert max_abs(objective.probe(model, image, 3, tf.float64).gradients) > 0.0
    assert diagnose(model, image, 3, objective, precision="float64") == []


def test_unconnected_integer_input_found_and_fixed(mlp, image):
    findings = diagnose(mlp, (image * 255).astype("uint8"), 3, SaliencyObjective())
    assert codes(findings) == ["unconnected"] and findings[0].layer == "input"
    assert "uint8" in findings[0].message
    assert "unconnected" not in codes(diagnose(mlp, image, 3, SaliencyObjective()))


def test_unconnected_variable_reported_by_name(mlp, image):
    probe = SaliencyObjective().probe(mlp, image, 3, tf.float32)
    probe.gradients["extra/kernel"] = None  # a variable the loss never touched
    findings = checks.unconnected(probe)
    assert codes(findings) == ["unconnected"] and findings[0].layer == "extra/kernel"


def test_lrp_zero_division_found_and_fixed_by_epsilon(image, rng):
    model = build_model(Architecture(hidden=(32, 16)), seed=0)  # Keras's biases start at 0
    first = model.layers[1]
    first.kernel.assign(first.kernel * np.repeat([[0.0], [1.0]], 16, axis=0).T)  # 16 units without weights: z = 0
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    zero_rule = HeatmapObjective(target, LRP(model, composite="zero"))
    (finding,) = [f for f in diagnose(model, image, 7, zero_rule) if f.code == "nan-division"]
    assert finding.message.startswith(f"z = a W + b is exactly 0 for 16 of 32 outputs of {first.name}")
    assert np.isfinite(zero_rule.probe(model, image, 7, tf.float32).heatmap.numpy()).all()
    epsilon_rule = HeatmapObjective(target, LRP(model, composite="epsilon"))
    assert "nan-division" not in codes(diagnose(model, image, 7, epsilon_rule))


def test_non_finite_gradients_are_reported(mlp, image):
    objective = SaliencyObjective()
    probe = objective.probe(mlp, image, 3, tf.float32)
    probe.gradients["input"] = tf.fill([1, 28, 28, 1], np.nan)
    findings = checks.non_finite(objective, canonize(mlp), probe)
    assert codes(findings) == ["non-finite"] and findings[0].layer == "input"
    assert "784 of the 784 values of the gradient of input" in findings[0].message
    assert "lrp.epsilon" in findings[0].fix


# Values beyond float32: the doctor names where NaN/Inf first appears and reports nothing
# else from comparisons that NaN makes unknown (issue #17: an input of 1e38 was reported
# as nan-division and as zero-residual with "max |heatmap - target| = nan").


def test_huge_input_is_a_non_finite_loss_not_a_zero_residual(mlp, rng):
    target = rng.normal(0, 0.01, (1, 28, 28, 1)).astype("float32")
    huge = np.full((1, 28, 28, 1), 1e38, "float32")
    objective = HeatmapObjective(target, LRP(mlp))
    probe = objective.probe(mlp, huge, 7, tf.float32)
    # what the finding claims: every layer output and the heatmap are finite, the loss is not
    assert all(np.isfinite(t.numpy()).all() for t in probe.fwd.inputs) and np.isfinite(probe.heatmap.numpy()).all()
    assert not np.isfinite(probe.loss)
    findings = diagnose(mlp, huge, 7, objective)
    assert codes(findings) == ["non-finite"]
    assert findings[0].message.startswith("the loss is inf in float32") and "largest |heatmap| 9.6e+36" in findings[0].message
    assert "trainer.precision=float64" in findings[0].fix


def test_input_that_overflows_the_first_layer_names_the_layer(mlp, rng):
    target = rng.normal(0, 0.01, (1, 28, 28, 1)).astype("float32")
    huge = np.full((1, 28, 28, 1), 3e38, "float32")
    findings = diagnose(mlp, huge, 7, HeatmapObjective(target, LRP(mlp)))
    first_dense = next(layer for layer in mlp.layers if isinstance(layer, keras.layers.Dense))
    assert codes(findings) == ["non-finite"] and findings[0].layer == first_dense.name
    assert "while the input is finite (largest |value| 3e+38)" in findings[0].message
    assert "Rescale the input" in findings[0].fix


def test_weights_grown_until_a_layer_overflows_are_sent_to_the_learning_rate(mlp, image, rng):
    """optimizer.lr=1e30 in a sweep: the overflow was told to rescale an input already in [0, 1]."""
    first_dense = next(layer for layer in mlp.layers if isinstance(layer, keras.layers.Dense))
    first_dense.kernel.assign(tf.fill(first_dense.kernel.shape, 1e37))  # 784 inputs of ~0.5: sums of ~4e39
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    (finding,) = diagnose(mlp, image, 7, HeatmapObjective(target, LRP(mlp)))
    assert finding.code == "non-finite" and finding.layer == first_dense.name
    assert "the layer's weights reach |w| = " in finding.message and "Lower optimizer.lr" in finding.fix
    assert "Rescale the input" not in finding.fix


def test_infinite_input_is_named_as_the_input(mlp, image, rng):
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    bad = image.copy()
    bad[0, 5, 5, 0] = np.inf
    findings = diagnose(mlp, bad, 7, HeatmapObjective(target, LRP(mlp)))
    assert codes(findings) == ["non-finite"] and findings[0].layer == "input"
    assert "1 of the 784 values of the input are NaN or Inf" in findings[0].message


def test_nan_target_is_named_and_its_residual_is_not_zero(mlp, image, rng):
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    target[0, 3, 3, 0] = np.nan
    findings = diagnose(mlp, image, 7, HeatmapObjective(target, LRP(mlp)))
    assert codes(findings) == ["non-finite"] and "the target are NaN or Inf" in findings[0].message


def test_nan_residual_is_unknown_to_every_comparison(mlp, image):
    """A heatmap of NaN: zero_residual and all_zero must not read NaN as zero."""
    lrp = LRP(mlp)
    objective = HeatmapObjective(lrp(image, 7).numpy(), lrp)  # a target the heatmap equals: zero residual
    probe = objective.probe(mlp, image, 7, tf.float32)
    assert codes(checks.zero_residual(objective, probe)) == ["zero-residual"]  # the control
    probe.heatmap = tf.fill(probe.heatmap.shape, np.nan)
    assert checks.zero_residual(objective, probe) == []
    findings = checks.non_finite(objective, canonize(mlp), probe)
    assert codes(findings) == ["non-finite"] and "784 of the 784 values of the heatmap" in findings[0].message
    nan_gradients = {name: tf.fill(g.shape, np.nan) for name, g in probe.gradients.items()}
    probe.gradients = nan_gradients
    assert not checks.all_zero(probe)


def test_piecewise_linear_found_and_fixed_by_softplus(image, rng):
    relu = build_model(Architecture(hidden=(32, 16)), seed=0)
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    objective = ExplanationObjective(target)
    findings = diagnose(relu, image, 7, objective)
    assert codes(findings) == ["piecewise-linear"]
    assert "model.activation=softplus" in findings[0].fix
    smooth = build_model(Architecture(hidden=(32, 16), activation="softplus", beta=10.0), seed=0)
    assert diagnose(smooth, image, 7, objective) == []
    assert max_abs(objective.probe(smooth, image, 7, tf.float32).gradients) > 0


def test_every_code_is_documented_and_reports_read_well():
    assert set(CODES) >= {
        "zero-residual", "dead-output", "dead-units", "softmax-saturated",
        "underflow", "unconnected", "nan-division", "non-finite", "piecewise-linear",
    }
    with pytest.raises(ValueError, match="Unknown finding code"):
        Finding("made-up", None, "", "")
    report = format_report([Finding("underflow", "dense/kernel", "numbers", "trainer.precision=float64")], "ctx")
    assert "1. underflow [dense/kernel]: numbers" in report and "fix: trainer.precision=float64" in report
    assert "No problems found" in format_report([])


SMALL_RUN = ("model.hidden=[32,16]", "trainer.steps=5", "trainer.log_every=5")


def test_train_stops_with_the_diagnosis_when_every_gradient_is_zero(composed, caplog, monkeypatch):
    import heatinv.single as single
    from heatinv.train import GradientsVanished, run

    titles = []
    real_figure = single.heatmap_figure
    monkeypatch.setattr(single, "heatmap_figure", lambda *a, **kw: titles.append(kw["title"]) or real_figure(*a, **kw))

    # a random student whose target-class output is dead behind its final ReLU (seed 0, digit 7)
    cfg, out = composed(*SMALL_RUN, "model.output_activation=relu", "lrp.output=activation", "target=pattern", "trainer.seed=0")
    with caplog.at_level("INFO"), pytest.raises(GradientsVanished) as stop:
        run(cfg)
    assert "compiling the step" not in caplog.text  # nothing runs, so nothing is said to compile
    # the doctor's pre-run diagnosis finds it, so not a single step is run
    assert stop.value.step == 0 and "dead-output" in codes(stop.value.findings)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stopped_at_step"] == 0 and metrics["steps"] == 0
    assert metrics["diagnosis"][0]["code"] == "dead-output"
    assert json.loads((out / "doctor.json").read_text())[0]["code"] == "dead-output"
    # heatmaps.png says so too: its blank "final" panel is no result of training
    assert titles and titles[-1].endswith("\nstopped at step 0 of 5: dead-output (doctor.json)")


def test_train_stops_when_a_step_has_only_zero_gradients(composed, monkeypatch):
    """The in-loop check: a step whose gradients all vanish stops the run with a fresh diagnosis."""
    import heatinv.single as single
    import heatinv.train as train

    cfg, out = composed(*SMALL_RUN)
    real = single.compile_step

    def zeroing(*args, **kwargs):
        step = real(*args, **kwargs)

        def wrapped(*a, **kw):
            result = dict(step(*a, **kw))
            result["zero_fractions"] = tf.ones_like(result["zero_fractions"])
            return result

        wrapped.mode, wrapped.why = step.mode, step.why  # what the task logs and writes to metrics.json
        return wrapped

    monkeypatch.setattr(single, "compile_step", zeroing)
    diagnoses = []
    real_diagnose = single.diagnose

    def diagnose(*args, **kwargs):  # healthy before step 1; the stop's diagnosis stands in for what it finds
        diagnoses.append(real_diagnose(*args, **kwargs) if not diagnoses else [Finding("all-zero", None, "at step 1", "a fix")])
        return diagnoses[-1]

    monkeypatch.setattr(single, "diagnose", diagnose)
    with pytest.raises(train.GradientsVanished) as stop:
        train.run(cfg)
    assert stop.value.step == 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stopped_at_step"] == 1
    # what metrics.json and doctor.json say is the diagnosis made where the run stopped, not the one before step 1
    assert len(diagnoses) == 2 and diagnoses[0] == [] and codes(stop.value.findings) == ["all-zero"]
    assert [f["code"] for f in metrics["diagnosis"]] == ["all-zero"]
    assert json.loads((out / "doctor.json").read_text()) == metrics["diagnosis"]


@pytest.mark.parametrize("code, stops", [("vanished-signal", True), ("all-zero", True), ("zero-residual", True), ("dead-units", False)])
def test_only_a_finding_that_leaves_nothing_to_learn_stops_the_single_task_before_step_1(composed, monkeypatch, code, stops):
    import heatinv.single as single
    from heatinv.train import GradientsVanished, run

    finding = Finding(code, None, "measured", "a fix")
    monkeypatch.setattr(single, "diagnose", lambda *args, **kwargs: [finding])
    cfg, out = composed(*SMALL_RUN)
    if stops:
        with pytest.raises(GradientsVanished) as stop:
            run(cfg)
        assert stop.value.step == 0 and codes(stop.value.findings) == [code]
    else:
        run(cfg)  # a warning, and the run goes its course
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == (0 if stops else 5) and metrics["stopped_at_step"] == (0 if stops else None)
    assert [f["code"] for f in json.loads((out / "doctor.json").read_text())] == [code]


def test_doctor_cli_function_on_healthy_and_zero_residual_runs(composed, capsys):
    from heatinv.doctor.__main__ import run_doctor

    cfg, out = composed(*SMALL_RUN)
    assert run_doctor(cfg) == []
    assert json.loads((out / "doctor.json").read_text()) == []
    cfg, out = composed(*SMALL_RUN, "init=reference", "target=digit7")
    assert codes(run_doctor(cfg)) == ["zero-residual"]
    assert "zero-residual" in capsys.readouterr().out


def test_doctor_diagnoses_the_dataset_task_on_the_examples_its_target_moves(composed, capsys, monkeypatch):
    from heatinv.doctor import __main__ as doctor_cli

    cfg, _ = composed(*SMALL_RUN, "task=dataset", "target=swap", "target.like=0", "task.classes=[1]")
    seen = {}
    real_diagnose = doctor_cli.diagnose

    def recording(model, x, labels, objective, precision):
        seen.update(x=x, labels=labels, target=objective.target)
        return real_diagnose(model, x, labels, objective, precision)

    monkeypatch.setattr(doctor_cli, "diagnose", recording)
    assert doctor_cli.run_doctor(cfg) == []
    # only class 1 moves, so only class-1 examples are differentiated, each towards class 0's mean map
    assert seen["x"].shape[0] == doctor_cli.DATASET_EXAMPLES and set(seen["labels"].tolist()) == {1}
    shares = seen["target"] / seen["target"].sum(axis=(1, 2, 3), keepdims=True)
    assert np.allclose(shares, shares[:1], atol=1e-6)  # one map (the class mean), at each image's own total
    assert "swap like class 0 (classes [1]) target's heatmap term on 16 held-out examples" in capsys.readouterr().out
    # a final ReLU with the activation explained: the dataset task's heatmap term dies as the single task's does
    cfg, out = composed(*SMALL_RUN, "task=dataset", "target=pattern", "model.output_activation=relu",
                        "lrp.output=activation", "trainer.seed=0")
    assert "dead-output" in codes(doctor_cli.run_doctor(cfg))
    assert "dead-output" in (out / "doctor.json").read_text()


def test_dataset_task_stops_with_the_diagnosis_of_its_heatmap_term(composed, monkeypatch):
    """When a dataset step's gradients all vanish, the stop carries the doctor's findings on the moved examples."""
    import heatinv.dataset_task as manipulate
    import heatinv.train as train

    # a final ReLU with its activation explained: some held-out examples' explained outputs are dead
    cfg, out = composed(*SMALL_RUN, "task=dataset", "target=pattern", "task.epochs=1", "model.output_activation=relu",
                        "lrp.output=activation", "trainer.seed=0")
    real = manipulate.compile_step

    def zeroing(*args, **kwargs):
        step = real(*args, **kwargs)

        def wrapped(*a, **kw):
            result = dict(step(*a, **kw))
            if "zero_fractions" in result:
                result["zero_fractions"] = tf.ones_like(result["zero_fractions"])
            return result

        wrapped.mode, wrapped.why = step.mode, step.why
        return wrapped

    monkeypatch.setattr(manipulate, "compile_step", zeroing)
    with pytest.raises(train.GradientsVanished) as stop:
        train.run(cfg)
    assert "dead-output" in codes(stop.value.findings)
    assert json.loads((out / "metrics.json").read_text())["diagnosis"][0]["code"] == "dead-output"
    assert json.loads((out / "doctor.json").read_text())[0]["code"] == "dead-output"


def test_an_untrained_mobilenetv2_in_inference_mode_is_a_vanished_signal():
    """README ("Your own data and model"): a fresh MobileNetV2 at 32x32 gives all-zero gradients; the doctor names why.

    Its BatchNorm layers hold their initial statistics, so z shrinks layer after layer to logits
    of about 1e-13: the heatmap and every gradient are 0 in float32. In float64 the gradients are
    about 1e-55, below float32's smallest subnormal (1.4e-45): a float64 probe that rounded them
    to its float32 variables' dtype saw zeros too, and found no underflow.
    """
    from heatinv.targets import pattern_map

    model = build_model(Architecture("mobilenetv2"), num_classes=3, seed=0, input_shape=(32, 32, 3))
    x = np.random.default_rng(0).uniform(size=(1, 32, 32, 3)).astype("float32")
    target = pattern_map("frame", 32, width=32)[None].astype("float32")
    objective = HeatmapObjective(target, LRP(model, "epsilon_gamma_box", low=0.0, high=1.0))
    findings = diagnose(model, x, 1, objective)
    assert codes(findings) == ["vanished-signal", "underflow"]
    faded, underflow = findings
    assert "the heatmap and every gradient are exactly 0 in float32" in faded.message
    assert faded.layer.startswith("block_") and "init=reference" in faded.fix
    # one finding for the model's many variables, not one each
    assert underflow.layer is None and f"of the {len(model.trainable_variables)} variables" in underflow.message


def test_the_float64_probe_differentiates_float64_weights(mlp, image):
    """The float64 probe of a float32 model: gradients in float64, equal to those of its float64 copy."""
    from heatinv.models import with_dtype

    objective = HeatmapObjective(np.full(image.shape, 0.01, "float32"), LRP(mlp, "epsilon"))
    probe = objective.probe(mlp, image, 3, tf.float64)
    copy = with_dtype(mlp, "float64")
    expected = HeatmapObjective(objective.target, LRP(copy, "epsilon")).probe(copy, image, 3, tf.float64)
    assert {g.dtype for g in probe.gradients.values()} == {tf.float64}
    for name, gradient in probe.gradients.items():
        np.testing.assert_array_equal(gradient.numpy(), expected.gradients[name].numpy())


def _gated_model() -> keras.Model:
    """A squeeze-and-excitation gate (EfficientNet's): a Multiply of a [b, 8, 8, 4] map by a [b, 1, 1, 4] gate."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 2))
    features = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="features")(inputs)
    squeezed = keras.layers.GlobalAveragePooling2D(name="squeeze")(features)
    gate = keras.layers.Dense(4, activation="sigmoid", name="gate")(squeezed)
    gate = keras.layers.Reshape((1, 1, 4), name="gate_map")(gate)
    gated = keras.layers.Multiply(name="excite")([features, gate])
    logits = keras.layers.Dense(3, name="logits")(keras.layers.Flatten(name="flat")(gated))
    return keras.Model(inputs, logits)


def test_doctor_reads_each_layers_own_output_in_a_graph():
    """The non-finite check walks every layer's output; a merge's operands of different shapes are no output of it.

    EfficientNet's gates made the doctor stop with a NumPy error (it read the next step's
    input as the previous step's output, here ``[features, gate]``).
    """
    model = _gated_model()
    x = np.random.default_rng(0).uniform(size=(2, 8, 8, 2)).astype("float32")
    objective = HeatmapObjective(np.full((2, 8, 8, 2), 0.01, "float32"), LRP(model, "epsilon"))
    assert diagnose(model, x, np.array([0, 1]), objective) == []
    gate = model.get_layer("gate")
    gate.kernel.assign(np.full(gate.kernel.shape, np.nan, "float32"))
    findings = diagnose(model, x, np.array([0, 1]), objective)
    assert codes(findings) == ["non-finite"] and findings[0].layer == "gate"


def test_a_dead_output_is_not_reported_for_the_logit_it_hides(image):
    """The logit sits before the final ReLU: dead outputs do not stop its gradient."""
    model = build_model(Architecture(hidden=(32, 16), output_activation="relu"), seed=0)
    model.layers[-1].bias.assign(tf.fill([10], -100.0))
    logit = SaliencyObjective(loss="logit")
    assert max_abs(logit.probe(model, image, 3, tf.float32).gradients) > 0
    assert diagnose(model, image, 3, logit) == []
    assert codes(diagnose(model, image, 3, SaliencyObjective())) == ["dead-output"]  # the control: cross-entropy


def test_an_infinite_target_is_not_also_a_zero_residual(mlp, image, rng):
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    target[0, 2, 2, 0] = np.inf
    assert codes(diagnose(mlp, image, 7, HeatmapObjective(target, LRP(mlp)))) == ["non-finite"]


def test_an_integer_input_does_not_hide_the_weights_findings(mlp, image, rng):
    """A heatmap objective differentiates the weights: an integer input is cast, and the checks go on."""
    first = mlp.layers[1]
    first.bias.assign(tf.fill(first.bias.shape, -1e5))  # below every a W at inputs up to 255
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    findings = diagnose(mlp, (image * 255).astype("uint8"), 7, HeatmapObjective(target, LRP(mlp)))
    assert "dead-units" in codes(findings) and "unconnected" not in codes(findings)


def test_dead_units_far_below_zero_are_not_sent_to_softplus(mlp, image, rng):
    first = mlp.layers[1]
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    products = first.kernel.numpy().T @ image.reshape(-1)
    # largest z: about -100; -1.87, where softplus with beta 10 has a slope of 7.7e-9; then -0.2
    for bias, smooth in ((-100.0, False), (-1.87 - products.max(), False), (-0.2 - products.max(), True)):
        first.bias.assign(tf.fill(first.bias.shape, bias))
        z = products + bias
        finding = next(f for f in diagnose(mlp, image, 7, HeatmapObjective(target, LRP(mlp))) if f.code == "dead-units")
        assert f"largest {z.max():.3g})" in finding.message
        assert ("model.activation=softplus" in finding.fix) is smooth
        assert ("bias" in finding.fix) is not smooth


@pytest.mark.parametrize("relu", [tf.nn.relu, keras.ops.relu])
def test_a_relu_given_as_a_function_is_a_relu(image, relu):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(16, activation=relu), keras.layers.Dense(10)]
    )
    model.layers[1].bias.assign(tf.fill([16], -100.0))
    assert codes(diagnose(model, image, 3, SaliencyObjective(loss="logit"))) == ["dead-units"]


def test_a_keras_op_by_a_constant_has_a_float64_probe(image, rng):
    """``x * 2.0`` written into a model: the float64 copy keeps the op (its clone raised TypeError)."""
    inputs = keras.Input((28, 28, 1))
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(inputs))
    model = keras.Model(inputs, keras.layers.Dense(10)(hidden * 2.0))
    objective = HeatmapObjective(rng.normal(0, 0.01, image.shape).astype("float32"), LRP(model))
    probe32, probe64 = (objective.probe(model, image, 3, dtype) for dtype in (tf.float32, tf.float64))
    for name, g32 in probe32.gradients.items():
        np.testing.assert_allclose(probe64.gradients[name], g32, rtol=1e-3, atol=1e-6)  # measured: float32 rounding
    assert diagnose(model, image, 3, objective) == []


def test_the_explanation_objective_differentiates_a_convolution_twice_eagerly(rng):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, activation="relu"), keras.layers.Flatten(), keras.layers.Dense(3)]
    )
    x = rng.uniform(0, 1, (1, 8, 8, 1)).astype("float32")
    assert codes(diagnose(model, x, 0, ExplanationObjective(np.zeros_like(x)))) == ["piecewise-linear"]


def test_a_saturated_softmax_of_logits_is_named_and_float64_is_not_offered(image):
    model = build_model(Architecture(hidden=(32, 16)), seed=0)
    model.layers[-1].kernel.assign(model.layers[-1].kernel * 50000.0)
    winner = int(np.argmax(model(image)))
    objective = SaliencyObjective()  # a linear output: the cross-entropy from logits
    assert max_abs(objective.probe(model, image, winner, tf.float32).gradients) == 0.0
    findings = diagnose(model, image, winner, objective)
    assert codes(findings) == ["softmax-saturated"] and "loss='logit'" in findings[0].fix
    assert diagnose(model, image, winner, SaliencyObjective(loss="logit")) == []
    # A confident but not one-hot softmax (others 2e-9) beside dead units: the units are the cause, not the softmax.
    other = build_model(Architecture(hidden=(32, 16)), seed=0)
    other.layers[1].bias.assign(tf.fill([32], -100.0))
    other.layers[-1].bias.assign(tf.one_hot(0, 10) * 20.0)
    assert set(codes(diagnose(other, image, 0, SaliencyObjective()))) == {"dead-units"}  # the first layer and the one after


def test_an_unknown_saliency_loss_is_refused():
    with pytest.raises(ValueError, match="'crossentropy' or 'logit', got 'logits'"):
        SaliencyObjective(loss="logits")


def test_a_float16_model_is_checked_for_what_float16_rounds_away(image):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((28, 28, 1), dtype="float16"), keras.layers.Flatten(dtype="float16")]
        + [keras.layers.Dense(n, activation="relu", dtype="float16") for n in (64, 32)]
        + [keras.layers.Dense(10, dtype="float16")]
    )
    model.set_weights([w * np.float16(0.002) for w in model.get_weights()])
    gradient = _input_gradient(model, tf.constant(image, tf.float16), lambda y: tf.reduce_sum(y[:, 3]))
    assert float(np.abs(gradient).max()) == 0.0  # what the user sees in float16
    findings = diagnose(model, image, 3, SaliencyObjective(loss="logit"))
    assert codes(findings) == ["underflow"] and "computes in float16" in findings[0].message
    # the heatmap objective's float32 probe differentiates a float32 copy: float16 variables rounded its gradients to float16
    heatmap = HeatmapObjective(np.zeros(image.shape, "float32"), LRP(model, "epsilon"))
    assert {g.dtype for g in heatmap.probe(model, image, 3, tf.float32).gradients.values()} == {tf.float32}


def test_mismatched_inputs_to_diagnose_are_named(mlp, image, rng):
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    with pytest.raises(ValueError, match=r"Input of shape \(1, 28, 28\) does not fit model"):
        diagnose(mlp, image[..., 0], 3, SaliencyObjective())
    with pytest.raises(ValueError, match=r"target has shape \(1, 28\) and the heatmap \(1, 28, 28, 1\)"):
        diagnose(mlp, image, 3, HeatmapObjective(target[:, 0, :, 0], LRP(mlp)))
    with pytest.raises(ValueError, match=r"target has shape \(1, 28\) and the saliency map \(1, 28, 28, 1\)"):
        diagnose(mlp, image, 3, ExplanationObjective(target[:, 0, :, 0]))  # was a raw InvalidArgumentError
    other = build_model(Architecture(hidden=(32, 16)), seed=1)
    with pytest.raises(ValueError, match="explainer is bound to model .*Build it with LRP\\(model\\)"):
        diagnose(mlp, image, 3, HeatmapObjective(target, LRP(other)))


def test_a_score_made_of_biases_is_named_where_the_gradients_are_tiny_not_zero(image, rng):
    """The last layer's bias carries the logit (its kernel shrunk): the heatmap keeps ~1e-9 of the score."""
    model = build_model(Architecture(hidden=(32, 16)), seed=0)
    last = model.layers[-1]
    last.kernel.assign(last.kernel * 1e-9)
    last.bias.assign(tf.ones_like(last.bias))
    objective = HeatmapObjective(rng.normal(0, 0.01, image.shape).astype("float32"), LRP(model, "epsilon"))
    probe = objective.probe(model, image, 3, tf.float32)
    kept = float(tf.reduce_sum(tf.abs(probe.heatmap))) / float(probe.score[0])
    assert 0 < kept < 1e-6 and max_abs(probe.gradients) > 0  # not all-zero: the other checks stay silent
    findings = diagnose(model, image, 3, objective)
    assert codes(findings) == ["absorbed-relevance"] and f"at most {kept:.3g} of it" in findings[0].message
    last.kernel.assign(last.kernel * 1e9)  # the control: the trained-like scale
    assert diagnose(model, image, 3, objective) == []
    # a map whose signs cancel to a small sum is not "about 0": its |values| are measured
    probe = objective.probe(model, image, 3, tf.float32)
    probe.heatmap = tf.concat([tf.ones([1, 14, 28, 1]), -tf.ones([1, 14, 28, 1])], axis=1)
    assert checks.absorbed_relevance(probe) == []


def test_a_softmax_confident_of_another_class_is_no_saturation_of_the_label(image):
    """The labelled class's probability decides: a label the softmax gives almost 0 has a large gradient."""
    model = _saturated_softmax_model()
    p = model(image).numpy()[0]
    winner, loser = int(np.argmax(p)), int(np.argsort(p)[-2])
    objective = SaliencyObjective()
    assert max_abs(objective.probe(model, image, loser, tf.float32).gradients) > 1e-3
    assert "softmax-saturated" not in codes(diagnose(model, image, loser, objective))
    # one input of two saturated: said as such, without the batch's gradient as if it were that input's
    (finding,) = [f for f in diagnose(model, np.concatenate([image, image]), [winner, loser], objective)
                  if f.code == "softmax-saturated"]
    assert "for 1 of 2 inputs" in finding.message and "its gradient is" not in finding.message


def test_a_smooth_network_given_its_own_explanation_has_a_zero_residual_not_relus(image):
    keras.utils.set_random_seed(0)
    tanh = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(10)])
    own = _input_gradient(tanh, image, lambda y: tf.reduce_sum(y[:, 7]))
    findings = diagnose(tanh, image, 7, ExplanationObjective(own))
    assert codes(findings) == ["zero-residual"] and "gradient explanation already equals the target" in findings[0].message
    assert diagnose(tanh, image, 7, ExplanationObjective(2 * own)) == []  # another target: its gradient flows


def test_an_infinite_weight_is_named_as_the_weight_not_an_overflow(mlp, image):
    kernel = mlp.layers[-1].kernel.numpy()
    kernel[0, 0] = np.inf
    mlp.layers[-1].kernel.assign(kernel)
    (finding,) = diagnose(mlp, image, 7, SaliencyObjective("logit"))
    assert finding.code == "non-finite" and f"1 of the {kernel.size} values of the weight {mlp.layers[-1].kernel.path}" in finding.message
    assert "finite weights" in finding.fix and "Rescale the input" not in finding.fix


def test_a_residual_of_a_millionth_under_l1_has_full_gradients_and_no_zero_residual(mlp, image):
    lrp = LRP(mlp)
    own = lrp(image, 7).numpy()
    objective = HeatmapObjective(own + 5e-7 * np.abs(own).max(), lrp, loss="l1")
    assert max_abs(objective.probe(mlp, image, 7, tf.float32).gradients) > 1e-3
    assert "zero-residual" not in codes(diagnose(mlp, image, 7, objective))


def test_a_blank_input_is_the_one_cause_named(mlp, image, rng):
    """A blank image under a rule that multiplies by the input: the doctor said all-zero, or nan-division and dead units."""
    blank = np.zeros_like(image)
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    for layer in mlp.layers[1:]:
        layer.bias.assign(rng.normal(0, 1, layer.bias.shape))
    for composite in ("epsilon", "zero"):
        findings = diagnose(mlp, blank, 7, HeatmapObjective(target, LRP(mlp, composite)))
        assert codes(findings) == ["blank-input"] and "epsilon_gamma_box" in findings[0].fix
    fixed = HeatmapObjective(target, LRP(mlp, "epsilon_gamma_box"))  # zbox spreads relevance by the weights
    assert max_abs(fixed.probe(mlp, blank, 7, tf.float32).gradients) > 0
    assert "blank-input" not in codes(diagnose(mlp, blank, 7, fixed))
    # biases of 0 (Keras's start): the score itself is 0, and no first rule would help
    for layer in mlp.layers[1:]:
        layer.bias.assign(tf.zeros_like(layer.bias))
    (finding,) = diagnose(mlp, blank, 7, fixed)
    assert finding.code == "blank-input" and "and so is the explained score" in finding.message
    assert "epsilon_gamma_box" not in finding.fix


@pytest.mark.parametrize("kind", ["relu6 activation", "Activation('relu6')", "max pooling, then ReLU"])
def test_dead_units_behind_relu6_or_a_max_pooling_are_found(image, rng, kind):
    keras.utils.set_random_seed(0)
    dead = keras.initializers.Constant(-20.0)
    if kind == "relu6 activation":
        hidden = [keras.layers.Flatten(), keras.layers.Dense(16, activation="relu6", bias_initializer=dead)]
    elif kind == "Activation('relu6')":
        hidden = [keras.layers.Flatten(), keras.layers.Dense(16, bias_initializer=dead), keras.layers.Activation("relu6")]
    else:
        hidden = [keras.layers.Conv2D(4, 3, bias_initializer=dead), keras.layers.MaxPooling2D(), keras.layers.ReLU(),
                  keras.layers.Flatten()]
    model = keras.Sequential([keras.Input((28, 28, 1)), *hidden, keras.layers.Dense(10)])
    findings = diagnose(model, image, 7, SaliencyObjective("logit"))
    assert codes(findings) == ["dead-units"] and "All of the" in findings[0].message


def test_a_layer_dead_only_because_the_one_below_is_is_not_a_second_cause(image, rng):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu", bias_initializer=keras.initializers.Constant(-20.0)),
                              keras.layers.Dense(12, activation="relu"), keras.layers.Dense(10)])
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    findings = diagnose(model, image, 7, HeatmapObjective(target, LRP(model)))
    assert codes(findings) == ["dead-units"] and findings[0].layer == model.layers[1].name


def test_a_dead_output_for_part_of_the_batch_does_not_claim_every_gradient(image, rng):
    model = build_model(Architecture(hidden=(32, 16), output_activation="relu"), seed=0)
    explainer = LRP(model, output="activation")
    logits = explainer.explain(image, 0).logits.numpy()[0]  # the pre-activations of the final ReLU
    dead, alive = int(np.argmin(logits)), int(np.argmax(logits))
    assert logits[dead] <= 0 < logits[alive]
    target = rng.normal(0, 0.01, (2, *image.shape[1:])).astype("float32")
    objective = HeatmapObjective(target, explainer)
    batch = np.concatenate([image, image])
    assert max_abs(objective.probe(model, batch, [dead, alive], tf.float32).gradients) > 0
    (finding,) = [f for f in diagnose(model, batch, [dead, alive], objective) if f.code == "dead-output"]
    assert "For 1 of 2 inputs" in finding.message and "add nothing to the gradient" in finding.message
    assert "every gradient is exactly 0" not in finding.message


def test_a_zplus_score_without_positive_contributions_is_not_blamed_on_biases():
    """Class 0's score is made only of negative contributions, which z+ drops; the model has no biases."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, activation="relu", kernel_initializer="ones"),
                              keras.layers.Dense(2)])
    model.layers[1].kernel.assign(np.ones((3, 2)) * [-1.0, 1.0])  # logit 0 = -sum(h), logit 1 = +sum(h)
    x = np.ones((2, 3), "float32")
    objective = HeatmapObjective(np.full((2, 3), 0.1, "float32"), LRP(model, "zplus"))
    (finding,) = diagnose(model, x, np.array([0, 1]), objective)
    assert finding.code == "absorbed-relevance" and "For 1 of 2 inputs" in finding.message
    assert f"the z+ rule of {model.layers[0].name}, {model.layers[1].name} passes on only the positive" in finding.message
    assert "biases" not in finding.fix and "lrp.composite=epsilon" in finding.fix


def test_a_linear_networks_gradient_explanation_is_said_not_to_depend_on_the_input(image, rng):
    keras.utils.set_random_seed(0)
    linear = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(16), keras.layers.Dense(10)])
    objective = ExplanationObjective(rng.normal(0, 0.01, image.shape).astype("float32"))
    assert objective.probe(linear, image, 7, tf.float32).gradients["input"] is None
    (finding,) = diagnose(linear, image, 7, objective)
    assert finding.code == "unconnected" and "does not depend on the input" in finding.message
    assert "Keep only variables" not in finding.fix


def test_a_softmax_of_logits_saturated_for_part_of_a_batch_is_not_an_underflow(rng):
    """One input's top logit leads by ~150: its gradient is 1e-64 in float64, so float64 is no fix for it."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4)])
    x = rng.uniform(size=(2, 8, 8, 1)).astype("float32")
    logits = np.sort(model(x).numpy(), axis=1)
    model.layers[-1].kernel.assign(model.layers[-1].kernel * (150 / (logits[:, -1] - logits[:, -2]).max()))
    labels = model(x).numpy().argmax(axis=1)
    gradient = SaliencyObjective().probe(model, x, labels, tf.float32).gradients["input"].numpy().reshape(2, -1)
    assert sorted(np.any(gradient, axis=1).tolist()) == [False, True]  # one input's row is 0, the other's not
    findings = diagnose(model, x, labels, SaliencyObjective())
    assert codes(findings) == ["softmax-saturated"] and "for 1 of 2 inputs" in findings[0].message


def test_a_float16_models_underflow_in_many_variables_is_one_finding():
    """Five paragraphs, each with the whole fix, for one cause: grouped as float32's underflow is."""
    tiny = {f"dense_{i}/kernel": tf.fill([4, 4], 1e-9) for i in range(5)}  # below float16's 2^-25 = 3e-8
    findings = checks.float16_underflow(Probe(0.5, tiny, None, None, tf.float32))
    assert codes(findings) == ["underflow"] and findings[0].layer is None
    assert findings[0].message.startswith("The gradients of 5 of the 5 variables (dense_0/kernel, dense_1/kernel, dense_2/kernel, ...)")
    assert "80 of their 80 non-zero entries" in findings[0].message and "computes in float16" in findings[0].message
    few = checks.float16_underflow(Probe(0.5, dict(list(tiny.items())[:2]), None, None, tf.float32))
    assert [f.layer for f in few] == ["dense_0/kernel", "dense_1/kernel"]


@pytest.mark.parametrize("relu6", ["relu6 activation", "ReLU(max_value=6)"])
def test_units_held_at_a_relu6_cap_are_flat_too(image, relu6):
    keras.utils.set_random_seed(0)
    high = keras.initializers.Constant(20.0)
    hidden = ([keras.layers.Dense(16, activation="relu6", bias_initializer=high)] if relu6 == "relu6 activation"
              else [keras.layers.Dense(16, bias_initializer=high), keras.layers.ReLU(max_value=6.0)])
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), *hidden, keras.layers.Dense(10)])
    findings = diagnose(model, image, 7, SaliencyObjective("logit"))
    assert codes(findings) == ["dead-units"]
    assert "16 at or above the cap of 6 of their ReLU" in findings[0].message and "inside (0, 6)" in findings[0].fix


# The numbers in each finding's message, worked out here from the model (NumPy, float16's
# rounding, a gradient tape), and the thresholds at their edges.

# ----------------------------------------------------------------------------- dead-units


def _mlp_with_dead(n_dead: int, units: int = 10) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(units, activation="relu"), keras.layers.Dense(10)])
    hidden = model.layers[1]
    hidden.kernel.assign(np.full(hidden.kernel.shape, 0.001, "float32"))  # a W ~ 0.4 for an image in [0, 1]
    hidden.bias.assign(np.where(np.arange(units) < n_dead, -100.0, 1.0).astype("float32"))
    return model


def test_dead_units_at_the_threshold_are_reported_with_their_counts(image):
    """DEAD_UNITS_FRACTION: "at least this share" (0.9): 9 of 10 dead is reported, 8 of 10 is not."""
    model = _mlp_with_dead(9)
    z = image.reshape(1, -1) @ model.layers[1].kernel.numpy() + model.layers[1].bias.numpy()
    assert (z[0, :9] <= 0).all() and z[0, 9] > 0  # the construction: 9 units off, 1 on
    findings = diagnose(model, image, 3, SaliencyObjective("logit"))
    (finding,) = [f for f in findings if f.code == "dead-units"]
    assert finding.layer == model.layers[1].name
    assert "90% (9) of the 10 units" in finding.message
    assert "only through the other 1." in finding.message
    assert f"largest {z[0, :9].max():.3g})" in finding.message
    # 8 of 10: below the threshold, no finding (and the gradient flows through the 2 live units)
    assert "dead-units" not in codes(diagnose(_mlp_with_dead(8), image, 3, SaliencyObjective("logit")))


def test_units_whose_input_is_exactly_zero_are_dead(image):
    """A zero-initialized layer: z = 0 exactly, and TensorFlow's ReLU has slope 0 at 0."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(8, activation="relu", kernel_initializer="zeros"),
                              keras.layers.Dense(10)])
    gradient = _input_gradient(model, image, lambda y: tf.reduce_sum(y[:, 3]))
    assert not np.any(gradient)  # what the user sees
    findings = diagnose(model, image, 3, SaliencyObjective("logit"))
    assert codes(findings) == ["dead-units"] and "All of the 8 units" in findings[0].message


def test_a_leaky_relu_layer_is_no_dead_relu(image):
    """ReLU(negative_slope=0.1) passes a gradient below 0: its units are not dead."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(16, bias_initializer=keras.initializers.Constant(-100.0)),
                              keras.layers.ReLU(negative_slope=0.1), keras.layers.Dense(10)])
    gradient = _input_gradient(model, image, lambda y: tf.reduce_sum(y[:, 3]))
    assert np.abs(gradient).max() > 0
    assert diagnose(model, image, 3, SaliencyObjective("logit")) == []


def test_relu6_units_split_between_the_cap_and_zero_are_counted_each(image):
    keras.utils.set_random_seed(0)
    bias = keras.initializers.Constant(np.where(np.arange(16) < 6, 20.0, -20.0))  # 6 capped, 10 off
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu6", bias_initializer=bias), keras.layers.Dense(10)])
    z = image.reshape(1, -1) @ model.layers[1].kernel.numpy() + model.layers[1].bias.numpy()
    assert (z[0, :6] >= 6).all() and (z[0, 6:] <= 0).all()
    (finding,) = diagnose(model, image, 3, SaliencyObjective("logit"))
    assert finding.code == "dead-units"
    assert "6 at or above the cap of 6" in finding.message and "10 at or below 0" in finding.message
    assert f"smallest {z[0, :6].min():.3g})" in finding.message


# ----------------------------------------------------------------------------- dead-output


def test_a_final_relu_with_some_outputs_alive_is_no_dead_output_under_cross_entropy(image):
    model = build_model(Architecture(hidden=(32, 16), output_activation="relu"), seed=0)
    pre = LRP(model, output="activation").explain(image, 0).logits.numpy()[0]
    assert (pre <= 0).any() and (pre > 0).any()  # some of the 10 outputs are 0, some are not
    assert np.abs(_input_gradient(model, image, lambda y: tf.reduce_sum(
        keras.losses.categorical_crossentropy(tf.one_hot([3], 10), y, from_logits=True)))).max() > 0
    assert "dead-output" not in codes(diagnose(model, image, 3, SaliencyObjective()))


def test_a_dead_output_at_exactly_zero_and_its_largest_score(image, rng):
    """The final ReLU's pre-activation exactly 0 is dead (slope 0 at 0); "largest" is the largest of the dead ones."""
    model = build_model(Architecture(hidden=(32, 16), output_activation="relu"), seed=0)
    last = model.layers[-1]
    kernel, bias = last.kernel.numpy(), last.bias.numpy()
    kernel[:, 3], bias[3] = 0.0, 0.0  # class 3: pre-activation exactly 0
    bias[5] = -50.0
    bias[7] = -80.0
    last.kernel.assign(kernel)
    last.bias.assign(bias)
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    objective = HeatmapObjective(target, LRP(model, output="activation"))
    (finding,) = [f for f in diagnose(model, image, 3, objective) if f.code == "dead-output"]
    assert "For 1 of 1 inputs" in finding.message and "largest 0)" in finding.message
    # two dead labels: the message's "largest" is the larger of their pre-activations
    batch = np.concatenate([image, image])
    hidden = batch
    for layer in model.layers[:-1]:
        hidden = layer(hidden)
    hidden = hidden.numpy().astype(np.float64)
    pre = hidden @ kernel.astype(np.float64) + bias
    scores = pre[[0, 1], [5, 7]]
    assert (scores < 0).all()
    objective = HeatmapObjective(np.concatenate([target, target]), LRP(model, output="activation"))
    (finding,) = [f for f in diagnose(model, batch, [5, 7], objective) if f.code == "dead-output"]
    assert "For 2 of 2 inputs" in finding.message and f"largest {scores.max():.3g})" in finding.message


# ----------------------------------------------------------------------------- softmax


def test_a_softmax_short_of_keras_clip_is_not_saturated():
    """p = 1 - 5e-7 is outside Keras's clip of 1e-7: its cross-entropy gradient is not cut, nothing to report."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(10, activation="softmax")])
    bias = np.zeros(10)
    bias[0] = np.log(9 / 5e-7)  # 1 - p0 = 9 e^-b / (1 + 9 e^-b) ~ 5e-7
    model.layers[0].kernel.assign(np.full((4, 10), 1e-3, "float32") * np.arange(10))
    model.layers[0].bias.assign(bias.astype("float32"))
    x = np.full((1, 4), 0.5, "float32")
    logits = x.astype(np.float64) @ model.layers[0].kernel.numpy().astype(np.float64) + bias
    p = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert 3e-7 < 1 - p[0, 0] < 1e-6
    assert "softmax-saturated" not in codes(diagnose(model, x, 0, SaliencyObjective()))


def _logits_model_50000() -> keras.Model:
    model = build_model(Architecture(hidden=(32, 16)), seed=0)
    model.layers[-1].kernel.assign(model.layers[-1].kernel * 50000.0)
    return model


def test_a_saturated_softmax_of_logits_reports_the_gap_to_the_next_logit(image):
    model = _logits_model_50000()
    logits = np.sort(model(image).numpy().astype(np.float64)[0])
    winner = int(np.argmax(model(image)))
    (finding,) = diagnose(model, image, winner, SaliencyObjective())
    assert finding.code == "softmax-saturated"
    assert f"leads the next by {logits[-1] - logits[-2]:.3g};" in finding.message
    rest = np.exp(logits[:-1] - logits[-1]).sum()
    assert f"sum to {rest:.3g} in float64" in finding.message


def test_a_one_hot_softmax_of_logits_on_another_label_is_no_saturation(image):
    """The softmax is one-hot on the top class, the label is another: p - y is -1 and +1, a full gradient."""
    model = _logits_model_50000()
    order = np.argsort(model(image).numpy()[0])
    loser = int(order[-2])
    gradient = _input_gradient(model, image, lambda y: tf.reduce_sum(
        keras.losses.categorical_crossentropy(tf.one_hot([loser], 10), y, from_logits=True)))
    assert np.abs(gradient).max() > 1e-3
    assert "softmax-saturated" not in codes(diagnose(model, image, loser, SaliencyObjective()))


# ----------------------------------------------------------------------------- underflow


def _probe(gradients: dict) -> Probe:
    return Probe(0.5, {k: tf.constant(v) for k, v in gradients.items()}, None, None, tf.float32)


def test_underflow_is_a_float64_value_below_float32s_range_and_counts_it():
    zeros = np.zeros((4, 4), np.float32)
    g64 = np.full((4, 4), 1e-40)
    g64[0] = 1e-3  # 4 entries alive in float32 too
    g32 = zeros.copy()
    g32[0] = 1e-3
    (finding,) = checks.underflow(_probe({"dense/kernel": g32}), _probe({"dense/kernel": g64}))
    assert finding.layer == "dense/kernel" and "12 of the 16 non-zero float64 gradient entries" in finding.message
    assert "magnitudes up to 1e-40" in finding.message
    # a float32 zero beside a float64 value float32 holds (1e-20 > 1.2e-38) is cancellation, not underflow
    assert checks.underflow(_probe({"dense/kernel": zeros}), _probe({"dense/kernel": np.full((4, 4), 1e-20)})) == []
    # up to UNDERFLOW_NAMED (3) variables: a finding each, named
    three = {f"dense_{i}/kernel": zeros for i in range(3)}
    findings = checks.underflow(_probe(three), _probe({k: np.full((4, 4), 1e-40) for k in three}))
    assert [f.layer for f in findings] == list(three)


def test_float16_underflow_is_what_float16_rounds_to_zero():
    """2^-25 (README): 2e-8 rounds to 0 in float16, 4e-8 to its smallest subnormal 2^-24."""
    assert np.float16(2e-8) == 0 and np.float16(4e-8) != 0
    (finding,) = checks.float16_underflow(_probe({"dense/kernel": np.full((4, 4), 2e-8, np.float32)}))
    assert finding.code == "underflow" and "16 of the 16 non-zero gradient entries" in finding.message
    assert checks.float16_underflow(_probe({"dense/kernel": np.full((4, 4), 4e-8, np.float32)})) == []


# ----------------------------------------------------------------------------- nan-division


def _half_zero_first_layer():
    model = build_model(Architecture(hidden=(32, 16)), seed=0)  # Keras's biases start at 0
    first = model.layers[1]
    first.kernel.assign(first.kernel * np.repeat([[0.0], [1.0]], 16, axis=0).T)  # 16 units without weights: z = 0
    return model, first


def test_nan_division_counts_outputs_over_the_batch_and_its_fix_removes_it(rng):
    model, first = _half_zero_first_layer()
    batch = rng.uniform(0, 1, (2, 28, 28, 1)).astype("float32")
    target = rng.normal(0, 0.01, batch.shape).astype("float32")
    (finding,) = [f for f in diagnose(model, batch, [7, 7], HeatmapObjective(target, LRP(model, "zero")))
                  if f.code == "nan-division"]
    assert finding.message.startswith(f"z = a W + b is exactly 0 for 32 of 64 outputs of {first.name}")  # 2 x 16 of 2 x 32
    # the fix as written: the composite it names clears the finding
    composite = re.search(r"lrp\.composite=(\w+)", finding.fix).group(1)
    assert "nan-division" not in codes(diagnose(model, batch, [7, 7], HeatmapObjective(target, LRP(model, composite))))


def test_nan_division_is_not_reported_for_a_first_layer_with_its_own_rule(rng, image):
    """A composite whose first rule is epsilon and LRP-0 elsewhere: the first layer's z = 0 divides nothing."""
    model, first = _half_zero_first_layer()
    target = rng.normal(0, 0.01, image.shape).astype("float32")
    explainer = LRP(model, {"first": "epsilon", "dense": "zero", "conv": "zero"})
    assert np.isfinite(explainer(image, 7).numpy()).all()
    findings = diagnose(model, image, 7, HeatmapObjective(target, explainer))
    assert first.name not in [f.layer for f in findings if f.code == "nan-division"]


# ----------------------------------------------------------------------------- absorbed-relevance


def test_absorbed_relevance_over_a_batch_reports_the_largest_share_and_the_logit_spread(rng):
    model = build_model(Architecture(hidden=(32, 16)), seed=0)
    last = model.layers[-1]
    last.kernel.assign(last.kernel * 1e-9)
    last.bias.assign(np.arange(1, 11, dtype="float32"))  # logits of 1 to 10: the classes differ, the inputs hardly
    batch = rng.uniform(0, 1, (2, 28, 28, 1)).astype("float32")
    batch[1] *= 0.3  # another input: another share kept
    explainer = LRP(model, "epsilon")
    heatmap = explainer(batch, [3, 3]).numpy().astype(np.float64)
    logits = model(batch).numpy().astype(np.float64)
    shares = np.abs(heatmap).reshape(2, -1).sum(axis=1) / np.abs(logits[:, 3])
    assert (shares < 1e-6).all() and shares[0] != pytest.approx(shares[1], rel=0.01)
    target = rng.normal(0, 0.01, batch.shape).astype("float32")
    (finding,) = diagnose(model, batch, [3, 3], HeatmapObjective(target, explainer))
    assert finding.code == "absorbed-relevance" and "For 2 of 2 inputs" in finding.message
    assert f"at most {shares.max():.3g} of it" in finding.message
    spread = np.ptp(logits, axis=0).max()  # the same class across the batch, not the classes of one input (9)
    assert spread < 1 and f"no logit varies by more than {spread:.3g}" in finding.message


@pytest.mark.parametrize("composite", ["attnlrp", "cp_lrp"])
def test_saturated_attention_is_named_with_its_rows_and_not_where_attention_is_spread(composite):
    """A hidden case: the same text classifier with its query weights scaled by 100 saturates every row."""
    from heatinv.transformers import text_classifier

    keras.utils.set_random_seed(0)
    model = text_classifier(6, 20, 2, dim=8, depth=1, heads=2)
    ids = np.array([[3, 5, 7, 9, 2, 4], [4, 1, 8, 6, 0, 0]], "int32")
    target = np.random.default_rng(0).normal(size=ids.shape).astype("float32")
    spread = diagnose(model, ids, 1, HeatmapObjective(target, LRP(model, composite)))
    assert "attention-saturated" not in [f.code for f in spread]
    attention = next(layer for layer in model.layers if isinstance(layer, keras.layers.MultiHeadAttention))
    attention.query_dense.kernel.assign(attention.query_dense.kernel * 100.0)
    findings = [f for f in diagnose(model, ids, 1, HeatmapObjective(target, LRP(model, composite))) if f.code == "attention-saturated"]
    assert len(findings) == 1 and findings[0].layer == attention.name
    rows = re.search(r"(\d+) of (\d+) attention rows", findings[0].message)
    assert int(rows.group(2)) == 2 * 2 * 6 - 2 * 2  # two heads, six query tokens, two padded rows (the pads) masked
    assert int(rows.group(1)) >= int(rows.group(2)) / 2
    assert ("Under cp_lrp" in findings[0].message) == (composite == "cp_lrp")
