"""Sweeps on real engines: the joblib, Ray and submitit launchers, the Optuna sweeper, failures, HParams.

The `slow` tests run `python -m heatinv.train` in a subprocess, as a user does, with tiny
settings (3 steps, a 784-16-8-10 MLP whose reference trained for one epoch) from a scratch
working directory: a 2-job sweep with the Ray and submitit launchers, the 3-job loss sweep
of conftest.py with joblib (shared with tests/test_sweeps.py), a 3-trial Optuna search, a joblib sweep
in which one job fails, and TensorBoard serving a sweep directory on 127.0.0.1 to show that
the HParams dashboard has one row per job with its overrides and final metrics.

Each launcher and the sweeper are optional extras (`pip install -e ".[test]"` installs them
all); a test whose extra is missing is skipped and says which one to install. The fast tests
check `heatinv.callbacks` on a hand-made sweep directory and the shipped launcher configs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from conftest import SWEEP_LOSSES
from heatinv.callbacks import SUMMARY_NAME, EnvDefaults, SweepSummary, failure_from_log, read_job, summarize
from heatinv.job_log import DONE_MARK, FAILED_MARK, UNREAD_MARK
from heatinv.config import register
from heatinv.progress import ConsoleFilter
from heatinv.startup import KNOWN_NOTICES

SHRINK = ("debug=smoke", "trainer.steps=3")  # configs/debug/smoke.yaml, 3 steps
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "HYDRA_FULL_ERROR": "0"}
FINAL = ("objective", "cosine", "ssim", "pearson", "spearman", "loss", "student_accuracy", "success_rate", "agreement",
         "feature_share", "token_share", "steps")
SINGLE_FINAL = tuple(name for name in FINAL if name not in ("success_rate", "agreement", "feature_share", "token_share"))  # a single-task job's


def need(module: str, extra: str):
    """Skip unless ``module`` imports: it comes with ``pip install -e ".[<extra>]"``."""
    return pytest.importorskip(module, reason=f'needs the "{extra}" extra: pip install -e ".[{extra}]"')


# --------------------------------------------------------------------------- running sweeps
@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    """A reference-model cache, trained once here: no sweep spends its time training it (with a
    cold cache, every parallel job of a sweep would train the same reference)."""
    from heatinv.data import load_dataset
    from heatinv.models import reference_model
    from heatinv.build import architecture

    cache = str(tmp_path_factory.mktemp("cache"))
    register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="heatinv.configs", version_base="1.3"):
            cfg = compose("train", overrides=[*SHRINK, "paths.root=/unused", "paths.output_dir=/unused"])
    finally:
        GlobalHydra.instance().clear()
    dataset = load_dataset(cfg.data.name, cfg.data.path)
    reference_model(architecture(cfg), dataset, cfg.model.reference_epochs, cache, seed=0)
    return cache


def heatinv_sweep(cwd, cache: str, *args: str, env=None, timeout: int = 240) -> tuple[subprocess.CompletedProcess, str]:
    """``python -m heatinv.train <args>`` (tiny settings) in ``cwd``; returns it and the sweep dir."""
    sweep_dir = os.path.join(str(cwd), "sweep")
    command = [sys.executable, "-m", "heatinv.train", *args, *SHRINK]
    result = subprocess.run(
        [*command, f"paths.cache_dir={cache}", f"hydra.sweep.dir={sweep_dir}"],
        cwd=cwd,
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result, sweep_dir


def output(result: subprocess.CompletedProcess) -> str:
    """The end of a command's output, for assertion messages."""
    return (result.stdout + result.stderr)[-4000:]


def override(job: dict, key: str) -> str:
    """The value a summary's job got for ``key`` on the command line."""
    (value,) = [item.split("=", 1)[1] for item in job["overrides"] if item.split("=", 1)[0] == key]
    return value


def read_summary(sweep_dir: str) -> dict:
    with open(os.path.join(sweep_dir, SUMMARY_NAME)) as f:
        return json.load(f)


def check_jobs(result: subprocess.CompletedProcess, sweep_dir: str, count: int) -> dict:
    """Exit code 0; every job's metrics.json; a summary listing every job as ok with its metrics."""
    assert result.returncode == 0, output(result)
    summary = read_summary(sweep_dir)
    assert summary["finished"] and summary["failed"] == [], summary
    assert [job["num"] for job in summary["jobs"]] == list(range(count))
    for job in summary["jobs"]:
        assert job["dir"].startswith(f"{job['num']}_")  # named after the job's overrides (hydra.job.override_dirname)
        with open(os.path.join(sweep_dir, job["dir"], "metrics.json")) as f:
            metrics = json.load(f)
        assert metrics["steps"] == 3
        assert all(math.isfinite(metrics[key]) for key in SINGLE_FINAL)
        assert job["status"] == "ok" and job["error"] is None
        assert job["metrics"]["cosine"] == metrics["cosine"]
        with open(os.path.join(sweep_dir, job["dir"], ".hydra", "overrides.yaml")) as f:
            assert job["overrides"] == yaml.safe_load(f)
    return summary


