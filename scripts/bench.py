"""Benchmark the inverse step; see ``heatinv/bench.py`` (``python scripts/bench.py --help``)."""

import sys

from heatinv.bench import main

if __name__ == "__main__":
    sys.exit(main())
