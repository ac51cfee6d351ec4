"""Einsum products and their adjoints: EinsumDense's map and the two products of attention.

An einsum ``"x,y->z"`` is linear in each operand. Its adjoint with respect to ``x`` is the
einsum ``"z,y->x"``: the cotangent of ``z`` contracted with the other operand. An index that
appears in ``x`` alone was summed over in the product, so the adjoint is constant along it:
computed without that index and broadcast back. Written as einsums rather than through a
nested tape, so the rules that use them are differentiable again, eagerly, under
``tf.function`` and with XLA.
"""

from __future__ import annotations

import tensorflow as tf


def parse(equation: str) -> tuple[str, str, str]:
    """``"ab,bc->ac"`` as ``("ab", "bc", "ac")``, spaces removed.

    Examples:
        >>> parse("abc,cde->abde")
        ('abc', 'cde', 'abde')
    """
    equation = equation.replace(" ", "")
    if "->" not in equation or equation.count(",") != 1:
        raise ValueError(f"Expected an einsum of two operands with an explicit output, 'x,y->z'; got {equation!r}.")
    operands, output = equation.split("->")
    first, second = operands.split(",")
    return first, second, output


def adjoint(equation: str, cotangent: tf.Tensor, other: tf.Tensor, like: tf.Tensor, operand: int) -> tf.Tensor:
    """The adjoint of ``einsum(equation, x, y)`` in one operand, applied to ``cotangent``.

    Args:
        equation: ``"x,y->z"``.
        cotangent: shaped like the product ``z``.
        other: the operand held fixed (``y`` for ``operand=0``, ``x`` for ``operand=1``).
        like: the operand the adjoint maps to, for its shape.
        operand: 0 for ``x``, 1 for ``y``.

    Returns:
        ``J^T cotangent``, shaped like ``like``.

    Examples:
        >>> x, y = tf.ones([2, 3]), tf.reshape(tf.range(12.0), [3, 4])
        >>> adjoint("ab,bc->ac", tf.ones([2, 4]), y, x, operand=0).numpy()[0].tolist()
        [6.0, 22.0, 38.0]
    """
    first, second, output = parse(equation)
    target, held = (first, second) if operand == 0 else (second, first)
    present = set(output) | set(held)
    kept = "".join(index for index in target if index in present or index == ".")
    if operand == 0:
        result = tf.einsum(f"{output},{held}->{kept}", cotangent, other)
    else:
        result = tf.einsum(f"{held},{output}->{kept}", other, cotangent)
    if kept == target:
        return result
    # Summed-out indices of the target: the adjoint is constant along them.
    labels = [index for index in target if index != "."]
    for axis, index in enumerate(labels):
        if index not in kept:
            result = tf.expand_dims(result, axis)
    return tf.broadcast_to(result, tf.shape(like))
