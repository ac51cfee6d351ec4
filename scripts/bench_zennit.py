"""heatinv's heatmap and Zennit's side by side: same architecture, weights, batch, composite and threads.

    python scripts/bench_zennit.py                     # vgg16 (32x32x3) and the bench cnn, batch 16
    python scripts/bench_zennit.py --models cnn --batch 2 --repeats 1 --min-time 0   # a smoke run

Needs the crosscheck extra (``pip install -e ".[crosscheck]"``) and a source checkout: the
PyTorch twin of each Keras model is built by ``tests/zennit_models.py``, the same code the
cross-check tests verify. Float32, each composite with its defaults on both sides,
2 threads each (TensorFlow's intra- and inter-op pools, ``torch.set_num_threads``), random
inputs in [0, 1] and random classes (seeded). ``--composites`` picks heatinv's
``epsilon_gamma_box``, ``epsilon_plus``, ``epsilon_alpha2_beta1`` against Zennit's
``EpsilonGammaBox``, ``EpsilonPlus``, ``EpsilonAlpha2Beta1``. Timing is heatinv's bench's: a warm-up, then
interleaved blocks of at least ``--min-time`` seconds, ``--repeats`` times; medians.

Variants (milliseconds per batch):

``heatmap_only``, ``heatmap_only_xla``
    heatinv's compiled heatmap (``LRP.__call__`` in ``tf.function``, without and with XLA),
    as in ``python -m heatinv.bench``.
``zennit_heatmap``
    Zennit's ``Gradient`` attribution with the matching composite registered once
    (its hooks' forward and modified backward pass, eager PyTorch).
``forward_backward``, ``torch_forward_backward``
    a plain gradient of the explained logit with respect to the input in each framework: the
    yardstick that tells the frameworks' own speed apart from the LRP engines'.

Before timing, each case checks that the two heatmaps agree (float32: ``relative_error``,
recorded with the Zennit variant). Writes ``--out`` (default ``outputs/bench/zennit.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import side_by_side

MODELS = ("vgg16", "cnn")
COMPOSITES = {
    "epsilon_gamma_box": "EpsilonGammaBox",
    "epsilon_plus": "EpsilonPlus",
    "epsilon_alpha2_beta1": "EpsilonAlpha2Beta1",
}
"""heatinv's composite -> Zennit's composite of the same rules."""


def parse_args(argv=None) -> argparse.Namespace:
    return side_by_side.parse_args(
        argv, "python scripts/bench_zennit.py", __doc__.split("\n")[0], MODELS, COMPOSITES, "epsilon_gamma_box", "zennit.json"
    )


def keras_model(name: str):
    """The Keras model of the case, float32, seeded."""
    import keras

    from heatinv.models import Architecture, build_model

    if name == "vgg16":
        keras.utils.set_random_seed(0)
        return keras.applications.VGG16(weights=None, input_shape=(32, 32, 3), classes=10, classifier_activation=None)
    return build_model(Architecture("cnn"), 10, seed=0)


def make_runners(name: str, composite_name: str, batch: int, hooks: contextlib.ExitStack):
    """The runners of one case and the float32 relative L2 error between the two heatmaps.

    Zennit's hooks stay registered until ``hooks`` closes, as heatinv's ``LRP`` is built once.
    """
    import numpy as np
    import tensorflow as tf
    import torch

    import zennit_models as twins
    from heatinv.bench import Runner
    from heatinv.lrp import LRP

    model = keras_model(name)
    torch_model, merges = twins.chain_module(model)
    torch_model = torch_model.float()
    zennit = twins.import_zennit()
    rng = np.random.default_rng(0)
    x_np = rng.uniform(0.0, 1.0, (batch,) + tuple(model.inputs[0].shape[1:])).astype("float32")
    y_np = rng.integers(0, 10, batch)
    x, y = tf.constant(x_np), tf.constant(y_np, tf.int32)
    x_torch = torch.tensor(twins.to_torch_layout(x_np))
    one_hot = torch.nn.functional.one_hot(torch.tensor(y_np), 10).float()

    explainer = LRP(model, composite_name)

    def heatmap(x, y):
        R = explainer(x, y)
        return R, tf.reduce_sum(R)

    def forward_backward(x, y):
        with tf.GradientTape() as tape:
            tape.watch(x)
            logits = model(x, training=False)
            score = tf.reduce_sum(logits * tf.one_hot(y, logits.shape[-1], dtype=logits.dtype))
        grad = tape.gradient(score, x)
        return grad, tf.reduce_sum(grad)

    canonizers = [zennit.canonizers.NamedMergeBatchNorm(merges)] if merges else None
    if composite_name == "epsilon_gamma_box":
        composite = zennit.composites.EpsilonGammaBox(low=0.0, high=1.0, canonizers=canonizers)
    else:
        composite = getattr(zennit.composites, COMPOSITES[composite_name])(canonizers=canonizers)
    attributor = hooks.enter_context(zennit.attribution.Gradient(torch_model, composite))

    def zennit_heatmap():
        _, R = attributor(x_torch.clone(), lambda output: output.detach() * one_hot)
        return R

    def torch_forward_backward():
        inputs = x_torch.clone().requires_grad_(True)
        with attributor.composite.inactive():  # the plain gradient, hooks switched off
            score = (torch_model(inputs) * one_hot).sum()
            (grad,) = torch.autograd.grad(score, inputs)
        return grad

    expected = twins.to_keras_layout(zennit_heatmap().numpy())
    actual = heatmap(x, y)[0].numpy()
    error = float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))
    fns = {
        "heatmap_only": tf.function(heatmap, reduce_retracing=True),
        "heatmap_only_xla": tf.function(heatmap, jit_compile=True, reduce_retracing=True),
        "forward_backward": tf.function(forward_backward, reduce_retracing=True),
    }
    runners = [
        Runner(variant, lambda f=fn: float(f(x, y)[1]), 1, "xla" if variant.endswith("_xla") else "function")
        for variant, fn in fns.items()
    ]
    runners.append(Runner("zennit_heatmap", lambda: float(zennit_heatmap().sum()), 1, "torch eager"))
    runners.append(Runner("torch_forward_backward", lambda: float(torch_forward_backward().sum()), 1, "torch eager"))
    return runners, error


def main(argv=None) -> int:
    side_by_side.run(parse_args(argv), "heatinv vs Zennit", make_runners, "Zennit", "zennit_heatmap", "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
