"""Hydra callbacks for sweeps: a summary of every job, the HParams experiment, launcher environment.

:class:`SweepSummary` (configured in ``configs/hydra/default.yaml``) runs with every launcher
and sweeper. When a sweep ends, it writes into the sweep directory

- ``sweep_summary.json``: each job's number, directory, overrides, status (``ok``,
  ``failed`` with the error, or ``interrupted`` with its checkpoint's step) and metrics,
  which jobs did not finish (``failed``), the swept keys no job read (``read_by_no_job``: the
  jobs that differ only in them ran the same) and the best job by ``objective``;
- the HParams experiment (``hp.hparams_config``), in each job's run: the swept config keys
  and the final metrics ``final/<metric>``, so ``tensorboard --logdir <sweep dir>`` shows one
  run and one row per job with its values and metrics, and no column for every gradient norm.

A job that fails is recorded where it ran (a worker process, a Ray actor, a Slurm node): the
callback writes ``heatinv job failed: <type>: <message>`` and the traceback to the job's log
(``<job dir>/train.log``), and the summary reads it from there. A job without that line and
without ``metrics.json`` is reported as failed too (it exited or was killed before Hydra
could record it). The summary is also written when the sweeper stops the sweep because a job
failed (Hydra then skips ``on_multirun_end``): from an exit handler, with ``"finished": false``.

:class:`EnvDefaults` (configured by ``configs/hydra/launcher/ray.yaml``) sets environment
variables the launcher reads in the main process, e.g. ``RAY_AUTH_MODE=disabled`` so a local
Ray writes no token into the home directory; variables already set are left alone.

:class:`WorkerFolder` (configured in ``configs/hydra/default.yaml``): in a multi-worker job
(``trainer.strategy=multi_worker``) a worker that is not the chief keeps Hydra's record and log
out of the run directory, in a temporary folder removed when it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import logging
import math
import os
import re
import shlex
import shutil
import tempfile
import time
from typing import Any, Optional

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from heatinv.atomic import write_json
from heatinv.cluster import NoClusterError, describe_cluster
from heatinv.final_metrics import FINAL_METRICS
from heatinv.job_log import DONE_MARK, FAILED_MARK, UNREAD_MARK
from heatinv.wording import count, run_dir_override

log = logging.getLogger(__name__)

SUMMARY_NAME = "sweep_summary.json"
HPARAMS_EVENTS_SUFFIX = ".heatinv-sweep"


class EnvDefaults(Callback):
    """Set environment variables for the launcher when a sweep starts, unless already set."""

    def __init__(self, env: Optional[dict] = None) -> None:
        self.env = {str(key): str(value) for key, value in (env or {}).items()}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        for key, value in self.env.items():
            os.environ.setdefault(key, value)


class WorkerFolder(Callback):
    """A multi-worker job's other workers: Hydra's ``.hydra/`` and log go to a temporary folder, not the run directory.

    The run directory stays the chief's (``paths.output_dir``, where such a worker reads the
    checkpoints a resume starts from); Hydra writes its record there before the job's code
    runs, so the choice is made here, when the run starts.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if OmegaConf.select(config, "trainer.strategy") != "multi_worker":
            return
        try:
            cluster = describe_cluster()
        except NoClusterError:
            return  # the job refuses to start and says what to set
        if cluster.chief:
            return
        run_dir = str(config.hydra.run.dir)
        scratch = tempfile.mkdtemp(prefix=f"heatinv-worker{cluster.index}-hydra-")
        atexit.register(shutil.rmtree, scratch, True)
        with open_dict(config):
            config.paths.output_dir = run_dir
            config.hydra.run.dir = scratch


