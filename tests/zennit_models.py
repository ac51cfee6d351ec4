"""The cross-check models twice: in Keras (float64) and in PyTorch with the same weights, for Zennit.

Each builder returns a :class:`Twin`: a Keras model with seeded, non-trivial weights (random
biases, random BatchNorm gamma, beta, running mean and variance) and a float64 PyTorch module
that computes the same function, written so that Zennit's rules land where heatinv's do:

- a Keras Dense kernel ``(in, out)`` is ``nn.Linear.weight = kernel.T``; a Conv2D kernel
  ``(kh, kw, in, out)`` (HWIO) is ``nn.Conv2d.weight`` in OIHW; a DepthwiseConv2D kernel
  ``(kh, kw, C, m)`` is a ``groups=C`` convolution whose output channel ``c * m + j`` is
  ``kernel[:, :, c, j]``;
- torch is NCHW, Keras NHWC: the twin takes NCHW and permutes to NHWC before a Flatten;
- Keras BatchNormalization has epsilon 1e-3 (torch's default is 1e-5): the twin adds it to the
  running variance and sets torch's ``eps`` to 0 (see :func:`batch_norm_module`);
- a BatchNorm that heatinv folds into the Dense/Conv before it is named in ``merges`` and
  given to Zennit's ``NamedMergeBatchNorm``; every other BatchNorm gets Zennit's ``Pass``;
- activations are modules (``nn.ReLU``, ``nn.ReLU6``), so Zennit's composites give them ``Pass``;
- a residual ``Add`` is ``zennit.layer.Sum()(torch.stack([a, b], -1))``, which Zennit's
  composites explain with the ``Norm`` rule, ``R_k = x_k * R / stab(sum_j x_j)``;
- concatenation and zero padding are plain tensor ops: autograd splits relevance back by
  position and crops the padding away (the graph issue's conventions for heatinv);
- modules are registered in forward order, so Zennit's "first layer" (the first module of
  its ``first_map`` types in ``named_modules()`` order) is the layer the input enters.

Zennit's ``zennit.composites`` imports ``zennit.torchvision``, which imports torchvision,
and torchvision's wheel does not load against torch's CPU build: :func:`import_zennit`
puts empty stand-ins for the three torchvision modules it names into ``sys.modules`` while
zennit is imported and removes them afterwards. Nothing here is part of heatinv.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import keras
import numpy as np

CROSSCHECK_MISSING = next(
    (
        f"{name} is not installed; the Zennit cross-check needs the extra: pip install -e \".[crosscheck]\""
        for name in ("torch", "zennit")
        if importlib.util.find_spec(name) is None
    ),
    None,
)
"""Why the cross-check cannot run here, or None when torch and zennit are installed."""

DTYPE = "float64"


def import_zennit() -> types.ModuleType:
    """``zennit``, imported with torchvision stubbed out if torchvision is not loaded yet.

    Zennit uses torchvision only for its ResNet canonizer (``BasicBlock``/``Bottleneck``
    classes), which these checks do not use.

    Example:
    >>> zennit = import_zennit()  # doctest: +SKIP
    >>> zennit.composites.EpsilonPlus  # doctest: +SKIP
    """
    if "zennit.composites" in sys.modules:
        return sys.modules["zennit"]
    stubs = {}
    if "torchvision" not in sys.modules:
        resnet = types.ModuleType("torchvision.models.resnet")
        resnet.BasicBlock = type("BasicBlock", (), {})
        resnet.Bottleneck = type("Bottleneck", (), {})
        models = types.ModuleType("torchvision.models")
        models.resnet = resnet
        torchvision = types.ModuleType("torchvision")
        torchvision.models = models
        stubs = {"torchvision": torchvision, "torchvision.models": models, "torchvision.models.resnet": resnet}
    sys.modules.update(stubs)
    try:
        for name in ("zennit", "zennit.attribution", "zennit.canonizers", "zennit.composites", "zennit.layer",
                     "zennit.rules", "zennit.types"):
            importlib.import_module(name)
    finally:
        for name in stubs:
            sys.modules.pop(name, None)
    return sys.modules["zennit"]


@dataclass
class Twin:
    """One architecture in Keras and in PyTorch, with the same float64 weights.

    Attributes:
        name: what the architecture exercises.
        keras_model: the model heatinv explains; NHWC (or flat) float64 input.
        torch_model: the same function for NCHW (or flat) float64 input.
        merges: ``[((linear_module_name,), batch_norm_module_name)]`` for Zennit's
            ``NamedMergeBatchNorm``: the BatchNorms heatinv folds into the layer before.
        input_shape: the Keras input shape without the batch axis.
        to_first_layer: what the torch model does to its input before the first linear
            layer (zero padding), or None if nothing; the z^B rule's box is carried through it.
    """

    name: str
    keras_model: keras.Model
    torch_model: object
    merges: list[tuple[tuple[str, ...], str]]
    input_shape: tuple[int, ...]
    to_first_layer: Callable | None = None


def to_torch_layout(x: np.ndarray) -> np.ndarray:
    """NHWC -> NCHW for images; flat inputs unchanged."""
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if x.ndim == 4 else x


def to_keras_layout(x: np.ndarray) -> np.ndarray:
    """NCHW -> NHWC for images; flat inputs unchanged."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if x.ndim == 4 else x


