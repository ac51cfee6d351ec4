"""The pages the site's build writes (mkdocs-gen-files), relative to ``docs/``; they are not files in the repository.

``gen_pages.py`` writes the reference pages from the code's registries, ``gen_benchmarks.py``
the benchmark page from ``docs/benchmarks/data/``. Links to them resolve on the site.
"""

REFERENCE_PAGES = ("reference/layers.md", "reference/composites.md", "reference/configuration.md")
BENCHMARK_PAGE = "benchmarks.md"
GENERATED_PAGES = (*REFERENCE_PAGES, BENCHMARK_PAGE)
