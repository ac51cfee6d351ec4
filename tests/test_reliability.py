"""Reliability: resume after SIGKILL or SIGTERM with the same final numbers; damaged checkpoints; changed configs.

The subprocess tests run the real command line. A run stops itself at a known step through
the loop's test-only hook (``HEATINV_TEST_SIGNAL_AT_STEP=N:SIGNAL``, set in the child's
environment only), so no test races a running process. A resumed run is compared with an
uninterrupted run of the same config and seed (CPU ops are deterministic here). Time limits
are hang detectors, not performance checks: each is a multiple of the uninterrupted run's
own duration on this machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import SMOKE, compose_run, expect, train_command
from heatinv.checkpoints import ResumeError, RunDirectoryError, clear_run_directory, guard_run_directory
from heatinv.loop import TEST_SIGNAL_VARIABLE

SINGLE = ["trainer.steps=120", "trainer.log_every=40", "trainer.steps_per_execution=10", "trainer.checkpoint_every=20"]
DATASET = ["experiment=pattern_frame_mlp", "task.epochs=2", "trainer.checkpoint_every=4"]
FINAL_SINGLE = ("loss", "cosine", "ssim", "pearson", "spearman", "student_accuracy", "steps")
FINAL_DATASET = ("cosine", "ssim", "pearson", "spearman", "success_rate", "student_accuracy", "initial_cosine", "steps")
FIRST_RUN_LIMIT = 900  # seconds; a hang detector for the first run, before any duration is known


def launch(run_dir: Path, cache: Path, *overrides: str, signal_at: str | None = None, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    env.pop(TEST_SIGNAL_VARIABLE, None)
    if signal_at:
        env[TEST_SIGNAL_VARIABLE] = signal_at  # this child only; the test session's environment is untouched
    cmd = train_command(run_dir, cache, *overrides)
    return subprocess.run(cmd, cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=timeout)


class Baseline:
    """An uninterrupted run: its metrics, and a time limit for the runs compared with it."""

    def __init__(self, root: Path, cache: Path, overrides: list[str]):
        self.root, self.cache, self.overrides = root, cache, overrides
        started = time.monotonic()
        done = launch(root / "uninterrupted", self.cache, *overrides, timeout=FIRST_RUN_LIMIT)
        assert done.returncode == 0, done.stderr[-3000:]
        self.limit = max(120.0, 5 * (time.monotonic() - started))
        self.metrics = json.loads((root / "uninterrupted" / "metrics.json").read_text())

    def run(self, name: str, *extra: str, signal_at: str | None = None) -> subprocess.CompletedProcess:
        return launch(self.root / name, self.cache, *self.overrides, *extra, signal_at=signal_at, timeout=self.limit)


@pytest.fixture(scope="module")
def single(tmp_path_factory, reference_cache):
    return Baseline(tmp_path_factory.mktemp("single"), reference_cache, SINGLE)


@pytest.fixture(scope="module")
def killed_single(single):
    """A single-task run SIGKILLed after step 70: checkpoints 40 and 60 (the last two) remain."""
    done = single.run("killed", signal_at="70:SIGKILL")
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    run_dir = single.root / "killed"
    assert not (run_dir / "metrics.json").exists()  # no half-written results
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.index")) == ["ckpt-40.index", "ckpt-60.index"]
    return run_dir


def copy_of(run_dir: Path, name: str) -> str:
    shutil.copytree(run_dir, run_dir.parent / name)
    return name


def assert_same_final_metrics(run_dir: Path, expected: dict, keys) -> None:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for key in keys:
        assert metrics[key] == expected[key], key


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_uninterrupted_result(single, killed_single):
    resumed = single.run(copy_of(killed_single, "resumed"), "trainer.resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "after step 60 of 120" in resumed.stdout  # the newest checkpoint before the kill at step 70
    assert_same_final_metrics(single.root / "resumed", single.metrics, FINAL_SINGLE)
    assert logged_events(single.root / "resumed") == logged_events(single.root / "uninterrupted")


@pytest.mark.slow
def test_sigterm_checkpoints_exits_cleanly_and_resumes_after_that_step(single):
    stopped = single.run("terminated", signal_at="90:SIGTERM")
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    run_dir = single.root / "terminated"
    assert "SIGTERM received: stopped after step 90" in stopped.stderr
    assert "trainer.resume=true" in stopped.stderr and f"hydra.run.dir={run_dir}" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    resumed = single.run("terminated", "trainer.resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "after step 90 of 120" in resumed.stdout  # from the SIGTERM checkpoint, not from scratch
    assert_same_final_metrics(run_dir, single.metrics, FINAL_SINGLE)


@pytest.mark.slow
def test_a_finished_run_directory_is_not_overwritten(single):
    run_dir = single.root / "uninterrupted"
    before = (run_dir / "metrics.json").read_bytes()
    record = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    again = single.run("uninterrupted", "loss=l1")
    assert again.returncode == 2
    assert "already holds results" in again.stderr and "trainer.overwrite=true" in again.stderr
    assert "Traceback" not in again.stderr
    assert (run_dir / "metrics.json").read_bytes() == before
    # Hydra rewrote its record (.hydra/overrides.yaml said loss=l1, a run that never happened): put back
    assert {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()} == record


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated data file", "removed index file"])
def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(single, killed_single, damage):
    name = copy_of(killed_single, damage.replace(" ", "-"))
    folder = single.root / name / "checkpoints"
    if damage == "truncated data file":
        data = folder / "ckpt-60.data-00000-of-00001"
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    else:
        (folder / "ckpt-60.index").unlink()
    resumed = single.run(name, "trainer.resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    warnings = [line for line in resumed.stderr.splitlines() if "warning: checkpoint" in line]
    assert len(warnings) == 1 and "ckpt-60" in warnings[0] and "damaged" in warnings[0] and "skipped" in warnings[0]
    assert "after step 40 of 120" in resumed.stdout
    assert_same_final_metrics(single.root / name, single.metrics, FINAL_SINGLE)


@pytest.mark.slow
def test_no_usable_checkpoint_is_a_clear_error(single, killed_single):
    name = copy_of(killed_single, "all-damaged")
    for data in (single.root / name / "checkpoints").glob("ckpt-*.data-*"):
        data.write_bytes(b"")
    resumed = single.run(name, "trainer.resume=true")
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    message = resumed.stderr.splitlines()[-1]
    assert "no checkpoint" in message and "reads back whole" in message
    assert "ckpt-40" in message and "ckpt-60" in message and "trainer.overwrite=true" in message
    assert not (single.root / name / "metrics.json").exists()


@pytest.mark.slow
def test_resuming_with_a_changed_model_names_the_keys(single, killed_single):
    name = copy_of(killed_single, "changed-model")
    resumed = single.run(name, "trainer.resume=true", "model=cnn", "trainer.steps=200")
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr and "incompatible tensor" not in resumed.stderr
    message = resumed.stderr.splitlines()[-1]
    assert "model.name: 'mlp' -> 'cnn'" in message and "trainer.overwrite=true" in message
    assert "trainer.steps" not in message  # a key a resume may change is not refused
    assert not (single.root / name / "metrics.json").exists()


@pytest.mark.slow
def test_dataset_task_resumes_mid_epoch_after_sigkill_to_the_same_metrics(tmp_path_factory, reference_cache):
    dataset = Baseline(tmp_path_factory.mktemp("dataset"), reference_cache, DATASET)
    killed = dataset.run("killed", signal_at="7:SIGKILL")  # epoch 1 has 11 batches of 128 (debug=smoke)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = dataset.run("killed", "trainer.resume=true", "trainer.max_nonfinite=20")  # a key a resume may change
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "after step 4 of 22" in resumed.stdout and "trainer.max_nonfinite: 10 -> 20" in resumed.stdout
    assert "trainer.resume:" not in resumed.stdout  # the switch itself is no changed setting
    assert "heatinv: 18 steps after resuming at step 4 in" in resumed.stdout + resumed.stderr
    assert "before: cosine" not in resumed.stdout + resumed.stderr  # said once, when the run began
    assert_same_final_metrics(dataset.root / "killed", dataset.metrics, FINAL_DATASET)
    # each summary once: none lost with the killed process, the first epoch's not written again
    assert logged_events(dataset.root / "killed") == logged_events(dataset.root / "uninterrupted")


def logged_events(run_dir: Path) -> Counter:
    """How often each (TensorBoard tag, step) was written, over all of a run's event files."""
    import tensorflow as tf

    events = Counter()
    for path in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            events.update((value.tag, event.step) for value in event.summary.value)
    return events


