"""The twelve Keras applications explained end to end, for every composite, and differentiable.

Each application is built once per module with ``weights=None`` (nothing is downloaded) at
the smallest input it accepts (32x32; InceptionV3 75x75, Xception 71x71) with 10 classes.

Two choices keep this honest and within a few minutes on two cores:

* Randomly initialized BatchNorm statistics (mean 0, variance 1) shrink activations block
  after block until the logits are ~1e-12 and every heatmap is exactly 0. So each model's
  BatchNorm statistics are set once from a batch (momentum 0, one call in training mode), as
  training would leave them; the weights stay random.
* The models are built and explained in float64: LRP-0 and LRP-epsilon multiply relevance
  by ``a / z`` at every layer, and on these random, very deep networks relevance and its
  gradients grow past float32's range (measured on DenseNet121: heatmaps up to 2e45, NaN
  in float32; kernel gradients above 3.4e38, inf in float32 variables).

"Every kernel gets a gradient" is checked with one tape per application, for one composite
per application in rotation, so every composite is differentiated through several
architectures without paying 7 second-order passes per model. A kernel whose gradient is
exactly zero for the model's own logit (a sigmoid gate saturated at exactly 1.0 in
EfficientNetB0's late squeeze-and-excitation blocks) cannot move the heatmap either; the
test requires a non-zero heatmap gradient for every kernel that moves the logit, and a
connected (not None) one for all.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from heatinv.lrp import COMPOSITES, LRP

A = keras.applications
APPLICATIONS = {
    "VGG16": (A.VGG16, 32),
    "VGG19": (A.VGG19, 32),
    "ResNet50": (A.ResNet50, 32),
    "ResNet101": (A.ResNet101, 32),
    "ResNet50V2": (A.ResNet50V2, 32),
    "MobileNet": (A.MobileNet, 32),
    "MobileNetV2": (A.MobileNetV2, 32),
    "MobileNetV3Small": (A.MobileNetV3Small, 32),
    "DenseNet121": (A.DenseNet121, 32),
    "EfficientNetB0": (A.EfficientNetB0, 32),
    "InceptionV3": (A.InceptionV3, 75),
    "Xception": (A.Xception, 71),
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built():
    """name -> (model, input batch of 2 in [0, 1], float64); each built on first use."""
    cache = {}

    def get(name):
        if name not in cache:
            factory, size = APPLICATIONS[name]
            keras.utils.set_random_seed(0)
            # Keras caches its global dtype policy on first use: set both, restore both
            floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
            keras.config.set_floatx("float64")
            keras.config.set_dtype_policy("float64")
            try:
                model = factory(weights=None, input_shape=(size, size, 3), classes=10, classifier_activation=None)
            finally:
                keras.config.set_floatx(floatx)
                keras.config.set_dtype_policy(policy)
            assert model.dtype == "float64"
            x = np.random.default_rng(0).uniform(size=(2, size, size, 3))
            norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
            for layer in norms:
                layer.momentum = 0.0
            model(x, training=True)
            for layer in norms:
                layer.momentum = 0.99
            cache[name] = model, x
        return cache[name]

    yield get
    keras.backend.clear_session()


@pytest.mark.parametrize("name", sorted(APPLICATIONS))
def test_every_composite_gives_a_finite_non_zero_heatmap(built, name):
    model, x = built(name)
    for composite in COMPOSITES:
        heatmap = LRP(model, composite)(x[:1], 3).numpy()
        assert heatmap.shape == x[:1].shape and heatmap.dtype == np.float64, composite
        assert np.all(np.isfinite(heatmap)), composite
        assert np.any(heatmap != 0), composite


@pytest.mark.parametrize("index, name", list(enumerate(sorted(APPLICATIONS))))
def test_a_heatmap_loss_reaches_every_kernel(built, index, name):
    model, x = built(name)
    composite = sorted(COMPOSITES)[index % len(COMPOSITES)]
    kernels = [v for v in model.trainable_variables if v.path.endswith("kernel")]
    sample = tf.constant(x[:1])
    with tf.GradientTape() as tape:
        logit = model(sample, training=False)[:, 3]
    moves_logit = [g is not None and np.any(g.numpy() != 0) for g in tape.gradient(logit, kernels)]
    lrp = LRP(model, composite)
    weights = tf.constant(np.random.default_rng(1).normal(size=x[:1].shape))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(lrp(sample, 3) * weights)
    gradients = tape.gradient(loss, kernels)
    assert sum(moves_logit) > 0.9 * len(kernels)
    disconnected = [v.path for v, g in zip(kernels, gradients) if g is None]
    assert not disconnected, disconnected
    still = [v.path for v, g, moves in zip(kernels, gradients, moves_logit) if moves and not np.any(g.numpy() != 0)]
    assert not still, f"{composite}: no heatmap gradient for {still}"
    assert all(np.all(np.isfinite(g.numpy())) for g in gradients)


@pytest.mark.parametrize("name", sorted(APPLICATIONS))
def test_the_doctor_walks_every_application(built, name):
    """Every check reads these graphs (merges of operands of different shapes: EfficientNet's and MobileNetV3's gates)."""
    from heatinv.doctor import HeatmapObjective, diagnose

    model, x = built(name)
    target = np.random.default_rng(2).normal(size=x[:1].shape)
    findings = diagnose(model, x[:1], 3, HeatmapObjective(target, LRP(model, "epsilon_gamma_box")), precision="float64")
    assert not {f.code for f in findings} & {"non-finite", "all-zero", "vanished-signal"}, [f.message for f in findings]
