"""Texts as token ids: a csv of texts and labels (``data=text``), or ids already made (``data=tokens``).

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

    Examples:
        >>> ds = load_text("reviews.csv")  # doctest: +SKIP
        >>> ds.x_train.dtype, ds.vocabulary[:2]  # doctest: +SKIP
        (dtype('int32'), ('', '[UNK]'))
    """
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
    labels = [(row[label_column] or "").strip() for row in rows]
    name = os.path.splitext(os.path.basename(file))[0]
    return tokenized(texts, labels, name, max_tokens, length, test_fraction, vocabulary)


def tokenized(texts: Sequence[str], labels: Sequence[str], name: str, max_tokens: int = 2000, length: int = 32,
              test_fraction: float = 0.2, vocabulary: Sequence[str] | None = None) -> Dataset:
    """Texts and their labels as a :class:`Dataset` of token ids ``[N, length]`` int32, split per class.

    The vocabulary is learned from the training split (or given: ``vocabulary``, a resumed run's).

    Examples:
        >>> ds = tokenized(["a good film", "a bad film"] * 5, ["pos", "neg"] * 5, "reviews", length=4)
        >>> ds.x_train.shape[1], ds.class_names
        (4, ('neg', 'pos'))
    """
    import keras

    names, y = label_classes(list(labels))
    train, test = stratified_split(y, test_fraction)
    if vocabulary is None:
        vectorize = keras.layers.TextVectorization(max_tokens=max_tokens, output_sequence_length=length)
        vectorize.adapt(np.array([texts[i] for i in train], dtype=object))
    else:
        vectorize = keras.layers.TextVectorization(output_sequence_length=length, vocabulary=list(vocabulary))
    ids = np.asarray(vectorize(np.array(texts, dtype=object)), np.int32)
    vocabulary = tuple(str(word) for word in vectorize.get_vocabulary())
    return Dataset(ids[train], y[train], ids[test], y[test], name, names, vocabulary=vocabulary, low=0.0, high=float(len(vocabulary)))


def load_protected_text(max_tokens: int = 2000, length: int = 32, test_fraction: float = 0.2,
                        vocabulary: Sequence[str] | None = None) -> Dataset:
    """The generated reviews of :mod:`heatinv.data.protected_text` (``data=protected_text``), as token ids.

    Examples:
        >>> ds = load_protected_text(length=16)
        >>> ds.name, ds.class_names, "foreign" in ds.vocabulary
        ('protected_text', ('negative', 'positive'), True)
    """
    from heatinv.data.protected_text import protected_reviews

    texts, labels = protected_reviews()
    return tokenized(texts, labels, "protected_text", max_tokens, length, test_fraction, vocabulary)


def load_tokens(path: str) -> Dataset:
    """Loads an ``.npz`` of token ids: ``x_train``, ``x_test`` integer ``[N, length]`` (0: padding), ``y_train``,
    ``y_test`` labels, and optionally ``vocabulary``, the word of each id (strings; without it id ``i`` is named ``#i``).

    Read with ``allow_pickle=False``: the vocabulary must be a string array (``np.array(words)``), not objects.

    Examples:
        >>> ds = load_tokens("ids.npz")  # doctest: +SKIP
        >>> ds.is_text, ds.x_train.dtype  # doctest: +SKIP
        (True, dtype('int32'))
    """
    import zipfile

    file = existing_file(path, "data.path", "an .npz file with integer token ids x_train, x_test [N, length] and labels y_train, y_test")
    try:
        with np.load(file, allow_pickle=False) as loaded:
            arrays = {key: loaded[key] for key in loaded.files}
    except (ValueError, OSError, zipfile.BadZipFile) as error:
        raise ValueError(f"heatinv/data/text.py load_tokens: '{file}' (data.path) is no .npz of arrays ({error}).") from None
    missing = [key for key in ("x_train", "y_train", "x_test", "y_test") if key not in arrays]
    ids = [arrays.get(key) for key in ("x_train", "x_test")]
    wrong = [f"{key} {a.dtype} {a.shape}" for key, a in zip(("x_train", "x_test"), ids)
             if a is not None and (a.ndim != 2 or not np.issubdtype(a.dtype, np.integer) or a.size and a.min() < 0)]
    if missing or wrong:
        raise ValueError(
            f"heatinv/data/text.py load_tokens: '{file}' (data.path) holds {sorted(arrays)}"
            f"{'; missing ' + ', '.join(missing) if missing else ''}{'; not ids [N, length] >= 0: ' + ', '.join(wrong) if wrong else ''}. "
            "Save np.savez(path, x_train=ids, y_train=labels, x_test=..., y_test=..., vocabulary=np.array(words)) with integer ids."
        )
    largest = int(max(a.max(initial=0) for a in ids))
    vocabulary = tuple(str(word) for word in arrays["vocabulary"]) if "vocabulary" in arrays else numbered_vocabulary(largest)
    if len(vocabulary) <= largest:
        raise ValueError(
            f"heatinv/data/text.py load_tokens: '{file}' (data.path) has ids up to {largest} but a vocabulary of {len(vocabulary)} "
            "words; give one word per id (index 0 the padding)."
        )
    name = os.path.splitext(os.path.basename(file))[0]
    x_train, x_test = (a.astype(np.int32) for a in ids)
    y_train, y_test = (np.asarray(arrays[key]).astype(np.int64).reshape(-1) for key in ("y_train", "y_test"))
    return Dataset(x_train, y_train, x_test, y_test, name, vocabulary=vocabulary, low=0.0, high=float(len(vocabulary)))


def numbered_vocabulary(largest: int) -> tuple[str, ...]:
    """Words for ids without any: padding for 0, ``#i`` for id ``i`` up to ``largest``.

    Examples:
        >>> numbered_vocabulary(2)
        ('', '#1', '#2')
    """
    return ("",) + tuple(f"#{i}" for i in range(1, largest + 1))


def words(ids, vocabulary: tuple[str, ...] | None) -> list[str]:
    """The words of ``ids``, ``<pad>`` for padding (``#id`` without a vocabulary).

    Examples:
        >>> words([2, 1, 0], ("", "[UNK]", "good")), words([5, 0], None)
        (['good', '[UNK]', '<pad>'], ['#5', '<pad>'])
    """
    return ["<pad>" if int(i) == 0 else vocabulary[int(i)] if vocabulary is not None else f"#{int(i)}" for i in ids]
