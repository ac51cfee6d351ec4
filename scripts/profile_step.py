"""Where the time of a compiled step goes, op by op: TensorFlow's profiler over a few calls.

    python scripts/profile_step.py --composite epsilon_gamma_box --batch 256              # the inverse step
    python scripts/profile_step.py --composite epsilon_gamma_box --batch 256 --what keras_fit

Builds the bench's cnn (or mlp) on random inputs in [0, 1) and a target from a second
model, as ``python -m heatinv.bench`` does, warms the call up, times ``--calls`` calls, then
records ``--calls`` more with ``tf.profiler`` and prints the op time per call summed over
the executor's threads (so it can exceed the wall time on several cores): by op type, split
into the ops of the step's own pass (``pass``) and those of its gradient (``gradient``,
TensorFlow's ``gradient_tape/`` ops), then the costliest single ops. ``--what``:
``step`` (heatinv's compiled inverse step, MSE, Adam), ``keras_fit`` (Keras's own train
function, sparse cross-entropy, Adam) or ``heatmap`` (the compiled heatmap alone).
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
    import keras
    import numpy as np
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # the profiler's trace format: no public reader

    from heatinv.losses import HeatmapMatch, heatmap_loss
    from heatinv.lrp import LRP
    from heatinv.models import Architecture, build_model
    from heatinv.step import compile_step, make_optimizer

    student = build_model(Architecture(args.model), 10, seed=0)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(size=(args.batch, *student.input_shape[1:])).astype("float32"))
    y = tf.constant(rng.integers(0, 10, args.batch).astype("int32"))
    target = tf.constant(LRP(build_model(Architecture(args.model), 10, seed=1), args.composite)(x, y))
    if args.what == "step":
        step = compile_step(student, LRP(student, args.composite), HeatmapMatch(heatmap_loss("mse")), make_optimizer("adam", 1e-3), "function")

        def call():
            return float(step(x, y, target)["loss"])
    elif args.what == "keras_fit":
        student.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        student.make_train_function()
        batches = iter(tf.data.Dataset.from_tensors((x, y)).repeat())

        def call():
            return float(student.train_function(batches)["loss"])
    else:
        explainer = LRP(student, args.composite)
        heatmap = tf.function(lambda x, y: tf.reduce_sum(explainer(x, y)), autograph=False)

        def call():
            return float(heatmap(x, y))

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
