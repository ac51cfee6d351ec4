"""Heatmaps and images as RGB arrays, pixel for pixel: TensorBoard's per-step image tiles.

A run logs its current heatmap many times; a matplotlib figure (:mod:`heatinv.figures`)
each time would cost more than the step. Here the blue-white-red colormap is a two-piece
linear ramp in numpy. Both functions return ``uint8`` arrays of shape ``[H, W, 3]``.

Examples:
    >>> import numpy as np
    >>> relevance = np.array([[-1.0, 0.0, 1.0]])
    >>> diverging_rgb(relevance)[0].tolist()
    [[0, 0, 255], [255, 255, 255], [255, 0, 0]]
"""

from __future__ import annotations

import numpy as np

# Drawn for NaN/Inf pixels, which the blue-white-red scale has no colour for:
# black stands out, so a diverged run shows up in the figure instead of
# crashing the run that tries to draw it.
NON_FINITE_RGB = (0, 0, 0)


def diverging_rgb(heatmap: np.ndarray, vmax: float | None = None) -> np.ndarray:
    """Signed heatmap to RGB with a blue-white-red scale centred at zero.

    As LRP papers draw relevance: 0 is white, `+vmax` and above is pure red
    `(255, 0, 0)`, `-vmax` and below is pure blue `(0, 0, 255)`, linear in
    between. The scale is symmetric, so equal magnitudes of opposite sign get
    equally saturated colours. Non-finite pixels are drawn black.

    Args:
        heatmap: `[H, W]` or `[H, W, 1]` array of signed relevance.
        vmax: magnitude drawn fully saturated. Defaults to the largest finite
            `|heatmap|`; an all-zero map is drawn all white.

    Returns:
        uint8 `[H, W, 3]`.

    Examples:
        >>> diverging_rgb(np.array([[0.5, -2.0]]), vmax=1.0)[0].tolist()
        [[255, 128, 128], [0, 0, 255]]
    """
    heatmap = np.asarray(heatmap)
    if heatmap.ndim == 3 and heatmap.shape[-1] > 1:  # per-channel relevance (target.channels=keep): a pixel's total
        heatmap = heatmap.sum(axis=-1)
    values = _as_2d(heatmap, "diverging_rgb", "heatmap").astype(np.float64)
    finite = np.isfinite(values)
    scale = _resolve_vmax(values, finite, vmax)
    t = np.clip(np.where(finite, values, 0.0) / scale, -1.0, 1.0)
    # Positive side keeps red at full and fades green/blue; negative side
    # keeps blue at full and fades red/green.
    red = np.where(t >= 0, 1.0, 1.0 + t)
    green = 1.0 - np.abs(t)
    blue = np.where(t <= 0, 1.0, 1.0 - t)
    rgb = _to_uint8(np.stack([red, green, blue], axis=-1))
    rgb[~finite] = NON_FINITE_RGB
    return rgb


def grayscale_rgb(image: np.ndarray) -> np.ndarray:
    """Grayscale image in `[0, 1]` to RGB; 0 is black, 1 is white, as the data holds it.

    Values outside `[0, 1]` are clipped (+inf is white, -inf black); NaN is drawn black. Not inverted: a
    grayscale photo drawn as a negative would mislead, and a digit's strokes are its high values.

    Args:
        image: `[H, W]` or `[H, W, 1]` array in `[0, 1]` (`[H, W, 3]`: drawn as its channels' mean).

    Returns:
        uint8 `[H, W, 3]`.

    Examples:
        >>> grayscale_rgb(np.array([[0.0, 1.0]]))[0].tolist()
        [[0, 0, 0], [255, 255, 255]]
    """
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 3:  # a colour input: its brightness, next to one-channel heatmaps
        image = image.mean(axis=-1)
    values = _as_2d(image, "grayscale_rgb", "image").astype(np.float64)
    values = np.clip(np.nan_to_num(values, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
    return _to_uint8(np.repeat(values[..., None], 3, axis=-1))


def _as_2d(array: np.ndarray, function: str, argument: str) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim != 2 or not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise ValueError(
            f"heatinv/render.py {function}: {argument} has dtype {array.dtype} "
            f"and shape {array.shape}; expected a numeric [H, W] or [H, W, 1] "
            "array. Pass one sample, e.g. batch[0], not a whole batch."
        )
    return array


def _resolve_vmax(values: np.ndarray, finite: np.ndarray, vmax: float | None) -> float:
    if vmax is None:
        largest = float(np.max(np.abs(values[finite]))) if finite.any() else 0.0
        # An all-zero map has no scale; any positive one draws it white.
        return largest if largest > 0.0 else 1.0
    if not np.isfinite(vmax) or vmax <= 0:
        raise ValueError(
            f"heatinv/render.py diverging_rgb: vmax={vmax!r}, expected a "
            "finite positive number (the magnitude drawn fully saturated), or "
            "None to use the map's largest |value|."
        )
    return float(vmax)


def _to_uint8(unit: np.ndarray) -> np.ndarray:
    return np.round(unit * 255.0).astype(np.uint8)
