"""Tests of the main job, `heatinv.train.run`, called in-process on a shrunk config.

The config is composed from the installed `heatinv.configs` package like the command line
does, then shrunk: 4 steps, a 784-16-8-10 MLP whose reference trains for one epoch (once
per session, in a session-wide cache directory), outputs under `tmp_path`. The tests read
back what a user would: `metrics.json`, `student.keras` (in Keras' safe mode),
`heatmaps.png` and the TensorBoard event files (through TensorBoard's own
`EventAccumulator`; TF2 summaries are stored as tensors).
"""

from __future__ import annotations

import json
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from conftest import compose_run
from heatinv.build import build_parts, explainer_for, single_target
from heatinv.data import load_dataset
from heatinv.final_metrics import FINAL_METRICS
from heatinv.losses import HeatmapMatch, heatmap_loss
from heatinv.lrp import LRP
from heatinv.models import Architecture, accuracy, build_model
from heatinv.render import diverging_rgb
from heatinv.similarity import similarity_numpy
from heatinv.step import compile_step
from heatinv.models import variable_tag
from heatinv.targets import pattern_map
from heatinv.train import GradientsVanished, run

METRIC_KEYS = (
    "loss",
    "cosine",
    "ssim",
    "pearson",
    "spearman",
    "steps",
    "seconds",
    "steps_per_second",
    "reference_accuracy",
    "student_accuracy",
)
SIMILARITIES = ("cosine", "ssim", "pearson", "spearman")


@pytest.fixture(scope="session")
def cache_dir(reference_cache) -> str:
    return str(reference_cache)


def train_config(output_dir, cache_dir: str, *overrides: str):
    """The smoke-sized ``train`` config with ``overrides``, writing to ``output_dir``."""
    return compose_run(output_dir, cache_dir, *overrides)


def events(output_dir) -> EventAccumulator:
    accumulator = EventAccumulator(os.path.join(output_dir, "tensorboard"), size_guidance={"tensors": 0})
    accumulator.Reload()
    return accumulator


def scalar_series(accumulator: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(event.step, float(tf.make_ndarray(event.tensor_proto))) for event in accumulator.Tensors(tag)]


def plugin_of(accumulator: EventAccumulator, tag: str) -> str:
    return accumulator.SummaryMetadata(tag).plugin_data.plugin_name


