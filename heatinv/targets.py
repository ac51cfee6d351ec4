"""Targets: the heatmap the student must produce, the input it explains, and the class.

``digit``: the reference model's own LRP heatmap of a held-out test image of that digit.
``file``: a heatmap (and optionally its input image) from ``.npy``/``.png`` files.
``pattern``: a synthetic map (square, cross, frame) to steer the explanation somewhere new.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heatinv.data import Dataset, first_index_of
from heatinv.lrp import LRP
from heatinv.maps_io import read_map

PATTERNS = ("square", "cross", "frame")


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


def pattern_map(name: str, size: int = 28, scale: float = 1.0) -> np.ndarray:
    """A ``[size, size, 1]`` map with total relevance ``scale`` on a square, cross or frame.

    Example:
    >>> float(pattern_map("frame").sum())
    1.0
    """
    mask = np.zeros((size, size), np.float32)
    if name == "square":  # top-left quadrant: somewhere no digit lives
        mask[3:11, 3:11] = 1
    elif name == "cross":
        mask[size // 2 - 1 : size // 2 + 1, 4:-4] = 1
        mask[4:-4, size // 2 - 1 : size // 2 + 1] = 1
    elif name == "frame":
        mask[1:3, 1:-1] = mask[-3:-1, 1:-1] = 1
        mask[1:-1, 1:3] = mask[1:-1, -3:-1] = 1
    else:
        raise ValueError(f"Unknown pattern {name!r}; expected one of {list(PATTERNS)}.")
    return (mask * (scale / mask.sum()))[..., None]


def build_target(
    kind: str,
    dataset: Dataset,
    reference_explainer: LRP | None,
    *,
    digit: int = 7,
    index: int = 0,
    path: str | None = None,
    image: str | None = None,
    pattern: str = "square",
    scale: float = 1.0,
) -> Target:
    """Build the target of ``kind`` (``digit``, ``file`` or ``pattern``)."""
    shape = dataset.x_test.shape[1:]
    if image is not None:
        x = read_map(image, expected_shape=shape, what="target.image")[None]
        source_image = image
    else:
        i = first_index_of(dataset, digit, index)
        x = dataset.x_test[i : i + 1]
        source_image = f"{dataset.name} test image #{i} (digit {digit}, index {index})"
    if kind == "digit":
        if reference_explainer is None:
            raise ValueError("target=digit* needs the reference model's explainer.")
        explanation = reference_explainer.explain(x, digit)
        heatmap = explanation.relevance.numpy()
        source = f"reference heatmap of {source_image}"
        if not np.any(heatmap) and float(explanation.start[0]) == 0.0:
            fix = (
                "Explain the pre-activation instead with lrp.output=logit, or train the reference with "
                "model.output_activation=linear."
                if reference_explainer.output == "activation"
                else "Check the reference model (its weights may be all zero), or pick another image (target.index)."
            )
            raise ValueError(
                f"The target heatmap ({source}) is all zeros because the reference's explained score for "
                f"class {digit} is exactly 0 (lrp.output={reference_explainer.output}). {fix}"
            )
    elif kind == "file":
        heatmap = read_map(path, expected_shape=shape, what="target.path")[None]
        source = f"heatmap {path} for {source_image}"
    elif kind == "pattern":
        heatmap = pattern_map(pattern, shape[0], scale)[None]
        source = f"{pattern} pattern for {source_image}"
    else:
        raise ValueError(f"Unknown target kind {kind!r}; expected digit, file or pattern.")
    if not np.any(heatmap):
        raise ValueError(
            f"The target heatmap ({source}) is all zeros: there is nothing to match, and every gradient "
            "would be zero. Pick another image (target.index) or check the file."
        )
    return Target(x.astype(np.float32), heatmap.astype(np.float32), int(digit), source)
