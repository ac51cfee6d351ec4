"""The hand-computed rule cases of ``test_rules.py``, computed a third way: by Zennit.

The hand derivations follow the papers; Zennit (Anders et al., 2021) is the reference for
the conventions the papers leave open (bias placement, sign(0) = +1, which terms get the
bias). Zennit's rules are hooks on PyTorch modules whose relevance is the input gradient
when the output gradient is the output relevance; here they must reproduce the same
literal numbers. Skipped where Zennit (or PyTorch) is not installed: it is not a
dependency of heatinv, only a cross-check.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from test_rules import HAND, HAND_A, HAND_B, HAND_MASK, HAND_RTOL, HAND_W


def _import_zennit():
    """zennit.rules, with stand-ins for torchvision (which zennit imports, and whose wheel
    does not load against the CPU-only torch here; the rules do not use it)."""
    pytest.importorskip("torch", reason="PyTorch is not installed: no Zennit cross-check")
    if "torchvision" not in sys.modules:
        try:
            import torchvision  # noqa: F401
        except Exception:  # a torchvision that fails to load raises RuntimeError, not ImportError
            for name in ("torchvision", "torchvision.models", "torchvision.models.resnet"):
                sys.modules[name] = types.ModuleType(name)
            resnet = sys.modules["torchvision.models.resnet"]
            resnet.BasicBlock = type("BasicBlock", (), {})
            resnet.Bottleneck = type("Bottleneck", (), {})
    return pytest.importorskip("zennit.rules", reason="Zennit is not installed: no Zennit cross-check")


@pytest.fixture(scope="module")
def zennit_rules():
    before = set(sys.modules)
    yield _import_zennit()
    # the torchvision stand-ins (and the zennit modules bound to them) leave with this module
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("torchvision", "zennit"):
            del sys.modules[name]


def _zennit_rule(rules, rid: str):
    return {
        "zero": lambda: rules.Epsilon(epsilon=0.0),
        "epsilon": lambda: rules.Epsilon(epsilon=0.5),
        "zplus": lambda: rules.ZPlus(),
        "alpha2_beta1": lambda: rules.AlphaBeta(alpha=2.0, beta=1.0),
        "gamma": lambda: rules.Gamma(gamma=0.5),
        "zbox": lambda: rules.ZBox(low=-1.0, high=2.0),
        "flat": lambda: rules.Flat(),
        "wsquare": lambda: rules.WSquare(),
    }[rid]()


def _relevance(model, modules_and_rules, x, r_out_of):
    """Zennit's relevance of ``x``: hooks registered, the output gradient set to the output relevance."""
    import torch

    handles = [rule.register(module) for module, rule in modules_and_rules]
    try:
        a = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        z = model(a)
        (relevance,) = torch.autograd.grad(z, a, grad_outputs=r_out_of(z))
    finally:
        for handle in handles:
            handle.remove()
    return relevance.detach().numpy()


@pytest.mark.parametrize("rid,spec,want", HAND, ids=[h[0] for h in HAND])
def test_zennit_gives_the_hand_computed_numbers(zennit_rules, rid, spec, want):
    import torch

    layer = torch.nn.Linear(3, 2).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(HAND_W).T)  # Keras (in, out) -> torch (out, in)
        layer.bias.copy_(torch.tensor(HAND_B))
    mask = torch.tensor(HAND_MASK, dtype=torch.float64)
    got = _relevance(layer, [(layer, _zennit_rule(zennit_rules, rid))], HAND_A, lambda z: z * mask)
    np.testing.assert_allclose(got[0], want, rtol=HAND_RTOL, atol=1e-12)


def _chain(first, dense_w):
    import torch

    dense = torch.nn.Linear(len(dense_w), 1).double()
    with torch.no_grad():
        dense.weight.copy_(torch.tensor([dense_w]))
        dense.bias.zero_()
    return torch.nn.Sequential(first, torch.nn.Flatten(), dense), dense


def _conv1d():
    import torch

    conv = torch.nn.Conv1d(1, 1, 2).double()
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([[[2.0, -1.0]]]))
        conv.bias.fill_(0.5)
    return conv


# The pooling and Conv1D cases of test_rules.HAND_LAYERS; torch lays 1-D data out as
# (batch, channels, length), which for one channel flattens in the same order as Keras.
LAYER_CASES = [
    ("norm", lambda torch: torch.nn.AvgPool1d(2), [2.0, -1.0], [3.0, -1.0, 4.0, 2.0], "Norm", [3.0, -1.0, -2.0, -1.0]),
    ("winner_takes_all", lambda torch: torch.nn.MaxPool1d(2), [2.0, -1.0], [-3.0, -1.0, 4.0, 2.0], None,
     [0.0, -2.0, -4.0, 0.0]),
    ("conv1d_flat", lambda torch: _conv1d(), [1.0, 1.0], [1.0, -2.0, 3.0], "Flat", [2.25, -1.0, -3.25]),
    ("conv1d_wsquare", lambda torch: _conv1d(), [1.0, 1.0], [1.0, -2.0, 3.0], "WSquare", [24 / 7, -86 / 21, -26 / 21]),
]


@pytest.mark.parametrize("rid,first,dense_w,x,rule,want", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_zennit_gives_the_hand_computed_layer_numbers(zennit_rules, rid, first, dense_w, x, rule, want):
    import torch

    first = first(torch)
    model, dense = _chain(first, dense_w)
    # max pooling has no rule in Zennit: its gradient routes relevance to the winner
    hooks = [(dense, zennit_rules.Epsilon(epsilon=0.0))] + ([(first, getattr(zennit_rules, rule)())] if rule else [])
    got = _relevance(model, hooks, [[x]], lambda z: z)
    np.testing.assert_allclose(got[0, 0], want, rtol=HAND_RTOL, atol=1e-12)
