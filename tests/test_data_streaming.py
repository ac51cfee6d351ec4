"""An image folder is streamed: decoded batch by batch, never whole, with the same numbers as the arrays.

The folder holds drawn shapes (tests/drawn_shapes.py) at 32x32, so decoding is exact (PNG is
lossless, a 32x32 -> 32x32 resize is the identity): the same images saved as an ``.npz`` give
the in-memory path with bit-identical inputs. With the same reference weights
(``model.weights``) the two paths must then give the same targets, held-out metrics and
training, and resume mid-epoch to the uninterrupted run's numbers; the folder path must also
never decode more than a few batches ahead of the step that uses them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import compose_run, train_command
from drawn_shapes import write_folder
from heatinv import data, explanation_cache
from heatinv.data import image_files
from heatinv.build import DatasetProblem, StreamedProblem, architecture, build_parts, dataset_problem, single_target
from heatinv.channel_sum import ChannelSumLRP
from heatinv.explanation_cache import cached_explanations, entry_paths
from heatinv.loop import TEST_SIGNAL_VARIABLE
from heatinv.lrp import LRP
from heatinv.dataset_task import DatasetTask, epoch_order
from heatinv.models import Architecture, build_model, fingerprint, train_reference, validation_split
from heatinv.train import run

SEED = 0  # trainer.seed of the default config: the folder's split seed


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """``(folder, npz, weights)``: a drawn-shapes folder, its split saved as an .npz, and a briefly trained CNN's weights."""
    root = tmp_path_factory.mktemp("streaming")
    folder = write_folder(str(root / "shapes"), count=300)
    ds = data.load_folder(folder, (32, 32), 0.2, seed=SEED)
    # x = k / 255 exactly as the .npz loader computes it, so rounding x * 255 recovers k.
    as_bytes = {key: np.round(getattr(ds, key)[:] * 255).astype(np.uint8) for key in ("x_train", "x_test")}
    np.savez(root / "shapes.npz", **as_bytes, y_train=ds.y_train, y_test=ds.y_test)
    cfg = compose_run(root / "arch", root / "cache", "model=cnn")
    model = build_model(architecture(cfg), 3, seed=0, input_shape=(32, 32, 3))
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(as_bytes["x_train"] / np.float32(255), ds.y_train, epochs=3, batch_size=32, verbose=0)
    model.save_weights(root / "reference.weights.h5")
    return folder, str(root / "shapes.npz"), str(root / "reference.weights.h5")


def configs(tmp_path, shapes, *overrides):
    folder, npz, weights = shapes
    common = ("model=cnn", f"model.weights={weights}", "task=dataset", *overrides)
    streamed = compose_run(tmp_path / "folder", tmp_path / "cache", "data=folder", f"data.path={folder}", *common)
    in_memory = compose_run(tmp_path / "npz", tmp_path / "cache", "data=npz", f"data.path={npz}", *common)
    return streamed, in_memory


def test_a_folder_is_never_converted_whole_and_indexing_decodes_only_what_is_asked(shapes):
    ds = data.load_folder(shapes[0], (32, 32), 0.2, seed=SEED)
    assert ds.streamed and not data.load_npz(shapes[1]).streamed
    with pytest.raises(TypeError, match="never converted whole"):
        np.asarray(ds.x_train)
    assert ds.x_train.largest_read == 0  # loading lists the files, decodes none
    picked = ds.x_train[[5, 2, 7]]
    assert picked.shape == (3, 32, 32, 3) and ds.x_train.largest_read == 3
    np.testing.assert_array_equal(picked[1], ds.x_train[2])
    np.testing.assert_array_equal(ds.x_test[10:20], data.load_npz(shapes[1]).x_test[10:20])


