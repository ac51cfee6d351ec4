"""Rendering heatmaps and images to RGB arrays and PNG files.

No matplotlib: the blue-white-red colormap is a two-piece linear ramp, tiles
are laid out with numpy, and PNGs are encoded by `tf.io.encode_png`.

All functions return `uint8` arrays of shape `[H, W, 3]`.

Example:

>>> import numpy as np
>>> relevance = np.array([[-1.0, 0.0, 1.0]])
>>> diverging_rgb(relevance)[0].tolist()
[[0, 0, 255], [255, 255, 255], [255, 0, 0]]
>>> figure = panel([grayscale_rgb(np.zeros((28, 28))), diverging_rgb(np.ones((28, 28)))])
>>> figure.shape
(112, 226, 3)
>>> write_png("/tmp/figure.png", figure)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from heatinv.atomic import write_bytes

WHITE = 255
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

    Example:

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


def grayscale_rgb(image: np.ndarray, invert: bool = False) -> np.ndarray:
    """Grayscale image in `[0, 1]` to RGB; 0 is black, 1 is white.

    Values outside `[0, 1]` are clipped; non-finite pixels are drawn black.

    Args:
        image: `[H, W]` or `[H, W, 1]` array in `[0, 1]` (`[H, W, 3]`: drawn as its channels' mean).
        invert: draw 0 as white and 1 as black (dark digit on white paper,
            which sits better next to white-centred heatmaps).

    Returns:
        uint8 `[H, W, 3]`.

    Example:

    >>> grayscale_rgb(np.array([[0.0, 1.0]]))[0].tolist()
    [[0, 0, 0], [255, 255, 255]]
    """
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 3:  # a colour input: its brightness, next to one-channel heatmaps
        image = image.mean(axis=-1)
    values = _as_2d(image, "grayscale_rgb", "image").astype(np.float64)
    values = np.clip(np.nan_to_num(values, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
    if invert:
        values = 1.0 - values
    return _to_uint8(np.repeat(values[..., None], 3, axis=-1))


def panel(tiles: list[np.ndarray], scale: int = 4, gap: int = 2) -> np.ndarray:
    """Lays equal-shape RGB tiles out in a row, upscaled, with white gaps.

    Args:
        tiles: non-empty list of uint8 `[h, w, 3]` arrays, all the same shape.
        scale: integer nearest-neighbour upscaling factor (pixels stay crisp).
        gap: white pixels between neighbouring tiles, after scaling.

    Returns:
        uint8 `[h * scale, n * w * scale + (n - 1) * gap, 3]`.

    Example:

    >>> panel([np.zeros((2, 3, 3), np.uint8)] * 2, scale=2, gap=1).shape
    (4, 13, 3)
    """
    return grid([tiles], scale=scale, gap=gap)


def grid(rows: list[list[np.ndarray]], scale: int = 4, gap: int = 2) -> np.ndarray:
    """Lays equal-shape RGB tiles out in rows, upscaled, with white gaps.

    Rows may have different lengths; shorter rows are padded with white on
    the right.

    Args:
        rows: non-empty list of non-empty lists of uint8 `[h, w, 3]` arrays,
            all the same shape.
        scale: integer nearest-neighbour upscaling factor.
        gap: white pixels between neighbouring tiles and rows, after scaling.

    Returns:
        uint8 `[r * h * scale + (r - 1) * gap, n * w * scale + (n - 1) * gap, 3]`
        where `r` is the number of rows and `n` the longest row's length.

    Example:

    >>> tile = np.zeros((2, 3, 3), np.uint8)
    >>> grid([[tile, tile], [tile]], scale=2, gap=1).shape
    (9, 13, 3)
    """
    _check_layout(rows, scale, gap)
    tile_h, tile_w = rows[0][0].shape[0] * scale, rows[0][0].shape[1] * scale
    n_cols = max(len(row) for row in rows)
    height = len(rows) * tile_h + (len(rows) - 1) * gap
    width = n_cols * tile_w + (n_cols - 1) * gap
    canvas = np.full((height, width, 3), WHITE, dtype=np.uint8)
    for r, row in enumerate(rows):
        for c, tile in enumerate(row):
            top, left = r * (tile_h + gap), c * (tile_w + gap)
            canvas[top : top + tile_h, left : left + tile_w] = _upscale(tile, scale)
    return canvas


def write_png(path: str, rgb: np.ndarray) -> None:
    """Writes a uint8 image to a PNG file atomically.

    The bytes go to a temporary file in the destination directory, which is
    then renamed over `path`: a reader (TensorBoard, a browser, a crashed
    run's leftovers) sees the old file or the new one, never half a PNG.
    Missing parent directories are created.

    Args:
        path: destination file name.
        rgb: uint8 `[H, W, 3]` (also `[H, W, 1]` gray or `[H, W, 4]` RGBA).

    Example:

    >>> write_png("/tmp/white.png", np.full((4, 4, 3), 255, np.uint8))  # doctest: +SKIP
    """
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[-1] not in (1, 3, 4) or 0 in rgb.shape:
        raise ValueError(
            f"heatinv/render.py write_png: image for '{path}' has dtype "
            f"{rgb.dtype} and shape {rgb.shape}; expected a non-empty uint8 "
            "array [H, W, 3] (or [H, W, 1] / [H, W, 4]). Convert maps with "
            "diverging_rgb or grayscale_rgb first."
        )
    write_bytes(path, tf.io.encode_png(rgb).numpy())


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


def _upscale(tile: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(tile, scale, axis=0), scale, axis=1)


def _check_layout(rows: list[list[np.ndarray]], scale: int, gap: int) -> None:
    if isinstance(scale, bool) or not isinstance(scale, (int, np.integer)) or scale < 1:
        raise ValueError(f"heatinv/render.py: scale={scale!r}, expected an integer >= 1.")
    if isinstance(gap, bool) or not isinstance(gap, (int, np.integer)) or gap < 0:
        raise ValueError(f"heatinv/render.py: gap={gap!r}, expected an integer >= 0.")
    if not rows or any(len(row) == 0 for row in rows):
        raise ValueError(
            "heatinv/render.py: got an empty row of tiles; expected at least "
            "one tile in every row. Drop empty rows before calling grid/panel."
        )
    first = np.asarray(rows[0][0])
    for r, row in enumerate(rows):
        for c, tile in enumerate(row):
            tile = np.asarray(tile)
            if tile.dtype != np.uint8 or tile.ndim != 3 or tile.shape[-1] != 3 or tile.shape != first.shape:
                raise ValueError(
                    f"heatinv/render.py: tile [{r}][{c}] has dtype {tile.dtype} "
                    f"and shape {tile.shape}; expected uint8 {first.shape} "
                    "like tile [0][0] (uint8 [h, w, 3], all the same shape). "
                    "Convert maps with diverging_rgb or grayscale_rgb, and "
                    "resize tiles to a common size first."
                )

