"""The figures a person reads: titles, one shared colour bar, amplified tiny panels, PNG + SVG."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from heatinv.figures import Row, dataset_figure, feature_figure, heatmap_figure, save, to_rgb


def _maps(seed=0, shape=(12, 10)):
    rng = np.random.default_rng(seed)
    return rng.random(shape), rng.normal(size=shape)


def _caption(fig) -> str:
    """Every text line drawn below the panels (scores, notes), joined."""
    return " ".join(t.get_text() for t in fig.texts)


def _image_axes(fig):
    return [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]


def _colorbars(fig):
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def test_heatmap_figure_titles_panels_and_one_shared_scale():
    image, target = _maps()
    fig = heatmap_figure(image, target, 0.5 * target, 0.9 * target, {"cosine": 0.98765, "ssim": 0.5}, title="digit 7")
    axes = _image_axes(fig)
    assert [ax.get_title() for ax in axes] == ["input", "target", "initial", "final", "target - final"]
    assert len(_colorbars(fig)) == 1
    peak = np.abs(target).max()
    for ax in axes[1:]:
        assert ax.images[0].get_clim() == pytest.approx((-peak, peak))
    texts = _caption(fig)
    assert "cosine 0.98765" in texts and "ssim 0.5" in texts  # six significant digits: 0.999995 is not "1"
    assert fig._suptitle.get_text() == "digit 7"


def test_tiny_panel_is_amplified_and_says_so():
    image, target = _maps()
    fig = heatmap_figure(image, target, 0.003 * target, target, {"cosine": 1.0})
    axes = _image_axes(fig)
    # 0.003 of the scale: 10 ** floor(log10(1 / 0.003)) = 100, drawn at 0.3 of the bar
    assert axes[2].get_title() == "initial (x100)"
    drawn = axes[2].images[0].get_array()
    assert np.abs(drawn).max() == pytest.approx(0.3 * np.abs(target).max())
    # final == target: the difference is exactly zero, nothing to amplify, and the title stays plain
    assert axes[4].get_title() == "target - final"
    assert "times N" in _caption(fig)


def test_saturated_panel_is_attenuated_and_says_so():
    image, target = _maps()
    fig = heatmap_figure(image, target, target, 30 * target, {"cosine": 1.0})
    axes = _image_axes(fig)
    # 30 times the scale: 10 ** -ceil(log10(30)) = 0.01, drawn at 0.3 of the bar instead of all one colour
    assert axes[3].get_title() == "final (x0.01)"
    drawn = axes[3].images[0].get_array()
    assert np.abs(drawn).max() == pytest.approx(0.3 * np.abs(target).max())
    # at the scale itself (initial == target) and at 2x, the panel is drawn as it is
    assert axes[2].get_title() == "initial"
    assert "times N" in _caption(fig)
    fig = heatmap_figure(image, target, 2 * target, target)
    assert _image_axes(fig)[2].get_title() == "initial"
    assert "times N" not in _caption(fig)


def test_channels_are_summed_and_rgb_inputs_drawn_in_colour():
    rng = np.random.default_rng(1)
    image, maps = rng.random((8, 8, 3)), rng.normal(size=(8, 8, 3))
    fig = heatmap_figure(image, maps, maps, maps)
    axes = _image_axes(fig)
    assert axes[0].images[0].get_array().shape == (8, 8, 3)
    np.testing.assert_allclose(axes[1].images[0].get_array(), maps.sum(-1))


def test_a_one_channel_input_is_drawn_as_its_values_not_inverted():
    """A grayscale photo (data.color_mode=grayscale) was drawn as its negative, for the digits' dark-ink look."""
    rng = np.random.default_rng(2)
    image, maps = rng.random((8, 8, 1)), rng.normal(size=(8, 8, 1))
    shown = _image_axes(heatmap_figure(image, maps, maps, maps))[0].images[0]
    assert shown.get_cmap().name == "gray" and shown.norm(1.0) == 1.0  # 1 is white
    np.testing.assert_array_equal(shown.get_array(), image[..., 0])


def test_dataset_figure_rows_columns_and_student_on_target_scale():
    image, target = _maps(2)
    rows = [Row(image, 2 * target, target, 0.5 * target, label=str(k), cosine=0.9 + k / 100) for k in range(3)]
    fig = dataset_figure(rows, title="pattern")
    axes = _image_axes(fig)
    assert len(axes) == 12 and len(_colorbars(fig)) == 3
    assert {bar.get_ylabel() for bar in _colorbars(fig)} == {"relevance"}  # as the single run's bar says
    assert [ax.get_title() for ax in axes[:4]] == ["input", "reference", "target", "student"]
    assert axes[4].get_ylabel() == "class 1\ncos 0.910"
    scale = 2 * np.abs(target).max()  # the reference's peak is the row's largest
    for ax in axes[1:4]:
        assert ax.images[0].get_clim() == pytest.approx((-scale, scale))


