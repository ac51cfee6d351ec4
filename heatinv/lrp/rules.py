"""LRP rules, each a pure function of (inputs, weights, relevance) written like its formula.

A linear layer is given to a rule as a :class:`LinearMap`: ``layer.affine(x, W, b)`` is the
layer's own map (a matrix product for Dense, a convolution for Conv) evaluated with whatever
kernel and bias the rule chooses, and ``layer.transpose(s, W, x)`` its adjoint ``W^T s``
(a transposed matrix product or a transposed convolution). So one rule serves dense and
convolutional layers alike. Every operation is an ordinary TensorFlow op, differentiable
twice, except the stabilized division (:func:`stabilized_ratio`), whose gradient is written
out to be cheaper, itself of ordinary ops. Max pooling's rule, winner takes all, is
:mod:`heatinv.lrp.max_pool`.

Rules that start from the layer's own ``z`` take ``product=a W`` from the forward pass, which
has computed it already (the largest product of the rule, and its gradient, done once). The
rules that split ``a W`` by the kernel's sign take ``positive=a W+`` from it too where the
forward pass computed it with ``a W`` as one map (:func:`heatinv.lrp.propagate.forward`).

Notation in the docstrings: ``a`` the layer input, ``z = a W + b`` its pre-activation,
``R`` the relevance of the layer's outputs, ``x+ = max(x, 0)``, ``x- = min(x, 0)``, and
``stab(z) = z + eps * sign(z)`` with ``sign(0) = +1``.

Reference: G. Montavon, A. Binder, S. Lapuschkin, W. Samek, K.-R. Müller,
"Layer-Wise Relevance Propagation: An Overview", in Explainable AI, LNCS 11700, 2019.
Rules with several terms follow the conventions of Zennit (Anders et al., 2021), so a
model explained with the matching Zennit composite gives the same heatmap.
"""

from __future__ import annotations

import functools
from typing import Callable, Protocol

import numpy as np
import tensorflow as tf

from heatinv.lrp import einsum


STABILIZER = 1e-6
"""The epsilon every rule except ``epsilon`` uses only to keep its divisions finite."""

ZERO_STABILIZER = 1e-12
"""LRP-0's stabilizer: small enough to leave the rule unchanged, large enough that 0/0 is 0."""


class LinearMap(Protocol):
    """A Dense or Conv layer's linear map, with any kernel and bias a rule substitutes."""

    def affine(self, x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor | None) -> tf.Tensor:
        """``x W + b`` (``b`` may be None)."""

    def transpose(self, s, kernel, like: tf.Tensor) -> tf.Tensor:
        """``W^T s``, shaped like the layer input ``like``; where ``stackable``, ``s`` and ``kernel``
        may be lists of one length, for ``sum_j K_j^T s_j`` computed as one map, or ``kernel``
        alone a list, for the list ``[K_j^T s for each j]``."""


class Rule(Protocol):
    """A rule bound to its parameters: ``rule(a, kernel, bias, relevance, layer) -> relevance``."""

    name: str
    takes_sign: bool
    """Whether the rule takes ``nonnegative=True`` (the input is ``>= 0``) to skip its ``a-`` terms."""
    takes_product: bool
    """Whether the rule takes ``product=a W`` (the forward pass's, so it is not computed twice)."""
    takes_rectified: bool
    """Whether the rule takes ``rectified=True`` (``R`` is zero where ``z <= 0``) to skip its ``z < 0`` terms."""
    takes_positive: bool
    """Whether the rule takes ``positive=a W+`` (the forward pass's) when it also takes ``nonnegative=True``."""

    def __call__(
        self, a: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, relevance: tf.Tensor, layer: LinearMap
    ) -> tf.Tensor: ...


def stabilize(z: tf.Tensor, epsilon: float) -> tf.Tensor:
    """``z + epsilon * sign(z)`` with ``sign(0) = +1``: never zero, and finite gradients.

    Unlike ``tf.where(z != 0, r / z, 0)``, whose gradient is NaN wherever ``z == 0``, this
    keeps both the value and its derivatives finite.

    Examples:
        >>> stabilize(tf.constant([-1.0, 0.0, 2.0]), 0.5).numpy()
        array([-1.5,  0.5,  2.5], dtype=float32)
    """
    epsilon = tf.convert_to_tensor(epsilon, dtype=z.dtype)
    # +-epsilon from a 0/1 mask, exactly (2 eps - eps = eps): on a CPU a third faster than a
    # select between two scalars, and nothing for the gradient to go through but the sum.
    return z + (tf.cast(z >= 0, z.dtype) * (2 * epsilon) - epsilon)


