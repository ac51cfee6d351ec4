"""Plain-NumPy reference implementation of the LRP rules, used only by the tests.

Why: the engine in ``heatinv.lrp`` is written in TensorFlow, as products and transposed
products with modified kernels; this module writes every rule the other way, as its
per-connection formula ``R_i = sum_j c_ij / z_j R_j`` over an explicit connection matrix
(the way Zennit's tests write rules ``as_matrix``), in float64, with its own convolution,
pooling and batch-norm folding.  A mistake made in the engine's sign splits, masks or
bias placement does not reappear here.  Nothing here imports ``heatinv``; Keras is used
only to read a built model's layers and weights.

Conventions (one linear layer z = a.W + b; ``a`` its input, ``R`` the relevance
of its outputs; every rule returns the relevance of its inputs):

* ``stab(z, e) = z + e * s`` with ``s = +1`` where ``z >= 0`` and ``-1`` elsewhere.
* Convolutions are channels_last, with Keras/TF ``valid``/``same`` padding,
  strides and dilation; 1-D layers run as 2-D layers on a height-1 image.
* Activations pass relevance through unchanged, Flatten/Reshape/Dropout only
  reshape, average pooling uses the "norm" rule (epsilon rule with stabilizer
  1e-6 on the pooling as a bias-free linear map), max pooling is
  winner-take-all (ties: every tied input receives the full relevance).
* BatchNormalization directly after a Dense/Conv with linear activation is
  folded into that layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]
RuleSpec = Union[str, Mapping[str, Any], None]

# ---------------------------------------------------------------------------
# Elementary helpers
# ---------------------------------------------------------------------------


def stab(z: Array, e: float) -> Array:
    """z + e * sign(z), with sign(0) = +1."""
    return z + e * np.where(z >= 0, 1.0, -1.0)


def pos(x: Array) -> Array:
    return np.maximum(x, 0.0)


def neg(x: Array) -> Array:
    return np.minimum(x, 0.0)


def _same_or_valid(size: int, k_eff: int, stride: int, padding: str) -> tuple[int, int, int]:
    """(out_size, pad_before, pad_after) for one spatial axis, TF conventions."""
    if padding == "valid":
        out = (size - k_eff) // stride + 1
        if out <= 0:
            raise ValueError("window larger than input")
        return out, 0, 0
    if padding == "same":
        out = -(-size // stride)  # ceil
        total = max((out - 1) * stride + k_eff - size, 0)
        return out, total // 2, total - total // 2
    raise ValueError(f"unsupported padding {padding!r}")


@dataclass(frozen=True)
class Geometry2D:
    """Where each window offset reads from in the padded input."""

    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    pads: tuple[tuple[int, int], tuple[int, int]]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilation: tuple[int, int]

    @staticmethod
    def make(
        in_hw: tuple[int, int],
        kernel: tuple[int, int],
        strides: tuple[int, int],
        padding: str,
        dilation: tuple[int, int] = (1, 1),
    ) -> "Geometry2D":
        outs, pads = [], []
        for n, k, s, d in zip(in_hw, kernel, strides, dilation):
            o, pb, pa = _same_or_valid(n, (k - 1) * d + 1, s, padding)
            outs.append(o)
            pads.append((pb, pa))
        return Geometry2D(
            tuple(in_hw), (outs[0], outs[1]), (pads[0], pads[1]),
            tuple(kernel), tuple(strides), tuple(dilation),
        )

    def window(self, i: int, j: int) -> tuple[slice, slice, slice, slice]:
        """Index into the padded (N, Hp, Wp, C) array for kernel offset (i, j)."""
        (oh, ow), (sh, sw), (dh, dw) = self.out_hw, self.strides, self.dilation
        rows = slice(i * dh, i * dh + (oh - 1) * sh + 1, sh)
        cols = slice(j * dw, j * dw + (ow - 1) * sw + 1, sw)
        return (slice(None), rows, cols, slice(None))

    def pad(self, a: Array, value: float = 0.0) -> Array:
        return np.pad(a, ((0, 0), self.pads[0], self.pads[1], (0, 0)), constant_values=value)

    def crop(self, ap: Array) -> Array:
        (pt, _), (pl, _) = self.pads
        h, w = self.in_hw
        return ap[:, pt:pt + h, pl:pl + w, :]


# ---------------------------------------------------------------------------
# Convolution
# ---------------------------------------------------------------------------


def conv2d(a: Array, w: Array, strides: tuple[int, int], padding: str,
           dilation: tuple[int, int] = (1, 1)) -> Array:
    """channels_last 2-D cross-correlation, no bias. a: (N,H,W,Cin), w: (kh,kw,Cin,Cout)."""
    kh, kw = w.shape[:2]
    g = Geometry2D.make(a.shape[1:3], (kh, kw), strides, padding, dilation)
    ap = g.pad(a)
    out = np.zeros((a.shape[0], *g.out_hw, w.shape[3]), dtype=np.result_type(a, w))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nhwc,co->nhwo", ap[g.window(i, j)], w[i, j])
    return out


# ---------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------


def avg_pool2d(a: Array, pool: tuple[int, int], strides: tuple[int, int], padding: str) -> Array:
    """TF average pooling ('same' padding excludes padded cells from the count)."""
    g = Geometry2D.make(a.shape[1:3], pool, strides, padding)
    ap, onep = g.pad(a), g.pad(np.ones_like(a))
    tot = np.zeros((a.shape[0], *g.out_hw, a.shape[3]))
    cnt = np.zeros_like(tot)
    for i in range(pool[0]):
        for j in range(pool[1]):
            tot += ap[g.window(i, j)]
            cnt += onep[g.window(i, j)]
    return tot / cnt


def max_pool2d(a: Array, pool: tuple[int, int], strides: tuple[int, int], padding: str) -> Array:
    g = Geometry2D.make(a.shape[1:3], pool, strides, padding)
    ap = g.pad(a, -np.inf)
    out = np.full((a.shape[0], *g.out_hw, a.shape[3]), -np.inf)
    for i in range(pool[0]):
        for j in range(pool[1]):
            out = np.maximum(out, ap[g.window(i, j)])
    return out


def max_pool2d_wta(a: Array, r: Array, pool: tuple[int, int], strides: tuple[int, int],
                   padding: str) -> Array:
    """Winner-take-all: each pooled output's relevance goes to its max input(s)."""
    g = Geometry2D.make(a.shape[1:3], pool, strides, padding)
    ap = g.pad(a, -np.inf)
    m = max_pool2d(a, pool, strides, padding)
    gp = np.zeros_like(ap)
    for i in range(pool[0]):
        for j in range(pool[1]):
            gp[g.window(i, j)] += np.where(ap[g.window(i, j)] == m, r, 0.0)
    return g.crop(gp)