def read_metrics(output_dir) -> dict:
    with open(os.path.join(output_dir, "metrics.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, cache_dir):
    """One shrunk run of the default config: ``(output_dir, returned metrics)``."""
    out = tmp_path_factory.mktemp("default-run")
    return str(out), run(train_config(out, cache_dir))


# --------------------------------------------------------------------------- outputs


def test_metrics_json_has_finite_values(default_run):
    out, returned = default_run
    metrics = read_metrics(out)
    for key in METRIC_KEYS:
        assert key in metrics, f"metrics.json lacks {key}"
        assert isinstance(metrics[key], (int, float)) and math.isfinite(metrics[key]), (key, metrics[key])
    assert metrics["steps"] == 4
    for key in SIMILARITIES:
        assert -1.0 <= metrics[key] <= 1.0, key
    assert 0.0 <= metrics["reference_accuracy"] <= 1.0 and 0.0 <= metrics["student_accuracy"] <= 1.0
    assert metrics["objective"] == pytest.approx(1.0 - metrics["cosine"])
    assert {key: returned[key] for key in METRIC_KEYS} == {key: metrics[key] for key in METRIC_KEYS}


def test_student_keras_loads_in_safe_mode_and_is_the_final_student(default_run):
    out, metrics = default_run
    student = keras.saving.load_model(os.path.join(out, "student.keras"), safe_mode=True)
    digits = load_dataset("digits")
    assert student(digits.x_test[:3]).shape == (3, 10)
    # Its test accuracy is the one reported for the final student.
    assert accuracy(student, digits.x_test, digits.y_test) == pytest.approx(metrics["student_accuracy"])


def test_student_keras_reproduces_the_final_heatmap(default_run, cache_dir):
    out, metrics = default_run
    cfg = train_config(out, cache_dir)
    target = single_target(cfg, load_dataset("digits"), build_parts(cfg).reference)
    student = keras.saving.load_model(os.path.join(out, "student.keras"), safe_mode=True)
    heatmap = explainer_for(student, cfg)(target.image, target.label).numpy()
    assert similarity_numpy(heatmap, target.heatmap)["cosine"] == pytest.approx(metrics["cosine"], abs=1e-5)


def test_heatmaps_png_and_svg_are_the_labelled_figure(default_run):
    out, _ = default_run
    with open(os.path.join(out, "heatmaps.png"), "rb") as f:
        image = tf.io.decode_png(f.read()).numpy()
    height, width, channels = image.shape
    assert channels in (3, 4)
    assert width > 3 * height > 600  # five panels and a colour bar side by side, at 110 dpi
    assert image.min() < image.max()
    with open(os.path.join(out, "heatmaps.svg")) as f:
        svg = f.read()
    assert svg.lstrip().startswith("<?xml") and svg.count("<image") >= 5  # one raster per panel


def test_tensorboard_match_group_first_per_step(default_run):
    out, _ = default_run
    accumulator = events(out)
    tags = set(accumulator.Tags()["tensors"])
    scalar_tags = sorted(tag for tag in tags if plugin_of(accumulator, tag) == "scalars")
    assert scalar_tags[0].startswith("1_match_per_step/")  # TensorBoard sorts groups by name
    for name in ("loss", *SIMILARITIES, "one_minus_cosine"):
        tag = f"1_match_per_step/{name}"
        assert tag in tags and plugin_of(accumulator, tag) == "scalars"
        series = scalar_series(accumulator, tag)
        assert {step for step, _ in series} == {1, 2, 4}  # step 1, every log_every, the last step
        assert all(math.isfinite(value) for _, value in series)
    cosine = dict(scalar_series(accumulator, "1_match_per_step/cosine"))
    for step, value in scalar_series(accumulator, "1_match_per_step/one_minus_cosine"):
        assert value == pytest.approx(1.0 - cosine[step], abs=1e-6)
    assert not any("per_epoch" in tag for tag in tags)


def test_tensorboard_gradients_per_trainable_variable(default_run):
    out, _ = default_run
    accumulator = events(out)
    tags = set(accumulator.Tags()["tensors"])
    student = keras.saving.load_model(os.path.join(out, "student.keras"), safe_mode=True)
    expected = [variable_tag(v) for v in student.trainable_variables]
    # three Dense layers, kernel and bias, each its own tag under its layer's fixed name
    assert expected == [f"{layer}/{weight}" for layer in ("dense_1", "dense_2", "output") for weight in ("kernel", "bias")]
    norm_tags = [f"4_grad_norm_per_step/{name}" for name in expected]
    zero_tags = [f"3_health_per_step/zero_grad_fraction/{name}" for name in expected]
    for tag in norm_tags + zero_tags + ["3_health_per_step/nonfinite_steps"]:
        assert tag in tags and plugin_of(accumulator, tag) == "scalars", tag
    for name in expected:
        for prefix in ("weights", "gradients"):
            assert plugin_of(accumulator, f"{prefix}/{name}") == "histograms"
    norms = [value for tag in norm_tags for _, value in scalar_series(accumulator, tag)]
    fractions = [value for tag in zero_tags for _, value in scalar_series(accumulator, tag)]
    assert all(value > 0 for value in norms)
    assert all(0.0 <= value < 1.0 for value in fractions)
    assert {tag for tag in tags if tag.startswith("4_grad_norm")} == set(norm_tags)  # nothing for non-trainable variables


def test_tensorboard_images_once_current_over_time_and_the_figure(default_run):
    out, _ = default_run
    accumulator = events(out)
    tags = set(accumulator.Tags()["tensors"])

    def steps_of(tag):
        assert tag in tags and plugin_of(accumulator, tag) == "images", tag
        return [event.step for event in accumulator.Tensors(tag)]

    for tag in ("heatmap/input", "heatmap/target", "heatmap/initial"):
        assert steps_of(tag) == [0]  # once: TensorBoard's 10 kept images per tag never drop them
    assert steps_of("heatmap/current")[-1] == 4 and len(steps_of("heatmap/current")) <= 1 + 10
    assert steps_of("heatmap/figure") == [4]
    # An image summary holds width, height and the encoded PNG.
    width, height, png = tf.make_ndarray(accumulator.Tensors("heatmap/figure")[-1].tensor_proto)
    assert tf.io.decode_png(png).shape == (int(height), int(width), 3) and int(width) > 3 * int(height)
    # The input as its values: a digit's empty border (0) is black, not inverted to white paper
    _, _, png = tf.make_ndarray(accumulator.Tensors("heatmap/input")[0].tensor_proto)
    assert tf.io.decode_png(png).numpy()[0, 0].tolist() == [0, 0, 0]


def test_tensorboard_target_tile_shows_the_target(default_run, cache_dir):
    out, _ = default_run
    cfg = train_config(out, cache_dir)
    target = single_target(cfg, load_dataset("digits"), build_parts(cfg).reference).heatmap[0, ..., 0]
    _, _, png = tf.make_ndarray(events(out).Tensors("heatmap/target")[0].tensor_proto)
    rgb = tf.io.decode_png(png).numpy().astype(int)
    assert rgb.shape[:2] == target.shape
    # Red for positive relevance, blue for negative: on the pixels of clear relevance, the tile's colour has the target's sign.
    clear = np.abs(target) > 0.05 * np.abs(target).max()
    assert clear.sum() >= 10
    np.testing.assert_array_equal(np.sign(rgb[..., 0] - rgb[..., 2])[clear], np.sign(target[clear]))


def test_tensorboard_current_heatmap_only_at_the_rare_log_steps(tmp_path, cache_dir):
    run(train_config(tmp_path, cache_dir, "trainer.steps=20", "trainer.log_every=1", "trainer.steps_per_execution=1"))
    accumulator = events(tmp_path)
    # 20 steps logged each: every 4th is a rare one (RARE_LOGS = 5), where an image costs its rendering.
    assert [event.step for event in accumulator.Tensors("heatmap/current")] == [4, 8, 12, 16, 20]
    assert [step for step, _ in scalar_series(accumulator, "1_match_per_step/loss")] == list(range(1, 21))


def test_tensorboard_text_is_preformatted(default_run):
    out, _ = default_run
    accumulator = events(out)
    for tag in ("config", "diagnosis"):
        assert plugin_of(accumulator, tag) == "text"
        body = tf.make_ndarray(accumulator.Tensors(tag)[0].tensor_proto).item().decode()
        assert body.startswith("```\n") and body.endswith("\n```"), tag  # markdown code block: lines kept
    config_text = tf.make_ndarray(accumulator.Tensors("config")[0].tensor_proto).item().decode()
    assert "name: mse" in config_text and "hidden:" in config_text


def test_tensorboard_hparams_row_holds_compared_keys_and_final_metrics(default_run):
    out, metrics = default_run
    # One job, one run: the row (session and final metrics) lives in the run itself ...
    assert all(name.startswith("events.out.tfevents.") for name in os.listdir(os.path.join(out, "tensorboard")))  # no sub-run
    accumulator = events(out)
    content = accumulator.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    hparams = {key: value for key, value in start.hparams.items()}
    keys = {"task.kind", "model.name", "target.kind", "init.kind", "loss.name", "lrp.composite",
            "optimizer.name", "optimizer.lr", "trainer.steps", "task.epochs"}
    assert set(hparams) == keys
    assert hparams["loss.name"].string_value == "mse" and hparams["trainer.steps"].number_value == 4
    assert start.group_name == os.path.basename(out)
    measured = ("objective", "loss", "cosine", "ssim", "pearson", "spearman", "student_accuracy", "steps")
    assert {tag for tag in accumulator.Tags()["tensors"] if tag.startswith("final/")} == {f"final/{name}" for name in measured}
    for name in measured:
        ((_, value),) = scalar_series(accumulator, f"final/{name}")
        assert value == pytest.approx(metrics[name], rel=1e-6)
    # ... and its experiment names the columns: these keys and the final metrics, no gradient norm
    # (without one, TensorBoard would take every scalar of the run as a metric).
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {info.name for info in experiment.hparam_infos} == keys
    assert [m.name.tag for m in experiment.metric_infos] == [f"final/{name}" for name in FINAL_METRICS]


def test_hparams_row_adds_the_command_lines_keys():
    from heatinv.summaries import compared_hparams

    flat = {"loss.name": "huber", "loss.delta": 0.2, "lrp.gamma": 0.5, "model.hidden": [16, 8], "trainer.steps": 3}
    row = compared_hparams(flat, ["loss=huber", "model.hidden=[16,8]", "debug=smoke"])
    assert row == {"loss.name": "huber", "loss.delta": 0.2, "model.hidden": "[16, 8]", "trainer.steps": 3}


def test_summary_line_gives_each_metric_its_own_value():
    from heatinv.single import SingleTask

    metrics = {"cosine": 0.98765, "ssim": 0.5, "pearson": 0.25, "spearman": 0.125, "loss": 0.00123, "steps": 40,
               "steps_per_second": 1580.4, "reference_accuracy": 0.9, "student_accuracy": 0.75}
    assert SingleTask.summary_line(metrics) == (
        "heatinv: cosine 0.9877  ssim 0.500  pearson 0.2500  spearman 0.125  loss 0.00123  after 40 steps (1580/s); "
        "accuracy reference 0.900, student 0.750"
    )
    # No step timed after the first call: no speed, rather than a made-up one.
    assert "after 1 step; accuracy" in SingleTask.summary_line({**metrics, "steps": 1, "steps_per_second": None})


def test_metrics_json_times_the_whole_loop(default_run):
    out, _ = default_run
    metrics = read_metrics(out)
    parts = metrics["seconds"] + metrics["first_call_seconds"] + metrics["summaries_seconds"] + metrics["checkpoints_seconds"]
    assert 0 < parts <= metrics["loop_seconds"]  # the loop's wall time holds every part it reports
    assert metrics["checkpoints_seconds"] > 0  # the final checkpoint
    assert metrics["loop_steps_per_second"] == pytest.approx(metrics["steps"] / metrics["loop_seconds"])


def test_tensorboard_logs_each_scalar_once_per_step(default_run):
    out, _ = default_run
    steps = [step for step, _ in scalar_series(events(out), "1_match_per_step/loss")]
    assert len(steps) == len(set(steps)), f"loss logged at steps {steps}"


def test_tensorboard_tags_do_not_depend_on_the_cache(tmp_path):
    cache = str(tmp_path / "fresh-cache")
    run(train_config(tmp_path / "miss", cache, "trainer.steps=1"))
    run(train_config(tmp_path / "hit", cache, "trainer.steps=1"))

    def grad_tags(out):
        return sorted(tag for tag in events(out).Tags()["tensors"] if tag.startswith("4_grad_norm"))

    assert grad_tags(tmp_path / "miss") == grad_tags(tmp_path / "hit")


# --------------------------------------------------------------------------- the step


def test_compiled_step_lowers_the_loss_with_nonzero_gradients():
    digits_image = load_dataset("digits").x_test[:1]
    label = tf.constant([3])
    # The target: another network's heatmap for the same image.
    teacher = build_model(Architecture("mlp", hidden=(16, 8)), seed=1)
    target = LRP(teacher, "epsilon_gamma_box")(digits_image, label)
    student = build_model(Architecture("mlp", hidden=(16, 8)), seed=0)
    loss_fn = heatmap_loss("mse")
    step = compile_step(student, LRP(student, "epsilon_gamma_box"), HeatmapMatch(loss_fn), keras.optimizers.Adam(1e-2))

    x = tf.constant(digits_image)
    losses = []
    for i in range(30):
        result = step(x, label, target)
        losses.append(float(result["loss"]))
        if i == 0:
            assert len(result["gradients"]) == len(student.trainable_variables) == 6
            assert np.all(result["grad_norms"].numpy() > 0)
            assert np.all(result["zero_fractions"].numpy() < 1)
            for gradient in result["gradients"]:
                assert np.all(np.isfinite(gradient.numpy()))
    assert all(math.isfinite(value) for value in losses)
    assert losses[-1] < 0.5 * losses[0], losses
    # The weights were updated in place: the student's heatmap now is close to the target too.
    current = LRP(student, "epsilon_gamma_box")(x, label)
    assert float(loss_fn(current, target)) < 0.5 * losses[0]


# --------------------------------------------------------------------------- behaviour


def test_same_seed_and_config_give_identical_metrics(default_run, tmp_path, cache_dir):
    _, first = default_run
    again = run(train_config(tmp_path / "again", cache_dir))
    other_seed = run(train_config(tmp_path / "seed1", cache_dir, "trainer.seed=1"))
    for key in ("loss", "cosine", "ssim", "pearson", "spearman", "student_accuracy"):
        assert again[key] == first[key], key
    # The seed does reach the student: another seed is another run.
    assert other_seed["cosine"] != first["cosine"] and other_seed["loss"] != first["loss"]


def test_reference_init_starts_at_the_target(tmp_path, cache_dir):
    cfg = train_config(tmp_path, cache_dir, "init=reference", "target=digit7")
    parts = build_parts(cfg)
    target = single_target(cfg, parts.dataset, parts.reference)
    initial = explainer_for(parts.student, cfg)(target.image, target.label).numpy()
    np.testing.assert_array_equal(initial, target.heatmap)
    # A random student does not start there (so the check above can fail).
    random_cfg = train_config(tmp_path, cache_dir, "init=random", "target=digit7")
    random_student = build_parts(random_cfg).student
    random_initial = explainer_for(random_student, random_cfg)(target.image, target.label).numpy()
    assert similarity_numpy(random_initial, target.heatmap)["cosine"] < 0.99

    # Nothing to learn: the doctor finds the zero residual and the run stops before step 1
    # (the compiled step's rounding noise would otherwise be amplified by Adam).
    with pytest.raises(GradientsVanished) as stop:
        run(train_config(tmp_path / "run", cache_dir, "init=reference", "target=digit7"))
    assert stop.value.step == 0 and [f.code for f in stop.value.findings] == ["zero-residual"]
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert written["steps"] == 0 and written["cosine"] == pytest.approx(1.0, abs=1e-6)


def logged_target_rgb(output_dir) -> np.ndarray:
    """The first ``heatmap/target`` image in the run's TensorBoard events, decoded."""
    _, _, png = tf.make_ndarray(events(output_dir).Tensors("heatmap/target")[0].tensor_proto)
    return tf.io.decode_png(png).numpy()


def test_pattern_target_runs(tmp_path, cache_dir):
    metrics = run(train_config(tmp_path, cache_dir, "target=pattern", "target.pattern=cross"))
    assert "cross pattern" in metrics["target"]
    assert all(math.isfinite(metrics[key]) for key in SIMILARITIES)
    # The target the run matched is the cross, not the reference's heatmap.
    np.testing.assert_array_equal(logged_target_rgb(tmp_path), diverging_rgb(pattern_map("cross")))


def test_file_target_runs(tmp_path, cache_dir):
    path = tmp_path / "target.npy"
    heatmap = 0.01 * pattern_map("frame")[..., 0] - 0.002 * pattern_map("square")[..., 0]  # signed, [28, 28]
    np.save(path, heatmap)
    out = tmp_path / "out"
    metrics = run(train_config(out, cache_dir, "target=file", f"target.path={path}"))
    assert str(path) in metrics["target"]
    assert all(math.isfinite(metrics[key]) for key in SIMILARITIES)
    np.testing.assert_array_equal(logged_target_rgb(out), diverging_rgb(heatmap))


def test_cnn_model_runs(tmp_path, cache_dir):
    metrics = run(train_config(tmp_path, cache_dir, "model=cnn", "model.filters=[4,8]", "trainer.steps=2"))
    assert metrics["steps"] == 2 and math.isfinite(metrics["loss"])
    student = keras.saving.load_model(tmp_path / "student.keras", safe_mode=True)
    assert [layer.filters for layer in student.layers if isinstance(layer, keras.layers.Conv2D)] == [4, 8]
    tags = set(events(tmp_path).Tags()["tensors"])
    assert {f"4_grad_norm_per_step/{variable_tag(v)}" for v in student.trainable_variables} <= tags


def test_model_file_runs(tmp_path, cache_dir):
    path = tmp_path / "user.keras"
    build_model(Architecture("mlp", hidden=(12,)), seed=5).save(path)
    out = tmp_path / "out"
    metrics = run(train_config(out, cache_dir, "model=file", f"model.path={path}", "trainer.steps=2"))
    assert math.isfinite(metrics["cosine"])
    student = keras.saving.load_model(out / "student.keras", safe_mode=True)
    assert [layer.units for layer in student.layers if isinstance(layer, keras.layers.Dense)] == [12, 10]


def test_model_file_with_open_image_sizes_is_built_for_the_data(tmp_path, cache_dir):
    inputs = keras.Input((None, None, 1))
    features = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, activation="relu")(inputs))
    saved = keras.Model(inputs, keras.layers.Dense(10)(features))
    saved.save(tmp_path / "open.keras")
    cfg = train_config(tmp_path / "out", cache_dir, "model=file", f"model.path={tmp_path / 'open.keras'}", "trainer.steps=2")
    parts = build_parts(cfg)
    assert tuple(parts.reference.inputs[0].shape) == (None, 28, 28, 1)
    x = parts.dataset.x_test[:4]
    np.testing.assert_array_equal(parts.reference(x), saved(x))  # the same weights
    assert math.isfinite(run(cfg)["cosine"])