def stabilized_ratio(relevance: tf.Tensor, z: tf.Tensor, epsilon: float) -> tf.Tensor:
    """``R / stab(z)``, for ``R`` and ``z`` of one shape.

    Its gradient is written out, ``dR = g / stab(z)`` and ``dz = -dR * s``: two element-wise
    ops where TensorFlow's gradient of a division takes five, and no reduction to undo a
    broadcast (on the cnn's inverse step the divisions' gradients were a tenth of the time).

    Examples:
        >>> stabilized_ratio(tf.constant([1.0, 1.0]), tf.constant([-1.0, 0.0]), 0.5).numpy()
        array([-0.6666667,  2.       ], dtype=float32)
    """
    if not relevance.shape.is_compatible_with(z.shape):
        raise ValueError(f"stabilized_ratio divides tensors of one shape; got {relevance.shape} and {z.shape}.")
    return _ratio(relevance, stabilize(z, epsilon))


@tf.custom_gradient
def _ratio(numerator: tf.Tensor, denominator: tf.Tensor):
    quotient = numerator / denominator

    def gradient(g):
        to_numerator = g / denominator
        return to_numerator, -to_numerator * quotient

    return quotient, gradient


def adjoint(fn: Callable[[tf.Tensor], tf.Tensor], x: tf.Tensor, cotangent: tf.Tensor) -> tf.Tensor:
    """The vector-Jacobian product ``J_fn(x)^T cotangent``; for a linear ``fn`` it is ``W^T s``.

    Used for pooling; the inner tape records ordinary gradient ops (``AvgPoolGrad``,
    ``MaxPoolGrad``), which an outer tape differentiates again.
    """
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x, output_gradients=cotangent)


def _split_contributions(
    a: tf.Tensor,
    relevance: tf.Tensor,
    layer: LinearMap,
    kernel_for_positive_inputs: tf.Tensor,
    kernel_for_negative_inputs: tf.Tensor,
    bias: tf.Tensor,
    stabilizer: float,
) -> tf.Tensor:
    """One term of the sign-split rules: ``z = a+ W1 + b + a- W2``, ``R_in = (a+ W1^T + a- W2^T) R/stab(z)``."""
    a_pos, a_neg = tf.maximum(a, 0.0), tf.minimum(a, 0.0)
    kernels = [kernel_for_positive_inputs, kernel_for_negative_inputs]
    z = affine_sum(layer, [a_pos, a_neg], kernels) + bias
    s = stabilized_ratio(relevance, z, stabilizer)
    to_positive, to_negative = transpose_each(layer, s, kernels, a)
    return a_pos * to_positive + a_neg * to_negative


def stacks(layer: LinearMap, kernel: tf.Tensor, x: tf.Tensor | None) -> bool:
    """Whether a rule's several maps of ``layer`` on input ``x`` run as one, kernels side by side.

    Where the layer allows (``layer.stackable``) and a kernel is no larger than the input's
    positions can carry: stacking saves a pass over the activations but writes the kernels
    side by side on every call, which costs more where one output's taps (``kh * kw * C_in``)
    outnumber the input's positions per example. VGG16 at 32x32 (512 channels at 2x2):
    ``epsilon_alpha2_beta1``'s heatmap at batch 16 took 3.2 s stacked, 1.9 s with those
    layers unstacked, on a 2-core AMD EPYC; the cnn's layers (9 and 144 taps at 784 and 196
    positions) stay stacked, 0.99-1.02x either way there.

    Examples:
        >>> class Conv:
        ...     stackable = True
        >>> stacks(Conv(), tf.zeros([3, 3, 16, 32]), tf.zeros([1, 14, 14, 16])), stacks(Conv(), tf.zeros([3, 3, 512, 512]), tf.zeros([1, 2, 2, 512]))
        (True, False)
    """
    if not getattr(layer, "stackable", False):
        return False
    positions = None if x is None else x.shape[1:-1].num_elements()
    return positions is None or kernel.shape[:-1].num_elements() <= positions


