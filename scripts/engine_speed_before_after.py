"""Time the compiled heatmap or inverse step of the chain models with another revision's engine and this one.

    python scripts/engine_speed_before_after.py --before main
    python scripts/engine_speed_before_after.py --before main --measure step --models cnn --batches 64,256

Checks out ``heatinv/lrp`` of ``--before`` (a git revision) into a temporary package, then
times ``heatmap_only`` (the compiled ``LRP.__call__``; ``--measure step``: the bench's
``compiled`` inverse step, MSE and Adam, each engine on its own copy of the weights) of the
bench's mlp and cnn with both engines on the same weights and inputs, interleaved in one process (alternating order,
``--repeats`` blocks of at least ``--min-time`` seconds), and prints the medians and their
ratio, and the ratio of the CPU time per call (all threads). Ratios, not absolute times, are what a shared machine reports faithfully.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

def load_engine(revision: str, root: str):
    """``heatinv/lrp`` of ``revision`` (every module it holds) as the package ``heatinv_before.lrp``."""
    package = os.path.join(root, "heatinv_before", "lrp")
    os.makedirs(package)
    open(os.path.join(root, "heatinv_before", "__init__.py"), "w").close()
    listed = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:heatinv/lrp"], capture_output=True, text=True, check=True)
    for name in (n[: -len(".py")] for n in listed.stdout.split() if n.endswith(".py")):
        shown = subprocess.run(["git", "show", f"{revision}:heatinv/lrp/{name}.py"], capture_output=True, text=True, check=True)
        with open(os.path.join(package, f"{name}.py"), "w") as f:
            f.write(shown.stdout.replace("heatinv.lrp", "heatinv_before.lrp"))
    sys.path.insert(0, root)
    return importlib.import_module("heatinv_before.lrp")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="main", help="the git revision to compare with (default main)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn")
    parser.add_argument("--composites", default="epsilon,epsilon_gamma_box", help="comma-separated composite names")
    parser.add_argument("--batches", default="1,64", help="comma-separated batch sizes")
    parser.add_argument("--measure", choices=("heatmap", "step"), default="heatmap", help="what to time (default heatmap)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    import heatinv.lrp as after
    from heatinv.data import load_digits
    from heatinv.losses import HeatmapMatch, heatmap_loss
    from heatinv.models import Architecture, build_model
    from heatinv.step import compile_step, make_optimizer

    with tempfile.TemporaryDirectory() as root:
        before = load_engine(args.before, root)
        digits = load_digits()
        for name in args.models.split(","):
            model = build_model(Architecture(name), digits.num_classes, seed=0)
            for composite in args.composites.split(","):
                for batch in map(int, args.batches.split(",")):
                    x = tf.constant(np.concatenate([digits.x_test] * (1 + batch // len(digits.x_test)))[:batch])
                    y = tf.constant(np.resize(digits.y_test, batch).astype("int32"))
                    target = tf.constant(after.LRP(build_model(Architecture(name), digits.num_classes, seed=1), composite)(x, y))
                    heatmaps = {}
                    for tag, engine in (("before", before), ("after", after)):
                        if args.measure == "heatmap":
                            explainer = engine.LRP(model, composite)
                            heatmaps[tag] = tf.function(lambda x, y, e=explainer: tf.reduce_sum(e(x, y)))
                        else:
                            student = build_model(Architecture(name), digits.num_classes, seed=0)
                            step = compile_step(
                                student, engine.LRP(student, composite), HeatmapMatch(heatmap_loss("mse")),
                                make_optimizer("adam", 1e-3), "function",
                            )
                            heatmaps[tag] = lambda x, y, s=step: s(x, y, target)["loss"]
                        float(heatmaps[tag](x, y))  # trace and compile outside the timing
                    times = {"before": [], "after": []}
                    cpu = {"before": [], "after": []}
                    for repeat in range(args.repeats):
                        for tag in ("before", "after") if repeat % 2 else ("after", "before"):
                            calls, started, cpu_started = 0, time.perf_counter(), time.process_time()
                            while time.perf_counter() - started < args.min_time:
                                float(heatmaps[tag](x, y))
                                calls += 1
                            times[tag].append((time.perf_counter() - started) * 1e3 / calls)
                            cpu[tag].append((time.process_time() - cpu_started) * 1e3 / calls)
                    b, a = statistics.median(times["before"]), statistics.median(times["after"])
                    # CPU time (all threads) per call: the work done, which other processes on a
                    # shared machine disturb less than the wall time.
                    cb, ca = statistics.median(cpu["before"]), statistics.median(cpu["after"])
                    print(f"{name} {composite} batch {batch}: before {b:.3f} ms, after {a:.3f} ms, after/before {a / b:.2f}; "
                          f"CPU time after/before {ca / cb:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
