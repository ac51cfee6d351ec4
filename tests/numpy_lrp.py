"""Plain-NumPy reference implementation of the LRP rules, used only by the tests.

Why: the engine in ``heatinv.lrp`` is written in TensorFlow and is meant to be
differentiable; this module re-derives every rule directly from its formula, in
float64, with its own convolution / pooling / batch-norm folding, so that the
tests can compare the two implementations number for number.  Nothing here
imports ``heatinv``; Keras is used only to read a built model's layers and
weights.

Conventions (one linear layer z = a.W + b; ``a`` its input, ``R`` the relevance
of its outputs; every rule returns the relevance of its inputs):

* ``stab(z, e) = z + e * s`` with ``s = +1`` where ``z >= 0`` and ``-1`` elsewhere.
* Convolutions are channels_last, with Keras/TF ``valid``/``same`` padding,
  strides and dilation; the "transpose" ``s W^T`` is the exact adjoint of the
  forward convolution (a scatter-add).
* Activations pass relevance through unchanged, Flatten/Reshape/Dropout only
  reshape, average pooling uses the "norm" rule (epsilon rule with stabilizer
  1e-6 on the pooling as a bias-free linear map), max pooling is
  winner-take-all (ties: every tied input receives the full relevance).
* BatchNormalization directly after a Dense/Conv2D with linear activation is
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
# Convolution and its adjoint
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


def conv2d_adjoint(s: Array, w: Array, in_shape: tuple[int, ...], strides: tuple[int, int],
                   padding: str, dilation: tuple[int, int] = (1, 1)) -> Array:
    """Exact adjoint of :func:`conv2d` w.r.t. its input (scatter-add)."""
    kh, kw = w.shape[:2]
    g = Geometry2D.make(tuple(in_shape[1:3]), (kh, kw), strides, padding, dilation)
    hp = in_shape[1] + sum(g.pads[0])
    wp = in_shape[2] + sum(g.pads[1])
    gp = np.zeros((s.shape[0], hp, wp, w.shape[2]), dtype=np.result_type(s, w))
    for i in range(kh):
        for j in range(kw):
            gp[g.window(i, j)] += np.einsum("nhwo,co->nhwc", s, w[i, j])
    return g.crop(gp)


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


def avg_pool2d_adjoint(s: Array, in_shape: tuple[int, ...], pool: tuple[int, int],
                       strides: tuple[int, int], padding: str) -> Array:
    g = Geometry2D.make(tuple(in_shape[1:3]), pool, strides, padding)
    onep = g.pad(np.ones(in_shape))
    cnt = np.zeros_like(s)
    for i in range(pool[0]):
        for j in range(pool[1]):
            cnt += onep[g.window(i, j)]
    gp = np.zeros_like(onep)
    for i in range(pool[0]):
        for j in range(pool[1]):
            gp[g.window(i, j)] += s / cnt
    return g.crop(gp)


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


@dataclass
class Linear:
    """Dense (on the last axis) or Conv2D, with (possibly BN-folded) float64 weights."""

    kind: str  # "dense" | "conv"
    w: Array
    b: Array
    strides: tuple[int, int] = (1, 1)
    padding: str = "valid"
    dilation: tuple[int, int] = (1, 1)
    name: str = ""

    def fwd(self, a: Array, w: Array) -> Array:
        """a.W without bias, for an arbitrary weight tensor of self.w's shape."""
        if self.kind == "dense":
            return a @ w
        return conv2d(a, w, self.strides, self.padding, self.dilation)

    def adj(self, s: Array, w: Array, in_shape: tuple[int, ...]) -> Array:
        """s.W^T: the adjoint of ``fwd(., w)``."""
        if self.kind == "dense":
            return s @ w.T
        return conv2d_adjoint(s, w, in_shape, self.strides, self.padding, self.dilation)

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

    def forward(self, a: Array) -> Array:
        if self.kind == "avg":
            return avg_pool2d(a, self.pool, self.strides, self.padding)
        if self.kind == "max":
            return max_pool2d(a, self.pool, self.strides, self.padding)
        if self.kind == "gavg":
            return a.mean(axis=(1, 2))
        if self.kind == "gmax":
            return a.max(axis=(1, 2))
        raise ValueError(self.kind)


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
    return (int(v[0]), int(v[1]))