@pytest.mark.slow
def test_joblib_sweep(joblib_sweep):
    """The joblib sweep of tests/test_sweeps.py (conftest.py's session fixture): its summary and launcher."""
    result, sweep_dir = joblib_sweep
    summary = check_jobs(result, sweep_dir, len(SWEEP_LOSSES))
    assert "Joblib.Parallel(n_jobs=2" in result.stdout + result.stderr  # the joblib launcher ran the jobs
    assert [override(job, "loss") for job in summary["jobs"]] == list(SWEEP_LOSSES)
    # A worker first imports TensorFlow while unpickling the config schema, not through the entry point.
    notices = [line for line in result.stderr.splitlines() if KNOWN_NOTICES.search(line)]
    assert not notices, f"the workers printed TensorFlow's start-up notices: {notices[:3]}"


@pytest.mark.slow
def test_ray_local_sweep(tmp_path, cache_dir):
    need("hydra_plugins.hydra_ray_launcher", "ray")
    need("ray", "ray")
    home = tmp_path / "home"
    home.mkdir()
    # Ray's socket paths must stay under 107 bytes: a short temp dir, not one under tmp_path.
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        result, sweep_dir = heatinv_sweep(
            tmp_path,
            cache_dir,
            "-m",
            "loss=l1,mse",
            "hydra/launcher=ray_local",
            f"hydra.launcher.ray.init._temp_dir={ray_tmp}",
            env={**ENV, "HOME": str(home)},
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    check_jobs(result, sweep_dir, 2)
    assert "Ray Launcher is launching 2 jobs" in result.stdout + result.stderr
    assert re.search(r"\(_run_job pid=\d+\)", result.stdout + result.stderr)  # output of a Ray worker
    assert not (home / ".ray").exists(), "Ray wrote into the home directory (RAY_AUTH_MODE not applied?)"


@pytest.mark.slow
def test_submitit_local_sweep(tmp_path, cache_dir):
    need("hydra_plugins.hydra_submitit_launcher", "slurm")
    result, sweep_dir = heatinv_sweep(tmp_path, cache_dir, "-m", "loss=l1,mse", "hydra/launcher=submitit_local")
    check_jobs(result, sweep_dir, 2)
    submitted = [d for d in os.listdir(os.path.join(sweep_dir, ".submitit")) if d != "%j"]
    assert len(submitted) == 2, submitted  # one submitit job per sweep job


@pytest.mark.slow
def test_optuna_search(tmp_path, cache_dir):
    need("hydra_plugins.hydra_optuna_sweeper", "optuna")
    optuna = need("optuna", "optuna")
    # No -m: hparams_search=optuna switches to MULTIRUN itself.
    result, sweep_dir = heatinv_sweep(tmp_path, cache_dir, "hparams_search=optuna", "hydra.sweeper.n_trials=3")
    summary = check_jobs(result, sweep_dir, 3)
    study = optuna.load_study(study_name="heatinv", storage=f"sqlite:///{os.path.join(sweep_dir, 'optuna.db')}")
    trials = sorted(study.trials, key=lambda trial: trial.number)
    assert [trial.state for trial in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    for trial, job in zip(trials, summary["jobs"]):
        assert trial.value == pytest.approx(job["metrics"]["objective"])  # minimized: 1 - cosine
        assert trial.params["loss"] in ("l1", "mse", "huber")
        assert 1e-4 <= trial.params["optimizer.lr"] <= 3e-2
        assert 1e-9 <= trial.params["lrp.epsilon"] <= 1e-3
        assert 0.01 <= trial.params["loss.delta"] <= 0.5
        assert f"loss={trial.params['loss']}" in job["overrides"]
    with open(os.path.join(sweep_dir, "optimization_results.yaml")) as f:
        assert yaml.safe_load(f)["best_value"] == pytest.approx(study.best_value)
    assert summary["best"]["objective"] == pytest.approx(study.best_value)


@pytest.mark.slow
def test_a_failed_job_keeps_the_others_and_is_reported(tmp_path, cache_dir):
    need("hydra_plugins.hydra_joblib_launcher", "joblib")
    # Job 0 asks for the 10000th test image of a 7 (there are 45); job 1 is fine. Under joblib
    # both run at once: job 0's failure must neither stop nor lose job 1.
    result, sweep_dir = heatinv_sweep(
        tmp_path, cache_dir, "-m", "target.index=9999,0", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"
    )
    assert result.returncode != 0, "a sweep with a failed job must not exit 0"
    summary = read_summary(sweep_dir)
    failed, ok = summary["jobs"]
    assert summary["failed"] == [0] and summary["ok"] == 1 and not summary["finished"]
    assert failed["status"] == "failed" and "target.index=9999" in failed["overrides"]
    assert "index=9999" in failed["error"] and failed["metrics"] is None, failed
    assert ok["status"] == "ok" and ok["error"] is None
    assert failed["dir"].startswith("0_") and "target.index=9999" in failed["dir"] and "/" not in failed["dir"]
    assert ok["dir"].startswith("1_") and "target.index=0" in ok["dir"] and "/" not in ok["dir"]
    with open(os.path.join(sweep_dir, ok["dir"], "metrics.json")) as f:
        assert json.load(f)["cosine"] == ok["metrics"]["cosine"]
    assert not os.path.exists(os.path.join(sweep_dir, failed["dir"], "metrics.json"))
    assert "failed: #0 (ConfigError: Config value target.index=9999" in result.stdout  # the sweep's last line says which job and why


# --------------------------------------------------------------------------- the HParams dashboard
def post_json(url: str, body: dict, timeout: float = 10) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
    with opener.open(request, timeout=timeout) as response:
        return json.load(response)


def get_json(url: str, timeout: float = 10):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
    with opener.open(url, timeout=timeout) as response:
        return json.load(response)


class TensorBoard:
    """``tensorboard --logdir <dir>`` on 127.0.0.1 and a free port, for at most ``deadline`` seconds."""

    def __init__(self, logdir: str, deadline: float = 90):
        self.deadline = time.monotonic() + deadline
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "tensorboard.main", "--logdir", logdir),
                *("--host", "127.0.0.1", "--port", "0", "--load_fast", "false", "--reload_interval", "1"),
            ],
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = None
        self._lines: list[str] = []
        found = threading.Event()

        def read() -> None:
            for line in self.process.stderr:
                self._lines.append(line)
                match = re.search(r"at (http://127\.0\.0\.1:\d+)/", line)
                if match and self.url is None:
                    self.url = match.group(1)
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(max(0.0, self.deadline - time.monotonic())):
            self.close()
            raise AssertionError("tensorboard did not start:\n" + "".join(self._lines[-20:]))

    def hparams(self, endpoint: str, body: dict) -> dict:
        return post_json(f"{self.url}/data/plugin/hparams/{endpoint}", {"experimentName": "", **body})

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


