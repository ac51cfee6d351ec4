"""scripts/bench_lxt.py: runs end to end and times the same heatmap in heatinv and LXT (no timing assertions)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import lxt_twins

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ["forward_backward", "heatmap_only", "heatmap_only_xla", "lxt_heatmap", "torch_forward_backward"]

pytestmark = pytest.mark.skipif(lxt_twins.LXT_MISSING is not None, reason=str(lxt_twins.LXT_MISSING))


@pytest.mark.slow
def test_smoke_run_writes_records_of_the_same_heatmap(tmp_path):
    out = tmp_path / "lxt.json"
    command = [
        sys.executable, os.path.join(ROOT, "scripts", "bench_lxt.py"), "--models", "text", "--batch", "2",
        "--repeats", "1", "--min-time", "0", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    assert sorted(r["variant"] for r in records) == VARIANTS
    for record in records:
        assert (record["model"], record["composite"], record["batch"]) == ("text", "attnlrp", 2)
        assert math.isfinite(record["ms_median"]) and record["ms_median"] > 0
        # float32 heatmaps of the two libraries; measured 3e-7 on these models at batch 16.
        assert record["relative_error"] <= 1e-5
    assert "lxt_heatmap / heatmap_only" in done.stdout
