"""scripts/bench_zennit.py and scripts/bench_lxt.py: each runs end to end and times the same heatmap in heatinv
and the other library (no timing assertions)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import lxt_twins
import zennit_models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = {
    # script: (its smoke run's arguments, the case it times, its variants, why it cannot run here or None, a line it prints)
    "bench_zennit.py": (
        ["--models", "cnn"], ("cnn", "epsilon_gamma_box"),
        ["forward_backward", "heatmap_only", "heatmap_only_xla", "torch_forward_backward", "zennit_heatmap"],
        zennit_models.CROSSCHECK_MISSING, "zennit_heatmap / heatmap_only",
    ),
    "bench_lxt.py": (
        ["--models", "text"], ("text", "attnlrp"),
        ["forward_backward", "heatmap_only", "heatmap_only_xla", "lxt_heatmap", "torch_forward_backward"],
        lxt_twins.LXT_MISSING, "lxt_heatmap / heatmap_only",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(CASES))
def test_smoke_run_writes_records_of_the_same_heatmap(script, tmp_path):
    arguments, case, variants, missing, printed = CASES[script]
    if missing is not None:
        pytest.skip(str(missing))
    out = tmp_path / "side_by_side.json"
    command = [
        sys.executable, os.path.join(ROOT, "scripts", script), *arguments, "--batch", "2", "--repeats", "1",
        "--min-time", "0", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    assert sorted(r["variant"] for r in records) == variants
    for record in records:
        assert (record["model"], record["composite"], record["batch"]) == (*case, 2)
        assert math.isfinite(record["ms_median"]) and record["ms_median"] > 0
        # float32 heatmaps of the two libraries; measured 2.7e-7 (Zennit, this case) and 3e-7 (LXT, batch 16).
        assert record["relative_error"] <= 1e-5
    assert printed in done.stdout