def transpose_sum(layer: LinearMap, cotangents: list, kernels: list, like: tf.Tensor) -> tf.Tensor:
    """``sum_j K_j^T s_j``: one transposed map, given the pairs, where the layer allows.

    Examples:
        >>> class Dense:
        ...     stackable = True
        ...     def transpose(self, s, kernel, like): return tf.concat(s, -1) @ tf.transpose(tf.concat(kernel, -1))
        >>> float(transpose_sum(Dense(), [tf.ones([1, 1])] * 2, [tf.ones([2, 1]), 2 * tf.ones([2, 1])], None)[0, 0])
        3.0
    """
    if not stacks(layer, kernels[0], like):
        return tf.add_n([layer.transpose(s, kernel, like) for s, kernel in zip(cotangents, kernels)])
    return layer.transpose(list(cotangents), list(kernels), like)


def affine_sum(layer: LinearMap, inputs: list, kernels: list) -> tf.Tensor:
    """``sum_i x_i K_i`` (no bias): one map over the inputs side by side where the layer allows.

    Examples:
        >>> class Dense:
        ...     stackable = True
        ...     def affine(self, x, kernel, bias): return x @ kernel
        >>> float(affine_sum(Dense(), [tf.ones([1, 2]), 2 * tf.ones([1, 2])], [tf.ones([2, 1]), tf.ones([2, 1])])[0, 0])
        6.0
    """
    if not stacks(layer, kernels[0], inputs[0]):
        return tf.add_n([layer.affine(x, kernel, None) for x, kernel in zip(inputs, kernels)])
    return layer.affine(tf.concat(inputs, axis=-1), tf.concat(kernels, axis=-2), None)


def transpose_each(layer: LinearMap, s: tf.Tensor, kernels: list, like: tf.Tensor) -> list[tf.Tensor]:
    """``[K_i^T s for each i]``, each shaped like ``like``: one transposed map where the layer allows.

    Examples:
        >>> class Dense:
        ...     stackable = True
        ...     def transpose(self, s, kernel, like):
        ...         if isinstance(kernel, list):
        ...             return tf.split(s @ tf.transpose(tf.concat(kernel, 0)), len(kernel), axis=-1)
        ...         return s @ tf.transpose(kernel)
        >>> [float(g[0, 0]) for g in transpose_each(Dense(), tf.ones([1, 1]), [tf.ones([1, 1]), -tf.ones([1, 1])], None)]
        [1.0, -1.0]
    """
    if not stacks(layer, kernels[0], like):
        return [layer.transpose(s, kernel, like) for kernel in kernels]
    return layer.transpose(s, list(kernels), like)


def epsilon(a, kernel, bias, relevance, layer, *, epsilon: float = 1e-6, product: tf.Tensor | None = None):
    """LRP-epsilon (Bach et al. 2015): ``R_in = a * W^T (R / stab(a W + b))``. Dense layers."""
    s = stabilized_ratio(relevance, _product(a, kernel, layer, product) + bias, epsilon)
    return a * layer.transpose(s, kernel, a)


def zero(a, kernel, bias, relevance, layer, *, product: tf.Tensor | None = None):
    """LRP-0 (Bach et al. 2015): epsilon with a vanishing epsilon; upper layers."""
    return epsilon(a, kernel, bias, relevance, layer, epsilon=ZERO_STABILIZER, product=product)


def _product(a: tf.Tensor, kernel: tf.Tensor, layer: LinearMap, product: tf.Tensor | None) -> tf.Tensor:
    """``a K`` (``a W``, or ``a W+``): the forward pass's when given, else computed."""
    return layer.affine(a, kernel, None) if product is None else product


