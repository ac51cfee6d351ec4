"""Tests for heatinv.render: the blue-white-red and grayscale tiles TensorBoard shows."""


import numpy as np
import pytest

from heatinv import render


def test_zero_is_white_max_is_red_min_is_blue():
    heatmap = np.array([[0.0, 2.0, -2.0]])
    rgb = render.diverging_rgb(heatmap)
    assert rgb.dtype == np.uint8 and rgb.shape == (1, 3, 3)
    assert rgb[0, 0].tolist() == [255, 255, 255]
    red, blue = rgb[0, 1], rgb[0, 2]
    assert red[0] == 255 and red[1] < 30 and red[2] < 30
    assert blue[2] == 255 and blue[0] < 30 and blue[1] < 30


def test_colormap_is_symmetric_around_zero():
    values = np.linspace(-3.0, 3.0, 61)[None, :]
    rgb = render.diverging_rgb(values).astype(int)
    mirrored = render.diverging_rgb(-values).astype(int)
    # Flipping the sign swaps the red and blue channels, green unchanged.
    np.testing.assert_array_equal(rgb[..., 0], mirrored[..., 2])
    np.testing.assert_array_equal(rgb[..., 1], mirrored[..., 1])
    np.testing.assert_array_equal(rgb[..., 2], mirrored[..., 0])


def test_colormap_is_monotone_in_magnitude():
    values = np.linspace(0.0, 1.0, 11)[None, :]
    green = render.diverging_rgb(values, vmax=1.0)[0, :, 1].astype(int)
    assert np.all(np.diff(green) < 0)


def test_default_vmax_is_largest_magnitude():
    heatmap = np.array([[0.5, -4.0]])
    rgb = render.diverging_rgb(heatmap)
    assert rgb[0, 1].tolist() == [0, 0, 255]
    assert rgb[0, 0, 0] == 255 and rgb[0, 0, 1] > 200


def test_explicit_vmax_saturates_beyond_it():
    rgb = render.diverging_rgb(np.array([[5.0, 0.5]]), vmax=1.0)
    assert rgb[0, 0].tolist() == [255, 0, 0]
    assert rgb[0, 1].tolist() == [255, 128, 128]


def test_all_zero_map_is_white_and_accepts_channel_axis():
    rgb = render.diverging_rgb(np.zeros((28, 28, 1)))
    assert rgb.shape == (28, 28, 3)
    assert np.all(rgb == 255)


def test_non_finite_pixels_are_black_and_do_not_set_the_scale():
    rgb = render.diverging_rgb(np.array([[np.nan, np.inf, 1.0]]))
    assert rgb[0, 0].tolist() == [0, 0, 0]
    assert rgb[0, 1].tolist() == [0, 0, 0]
    assert rgb[0, 2].tolist() == [255, 0, 0]


@pytest.mark.parametrize("vmax", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_vmax_is_refused(vmax):
    with pytest.raises(ValueError, match="vmax"):
        render.diverging_rgb(np.ones((2, 2)), vmax=vmax)


def test_batched_heatmap_is_refused():
    with pytest.raises(ValueError, match=r"\(4, 28, 28, 1\)"):
        render.diverging_rgb(np.zeros((4, 28, 28, 1)))


def test_grayscale():
    image = np.array([[0.0, 0.5, 1.0, 2.0]])
    rgb = render.grayscale_rgb(image)
    assert rgb.dtype == np.uint8 and rgb.shape == (1, 4, 3)
    assert rgb[0, :, 0].tolist() == [0, 128, 255, 255]
    assert np.all(rgb[..., 0] == rgb[..., 1]) and np.all(rgb[..., 1] == rgb[..., 2])
    assert render.grayscale_rgb(image[..., None])[0, :, 0].tolist() == [0, 128, 255, 255]  # not inverted


def test_per_channel_relevance_is_drawn_as_each_pixels_total():
    # 0.25 + 0.25 + 0.5 = 1.0 at vmax 1: fully red; their mean would be a pale pink.
    heatmap = np.array([[[0.25, 0.25, 0.5], [0.0, -0.5, 0.0]]])
    rgb = render.diverging_rgb(heatmap, vmax=1.0)
    assert rgb.shape == (1, 2, 3)
    assert rgb[0].tolist() == [[255, 0, 0], [128, 128, 255]]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_default_vmax_is_the_largest_finite_magnitude(bad):
    rgb = render.diverging_rgb(np.array([[bad, 2.0, 1.0]]))
    assert rgb[0, 1].tolist() == [255, 0, 0]
    assert rgb[0, 2].tolist() == [255, 128, 128]


def test_grayscale_clips_infinities_and_draws_nan_black():
    rgb = render.grayscale_rgb(np.array([[np.nan, -np.inf, np.inf, 0.5]]))
    assert rgb[0, :, 0].tolist() == [0, 0, 255, 128]


def test_grayscale_of_a_colour_image_is_its_channels_mean():
    image = np.array([[[1.0, 0.0, 0.5], [0.2, 0.2, 0.2]]])
    rgb = render.grayscale_rgb(image)
    assert rgb.shape == (1, 2, 3)
    assert rgb[0, :, 0].tolist() == [128, 51] and np.all(rgb[..., 0] == rgb[..., 2])


def test_grayscale_draws_a_boolean_mask_white_where_true():
    assert render.grayscale_rgb(np.array([[True, False]]))[0, :, 0].tolist() == [255, 0]