def test_model_file_with_open_sizes_and_a_list_of_one_input(tmp_path):
    from heatinv.models import with_input_shape

    inputs = keras.Input((None, None, 1))
    saved = keras.Model([inputs], keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(inputs)))
    built = with_input_shape(saved, (28, 28, 1))
    x = np.random.default_rng(0).random((2, 28, 28, 1)).astype("float32")
    assert tuple(built.inputs[0].shape) == (None, 28, 28, 1)
    np.testing.assert_array_equal(built([x]), saved([x]))


def test_a_model_file_no_better_than_guessing_is_warned_about(tmp_path, cache_dir, caplog):
    """A user's model that scores at chance (trained on 0-255 images, say) explains noise: the log says so."""
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10, kernel_initializer="zeros")])
    model.save(tmp_path / "blind.keras")  # every logit 0: always class 0
    cfg = train_config(tmp_path / "out", cache_dir, "model=file", f"model.path={tmp_path / 'blind.keras'}")
    with caplog.at_level("WARNING", logger="heatinv.build"):
        build_parts(cfg)
    assert "no better than always naming its commonest class" in caplog.text and "blind.keras" in caplog.text
    caplog.clear()
    trained = build_parts(train_config(tmp_path / "out2", cache_dir))  # the control: the digits reference
    trained.reference.save(tmp_path / "trained.keras")
    with caplog.at_level("WARNING", logger="heatinv.build"):
        build_parts(train_config(tmp_path / "out3", cache_dir, "model=file", f"model.path={tmp_path / 'trained.keras'}"))
    assert "commonest class" not in caplog.text


