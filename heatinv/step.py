"""The inverse step: heatmap, loss, gradients, update; plain Python, compiled once.

:func:`train_step` knows nothing of compilation; :func:`compile_step` wraps it in
``tf.function`` (optionally XLA) exactly once, and can run several updates per call
(``steps_per_execution``, like Keras's ``Model.compile(steps_per_execution=...)``): one
dispatch, one host read and one set of diagnostics for ``N`` updates.

Where the time of a step goes, and what this module does about it (CPU, the ``mlp`` at
batch 1; ``python -m heatinv.bench`` measures it):

- dispatch: a ``tf.function`` call costs ~0.2 ms before any op runs, as much as the whole
  heatmap. ``steps_per_execution`` runs ``N`` updates in one ``tf.while_loop`` and pays it
  once per ``N`` steps. Under XLA the loop stays in the graph and calls the XLA-compiled
  update: XLA's own while loop made the cnn's updates ~10x slower on CPU.
- the optimizer: Keras's Adam is ~12 element-wise ops and ~10 scalar ops per variable,
  each a graph-executor launch. :func:`apply_gradients` runs the same update as one fused
  kernel per variable (``ResourceApplyAdam``, ``ResourceApplyKerasMomentum``,
  ``ResourceApplyGradientDescent``), on the optimizer's own slot variables, whenever the
  optimizer is a plain Keras Adam or SGD; anything else goes through Keras.
- diagnostics: the per-variable gradient norms and zero fractions read every gradient
  once more; with ``steps_per_execution`` they are computed once per call, from the last
  update's gradients.
- returned tensors: each output of a ``tf.function`` costs a little at every call; the
  multi-step loop returns one set per call.
- tracing: the step's Python has no data-dependent ``if``/``while`` of its own (``tf.cond``
  and ``tf.while_loop`` are explicit), so it is traced with ``autograph=False``: AutoGraph's
  rewriting of the engine's source took 4-5 s of the default job's 7 s first call.
- the NaN/Inf guard skips an update without a branch (see :func:`apply_gradients`); its
  check of every gradient before the update took 13 % of the mlp's update in the XLA loop,
  which therefore checks the weights once per call instead and redoes a failed call with
  the guard (see :class:`CompiledStep`).
- the loop carries nothing of its updates but counts: the last update runs after it and
  gives the call's outputs (carrying the gradients copied them at every update, 8 %).
- the host read of the loss is cheap on CPU (the call is synchronous there), but it forces
  a sync on an accelerator: read it once per call, which with ``steps_per_execution`` is
  once per ``N`` steps.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Callable

import keras
import tensorflow as tf

from heatinv.lrp import LRP
from heatinv.lrp.canonical import Merge, Pool
from heatinv.onednn import onednn_enabled

MODES = ("eager", "function", "xla", "auto")

XLA_FAILURES = (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError)
"""What a step XLA cannot compile raises on its first call (an op without an XLA kernel:
``InvalidArgumentError: Detected unsupported operations when trying to compile graph``)."""

log = logging.getLogger(__name__)

Objective = Callable[..., dict]
"""``objective(explanation, label, target, *extra) -> {"loss": scalar, <term>: scalar, ...}``."""


def update(
    student: keras.Model,
    explainer: LRP,
    objective: Objective,
    optimizer: keras.optimizers.Optimizer,
    x: tf.Tensor,
    label: tf.Tensor,
    target: tf.Tensor,
    *extra: tf.Tensor,
    guard: bool = True,
) -> dict[str, tf.Tensor | list[tf.Tensor] | dict[str, tf.Tensor]]:
    """One update without diagnostics.

    Args:
        objective: ``objective(explanation, label, target, *extra) -> {"loss": scalar, <term>: scalar}``
            (:class:`heatinv.losses.HeatmapMatch` for one heatmap, the dataset task's
            :class:`heatinv.dataset_task.Manipulation`).
        x, label, target, extra: one batch: inputs, explained classes, target heatmaps and
            whatever else the objective reads.
        guard: skip the update when the loss or a gradient is NaN/Inf. Without it the update
            is applied whatever its values (the caller checks the weights afterwards and
            redoes the updates with the guard, see :class:`CompiledStep`).

    Returns:
        ``loss``, ``terms`` (the objective's other terms, float32), ``heatmap`` (before the
        update), ``logits``, ``gradients``, and ``nonfinite`` (1 when the loss or a gradient
        was NaN/Inf and the update was skipped, else 0; without ``guard``, 1 when the loss was
        NaN/Inf, the update made all the same).
    """
    variables = student.trainable_variables
    with tf.GradientTape() as tape:
        explanation = explainer.explain(x, label)
        terms = dict(objective(explanation, label, target, *extra))
        loss = terms.pop("loss")
    gradients = tape.gradient(loss, variables)
    # An unconnected variable (None) is reported as an all-zero gradient for the doctor; an
    # Embedding's (IndexedSlices of the rows looked up) is made dense, as the summaries read every entry.
    gradients = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(gradients, variables)]
    if guard:
        finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in gradients] + [tf.math.is_finite(loss)]))
        # A NaN/Inf step leaves the weights and the optimizer's state untouched.
        skip = tf.logical_not(finite)
    else:
        skip = tf.logical_not(tf.math.is_finite(loss))  # in the loss's own dtype: float64 beyond float32's range is finite
    apply_gradients(optimizer, gradients, variables, skip=skip if guard else None)
    return {
        "loss": tf.cast(loss, tf.float32),
        "terms": {name: tf.cast(value, tf.float32) for name, value in terms.items()},
        "heatmap": explanation.relevance,
        "logits": explanation.logits,
        "gradients": gradients,
        "nonfinite": tf.cast(skip, tf.int32),
    }


def gradient_stats(gradients: list[tf.Tensor]) -> dict[str, tf.Tensor]:
    """``grad_norms`` and ``zero_fractions``, float32 ``[variables]``."""
    return {
        "grad_norms": tf.stack([tf.norm(tf.cast(g, tf.float32)) for g in gradients]),
        "zero_fractions": tf.stack([tf.reduce_mean(tf.cast(tf.equal(g, 0), tf.float32)) for g in gradients]),
    }


def train_step(
    student: keras.Model,
    explainer: LRP,
    objective: Objective,
    optimizer: keras.optimizers.Optimizer,
    x: tf.Tensor,
    label: tf.Tensor,
    target: tf.Tensor,
    *extra: tf.Tensor,
) -> dict[str, tf.Tensor | list[tf.Tensor]]:
    """One update of the student's weights towards ``target``.

    Args:
        x: ``[batch, 28, 28, 1]`` input (its dtype sets the working precision).
        label: ``[batch]`` int, the explained class.
        target: heatmap with the shape of ``x``.
        extra: the objective's other inputs (see :func:`update`).

    Returns:
        ``loss`` (scalar), ``terms``, ``heatmap`` (before the update), ``logits``, ``gradients``
        (one per trainable variable, zeros where no path exists), ``grad_norms`` and
        ``zero_fractions`` (``[variables]``).
    """
    result = update(student, explainer, objective, optimizer, x, label, target, *extra)
    return {**result, **gradient_stats(result["gradients"])}


# --------------------------------------------------------------------------- optimizer


def _plain(optimizer: keras.optimizers.Optimizer) -> bool:
    """True when ``apply_gradients`` would do nothing but the update rule itself."""
    return (
        getattr(optimizer, "clipnorm", None) is None
        and getattr(optimizer, "clipvalue", None) is None
        and getattr(optimizer, "global_clipnorm", None) is None
        and getattr(optimizer, "weight_decay", None) is None
        and not getattr(optimizer, "use_ema", False)
        and not getattr(optimizer, "gradient_accumulation_steps", None)
        and getattr(optimizer, "loss_scale_factor", None) is None
        and not tf.distribute.has_strategy()  # under a strategy Keras all-reduces the gradients
    )


def fused_kind(optimizer: keras.optimizers.Optimizer, variables) -> str | None:
    """``"adam"``, ``"momentum"`` or ``"sgd"`` when :func:`apply_gradients` can use a fused kernel, else None.

    Only exactly ``keras.optimizers.Adam`` (without AMSGrad) and ``keras.optimizers.SGD``
    (without Nesterov) qualify, with no clipping, weight decay, EMA, gradient accumulation
    or loss scaling, built on these variables, none of them with a constraint.
    """
    if not _plain(optimizer) or not getattr(optimizer, "built", False):
        return None
    try:
        indices = [optimizer._get_variable_index(v) for v in variables]
    except (AttributeError, KeyError):
        return None
    if any(getattr(v, "constraint", None) is not None for v in variables):
        return None
    if any(getattr(v, "overwrite_with_gradient", False) for v in variables):
        return None
    if type(optimizer) is keras.optimizers.Adam and not optimizer.amsgrad:
        slots = (optimizer._momentums, optimizer._velocities)
        ok = all(s[i].dtype == v.dtype for s in slots for i, v in zip(indices, variables))
        return "adam" if ok else None
    if type(optimizer) is keras.optimizers.SGD and not optimizer.nesterov:
        if optimizer.momentum == 0:
            return "sgd"
        ok = all(optimizer.momentums[i].dtype == v.dtype for i, v in zip(indices, variables))
        return "momentum" if ok else None
    return None


def _handle(variable) -> tf.Tensor:
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


def apply_gradients(optimizer: keras.optimizers.Optimizer, gradients, variables, skip: tf.Tensor | None = None) -> None:
    """``optimizer.apply_gradients(zip(gradients, variables))``, as fused kernels when possible.

    For a plain Keras Adam or SGD (see :func:`fused_kind`) each variable is updated by one
    TensorFlow training kernel on the optimizer's own slot variables, and
    ``optimizer.iterations`` is advanced, so the optimizer's state is exactly what Keras
    would hold and the two paths can be mixed. The kernels compute Keras's formulas
    (Adam's ``epsilon``-hat form, ``m = momentum * m - lr * g``), rounded differently:
    in float64 the fused Adam is Adam's formula to the last bit, while Keras's own update
    drifts ~3e-7 from it in 5 steps at lr 0.01 (it rounds some factors in float32); in
    float32 the two agree to ~3e-7; SGD and momentum agree with Keras to a rounding.
    Eager, graph and XLA (the kernels have XLA lowerings) run the same path.

    ``skip`` (a boolean scalar tensor, e.g. "a gradient is NaN"): where true, the weights,
    the slots and ``optimizer.iterations`` keep their values. The fused Adam and SGD take it
    without a branch: with a zero gradient, Adam's ``beta1 = beta2 = 1`` and a learning rate
    of 0, ``m + (0 - m)(1 - 1) = m``, ``v`` likewise and ``var - 0 * m / (sqrt(v) + eps) = var``
    (SGD: ``var - lr * 0 = var``). Under XLA a ``tf.cond`` here became a select over every
    weight and slot plus copies of the slots, about a fifth of the mlp's update at batch 1.
    Momentum (``var += accum`` moves the weights even at a zero gradient) and the optimizers
    that are not fused take a ``tf.cond``.

    Examples:
        >>> v = keras.Variable([1.0, 2.0]); opt = keras.optimizers.Adam(0.1); opt.build([v])
        >>> apply_gradients(opt, [tf.constant([float("nan"), 1.0])], [v], skip=tf.constant(True))
        >>> v.numpy(), int(opt.iterations)
        (array([1., 2.], dtype=float32), 0)
    """
    kind = fused_kind(optimizer, variables)
    if skip is not None and kind in (None, "momentum"):

        def apply() -> tf.Tensor:
            apply_gradients(optimizer, gradients, variables)
            return tf.constant(0, tf.int32)

        tf.cond(skip, lambda: tf.constant(1, tf.int32), apply)
        return
    if kind is None:
        optimizer.apply_gradients(zip(gradients, variables))
        return
    learning_rate = optimizer.learning_rate  # a schedule is evaluated at the current iteration
    if skip is not None:  # NaN * 0 is NaN: a skipped gradient is replaced, not scaled
        # Select (v1) on a scalar condition hands one input over; SelectV2 (tf.where) copies
        # it: 0.09 against 0.32 ms for the mlp's [784, 300] gradient in the graph.
        gradients = [tf.raw_ops.Select(condition=skip, x=tf.zeros_like(g), y=g) for g in gradients]

    def unless_skipped(value, dtype, otherwise):
        value = tf.cast(value, dtype) if tf.is_tensor(value) else tf.constant(value, dtype)  # 0.9 -> float32 -> float64 is not 0.9
        return value if skip is None else tf.where(skip, tf.constant(otherwise, dtype), value)
    if kind == "adam":
        powers = {}
        for gradient, variable in zip(gradients, variables):
            dtype = variable.dtype
            if dtype not in powers:  # as Keras computes them, in the variable's dtype
                step = tf.cast(optimizer.iterations + 1, dtype)
                powers[dtype] = (
                    tf.pow(tf.constant(optimizer.beta_1, dtype), step),
                    tf.pow(tf.constant(optimizer.beta_2, dtype), step),
                )
            index = optimizer._get_variable_index(variable)
            tf.raw_ops.ResourceApplyAdam(
                var=_handle(variable),
                m=_handle(optimizer._momentums[index]),
                v=_handle(optimizer._velocities[index]),
                beta1_power=powers[dtype][0],
                beta2_power=powers[dtype][1],
                lr=unless_skipped(learning_rate, dtype, 0),
                beta1=unless_skipped(optimizer.beta_1, dtype, 1),
                beta2=unless_skipped(optimizer.beta_2, dtype, 1),
                epsilon=tf.constant(optimizer.epsilon, dtype),
                grad=tf.cast(gradient, dtype),
            )
    elif kind == "momentum":
        for gradient, variable in zip(gradients, variables):
            dtype = variable.dtype
            tf.raw_ops.ResourceApplyKerasMomentum(
                var=_handle(variable),
                accum=_handle(optimizer.momentums[optimizer._get_variable_index(variable)]),
                lr=tf.cast(learning_rate, dtype),
                grad=tf.cast(gradient, dtype),
                momentum=tf.constant(optimizer.momentum, dtype),
            )
    else:
        for gradient, variable in zip(gradients, variables):
            dtype = variable.dtype
            tf.raw_ops.ResourceApplyGradientDescent(
                var=_handle(variable), alpha=tf.cast(learning_rate, dtype), delta=tf.cast(gradient, dtype)
            )
    optimizer.iterations.assign_add(1 if skip is None else 1 - tf.cast(skip, optimizer.iterations.dtype))


# --------------------------------------------------------------------------- compiled step


class CompiledStep:
    """``step(x, label, target, *extra, steps=None) -> dict``: ``steps`` updates on one batch in one call.

    Built by :func:`compile_step`. ``steps`` defaults to ``steps_per_execution``; any other
    positive count runs without a retrace (it is passed as a tensor), so a loop can stop
    exactly at its log steps (see :func:`schedule`). The result has :func:`train_step`'s
    keys and is the last update's outputs (the diagnostics are computed once per call,
    from the last gradients); ``N`` updates in one call give the same weights and losses
    as ``N`` calls of one update.

    In ``xla`` mode with ``xla_loop=False`` the loop is a graph ``tf.while_loop`` whose
    body calls the XLA-compiled update (one XLA program, compiled once, launched per update
    from the graph); with ``xla_loop=True`` the loop itself is inside the XLA program.
    Measured on CPU (``python -m heatinv.bench``): the XLA loop is 10-30 % faster per update
    for the mlp, but ~10x slower for the cnn (XLA's CPU convolutions inside a while loop).
    ``xla_loop=None`` (the default) picks the XLA loop for models without convolution or
    pooling layers.

    The XLA loop with a fused optimizer (see :func:`fused_kind`) runs its updates without
    the NaN/Inf guard, on a saved copy of the state, and checks the weights and losses once
    at the end; a call that fails the check is undone and run again with the guard at every
    update (compiled on first need), so it skips exactly the updates the guard skips.

    With ``fallback`` (``trainer.jit_compile=auto``) a first call that XLA cannot compile
    (:data:`XLA_FAILURES`) rebuilds the step without XLA, logs one line, and runs the call
    again: XLA compiles before it runs anything, so the failed call updated nothing.

    Attributes:
        mode: ``eager``, ``function`` or ``xla``: what the calls run (after a fallback, ``function``).
        why: how the mode was chosen, for the log and ``metrics.json``.
        steps_per_execution: the default number of updates per call.
        xla_loop: whether the multi-step loop runs inside the XLA program.
        function: the ``tf.function`` one call runs (None in eager mode), e.g. for
            ``function.experimental_get_tracing_count()``.
    """

    def __init__(
        self,
        student,
        explainer,
        objective,
        optimizer,
        mode: str,
        steps_per_execution: int,
        xla_loop: bool | None = None,
        why: str = "",
        fallback: bool = False,
    ):
        self.parts = (student, explainer, objective, optimizer)
        self.requested_xla_loop = xla_loop
        self.steps_per_execution = steps_per_execution
        self.why = why or f"mode {mode}"
        self.fallback = fallback and mode == "xla"
        self._build(mode)

    def _build(self, mode: str) -> None:
        student, explainer, objective, optimizer = self.parts
        steps_per_execution, xla_loop = self.steps_per_execution, self.requested_xla_loop
        if xla_loop is None:
            xla_loop = not _convolutional(explainer)
        self.mode = mode
        self.xla_loop = bool(xla_loop) and mode == "xla" and steps_per_execution > 1
        variables = student.trainable_variables

        def one(*batch):
            return update(student, explainer, objective, optimizer, *batch)

        def unguarded(*batch):
            return update(student, explainer, objective, optimizer, *batch, guard=False)

        def single(*batch):
            return train_step(student, explainer, objective, optimizer, *batch)

        def looped(body_fn):
            def many(steps, *batch):
                """``steps >= 1`` updates: ``steps - 1`` in a while loop, then the last, whose outputs are returned.

                The loop carries no outputs of its updates: carrying the gradients took 8 % of
                the mlp's update in the XLA loop (a copy of every gradient per update).
                """

                def body(i, skipped, finite):
                    result = body_fn(*batch)
                    return i + 1, skipped + result["nonfinite"], finite & tf.equal(result["nonfinite"], 0)

                _, skipped, finite = tf.while_loop(
                    lambda i, *_: i < steps - 1,
                    body,
                    (tf.constant(0, tf.int32), tf.constant(0, tf.int32), tf.constant(True)),
                    parallel_iterations=1,  # sequential: each update reads the last one's weights
                )
                last = body_fn(*batch)
                skipped, finite = skipped + last["nonfinite"], finite & tf.equal(last["nonfinite"], 0)
                # ``nonfinite`` of a call: how many of its updates were skipped.
                return {**last, "nonfinite": skipped, **gradient_stats(last["gradients"]), "finite": finite}

            return many

        self._single, self._many, self._guarded, self.function = single, None, None, None
        if mode == "eager":
            return
        jit = mode == "xla"
        if steps_per_execution == 1:
            self._single = tf.function(single, jit_compile=jit, reduce_retracing=True, autograph=False)
            self.function = self._single
            return
        if not self.xla_loop:  # each update one program (XLA's or TensorFlow's), traced once, looped by TensorFlow
            self._update = tf.function(one, jit_compile=jit, reduce_retracing=True, autograph=False)
            self._many = tf.function(looped(self._update), reduce_retracing=True, autograph=False)
        elif fused_kind(optimizer, variables) is not None:
            # The guard's check of every gradient before its update took 13 % of the mlp's update
            # in this loop. A fused Adam or SGD update of a NaN/Inf gradient makes its weight
            # NaN/Inf (Adam: m and v Inf or NaN, m / sqrt(v) NaN; SGD: lr * g), and no later
            # update makes it finite again (NaN stays NaN, Inf gives Inf or NaN), so one check
            # of the weights and the losses after the call finds it: a call that fails it is
            # undone (weights, slots, iterations) and run again with the guard at every update.
            state = [*variables, *optimizer.variables]
            self._saved = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in state]

            def speculative(steps, *batch):
                """The updates without the guard, on a copy of the state; ``finite`` says whether they may stand."""
                for saved, variable in zip(self._saved, state):
                    saved.assign(variable)
                result = looped(unguarded)(steps, *batch)
                weights_finite = [tf.reduce_all(tf.math.is_finite(v)) for v in variables]
                return {**result, "finite": tf.reduce_all(tf.stack([result["finite"], *weights_finite]))}

            self._many = tf.function(speculative, jit_compile=True, reduce_retracing=True, autograph=False)
            self._guarded = tf.function(looped(one), jit_compile=True, reduce_retracing=True, autograph=False)
            self._restore = tf.function(lambda: [v.assign(saved) for v, saved in zip(state, self._saved)], autograph=False)
        else:
            self._many = tf.function(looped(one), jit_compile=True, reduce_retracing=True, autograph=False)
        self.function = self._many

    def __call__(self, *batch, steps: int | None = None) -> dict:
        steps = self.steps_per_execution if steps is None else int(steps)
        if steps < 1:
            raise ValueError(f"steps must be a positive number of updates, got {steps}.")
        if not self.fallback:
            return self._run(batch, steps)
        self.fallback = False  # only the first call compiles
        try:
            return self._run(batch, steps)
        except XLA_FAILURES as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            log.warning(f"heatinv: XLA cannot compile this step, running it without XLA ({first_line[:200]})")
            self.why = f"{self.why}; XLA failed to compile it: {first_line[:200]}"
            self._build("function")
            return self._run(batch, steps)

    def _run(self, batch: tuple, steps: int) -> dict:
        if self._many is not None:
            result = self._many(tf.constant(steps, tf.int32), *batch)
            if self._guarded is not None and not bool(result["finite"]):
                self._restore()
                result = self._guarded(tf.constant(steps, tf.int32), *batch)
            del result["finite"]
            return result
        skipped = tf.constant(0, tf.int32)
        for _ in range(steps):
            result = self._single(*batch)
            skipped += result["nonfinite"]
        return {**result, "nonfinite": skipped}


def _convolutional(explainer: LRP) -> bool:
    """Whether the model has convolution or pooling layers."""
    return any(isinstance(step, Pool) or getattr(step, "kind", None) == "conv" for step in explainer.steps)


XLA_MAX_CONV_WEIGHTS = 1_000_000
"""Convolutional chains up to this many weights get XLA at batch 1 under oneDNN (see :func:`auto_mode`)."""

XLA_MIN_UPDATES = 1500
"""A run of fewer updates than this gets no XLA: its compiling would take longer than it saves (see :func:`auto_mode`)."""


def auto_mode(explainer: LRP, batch: int, steps_per_execution: int = 1, updates: int | None = None) -> tuple[str, str]:
    """``trainer.jit_compile=auto``: ``("xla" or "function", why)`` for this model, batch and run length.

    XLA at batch 1 for a chain of layers (no merge) in a run of at least
    :data:`XLA_MIN_UPDATES` updates (``updates``; None: a run long enough), where a chain
    that convolves has at most :data:`XLA_MAX_CONV_WEIGHTS` weights and TensorFlow runs
    oneDNN's kernels (:func:`onednn_enabled`); no XLA otherwise.

    The run's length counts because XLA's compiling is paid once and its gain per update:
    the main job (mlp, epsilon_gamma_box, batch 1, 25 updates per call) spent 4.3-4.7 s in
    its first call with XLA against 0.8-1.0 s without, and 1.0-1.3 ms per later update
    against 3.4-4.2 ms, so its loop took 5.4 / 2.4 s at 300 steps (the default), 6.4 / 4.8 s
    at 1000, 7.1 / 8.7 s at 2000 and 9.9 / 16.9 s at 4000 with / without XLA (2-core AMD
    EPYC, ``python -m heatinv.train trainer.steps=N trainer.jit_compile=true|false``, two
    runs each); on the Intel Xeon of earlier runs the job's first call took 1.5-1.7 s with
    XLA, whose updates (0.4-0.6 ms) took 0.33-0.48x the graph step's, which puts the
    break-even there, estimated, at 1000-2500 updates. The rest of the rule follows the bench
    (``python -m heatinv.bench ... --steps-per-execution 25``, the benchmark page, 2 CPU
    cores, epsilon_gamma_box):

    - batch 1: the mlp's updates compiled into one XLA loop took 0.31-0.53x the time of the
      graph loop on both CPUs, with oneDNN's kernels or without. The bench cnn's graph loop
      around its XLA update took 0.47-0.69x the graph loop's time on the Intel Xeon, where
      oneDNN is on by default, and 0.78x on the AMD EPYC with ``TF_ENABLE_ONEDNN_OPTS=1``,
      but 1.2-1.65x there by default, without oneDNN, whose graph step was the fastest of
      the four (3.1 ms per update, 5.0 with oneDNN, XLA 3.9-4.0 either way): oneDNN's
      kernels cost more per call at batch 1 (as whole runs, under oneDNN on the AMD EPYC,
      the cnn's XLA repaid its 4.8-5.4 s of compiling only after about 4000 updates, so the
      run-length bound, set on the mlp, is short for it there: the benchmark page, "The main job and
      ``trainer.jit_compile=auto``"). VGG16 at 32x32 (15M weights) took 2.8x the
      time for its heatmap with XLA (the Intel Xeon), hence the size bound, which lies
      between the cnn's 20k weights and VGG16's;
    - larger batches, which only ``task=dataset`` runs, one update per call: the mlp's XLA
      update took 1.08x / 0.89x the time of the graph's at batch 64 / 256 (no clear gain),
      the cnn's 1.58x / 1.76x (``--variants compiled,compiled_xla``, 2026-12-03; the
      mlp's loops of 25 updates, which no task runs at these batches, 0.65-0.82x); as a
      user runs it, ``experiment=pattern_frame_mlp`` (440 updates at batch 64) spent
      1.4-1.6x the loop's time with XLA, its compiling included;
    - models with merges (ResNet50, MobileNetV2): their heatmaps took 2-7x the time with XLA
      at batch 1.

    ``steps_per_execution`` only names the loop in ``why``. The run's length is checked
    last, so ``why`` names it only where it decides.

    Examples:
        >>> auto_mode(LRP(build_model(Architecture("mlp"))), batch=1, steps_per_execution=25)  # doctest: +SKIP
        ('xla', 'batch 1, a chain of layers, 25 updates per call')
        >>> auto_mode(LRP(build_model(Architecture("mlp"))), batch=1, steps_per_execution=25, updates=300)  # doctest: +SKIP
        ('function', "300 updates, fewer than the 1500 that repay XLA's compiling, 25 updates per call")
    """
    calls = f"{steps_per_execution} update{'s' if steps_per_execution > 1 else ''} per call"
    if any(isinstance(step, Merge) for step in explainer.steps):
        return "function", f"a model with merges, {calls}"
    if batch != 1:
        return "function", f"batch {batch}, {calls}"
    convolutional = _convolutional(explainer)
    if convolutional:
        weights = explainer.model.count_params()
        if weights > XLA_MAX_CONV_WEIGHTS:
            return "function", f"a convolutional model of {weights} weights, {calls}"
        onednn = onednn_enabled()
        if not onednn:
            state = "TensorFlow's oneDNN kernels off" if onednn is False else "oneDNN's state unknown"
            return "function", f"a convolutional model, {state}, {calls}"
    if updates is not None and updates < XLA_MIN_UPDATES:
        return "function", f"{updates} updates, fewer than the {XLA_MIN_UPDATES} that repay XLA's compiling, {calls}"
    kind = "a convolutional chain under oneDNN's kernels" if convolutional else "a chain of layers"
    return "xla", f"batch 1, {kind}, {calls}"


def compile_step(
    student: keras.Model,
    explainer: LRP,
    objective: Objective,
    optimizer: keras.optimizers.Optimizer,
    mode: str = "function",
    steps_per_execution: int = 1,
    *,
    xla_loop: bool | None = None,
    batch: int | None = None,
    updates: int | None = None,
) -> CompiledStep:
    """``step(x, label, target, *extra, steps=None)``: :func:`update` run eagerly, as a graph, or with XLA.

    ``mode="auto"`` (``trainer.jit_compile=auto``) picks ``xla`` or ``function`` by
    :func:`auto_mode` for the model, ``batch`` and the run's ``updates`` (None: a run long
    enough for XLA), and falls back to ``function`` when XLA cannot compile the step (see
    :class:`CompiledStep`).

    With ``steps_per_execution=N > 1`` one call runs ``N`` updates inside one compiled
    ``tf.while_loop`` (one dispatch, one host read of the loss per ``N`` steps); in ``xla``
    mode the loop runs inside the XLA program (``xla_loop=True``, the default for models
    without convolutions or pooling) or in the graph around the XLA-compiled update (``False``, the
    default for convolutional models); see :class:`CompiledStep`. The optimizer's variables
    are built first, so the first trace creates none.

    Examples:
        >>> step = compile_step(model, LRP(model), HeatmapMatch(heatmap_loss("mse")), keras.optimizers.Adam(),
        ...                     "xla", steps_per_execution=25)  # doctest: +SKIP
        >>> for n, done, log in schedule(300, 25, log_every=25):  # doctest: +SKIP
        ...     result = step(x, label, target, steps=n)   # n updates, one dispatch
        ...     loss = float(result["loss"])               # the last update's loss
    """
    if mode not in MODES:
        raise ValueError(f"Unknown step mode {mode!r}; expected one of {list(MODES)}.")
    if int(steps_per_execution) != steps_per_execution or steps_per_execution < 1:
        raise ValueError(f"steps_per_execution must be a positive integer, got {steps_per_execution!r}.")
    optimizer.build(student.trainable_variables)
    why, fallback = {"xla": "trainer.jit_compile=true", "function": "trainer.jit_compile=false"}.get(mode, mode), False
    if mode == "auto":
        if batch is None:
            raise ValueError("mode='auto' needs the batch size (batch=...): the rule depends on it.")
        mode, reason = auto_mode(explainer, batch, int(steps_per_execution), updates)
        why, fallback = f"trainer.jit_compile=auto: {reason}", True
    return CompiledStep(student, explainer, objective, optimizer, mode, int(steps_per_execution), xla_loop, why, fallback)


def mode_for(jit_compile) -> str:
    """The step mode of a ``trainer.jit_compile`` value: ``"auto"``, ``"xla"`` (true) or ``"function"`` (false).

    Examples:
        >>> [mode_for(v) for v in ("auto", True, False)]
        ['auto', 'xla', 'function']
    """
    return "auto" if jit_compile == "auto" else ("xla" if jit_compile else "function")


def schedule(total: int, steps_per_execution: int, log_every: int, start: int = 0) -> Iterator[tuple[int, int, bool]]:
    """``(steps, done, log)`` per call: run ``steps`` updates, ``done`` of ``total`` after it.

    Calls never cross a log step (step 1, every multiple of ``log_every``, and the last),
    so ``log_every`` need not be a multiple of ``steps_per_execution``; ``log`` says the
    call ends on one. ``start`` is the number of steps already done (a resumed run).

    Examples:
        >>> list(schedule(7, 4, log_every=5))
        [(1, 1, True), (4, 5, True), (2, 7, True)]
        >>> list(schedule(10, 3, log_every=100))
        [(1, 1, True), (3, 4, False), (3, 7, False), (3, 10, True)]
    """
    if total < 0 or steps_per_execution < 1 or log_every < 1:
        raise ValueError(f"need total >= 0, steps_per_execution >= 1, log_every >= 1; got {total}, {steps_per_execution}, {log_every}.")
    done = start
    while done < total:
        next_log = 1 if done == 0 else min(total, (done // log_every + 1) * log_every)
        steps = min(steps_per_execution, next_log - done)
        done += steps
        yield steps, done, done == next_log


def make_optimizer(name: str, lr, momentum: float = 0.0, global_clipnorm: float | None = None) -> keras.optimizers.Optimizer:
    """``adam`` or ``sgd`` (with momentum); ``global_clipnorm`` rescales each update's gradients to that global norm at most.

    Clipping takes Keras's own update instead of the fused kernels (:func:`fused_kind`).

    Examples:
        >>> make_optimizer("adam", 1e-3, global_clipnorm=1.0).global_clipnorm
        1.0
    """
    if name == "adam":
        return keras.optimizers.Adam(lr, global_clipnorm=global_clipnorm)
    if name == "sgd":
        return keras.optimizers.SGD(lr, momentum=momentum, global_clipnorm=global_clipnorm)
    raise ValueError(f"Unknown optimizer {name!r}; expected 'adam' or 'sgd'.")


def optimizer_from(settings, lr=None) -> keras.optimizers.Optimizer:
    """:func:`make_optimizer` from the ``optimizer`` config group; ``lr`` (e.g. a schedule) replaces ``settings.lr``."""
    return make_optimizer(settings.name, settings.lr if lr is None else lr, settings.momentum, settings.global_clipnorm)
