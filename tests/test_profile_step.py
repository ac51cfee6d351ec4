"""scripts/profile_step.py: it profiles the step it names and accounts for its ops (no timing assertions)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _profile(*options: str) -> str:
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "profile_step.py"), "--batch", "2", "--calls", "2", *options],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_inverse_step_profile_lists_the_convolutions_of_its_pass_and_its_gradient() -> None:
    out = _profile("--what", "step")
    total = float(re.search(r"([0-9.]+) ms of op time per call", out).group(1))
    shares = [float(share) for share in re.findall(r"^\s+[0-9.]+\s+([0-9.]+)%", out, flags=re.M)]
    assert total > 0 and 50 < sum(shares) <= 100.5, out  # the listed types: most of the op time
    types = re.findall(r"^\s+[0-9.]+\s+[0-9.]+%\s+(pass|gradient)\s+(\S+)", out, flags=re.M)
    assert any(part == "gradient" and "Conv2DBackpropFilter" in op for part, op in types), out
    assert any(part == "pass" and "Conv2D" in op for part, op in types), out


def test_keras_fit_has_no_lrp_ops() -> None:
    out = _profile("--what", "keras_fit")
    assert "cnn epsilon_gamma_box batch 2 keras_fit" in out
    assert "conv_transpose" not in out and "Conv2D" in out, out
