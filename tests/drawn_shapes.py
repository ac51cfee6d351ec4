"""Small image data sets of drawn shapes (square, disk, cross), made on the spot for tests and demos.

Each image is a coloured shape of random size and position on a dark, noisy background, so
a small CNN tells the classes apart in a few epochs while the heatmaps still have somewhere
to point. ``python tests/drawn_shapes.py <folder> [count]`` writes the image folder the
``pattern_frame_folder_mobilenetv2`` experiment reads.
"""

from __future__ import annotations

import os
import sys

import numpy as np

CLASSES = ("cross", "disk", "square")


def draw_shapes(count: int, size: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` uint8 RGB images ``[count, size, size, 3]`` and their labels (index into :data:`CLASSES`).

    Example:
    >>> x, y = draw_shapes(6)
    >>> x.shape, x.dtype, sorted(set(y.tolist()))
    ((6, 32, 32, 3), dtype('uint8'), [0, 1, 2])
    """
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % len(CLASSES)
    rows, cols = np.mgrid[0:size, 0:size]
    images = rng.integers(0, 40, size=(count, size, size, 3)).astype(np.float32)
    for image, label in zip(images, labels):
        radius = rng.uniform(0.18, 0.3) * size
        cy, cx = rng.uniform(radius + 1, size - radius - 1, size=2)
        dy, dx = np.abs(rows - cy), np.abs(cols - cx)
        if CLASSES[label] == "square":
            mask = (dy <= radius * 0.8) & (dx <= radius * 0.8)
        elif CLASSES[label] == "disk":
            mask = dy**2 + dx**2 <= radius**2
        else:
            bar = radius * 0.3
            mask = ((dy <= bar) & (dx <= radius)) | ((dx <= bar) & (dy <= radius))
        image[mask] = rng.uniform(150, 255, size=3)
    return images.astype(np.uint8), labels.astype(np.int64)


def write_folder(folder: str, count: int = 300, size: int = 32, seed: int = 0) -> str:
    """Write ``count`` drawn shapes as PNGs, one subfolder per class; returns ``folder``."""
    from PIL import Image

    images, labels = draw_shapes(count, size, seed)
    for name in CLASSES:
        os.makedirs(os.path.join(folder, name), exist_ok=True)
    for i, (image, label) in enumerate(zip(images, labels)):
        Image.fromarray(image).save(os.path.join(folder, CLASSES[label], f"{i:05d}.png"))
    return folder


def write_npz(path: str, train: int = 240, test: int = 60, size: int = 32, seed: int = 0) -> str:
    """Write drawn shapes as an ``.npz`` with ``x_train, y_train, x_test, y_test``; returns ``path``."""
    x, y = draw_shapes(train + test, size, seed)
    np.savez(path, x_train=x[:train], y_train=y[:train], x_test=x[train:], y_test=y[train:])
    return path


if __name__ == "__main__":
    write_folder(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300)