def alpha_beta(
    a, kernel, bias, relevance, layer, *, alpha: float = 2.0, beta: float = 1.0, nonnegative: bool = False,
    product: tf.Tensor | None = None, positive: tf.Tensor | None = None,
):
    """LRP-alpha-beta (Bach et al. 2015): ``alpha * R_positive - beta * R_negative``; conv layers.

    The positive part uses ``z+ = a+ W+ + b+ + a- W-``, the negative ``z- = a+ W- + b- + a- W+``.
    ``alpha=1, beta=0`` is the z+ rule. ``nonnegative``: the input is ``>= 0`` by construction
    (a ReLU output), so ``a- = 0`` and its terms are skipped; ``positive``: ``a W+``, if computed.
    """
    w_pos, w_neg = tf.maximum(kernel, 0.0), tf.minimum(kernel, 0.0)
    b_pos, b_neg = tf.maximum(bias, 0.0), tf.minimum(bias, 0.0)
    if nonnegative:
        # z+ = a W+ + b+ >= 0 term by term, so stab(z+) = z+ + eps: the stabilizer joins the
        # bias. alpha and -beta scale the kernels of the transposed maps, not the ratios:
        # kernel-sized products instead of passes over the activations.
        positive = _product(a, w_pos, layer, positive)
        s_pos = _ratio(relevance, positive + (b_pos + STABILIZER))
        if beta == 0:
            return a * layer.transpose(s_pos, _scaled(alpha, w_pos), a)
        # a >= 0: a W- = a W - a W+, so one map on top of the forward pass's a W.
        s_neg = stabilized_ratio(relevance, _product(a, kernel, layer, product) - positive + b_neg, STABILIZER)
        return a * transpose_sum(layer, [s_pos, s_neg], [_scaled(alpha, w_pos), _scaled(-beta, w_neg)], a)
    positive = _split_contributions(a, relevance, layer, w_pos, w_neg, b_pos, STABILIZER)
    if beta == 0:
        return alpha * positive
    negative = _split_contributions(a, relevance, layer, w_neg, w_pos, b_neg, STABILIZER)
    return alpha * positive - beta * negative


def _scaled(factor: float, kernel: tf.Tensor) -> tf.Tensor:
    """``factor * kernel``, without an op where the factor is 1."""
    return kernel if factor == 1 else factor * kernel


def gamma(
    a, kernel, bias, relevance, layer, *, gamma: float = 0.25, nonnegative: bool = False, rectified: bool = False,
    product: tf.Tensor | None = None, positive: tf.Tensor | None = None,
):
    """LRP-gamma (Montavon et al. 2019, generalized to signed inputs): favours positive evidence.

    Outputs with ``z > 0`` redistribute with ``W + gamma W+`` on positive inputs (and
    ``W + gamma W-`` on negative ones), outputs with ``z < 0`` the other way round;
    biases become ``b + gamma b+`` and ``b + gamma b-``. Conv layers. ``nonnegative``: the
    input is ``>= 0`` by construction (a ReLU output), so ``a- = 0`` and its terms are skipped.
    ``rectified``: ``R`` is zero wherever ``z <= 0`` by construction (the layer's ReLU is off
    there and every rule above scales relevance by its input), so the ``z < 0`` terms, which
    would redistribute zeros, are skipped. ``positive``: ``a W+``, if computed.
    """
    w_pos = tf.maximum(kernel, 0.0)
    up = kernel + gamma * w_pos
    down = kernel + gamma * tf.minimum(kernel, 0.0)
    bias_up = bias + gamma * tf.maximum(bias, 0.0)
    bias_down = bias + gamma * tf.minimum(bias, 0.0)
    if rectified:  # R = 0 where z <= 0: only the z > 0 outputs, with W + gamma W+ on a+
        if nonnegative:
            # z_up = a (W + gamma W+) + b_up: from the forward pass's a W and a W+ where it
            # computed both as one map, else as one map of its own (not a W+ next to a W).
            if positive is None:
                z_up = layer.affine(a, up, bias_up)
            else:
                z_up = _product(a, kernel, layer, product) + gamma * positive + bias_up
            return a * layer.transpose(stabilized_ratio(relevance, z_up, STABILIZER), up, a)
        return _split_contributions(a, relevance, layer, up, down, bias_up, STABILIZER)
    product = _product(a, kernel, layer, product)
    z = product + bias
    if nonnegative:
        # a >= 0 splits a W into a W+ >= 0 and a W- = a W - a W+ <= 0: one map on top of the
        # forward pass's. z_up = a (W + gamma W+) + b_up, z_down = a (W + gamma W-) + b_down.
        # Each output takes one side, so one ratio serves both: z_up where z > 0, z_down
        # elsewhere (R masked to 0 where z = 0), split again for the two kernels. One
        # denominator and one quotient kept for the gradient instead of two of each: on
        # ResNet50's wide convs before each sum these were the inverse step's largest tensors.
        positive = _product(a, w_pos, layer, positive)
        up_side = z > 0
        z_side = product + gamma * tf.where(up_side, positive, product - positive) + tf.where(up_side, bias_up, bias_down)
        s = stabilized_ratio(tf.where(up_side | (z < 0), relevance, tf.zeros_like(relevance)), z_side, STABILIZER)
        return a * sided_transpose(layer, s, up_side, up, down, a)
    r_pos = tf.where(z > 0, relevance, tf.zeros_like(relevance))
    r_neg = tf.where(z < 0, relevance, tf.zeros_like(relevance))
    return _split_contributions(a, r_pos, layer, up, down, bias_up, STABILIZER) + _split_contributions(
        a, r_neg, layer, down, up, bias_down, STABILIZER
    )


