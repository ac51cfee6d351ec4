"""Progress: a logged line at most every few seconds, and one at the end; a Keras bar in a terminal."""

from __future__ import annotations

import io
import logging

from heatinv.progress import Progress


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