def test_dataset_figure_says_what_a_rescaled_panel_means():
    image, target = _maps(3)
    plain = [Row(image, target, target, 0.5 * target, label="0", cosine=0.5)]
    assert "times N" not in _caption(dataset_figure(plain))
    # the second row's student is a thousandth of its scale: drawn x1000, and the figure says what that means
    rows = plain + [Row(image, target, target, 0.001 * target, label="1", cosine=0.5)]
    fig = dataset_figure(rows)
    assert _marks(_image_axes(fig)[7]) == ["x1000"]
    assert "a panel marked xN shows its values times N" in _caption(fig)
    # In the first row the factor is the panel's own, inside it: neither "student (x1000)" nor a
    # title on the column's header line, both read as the whole column's.
    first = dataset_figure(rows[::-1])
    student = _image_axes(first)[3]
    assert student.get_title() == "student" and student.get_title(loc="right") == "" and _marks(student) == ["x1000"]
    assert _marks(_image_axes(first)[7]) == []


def _marks(ax) -> list[str]:
    """The texts drawn inside a panel (its axes' own coordinates), such as a rescaling factor."""
    return [t.get_text() for t in ax.texts if t.get_transform() == ax.transAxes]


def test_save_writes_png_and_svg_whole(tmp_path):
    image, target = _maps()
    paths = save(heatmap_figure(image, target, target, target, {"cosine": 1.0}), str(tmp_path / "sub" / "heatmaps"))
    assert paths == [str(tmp_path / "sub" / "heatmaps.png"), str(tmp_path / "sub" / "heatmaps.svg")]
    with Image.open(paths[0]) as png:
        width, height = png.size
    assert width > 3 * height > 600  # a row of five panels with a colour bar
    assert open(paths[1]).read().lstrip().startswith("<?xml")
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["heatmaps.png", "heatmaps.svg"]


def test_to_rgb_renders_the_figure():
    image, target = _maps()
    rgb = to_rgb(heatmap_figure(image, target, target, target))
    assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[-1] == 3
    # red and blue pixels of the heatmaps are there, not a blank canvas
    assert ((rgb[..., 0] > 200) & (rgb[..., 2] < 60)).any() and ((rgb[..., 2] > 200) & (rgb[..., 0] < 60)).any()


@pytest.mark.parametrize("bad", [np.zeros((2, 8, 8, 1)), np.zeros(8)])
def test_bad_map_shapes_are_refused(bad):
    image, target = _maps()
    with pytest.raises(ValueError, match="target heatmap has shape"):
        heatmap_figure(image, bad, target, target)


def test_empty_dataset_figure_is_refused():
    with pytest.raises(ValueError, match="at least one row"):
        dataset_figure([])


def test_a_tables_bar_chart_says_which_features_it_shows():
    names = [f"f{i}" for i in range(30)]
    maps = {"target": np.linspace(0.0, 1.0, 30), "student": np.zeros(30)}
    ax = feature_figure(names, maps, top=15).axes[0]
    assert ax.get_xlabel() == "relevance (the 15 of 30 features largest in any map)"
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"f{i}" for i in range(15, 30)]  # largest at the top
    assert feature_figure(names[:5], {k: v[:5] for k, v in maps.items()}).axes[0].get_xlabel() == "relevance"


def test_difference_panel_is_target_minus_final_under_a_labelled_bar():
    image, target = _maps()
    final = 0.25 * target + 0.1
    fig = heatmap_figure(image, target, target, final)
    np.testing.assert_allclose(_image_axes(fig)[4].images[0].get_array(), target - final)
    assert [bar.get_ylabel() for bar in _colorbars(fig)] == ["relevance"]


def test_an_all_zero_target_takes_the_final_maps_scale_and_non_finite_values_are_left_out():
    image, target = _maps()
    fig = heatmap_figure(image, np.zeros_like(target), target, target)
    peak = np.abs(target).max()
    assert _image_axes(fig)[1].images[0].get_clim() == pytest.approx((-peak, peak))
    spiked = target.copy()
    spiked[0, 0] = np.nan
    peak = np.nanmax(np.abs(spiked))
    fig = heatmap_figure(image, spiked, spiked, spiked)
    assert _image_axes(fig)[1].images[0].get_clim() == pytest.approx((-peak, peak))


def test_a_panel_past_twice_the_scale_is_attenuated():
    image, target = _maps()
    # 3 times the scale: past SATURATED (2), 10 ** -ceil(log10(3)) = 0.1
    assert _image_axes(heatmap_figure(image, target, 3 * target, target))[2].get_title() == "initial (x0.1)"