class SweepSummary(Callback):
    """Write ``sweep_summary.json`` and the HParams experiment into the sweep directory."""

    def __init__(self, filename: str = SUMMARY_NAME, metrics: Optional[list] = None) -> None:
        self.filename = filename
        self.metrics = tuple(metrics) if metrics is not None else FINAL_METRICS
        self._sweep_dir: Optional[str] = None
        self._written = False

    # ------------------------------------------------------------------ main process
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._sweep_dir = os.path.abspath(str(config.hydra.sweep.dir))
        # The Optuna sweeper opens its SQLite storage in the sweep directory before any job
        # has created it.
        os.makedirs(self._sweep_dir, exist_ok=True)
        self._written = False
        # A failed job makes the sweeper raise, and Hydra then skips on_multirun_end.
        atexit.register(self._write_at_exit)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        atexit.unregister(self._write_at_exit)
        self._write(finished=True)

    def _write_at_exit(self) -> None:
        if not self._written:
            self._write(finished=False)

    def _write(self, finished: bool) -> None:
        if self._sweep_dir is None:
            return
        self._written = True
        if not job_dirs(self._sweep_dir):  # Hydra refused the command before any job: no sweep to sum up
            if set(os.listdir(self._sweep_dir)) <= {"multirun.yaml"}:  # nothing but what this command wrote
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self._sweep_dir, "multirun.yaml"))
                with contextlib.suppress(OSError):
                    os.rmdir(self._sweep_dir)
            return
        try:
            summary = summarize(self._sweep_dir, finished)
            write_json(os.path.join(self._sweep_dir, self.filename), summary)
            write_hparams_config(self._sweep_dir, summary["jobs"], self.metrics)
        except Exception:  # a summary must never hide the sweep's own result or error
            log.exception("heatinv: could not write the sweep summary in %s", self._sweep_dir)
            return
        line = f"heatinv: sweep summary {os.path.join(self._sweep_dir, self.filename)}: {count(len(summary['jobs']), 'job')}"
        for status in ("interrupted", "failed"):
            jobs = [job for job in summary["jobs"] if job["status"] == status]
            if jobs:
                line += f", {status}: " + "; ".join(f"#{job['num']} ({job['error']})" for job in jobs)
        if summary["read_by_no_job"]:
            line += f", read by no job: {', '.join(summary['read_by_no_job'])} (each job ran without it: see its warning)"
        if any(job["status"] == "failed" for job in summary["jobs"]):
            line += ". A failed job's traceback is in its train.log"
        print(line, flush=True)
        print(f"heatinv: look at the sweep with  tensorboard --logdir {shlex.quote(self._sweep_dir)}", flush=True)

    # ------------------------------------------------------------------ where the job ran
    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if job_return.status != JobStatus.FAILED:
            return
        error = job_return._return_value  # the exception; .return_value would raise it
        # File only: the console has the job's own message (heatinv's stderr line, or Hydra's
        # report of the exception) and the sweep summary's line; a third copy hides the sweep.
        file_only = {"file_only": True}
        if isinstance(error, BaseException):
            log.error(
                "%s%s: %s", FAILED_MARK, type(error).__name__, error, exc_info=(type(error), error, error.__traceback__),
                extra=file_only,
            )
        else:
            log.error("%s%s", FAILED_MARK, error, extra=file_only)
        for handler in logging.getLogger().handlers:
            handler.flush()


# ---------------------------------------------------------------------------- reading a sweep
def job_dirs(sweep_dir: str) -> list[str]:
    """Every job directory under ``sweep_dir`` (one with ``.hydra/overrides.yaml``), by job number."""
    found = []
    for root, dirs, _ in os.walk(sweep_dir):
        if os.path.isfile(os.path.join(root, ".hydra", "overrides.yaml")):
            found.append(root)
            dirs[:] = []  # a job's own folders hold no jobs
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "tensorboard")
    return sorted(found, key=lambda path: (_job_num(path), path))


def _job_num(job_dir: str) -> int:
    try:
        num = OmegaConf.load(os.path.join(job_dir, ".hydra", "hydra.yaml")).hydra.job.num
        return int(num)
    except Exception:
        return 1 << 30


def _job_name(job_dir: str) -> str:
    try:
        return str(OmegaConf.load(os.path.join(job_dir, ".hydra", "hydra.yaml")).hydra.job.name)
    except Exception:
        return "train"


def failure_from_log(log_path: str) -> Optional[str]:
    """The ``heatinv job failed:`` message of a job's latest attempt in its log (without the traceback), if any.

    A sweep run again in its folder (``trainer.resume=true``) appends to its jobs' logs: a
    failure followed by a :data:`DONE_MARK` line was an attempt that a later one finished.
    """
    if not os.path.isfile(log_path):
        return None
    with open(log_path, errors="replace") as f:
        lines = f.read().splitlines()
    message = None
    for i, line in enumerate(lines):
        if FAILED_MARK in line:
            parts = [line.split(FAILED_MARK, 1)[1]]
            for more in lines[i + 1 :]:
                if more.startswith("Traceback (most recent call last)") or _is_log_record(more):
                    break
                parts.append(more)
            message = "\n".join(parts).strip()
        elif DONE_MARK in line:
            message = None
    return message


