"""Benchmark the inverse step: eager reference vs compiled, XLA, multi-step, and plain Keras training.

    python -m heatinv.bench                      # full: mlp, cnn x epsilon, epsilon_gamma_box x batch 1, 64, 256
    python -m heatinv.bench --quick              # a CI smoke run (fewer repeats and sizes, same fields)
    python scripts/bench.py --models mlp --batches 1 --out /tmp/bench.json

Every variant of one case (model, composite, batch) runs on its own copy of the same
initial weights, the same input batch, labels and target heatmap, in one process. After a
warm-up (the compile, timed as ``compile_s``) each variant is timed in blocks of calls that
last at least ``--min-time`` seconds; the blocks of all variants are interleaved (in a
rotating order) ``--repeats`` times, and each record gives the median, min and max
milliseconds per training step (per heatmap for ``heatmap_only``, per gradient for
``forward_backward``). Every call ends with a host read of a scalar (the loss), as a
training loop that logs does, so asynchronous devices are timed to completion.

Variants:

``eager_reference``
    what a user writes by hand: for the mlp, a numpy-free eager TensorFlow loop over the
    Dense weights (``relu(a @ W + b)`` forward, ``R = a * (R / stab(z)) @ W.T`` backward;
    z^B on the first layer for ``epsilon_gamma_box``, as heatinv does), a
    ``tf.GradientTape`` around it and Keras's Adam; for the cnn, heatinv's step in eager mode.
``compiled``, ``compiled_xla``
    :func:`heatinv.step.compile_step` in ``function`` / ``xla`` mode, one update per call
    (``compiled`` is what ``trainer.jit_compile=false`` runs).
``multi_step``, ``multi_step_xla``, ``multi_step_xla_loop``
    the same with ``steps_per_execution=N`` (``--steps-per-execution``): N updates per call.
    ``multi_step_xla`` loops in the graph around the XLA-compiled update
    (``xla_loop=False``), ``multi_step_xla_loop`` compiles the loop into the XLA program
    (``xla_loop=True``); ``compile_step``'s default picks the latter for the mlp and the
    former for the cnn. Each record's ``auto_pick`` is what ``trainer.jit_compile=auto``
    picks for the case in a run long enough for XLA (:func:`heatinv.step.auto_mode`; a
    shorter run gets the graph step, whose compiling is shorter), and the ratios compare that pick
    with the other mode as the trainer runs it: at batch 1 (``task=single``, one image)
    the multi-step loops, at larger batches (only ``task=dataset`` has them, one update per
    call) ``compiled`` and ``compiled_xla``. ``multi_step_xla_loop`` is skipped for the cnn unless named in
    ``--variants``: there XLA's CPU while loop runs each update ~10x slower (~0.45 s per
    update at batch 64), which would dominate the run.
``keras_fit``, ``keras_fit_multi``, ``keras_fit_xla``
    plain supervised training of the same architecture (sparse cross-entropy, Adam), timed
    through Keras's own ``model.train_function`` on a repeating ``tf.data`` iterator, which is
    exactly what ``model.fit`` calls per step: with ``jit_compile="auto"`` (as Keras picks;
    the record's ``jit`` says what it picked) and ``steps_per_execution`` 1 and N, and with
    ``jit_compile=True`` and ``steps_per_execution`` N.
``heatmap_only``, ``heatmap_only_xla``
    the compiled relevance computation alone (``LRP.__call__``).
``forward_backward``, ``forward_backward_xla``
    a plain compiled gradient of the explained logit with respect to the input: the cost of
    one forward and one backward pass of the same model, the yardstick for the heatmap.

``main_job`` (``--main-job SHORT,LONG``, on by default outside ``--quick``)
    the main job as a user runs it, ``python -m heatinv.train`` with the default
    configuration (mlp, epsilon_gamma_box, batch 1), run for SHORT and for LONG steps in
    fresh processes (by default 2000 and 4000: runs long enough for ``auto`` to pick XLA,
    :data:`heatinv.step.XLA_MIN_UPDATES`): each run's loop wall time per step after its first
    (compiling) call (from its ``metrics.json``), summaries, checkpoints and logging included,
    start-up and compiling excluded; the long run's is the record's; see :func:`main_job`.

``--memory MODELS`` adds each model's peak memory of a training step, the heatmap and the
inverse step, each in a fresh process, as ratios to the training step
(:mod:`heatinv.peak_memory`; records with ``variant`` ``peak_memory``).

``peak_rss_mb`` is the process's peak resident set size so far (``ru_maxrss``), read after
each variant's timing: process-wide and monotone, so it bounds, rather than isolates, the
memory of the variants measured up to then.

Writes a JSON list of records (``--out``, default ``outputs/bench/bench.json``, written
atomically) with ``variant, model, composite, batch, ms_median, ms_min, ms_max,
steps_per_second, peak_rss_mb`` and a few more (``steps_per_call``, ``calls_per_block``,
``repeats``, ``compile_s``, ``jit``), and prints a table and the ratios the speed goals are
about.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

from heatinv.atomic import write_json
from heatinv.peak_memory import MODELS as PEAK_MODELS

VARIANTS = (
    "eager_reference",
    "compiled",
    "compiled_xla",
    "multi_step",
    "multi_step_xla",
    "multi_step_xla_loop",
    "keras_fit",
    "keras_fit_multi",
    "keras_fit_xla",
    "heatmap_only",
    "heatmap_only_xla",
    "forward_backward",
    "forward_backward_xla",
)
MODELS = ("mlp", "cnn")
APPLICATIONS = {"resnet50": "ResNet50", "mobilenetv2": "MobileNetV2", "densenet121": "DenseNet121"}
"""keras.applications models (``--models resnet50,...``), built with ``weights=None`` at 64x64 with
10 classes on uniform random inputs (the target: the heatmap of the same architecture with other
initial weights); the inverse step, ``keras_fit``, the heatmap and forward+backward variants run on them."""
APPLICATION_VARIANTS = ("compiled", "keras_fit", "heatmap_only", "heatmap_only_xla", "forward_backward", "forward_backward_xla")
TRANSFORMERS = {"vit": "a ViT on 28x28x1 (4x4 patches: 49 tokens)", "text": "a text encoder of 64 token ids (vocabulary 1000)"}
"""heatinv.transformers models (``--models vit,text``): width 64, 4 blocks of 4 heads, 10 classes, random
weights and inputs (the text's ids padded after a random length of 16 to 64); the same variants as the
applications. For the text model, ``forward_backward`` differentiates the logit with respect to the
embedding table: the whole backward pass to the token vectors, as an input gradient would be."""
TRANSFORMER_COMPOSITES = ("attnlrp", "cp_lrp")
COMPOSITES = ("epsilon", "epsilon_gamma_box")
BATCHES = (1, 64, 256)
DEFAULT_OUT = os.path.join("outputs", "bench", "bench.json")
# Left out unless named in --variants (see the module docstring).
SKIPPED_BY_DEFAULT = {("cnn", "multi_step_xla_loop")}
RECORD_FIELDS = (
    "variant",
    "model",
    "composite",
    "batch",
    "ms_median",
    "ms_min",
    "ms_max",
    "steps_per_second",
    "peak_rss_mb",
)

# The speed goals of the issue, checked (and printed) from one run's records.
GOAL_EAGER_SPEEDUP = 15.0
GOAL_MULTI_STEP_PER_SECOND = 2000.0
GOAL_KERAS_RATIO = 3.0
GOAL_HEATMAP_RATIO = 2.0
GOAL_APPLICATION_HEATMAP_RATIO = 3.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


# --------------------------------------------------------------------------- the hand-written reference


class HandWrittenStep:
    """The eager step a user writes for an MLP: their own LRP loop over the Dense weights.

    Only Flatten and Dense layers with ReLU (hidden) and linear (output) activations, as in
    ``heatinv.models.build_model("mlp")``. The rules and stabilizers are heatinv's, so the
    heatmap is the same (the tests check it): ``epsilon`` everywhere, or z^B on the first
    layer for ``epsilon_gamma_box``.
    """

    def __init__(self, model, composite: str, optimizer, loss_fn, *, epsilon: float = 1e-6, low=0.0, high=1.0):
        import keras
        import tensorflow as tf

        if composite not in ("epsilon", "epsilon_gamma_box"):
            raise ValueError(f"The hand-written reference knows 'epsilon' and 'epsilon_gamma_box', not {composite!r}.")
        self.dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
        others = [layer for layer in model.layers if not isinstance(layer, (keras.layers.Dense, keras.layers.Flatten))]
        if others:
            raise ValueError(f"The hand-written reference is for Flatten/Dense models, got {[type(o).__name__ for o in others]}.")
        self.model, self.zbox, self.epsilon = model, composite == "epsilon_gamma_box", epsilon
        self.low, self.high = low, high
        self.optimizer, self.loss_fn = optimizer, loss_fn
        self.tf = tf

    def _stab(self, z, eps):
        tf = self.tf
        return z + eps * tf.where(z >= 0, tf.ones_like(z), -tf.ones_like(z))

    def heatmap(self, x, label):
        tf = self.tf
        a = tf.reshape(x, [tf.shape(x)[0], -1])
        inputs = []
        for i, layer in enumerate(self.dense):
            inputs.append(a)
            z = tf.matmul(a, layer.kernel) + layer.bias
            a = tf.nn.relu(z) if i < len(self.dense) - 1 else z
        R = z * tf.one_hot(label, z.shape[-1], dtype=z.dtype)
        for i in reversed(range(len(self.dense))):
            W, b, a = self.dense[i].kernel, self.dense[i].bias, inputs[i]
            if i == 0 and self.zbox:
                low, high = self.low + tf.zeros_like(a), self.high + tf.zeros_like(a)
                Wp, Wn = tf.maximum(W, 0.0), tf.minimum(W, 0.0)
                z = tf.matmul(a, W) - tf.matmul(low, Wp) - tf.matmul(high, Wn)
                s = R / self._stab(z, 1e-6)
                R = (
                    a * tf.matmul(s, W, transpose_b=True)
                    - low * tf.matmul(s, Wp, transpose_b=True)
                    - high * tf.matmul(s, Wn, transpose_b=True)
                )
            else:
                s = R / self._stab(tf.matmul(a, W) + b, self.epsilon)
                R = a * tf.matmul(s, W, transpose_b=True)
        return tf.reshape(R, tf.shape(x))

    def __call__(self, x, label, target):
        variables = self.model.trainable_variables
        with self.tf.GradientTape() as tape:
            loss = self.loss_fn(self.heatmap(x, label), target)
        gradients = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(gradients, variables))
        return loss


# --------------------------------------------------------------------------- cases and variants


@dataclass
class Case:
    model: str
    composite: str
    batch: int


@dataclass
class Runner:
    """``call()`` runs one call (``steps_per_call`` steps) and reads a scalar on the host."""

    variant: str
    call: Callable[[], float]
    steps_per_call: int
    jit: str = ""
    auto_pick: str = ""


def _data(case: Case, dataset):
    import numpy as np
    import tensorflow as tf

    from heatinv.lrp import LRP
    from heatinv.models import Architecture, build_model

    if case.model in TRANSFORMERS:
        import keras

        from heatinv import transformers

        rng = np.random.default_rng(0)
        if case.model == "vit":
            build = lambda: transformers.vit((28, 28, 1), 10)  # noqa: E731
            x = rng.uniform(size=(case.batch, 28, 28, 1)).astype("float32")
        else:
            build = lambda: transformers.text_classifier(64, 1000, 10)  # noqa: E731
            x = rng.integers(1, 1000, (case.batch, 64)).astype("int32")
            x[np.arange(64)[None] >= rng.integers(16, 65, case.batch)[:, None]] = 0
        keras.utils.set_random_seed(0)
        student = build()
        keras.utils.set_random_seed(1)
        reference = build()
        x, y = tf.constant(x), tf.constant(rng.integers(0, 10, case.batch).astype("int32"))
        return student, x, y, tf.constant(LRP(reference, case.composite)(x, y))

    if case.model in APPLICATIONS:
        import keras

        keras.utils.set_random_seed(0)
        factory = getattr(keras.applications, APPLICATIONS[case.model])
        student = factory(weights=None, input_shape=(64, 64, 3), classes=10, classifier_activation=None)
        rng = np.random.default_rng(0)
        x = tf.constant(rng.uniform(size=(case.batch, 64, 64, 3)).astype("float32"))
        y = tf.constant(rng.integers(0, 10, case.batch).astype("int32"))
        keras.utils.set_random_seed(1)
        reference = factory(weights=None, input_shape=(64, 64, 3), classes=10, classifier_activation=None)
        return student, x, y, tf.constant(LRP(reference, case.composite)(x, y))
    reps = math.ceil(case.batch / len(dataset.x_test))
    x = np.concatenate([dataset.x_test] * reps)[: case.batch]
    y = np.concatenate([dataset.y_test] * reps)[: case.batch].astype("int32")
    architecture = Architecture(case.model)
    student = build_model(architecture, dataset.num_classes, seed=0)
    reference = build_model(architecture, dataset.num_classes, seed=1)
    x, y = tf.constant(x), tf.constant(y)
    target = tf.constant(LRP(reference, case.composite)(x, y))
    return student, x, y, target


def _copy(model):
    import keras

    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    return clone


def make_runners(case: Case, dataset, variants: tuple[str, ...], steps_per_execution: int) -> list[Runner]:
    """One runner per variant, each on its own copy of the case's initial weights."""
    import keras
    import tensorflow as tf

    from heatinv.losses import HeatmapMatch, heatmap_loss
    from heatinv.lrp import LRP
    from heatinv.step import auto_mode, compile_step, make_optimizer

    student, x, y, target = _data(case, dataset)
    loss_fn = heatmap_loss("mse")
    # what trainer.jit_compile=auto runs for this case
    pick = auto_mode(LRP(student, case.composite), case.batch, steps_per_execution)[0]
    runners = []
    for variant in variants:
        model = _copy(student)
        if variant == "eager_reference":
            if case.model == "mlp":
                step = HandWrittenStep(model, case.composite, make_optimizer("adam", 1e-3), loss_fn)
                runners.append(Runner(variant, lambda s=step: float(s(x, y, target)), 1, "eager"))
            else:
                step = compile_step(model, LRP(model, case.composite), HeatmapMatch(loss_fn), make_optimizer("adam", 1e-3), "eager")
                runners.append(Runner(variant, lambda s=step: float(s(x, y, target)["loss"]), 1, "eager"))
        elif variant in ("compiled", "compiled_xla", "multi_step", "multi_step_xla", "multi_step_xla_loop"):
            mode = "xla" if "_xla" in variant else "function"
            n = steps_per_execution if variant.startswith("multi_step") else 1
            explainer, optimizer = LRP(model, case.composite), make_optimizer("adam", 1e-3)
            step = compile_step(model, explainer, HeatmapMatch(loss_fn), optimizer, mode, n, xla_loop=variant.endswith("_loop"))
            runners.append(Runner(variant, lambda s=step: float(s(x, y, target)["loss"]), n, mode))
        elif variant in ("keras_fit", "keras_fit_multi", "keras_fit_xla"):
            n = 1 if variant == "keras_fit" else steps_per_execution
            model.compile(
                optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=True if variant == "keras_fit_xla" else "auto",
                steps_per_execution=n,
            )
            model.make_train_function()
            iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
            fn = model.train_function
            runners.append(
                Runner(variant, lambda f=fn, it=iterator: float(f(it)["loss"]), n, "xla" if model.jit_compile else "function")
            )
        elif variant in ("heatmap_only", "heatmap_only_xla"):
            explainer = LRP(model, case.composite)

            def heatmap(x, y, explainer=explainer):
                R = explainer(x, y)
                return R, tf.reduce_sum(R)

            jit = variant.endswith("_xla")
            fn = tf.function(heatmap, jit_compile=jit, reduce_retracing=True, autograph=False)
            runners.append(Runner(variant, lambda f=fn: float(f(x, y)[1]), 1, "xla" if jit else "function"))
        elif variant in ("forward_backward", "forward_backward_xla"):
            jit = variant.endswith("_xla")
            fn = tf.function(forward_backward(model), jit_compile=jit, reduce_retracing=True, autograph=False)
            runners.append(Runner(variant, lambda f=fn: float(f(x, y)[1]), 1, "xla" if jit else "function"))
        else:
            raise ValueError(f"Unknown variant {variant!r}; expected some of {list(VARIANTS)}.")
    for runner in runners:
        runner.auto_pick = pick
    return runners


def forward_backward(model) -> Callable:
    """``f(x, y) -> (gradient, its sum)``: the gradient of the labels' logits with respect to the input,
    or, for a model of token ids, to its Embedding's table (the backward pass reaches the token vectors).

    The heatmap's yardstick: one forward and one backward pass of the same model.
    """
    import keras
    import tensorflow as tf

    def gradient(x, y):
        # the tables looked up inside: a tf.function would take a list argument's variables as tensors
        tables = [layer.embeddings for layer in model.layers if isinstance(layer, keras.layers.Embedding)]
        with tf.GradientTape() as tape:
            if not tables:
                tape.watch(x)
            logits = model(x, training=False)
            score = tf.reduce_sum(logits * tf.one_hot(y, logits.shape[-1], dtype=logits.dtype))
        grad = tf.convert_to_tensor(tape.gradient(score, tables[0] if tables else x))
        return grad, tf.reduce_sum(grad)

    return gradient


def _block(runner: Runner, calls: int) -> float:
    """Milliseconds per step over ``calls`` calls."""
    started = time.perf_counter()
    for _ in range(calls):
        runner.call()
    return (time.perf_counter() - started) * 1e3 / (calls * runner.steps_per_call)


def measure(case: Case, runners: list[Runner], repeats: int, min_time: float, max_calls: int = 2000) -> list[dict]:
    """Warm up and calibrate every runner, then time interleaved blocks; one record per runner."""
    setup = {}
    for runner in runners:
        started = time.perf_counter()
        runner.call()  # trace and compile
        compile_s = time.perf_counter() - started
        runner.call()
        started = time.perf_counter()
        runner.call()
        one = max(time.perf_counter() - started, 1e-6)
        setup[runner.variant] = (compile_s, max(1, min(max_calls, math.ceil(min_time / one))))
    times: dict[str, list[float]] = {runner.variant: [] for runner in runners}
    peaks: dict[str, float] = {}
    for repeat in range(repeats):
        gc.collect()
        shift = repeat % len(runners)
        for runner in runners[shift:] + runners[:shift]:
            times[runner.variant].append(_block(runner, setup[runner.variant][1]))
            peaks[runner.variant] = peak_rss_mb()
    records = []
    for runner in runners:
        ms = times[runner.variant]
        median = statistics.median(ms)
        records.append(
            {
                "variant": runner.variant,
                "model": case.model,
                "composite": case.composite,
                "batch": case.batch,
                "ms_median": median,
                "ms_min": min(ms),
                "ms_max": max(ms),
                "steps_per_second": 1e3 / median,
                "peak_rss_mb": peaks[runner.variant],
                "steps_per_call": runner.steps_per_call,
                "calls_per_block": setup[runner.variant][1],
                "repeats": repeats,
                "compile_s": setup[runner.variant][0],
                "jit": runner.jit,
                "auto_pick": runner.auto_pick,
            }
        )
    return records


# --------------------------------------------------------------------------- report


def _find(records, variant, model, composite, batch):
    for r in records:
        if (r["variant"], r["model"], r["composite"], r["batch"]) == (variant, model, composite, batch):
            return r
    return None


def ratios(records: list[dict]) -> list[dict]:
    """The goal ratios, per case, from one run (missing variants are skipped).

    ``value`` compares medians; ``value_from_min`` compares the fastest blocks, which a
    machine shared with other work disturbs less.
    """
    out = []
    order = lambda c: (MODELS.index(c[0]) if c[0] in MODELS else len(MODELS), c[0], c[1], c[2])  # noqa: E731
    cases = sorted({(r["model"], r["composite"], r["batch"]) for r in records}, key=order)
    inverse = ("compiled", "compiled_xla", "multi_step", "multi_step_xla", "multi_step_xla_loop")

    for case in cases:
        model, composite, batch = case
        get = lambda v: _find(records, v, *case)  # noqa: E731

        def best(names):
            found = [r for r in map(get, names) if r]
            return min(found, key=lambda r: r["ms_median"]) if found else None

        def add(name, a, b, op, goal, detail):
            """``a / b`` of two records' times (``b`` None: ``a``'s steps per second)."""
            if b is None:
                value, from_min = 1e3 / a["ms_median"], 1e3 / a.get("ms_min", a["ms_median"])
            else:
                value = a["ms_median"] / b["ms_median"]
                from_min = a.get("ms_min", a["ms_median"]) / b.get("ms_min", b["ms_median"])
            out.append(_ratio(name, case, value, from_min, op, goal, detail))

        eager, default, fastest = get("eager_reference"), get("compiled"), best(inverse)
        if eager and default:
            add("default step speedup vs eager reference", eager, default, ">=", GOAL_EAGER_SPEEDUP, "eager_reference / compiled")
        if eager and fastest:
            add("best step speedup vs eager reference", eager, fastest, ">=", GOAL_EAGER_SPEEDUP, f"eager_reference / {fastest['variant']}")
        if model == "mlp" and batch == 1:
            for name in ("main_job", "multi_step", "multi_step_xla", "multi_step_xla_loop"):
                if get(name):
                    add(f"{name} steps/s at batch 1", get(name), None, ">=", GOAL_MULTI_STEP_PER_SECOND, name)
        goal = GOAL_APPLICATION_HEATMAP_RATIO if model in APPLICATIONS else GOAL_HEATMAP_RATIO
        if batch in (64, 256) or model in APPLICATIONS or model in TRANSFORMERS:
            fit, keras_best = get("keras_fit"), best(("keras_fit", "keras_fit_multi", "keras_fit_xla"))
            if default and fit:
                add("default step / keras_fit", default, fit, "<=", GOAL_KERAS_RATIO, "compiled / keras_fit")
            if fastest and keras_best:
                add("best step / best keras", fastest, keras_best, "<=", GOAL_KERAS_RATIO, f"{fastest['variant']} / {keras_best['variant']}")
        # trainer.jit_compile=auto's pick against the other mode, each run as the trainer runs it:
        # one image (task=single) as the loop compile_step builds, a batch (only task=dataset has
        # batches) one update per call
        if batch == 1:
            graph, xla = get("multi_step"), get("multi_step_xla_loop" if model == "mlp" else "multi_step_xla")
        else:
            graph, xla = get("compiled"), get("compiled_xla")
        if graph and xla and graph.get("auto_pick"):
            picked, other = (xla, graph) if graph["auto_pick"] == "xla" else (graph, xla)
            add(f"auto ({graph['auto_pick']}) / the other mode", picked, other, "<=", 1.0, f"{picked['variant']} / {other['variant']}")
        for suffix in ("", "_xla"):
            heat, fb = get("heatmap_only" + suffix), get("forward_backward" + suffix)
            if heat and fb:
                add(f"heatmap_only{suffix} / forward_backward{suffix}", heat, fb, "<=", goal, "")
    return out


def _ratio(name, case, value, from_min, op, goal, detail):
    met = value >= goal if op == ">=" else value <= goal
    return {
        "ratio": name,
        "model": case[0],
        "composite": case[1],
        "batch": case[2],
        "value": value,
        "value_from_min": from_min,
        "goal": f"{op} {goal:g}",
        "met": met,
        "detail": detail,
    }


def table(records: list[dict]) -> str:
    head = f"{'model':<5} {'composite':<17} {'batch':>5}  {'variant':<21} {'ms/step':>9} {'min':>9} {'max':>9} {'steps/s':>10} {'rss MB':>7} {'compile s':>9}"
    lines = [head, "-" * len(head)]
    for r in records:
        lines.append(
            f"{r['model']:<5} {r['composite']:<17} {r['batch']:>5}  {r['variant']:<21} {r['ms_median']:>9.3f} "
            f"{r['ms_min']:>9.3f} {r['ms_max']:>9.3f} {r['steps_per_second']:>10.1f} {r['peak_rss_mb']:>7.0f} {r['compile_s']:>9.2f}"
        )
    return "\n".join(lines)


def ratio_lines(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        mark = "ok  " if r["met"] else "MISS"
        detail = f"  ({r['detail']})" if r["detail"] else ""
        lines.append(
            f"{mark} {r['model']:<4} {r['composite']:<17} b={r['batch']:<4} {r['ratio']:<44} {r['value']:>9.2f} "
            f"(mins {r['value_from_min']:>8.2f})  goal {r['goal']}{detail}"
        )
    return "\n".join(lines)



# --------------------------------------------------------------------------- command line


def _list(kind, allowed=None):
    def parse(text: str):
        items = [kind(item) for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        if allowed is not None:
            bad = [i for i in items if i not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"{bad} not in {list(allowed)}")
        return tuple(items)

    return parse


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m heatinv.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a CI smoke run: mlp, epsilon, batch 1 and 64, 3 short repeats")
    parser.add_argument(
        "--models",
        type=_list(str, MODELS + tuple(APPLICATIONS) + tuple(TRANSFORMERS)),
        default=None,
        help=f"comma-separated (default: mlp,cnn; also {','.join(APPLICATIONS)},{','.join(TRANSFORMERS)})",
    )
    parser.add_argument(
        "--composites", type=_list(str), default=None,
        help=f"comma-separated composite names (default: {','.join(COMPOSITES)}; {','.join(TRANSFORMER_COMPOSITES)} for "
        f"{','.join(TRANSFORMERS)})",
    )
    parser.add_argument("--batches", type=_list(int), default=None, help="comma-separated (default: 1,64,256)")
    parser.add_argument("--variants", type=_list(str, VARIANTS), default=None, help="comma-separated (default: all)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved timing blocks per variant (default 5; quick 3)")
    parser.add_argument("--min-time", type=float, default=None, help="seconds per timing block (default 0.1; quick 0.02)")
    parser.add_argument("--steps-per-execution", type=int, default=10, help="updates per call of the multi-step variants")
    parser.add_argument(
        "--main-job",
        type=_list(int),
        default=None,
        help="SHORT,LONG: time `python -m heatinv.train` with the defaults for SHORT and LONG steps and "
        "report the wall time per step of the difference (default 2000,4000, runs long enough for "
        "trainer.jit_compile=auto to pick XLA; 0 to skip; quick: skipped)",
    )
    parser.add_argument(
        "--memory", type=_list(str, PEAK_MODELS), default=(),
        help="comma-separated models whose peak memory to measure, each case in a fresh process (heatinv.peak_memory)",
    )
    parser.add_argument("--memory-batch", type=int, default=8, help="--memory's batch (default 8)")
    parser.add_argument("--memory-size", type=int, default=224, help="--memory's image side (default 224)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"the JSON file to write (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if args.composites:
        from heatinv.lrp.composites import COMPOSITES as NAMED

        unknown = [name for name in args.composites if name not in NAMED]
        if unknown:
            parser.error(f"--composites: {unknown} not in {sorted(NAMED)}")
    quick = args.quick
    args.models = args.models or (("mlp",) if quick else MODELS)
    args.composites_given = args.composites is not None
    args.composites = args.composites or (("epsilon",) if quick else COMPOSITES)
    args.batches = args.batches or ((1, 64) if quick else BATCHES)
    if args.main_job is None:
        args.main_job = () if quick else (2000, 4000)
    elif args.main_job == (0,):
        args.main_job = ()
    elif len(args.main_job) != 2 or not 0 < args.main_job[0] < args.main_job[1]:
        parser.error(f"--main-job: expected SHORT,LONG with 0 < SHORT < LONG, got {args.main_job}")
    else:
        from heatinv.step import XLA_MIN_UPDATES

        if args.main_job[0] < XLA_MIN_UPDATES <= args.main_job[1]:
            parser.error(
                f"--main-job {args.main_job[0]},{args.main_job[1]}: trainer.jit_compile=auto runs XLA from {XLA_MIN_UPDATES} "
                "steps, so the two runs would run different steps and their difference would be no step's time; give "
                f"two lengths on one side of it (e.g. {XLA_MIN_UPDATES + 500},{XLA_MIN_UPDATES + 2500})"
            )
    args.all_variants = args.variants is None
    args.variants = args.variants or VARIANTS
    args.repeats = args.repeats if args.repeats is not None else (3 if quick else 5)
    args.min_time = args.min_time if args.min_time is not None else (0.02 if quick else 0.1)
    if any(b < 1 for b in args.batches) or args.repeats < 1 or args.steps_per_execution < 1 or args.min_time < 0:
        parser.error("batches, repeats and --steps-per-execution must be positive, --min-time non-negative")
    return args


def main_job(short: int, long: int, overrides: tuple[str, ...] = ()) -> dict:
    """The main job as a user runs it: ``python -m heatinv.train`` with the defaults.

    Runs the command twice, for ``short`` and ``long`` steps, in fresh processes (their own
    output folders in a temporary directory; both runs must pick the same step:
    ``trainer.jit_compile=auto`` picks XLA from :data:`heatinv.step.XLA_MIN_UPDATES` steps),
    and reports each run's loop wall time per update after its first call, from its
    ``metrics.json``: ``loop_seconds`` less the first call (which traces and compiles the step,
    and whose time a loaded machine makes vary by seconds), over the updates after it. So
    everything the loop does per step stays (the step, summaries, checkpoints, logging) while
    start-up, model building, compiling and the final outputs are left out. The long run's is
    ``ms_median``, the two runs' span ``ms_min`` and ``ms_max``. Each run's own figure, not their
    difference: the difference of two loops of about a second each is within the compile
    time's spread (measured: 0.05 ms per step from a difference, a tenth of either run's). The
    processes' wall times are kept as their difference (``process_ms_per_step``).

    Returns:
        A record like the others: ``variant`` ``main_job``, the default model, composite and
        batch (mlp, epsilon_gamma_box, 1), ``ms_median`` per step, ``steps_per_second``;
        ``jit`` says whether the job's step ran with XLA (``metrics.json``'s ``xla_why``).

    Examples:
        >>> record = main_job(2000, 4000)  # doctest: +SKIP
    """
    import json
    import subprocess
    import tempfile

    from heatinv.step import XLA_MIN_UPDATES

    wall, metrics = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for steps in (short, long):
            out = os.path.join(folder, str(steps))
            command = [sys.executable, "-m", "heatinv.train", f"trainer.steps={steps}", f"hydra.run.dir={out}", *overrides]
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            wall[steps] = time.perf_counter() - started
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
            with open(os.path.join(out, "metrics.json")) as f:
                metrics[steps] = json.load(f)
    if metrics[short].get("xla_why") != metrics[long].get("xla_why"):
        raise ValueError(
            f"--main-job {short},{long}: the two runs ran different steps ({short} steps: {metrics[short].get('xla_why')!r}; "
            f"{long} steps: {metrics[long].get('xla_why')!r}), so their difference is no step's time. trainer.jit_compile=auto "
            f"picks by the run's length (XLA from {XLA_MIN_UPDATES} steps): give two lengths on one side of it."
        )
    per_step = {steps: _loop_ms_per_step(m, steps) for steps, m in metrics.items()}
    ms = per_step[long]
    summaries = (metrics[long]["summaries_seconds"] - metrics[short]["summaries_seconds"]) * 1e3 / (long - short)
    return {
        "variant": "main_job",
        "model": "mlp",
        "composite": "epsilon_gamma_box",
        "batch": 1,
        "ms_median": ms,
        "ms_min": min(per_step.values()),
        "ms_max": max(per_step.values()),
        "steps_per_second": 1e3 / ms,
        "peak_rss_mb": peak_rss_mb(),
        "steps_per_call": long - short,
        "calls_per_block": 1,
        "repeats": 1,
        "compile_s": metrics[long]["first_call_seconds"],
        "jit": metrics[long].get("xla_why", " ".join(overrides) or "defaults"),
        "summaries_ms_per_step": summaries,
        # issue 13's goal (<= 10 %): what summaries and checkpoints cost of the long run's whole loop
        "bookkeeping_share": (metrics[long]["summaries_seconds"] + metrics[long]["checkpoints_seconds"]) / metrics[long]["loop_seconds"],
        "process_ms_per_step": (wall[long] - wall[short]) * 1e3 / (long - short),
        "command": f"python -m heatinv.train trainer.steps={short} / {long} {' '.join(overrides)}".strip(),
    }


def _loop_ms_per_step(metrics: dict, steps: int) -> float:
    """A run's loop wall time per update after its first call, from its ``metrics.json``.

    ``steps_per_second * seconds`` counts the updates after the first call (None where no call
    followed it: all ``steps`` count, and the loop has no first call to leave out).

    Examples:
        >>> _loop_ms_per_step({"loop_seconds": 9.0, "first_call_seconds": 4.0, "seconds": 4.0, "steps_per_second": 500.0}, 2025)
        2.5
    """
    timed = steps if metrics.get("steps_per_second") is None else round(metrics["steps_per_second"] * metrics["seconds"])
    return (metrics["loop_seconds"] - (metrics["first_call_seconds"] or 0.0)) * 1e3 / timed


def run(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Measure every case; returns (records, ratios) and writes ``args.out``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from heatinv.data import load_digits

    dataset = load_digits()
    devices = ", ".join(d.device_type for d in tf.config.list_logical_devices()) or "?"
    print(
        f"heatinv bench: TF {tf.__version__}, Keras {keras.__version__}, devices [{devices}], "
        f"{os.cpu_count()} CPUs, python {platform.python_version()}; repeats {args.repeats}, "
        f"min block {args.min_time:g} s, steps_per_execution {args.steps_per_execution}",
        flush=True,
    )
    records: list[dict] = []
    for model in args.models:
        composites = TRANSFORMER_COMPOSITES if model in TRANSFORMERS and not args.composites_given else args.composites
        for composite in composites:
            for batch in args.batches:
                case = Case(model, composite, batch)
                started = time.perf_counter()
                variants = tuple(
                    v
                    for v in args.variants
                    if not (args.all_variants and (model, v) in SKIPPED_BY_DEFAULT)
                    and (model not in APPLICATIONS and model not in TRANSFORMERS or v in APPLICATION_VARIANTS)
                )
                runners = make_runners(case, dataset, variants, args.steps_per_execution)
                case_records = measure(case, runners, args.repeats, args.min_time)
                records.extend(case_records)
                del runners
                keras.backend.clear_session()
                gc.collect()
                print(f"  {model} {composite} batch {batch}: {time.perf_counter() - started:.1f} s", flush=True)
                write_json(args.out, records)  # partial results survive an interrupted run
    if args.main_job:
        started = time.perf_counter()
        records.append(main_job(args.main_job[0], args.main_job[1]))
        share = records[-1]["bookkeeping_share"]
        print(
            f"  main job: {time.perf_counter() - started:.1f} s; summaries + checkpoints {share:.1%} of the "
            f"{args.main_job[1]}-step run's loop (goal <= 10 %)",
            flush=True,
        )
        write_json(args.out, records)
    if args.memory:
        from heatinv.peak_memory import measure as measure_memory
        from heatinv.peak_memory import ratio_table

        print(f"peak memory, batch {args.memory_batch}, {args.memory_size}x{args.memory_size}, each case in a fresh process:", flush=True)
        memory = measure_memory(args.memory, args.memory_batch, args.memory_size, progress=lambda line: print("  " + line, flush=True))
        records.extend({"variant": "peak_memory", **r} for r in memory)
        write_json(args.out, records)
    timed = [r for r in records if "ms_median" in r]
    rows = ratios(timed)
    print(table(timed))
    print("\nratios of this run's medians (and of its fastest blocks); peak_rss_mb is process-wide:")
    print(ratio_lines(rows))
    if args.memory:
        print("\npeak memory and time of one call, as ratios to the model's training step (heatinv.peak_memory):")
        print(ratio_table([r for r in records if r["variant"] == "peak_memory"]))
    print(f"\nwrote {args.out}", flush=True)
    return records, rows


def main(argv=None) -> int:
    from heatinv.startup import start_tensorflow

    start_tensorflow()  # before anything imports TensorFlow: no CUDA notices on a CPU machine
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