def max_pool2d_ties(a: Array, pool: tuple[int, int], strides: tuple[int, int], padding: str) -> int:
    """Number of pooled outputs whose maximum is attained by more than one input."""
    g = Geometry2D.make(a.shape[1:3], pool, strides, padding)
    ap = g.pad(a, -np.inf)
    m = max_pool2d(a, pool, strides, padding)
    hits = np.zeros_like(m)
    for i in range(pool[0]):
        for j in range(pool[1]):
            hits += ap[g.window(i, j)] == m
    return int(np.sum(hits > 1))


# ---------------------------------------------------------------------------
# Model representation
# ---------------------------------------------------------------------------


def _as_2d(a: Array) -> Array:
    """(N, L, C) -> (N, 1, L, C): a 1-D layer is the 2-D one on a height-1 image."""
    return a[:, None]


@dataclass
class Linear:
    """Dense (on the last axis, any rank), Conv1D or Conv2D, with (possibly BN-folded) float64 weights."""

    kind: str  # "dense" | "conv"
    w: Array
    b: Array
    strides: tuple[int, int] = (1, 1)
    padding: str = "valid"
    dilation: tuple[int, int] = (1, 1)
    name: str = ""
    spatial: int = 2  # conv only: 1 for Conv1D (run as a height-1 Conv2D), 2 for Conv2D

    def fwd(self, a: Array, w: Array) -> Array:
        """a.W without bias, for an arbitrary weight tensor of self.w's shape."""
        if self.kind == "dense":
            return a @ w
        if self.spatial == 1:
            return conv2d(_as_2d(a), w[None], self.strides, self.padding, self.dilation)[:, 0]
        return conv2d(a, w, self.strides, self.padding, self.dilation)

    def forward(self, a: Array) -> Array:
        return self.fwd(a, self.w) + self.b


