"""Command-line tests: `python -m heatinv.train` in a subprocess, as a user runs it (all `slow`).

Each command runs in a scratch working directory with no `configs/` folder, so the configs
must come from the installed `heatinv.configs` package. A sweep over the three losses runs
once with Hydra's basic launcher (all jobs in one process) and once with the joblib launcher
(two worker processes); both must write every job's outputs, and give the same numbers. Both
sweeps are session fixtures in conftest.py: tests/test_launchers.py reads the joblib one too.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from conftest import SWEEP_LOSSES

pytestmark = pytest.mark.slow

LOSSES = SWEEP_LOSSES


def check_sweep(result: subprocess.CompletedProcess, sweep_dir: str) -> dict[str, dict]:
    """Exit code 0 and, for each job 0, 1, 2, its config, metrics.json and other outputs; metrics by loss."""
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.path.isfile(os.path.join(sweep_dir, "multirun.yaml"))
    by_loss = {}
    for job in range(len(LOSSES)):
        # job folders are named after the job's overrides, e.g. 0_debug=smoke,loss=l1
        (job_dir,) = [os.path.join(sweep_dir, d) for d in os.listdir(sweep_dir) if d.split("_", 1)[0] == str(job)]
        for name in ("metrics.json", "student.keras", "heatmaps.png"):
            assert os.path.isfile(os.path.join(job_dir, name)), f"job {job} lacks {name}"
        assert os.listdir(os.path.join(job_dir, "tensorboard")), f"job {job} wrote no events"
        with open(os.path.join(job_dir, ".hydra", "config.yaml")) as f:
            config = yaml.safe_load(f)
        with open(os.path.join(job_dir, "metrics.json")) as f:
            metrics = json.load(f)
        assert metrics["steps"] == 3
        assert f"loss={config['loss']['name']}" in os.path.basename(job_dir)
        by_loss[config["loss"]["name"]] = metrics
    assert sorted(by_loss) == sorted(LOSSES)
    return by_loss


def test_basic_launcher_sweep(basic_sweep):
    result, sweep_dir = basic_sweep
    metrics = check_sweep(result, sweep_dir)
    assert result.stdout.count("heatinv: cosine") == len(metrics)  # one summary line per job
    assert f"heatinv: look at the sweep with  tensorboard --logdir {sweep_dir}" in result.stdout
    # The jobs shared one reference: trained by the first, loaded from the cache by the others.
    assert len(os.listdir(os.path.join(os.path.dirname(sweep_dir), "cache"))) == 1
    # Nothing lands in the working directory besides what the command named.
    assert sorted(os.listdir(os.path.dirname(sweep_dir))) == ["cache", "sweep"]


def test_joblib_launcher_sweep(joblib_sweep):
    result, sweep_dir = joblib_sweep
    check_sweep(result, sweep_dir)
    assert "Joblib" in result.stdout + result.stderr  # the joblib launcher really ran the jobs


def test_launchers_agree(basic_sweep, joblib_sweep):
    basic = check_sweep(*basic_sweep)
    joblib = check_sweep(*joblib_sweep)
    for loss in LOSSES:
        for key in ("loss", "cosine", "ssim", "pearson", "spearman"):
            assert basic[loss][key] == joblib[loss][key], (loss, key)