def sided_transpose(layer: LinearMap, s: tf.Tensor, up_side: tf.Tensor, up: tf.Tensor, down: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """``up^T (s where up_side) + down^T (s elsewhere)``: the gamma rule's two sides, one transposed map.

    The two masked copies of ``s`` are made again in the gradient, once it arrives, from ``s``
    (kept anyway: the ratio's quotient) and the mask, instead of being kept from the relevance
    pass: ResNet50's inverse step at 224x224, batch 8, took 1,685 MiB keeping them, 1,423 MiB
    without (on its widest layers they are two tensors of the output's size each).

    Examples:
        >>> class Dense:
        ...     stackable = False
        ...     def transpose(self, s, kernel, like): return s @ tf.transpose(kernel)
        >>> float(sided_transpose(Dense(), tf.constant([[1.0, 1.0]]), tf.constant([[True, False]]),
        ...                       tf.constant([[2.0, 0.0]]), tf.constant([[0.0, 3.0]]), None)[0, 0])
        5.0
    """

    def sides(s):
        zeros = tf.zeros_like(s)
        return [tf.where(up_side, s, zeros), tf.where(up_side, zeros, s)]

    @tf.custom_gradient
    def transposed(s, up, down):
        def gradient(g):
            with tf.control_dependencies([g]):
                again = tf.identity(s)
            with tf.GradientTape() as tape:
                tape.watch([again, up, down])
                out = transpose_sum(layer, sides(again), [up, down], like)
            return tape.gradient(out, [again, up, down], output_gradients=g)

        return transpose_sum(layer, sides(s), [up, down], like), gradient

    return transposed(s, up, down)


def zbox(a, kernel, bias, relevance, layer, *, low: float = 0.0, high: float = 1.0, product: tf.Tensor | None = None):
    """LRP-z^B (Montavon et al. 2017) for inputs boxed in ``[low, high]``; the first layer.

    ``z = a W - l W+ - h W-``, ``R_in = (a W^T - l W+^T - h W-^T) R / stab(z)``.
    """
    w_pos, w_neg = tf.maximum(kernel, 0.0), tf.minimum(kernel, 0.0)
    # z = a W + (-l) W+ + (-h) W-, one (input, kernel) pair per term. A bound known to be zero
    # when tracing (a number: low = 0 for images in [0, 1]) adds exactly zero to z and to R_in,
    # so its term is skipped. The bounds are the same for every example: their products are
    # computed for one and broadcast.
    inputs, kernels = [a], [kernel]
    for name, bound, bound_kernel in (("low", low, w_pos), ("high", high, w_neg)):
        if not known_zero(bound):
            inputs.append(-box_bound(bound, a, name))
            kernels.append(bound_kernel)
    z = _product(a, kernel, layer, product)
    if len(inputs) > 1:
        z = z + affine_sum(layer, inputs[1:], kernels[1:])
    s = stabilized_ratio(relevance, z, STABILIZER)
    # R_in = a W^T s + (-l) W+^T s + (-h) W-^T s
    return tf.add_n([x * to_x for x, to_x in zip(inputs, transpose_each(layer, s, kernels, a))])


def known_zero(bound) -> bool:
    """Whether ``bound`` is a number or array (not a tensor) that is zero everywhere.

    Examples:
        >>> known_zero(0.0), known_zero(np.zeros(3)), known_zero(1.0), known_zero(tf.zeros([3]))
        (True, True, False, False)
    """
    return bound is not None and not tf.is_tensor(bound) and not np.any(bound)


def box_bound(bound, like: tf.Tensor, name: str) -> tf.Tensor:
    """A z^B bound (a number, or an array that broadcasts to one input: per pixel or channel) shaped like ``like[:1]``.

    Raises:
        ValueError: the bound (``name``: ``low`` or ``high``) does not broadcast to one input.
    """
    example, given = (1, *like.shape[1:]), tuple(np.shape(bound))
    try:
        fits = None in example or None in given or np.broadcast_shapes(given, example) == example  # unknown sizes: not checked
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"LRP-z^B's {name} has shape {np.shape(bound)}, which does not broadcast to one input of shape "
            f"{example[1:]}: give a number, one value per channel ({example[-1]},) or one per input value {example[1:]}."
        )
    return tf.convert_to_tensor(bound, dtype=like.dtype) + tf.zeros_like(like[:1])


