"""Plain-NumPy reference of LRP on layer graphs (merges, skips, gates), used only by the tests.

Why: the engine walks a Keras functional graph in TensorFlow; this module re-derives the
walk and the merge rules from their formulas, in float64, reading the graph through the
public ``layer.input`` / ``layer.output`` of each layer (every layer called once), so the
tests compare two independent implementations. The linear-layer rules and the convolution
come from :mod:`numpy_lrp`; nothing here imports ``heatinv``.

Conventions (the documented ones of the engine, restated):

* a tensor read by several layers gets the sum of the relevance they hand back;
* Add: ``R_k = x_k R / stab(sum_j x_j)``; Concatenate: split by position;
* Multiply: an operand computed by a sigmoid is a gate and gets nothing, the other operand
  all of ``R`` (summed over the axes it was broadcast along); no gate: ``R / n`` each;
* BatchNormalization right after a Dense/Conv without activation, as its only reader, is
  folded; anywhere else it passes relevance unchanged (so does every activation);
* DepthwiseConv2D is the convolution with the block-diagonal kernel
  ``W[:, :, c, c * m + j] = w[:, :, c, j]``;
* ZeroPadding2D: relevance of the padded border is dropped;
* the ``first`` rule goes to every linear layer the input reaches without crossing another
  one, with the zbox bounds padded with zeros there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from numpy_lrp import STAB, Defaults, Linear, _relu_general, make_rule, resolve_composite, stab, target_mask

Array = np.ndarray

_ACTIVATIONS = {
    "linear": lambda z: z,
    "relu": lambda z: np.maximum(z, 0.0),
    "sigmoid": lambda z: 1.0 / (1.0 + np.exp(-z)),
    "swish": lambda z: z / (1.0 + np.exp(-z)),
    "silu": lambda z: z / (1.0 + np.exp(-z)),
    "tanh": np.tanh,
}


def _activation(fn: Any):
    return _ACTIVATIONS[fn.__name__]


def _block_diagonal(w: Array) -> Array:
    """(kh, kw, C, m) depthwise kernel -> (kh, kw, C, C * m) ordinary kernel."""
    kh, kw, c, m = w.shape
    full = np.zeros((kh, kw, c, c * m))
    for channel in range(c):
        full[:, :, channel, channel * m : (channel + 1) * m] = w[:, :, channel, :]
    return full


class Node:
    """One layer of the reference graph: how to compute it and how relevance leaves it."""

    def __init__(self, layer, sources: list[int]):
        self.layer, self.sources = layer, sources
        self.linear: Linear | None = None
        self.activation = lambda z: z
        self.gate = False


def build(model) -> tuple[list[Node], dict[int, int]]:
    """The model's layers as reference nodes; sources index the node list (-1: the input)."""
    import keras

    L = keras.layers
    where = {id(model.inputs[0]): -1}
    nodes: list[Node] = []
    readers: dict[int, int] = {}  # tensor id -> number of layers reading it
    for layer in model.layers:
        inputs = layer.input if isinstance(layer.input, list) else [layer.input]
        for tensor in inputs:
            readers[id(tensor)] = readers.get(id(tensor), 0) + 1
    for layer in model.layers:
        if isinstance(layer, L.InputLayer):
            continue
        inputs = layer.input if isinstance(layer.input, list) else [layer.input]
        sources = [where[id(t)] for t in inputs]
        if isinstance(layer, (L.Dropout,)):
            where[id(layer.output)] = sources[0]
            continue
        node = Node(layer, sources)
        if isinstance(layer, (L.Dense, L.Conv2D, L.DepthwiseConv2D)):
            w = np.asarray(layer.kernel, np.float64)
            b = np.asarray(layer.bias, np.float64) if layer.use_bias else None
            if isinstance(layer, L.DepthwiseConv2D):
                w = _block_diagonal(w)
            b = np.zeros(w.shape[-1]) if b is None else b
            kind = "dense" if isinstance(layer, L.Dense) else "conv"
            node.linear = Linear(kind, w, b, tuple(layer.strides), layer.padding, tuple(layer.dilation_rate), layer.name) \
                if kind == "conv" else Linear(kind, w, b, name=layer.name)
            node.activation = _activation(layer.activation)
            node.gate = layer.activation.__name__ == "sigmoid"
        elif isinstance(layer, L.BatchNormalization):
            previous = nodes[sources[0]] if sources[0] >= 0 else None
            gamma = np.asarray(layer.gamma, np.float64) if layer.scale else 1.0
            beta = np.asarray(layer.beta, np.float64) if layer.center else 0.0
            scale = gamma / np.sqrt(np.asarray(layer.moving_variance, np.float64) + layer.epsilon)
            shift = beta - np.asarray(layer.moving_mean, np.float64) * scale
            if (previous is not None and previous.linear is not None and previous.layer.activation.__name__ == "linear"
                    and readers[id(layer.input)] == 1 and not getattr(previous, "folded", False)):
                lin = previous.linear
                previous.linear = Linear(lin.kind, lin.w * scale, lin.b * scale + shift, lin.strides, lin.padding,
                                         lin.dilation, lin.name)
                previous.folded = True
                where[id(layer.output)] = sources[0]
                continue
            node.activation = lambda z, s=scale, t=shift: z * s + t
        elif isinstance(layer, L.ReLU):
            mv = None if layer.max_value is None else float(layer.max_value)
            node.activation = _relu_general(mv, float(layer.negative_slope), float(layer.threshold))
        elif isinstance(layer, L.Activation):
            node.activation = _activation(layer.activation)
            node.gate = layer.activation.__name__ == "sigmoid"
        elif not isinstance(layer, (L.Add, L.Concatenate, L.Multiply, L.GlobalAveragePooling2D, L.ZeroPadding2D,
                                    L.Flatten)):
            raise NotImplementedError(type(layer).__name__)
        nodes.append(node)
        where[id(layer.output)] = len(nodes) - 1
    return nodes, where


