"""What a run writes and keeps: files written whole, the results' order, checkpoints, resume, the sweep's best job.

Each test guards one behaviour that a mutation review of atomic.py, outputs.py,
checkpoints.py, loop.py, callbacks.py and manipulate.py found no other test caught (the
rest of resume is in tests/test_reliability.py, run folders in tests/test_run_folders.py).
"""

from __future__ import annotations

import json
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from matplotlib.figure import Figure
from omegaconf import OmegaConf
from tensorboard.summary.writer.record_writer import RecordWriter

import heatinv.outputs as outputs
import heatinv.train as train
from conftest import dense_model, expect
from heatinv.atomic import write_json
from heatinv.callbacks import SUMMARY_NAME, SweepSummary
from heatinv.checkpoints import (
    Checkpointer,
    ResumeError,
    RunDirectoryError,
    checkpoint_numbers,
    held_run_directory,
)
from heatinv.job_log import FAILED_MARK
from heatinv.outputs import write_run_files
from heatinv.summaries import TRAIN
from heatinv.targets import pattern_map
from heatinv.train import run


def built(seed: int):
    model, optimizer = dense_model(seed=seed), keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    return model, optimizer


# --------------------------------------------------------------------------- atomic.py
def test_write_json_nulls_non_finite_floats_inside_lists_and_tuples(tmp_path):
    """Strict JSON (jq, JSON.parse) has no NaN/Infinity: nested ones become null too, never a failed write."""
    path = tmp_path / "m.json"
    write_json(str(path), {"curve": [1.0, float("nan")], "pair": (float("inf"), 2.0), "jobs": [{"cosine": float("-inf")}]})
    strict = json.loads(path.read_text(), parse_constant=lambda token: pytest.fail(f"non-JSON token {token}"))
    assert strict == {"curve": [1.0, None], "pair": [None, 2.0], "jobs": [{"cosine": None}]}


def test_a_sweep_summary_is_written_when_a_jobs_metrics_hold_nan(tmp_path):
    """A job's metrics.json with Python's NaN token (an older heatinv, a hand-made file): the summary still appears."""
    sweep = tmp_path / "sweep"
    job = sweep / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["loss=l1"]))
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"loss": {"name": "l1"}}))
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": 0, "name": "train"}}}))
    (job / "train.log").write_text("")
    (job / "metrics.json").write_text('{"objective": NaN, "cosine": NaN, "steps": 3}')
    callback, config = SweepSummary(), OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    callback.on_multirun_start(config)
    callback.on_multirun_end(config)
    summary = json.loads((sweep / SUMMARY_NAME).read_text())
    assert summary["jobs"][0]["metrics"]["cosine"] is None and summary["best"] is None


# --------------------------------------------------------------------------- outputs.py
def test_metrics_json_is_written_only_once_every_other_result_is(config, tmp_path, monkeypatch):
    """A run with metrics.json counts as finished (sweep summary: "ok"); a failure writing the figure must not leave one."""
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        run(config())
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_a_student_save_cut_short_leaves_the_previous_student_whole(tmp_path, monkeypatch):
    """Extending a finished run on a full disk: the old student.keras must survive a save that fails half way."""
    dense_model(seed=1).save(tmp_path / "student.keras")
    before = (tmp_path / "student.keras").read_bytes()

    def cut_short(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(keras.Model, "save", cut_short)
    with pytest.raises(OSError):
        write_run_files(str(tmp_path), {"cosine": 0.5}, dense_model(seed=2), Figure())
    assert (tmp_path / "student.keras").read_bytes() == before
    assert os.listdir(tmp_path) == ["student.keras"]  # no temporary file left either


# --------------------------------------------------------------------------- checkpoints.py
def test_the_newest_checkpoint_is_the_highest_step_not_the_last_name(tmp_path):
    """ckpt-100 is newer than ckpt-80 (sorted as names, "80" > "100")."""
    Checkpointer(str(tmp_path), *built(1)).save(80)
    saver = Checkpointer(str(tmp_path), *built(1))
    saver.save(80)
    saver.save(100)
    assert checkpoint_numbers(str(tmp_path / "checkpoints")) == [100, 80]
    assert Checkpointer(str(tmp_path), *built(2)).restore() == 100


def test_a_second_hold_on_a_held_run_directory_is_refused(tmp_path):
    """Two heatinv runs (each holding the folder as run() does) must exclude each other, not share it."""
    with held_run_directory(str(tmp_path)):
        with pytest.raises(RunDirectoryError, match="in use by another heatinv run"):
            with held_run_directory(str(tmp_path)):
                pass
    with held_run_directory(str(tmp_path)):  # free again once the first run ended
        pass


def test_resuming_checkpoints_without_their_config_is_refused_before_anything_loads(config, tmp_path, monkeypatch):
    """Checkpoints copied without checkpoints/config.yaml cannot be matched with this config: refused, not trusted."""
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "ckpt-5.index").write_bytes(b"")
    monkeypatch.setattr(train, "build_parts", lambda cfg: pytest.fail("resume went on to load the data"))
    expect(ResumeError, config("trainer.resume=true"), "config.yaml is missing", "trainer.overwrite=true")


@pytest.mark.parametrize("folder", ["checkpoints", "tensorboard"])
def test_a_run_never_reads_a_file_inside_a_folder_it_writes(config, tmp_path, folder):
    """trainer.overwrite=true removes checkpoints/ and tensorboard/ whole: a target read from in there would be lost."""
    path = tmp_path / "run" / folder / "target.npy"
    path.parent.mkdir(parents=True)
    np.save(path, 0.01 * pattern_map("frame")[..., 0])  # a valid target: only where it lies is wrong
    before = path.read_bytes()
    expect(RunDirectoryError, config("target=file", f"target.path={path}", "trainer.overwrite=true"),
           f"target.path={path}", f"writes its own {folder}", "hydra.run.dir=")
    assert path.read_bytes() == before


