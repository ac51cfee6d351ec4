"""Dataset-scale manipulation: targets over many images, the combined objective, held-out evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

from heatinv.config import validate
from heatinv.data import TEXT_NAMES
from heatinv.dataset_targets import dataset_targets
from heatinv.lrp import LRP
from heatinv.build import explain_all
from heatinv.dataset_task import evaluate
from heatinv.models import Architecture, accuracy, build_model
from heatinv.targets import pattern_map

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parents[1] / "configs" / "experiment").glob("*.yaml"))
NEEDS_A_FOLDER = "pattern_frame_folder_mobilenetv2"
RUNNABLE_EXPERIMENTS = [
    pytest.param(
        name,
        marks=pytest.mark.skip(
            reason="reads an image folder the user draws first (tests/drawn_shapes.py) and trains a MobileNetV2 for "
            "minutes; MobileNetV2's few-step run at 32x32 is tests/test_own_data.py's"
        ),
    )
    if name == NEEDS_A_FOLDER
    else name
    for name in EXPERIMENTS
]


@pytest.fixture
def maps(rng):
    labels = np.array([0, 1, 2, 1, 0, 2])
    heatmaps = rng.uniform(0, 1, (6, 28, 28, 1)).astype("float32")
    return labels, heatmaps


def test_pattern_targets_keep_each_images_total_and_move_only_chosen_classes(maps):
    labels, heatmaps = maps
    targets, chosen = dataset_targets("pattern", labels, heatmaps, classes=[1], pattern="frame")
    assert chosen.tolist() == [False, True, False, True, False, False]
    np.testing.assert_array_equal(targets[~chosen], heatmaps[~chosen])
    frame = pattern_map("frame")
    for i in np.flatnonzero(chosen):
        np.testing.assert_allclose(targets[i].sum(), heatmaps[i].sum(), rtol=1e-4)
        np.testing.assert_allclose(targets[i] / targets[i].sum(), frame / frame.sum(), atol=1e-7)


def test_swap_targets_take_the_like_class_mean_from_the_given_source(maps):
    labels, heatmaps = maps
    source_labels = np.array([0, 0, 5])
    left, top, corner = (np.zeros((28, 28, 1), "float32") for _ in range(3))
    left[:, :14], top[:14], corner[27, 27] = 1.0, 3.0, 100.0
    source_maps = np.stack([left, top, corner])
    targets, chosen = dataset_targets("swap", labels, heatmaps, classes=[2], like=0, like_heatmaps=(source_labels, source_maps))
    assert chosen.sum() == 2
    # The class-0 mean by hand: (1 + 3) / 2 in the top-left quadrant, 3 / 2 top-right, 1 / 2
    # bottom-left, 0 bottom-right; 196 pixels each, 784 in all. The class-5 map plays no part.
    mean = np.zeros((28, 28, 1))
    mean[:14, :14], mean[:14, 14:], mean[14:, :14] = 2.0, 1.5, 0.5
    for i in np.flatnonzero(chosen):
        np.testing.assert_allclose(targets[i], mean / 784 * heatmaps[i].sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="no images of class 7"):
        dataset_targets("swap", labels, heatmaps, like=7)


def test_a_swap_class_mean_that_sums_below_zero_keeps_its_signs(maps):
    """Divided by its own total (-1 here), the mean turned into its opposite: evidence against where it had evidence for."""
    labels, heatmaps = maps
    mean = np.zeros((28, 28, 1), "float32")
    mean[:4], mean[4:] = 1.0, -0.5  # 112 pixels of 1 and 672 of -0.5: sums to -224
    targets, chosen = dataset_targets("swap", labels, heatmaps, classes=[2], like=0, like_mean=mean)
    for i in np.flatnonzero(chosen):
        np.testing.assert_allclose(targets[i], mean / 224 * abs(heatmaps[i].sum()), rtol=1e-5)


def test_suppress_targets_empty_the_top_k_pixels_and_keep_the_total(maps):
    labels, heatmaps = maps
    targets, _ = dataset_targets("suppress", labels, heatmaps, top_k=30)
    for i in range(len(labels)):
        flat, target = heatmaps[i].ravel(), targets[i].ravel()
        top = np.argsort(-flat)[:30]
        assert np.all(target[top] == 0) and np.count_nonzero(target) == flat.size - 30
        np.testing.assert_allclose(target.sum(), flat.sum(), rtol=1e-4)
        # All relevance positive: the rest keep their shares.
        rest = np.delete(np.arange(flat.size), top)
        np.testing.assert_allclose(target[rest] / target.sum(), flat[rest] / flat[rest].sum(), rtol=1e-4)


def test_suppress_targets_give_the_removed_total_to_the_rests_positive_relevance_and_flip_no_sign():
    # A sign-mixed map whose two top pixels hold more than its total (6.5): the rest sums to
    # -1.5, so scaling the whole rest to the total would flip every sign. By hand: the removed
    # 8 goes to the rest's positive 1.5 (1 and 0.5), each times 1 + 8 / 1.5 = 19 / 3; -2 and
    # -1 stay; the total is 19 / 3 * 1.5 - 3 = 6.5.
    heatmap = np.array([5.0, 3.0, -2.0, 1.0, -1.0, 0.5], "float32").reshape(1, 2, 3, 1)
    targets, _ = dataset_targets("suppress", np.array([0]), heatmap, top_k=2)
    np.testing.assert_allclose(targets.ravel(), [0.0, 0.0, -2.0, 19 / 3, -1.0, 19 / 6], rtol=1e-6)
    # Nothing positive left: nothing to give the removed total to; the rest stays as it was.
    only_negative_rest = np.array([4.0, -1.0], "float32").reshape(1, 1, 2, 1)
    targets, _ = dataset_targets("suppress", np.array([0]), only_negative_rest, top_k=1)
    np.testing.assert_array_equal(targets.ravel(), [0.0, -1.0])
    # A positive rest of 1e-7 against 8 removed (below the 1e-3 share): it is rounding noise,
    # not a place to put 8 (it would become the target's peak); it stays as it was too.
    noise_rest = np.array([5.0, 3.0, -2.0, 1e-7], "float32").reshape(1, 1, 4, 1)
    targets, _ = dataset_targets("suppress", np.array([0]), noise_rest, top_k=2)
    np.testing.assert_array_equal(targets.ravel(), np.array([0.0, 0.0, -2.0, 1e-7], "float32"))


def test_pattern_and_swap_targets_of_an_image_scoring_below_zero_are_not_turned_into_their_opposite(maps):
    labels, heatmaps = maps
    heatmaps = heatmaps.copy()
    heatmaps[1] -= 2 * heatmaps[1].mean() + 0.01  # class 1's first image now sums below 0
    total = abs(float(heatmaps[1].sum()))
    frame = pattern_map("frame")
    targets, _ = dataset_targets("pattern", labels, heatmaps, classes=[1], pattern="frame")
    np.testing.assert_allclose(targets[1], frame / frame.sum() * total, rtol=1e-5)
    mean = np.zeros((28, 28, 1), "float32")
    mean[:4] = 2.0
    targets, _ = dataset_targets("swap", labels, heatmaps, classes=[1], like=0, like_mean=mean)
    np.testing.assert_allclose(targets[1], mean / mean.sum() * total, rtol=1e-5)


def test_a_swap_class_mean_summing_to_zero_is_refused(maps):
    labels, heatmaps = maps
    mean = np.zeros((28, 28, 1), "float32")
    mean[0, 0], mean[0, 1] = 1.0, -1.0
    with pytest.raises(ValueError, match="non-zero total"):
        dataset_targets("swap", labels, heatmaps, like=0, like_mean=mean)


def test_suppress_of_a_map_with_nothing_positive_empties_the_top_k_and_keeps_the_rest():
    # The all-zero map has nothing removed and nothing to receive it (0 / 0); the all-negative
    # one removes a negative total (its largest values) with nothing positive to take it.
    heatmaps = np.array([[0.0, 0.0, 0.0], [-1.0, -3.0, -0.5]], "float32").reshape(2, 1, 3, 1)
    targets, _ = dataset_targets("suppress", np.array([0, 0]), heatmaps, top_k=1)
    np.testing.assert_array_equal(targets.reshape(2, 3), [[0.0, 0.0, 0.0], [-1.0, -3.0, 0.0]])


@pytest.mark.parametrize(("rest", "target"), [(0.016, 8.016), (0.004, 0.004)], ids=["two_thousandths", "half_a_thousandth"])
def test_suppress_gives_the_removed_total_only_to_a_rest_holding_a_thousandth_of_it(rest, target):
    heatmap = np.array([8.0, rest], "float32").reshape(1, 1, 2, 1)
    targets, _ = dataset_targets("suppress", np.array([0]), heatmap, top_k=1)
    np.testing.assert_allclose(targets.ravel(), [0.0, target], rtol=1e-6)


@pytest.mark.parametrize(("kind", "like_feature"), [("suppress_feature", None), ("swap_features", 2)])
def test_feature_targets_move_only_the_chosen_classes_rows(kind, like_feature):
    labels = np.array([0, 1, 0, 1])
    maps = np.array([[2.0, 1.0, 1.0], [2.0, 1.0, 1.0], [-1.0, 3.0, 1.0], [-1.0, 3.0, 1.0]], "float32")
    targets, chosen = dataset_targets(kind, labels, maps, classes=[1], feature=0, like_feature=like_feature)
    assert chosen.tolist() == [False, True, False, True]
    np.testing.assert_array_equal(targets[~chosen], maps[~chosen])
    # By hand: 2 shared by |1| and |1| (or given to feature 2); -1 shared 3 : 1 (or given to feature 2).
    moved = [[0.0, 2.0, 2.0], [0.0, 2.25, 0.75]] if like_feature is None else [[0.0, 1.0, 3.0], [0.0, 3.0, 0.0]]
    np.testing.assert_allclose(targets[chosen], moved, rtol=1e-6)


def test_pattern_targets_on_wide_images_are_drawn_at_their_height_and_width():
    """The frame was drawn 32x32 for 32x48 maps and failed to broadcast, after the reference had trained."""
    heatmaps = np.random.default_rng(0).uniform(0, 1, (2, 32, 48, 1)).astype("float32")
    targets, _ = dataset_targets("pattern", np.array([0, 1]), heatmaps, pattern="frame")
    drawn = np.zeros((32, 48))  # 28x28's 1 in and 2 thick, in proportion: rows 1 in, 2 thick; columns 2 in, 3 thick
    drawn[1:31, 2:46] = 1
    drawn[3:29, 5:43] = 0
    for i in range(2):
        np.testing.assert_allclose(targets[i, ..., 0], drawn / drawn.sum() * heatmaps[i].sum(), rtol=1e-5)


def test_pattern_targets_of_per_channel_maps_keep_each_images_total():
    """With target.channels=keep each channel got the whole total, so the target held 3 times the reference's."""
    heatmaps = np.random.default_rng(0).uniform(0, 1, (2, 28, 28, 3)).astype("float32")
    targets, _ = dataset_targets("pattern", np.array([0, 1]), heatmaps, pattern="square")
    np.testing.assert_allclose(targets.reshape(2, -1).sum(1), heatmaps.reshape(2, -1).sum(1), rtol=1e-5)