SESSION_GROUPS = {
    "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
    "colParams": [],
    "startIndex": 0,
    "sliceSize": 100,
}


@pytest.mark.slow
def test_tensorboard_hparams_shows_one_row_per_job(joblib_sweep):
    result, sweep_dir = joblib_sweep
    assert result.returncode == 0, output(result)
    summary = read_summary(sweep_dir)
    board = TensorBoard(sweep_dir)
    try:
        groups = []
        while time.monotonic() < board.deadline:  # TensorBoard loads the event files in the background
            groups = board.hparams("session_groups", SESSION_GROUPS)["sessionGroups"]
            if len(groups) == len(summary["jobs"]) and all(len(g["metricValues"]) == len(SINGLE_FINAL) for g in groups):
                break
            time.sleep(1)
        experiment = board.hparams("experiment", {})
        runs = get_json(f"{board.url}/data/runs")
    finally:
        board.close()

    # One job, one run in the run selector: no run for the sweep's experiment, none for the rows.
    assert sorted(runs) == sorted(f"{job['dir']}/tensorboard" for job in summary["jobs"]), runs

    # Columns: the keys the command line sets (every key of the `loss` group, trainer.steps),
    # final metrics; the keys debug=smoke sets (a global package) are not overrides of their own.
    columns = {info["name"]: info for info in experiment["hparamInfos"]}
    assert {"loss.name", "loss.delta", "loss.normalize", "trainer.steps"} <= set(columns)
    assert "lrp.gamma" not in columns  # not swept: no column
    assert columns["loss.name"]["differs"] and not columns["trainer.steps"]["differs"]
    assert sorted(m["name"]["tag"] for m in experiment["metricInfos"]) == sorted(f"final/{m}" for m in FINAL)

    # Rows: one per job, its overrides' values and its metrics.json.
    assert len(groups) == len(summary["jobs"]), groups
    # Issue #18: a row is named after its run directory relative to outputs/; this sweep lies
    # outside outputs/ (hydra.sweep.dir), so each row is named after its job's folder.
    assert sorted(group["name"] for group in groups) == sorted(job["dir"] for job in summary["jobs"])
    rows = {group["hparams"]["loss.name"]: group for group in groups}
    for job in summary["jobs"]:
        row = rows[override(job, "loss")]
        assert row["hparams"]["trainer.steps"] == 3
        values = {m["name"]["tag"]: m["value"] for m in row["metricValues"]}
        for name in SINGLE_FINAL:
            assert values[f"final/{name}"] == pytest.approx(job["metrics"][name], rel=1e-6), name


