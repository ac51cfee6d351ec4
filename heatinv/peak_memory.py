"""Peak memory of one compiled call: a training step, the heatmap, and the inverse step, each in a fresh process.

    python -m heatinv.peak_memory                                  # resnet50, vgg16 at 224x224, batch 8
    python -m heatinv.peak_memory --models cnn,vit,mobilenetv2 --batch 64 --size 64

For each model the three cases run in fresh processes, on the same initial weights, batch,
labels and target heatmap:

``training_step``
    a supervised training step as Keras's ``train_step`` makes it (sparse cross-entropy, a
    ``GradientTape``, Adam), compiled: forward, backward to the weights, update. The yardstick.
``heatmap``
    the compiled relevance computation (``LRP.__call__``) under the case's composite.
``inverse_step``
    heatinv's compiled step (:func:`heatinv.step.compile_step`): the heatmap, the MSE to the
    target, its gradient with respect to the weights (through the LRP pass), the Adam update.
``inverse_step_recompute``
    the same with ``LRP(..., recompute=True)`` (``lrp.recompute=true``): the conv rules run
    again in the gradient instead of keeping their intermediates.

Each process builds the model and traces the function, returns what was freed to the system
(every large block is its own mapping, :data:`CHILD_ENVIRONMENT`; then glibc's
``malloc_trim``), resets the kernel's peak counter (``/proc/self/clear_refs``) and calls the
function: ``peak_mib`` is the growth of the resident set's peak over the resident set just
before that first call (graph optimization included; on a GPU: TensorFlow's allocator peak
over its current use, after ``reset_memory_stats``). Then the same for a second call:
``repeat_peak_mib`` (allocations the first call left in place are not seen again) and
``seconds``, its wall time. Both are reported as
ratios to the training step of the same model and batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = ("training_step", "heatmap", "inverse_step", "inverse_step_recompute")
CHILD_ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "2", "MALLOC_MMAP_THRESHOLD_": "65536"}
"""Each case's process: glibc serves every block of 64 KiB or more by its own mapping, returned to the
system when freed. By default glibc raises that threshold after the first large free, and from then
on keeps the freed tensors resident: the second call would reuse them, and its peak would not show."""
APPLICATIONS = {"resnet50": "ResNet50", "vgg16": "VGG16", "mobilenetv2": "MobileNetV2"}
MODELS = ("cnn", "vit") + tuple(APPLICATIONS)


def _status_mib(key: str) -> float:
    """A field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in MiB."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"/proc/self/status has no {key}: peak memory is measured on Linux only.")


def _reset_peak() -> None:
    """Returns the memory the first call freed to the system (``malloc_trim``: glibc keeps it resident
    otherwise, and the second call would reuse it unseen), then sets the resident set's peak
    (``VmHWM``) to the resident set now (Linux's ``clear_refs`` 5)."""
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _model(name: str, size: int, classes: int = 10):
    """The model ``name`` with random weights (``weights=None``) for ``size x size`` inputs, and its composite."""
    import keras

    from heatinv import transformers
    from heatinv.models import Architecture, build_model

    if name in APPLICATIONS:
        factory = getattr(keras.applications, APPLICATIONS[name])
        return factory(weights=None, input_shape=(size, size, 3), classes=classes, classifier_activation=None), "epsilon_gamma_box"
    if name == "vit":
        return transformers.vit((size, size, 1), classes, patch=4, dim=64, depth=4, heads=4), "attnlrp"
    if name == "cnn":
        return build_model(Architecture("cnn"), classes, seed=0, input_shape=(size, size, 1)), "epsilon_gamma_box"
    raise ValueError(f"Unknown model {name!r}; expected one of {list(MODELS)}.")


