"""Unit tests for `heatinv.losses`: the heatmap losses and the map normalizations.

Every loss measures the residual in units of the target's largest magnitude, so Huber's
``delta`` is a fraction of that peak and no loss depends on the overall scale of the pair.
``normalize="sum"``/``"max"`` rescale each map before that, which makes the loss blind to the
student's own scale; ``"none"`` does not.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from heatinv.losses import LOSSES, NORMALIZATIONS, heatmap_loss, normalize_map


def huber_reference(heatmap: np.ndarray, target: np.ndarray, delta: float) -> float:
    """Huber on the raw residual with an absolute threshold ``delta * max|target|``, in peak units."""
    peak = np.abs(target).max()
    threshold = delta * peak
    r = np.abs(heatmap - target).astype(np.float64)
    raw = np.where(r <= threshold, 0.5 * r**2, threshold * (r - 0.5 * threshold))
    return float(raw.mean() / peak**2)


@pytest.fixture
def pair(rng):
    """A heatmap/target pair of small, signed, heatmap-sized numbers, ``[2, 28, 28, 1]``."""
    target = rng.normal(0.0, 0.01, (2, 28, 28, 1)).astype(np.float32)
    heatmap = target + rng.normal(0.0, 0.01, target.shape).astype(np.float32)
    return heatmap, target


def value(fn, heatmap, target) -> float:
    return float(fn(tf.constant(heatmap), tf.constant(target)))


def test_docstring_example():
    fn = heatmap_loss("huber", delta=0.1)
    target = np.array([[0.0, 0.0, 0.0, 1.0]], np.float32)
    assert value(fn, np.zeros([1, 4], np.float32), target) == pytest.approx(0.02375)


@pytest.mark.parametrize("delta", [0.01, 0.1, 0.5, 2.0])
def test_huber_delta_is_a_fraction_of_the_target_peak(pair, delta):
    heatmap, target = pair
    expected = huber_reference(heatmap, target, delta)
    assert value(heatmap_loss("huber", delta=delta), heatmap, target) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("name", ["mse", "l1", "huber"])
def test_the_unit_is_the_peak_magnitude_when_the_peak_is_negative(name):
    """The target's largest value is 0.5 but its largest magnitude 4: the residual is in units of 4."""
    target = np.array([[0.5, -4.0, 0.0, 1.0]])
    heatmap = np.array([[0.0, -1.0, 0.3, 1.0]])
    r = np.abs(heatmap - target) / 4.0
    delta = 0.1
    expected = {"mse": np.mean(r**2), "l1": np.mean(r),
                "huber": np.mean(np.where(r <= delta, 0.5 * r**2, delta * (r - 0.5 * delta)))}[name]
    fn = heatmap_loss(name, delta=delta)
    assert value(fn, heatmap, target) == pytest.approx(expected, rel=1e-9)
    assert value(fn, -heatmap, -target) == pytest.approx(expected, rel=1e-9)


def test_huber_switches_at_delta_times_peak():
    # One residual just below and one just above delta * peak (peak = 4, delta = 0.25 -> 1.0).
    target = np.array([[4.0, 0.0, 0.0]], np.float32)
    below = np.array([[4.0, 0.9, 0.0]], np.float32)
    above = np.array([[4.0, 1.1, 0.0]], np.float32)
    fn = heatmap_loss("huber", delta=0.25)
    # In peak units: r = 0.225 -> quadratic 0.5 r^2; r = 0.275 -> linear 0.25 (r - 0.125).
    assert value(fn, below, target) == pytest.approx(0.5 * 0.225**2 / 3, rel=1e-5)
    assert value(fn, above, target) == pytest.approx(0.25 * (0.275 - 0.125) / 3, rel=1e-5)


def test_huber_with_large_delta_is_half_mse(pair):
    heatmap, target = pair  # residuals are a few peak-units at most; delta 100 keeps all quadratic
    huber = value(heatmap_loss("huber", delta=100.0), heatmap, target)
    mse = value(heatmap_loss("mse"), heatmap, target)
    assert huber == pytest.approx(0.5 * mse, rel=1e-5)


def test_l1_and_mse_in_peak_units(pair):
    heatmap, target = pair
    peak = np.abs(target).max()
    residual = (heatmap.astype(np.float64) - target) / peak
    assert value(heatmap_loss("l1"), heatmap, target) == pytest.approx(np.abs(residual).mean(), rel=1e-5)
    assert value(heatmap_loss("mse"), heatmap, target) == pytest.approx((residual**2).mean(), rel=1e-5)