# --------------------------------------------------------------------------- fast: the callbacks
def make_job(sweep_dir, num: int, overrides: list[str], config: dict, metrics=None, log: str = "") -> str:
    """A job directory as Hydra and heatinv leave it."""
    job = sweep_dir / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num, "name": "train"}}}))
    (job / "train.log").write_text(log)
    if metrics is not None:
        (job / "metrics.json").write_text(json.dumps(metrics))
        (job / "tensorboard").mkdir()
    return str(job)


def job_config(loss: str) -> dict:
    return {
        "loss": {"name": loss, "delta": 0.1, "normalize": "none"},
        "lrp": {"gamma": 0.25},
        "model": {"hidden": [16, 8]},
        "paths": {"output_dir": "/somewhere"},
    }


def metrics_for(cosine: float) -> dict:
    return {**{name: 0.5 for name in FINAL}, "cosine": cosine, "objective": 1 - cosine, "steps": 3, "diagnosis": []}


def test_a_job_stopped_while_extending_is_interrupted_not_its_old_results(tmp_path):
    """Extending a finished sweep and stopping it left each job "ok" with the metrics the extension would replace."""
    sweep = tmp_path / "my sweeps" / "12-00-00_loss=l1,mse"  # a space, and Hydra's override syntax
    job = make_job(sweep, 0, ["loss=l1"], job_config("l1"), metrics_for(0.9))  # metrics of step 3
    (sweep / "0" / "checkpoints").mkdir()
    (sweep / "0" / "checkpoints" / "ckpt-6.index").write_bytes(b"")
    read = read_job(job, str(sweep))
    assert read["status"] == "interrupted" and "stopped after step 6" in read["error"] and read["metrics"] is None
    # The resume command it prints reads back as this sweep folder in a shell and in Hydra.
    words = shlex.split(read["error"].split("the same command plus ")[1])
    assert words[1] == "trainer.resume=true"
    override = OverridesParser.create().parse_override(words[0])
    assert override.get_key_element() == "hydra.sweep.dir" and override.value() == str(sweep)


def test_a_swept_key_that_no_job_reads_is_named_in_the_summary(tmp_path, capsys):
    """`-m target.pattern=frame,cross` without target=pattern ran two identical jobs, and the summary said nothing."""
    sweep = tmp_path / "sweep"
    for num, pattern in enumerate(("frame", "cross")):
        warning = (f"[2026-01-01 00:00:00,000][heatinv.config][WARNING] - heatinv: target.pattern={pattern} is read only "
                   f"with target=pattern, and this run has target.kind='class'{UNREAD_MARK}\n")
        make_job(sweep, num, [f"target.pattern={pattern}"], job_config("mse"), metrics_for(0.9), log=warning)
    callback = SweepSummary()
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    callback.on_multirun_start(config)
    callback.on_multirun_end(config)
    summary = json.loads((sweep / SUMMARY_NAME).read_text())
    assert summary["read_by_no_job"] == ["target.pattern"]
    assert "read by no job: target.pattern" in capsys.readouterr().out


def test_sweep_summary_lists_each_job_and_writes_the_hparams_experiment(tmp_path):
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    sweep = tmp_path / "sweep"
    make_job(sweep, 0, ["loss=l1"], job_config("l1"), metrics_for(0.9))
    make_job(sweep, 1, ["loss=mse"], job_config("mse"), metrics_for(0.95))
    failure = (
        f"[2026-01-01 00:00:00,000][heatinv.callbacks][ERROR] - {FAILED_MARK}ValueError: index=9999 is out of range\n"
        "Traceback (most recent call last):\n  File ...\nValueError: index=9999 is out of range\n"
    )
    make_job(sweep, 2, ["loss=huber"], job_config("huber"), log=failure)
    make_job(sweep, 3, ["loss=l1", "trainer.seed=1"], job_config("l1"))  # died without a word

    callback = SweepSummary()
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    callback.on_multirun_start(config)
    callback.on_multirun_end(config)

    summary = read_summary(str(sweep))
    assert summary["finished"] and summary["ok"] == 2 and summary["failed"] == [2, 3]
    assert summary["best"] == {"num": 1, "dir": "1", "objective": pytest.approx(0.05)}
    jobs = summary["jobs"]
    assert [job["status"] for job in jobs] == ["ok", "ok", "failed", "failed"]
    assert jobs[0]["overrides"] == ["loss=l1"] and jobs[0]["metrics"]["cosine"] == 0.9
    assert "diagnosis" not in jobs[0]["metrics"]  # lists stay in metrics.json
    assert jobs[2]["error"] == "ValueError: index=9999 is out of range"
    assert "no metrics.json" in jobs[3]["error"] and jobs[3]["metrics"] is None

    # The experiment is in each job's run (0 and 1 have one), not a run of its own in the sweep directory.
    assert not [f for f in os.listdir(sweep) if f.startswith("events.out.tfevents")]
    experiments = []
    for job in ("0", "1"):
        accumulator = EventAccumulator(str(sweep / job / "tensorboard"), size_guidance={"tensors": 0})
        accumulator.Reload()
        content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.EXPERIMENT_TAG]
        experiments.append(metadata.parse_experiment_plugin_data(content))
    experiment = experiments[0]
    assert experiments[1] == experiment  # whichever TensorBoard finds first, the same columns
    infos = {info.name: info for info in experiment.hparam_infos}
    # Jobs with a TensorBoard run only (0 and 1); their `loss` group keys; not paths, not lrp.
    assert set(infos) == {"loss.name", "loss.delta", "loss.normalize"}
    assert list(infos["loss.name"].domain_discrete.values) and infos["loss.name"].differs
    assert not infos["loss.delta"].differs
    assert [m.name.tag for m in experiment.metric_infos] == [f"final/{name}" for name in FINAL]

    callback.on_multirun_end(config)  # written again: still one experiment file per job's run
    for job in ("0", "1"):
        assert len([f for f in os.listdir(sweep / job / "tensorboard") if f.startswith("events.out.tfevents")]) == 1