UNSCALED_RULES = ("flat", "wsquare", "zbox")
"""The rules that can give an input of 0 relevance: flat and w^2 ignore the input, z^B's bound terms do not scale with it."""


def flat(a, kernel, bias, relevance, layer):
    """LRP-flat (Lapuschkin et al. 2019): relevance spread evenly over each receptive field."""
    ones, ones_kernel = tf.ones_like(a), tf.ones_like(kernel)
    s = stabilized_ratio(relevance, layer.affine(ones, ones_kernel, None), STABILIZER)
    return layer.transpose(s, ones_kernel, a)


def wsquare(a, kernel, bias, relevance, layer):
    """LRP-w^2 (Montavon et al. 2017): ``R_in = W²^T R / stab(1 W² + b²)``; unbounded inputs."""
    ones, squared = tf.ones_like(a), tf.square(kernel)
    s = stabilized_ratio(relevance, layer.affine(ones, squared, tf.square(bias)), STABILIZER)
    return layer.transpose(s, squared, a)


def zplus(a, kernel, bias, relevance, layer, *, nonnegative: bool = False, positive: tf.Tensor | None = None):
    """LRP-z+ (Montavon et al. 2017): alpha-beta with alpha=1, beta=0; conv layers."""
    return alpha_beta(a, kernel, bias, relevance, layer, alpha=1.0, beta=0.0, nonnegative=nonnegative, positive=positive)


def _check_epsilon(epsilon: float) -> None:
    if not epsilon >= 0:
        raise ValueError(f"LRP-epsilon needs epsilon >= 0, got epsilon={epsilon!r}.")


def _check_alpha_beta(alpha: float, beta: float) -> None:
    if alpha < 0 or beta < 0 or abs(alpha - beta - 1.0) > 1e-12:
        raise ValueError(
            f"LRP-alpha-beta needs alpha >= 0, beta >= 0 and alpha - beta = 1 (so relevance is "
            f"conserved); got alpha={alpha!r}, beta={beta!r}. Common choices: alpha=1, beta=0 (z+) "
            "and alpha=2, beta=1."
        )


def _check_gamma(gamma: float) -> None:
    if not gamma >= 0:
        raise ValueError(f"LRP-gamma needs gamma >= 0, got gamma={gamma!r}; 0 gives LRP-0, 0.25 is usual.")


def _check_box(low, high) -> None:
    if not np.all(np.asarray(low) <= np.asarray(high)):
        raise ValueError(f"LRP-z^B needs low <= high (the input's range), got low={low!r}, high={high!r}.")