def test_a_run_gives_back_the_signal_handlers_it_found(config):
    """After run() (a notebook, a sweep's basic launcher running the next job), Ctrl-C and SIGTERM act as before it."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    run(config("trainer.steps=2"))
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_wrong_model_is_not_half_restored_from_a_checkpoint(tmp_path):
    """A model.path file replaced by a deeper model (the config is the same): refused, never a silent partial restore."""
    Checkpointer(str(tmp_path), *built(1)).save(10)
    deeper = keras.Sequential([dense_model(seed=2), keras.layers.Dense(3)])
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(deeper.trainable_variables)
    with pytest.raises(ResumeError, match=r"ckpt-10 does not fit this run's student or optimizer .*model\.path.*trainer\.overwrite=true"):
        Checkpointer(str(tmp_path), deeper, optimizer).restore()


# --------------------------------------------------------------------------- loop.py
def test_checkpoint_every_is_honoured_when_calls_step_past_its_multiples(composed):
    """steps_per_execution=3, checkpoint_every=5: calls end at 3, 6, 9, 12, so a checkpoint comes at 6 (the first
    call past step 5) and at 12 (past 10), not only the one at the end."""
    cfg, out = composed("trainer.steps=12", "trainer.steps_per_execution=3", "trainer.log_every=3",
                        "trainer.checkpoint_every=5", "trainer.checkpoint_seconds=0")
    run(cfg)
    assert checkpoint_numbers(str(out / "checkpoints")) == [12, 6]


# --------------------------------------------------------------------------- callbacks.py
def test_the_best_job_of_a_sweep_is_one_that_finished(tmp_path):
    """A job stopped by the doctor writes metrics.json and fails: it must not be named the sweep's best."""
    sweep = tmp_path / "sweep"
    for num, cosine, log in ((0, 0.9, ""), (1, 0.99, f"[2026-01-01 00:00:00,000][heatinv.callbacks][ERROR] - "
                                                     f"{FAILED_MARK}GradientsVanished: every gradient is zero\n")):
        job = sweep / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"trainer.seed={num}"]))
        (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"trainer": {"seed": num}}))
        (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num, "name": "train"}}}))
        (job / "train.log").write_text(log)
        (job / "metrics.json").write_text(json.dumps({"objective": 1 - cosine, "cosine": cosine, "steps": 3}))
    callback, config = SweepSummary(), OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    callback.on_multirun_start(config)
    callback.on_multirun_end(config)
    summary = json.loads((sweep / SUMMARY_NAME).read_text())
    assert [job["status"] for job in summary["jobs"]] == ["ok", "failed"]
    assert summary["best"]["num"] == 0


def test_every_summary_up_to_a_checkpoint_is_on_disk_when_the_checkpoint_is(composed, monkeypatch):
    """A kill right after a checkpoint must not lose the summaries before it: the resumed run starts its events after
    the checkpoint's step and never writes them again. Read back from disk at each save, as a new process would."""
    # A file system that keeps written records only once flushed (gfile's contract; local files often write through).
    write, flush = RecordWriter.write, RecordWriter.flush

    def held_write(self, data):
        self.__dict__.setdefault("held", []).append(data)

    def released_flush(self):
        for data in self.__dict__.pop("held", []):
            write(self, data)
        flush(self)

    monkeypatch.setattr(RecordWriter, "write", held_write)
    monkeypatch.setattr(RecordWriter, "flush", released_flush)
    cfg, out = composed("trainer.steps=40", "trainer.log_every=10", "trainer.steps_per_execution=5",
                        "trainer.checkpoint_every=20", "trainer.checkpoint_seconds=0")
    real, on_disk = Checkpointer.save, {}

    def save(self, completed, *args, **kwargs):
        path = real(self, completed, *args, **kwargs)
        on_disk[completed] = {
            event.step
            for file in (out / "tensorboard").glob("events.out.tfevents.*")
            for event in tf.compat.v1.train.summary_iterator(str(file))
            if event.summary.value
        }
        return path

    monkeypatch.setattr(Checkpointer, "save", save)
    run(cfg)
    assert {10, 20} <= on_disk[20] and {30, 40} <= on_disk[40]


@pytest.mark.slow
def test_a_dataset_run_resumed_mid_epoch_logs_the_same_epoch_training_means(tmp_path, reference_cache):
    """Killed after checkpoint 4 of epoch 1's 11 batches: the epoch's mean training terms (TensorBoard's
    2_train group) must still average all 11 batches, as in the uninterrupted run."""
    from test_reliability import DATASET, launch

    def train_means(run_dir):
        return {
            (value.tag, event.step): float(tf.make_ndarray(value.tensor))
            for path in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
            for event in tf.compat.v1.train.summary_iterator(str(path))
            for value in event.summary.value
            if value.tag.startswith(TRAIN)
        }

    done = launch(tmp_path / "uninterrupted", reference_cache, *DATASET, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    killed = launch(tmp_path / "killed", reference_cache, *DATASET, signal_at="7:SIGKILL", timeout=900)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = launch(tmp_path / "killed", reference_cache, *DATASET, "trainer.resume=true", timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = train_means(tmp_path / "uninterrupted")
    assert {step for _, step in expected} == {1, 2} and train_means(tmp_path / "killed") == pytest.approx(expected, rel=1e-6)