# Early stopping whose best epoch comes before the kill: at lr 0.03 the smoke reference's
# student keeps a validation agreement of 0.37 after epoch 1 and 0.20 after epochs 2 and 3
# (measured), so with task.min_agreement=0.3 only epoch 1 qualifies. A resumed run that lost
# epoch 1's validation scores or weights would end at epoch 0 (the reference) or epoch 3.
EARLY_STOPPING = [
    "experiment=pattern_frame_mlp", "task.epochs=3", "task.early_stopping=true", "optimizer.lr=0.03",
    "task.min_agreement=0.3", "task.max_accuracy_drop=1", "trainer.checkpoint_every=4",
]


@pytest.mark.slow
def test_early_stopping_resumed_after_its_best_epoch_restores_the_same_epoch(tmp_path_factory, reference_cache):
    stopping = Baseline(tmp_path_factory.mktemp("early-stopping"), reference_cache, EARLY_STOPPING)
    assert stopping.metrics["best_epoch"] == 1  # the case this test is about (see EARLY_STOPPING)
    killed = stopping.run("killed", signal_at="13:SIGKILL")  # epoch 2's 4th batch: 9 batches of 128 per epoch
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = stopping.run("killed", "trainer.resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "after step 12 of 27" in resumed.stdout
    assert_same_final_metrics(
        stopping.root / "killed", stopping.metrics, FINAL_DATASET + ("agreement", "best_epoch", "best_validation_cosine")
    )


def test_guard_run_directory(tmp_path):
    guard_run_directory(str(tmp_path), resume=False, overwrite=False)  # empty: fine
    (tmp_path / "metrics.json").write_text("{}")
    with pytest.raises(RunDirectoryError, match="metrics.json") as refused:
        guard_run_directory(str(tmp_path), resume=False, overwrite=False)
    # No checkpoint (a doctor's stop, a run without checkpoints): resuming is not offered, it would be refused.
    assert "no checkpoint to continue from" in str(refused.value) and "resume" not in str(refused.value)
    with pytest.raises(ResumeError, match="holds no checkpoint"):  # results but no checkpoint: nothing to resume from
        guard_run_directory(str(tmp_path), resume=True, overwrite=False)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt-5.index").write_bytes(b"")
    guard_run_directory(str(tmp_path), resume=True, overwrite=False)
    guard_run_directory(str(tmp_path), resume=False, overwrite=True)
    with pytest.raises(RunDirectoryError, match="Extend it with trainer.resume=true"):
        guard_run_directory(str(tmp_path), resume=False, overwrite=False)


def test_resuming_where_no_run_was_is_refused_before_anything_loads(config, tmp_path, monkeypatch):
    import heatinv.train as train

    monkeypatch.setattr(train, "build_parts", lambda cfg: pytest.fail("resume went on to load the data"))
    expect(ResumeError, config("trainer.resume=true"), "trainer.resume=true", "holds no checkpoint", "hydra.run.dir",
           "without trainer.resume")


@pytest.mark.slow
def test_ctrl_c_outside_the_loop_is_one_message_and_exit_130(tmp_path):
    """Ctrl-C while the reference trained printed a KeyboardInterrupt traceback and no way on."""
    # Ctrl-C lands wherever the process is; build_parts (data, reference) is where runs spend their first minutes.
    child = (
        "import sys, heatinv.train as t\n"
        "def interrupted(cfg): raise KeyboardInterrupt\n"
        "t.build_parts = interrupted\n"
        "sys.argv = ['heatinv.train', *sys.argv[1:]]\n"
        "t.main()\n"
    )
    run_dir = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("HYDRA_FULL_ERROR", None)
    done = subprocess.run(
        [sys.executable, "-c", child, *train_command(run_dir, tmp_path / "cache")[3:]],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 128 + signal.SIGINT, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr[-2000:]
    assert f"interrupted (Ctrl-C) outside the training loop, with no checkpoint in {run_dir}" in done.stderr


def test_ctrl_c_outside_the_loop_names_the_checkpoint_to_continue_from(tmp_path):
    from heatinv.train import _interrupted_outside_the_loop

    (tmp_path / "checkpoints").mkdir()
    for step in (20, 40):
        (tmp_path / "checkpoints" / f"ckpt-{step}.index").write_bytes(b"")
    message = _interrupted_outside_the_loop(str(tmp_path))
    assert "after step 40, is kept" in message and f"hydra.run.dir={tmp_path} trainer.resume=true" in message


def test_checkpoints_of_an_unfinished_run_are_neither_reused_nor_lost_silently(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt-20.index").write_bytes(b"")
    with pytest.raises(RunDirectoryError, match="checkpoints of an earlier run.*trainer.resume=true"):
        guard_run_directory(str(tmp_path), resume=False, overwrite=False)
    guard_run_directory(str(tmp_path), resume=True, overwrite=False)
    assert (tmp_path / "checkpoints" / "ckpt-20.index").exists()
    clear_run_directory(str(tmp_path))  # starting over removes them, once the new run is built
    assert not (tmp_path / "checkpoints").exists()


def test_a_resume_never_goes_back_nor_redoes_a_finished_run(composed, reference_cache):
    """Resuming a run checkpointed at step 3550 with the default trainer.steps=300 wrote metrics of
    "300 steps" for the model of step 3550, and TensorBoard dropped the curves in between; resuming a
    finished run replaced its timings with those of no steps."""
    import heatinv.train as train

    settings = ("trainer.checkpoint_every=4", "trainer.steps_per_execution=2")
    cfg, out = composed("trainer.steps=8", *settings)
    train.run(cfg)
    written = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    events = sorted(p.name for p in (out / "tensorboard").iterdir())
    again = lambda *extra: compose_run(out, reference_cache, "trainer.resume=true", *settings, *extra)  # noqa: E731
    # trainer.steps=8 would be the finished run itself: the next length that resumes is 9
    expect(ResumeError, again("trainer.steps=4"), "after step 8, past the 4 steps that trainer.steps=4 asks for",
           "trainer.steps=9 or more")
    expect(RunDirectoryError, again("trainer.steps=8"), "holds a finished run", "step 8 of the 8", "trainer.steps=9 or more",
           "trainer.overwrite=true")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "train.log"} == {
        name: data for name, data in written.items() if name != "train.log"
    }, "nothing was changed"
    assert sorted(p.name for p in (out / "tensorboard").iterdir()) == events
    # A run whose loop ended but whose results were not all written (Ctrl-C or a kill while writing
    # them) finishes them.
    (out / "metrics.json").unlink()
    assert train.run(again("trainer.steps=8"))["steps"] == 8
    (out / "student.keras").unlink()
    assert train.run(again("trainer.steps=8"))["steps"] == 8 and (out / "student.keras").exists()
    assert train.run(again("trainer.steps=16"))["steps"] == 16  # extending goes on
    # Extended, the run's own first length is now a step back (its checkpoints/config.yaml still says 8:
    # read from there, 16 = 2 x 8 was taken for a finished run of "2 steps each").
    expect(ResumeError, again("trainer.steps=8"), "after step 16, past the 8 steps that trainer.steps=8 asks", "trainer.steps=17 or more")
    expect(RunDirectoryError, again("trainer.steps=16"), "holds a finished run", "step 16 of the 16 that trainer.steps=16 asks",
           "trainer.steps=17 or more")
    # TensorBoard keeps a run's first HParams row (trainer.steps=8); final/steps, written last, says 16.
    import tensorflow as tf

    final_steps = [
        float(tf.make_ndarray(value.tensor))
        for path in sorted((out / "tensorboard").glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)
        for event in tf.compat.v1.train.summary_iterator(str(path))
        for value in event.summary.value
        if value.tag == "final/steps"
    ]
    assert final_steps[-1] == 16
    # An extension cut short between checkpoints leaves the results of the run it extends: the run
    # with results of step 8 and its newest checkpoint after step 12 is not finished at 12.
    (out / "metrics.json").write_bytes(written["metrics.json"])
    for path in (out / "checkpoints").glob("ckpt-16.*"):
        path.unlink()
    expect(ResumeError, again("trainer.steps=4"), "after step 12, past the 4 steps", "trainer.steps=12 or more")
    assert train.run(again("trainer.steps=12"))["steps"] == 12


@pytest.mark.slow
def test_an_interrupted_sweep_is_finished_by_resuming_it(tmp_path, reference_cache):
    """The SIGTERM hint of a sweep's job named hydra.run.dir, which a sweep ignores; resuming with
    hydra.sweep.dir failed the jobs that had not started ("holds no checkpoint")."""
    sweep = tmp_path / "sweep"

    def sweep_run(*extra: str, signal_at: str | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        env.pop("HYDRA_FULL_ERROR", None)
        env.pop(TEST_SIGNAL_VARIABLE, None)
        if signal_at:
            env[TEST_SIGNAL_VARIABLE] = signal_at
        command = [sys.executable, "-m", "heatinv.train", "-m", SMOKE, f"paths.cache_dir={reference_cache}", "loss=l1,mse",
                   "trainer.steps=20", "trainer.checkpoint_every=5", "trainer.steps_per_execution=5", f"hydra.sweep.dir={sweep}", *extra]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=FIRST_RUN_LIMIT)

    def summary() -> dict:
        return json.loads((sweep / "sweep_summary.json").read_text())

    stopped = sweep_run(signal_at="10:SIGTERM")  # the basic launcher: job 0 stops, job 1 never starts
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert f"plus: hydra.sweep.dir={sweep} trainer.resume=true" in stopped.stderr
    assert [job["status"] for job in summary()["jobs"]] == ["interrupted"]
    assert "stopped after step 10 (checkpoint ckpt-10)" in summary()["jobs"][0]["error"]

    resumed = sweep_run(f"hydra.sweep.dir={sweep}", "trainer.resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "holds no checkpoint or result of this job; it starts from step 0" in resumed.stdout
    jobs = summary()["jobs"]
    assert [job["status"] for job in jobs] == ["ok", "ok"] and all(job["metrics"]["steps"] == 20 for job in jobs)
    written = {job["dir"]: (sweep / job["dir"] / "metrics.json").read_bytes() for job in jobs}

    again = sweep_run("trainer.resume=true")  # everything finished: kept as it is
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("had finished; its results are kept") == 2
    assert {job["dir"]: (sweep / job["dir"] / "metrics.json").read_bytes() for job in jobs} == written
    assert summary()["ok"] == 2 and summary()["best"] is not None

    extended = sweep_run("trainer.resume=true", "trainer.steps=25")  # the folders leave trainer.steps out of their names
    assert extended.returncode == 0, extended.stderr[-3000:]
    assert extended.stdout.count("after resuming at step 20") == 2
    assert [job["dir"] for job in summary()["jobs"]] == [job["dir"] for job in jobs]
    assert [job["metrics"]["steps"] for job in summary()["jobs"]] == [25, 25]


def test_a_dataset_resume_names_the_epochs(composed, reference_cache):
    import heatinv.train as train

    settings = ("experiment=pattern_frame_mlp", "task.early_stopping=false", "trainer.checkpoint_every=1")
    cfg, out = composed(*settings, "task.epochs=2")
    steps = train.run(cfg)["steps"]
    message = expect(RunDirectoryError, compose_run(out, reference_cache, "trainer.resume=true", *settings, "task.epochs=2"),
                     f"step {steps} of the {steps} that task.epochs=2 ({steps // 2} steps each) asks for", "task.epochs=3 or more")
    assert "trainer.steps" not in message


def test_nonfinite_steps_do_not_update_and_stop_the_run(composed, monkeypatch):
    """A NaN loss skips the update; max_nonfinite such steps in a row stop the run with a diagnosis."""
    import keras
    import numpy as np
    import tensorflow as tf

    import heatinv.single as single_task
    import heatinv.train as train
    from heatinv.build import architecture
    from heatinv.models import build_model

    real = single_task.heatmap_loss

    def poisoned(*args, **kwargs):
        loss = real(*args, **kwargs)
        return lambda heatmap, target: loss(heatmap, target) * tf.constant(np.nan, heatmap.dtype)

    monkeypatch.setattr(single_task, "heatmap_loss", poisoned)
    cfg, out = composed("trainer.steps=20", "trainer.steps_per_execution=1", "trainer.max_nonfinite=4")
    with pytest.raises(train.GradientsVanished) as stop:
        train.run(cfg)
    assert stop.value.step == 4 and "4 steps in a row up to step 4 had a NaN/Inf loss" in str(stop.value)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nonfinite_steps"] == 4 and metrics["stopped_at_step"] == 4
    student = keras.saving.load_model(out / "student.keras", safe_mode=True)
    untouched = build_model(architecture(cfg), 10, seed=cfg.trainer.seed)
    for after, before in zip(student.get_weights(), untouched.get_weights()):
        np.testing.assert_array_equal(after, before)


def test_skipped_updates_that_are_not_in_a_row_do_not_stop_the_run(composed, monkeypatch):
    """Every other update NaN, max_nonfinite=2: the count in a row starts again after each good update."""
    import numpy as np
    import tensorflow as tf

    import heatinv.single as single_task
    import heatinv.train as train

    real, calls = single_task.heatmap_loss, tf.Variable(0, dtype=tf.int64)

    def every_other_one_poisoned(*args, **kwargs):
        loss = real(*args, **kwargs)

        def poisoned(heatmap, target):
            nan = tf.where(calls.assign_add(1) % 2 == 0, tf.constant(np.nan, heatmap.dtype), tf.constant(1.0, heatmap.dtype))
            return loss(heatmap, target) * nan

        return poisoned

    monkeypatch.setattr(single_task, "heatmap_loss", every_other_one_poisoned)
    cfg, out = composed("trainer.steps=8", "trainer.steps_per_execution=1", "trainer.max_nonfinite=2")
    train.run(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nonfinite_steps"] == 4 and metrics.get("stopped_at_step") is None  # updates 2, 4, 6 and 8 skipped


def test_a_resumed_run_goes_on_counting_its_nonfinite_steps(composed, reference_cache, monkeypatch):
    """The skipped updates' total and their run in a row are checkpointed: a resume neither forgets nor restarts them."""
    import numpy as np
    import tensorflow as tf

    import heatinv.single as single_task
    import heatinv.train as train

    real = single_task.heatmap_loss

    def poisoned(*args, **kwargs):
        loss = real(*args, **kwargs)
        return lambda heatmap, target: loss(heatmap, target) * tf.constant(np.nan, heatmap.dtype)

    monkeypatch.setattr(single_task, "heatmap_loss", poisoned)
    settings = ("trainer.steps_per_execution=1", "trainer.log_every=1", "trainer.max_nonfinite=7")
    cfg, out = composed("trainer.steps=5", *settings)
    assert train.run(cfg)["nonfinite_steps"] == 5  # every update skipped, too few in a row to stop
    with pytest.raises(train.GradientsVanished) as stop:
        train.run(compose_run(out, reference_cache, "trainer.steps=10", "trainer.resume=true", *settings))
    # the 6th and 7th skipped updates in a row, not the resumed process's 1st and 2nd
    assert stop.value.step == 7 and "7 steps in a row up to step 7" in str(stop.value)
    assert json.loads((out / "metrics.json").read_text())["nonfinite_steps"] == 7
    counted = {
        event.step: float(tf.make_ndarray(value.tensor))
        for path in sorted((out / "tensorboard").glob("events.out.tfevents.*"))
        for event in tf.compat.v1.train.summary_iterator(str(path))
        for value in event.summary.value
        if value.tag == "3_health_per_step/nonfinite_steps"
    }
    # TensorBoard's count goes on from the checkpoint's (a stopping step writes its diagnosis, not its health)
    assert counted == {step: float(step) for step in range(1, 7)}


def test_a_checkpoint_without_the_nonfinite_counts_still_resumes(tmp_path, rng):
    """Checkpoints written before the counts were kept restore everything else, the counts at 0."""
    import keras
    import numpy as np
    import tensorflow as tf

    from conftest import dense_model
    from heatinv.checkpoints import Checkpointer

    model, optimizer = dense_model(seed=1), keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    completed = tf.Variable(30, dtype=tf.int64, trainable=False)
    old = tf.train.Checkpoint(student=model, optimizer=optimizer, completed=completed)
    tf.train.CheckpointManager(old, str(tmp_path / "checkpoints"), max_to_keep=2).save(checkpoint_number=30)

    fresh = dense_model(seed=2)
    fresh_optimizer = keras.optimizers.Adam(1e-3)
    fresh_optimizer.build(fresh.trainable_variables)
    checkpointer = Checkpointer(str(tmp_path), fresh, fresh_optimizer)
    assert checkpointer.restore() == 30
    assert (checkpointer.nonfinite_steps, checkpointer.nonfinite_streak) == (0, 0)
    for restored, saved in zip(fresh.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(restored, saved)
    # and a checkpoint written now keeps them
    checkpointer.save(40, nonfinite_steps=3, nonfinite_streak=2)
    again_model, again_optimizer = dense_model(seed=3), keras.optimizers.Adam(1e-3)
    again_optimizer.build(again_model.trainable_variables)
    again = Checkpointer(str(tmp_path), again_model, again_optimizer)
    assert again.restore() == 40 and (again.nonfinite_steps, again.nonfinite_streak) == (3, 2)