@pytest.mark.parametrize("name", LOSSES)
def test_loss_is_zero_only_at_the_target(pair, name):
    heatmap, target = pair
    fn = heatmap_loss(name)
    assert value(fn, target, target) == 0.0
    assert value(fn, heatmap, target) > 0.0


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("scale", [1e-4, 1e3])
def test_loss_does_not_depend_on_the_pair_scale(pair, name, scale):
    heatmap, target = pair
    fn = heatmap_loss(name)
    assert value(fn, heatmap * scale, target * scale) == pytest.approx(value(fn, heatmap, target), rel=1e-4)


@pytest.mark.parametrize("how", ["sum", "max"])
@pytest.mark.parametrize("name", LOSSES)
def test_sum_and_max_normalization_ignore_each_maps_scale(pair, name, how):
    heatmap, target = pair
    fn = heatmap_loss(name, normalize=how)
    base = value(fn, heatmap, target)
    assert value(fn, heatmap * 7.0, target) == pytest.approx(base, rel=1e-4)
    assert value(fn, heatmap, target * 0.01) == pytest.approx(base, rel=1e-4)
    # A rescaled copy of the target is a perfect match.
    assert value(fn, target * 3.0, target) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("name", LOSSES)
def test_no_normalization_sees_the_students_scale(pair, name):
    _, target = pair
    # Three times the target is off by twice its own size everywhere: far from a match unless normalized.
    scaled = value(heatmap_loss(name, normalize="none"), target * 3.0, target)
    assert scaled > 1e-2
    assert scaled > 1e3 * value(heatmap_loss(name, normalize="max"), target * 3.0, target)


def test_normalize_map_per_sample(rng):
    scales = np.array([1e-3, 1.0, 50.0], np.float32)[:, None, None, None]
    maps = rng.normal(size=(3, 5, 5, 1)).astype(np.float32) * scales
    by_sum = normalize_map(tf.constant(maps), "sum").numpy()
    by_max = normalize_map(tf.constant(maps), "max").numpy()
    np.testing.assert_allclose(np.abs(by_sum).sum(axis=(1, 2, 3)), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.abs(by_max).max(axis=(1, 2, 3)), 1.0, rtol=1e-6)
    # Signs and relative sizes survive.
    np.testing.assert_array_equal(np.sign(by_sum), np.sign(maps))
    np.testing.assert_array_equal(normalize_map(tf.constant(maps), "none").numpy(), maps)


@pytest.mark.parametrize("how", NORMALIZATIONS)
@pytest.mark.parametrize("name", LOSSES)
def test_all_zero_student_map_gives_finite_loss_and_gradient(name, how):
    # The all-zero map is what a dead output produces; it must not turn into NaN.
    target = tf.constant(np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 4, 4, 1))
    heatmap = tf.Variable(tf.zeros_like(target))
    with tf.GradientTape() as tape:
        loss = heatmap_loss(name, normalize=how)(heatmap, target)
    gradient = tape.gradient(loss, heatmap)
    assert np.isfinite(float(loss)) and float(loss) > 0
    assert np.all(np.isfinite(gradient.numpy()))


@pytest.mark.parametrize("name", LOSSES)
def test_gradient_points_towards_the_target(pair, name):
    heatmap, target = pair
    variable = tf.Variable(heatmap)
    fn = heatmap_loss(name, delta=0.1)
    with tf.GradientTape() as tape:
        loss = fn(variable, tf.constant(target))
    gradient = tape.gradient(loss, variable).numpy()
    # Descending the gradient moves every pixel towards its target value.
    moved = heatmap - 1e-3 * gradient / np.abs(gradient).max()
    assert value(fn, moved, target) < float(loss)
    np.testing.assert_array_equal(np.sign(gradient)[heatmap != target], np.sign(heatmap - target)[heatmap != target])


def test_float64_maps_stay_float64(pair):
    heatmap, target = pair
    loss = heatmap_loss("huber")(tf.constant(heatmap, tf.float64), tf.constant(target))
    assert loss.dtype == tf.float64


def test_unknown_loss_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"l3.*'l1', 'mse', 'huber'"):
        heatmap_loss("l3")


def test_unknown_normalization_is_refused_with_the_choices(pair):
    heatmap, target = pair
    with pytest.raises(ValueError, match=r"l2.*'none', 'sum', 'max'"):
        heatmap_loss("mse", normalize="l2")(tf.constant(heatmap), tf.constant(target))
