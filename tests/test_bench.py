"""The benchmark: runs end to end in --quick mode and writes well-formed records (no timing assertions)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from heatinv.bench import RECORD_FIELDS, VARIANTS, HandWrittenStep, parse_args, ratios, write_json
from heatinv.losses import heatmap_loss
from heatinv.lrp import LRP
from heatinv.models import Architecture, build_model


def test_quick_bench_writes_positive_finite_records(tmp_path):
    out = tmp_path / "bench" / "bench.json"
    command = [
        sys.executable, "-m", "heatinv.bench", "--quick",  # the README's command
        "--models", "mlp", "--composites", "epsilon", "--batches", "1",
        "--repeats", "2", "--min-time", "0", "--steps-per-execution", "3", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    assert isinstance(records, list)
    assert sorted(r["variant"] for r in records) == sorted(VARIANTS)
    for record in records:
        assert set(RECORD_FIELDS) <= set(record)
        assert (record["model"], record["composite"], record["batch"]) == ("mlp", "epsilon", 1)
        for field in ("ms_median", "ms_min", "ms_max", "steps_per_second", "peak_rss_mb"):
            value = record[field]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (record["variant"], field, value)
        assert record["ms_min"] <= record["ms_median"] <= record["ms_max"]
        multi = "multi" in record["variant"] or record["variant"] == "keras_fit_xla"
        assert record["steps_per_call"] == (3 if multi else 1)
    assert not [name for name in os.listdir(out.parent) if name != "bench.json"]  # no temporary file left
    for line in ("eager_reference", "multi_step_xla steps/s at batch 1", "heatmap_only / forward_backward"):
        assert line in done.stdout


@pytest.mark.parametrize("composite", ["epsilon", "epsilon_gamma_box"])
def test_hand_written_reference_computes_heatinvs_heatmap(composite, rng):
    """The eager reference is the same computation, so the speedup compares like with like."""
    model = build_model(Architecture("mlp", hidden=(16, 8)), seed=0)
    x = tf.constant(rng.uniform(0, 1, (4, 28, 28, 1)).astype("float32"))
    label = tf.constant([0, 3, 7, 9], tf.int32)
    reference = HandWrittenStep(model, composite, keras.optimizers.Adam(1e-3), heatmap_loss("mse"))
    ours = LRP(model, composite)(x, label).numpy()
    theirs = reference.heatmap(x, label).numpy()
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-6 * np.abs(ours).max())
    before = [w.copy() for w in model.get_weights()]
    loss = reference(x, label, tf.zeros_like(x) + 0.01)
    assert np.isfinite(float(loss)) and any(np.any(a != b) for a, b in zip(before, model.get_weights()))


def test_ratios_and_quick_defaults():
    def record(variant, ms, batch=1):
        return {"variant": variant, "model": "mlp", "composite": "epsilon", "batch": batch, "ms_median": ms, "steps_per_second": 1e3 / ms}

    records = [record("eager_reference", 30.0), record("compiled", 1.5), record("multi_step_xla", 0.4),
               record("heatmap_only", 0.5), record("forward_backward", 0.5),
               record("compiled", 3.0, 64), record("keras_fit", 2.0, 64), record("main_job", 1.0)]  # fmt: skip
    rows = {(r["ratio"], r["batch"]): r for r in ratios(records)}
    assert rows[("default step speedup vs eager reference", 1)]["value"] == pytest.approx(20.0)
    assert rows[("best step speedup vs eager reference", 1)]["value"] == pytest.approx(75.0)
    assert rows[("multi_step_xla steps/s at batch 1", 1)]["met"]
    assert rows[("default step / keras_fit", 64)]["value"] == pytest.approx(1.5)
    assert rows[("heatmap_only / forward_backward", 1)]["met"]
    assert not rows[("main_job steps/s at batch 1", 1)]["met"]  # 1000 steps/s < 2000
    args = parse_args(["--quick"])
    assert args.models == ("mlp",) and args.repeats < parse_args([]).repeats
    assert args.main_job == () and parse_args([]).main_job == (2000, 4000) and parse_args(["--main-job", "0"]).main_job == ()


def test_the_auto_row_compares_what_the_trainer_runs_at_each_batch():
    def record(variant, ms, batch, pick):
        return {"variant": variant, "model": "mlp", "composite": "epsilon", "batch": batch, "ms_median": ms,
                "steps_per_second": 1e3 / ms, "auto_pick": pick}  # fmt: skip

    # batch 1: the single task's loops; batch 64: the dataset task's one update per call,
    # whose loops (never run by the trainer at that batch) must not decide the row
    records = [record("multi_step", 2.0, 1, "xla"), record("multi_step_xla_loop", 1.0, 1, "xla"),
               record("multi_step", 5.0, 64, "function"), record("multi_step_xla_loop", 3.0, 64, "function"),
               record("compiled", 8.0, 64, "function"), record("compiled_xla", 10.0, 64, "function")]  # fmt: skip
    rows = {(r["ratio"], r["batch"]): r for r in ratios(records)}
    assert rows[("auto (xla) / the other mode", 1)]["value"] == pytest.approx(0.5)
    assert rows[("auto (function) / the other mode", 64)]["value"] == pytest.approx(0.8)
    assert rows[("auto (function) / the other mode", 64)]["met"]


def test_bad_bench_arguments_exit_2():
    # 100 and 5100 steps: auto runs the graph step in one and XLA in the other
    for argv in (["--main-job", "100"], ["--main-job", "200,100"], ["--main-job", "100,5100"], ["--composites", "nope"]):
        with pytest.raises(SystemExit) as stop:
            parse_args(argv)
        assert stop.value.code == 2


def test_write_json_is_atomic(tmp_path):
    path = tmp_path / "out.json"
    write_json(str(path), [{"a": 1}])
    with pytest.raises(TypeError):
        write_json(str(path), [{"a": object()}])  # fails half way: the old file stays whole
    assert json.loads(path.read_text()) == [{"a": 1}]
    assert os.listdir(tmp_path) == ["out.json"]