def unread_keys_from_log(log_path: str) -> set[str]:
    """The keys a job warned it does not read (a sweep crossed them with a choice that ignores them)."""
    if not os.path.isfile(log_path):
        return set()
    with open(log_path, errors="replace") as f:
        return {line.split("heatinv: ", 1)[1].split("=", 1)[0] for line in f if UNREAD_MARK in line and "heatinv: " in line}


def _newest_checkpoint(job_dir: str) -> Optional[int]:
    """The step of a job's newest checkpoint (``checkpoints/ckpt-<n>.index``), None without one."""
    steps = [int(m.group(1)) for path in glob.glob(os.path.join(job_dir, "checkpoints", "ckpt-*.index"))
             if (m := re.fullmatch(r"ckpt-(\d+)\.index", os.path.basename(path)))]
    return max(steps, default=None)


def _is_log_record(line: str) -> bool:
    """Hydra's job log format starts each record with ``[<date> <time>][<logger>]``."""
    return line.startswith("[") and "][" in line[:40]


def scalar_metrics(metrics: dict) -> dict:
    """The numbers and strings of ``metrics.json`` (drops lists such as ``diagnosis``)."""
    return {key: value for key, value in metrics.items() if value is None or isinstance(value, (bool, int, float, str))}


def read_job(job_dir: str, sweep_dir: str) -> dict:
    overrides = OmegaConf.to_container(OmegaConf.load(os.path.join(job_dir, ".hydra", "overrides.yaml")))
    metrics = None
    metrics_path = os.path.join(job_dir, "metrics.json")
    if os.path.isfile(metrics_path):
        try:
            with open(metrics_path) as f:
                metrics = scalar_metrics(json.load(f))
        except (OSError, ValueError):
            metrics = None
    log_path = os.path.join(job_dir, f"{_job_name(job_dir)}.log")
    error = failure_from_log(log_path)
    status = "ok" if error is None else "failed"
    saved = _newest_checkpoint(job_dir)
    if error is None and metrics is not None and saved is not None and saved > (metrics.get("steps") or 0):
        metrics = None  # an extension stopped past the results it would replace: they are an earlier attempt's
    if error is None and metrics is None:
        status = "interrupted" if saved is not None else "failed"
        error = (
            f"stopped after step {saved} (checkpoint ckpt-{saved}): resume the sweep with the same command plus "
            f"{run_dir_override(sweep_dir, 'hydra.sweep.dir')} trainer.resume=true"
            if saved is not None
            else f"no metrics.json, and no error in {os.path.relpath(log_path, sweep_dir)}: the job exited or was "
            "killed before Hydra could record a failure (see the launcher's output)"
        )
    return {
        "num": _job_num(job_dir),
        "dir": os.path.relpath(job_dir, sweep_dir),
        "overrides": overrides,
        "unread": sorted(unread_keys_from_log(log_path)),
        "status": status,
        "error": error,
        "metrics": metrics,
    }


def summarize(sweep_dir: str, finished: bool = True) -> dict:
    """The content of ``sweep_summary.json`` for the jobs found under ``sweep_dir``."""
    jobs = [read_job(job_dir, sweep_dir) for job_dir in job_dirs(sweep_dir)]
    scored = [job for job in jobs if job["status"] == "ok" and _finite(job["metrics"].get("objective"))]
    best = min(scored, key=objective, default=None)
    return {
        "sweep_dir": sweep_dir,
        "finished": finished,  # false: the sweep stopped early (a job failed and the sweeper raised)
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "jobs": jobs,
        "ok": sum(job["status"] == "ok" for job in jobs),
        "failed": [job["num"] for job in jobs if job["status"] != "ok"],
        # Swept keys no job read: the jobs that differ only in them ran the same.
        "read_by_no_job": sorted(set.intersection(*(set(job["unread"]) for job in jobs))) if jobs else [],
        "best": None if best is None else {"num": best["num"], "dir": best["dir"], "objective": objective(best)},
    }


def objective(job: dict) -> float:
    return job["metrics"]["objective"]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)