@pytest.mark.parametrize(
    "target", [("target=pattern", "target.pattern=frame"), ("target=suppress", "target.top_k=40"), ("target=swap", "target.like=0", "task.classes=[1,2]")]
)
def test_streamed_targets_equal_the_in_memory_ones(tmp_path, shapes, target):
    streamed_cfg, memory_cfg = configs(tmp_path, shapes, *target)
    streamed_parts, memory_parts = build_parts(streamed_cfg), build_parts(memory_cfg)
    streamed = dataset_problem(streamed_cfg, streamed_parts.dataset, streamed_parts.reference)
    memory = dataset_problem(memory_cfg, memory_parts.dataset, memory_parts.reference)
    assert isinstance(streamed, StreamedProblem) and isinstance(memory, DatasetProblem)
    order = epoch_order(len(memory_parts.dataset.y_train), SEED, 2)
    got = list(streamed.batches(streamed_parts.dataset, "train", 64, order))
    targets = np.concatenate([b.targets for b in got])
    logits = np.concatenate([b.reference_logits for b in got])
    np.testing.assert_array_equal(np.concatenate([b.labels for b in got]), memory_parts.dataset.y_train[order])
    scale = np.abs(memory.train_targets).max()
    # Measured (2-core x86 CPU): max |difference| / max |target| 0 for pattern and suppress, 7e-8
    # for swap (its class mean summed batch by batch in float64, numpy's mean in float32); the
    # logits equal (both explained once, in batches of 256). The margin is for another CPU's rounding.
    np.testing.assert_allclose(targets, memory.train_targets[order], rtol=0, atol=1e-6 * scale)
    np.testing.assert_allclose(logits, memory.train_logits[order], rtol=0, atol=1e-6)
    test = list(streamed.test_batches(streamed_parts.dataset, batch_size=16))
    np.testing.assert_array_equal(np.concatenate([b.chosen for b in test]), memory.test_chosen)
    np.testing.assert_allclose(np.concatenate([b.targets for b in test]), memory.test_targets, rtol=0, atol=1e-6 * scale)
    assert memory.test_chosen.sum() == (60 if target[0] != "target=swap" else np.isin(memory_parts.dataset.y_test, [1, 2]).sum())


def test_the_references_explanations_are_computed_once_per_split_and_reused_from_the_cache(tmp_path, shapes, monkeypatch, caplog):
    streamed_cfg, memory_cfg = configs(tmp_path, shapes, "target=pattern")
    parts, memory_parts = build_parts(streamed_cfg), build_parts(memory_cfg)
    problem = dataset_problem(streamed_cfg, parts.dataset, parts.reference)
    memory = dataset_problem(memory_cfg, memory_parts.dataset, memory_parts.reference)
    cache = tmp_path / "cache"
    assert len(list(cache.glob("explanations-*.npy"))) == 4  # train and test: heatmaps and logits
    maps, logits = problem.explanations["test"]
    assert isinstance(maps, np.memmap) and maps.shape == (60, 32, 32, 1) and logits.shape == (60, 3)
    # The in-memory path explains the .npz's identical images in the same batches of 256:
    # measured equal bit for bit, heatmaps and logits, on both splits.
    np.testing.assert_array_equal(maps, memory.test_maps)
    np.testing.assert_array_equal(logits, memory.test_logits)
    np.testing.assert_array_equal(problem.explanations["train"][1], memory.train_logits)
    # Reused, not recomputed: an entry overwritten with a marker comes back as the marker.
    entry = next(cache.glob("explanations-test-*.maps.npy"))
    marked = np.full(maps.shape, 7.0, np.float32)
    del problem, maps, logits
    np.save(entry, marked)
    with caplog.at_level("INFO", logger="heatinv.explanation_cache"):
        again = dataset_problem(streamed_cfg, parts.dataset, parts.reference)
    assert np.all(next(again.test_batches(parts.dataset)).reference_maps == 7.0)
    assert f"explanations of the held-out images come from the cache ({entry})" in caplog.text  # a reuse is said
    assert len(list(cache.glob("explanations-*.npy"))) == 4
    # Another rule, or other reference weights: other entries, never the stale one.
    other_rule, _ = configs(tmp_path, shapes, "target=pattern", "lrp.epsilon=0.5")
    other = dataset_problem(other_rule, parts.dataset, parts.reference)
    assert not np.any(other.explanations["test"][0] == 7.0) and len(list(cache.glob("explanations-*.npy"))) == 8
    parts.reference.weights[0].assign(parts.reference.weights[0] * 1.01)
    retrained = dataset_problem(streamed_cfg, parts.dataset, parts.reference)
    assert not np.any(retrained.explanations["test"][0] == 7.0) and len(list(cache.glob("explanations-*.npy"))) == 12
    # Changed engine code (a fixed rule, another TensorFlow): other entries too.
    monkeypatch.setattr(explanation_cache, "code_fingerprint", lambda: "another engine")
    dataset_problem(streamed_cfg, parts.dataset, parts.reference)
    assert len(list(cache.glob("explanations-*.npy"))) == 16
    assert not list(cache.glob(".*"))  # no temporary file left behind


