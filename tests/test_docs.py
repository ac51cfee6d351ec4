"""README.md and the pages it links: short, every link resolves, every Python block runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_at_most_200_lines_and_holds_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    ci = (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install ")  # CI's installs are quiet
    assert "pip install -e . && python -m heatinv.train target=digit7" in readme
    test_command = 'pip install -e ".[test]" && pip install --no-deps lxt==2.1 && python -m pytest -q -n 2'
    assert test_command in readme
    for part in ('pip install -e ".[test]"', "pip install --no-deps lxt==2.1", "python -m pytest -q -n 2"):
        assert part in ci, part


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    broken = [link for link in links if "://" not in link and not (page.parent / link).exists()]
    assert not broken, f"{page.name} links to missing files: {broken}"


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


@pytest.mark.parametrize("index", range(len(_python_blocks(ROOT / "README.md"))))
def test_each_python_block_of_the_readme_runs(index, tmp_path):
    """Each block as a user pastes it, in a fresh interpreter in an empty directory."""
    code = _python_blocks(ROOT / "README.md")[index]
    env = {**os.environ, "MPLBACKEND": "Agg", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, f"README's Python block {index} failed:\n{code}\n{done.stderr[-3000:]}"