@dataclass
class Act:
    """Element-wise (or softmax) activation; relevance passes through unchanged."""

    fn: Callable[[Array], Array]
    name: str = ""


@dataclass
class Reshape:
    shape: tuple[int, ...] | None  # per-sample target shape; None = flatten


@dataclass
class Pool:
    kind: str  # "avg" | "max" | "gavg" | "gmax"
    pool: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    padding: str = "valid"
    spatial: int = 2  # 1 for the 1-D poolings (run as height-1 2-D poolings)

    def forward(self, a: Array) -> Array:
        if self.kind in ("gavg", "gmax"):
            axes = tuple(range(1, a.ndim - 1))
            return a.mean(axis=axes) if self.kind == "gavg" else a.max(axis=axes)
        pool2d = {"avg": avg_pool2d, "max": max_pool2d}[self.kind]
        if self.spatial == 1:
            return pool2d(_as_2d(a), self.pool, self.strides, self.padding)[:, 0]
        return pool2d(a, self.pool, self.strides, self.padding)


Op = Union[Linear, Act, Reshape, Pool]


# --- activations -----------------------------------------------------------

def _softmax(z: Array, axis: int = -1) -> Array:
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _relu_general(max_value: float | None, slope: float, threshold: float) -> Callable[[Array], Array]:
    def f(z: Array) -> Array:
        y = np.where(z >= threshold, z, slope * (z - threshold))
        if max_value is not None:
            y = np.where(z >= max_value, max_value, y)
        return y
    return f


def _softplus_beta(beta: float) -> Callable[[Array], Array]:
    return lambda z: np.logaddexp(0.0, beta * z) / beta


_NAMED_ACTS: dict[str, Callable[[Array], Array]] = {
    "linear": lambda z: z,
    "relu": lambda z: np.maximum(z, 0.0),
    "softmax": _softmax,
    "tanh": np.tanh,
    "sigmoid": lambda z: 1.0 / (1.0 + np.exp(-z)),
    "leaky_relu": lambda z: np.where(z >= 0, z, 0.2 * z),  # keras.activations default slope
}


def _act_from_keras(fn: Any) -> Act | None:
    """None for the identity, else an :class:`Act`."""
    name = getattr(fn, "__name__", None) or str(fn)
    if name == "linear":
        return None
    if name not in _NAMED_ACTS:
        raise NotImplementedError(f"activation {name!r}")
    return Act(_NAMED_ACTS[name], name)


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    if len(v) == 1:  # a 1-D layer: height 1, run as 2-D
        return (1, int(v[0]))
    return (int(v[0]), int(v[1]))