def test_a_streamed_dataset_run_gives_the_in_memory_runs_metrics(tmp_path, shapes):
    overrides = ("target=pattern", "target.pattern=frame", "task.epochs=2", "task.batch_size=64")
    metrics = {}
    for cfg in configs(tmp_path, shapes, *overrides):
        run(cfg)
        metrics[cfg.data.name] = json.load(open(f"{cfg.paths.output_dir}/metrics.json"))
    streamed, memory = metrics["folder"], metrics["npz"]
    assert streamed["steps"] == memory["steps"] == 2 * 4  # 240 training images in 4 batches of 64 (the last of 48)
    assert streamed["manipulated_test_images"] == memory["manipulated_test_images"] == 60
    assert streamed["evaluation_seconds"] > 0 and memory["evaluation_seconds"] > 0  # reported by both (its value is a time: not compared)
    for key in ("initial_cosine", "cosine", "ssim", "pearson", "spearman", "student_accuracy", "agreement", "reference_accuracy"):
        # Measured: every value equal (bit for bit) after the 8 steps; the margin is for another
        # CPU's rounding, far below the changes training makes (the cosine moves by 8e-3).
        assert streamed[key] == pytest.approx(memory[key], abs=1e-6), key


def test_early_stopping_on_a_streamed_folder_gives_the_in_memory_runs_choice_and_metrics(tmp_path, shapes):
    # Loose admissibility so that training epochs compete with the start, not only the start itself.
    overrides = ("target=pattern", "task.epochs=2", "task.batch_size=64", "task.early_stopping=true", "task.min_agreement=0.5",
                 "task.max_accuracy_drop=0.5", "optimizer.lr=3e-3")
    metrics = {}
    for cfg in configs(tmp_path, shapes, *overrides):
        run(cfg)
        metrics[cfg.data.name] = json.load(open(f"{cfg.paths.output_dir}/metrics.json"))
    streamed, memory = metrics["folder"], metrics["npz"]
    assert streamed["steps"] == memory["steps"] == 2 * 4  # the 204 fit images of 240 in 4 batches of 64
    assert streamed["best_epoch"] == memory["best_epoch"]
    # Measured: equal bit for bit (the same images, weights and batches); the margin is for another CPU's rounding.
    assert streamed["best_validation_cosine"] == pytest.approx(memory["best_validation_cosine"], abs=1e-6)
    for key in ("initial_cosine", "cosine", "student_accuracy", "agreement"):
        assert streamed[key] == pytest.approx(memory[key], abs=1e-6), key


def test_the_pipeline_never_runs_more_than_a_few_batches_ahead_of_the_step(tmp_path, shapes, monkeypatch):
    decoded = {"count": 0}
    real_decoder = image_files.decoder

    def counting_decoder(image_size, channels=3):
        decode = real_decoder(image_size, channels)

        def bump():
            decoded["count"] += 1
            return 0

        def counted(path):
            with tf.control_dependencies([tf.py_function(bump, [], tf.int32)]):
                return tf.identity(decode(path))

        return counted

    monkeypatch.setattr(image_files, "decoder", counting_decoder)
    seen = {}
    real_begin, real_step = DatasetTask.begin, DatasetTask.step

    def begin(task, summaries):
        real_begin(task, summaries)
        seen["begin"] = decoded["count"]

    def step(task, call):
        seen.setdefault("steps", []).append((call.done, decoded["count"]))
        return real_step(task, call)

    monkeypatch.setattr(DatasetTask, "begin", begin)
    monkeypatch.setattr(DatasetTask, "step", step)
    batch = 16
    # No model.weights: the reference is trained from the folder's pipeline too.
    cfg = compose_run(tmp_path / "run", tmp_path / "cache", "data=folder", f"data.path={shapes[0]}", "model=cnn", "task=dataset",
                      "target=pattern", f"task.batch_size={batch}")
    run(cfg)
    steps = seen["steps"]
    assert [done for done, _ in steps] == list(range(1, 16))  # 240 images, batches of 16, one epoch
    # The prefetch of 2 batches and tf.data's parallel decoding read ahead of the step; the
    # whole epoch is 15 batches. Measured (2 cores): at most 4 batches decoded beyond the one
    # being stepped on; 6 leaves room for more parallel decoding on a machine with more cores.
    for done, count in steps:
        assert count - seen["begin"] <= (done + 6) * batch, (done, count - seen["begin"])
    assert decoded["count"] > seen["begin"] + 14 * batch  # the counter does see the training batches


