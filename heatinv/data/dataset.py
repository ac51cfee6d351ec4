"""The `Dataset` every loader returns, and what the loaders share: a fixed split, the range of values, a file check.

Examples:
    >>> from heatinv.data import load_digits
    >>> ds = load_digits()
    >>> i = first_index_of(ds, digit=3)
    >>> int(ds.y_test[i])
    3
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from heatinv.data.image_files import ImageFiles

SPLIT_SEED = 0


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split of images `[N, H, W, C]` or feature vectors `[N, d]`.

    `eq=False` because comparing numpy arrays with `==` is elementwise, so a
    generated `__eq__` would raise instead of returning a bool.

    Attributes:
        x_train: float32 `[N_train, *input_shape]`, or the `ImageFiles` of an image folder.
        y_train: int64 `[N_train]` in `0..num_classes-1`.
        x_test: float32 `[N_test, *input_shape]`.
        y_test: int64 `[N_test]` in `0..num_classes-1`.
        name: the source (`"digits"`, `"mnist"`, `"breast_cancer"`, a file's name...); recorded in run metadata.
        class_names: one name per class (default `"0"`, `"1"`, ...).
        feature_names: for feature vectors, one name per feature (default `"x0"`, `"x1"`, ...).
        low, high: the smallest and largest input value, a float or one per channel (images)
            or feature (tables): the box of the `zbox` rule.
        vocabulary: for token ids (texts), the word of each id (id 0: padding); None otherwise.

    Examples:
        >>> from heatinv.data import load_digits
        >>> ds = load_digits()
        >>> ds.x_test.dtype, ds.y_test.dtype, ds.num_classes, ds.low, ds.high
        (dtype('float32'), dtype('int64'), 10, 0.0, 1.0)
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str
    class_names: tuple[str, ...] | None = None
    feature_names: tuple[str, ...] | None = None
    low: float | np.ndarray = 0.0
    high: float | np.ndarray = 1.0
    vocabulary: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        # Catch a malformed split here, not as a shape error deep in Keras.
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            if x.ndim not in (2, 4) or x.shape[1:] != self.x_train.shape[1:]:
                raise ValueError(
                    f"Dataset '{self.name}': x_{split} has shape {x.shape}, expected images "
                    f"[N, H, W, C] or feature vectors [N, d], the same for both splits "
                    f"(x_train is {self.x_train.shape}). Add the channel axis to grayscale "
                    "images ([N, H, W] -> [N, H, W, 1])."
                )
            if y.shape != (x.shape[0],):
                raise ValueError(
                    f"Dataset '{self.name}': y_{split} has shape {y.shape} but "
                    f"x_{split} holds {x.shape[0]} examples; expected one label "
                    "per example as a 1-D array. Pass labels as integers, not "
                    "one-hot vectors."
                )
        if self.class_names is None:
            count = int(max(self.y_train.max(initial=0), self.y_test.max(initial=0))) + 1
            object.__setattr__(self, "class_names", tuple(str(i) for i in range(count)))
        if self.feature_names is None and self.x_train.ndim == 2 and self.vocabulary is None:
            object.__setattr__(self, "feature_names", tuple(f"x{i}" for i in range(self.x_train.shape[1])))
        for split in ("train", "test"):
            y = getattr(self, f"y_{split}")
            if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                raise ValueError(
                    f"Dataset '{self.name}': y_{split} holds labels in [{y.min()}, {y.max()}], but there are "
                    f"{self.num_classes} classes ({list(self.class_names)[:10]}); labels must be integers "
                    f"0..{self.num_classes - 1}. Renumber the labels so each class has one index."
                )
        if self.num_classes < 2 or len(np.unique(self.y_train)) < 2:
            raise ValueError(
                f"Dataset '{self.name}': the training split has only class(es) "
                f"{sorted(set(self.y_train.tolist()))}; a classifier needs at least two classes. "
                "Add examples of another class (for an image folder: a second subfolder)."
            )

    @property
    def num_classes(self) -> int:
        """Number of classes: one per name in `class_names`."""
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example: `(H, W, C)` or `(d,)`."""
        return tuple(self.x_train.shape[1:])

    @property
    def is_text(self) -> bool:
        """Whether the examples are token ids ``[length]`` (``vocabulary`` names each id)."""
        return self.vocabulary is not None

    @property
    def is_image(self) -> bool:
        """Whether the examples are images `[H, W, C]` (else feature vectors `[d]`)."""
        return self.x_train.ndim == 4

    @property
    def streamed(self) -> bool:
        """Whether the images are files decoded batch by batch (an image folder), not arrays in memory."""
        return isinstance(self.x_train, ImageFiles)

    def batches(self, split: str, batch_size: int, order: np.ndarray | None = None, shuffle_seed: int | None = None):
        """A `tf.data` pipeline of `(x [b, *input_shape] float32, labels [b] int32)` batches of a split.

        An image folder's batches are decoded one at a time, as the pipeline is read.

        Args:
            split: `"train"` or `"test"`.
            batch_size: examples per batch (the last may be smaller).
            order: the positions to visit, in this order (default: all, in split order).
            shuffle_seed: if given, each pass over the pipeline visits `order` in a new
                order drawn from this seed (for `model.fit`'s epochs).

        Returns:
            The `tf.data.Dataset`.

        Examples:
            >>> from heatinv.data import load_digits
            >>> x, y = next(iter(load_digits().batches("test", 8)))
            >>> tuple(x.shape), y.dtype.name
            ((8, 28, 28, 1), 'int32')
        """
        import tensorflow as tf

        x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
        if isinstance(x, ImageFiles):
            return x.batches(y, batch_size, order, shuffle_seed)
        order = np.arange(len(y)) if order is None else np.asarray(order)
        pipeline = tf.data.Dataset.from_tensor_slices((x[order], y[order].astype(np.int32)))
        if shuffle_seed is not None:
            pipeline = pipeline.shuffle(len(order), seed=shuffle_seed, reshuffle_each_iteration=True)
        return pipeline.batch(batch_size)


