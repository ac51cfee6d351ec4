"""Walk the step graph: a forward pass that keeps each step's input, then relevance back.

Relevance flows from the explained output down the steps in reverse topological order;
where a tensor feeds several steps, the relevance they hand back to it is summed.

Everything here is plain TensorFlow on the live variables, so the relevance is
differentiable (to any order; first order only with ``recompute``) with respect to the
weights and the input, eagerly, under ``tf.function`` and with XLA.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass, field

import keras
import tensorflow as tf

from heatinv.lrp.attention import Attention
from heatinv.lrp.canonical import (
    Discrete,
    takes_mask,
    Elementwise,
    Embed,
    Linear,
    Merge,
    Normalize,
    Pool,
    Rearrange,
    Reshape,
    Shift,
    Step,
    UnsupportedLayerError,
    output_mask,
)
from heatinv.lrp.composites import Composite
from heatinv.lrp.graph import MODEL_INPUT
from heatinv.lrp.keras_hub import EncoderBlock, PatchEmbedding, Positions, position_table
from heatinv.lrp.llama import DecoderBlock
from heatinv.lrp.max_pool import max_pool_with_mask, winner_takes_all
from heatinv.lrp.rules import (
    UNSCALED_RULES,
    adjoint,
    box_bound,
    concatenation_rule,
    known_zero,
    layer_norm_rule,
    norm,
    product_rule,
    stacks,
    sum_rule,
)
from heatinv.onednn import onednn_enabled

OUTPUTS = ("logit", "activation")

STACKED_PRODUCTS_MIN_BATCH = 4
"""The smallest batch (or an unknown one) whose forward pass computes ``a W+`` with ``a W`` as one map.