def test_a_weights_file_no_better_than_guessing_is_warned_about(tmp_path, cache_dir, caplog):
    from heatinv.build import architecture

    weights = tmp_path / "blind.weights.h5"
    cfg = train_config(tmp_path / "out", cache_dir, f"model.weights={weights}")
    digits = load_dataset("digits")
    model = build_model(architecture(cfg), digits.num_classes, seed=0, input_shape=digits.input_shape)
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])  # every logit 0: always class 0
    model.save_weights(weights)
    with caplog.at_level("WARNING", logger="heatinv.build"):
        build_parts(cfg)
    assert f"the model of model.weights={weights} classifies" in caplog.text
    assert "no better than always naming its commonest class" in caplog.text


def test_a_saved_sequential_model_with_open_sizes_is_built_for_the_data(tmp_path):
    """A loaded Sequential has ``inputs`` but no ``input`` ("has never been called"): it raised AttributeError."""
    from heatinv.models import with_input_shape

    keras.Sequential(
        [keras.Input((None, None, 1)), keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    ).save(tmp_path / "open.keras")
    saved = keras.saving.load_model(tmp_path / "open.keras", safe_mode=True)
    built = with_input_shape(saved, (28, 28, 1))
    x = np.random.default_rng(0).random((2, 28, 28, 1)).astype("float32")
    assert tuple(built.inputs[0].shape) == (None, 28, 28, 1)
    np.testing.assert_array_equal(built(x), saved(x))


def test_model_file_with_softplus_optimizes_a_smoothed_student(tmp_path, cache_dir):
    from heatinv.layers import SoftplusBeta

    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(12),
                              keras.layers.ReLU(name="relu"), keras.layers.Dense(10)])
    model.save(tmp_path / "relu.keras")
    overrides = ("model=file", f"model.path={tmp_path / 'relu.keras'}", "model.activation=softplus", "model.beta=7")
    parts = build_parts(train_config(tmp_path / "out", cache_dir, *overrides, "init=reference"))
    (swapped,) = [layer for layer in parts.student.layers if layer.name == "relu"]
    assert isinstance(swapped, SoftplusBeta) and swapped.beta == 7
    assert isinstance(parts.reference.get_layer("relu"), keras.layers.ReLU)  # the file's model, as saved
    for student, reference in zip(parts.student.get_weights(), parts.reference.get_weights()):
        np.testing.assert_array_equal(student, reference)
    # a ReLU inside a nested model (a backbone) is swapped too
    backbone = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(12),
                                 keras.layers.ReLU(name="inner_relu")], name="backbone")
    keras.Sequential([keras.Input((28, 28, 1)), backbone, keras.layers.Dense(10)]).save(tmp_path / "nested.keras")
    overrides = ("model=file", f"model.path={tmp_path / 'nested.keras'}", "model.activation=softplus")
    parts = build_parts(train_config(tmp_path / "nested", cache_dir, *overrides))
    assert isinstance(parts.student.get_layer("backbone").get_layer("inner_relu"), SoftplusBeta)


@pytest.mark.parametrize("loss", ["l1", "mse", "huber"])
def test_each_loss_improves_cosine(tmp_path, cache_dir, loss):
    metrics = run(train_config(tmp_path, cache_dir, f"loss={loss}", "trainer.steps=40", "trainer.log_every=40"))
    (first_step, initial), *_ = scalar_series(events(tmp_path), "1_match_per_step/cosine")
    assert first_step == 1
    assert metrics["cosine"] > initial + 0.1, (initial, metrics["cosine"])