def test_unknown_dataset_target_is_refused(maps):
    with pytest.raises(ValueError, match="expected one of"):
        dataset_targets("rotate", *maps)


@pytest.mark.parametrize(("shape", "unit"), [((28, 28, 1), "images"), ((30,), "examples")])
def test_explaining_a_set_counts_images_or_a_tables_examples(rng, caplog, shape, unit):
    """The fairwashing run's progress said "427/427 images" of a table's rows."""
    model = build_model(Architecture(hidden=(4,)), num_classes=2, input_shape=shape, seed=0)
    x = rng.uniform(0, 1, (5, *shape)).astype("float32")
    caplog.set_level("INFO", logger="heatinv.progress")
    explain_all(LRP(model, "epsilon"), x, np.zeros(5, "int64"), what="the training set")
    assert caplog.records and caplog.records[-1].getMessage().endswith(f"5/5 {unit} (100%), 0 s"), caplog.text


def test_a_swap_named_by_class_gives_held_out_images_the_training_mean_of_that_class(composed):
    from heatinv.build import architecture, dataset_problem
    from heatinv.data import load_dataset

    cfg, _ = composed("data=tabular", "task=dataset", "target=swap", "target.like=benign", "task.classes=[malignant]", "lrp=epsilon")
    ds = load_dataset("breast_cancer")
    reference = build_model(architecture(cfg), ds.num_classes, seed=0, input_shape=ds.input_shape)  # untrained: any maps do
    problem = dataset_problem(cfg, ds, reference)
    assert problem.description == "swap like class 1 (benign) (classes [0 (malignant)])"
    assert problem.test_chosen.tolist() == (ds.y_test == 0).tolist()
    # Class 1 does not move, so its training targets are the reference's own maps.
    mean = problem.train_targets[ds.y_train == 1].astype(np.float64).mean(axis=0)
    unit = mean / abs(mean.sum())
    for i in range(len(ds.y_test)):
        total = abs(problem.test_maps[i].astype(np.float64).sum())
        expected = unit * total if ds.y_test[i] == 0 else problem.test_maps[i]
        np.testing.assert_allclose(problem.test_targets[i], expected, rtol=1e-4, atol=1e-6 * max(total, 1e-3), err_msg=str(i))