def test_summary_metrics_are_the_ones_each_run_logs():
    from heatinv import callbacks, summaries

    assert callbacks.FINAL_METRICS == summaries.FINAL_METRICS == FINAL


def test_failed_job_is_logged_where_it_ran(tmp_path, caplog):
    log_path = tmp_path / "train.log"
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        try:
            raise ValueError("target.index=9999 is out of range\nsecond line")
        except ValueError as error:
            failed = JobReturn(status=JobStatus.FAILED, _return_value=error)
        SweepSummary().on_job_end(OmegaConf.create({}), failed)
        SweepSummary().on_job_end(OmegaConf.create({}), JobReturn(status=JobStatus.COMPLETED, _return_value=0.1))
    finally:
        root.removeHandler(handler)
        handler.close()
    assert failure_from_log(str(log_path)) == "ValueError: target.index=9999 is out of range\nsecond line"
    assert "Traceback" in log_path.read_text()  # the traceback stays in the job's log
    failures = [record for record in caplog.records if record.getMessage().startswith(FAILED_MARK)]
    assert len(failures) == 1 and not ConsoleFilter().filter(failures[0]), "the console shows the error once, not the callback's copy"


def test_a_failure_that_a_later_attempt_finished_is_not_the_jobs(tmp_path):
    """A resumed sweep appends to its jobs' logs: an old failure must not mark a job that then finished."""
    log_path = tmp_path / "train.log"
    failed = f"[2026-01-01 00:00:00,000][heatinv.callbacks][ERROR] - {FAILED_MARK}ResumeError: no checkpoint\n"
    done = f"[2026-01-01 00:01:00,000][heatinv.train][INFO] - {DONE_MARK}{tmp_path} (kept)\n"
    log_path.write_text(failed + done)
    assert failure_from_log(str(log_path)) is None
    log_path.write_text(done + failed)
    assert failure_from_log(str(log_path)) == "ResumeError: no checkpoint"


def test_a_failure_reads_back_from_the_literal_lines_of_a_job_log(tmp_path):
    """The lines as a job's train.log holds them (not built from heatinv's constants): old logs of a resumed sweep too."""
    log_path = tmp_path / "train.log"
    log_path.write_text(
        "[2026-01-01 00:00:00,000][heatinv.callbacks][ERROR] - heatinv job failed: ValueError: shapes differ:\n"
        "[1, 2] is not [1, 3]\n"
        "\n"
        "[2026-01-01 00:00:01,000][hydra.core.utils][INFO] - a later record of the same run\n"
    )
    assert failure_from_log(str(log_path)) == "ValueError: shapes differ:\n[1, 2] is not [1, 3]"
    with open(log_path, "a") as f:
        f.write("[2026-01-01 00:02:00,000][heatinv.train][INFO] - heatinv: results in /sweep/0 (kept)\n")
    assert failure_from_log(str(log_path)) is None


def test_jobs_are_listed_by_number_past_nine(tmp_path):
    sweep = tmp_path / "sweep"
    for num in range(11):
        make_job(sweep, num, [f"trainer.seed={num}"], job_config("l1"))
    summary = summarize(str(sweep))
    assert [job["num"] for job in summary["jobs"]] == list(range(11))
    assert [job["dir"] for job in summary["jobs"]] == [str(num) for num in range(11)]