def test_caption_lists_the_scores_in_order_then_the_rescaling_note():
    image, target = _maps()
    scores = {"loss": 0.125, "spearman": 0.5, "pearson": 0.75, "ssim": None, "cosine": 0.875, "steps": 4}
    fig = heatmap_figure(image, target, 0.001 * target, target, scores)
    scores_line, note = _caption(fig).split("\n")
    assert scores_line == "cosine 0.875   pearson 0.75   spearman 0.5   loss 0.125"
    assert note == "a panel marked xN shows its values times N on the colour bar"
    to_rgb(fig)  # drawn: the caption sits under the panels, not over them
    below = min(ax.get_window_extent().y0 for ax in fig.axes)
    assert fig.texts[0].get_window_extent().y1 < below


def test_input_outside_0_1_is_drawn_over_its_own_range():
    image, target = _maps()
    standardized = 1.5 * image - 1.0  # below 0, not above 1
    shown = _image_axes(heatmap_figure(standardized, target, target, target))[0].images[0].get_array()
    low, high = standardized.min(), standardized.max()
    np.testing.assert_allclose(shown, (standardized - low) / (high - low))


def test_dataset_figure_names_the_columns_once_and_grows_a_row_at_a_time():
    image, target = _maps(2)
    rows = [Row(image, target, target, target, label=str(k), cosine=0.5) for k in range(3)]
    fig = dataset_figure(rows, title="pattern")
    assert fig._suptitle.get_text() == "pattern"
    assert [ax.get_title() for ax in _image_axes(fig)[4:]] == [""] * 8
    # 2.2 inches a row: at 80 dpi two more rows are 2 * 176 pixels taller
    assert to_rgb(fig).shape[0] - to_rgb(dataset_figure(rows[:1])).shape[0] == 2 * 176


def test_dataset_figure_notes_a_rescaled_panel_of_any_row():
    image, target = _maps(3)
    rows = [Row(image, target, target, 0.001 * target, label="0", cosine=0.5),
            Row(image, target, target, target, label="1", cosine=0.5)]
    assert _caption(dataset_figure(rows)) == "a panel marked xN shows its values times N on the colour bar"


def test_save_writes_a_110_dpi_png_with_the_caption_inside(tmp_path):
    image, target = _maps()
    sizes = {}
    for name, scores in (("bare", None), ("scored", {"cosine": 1.0})):
        (png, _) = save(heatmap_figure(image, target, target, target, scores), str(tmp_path / name))
        with Image.open(png) as opened:
            sizes[name] = opened.size
            assert opened.info["dpi"] == pytest.approx((110, 110), abs=0.01)
    # the caption under the panels is cropped in, not cut off at the figure's edge
    assert sizes["scored"][0] == sizes["bare"][0] and sizes["scored"][1] > sizes["bare"][1]


def test_a_failed_save_leaves_the_earlier_file_and_no_temporary_one(tmp_path):
    image, target = _maps()
    fig = heatmap_figure(image, target, target, target)
    (tmp_path / "heatmaps.png").write_bytes(b"earlier")

    def broken(path, **kwargs):
        with open(path, "wb") as f:
            f.write(b"half a PNG")
        raise OSError("disk full")

    fig.savefig = broken
    with pytest.raises(OSError, match="disk full"):
        save(fig, str(tmp_path / "heatmaps"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heatmaps.png"]
    assert (tmp_path / "heatmaps.png").read_bytes() == b"earlier"


def test_to_rgb_renders_at_the_asked_dpi():
    image, target = _maps()
    # 12.5 x 3.3 inches
    assert to_rgb(heatmap_figure(image, target, target, target), dpi=40).shape == (132, 500, 3)


def test_feature_bars_rank_by_absolute_relevance_and_show_each_maps_values():
    names = ["a", "b", "c", "d"]
    maps = {"target": np.array([0.1, -0.9, 0.5, 0.0]), "student": np.array([0.2, 0.3, -0.4, 0.05])}
    ax = feature_figure(names, maps, title="credit", top=3).axes[0]
    # b's -0.9 is the largest relevance in either map: a negative one tells as much as a positive one
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "c", "b"]  # the largest at the top
    assert ax.get_title() == "credit"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["target", "student"]
    bars = {container.get_label(): container.patches for container in ax.containers}
    for label, values in maps.items():
        assert [bar.get_width() for bar in bars[label]] == pytest.approx(values[[0, 2, 1]].tolist())
    for k, tick in enumerate(ax.get_yticks()):
        (low, middle), (touching, high) = sorted((bar[k].get_y(), bar[k].get_y() + bar[k].get_height()) for bar in bars.values())
        # side by side, not drawn over each other, and labelled at the group's centre
        assert middle == pytest.approx(touching) and tick == pytest.approx((low + high) / 2)
