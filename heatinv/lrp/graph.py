"""Read a Keras model's layer graph: every call of a layer or Keras op, in topological order.

A functional model is a graph of *calls*: a layer called twice appears twice, and a Keras
op written into the model (``x + 3`` in MobileNetV3's hard-sigmoid) is a call of an
operation that is not a layer. Nested models (Sequential or functional) are expanded in
place, so the walk sees only layers and ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras

from heatinv.wording import count

MODEL_INPUT = -1
"""The source index that stands for the model's input tensor."""


class UnsupportedLayerError(TypeError):
    """A layer or model structure heatinv's LRP engine has no rule for."""


@dataclass
class Call:
    """One call of a layer or op in the model's graph.

    Attributes:
        operation: the Keras layer or op.
        sources: for each input tensor, the index of the call that produced it
            (:data:`MODEL_INPUT` for the model's input).
        arguments: Keras's record of the call's arguments (tensors and constants), or None
            for a call inside a Sequential model (one tensor, no constants).
        discrete: whether the call computes a boolean or integer tensor: a Keras mask (an
            Embedding's ``mask_zero`` padding, combined by merge layers, which Keras records as
            ops in the graph when a layer takes it as an argument), or ids computed from ids
            (segment ids of zeros, a padding mask from the token ids).
    """

    operation: keras.Operation
    sources: tuple[int, ...]
    arguments: object | None = None
    discrete: bool = False

    @property
    def name(self) -> str:
        return self.operation.name


def layer_graph(model: keras.Model) -> list[Call]:
    """The model's calls in topological order; the last call computes the model's output.

    Args:
        model: a built Keras 3 model, Sequential or functional, with one input and one output.

    Returns:
        The calls, each naming its sources by index into the list.

    Raises:
        UnsupportedLayerError: for subclassed models, several inputs or outputs, or ops with
            several outputs.

    Examples:
        >>> inputs = keras.Input((4,))
        >>> hidden = keras.layers.Dense(3)(inputs)
        >>> model = keras.Model(inputs, keras.layers.Add()([hidden, hidden]))
        >>> [(call.name, call.sources) for call in layer_graph(model)][-1][1]
        (0, 0)
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a Keras model, got {type(model).__name__}.")
    if not model.built:
        raise ValueError(f"Model {model.name!r} is not built; call it on a batch or give it an Input first.")
    calls: list[Call] = []
    output = _expand(model, MODEL_INPUT, calls)
    if output != len(calls) - 1:
        raise UnsupportedLayerError(
            f"Model {model.name!r} returns a tensor that is not computed by its last layer call; "
            "heatinv explains a model whose output is its last call."
        )
    return calls


def _expand(model: keras.Model, source: int, calls: list[Call]) -> int:
    """Append ``model``'s calls, fed by call ``source``; return the index of its output call."""
    if isinstance(model, keras.Sequential):
        for layer in model.layers:
            if isinstance(layer, keras.Model):
                source = _expand(layer, source, calls)
            elif not isinstance(layer, keras.layers.InputLayer):
                calls.append(Call(layer, (source,)))
                source = len(calls) - 1
        return source
    _check_functional(model)
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise UnsupportedLayerError(
            f"Model {model.name!r} has {count(len(model.inputs), 'input')} and {count(len(model.outputs), 'output')}; "
            "heatinv explains models with one input and one output. Explain one output at a time, "
            "keras.Model(model.inputs, model.outputs[k]), and give a model of several inputs as one "
            "(concatenate them before the model, split them inside it; for keras-hub's text models, "
            "heatinv.lrp.keras_hub.token_model(model))."
        )
    return _expand_functional(model, (source,), calls)[0]


def _expand_functional(model: keras.Model, sources: tuple[int, ...], calls: list[Call]) -> list[int]:
    """Append a functional model's calls, its inputs fed by ``sources`` (in ``model.inputs``' order);
    return the index of the call computing each of its outputs (in ``model.outputs``' order).

    A nested model may take and give several tensors (keras-hub's backbones take a dict of ids and
    masks and give a dict of outputs): Keras flattens both in the same order as the call's tensors.
    """
    _check_functional(model)
    produced = {id(tensor): source for tensor, source in zip(model.inputs, sources)}
    for depth in sorted(model._nodes_by_depth, reverse=True):
        for node in model._nodes_by_depth[depth]:
            if node.is_input or isinstance(node.operation, keras.layers.InputLayer):
                continue
            given = tuple(produced[id(tensor)] for tensor in node.input_tensors)
            operation = node.operation
            if isinstance(operation, keras.Model) and not isinstance(operation, keras.Sequential):
                if len(given) != len(operation.inputs):
                    raise UnsupportedLayerError(
                        f"Nested model {operation.name!r} is called with {len(given)} tensors for its "
                        f"{count(len(operation.inputs), 'input')}; heatinv needs one tensor per input."
                    )
                outputs = _expand_functional(operation, given, calls)
            elif len(node.outputs) != 1:
                raise UnsupportedLayerError(
                    f"{type(operation).__name__} {operation.name!r} in model {model.name!r} has "
                    f"{len(node.outputs)} outputs; heatinv explains layers and ops with one output."
                )
            elif isinstance(operation, keras.Model):
                if len(given) != 1:
                    raise UnsupportedLayerError(f"Nested model {operation.name!r} takes {len(given)} inputs; heatinv needs one.")
                outputs = [_expand(operation, given[0], calls)]
            else:
                dtype = str(node.outputs[0].dtype)
                calls.append(Call(operation, given, node.arguments, dtype == "bool" or "int" in dtype))
                outputs = [len(calls) - 1]
            for tensor, index in zip(node.outputs, outputs):
                produced[id(tensor)] = index
    return [produced[id(tensor)] for tensor in model.outputs]


def _check_functional(model: keras.Model) -> None:
    if not (hasattr(model, "_nodes_by_depth") and getattr(model, "inputs", None)):
        raise UnsupportedLayerError(
            f"Model {model.name!r} is a subclassed keras.Model: heatinv needs the layer graph. "
            "Rebuild it as keras.Sequential or with the functional API."
        )
