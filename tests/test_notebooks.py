"""The tutorial notebooks (docs/tutorials/*.ipynb): each runs top to bottom and draws its figure; each is saved executed.

The documentation site shows the notebooks as saved, without running them, so a saved
notebook must hold the outputs of every code cell, its figure included. A copy run in an
empty directory (the saved file is left as it is) checks that the code still works against
the package as it is now.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "docs" / "tutorials").glob("*.ipynb"))
COLOURS = re.compile(r"\x1b\[[0-9;]*m")
"""The terminal colour codes of IPython's tracebacks."""


def _code_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _images(notebook) -> int:
    """The number of PNG outputs in the notebook's code cells."""
    return sum("image/png" in output.get("data", {}) for cell in _code_cells(notebook) for output in cell.outputs)


def test_there_are_tutorial_notebooks():
    assert NOTEBOOKS, "docs/tutorials/ holds no notebooks: the site's navigation names two"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_saved_notebook_holds_its_outputs(path):
    """Every code cell was run and nothing failed; the figure is saved (the site does not execute notebooks)."""
    notebook = nbformat.read(path, as_version=4)
    not_run = [index for index, cell in enumerate(notebook.cells) if cell.cell_type == "code" and cell.execution_count is None]
    assert not not_run, f"{path.name}: code cells {not_run} have no saved run; execute the notebook and save it with its outputs"
    counts = [cell.execution_count for cell in _code_cells(notebook)]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: run out of order or partly ({counts}); run it top to bottom"
    errors = [output.get("ename") for cell in _code_cells(notebook) for output in cell.outputs if output.output_type == "error"]
    assert not errors, f"{path.name} was saved with errors: {errors}"
    assert _images(notebook) >= 1, f"{path.name} holds no figure (image/png output)"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    """A copy runs in an empty directory with a non-interactive matplotlib backend, as in CI; it draws its figure."""
    monkeypatch.setenv("MPLBACKEND", "Agg")  # the kernel inherits this environment; the notebook picks its own inline backend
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    failure = None
    try:
        client.execute()
    except CellExecutionError as error:
        failure = COLOURS.sub("", str(error))  # failed outside the handler, so the report holds the cell's error once
    if failure:
        pytest.fail(f"{path.name}: a cell raised:\n{failure}", pytrace=False)
    assert _images(notebook) >= 1, f"{path.name} ran but drew no figure (no image/png output)"