@pytest.mark.slow  # three command-line runs
def test_a_streamed_dataset_run_resumes_mid_epoch_after_sigkill_to_the_same_metrics(tmp_path, shapes):
    folder, _, weights = shapes
    overrides = ("data=folder", f"data.path={folder}", "model=cnn", f"model.weights={weights}", "task=dataset", "target=pattern",
                 "task.epochs=2", "task.batch_size=32", "trainer.checkpoint_every=4")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop(TEST_SIGNAL_VARIABLE, None)

    def launch(name, *extra, signal_at=None):
        child = {**env, TEST_SIGNAL_VARIABLE: signal_at} if signal_at else env
        return subprocess.run(train_command(tmp_path / name, tmp_path / "cache", *overrides, *extra), cwd=tmp_path, env=child,
                              capture_output=True, text=True, timeout=600)

    done = launch("uninterrupted")
    assert done.returncode == 0, done.stderr[-3000:]
    killed = launch("killed", signal_at="7:SIGKILL")  # epoch 1 has 8 batches of 32: killed mid-epoch, after checkpoint 4
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = launch("killed", "trainer.resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "after step 4 of 16" in resumed.stdout + resumed.stderr
    expected = json.loads((tmp_path / "uninterrupted" / "metrics.json").read_text())
    got = json.loads((tmp_path / "killed" / "metrics.json").read_text())
    for key in ("cosine", "ssim", "pearson", "spearman", "success_rate", "student_accuracy", "initial_cosine", "steps"):
        assert got[key] == expected[key], key  # CPU ops are deterministic: the same batches give the same numbers


def test_mirrored_strategy_on_a_streamed_folder_is_refused_with_the_fix(tmp_path, shapes):
    streamed, _ = configs(tmp_path, shapes, "target=pattern", "trainer.strategy=mirrored")
    with pytest.raises(ValueError) as caught:
        run(streamed)
    message = str(caught.value)
    assert "trainer.strategy=mirrored" in message and "data=npz" in message and "\n" not in message
    assert not (tmp_path / "folder" / "metrics.json").exists()


def test_single_task_reads_its_target_example_from_the_stream(tmp_path, shapes):
    streamed_cfg, memory_cfg = configs(tmp_path, shapes, "task=single", "target=class", "target.label=2", "target.index=3")
    streamed_parts, memory_parts = build_parts(streamed_cfg), build_parts(memory_cfg)
    streamed_parts.dataset.x_test.largest_read = 0  # building read the held-out accuracy's batches
    streamed = single_target(streamed_cfg, streamed_parts.dataset, streamed_parts.reference)
    assert streamed_parts.dataset.x_test.largest_read == 1  # the target decodes its one image
    memory = single_target(memory_cfg, memory_parts.dataset, memory_parts.reference)
    i = int(np.flatnonzero(memory_parts.dataset.y_test == 2)[3])
    np.testing.assert_array_equal(streamed.image, memory_parts.dataset.x_test[i : i + 1])
    np.testing.assert_array_equal(streamed.heatmap, memory.heatmap)  # measured: equal, the same image and weights
    assert streamed.label == memory.label == 2


def test_the_reference_cache_key_follows_the_folders_files_without_reading_them(tmp_path):
    folder = write_folder(str(tmp_path / "shapes"), count=30)
    first = fingerprint(data.load_folder(folder, (32, 32), 0.2, seed=SEED))
    assert fingerprint(data.load_folder(folder, (32, 32), 0.2, seed=SEED)) == first
    assert fingerprint(data.load_folder(folder, (24, 24), 0.2, seed=SEED)) != first  # other image size, other inputs
    ds = data.load_folder(folder, (32, 32), 0.2, seed=SEED)
    changed = ds.x_train.paths[0]
    status = os.stat(changed)
    os.utime(changed, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))  # rewritten at the same size, as `touch` leaves it
    assert fingerprint(data.load_folder(folder, (32, 32), 0.2, seed=SEED)) != first
    with open(changed, "ab") as handle:  # one more byte: size and modification time change
        handle.write(b"\0")
    assert fingerprint(data.load_folder(folder, (32, 32), 0.2, seed=SEED)) != first