def stratified_split(labels: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """`(train positions, test positions)`: a per-class random split with a private, fixed generator.

    `round(test_fraction * count)` of each class are held out; both lists are shuffled across classes.
    """
    rng = np.random.default_rng(SPLIT_SEED)
    train, test = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_test = int(round(len(members) * test_fraction))
        test.append(members[:n_test])
        train.append(members[n_test:])
    # Shuffle across classes so batches are not sorted by label.
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def value_range(x_train: np.ndarray, x_test: np.ndarray) -> tuple:
    """Per-channel (last axis) minimum and maximum over both splits; one float each where they agree."""
    axes = tuple(range(x_train.ndim - 1))
    low = np.minimum(x_train.min(axis=axes), x_test.min(axis=axes)).astype(np.float32)
    high = np.maximum(x_train.max(axis=axes), x_test.max(axis=axes)).astype(np.float32)
    if np.all(low == low[0]) and np.all(high == high[0]):
        return float(low[0]), float(high[0])
    return low, high


def existing_file(path: str | None, key: str, what: str) -> str:
    file = os.path.abspath(os.path.expanduser(path)) if path else ""
    if not os.path.isfile(file):
        raise FileNotFoundError(f"heatinv/data/dataset.py: {key}={path!r} is not a file. Point {key} at {what}.")
    return file


def first_index_of(dataset: Dataset, digit: int, index: int = 0, split: str = "test") -> int:
    """Position of the `index`-th image of class `digit` in a split.

    Used to pick a reproducible input image by label rather than by raw
    position, which would change with the dataset.

    Args:
        dataset: the `Dataset` to search.
        digit: class label, `0..num_classes-1`.
        index: which occurrence, counting from 0.
        split: `"test"` or `"train"`.

    Returns:
        An int `i` with `dataset.y_<split>[i] == digit`.

    Examples:
        >>> from heatinv.data import load_digits
        >>> ds = load_digits()
        >>> i = first_index_of(ds, digit=7, index=2)
        >>> int(ds.y_test[i])
        7
    """
    if split not in ("train", "test"):
        raise ValueError(
            f"heatinv/data/dataset.py first_index_of: split={split!r}, expected "
            "'train' or 'test'."
        )
    if not _is_int(digit) or not 0 <= digit < dataset.num_classes:
        raise ValueError(
            f"heatinv/data/dataset.py first_index_of: digit={digit!r} is not a class "
            f"label of dataset '{dataset.name}'; expected an integer in "
            f"0..{dataset.num_classes - 1}."
        )
    labels = dataset.y_test if split == "test" else dataset.y_train
    positions = np.flatnonzero(labels == digit)
    if not _is_int(index) or not 0 <= index < len(positions):
        raise ValueError(
            f"heatinv/data/dataset.py first_index_of: index={index!r} is out of range; "
            f"the {split} split of '{dataset.name}' has {len(positions)} images "
            f"of digit {digit}, so index must be in 0..{len(positions) - 1}."
        )
    return int(positions[index])


def _is_int(value) -> bool:
    # bool is an int subclass, but digit=True is a config mistake, not 1.
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
