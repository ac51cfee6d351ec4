"""A user's image folder, one subfolder per class: listed and split, never decoded whole.

Examples:
    >>> ds = load_folder("shapes/", (32, 32), 0.2)  # doctest: +SKIP
    >>> ds.input_shape, ds.class_names  # doctest: +SKIP
    ((32, 32, 3), ('circle', 'square', 'triangle'))
"""

from __future__ import annotations

import os

import numpy as np

from heatinv.data.dataset import Dataset
from heatinv.data.image_files import IMAGE_EXTENSIONS, ImageFiles

COLOR_MODES = {"rgb": 3, "grayscale": 1}
"""``data.color_mode`` -> the channels an image folder's images are decoded to (Keras's names)."""


def load_folder(path: str, image_size: tuple[int, int], test_split: float, seed: int = 0, color_mode: str = "rgb") -> Dataset:
    """An image folder with one subfolder per class, streamed: its files are listed, never all decoded at once.

    `x_train` and `x_test` are `ImageFiles`: indexing or `Dataset.batches` decodes just the
    images asked for (RGB or grayscale, bilinear resize to `image_size`, pixels scaled to `[0, 1]`, as
    `keras.utils.image_dataset_from_directory` reads them), so a folder larger than memory
    works. What stays in memory: the file paths and labels. The class names are the
    subfolders' names, sorted; the range is `[0, 1]` without a scan. The held-out split is
    `int(test_split * count)` images drawn with `seed`: two calls give the same split.

    Args:
        path: the folder (`data.path`).
        image_size: `(height, width)` every image is resized to (`data.image_size`).
        test_split: the held-out fraction, in (0, 1) (`data.test_split`).
        seed: the split's seed.
        color_mode: `"rgb"` (3 channels) or `"grayscale"` (1), as Keras's loader takes it
            (`data.color_mode`); a colour image read in grayscale is converted.

    Returns:
        A `Dataset` named after the folder.

    Examples:
        >>> ds = load_folder("shapes/", (32, 32), 0.2)  # doctest: +SKIP
        >>> ds.input_shape, ds.class_names  # doctest: +SKIP
        ((32, 32, 3), ('circle', 'square', 'triangle'))
    """
    folder = os.path.abspath(os.path.expanduser(path)) if path else ""
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.isfile(folder) else "does not exist"
        other = {".csv": " (a table: data=csv)", ".npz": " (arrays: data=npz)"}.get(os.path.splitext(folder)[1].lower(), "")
        raise FileNotFoundError(
            f"heatinv/data/folders.py load_folder: the image folder '{path}' (data.path) {what}{other}. Point "
            "data.path at a folder with one subfolder of images per class (e.g. shapes/circle/*.png, "
            "shapes/square/*.png)."
        )
    # Hidden folders (.ipynb_checkpoints, .git) are no classes, as in keras.utils.image_dataset_from_directory.
    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)) and not d.startswith("."))
    if len(classes) < 2:
        raise ValueError(
            f"heatinv/data/folders.py load_folder: the image folder '{folder}' (data.path) has {len(classes)} class "
            f"subfolder(s) {classes}; a classifier needs at least two. Put each class's images in a subfolder "
            "of its own (e.g. shapes/circle/, shapes/square/)."
        )
    if not 0.0 < float(test_split) < 1.0:
        raise ValueError(
            f"heatinv/data/folders.py load_folder: data.test_split={test_split!r} is outside (0, 1); it is the "
            "fraction of the images held out for testing. Use e.g. data.test_split=0.2."
        )
    if color_mode not in COLOR_MODES:
        raise ValueError(f"heatinv/data/folders.py load_folder: color_mode={color_mode!r}; expected one of {list(COLOR_MODES)}.")
    (train_paths, y_train), (test_paths, y_test) = _split_files(folder, classes, float(test_split), seed)
    size, channels = tuple(image_size), COLOR_MODES[color_mode]
    name = os.path.basename(folder.rstrip(os.sep))
    return Dataset(
        ImageFiles(train_paths, size, channels), y_train, ImageFiles(test_paths, size, channels), y_test, name=name,
        class_names=tuple(classes),
    )


def _split_files(folder: str, classes: list[str], test_split: float, seed: int):
    """``((train paths, labels), (test paths, labels))``: every image file under each class subfolder, split with ``seed``.

    The held-out split is ``int(test_split * count)`` images of a permutation drawn from
    ``seed`` alone, so the same folder and seed always give the same split.
    """
    paths, labels = [], []
    for label, name in enumerate(classes):
        count = len(paths)
        found = []
        for root, folders, files in os.walk(os.path.join(folder, name)):
            # Hidden entries are copies and metadata (Jupyter's checkpoints, macOS's ._name.png), not images.
            folders[:] = [d for d in folders if not d.startswith(".")]
            found.append((root, sorted(f for f in files if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith("."))))
        for root, names in sorted(found):
            paths += [os.path.join(root, f) for f in names]
            labels += [label] * len(names)
        if len(paths) == count:
            raise ValueError(
                f"heatinv/data/folders.py load_folder: the class subfolder '{os.path.join(folder, name)}' (data.path) holds no "
                f"images (.png/.jpg/.jpeg/.bmp/.gif); every subfolder of '{folder}' is a class, and a class "
                "without images cannot be learned. Put its images there, or move the empty folder out."
            )
    dangling = [path for path in paths if not os.path.exists(path)]
    if dangling:
        raise ValueError(
            f"heatinv/data/folders.py load_folder: the image folder '{folder}' (data.path) holds {len(dangling)} link(s) to "
            f"files that do not exist, the first '{dangling[0]}' -> '{_link_target(dangling[0])}'. Remove the broken "
            "links, or restore the files they point to."
        )
    held_out = int(test_split * len(paths))
    if held_out < 1 or held_out >= len(paths):
        raise ValueError(
            f"heatinv/data/folders.py load_folder: the image folder '{folder}' (data.path) holds {len(paths)} images "
            f"(.png/.jpg/.jpeg/.bmp/.gif) in {classes}; data.test_split={test_split} holds out {held_out} of them, "
            "leaving none to train or none to test. Add images, or change data.test_split."
        )
    order = np.random.default_rng([seed, len(paths)]).permutation(len(paths))
    paths, labels = np.array(paths, dtype=object)[order], np.array(labels, np.int64)[order]
    split = len(paths) - held_out
    return (tuple(paths[:split]), labels[:split]), (tuple(paths[split:]), labels[split:])


def _link_target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # no link: the file went away while the folder was listed
        return "(removed)"
