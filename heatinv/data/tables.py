"""Tables: scikit-learn's bundled `breast_cancer` and `wine`, or a user's CSV; standardized feature vectors.

Examples:
    >>> ds = load_tabular("breast_cancer")
    >>> ds.input_shape, ds.class_names
    ((30,), ('malignant', 'benign'))
"""

from __future__ import annotations

import os

import numpy as np

from heatinv.data.dataset import Dataset, existing_file, stratified_split, value_range

TABULAR_NAMES = ("breast_cancer", "wine")


def load_tabular(name: str, test_fraction: float = 0.25) -> Dataset:
    """Loads scikit-learn's bundled `breast_cancer` or `wine` table, standardized, with feature names.

    The split is stratified and fixed (like `load_digits`); every feature is standardized
    with the training split's mean and standard deviation, so nothing of the held-out
    examples leaks into the inputs. `low`/`high` are each feature's range over both splits.

    Args:
        name: `"breast_cancer"` or `"wine"` (`data.name`).
        test_fraction: the held-out fraction of each class.

    Returns:
        A `Dataset` of feature vectors named `name`.

    Examples:
        >>> ds = load_tabular("wine")
        >>> ds.input_shape, ds.num_classes, ds.feature_names[0]
        ((13,), 3, 'alcohol')
    """
    from sklearn import datasets

    loaders = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine}
    if name not in loaders:
        raise ValueError(
            f"heatinv/data/tables.py load_tabular: data.name={name!r} is not a bundled table; expected one of "
            f"{list(TABULAR_NAMES)}, or data=csv data.path=<file>.csv for your own table."
        )
    bunch = loaders[name]()
    return _standardized_table(
        bunch.data, bunch.target.astype(np.int64), name, tuple(map(str, bunch.target_names)), tuple(map(str, bunch.feature_names)), test_fraction
    )


def load_csv(path: str, label_column: str | None, test_fraction: float = 0.25) -> Dataset:
    """Loads a CSV table with a header row: numeric feature columns and a label column.

    The labels may be any text (`yes`/`no`, `3`, `setosa`); the classes are their sorted
    distinct values (numbers by value: `2` before `10`). Split and standardization as in `load_tabular`.

    Args:
        path: the `.csv` file (`data.path`).
        label_column: the header of the label column (`data.label_column`).

    Returns:
        A `Dataset` of feature vectors named after the file.

    Examples:
        >>> ds = load_csv("patients.csv", "outcome")  # doctest: +SKIP
    """
    import csv

    file = existing_file(path, "data.path", "a .csv file with a header row")
    try:
        with open(file, newline="", encoding="utf-8-sig") as handle:  # -sig: Excel's "CSV UTF-8" starts with a byte-order mark
            rows = list(csv.reader(handle))
    except UnicodeDecodeError as error:
        raise ValueError(
            f"heatinv/data/tables.py load_csv: '{file}' (data.path) is not UTF-8 text (byte {error.object[error.start]:#04x} at "
            f"position {error.start}). Save it as UTF-8: Excel's \"CSV UTF-8\", or pandas df.to_csv(path, index=False)."
        ) from error
    if not any(rows[1:]):
        has = "is empty" if not rows else f"has a header ({', '.join(rows[0])}) but no rows"
        raise ValueError(f"heatinv/data/tables.py load_csv: '{file}' (data.path) {has}. Give a table with one row per example.")
    header = [h.strip() for h in rows[0]]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise ValueError(
            f"heatinv/data/tables.py load_csv: '{file}' (data.path) names more than one column {', '.join(map(repr, repeated))}, "
            "so a feature (target.feature) or the label column could not be told apart by name. Give each column "
            "a name of its own in the header row."
        )
    if label_column not in header:
        other = next((name for sign, name in ((";", "semicolons"), ("\t", "tabs")) if len(header) == 1 and sign in header[0]), None)
        fix = (
            f"The header is one column holding {other}: heatinv reads comma-separated values; save the table "
            "with commas (pandas: df.to_csv(path, index=False))."
            if other else "Set data.label_column to the column holding each row's class."
        )
        raise ValueError(
            f"heatinv/data/tables.py load_csv: '{file}' (data.path) has no column {label_column!r} "
            f"(data.label_column); its columns are {header}. {fix}"
        )
    body = [row for row in rows[1:] if row]
    if any(len(row) != len(header) for row in body):
        line = next(i for i, row in enumerate(rows[1:], 2) if row and len(row) != len(header))
        raise ValueError(
            f"heatinv/data/tables.py load_csv: '{file}' (data.path) line {line} has a different number of fields "
            f"than its header ({len(header)}). Fix that row."
        )
    label_at = header.index(label_column)
    features = [h for i, h in enumerate(header) if i != label_at]
    x = _csv_numbers(file, rows, header, label_at)
    raw = [row[label_at].strip() for row in body]
    if "" in raw:
        line = 2 + next(i for i, row in enumerate(rows[1:]) if row and not row[label_at].strip())
        raise ValueError(
            f"heatinv/data/tables.py load_csv: '{file}' (data.path) line {line} has no label (its {label_column!r} cell, "
            "data.label_column, is empty). Label every row, or drop the unlabelled ones."
        )
    names, y = label_classes(raw)
    return _standardized_table(x, y, os.path.splitext(os.path.basename(file))[0], names, tuple(features), test_fraction)


