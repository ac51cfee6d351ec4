"""A single run's folder is named after its overrides, the resume command it prints reads back, and
its HParams row is named after the folder.

``configs/hydra/default.yaml`` names a run ``outputs/<date>/<time>_<overrides>`` (Hydra's
``override_dirname``, as a sweep's job folders); such a name holds ``=`` and ``,``, which
Hydra's override grammar reads as syntax, so the printed resume command quotes it. The checks
read the name and the command back through Hydra's own parser and a shell's word splitting
(:func:`shlex.split`), not through heatinv's code.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from conftest import SMOKE
from heatinv.wording import run_dir_override
from heatinv.config import run_folder_name
from heatinv.loop import TEST_SIGNAL_VARIABLE

HANG_LIMIT = 900  # seconds; a hang detector, not a performance check


def test_job_folders_leave_out_what_a_resume_may_change_and_run_folders_keep_it():
    """A sweep extended with trainer.steps=600 looked for its jobs in folders named ...,trainer.steps=600.
    A single run keeps the key: two runs started in one second with other trainer.steps stay apart."""
    from heatinv.config import MAY_CHANGE_ON_RESUME, job_folder_name

    assert job_folder_name(3, "loss=l1,model.hidden=[16,8],trainer.steps=600,task.epochs=2") == "3_loss=l1,model.hidden=[16,8]"
    assert job_folder_name(0, ",".join(f"{key}=1" for key in MAY_CHANGE_ON_RESUME)) == "0_"
    # Named one by one: how long it runs, how often it logs and saves, how the same updates run.
    resumable = ("trainer.steps=9,task.epochs=9,trainer.log_every=3,trainer.checkpoint_every=3,trainer.checkpoint_seconds=0,"
                 "trainer.max_nonfinite=3,trainer.steps_per_execution=3,trainer.jit_compile=false,trainer.strategy=mirrored,"
                 "trainer.resume=true,trainer.overwrite=true")
    assert job_folder_name(1, f"{resumable},trainer.seed=1") == "1_trainer.seed=1"
    assert run_folder_name("23-37-04", "trainer.steps=600") == "23-37-04_trainer.steps=600"


def test_a_run_without_overrides_is_named_by_its_time_only():
    assert run_folder_name("23-37-04", "") == "23-37-04"
    assert run_folder_name("23-37-04", "loss=l1,optimizer.lr=0.1") == "23-37-04_loss=l1,optimizer.lr=0.1"


@pytest.mark.parametrize(
    "path",
    [
        "/tmp/outputs/2026-11-30/23-37-04",
        "/tmp/outputs/2026-11-30/23-37-04_loss=l1",
        "/tmp/outputs/2026-11-30/23-37-04_loss=l1,optimizer.lr=0.1",
        "/tmp/my outputs/23-37-04_target.label=[3,5]",
        "/tmp/it's/$HOME/a\\b/23-37-04_x=1",
        "/tmp/ends/in\\",
    ],
)
def test_the_resume_override_is_one_shell_word_that_hydra_reads_back_as_the_path(path):
    words = shlex.split(run_dir_override(path))
    assert len(words) == 1
    override = OverridesParser.create().parse_override(words[0])
    assert override.get_key_element() == "hydra.run.dir" and override.value() == path
    assert not override.is_sweep_override()


@pytest.mark.slow
def test_a_run_is_named_after_its_overrides_and_resumes_from_the_printed_command(tmp_path, reference_cache):
    overrides = ["loss=l1", "trainer.steps=30", "trainer.steps_per_execution=5", "trainer.log_every=10",
                 "trainer.checkpoint_every=100"]
    command = [sys.executable, "-m", "heatinv.train", SMOKE, f"paths.cache_dir={reference_cache}", *overrides]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", TEST_SIGNAL_VARIABLE: "10:SIGINT"}
    stopped = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_LIMIT)
    # README: Ctrl-C stops between two steps, saves a checkpoint and prints how to resume; exit 128 + 2.
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert "SIGINT received: stopped after step 10" in stopped.stderr
    assert "Traceback" not in stopped.stderr

    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    assert not (run_dir / "metrics.json").exists()
    # Hydra's override_dirname: the overrides sorted, path-valued keys (paths.cache_dir) left out.
    expected = ",".join(sorted([SMOKE, *overrides]))
    assert re.fullmatch(r"\d\d-\d\d-\d\d_" + re.escape(expected), run_dir.name), run_dir.name
    assert (run_dir / "checkpoints" / "ckpt-10.index").is_file()

    hint = re.search(r"Resume with the same command plus: (.*) trainer\.resume=true", stopped.stderr)
    assert hint, stopped.stderr[-3000:]
    resume = shlex.split(hint.group(1))
    env.pop(TEST_SIGNAL_VARIABLE)
    resumed = subprocess.run(command + resume + ["trainer.resume=true"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=HANG_LIMIT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {run_dir} after step 10 of 30" in resumed.stdout
    assert json.loads((run_dir / "metrics.json").read_text())["steps"] == 30
    assert [p.name for p in (tmp_path / "outputs").glob("*/*")] == [run_dir.name]  # no second folder

    # Issue #18: the HParams row is named after the run's folder, then where it lies under outputs/
    # (paths.root), so rows of runs started the same second in different days stay apart.
    accumulator = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    accumulator.Reload()
    content = accumulator.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.group_name == f"{run_dir.name} ({run_dir.parent.name})"
    assert start.hparams["loss.name"].string_value == "l1"


def test_a_resume_lists_the_settings_it_changes_not_its_own_switch(config, tmp_path):
    from heatinv.checkpoints import check_resumable, save_run_config

    out = str(tmp_path / "run")
    before = config()
    save_run_config(out, before)
    assert check_resumable(out, config("trainer.resume=true")) == []
    assert check_resumable(out, config("trainer.resume=true", "trainer.log_every=7")) == [
        f"trainer.log_every: {before.trainer.log_every} -> 7"
    ]
    # a cosine schedule is stretched over an extended run: its learning rate jumps back up, which is said
    dataset = str(tmp_path / "dataset")
    save_run_config(dataset, config("task=dataset", "target=pattern", "task.lr_schedule=cosine", "task.epochs=2"))
    [extended] = check_resumable(dataset, config("task=dataset", "target=pattern", "task.lr_schedule=cosine", "task.epochs=3"))
    assert extended.startswith("task.epochs: 2 -> 3 (task.lr_schedule=cosine decays over the new total")


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_run_never_writes_its_results_over_a_file_it_reads(config, tmp_path, overwrite):
    """model.path=student.keras in the run directory: with trainer.overwrite=true the trained student replaced it."""
    import keras

    from conftest import expect
    from heatinv.checkpoints import RunDirectoryError

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    mine = run_dir / "student.keras"
    keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)]).save(mine)
    before = mine.read_bytes()
    cfg = config("model=file", f"model.path={mine}", f"trainer.overwrite={str(overwrite).lower()}")
    expect(RunDirectoryError, cfg, f"model.path={mine}", "writes its own student.keras", "hydra.run.dir=")
    assert mine.read_bytes() == before and sorted(os.listdir(run_dir)) == ["student.keras"]


def test_a_run_into_a_folder_another_run_is_using_is_refused_until_that_run_ends(config, tmp_path):
    """Two runs started into one hydra.run.dir both wrote their results and TensorBoard events there."""
    import fcntl

    from conftest import expect
    from heatinv.checkpoints import RunDirectoryError
    from heatinv.train import run

    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    other = os.open(out, os.O_RDONLY)  # another run's hold on the folder
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        expect(RunDirectoryError, config(), f"Run directory {out} is in use by another heatinv run", "hydra.run.dir=",
               out=out)
        assert sorted(os.listdir(out)) == ["notes.txt"]
    finally:
        os.close(other)  # that run ends, however it ends: nothing of its hold is left behind
    assert run(config())["steps"] > 0