def test_a_job_with_its_own_name_is_read_from_its_own_log(tmp_path):
    """`hydra.job.name=fit` writes fit.log, not train.log."""
    sweep = tmp_path / "sweep"
    job = make_job(sweep, 0, ["loss=l1"], job_config("l1"))
    (sweep / "0" / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": 0, "name": "fit"}}}))
    (sweep / "0" / "fit.log").write_text(
        "[2026-01-01 00:00:00,000][heatinv.callbacks][ERROR] - heatinv job failed: ResumeError: no checkpoint\n")
    read = read_job(job, str(sweep))
    assert read["status"] == "failed" and read["error"] == "ResumeError: no checkpoint"


def test_unread_keys_are_the_warned_ones_and_read_by_no_job_only_if_every_job_warned(tmp_path):
    """Every finished job logs `heatinv: results in <dir>`, and a Hydra sweep folder's name holds `=`."""
    sweep = tmp_path / "12-00-00_loss=l1,mse"
    for num, warns in ((0, True), (1, False)):
        log = ("[2026-01-01 00:00:00,000][heatinv.config][WARNING] - heatinv: target.pattern=frame is read only with "
               "target=pattern, and this run has target.kind='class'; this job runs without it.\n" if warns else "")
        log += f"[2026-01-01 00:01:00,000][heatinv.train][INFO] - heatinv: results in {sweep}/{num} (kept)\n"
        make_job(sweep, num, ["target.pattern=frame", f"trainer.seed={num}"], job_config("mse"), metrics_for(0.9), log=log)
    summary = summarize(str(sweep))
    assert [job["unread"] for job in summary["jobs"]] == [["target.pattern"], []]
    assert summary["read_by_no_job"] == []


def test_a_job_that_checkpointed_its_last_step_finished_and_one_past_it_did_not(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for num, saved in ((0, (1, 3)), (1, (3, 6))):
        make_job(sweep, num, [f"trainer.seed={num}"], job_config("l1"), metrics_for(0.9))  # metrics of step 3
        (sweep / str(num) / "checkpoints").mkdir()
        for step in saved:
            (sweep / str(num) / "checkpoints" / f"ckpt-{step}.index").write_bytes(b"")
    callback, config = SweepSummary(), OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    callback.on_multirun_start(config)
    callback.on_multirun_end(config)
    summary = read_summary(str(sweep))
    assert [job["status"] for job in summary["jobs"]] == ["ok", "interrupted"]
    assert summary["jobs"][0]["metrics"]["cosine"] == 0.9 and summary["jobs"][0]["error"] is None
    assert summary["jobs"][1]["error"].startswith("stopped after step 6 (checkpoint ckpt-6)")
    assert summary["ok"] == 1 and summary["failed"] == [1]  # `failed`: every job that did not finish
    assert "traceback" not in capsys.readouterr().out  # no job failed


def test_the_summary_line_names_each_unfinished_job_and_a_logdir_a_shell_reads_back(tmp_path, capsys):
    sweep = tmp_path / "my sweeps" / "12-00-00_loss=l1,mse"
    make_job(sweep, 0, ["loss=l1"], job_config("l1"), metrics_for(0.9))
    make_job(sweep, 1, ["loss=mse"], job_config("mse"))
    (sweep / "1" / "checkpoints").mkdir()
    (sweep / "1" / "checkpoints" / "ckpt-6.index").write_bytes(b"")
    make_job(sweep, 2, ["loss=huber"], job_config("huber"),
             log="[2026-01-01 00:00:00,000][heatinv.callbacks][ERROR] - heatinv job failed: ValueError: bad index\n")
    callback, config = SweepSummary(), OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    callback.on_multirun_start(config)
    callback.on_multirun_end(config)
    line, logdir = capsys.readouterr().out.splitlines()[-2:]
    assert line.startswith(f"heatinv: sweep summary {sweep / SUMMARY_NAME}: 3 jobs, interrupted: #1 (stopped after step 6")
    assert ", failed: #2 (ValueError: bad index). A failed job's traceback is in its train.log" in line
    assert shlex.split(logdir.split("tensorboard --logdir ", 1)[1]) == [str(sweep)]


def test_a_metric_a_job_could_not_compute_stays_in_the_summary_as_null(tmp_path):
    sweep = tmp_path / "sweep"
    make_job(sweep, 0, ["loss=l1"], job_config("l1"))
    (sweep / "0" / "metrics.json").write_text('{"objective": 0.1, "cosine": 0.9, "ssim": null, "steps": 3}')
    assert summarize(str(sweep))["jobs"][0]["metrics"] == {"objective": 0.1, "cosine": 0.9, "ssim": None, "steps": 3}


def test_a_cut_short_metrics_json_is_a_failed_job_not_a_missing_summary(tmp_path):
    sweep = tmp_path / "sweep"
    make_job(sweep, 0, ["loss=l1"], job_config("l1"), metrics_for(0.9))
    make_job(sweep, 1, ["loss=mse"], job_config("mse"))
    (sweep / "1" / "metrics.json").write_text('{"objective": 0.1, "cos')
    callback, config = SweepSummary(), OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    callback.on_multirun_start(config)
    callback.on_multirun_end(config)
    summary = read_summary(str(sweep))
    assert [job["status"] for job in summary["jobs"]] == ["ok", "failed"] and summary["best"]["num"] == 0


def test_a_sweep_stopped_by_a_failed_job_is_summed_up_at_exit_as_unfinished(tmp_path, monkeypatch):
    """The Optuna sweeper opens its storage in the sweep folder before any job made it."""
    at_exit = []
    monkeypatch.setattr("heatinv.callbacks.atexit.register", at_exit.append)
    sweep = tmp_path / "sweep"
    SweepSummary().on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert sweep.is_dir()
    make_job(sweep, 0, ["loss=l1"], job_config("l1"), metrics_for(0.9))
    (at_exit_write,) = at_exit
    at_exit_write()
    summary = read_summary(str(sweep))
    assert summary["finished"] is False and summary["ok"] == 1


def test_a_sweep_without_jobs_removes_only_the_folder_its_command_made(tmp_path):
    refused, kept = tmp_path / "refused", tmp_path / "kept"
    for sweep in (refused, kept):
        sweep.mkdir()
        (sweep / "multirun.yaml").write_text("hydra: {}\n")
    (kept / "optuna.db").write_bytes(b"SQLite format 3\x00")
    for sweep in (refused, kept):
        callback, config = SweepSummary(), OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
        callback.on_multirun_start(config)
        callback.on_multirun_end(config)
    assert not refused.exists()
    assert sorted(os.listdir(kept)) == ["multirun.yaml", "optuna.db"]


def test_hparams_domains_span_each_columns_values_from_the_jobs_with_a_run(tmp_path):
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    sweep = tmp_path / "sweep"
    for num, (loss, delta, steps, center) in enumerate((("mse", 0.3, 300, True), ("l1", 0.1, 100, False))):
        config = {**job_config(loss), "trainer": {"steps": steps, "center": center}}
        config["loss"] = {**config["loss"], "delta": delta, **({"margin": 0.5} if num else {})}
        make_job(sweep, num, [f"loss={loss}", f"trainer.steps={steps}"], config, metrics_for(0.9))
    make_job(sweep, 2, ["loss=huber"], job_config("huber"))  # no run: not a row, no column of its own
    callback, config = SweepSummary(metrics=["cosine"]), OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    callback.on_multirun_start(config)
    callback.on_multirun_end(config)
    assert not (sweep / "2" / "tensorboard").exists()
    accumulator = EventAccumulator(str(sweep / "0" / "tensorboard"), size_guidance={"tensors": 0})
    accumulator.Reload()
    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.EXPERIMENT_TAG]
    experiment = metadata.parse_experiment_plugin_data(content)
    infos = {info.name: info for info in experiment.hparam_infos}
    assert [v.string_value for v in infos["loss.name"].domain_discrete.values] == ["l1", "mse"]
    assert [v.bool_value for v in infos["trainer.center"].domain_discrete.values] == [False, True]
    bounds = {name: (infos[name].domain_interval.min_value, infos[name].domain_interval.max_value)
              for name in ("loss.delta", "trainer.steps", "loss.margin")}
    assert bounds == {"loss.delta": (0.1, 0.3), "trainer.steps": (100, 300), "loss.margin": (0.5, 0.5)}
    assert [m.name.tag for m in experiment.metric_infos] == ["final/cosine"]


def test_an_overrides_keys_are_columns_with_plus_or_package_but_not_keys_it_only_prefixes(tmp_path):
    from heatinv.callbacks import swept_hparams

    sweep = tmp_path / "sweep"
    jobs = [["loss=l1", "++lrp.gamma=0.25", "model@model=mlp"], ["loss=mse", "++lrp.gamma=0.25", "model@model=mlp"]]
    dirs = [make_job(sweep, num, overrides, {**job_config(overrides[0][5:]), "loss_scale": {"factor": 2}})
            for num, overrides in enumerate(jobs)]
    columns = swept_hparams(dirs, jobs)
    assert columns["lrp.gamma"] == [0.25, 0.25] and "model.hidden" in columns
    assert "loss_scale.factor" not in columns


@pytest.mark.slow
def test_a_sweep_hydra_refuses_leaves_no_folder_and_no_summary(tmp_path):
    """`-m loss=l1,hubr` left a sweep folder holding only multirun.yaml, and printed a summary of 0 jobs."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("HYDRA_FULL_ERROR", None)
    done = subprocess.run([sys.executable, "-m", "heatinv.train", "-m", "loss=l1,hubr", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "hubr" in done.stderr
    assert "sweep summary" not in done.stdout and not (tmp_path / "sweep").exists()


def test_env_defaults_keep_what_the_user_set(monkeypatch):
    # Set, then deleted: monkeypatch records the variable and removes what EnvDefaults sets at
    # teardown (a bare delenv of an unset variable records nothing, and the value would leak
    # into the rest of the session).
    monkeypatch.setenv("HEATINV_TEST_A", "unset")
    monkeypatch.delenv("HEATINV_TEST_A")
    monkeypatch.setenv("HEATINV_TEST_B", "mine")
    EnvDefaults({"HEATINV_TEST_A": "disabled", "HEATINV_TEST_B": "theirs"}).on_multirun_start(OmegaConf.create({}))
    assert os.environ["HEATINV_TEST_A"] == "disabled" and os.environ["HEATINV_TEST_B"] == "mine"
    monkeypatch.undo()
    assert "HEATINV_TEST_A" not in os.environ


# --------------------------------------------------------------------------- fast: the configs
@pytest.fixture
def compose_hydra(tmp_path, monkeypatch):
    """``compose_hydra(*overrides)``: the ``hydra`` node of the composed ``train`` config."""
    monkeypatch.chdir(tmp_path)
    register()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="heatinv.configs", version_base="1.3"):
        yield lambda *overrides: compose("train", overrides=list(overrides), return_hydra_config=True).hydra
    GlobalHydra.instance().clear()


def test_every_sweep_has_the_summary_callback(compose_hydra):
    assert compose_hydra().callbacks.sweep_summary._target_ == "heatinv.callbacks.SweepSummary"


def test_ray_local_config(compose_hydra):
    need("hydra_plugins.hydra_ray_launcher", "ray")
    hydra = compose_hydra("hydra/launcher=ray_local")
    assert hydra.launcher._target_.endswith("RayLauncher")
    assert OmegaConf.to_container(hydra.launcher.ray.init) == {
        "address": None,
        "num_cpus": 2,
        "include_dashboard": False,
        "_temp_dir": None,
    }
    assert hydra.callbacks.ray_env.env.RAY_AUTH_MODE == "disabled"
    assert "sweep_summary" in hydra.callbacks


def test_ray_cluster_config_passes_nothing_a_connection_refuses(compose_hydra):
    need("hydra_plugins.hydra_ray_launcher", "ray")
    init = compose_hydra("hydra/launcher=ray_cluster").launcher.ray.init
    assert init.address == "auto"
    assert "object_store_memory" in init and init.object_store_memory is None  # keeps the plugin's default out
    assert not {"num_cpus", "include_dashboard", "_temp_dir"} & set(init)


def test_slurm_config(compose_hydra):
    need("hydra_plugins.hydra_submitit_launcher", "slurm")
    launcher = compose_hydra("hydra/launcher=slurm", "hydra.sweep.dir=/shared/sweep").launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.timeout_min == 60 and launcher.partition is None and launcher.cpus_per_task == 2
    assert launcher.submitit_folder == "/shared/sweep/.submitit/%j"


def test_optuna_search_config(compose_hydra):
    need("hydra_plugins.hydra_optuna_sweeper", "optuna")
    hydra = compose_hydra("hparams_search=optuna", "hydra.sweep.dir=/tmp/some-sweep")
    sweeper = hydra.sweeper
    assert hydra.mode.name == "MULTIRUN"
    assert sweeper._target_.endswith("OptunaSweeper")
    assert str(sweeper.direction).endswith("minimize") and sweeper.n_trials == 10
    assert sweeper.storage == "sqlite:////tmp/some-sweep/optuna.db"
    assert dict(sweeper.params) == {
        "optimizer.lr": "tag(log, interval(1e-4, 3e-2))",
        "loss": "choice(l1, mse, huber)",
        "lrp.epsilon": "tag(log, interval(1e-9, 1e-3))",
        "loss.delta": "interval(0.01, 0.5)",
    }


def test_hparams_columns_are_the_keys_every_run_shows_and_never_how_a_job_started(tmp_path):
    """A resumed sweep got a trainer.resume column (true for one job, blank for another); the keys every single
    run's row shows (optimizer, trainer.steps, ...) were missing from a sweep's."""
    from heatinv.callbacks import swept_hparams

    sweep = tmp_path / "sweep"
    jobs = [(["loss=l1", "trainer.resume=true"], "l1", True), (["loss=mse"], "mse", False)]
    dirs = [
        make_job(sweep, num, overrides, {**job_config(loss), "optimizer": {"name": "adam", "lr": 1e-3},
                                         "trainer": {"steps": 300, "resume": resume}}, metrics_for(0.9))
        for num, (overrides, loss, resume) in enumerate(jobs)
    ]
    columns = swept_hparams(dirs, [overrides for overrides, _, _ in jobs])
    assert {"loss.name", "optimizer.name", "optimizer.lr", "trainer.steps"} <= set(columns)
    assert "trainer.resume" not in columns and "lrp.gamma" not in columns