def test_the_figure_names_each_rows_class(tmp_path, shapes, monkeypatch):
    from heatinv import dataset_task as manipulate
    from heatinv.train import run

    drawn = []

    def recording(rows, *args, **kwargs):
        drawn.append([row.label for row in rows])
        return figure(rows, *args, **kwargs)

    figure = manipulate.dataset_figure
    monkeypatch.setattr(manipulate, "dataset_figure", recording)
    streamed, _ = configs(tmp_path, shapes, "target=pattern", "task.epochs=1")
    run(streamed)
    assert drawn and all(drawn), drawn
    assert {label for labels in drawn for label in labels} <= {"cross", "disk", "square"}, drawn


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory) -> str:
    """30 drawn shapes (24 training, 6 held-out images at a split of 0.2)."""
    return write_folder(str(tmp_path_factory.mktemp("small") / "shapes"), count=30)


def counted_explain(calls: list):
    """A stand-in for the compiled explainer: heatmap = channel sum x (label + 1), logits = one-hot x mean pixel."""

    def explain(x, labels):
        calls.append(len(labels))
        scale = tf.cast(labels + 1, tf.float32)[:, None, None, None]
        mean = tf.reduce_mean(x, axis=[1, 2, 3])[:, None]
        return tf.reduce_sum(x, axis=-1, keepdims=True) * scale, tf.one_hot(labels, 3) * mean

    return explain


def tiny_explainer(cls=LRP, activation="relu"):
    keras.backend.clear_session()  # as build_parts: the layers' automatic names (in the model's JSON) start again
    keras.utils.set_random_seed(0)
    return cls(build_model(Architecture("cnn", filters=(2,), activation=activation), 3, input_shape=(32, 32, 3)))


def test_cached_explanations_hold_each_images_numbers_in_split_order_read_only(tmp_path, small_folder, caplog):
    ds = data.load_folder(small_folder, (32, 32), 0.2, seed=SEED)
    calls = []
    maps, logits = cached_explanations(counted_explain(calls), tiny_explainer(), ds, "test", str(tmp_path), {"epsilon": 0.1})
    # The files decoded by PIL, in the split's order: PNG is lossless and 32x32 -> 32x32 is no resize.
    images = np.stack([np.asarray(Image.open(path).convert("RGB"), np.float64) / 255 for path in ds.x_test.paths])
    labels = np.asarray(ds.y_test)
    assert maps.shape == (6, 32, 32, 1) and logits.shape == (6, 3) and maps.dtype == logits.dtype == np.float32
    np.testing.assert_allclose(maps, images.sum(-1, keepdims=True) * (labels + 1)[:, None, None, None], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(logits, np.eye(3)[labels] * images.mean(axis=(1, 2, 3))[:, None], rtol=1e-6, atol=1e-7)
    assert not maps.flags.writeable and not logits.flags.writeable  # the cache entry is never written through
    assert calls == [6]
    for _ in range(2):
        with caplog.at_level("INFO", logger="heatinv.explanation_cache"):
            maps, _ = cached_explanations(counted_explain(calls), tiny_explainer(), ds, "train", str(tmp_path), {"epsilon": 0.1})
    assert maps.shape == (24, 32, 32, 1) and calls == [6, 24]
    assert "explanations of the training images come from the cache" in caplog.text


def test_an_entry_missing_either_file_is_computed_again(tmp_path, small_folder):
    ds = data.load_folder(small_folder, (32, 32), 0.2, seed=SEED)
    explainer, calls = tiny_explainer(), []
    maps_path, logits_path = entry_paths(str(tmp_path), explainer, ds, "test", {})
    for missing in (logits_path, maps_path):
        cached_explanations(counted_explain(calls), explainer, ds, "test", str(tmp_path), {})
        os.remove(missing)
    cached_explanations(counted_explain(calls), explainer, ds, "test", str(tmp_path), {})
    assert calls == [6, 6, 6]
    assert sorted(os.listdir(tmp_path)) == sorted(map(os.path.basename, (maps_path, logits_path)))


def test_a_pipeline_that_gives_fewer_images_than_the_split_leaves_no_entry(tmp_path, small_folder, monkeypatch):
    ds = data.load_folder(small_folder, (32, 32), 0.2, seed=SEED)
    whole = data.Dataset.batches
    monkeypatch.setattr(data.Dataset, "batches", lambda self, split, size, *a, **k: whole(self, split, size, *a, **k).unbatch().take(5).batch(size))
    with pytest.raises(RuntimeError, match="explained 5 of the 6 images of the test split"):
        cached_explanations(counted_explain([]), tiny_explainer(), ds, "test", str(tmp_path), {})
    assert os.listdir(tmp_path) == []


def test_an_entry_renames_its_logits_before_its_heatmaps(tmp_path, small_folder, monkeypatch):
    ds = data.load_folder(small_folder, (32, 32), 0.2, seed=SEED)
    renamed = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda source, target: (renamed.append(os.path.basename(target)), replace(source, target)))
    cached_explanations(counted_explain([]), tiny_explainer(), ds, "test", str(tmp_path), {})
    assert [name.split(".", 1)[1] for name in renamed] == ["logits.npy", "maps.npy"]


