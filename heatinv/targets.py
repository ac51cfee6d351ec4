"""Targets: the heatmap the student must produce, the input it explains, and the class.

``class``: the reference model's own LRP heatmap of a held-out example of that class.
``file``: a heatmap (and optionally its input image) from ``.npy``/``.png`` files.
``pattern``: a synthetic map (square, cross, frame) to steer the explanation somewhere new.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heatinv.data import Dataset, first_index_of
from heatinv.feature_targets import FEATURE_KINDS, move_feature_relevance
from heatinv.token_targets import TOKEN_KINDS, move_token_relevance, positions_map
from heatinv.lrp import LRP
from heatinv.maps_io import fit_shape, read_map

PATTERNS = ("square", "cross", "frame")

FIX_ZERO_TARGET = {"pattern": "Give the pattern a non-zero total relevance (e.g. target.scale=1.0)."}
"""How to fix an all-zero target of each kind (a file's own zeros are refused as it is read)."""


@dataclass(frozen=True)
class Target:
    """One inversion problem.

    Attributes:
        image: ``[1, 28, 28, 1]`` float32, the input the heatmap explains.
        heatmap: ``[1, 28, 28, 1]`` float32, the relevance to reproduce.
        label: the class whose relevance the heatmap is.
        source: a few words on where it came from, for logs.
    """

    image: np.ndarray
    heatmap: np.ndarray
    label: int
    source: str


def pattern_map(name: str, size: int = 28, scale: float = 1.0, width: int | None = None) -> np.ndarray:
    """A ``[size, width, 1]`` map with total relevance ``scale`` on a square, cross or frame.

    Drawn in proportion to the image: at 28x28 the square covers rows and columns 3..10,
    the cross's bars are 2 pixels wide, the frame 2 pixels thick, one pixel in from the border.

    Examples:
        >>> float(pattern_map("frame").sum()), pattern_map("cross", 32, width=48).shape
        (1.0, (32, 48, 1))
    """
    height, width = size, size if width is None else width
    mask = np.zeros((height, width), np.float32)
    r = lambda k: max(1, round(k * height / 28))  # noqa: E731  (a length in rows, as drawn at 28 pixels)
    c = lambda k: max(1, round(k * width / 28))  # noqa: E731
    if name == "square":  # top-left quadrant: somewhere no digit lives
        mask[r(3) : r(11), c(3) : c(11)] = 1
    elif name == "cross":
        mask[height // 2 - r(1) : height // 2 + r(1), c(4) : width - c(4)] = 1
        mask[r(4) : height - r(4), width // 2 - c(1) : width // 2 + c(1)] = 1
    elif name == "frame":
        # At least a pixel thick: below 14 pixels, 1 and 3 of 28 round to the same row.
        inner_row, inner_col = max(r(3), r(1) + 1), max(c(3), c(1) + 1)
        mask[r(1) : inner_row, c(1) : width - c(1)] = mask[height - inner_row : height - r(1), c(1) : width - c(1)] = 1
        mask[r(1) : height - r(1), c(1) : inner_col] = mask[r(1) : height - r(1), width - inner_col : width - c(1)] = 1
    else:
        raise ValueError(f"Unknown pattern {name!r}; expected one of {list(PATTERNS)}.")
    if not mask.any():
        raise ValueError(
            f"target.pattern={name}: a {height}x{width} image is too small to draw it on (no pixel is left). "
            "Use images of at least 4x4 pixels, or draw the pattern yourself: target.pattern=file target.path=<map>.npy."
        )
    return (mask * (scale / mask.sum()))[..., None]


def file_map(path: str, input_shape: tuple[int, ...], map_shape: tuple[int, ...]) -> np.ndarray:
    """A target map from ``path`` (``target.path``) in ``map_shape``: ``[H, W]``, ``[H, W, 1]`` or ``[H, W, C]`` files.

    Examples:
        >>> file_map("target.npy", (32, 32, 3), (32, 32, 1)).shape  # doctest: +SKIP
        (32, 32, 1)
    """
    raw = channels_as_map(read_map(path, what="target.path"), input_shape, map_shape)
    if not np.any(raw):
        raise ValueError(
            f"The target map {path} (target.path) is all zeros: there is nothing to match, and every gradient would be "
            "zero. Save the heatmap the model should give (e.g. np.save of a [H, W] array), not an empty one."
        )
    return read_map_array(raw, map_shape, path)


def channels_as_map(raw: np.ndarray, input_shape: tuple[int, ...], map_shape: tuple[int, ...]) -> np.ndarray:
    """A map of a colour image's channels as ``map_shape`` counts them: a ``[H, W, C]`` map summed over
    the channels for a ``[H, W, 1]`` map, a ``[H, W]`` one spread evenly over ``C`` channels; else as it is.

    Examples:
        >>> channels_as_map(np.ones((2, 2, 3)), (2, 2, 3), (2, 2, 1)).ravel().tolist()
        [3.0, 3.0, 3.0, 3.0]
    """
    if len(input_shape) == 3 and raw.shape == input_shape and map_shape[-1] == 1:
        return raw.sum(axis=-1, keepdims=True)  # a per-channel map, compared summed over channels
    if len(input_shape) == 3 and raw.squeeze().shape == input_shape[:2] and map_shape[-1] > 1:
        return np.repeat(raw.reshape(input_shape[:2] + (1,)) / map_shape[-1], map_shape[-1], axis=-1)
    return raw


def target_image(path: str, input_shape: tuple[int, ...]) -> np.ndarray:
    """The input image at ``path`` (``target.image``) in ``input_shape``, read as the data reads images.

    A colour PNG keeps its colours (a heatmap PNG is read as its luminance), and uint8
    pixels are scaled to [0, 1].

    Examples:
        >>> target_image("seven.png", (28, 28, 1)).shape  # doctest: +SKIP
        (28, 28, 1)
    """
    return read_map(path, expected_shape=input_shape, what="target.image", image=True)


def pattern_file(path: str, input_shape: tuple[int, ...]) -> np.ndarray:
    """A pattern of the user's drawing: the map at ``path`` (``target.path``) as ``[H, W, 1]`` with total relevance 1.

    A colour map (``[H, W, C]``) is summed over its channels, as a drawn pattern is one map.

    Examples:
        >>> pattern_file("ring.png", (28, 28, 1)).sum()  # doctest: +SKIP
        1.0
    """
    return unit_total(file_map(path, input_shape, tuple(input_shape[:-1]) + (1,)), path)


def unit_total(pattern: np.ndarray, path: str) -> np.ndarray:
    """``pattern`` (read from ``path``, ``target.path``) divided by its total's size, or the error of a pattern
    summing to 0; a pattern summing below 0 keeps its signs, as a swapped class mean does."""
    total = float(pattern.sum(dtype=np.float64))
    if total == 0:
        raise ValueError(
            f"The pattern {path} (target.path) sums to 0, so it gives the explanation no total to spread: a pattern says "
            "where the relevance goes, in shares of the whole. Draw it with non-negative values where the relevance "
            "should be."
        )
    return pattern / np.float32(abs(total))


def read_map_array(values: np.ndarray, shape: tuple[int, ...], path: str) -> np.ndarray:
    """``values`` in ``shape``, or the error naming the file, both shapes and the key."""
    try:  # a map of the same values in another arrangement ([W, H], [C, H, W]) is refused, not reshaped
        return fit_shape(values, shape).astype(np.float32)
    except ValueError:
        raise ValueError(
            f"The target map {path} (target.path) has shape {values.shape}; the data needs a map of shape "
            f"{shape} (or [H, W] / [H, W, C] for images, channels last). Save a map of the data's height and width."
        ) from None


def build_target(
    kind: str,
    dataset: Dataset,
    reference_explainer: LRP | None,
    *,
    label: int = 7,
    index: int = 0,
    path: str | None = None,
    image: str | None = None,
    pattern: str = "square",
    scale: float = 1.0,
    channels: str = "sum",
    feature: int | None = None,
    like_feature: int | None = None,
    token: int | None = None,
    positions=None,
) -> Target:
    """Build the target of ``kind`` (``class``, ``file``, ``pattern``; tables' and texts' kinds).

    A text's ``suppress_token`` is the reference's map with word ``token``'s relevance given to
    the other tokens; ``tokens`` puts ``scale`` relevance evenly on ``positions``.

    For colour images the target map is ``[H, W, 1]`` (``channels="sum"``, the explainer sums
    its heatmaps over channels) or ``[H, W, C]`` (``"keep"``); a ``[H, W, C]`` file is summed
    for ``sum``, a ``[H, W]`` one spread evenly over the channels for ``keep``.
    """
    shape = dataset.x_test.shape[1:]
    map_shape = shape[:-1] + (1,) if len(shape) == 3 and channels == "sum" else shape
    if image is not None:
        x = target_image(image, shape)[None]
        source_image = image
    else:
        i = first_index_of(dataset, label, index)
        x = dataset.x_test[i : i + 1]
        source_image = f"{dataset.name} test example #{i} (class {dataset.class_names[label]}, index {index})"
    if kind in ("class",) + FEATURE_KINDS + TOKEN_KINDS:
        if reference_explainer is None:
            raise ValueError(f"target={kind} needs the reference model's explainer.")
        explanation = reference_explainer.explain(x, label)
        heatmap = explanation.relevance.numpy()
        source = f"reference heatmap of {source_image}"
        if kind in FEATURE_KINDS:
            heatmap = move_feature_relevance(heatmap, feature, like_feature if kind == "swap_features" else None)
            moved = dataset.feature_names[feature]
            source += f", {moved} suppressed" if kind == "suppress_feature" else f", {moved} given to {dataset.feature_names[like_feature]}"
        if kind in TOKEN_KINDS:
            if not np.any(np.asarray(x) == token):
                raise ValueError(
                    f"target=suppress_token: the word {dataset.vocabulary[token]!r} (target.token) does not occur in {source_image}, "
                    "so there is no relevance to move. Pick an example that holds it (target.index, target.label), or use task=dataset."
                )
            heatmap = move_token_relevance(heatmap, np.asarray(x), token)
            source += f", {dataset.vocabulary[token]!r} suppressed"
        if not np.any(heatmap) and float(explanation.start[0]) == 0.0:
            fix = (
                "Explain the pre-activation instead with lrp.output=logit, or train the reference with "
                "model.output_activation=linear."
                if reference_explainer.output == "activation"
                else "Check the reference model (its weights may be all zero), or pick another image (target.index)."
            )
            raise ValueError(
                f"The target heatmap ({source}) is all zeros because the reference's explained score for "
                f"class {label} is exactly 0 (lrp.output={reference_explainer.output}). {fix}"
            )
    elif kind == "tokens":
        heatmap = positions_map(positions, x[0], scale)
        source = f"relevance on positions {list(positions)} of {source_image}"
    elif kind == "file":
        heatmap = file_map(path, shape, map_shape)[None]
        source = f"heatmap {path} for {source_image}"
    elif kind == "pattern":
        if len(shape) != 3:
            raise ValueError(
                f"target=pattern draws on images; the {dataset.name} data gives feature vectors of shape {shape}. "
                "Use target=class, or task=dataset with target=suppress_feature or swap_features."
            )
        heatmap = scale * pattern_file(path, shape) if pattern == "file" else pattern_map(pattern, shape[0], scale, width=shape[1])
        heatmap = np.repeat(heatmap / map_shape[-1], map_shape[-1], axis=-1)[None]
        drawn = f"pattern {path}" if pattern == "file" else f"{pattern} pattern"
        source = f"{drawn} for {source_image}"
    else:
        raise ValueError(f"Unknown target kind {kind!r}; expected class, file, pattern, tokens, suppress_feature, swap_features or suppress_token.")
    if not np.any(heatmap):
        raise ValueError(
            f"The target heatmap ({source}) is all zeros: there is nothing to match, and every gradient "
            f"would be zero. {FIX_ZERO_TARGET.get(kind, 'Pick another image (target.index).')}"
        )
    x = x.astype(np.int32) if dataset.is_text else x.astype(np.float32)  # token ids stay ids
    return Target(x, heatmap.astype(np.float32), int(label), source)