def extract(model: Any) -> list[Op]:
    """Read a built single-chain Keras 3 model into a list of float64 ops."""
    import keras

    L = keras.layers
    ops: list[Op] = []
    for layer in model.layers:
        if isinstance(layer, L.InputLayer):
            continue
        if isinstance(layer, (L.Dense, L.Conv2D)):
            weights = [np.asarray(v, dtype=np.float64) for v in layer.get_weights()]
            w = weights[0]
            b = weights[1] if layer.use_bias else np.zeros(w.shape[-1])
            if isinstance(layer, L.Dense):
                ops.append(Linear("dense", w, b, name=layer.name))
            else:
                if layer.data_format != "channels_last" or getattr(layer, "groups", 1) != 1:
                    raise NotImplementedError("only channels_last, groups=1 convolutions")
                ops.append(Linear("conv", w, b, _pair(layer.strides), layer.padding,
                                  _pair(layer.dilation_rate), name=layer.name))
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
        elif isinstance(layer, L.Flatten):
            ops.append(Reshape(None))
        elif isinstance(layer, L.Reshape):
            ops.append(Reshape(tuple(layer.target_shape)))
        elif isinstance(layer, L.Dropout):
            continue
        elif isinstance(layer, (L.AveragePooling2D, L.MaxPooling2D)):
            kind = "avg" if isinstance(layer, L.AveragePooling2D) else "max"
            ops.append(Pool(kind, _pair(layer.pool_size), _pair(layer.strides), layer.padding))
        elif isinstance(layer, L.GlobalAveragePooling2D):
            if layer.keepdims:
                raise NotImplementedError("keepdims")
            ops.append(Pool("gavg"))
        elif isinstance(layer, L.GlobalMaxPooling2D):
            if layer.keepdims:
                raise NotImplementedError("keepdims")
            ops.append(Pool("gmax"))
        else:
            raise NotImplementedError(f"layer {type(layer).__name__}")
    return ops


def fold_batchnorm(lin: Linear, gamma: Array, beta: Array, mean: Array, var: Array,
                   eps: float) -> Linear:
    """Fold inference-mode BN (on the output-channel axis) into ``lin``."""
    scale = gamma / np.sqrt(var + eps)
    return Linear(lin.kind, lin.w * scale, (lin.b - mean) * scale + beta,
                  lin.strides, lin.padding, lin.dilation, lin.name)


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
# The rules (one linear layer)
# ---------------------------------------------------------------------------

STAB = 1e-6
ZERO_STAB = 1e-12


def rule_epsilon(op: Linear, a: Array, r: Array, e: float) -> Array:
    z = op.fwd(a, op.w) + op.b
    return a * op.adj(r / stab(z, e), op.w, a.shape)


def rule_zero(op: Linear, a: Array, r: Array) -> Array:
    return rule_epsilon(op, a, r, ZERO_STAB)


def rule_alpha_beta(op: Linear, a: Array, r: Array, alpha: float, beta: float) -> Array:
    if not np.isclose(alpha - beta, 1.0):
        raise ValueError("alpha - beta must be 1")
    w, b = op.w, op.b
    wp, wn, bp, bn, ap, an = pos(w), neg(w), pos(b), neg(b), pos(a), neg(a)
    zp = op.fwd(ap, wp) + bp + op.fwd(an, wn)
    zn = op.fwd(ap, wn) + bn + op.fwd(an, wp)
    sp, sn = r / stab(zp, STAB), r / stab(zn, STAB)
    rp = ap * op.adj(sp, wp, a.shape) + an * op.adj(sp, wn, a.shape)
    rn = ap * op.adj(sn, wn, a.shape) + an * op.adj(sn, wp, a.shape)
    return alpha * rp - beta * rn


def rule_zplus(op: Linear, a: Array, r: Array) -> Array:
    return rule_alpha_beta(op, a, r, 1.0, 0.0)


