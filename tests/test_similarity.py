"""Tests for heatinv.similarity against independent numpy computations."""

import numpy as np
import pytest
import tensorflow as tf

from heatinv import similarity as sim

NAMES = {"cosine", "ssim", "pearson", "spearman"}


def _maps(shape=(4, 28, 28, 1), seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _numpy_average_ranks(row):
    """Average ranks via argsort, written independently of the TF version."""
    order = np.argsort(row, kind="stable")
    ranks = np.empty(len(row), dtype=np.float64)
    ranks[order] = np.arange(1, len(row) + 1)
    for value in np.unique(row):
        tied = row == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _numpy_pearson(a, b):
    return np.mean([np.corrcoef(x.ravel(), y.ravel())[0, 1] for x, y in zip(a, b)])


def _numpy_spearman(a, b):
    flat_a, flat_b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    return np.mean(
        [np.corrcoef(_numpy_average_ranks(x), _numpy_average_ranks(y))[0, 1] for x, y in zip(flat_a, flat_b)]
    )


def test_returns_scalar_float32_tensors():
    scores = sim.similarity(_maps(), _maps(seed=1))
    assert set(scores) == NAMES
    for value in scores.values():
        assert isinstance(value, tf.Tensor)
        assert value.shape == () and value.dtype == tf.float32


def test_identical_maps_score_one():
    maps = _maps()
    scores = sim.similarity_numpy(maps, maps)
    assert scores["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert scores["pearson"] == pytest.approx(1.0, abs=1e-6)
    assert scores["spearman"] == pytest.approx(1.0, abs=1e-6)
    assert scores["ssim"] == pytest.approx(1.0, abs=1e-4)


def test_cosine_stays_in_its_range_where_float32_rounds_past_it():
    """A map against itself, or its negation, at many scales: never past +-1, and the float64 value."""
    rng = np.random.default_rng(0)
    maps = (_maps((512, 28, 28, 1)) * rng.choice([3.7e-3, 1.0, 41.0], size=(512, 1, 1, 1))).astype(np.float32)
    for other, expected in ((maps, 1.0), (-maps, -1.0)):
        values = sim.cosine(maps, other).numpy()
        assert np.all(np.abs(values) <= 1.0), "cosine past +-1: float32 rounding not clipped"
        np.testing.assert_allclose(values, sim.cosine_numpy(maps, other), atol=1e-6)
        np.testing.assert_allclose(values, expected, atol=1e-6)


def test_negated_map_scores_minus_one():
    maps = _maps()
    scores = sim.similarity_numpy(maps, -maps)
    assert scores["cosine"] == pytest.approx(-1.0, abs=1e-6)
    assert scores["pearson"] == pytest.approx(-1.0, abs=1e-6)
    assert scores["spearman"] == pytest.approx(-1.0, abs=1e-6)
    # Raw SSIM would score a negated signed map about +0.5; the shift by the
    # target's minimum must make it clearly negative.
    assert scores["ssim"] < -0.5


@pytest.mark.parametrize("factor", [1e-3, 7.0, 1e4])
def test_cosine_pearson_spearman_are_scale_invariant(factor):
    a, b = _maps(seed=2), _maps(seed=3)
    base = sim.similarity_numpy(a, b)
    scaled = sim.similarity_numpy(factor * a, b)
    for name in ("cosine", "pearson", "spearman"):
        assert scaled[name] == pytest.approx(base[name], abs=1e-5)


def test_cosine_matches_numpy():
    a, b = _maps(seed=4), _maps(seed=5)
    flat_a, flat_b = a.reshape(4, -1), b.reshape(4, -1)
    expected = np.mean(
        np.sum(flat_a * flat_b, 1) / (np.linalg.norm(flat_a, axis=1) * np.linalg.norm(flat_b, axis=1))
    )
    assert sim.similarity_numpy(a, b)["cosine"] == pytest.approx(expected, abs=1e-5)


def test_pearson_and_spearman_match_numpy_on_correlated_data():
    rng = np.random.default_rng(6)
    a = rng.normal(size=(5, 784))
    # Nonlinear but monotone-ish relation with noise: Pearson and Spearman
    # differ, so each is checked against its own definition.
    b = np.exp(a) + 0.5 * rng.normal(size=a.shape)
    scores = sim.similarity_numpy(a, b)
    assert scores["pearson"] == pytest.approx(_numpy_pearson(a, b), abs=1e-4)
    assert scores["spearman"] == pytest.approx(_numpy_spearman(a, b), abs=1e-4)
    assert abs(scores["pearson"] - scores["spearman"]) > 0.01


def test_spearman_uses_average_ranks_for_ties():
    rng = np.random.default_rng(7)
    # Heavy ties, like the exact zeros of an LRP map's background.
    a = rng.integers(-2, 3, size=(3, 100)).astype(np.float32)
    b = (a + rng.integers(-1, 2, size=a.shape)).astype(np.float32)
    got = sim.spearman(a, b).numpy()
    expected = [np.corrcoef(_numpy_average_ranks(x), _numpy_average_ranks(y))[0, 1] for x, y in zip(a, b)]
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_average_ranks_matches_numpy():
    values = np.array([[3.0, 1.0, 2.0, 1.0, 5.0, 1.0]], dtype=np.float32)
    np.testing.assert_array_equal(sim.average_ranks(values).numpy()[0], _numpy_average_ranks(values[0]))


def test_spearman_is_invariant_to_monotone_transform():
    a, b = _maps(seed=8), _maps(seed=9)
    base = sim.similarity_numpy(a, b)["spearman"]
    assert sim.similarity_numpy(np.exp(a), b)["spearman"] == pytest.approx(base, abs=1e-5)


def test_zero_and_constant_inputs_are_finite():
    zeros = np.zeros((2, 28, 28, 1), np.float32)
    ones = np.ones((2, 28, 28, 1), np.float32)
    maps = _maps(shape=(2, 28, 28, 1))
    for a, b in [(zeros, zeros), (zeros, maps), (maps, zeros), (ones, maps), (ones, ones)]:
        scores = sim.similarity_numpy(a, b)
        assert all(np.isfinite(v) for v in scores.values()), scores
    assert sim.similarity_numpy(zeros, maps)["cosine"] == 0.0
    assert sim.similarity_numpy(ones, maps)["pearson"] == 0.0
    assert sim.similarity_numpy(zeros, zeros)["ssim"] == pytest.approx(1.0)


def test_cosine_gradient_is_finite_at_zero():
    heatmap = tf.Variable(tf.zeros([2, 28, 28, 1]))
    target = tf.constant(_maps(shape=(2, 28, 28, 1)))
    with tf.GradientTape() as tape:
        loss = -sim.similarity(heatmap, target)["cosine"] - sim.similarity(heatmap, target)["pearson"]
    gradient = tape.gradient(loss, heatmap)
    assert np.all(np.isfinite(gradient.numpy()))


def test_ssim_matches_tf_image_ssim_per_sample():
    a, b = _maps(seed=10), _maps(seed=11)
    b[1] *= 5.0  # a different value range per sample
    got = sim.ssim(a, b).numpy()
    for i in range(len(a)):
        low, value_range = b[i].min(), float(b[i].max() - b[i].min())
        expected = tf.image.ssim(
            a[i : i + 1] - low, b[i : i + 1] - low, max_val=value_range, filter_size=11
        ).numpy()[0]
        assert got[i] == pytest.approx(expected, abs=1e-5)


def test_ssim_flat_square_input_equals_image_input():
    a, b = _maps(seed=12), _maps(seed=13)
    image = sim.similarity_numpy(a, b)
    flat = sim.similarity_numpy(a.reshape(4, 784), b.reshape(4, 784))
    rank3 = sim.similarity_numpy(a[..., 0], b[..., 0])
    for name in NAMES:
        assert flat[name] == pytest.approx(image[name], abs=1e-5)
        assert rank3[name] == pytest.approx(image[name], abs=1e-5)


def test_ssim_prefers_a_shrunken_map_to_a_negated_one():
    target = _maps(seed=23)
    scores = [sim.similarity_numpy(h, target)["ssim"] for h in (target, 0.5 * target, 0 * target, -target)]
    assert scores == sorted(scores, reverse=True)


def test_ssim_small_images_shrink_the_window():
    a, b = _maps(shape=(2, 5, 7, 1), seed=14), _maps(shape=(2, 5, 7, 1), seed=15)
    assert np.isfinite(sim.similarity_numpy(a, b)["ssim"])
    assert sim.similarity_numpy(a, a)["ssim"] == pytest.approx(1.0, abs=1e-4)


def test_global_ssim_for_non_square_vectors():
    rng = np.random.default_rng(16)
    a, b = rng.normal(size=(3, 10)), rng.normal(size=(3, 10))
    got = sim.ssim(a, b).numpy()
    for i in range(3):
        x, y = a[i] - b[i].min(), b[i] - b[i].min()
        c1 = (0.01 * (y.max() - y.min())) ** 2
        c2 = (0.03 * (y.max() - y.min())) ** 2
        cov = np.mean((x - x.mean()) * (y - y.mean()))
        expected = ((2 * x.mean() * y.mean() + c1) * (2 * cov + c2)) / (
            (x.mean() ** 2 + y.mean() ** 2 + c1) * (x.var() + y.var() + c2)
        )
        assert got[i] == pytest.approx(expected, abs=1e-5)
    assert sim.similarity_numpy(a, a)["ssim"] == pytest.approx(1.0, abs=1e-6)


def test_same_values_eager_tf_function_and_xla():
    a, b = _maps(seed=17), _maps(seed=18)
    eager = sim.similarity_numpy(a, b)
    graph = tf.function(sim.similarity)(tf.constant(a), tf.constant(b))
    xla = tf.function(sim.similarity, jit_compile=True)(tf.constant(a), tf.constant(b))
    for name in NAMES:
        assert float(graph[name]) == pytest.approx(eager[name], abs=1e-5)
        assert float(xla[name]) == pytest.approx(eager[name], abs=1e-4)


def test_tf_function_with_unknown_batch_size():
    signature = [tf.TensorSpec([None, 28, 28, 1], tf.float32)] * 2
    traced = tf.function(sim.similarity, input_signature=signature)
    a, b = _maps(seed=19), _maps(seed=20)
    eager = sim.similarity_numpy(a, b)
    for batch in (a, a[:2]):
        scores = traced(tf.constant(batch), tf.constant(b[: len(batch)]))
        assert set(scores) == NAMES
    scores = traced(tf.constant(a), tf.constant(b))
    for name in NAMES:
        assert float(scores[name]) == pytest.approx(eager[name], abs=1e-5)


def test_per_sample_values_average_to_similarity():
    a, b = _maps(seed=21), _maps(seed=22)
    per_sample = sim.per_sample_similarity(a, b)
    total = sim.similarity(a, b)
    for name in NAMES:
        assert per_sample[name].shape == (4,)
        assert float(tf.reduce_mean(per_sample[name])) == pytest.approx(float(total[name]), abs=1e-6)


def test_float64_input_is_accepted():
    a = _maps().astype(np.float64)
    assert sim.similarity(a, a)["cosine"].dtype == tf.float32


def test_shape_mismatch_is_a_clear_error():
    expected = r"heatmap has shape \(4, 28, 28, 1\) but target has shape \(1, 28, 28, 1\)"
    with pytest.raises(ValueError, match=expected):
        sim.similarity(_maps(), _maps(shape=(1, 28, 28, 1)))


def test_unbatched_input_is_a_clear_error():
    with pytest.raises(ValueError, match="batch"):
        sim.similarity(np.zeros(784, np.float32), np.zeros(784, np.float32))


def test_a_map_with_nan_has_no_rank_correlation():
    """NaN sorts anywhere, so its ranks mean nothing: Spearman is NaN (null in metrics.json), like Pearson."""
    maps = np.array([[1.0, np.nan, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]], np.float32)
    target = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]], np.float32)
    rho = sim.spearman(maps, target).numpy()
    assert np.isnan(rho[0]) and rho[1] == 1.0
    assert np.isnan(sim.spearman(target, maps).numpy()[0])
