"""A csv of texts and labels as token ids: ``data=text data.path=reviews.csv``.

Each row's text is lower-cased, stripped of punctuation and split on whitespace by
``keras.layers.TextVectorization``, whose vocabulary (the training split's most frequent
words, ``[UNK]`` for the rest, id 0 for padding) is learned from the training split only.
Examples are ``length`` ids, padded with 0 or cut after ``length`` words.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence

import numpy as np

from heatinv.data.dataset import Dataset, existing_file, stratified_split
from heatinv.data.tables import label_classes

PADDING, UNKNOWN = "", "[UNK]"
"""TextVectorization's words for id 0 (padding) and id 1 (a word outside the vocabulary)."""


def load_text(path: str, text_column: str = "text", label_column: str = "label", max_tokens: int = 2000,
              length: int = 32, test_fraction: float = 0.2, vocabulary: Sequence[str] | None = None) -> Dataset:
    """Loads a csv with a header row, a text column and a label column, as token ids ``[N, length]`` int32.

    Args:
        path: the ``.csv`` file (``data.path``).
        text_column, label_column: the headers of the two columns (``data.text_column``, ``data.label_column``).
        max_tokens: the vocabulary's size, padding and ``[UNK]`` included (``data.max_tokens``).
        length: ids per example (``data.length``).
        test_fraction: the held-out share, per class (``data.test_split``).
        vocabulary: the words of the ids, padding and ``[UNK]`` first, to tokenize with (a
            resumed run's, saved when it began); None: learned from the training split.

    Returns:
        A :class:`Dataset` whose ``vocabulary`` names each id.

    Example:
    >>> ds = load_text("reviews.csv")  # doctest: +SKIP
    >>> ds.x_train.dtype, ds.vocabulary[:2]  # doctest: +SKIP
    (dtype('int32'), ('', '[UNK]'))
    """
    import keras

    file = existing_file(path, "data.path", "a .csv file with a header row, a text column and a label column")
    with open(file, newline="", encoding="utf-8-sig") as handle:
        rows = [row for row in csv.DictReader(handle)]
    header = list(rows[0]) if rows else []
    missing = [key for key, column in (("data.text_column", text_column), ("data.label_column", label_column)) if column not in header]
    if missing or not rows:
        raise ValueError(
            f"heatinv/data/text.py load_text: '{file}' (data.path) has columns {header} and {len(rows)} rows; it needs a "
            f"row per example and the columns {text_column!r} and {label_column!r} ({', '.join(missing) or 'rows'}: "
            "set data.text_column and data.label_column to its headers)."
        )
    texts = [row[text_column] or "" for row in rows]
    names, y = label_classes([(row[label_column] or "").strip() for row in rows])
    train, test = stratified_split(y, test_fraction)
    if vocabulary is None:
        vectorize = keras.layers.TextVectorization(max_tokens=max_tokens, output_sequence_length=length)
        vectorize.adapt(np.array([texts[i] for i in train], dtype=object))
    else:
        vectorize = keras.layers.TextVectorization(output_sequence_length=length, vocabulary=list(vocabulary))
    ids = np.asarray(vectorize(np.array(texts, dtype=object)), np.int32)
    vocabulary = tuple(str(word) for word in vectorize.get_vocabulary())
    name = os.path.splitext(os.path.basename(file))[0]
    return Dataset(ids[train], y[train], ids[test], y[test], name, names, vocabulary=vocabulary, low=0.0, high=float(len(vocabulary)))


def words(ids, vocabulary: tuple[str, ...]) -> list[str]:
    """The words of ``ids``, ``<pad>`` for padding.

    Example:
    >>> words([2, 1, 0], ("", "[UNK]", "good"))
    ['good', '[UNK]', '<pad>']
    """
    return ["<pad>" if int(i) == 0 else vocabulary[int(i)] for i in ids]