def extract(model: Any) -> list[Op]:
    """Read a built single-chain Keras 3 model into a list of float64 ops."""
    import keras

    L = keras.layers
    ops: list[Op] = []
    for layer in model.layers:
        if isinstance(layer, L.InputLayer):
            continue
        if isinstance(layer, (L.Dense, L.Conv1D, L.Conv2D)):
            weights = [np.asarray(v, dtype=np.float64) for v in layer.get_weights()]
            w = weights[0]
            b = weights[1] if layer.use_bias else np.zeros(w.shape[-1])
            if isinstance(layer, L.Dense):
                ops.append(Linear("dense", w, b, name=layer.name))
            else:
                if layer.data_format != "channels_last" or getattr(layer, "groups", 1) != 1:
                    raise NotImplementedError("only channels_last, groups=1 convolutions")
                ops.append(Linear("conv", w, b, _pair(layer.strides), layer.padding,
                                  _pair(layer.dilation_rate), name=layer.name,
                                  spatial=1 if isinstance(layer, L.Conv1D) else 2))
            act = _act_from_keras(layer.activation)
            if act is not None:
                ops.append(act)
        elif isinstance(layer, L.BatchNormalization):
            prev = ops[-1] if ops else None
            if not isinstance(prev, Linear):
                raise NotImplementedError("BatchNormalization must follow a linear-activation Dense/Conv2D")
            if layer.axis not in (-1, len(layer.input.shape) - 1):
                raise NotImplementedError("BatchNormalization only on the last axis")
            n = prev.w.shape[-1]
            gamma = np.asarray(layer.gamma, np.float64) if layer.scale else np.ones(n)
            beta = np.asarray(layer.beta, np.float64) if layer.center else np.zeros(n)
            mean = np.asarray(layer.moving_mean, np.float64)
            var = np.asarray(layer.moving_variance, np.float64)
            ops[-1] = fold_batchnorm(prev, gamma, beta, mean, var, float(layer.epsilon))
        elif isinstance(layer, L.ReLU):
            mv = None if layer.max_value is None else float(layer.max_value)
            ops.append(Act(_relu_general(mv, float(layer.negative_slope), float(layer.threshold)), "relu"))
        elif isinstance(layer, L.LeakyReLU):
            ops.append(Act(_relu_general(None, float(layer.negative_slope), 0.0), "leaky_relu"))
        elif isinstance(layer, L.Softmax):
            axis = layer.axis if isinstance(layer.axis, int) else layer.axis[0]
            ops.append(Act(lambda z, ax=axis: _softmax(z, ax), "softmax"))
        elif isinstance(layer, L.Activation):
            act = _act_from_keras(layer.activation)
            if act is not None:
                ops.append(act)
        elif type(layer).__name__ == "SoftplusBeta":  # heatinv.layers, read by its formula
            ops.append(Act(_softplus_beta(float(layer.beta)), "softplus_beta"))
        elif isinstance(layer, L.Flatten):
            ops.append(Reshape(None))
        elif isinstance(layer, L.Reshape):
            ops.append(Reshape(tuple(layer.target_shape)))
        elif isinstance(layer, L.Dropout):
            continue
        elif isinstance(layer, (L.AveragePooling1D, L.AveragePooling2D, L.MaxPooling1D, L.MaxPooling2D)):
            kind = "avg" if isinstance(layer, (L.AveragePooling1D, L.AveragePooling2D)) else "max"
            spatial = 1 if isinstance(layer, (L.AveragePooling1D, L.MaxPooling1D)) else 2
            ops.append(Pool(kind, _pair(layer.pool_size), _pair(layer.strides), layer.padding, spatial))
        elif isinstance(layer, (L.GlobalAveragePooling1D, L.GlobalAveragePooling2D,
                                L.GlobalMaxPooling1D, L.GlobalMaxPooling2D)):
            if layer.keepdims:
                raise NotImplementedError("keepdims")
            average = isinstance(layer, (L.GlobalAveragePooling1D, L.GlobalAveragePooling2D))
            ops.append(Pool("gavg" if average else "gmax"))
        else:
            raise NotImplementedError(f"layer {type(layer).__name__}")
    return ops


def fold_batchnorm(lin: Linear, gamma: Array, beta: Array, mean: Array, var: Array,
                   eps: float) -> Linear:
    """Fold inference-mode BN (on the output-channel axis) into ``lin``."""
    scale = gamma / np.sqrt(var + eps)
    return Linear(lin.kind, lin.w * scale, (lin.b - mean) * scale + beta,
                  lin.strides, lin.padding, lin.dilation, lin.name, lin.spatial)


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------


def apply_op(op: Op, a: Array) -> Array:
    if isinstance(op, Linear):
        return op.forward(a)
    if isinstance(op, Act):
        return op.fn(a)
    if isinstance(op, Reshape):
        return a.reshape((a.shape[0], -1) if op.shape is None else (a.shape[0], *op.shape))
    if isinstance(op, Pool):
        return op.forward(a)
    raise TypeError(op)


def forward(ops: list[Op], x: ArrayLike) -> list[Array]:
    """[x, out_1, ..., out_n]: the input and every op's output, in float64."""
    acts = [np.asarray(x, dtype=np.float64)]
    for op in ops:
        acts.append(apply_op(op, acts[-1]))
    return acts


def predict(model_or_ops: Any, x: ArrayLike) -> Array:
    ops = model_or_ops if isinstance(model_or_ops, list) else extract(model_or_ops)
    return forward(ops, x)[-1]