def rule_gamma(op: Linear, a: Array, r: Array, g: float) -> Array:
    w, b = op.w, op.b
    z = op.fwd(a, w) + b
    mp, mn = (z > 0).astype(np.float64), (z < 0).astype(np.float64)
    wup, wdn = w + g * pos(w), w + g * neg(w)
    bup, bdn = b + g * pos(b), b + g * neg(b)
    ap, an = pos(a), neg(a)
    zp = op.fwd(ap, wup) + bup + op.fwd(an, wdn)
    zn = op.fwd(ap, wdn) + bdn + op.fwd(an, wup)
    sp, sn = mp * r / stab(zp, STAB), mn * r / stab(zn, STAB)
    return (ap * op.adj(sp, wup, a.shape) + an * op.adj(sp, wdn, a.shape)
            + ap * op.adj(sn, wdn, a.shape) + an * op.adj(sn, wup, a.shape))


def rule_zbox(op: Linear, a: Array, r: Array, low: ArrayLike, high: ArrayLike) -> Array:
    lo = np.broadcast_to(np.asarray(low, np.float64), a.shape)
    hi = np.broadcast_to(np.asarray(high, np.float64), a.shape)
    w = op.w
    wp, wn = pos(w), neg(w)
    z = op.fwd(a, w) - op.fwd(lo, wp) - op.fwd(hi, wn)
    s = r / stab(z, STAB)
    return a * op.adj(s, w, a.shape) - lo * op.adj(s, wp, a.shape) - hi * op.adj(s, wn, a.shape)


def rule_flat(op: Linear, a: Array, r: Array) -> Array:
    ones_w = np.ones_like(op.w)
    z = op.fwd(np.ones_like(a), ones_w)
    return op.adj(r / stab(z, STAB), ones_w, a.shape)


def rule_wsquare(op: Linear, a: Array, r: Array) -> Array:
    w2 = op.w ** 2
    z = op.fwd(np.ones_like(a), w2) + op.b ** 2
    return op.adj(r / stab(z, STAB), w2, a.shape)


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


def make_rule(spec: RuleSpec, d: Defaults) -> Callable[[Linear, Array, Array], Array]:
    """Turn a rule spec (name or {"name": ..., **params}) into a callable."""
    if spec is None:
        raise ValueError("no rule")
    if isinstance(spec, str):
        name, params = spec, {}
    else:
        params = dict(spec)
        name = params.pop("name")
    if name == "zero":
        return rule_zero
    if name == "epsilon":
        e = float(params.get("epsilon", d.epsilon))
        return lambda op, a, r: rule_epsilon(op, a, r, e)
    if name == "zplus":
        return rule_zplus
    if name == "alpha_beta":
        al, be = float(params["alpha"]), float(params["beta"])
        return lambda op, a, r: rule_alpha_beta(op, a, r, al, be)
    if name == "gamma":
        g = float(params.get("gamma", d.gamma))
        return lambda op, a, r: rule_gamma(op, a, r, g)
    if name == "zbox":
        lo, hi = params.get("low", d.low), params.get("high", d.high)
        return lambda op, a, r: rule_zbox(op, a, r, lo, hi)
    if name == "flat":
        return rule_flat
    if name == "wsquare":
        return rule_wsquare
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
        elif isinstance(op, Pool):
            if op.kind == "avg":
                z = avg_pool2d(a, op.pool, op.strides, op.padding)
                r = a * avg_pool2d_adjoint(r / stab(z, STAB), a.shape, op.pool, op.strides, op.padding)
            elif op.kind == "gavg":
                z = a.mean(axis=(1, 2))
                s = r / stab(z, STAB)
                r = a * np.broadcast_to(s[:, None, None, :] / (a.shape[1] * a.shape[2]), a.shape)
            elif op.kind == "max":
                r = max_pool2d_wta(a, r, op.pool, op.strides, op.padding)
            elif op.kind == "gmax":
                m = a.max(axis=(1, 2), keepdims=True)
                r = np.where(a == m, r[:, None, None, :], 0.0)
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
            n += max_pool2d_ties(a, op.pool, op.strides, op.padding)
        elif isinstance(op, Pool) and op.kind == "gmax":
            n += int(np.sum((a == a.max(axis=(1, 2), keepdims=True)).sum(axis=(1, 2)) > 1))
    return n