# name -> (function, its parameters, a validator for them)
RULES: dict[str, tuple[Callable, tuple[str, ...], Callable | None]] = {
    "zero": (zero, (), None),
    "epsilon": (epsilon, ("epsilon",), _check_epsilon),
    "zplus": (zplus, (), None),
    "alpha_beta": (alpha_beta, ("alpha", "beta"), _check_alpha_beta),
    "gamma": (gamma, ("gamma",), _check_gamma),
    "zbox": (zbox, ("low", "high"), _check_box),
    "flat": (flat, (), None),
    "wsquare": (wsquare, (), None),
}


def make_rule(name: str, **params: float) -> Rule:
    """Bind a rule to its parameters, checking them now rather than inside a traced step.

    Parameters the rule does not take are ignored, so one set of defaults serves a whole
    composite.

    Examples:
        >>> rule = make_rule("alpha_beta", alpha=2.0, beta=1.0, epsilon=1e-6)
        >>> rule.name
        'alpha_beta'
    """
    if name not in RULES:
        raise ValueError(f"Unknown LRP rule {name!r}; expected one of {sorted(RULES)}.")
    fn, keys, check = RULES[name]
    bound = {key: _number(params[key]) for key in keys if key in params}
    if check is not None:
        check(**{key: bound.get(key, _default(fn, key)) for key in keys})
    rule = functools.partial(fn, **bound)
    rule.name = name
    # The sign-split rules can skip their a- terms when told the input is >= 0.
    rule.takes_sign = "nonnegative" in (fn.__kwdefaults__ or {})
    rule.takes_product = "product" in (fn.__kwdefaults__ or {})
    # Rules that split outputs by the sign of z can skip the z < 0 side behind a ReLU.
    rule.takes_rectified = "rectified" in (fn.__kwdefaults__ or {})
    rule.takes_positive = "positive" in (fn.__kwdefaults__ or {})
    return rule


def _number(value) -> float | np.ndarray:
    """A float, or a float64 array for array-valued parameters (zbox bounds per pixel)."""
    array = np.asarray(value, dtype=np.float64)
    return float(array) if array.ndim == 0 else array


def _default(fn: Callable, key: str) -> float:
    return fn.__kwdefaults__[key]


def norm(a: tf.Tensor, relevance: tf.Tensor, pool: Callable[[tf.Tensor], tf.Tensor], stabilizer: float = STABILIZER) -> tf.Tensor:
    """Average pooling as a linear map without weights: ``R_in = a * P^T (R / stab(P a))``."""
    s = stabilized_ratio(relevance, pool(a), stabilizer)
    return a * adjoint(pool, a, s)


# Merge rules: a node that combines several tensors hands each operand its share of ``R``.


def sum_rule(contributions: list[tf.Tensor], relevance: tf.Tensor, stabilizer: float = STABILIZER) -> list[tf.Tensor]:
    """A sum ``z = sum_k x_k`` (Add; Average with ``x_k / n``; Subtract with ``x_1, -x_2``).

    ``R_k = x_k * R / stab(z)``: Zennit's rule for a residual sum (its ``Sum`` layer with the
    ``Norm`` rule). Operands broadcast in the sum get their relevance summed back over the
    broadcast axes.
    """
    s = stabilized_ratio(relevance, tf.add_n([tf.broadcast_to(x, tf.shape(relevance)) for x in contributions]), stabilizer)
    return [unbroadcast(x * s, x) for x in contributions]


def concatenation_rule(operands: list[tf.Tensor], relevance: tf.Tensor, axis: int) -> list[tf.Tensor]:
    """Concatenate: each operand gets the relevance of the positions it filled."""
    return tf.split(relevance, [x.shape[axis] for x in operands], axis=axis)


def product_rule(operands: list[tf.Tensor], relevance: tf.Tensor, gates: tuple[bool, ...]) -> list[tf.Tensor | None]:
    """Multiply: a gate gets nothing (None) and the signal all of ``R``; non-gates share equally.

    ``z = x * g`` with a gate ``g`` (a sigmoid or hard-sigmoid, as in squeeze-and-excitation):
    ``R_x = R``, ``R_g = 0`` ("signal takes all", Arras et al. 2017, LRP for LSTMs). A
    product of ``n`` non-gate operands: ``R_k = R / n`` (the uniform rule of AttnLRP,
    Achtibat et al. 2024). When every operand is a gate they share equally too.
    """
    signals = [not gate for gate in gates] if not all(gates) else [True] * len(operands)
    share = relevance / sum(signals)
    return [unbroadcast(share, x) if signal else None for x, signal in zip(operands, signals)]