def randomize(model: keras.Model, seed: int, bn_gamma: dict[str, float] | None = None) -> keras.Model:
    """Random biases and BatchNorm statistics (kernels keep Keras's seeded initialization).

    Args:
        model: the Keras model, changed in place.
        seed: the NumPy seed.
        bn_gamma: per BatchNorm name, a factor on its random gamma (to push a ReLU6 into
            saturation, say).

    Returns:
        ``model``.
    """
    rng = np.random.default_rng(seed)
    for layer in _leaf_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            factor = (bn_gamma or {}).get(layer.name, 1.0)
            layer.set_weights(
                [
                    factor * rng.uniform(0.5, 1.5, gamma.shape),
                    rng.normal(0.0, 0.2, beta.shape),
                    rng.normal(0.0, 0.2, mean.shape),
                    rng.uniform(0.5, 2.0, var.shape),
                ]
            )
        elif getattr(layer, "use_bias", False):
            weights = layer.get_weights()
            weights[-1] = rng.normal(0.0, 0.1, weights[-1].shape)
            layer.set_weights(weights)
    return model


def _leaf_layers(model: keras.Model) -> list[keras.layers.Layer]:
    layers = []
    for layer in model.layers:
        layers.extend(_leaf_layers(layer) if isinstance(layer, keras.Model) else [layer])
    return layers


# --- one Keras layer -> one torch module -------------------------------------------------------


def _torch():
    import torch

    return torch


def _parameter(array: np.ndarray):
    torch = _torch()
    return torch.nn.Parameter(torch.tensor(np.asarray(array, dtype=np.float64)))