def _forward_node(node: Node, operands: list[Array]) -> Array:
    import keras

    L, layer = keras.layers, node.layer
    if node.linear is not None:
        return node.activation(node.linear.forward(operands[0]))
    if isinstance(layer, L.Add):
        return sum(operands)
    if isinstance(layer, L.Concatenate):
        return np.concatenate(operands, axis=layer.axis)
    if isinstance(layer, L.Multiply):
        return operands[0] * operands[1]
    if isinstance(layer, L.GlobalAveragePooling2D):
        return operands[0].mean(axis=(1, 2), keepdims=layer.keepdims)
    if isinstance(layer, L.ZeroPadding2D):
        (top, bottom), (left, right) = layer.padding
        return np.pad(operands[0], [(0, 0), (top, bottom), (left, right), (0, 0)])
    if isinstance(layer, L.Flatten):
        return operands[0].reshape(operands[0].shape[0], -1)
    return node.activation(operands[0])


def _unbroadcast(r: Array, like: Array) -> Array:
    axes = tuple(i for i, (n, m) in enumerate(zip(like.shape, r.shape)) if n == 1 and m != 1)
    return r.sum(axis=axes, keepdims=True) if axes else r


def _backward_node(node: Node, operands: list[Array], r: Array, rule, nodes: list[Node], box) -> list[Array | None]:
    import keras

    L, layer = keras.layers, node.layer
    if node.linear is not None:
        return [rule(node.linear, operands[0], r)]
    if isinstance(layer, L.Add):
        s = r / stab(sum(operands), STAB)
        return [x * s for x in operands]
    if isinstance(layer, L.Concatenate):
        cuts = np.cumsum([x.shape[layer.axis] for x in operands])[:-1]
        return np.split(r, cuts, axis=layer.axis)
    if isinstance(layer, L.Multiply):
        gates = [source >= 0 and nodes[source].gate for source in node.sources]
        signal = [not g for g in gates]
        n = sum(signal)
        return [_unbroadcast(r / n, x) if s else None for x, s in zip(operands, signal)]
    if isinstance(layer, L.GlobalAveragePooling2D):
        a = operands[0]
        z = a.mean(axis=(1, 2), keepdims=True)
        s = r.reshape(z.shape) / stab(z, STAB)
        return [a * s / (a.shape[1] * a.shape[2])]
    if isinstance(layer, L.ZeroPadding2D):
        (top, bottom), (left, right) = layer.padding
        h, w = operands[0].shape[1:3]
        return [r[:, top : top + h, left : left + w]]
    if isinstance(layer, L.Flatten):
        return [r.reshape(operands[0].shape)]
    return [r]


def relevance(model, x, target, composite="epsilon_gamma_box", low=0.0, high=1.0, epsilon=1e-6, gamma=0.25) -> Array:
    """Reference LRP of a functional Keras model from its logits (the last Dense/Conv's output)."""
    nodes, _ = build(model)
    x = np.asarray(x, np.float64)
    values, inputs = [], []
    for node in nodes:
        operands = [x if s == -1 else values[s] for s in node.sources]
        inputs.append(operands)
        values.append(_forward_node(node, operands))
    top = len(nodes) - 1
    while nodes[top].linear is None:
        top = nodes[top].sources[0]
    logits = nodes[top].linear.forward(inputs[top][0])
    spec, defaults = resolve_composite(composite), Defaults(low, high, epsilon, gamma)
    # first linear nodes, and the zbox bounds carried to them (only padding comes first here)
    box = {-1: (np.broadcast_to(np.asarray(low, np.float64), x.shape), np.broadcast_to(np.asarray(high, np.float64), x.shape))}
    first = set()
    for i, node in enumerate(nodes):
        if all(s in box for s in node.sources):
            if node.linear is not None:
                first.add(i)
            else:
                box[i] = tuple(_forward_node(node, [box[s][k] for s in node.sources]) for k in (0, 1))
    pending = {top: target_mask(target, logits.shape[0], logits.shape[-1]) * logits}
    for i in range(top, -1, -1):
        if i not in pending:
            continue
        node, r = nodes[i], pending.pop(i)
        rule = None
        if node.linear is not None:
            if i in first and spec.get("first") is not None:
                name = spec["first"]
                if name == "zbox":
                    lo, hi = box[node.sources[0]]
                    rule = make_rule({"name": "zbox", "low": lo, "high": hi}, defaults)
                else:
                    rule = make_rule(name, defaults)
            else:
                rule = make_rule(spec[node.linear.kind], defaults)
        for source, share in zip(node.sources, _backward_node(node, inputs[i], r, rule, nodes, box)):
            if share is not None:
                pending[source] = pending[source] + share if source in pending else share
    return pending[-1]
