"""mkdocs-gen-files script: the pages written from the code's own registries when the site is built."""

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).parent))  # gen-files runs this file by path, not as a package

from composites_page import composites_page  # noqa: E402
from configuration_page import configuration_page  # noqa: E402
from layers_page import layers_page  # noqa: E402

for name, write in (("layers.md", layers_page), ("composites.md", composites_page), ("configuration.md", configuration_page)):
    with mkdocs_gen_files.open(f"reference/{name}", "w") as page:
        page.write(write())
