"""The documentation site builds with every warning an error, and its generated pages say what the code does.

``mkdocs build --strict`` fails on a broken link or anchor, a page left out of the navigation,
a docstring that documents a parameter the function does not have, and a reference
mkdocstrings cannot resolve. The generated pages (supported layers, composites,
configuration) are written from the code's registries when the site is built; the tests here
check that what they list is what the code accepts.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from heatinv import config
from heatinv.lrp import COMPOSITES
from heatinv.lrp.canonical import LAYER_KINDS, UnsupportedLayerError, canonize

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "docs"))

from composites_page import composites_page  # noqa: E402
from generated import GENERATED_PAGES  # noqa: E402
from configuration_page import configuration_page  # noqa: E402
from layers_page import layers_page  # noqa: E402


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    built = [name.removesuffix(".md") + "/index.html" for name in GENERATED_PAGES]
    for page in ("index.html", "rules/index.html", "api/lrp/index.html", "tutorials/invert-one-heatmap/index.html", *built):
        assert (site / page).stat().st_size > 1000, page
    rules = (site / "rules" / "index.html").read_text()
    assert rules.count("<math") > 20 and "arithmatex" not in rules  # every formula turned into MathML
    api = (site / "api" / "lrp" / "index.html").read_text()
    assert ":func:" not in api and ":class:" not in api  # the docstrings' Sphinx roles read as code


def test_the_layers_page_lists_every_class_the_engine_explains():
    page = layers_page()
    for kind in LAYER_KINDS:
        for cls in kind.classes:
            assert f".{cls.__name__}`" in page, cls


def test_a_layer_outside_the_registry_is_refused():
    """The registry is what canonize reads: a Keras layer it lacks stops the walk, naming the layer."""
    import keras

    explained = {cls for kind in LAYER_KINDS for cls in kind.classes}
    assert keras.layers.GroupNormalization not in explained
    model = keras.Sequential([keras.Input((4, 4, 2)), keras.layers.GroupNormalization(groups=2),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
    with pytest.raises(UnsupportedLayerError, match="GroupNormalization"):
        canonize(model)


def test_the_composites_page_has_a_row_per_registered_composite():
    rows = [line for line in composites_page().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(COMPOSITES)


def test_the_configuration_page_holds_every_key_of_the_schema_and_every_group_option():
    page = configuration_page()
    hints = typing.get_type_hints(config.TrainConfig)
    keys = [
        f"{section.name}.{field.name}"
        for section in dataclasses.fields(config.TrainConfig)
        if dataclasses.is_dataclass(hints[section.name])
        for field in dataclasses.fields(hints[section.name])
    ]
    assert len(keys) > 80
    for key in keys:
        assert f"| `{key}` |" in page, key
    for key, choices in config.CHOICES.items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{key}` |"))
        assert all(f"`{choice}`" in row for choice in choices), key
    for option in (ROOT / "configs" / "model").glob("*.yaml"):
        assert f"`{option.stem}`" in page


def test_the_doctor_page_has_a_row_for_every_finding_code():
    from heatinv.doctor import CODES

    page = (ROOT / "docs" / "doctor.md").read_text()
    rows = [line.split("`")[1] for line in page.splitlines() if line.startswith("| `")]
    assert sorted(rows) == sorted(CODES)
