"""scripts/heatmap_loss_line_search.py: it steps along the heatmap loss's real gradient.

For the digits MLP (smooth at this scale) a step of 1e-4 along the normalized negative
gradient must lower the heatmap loss (first order); a wrong sign or a gradient of another
loss would not. What it prints is what it returns.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from conftest import SMOKE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def line_search():
    spec = importlib.util.spec_from_file_location("line_search", os.path.join(ROOT, "scripts", "heatmap_loss_line_search.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_small_step_along_the_gradient_lowers_the_heatmap_loss(line_search, tmp_path, reference_cache, capsys):
    found = line_search.main(
        [SMOKE, "experiment=pattern_frame_mlp", f"paths.root={tmp_path}", f"paths.cache_dir={reference_cache}"]
    )
    printed = capsys.readouterr().out
    assert f"heatmap loss at the start: {found['start']:.6f}" in printed
    assert found["start"] > 0 and np.isfinite(found["start"])
    assert found["gradient"][1e-4] < found["start"]
    assert sorted(found["gradient"]) == [1e-4, 1e-3, 1e-2, 1e-1] and sorted(found["sign"]) == [1e-5, 1e-4, 1e-3]
    assert all(np.isfinite(v) for v in [*found["gradient"].values(), *found["sign"].values()])