# ---------------------------------------------------------------------------
# The rules, one connection at a time
# ---------------------------------------------------------------------------
# Every linear map (Dense of any rank, Conv1D/2D, average pooling) is read off as its
# connection matrix M (per sample, inputs and outputs flattened): M[i, j] is the weight
# that links input i to output j, found by sending each unit vector through the map.
# For a convolution each (input, output) pair is linked by at most one kernel tap, so
# pos(M), neg(M) and M**2 are the matrices of the convolution with pos(W), neg(W), W**2.
#
# Each rule is then the textbook per-connection formula
#     R_i = sum_j  c_ij / stab(sum_i' c_i'j + d_j)  R_j
# with its own contributions c_ij and denominator term d_j (Bach et al. 2015; Montavon et
# al. 2017, 2019; Andéol et al. 2021 for gamma on signed inputs; bias conventions as in
# Zennit 0.5.1, read from its rules.py: zplus/alpha-beta put b+ (b-) in the positive
# (negative) denominator, gamma b + gamma*b+ (b + gamma*b-), wsquare b**2, zbox and flat
# no bias).  Stabilizer 1e-6 with sign(0) = +1 for every rule but epsilon, and 1e-12 for
# LRP-0 (0 in the papers; heatinv's choice, so that 0/0 is 0).

STAB = 1e-6
ZERO_STAB = 1e-12


def connection_matrix(fmap: Callable[[Array], Array], in_shape: tuple[int, ...]) -> Array:
    """M[i, j] of a linear, bias-free map of one sample (inputs/outputs flattened)."""
    n = int(np.prod(in_shape))
    basis = np.eye(n).reshape((n, *in_shape))
    return fmap(basis).reshape(n, -1)


def redistribute(c: Array, d: Array, r: Array, e: float = STAB) -> Array:
    """R_i = sum_j c_ij / stab(sum_i c_ij + d_j) R_j, for c [N, in, out], d [out] or [N, out], r [N, out]."""
    z = c.sum(axis=1) + d
    return np.einsum("nij,nj->ni", c, r / stab(z, e))


def rule_epsilon(a: Array, m: Array, b: Array, r: Array, e: float) -> Array:
    """c_ij = a_i w_ij, d_j = b_j, stabilizer e."""
    return redistribute(a[:, :, None] * m, b, r, e)


def rule_zero(a: Array, m: Array, b: Array, r: Array) -> Array:
    return redistribute(a[:, :, None] * m, b, r, ZERO_STAB)


def rule_zplus(a: Array, m: Array, b: Array, r: Array) -> Array:
    """c_ij = (a_i w_ij)+, d_j = b_j+."""
    return redistribute(pos(a[:, :, None] * m), pos(b), r)


def rule_alpha_beta(a: Array, m: Array, b: Array, r: Array, alpha: float, beta: float) -> Array:
    """alpha * [c = (a_i w_ij)+, d = b_j+]  -  beta * [c = (a_i w_ij)-, d = b_j-]."""
    contribution = a[:, :, None] * m
    return (alpha * redistribute(pos(contribution), pos(b), r)
            - beta * redistribute(neg(contribution), neg(b), r))


def rule_gamma(a: Array, m: Array, b: Array, r: Array, g: float) -> Array:
    """Where z_j > 0: c_ij = a_i w_ij + g (a_i w_ij)+, d_j = b_j + g b_j+;
    where z_j < 0: c_ij = a_i w_ij + g (a_i w_ij)-, d_j = b_j + g b_j-; z_j = 0: nothing."""
    contribution = a[:, :, None] * m
    z = contribution.sum(axis=1) + b
    up = redistribute(contribution + g * pos(contribution), b + g * pos(b), np.where(z > 0, r, 0.0))
    down = redistribute(contribution + g * neg(contribution), b + g * neg(b), np.where(z < 0, r, 0.0))
    return up + down


def rule_zbox(a: Array, m: Array, r: Array, low: Array, high: Array) -> Array:
    """c_ij = a_i w_ij - l_i w_ij+ - h_i w_ij-, no bias; l, h per input (flattened)."""
    c = a[:, :, None] * m - low[:, :, None] * pos(m) - high[:, :, None] * neg(m)
    return redistribute(c, 0.0, r)


def rule_flat(connected: Array, r: Array) -> Array:
    """c_ij = 1 where input i feeds output j (0 elsewhere), no bias."""
    return redistribute(np.broadcast_to(connected, (len(r), *connected.shape)), 0.0, r)


