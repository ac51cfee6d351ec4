"""README claims about the command line itself: exit codes, signals and printed text (one subprocess each).

The Ctrl-C test stops the run at a known step with the loop's test-only hook
(``HEATINV_TEST_SIGNAL_AT_STEP=N:SIGINT``, set in the child's environment only), so no test
races a running process. Time limits are hang detectors, not performance checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMOKE, train_command
from heatinv.loop import TEST_SIGNAL_VARIABLE

# A random student whose target-class output is dead behind its final ReLU (seed 0): the
# doctor finds dead-output before the first update (tests/test_doctor.py).
DEAD_OUTPUT = ("model.hidden=[32,16]", "trainer.steps=5", "trainer.log_every=5", "model.output_activation=relu",
               "lrp.output=activation", "target=pattern", "trainer.seed=0")
HANG_LIMIT = 900  # seconds; a loaded 2-core machine takes ~20 s per run


def launch(cmd: list[str], cwd: Path, signal_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    env.pop(TEST_SIGNAL_VARIABLE, None)
    if signal_at:
        env[TEST_SIGNAL_VARIABLE] = signal_at  # this child only
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_LIMIT)


@pytest.mark.slow
def test_a_doctor_stop_exits_3_with_the_diagnosis_and_no_traceback(tmp_path, reference_cache):
    """README: "A step whose gradients are all zero ... stops the run with the doctor's diagnosis (exit code 3)"."""
    done = launch(train_command(tmp_path / "run", reference_cache, *DEAD_OUTPUT), tmp_path)
    assert done.returncode == 3, done.stderr[-3000:]
    assert "heatinv: stopped before the first update." in done.stderr
    assert "dead-output" in done.stderr and "lrp.output=logit" in done.stderr  # the finding and its fix
    assert "Traceback" not in done.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["stopped_at_step"] == 0 and metrics["diagnosis"][0]["code"] == "dead-output"


@pytest.mark.slow
def test_python_m_heatinv_doctor_prints_the_finding_and_writes_doctor_json(tmp_path, reference_cache):
    cmd = [sys.executable, "-m", "heatinv.doctor", SMOKE, f"hydra.run.dir={tmp_path / 'run'}",
           f"paths.cache_dir={reference_cache}", *DEAD_OUTPUT]
    done = launch(cmd, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]  # it could diagnose: exit 0, findings or not
    assert "1 finding:" in done.stdout
    assert "1. dead-output [" in done.stdout and "target class's pre-activation is <= 0" in done.stdout
    assert "fix: Explain the pre-activation score: lrp.output=logit" in done.stdout
    findings = json.loads((tmp_path / "run" / "doctor.json").read_text())
    assert [f["code"] for f in findings] == ["dead-output"]
    assert not (tmp_path / "run" / "metrics.json").exists()  # the doctor trains nothing


@pytest.mark.slow
def test_ctrl_c_checkpoints_exits_130_prints_the_resume_command_and_resumes(tmp_path, reference_cache):
    """README: Ctrl-C stops between two steps, saves a checkpoint and prints how to resume; exit 128 + 2."""
    run_dir = tmp_path / "run"
    overrides = ("trainer.steps=30", "trainer.steps_per_execution=5", "trainer.log_every=10", "trainer.checkpoint_every=100")
    done = launch(train_command(run_dir, reference_cache, *overrides), tmp_path, signal_at="10:SIGINT")
    assert done.returncode == 130, done.stderr[-3000:]
    assert "SIGINT received: stopped after step 10" in done.stderr
    assert f"hydra.run.dir={run_dir} trainer.resume=true" in done.stderr
    assert "Traceback" not in done.stderr and not (run_dir / "metrics.json").exists()
    assert (run_dir / "checkpoints" / "ckpt-10.index").is_file()
    resumed = launch(train_command(run_dir, reference_cache, *overrides, "trainer.resume=true"), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {run_dir} after step 10 of 30" in resumed.stdout
    assert json.loads((run_dir / "metrics.json").read_text())["steps"] == 30