def _conv_padding(layer: keras.layers.Layer):
    strides = tuple(layer.strides)
    if layer.padding == "valid":
        return 0
    if layer.padding == "same" and all(s == 1 for s in strides) and all(k % 2 for k in layer.kernel_size):
        return tuple(k // 2 for k in layer.kernel_size)
    # Keras pads a strided "same" convolution more at the end than at the start; torch cannot.
    raise ValueError(f"{layer.name}: only 'valid' or stride-1 odd-kernel 'same' convolutions have a torch twin here.")


def dense_module(layer: keras.layers.Dense):
    """``nn.Linear`` with ``weight = kernel.T``."""
    kernel = layer.kernel.numpy()
    module = _torch().nn.Linear(kernel.shape[0], kernel.shape[1], bias=layer.use_bias, dtype=_torch().float64)
    module.weight = _parameter(kernel.T)
    if layer.use_bias:
        module.bias = _parameter(layer.bias.numpy())
    return module


def conv_module(layer: keras.layers.Layer):
    """``nn.Conv2d`` for a Conv2D (HWIO -> OIHW) or a DepthwiseConv2D (``groups = C``)."""
    nn = _torch().nn
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        kernel = layer.kernel.numpy()  # (kh, kw, C, m)
        kh, kw, channels, multiplier = kernel.shape
        weight = kernel.transpose(2, 3, 0, 1).reshape(channels * multiplier, 1, kh, kw)
        groups, in_channels = channels, channels
    elif isinstance(layer, keras.layers.Conv2D) and layer.groups == 1:
        kernel = layer.kernel.numpy()  # (kh, kw, in, out)
        weight = kernel.transpose(3, 2, 0, 1)
        groups, in_channels = 1, kernel.shape[2]
    else:
        raise ValueError(f"{layer.name}: no torch twin for {type(layer).__name__}.")
    if tuple(layer.dilation_rate) != (1, 1):
        raise ValueError(f"{layer.name}: dilated convolutions have no torch twin here.")
    module = nn.Conv2d(
        in_channels,
        weight.shape[0],
        weight.shape[2:],
        stride=tuple(layer.strides),
        padding=_conv_padding(layer),
        groups=groups,
        bias=layer.use_bias,
        dtype=_torch().float64,
    )
    module.weight = _parameter(weight)
    if layer.use_bias:
        module.bias = _parameter(layer.bias.numpy())
    return module


def batch_norm_module(layer: keras.layers.BatchNormalization, spatial: bool):
    """``nn.BatchNorm2d`` (or 1d) in eval mode computing Keras's ``(z - mean) / sqrt(var + eps) * gamma + beta``.

    Keras's epsilon is carried in the running variance and the module's own ``eps`` is 0:
    Zennit 0.5.1 turns a merged BatchNorm into an "identity" with variance 1 but keeps its
    ``eps``, so with ``eps = 1e-3`` every merged BatchNorm would still scale by
    ``1 / sqrt(1.001)`` (measured: logits 1.5 % off on the cnn twin).
    """
    nn = _torch().nn
    gamma, beta, mean, var = (w.numpy() for w in (layer.gamma, layer.beta, layer.moving_mean, layer.moving_variance))
    kind = nn.BatchNorm2d if spatial else nn.BatchNorm1d
    module = kind(gamma.shape[0], eps=0.0, dtype=_torch().float64)
    module.weight = _parameter(gamma)
    module.bias = _parameter(beta)
    module.running_mean.copy_(_torch().tensor(mean))
    module.running_var.copy_(_torch().tensor(var + layer.epsilon))
    return module.eval()


def activation_module(fn: Callable):
    """The torch module of a Keras activation; a module, so Zennit's composites give it ``Pass``."""
    nn = _torch().nn
    if fn is keras.activations.relu:
        return nn.ReLU()
    raise ValueError(f"No torch twin for activation {fn!r}.")


def _nhwc_flatten():
    """Keras flattens NHWC: permute NCHW back before flattening."""
    torch = _torch()

    class FlattenLikeKeras(torch.nn.Module):
        def forward(self, x):
            return torch.flatten(x.permute(0, 2, 3, 1) if x.dim() == 4 else x, 1)

    return FlattenLikeKeras()


# --- chains: every layer in order --------------------------------------------------------------


def chain_module(model: keras.Model):
    """A torch ``nn.Sequential`` for a Keras chain, and the BatchNorm merges heatinv folds.

    Handles Dense, Conv2D, BatchNormalization, ReLU, Activation("relu"), Max/AveragePooling2D
    (tiling windows), GlobalAveragePooling2D, Flatten, Dropout and InputLayer.

    Returns:
        ``(module, merges)``.
    """
    nn = _torch().nn
    modules: list[tuple[str, object]] = []
    merges = []
    previous_linear = None  # name of a Dense/Conv without activation, which a BatchNorm can fold into
    for layer in _leaf_layers(model):
        name = layer.name
        if isinstance(layer, (keras.layers.InputLayer, keras.layers.Dropout)):
            continue
        if isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D)):
            modules.append((name, dense_module(layer) if isinstance(layer, keras.layers.Dense) else conv_module(layer)))
            previous_linear = name
            if layer.activation is not keras.activations.linear:
                modules.append((f"{name}_activation", activation_module(layer.activation)))
                previous_linear = None
            continue
        if isinstance(layer, keras.layers.BatchNormalization):
            modules.append((name, batch_norm_module(layer, spatial=len(layer.input.shape) == 4)))
            if previous_linear is not None:
                merges.append(((previous_linear,), name))
        elif isinstance(layer, keras.layers.ReLU) and layer.max_value is None and layer.negative_slope == 0:
            modules.append((name, nn.ReLU()))
        elif isinstance(layer, keras.layers.Activation):
            modules.append((name, activation_module(layer.activation)))
        elif isinstance(layer, (keras.layers.MaxPooling2D, keras.layers.AveragePooling2D)):
            if tuple(layer.pool_size) != tuple(layer.strides) or layer.padding != "valid":
                raise ValueError(f"{name}: only tiling 'valid' pooling has a torch twin here.")
            kind = nn.MaxPool2d if isinstance(layer, keras.layers.MaxPooling2D) else nn.AvgPool2d
            modules.append((name, kind(tuple(layer.pool_size))))
        elif isinstance(layer, keras.layers.GlobalAveragePooling2D):
            modules.append((name, nn.AdaptiveAvgPool2d(1)))
            modules.append((f"{name}_flatten", nn.Flatten()))
        elif isinstance(layer, keras.layers.Flatten):
            modules.append((name, _nhwc_flatten()))
        else:
            raise ValueError(f"{name}: no torch twin for {type(layer).__name__}.")
        previous_linear = None
    return nn.Sequential(OrderedDict(modules)).eval(), merges