def label_classes(labels: list[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """The classes of a csv's labels and each row's class index.

    Labels that are all numbers are classes by value, in order (``2`` before ``10``; ``1`` and
    ``1.0`` one class, named by its shortest spelling); any other labels are classes as text,
    sorted.

    Examples:
        >>> label_classes(["10", "2", "2.0", "10"])
        (('2', '10'), array([1, 0, 0, 1]))
    """
    try:
        values = {label: float(label) for label in set(labels)}
    except ValueError:
        values = None
    if values is None or not all(np.isfinite(v) for v in values.values()):  # "nan" has no place among numbers
        names = tuple(sorted(set(labels)))
        return names, np.array([names.index(label) for label in labels], np.int64)
    spellings: dict[float, list[str]] = {}
    for label, value in values.items():
        spellings.setdefault(value, []).append(label)
    order = sorted(spellings)
    names = tuple(min(spellings[value], key=lambda text: (len(text), text)) for value in order)
    index = {value: i for i, value in enumerate(order)}
    return names, np.array([index[values[label]] for label in labels], np.int64)


def _csv_numbers(file: str, rows: list[list[str]], header: list[str], label_at: int) -> np.ndarray:
    """The feature columns of a csv's rows as float64 ``[n, d]``; the first cell that is no finite number is an error."""
    x = []
    for line, row in enumerate(rows[1:], 2):
        if not row:
            continue
        values = []
        for i, cell in enumerate(row):
            if i == label_at:
                continue
            try:
                value = float(cell)
            except ValueError:
                value = None
            if value is None or not np.isfinite(value):
                what = "an empty cell (a missing value)" if not cell.strip() else f"{cell.strip()!r}, which is not a finite number"
                raise ValueError(
                    f"heatinv/data/tables.py load_csv: '{file}' (data.path) line {line}, column {header[i]!r} holds {what}; "
                    f"every column but the label ({header[label_at]!r}) must hold numbers. Fill or drop the rows with "
                    "missing values, and encode text columns as numbers (e.g. one 0/1 column per category)."
                )
            values.append(value)
        x.append(values)
    return np.array(x, np.float64)


def _standardized_table(x, y, name, class_names, feature_names, test_fraction) -> Dataset:
    if len(class_names) < 2:
        raise ValueError(
            f"heatinv/data/tables.py: the table '{name}' has only the class(es) {list(class_names)}; a classifier "
            "needs at least two. Check the label column (data.label_column)."
        )
    train, test = stratified_split(y, test_fraction)
    if len(test) == 0:
        counts = np.bincount(y, minlength=len(class_names))
        looks_measured = (
            f" Its label column has {len(class_names)} different values in {len(y)} rows: a measurement rather than "
            "a class?" if len(class_names) > len(y) / 2 else ""
        )
        raise ValueError(
            f"heatinv/data/tables.py: the table '{name}' ({len(y)} rows, {len(class_names)} classes of {counts.min()} to "
            f"{counts.max()} rows) leaves no row to test: {test_fraction:.0%} of each class is held out, rounded, "
            f"which is no row at all here.{looks_measured} Add rows, or choose a label column "
            "of classes (data.label_column)."
        )
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    std = np.where(std > 0, std, 1.0)  # a constant column stays 0 rather than dividing by zero
    x = ((x - mean) / std).astype(np.float32)
    low, high = value_range(x[train], x[test])
    return Dataset(x[train], y[train], x[test], y[test], name=name, class_names=class_names,
                   feature_names=feature_names, low=low, high=high)