def measure_one(model_name: str, case: str, batch: int, size: int, composite: str | None = None) -> dict:
    """One case in this process: ``{model, case, composite, batch, size, peak_mib, repeat_peak_mib, seconds, device}``.

    ``composite``: the LRP composite (None: the model's, ``epsilon_gamma_box`` or ``attnlrp``).
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from heatinv.losses import HeatmapMatch, heatmap_loss
    from heatinv.lrp import LRP
    from heatinv.step import compile_step, make_optimizer

    keras.utils.set_random_seed(1)
    reference, default = _model(model_name, size)
    composite = composite or default
    keras.utils.set_random_seed(0)
    model, _ = _model(model_name, size)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(size=(batch,) + tuple(model.inputs[0].shape[1:])).astype("float32"))
    y = tf.constant(rng.integers(0, 10, batch).astype("int32"))
    if case == "training_step":
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
        cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def train(x, y):
            with tf.GradientTape() as tape:
                loss = cross_entropy(y, model(x, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        function = tf.function(train, autograph=False)
        arguments = (x, y)
    elif case == "heatmap":
        explainer = LRP(model, composite)
        function = tf.function(lambda x, y: tf.reduce_sum(explainer(x, y)), autograph=False)
        arguments = (x, y)
    elif case in ("inverse_step", "inverse_step_recompute"):
        target = tf.constant(LRP(reference, composite)(x, y))
        explainer = LRP(model, composite, recompute=case == "inverse_step_recompute")
        step = compile_step(model, explainer, HeatmapMatch(heatmap_loss("mse")), make_optimizer("adam", 1e-3), "function")
        step.parts[3].build(model.trainable_variables)
        function = step.function
        arguments = (x, y, target)
    else:
        raise ValueError(f"Unknown case {case!r}; expected one of {list(CASES)}.")
    del reference
    function.get_concrete_function(*arguments)  # traced before the measured calls: they hold no tracing
    gpu = bool(tf.config.list_logical_devices("GPU"))
    peaks, seconds = [], []
    for _ in range(2):  # the first call (with the graph's first run) and a repeat
        if gpu:
            tf.config.experimental.reset_memory_stats("GPU:0")
            before = tf.config.experimental.get_memory_info("GPU:0")["current"] / 2**20
        else:
            _reset_peak()
            before = _status_mib("VmRSS")
        started = time.perf_counter()
        result = function(*arguments)
        float(tf.nest.flatten(result)[0].numpy().ravel()[0])  # to completion
        seconds.append(time.perf_counter() - started)
        peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20 if gpu else _status_mib("VmHWM")
        peaks.append(round(peak - before, 1))
        del result
    return {"model": model_name, "case": case, "composite": composite, "batch": batch, "size": size, "peak_mib": peaks[0],
            "repeat_peak_mib": peaks[1], "seconds": round(seconds[1], 3), "device": "GPU:0" if gpu else "CPU"}


def measure(models, batch: int, size: int, progress=print, cases=CASES, composite: str | None = None) -> list[dict]:
    """Every case of every model, each in a fresh process (``python -m heatinv.peak_memory --one ...``)."""
    records = []
    for model in models:
        for case in cases:
            command = [sys.executable, "-m", "heatinv.peak_memory", "--one", model, case, "--batch", str(batch), "--size", str(size)]
            command += ["--composite", composite] if composite else []
            done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **CHILD_ENVIRONMENT})
            if done.returncode:
                raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
            record = json.loads(done.stdout.strip().splitlines()[-1])
            records.append(record)
            progress(f"{model} {case}: peak +{record['peak_mib']:.0f} MiB, {record['seconds']:.2f} s")
    return records


def ratio_table(records: list[dict]) -> str:
    """A markdown table: each case's peak memory and time, and their ratios to the model's training step."""
    lines = ["| model | case | peak MiB | x training step | seconds | x training step |", "| --- | --- | --- | --- | --- | --- |"]
    base = {r["model"]: r for r in records if r["case"] == "training_step"}
    for r in records:
        b = base.get(r["model"])
        memory = f"{r['peak_mib'] / b['peak_mib']:.2f}" if b and b["peak_mib"] > 0 else "-"
        time_ratio = f"{r['seconds'] / b['seconds']:.2f}" if b and b["seconds"] > 0 else "-"
        lines.append(f"| {r['model']} | {r['case']} | {r['peak_mib']:.0f} | {memory} | {r['seconds']:.2f} | {time_ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m heatinv.peak_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet50,vgg16", help=f"comma-separated, of {list(MODELS)}")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224, help="the images' side (cnn, vit: one channel)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {list(CASES)}")
    parser.add_argument("--composite", default=None, help="the LRP composite (default: epsilon_gamma_box; the vit: attnlrp)")
    parser.add_argument("--out", default=None, help="a JSON file for the records")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(*args.one, args.batch, args.size, args.composite)))
        return 0
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"--models {','.join(unknown)}: not of {list(MODELS)}")
    cases = [c for c in args.cases.split(",") if c]
    if set(cases) - set(CASES):
        parser.error(f"--cases {','.join(sorted(set(cases) - set(CASES)))}: not of {list(CASES)}")
    records = measure(models, args.batch, args.size, cases=cases, composite=args.composite)
    print(ratio_table(records))
    if args.out:
        from heatinv.atomic import write_json

        write_json(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