def _chain_twin(name: str, model: keras.Model) -> Twin:
    module, merges = chain_module(model)
    return Twin(name, model, module, merges, tuple(model.inputs[0].shape[1:]))


def mlp(seed: int = 0) -> Twin:
    """Dense-BN-ReLU-Dense-ReLU-Dense on 10 features, 4 classes; the BatchNorm folds."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((10,), dtype=DTYPE),
            keras.layers.Dense(16, dtype=DTYPE, name="dense1"),
            keras.layers.BatchNormalization(dtype=DTYPE, name="bn1"),
            keras.layers.ReLU(dtype=DTYPE, name="relu1"),
            keras.layers.Dense(12, activation="relu", dtype=DTYPE, name="dense2"),
            keras.layers.Dense(4, dtype=DTYPE, name="logits"),
        ],
        name="mlp",
    )
    return _chain_twin("mlp", randomize(model, seed))


def cnn(seed: int = 0) -> Twin:
    """Conv-BN-ReLU-MaxPool-Conv-AvgPool-Flatten-Dense-Dense on 12x12x3, 4 classes.

    The flattened map is 2x2x8, so a Flatten in the wrong (NCHW) order would show.
    """
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((12, 12, 3), dtype=DTYPE),
            keras.layers.Conv2D(6, 3, padding="same", dtype=DTYPE, name="conv1"),
            keras.layers.BatchNormalization(dtype=DTYPE, name="bn1"),
            keras.layers.ReLU(dtype=DTYPE, name="relu1"),
            keras.layers.MaxPooling2D(2, dtype=DTYPE, name="max1"),
            keras.layers.Conv2D(8, 3, activation="relu", dtype=DTYPE, name="conv2"),
            keras.layers.AveragePooling2D(2, dtype=DTYPE, name="avg2"),
            keras.layers.Flatten(dtype=DTYPE, name="flatten"),
            keras.layers.Dense(10, activation="relu", dtype=DTYPE, name="dense"),
            keras.layers.Dense(4, dtype=DTYPE, name="logits"),
        ],
        name="cnn",
    )
    return _chain_twin("cnn", randomize(model, seed))


def vgg16(seed: int = 0) -> Twin:
    """``keras.applications.VGG16`` (no download) at 32x32x3 with 10 classes, in float64."""
    keras.utils.set_random_seed(seed)
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(DTYPE)
    keras.config.set_dtype_policy(DTYPE)
    try:
        model = keras.applications.VGG16(
            weights=None, input_shape=(32, 32, 3), classes=10, classifier_activation=None
        )
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)
    return _chain_twin("vgg16", randomize(model, seed))


# --- graphs: a hand-written torch twin per architecture ---------------------------------------


def residual_cnn(seed: int = 0) -> Twin:
    """A small ResNet: a folded stem, an identity block, a projection block, a BatchNorm after an Add.

    ``stem: Conv-BN-ReLU``; ``block1: h + BN(Conv(ReLU(BN(Conv(h)))))``, then ReLU;
    ``block2`` (stride 2): ``BN(Conv1x1/2(h)) + BN(Conv(ReLU(BN(Conv1x1/2(h)))))``, then a
    BatchNorm that no linear layer precedes (heatinv and Zennit pass relevance through it)
    and a ReLU; global average pooling and a Dense classifier. 12x12x3 input, 4 classes.
    """
    keras.utils.set_random_seed(seed)
    L = keras.layers
    x = keras.Input((12, 12, 3), dtype=DTYPE)
    h = L.Conv2D(8, 3, padding="same", use_bias=False, dtype=DTYPE, name="stem_conv")(x)
    h = L.BatchNormalization(dtype=DTYPE, name="stem_bn")(h)
    h = L.ReLU(dtype=DTYPE, name="stem_relu")(h)
    y = L.Conv2D(8, 3, padding="same", dtype=DTYPE, name="b1_conv1")(h)
    y = L.BatchNormalization(dtype=DTYPE, name="b1_bn1")(y)
    y = L.ReLU(dtype=DTYPE, name="b1_relu1")(y)
    y = L.Conv2D(8, 3, padding="same", dtype=DTYPE, name="b1_conv2")(y)
    y = L.BatchNormalization(dtype=DTYPE, name="b1_bn2")(y)
    h = L.Add(dtype=DTYPE, name="b1_add")([h, y])
    h = L.ReLU(dtype=DTYPE, name="b1_relu")(h)
    y = L.Conv2D(12, 1, strides=2, dtype=DTYPE, name="b2_conv1")(h)
    y = L.BatchNormalization(dtype=DTYPE, name="b2_bn1")(y)
    y = L.ReLU(dtype=DTYPE, name="b2_relu1")(y)
    y = L.Conv2D(12, 3, padding="same", dtype=DTYPE, name="b2_conv2")(y)
    y = L.BatchNormalization(dtype=DTYPE, name="b2_bn2")(y)
    s = L.Conv2D(12, 1, strides=2, dtype=DTYPE, name="b2_short_conv")(h)
    s = L.BatchNormalization(dtype=DTYPE, name="b2_short_bn")(s)
    h = L.Add(dtype=DTYPE, name="b2_add")([s, y])
    h = L.BatchNormalization(dtype=DTYPE, name="b2_post_bn")(h)
    h = L.ReLU(dtype=DTYPE, name="b2_relu")(h)
    h = L.GlobalAveragePooling2D(dtype=DTYPE, name="gap")(h)
    out = L.Dense(4, dtype=DTYPE, name="logits")(h)
    model = randomize(keras.Model(x, out, name="residual_cnn"), seed)

    torch = _torch()
    nn = torch.nn
    sum_layer = import_zennit().layer.Sum
    get = model.get_layer

    class ResidualCNN(nn.Module):
        def __init__(self):
            super().__init__()
            # Registration order is forward order (Zennit's first layer is stem_conv).
            for name in ("stem_conv", "b1_conv1", "b1_conv2", "b2_conv1", "b2_conv2", "b2_short_conv"):
                setattr(self, name, conv_module(get(name)))
            for name in ("stem_bn", "b1_bn1", "b1_bn2", "b2_bn1", "b2_bn2", "b2_short_bn", "b2_post_bn"):
                setattr(self, name, batch_norm_module(get(name), spatial=True))
            for name in ("stem_relu", "b1_relu1", "b1_relu", "b2_relu1", "b2_relu"):
                setattr(self, name, nn.ReLU())
            self.b1_add, self.b2_add = sum_layer(), sum_layer()
            self.gap = nn.AdaptiveAvgPool2d(1)
            self.logits = dense_module(get("logits"))

        def forward(self, x):
            h = self.stem_relu(self.stem_bn(self.stem_conv(x)))
            y = self.b1_bn2(self.b1_conv2(self.b1_relu1(self.b1_bn1(self.b1_conv1(h)))))
            h = self.b1_relu(self.b1_add(torch.stack([h, y], dim=-1)))
            y = self.b2_bn2(self.b2_conv2(self.b2_relu1(self.b2_bn1(self.b2_conv1(h)))))
            s = self.b2_short_bn(self.b2_short_conv(h))
            h = self.b2_relu(self.b2_post_bn(self.b2_add(torch.stack([s, y], dim=-1))))
            return self.logits(torch.flatten(self.gap(h), 1))

    merges = [((conv,), bn) for conv, bn in [
        ("stem_conv", "stem_bn"), ("b1_conv1", "b1_bn1"), ("b1_conv2", "b1_bn2"), ("b2_conv1", "b2_bn1"),
        ("b2_conv2", "b2_bn2"), ("b2_short_conv", "b2_short_bn"),
    ]]
    return Twin("residual_cnn", model, ResidualCNN().eval(), merges, (12, 12, 3))


def concat_net(seed: int = 0) -> Twin:
    """One tensor feeding three consumers, joined again by a Concatenate.

    ``h = ReLU(Conv(x))``; ``a = ReLU(Conv3x3(h))``, ``b = ReLU(Conv1x1(h))``;
    ``c = Concatenate([a, h, b])`` (h itself is the third consumer), then
    ``Conv-ReLU-MaxPool-Flatten-Dense``. 10x10x3 input, 4 classes.
    """
    keras.utils.set_random_seed(seed)
    L = keras.layers
    x = keras.Input((10, 10, 3), dtype=DTYPE)
    h = L.Conv2D(6, 3, padding="same", activation="relu", dtype=DTYPE, name="conv_in")(x)
    a = L.Conv2D(4, 3, padding="same", activation="relu", dtype=DTYPE, name="branch_a")(h)
    b = L.Conv2D(5, 1, activation="relu", dtype=DTYPE, name="branch_b")(h)
    c = L.Concatenate(dtype=DTYPE, name="concat")([a, h, b])
    c = L.Conv2D(8, 3, padding="same", activation="relu", dtype=DTYPE, name="conv_mix")(c)
    c = L.MaxPooling2D(2, dtype=DTYPE, name="pool")(c)
    c = L.Flatten(dtype=DTYPE, name="flatten")(c)
    out = L.Dense(4, dtype=DTYPE, name="logits")(c)
    model = randomize(keras.Model(x, out, name="concat_net"), seed)

    torch = _torch()
    nn = torch.nn
    get = model.get_layer

    class ConcatNet(nn.Module):
        def __init__(self):
            super().__init__()
            for name in ("conv_in", "branch_a", "branch_b", "conv_mix"):
                setattr(self, name, conv_module(get(name)))
                setattr(self, f"{name}_relu", nn.ReLU())
            self.pool = nn.MaxPool2d(2)
            self.flatten = _nhwc_flatten()
            self.logits = dense_module(get("logits"))

        def forward(self, x):
            h = self.conv_in_relu(self.conv_in(x))
            a = self.branch_a_relu(self.branch_a(h))
            b = self.branch_b_relu(self.branch_b(h))
            c = torch.cat([a, h, b], dim=1)
            c = self.pool(self.conv_mix_relu(self.conv_mix(c)))
            return self.logits(self.flatten(c))

    return Twin("concat_net", model, ConcatNet().eval(), [], (10, 10, 3))


def mobilenet_block(seed: int = 0) -> Twin:
    """MobileNetV2's pieces: ZeroPadding2D, strided convs, ReLU6, DepthwiseConv2D, an inverted residual Add.

    ``stem``: pad (0,1)x(0,1), Conv3x3/2 valid, BN, ReLU6 (its BatchNorm gamma is scaled up so
    some units saturate at 6); ``block1``: expand 1x1, BN, ReLU6, depthwise 3x3 same, BN,
    ReLU6, project 1x1, BN, Add with the block input; ``block2``: expand 1x1, BN, ReLU6, pad,
    depthwise 3x3/2 valid with depth multiplier 2, BN, ReLU6, project 1x1, BN; global average
    pooling and a Dense classifier. 16x16x3 input, 4 classes.

    The stem's padding is outside its convolution, so Zennit's z^B rule would put the box
    ``[low, high]`` on the padded zeros too; the twin gives it the input box carried through
    the padding instead (``to_first_layer``): ``[0, 0]`` on padded pixels, as a "same"
    convolution's own padding does in both libraries.
    """
    keras.utils.set_random_seed(seed)
    L = keras.layers

    def relu6(name):
        return L.ReLU(max_value=6.0, dtype=DTYPE, name=name)

    x = keras.Input((16, 16, 3), dtype=DTYPE)
    h = L.ZeroPadding2D(((0, 1), (0, 1)), dtype=DTYPE, name="stem_pad")(x)
    h = L.Conv2D(8, 3, strides=2, use_bias=False, dtype=DTYPE, name="stem_conv")(h)
    h = L.BatchNormalization(dtype=DTYPE, name="stem_conv_bn")(h)
    h = relu6("stem_conv_relu")(h)
    y = L.Conv2D(16, 1, use_bias=False, dtype=DTYPE, name="b1_expand")(h)
    y = L.BatchNormalization(dtype=DTYPE, name="b1_expand_bn")(y)
    y = relu6("b1_expand_relu")(y)
    y = L.DepthwiseConv2D(3, padding="same", use_bias=False, dtype=DTYPE, name="b1_depthwise")(y)
    y = L.BatchNormalization(dtype=DTYPE, name="b1_depthwise_bn")(y)
    y = relu6("b1_depthwise_relu")(y)
    y = L.Conv2D(8, 1, use_bias=False, dtype=DTYPE, name="b1_project")(y)
    y = L.BatchNormalization(dtype=DTYPE, name="b1_project_bn")(y)
    h = L.Add(dtype=DTYPE, name="b1_add")([h, y])
    y = L.Conv2D(12, 1, dtype=DTYPE, name="b2_expand")(h)
    y = L.BatchNormalization(dtype=DTYPE, name="b2_expand_bn")(y)
    y = relu6("b2_expand_relu")(y)
    y = L.ZeroPadding2D(((0, 1), (0, 1)), dtype=DTYPE, name="b2_pad")(y)
    y = L.DepthwiseConv2D(3, strides=2, depth_multiplier=2, dtype=DTYPE, name="b2_depthwise")(y)
    y = L.BatchNormalization(dtype=DTYPE, name="b2_depthwise_bn")(y)
    y = relu6("b2_depthwise_relu")(y)
    y = L.Conv2D(10, 1, dtype=DTYPE, name="b2_project")(y)
    y = L.BatchNormalization(dtype=DTYPE, name="b2_project_bn")(y)
    h = L.GlobalAveragePooling2D(dtype=DTYPE, name="gap")(y)
    out = L.Dense(4, dtype=DTYPE, name="logits")(h)
    model = randomize(keras.Model(x, out, name="mobilenet_block"), seed, bn_gamma={"stem_conv_bn": 12.0})

    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional
    get = model.get_layer

    def pad_stem(x):
        return F.pad(x, (0, 1, 0, 1))  # (left, right, top, bottom) of the last two axes

    convs = ("stem_conv", "b1_expand", "b1_depthwise", "b1_project", "b2_expand", "b2_depthwise", "b2_project")

    class MobileNetBlock(nn.Module):
        def __init__(self):
            super().__init__()
            # Each linear module is followed by its BatchNorm and ReLU6, in forward order.
            for name in convs:
                setattr(self, name, conv_module(get(name)))
                setattr(self, f"{name}_bn", batch_norm_module(get(f"{name}_bn"), spatial=True))
                if not name.endswith("project"):
                    setattr(self, f"{name}_relu", nn.ReLU6())
            self.b1_add = import_zennit().layer.Sum()
            self.gap = nn.AdaptiveAvgPool2d(1)
            self.logits = dense_module(get("logits"))

        def unit(self, name, x):
            x = getattr(self, f"{name}_bn")(getattr(self, name)(x))
            return getattr(self, f"{name}_relu")(x) if hasattr(self, f"{name}_relu") else x

        def forward(self, x):
            h = self.unit("stem_conv", pad_stem(x))
            y = self.unit("b1_project", self.unit("b1_depthwise", self.unit("b1_expand", h)))
            h = self.b1_add(torch.stack([h, y], dim=-1))
            y = self.unit("b2_expand", h)
            y = self.unit("b2_project", self.unit("b2_depthwise", F.pad(y, (0, 1, 0, 1))))
            return self.logits(torch.flatten(self.gap(y), 1))

    merges = [((name,), f"{name}_bn") for name in convs]
    return Twin("mobilenet_block", model, MobileNetBlock().eval(), merges, (16, 16, 3), pad_stem)


CHAINS = {"mlp": mlp, "cnn": cnn, "vgg16": vgg16}
GRAPHS = {"residual_cnn": residual_cnn, "concat_net": concat_net, "mobilenet_block": mobilenet_block}
