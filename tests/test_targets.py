"""Unit tests for `heatinv.targets`: synthetic pattern maps and `build_target` for each kind.

Uses a small synthetic `Dataset` (two images per digit, each image marked with its index) so
the tests can tell which image a target picked without loading real data.
"""

from __future__ import annotations

import numpy as np
import pytest

from heatinv.data import Dataset
from heatinv.lrp import LRP
from heatinv.models import Architecture, build_model
from heatinv.targets import PATTERNS, Target, build_target, pattern_map


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    """20 test images, labels 0..9 twice; image ``i`` has pixel (14, 14) = 0.5 + i / 100."""
    labels = np.tile(np.arange(10), 2).astype(np.int64)
    x = np.random.default_rng(0).uniform(0, 0.4, (20, 28, 28, 1)).astype(np.float32)
    x[:, 14, 14, 0] = 0.5 + np.arange(20) / 100
    return Dataset(x, labels, x.copy(), labels.copy(), name="synthetic")


def support(heatmap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.nonzero(heatmap[..., 0])
    return rows, cols


@pytest.mark.parametrize("name", PATTERNS)
@pytest.mark.parametrize("scale", [1.0, 0.25, 3.0, -2.0])
def test_pattern_sums_to_scale(name, scale):
    heatmap = pattern_map(name, scale=scale)
    assert heatmap.shape == (28, 28, 1) and heatmap.dtype == np.float32
    assert float(heatmap.sum()) == pytest.approx(scale, rel=1e-5)
    # Uniform on its support: one non-zero value.
    assert len(np.unique(heatmap[heatmap != 0])) == 1


def test_square_is_in_the_top_left_quadrant():
    rows, cols = support(pattern_map("square"))
    assert rows.min() == 3 and rows.max() == 10 and cols.min() == 3 and cols.max() == 10
    assert len(rows) == 64  # a filled 8x8 square


def test_cross_is_centred_and_symmetric():
    heatmap = pattern_map("cross")[..., 0]
    rows, cols = support(heatmap[..., None])
    assert (rows.min() + rows.max()) / 2 == pytest.approx(13.5)
    assert (cols.min() + cols.max()) / 2 == pytest.approx(13.5)
    np.testing.assert_array_equal(heatmap, heatmap.T)  # arms of equal shape
    # The centre is on the cross, the corners are not.
    assert heatmap[13, 13] > 0 and heatmap[14, 14] > 0
    assert heatmap[:4, :4].sum() == 0 and heatmap[-4:, -4:].sum() == 0


def test_frame_hugs_the_border_and_leaves_the_inside_empty():
    heatmap = pattern_map("frame")[..., 0]
    assert heatmap[3:-3, 3:-3].sum() == 0  # nothing inside
    assert np.all(heatmap[1, 1:-1] > 0) and np.all(heatmap[-2, 1:-1] > 0)
    assert np.all(heatmap[1:-1, 1] > 0) and np.all(heatmap[1:-1, -2] > 0)
    # The outermost pixel ring is left blank.
    assert heatmap[0].sum() == heatmap[-1].sum() == heatmap[:, 0].sum() == heatmap[:, -1].sum() == 0


def test_frame_is_two_pixels_thick_one_in_from_the_border():
    """The README's frame drawn by hand: the ring between the 26x26 and the 22x22 centred squares."""
    drawn = np.zeros((28, 28))
    drawn[1:27, 1:27] = 1
    drawn[3:25, 3:25] = 0
    np.testing.assert_allclose(pattern_map("frame")[..., 0], drawn / drawn.sum(), rtol=1e-6)


def test_pattern_size_follows_the_argument():
    heatmap = pattern_map("cross", size=12, scale=2.0)
    assert heatmap.shape == (12, 12, 1)
    assert float(heatmap.sum()) == pytest.approx(2.0)


def test_unknown_pattern_names_the_choices():
    with pytest.raises(ValueError, match=r"circle.*square.*cross.*frame"):
        pattern_map("circle")


def test_pattern_target_uses_the_digits_test_image(dataset):
    target = build_target("pattern", dataset, None, label=3, index=1, pattern="frame", scale=2.0)
    assert isinstance(target, Target)
    assert target.label == 3
    assert target.image.shape == target.heatmap.shape == (1, 28, 28, 1)
    assert target.image.dtype == target.heatmap.dtype == np.float32
    # index 1 of digit 3 is test image #13.
    assert target.image[0, 14, 14, 0] == pytest.approx(0.63)
    np.testing.assert_array_equal(target.heatmap[0], pattern_map("frame", scale=2.0))
    assert "frame" in target.source and "#13" in target.source


def test_pattern_from_a_file_is_the_drawn_map_with_total_scale(dataset, tmp_path):
    """target.pattern=file in a single run raised "Unknown pattern 'file'" after the reference had trained."""
    drawn = np.zeros((28, 28), np.float32)
    drawn[10:18, 10:18] = 2.0
    drawn[12:16, 12:16] = 0.0  # a ring
    np.save(tmp_path / "ring.npy", drawn)
    target = build_target("pattern", dataset, None, label=3, pattern="file", path=str(tmp_path / "ring.npy"), scale=3.0)
    np.testing.assert_allclose(target.heatmap[0, ..., 0], drawn / drawn.sum() * 3.0, rtol=1e-6)
    assert float(target.heatmap.sum()) == pytest.approx(3.0)
    assert str(tmp_path / "ring.npy") in target.source and "#3" in target.source


def test_a_pattern_file_summing_to_zero_is_refused(dataset, tmp_path):
    drawn = np.zeros((28, 28), np.float32)
    drawn[0, 0], drawn[1, 1] = 1.0, -1.0
    np.save(tmp_path / "flat.npy", drawn)
    with pytest.raises(ValueError, match=r"flat\.npy \(target\.path\) sums to 0"):
        build_target("pattern", dataset, None, pattern="file", path=str(tmp_path / "flat.npy"))


def test_file_target_reads_the_heatmap_and_image(dataset, tmp_path):
    heatmap = np.random.default_rng(1).normal(size=(28, 28)).astype(np.float32)
    image = np.random.default_rng(2).uniform(size=(28, 28, 1)).astype(np.float32)
    np.save(tmp_path / "map.npy", heatmap)
    np.save(tmp_path / "image.npy", image)
    target = build_target(
        "file", dataset, None, label=4, path=str(tmp_path / "map.npy"), image=str(tmp_path / "image.npy")
    )
    np.testing.assert_array_equal(target.heatmap, heatmap[None, ..., None])
    np.testing.assert_array_equal(target.image, image[None])
    assert target.label == 4
    assert str(tmp_path / "map.npy") in target.source


def test_file_target_without_image_uses_the_digits_test_image(dataset, tmp_path):
    np.save(tmp_path / "map.npy", pattern_map("square"))
    target = build_target("file", dataset, None, label=2, path=str(tmp_path / "map.npy"))
    assert target.image[0, 14, 14, 0] == pytest.approx(0.52)


def test_digit_target_is_the_explainers_heatmap(dataset):
    model = build_model(Architecture("mlp", hidden=(8,)), seed=0)
    explainer = LRP(model, "epsilon")
    target = build_target("class", dataset, explainer, label=5, index=0)
    np.testing.assert_allclose(target.heatmap, explainer(dataset.x_test[5:6], 5).numpy(), rtol=1e-6)
    assert target.label == 5 and np.any(target.heatmap)


@pytest.mark.parametrize(("kind", "fix"), [("file", "target.path"), ("pattern", "target.scale=1.0")])
def test_all_zero_heatmap_is_refused(dataset, tmp_path, kind, fix):
    np.save(tmp_path / "zeros.npy", np.zeros((28, 28), np.float32))
    with pytest.raises(ValueError, match="all zeros") as info:
        build_target(kind, dataset, None, path=str(tmp_path / "zeros.npy"), scale=0.0)
    assert fix in str(info.value) and "target.index" not in str(info.value)  # the key to change, not an unrelated one


def test_all_zero_reference_heatmap_is_refused(dataset):
    # A model whose weights are all zero explains nothing: its heatmap is exactly 0.
    model = build_model(Architecture("mlp", hidden=(8,)), seed=0)
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    with pytest.raises(ValueError, match="all zeros") as info:
        build_target("class", dataset, LRP(model, "epsilon"), label=7)
    assert "class 7" in str(info.value)  # names the image


def test_digit_target_needs_an_explainer(dataset):
    with pytest.raises(ValueError, match="explainer"):
        build_target("class", dataset, None)


def test_unknown_kind_is_refused(dataset):
    with pytest.raises(ValueError, match=r"'noise'.*class, file, pattern"):
        build_target("noise", dataset, None)


def test_missing_heatmap_file_names_the_path(dataset, tmp_path):
    missing = tmp_path / "nowhere.npy"
    with pytest.raises(FileNotFoundError, match="nowhere.npy"):
        build_target("file", dataset, None, path=str(missing))


def test_missing_digit_image_is_refused(dataset):
    # Only two test images of each digit exist.
    with pytest.raises(ValueError, match="index"):
        build_target("pattern", dataset, None, label=1, index=2)


def test_the_dataset_tasks_target_is_named_with_what_it_moves():
    from omegaconf import OmegaConf

    from heatinv.build import target_detail

    def named(**target):
        return target_detail(OmegaConf.create({"pattern": "frame", "path": None, "like": 0, "top_k": 50, "feature": None, **target}))

    assert named(kind="pattern") == "pattern frame"
    assert named(kind="pattern", pattern="file", path="m.npy") == "pattern file m.npy"
    assert named(kind="swap", like=3) == "swap like class 3"
    swap = OmegaConf.create({"kind": "swap", "pattern": "frame", "path": None, "like": 1, "top_k": 50, "feature": None})
    assert target_detail(swap, ("cat", "dog")) == "swap like class 1 (dog)"  # a folder's class by its name too
    assert named(kind="suppress", top_k=20) == "suppress top 20"
    assert named(kind="suppress_feature", feature="worst area") == "suppress_feature 'worst area'"
    assert named(kind="swap_features", feature="age", like="income") == "swap_features 'age' like 'income'"
    # a table's classes have names too; only swap's like is a class, swap_features' is a feature
    features = OmegaConf.create({"kind": "swap_features", "pattern": "frame", "path": None, "like": "income", "top_k": 50, "feature": "age"})
    assert target_detail(features, ("low", "high")) == "swap_features 'age' like 'income'"


def test_a_drawn_pattern_summing_below_zero_keeps_its_signs():
    """Like a swapped class mean: scaled by its total's size, not turned into its opposite."""
    from heatinv.targets import unit_total

    pattern = np.array([[1.0, -3.0]], np.float32)
    np.testing.assert_allclose(unit_total(pattern, "p.npy"), [[0.5, -1.5]])


def drawn_at_28(name: str) -> np.ndarray:
    """The 28x28 patterns as the docstring describes them, drawn by hand."""
    mask = np.zeros((28, 28))
    if name == "square":
        mask[3:11, 3:11] = 1
    elif name == "cross":
        mask[13:15, 4:24] = mask[4:24, 13:15] = 1
    else:
        mask[1:27, 1:27] = 1
        mask[3:25, 3:25] = 0
    return mask


@pytest.mark.parametrize("name", PATTERNS)
@pytest.mark.parametrize("axis", [0, 1], ids=["tall", "wide"])
def test_pattern_on_a_non_square_image_is_the_28x28_drawing_stretched(name, axis):
    shape = (56, 28) if axis == 0 else (28, 56)
    heatmap = pattern_map(name, shape[0], width=shape[1])[..., 0]
    stretched = np.repeat(drawn_at_28(name), 2, axis=axis)
    np.testing.assert_allclose(heatmap, stretched / stretched.sum(), rtol=1e-6)


def test_cross_on_a_small_image_keeps_bars_at_least_a_pixel_wide():
    # At 12 pixels a 1-pixel half-width rounds to 0; the bars must not vanish.
    drawn = np.zeros((12, 12))
    drawn[5:7, 2:10] = drawn[2:10, 5:7] = 1
    np.testing.assert_allclose(pattern_map("cross", 12)[..., 0], drawn / drawn.sum(), rtol=1e-6)


def test_frame_on_an_image_under_14_pixels_is_a_pixel_thick_not_nan():
    """Below 14 pixels 1 and 3 of 28 round to the same row: the frame was empty, and the target all NaN."""
    expected = np.zeros((12, 12), np.float32)
    expected[1, 1:11] = expected[10, 1:11] = expected[1:11, 1] = expected[1:11, 10] = 1
    np.testing.assert_allclose(pattern_map("frame", 12)[..., 0], expected / expected.sum(), rtol=1e-6)


@pytest.mark.parametrize("name", ["square", "cross", "frame"])
def test_a_pattern_on_an_image_too_small_to_hold_it_is_refused(name):
    with pytest.raises(ValueError, match=f"target.pattern={name}: a 2x2 image is too small"):
        pattern_map(name, 2)


@pytest.fixture(scope="module")
def colour_dataset(dataset) -> Dataset:
    x = np.repeat(dataset.x_test, 3, axis=-1)
    return Dataset(x, dataset.y_test, x.copy(), dataset.y_test.copy(), name="colour")


def test_pattern_target_with_channels_kept_splits_the_scale_over_the_channels(colour_dataset):
    target = build_target("pattern", colour_dataset, None, label=3, pattern="square", scale=3.0, channels="keep")
    assert target.heatmap.shape == (1, 28, 28, 3)
    square = drawn_at_28("square")
    for channel in range(3):
        np.testing.assert_allclose(target.heatmap[0, ..., channel], square / 64, rtol=1e-6)
    assert build_target("pattern", colour_dataset, None, label=3, pattern="square", scale=3.0).heatmap.shape == (1, 28, 28, 1)


def test_a_colour_pattern_file_is_summed_over_its_channels(colour_dataset, tmp_path):
    drawn = np.zeros((28, 28, 3), np.float32)
    drawn[2:6, 2:6, 0], drawn[20:24, 20:24, 2] = 1.0, 3.0
    np.save(tmp_path / "two.npy", drawn)
    target = build_target("pattern", colour_dataset, None, label=3, pattern="file", path=str(tmp_path / "two.npy"), scale=2.0)
    assert target.heatmap.shape == (1, 28, 28, 1)
    np.testing.assert_allclose(target.heatmap[0, ..., 0], drawn.sum(axis=-1) / 64 * 2.0, rtol=1e-6)


def test_a_one_channel_file_target_with_channels_kept_is_spread_evenly(colour_dataset, tmp_path):
    heatmap = np.random.default_rng(3).normal(size=(28, 28)).astype(np.float32)
    np.save(tmp_path / "map.npy", heatmap)
    target = build_target("file", colour_dataset, None, label=2, path=str(tmp_path / "map.npy"), channels="keep")
    assert target.heatmap.shape == (1, 28, 28, 3)
    for channel in range(3):
        np.testing.assert_allclose(target.heatmap[0, ..., channel], heatmap / 3, rtol=1e-6)


@pytest.mark.parametrize(("output", "fix"), [("activation", "lrp.output=logit"), ("logit", "weights may be all zero")])
def test_a_reference_scoring_exactly_zero_is_refused_with_the_fix_for_its_output(dataset, output, fix):
    model = build_model(Architecture("mlp", hidden=(8,), output_activation="relu"), seed=0)
    weights = model.get_weights()
    if output == "activation":  # a dead ReLU output: the activation is 0 whatever the logit
        weights[-2], weights[-1] = np.zeros_like(weights[-2]), np.full_like(weights[-1], -1.0)
    else:
        weights = [np.zeros_like(w) for w in weights]
    model.set_weights(weights)
    with pytest.raises(ValueError, match="exactly 0") as info:
        build_target("class", dataset, LRP(model, "epsilon", output=output), label=7)
    assert fix in str(info.value) and f"lrp.output={output}" in str(info.value)


def test_a_zero_reference_heatmap_of_a_nonzero_score_asks_for_another_image(dataset):
    # Only the output bias is non-zero: the score is 1, all of it on the bias, none on the pixels.
    model = build_model(Architecture("mlp", hidden=(8,)), seed=0)
    weights = [np.zeros_like(w) for w in model.get_weights()]
    weights[-1][:] = 1.0
    model.set_weights(weights)
    with pytest.raises(ValueError, match="all zeros") as info:
        build_target("class", dataset, LRP(model, "epsilon"), label=7)
    assert "target.index" in str(info.value) and "target.scale" not in str(info.value) and "exactly 0" not in str(info.value)


@pytest.fixture(scope="module")
def table() -> Dataset:
    labels = np.tile(np.arange(10), 2).astype(np.int64)
    x = np.random.default_rng(4).normal(size=(20, 5)).astype(np.float32)
    return Dataset(x, labels, x.copy(), labels.copy(), name="table", feature_names=("a", "b", "c", "d", "e"))


def test_a_pattern_on_a_table_is_refused_naming_the_targets_that_fit(table):
    with pytest.raises(ValueError, match=r"draws on images.*shape \(5,\).*suppress_feature"):
        build_target("pattern", table, None, label=3)


def test_feature_targets_move_the_references_relevance_and_name_the_features(table):
    model = build_model(Architecture("mlp", hidden=(8,)), input_shape=(5,), seed=0)
    explainer = LRP(model, "epsilon")
    reference = explainer(table.x_test[3:4], 3).numpy()
    swapped = build_target("swap_features", table, explainer, label=3, feature=1, like_feature=4)
    expected = reference.copy()
    expected[0, 4] += reference[0, 1]
    expected[0, 1] = 0.0
    np.testing.assert_allclose(swapped.heatmap, expected, rtol=1e-5, atol=1e-7)
    assert swapped.source.endswith(", b given to e")
    suppressed = build_target("suppress_feature", table, explainer, label=3, feature=1)
    assert suppressed.heatmap[0, 1] == 0 and suppressed.heatmap.sum() == pytest.approx(reference.sum(), rel=1e-5)
    assert suppressed.source.endswith(", b suppressed")