def rule_wsquare(m: Array, b: Array, r: Array) -> Array:
    """c_ij = w_ij**2, d_j = b_j**2."""
    return redistribute(np.broadcast_to(m ** 2, (len(r), *m.shape)), b ** 2, r)


def rule_norm(a: Array, p: Array, r: Array) -> Array:
    """Average pooling as a bias-free linear map P: c_ij = a_i P_ij."""
    return redistribute(a[:, :, None] * p, 0.0, r)


def winner_takes_all(op: Pool, a: Array, r: Array) -> Array:
    """Max pooling: each pooled output's relevance goes to the input(s) holding its maximum."""
    if op.kind == "gmax":
        axes = tuple(range(1, a.ndim - 1))
        m = a.max(axis=axes, keepdims=True)
        return np.where(a == m, r.reshape(m.shape), 0.0)
    if op.spatial == 1:
        return max_pool2d_wta(_as_2d(a), _as_2d(r), op.pool, op.strides, op.padding)[:, 0]
    return max_pool2d_wta(a, r, op.pool, op.strides, op.padding)


# ---------------------------------------------------------------------------
# Composites
# ---------------------------------------------------------------------------

COMPOSITES: dict[str, dict[str, RuleSpec]] = {
    "zero": {"first": None, "dense": "zero", "conv": "zero"},
    "epsilon": {"first": None, "dense": "epsilon", "conv": "epsilon"},
    "zplus": {"first": None, "dense": "zplus", "conv": "zplus"},
    "epsilon_plus": {"first": None, "dense": "epsilon", "conv": "zplus"},
    "epsilon_gamma_box": {"first": "zbox", "dense": "epsilon", "conv": "gamma"},
    "epsilon_plus_flat": {"first": "flat", "dense": "epsilon", "conv": "zplus"},
    "epsilon_alpha2_beta1": {"first": None, "dense": "epsilon",
                             "conv": {"name": "alpha_beta", "alpha": 2.0, "beta": 1.0}},
}


@dataclass
class Defaults:
    low: ArrayLike = 0.0
    high: ArrayLike = 1.0
    epsilon: float = 1e-6
    gamma: float = 0.25
    extra: dict[str, Any] = field(default_factory=dict)


LayerRule = Callable[[Linear, Array, Array], Array]


def make_rule(spec: RuleSpec, d: Defaults) -> LayerRule:
    """A rule spec (name or {"name": ..., **params}) as ``rule(op, a, r) -> R_in`` on unflattened arrays."""
    if spec is None:
        raise ValueError("no rule")
    if isinstance(spec, str):
        name, params = spec, {}
    else:
        params = dict(spec)
        name = params.pop("name")

    def on_layer(per_connection: Callable[..., Array]) -> LayerRule:
        def apply(op: Linear, a: Array, r: Array) -> Array:
            in_shape, n = a.shape[1:], len(a)
            m = connection_matrix(lambda v: op.fwd(v, op.w), in_shape)
            b = np.broadcast_to(op.b, r.shape[1:]).reshape(-1)
            flat = per_connection(op=op, a=a.reshape(n, -1), m=m, b=b, r=r.reshape(n, -1), in_shape=in_shape)
            return flat.reshape(a.shape)
        return apply

    if name == "zero":
        return on_layer(lambda a, m, b, r, **_: rule_zero(a, m, b, r))
    if name == "epsilon":
        e = float(params.get("epsilon", d.epsilon))
        return on_layer(lambda a, m, b, r, **_: rule_epsilon(a, m, b, r, e))
    if name == "zplus":
        return on_layer(lambda a, m, b, r, **_: rule_zplus(a, m, b, r))
    if name == "alpha_beta":
        al, be = float(params["alpha"]), float(params["beta"])
        if not np.isclose(al - be, 1.0):
            raise ValueError("alpha - beta must be 1")
        return on_layer(lambda a, m, b, r, **_: rule_alpha_beta(a, m, b, r, al, be))
    if name == "gamma":
        g = float(params.get("gamma", d.gamma))
        return on_layer(lambda a, m, b, r, **_: rule_gamma(a, m, b, r, g))
    if name == "zbox":
        lo, hi = params.get("low", d.low), params.get("high", d.high)

        def zbox(a, m, r, in_shape, **_):
            def per_input(v):
                return np.broadcast_to(np.asarray(v, np.float64), (len(a), *in_shape)).reshape(len(a), -1)
            return rule_zbox(a, m, r, per_input(lo), per_input(hi))
        return on_layer(zbox)
    if name == "flat":
        def flat(op, r, in_shape, **_):
            return rule_flat(connection_matrix(lambda v: op.fwd(v, np.ones_like(op.w)), in_shape), r)
        return on_layer(flat)
    if name == "wsquare":
        return on_layer(lambda m, b, r, **_: rule_wsquare(m, b, r))
    raise ValueError(f"unknown rule {name!r}")


