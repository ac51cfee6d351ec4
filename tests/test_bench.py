"""The benchmark: runs end to end in --quick mode and writes well-formed records (no timing assertions)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf

from heatinv import bench
from heatinv.bench import RECORD_FIELDS, VARIANTS, HandWrittenStep, parse_args, ratio_lines, ratios, table, write_json
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


def _rec(variant, ms, model="mlp", composite="epsilon", batch=1, ms_min=None, pick=""):
    return {"variant": variant, "model": model, "composite": composite, "batch": batch, "ms_median": ms,
            "ms_min": ms if ms_min is None else ms_min, "ms_max": ms, "steps_per_second": 1e3 / ms, "auto_pick": pick,
            "peak_rss_mb": 100.0, "compile_s": 1.0}  # fmt: skip


def test_ratios_divide_medians_and_mins_of_the_fastest_records_by_hand():
    records = [_rec("eager_reference", 30.0, batch=64, ms_min=24.0), _rec("compiled", 2.0, batch=64, ms_min=1.0),
               _rec("multi_step_xla", 1.5, batch=64, ms_min=1.2), _rec("compiled_xla", 1.6, batch=64, ms_min=0.5),
               _rec("keras_fit", 1.0, batch=64, ms_min=0.8), _rec("keras_fit_multi", 0.9, batch=64, ms_min=0.3),
               _rec("keras_fit_xla", 0.6, batch=64, ms_min=0.4),
               _rec("multi_step", 0.8, ms_min=0.25)]  # fmt: skip
    rows = {(r["ratio"], r["batch"]): r for r in ratios(records)}
    default = rows[("default step speedup vs eager reference", 64)]
    assert (default["value"], default["value_from_min"], default["goal"]) == (pytest.approx(15.0), pytest.approx(24.0), ">= 15")
    assert default["met"]  # 15 meets ">= 15"
    # "best" is the lowest median (multi_step_xla), not the lowest min (compiled_xla)
    best = rows[("best step speedup vs eager reference", 64)]
    assert best["detail"] == "eager_reference / multi_step_xla"
    assert (best["value"], best["value_from_min"]) == (pytest.approx(20.0), pytest.approx(20.0))
    keras_row = rows[("default step / keras_fit", 64)]
    assert (keras_row["value"], keras_row["value_from_min"], keras_row["goal"]) == (pytest.approx(2.0), pytest.approx(1.25), "<= 3")
    best_keras = rows[("best step / best keras", 64)]
    assert best_keras["detail"] == "multi_step_xla / keras_fit_xla"
    assert (best_keras["value"], best_keras["value_from_min"]) == (pytest.approx(2.5), pytest.approx(3.0))
    assert best_keras["met"]  # 2.5 <= 3
    steps = rows[("multi_step steps/s at batch 1", 1)]
    assert (steps["value"], steps["value_from_min"], steps["goal"]) == (pytest.approx(1250.0), pytest.approx(4000.0), ">= 2000")
    assert not steps["met"]
    assert not [r for r in rows if r[0].startswith("auto")]  # records without auto_pick have no auto row


def test_ratio_goals_are_met_at_their_threshold_and_missed_past_it():
    def rows_for(eager, heat, fit, multi):
        records = [_rec("eager_reference", eager, batch=64), _rec("compiled", 1.0, batch=64),
                   _rec("heatmap_only", heat, batch=64), _rec("forward_backward", 1.0, batch=64),
                   _rec("keras_fit", fit, batch=64), _rec("multi_step", multi)]  # fmt: skip
        return {r["ratio"]: r["met"] for r in ratios(records)}

    at = rows_for(15.0, 2.0, 1 / 3, 0.5)  # exactly 15x, 2x, 3x, 2000 steps/s
    assert at == {"default step speedup vs eager reference": True, "best step speedup vs eager reference": True,
                  "default step / keras_fit": True, "best step / best keras": True,
                  "heatmap_only / forward_backward": True, "multi_step steps/s at batch 1": True}  # fmt: skip
    past = rows_for(14.9, 2.1, 0.3, 0.51)
    assert not any(past.values()), past


def test_ratios_apply_each_goal_to_its_models_and_batches():
    records = [_rec("multi_step", 0.1, model="cnn"), _rec("compiled", 3.0, model="cnn"), _rec("keras_fit", 1.0, model="cnn"),
               _rec("multi_step", 0.1, batch=64), _rec("compiled", 3.0), _rec("keras_fit", 1.0),
               _rec("compiled", 4.0, model="resnet50"), _rec("keras_fit", 1.0, model="resnet50"),
               _rec("heatmap_only", 2.5, model="resnet50"), _rec("forward_backward", 1.0, model="resnet50"),
               _rec("heatmap_only", 2.5, batch=256), _rec("forward_backward", 1.0, batch=256),
               _rec("heatmap_only", 1.0, model="cnn", batch=64), _rec("forward_backward", 1.0, model="cnn", batch=64),
               _rec("eager_reference", 3.0, batch=64)]  # fmt: skip
    rows = ratios(records)
    names = {(r["model"], r["batch"], r["ratio"]) for r in rows}
    # steps/s only for the mlp at batch 1 (none here); keras ratios at batches 64, 256 and for applications
    assert not [n for n in names if "steps/s" in n[2]]
    assert ("cnn", 1, "default step / keras_fit") not in names and ("mlp", 1, "default step / keras_fit") not in names
    by = {(r["model"], r["batch"], r["ratio"]): r for r in rows}
    assert by[("resnet50", 1, "default step / keras_fit")]["value"] == pytest.approx(4.0)
    app = by[("resnet50", 1, "heatmap_only / forward_backward")]
    mlp = by[("mlp", 256, "heatmap_only / forward_backward")]
    assert (app["goal"], app["met"], mlp["goal"], mlp["met"]) == ("<= 3", True, "<= 2", False)
    # without "compiled" at batch 64 there is no default step, but still a best one
    assert by[("mlp", 64, "best step speedup vs eager reference")]["value"] == pytest.approx(30.0)
    assert ("mlp", 64, "default step speedup vs eager reference") not in by
    # printed in the order of MODELS, then the applications
    assert [m for i, m in enumerate(r["model"] for r in rows) if i == 0 or rows[i - 1]["model"] != m] == ["mlp", "cnn", "resnet50"]


def test_ratios_pair_records_of_the_same_composite_and_mode():
    records = [_rec("heatmap_only", 3.0, composite="epsilon"), _rec("forward_backward", 2.0, composite="epsilon"),
               _rec("heatmap_only", 8.0, composite="epsilon_gamma_box"), _rec("forward_backward", 2.0, composite="epsilon_gamma_box"),
               _rec("heatmap_only_xla", 1.0, composite="epsilon"), _rec("forward_backward_xla", 4.0, composite="epsilon")]  # fmt: skip
    rows = {(r["ratio"], r["composite"]): r["value"] for r in ratios(records)}
    assert rows == {("heatmap_only / forward_backward", "epsilon"): pytest.approx(1.5),
                    ("heatmap_only / forward_backward", "epsilon_gamma_box"): pytest.approx(4.0),
                    ("heatmap_only_xla / forward_backward_xla", "epsilon"): pytest.approx(0.25)}  # fmt: skip


def test_the_auto_row_of_the_cnn_at_batch_1_compares_the_graph_loop_with_xla():
    # the cnn's XLA loop is multi_step_xla (the in-XLA loop is skipped for it); a slower one must not count
    records = [_rec("multi_step", 2.0, model="cnn", pick="function"), _rec("multi_step_xla", 1.6, model="cnn", pick="function"),
               _rec("multi_step_xla_loop", 20.0, model="cnn", pick="function")]  # fmt: skip
    (row,) = [r for r in ratios(records) if r["ratio"].startswith("auto")]
    assert (row["ratio"], row["value"], row["detail"], row["goal"]) == (
        "auto (function) / the other mode", pytest.approx(1.25), "multi_step / multi_step_xla", "<= 1")
    assert not row["met"]


def test_ratio_lines_and_table_print_the_records_fields():
    row = {"ratio": "default step / keras_fit", "model": "mlp", "composite": "epsilon", "batch": 64, "value": 4.0,
           "value_from_min": 1.25, "goal": "<= 3", "met": False, "detail": "compiled / keras_fit"}  # fmt: skip
    missed, met = ratio_lines([row, {**row, "value": 2.0, "met": True, "detail": ""}]).splitlines()
    assert missed.split() == ["MISS", "mlp", "epsilon", "b=64", "default", "step", "/", "keras_fit", "4.00", "(mins", "1.25)",
                              "goal", "<=", "3", "(compiled", "/", "keras_fit)"]  # fmt: skip
    assert met.split()[0] == "ok" and met.split()[-6:] == ["2.00", "(mins", "1.25)", "goal", "<=", "3"]
    record = {"model": "cnn", "composite": "epsilon_gamma_box", "batch": 256, "variant": "keras_fit_multi", "ms_median": 2.5,
              "ms_min": 1.25, "ms_max": 7.0, "steps_per_second": 400.0, "peak_rss_mb": 812.4, "compile_s": 3.456}  # fmt: skip
    head, rule, line = table([record]).splitlines()
    assert head.split() == ["model", "composite", "batch", "variant", "ms/step", "min", "max", "steps/s", "rss", "MB", "compile", "s"]
    assert line.split() == ["cnn", "epsilon_gamma_box", "256", "keras_fit_multi", "2.500", "1.250", "7.000", "400.0", "812", "3.46"]


def test_bench_arguments_parse_lists_and_reject_what_cannot_be_run():
    args = parse_args(["--models", "cnn,mlp,", "--batches", "64,1", "--variants", "keras_fit,compiled", "--min-time", "0",
                       "--main-job", "1500,2500"])  # fmt: skip
    assert (args.models, args.batches, args.variants, args.min_time, args.main_job) == (
        ("cnn", "mlp"), (64, 1), ("keras_fit", "compiled"), 0.0, (1500, 2500))
    assert not args.all_variants and parse_args([]).all_variants
    quick = parse_args(["--quick"])
    assert (quick.composites, quick.batches, quick.repeats, quick.min_time) == (("epsilon",), (1, 64), 3, 0.02)
    full = parse_args([])
    assert (full.composites, full.batches, full.repeats, full.min_time) == (("epsilon", "epsilon_gamma_box"), (1, 64, 256), 5, 0.1)
    # 1000 steps run the graph step and 1500 XLA (XLA_MIN_UPDATES = 1500); equal lengths have no difference
    for argv in (["--variants", "compiled,nope"], ["--models", "vgg"], ["--main-job", "1000,1500"], ["--main-job", "3000,3000"],
                 ["--min-time", "-1"], ["--batches", "0"], ["--repeats", "-1"], ["--steps-per-execution", "0"]):  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            parse_args(argv)
        assert stop.value.code == 2, argv


def _fake_train(metrics_by_steps, calls):
    """A stand-in for ``python -m heatinv.train``: writes the chosen metrics.json into hydra.run.dir."""

    def fake_run(command, **kwargs):
        options = dict(arg.split("=", 1) for arg in command if "=" in arg)
        calls.append(command)
        steps, folder = int(options["trainer.steps"]), options["hydra.run.dir"]
        os.makedirs(folder)
        with open(os.path.join(folder, "metrics.json"), "w") as f:
            json.dump(metrics_by_steps[steps], f)
        return subprocess.CompletedProcess(command, 0, "", "")

    return fake_run


def test_main_job_times_a_step_by_each_runs_loop_after_its_first_call(monkeypatch):
    # 25 updates in each first call: 1975 and 3975 after it
    metrics = {
        2000: {"loop_seconds": 9.0, "first_call_seconds": 4.0, "seconds": 3.95, "steps_per_second": 500.0, "summaries_seconds": 0.5,
               "checkpoints_seconds": 0.25, "xla_why": "xla: 2000 steps"},
        4000: {"loop_seconds": 16.0, "first_call_seconds": 5.0, "seconds": 7.95, "steps_per_second": 500.0, "summaries_seconds": 1.5,
               "checkpoints_seconds": 0.5, "xla_why": "xla: 2000 steps"},
    }  # fmt: skip
    calls = []
    monkeypatch.setattr(subprocess, "run", _fake_train(metrics, calls))
    clock = iter([100.0, 110.0, 200.0, 225.0])  # each run's start and end: 10 s and 25 s
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    record = bench.main_job(2000, 4000)
    # loops less first calls: 5 s over 1975 updates and 11 s over 3975; the long run's is the record's
    assert record["ms_median"] == pytest.approx(11e3 / 3975)
    assert (record["ms_min"], record["ms_max"]) == (pytest.approx(5e3 / 1975), pytest.approx(11e3 / 3975))
    assert record["steps_per_second"] == pytest.approx(3975 / 11.0)
    assert record["summaries_ms_per_step"] == pytest.approx(0.5)
    assert record["process_ms_per_step"] == pytest.approx(7.5)
    assert record["bookkeeping_share"] == pytest.approx(2.0 / 16.0)
    assert (record["compile_s"], record["jit"], record["steps_per_call"]) == (5.0, "xla: 2000 steps", 2000)
    assert (record["variant"], record["model"], record["composite"], record["batch"]) == ("main_job", "mlp", "epsilon_gamma_box", 1)
    assert set(RECORD_FIELDS) <= set(record)
    assert [c[c.index("-m") + 1 :][:2] for c in calls] == [["heatinv.train", "trainer.steps=2000"], ["heatinv.train", "trainer.steps=4000"]]
    assert calls[0][0] == sys.executable


def test_main_job_counts_a_run_without_first_call_as_zero_and_refuses_different_steps(monkeypatch):
    metrics = {
        100: {"loop_seconds": 1.0, "first_call_seconds": None, "seconds": None, "steps_per_second": None, "summaries_seconds": 0.0,
              "checkpoints_seconds": 0.0},
        300: {"loop_seconds": 2.0, "first_call_seconds": None, "seconds": None, "steps_per_second": None, "summaries_seconds": 0.0,
              "checkpoints_seconds": 0.0},
    }  # fmt: skip
    monkeypatch.setattr(subprocess, "run", _fake_train(metrics, []))
    record = bench.main_job(100, 300)
    assert (record["ms_median"], record["jit"], record["command"]) == (
        pytest.approx(2e3 / 300), "defaults", "python -m heatinv.train trainer.steps=100 / 300")
    metrics[300]["xla_why"] = "xla"
    with pytest.raises(ValueError, match="different steps"):
        bench.main_job(100, 300)


def test_measure_reports_median_min_max_of_rotated_blocks(monkeypatch):
    calls, order = [], []
    blocks = {"a": iter([5.0, 1.0, 3.0, 100.0]), "b": iter([2.0, 4.0, 4.0, 3.0]), "c": iter([1.0, 1.0, 1.0, 1.0])}

    def block(runner, n):
        order.append(runner.variant)
        return next(blocks[runner.variant])

    monkeypatch.setattr(bench, "_block", block)
    runners = [bench.Runner(v, lambda v=v: calls.append(v) or 0.0, 3 if v == "b" else 1, "xla", "function") for v in "abc"]
    records = {r["variant"]: r for r in bench.measure(bench.Case("mlp", "epsilon", 8), runners, repeats=4, min_time=0.0)}
    assert (records["a"]["ms_median"], records["a"]["ms_min"], records["a"]["ms_max"]) == (4.0, 1.0, 100.0)
    assert records["a"]["steps_per_second"] == pytest.approx(250.0)
    assert (records["b"]["ms_median"], records["b"]["steps_per_call"], records["b"]["repeats"]) == (3.5, 3, 4)
    assert (records["c"]["jit"], records["c"]["auto_pick"], records["c"]["batch"]) == ("xla", "function", 8)
    assert sorted(calls) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3  # compile, warm-up, calibration; blocks are faked
    # each repeat starts with the next runner, so no variant always runs first
    assert order == list("abc" "bca" "cab" "abc")


def test_zero_repeats_is_refused_not_replaced_by_the_default():
    # the error names repeats "must be positive"; 0 must not silently become 5 timing blocks
    with pytest.raises(SystemExit) as stop:
        parse_args(["--repeats", "0"])
    assert stop.value.code == 2


def test_run_measures_each_case_with_its_variants_and_writes_every_record(monkeypatch, tmp_path, capsys):
    import heatinv.data

    seen, jobs = {}, []

    def fake_measure(case, runners, repeats, min_time):
        seen[(case.model, case.batch)] = [r.variant for r in runners]
        return [_rec(r.variant, 2.0 if r.variant == "compiled" else 1.0, case.model, case.composite, case.batch) for r in runners]

    def fake_main_job(short, long):
        jobs.append((short, long))
        return {**_rec("main_job", 0.25, composite="epsilon_gamma_box"), "bookkeeping_share": 0.05}

    monkeypatch.setattr(heatinv.data, "load_digits", lambda: None)
    monkeypatch.setattr(bench, "make_runners", lambda case, dataset, variants, n: [bench.Runner(v, float, n) for v in variants])
    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench, "main_job", fake_main_job)
    out = tmp_path / "bench.json"
    argv = ["--models", "mlp,cnn,resnet50", "--composites", "epsilon", "--batches", "64", "--main-job", "1600,2600", "--out", str(out)]
    records, rows = bench.run(parse_args(argv))
    assert seen[("mlp", 64)] == list(VARIANTS)
    assert seen[("cnn", 64)] == [v for v in VARIANTS if v != "multi_step_xla_loop"]
    assert seen[("resnet50", 64)] == list(bench.APPLICATION_VARIANTS)
    assert jobs == [(1600, 2600)]
    assert json.loads(out.read_text()) == records and records[-1]["variant"] == "main_job"
    assert len(records) == 2 * len(VARIANTS) - 1 + len(bench.APPLICATION_VARIANTS) + 1
    printed = capsys.readouterr().out
    assert "summaries + checkpoints 5.0% of the 2600-step run's loop" in printed
    assert "main_job steps/s at batch 1" in printed and "default step / keras_fit" in printed
    # named in --variants, the cnn's in-XLA loop is run
    bench.run(parse_args(["--models", "cnn", "--composites", "epsilon", "--batches", "1", "--variants", "multi_step_xla_loop",
                          "--main-job", "0", "--out", str(out)]))  # fmt: skip
    assert seen[("cnn", 1)] == ["multi_step_xla_loop"]


def test_main_job_reports_a_failed_run_with_its_stderr(monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda command, **kwargs: subprocess.CompletedProcess(command, 3, "", "Traceback: boom"))
    with pytest.raises(RuntimeError, match=r"failed \(3\):\nTraceback: boom"):
        bench.main_job(2000, 4000)


def test_peak_rss_is_the_kernels_high_water_mark_in_mib():
    def high_water_mib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024

    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux's /proc")
    # the two counters are kept apart by the kernel and differ by a page or so
    assert bench.peak_rss_mb() == pytest.approx(high_water_mib(), rel=0.05)


@pytest.mark.parametrize("model", ["vit", "text"])
def test_transformer_cases_run_every_application_variant(model):
    """The bench's transformers: each variant runs and reads a finite scalar (the text's gradient is the embedding table's)."""
    runners = bench.make_runners(bench.Case(model, "attnlrp", 2), None, bench.APPLICATION_VARIANTS, 1)
    assert [r.variant for r in runners] == list(bench.APPLICATION_VARIANTS)
    for runner in runners:
        value = runner.call()
        assert math.isfinite(value), runner.variant
    values = {r.variant: r.call() for r in runners if r.variant.startswith("forward_backward")}
    assert values["forward_backward"] != 0.0


def test_transformers_take_their_composites_unless_named(monkeypatch, tmp_path):
    import heatinv.data

    seen = []
    monkeypatch.setattr(bench, "make_runners", lambda case, dataset, variants, n: seen.append((case.model, case.composite)) or [])
    monkeypatch.setattr(bench, "measure", lambda case, runners, repeats, min_time: [])
    monkeypatch.setattr(heatinv.data, "load_digits", lambda: None)
    out = str(tmp_path / "bench.json")
    bench.run(parse_args(["--models", "mlp,vit", "--batches", "16", "--main-job", "0", "--out", out]))
    assert seen == [("mlp", "epsilon"), ("mlp", "epsilon_gamma_box"), ("vit", "attnlrp"), ("vit", "cp_lrp")]
    seen.clear()
    bench.run(parse_args(["--models", "vit", "--composites", "epsilon", "--batches", "16", "--main-job", "0", "--out", out]))
    assert seen == [("vit", "epsilon")]
