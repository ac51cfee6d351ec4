"""What scripts/bench_zennit.py and scripts/bench_lxt.py share: two frameworks timed side by side.

Both fix TensorFlow's and PyTorch's thread pools before either runs an op, then, per case
(model, composite), build the runners, check the two heatmaps agree, time the runners with
heatinv's bench (interleaved blocks, medians) and write the records after every case.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREADS = 2


def parse_args(argv, prog: str, description: str, models: tuple, composites, default_composite: str, out: str) -> argparse.Namespace:
    """The two scripts' arguments: ``--models``, ``--composites`` (checked against theirs), ``--batch``,
    ``--repeats``, ``--min-time``, ``--out`` (default ``outputs/bench/<out>``)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--models", default=",".join(models), help=f"comma-separated, of {','.join(models)} (default: all)")
    parser.add_argument(
        "--composites", default=default_composite, help=f"comma-separated, of {','.join(composites)} (default: {default_composite})"
    )
    parser.add_argument("--batch", type=int, default=16, help="examples per heatmap call (default 16)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing blocks per variant (default 5)")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per timing block (default 0.2)")
    parser.add_argument("--out", default=os.path.join("outputs", "bench", out), help="the JSON file to write")
    args = parser.parse_args(argv)
    for name, allowed in (("models", models), ("composites", composites)):
        given = tuple(item for item in getattr(args, name).split(",") if item)
        unknown = [item for item in given if item not in allowed]
        if unknown or not given:
            parser.error(f"--{name}: {unknown or 'none'} not in {list(allowed)}")
        setattr(args, name, given)
    if args.batch < 1 or args.repeats < 1 or args.min_time < 0:
        parser.error("--batch and --repeats must be positive, --min-time non-negative")
    return args


def start(title: str, args: argparse.Namespace) -> None:
    """Thread pools fixed (``THREADS`` each), ``tests/`` importable (the twins live there), the header printed."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    tf.config.threading.set_inter_op_parallelism_threads(THREADS)
    import torch

    torch.set_num_threads(THREADS)
    torch.set_num_interop_threads(THREADS)
    print(f"{title}: TF {tf.__version__}, torch {torch.__version__}, {THREADS} threads each, "
          f"batch {args.batch}, repeats {args.repeats}, min block {args.min_time:g} s", flush=True)


def time_cases(args: argparse.Namespace, make_runners: Callable, other: str) -> list[dict]:
    """Every (model, composite) of ``args`` timed; ``make_runners(model, composite, batch, stack)`` returns
    the runners and the float32 relative L2 error between heatinv's heatmap and ``other``'s (the runners
    may register hooks on ``stack``, closed after the case). Returns the records, each with that error."""
    from heatinv.bench import Case, measure, table, write_json

    records = []
    for name in args.models:
        for composite in args.composites:
            with contextlib.ExitStack() as stack:
                runners, error = make_runners(name, composite, args.batch, stack)
                case_records = measure(Case(name, composite, args.batch), runners, args.repeats, args.min_time)
            for record in case_records:
                record["relative_error"] = error
            records.extend(case_records)
            print(f"  {name} {composite}: heatinv vs {other} heatmap, float32 relative L2 error {error:.1e}", flush=True)
            write_json(args.out, records)
    print(table(records))
    return records


def report(args: argparse.Namespace, records: list[dict], other: str, note: str = "") -> None:
    """Per case, the other library's heatmap time over heatinv's (without and with XLA) and the frameworks' own ratio."""
    for name, composite in ((n, c) for n in args.models for c in args.composites):
        ms = {r["variant"]: r["ms_median"] for r in records if r["model"] == name and r["composite"] == composite}
        print(
            f"{name} {composite}: {other} / heatmap_only {ms[other] / ms['heatmap_only']:.2f}, "
            f"/ heatmap_only_xla {ms[other] / ms['heatmap_only_xla']:.2f}{note}; "
            f"torch_forward_backward / forward_backward {ms['torch_forward_backward'] / ms['forward_backward']:.2f}"
        )
    print(f"\nwrote {args.out}", flush=True)


def run(args: argparse.Namespace, title: str, make_runners: Callable, other: str, variant: str, note: str = "") -> list[dict]:
    """:func:`start`, :func:`time_cases` and :func:`report`: a script's whole run; returns the records."""
    start(title, args)
    records = time_cases(args, make_runners, other)
    report(args, records, variant, note)
    return records