# ---------------------------------------------------------------------------- HParams
def _override_key(override: str) -> Optional[str]:
    key = override.split("=", 1)[0].lstrip("+~").strip()
    if not key or key.startswith("hydra.") or key.startswith("hydra/"):
        return None
    return key.split("@", 1)[0]


def swept_hparams(job_dirs_: list[str], overrides: list[list[str]]) -> dict[str, list]:
    """``{flat key: [value per job]}`` for the keys every run shows (``HPARAM_KEYS``), the jobs' overrides
    set, or that differ between jobs; never the switches of how a job starts (``NOT_HPARAMS``).

    Values are the ones each job logged to HParams (``heatinv.summaries.hparam_value`` of
    ``heatinv.config.flat_config``); a group override (``loss=huber``) selects every key of
    that group (``loss.name``, ``loss.delta``, ...).
    """
    from heatinv.config import flat_config
    from heatinv.summaries import HPARAM_KEYS, NOT_HPARAMS, hparam_value

    flats = []
    for job_dir in job_dirs_:
        config = OmegaConf.load(os.path.join(job_dir, ".hydra", "config.yaml"))
        flats.append({key: hparam_value(value) for key, value in flat_config(config).items()})
    prefixes = {key for job in overrides for key in map(_override_key, job) if key}
    keys = sorted({key for flat in flats for key in flat})
    chosen = {}
    for key in keys:
        values = [flat.get(key) for flat in flats]
        overridden = any(key == p or key.startswith(p + ".") for p in prefixes)
        differs = len({json.dumps(v, sort_keys=True) for v in values}) > 1
        if key not in NOT_HPARAMS and (key in HPARAM_KEYS or overridden or differs):
            chosen[key] = values
    return chosen


def _domain(values: list):
    from tensorboard.plugins.hparams import api as hp

    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, bool) for v in present):
        return hp.Discrete(sorted(set(present)))
    if all(isinstance(v, str) for v in present):
        return hp.Discrete(sorted(set(present)))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        if all(isinstance(v, int) for v in present):
            return hp.IntInterval(min(present), max(present))
        return hp.RealInterval(float(min(present)), float(max(present)))
    return None


def write_hparams_config(sweep_dir: str, jobs: list[dict], metrics=FINAL_METRICS) -> list[str]:
    """The HParams experiment for the sweep's jobs, as an event file in each job's run.

    Each job's own run (``<job>/tensorboard``) holds its session (``hp.hparams``) and the
    scalars ``final/<metric>``; this experiment names which of them the dashboard shows.
    It goes into every job's run rather than the sweep directory, where it would be a run of
    its own in TensorBoard's run list: TensorBoard takes the first experiment it finds, and
    every copy is the same, so one job is one run whichever folder a person opens.
    Returns the event files' paths (none when no job has a TensorBoard run).
    """
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.hparams import api as hp
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    with_runs = [job for job in jobs if os.path.isdir(os.path.join(sweep_dir, job["dir"], "tensorboard"))]
    if not with_runs:
        return []
    dirs = [os.path.join(sweep_dir, job["dir"]) for job in with_runs]
    values = swept_hparams(dirs, [job["overrides"] for job in with_runs])
    hparams = []
    for name, column in values.items():
        domain = _domain(column)
        hparams.append(hp.HParam(name, domain) if domain is not None else hp.HParam(name))
    metric_list = [hp.Metric(f"final/{name}", display_name=name) for name in metrics]
    summary = hp.hparams_config_pb(hparams=hparams, metrics=metric_list)
    # Mark the columns whose values differ between jobs (TensorBoard lists those first).
    value = summary.value[0]
    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for info in data.experiment.hparam_infos:
        info.differs = len({json.dumps(v, sort_keys=True) for v in values[info.name]}) > 1
    value.metadata.plugin_data.content = data.SerializeToString()

    paths = []
    for job_dir in dirs:
        run = os.path.join(job_dir, "tensorboard")
        for old in glob.glob(os.path.join(run, f"events.out.tfevents.*{HPARAMS_EVENTS_SUFFIX}")):
            os.remove(old)  # one experiment per job's run, the latest
        writer = EventFileWriter(run, filename_suffix=HPARAMS_EVENTS_SUFFIX)
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=0, summary=summary))
        writer.close()
        paths += glob.glob(os.path.join(run, f"events.out.tfevents.*{HPARAMS_EVENTS_SUFFIX}"))
    return paths
