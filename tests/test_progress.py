"""Progress: a line at most every few seconds in a log, and one at the end; a Keras bar in a terminal."""

from __future__ import annotations

import io

from heatinv.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_interval_and_one_at_the_end():
    log = io.StringIO()
    progress = Progress("optimizing the heatmap", 300, "steps", every=3600.0, stream=log)
    for done in range(1, 300):
        progress.update(done, {"loss": 0.5})
    assert log.getvalue() == ""  # within the interval: nothing yet
    progress.update(300, {"loss": 0.25})
    (line,) = log.getvalue().splitlines()
    assert line.startswith("heatinv: optimizing the heatmap: 300/300 steps (100%), ") and line.endswith("loss 0.25")


def test_a_log_with_a_zero_interval_gets_every_update():
    log = io.StringIO()
    progress = Progress("explaining the training set", 4, "images", every=0.0, stream=log)
    for done in (1, 2, 3, 4):
        progress.update(done)
    assert [line.split(": ")[2].split(" ")[0] for line in log.getvalue().splitlines()] == ["1/4", "2/4", "3/4", "4/4"]


def test_a_terminal_gets_the_keras_bar_not_lines():
    screen = Terminal()
    progress = Progress("training", 10, "steps", every=0.0, stream=screen)
    assert progress.bar is not None
    progress.update(10, {"loss": 0.1})
    assert "heatinv: training: 10/10" not in screen.getvalue()