def test_the_explanation_cache_key_covers_labels_files_explainer_architecture_and_code(tmp_path, small_folder, monkeypatch):
    from heatinv import explanation_cache as cache_module

    folder = shutil.copytree(small_folder, tmp_path / "shapes")
    ds = data.load_folder(str(folder), (32, 32), 0.2, seed=SEED)
    explainer = tiny_explainer()
    settings = {"composite": "epsilon", "epsilon": 0.1}
    base = entry_paths(str(tmp_path), explainer, ds, "test", settings)
    assert entry_paths(str(tmp_path), tiny_explainer(), ds, "test", dict(settings)) == base  # the same inputs: the same entry
    keys = {"base": base}
    keys["labels"] = entry_paths(str(tmp_path), explainer, dataclasses.replace(ds, y_test=np.roll(ds.y_test, 1)), "test", settings)
    keys["image size"] = entry_paths(str(tmp_path), explainer, data.load_folder(str(folder), (24, 24), 0.2, seed=SEED), "test", settings)
    keys["settings"] = entry_paths(str(tmp_path), explainer, ds, "test", {**settings, "epsilon": 0.2})
    keys["channel sum"] = entry_paths(str(tmp_path), tiny_explainer(ChannelSumLRP), ds, "test", settings)
    # Softplus instead of ReLU: the same weights, another function.
    keys["architecture"] = entry_paths(str(tmp_path), tiny_explainer(activation="softplus"), ds, "test", settings)
    touched = ds.x_test.paths[0]
    status = os.stat(touched)
    os.utime(touched, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))  # rewritten at the same size, as `touch` leaves it
    keys["touched"] = entry_paths(str(tmp_path), explainer, ds, "test", settings)
    os.utime(touched, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert entry_paths(str(tmp_path), explainer, ds, "test", settings) == base
    with monkeypatch.context() as patch:
        patch.setattr(keras, "__version__", "0.0.0")
        keys["keras version"] = entry_paths(str(tmp_path), explainer, ds, "test", settings)
    # A copy of the package's sources stands in for the installed one; editing a rule's source changes the key.
    package = tmp_path / "package"
    shutil.copytree(os.path.dirname(cache_module.__file__), package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache_module, "__file__", str(package / "explanation_cache.py"))
    assert entry_paths(str(tmp_path), explainer, ds, "test", settings) == base
    for edited in ("lrp/rules.py", "data/image_files.py", "channel_sum.py"):
        with open(package / edited, "a") as source:
            source.write("\n# edited\n")
        keys[edited] = entry_paths(str(tmp_path), explainer, ds, "test", settings)
    assert len({paths[0] for paths in keys.values()}) == len({paths[1] for paths in keys.values()}) == len(keys), keys


def test_a_streamed_reference_validates_on_the_training_images_its_fit_leaves_out(small_folder, monkeypatch):
    ds = data.load_folder(small_folder, (32, 32), 0.2, seed=SEED)
    seen = {}
    fit = keras.Model.fit

    def recording(self, x, *args, validation_data=None, **kwargs):
        seen["fit"] = np.concatenate([images.numpy() for images, _ in x])
        seen["validation"] = np.concatenate([images.numpy() for images, _ in validation_data])
        return fit(self, x, *args, validation_data=validation_data, **kwargs)

    monkeypatch.setattr(keras.Model, "fit", recording)
    train_reference(Architecture("mlp", hidden=(4,)), ds, epochs=1, seed=SEED)
    fit_idx, val_idx = validation_split(len(ds.y_train), SEED)
    # The files decoded by PIL: the validation images are the held-back training files, in order.
    pixels = [np.asarray(Image.open(path).convert("RGB"), np.float64) / 255 for path in ds.x_train.paths]
    np.testing.assert_allclose(seen["validation"], np.stack([pixels[i] for i in val_idx]), rtol=0, atol=1e-6)
    assert len(seen["fit"]) == len(fit_idx) == len(ds.y_train) - len(val_idx)
