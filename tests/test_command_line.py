"""README claims about the command line itself: exit codes and printed text (one subprocess each).

Ctrl-C (exit 130, the checkpoint, the printed resume command, the resumed run) is checked by
tests/test_run_folders.py, whose run stops itself at a known step through the loop's test-only
hook. Time limits are hang detectors, not performance checks.
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


def launch(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    env.pop(TEST_SIGNAL_VARIABLE, None)  # no run here stops itself
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_LIMIT)


@pytest.mark.slow
def test_a_doctor_stop_exits_3_with_the_diagnosis_and_no_traceback(tmp_path, reference_cache):
    """README: "A step whose gradients are all zero ... stops the run with the doctor's diagnosis (exit code 3)"."""
    done = launch(train_command(tmp_path / "run", reference_cache, *DEAD_OUTPUT), tmp_path)
    assert done.returncode == 3, done.stderr[-3000:]
    assert "heatinv: stopped before the first update." in done.stderr
    assert "dead-output" in done.stderr and "lrp.output=logit" in done.stderr  # the finding and its fix
    assert "Traceback" not in done.stderr
    console = done.stdout + done.stderr
    assert console.count("1. dead-output [") == 1, "the doctor's report was printed twice"
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["stopped_at_step"] == 0 and metrics["diagnosis"][0]["code"] == "dead-output"
    # README: train.log holds everything the console showed, the lines of building the run's parts too
    log = (tmp_path / "run" / "train.log").read_text()
    for line in ("heatinv: data digits: ", "heatinv: lrp.low = 0.0 (the digits data's range"):
        assert line in done.stdout and line in log, line


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
    assert "dead-output" in (tmp_path / "run" / "doctor.log").read_text()  # not Hydra's __main__.log


@pytest.mark.slow
def test_python_m_heatinv_doctor_exits_2_when_it_cannot_run(tmp_path):
    """Its docstring: non-zero when it could not run (a config error here), and no doctor.json."""
    done = launch([sys.executable, "-m", "heatinv.doctor", SMOKE, f"hydra.run.dir={tmp_path / 'run'}",
                   f"paths.cache_dir={tmp_path / 'cache'}", "trainer.steps=0"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "heatinv doctor: could not run:" in done.stderr and "trainer.steps" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "doctor.json").exists()


@pytest.mark.parametrize("module", ["train", "doctor"])
def test_help_says_what_the_command_does_and_how_it_exits(tmp_path, module):
    done = launch([sys.executable, "-m", f"heatinv.{module}", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"python -m heatinv.{module} [group=option ...]")  # was "__main__ is powered by Hydra."
    assert "Exit codes: 0 done" in done.stdout and "3 training stopped because every gradient vanished" in done.stdout
    assert "model: cnn, densenet121" in done.stdout  # Hydra's groups follow
    assert not (tmp_path / "outputs").exists()  # --help runs nothing
