"""scripts/bench_zennit.py: runs end to end and times the same heatmap in both libraries (no timing assertions)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import zennit_models as twins

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ["forward_backward", "heatmap_only", "heatmap_only_xla", "torch_forward_backward", "zennit_heatmap"]

pytestmark = pytest.mark.skipif(twins.CROSSCHECK_MISSING is not None, reason=str(twins.CROSSCHECK_MISSING))


@pytest.mark.slow
def test_smoke_run_writes_records_of_the_same_heatmap(tmp_path):
    out = tmp_path / "zennit.json"
    command = [
        sys.executable, os.path.join(ROOT, "scripts", "bench_zennit.py"), "--models", "cnn", "--batch", "2",
        "--repeats", "1", "--min-time", "0", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    assert sorted(r["variant"] for r in records) == VARIANTS
    for record in records:
        assert (record["model"], record["composite"], record["batch"]) == ("cnn", "epsilon_gamma_box", 2)
        assert math.isfinite(record["ms_median"]) and record["ms_median"] > 0
        # float32 heatmaps of the two libraries; measured 2.7e-7 on this case.
        assert record["relative_error"] <= 1e-5
    assert "zennit_heatmap / heatmap_only" in done.stdout