def unbroadcast(relevance: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """Sum ``relevance`` over the axes along which ``like`` was broadcast to its shape."""
    if like.shape.rank == relevance.shape.rank and like.shape == relevance.shape:
        return relevance
    extra = relevance.shape.rank - like.shape.rank
    if extra:
        relevance = tf.reduce_sum(relevance, axis=list(range(extra)))
    axes = [axis for axis, size in enumerate(like.shape) if size == 1 and relevance.shape[axis] != 1]
    return tf.reduce_sum(relevance, axis=axes, keepdims=True) if axes else relevance


# Transformer rules: AttnLRP (Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance
# Propagation for Transformers", ICML 2024) and CP-LRP (Ali et al., "XAI for Transformers:
# Better Explanations through Conservative Propagation", ICML 2022).


def layer_norm_rule(
    a: tf.Tensor, relevance: tf.Tensor, scale: tf.Tensor, shift: tf.Tensor | None, centered: bool, stabilizer: float
) -> tf.Tensor:
    """LayerNorm / RMSNorm with ``1 / sigma`` held constant (AttnLRP's identity rule on the division).

    ``z = C(a) * scale + shift``, ``C`` the centering ``a - mean(a)`` over the last axis (the identity
    for RMSNorm), ``scale = gamma / sigma(a)`` taken as a constant of the example: a linear map with
    a bias, explained by LRP-0, ``R_in = a * C^T (scale * R / stab(z))`` (``C`` is symmetric).
    ``shift`` (beta) absorbs its share. Constant only in this rule: ``sigma`` is an ordinary
    tensor of the forward pass, so a tape around the heatmap differentiates through it.
    """
    z = (a - tf.reduce_mean(a, axis=-1, keepdims=True) if centered else a) * scale
    if shift is not None:
        z = z + shift
    back = scale * stabilized_ratio(relevance, z, stabilizer)
    if centered:
        back = back - tf.reduce_mean(back, axis=-1, keepdims=True)
    return a * back


def uniform_rule(
    equation: str, x: tf.Tensor, y: tf.Tensor, relevance: tf.Tensor, stabilizer: float, shares: tuple[float, float] = (0.5, 0.5),
    product: tf.Tensor | None = None,
) -> tuple[tf.Tensor | None, tf.Tensor | None]:
    """A product of two tensors ``z = einsum(equation, x, y)`` (``q k^T``, ``A v``): each factor's LRP-0 share.

    ``R_x = shares[0] * x * J_x^T (R / stab(z))`` with ``J_x`` the product's Jacobian in ``x`` (``y``
    held fixed), and ``R_y`` likewise. AttnLRP's uniform rule gives each factor half
    (``shares=(0.5, 0.5)``); CP-LRP holds the attention weights constant, so ``A v`` gives
    ``v`` all (``(0.0, 1.0)``). A factor with share 0 gets None. ``product``: ``z``, where the
    forward pass has it.
    """
    z = tf.einsum(equation, x, y) if product is None else product
    s = stabilized_ratio(relevance, z, stabilizer)
    to_x = None if shares[0] == 0 else shares[0] * x * einsum.adjoint(equation, s, y, x, operand=0)
    to_y = None if shares[1] == 0 else shares[1] * y * einsum.adjoint(equation, s, x, y, operand=1)
    return to_x, to_y


def softmax_rule(x: tf.Tensor, weights: tf.Tensor, relevance: tf.Tensor, axis: int = -1) -> tf.Tensor:
    """AttnLRP's softmax rule: ``R_in_i = x_i (R_i - s_i sum_j R_j)``, ``s = softmax(x)`` along ``axis``.

    The Taylor decomposition of the softmax at ``x`` (Achtibat et al. 2024, Prop. 3.3), equal to
    gradient times input of the softmax. Not conservative: ``sum_i R_in_i = sum_i R_i - H``
    where ``H`` depends on how far ``x`` is from its weighted mean.
    """
    return x * (relevance - weights * tf.reduce_sum(relevance, axis=axis, keepdims=True))
