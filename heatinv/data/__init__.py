"""Datasets for heatinv: bundled digits, local MNIST, a user's .npz, image folder, table, CSV or texts.

Every loader returns the same `Dataset`, so models, targets and the training loop never need
to know which source they got:

- `x_*`: float32 images `[N, H, W, C]` or feature vectors `[N, d]`, or int32 token ids `[N, length]`
  (texts: `vocabulary` names each id); for an image folder an `ImageFiles` that decodes only
  the images indexed (`x[a:b]`) or batched (`Dataset.batches`);
- `y_*`: int64 `[N]`, labels `0..num_classes-1`;
- `class_names`, `feature_names` (tables), `low`/`high`: the data's range (the `zbox` box).

One module per source: `digits`, `arrays` (mnist.npz, a user's .npz), `folders` (an image
folder, whose files `image_files` decodes batch by batch), `tables` (bundled tables, a
csv) and `text` (a csv of texts, an .npz of token ids); `dataset` holds the `Dataset` they all return. `load_dataset` picks one by its config name.

Nothing here touches the network: `digits` and the tabular builtins ship inside
scikit-learn, every other source is a local file or folder.

Examples:
    >>> ds = load_dataset("digits")
    >>> ds.x_train.shape[1:], ds.num_classes
    ((28, 28, 1), 10)
    >>> i = first_index_of(ds, digit=3)
    >>> int(ds.y_test[i])
    3
"""

from __future__ import annotations

from heatinv.data.arrays import load_mnist, load_npz
from heatinv.data.dataset import Dataset, first_index_of
from heatinv.data.digits import load_digits
from heatinv.data.folders import COLOR_MODES, load_folder
from heatinv.data.image_files import ImageFiles, image_key, reading
from heatinv.data.tables import TABULAR_NAMES, load_csv, load_tabular
from heatinv.data.text import load_protected_text, load_text, load_tokens

__all__ = [
    "COLOR_MODES", "DATASET_NAMES", "TABULAR_NAMES", "Dataset", "ImageFiles", "first_index_of", "image_key",
    "load_csv", "load_dataset", "load_digits", "load_folder", "load_mnist", "load_npz", "load_tabular", "load_protected_text", "load_text", "load_tokens", "reading", "TEXT_NAMES",
]

DATASET_NAMES = ("digits", "mnist", "npz", "folder", "text", "tokens", "protected_text", "tabular", "csv")
TEXT_NAMES = ("text", "protected_text")
"""The data sets tokenized here by ``TextVectorization`` (their vocabulary is saved with a run)."""


def load_dataset(
    name: str,
    path: str | None = None,
    *,
    image_size: tuple[int, int] = (32, 32),
    test_split: float = 0.2,
    label_column: str | None = None,
    seed: int = 0,
    color_mode: str = "rgb",
    text_column: str = "text",
    max_tokens: int = 2000,
    length: int = 32,
    vocabulary=None,
) -> Dataset:
    """Loads a dataset by its config name (the `data` group).

    Args:
        name: `"digits"`, `"mnist"`, `"npz"`, `"folder"`, `"csv"`, or a bundled table
            (`"breast_cancer"`, `"wine"`).
        path: the file or folder for `mnist`, `npz`, `folder`, `csv`; ignored otherwise.
        image_size, test_split, seed, color_mode: for `folder`.
        label_column: for `csv` and `text`.
        text_column, max_tokens, length, vocabulary: for `text` (a csv of texts, as token ids;
            `vocabulary`: the words of the ids to tokenize with, a resumed run's) and
            `protected_text` (generated reviews, :mod:`heatinv.data.protected_text`).

    Returns:
        The `Dataset`.

    Examples:
        >>> load_dataset("digits").name
        'digits'
    """
    if name == "digits":
        return load_digits()
    if name == "mnist":
        return load_mnist(path)
    if name == "npz":
        return load_npz(path)
    if name == "folder":
        return load_folder(path, image_size, test_split, seed, color_mode)
    if name == "csv":
        return load_csv(path, label_column)
    if name == "tokens":
        return load_tokens(path)
    if name == "text":
        return load_text(path, text_column, label_column or "label", max_tokens, length, test_split, vocabulary)
    if name == "protected_text":
        return load_protected_text(max_tokens, length, test_split, vocabulary)
    if name in TABULAR_NAMES:
        return load_tabular(name)
    raise ValueError(
        f"heatinv/data load_dataset: unknown dataset name {name!r}. "
        f"Expected one of {list(DATASET_NAMES[:-2]) + list(TABULAR_NAMES) + ['csv']}. Set data=digits "
        "(offline, bundled), data=mnist (a local mnist.npz), data=npz, data=folder, data=csv "
        "(data.path=...) or data=tabular data.name=breast_cancer."
    )