Below it the two maps, each small, run faster apart, side by side on two cores: the cnn's
epsilon_gamma_box inverse step took 1.05, 1.04, 0.99 and 0.98 of the time stacked against
apart at batch 1, 2, 4 and 8, and 0.94 at 16 to 256 (2-core AMD EPYC without AVX-512,
oneDNN's kernels off, ``scripts/engine_speed_before_after.py``; the CPU time was the same
at batch 1).
"""


@dataclass
class Forward:
    """What the backward pass needs from the forward pass.

    Attributes:
        inputs: the input of every step, ``inputs[i]`` feeds ``steps[i]`` (a list of
            operands for a Merge step).
        params: (kernel, bias) of every Linear step (BatchNorm folded), else None.
        products: ``a W`` (no bias) of every Linear step, else None: the rules that use it
            take it from here instead of computing the layer's largest product again.
        positives: ``a W+`` by step index, for the steps asked for where computed with
            ``a W`` as one map or on the same patches (:func:`forward`).
        logits: the explained scores, shape ``[batch, classes]``: the pre-activation of the
            last Dense/Conv step (or its reshaped output).
        values: the output of every step, ``values[i]`` from ``steps[i]`` (in a graph the
            next step's input may be another step's output).
        masks: the winners' mask of each max pooling step, by step index, where the forward
            pass found it (:func:`heatinv.lrp.max_pool.max_pool_with_mask`), else None; the
            routing reuses it.
        kept: what each attention, normalization, keras-hub encoder or ViT patching step keeps of
            its forward pass, by step index (:class:`heatinv.lrp.attention.AttentionValues`,
            :class:`heatinv.lrp.keras_hub.EncoderValues`, :meth:`heatinv.lrp.keras_hub.PatchEmbedding.parts`).
        keras_masks: the Keras mask of every step's output (token padding from an
            Embedding with ``mask_zero``) as Keras passes it at run time, None where there is none.
        padding: the mask a masked pooling or softmax step applied, by step index.
        outputs: the model's output (after any final activation): the last step's value.
    """

    inputs: list
    params: list[tuple[tf.Tensor, tf.Tensor] | None]
    products: list[tf.Tensor | None]
    logits: tf.Tensor
    values: list
    masks: dict[int, tf.Tensor | None]
    positives: dict[int, tf.Tensor]
    kept: dict = field(default_factory=dict)
    keras_masks: list = field(default_factory=list)
    padding: dict = field(default_factory=dict)

    @property
    def outputs(self) -> tf.Tensor:
        return self.values[-1]


def forward(steps: list[Step], x: tf.Tensor, positive: Collection[int] = ()) -> Forward:
    """Run the steps in inference mode on ``x``, in ``x``'s dtype.

    ``positive``: Linear steps whose rule will also want ``a W+``
    (:func:`positive_product_steps`). Where the layer stacks kernels
    (:func:`heatinv.lrp.rules.stacks`) and the batch is not small
    (:data:`STACKED_PRODUCTS_MIN_BATCH`), both products come from one map with ``[W, W+]``
    side by side: one pass over the input, forward and in the gradient, instead of two (the
    cnn's inverse step at batch 64 and 256 took 0.94-0.98 of the time with alpha-beta,
    epsilon_plus and epsilon_gamma_box on a 2-core AMD EPYC without AVX-512, oneDNN's kernels
    off; where they run, no step is given). Where the map runs tap by tap
    (:attr:`heatinv.lrp.canonical.Linear.runs_by_taps`), at any batch, both are matrix
    products on the input's patches, taken once.
    """
    top = logit_step(steps)
    inputs, params, products, values = [], [], [], []
    masks, positives, kept, keras_masks, padding = {}, {}, {}, [], {}
    logits = None
    for i, step in enumerate(steps):
        operands = [x if source == MODEL_INPUT else values[source] for source in step.sources]
        given_masks = [None if source == MODEL_INPUT else keras_masks[source] for source in step.sources]
        explicit = [operand for source, operand in zip(step.sources, operands) if _is_discrete(steps, source)]
        if explicit and not isinstance(step, (Discrete, Embed)):  # a mask Keras recorded as the call's argument
            operands = [o for source, o in zip(step.sources, operands) if not _is_discrete(steps, source)]
            given_masks = given_masks[: len(operands)]
        keras_masks.append(output_mask(step, operands, given_masks))
        if isinstance(step, (Merge, Attention, Discrete)):
            inputs.append(operands)
            params.append(None)
            products.append(None)
            if isinstance(step, Attention):
                kept[i] = step.forward(*operands, masks=given_masks)
                values.append(step.output(kept[i]))
                for source in step.sources:
                    # Keras's MultiHeadAttention removes its inputs' masks: a later reader of the
                    # same tensor (the residual sum) sees none.
                    if source != MODEL_INPUT:
                        keras_masks[source] = None
            else:
                values.append(step(*operands))
            continue
        a = operands[0]
        inputs.append(a)
        if isinstance(step, (PatchEmbedding, Normalize)):  # their rules reuse what the forward pass computes
            params.append(None)
            products.append(None)
            kept[i] = step.parts(a)
            values.append(kept[i][1] + kept[i][2] if isinstance(step, PatchEmbedding) else step(a, kept[i]))
            continue
        if isinstance(step, EncoderBlock):
            params.append(None)
            products.append(None)
            kept[i] = step.forward(a, given_masks[0], explicit[0] if explicit else None)
            values.append(step.output(kept[i]))
            if not step.normalize_first and step.sources[0] != MODEL_INPUT:
                keras_masks[step.sources[0]] = None  # its attention read (and unmasked) its input tensor itself
            continue
        if isinstance(step, DecoderBlock):
            params.append(None)
            products.append(None)
            kept[i] = step.forward(a, explicit[0] if explicit else None, given_masks[0])
            values.append(step.output(kept[i]))
            continue
        if isinstance(step, Linear):
            kernel, bias = step.params(a.dtype)
            params.append((kernel, bias))
            batch = a.shape[0]
            if i in positive and (
                step.runs_by_taps or (stacks(step, kernel, a) and (batch is None or batch >= STACKED_PRODUCTS_MIN_BATCH))
            ):
                product, positives[i] = step.affine_each(a, [kernel, tf.maximum(kernel, 0.0)])
                products.append(product)
            else:
                products.append(step.affine(a, kernel, None))
            z = products[-1] + bias
            if i == top:
                logits = z
            values.append(z if step.activation is None else step.activation(z))
        else:
            params.append(None)
            products.append(None)
            if isinstance(step, Pool) and step.kind == "max":
                value, masks[i] = max_pool_with_mask(step, a)
                values.append(value)
            elif isinstance(step, (Pool, Elementwise)) and (explicit or given_masks[0] is not None) and takes_mask(step):
                padding[i] = explicit[0] if explicit else given_masks[0]
                values.append(step(a, mask=padding[i]))
            else:
                values.append(step(a))
            if i == top:
                logits = values[-1]
    return Forward(inputs, params, products, logits, values, masks, positives, kept, keras_masks, padding)


def _is_discrete(steps: list[Step], source: int) -> bool:
    return source != MODEL_INPUT and isinstance(steps[source], Discrete)


def logit_step(steps: list[Step]) -> int:
    """Index of the step whose output holds the logits: the last Dense/Conv step.

    Only activations may follow it, and a Flatten/Reshape when it has no activation of its
    own (a 1x1 convolution classifier, as in MobileNet).
    """
    index = len(steps) - 1
    while isinstance(steps[index], Elementwise) and steps[index].sources[0] != MODEL_INPUT:
        index = steps[index].sources[0]
    linear = index
    while isinstance(steps[linear], Reshape) and steps[linear].sources[0] != MODEL_INPUT:
        linear = steps[linear].sources[0]
    if isinstance(steps[linear], Linear) and (linear == index or steps[linear].activation is None):
        return index
    step = steps[index]
    raise UnsupportedLayerError(
        f"Layer {step.name!r} ({type(step.layer).__name__}) ends the model after its last Dense/Conv "
        "layer; heatinv starts relevance at that layer's output, so only activations (and a "
        "Flatten/Reshape of a layer without activation) may follow it. Add a Dense layer with one "
        "output per class, keras.layers.Dense(classes), after it: the explained score is a class's logit."
    )


def positive_product_steps(steps: list[Step], composite: Composite) -> set[int]:
    """The Linear steps whose rule takes ``a W+`` and gets an input ``>= 0`` by construction.

    None where oneDNN's kernels run (:func:`heatinv.onednn.onednn_enabled`): each rule then
    computes its own maps, and the forward pass's ``a W`` stays a map alone, which oneDNN
    computes faster than one map of ``[W, W+]`` and its split; a rectified gamma rule computes
    ``a (W + gamma W+)`` as one map. On a 2-core AMD EPYC with AVX-512 the cnn's inverse step
    took 0.86-0.96 and 0.93-0.97 of the time at batch 64 and 256 with epsilon_plus,
    0.94-0.97 and 0.97 with epsilon_gamma_box, 0.92-1.00 and 1.00-1.01 with alpha-beta (two
    runs of ``scripts/engine_speed_before_after.py``). With oneDNN's kernels off the one map
    of ``[W, W+]`` is the faster (:func:`forward`).

    A first layer whose input's sign is checked at run time is left out (where the batch has
    negative values, its rule's signed form would not use ``a W+``) unless its map runs tap
    by tap (:attr:`heatinv.lrp.canonical.Linear.runs_by_taps`): there ``a W+`` costs one
    matrix product on the patches ``a W`` takes anyway, and the rule's non-negative form
    takes it. With ``epsilon_alpha2_beta1`` the cnn's inverse step took 0.89 of the time at
    batch 64 and 256 with the map and ``a W+`` both on the patches (2-core AMD EPYC).

    Examples:
        >>> model = keras.Sequential([keras.Input((8, 8, 2)), keras.layers.Conv2D(2, 3, activation="relu"),
        ...                           keras.layers.Conv2D(2, 3), keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> from heatinv.lrp.canonical import canonize
        >>> from heatinv.lrp.composites import resolve
        >>> sorted(positive_product_steps(canonize(model), resolve("epsilon_plus"))) == ([] if onednn_enabled() else [1])
        True
    """
    if onednn_enabled():
        return set()
    first, nonnegative = first_linear_steps(steps), nonnegative_steps(steps)
    return {
        i
        for i, step in enumerate(steps)
        if isinstance(step, Linear)
        and (step.sources[0] in nonnegative or (i in first and step.runs_by_taps))
        and composite.rule_for(step.kind, is_first=i in first).takes_positive
    }


def first_linear_steps(steps: list[Step]) -> set[int]:
    """The Linear steps the model input reaches without crossing another Linear step."""
    reached, first = {MODEL_INPUT}, set()
    for i, step in enumerate(steps):
        if any(source in reached for source in step.sources):
            if isinstance(step, Linear):
                first.add(i)
            elif not isinstance(step, (Embed, Attention, Discrete, EncoderBlock, DecoderBlock, Positions, PatchEmbedding)):  # no first-layer rule beyond
                reached.add(i)
    return first


def nonnegative_steps(steps: list[Step]) -> set[int]:
    """The steps whose output is ``>= 0`` by construction, known from the graph alone.

    A ReLU (any max value, threshold ``>= 0``, no negative slope) or ReLU6 output is
    ``>= 0``, and so is a pooling, reshape, padding, cropping or permutation of such an
    output, and a sum, average, product or concatenation of such outputs. Where a layer's
    input is one of them, ``a- = min(a, 0)`` is exactly zero, so the sign-split rules skip
    its terms: the same values, and the same gradients, since a ReLU's gradient is zero
    wherever its output is.

    Examples:
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"),
        ...                           keras.layers.Dense(2)])
        >>> from heatinv.lrp.canonical import canonize
        >>> sorted(nonnegative_steps(canonize(model)))
        [0]
    """
    nonnegative: set[int] = set()
    for i, step in enumerate(steps):
        from_nonnegative = all(source in nonnegative for source in step.sources)
        if isinstance(step, Linear):
            keeps = step.activation in _RELUS
        elif isinstance(step, Elementwise):
            keeps = step.arguments is None and _is_relu(step.layer)
        elif isinstance(step, (Pool, Reshape, Rearrange)):
            keeps = from_nonnegative
        elif isinstance(step, Merge):
            keeps = step.kind != "subtract" and from_nonnegative
        else:
            keeps = False
        if keeps:
            nonnegative.add(i)
    return nonnegative


_RELUS = (keras.activations.relu, keras.activations.relu6)


def _is_relu(layer) -> bool:
    if isinstance(layer, keras.layers.ReLU):
        return layer.negative_slope == 0 and layer.threshold >= 0
    return isinstance(layer, keras.layers.Activation) and layer.activation in _RELUS


def rectified_steps(steps: list[Step], composite: Composite, start: int) -> set[int]:
    """The Linear steps whose relevance is zero wherever ``z <= 0``, known from the graph alone.

    A rule that scales relevance by its input (every rule but flat, w^2 and z^B), average pooling
    and a sum hand an input of 0 no relevance. Max pooling (its winner holds the output's
    value), reshapes, rearrangements, a concatenation and a ReLU pass relevance on only where
    their output holds the same value (a ReLU: where its output is 0 its input is <= 0). So
    the relevance of a tensor is zero wherever the tensor is, when every step that reads it
    is of the first kind, or of the second kind with that property itself. A Linear step
    whose output is such a tensor through a ReLU (its own activation, or the ReLU layers that
    are its only readers) gets no relevance where ``z <= 0``, and the gamma rule skips its
    ``z < 0`` terms there: the same values and, since the ReLU's gradient is zero there too,
    the same gradients.

    Examples:
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"),
        ...                           keras.layers.Dense(2)])
        >>> from heatinv.lrp.canonical import canonize
        >>> from heatinv.lrp.composites import resolve
        >>> sorted(rectified_steps(canonize(model), resolve("epsilon"), start=1))
        [0]
    """
    first = first_linear_steps(steps)
    readers: dict[int, list[int]] = {i: [] for i in range(len(steps))}
    for i, step in enumerate(steps):
        for source in step.sources:
            if source != MODEL_INPUT:
                readers[source].append(i)

    def zero_for_zero(i: int) -> bool:
        """Whether step ``i`` hands its source no relevance where the source is 0, given ``silent``."""
        step = steps[i]
        if i > start:
            return True  # relevance starts below it: it hands none back
        if isinstance(step, Linear):
            return composite.rule_for(step.kind, is_first=i in first).name not in UNSCALED_RULES
        if isinstance(step, Pool) and step.kind == "average":
            return True
        if isinstance(step, Merge) and step.kind in ("add", "average", "subtract"):
            return True
        passes_on = (
            isinstance(step, (Pool, Reshape, Rearrange))
            or (isinstance(step, Merge) and step.kind == "concatenate")
            or (isinstance(step, Elementwise) and step.arguments is None and _is_relu(step.layer))
        )
        return passes_on and i in silent

    silent: set[int] = set()  # steps whose output's relevance is zero wherever the output is
    for i in range(len(steps) - 1, -1, -1):
        if i != start and all(zero_for_zero(reader) for reader in readers[i]):
            silent.add(i)
    rectified = set()
    for i, step in enumerate(steps):
        if not isinstance(step, Linear) or i == start:
            continue
        if step.activation in _RELUS:
            through_relu = i in silent
        else:
            relus = [r for r in readers[i] if isinstance(steps[r], Elementwise) and steps[r].arguments is None and _is_relu(steps[r].layer)]
            through_relu = step.activation is None and readers[i] and relus == readers[i] and all(r in silent for r in relus)
        if through_relu:
            rectified.add(i)
    return rectified


def carry_bounds(steps: list[Step], x: tf.Tensor, low, high) -> dict[int, tuple]:
    """The input box ``[low, high]`` carried to the input of every first Linear step.

    The bounds, given in the model's input space, pass through the steps before the first
    Dense/Conv layers (Rescaling, Normalization, padding, reshapes): each step maps both
    bounds and the elementwise minimum and maximum of the two images are the new bounds
    (a negative scale swaps them; padding adds zeros to both). Sums and concatenations
    combine the bounds of their operands.

    A bound given as zero (a number or array, e.g. ``low = 0`` for images in ``[0, 1]``)
    reaches a first Linear step as the number ``0.0`` where every step on the way maps zeros
    to zeros (reshapes, padding, cropping, permutations, pooling), so that the zbox rule
    sees when tracing that its term is zero (:func:`heatinv.lrp.rules.known_zero`).

    Returns:
        ``{step index: (low, high)}`` for every first Linear step: tensors shaped like one
        example of that step's input (batch size 1), or ``0.0``.
    """
    # The box is the same for every example: carried at batch size 1, it broadcasts where used.
    box = {MODEL_INPUT: (box_bound(low, x, "low"), box_bound(high, x, "high"))}
    zero = {MODEL_INPUT: (known_zero(low), known_zero(high))}
    at_first = {}
    for i, step in enumerate(steps):
        if not all(source in box for source in step.sources):
            continue
        if isinstance(step, Linear):
            source = step.sources[0]
            at_first[i] = tuple(0.0 if is_zero else bound for bound, is_zero in zip(box[source], zero[source]))
            continue
        if isinstance(step, (PatchEmbedding, EncoderBlock, DecoderBlock, Embed, Discrete, Positions)):
            continue  # holds its first linear layer, or follows one: no bounds are needed past it
        if isinstance(step, (Normalize, Attention)):
            raise UnsupportedLayerError(
                f"{step.name!r} ({type(step.layer).__name__}) comes before the first Dense/Conv layer; the zbox rule "
                "cannot carry its input bounds through a normalization or an attention. Use a composite without zbox "
                "(attnlrp, cp_lrp or epsilon_plus)."
            )
        lows = [box[source][0] for source in step.sources]
        highs = [box[source][1] for source in step.sources]
        if isinstance(step, Merge):
            if step.kind not in ("add", "average", "concatenate"):
                raise UnsupportedLayerError(
                    f"{step.name!r} ({step.kind}) combines tensors before the first Dense/Conv layer; the "
                    "zbox rule cannot carry its input bounds through it. Use a composite without zbox."
                )
            images = step(*lows), step(*highs)
        else:
            images = step(lows[0]), step(highs[0])
        box[i] = (tf.minimum(*images), tf.maximum(*images))
        keeps_zeros = isinstance(step, (Reshape, Rearrange, Pool))
        zero[i] = tuple(keeps_zeros and zero[step.sources[0]][k] for k in (0, 1))
    return at_first


def backward(
    steps: list[Step],
    fwd: Forward,
    relevance: tf.Tensor,
    composite: Composite,
    start: int,
    bounds: dict[int, tuple[tf.Tensor, tf.Tensor]] | None = None,
    recompute: bool = False,
) -> tf.Tensor:
    """Propagate ``relevance`` from the output of ``steps[start]`` down to the input.

    Activations pass relevance unchanged, so relevance of a step's pre-activation (logits)
    and of its activation take the same walk. ``bounds`` (from :func:`carry_bounds`) give
    the zbox rule of each first Linear step its input box. ``recompute``: the conv layers'
    rules keep only their arguments for the gradient and run again in it (:func:`_recomputed`).
    """
    first = first_linear_steps(steps)
    nonnegative = nonnegative_steps(steps)
    rectified = rectified_steps(steps, composite, start)
    bounds = bounds or {}
    pending = {start: relevance}
    for i in range(start, -1, -1):
        if i not in pending:
            continue  # nothing of the explained score flows through this step
        step, a, r = steps[i], fwd.inputs[i], pending.pop(i)
        if isinstance(step, Attention):
            shares = step.relevance(fwd.kept[i], r, composite.dense, composite.attention, composite.stabilizer)
        elif isinstance(step, (EncoderBlock, DecoderBlock)):
            shares = step.relevance(fwd.kept[i], r, composite)
        elif isinstance(step, PatchEmbedding):
            shares = step.relevance(a, fwd.kept[i], r, composite)
        elif isinstance(step, Normalize):
            scale, shift, centered = fwd.kept[i]
            shares = [layer_norm_rule(a, r, scale, shift, centered, composite.stabilizer)]
        else:
            shares = _shares(
                step, a, fwd.params[i], fwd.products[i], r, composite, i in first, bounds.get(i), nonnegative,
                i in rectified, fwd.masks.get(i), fwd.positives.get(i), fwd.padding.get(i), recompute,
            )
        for source, share in zip(step.sources, shares):
            if share is not None:
                pending[source] = pending[source] + share if source in pending else share
    if MODEL_INPUT not in pending:
        return tf.zeros_like(_input_like(steps, fwd))
    return pending[MODEL_INPUT]


def _input_like(steps: list[Step], fwd: Forward) -> tf.Tensor:
    """A tensor shaped like the relevance that reaches the input: the input, or the token vectors where an Embed reads it."""
    first = next(i for i, step in enumerate(steps) if MODEL_INPUT in step.sources)
    if isinstance(steps[first], Embed):
        return fwd.values[first]
    return fwd.inputs[first][0] if isinstance(fwd.inputs[first], list) else fwd.inputs[first]


def _when_relevance_arrives(a: tf.Tensor, relevance: tf.Tensor) -> tf.Tensor:
    """``a``, read only once ``relevance`` exists. A rule's maps of its input (``a W``, ``a W+``) and
    what it makes of the forward pass's products then run as the relevance pass reaches their
    layer. Without the dependency a graph runs each as soon as the forward pass has made its
    operands, and holds every layer's at once: ResNet50's heatmap at 224x224, batch 8, under
    epsilon_gamma_box took 1,566 MiB with none, 1,294 MiB with the input waiting, 1,186 MiB with
    the products waiting too (a training step: 802 MiB)."""
    with tf.control_dependencies([relevance]):
        return tf.identity(a)


def _recomputed(apply, a, kernel, bias, relevance, known: dict) -> tf.Tensor:
    """``apply(a, kernel, bias, relevance, **known)``, its intermediates recomputed for the gradient instead of kept.

    ``tf.recompute_grad`` keeps the arguments only and runs the rule again, under a tape, once
    the gradient reaches it (it makes the recomputation wait for that gradient, in graphs and
    under XLA). The forward pass's products are not passed: kept for the rule, they would stay
    alive until its gradient; recomputed, they cost one map per layer.
    """
    tensors = {name: value for name, value in known.items() if tf.is_tensor(value)}
    constants = {name: value for name, value in known.items() if name not in tensors}
    names = list(tensors)

    @tf.recompute_grad
    def rule(a, kernel, bias, relevance, *values):
        return apply(a, kernel, bias, relevance, **constants, **dict(zip(names, values)))

    return rule(a, kernel, bias, relevance, *tensors.values())


def _checking_the_sign(
    rule, a: tf.Tensor, kernel, bias, relevance: tf.Tensor, step: Linear, known: dict, positive: tf.Tensor | None
) -> tf.Tensor:
    """``rule``'s relevance on a first layer, whose input's sign the graph does not tell.

    A batch that is ``>= 0`` at run time (images in [0, 1]) takes the rule's non-negative
    form, which skips the ``a-`` terms, exactly zero there: with ``epsilon_alpha2_beta1``
    the cnn's inverse step took 0.91-0.93 of the time. Deeper layers whose input is not a
    ReLU's (the linear bottlenecks of MobileNetV2) are left alone: their inputs have both
    signs, and a check would only add its branch to the trace. ``positive``: ``a W+`` from
    the forward pass, for the non-negative form (the signed one splits ``a`` instead).
    """
    nonnegative_known = {**known, "positive": positive} if positive is not None and rule.takes_positive else known
    return tf.cond(
        tf.reduce_all(a >= 0),
        lambda: rule(a, kernel, bias, relevance, step, nonnegative=True, **nonnegative_known),
        lambda: rule(a, kernel, bias, relevance, step, **known),
    )


def _shares(
    step: Step, a, params, product, relevance: tf.Tensor, composite: Composite, is_first: bool, box, nonnegative: set[int],
    rectified: bool, mask: tf.Tensor | None = None, positive: tf.Tensor | None = None, padding: tf.Tensor | None = None,
    recompute: bool = False,
) -> list:
    """The relevance ``step`` hands to each of its sources (None: none); ``padding``: its input's Keras mask."""
    if isinstance(step, Linear):
        kernel, bias = params
        a = _when_relevance_arrives(a, relevance)
        rule = composite.rule_for(step.kind, is_first=is_first)
        # Recomputed where the activations are large and the kernels small: a Dense layer's
        # intermediates are a batch of vectors, and recomputing it would copy its kernel
        # (VGG16's first: 392 MiB) for the gradient.
        recomputed = recompute and step.kind == "conv"
        known = {}
        if rule.takes_product and not recomputed:
            known["product"] = _when_relevance_arrives(product, relevance)
        if box is not None and is_first and composite.first is not None and rule.name == "zbox":
            known.update(low=box[0], high=box[1])
        elif rule.takes_sign and step.sources[0] in nonnegative:
            known["nonnegative"] = True
            if positive is not None and rule.takes_positive:
                known["positive"] = _when_relevance_arrives(positive, relevance)
        if rectified and rule.takes_rectified:
            known["rectified"] = True

        def apply(a, kernel, bias, relevance, **known):
            if rule.takes_sign and is_first and "nonnegative" not in known:
                return _checking_the_sign(rule, a, kernel, bias, relevance, step, known, positive)
            return rule(a, kernel, bias, relevance, step, **known)

        if recomputed:
            return [_recomputed(apply, a, kernel, bias, relevance, known)]
        return [apply(a, kernel, bias, relevance, **known)]
    if isinstance(step, Pool):
        if step.kind == "average":
            pool = step if padding is None else functools.partial(step, mask=padding)
            return [norm(a, relevance, pool, composite.stabilizer)]
        return [winner_takes_all(a, relevance, step, mask)]
    if isinstance(step, Reshape):
        return [tf.reshape(relevance, tf.shape(a))]
    if isinstance(step, Rearrange):
        return [adjoint(step, a, relevance)]
    if isinstance(step, Merge):
        if step.kind == "add":
            return sum_rule(a, relevance, composite.stabilizer)
        if step.kind == "average":
            return sum_rule([x / len(a) for x in a], relevance, composite.stabilizer)
        if step.kind == "subtract":
            return sum_rule([a[0], -a[1]], relevance, composite.stabilizer)
        if step.kind == "concatenate":
            return concatenation_rule(a, relevance, step.axis)
        return product_rule(a, relevance, step.gates)
    if isinstance(step, Shift):
        return sum_rule([a, step.shift(a)], relevance, composite.stabilizer)[:1]
    if isinstance(step, Embed) and step.sources[0] != MODEL_INPUT:
        return [None]  # computed ids (segments): the table absorbs the relevance, as a bias does
    if isinstance(step, Embed) and step.positions is not None:
        vectors = step.lookup(a)
        return sum_rule([vectors, position_table(step.positions, vectors)], relevance, composite.stabilizer)[:1]
    if isinstance(step, Positions):
        return [None]  # its input gives the shape only
    # Elementwise, Affine: relevance passes unchanged; Embed: relevance stops at its vectors.
    return [relevance]