def resolve_composite(composite: str | Mapping[str, RuleSpec]) -> dict[str, RuleSpec]:
    if isinstance(composite, str):
        return dict(COMPOSITES[composite])
    return {"first": composite.get("first"), "dense": composite.get("dense"),
            "conv": composite.get("conv")}


# ---------------------------------------------------------------------------
# Full backward pass
# ---------------------------------------------------------------------------


def target_mask(target: ArrayLike, batch: int, classes: int) -> Array:
    t = np.asarray(target)
    if t.ndim == 0:
        return np.tile(np.eye(classes)[int(t)], (batch, 1))
    if t.ndim == 1:
        return np.eye(classes)[t.astype(int)]
    if t.shape == (batch, classes):
        return t.astype(np.float64)
    raise ValueError(f"bad target shape {t.shape}")


def relevance(model_or_ops: Any, x: ArrayLike, target: ArrayLike,
              composite: str | Mapping[str, RuleSpec] = "epsilon_gamma_box",
              low: ArrayLike = 0.0, high: ArrayLike = 1.0, epsilon: float = 1e-6,
              gamma: float = 0.25, output: str = "logit") -> Array:
    """Reference LRP; always computes in float64 and returns float64."""
    ops = model_or_ops if isinstance(model_or_ops, list) else extract(model_or_ops)
    acts = forward(ops, x)
    lin_idx = [i for i, op in enumerate(ops) if isinstance(op, Linear)]
    if not lin_idx:
        raise ValueError("model has no linear layer")
    first, last = lin_idx[0], lin_idx[-1]
    for op in ops[last + 1:]:
        if not isinstance(op, (Act, Reshape)):
            raise NotImplementedError("only activations/reshapes may follow the last linear layer")

    d = Defaults(low, high, epsilon, gamma)
    comp = resolve_composite(composite)
    rules = {}
    for i in lin_idx:
        spec = comp["first"] if (i == first and comp.get("first") is not None) else comp[ops[i].kind]
        rules[i] = make_rule(spec, d)

    if output == "logit":
        y, start = acts[last + 1], last  # z_L: output of the last linear op
    elif output == "activation":
        y, start = acts[-1], len(ops) - 1
    else:
        raise ValueError(output)
    r = target_mask(target, y.shape[0], y.shape[-1]) * y

    for i in range(start, -1, -1):
        op, a = ops[i], acts[i]
        if isinstance(op, Linear):
            r = rules[i](op, a, r)
        elif isinstance(op, Act):
            pass
        elif isinstance(op, Reshape):
            r = r.reshape(a.shape)
        elif isinstance(op, Pool) and op.kind in ("avg", "gavg"):
            p = connection_matrix(op.forward, a.shape[1:])
            r = rule_norm(a.reshape(len(a), -1), p, r.reshape(len(a), -1)).reshape(a.shape)
        elif isinstance(op, Pool):
            r = winner_takes_all(op, a, r)
        else:
            raise TypeError(op)
    return r


def count_maxpool_ties(model_or_ops: Any, x: ArrayLike) -> int:
    """Ties in any max-pooling window for input x (tests require none)."""
    ops = model_or_ops if isinstance(model_or_ops, list) else extract(model_or_ops)
    acts = forward(ops, x)
    n = 0
    for op, a in zip(ops, acts):
        if isinstance(op, Pool) and op.kind == "max":
            a2 = _as_2d(a) if op.spatial == 1 else a
            n += max_pool2d_ties(a2, op.pool, op.strides, op.padding)
        elif isinstance(op, Pool) and op.kind == "gmax":
            axes = tuple(range(1, a.ndim - 1))
            n += int(np.sum((a == a.max(axis=axes, keepdims=True)).sum(axis=axes) > 1))
    return n
