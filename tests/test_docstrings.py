"""Every example in heatinv's docstrings runs and prints what it shows.

The examples are the first code a user copies; one that drifted from the code (a figure's
title, a quoted override) is a wrong answer in the documentation. Examples marked
``# doctest: +SKIP`` need a model or data the docstring does not build.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import heatinv

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(heatinv.__path__, "heatinv.") if not info.name.endswith("__main__")
)


@pytest.mark.parametrize("name", ["heatinv", *MODULES])
def test_docstring_examples_run_as_written(name, capsys):
    result = doctest.testmod(importlib.import_module(name), report=False)
    assert result.failed == 0, capsys.readouterr().out
