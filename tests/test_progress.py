"""Progress: a logged line at most every few seconds, and one at the end; a Keras bar in a terminal."""

from __future__ import annotations

import io
import logging
import sys

from heatinv import progress as progress_module
from heatinv.progress import ConsoleFilter, FitProgress, Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "heatinv.progress"]


def test_a_log_gets_a_line_per_interval_and_one_at_the_end(caplog):
    caplog.set_level(logging.INFO, logger="heatinv.progress")
    progress = Progress("optimizing the heatmap", 300, "steps", every=3600.0, stream=io.StringIO())
    for done in range(1, 300):
        progress.update(done, {"loss": 0.5})
    assert lines(caplog) == ["heatinv: optimizing the heatmap"]  # within the interval: only what starts
    progress.update(300, {"loss": 0.25})
    line = lines(caplog)[-1]
    assert line.startswith("heatinv: optimizing the heatmap: 300/300 steps (100%), ") and line.endswith("loss 0.25")


def test_a_log_with_a_zero_interval_gets_every_update(caplog):
    caplog.set_level(logging.INFO, logger="heatinv.progress")
    progress = Progress("explaining the training set", 4, "images", every=0.0, stream=io.StringIO())
    for done in (1, 2, 3, 4):
        progress.update(done)
    assert [line.split(": ")[2].split(" ")[0] for line in lines(caplog)[1:]] == ["1/4", "2/4", "3/4", "4/4"]


def test_a_terminal_gets_the_keras_bar_and_the_log_one_line_at_the_end(caplog):
    caplog.set_level(logging.INFO, logger="heatinv.progress")
    screen = Terminal()
    progress = Progress("training", 10, "steps", every=0.0, stream=screen)
    assert progress.bar is not None
    progress.update(5, {"loss": 0.2})
    assert len(lines(caplog)) == 1  # the bar redraws; the log gets nothing in between
    progress.update(10, {"loss": 0.1})
    assert "heatinv: training: 10/10" not in screen.getvalue()
    (record,) = [r for r in caplog.records if r.getMessage().startswith("heatinv: training: 10/10")]
    assert getattr(record, "file_only", False)  # the console has the bar already


def test_a_stretch_started_late_counts_from_its_start(caplog):
    caplog.set_level(logging.INFO, logger="heatinv.progress")
    screen = Terminal()
    progress = Progress("training", 100, "steps", stream=screen, start=25)
    assert progress.bar.target == 75  # the bar's rate and estimate leave out the first 25 steps


class Clock:
    """time.monotonic, moved by hand: which update gets a line depends on the seconds between them."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_a_log_gets_a_line_ten_seconds_after_the_last_line(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="heatinv.progress")
    clock = Clock()
    monkeypatch.setattr(progress_module, "time", clock)
    progress = Progress("optimizing the heatmap", 100, "steps", stream=io.StringIO())
    for seconds, done in ((5.0, 1), (10.25, 2), (15.0, 3), (21.0, 4), (30.0, 5), (32.0, 100)):
        clock.now = seconds
        progress.update(done, {"loss": 0.123456})
    assert lines(caplog)[1:] == [
        "heatinv: optimizing the heatmap: 2/100 steps (2%), 10 s, loss 0.1235",
        "heatinv: optimizing the heatmap: 4/100 steps (4%), 21 s, loss 0.1235",  # 15 s was 4.75 s after the last line
        "heatinv: optimizing the heatmap: 100/100 steps (100%), 32 s, loss 0.1235",  # 30 s was 9 s after
    ]


def test_a_stretch_of_no_units_is_reported_done(caplog):
    caplog.set_level(logging.INFO, logger="heatinv.progress")
    Progress("explaining the test set", 0, "images", stream=io.StringIO()).update(0)
    assert lines(caplog)[-1].startswith("heatinv: explaining the test set: 0/0 images (100%), ")


def test_fit_progress_counts_batches_over_all_epochs(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="heatinv.progress")
    monkeypatch.setattr(progress_module, "time", Clock())
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # not a terminal, even under pytest -s
    callback = FitProgress("training the reference", epochs=3, batches_per_epoch=4)
    for epoch in range(3):
        callback.on_epoch_begin(epoch)
        for batch in range(4):
            callback.on_train_batch_end(batch, {"loss": 0.5})
    assert lines(caplog) == ["heatinv: training the reference", "heatinv: training the reference: 12/12 batches (100%), 0 s, loss 0.5"]


def test_a_terminal_bar_counts_from_the_start_in_steps(caplog):
    caplog.set_level(logging.INFO, logger="heatinv.progress")
    progress = Progress("training", 100, "steps", stream=Terminal(), start=25)
    progress.update(50)
    assert progress.bar._seen_so_far == 25 and progress.bar.unit_name == "step"  # the bar shows "ms/step"


def test_the_console_filter_drops_only_file_only_records():
    assert not ConsoleFilter().filter(logging.makeLogRecord({"msg": "bar's last state", "file_only": True}))
    assert ConsoleFilter().filter(logging.makeLogRecord({"msg": "a line"}))
