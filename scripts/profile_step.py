"""Where the time of a compiled step goes, op by op: TensorFlow's profiler over a few calls.

    python scripts/profile_step.py --composite epsilon_gamma_box --batch 256              # the inverse step
    python scripts/profile_step.py --composite epsilon_gamma_box --batch 256 --what keras_fit

Builds the bench's case (``heatinv.bench.make_runners``: the digits' held-out images, a
target from a second model) and its variant, warms the call up, times ``--calls`` calls, then
records ``--calls`` more with ``tf.profiler`` and prints the op time per call summed over
the executor's threads (so it can exceed the wall time on several cores): by op type, split
into the ops of the step's own pass (``pass``) and those of its gradient (``gradient``,
TensorFlow's ``gradient_tape/`` ops), then the costliest single ops. ``--what``:
``step`` (the bench's ``compiled``: heatinv's inverse step, MSE, Adam), ``keras_fit``
(Keras's own train function, sparse cross-entropy, Adam) or ``heatmap`` (``heatmap_only``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="cnn", choices=("mlp", "cnn"))
    parser.add_argument("--composite", default="epsilon_gamma_box")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--what", default="step", choices=("step", "keras_fit", "heatmap"))
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--top", type=int, default=20, help="how many single ops to list")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # the profiler's trace format: no public reader

    from heatinv.bench import Case, make_runners
    from heatinv.data import load_digits

    variant = {"step": "compiled", "keras_fit": "keras_fit", "heatmap": "heatmap_only"}[args.what]
    (runner,) = make_runners(Case(args.model, args.composite, args.batch), load_digits(), (variant,), 1)
    call = runner.call
    for _ in range(3):
        call()
    started = time.perf_counter()
    for _ in range(args.calls):
        call()
    wall = (time.perf_counter() - started) * 1e3 / args.calls
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(args.calls):
            call()
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        with open(sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))[-1], "rb") as f:
            space.ParseFromString(f.read())
    per_op, per_type = collections.Counter(), collections.Counter()
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                # ops are "name:Type"; the executor's and the function's own spans
                # ("ExecutorState::Process", "__inference_...") hold them and are left out
                if not re.fullmatch(r"[\w/.\-]+:\w+", name):
                    continue
                ms = event.duration_ps / 1e9 / args.calls
                per_op[name] += ms
                part = "gradient" if name.startswith("gradient_tape/") else "pass"
                per_type[f"{part:8s} {name.split(':')[-1]}"] += ms
    total = sum(per_op.values())
    print(f"{args.model} {args.composite} batch {args.batch} {args.what}: {wall:.1f} ms per call (wall), "
          f"{total:.1f} ms of op time per call (all threads)")
    print("\nby op type (ms per call, share of the op time):")
    for name, ms in per_type.most_common():
        if ms >= 0.005 * total:
            print(f"  {ms:8.2f}  {ms / total:6.1%}  {name}")
    if args.top:
        print(f"\nthe {args.top} costliest ops:")
        for name, ms in per_op.most_common(args.top):
            print(f"  {ms:8.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
