"""heatinv's AttnLRP heatmap and LXT's side by side: same transformer, weights, batch, composite and threads.

    python scripts/bench_lxt.py                        # the bench's vit and text models, batch 16, attnlrp
    python scripts/bench_lxt.py --models vit --batch 2 --repeats 1 --min-time 0   # a smoke run

Needs torch and LXT (the README's test command installs both) and a source checkout: the
PyTorch twin of each Keras model is ``tests/lxt_twins.py``'s, the code the cross-check tests
verify, which runs each Keras call as torch ops and LXT 2.1's own rules (float32 here).
The models are ``python -m heatinv.bench``'s ``vit`` and ``text`` (:mod:`heatinv.transformers`:
width 64, 4 blocks of 4 heads); the text's ids have no padding (the twin has no Keras masks).
2 threads each (TensorFlow's intra- and inter-op pools, ``torch.set_num_threads``). Timing is
heatinv's bench's: a warm-up, then interleaved blocks of at least ``--min-time`` seconds,
``--repeats`` times; medians.

Variants (milliseconds per batch):

``heatmap_only``, ``heatmap_only_xla``
    heatinv's compiled heatmap (``LRP.__call__`` in ``tf.function``, without and with XLA).
``lxt_heatmap``
    the twin's forward pass and LXT's modified backward pass, eager PyTorch, relevance taken
    as LXT's users take it (input times gradient; for tokens, at the embedding output).
``forward_backward``, ``torch_forward_backward``
    the plain gradient of the explained logits with respect to the input (for tokens, the
    embedding output) in each framework: the yardstick that tells the frameworks' own speed
    apart from the LRP engines' (the twin with LXT's rules switched off: plain attention,
    LayerNorm and activations).

Before timing, each case checks that the two heatmaps agree (float32: ``relative_error``,
recorded with the LXT variant). Writes ``--out`` (default ``outputs/bench/lxt.json``).
"""

from __future__ import annotations

import argparse
import sys

import side_by_side

MODELS = ("vit", "text")
COMPOSITES = {"attnlrp": "attnlrp", "cp_lrp": "cp"}
"""heatinv's composite -> the twin's attention rule (LXT's ``wrap_attention_forward`` or its CP-LRP wrapper)."""


def parse_args(argv=None) -> argparse.Namespace:
    return side_by_side.parse_args(
        argv, "python scripts/bench_lxt.py", __doc__.split("\n")[0], MODELS, COMPOSITES, "attnlrp", "lxt.json"
    )


def case_data(name: str, batch: int):
    """The Keras model (seeded) and a batch for it: images in [0, 1], or ids 1..999 without padding."""
    import keras
    import numpy as np

    from heatinv import transformers

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if name == "vit":
        return transformers.vit((28, 28, 1), 10), rng.uniform(size=(batch, 28, 28, 1)).astype("float32")
    return transformers.text_classifier(64, 1000, 10), rng.integers(1, 1000, (batch, 64)).astype("int32")


def make_runners(name: str, composite: str, batch: int, stack=None):
    """The runners of one case and the float32 relative L2 error between the two heatmaps (``stack``: unused, no hooks)."""
    import numpy as np
    import tensorflow as tf

    import lxt_twins
    from heatinv.bench import Runner, forward_backward
    from heatinv.lrp import LRP

    model, x_np = case_data(name, batch)
    y_np = np.random.default_rng(1).integers(0, 10, batch)
    x, y = tf.constant(x_np), tf.constant(y_np, tf.int32)
    explainer = LRP(model, composite)
    twin = lxt_twins.Twin(model, COMPOSITES[composite], dtype="float32")

    def heatmap(x, y):
        R = explainer(x, y)
        return R, tf.reduce_sum(R)

    expected, _ = twin.relevance(x_np, y_np)
    actual = heatmap(x, y)[0].numpy()
    error = float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))
    plain = lxt_twins.Twin(model, COMPOSITES[composite], dtype="float32", rules=False)
    runners = [
        Runner("heatmap_only", lambda f=tf.function(heatmap, reduce_retracing=True): float(f(x, y)[1]), 1, "function"),
        Runner(
            "heatmap_only_xla", lambda f=tf.function(heatmap, jit_compile=True, reduce_retracing=True): float(f(x, y)[1]), 1, "xla"
        ),
        Runner("lxt_heatmap", lambda: float(twin.relevance(x_np, y_np)[0].sum()), 1, "torch eager"),
        Runner("forward_backward", lambda f=tf.function(forward_backward(model), reduce_retracing=True): float(f(x, y)[1]), 1, "function"),
        Runner("torch_forward_backward", lambda: float(plain.relevance(x_np, y_np)[0].sum()), 1, "torch eager"),
    ]
    return runners, error


def main(argv=None) -> int:
    side_by_side.run(parse_args(argv), "heatinv vs LXT", make_runners, "LXT", "lxt_heatmap", " (goal >= 1: heatinv at least as fast)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
