"""An image folder's files, decoded only when asked for, as Keras's `image_dataset_from_directory` reads them.

Examples:
    >>> files = ImageFiles(("shapes/disk/0.png", "shapes/cross/1.png"), (32, 32))
    >>> files.shape
    (2, 32, 32, 3)
"""

from __future__ import annotations

import contextlib
import re

import numpy as np

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


def decoder(image_size: tuple[int, int], channels: int = 3):
    """A ``tf.data`` map function ``path -> image [H, W, channels]`` in ``[0, 1]``: decoded, bilinearly resized.

    The same steps as ``keras.utils.image_dataset_from_directory`` (``decode_image`` with
    ``channels``: 3 for RGB, 1 for grayscale; ``resize`` bilinear to ``image_size``), scaled
    from 0..255 to ``[0, 1]``. In grayscale, BMP and GIF files, which TensorFlow decodes only
    in colour (Keras's loader fails on them), are decoded as RGB and made one channel by
    ``tf.image.rgb_to_grayscale``.
    """
    import tensorflow as tf  # here, so that importing heatinv.data stays cheap

    height, width = int(image_size[0]), int(image_size[1])

    def in_colour_only(contents):
        return tf.logical_or(tf.strings.substr(contents, 0, 2) == b"BM", tf.strings.substr(contents, 0, 3) == b"GIF")

    def decode(path):
        contents = tf.io.read_file(path)
        if channels == 1:
            image = tf.cond(
                in_colour_only(contents),
                lambda: tf.image.rgb_to_grayscale(tf.image.decode_image(contents, channels=3, expand_animations=False)),
                lambda: tf.image.decode_image(contents, channels=1, expand_animations=False),
            )
        else:
            image = tf.image.decode_image(contents, channels=channels, expand_animations=False)
        image = tf.image.resize(image, (height, width), method="bilinear")
        image.set_shape((height, width, channels))
        return image / 255.0

    return decode


class ImageFiles:
    """The images of an image folder's split, decoded only when asked for: an array that is never whole in memory.

    Indexing (``files[i]``, ``files[a:b]``, ``files[[i, j]]``) reads, decodes and resizes just
    those files, as ``keras.utils.image_dataset_from_directory`` would (RGB or grayscale, bilinear,
    ``image_size``), and scales the pixels to ``[0, 1]``; :meth:`batches` gives a ``tf.data``
    pipeline that decodes one batch at a time. Converting the whole split to one numpy array
    (``np.asarray(files)``) is refused: a folder larger than memory must never be read at once.

    Attributes:
        paths: one file per image, in split order.
        image_size: ``(height, width)`` every image is resized to.
        channels: 3 (RGB) or 1 (grayscale).
        largest_read: the most images one indexing call has decoded (streaming's own check).

    Examples:
        >>> files = ImageFiles(("shapes/disk/0.png", "shapes/cross/1.png"), (32, 32))  # doctest: +SKIP
        >>> files.shape, files[0:1].shape  # doctest: +SKIP
        ((2, 32, 32, 3), (1, 32, 32, 3))
    """

    ndim = 4
    dtype = np.dtype(np.float32)

    def __init__(self, paths: tuple[str, ...], image_size: tuple[int, int], channels: int = 3):
        self.paths = tuple(paths)
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.channels = int(channels)
        self.largest_read = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.paths), *self.image_size, self.channels)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index) -> np.ndarray:
        if isinstance(index, (int, np.integer)):
            return self[[int(index)]][0]
        chosen = np.arange(len(self.paths))[index]
        self.largest_read = max(self.largest_read, len(chosen))
        if len(chosen) == 0:
            return np.zeros((0, *self.shape[1:]), np.float32)
        import tensorflow as tf

        paths = [self.paths[i] for i in chosen]
        decode = decoder(self.image_size, self.channels)
        pipeline = tf.data.Dataset.from_tensor_slices(paths).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        with reading(self):
            return next(iter(pipeline.batch(len(paths)))).numpy()

    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            f"heatinv/data/image_files.py ImageFiles: the {len(self.paths)} images of an image folder are read in batches "
            "(files[a:b], or ImageFiles.batches), never converted whole to one array: a folder may be larger "
            "than memory."
        )

    def batches(self, labels: np.ndarray, batch_size: int, order: np.ndarray | None = None, shuffle_seed: int | None = None):
        """A ``tf.data`` pipeline of ``(images [b, H, W, channels] in [0, 1], labels [b] int32)`` batches.

        Args:
            labels: ``[N]`` the split's labels.
            batch_size: images per batch (the last may be smaller).
            order: the positions to visit, in order (default: all, in split order).
            shuffle_seed: if given, each pass visits `order` in a new order drawn from it;
                only the file names are shuffled, before any image is decoded.

        Returns:
            The pipeline; it decodes each batch's files when the batch is asked for.
        """
        import tensorflow as tf

        order = np.arange(len(self.paths)) if order is None else np.asarray(order)
        paths = tf.constant(np.array(self.paths, dtype=object)[order].astype(str))
        batch_labels = tf.constant(np.asarray(labels)[order].astype(np.int32))
        decode = decoder(self.image_size, self.channels)
        pipeline = tf.data.Dataset.from_tensor_slices((paths, batch_labels))
        if shuffle_seed is not None:
            pipeline = pipeline.shuffle(len(order), seed=shuffle_seed, reshuffle_each_iteration=True)
        pipeline = pipeline.map(lambda path, label: (decode(path), label), num_parallel_calls=tf.data.AUTOTUNE)
        return pipeline.batch(batch_size)


def image_key(files: ImageFiles) -> str:
    """How ``files`` are read, for a cache key: the size, and the channels where not RGB (so RGB's keys stay as they were)."""
    return repr(files.image_size) + ("" if files.channels == 3 else f" {files.channels} channels")


@contextlib.contextmanager
def reading(files: ImageFiles):
    """Turns a file TensorFlow cannot decode, met while reading ``files``, into an error naming that file.

    TensorFlow's own error names no file; the first unreadable one is found by decoding the
    files one at a time (only once something failed).

    Examples:
        >>> with reading(dataset.x_train):  # doctest: +SKIP
        ...     model.fit(dataset.batches("train", 32))
    """
    import tensorflow as tf

    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        decode = decoder(files.image_size, files.channels)
        for bad in files.paths:
            try:
                decode(tf.constant(bad))
            except tf.errors.InvalidArgumentError as found:
                reason = re.sub(r"\{\{.*?\}\}|\[Op:.*?\]|name: *$", "", found.message).strip()
                break
        else:
            raise
        raise ValueError(
            f"heatinv/data/image_files.py: the image folder (data.path) holds '{bad}', which TensorFlow cannot decode as an "
            f"image ({reason}). Remove or replace that file; every file with an image extension "
            f"({', '.join(IMAGE_EXTENSIONS)}) must be a readable image."
        ) from error
