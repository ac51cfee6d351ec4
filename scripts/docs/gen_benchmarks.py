"""mkdocs-gen-files' script for the benchmark page: ``benchmarks.md`` and its plots, from ``docs/benchmarks/data/``.

In ``mkdocs.yml``::

    plugins:
      - gen-files:
          scripts:
            - scripts/docs/gen_benchmarks.py

mkdocs-gen-files runs this file with ``runpy.run_path``: its ``__name__`` is not ``"__main__"``
and its folder is not on ``sys.path``, so it loads :mod:`benchmark_page` from its own path, afresh
on every build (``mkdocs serve`` rebuilds in the same process).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import mkdocs_gen_files

PAGE = "benchmarks.md"  # generated.BENCHMARK_PAGE
IMAGE_FOLDER = "benchmarks"
"""The plots' folder in the site, next to the page: the page links them as ``benchmarks/<plot>.png``."""
GENERATOR = Path(__file__).resolve().parent / "benchmark_page.py"


def _load_generator():
    spec = importlib.util.spec_from_file_location("benchmark_page", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def write_page() -> None:
    """The page and its PNGs into mkdocs' virtual docs folder; "edit this page" opens the generator."""
    generator = _load_generator()
    with tempfile.TemporaryDirectory() as scratch:
        image_dir = Path(scratch) / IMAGE_FOLDER
        page = generator.benchmark_page(generator.DATA_DIR, image_dir)
        with mkdocs_gen_files.open(PAGE, "w") as handle:
            handle.write(page)
        for plot in sorted(image_dir.glob("*.png")):
            with mkdocs_gen_files.open(f"{IMAGE_FOLDER}/{plot.name}", "wb") as handle:
                handle.write(plot.read_bytes())
    mkdocs_gen_files.set_edit_path(PAGE, GENERATOR.relative_to(generator.ROOT).as_posix())


write_page()
