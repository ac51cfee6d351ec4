"""Reliability: resume after SIGKILL or SIGTERM with the same final numbers; never overwrite results.

The subprocess tests run the real command line, kill it mid-run, resume it, and compare with
an uninterrupted run of the same config and seed (CPU ops are deterministic here).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heatinv.checkpoints import RunDirectoryError, guard_run_directory

TINY = [
    "model.hidden=[16,8]",
    "model.reference_epochs=1",
    "trainer.steps=400",
    "trainer.log_every=50",
    "trainer.checkpoint_every=20",
]
FINAL = ("loss", "cosine", "ssim", "pearson", "spearman", "student_accuracy")


def command(run_dir: Path, cache: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "heatinv.train", *TINY, f"paths.cache_dir={cache}", f"hydra.run.dir={run_dir}", *extra]


def start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(run_dir: Path, process: subprocess.Popen, timeout: float = 120.0) -> None:
    index = run_dir / "checkpoints" / "checkpoint"
    deadline = time.monotonic() + timeout
    while not index.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    cache = root / "cache"
    run_dir = root / "uninterrupted"
    done = subprocess.run(command(run_dir, cache), cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, cache, json.loads((run_dir / "metrics.json").read_text())


def assert_same_final_metrics(run_dir: Path, expected: dict) -> None:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for key in FINAL:
        assert metrics[key] == expected[key], key
    assert metrics["steps"] == expected["steps"]


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_uninterrupted_result(uninterrupted):
    root, cache, expected = uninterrupted
    run_dir = root / "killed"
    process = start(command(run_dir, cache), root)
    wait_for_checkpoint(run_dir, process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not (run_dir / "metrics.json").exists()  # no half-written results
    resumed = subprocess.run(command(run_dir, cache, "trainer.resume=true"), cwd=root, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stdout
    assert_same_final_metrics(run_dir, expected)


@pytest.mark.slow
def test_sigterm_checkpoints_exits_cleanly_and_says_how_to_resume(uninterrupted):
    root, cache, expected = uninterrupted
    run_dir = root / "terminated"
    process = start(command(run_dir, cache), root)
    wait_for_checkpoint(run_dir, process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "SIGTERM received" in stderr and "trainer.resume=true" in stderr and f"hydra.run.dir={run_dir}" in stderr
    assert "Traceback" not in stderr
    resumed = subprocess.run(command(run_dir, cache, "trainer.resume=true"), cwd=root, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_final_metrics(run_dir, expected)


@pytest.mark.slow
def test_a_finished_run_directory_is_not_overwritten(uninterrupted):
    root, cache, _ = uninterrupted
    run_dir = root / "uninterrupted"
    before = (run_dir / "metrics.json").read_bytes()
    again = subprocess.run(command(run_dir, cache), cwd=root, capture_output=True, text=True, timeout=600)
    assert again.returncode == 2
    assert "already holds results" in again.stderr and "trainer.overwrite=true" in again.stderr
    assert "Traceback" not in again.stderr
    assert (run_dir / "metrics.json").read_bytes() == before


def test_guard_run_directory(tmp_path):
    guard_run_directory(str(tmp_path), resume=False, overwrite=False)  # empty: fine
    (tmp_path / "metrics.json").write_text("{}")
    with pytest.raises(RunDirectoryError, match="metrics.json"):
        guard_run_directory(str(tmp_path), resume=False, overwrite=False)
    guard_run_directory(str(tmp_path), resume=True, overwrite=False)
    guard_run_directory(str(tmp_path), resume=False, overwrite=True)


def test_nonfinite_steps_do_not_update_and_stop_the_run(tmp_path, monkeypatch):
    """A NaN loss skips the update; max_nonfinite such steps in a row stop the run with a diagnosis."""
    import keras
    import numpy as np
    import tensorflow as tf
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    import heatinv.train as train
    from heatinv.config import register
    from heatinv.models import build_model

    real = train.heatmap_loss

    def poisoned(*args, **kwargs):
        loss = real(*args, **kwargs)
        return lambda heatmap, target: loss(heatmap, target) * tf.constant(np.nan, heatmap.dtype)

    monkeypatch.setattr(train, "heatmap_loss", poisoned)
    register()
    GlobalHydra.instance().clear()
    out = tmp_path / "run"
    with initialize_config_module(config_module="heatinv.configs", version_base="1.3"):
        cfg = compose("train", overrides=[
            "model.hidden=[16,8]", "model.reference_epochs=1", "trainer.steps=20", "trainer.steps_per_execution=1",
            "trainer.max_nonfinite=4", f"paths.output_dir={out}", f"paths.cache_dir={tmp_path / 'cache'}",
            f"paths.root={tmp_path}",
        ])
    GlobalHydra.instance().clear()
    with pytest.raises(train.GradientsVanished) as stop:
        train.run(cfg)
    assert stop.value.step == 4 and "4 steps in a row up to step 4 had a NaN/Inf loss" in str(stop.value)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nonfinite_steps"] == 4 and metrics["stopped_at_step"] == 4
    student = keras.saving.load_model(out / "student.keras", safe_mode=True)
    untouched = build_model(train.architecture(cfg), 10, seed=cfg.trainer.seed)
    for after, before in zip(student.get_weights(), untouched.get_weights()):
        np.testing.assert_array_equal(after, before)
