"""Compare the TensorFlow LRP engine (``heatinv.lrp.relevance``) with the NumPy reference.

What is checked, and why:

* Every rule, and the pooling redistributions, against numbers computed by hand
  (negative inputs, both signs of z, two outputs, biases, zbox with low != 0),
  for the engine and the reference alike.
* The reference itself: it writes each rule as a per-connection formula (not the
  engine's products with modified kernels); its convolution, pooling and model
  forward pass agree with Keras/TF; rules that must coincide do (alpha=1/beta=0
  vs zplus, gamma=0 vs epsilon) and rules that must not, differ; conservation
  holds where theory says it does.
* The engine: for every rule (placed on every layer via a composite dict), every
  named composite, both output modes, all three target encodings, a model with
  BatchNormalization, Conv1D and the 1-D poolings, Reshape, SoftplusBeta and Dense
  on rank-3/4 inputs, in float32 and float64, the engine's relevance equals the
  reference's (float64: max abs diff <= 1e-13 * max|R|; float32: 1e-5).
* Conservation of the engine's relevance for LRP-0, tiny-epsilon, zplus and flat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import keras
import numpy as np
import pytest
import tensorflow as tf

import numpy_lrp as ref
from heatinv.layers import SoftplusBeta
from heatinv.lrp import max_pool
from heatinv.lrp.max_pool import _route_to_winners, max_pool_with_mask, winner_takes_all

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

# Engine vs reference, max |difference| / max |R_ref| over every comparison in this file,
# measured with both implementations as they are: 1.1e-14 in float64 (wsquare on conv_gmax)
# and 1.6e-6 in float32 (epsilon 0.05 on dense_rank). Tolerances about 10x above that.
TOL = {np.float64: 1e-13, np.float32: 1e-5}
# conv_gmax with z^B or w^2 on every layer is ill-conditioned (z^B puts the upper layers' ReLU
# outputs into a box they leave, so z cancels): its float64 error is 1.1e-14, 100x the other
# cases', and float32 gave 1.07e-5 (zbox), 1.08e-5 (zbox_dict) and 1.14e-5 (wsquare) on an
# AMD EPYC, where the CPUs of the first measurement stayed below 1e-5.
ILL_CONDITIONED_F32 = {("zbox", "conv_gmax"): 5e-5, ("zbox_dict", "conv_gmax"): 5e-5, ("wsquare", "conv_gmax"): 5e-5,
                       # alpha-beta's non-negative form takes a W- = a W - a W+, which cancels where the
                       # negative part is small: 1.08e-5 of max|R| measured, with convolutions or taps alike
                       ("alpha2_beta1", "conv_grey"): 3e-5}
DTYPES = [np.float64, np.float32]
DTYPE_IDS = ["f64", "f32"]


def engine(model: keras.Model, x: np.ndarray, target: Any, **kw: Any) -> np.ndarray:
    """The engine under test, as a NumPy array."""
    from heatinv.lrp import relevance

    return np.asarray(relevance(model, x, target, **kw))


def assert_matches(r_eng: np.ndarray, r_ref: np.ndarray, dtype: type, what: str, rel_tol: float | None = None) -> None:
    assert r_eng.shape == r_ref.shape, f"{what}: shape {r_eng.shape} != {r_ref.shape}"
    assert r_eng.dtype == np.dtype(dtype), f"{what}: dtype {r_eng.dtype} != {np.dtype(dtype)}"
    scale = float(np.max(np.abs(r_ref)))
    assert scale > 0, f"{what}: reference relevance is identically zero (vacuous test)"
    assert np.all(np.isfinite(r_eng)), f"{what}: engine returned non-finite values"
    err = float(np.max(np.abs(r_eng.astype(np.float64) - r_ref)))
    tol = (rel_tol or TOL[dtype]) * scale
    assert err <= tol, f"{what}: max abs diff {err:.3e} > tol {tol:.3e} (max|R_ref| = {scale:.3e})"


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), np.max(np.abs(b))))


def _glorot(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    fan_in = int(np.prod(shape[:-1]))
    return rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)  # He init: keeps ReLUs alive


def randomize(model: keras.Model, rng: np.random.Generator,
              bias: dict[str, tuple[float, float]] | None = None,
              zero_bias: bool = False) -> None:
    """Random weights, non-zero biases (range per layer name), random BN statistics."""
    bias = bias or {}
    for layer in model.layers:
        ws = layer.get_weights()
        if not ws:
            continue
        if isinstance(layer, keras.layers.BatchNormalization):
            n = ws[0].shape[0]
            gamma = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)
            beta = rng.normal(0.0, 0.5, n)
            mean = rng.normal(0.0, 0.5, n)
            var = rng.uniform(0.3, 2.0, n)
            layer.set_weights([w.astype(np.float32) for w in (gamma, beta, mean, var)])
            continue
        new = [_glorot(rng, ws[0].shape)]
        if len(ws) > 1:
            lo, hi = bias.get(layer.name, (-0.3, 0.3))
            b = np.zeros(ws[1].shape) if zero_bias else rng.uniform(lo, hi, ws[1].shape)
            new.append(b)
        layer.set_weights([w.astype(np.float32) for w in new])


L = keras.layers


@dataclass
class Case:
    """A test model, its float64 input (exactly representable in float32) and bounds."""

    model: keras.Model
    x: np.ndarray
    low: float
    high: float

    def xs(self, dtype: type) -> np.ndarray:
        return self.x.astype(dtype)


def _x(rng: np.random.Generator, shape: tuple[int, ...], lo: float, hi: float) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32).astype(np.float64)


def build_dense(seed: int = 1, head: str | None = None, zero_bias: bool = False,
                positive_x: bool = False) -> Case:
    rng = np.random.default_rng(seed)
    m = keras.Sequential([
        keras.Input((4,)),
        L.Dense(6, activation="relu"),
        L.Dense(5, activation="relu"),
        L.Dense(3, activation=head),
    ])
    randomize(m, rng, zero_bias=zero_bias)
    x = _x(rng, (3, 4), 0.1 if positive_x else -1.0, 1.0)
    return Case(m, x, -1.0, 1.0)


def build_conv(seed: int = 3, zero_bias: bool = False, channels: int = 2) -> Case:
    """Conv 3x3 same relu -> MaxPool 2 -> Conv valid relu -> AvgPool 2 -> Flatten -> Dense 3."""
    rng = np.random.default_rng(seed)
    m = keras.Sequential([
        keras.Input((12, 12, channels)),
        L.Conv2D(3, 3, padding="same", activation="relu", name="c1"),
        L.MaxPooling2D(2),
        L.Conv2D(4, 3, padding="valid", activation="relu", name="c2"),
        L.AveragePooling2D(2),
        L.Flatten(),
        L.Dense(3, name="d"),
    ])
    # positive first-conv biases: no all-zero (tied) max-pooling windows
    randomize(m, rng, bias={"c1": (0.8, 1.2), "c2": (-0.2, 0.4)}, zero_bias=zero_bias)
    # 12x12 and a batch of 4: c2's kernel (27 taps) is no larger than its input's 36
    # positions, and from batch 4 on the forward pass computes c2's a W and a W+ as one map
    # (heatinv.lrp.propagate.STACKED_PRODUCTS_MIN_BATCH): that path meets the reference too
    return Case(m, _x(rng, (4, 12, 12, channels), 0.0, 1.0), 0.0, 1.0)


def build_conv_gavg(seed: int = 4) -> Case:
    """Functional: strided non-square same conv, same-padded max pool, GAP, Softmax layer."""
    rng = np.random.default_rng(seed)
    inp = keras.Input((7, 9, 2))
    h = L.Conv2D(3, (3, 2), strides=(1, 2), padding="same", activation="relu", name="c1")(inp)
    h = L.MaxPooling2D(2, padding="same")(h)
    h = L.Conv2D(4, 2, padding="valid", name="c2")(h)
    h = L.ReLU()(h)
    h = L.GlobalAveragePooling2D()(h)
    h = L.Dense(3, name="d")(h)
    out = L.Softmax()(h)
    m = keras.Model(inp, out)
    randomize(m, rng, bias={"c1": (0.8, 1.2)})
    return Case(m, _x(rng, (2, 7, 9, 2), 0.0, 1.0), 0.0, 1.0)


def build_conv_gmax(seed: int = 8) -> Case:
    """Functional: stride-2 conv, LeakyReLU (negative activations), same avg pool,
    dilated conv, global max pool, Dropout, Dense with softmax activation."""
    rng = np.random.default_rng(seed)
    inp = keras.Input((8, 8, 2))
    h = L.Conv2D(4, 3, strides=2, padding="same", name="c1")(inp)
    h = L.LeakyReLU(negative_slope=0.1)(h)
    h = L.AveragePooling2D(2, strides=1, padding="same")(h)
    h = L.Conv2D(3, 2, dilation_rate=2, padding="valid", activation="relu", name="c2")(h)
    h = L.GlobalMaxPooling2D()(h)
    h = L.Dropout(0.5)(h)
    out = L.Dense(3, activation="softmax", name="d")(h)
    m = keras.Model(inp, out)
    randomize(m, rng, bias={"c2": (0.5, 1.0)})
    return Case(m, _x(rng, (2, 8, 8, 2), -1.0, 1.0), -1.0, 1.0)


def build_bn(seed: int = 0) -> Case:
    """Conv (linear) -> BN -> ReLU -> Flatten -> Dense (linear) -> BN -> ReLU -> Dense."""
    rng = np.random.default_rng(seed)
    m = keras.Sequential([
        keras.Input((5, 5, 2)),
        L.Conv2D(3, 3, padding="same", name="c1"),
        L.BatchNormalization(),
        L.ReLU(),
        L.Flatten(),
        L.Dense(5, name="d1"),
        L.BatchNormalization(),
        L.Activation("relu"),
        L.Dense(3, name="d2"),
    ])
    randomize(m, rng)
    return Case(m, _x(rng, (2, 5, 5, 2), 0.0, 1.0), 0.0, 1.0)


def build_conv1d(seed: int = 6) -> Case:
    """Conv1D same relu -> MaxPooling1D 2 (tiling) -> dilated Conv1D -> SoftplusBeta ->
    AveragePooling1D same stride 1 -> GlobalMaxPooling1D -> Dense; signed inputs."""
    rng = np.random.default_rng(seed)
    m = keras.Sequential([
        keras.Input((12, 2)),
        L.Conv1D(3, 3, padding="same", activation="relu", name="c1"),
        L.MaxPooling1D(2),
        L.Conv1D(4, 2, dilation_rate=2, padding="valid", name="c2"),
        SoftplusBeta(beta=5.0),
        L.AveragePooling1D(2, strides=1, padding="same"),
        L.GlobalMaxPooling1D(),
        L.Dense(3, name="d"),
    ])
    randomize(m, rng, bias={"c1": (0.8, 1.2)})
    return Case(m, _x(rng, (2, 12, 2), -1.0, 1.0), -1.0, 1.0)


def build_conv1d_gavg(seed: int = 11) -> Case:
    """Strided Conv1D -> overlapping same-padded MaxPooling1D -> AveragePooling1D ->
    GlobalAveragePooling1D -> Dense."""
    rng = np.random.default_rng(seed)
    m = keras.Sequential([
        keras.Input((10, 2)),
        L.Conv1D(4, 3, strides=2, padding="same", activation="relu", name="c1"),
        L.MaxPooling1D(3, strides=1, padding="same"),
        L.AveragePooling1D(2),
        L.GlobalAveragePooling1D(),
        L.Dense(3, name="d"),
    ])
    randomize(m, rng, bias={"c1": (0.8, 1.2)})
    return Case(m, _x(rng, (2, 10, 2), 0.0, 1.0), 0.0, 1.0)


def build_dense_rank(seed: int = 7) -> Case:
    """Dense on a rank-4 input, Reshape, Dense on a rank-3 input, Flatten, Dense."""
    rng = np.random.default_rng(seed)
    m = keras.Sequential([
        keras.Input((2, 3, 4)),
        L.Dense(6, activation="relu", name="d1"),
        L.Reshape((6, 6)),
        L.Dense(4, activation="relu", name="d2"),
        L.Flatten(),
        L.Dense(3, name="d3"),
    ])
    randomize(m, rng)
    return Case(m, _x(rng, (3, 2, 3, 4), -1.0, 1.0), -1.0, 1.0)


BUILDERS: dict[str, Callable[[], Case]] = {
    "dense": build_dense,
    "conv": build_conv,
    "conv_gavg": build_conv_gavg,
    "conv_gmax": build_conv_gmax,
    "conv1d": build_conv1d,
    "conv1d_gavg": build_conv1d_gavg,
    "dense_rank": build_dense_rank,
}
MAIN = list(BUILDERS)


@pytest.fixture(scope="module")
def cases() -> dict[str, Case]:
    out = {k: b() for k, b in BUILDERS.items()}
    out["dense_softmax"] = build_dense(seed=2, head="softmax")
    out["bn"] = build_bn()
    return out


def kw(case: Case, **extra: Any) -> dict[str, Any]:
    return {"low": case.low, "high": case.high, **extra}


# Rules put on every linear layer: (id, spec, extra keyword arguments to relevance()).
RULES: list[tuple[str, Any, dict[str, Any]]] = [
    ("zero", "zero", {}),
    ("epsilon", "epsilon", {"epsilon": 0.25}),
    ("epsilon_dict", {"name": "epsilon", "epsilon": 0.05}, {}),
    ("zplus", "zplus", {}),
    ("alpha2_beta1", {"name": "alpha_beta", "alpha": 2.0, "beta": 1.0}, {}),
    ("gamma", "gamma", {"gamma": 0.25}),
    ("gamma_dict", {"name": "gamma", "gamma": 1.0}, {}),
    ("zbox", "zbox", {}),
    ("zbox_dict", {"name": "zbox", "low": -2.0, "high": 2.0}, {}),
    ("flat", "flat", {}),
    ("wsquare", "wsquare", {}),
]
RULE_IDS = [r[0] for r in RULES]
NAMED = ["zero", "epsilon", "zplus", "epsilon_plus", "epsilon_gamma_box",
         "epsilon_plus_flat", "epsilon_alpha2_beta1"]


def everywhere(spec: Any) -> dict[str, Any]:
    return {"first": spec, "dense": spec, "conv": spec}


TARGET = np.array([2, 0, 1, 2])

# ---------------------------------------------------------------------------
# 1. The reference against Keras / TF (validates the reference)
# ---------------------------------------------------------------------------

CONV_CONFIGS = [
    # (input HWC, kernel, strides, padding, dilation)
    ((7, 9, 2), (3, 2), (1, 2), "same", (1, 1)),
    ((8, 8, 3), (3, 3), (2, 2), "same", (1, 1)),
    ((8, 8, 2), (3, 3), (1, 1), "valid", (2, 2)),
    ((6, 7, 2), (2, 3), (2, 1), "valid", (1, 1)),
    ((5, 5, 1), (4, 4), (1, 1), "same", (1, 1)),
    ((9, 10, 2), (3, 3), (3, 3), "same", (1, 1)),
    ((8, 8, 2), (2, 2), (1, 1), "same", (2, 3)),
]


def _keras_conv(cfg: tuple) -> tuple[keras.layers.Conv2D, np.ndarray, np.ndarray]:
    shape, k, s, p, d = cfg
    rng = np.random.default_rng(100 + CONV_CONFIGS.index(cfg))
    layer = L.Conv2D(3, k, strides=s, padding=p, dilation_rate=d, dtype="float64")
    layer.build((None, *shape))
    w = rng.normal(size=(*k, shape[2], 3))
    b = rng.normal(size=3)
    layer.set_weights([w, b])
    x = rng.normal(size=(2, *shape))
    return layer, x, w


@pytest.mark.parametrize("cfg", CONV_CONFIGS, ids=[str(i) for i in range(len(CONV_CONFIGS))])
def test_reference_conv_matches_keras(cfg: tuple) -> None:
    layer, x, w = _keras_conv(cfg)
    _, _, s, p, d = cfg
    want = np.asarray(layer(x)) - layer.get_weights()[1]
    got = ref.conv2d(x, w, s, p, d)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


POOL_CONFIGS = [((8, 8, 2), (2, 2), (2, 2), "valid"), ((7, 9, 2), (2, 2), (2, 2), "same"),
                ((6, 6, 3), (3, 2), (1, 2), "same"), ((7, 7, 1), (3, 3), (2, 2), "valid")]


@pytest.mark.parametrize("cfg", POOL_CONFIGS, ids=[str(i) for i in range(len(POOL_CONFIGS))])
def test_reference_pooling_matches_keras(cfg: tuple) -> None:
    shape, k, s, p = cfg
    rng = np.random.default_rng(11)
    x = rng.normal(size=(2, *shape))  # continuous: no ties
    for cls, f in ((L.AveragePooling2D, ref.avg_pool2d), (L.MaxPooling2D, ref.max_pool2d)):
        layer = cls(k, strides=s, padding=p, dtype="float64")
        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            y = layer(xt)
            sv = rng.normal(size=tuple(y.shape))
            tot = tf.reduce_sum(y * sv)
        np.testing.assert_allclose(f(x, k, s, p), y.numpy(), rtol=0, atol=1e-12)
        if cls is L.MaxPooling2D:
            # without ties, winner-takes-all routing is max pooling's gradient
            assert ref.max_pool2d_ties(x, k, s, p) == 0
            np.testing.assert_allclose(ref.max_pool2d_wta(x, sv, k, s, p), tape.gradient(tot, xt).numpy(),
                                       rtol=0, atol=1e-12)


def test_reference_maxpool_ties_go_to_all() -> None:
    a = np.zeros((1, 2, 2, 1))
    a[0, 0, 0, 0] = a[0, 1, 1, 0] = 1.0
    r = ref.max_pool2d_wta(a, np.full((1, 1, 1, 1), 5.0), (2, 2), (2, 2), "valid")
    assert r[0, :, :, 0].tolist() == [[5.0, 0.0], [0.0, 5.0]]
    assert ref.max_pool2d_ties(a, (2, 2), (2, 2), "valid") == 1


@pytest.mark.parametrize("name", MAIN + ["dense_softmax", "bn"])
def test_reference_forward_matches_model(cases: dict[str, Case], name: str) -> None:
    c = cases[name]
    want = np.asarray(c.model(c.xs(np.float32), training=False), dtype=np.float64)
    got = ref.predict(c.model, c.x)
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


def test_bn_folding_is_not_trivial(cases: dict[str, Case]) -> None:
    """The BN layers in the BN model change the function (folding is exercised)."""
    c = cases["bn"]
    ops = ref.extract(c.model)
    raw = {l.name: l.get_weights() for l in c.model.layers if isinstance(l, (L.Dense, L.Conv2D))}
    unfolded = [ref.Linear(o.kind, raw[o.name][0].astype(np.float64), raw[o.name][1].astype(np.float64),
                           o.strides, o.padding, o.dilation, o.name) if isinstance(o, ref.Linear) else o
                for o in ops]
    assert rel_diff(ref.predict(ops, c.x), ref.predict(unfolded, c.x)) > 0.05
    assert rel_diff(ref.relevance(ops, c.x, 0, "epsilon"), ref.relevance(unfolded, c.x, 0, "epsilon")) > 0.05


def test_models_are_not_degenerate(cases: dict[str, Case]) -> None:
    """Every ReLU layer has a healthy fraction of active units (seeds were chosen for this);
    a dead network would make most rule comparisons trivially equal."""
    for name, c in cases.items():
        ops = ref.extract(c.model)
        acts = ref.forward(ops, c.x)
        for i, op in enumerate(ops):
            if isinstance(op, ref.Act) and op.name == "relu":
                frac = float(np.mean(acts[i + 1] > 0))
                assert 0.25 <= frac, f"{name}: op {i} has only {frac:.0%} active units"


@pytest.mark.parametrize("onednn", [False, True], ids=["onednn_off", "onednn_on"])
@pytest.mark.parametrize("composite", ["epsilon_alpha2_beta1", "epsilon_gamma_box", "epsilon_plus"])
def test_the_conv_case_takes_both_forms_of_a_w_plus(
    cases: dict[str, Case], composite: str, onednn: bool, monkeypatch
) -> None:
    """The engine's comparisons with the reference cover ``a W+`` both ways on the conv case:
    computed by the rule (the first layer; c2 where oneDNN's kernels run) and with ``a W`` as
    one map by the forward pass (c2 where they do not); both forms are compared on any CPU
    (:func:`test_engine_a_w_plus_both_ways`)."""
    from heatinv.lrp import propagate
    from heatinv.lrp.canonical import canonize
    from heatinv.lrp.composites import resolve
    from heatinv.lrp.propagate import forward, positive_product_steps

    monkeypatch.setattr(propagate, "onednn_enabled", lambda: onednn)
    c = cases["conv"]
    steps = canonize(c.model)
    wanted = positive_product_steps(steps, resolve(composite))
    assert [steps[i].name for i in wanted] == ([] if onednn else ["c2"])
    assert sorted(forward(steps, tf.constant(c.x), wanted).positives) == sorted(wanted)
    assert forward(steps, tf.constant(c.x[:1]), wanted).positives == {}  # batch 1: the rule computes it


@pytest.mark.parametrize("onednn", [False, True], ids=["onednn_off", "onednn_on"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("composite", ["epsilon_alpha2_beta1", "epsilon_gamma_box", "epsilon_plus"])
def test_engine_a_w_plus_both_ways(cases: dict[str, Case], composite: str, dtype: type, onednn: bool, monkeypatch) -> None:
    """c2 of the conv case (after a ReLU, followed by one) takes ``a W+`` from the forward
    pass's map of ``[W, W+]`` where oneDNN's kernels are off, and computes its own maps where
    they run (the gamma rule: ``a (W + gamma W+)``): on any CPU, both meet the reference."""
    from heatinv.lrp import propagate

    monkeypatch.setattr(propagate, "onednn_enabled", lambda: onednn)
    c = cases["conv"]
    t = TARGET[: len(c.x)]
    want = ref.relevance(c.model, c.x, t, composite, **kw(c))
    got = engine(c.model, c.xs(dtype), t, composite=composite, **kw(c))
    assert_matches(got, want, dtype, f"{composite} on the conv case, oneDNN {'on' if onednn else 'off'}")


def test_data_has_no_maxpool_ties(cases: dict[str, Case]) -> None:
    for name in ("conv", "conv_gavg", "conv_gmax", "conv1d", "conv1d_gavg"):
        assert ref.count_maxpool_ties(cases[name].model, cases[name].x) == 0, name


# ---------------------------------------------------------------------------
# 2. Every rule against numbers computed by hand
# ---------------------------------------------------------------------------
# One Dense layer, three inputs, two outputs, both outputs carrying relevance:
#
#   a = [2, -1, 1]          W = [[ 1,  2],        b = [0.5, -1]
#                                [ 3, -1],
#                                [-1, -2]]
#   contributions p_ij = a_i W_ij = [[ 2,  4],
#                                    [-3,  1],
#                                    [-1, -2]]
#   z = [2 - 3 - 1 + 0.5, 4 + 1 - 2 - 1] = [-1.5, 2]      (output 0 has z < 0)
#
# The target is the float mask [[2, 1]], so R_out = mask * z = [-3, 2].
# Rules use the stabilizer 1e-6 (LRP-0: 1e-12), which moves every denominator below
# (all |d| >= 1) by at most 1e-6 relative. Measured distance of the engine and the
# reference from these literals: at most 8.0e-7 relative in float64 and 6.6e-7 in float32
# (zplus, where -2.4 + 1.6 cancels and magnifies the stabilizer's shift), 1.0e-6 for the
# norm rule on a pooled value of 1; hence HAND_RTOL = 3e-6. A wrong term moves an entry
# by 1e-2 or more.
#
# zero:     s = R / z = [-3 / -1.5, 2 / 2] = [2, 1];  R_i = p_i0 * 2 + p_i1 * 1
#           = [4 + 4, -6 + 1, -2 - 2] = [8, -5, -4]
# epsilon:  eps = 0.5, stab(z) = [-1.5 - 0.5, 2 + 0.5] = [-2, 2.5]; s = [1.5, 0.8]
#           R = [3 + 3.2, -4.5 + 0.8, -1.5 - 1.6] = [6.2, -3.7, -3.1]
# zplus:    p+ = [[2, 4], [0, 1], [0, 0]], b+ = [0.5, 0]; z+ = [2.5, 5]; s = [-1.2, 0.4]
#           R = [-2.4 + 1.6, 0.4, 0] = [-0.8, 0.4, 0]
# alpha2_beta1: p- = [[0, 0], [-3, 0], [-1, -2]], b- = [0, -1]; z- = [-4, -3];
#           s- = [-3 / -4, 2 / -3] = [0.75, -2/3]; negative part
#           = [0, -2.25, -0.75 + 4/3] = [0, -2.25, 7/12]
#           R = 2 * [-0.8, 0.4, 0] - [0, -2.25, 7/12] = [-1.6, 3.05, -7/12]
# gamma:    gamma = 0.5. Output 0 has z < 0: c = p + 0.5 * min(p, 0) = [2, -4.5, -1.5],
#           d = b + 0.5 * min(b, 0) = 0.5; denominator -3.5; s0 = -3 / -3.5 = 6/7.
#           Output 1 has z > 0: c = p + 0.5 * max(p, 0) = [6, 1.5, -2],
#           d = b + 0.5 * max(b, 0) = -1; denominator 4.5; s1 = 2 / 4.5 = 4/9.
#           R = [12/7 + 24/9, -27/7 + 6/9, -9/7 - 8/9] = [92/21, -67/21, -137/63]
# zbox:     low = -1, high = 2: c_ij = a_i W_ij - low W_ij+ - high W_ij-:
#           output 0: [2 + 1, -3 + 3, -1 + 2] = [3, 0, 1], z = 4
#           output 1: [4 + 2, 1 + 2, -2 + 4] = [6, 3, 2], z = 11;  s = [-3/4, 2/11]
#           R = [-9/4 + 12/11, 6/11, -3/4 + 4/11] = [-51/44, 6/11, -17/44]
# flat:     c_ij = 1, z = [3, 3]; R_i = (-3 + 2) / 3 = -1/3 for every input
# wsquare:  c_ij = W_ij^2, d = b^2: output 0: [1, 9, 1] + 0.25 -> 11.25; output 1:
#           [4, 1, 4] + 1 -> 10; s = [-3 / 11.25, 2 / 10] = [-4/15, 1/5]
#           R = [-4/15 + 4/5, -36/15 + 1/5, -4/15 + 4/5] = [8/15, -11/5, 8/15]

HAND_RTOL = 3e-6
HAND_A = [[2.0, -1.0, 1.0]]
HAND_W = [[1.0, 2.0], [3.0, -1.0], [-1.0, -2.0]]
HAND_B = [0.5, -1.0]
HAND_MASK = [[2.0, 1.0]]

HAND: list[tuple[str, Any, list[float]]] = [
    ("zero", "zero", [8.0, -5.0, -4.0]),
    ("epsilon", {"name": "epsilon", "epsilon": 0.5}, [6.2, -3.7, -3.1]),
    ("zplus", "zplus", [-0.8, 0.4, 0.0]),
    ("alpha2_beta1", {"name": "alpha_beta", "alpha": 2.0, "beta": 1.0}, [-1.6, 3.05, -7 / 12]),
    ("gamma", {"name": "gamma", "gamma": 0.5}, [92 / 21, -67 / 21, -137 / 63]),
    ("zbox", {"name": "zbox", "low": -1.0, "high": 2.0}, [-51 / 44, 6 / 11, -17 / 44]),
    ("flat", "flat", [-1 / 3, -1 / 3, -1 / 3]),
    ("wsquare", "wsquare", [8 / 15, -11 / 5, 8 / 15]),
]


def _dense_layer_model(dtype: str) -> keras.Model:
    m = keras.Sequential([keras.Input((3,), dtype=dtype), L.Dense(2, dtype=dtype)])
    m.layers[-1].set_weights([np.array(HAND_W, dtype), np.array(HAND_B, dtype)])
    return m


def test_hand_case_has_both_signs_of_z() -> None:
    """The derivation above relies on z = [-1.5, 2]: one output per branch of gamma and alpha-beta."""
    z = np.asarray(_dense_layer_model("float64")(np.array(HAND_A)))
    np.testing.assert_array_equal(z, [[-1.5, 2.0]])


@pytest.mark.parametrize("rid,spec,want", HAND, ids=[h[0] for h in HAND])
def test_reference_hand_computed(rid: str, spec: Any, want: list) -> None:
    got = ref.relevance(_dense_layer_model("float64"), np.array(HAND_A), np.array(HAND_MASK), everywhere(spec))
    np.testing.assert_allclose(got[0], want, rtol=HAND_RTOL, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("rid,spec,want", HAND, ids=[h[0] for h in HAND])
def test_engine_hand_computed(rid: str, spec: Any, want: list, dtype: str) -> None:
    got = engine(_dense_layer_model(dtype), np.array(HAND_A, dtype), np.array(HAND_MASK, dtype),
                 composite=everywhere(spec))
    np.testing.assert_allclose(got[0], want, rtol=HAND_RTOL, atol=1e-12)


def test_stabilizer_takes_sign_0_as_plus_1() -> None:
    """stab(z) = z + eps * sign(z) with sign(0) = +1 (Zennit's convention), seen through a gradient.

    At z = 0 the relevance is 0 whatever sign(0) is, but its derivative is not. Dense 2 -> 1,
    a = [1, 1], w = [1, -1], b = 0, so z = 0; epsilon 0.5, target 0, so R_out = z and
    R_0 = a_0 w_0 z / stab(z) = z / (z + 0.5 sign(z)). Near z = 0, with sign(0) = +1,
    R_0 = z / (z + 0.5) and dR_0/db = dR_0/dz = 0.5 / 0.5^2 = 2; with sign(0) = -1 it would be -2.
    """
    from heatinv.lrp import relevance

    m = keras.Sequential([keras.Input((2,), dtype="float64"), L.Dense(1, dtype="float64")])
    m.layers[-1].set_weights([np.array([[1.0], [-1.0]]), np.zeros(1)])
    with tf.GradientTape() as tape:
        r = relevance(m, np.ones((1, 2)), 0, composite=everywhere({"name": "epsilon", "epsilon": 0.5}))
        first = r[0, 0]
    np.testing.assert_array_equal(r.numpy(), [[0.0, 0.0]])
    assert float(tape.gradient(first, m.layers[-1].bias)[0]) == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("order", [1, 2])
def test_stabilized_ratio_has_the_derivatives_of_a_division(order: int) -> None:
    """R / stab(z), whose gradient heatinv writes out, against TensorFlow's own gradient of the
    division in float64, first and second order, with z of both signs and exactly 0."""
    from heatinv.lrp.rules import stabilize, stabilized_ratio

    rng = np.random.default_rng(order)
    relevance = tf.constant(rng.normal(size=(3, 5)))
    z = tf.constant(np.concatenate([rng.normal(size=(3, 4)), np.zeros((3, 1))], axis=1))
    cotangent = tf.constant(rng.normal(size=(3, 5)))

    def derivatives(ratio):
        with tf.GradientTape(persistent=True) as outer:
            outer.watch([relevance, z])
            with tf.GradientTape() as inner:
                inner.watch([relevance, z])
                pairing = tf.reduce_sum(ratio(relevance, z) * cotangent)
            first = inner.gradient(pairing, [relevance, z])
            if order == 1:
                return first
            pairing = tf.reduce_sum(first[0] * first[1])  # a scalar that mixes both first derivatives
        return outer.gradient(pairing, [relevance, z])

    got = derivatives(lambda r, z: stabilized_ratio(r, z, 0.1))
    want = derivatives(lambda r, z: r / stabilize(z, 0.1))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-14)


# Pooling and a convolution, by hand (Input -> layer -> Flatten -> Dense, target class 0).
#
# norm (AveragePooling1D(2)): a = [3, -1, 4, 2] -> pooled [1, 3]; Dense w = [2, -1], b = 0:
#   z = 2 - 3 = -1 = R_out; LRP-0: R_pool = [1 * 2, 3 * -1] * (-1 / -1) = [2, -3];
#   R_i = a_i / 2 * R_j / pooled_j: [3/2 * 2, -1/2 * 2, 4/2 * -1, 2/2 * -1] = [3, -1, -2, -1]
# winner_takes_all (MaxPooling1D(2)): a = [-3, -1, 4, 2] -> pooled [-1, 4] (the first window's
#   winner is negative); z = -2 - 4 = -6 = R_out; R_pool = [-2, -4] * (-6 / -6) = [-2, -4];
#   R = [0, -2, -4, 0]
# Conv1D(1, kernel 2, valid) on x = [1, -2, 3] with kernel [2, -1], bias 0.5:
#   out0 = 2 + 2 + 0.5 = 4.5 (inputs 0, 1), out1 = -4 - 3 + 0.5 = -6.5 (inputs 1, 2);
#   Dense w = [1, 1], b = 0: z = -2 = R_out; LRP-0: R_conv = [4.5, -6.5].
#   flat: every output has 2 inputs: R = [4.5/2, 4.5/2 - 6.5/2, -6.5/2] = [2.25, -1, -3.25]
#   wsquare: z_j = 4 + 1 + 0.25 = 5.25; input 0 feeds out0 through k0 = 2, input 1 feeds
#   out0 through k1 = -1 and out1 through k0, input 2 feeds out1 through k1:
#   R = [4/5.25 * 4.5, (1 * 4.5 + 4 * -6.5) / 5.25, 1/5.25 * -6.5] = [24/7, -86/21, -26/21]

def _chain(first: keras.layers.Layer, dense_w: list[float], shape: tuple[int, ...]) -> keras.Model:
    m = keras.Sequential([keras.Input(shape, dtype="float64"), first, L.Flatten(dtype="float64"),
                          L.Dense(1, dtype="float64")])
    m.layers[-1].set_weights([np.array(dense_w, np.float64)[:, None], np.zeros(1)])
    return m


def _conv1d_chain() -> keras.Model:
    conv = L.Conv1D(1, 2, dtype="float64")
    m = _chain(conv, [1.0, 1.0], (3, 1))
    conv.set_weights([np.array([2.0, -1.0]).reshape(2, 1, 1), np.array([0.5])])
    return m


HAND_LAYERS: list[tuple[str, Callable[[], keras.Model], list[float], Any, list[float]]] = [
    ("norm", lambda: _chain(L.AveragePooling1D(2, dtype="float64"), [2.0, -1.0], (4, 1)),
     [3.0, -1.0, 4.0, 2.0], "zero", [3.0, -1.0, -2.0, -1.0]),
    ("winner_takes_all", lambda: _chain(L.MaxPooling1D(2, dtype="float64"), [2.0, -1.0], (4, 1)),
     [-3.0, -1.0, 4.0, 2.0], "zero", [0.0, -2.0, -4.0, 0.0]),
    ("conv1d_flat", _conv1d_chain, [1.0, -2.0, 3.0], {"first": "flat", "dense": "zero", "conv": "zero"},
     [2.25, -1.0, -3.25]),
    ("conv1d_wsquare", _conv1d_chain, [1.0, -2.0, 3.0], {"first": "wsquare", "dense": "zero", "conv": "zero"},
     [24 / 7, -86 / 21, -26 / 21]),
]


@pytest.mark.parametrize("rid,build,x,composite,want", HAND_LAYERS, ids=[h[0] for h in HAND_LAYERS])
def test_layers_hand_computed(rid: str, build: Callable, x: list, composite: Any, want: list) -> None:
    model = build()
    x = np.array(x)[None, :, None]
    for got in (engine(model, x, 0, composite=composite), ref.relevance(model, x, 0, composite)):
        np.testing.assert_allclose(got[0, :, 0], want, rtol=HAND_RTOL, atol=1e-12)


# ---------------------------------------------------------------------------
# 3. Reference self-consistency
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", MAIN)
def test_reference_rules_are_distinct(cases: dict[str, Case], name: str) -> None:
    """Every pair of rule cases gives visibly different relevance: no vacuous comparisons."""
    c = cases[name]
    rs = {rid: ref.relevance(c.model, c.x, TARGET[: len(c.x)], everywhere(spec), **kw(c, **extra))
          for rid, spec, extra in RULES}
    for rid, r in rs.items():
        assert np.max(np.abs(r)) > 0, rid
    ids = list(rs)
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            assert rel_diff(rs[a], rs[b]) > 1e-3, f"{name}: {a} vs {b}"


@pytest.mark.parametrize("name", MAIN)
def test_reference_special_cases_agree(cases: dict[str, Case], name: str) -> None:
    c = cases[name]
    t = TARGET[: len(c.x)]

    def r(spec: Any, **extra: Any) -> np.ndarray:
        return ref.relevance(c.model, c.x, t, everywhere(spec), **kw(c, **extra))

    # alpha=1, beta=0 is zplus
    np.testing.assert_allclose(r({"name": "alpha_beta", "alpha": 1.0, "beta": 0.0}), r("zplus"),
                               rtol=0, atol=1e-12)
    # gamma=0 is epsilon with the same 1e-6 stabilizer (z is never exactly 0 here)
    np.testing.assert_allclose(r({"name": "gamma", "gamma": 0.0}), r("epsilon", epsilon=1e-6),
                               rtol=0, atol=1e-10 * np.max(np.abs(r("zero"))))
    # "first": None / absent means "use the layer type's rule"
    a = ref.relevance(c.model, c.x, t, {"first": None, "dense": "epsilon", "conv": "zplus"})
    b = ref.relevance(c.model, c.x, t, {"dense": "epsilon", "conv": "zplus"})
    np.testing.assert_array_equal(a, ref.relevance(c.model, c.x, t, "epsilon_plus"))
    np.testing.assert_array_equal(b, a)


def _target_logit(case: Case, t: np.ndarray) -> np.ndarray:
    ops = ref.extract(case.model)
    last = max(i for i, o in enumerate(ops) if isinstance(o, ref.Linear))
    z = ref.forward(ops, case.x)[last + 1]
    return z[np.arange(len(t)), t]


# (id, spec, extra kwargs, rtol, model).  Flat is checked on the dense model only: on the
# conv model the average-pooling "norm" rule drops relevance of all-zero windows.  The conv
# model's rtol is 1e-4 because that norm rule's fixed 1e-6 stabilizer leaks ~1e-6/|pooled value|.
# Targets are each sample's argmax class with a positive logit: then z_j > 0 implies zp_j > 0
# for every neuron carrying relevance, so zplus conserves exactly (up to stabilizers).
def _argmax_target(case: Case) -> np.ndarray:
    return np.argmax(ref.predict(case.model, case.x).reshape(len(case.x), -1), axis=1)


CONSERVING: list[tuple[str, Any, dict[str, Any], float, str]] = [
    (f"{rid}-{m}", spec, extra, rtol if m == "dense" else max(rtol, 1e-4), m)
    for rid, spec, extra, rtol in [
        ("zero", "zero", {}, 1e-9),
        ("epsilon_tiny", "epsilon", {"epsilon": 1e-10}, 1e-9),
        ("zplus", "zplus", {}, 1e-5),
        ("flat", "flat", {}, 1e-5),
    ]
    for m in ("dense", "conv")
    if not (rid == "flat" and m == "conv")
]


@pytest.fixture(scope="module")
def conserving_cases() -> dict[str, Case]:
    return {"dense": build_dense(seed=2, zero_bias=True, positive_x=True),
            "conv": build_conv(seed=0, zero_bias=True)}


@pytest.mark.parametrize("rid,spec,extra,rtol,model_name", CONSERVING, ids=[c[0] for c in CONSERVING])
def test_reference_conservation(conserving_cases: dict[str, Case], model_name: str, rid: str,
                                spec: Any, extra: dict, rtol: float) -> None:
    c = conserving_cases[model_name]
    t = _argmax_target(c)
    logit = _target_logit(c, t)
    assert np.all(logit > 1e-2)
    r = ref.relevance(c.model, c.x, t, everywhere(spec), **extra)
    sums = r.reshape(len(r), -1).sum(axis=1)
    np.testing.assert_allclose(sums, logit, rtol=rtol)


def test_reference_conservation_fails_with_bias(cases: dict[str, Case]) -> None:
    """Control: with non-zero biases LRP-0 does not conserve, so the test above can fail."""
    c = cases["dense"]
    t = TARGET[: len(c.x)]
    sums = ref.relevance(c.model, c.x, t, "zero").sum(axis=1)
    assert np.max(np.abs(sums - _target_logit(c, t))) > 1e-2


# ---------------------------------------------------------------------------
# 4. Engine == reference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", MAIN)
@pytest.mark.parametrize("rid,spec,extra", RULES, ids=RULE_IDS)
def test_engine_rule_everywhere(cases: dict[str, Case], rid: str, spec: Any, extra: dict,
                                name: str, dtype: type) -> None:
    c = cases[name]
    t = TARGET[: len(c.x)]
    args = kw(c, **extra)
    want = ref.relevance(c.model, c.x, t, everywhere(spec), **args)
    got = engine(c.model, c.xs(dtype), t, composite=everywhere(spec), **args)
    rel_tol = ILL_CONDITIONED_F32.get((rid, name)) if dtype is np.float32 else None
    assert_matches(got, want, dtype, f"rule {rid} on {name}", rel_tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", MAIN)
@pytest.mark.parametrize("rid,spec,extra", [rule for rule in RULES if rule[0] in ("zplus", "alpha2_beta1", "gamma")])
def test_engine_rule_on_an_input_of_one_sign(cases: dict[str, Case], rid: str, spec: Any, extra: dict,
                                             name: str, dtype: type) -> None:
    """The sign-split rules on a first layer whose input is >= 0 at run time (the other tests'
    inputs have both signs) take their non-negative form; it must equal the reference's full
    rule, which computes the a- terms (zero here) anyway."""
    c = cases[name]
    t = TARGET[: len(c.x)]
    x = np.abs(c.x)
    want = ref.relevance(c.model, x, t, everywhere(spec), **kw(c, **extra))
    got = engine(c.model, x.astype(dtype), t, composite=everywhere(spec), **kw(c, **extra))
    assert_matches(got, want, dtype, f"rule {rid} on {name}, input >= 0")


@pytest.mark.parametrize("onednn", [False, True], ids=["taps", "onednn"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rid,spec,extra", RULES, ids=RULE_IDS)
def test_engine_rule_on_a_grey_first_layer(rid: str, spec: Any, extra: dict, dtype: type, onednn: bool, monkeypatch) -> None:
    """A first convolution on one channel (grey images, >= 0) has forms of its own, chosen by
    whether TensorFlow runs oneDNN's kernels: without them its map runs tap by tap (every
    rule's products), ``a W+`` comes from the forward pass for the rules that split the
    kernel by sign, and alpha-beta's two transposed maps are given apart
    (:func:`heatinv.lrp.one_channel.single_channel_transpose`); with them, convolutions."""
    from heatinv.lrp import canonical, one_channel, propagate
    from heatinv.lrp.composites import resolve
    from heatinv.lrp.propagate import positive_product_steps

    for module in (canonical, one_channel, propagate):
        monkeypatch.setattr(module, "onednn_enabled", lambda: onednn)
    c = build_conv(seed=6, channels=1)
    assert ref.count_maxpool_ties(c.model, c.x) == 0  # the premise: one route through max pooling (seed 3 has a tie)
    steps = canonical.canonize(c.model)
    composite = resolve(everywhere(spec))
    splits = composite.rule_for("conv", is_first=True).takes_positive
    assert (0 in positive_product_steps(steps, composite)) == (splits and not onednn)
    t = TARGET[: len(c.x)]
    want = ref.relevance(c.model, c.x, t, everywhere(spec), **kw(c, **extra))
    got = engine(c.model, c.xs(dtype), t, composite=everywhere(spec), **kw(c, **extra))
    rel_tol = ILL_CONDITIONED_F32.get((rid, "conv_grey")) if dtype is np.float32 else None
    assert_matches(got, want, dtype, f"rule {rid} on the grey conv case", rel_tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", MAIN)
@pytest.mark.parametrize("composite", NAMED)
def test_engine_named_composite(cases: dict[str, Case], composite: str, name: str, dtype: type) -> None:
    c = cases[name]
    t = TARGET[: len(c.x)]
    want = ref.relevance(c.model, c.x, t, composite, **kw(c))
    got = engine(c.model, c.xs(dtype), t, composite=composite, **kw(c))
    assert_matches(got, want, dtype, f"composite {composite} on {name}")


@pytest.mark.parametrize("name", ["dense", "conv"])
def test_engine_mixed_composite_and_default(cases: dict[str, Case], name: str) -> None:
    """Different rules per layer type, 'first' absent/None, and the default composite."""
    c = cases[name]
    t = TARGET[: len(c.x)]
    comps: list[Any] = [
        {"dense": {"name": "epsilon", "epsilon": 0.1}, "conv": {"name": "gamma", "gamma": 0.5}},
        {"first": None, "dense": "zplus", "conv": "epsilon"},
        {"first": "wsquare", "dense": {"name": "alpha_beta", "alpha": 2.0, "beta": 1.0}, "conv": "zero"},
    ]
    for comp in comps:
        assert_matches(engine(c.model, c.x, t, composite=comp, **kw(c)),
                       ref.relevance(c.model, c.x, t, comp, **kw(c)), np.float64, f"{comp} on {name}")
    # all defaults: composite epsilon_gamma_box, low 0, high 1, epsilon 1e-6, gamma 0.25, logit
    assert_matches(engine(c.model, c.x, t), ref.relevance(c.model, c.x, t), np.float64,
                   f"defaults on {name}")


def test_engine_zbox_array_bounds(cases: dict[str, Case]) -> None:
    """zbox bounds given per input feature (broadcast to the input shape)."""
    c = cases["dense"]
    t = TARGET[: len(c.x)]
    low = np.array([-1.0, -2.0, -1.5, -1.2])
    high = np.array([1.0, 2.0, 1.1, 3.0])
    want = ref.relevance(c.model, c.x, t, "epsilon_gamma_box", low=low, high=high)
    assert rel_diff(want, ref.relevance(c.model, c.x, t, "epsilon_gamma_box", low=-1.0, high=1.0)) > 1e-3
    assert_matches(engine(c.model, c.x, t, composite="epsilon_gamma_box", low=low, high=high),
                   want, np.float64, "zbox array bounds")


def test_engine_zbox_bounds_of_another_shape_are_named(cases: dict[str, Case]) -> None:
    c = cases["dense"]  # 4 input features
    with pytest.raises(ValueError, match=r"LRP-z\^B's high has shape \(5,\), which does not broadcast to one input of shape \(4,\)"):
        engine(c.model, c.x, 0, composite="epsilon_gamma_box", low=-1.0, high=np.ones(5))
    with_batch_axis = np.array([[-1.0, -2.0, -1.5, -1.2]])  # [1, features] broadcasts to every example, as before
    np.testing.assert_array_equal(
        engine(c.model, c.x, 0, composite="epsilon_gamma_box", low=with_batch_axis, high=3.0),
        engine(c.model, c.x, 0, composite="epsilon_gamma_box", low=with_batch_axis[0], high=3.0),
    )


def _target_forms(batch: int) -> dict[str, Any]:
    t = TARGET[:batch]
    return {"int": 1, "array": t, "onehot": np.eye(3)[t]}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("form", ["int", "array", "onehot"])
@pytest.mark.parametrize("output", ["logit", "activation"])
@pytest.mark.parametrize("name", ["dense_softmax", "conv_gavg", "conv_gmax"])
def test_engine_output_and_target(cases: dict[str, Case], name: str, output: str, form: str,
                                  dtype: type) -> None:
    c = cases[name]
    target = _target_forms(len(c.x))[form]
    want = ref.relevance(c.model, c.x, target, "epsilon_plus", output=output, **kw(c))
    got = engine(c.model, c.xs(dtype), target, composite="epsilon_plus", output=output, **kw(c))
    assert_matches(got, want, dtype, f"output={output} target={form} on {name}")


@pytest.mark.parametrize("name", ["dense_softmax", "conv_gavg", "conv_gmax"])
def test_reference_output_modes_and_targets_differ(cases: dict[str, Case], name: str) -> None:
    c = cases[name]
    t = TARGET[: len(c.x)]
    # logit-mode relevance starts from z_L, activation-mode from softmax(z_L)
    lg = ref.relevance(c.model, c.x, t, "epsilon_plus", output="logit")
    ac = ref.relevance(c.model, c.x, t, "epsilon_plus", output="activation")
    assert rel_diff(lg, ac) > 1e-2
    # a different target class gives a different map; int-array and one-hot targets agree
    assert rel_diff(ref.relevance(c.model, c.x, (t + 1) % 3, "epsilon_plus"), lg) > 1e-2
    forms = _target_forms(len(c.x))
    np.testing.assert_array_equal(ref.relevance(c.model, c.x, forms["array"], "epsilon_plus"),
                                  ref.relevance(c.model, c.x, forms["onehot"], "epsilon_plus"))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("comp", ["epsilon_gamma_box", "epsilon", "zplus", "gamma_all", "zbox_all"])
def test_engine_batchnorm_folded(cases: dict[str, Case], comp: str, dtype: type) -> None:
    c = cases["bn"]
    t = TARGET[: len(c.x)]
    composite = {"gamma_all": everywhere("gamma"), "zbox_all": everywhere("zbox")}.get(comp, comp)
    want = ref.relevance(c.model, c.x, t, composite, **kw(c))
    got = engine(c.model, c.xs(dtype), t, composite=composite, **kw(c))
    assert_matches(got, want, dtype, f"BN model, composite {comp}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rid,spec,extra,rtol,model_name", CONSERVING, ids=[c[0] for c in CONSERVING])
def test_engine_conservation(conserving_cases: dict[str, Case], model_name: str, rid: str, spec: Any,
                             extra: dict, rtol: float, dtype: type) -> None:
    c = conserving_cases[model_name]
    t = _argmax_target(c)
    logit = _target_logit(c, t)
    r = engine(c.model, c.xs(dtype), t, composite=everywhere(spec), **extra)
    sums = r.astype(np.float64).reshape(len(r), -1).sum(axis=1)
    np.testing.assert_allclose(sums, logit, rtol=max(rtol, 1e-4 if dtype is np.float32 else 0.0),
                               err_msg=f"conservation {rid} on {model_name} ({np.dtype(dtype)})")


STRICT_CASES: list[tuple[str, str, Any, dict[str, Any]]] = [
    ("epsilon_0.05", "dense", everywhere("epsilon"), {"epsilon": 0.05}),
    ("zbox_bounds", "dense", "epsilon_gamma_box", {"low": -0.3, "high": 1.1}),
    ("bn_epsilon", "bn", "zero", {}),
]


@pytest.mark.parametrize("cid,name,composite,extra", STRICT_CASES, ids=[s[0] for s in STRICT_CASES])
def test_engine_float64_is_float64_throughout(cases: dict[str, Case], cid: str, name: str,
                                              composite: Any, extra: dict) -> None:
    """With float64 input every quantity (rule hyperparameters such as epsilon/low/high, the
    BatchNormalization epsilon) must be float64 too.  Values that are not exactly representable
    in float32 (0.05, -0.3, 1.1, BN's 1e-3) expose a float32 round trip as a ~1e-9..1e-11
    relative error; genuine float64 agreement here is ~1e-14, so the tolerance is 1e-12."""
    c = cases[name]
    t = TARGET[: len(c.x)]
    want = ref.relevance(c.model, c.x, t, composite, **kw(c, **extra))
    got = engine(c.model, c.x, t, composite=composite, **kw(c, **extra))
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got - want)))
    assert err <= 1e-12 * scale, f"{cid}: max abs diff {err:.3e} = {err / scale:.1e} * max|R|"


# Both routings of max pooling: max pooling's own gradient (what the engine runs on a CPU outside
# XLA) and the comparisons/argmax (under XLA or with a GPU).
ROUTINGS = {
    "gradient": winner_takes_all,
    "comparisons": lambda a, relevance, pool: _route_to_winners(a, relevance, pool.window(a)),
}


@pytest.fixture(params=[False, True], ids=["spread", "onednn"])
def pool_kernels(request, monkeypatch) -> bool:
    """Both forms of the CPU routing, whatever this machine's CPU: spreading over the winners' mask
    (oneDNN's kernels off) and max pooling's own gradient (on); either form runs on either CPU."""
    monkeypatch.setattr(max_pool, "onednn_enabled", lambda: request.param)
    return request.param


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_max_pool_routing_gives_ties_to_the_first_input_of_the_window(dtype, routing, pool_kernels) -> None:
    """Winner-takes-all with tied maxima, worked out by hand: the window's first maximal input
    (row-major) takes all of its output's relevance; the row and column that no 2x2 window
    covers get none."""
    a = tf.constant(
        [
            [1, 1, 0, 0, 9],  # windows: [[1, 1], [0, 1]] -> (0, 0); [[0, 0], [0, 0]] -> (0, 2)
            [0, 1, 0, 0, 9],
            [0, 2, 3, 3, 9],  # [[0, 2], [2, 0]] -> (2, 1); [[3, 3], [3, 5]] -> (3, 3)
            [2, 0, 3, 5, 9],
            [9, 9, 9, 9, 9],  # outside every window
        ],
        dtype,
    )[None, :, :, None]
    relevance = tf.constant([[10, 20], [30, 40]], dtype)[None, :, :, None]

    def pool(x):
        return tf.nn.max_pool2d(x, 2, 2, "VALID")

    pool.window = lambda x: (2, 2)
    want = np.zeros((5, 5))
    want[0, 0], want[0, 2], want[2, 1], want[3, 3] = 10, 20, 30, 40
    got = ROUTINGS[routing](a, relevance, pool)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got[0, :, :, 0].numpy(), want)


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_max_pool_routing_over_channels_and_window_sizes_matches_a_numpy_loop(dtype, size, routing, pool_kernels) -> None:
    """Windows of 1x1 (the identity), 2x2, 3x3 and 4x4 over three channels, an odd input size
    (cropped at the bottom and right), against a plain loop over the windows; integer values
    give ties. The routing's derivative (what the inverse step differentiates) gathers a
    cotangent from the same winners."""
    rng = np.random.default_rng(size)
    a = rng.integers(0, 4, size=(2, 7, 8, 3)).astype(np.float64)
    rows, cols = 7 // size, 8 // size
    relevance = rng.normal(size=(2, rows, cols, 3))
    cotangent = rng.normal(size=a.shape)
    want, want_gradient = np.zeros_like(a), np.zeros_like(relevance)
    for b, i, j, c in np.ndindex(2, rows, cols, 3):
        window = a[b, i * size : (i + 1) * size, j * size : (j + 1) * size, c]
        first = np.argmax(window)  # numpy's argmax: the first maximal entry, row-major
        winner = (b, i * size + first // size, j * size + first % size, c)
        want[winner] = relevance[b, i, j, c]
        want_gradient[b, i, j, c] = cotangent[winner]

    def pool(x):
        return tf.nn.max_pool2d(x, size, size, "VALID")

    pool.window = lambda x: (size, size)
    relevance, cotangent = tf.constant(relevance, dtype), tf.constant(cotangent, dtype)
    probe = tf.constant(rng.normal(size=relevance.shape), dtype)
    with tf.GradientTape() as outer:
        outer.watch(cotangent)
        with tf.GradientTape() as tape:
            tape.watch(relevance)
            got = ROUTINGS[routing](tf.constant(a, dtype), relevance, pool)
            pairing = tf.reduce_sum(got * cotangent)
        gathered = tape.gradient(pairing, relevance)
        second = tf.reduce_sum(gathered * probe)
    np.testing.assert_array_equal(got.numpy(), want.astype(dtype.as_numpy_dtype))
    np.testing.assert_array_equal(gathered.numpy(), tf.constant(want_gradient, dtype).numpy())
    # The derivative of the gathering is the routing again (of the probe).
    np.testing.assert_array_equal(
        outer.gradient(second, cotangent).numpy(), ROUTINGS[routing](tf.constant(a, dtype), probe, pool).numpy()
    )


@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_max_pool_routing_drops_a_losing_inputs_cotangent_even_when_it_is_not_finite(routing, pool_kernels) -> None:
    """The derivative gathers the winner's cotangent only: an inf or NaN at an input that lost
    its window (a = 0 against 1) does not reach the relevance's gradient."""
    a = tf.constant([[1.0, 0.0], [0.0, 0.0]])[None, :, :, None]
    relevance = tf.constant([[[[3.0]]]])
    cotangent = tf.constant([[2.0, np.inf], [np.nan, -np.inf]])[None, :, :, None]

    def pool(x):
        return tf.nn.max_pool2d(x, 2, 2, "VALID")

    pool.window = lambda x: (2, 2)
    with tf.GradientTape() as tape:
        tape.watch(relevance)
        pairing = tf.reduce_sum(ROUTINGS[routing](a, relevance, pool) * cotangent)
    assert tape.gradient(pairing, relevance).numpy().ravel().tolist() == [2.0]
    for value in (np.inf, np.nan):  # and the routing itself gives a non-finite relevance to the winner only
        with tf.GradientTape() as tape:
            non_finite = tf.constant([[[[value]]]])
            tape.watch(non_finite)
            routed = ROUTINGS[routing](a, non_finite, pool)[0, :, :, 0].numpy()
        np.testing.assert_array_equal(routed, [[value, 0.0], [0.0, 0.0]])


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("size", [2, 4])
def test_the_forward_max_poolings_gradient_through_the_winners_mask_is_max_poolings_own(dtype, size, pool_kernels) -> None:
    """Where a tape records it, the forward pass's max pooling finds its winners' mask once and
    spreads its cotangent to them: equal to TensorFlow's ``MaxPoolGrad``, ties (integer values)
    and the row and column no window covers included, and an inf or NaN cotangent reaches
    only its window's winner. Unrecorded, it finds no mask."""
    rng = np.random.default_rng(size)
    a = tf.constant(rng.integers(0, 4, size=(2, 9, 10, 3)), dtype)
    cotangent = rng.normal(size=(2, 9 // size, 10 // size, 3))
    cotangent[0, 0, 0, 0], cotangent[1, 1, 1, 2] = np.inf, np.nan
    cotangent = tf.constant(cotangent, dtype)

    def pool(x):
        return tf.nn.max_pool2d(x, size, size, "VALID")

    pool.window = lambda x: (size, size)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(a)
        got, mask = max_pool_with_mask(pool, a)
        want = pool(a)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(
        tape.gradient(got, a, output_gradients=cotangent).numpy(), tape.gradient(want, a, output_gradients=cotangent).numpy()
    )
    winners_per_window = tf.nn.avg_pool2d(mask, size, size, "VALID") * size * size
    np.testing.assert_array_equal(winners_per_window.numpy(), np.ones(cotangent.shape))
    assert max_pool_with_mask(pool, a)[1] is None


def test_a_channels_first_max_pooling_has_no_window() -> None:
    """The window routings lay out ``[batch, ..., channels]``: a channels-first layer goes
    through max pooling's own gradient (its window is None); a channels-last one has one."""
    from heatinv.lrp.canonical import Pool

    for data_format, want in (("channels_first", None), ("channels_last", (2, 2))):
        layer = L.MaxPooling2D(2, data_format=data_format)
        keras.Sequential([keras.Input((4, 4, 4)), layer])
        assert Pool(layer, "max").window(tf.zeros([1, 4, 4, 4])) == want


def test_a_rule_mapping_with_a_key_its_rule_does_not_take_is_refused() -> None:
    """{"name": "gamma", "gama": 0.5} ran with gamma 0.25: make_rule drops what a rule does not take."""
    from heatinv.lrp.composites import resolve

    with pytest.raises(ValueError, match=r"rule 'gamma' takes \['gamma'\].*\['gama'\]"):
        resolve({"first": "zbox", "dense": {"name": "gamma", "gama": 0.5}, "conv": "zplus"})
    assert resolve({"dense": {"name": "gamma", "gamma": 0.5}, "conv": "zplus"}, epsilon=1e-6).dense.keywords == {"gamma": 0.5}
