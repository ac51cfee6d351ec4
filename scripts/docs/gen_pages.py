"""mkdocs-gen-files script: the reference pages, written from the code's own registries when the site is built."""

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).parent))  # gen-files runs this file by path, not as a package

from composites_page import composites_page  # noqa: E402
from configuration_page import configuration_page  # noqa: E402
from generated import REFERENCE_PAGES  # noqa: E402
from layers_page import layers_page  # noqa: E402

WRITERS = {"reference/layers.md": layers_page, "reference/composites.md": composites_page, "reference/configuration.md": configuration_page}
assert set(WRITERS) == set(REFERENCE_PAGES), "generated.REFERENCE_PAGES names the pages written here"

for name, write in WRITERS.items():
    with mkdocs_gen_files.open(name, "w") as page:
        page.write(write())
