"""trainer.strategy=multi_worker: the dataset task as two local workers, each its own process with its own TF_CONFIG.

The runs share one reference model through ``paths.cache_dir`` (the single-process run trains
and caches it first), as workers on a shared file system do.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
JOB = ["debug=smoke", "task=dataset", "target=pattern", "task.epochs=2", "trainer.checkpoint_every=3"]
"""A job of 2 epochs of 11 batches of 128 (the 16-8 MLP of debug=smoke), checkpointed every 3 steps."""


def _ports() -> list[int]:
    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _environment(tmp: Path, **extra) -> dict:
    scratch = tmp / "scratch"  # every temporary folder of the workers: empty again when they are done
    scratch.mkdir(exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG" and not key.startswith("SLURM_")}
    return {**env, "TMPDIR": str(scratch), "TF_CPP_MIN_LOG_LEVEL": "3", "TF_NUM_INTRAOP_THREADS": "1", **extra}


def _single(tmp: Path, run: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "heatinv.train", *JOB, f"hydra.run.dir={tmp / run}", f"paths.cache_dir={tmp / 'cache'}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=_environment(tmp), cwd=tmp)


def _two_workers(tmp: Path, run: str, *overrides: str, killed_at: int | None = None) -> list[subprocess.CompletedProcess]:
    """Worker 0 (the chief) and worker 1; ``killed_at``: worker 1 SIGKILLs itself after that step."""
    ports = _ports()
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    workers = []
    for index in (0, 1):
        extra = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        if killed_at is not None and index == 1:
            extra["HEATINV_TEST_SIGNAL_AT_STEP"] = f"{killed_at}:SIGKILL"
        command = [sys.executable, "-m", "heatinv.train", *JOB, "trainer.strategy=multi_worker", "trainer.collective_timeout=60",
                   f"hydra.run.dir={tmp / run}", f"paths.cache_dir={tmp / 'cache'}", *overrides]
        workers.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=_environment(tmp, **extra), cwd=tmp))
    done = []
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(worker.args, worker.returncode, out, err))
    return done


def _weights(run: Path) -> list[np.ndarray]:
    return keras.saving.load_model(run / "student.keras", safe_mode=True).get_weights()


def _metrics(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi_worker")
    single = _single(tmp, "single")
    assert single.returncode == 0, single.stderr[-3000:]
    workers = _two_workers(tmp, "two_workers")
    for index, worker in enumerate(workers):
        assert worker.returncode == 0, f"worker {index}:\n{worker.stderr[-3000:]}"
    return tmp, workers


@pytest.mark.slow  # three processes importing TensorFlow, two of them together
def test_two_workers_make_the_single_process_updates(runs):
    tmp, _ = runs
    single, multi = tmp / "single", tmp / "two_workers"
    for a, b in zip(_weights(single), _weights(multi)):
        # Each worker computes half of every global batch of 128; the gradients' sum is all-reduced.
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    want, got = _metrics(single), _metrics(multi)
    assert got["steps"] == want["steps"] == 22
    for key in ("cosine", "ssim", "student_accuracy", "agreement", "success_rate"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-5), key


@pytest.mark.slow
def test_only_the_chief_writes_and_each_worker_says_which_it_is(runs):
    tmp, (chief, other) = runs
    assert "worker 0 of 2 (TF_CONFIG; the chief)" in chief.stdout + chief.stderr
    said = other.stdout + other.stderr
    assert "worker 1 of 2 (TF_CONFIG; not the chief: it writes nothing into the run directory)" in said
    assert "(removed at the end); the chief writes" in said
    written = sorted(p.name for p in (tmp / "two_workers").iterdir())
    assert written == sorted(p.name for p in (tmp / "single").iterdir())  # the chief's run, as one process writes it
    assert list((tmp / "scratch").iterdir()) == []  # the other worker's folders are gone


@pytest.mark.slow
def test_a_killed_worker_stops_the_chief_with_a_message_and_both_resume_to_the_same_metrics(runs):
    tmp, _ = runs
    chief, killed = _two_workers(tmp, "killed", killed_at=7)  # after step 7: a checkpoint after step 6 is there
    assert killed.returncode == -signal.SIGKILL
    assert chief.returncode == 4, chief.stderr[-3000:]
    assert "worker 0 of 2 lost the others" in chief.stderr and "trainer.resume=true" in chief.stderr
    assert not (tmp / "killed" / "metrics.json").exists()
    resumed = _two_workers(tmp, "killed", "trainer.resume=true")
    for index, worker in enumerate(resumed):
        assert worker.returncode == 0, f"worker {index}:\n{worker.stderr[-3000:]}"
    assert "resuming" in resumed[0].stdout + resumed[0].stderr
    for a, b in zip(_weights(tmp / "two_workers"), _weights(tmp / "killed")):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    want, got = _metrics(tmp / "two_workers"), _metrics(tmp / "killed")
    for key in ("cosine", "ssim", "student_accuracy", "agreement"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-5), key


def test_multi_worker_without_a_cluster_exits_2_saying_what_to_set(tmp_path):
    command = [sys.executable, "-m", "heatinv.train", *JOB, "trainer.strategy=multi_worker", f"hydra.run.dir={tmp_path / 'run'}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_environment(tmp_path), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "trainer.strategy=multi_worker needs the cluster" in done.stderr and "TF_CONFIG" in done.stderr


@pytest.mark.slow
def test_over_a_finished_run_every_worker_refuses_to_start(runs):
    """The chief's directory checks hold for every worker: none builds and then waits for a chief that is gone."""
    tmp, _ = runs
    before = sorted(p.name for p in (tmp / "two_workers").iterdir())
    for index, worker in enumerate(_two_workers(tmp, "two_workers")):
        assert worker.returncode == 2, f"worker {index}:\n{worker.stderr[-3000:]}"
        assert "already holds results" in worker.stderr, worker.stderr[-2000:]
    assert sorted(p.name for p in (tmp / "two_workers").iterdir()) == before
