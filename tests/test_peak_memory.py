"""heatinv.peak_memory: each case's peak memory, measured in a fresh process, and the ratio table."""

from __future__ import annotations

import pytest

from heatinv.peak_memory import CASES, measure, ratio_table


@pytest.mark.slow  # one TensorFlow process per case
def test_each_case_runs_in_a_fresh_process_and_reports_its_peak_and_time():
    lines = []
    records = measure(["cnn"], batch=4, size=28, progress=lines.append)
    assert [r["case"] for r in records] == list(CASES) and len(lines) == len(CASES)
    for r in records:
        assert r["model"] == "cnn" and r["composite"] == "epsilon_gamma_box" and r["device"] in ("CPU", "GPU:0")
        # the first call holds the graph's first run: its tensors at least, so the peak grows
        assert r["peak_mib"] > 0 and r["seconds"] > 0 and r["repeat_peak_mib"] >= 0
    table = ratio_table(records)
    assert table.splitlines()[2].startswith("| cnn | training_step |") and "| 1.00 |" in table.splitlines()[2]


def test_an_unknown_model_or_case_is_refused_by_name(capsys):
    from heatinv.peak_memory import main

    with pytest.raises(SystemExit):
        main(["--models", "resnet51"])
    assert "--models resnet51: not of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--models", "cnn", "--cases", "backward"])
    assert "--cases backward: not of" in capsys.readouterr().err