def test_moved_examples_are_the_first_count_the_target_moves_across_batches():
    from heatinv.build import DatasetProblem, moved_examples

    n = 600
    chosen = np.zeros(n, bool)
    chosen[250:261] = chosen[300:311] = True  # 6 in the first batch of 256, then 16 more
    rows = np.arange(n, dtype=np.float32)
    dataset = SimpleNamespace(x_test=rows[:, None], y_test=np.arange(n) % 3, name="rows")
    problem = DatasetProblem(None, None, None, rows[:, None], rows[:, None], -rows[:, None], chosen, "test")
    x, labels, targets = moved_examples(problem, dataset, count=16)
    first = np.flatnonzero(chosen)[:16]
    assert x[:, 0].tolist() == first.tolist() and labels.tolist() == (first % 3).tolist()
    assert targets[:, 0].tolist() == (-first).tolist()


def test_evaluate_scores_the_given_held_out_images(rng):
    model = build_model(Architecture(hidden=(16, 8)), seed=0)
    x = rng.uniform(0, 1, (20, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, 20)
    explainer = LRP(model)
    maps, logits = explain_all(explainer, x, y, batch_size=7)
    np.testing.assert_allclose(maps, explainer(x, y.astype("int32")).numpy(), rtol=1e-5, atol=1e-7)
    chosen = y % 2 == 0
    own = np.argmax(logits, -1)
    scores = evaluate(explainer, x, y, maps, chosen, threshold=0.99, reference_classes=own)
    assert scores["cosine"] == pytest.approx(1.0, abs=1e-5) and scores["success_rate"] == 1.0
    assert scores["student_accuracy"] == pytest.approx(accuracy(model, x, y))
    shuffled = maps[::-1].copy()
    assert evaluate(explainer, x, y, shuffled, chosen, threshold=0.99, reference_classes=own)["success_rate"] < 1.0




@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_validates(experiment, composed):
    cfg, _ = composed(f"experiment={experiment}")
    validate(cfg)
    assert cfg.task.kind == "dataset" and cfg.init.kind == "reference"
    # The name says the model or the data (or that it is text), and the target (fairwash_*: hiding a feature or a word).
    assert cfg.model.name in experiment or cfg.data.name in experiment or (cfg.data.name in TEXT_NAMES and "text" in experiment)
    first_word = experiment.split("_")[0]
    if first_word == "fairwash":
        assert cfg.target.kind == ("suppress_token" if cfg.data.name in TEXT_NAMES else "suppress_feature")
    else:
        assert cfg.target.kind in first_word


def test_a_small_pattern_experiment_runs_and_reports_held_out_metrics(composed, caplog, monkeypatch):
    import re

    from heatinv.data import load_digits
    from heatinv.dataset_task import DatasetTask
    from heatinv.train import run

    step_losses = []
    real_step = DatasetTask.step

    def step(self, call):
        result = real_step(self, call)
        step_losses.append(float(result["loss"]))
        return result

    monkeypatch.setattr(DatasetTask, "step", step)
    cfg, out = composed("experiment=pattern_frame_mlp", "task.epochs=2")
    with caplog.at_level("INFO"):
        metrics = run(cfg)
    # The progress line at an epoch's end gives the epoch's mean loss, as the epoch's line does (it gave the last batch's)
    epoch_loss = re.search(r"epoch 2/2: loss (\S+) ", caplog.text).group(1)
    assert re.search(rf"\(100%\), \d+ s, loss {re.escape(epoch_loss)}\b", caplog.text), caplog.text[-3000:]
    written = json.loads((out / "metrics.json").read_text())
    for key in ("reference_accuracy", "student_accuracy", "cosine", "ssim", "pearson", "success_rate"):
        assert np.isfinite(written[key]), key
    assert written["manipulated_test_images"] == len(load_digits().y_test)  # held-out images, all classes
    assert metrics["cosine"] > metrics["initial_cosine"]
    student = keras.saving.load_model(out / "student.keras", safe_mode=True)
    data = load_digits()
    assert written["student_accuracy"] == pytest.approx(accuracy(student, data.x_test, data.y_test), abs=1e-9)
    rgb = tf.io.decode_png((out / "heatmaps.png").read_bytes()).numpy()
    assert rgb.shape[-1] in (3, 4) and rgb.shape[0] > rgb.shape[1] / 2  # rows of test images, four panels each
    assert (out / "heatmaps.svg").is_file()
    steps = 2 * -(-len(data.x_train) // 128)  # two epochs of batches of 128 (debug=smoke)
    # Gradient statistics are measured, once per epoch. A pixel that is 0 in every training image
    # (the upsampled digits have empty borders) enters the zbox first-layer rule (low 0, high 1)
    # only through -high * min(w, 0): its kernel entries that start positive get exactly zero
    # gradient, so Adam (m = v = 0) never moves them. The first kernel's zero fraction is at
    # least their share, and those entries end where the reference left them.
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert "1_match_per_epoch/agreement" in tags and 0 <= written["agreement"] <= 1
    zero_tags = sorted(tag for tag in tags if tag.startswith("3_health_per_epoch/zero_grad_fraction/"))
    assert len(zero_tags) == len(student.trainable_variables) == 6
    # Per-epoch values under their own tags: nothing shares a tag with a single run's per-step values.
    assert not any("per_step" in tag for tag in tags)
    for name in ("cosine", "one_minus_cosine", "success_rate", "student_accuracy"):
        assert [e.step for e in events.Tensors(f"1_match_per_epoch/{name}")] == [0, 1, 2]  # before, and each epoch
    assert [e.step for e in events.Tensors("2_train_per_epoch/loss")] == [1, 2]
    # each epoch's training loss is the mean of that epoch's own batches' losses
    per_epoch = np.array(step_losses).reshape(2, -1).mean(-1)
    logged = [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors("2_train_per_epoch/loss")]
    np.testing.assert_allclose(logged, per_epoch, rtol=1e-5)
    assert written["objective"] == pytest.approx(1.0 - written["cosine"])  # what a sweep minimizes
    # The dataset task logs its figure (before and after) and histograms too.
    assert [e.step for e in events.Tensors("heatmap/figure_initial")] == [0]
    assert [e.step for e in events.Tensors("heatmap/figure")] == [2]
    assert any(tag.startswith("weights/") for tag in tags) and any(tag.startswith("gradients/") for tag in tags)
    always_dark = np.all(data.x_train.reshape(len(data.x_train), -1) == 0, axis=0)
    from heatinv.build import build_parts
    from heatinv.models import variable_tag

    start_kernel = build_parts(cfg).reference.get_weights()[0]  # init=reference: the student's start
    frozen = always_dark[:, None] & (start_kernel > 0)
    np.testing.assert_array_equal(student.get_weights()[0][frozen], start_kernel[frozen])
    bound = float(frozen.mean())

    first_kernel = "3_health_per_epoch/zero_grad_fraction/" + variable_tag(student.trainable_variables[0])
    series = [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors(first_kernel)]
    assert [step for step, _ in series] == [1, 2] and bound > 0.05
    assert all(bound <= value < 1 for _, value in series), (series, bound)
    assert written["steps"] == steps and (out / "checkpoints" / f"ckpt-{steps}.index").is_file()


def test_dataset_task_skips_nonfinite_updates_and_stops_after_max_nonfinite(composed, monkeypatch):
    """The shared NaN/Inf guard: a NaN heatmap term skips every update, and 3 in a row stop the run."""
    import heatinv.dataset_task as manipulate
    from heatinv.build import build_parts
    from heatinv.train import GradientsVanished, run

    real = manipulate.per_example_heatmap_loss

    def poisoned(*args, **kwargs):
        loss = real(*args, **kwargs)
        return lambda heatmap, target, unit: loss(heatmap, target, unit) * tf.constant(np.nan, heatmap.dtype)

    monkeypatch.setattr(manipulate, "per_example_heatmap_loss", poisoned)
    cfg, out = composed("experiment=pattern_frame_mlp", "trainer.max_nonfinite=3")
    with pytest.raises(GradientsVanished) as stop:
        run(cfg)
    assert stop.value.step == 3 and "3 steps in a row up to step 3 had a NaN/Inf loss" in str(stop.value)
    # the doctor's probe of the same weights is healthy: said as such, not as a clean bill beside the stop
    assert "no cause the doctor knows" in str(stop.value) and "No problems found" not in str(stop.value)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nonfinite_steps"] == 3 and metrics["stopped_at_step"] == 3
    student = keras.saving.load_model(out / "student.keras", safe_mode=True)
    for after, before in zip(student.get_weights(), build_parts(cfg).reference.get_weights()):  # init=reference
        np.testing.assert_array_equal(after, before)


def test_agreement_is_the_share_of_images_given_the_references_class():
    from heatinv.dataset_task import agreement

    # Hand-made: the student differs from the reference on images 2 and 4 of 5 -> 3/5.
    assert agreement(np.array([3, 1, 4, 1, 5]), np.array([3, 1, 0, 1, 9])) == pytest.approx(0.6)
    assert agreement(np.array([7, 7]), np.array([7, 7])) == 1.0
    with pytest.raises(ValueError, match="agreement"):
        agreement(np.array([1, 2]), np.array([1, 2, 3]))


def test_evaluate_reports_agreement_with_the_references_predictions(rng):
    model = build_model(Architecture(hidden=(16, 8)), seed=0)
    x = rng.uniform(0, 1, (20, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, 20)
    explainer = LRP(model)
    maps, logits = explain_all(explainer, x, y)
    own = np.argmax(logits, -1)
    chosen = np.ones(20, bool)
    assert evaluate(explainer, x, y, maps, chosen, 0.8, reference_classes=own)["agreement"] == 1.0
    # A "reference" that predicts differently on exactly the first 5 images: agreement 15/20.
    other = own.copy()
    other[:5] = (own[:5] + 1) % 10
    assert evaluate(explainer, x, y, maps, chosen, 0.8, reference_classes=other)["agreement"] == pytest.approx(0.75)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", RUNNABLE_EXPERIMENTS)
def test_every_experiment_runs_through_the_command_line_with_the_debug_config(experiment, tmp_path, reference_cache):
    import subprocess

    from conftest import train_command

    run_dir = tmp_path / "run"
    done = subprocess.run(
        train_command(run_dir, reference_cache, f"experiment={experiment}"), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # A quiet console: no TensorFlow retracing warning (the summaries trace no tf.function).
    assert "retracing" not in done.stdout + done.stderr, done.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for key in ("cosine", "success_rate", "student_accuracy", "reference_accuracy", "agreement"):
        assert 0 <= metrics[key] <= 1 or key == "cosine", (key, metrics[key])
    assert f"agreement {metrics['agreement']:.3f}" in done.stdout
    assert f"summaries and held-out evaluations {metrics['summaries_seconds']:.1f} s" in done.stdout
    assert metrics["manipulated_test_images"] > 0
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    if config["data"]["name"] == "digits":
        # README, "Experiments": target=pattern|swap|suppress (the experiment's first word), one
        # epoch of the dataset task under debug=smoke, held-out metrics, a target unlike the start.
        from heatinv.data import load_digits
        from heatinv.models import validation_split

        assert config["target"]["kind"] == experiment.split("_")[0]
        for key in ("cosine", "ssim", "pearson", "success_rate", "reference_accuracy", "student_accuracy", "initial_cosine"):
            assert np.isfinite(metrics[key]), key
        # one epoch of batches of 128, over the reference's fit split where the run stops early on the rest
        trained = len(load_digits().x_train)
        if config["task"]["early_stopping"]:
            trained = len(validation_split(trained, seed=0)[0])
        assert metrics["steps"] == -(-trained // 128)
        assert metrics["initial_cosine"] < 0.99  # the student starts from the reference, whose heatmaps are not yet the targets


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_learning_rate_schedule_follows_its_formula(schedule, composed):
    from heatinv.build import build_parts
    from heatinv.dataset_task import DatasetTask

    cfg, _ = composed("experiment=swap_1_like_0_mlp", f"task.lr_schedule={schedule}", "optimizer.lr=0.01")
    task = DatasetTask(cfg, build_parts(cfg))
    for step in (0, task.total // 3, task.total):
        task.optimizer.iterations.assign(step)
        # cosine: lr * (1 + cos(pi * step / total)) / 2, from the full run's first step to its last
        expected = 0.01 if schedule == "constant" else 0.01 * (1 + np.cos(np.pi * step / task.total)) / 2
        assert float(task.optimizer.learning_rate) == pytest.approx(expected, rel=1e-5, abs=1e-9), step


@pytest.mark.parametrize("min_agreement, max_accuracy_drop", [(0.0, 1.0), (1.0, 0.0)])
def test_early_stopping_restores_the_best_admissible_validation_epoch(composed, monkeypatch, caplog, min_agreement, max_accuracy_drop):
    """The final weights are the ones the student held after the chosen epoch, and the chosen epoch
    is the best validation cosine among the epochs within the limits, read from TensorBoard."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    from heatinv.dataset_task import DatasetTask
    from heatinv.train import run

    snapshots = {}
    real_log, real_begin = DatasetTask.log, DatasetTask.begin

    def begin(self, summaries):
        snapshots[0] = [w.copy() for w in self.student.get_weights()]
        return real_begin(self, summaries)

    def log(self, summaries, call, result):
        snapshots[self.log_step(call.done)] = [w.copy() for w in self.student.get_weights()]
        return real_log(self, summaries, call, result)

    monkeypatch.setattr(DatasetTask, "begin", begin)
    monkeypatch.setattr(DatasetTask, "log", log)
    cfg, out = composed(
        "experiment=pattern_frame_mlp", "task.epochs=4", "task.early_stopping=true", "optimizer.lr=0.01",
        f"task.min_agreement={min_agreement}", f"task.max_accuracy_drop={max_accuracy_drop}",
    )
    with caplog.at_level("INFO", logger="heatinv.dataset_task"):
        metrics = run(cfg)
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0}).Reload()

    def series(name):
        return {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors(f"validation_per_epoch/{name}")}

    cosine, agreement_, accuracy_ = series("cosine"), series("agreement"), series("student_accuracy")
    assert sorted(cosine) == [0, 1, 2, 3, 4] and agreement_[0] == 1.0  # epoch 0 is the reference itself
    admissible = [e for e in cosine if agreement_[e] >= min_agreement and accuracy_[e] >= accuracy_[0] - max_accuracy_drop]
    best = max(admissible, key=lambda e: (cosine[e], -e))  # the first of equal cosines
    assert metrics["best_epoch"] == best and metrics["best_validation_cosine"] == pytest.approx(cosine[best], abs=1e-6)
    if min_agreement == 0.0:
        assert best > 0, "a permissive limit must let training help the validation cosine"
    for epoch in range(1, 5):  # each epoch's line says whether it was admissible, and which limit it broke
        line = next(r.message for r in caplog.records if r.message.startswith(f"epoch {epoch}/4:"))
        assert f"validation cosine {cosine[epoch]:.3f} agreement {agreement_[epoch]:.3f} accuracy {accuracy_[epoch]:.3f}" in line
        assert ("not admissible" in line) == (epoch not in admissible), line
        assert ("task.min_agreement" in line) == (agreement_[epoch] < min_agreement), line
        assert ("task.max_accuracy_drop" in line) == (accuracy_[epoch] < accuracy_[0] - max_accuracy_drop), line
    if best > 0:  # the console names the epoch it kept (only a kept start was said)
        assert f"task.early_stopping: kept epoch {best} of 4 (validation cosine {cosine[best]:.4f}" in caplog.text
    student = keras.saving.load_model(out / "student.keras", safe_mode=True)
    for final, kept in zip(student.get_weights(), snapshots[best]):
        np.testing.assert_array_equal(final, kept)
    assert any(not np.array_equal(a, b) for a, b in zip(snapshots[4], snapshots[best])) or best == 4


def test_kl_teacher_term_is_the_tempered_distillation_loss():
    from heatinv.dataset_task import Manipulation

    student = np.array([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]], "float32")
    reference = np.array([[0.0, 1.0, 3.0], [0.0, 0.0, 0.0]], "float32")
    t = 2.0
    # NumPy: p = softmax(reference / T), q = softmax(student / T), T^2 sum p log(p / q) per image.
    p = np.exp(reference / t) / np.exp(reference / t).sum(-1, keepdims=True)
    q = np.exp(student / t) / np.exp(student / t).sum(-1, keepdims=True)
    expected = t * t * (p * np.log(p / q)).sum(-1)
    kl = Manipulation(None, "none", 1.0, 1.0, 1.0, "kl", t)
    np.testing.assert_allclose(kl.teacher_loss(tf.constant(student), tf.constant(reference)).numpy(), expected, rtol=1e-5, atol=1e-7)
    assert expected[1] == 0.0  # equal logits: nothing to distil
    mse = Manipulation(None, "none", 1.0, 1.0, 1.0)
    np.testing.assert_allclose(mse.teacher_loss(tf.constant(student), tf.constant(reference)).numpy(), ((student - reference) ** 2).mean(-1), rtol=1e-6)


def test_early_stopping_keeps_the_last_epoch_when_nothing_qualifies(composed, caplog, monkeypatch):
    """A random start never agrees with the reference: with min_agreement 1 nothing qualifies, not even the
    start, so the last epoch's weights stay (the untrained start was kept) and the log says so."""
    from heatinv.dataset_task import DatasetTask
    from heatinv.train import run

    last = {}
    real_log = DatasetTask.log

    def log(self, summaries, call, result):
        last["weights"] = [w.copy() for w in self.student.get_weights()]
        return real_log(self, summaries, call, result)

    monkeypatch.setattr(DatasetTask, "log", log)
    cfg, out = composed(
        "experiment=pattern_frame_mlp", "init=random", "task.early_stopping=true", "task.min_agreement=1.0", "task.epochs=2"
    )
    with caplog.at_level("INFO"):
        metrics = run(cfg)
    assert metrics["best_epoch"] is None and metrics["best_validation_cosine"] is None
    assert "best epoch none yet)" in caplog.text and "best epoch 0)" not in caplog.text  # the epoch lines agree
    assert "(not admissible: agreement " in caplog.text and "task.min_agreement=1.0" in caplog.text
    assert json.loads((out / "metrics.json").read_text())["best_validation_cosine"] is None  # valid JSON, no -Infinity
    assert "neither the start nor any of the 2 epochs reached validation agreement 1.0" in caplog.text
    assert "the last epoch's weights are kept" in caplog.text and "init=reference" in caplog.text
    student = keras.saving.load_model(out / "student.keras", safe_mode=True)
    for final, kept in zip(student.get_weights(), last["weights"]):
        np.testing.assert_array_equal(final, kept)


def test_manipulation_loss_is_the_weighted_sum_of_the_terms_batch_means():
    from heatinv.dataset_task import Manipulation

    logits = np.array([[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]], "float32")
    reference = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 1.0]], "float32")
    labels = np.array([0, 2])
    heatmaps = np.array([[1.0, 2.0], [3.0, -1.0]], "float32")
    targets = np.array([[0.0, 2.0], [1.0, 1.0]], "float32")
    explanation = SimpleNamespace(logits=tf.constant(logits), relevance=tf.constant(heatmaps))
    def absolute(heatmap, target, unit):
        return tf.reduce_sum(tf.abs(heatmap - target), axis=-1) / unit

    objective = Manipulation(absolute, "none", 2.0, 3.0, 5.0)
    got = {k: float(v) for k, v in objective(explanation, tf.constant(labels), tf.constant(targets), tf.constant(reference)).items()}
    # NumPy: |h - t| summed per image over the unit max |target| = 2; CE = logsumexp - true logit; MSE of logits.
    heatmap = (np.abs(heatmaps - targets).sum(-1) / 2.0).mean()
    cross_entropy = (np.log(np.exp(logits).sum(-1)) - logits[[0, 1], labels]).mean()
    logit_match = ((logits - reference) ** 2).mean()
    assert got["heatmap"] == pytest.approx(heatmap, rel=1e-5)
    assert got["cross_entropy"] == pytest.approx(cross_entropy, rel=1e-5)
    assert got["logit_match"] == pytest.approx(logit_match, rel=1e-5)
    assert got["loss"] == pytest.approx(2.0 * heatmap + 3.0 * cross_entropy + 5.0 * logit_match, rel=1e-5)


def test_epoch_order_is_a_permutation_drawn_anew_for_each_epoch():
    from heatinv.dataset_task import epoch_order

    orders = [epoch_order(50, 3, epoch) for epoch in (1, 2, 3)]
    for order in orders:
        np.testing.assert_array_equal(np.sort(order), np.arange(50))
    # numpy's own generator seeded with (seed, epoch): a resumed run can redraw any epoch's order
    np.testing.assert_array_equal(orders[1], np.random.default_rng([3, 2]).permutation(50))
    assert not np.array_equal(orders[0], np.arange(50))
    assert len({tuple(order) for order in orders}) == 3
    assert not np.array_equal(epoch_order(50, 4, 1), orders[0])


def test_success_rate_counts_a_cosine_equal_to_the_threshold():
    model = build_model(Architecture(hidden=(16, 8)), seed=0)
    x = np.random.default_rng(0).uniform(0, 1, (6, 28, 28, 1)).astype("float32")
    y = np.arange(6)
    explainer = LRP(model)
    maps, logits = explain_all(explainer, x, y)
    # cosine 1 (the map itself), 0 exactly (an empty target: a zero dot product) and -1 (its opposite)
    targets = np.concatenate([maps[:2], np.zeros_like(maps[2:4]), -maps[4:]])
    scores = evaluate(explainer, x, y, targets, np.ones(6, bool), threshold=0.0, reference_classes=np.argmax(logits, -1))
    assert scores["success_rate"] == pytest.approx(4 / 6)


def test_evaluate_batches_averages_over_images_not_over_batches():
    from heatinv.dataset_task import evaluate_batches

    model = build_model(Architecture(hidden=(16, 8)), seed=0)
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (4, 28, 28, 1)).astype("float32")
    y = np.array([0, 1, 2, 3])
    explainer = LRP(model)
    maps, logits = explain_all(explainer, x, y)
    targets = rng.normal(0, 1, maps.shape).astype("float32")
    targets[:3] = maps[:3] + 0.1 * np.abs(maps[:3]).max() * targets[:3]  # three close to their maps, one random
    flat_maps, flat_targets = maps.reshape(4, -1).astype(np.float64), targets.reshape(4, -1).astype(np.float64)
    by_hand = (flat_maps * flat_targets).sum(-1) / np.linalg.norm(flat_maps, axis=-1) / np.linalg.norm(flat_targets, axis=-1)
    chosen = np.ones(4, bool)
    split = [(x[:3], y[:3], targets[:3], chosen[:3]), (x[3:], y[3:], targets[3:], chosen[3:])]  # unequal batches
    scores = evaluate_batches(explainer, split, 0.5, np.argmax(logits, -1))
    assert abs(by_hand[:3].mean() - by_hand[3]) > 0.1  # a mean of the two batch means would differ
    assert scores["cosine"] == pytest.approx(by_hand.mean(), abs=1e-5)


def test_agreement_of_no_images_is_refused():
    from heatinv.dataset_task import agreement

    with pytest.raises(ValueError, match="non-empty"):
        agreement(np.zeros(0, int), np.zeros(0, int))


def _bare_task(**attributes):
    """A DatasetTask with only the attributes a method under test reads (no data, no reference)."""
    from heatinv.dataset_task import DatasetTask

    task = DatasetTask.__new__(DatasetTask)
    task.__dict__.update(attributes)
    return task


def _early_stopping_config(min_agreement, max_accuracy_drop, epochs=3):
    from omegaconf import OmegaConf

    return OmegaConf.create({"task": {"min_agreement": min_agreement, "max_accuracy_drop": max_accuracy_drop, "epochs": epochs}})


def test_outside_limits_admits_the_limits_themselves_and_names_each_broken_one_with_its_numbers():
    task = _bare_task(cfg=_early_stopping_config(0.75, 0.25), reference_validation_accuracy=0.875)
    at_limits = {"agreement": 0.75, "student_accuracy": 0.875 - 0.25}
    assert task.outside_limits(at_limits) == [] and task.admissible(at_limits)
    broken = task.outside_limits({"agreement": 0.5, "student_accuracy": 0.5})
    assert broken == [
        "agreement 0.500 < task.min_agreement=0.75",
        "accuracy 0.500 < 0.625 (the reference's 0.875 less task.max_accuracy_drop=0.25)",
    ]
    assert not task.admissible({"agreement": 0.74, "student_accuracy": 0.875})


def test_keep_if_best_keeps_the_first_of_the_highest_admissible_validation_cosines():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    scores = iter([
        {"cosine": 0.5, "agreement": 1.0, "student_accuracy": 1.0},  # epoch 1: best so far
        {"cosine": 0.9, "agreement": 0.0, "student_accuracy": 1.0},  # epoch 2: higher, not admissible
        {"cosine": 0.5, "agreement": 1.0, "student_accuracy": 1.0},  # epoch 3: a tie, not better
    ])
    task = _bare_task(
        cfg=_early_stopping_config(0.5, 0.1), reference_validation_accuracy=1.0, student=model,
        evaluate_validation=lambda: next(scores), best_epoch=tf.Variable(0, dtype=tf.int64),
        best_cosine=tf.Variable(0.2, dtype=tf.float64), best_weights=[tf.Variable(tf.zeros_like(w)) for w in model.weights],
    )
    held = {}
    for epoch in (1, 2, 3):
        model.set_weights([np.full(w.shape, epoch, "float32") for w in model.get_weights()])
        task._keep_if_best(epoch)
        held[epoch] = int(task.best_epoch), float(task.best_cosine)
    assert held == {1: (1, 0.5), 2: (1, 0.5), 3: (1, 0.5)}
    assert all(np.all(w.numpy() == 1.0) for w in task.best_weights)  # epoch 1's weights


def test_restore_best_epoch_says_which_epoch_of_how_many_it_kept(caplog):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    kept = [np.full(w.shape, 7.0, "float32") for w in model.get_weights()]
    for best_epoch, said in [(2, "kept epoch 2 of 3 (validation cosine 0.6250"), (0, "the start's weights are kept")]:
        task = _bare_task(
            cfg=_early_stopping_config(0.5, 0.1), steps_per_epoch=4, student=model,
            best_epoch=tf.Variable(best_epoch, dtype=tf.int64), best_cosine=tf.Variable(0.625, dtype=tf.float64),
            best_weights=[tf.Variable(w) for w in kept],
        )
        model.set_weights([np.zeros(w.shape, "float32") for w in model.get_weights()])
        caplog.clear()
        with caplog.at_level("INFO", logger="heatinv.dataset_task"):
            early = task._restore_best_epoch(SimpleNamespace(steps=12))  # 3 epochs of 4 batches
        assert early == {"best_epoch": best_epoch, "best_validation_cosine": 0.625}
        assert said in caplog.text, caplog.text
        assert ("no epoch reached" in caplog.text) == (best_epoch == 0)
        for weight, expected in zip(model.get_weights(), kept):
            np.testing.assert_array_equal(weight, expected)


def test_calls_resumed_mid_epoch_continue_with_the_batches_of_an_uninterrupted_run():
    from omegaconf import OmegaConf

    images = np.arange(10, dtype=np.int32)
    cfg = OmegaConf.create({"task": {"epochs": 2, "batch_size": 4}, "trainer": {"seed": 5}})
    task = _bare_task(cfg=cfg, fit=images, streamed=False, strategy=None, columns=(tf.constant(images),), steps_per_epoch=3)

    def run(start):
        return [(call.done, call.log, call.batch[0].numpy().tolist()) for call in task.calls(start)]

    full = run(0)
    # numpy: each epoch's permutation from (seed, epoch), cut into batches of 4 (the last holds 2)
    expected = []
    for epoch in (1, 2):
        order = np.random.default_rng([5, epoch]).permutation(10)
        expected += [(3 * (epoch - 1) + k + 1, k == 2, order[4 * k : 4 * k + 4].tolist()) for k in range(3)]
    assert full == expected
    for start in (1, 3, 4, 5):
        assert run(start) == full[start:], start


def test_the_figure_draws_the_first_six_moved_held_out_images_and_titles_the_given_metrics(monkeypatch):
    import heatinv.dataset_task as manipulate

    model = build_model(Architecture(hidden=(16, 8)), seed=0)
    rng = np.random.default_rng(2)
    batches = []
    moved = [[False, True, True, False], [False, True, True, False], [True, True, True, False], [True] * 4]
    for first, chosen in zip(range(0, 16, 4), moved):  # four held-out batches of 4 images
        x = rng.uniform(0, 1, (4, 28, 28, 1)).astype("float32")
        batches.append(SimpleNamespace(
            x=x, labels=np.arange(first, first + 4) % 10, targets=rng.normal(0, 1, x.shape).astype("float32"),
            reference_maps=np.zeros_like(x), chosen=np.array(chosen),
        ))
    drawn = []
    monkeypatch.setattr(manipulate, "dataset_figure", lambda rows, title: drawn.append((rows, title)))
    task = _bare_task(
        problem=SimpleNamespace(test_batches=lambda data: iter(batches), description="frame"),
        parts=SimpleNamespace(dataset=SimpleNamespace(class_names=[f"digit {i}" for i in range(10)])),
        explainer=LRP(model), initial={"cosine": 0.125, "success_rate": 0.25, "student_accuracy": 0.5},
    )
    task.figure({"cosine": 0.875, "success_rate": 0.625, "student_accuracy": 0.75})
    task.figure()
    (rows, title), (_, initial_title) = drawn
    assert [row.label for row in rows] == ["digit 1", "digit 2", "digit 5", "digit 6", "digit 8", "digit 9"]
    assert title == "frame: held-out cosine 0.875, success rate 0.625, accuracy 0.750"
    assert initial_title == "frame: held-out cosine 0.125, success rate 0.250, accuracy 0.500"  # the start's
    for row, (b, i) in zip(rows, [(0, 1), (0, 2), (1, 1), (1, 2), (2, 0), (2, 1)]):
        np.testing.assert_array_equal(row.target, batches[b].targets[i])
        student = row.student.ravel().astype(np.float64)
        target = batches[b].targets[i].ravel().astype(np.float64)
        assert row.cosine == pytest.approx(student @ target / np.linalg.norm(student) / np.linalg.norm(target), abs=1e-5)


def test_summary_line_gives_the_held_out_metrics_and_a_tables_feature_shares():
    from heatinv.dataset_task import DatasetTask

    metrics = {"cosine": 0.91234, "success_rate": 0.5, "reference_accuracy": 0.975, "student_accuracy": 0.96, "agreement": 0.98}
    assert DatasetTask.summary_line(metrics) == (
        "heatinv: held-out cosine 0.9123, success rate 0.500; accuracy reference 0.975, student 0.960; agreement 0.980"
    )
    shares = {**metrics, "reference_feature_share": 0.4, "feature_share": 0.05}
    assert DatasetTask.summary_line(shares).endswith("; feature share reference 40.00%, student 5.00%")


def test_batch_constants_repeat_the_global_batchs_unit_and_size_on_every_example():
    from heatinv.dataset_task import _with_batch_constants

    target = np.array([[0.5, -3.0], [1.0, 2.0], [0.0, 0.25]], "float32")
    x, y, ref = np.zeros((3, 2), "float32"), np.zeros(3, "int32"), np.zeros((3, 4), "float32")
    *passed, unit, size = _with_batch_constants("none")(tf.constant(x), tf.constant(y), tf.constant(target), tf.constant(ref))
    for got, given in zip(passed, (x, y, target, ref)):
        np.testing.assert_array_equal(got.numpy(), given)
    np.testing.assert_allclose(unit.numpy(), [3.0] * 3)  # max |target| over the batch
    assert size.numpy().tolist() == [3, 3, 3]


def test_early_stopping_validates_on_the_images_the_reference_held_out(composed):
    from heatinv.build import build_parts
    from heatinv.dataset_task import DatasetTask
    from heatinv.models import validation_split

    cfg, _ = composed("experiment=pattern_frame_mlp", "task.early_stopping=true")
    parts = build_parts(cfg)
    task = DatasetTask(cfg, parts)
    count = len(parts.dataset.y_train)
    _, held_out = validation_split(count, seed=0)  # train_reference(seed=0) fitted on the rest
    np.testing.assert_array_equal(task.validation, held_out)
    assert sorted(np.concatenate([task.fit, task.validation]).tolist()) == list(range(count))
    assert task.steps_per_epoch == -(-(count - len(held_out)) // cfg.task.batch_size)


def test_an_accuracy_exactly_max_accuracy_drop_below_the_references_is_admissible():
    # 7 of 10 validation images against the reference's 8 of 10: a drop of exactly 0.1, which
    # float subtraction puts at 0.7000000000000001 - 0.7 above the student.
    task = _bare_task(cfg=_early_stopping_config(0.0, 0.1), reference_validation_accuracy=8 / 10)
    assert task.outside_limits({"agreement": 1.0, "student_accuracy": 7 / 10}) == []


def test_predicted_classes_covers_every_image_of_a_ragged_last_chunk():
    from heatinv.dataset_task import predicted_classes

    model = build_model(Architecture(hidden=(16, 8)), seed=0)
    x = np.random.default_rng(3).uniform(0, 1, (5, 28, 28, 1)).astype("float32")
    classes = predicted_classes(model, x, batch_size=2)  # chunks of 2, 2 and 1
    np.testing.assert_array_equal(classes, np.argmax(model.predict(x, verbose=0), -1))
