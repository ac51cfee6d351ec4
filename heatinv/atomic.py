"""Files written whole or not at all: a reader (or a crash) never sees half a file.

Every result file heatinv writes (``metrics.json``, ``student.keras``, PNGs, the reference
cache, sweep summaries, benchmark records) goes through :func:`atomic_path`: the content is
written under a temporary name of this writer's own in the same folder, then renamed onto the
final name, which is atomic on one file system. Parallel writers never collide on the
temporary name, and a failure removes it.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path to write ``path``'s content to; renamed onto ``path`` when the block succeeds.

    The temporary name keeps ``path``'s extension (Keras picks the format from it) and is
    removed when the block or the rename fails, so the old ``path``, if any, stays whole.

    Args:
        path: the final file name; its folder is created when missing.

    Returns:
        A context manager yielding the temporary path.

    Examples:
        >>> with atomic_path("/tmp/student.keras") as tmp:  # doctest: +SKIP
        ...     model.save(tmp)
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    stem, extension = os.path.splitext(os.path.basename(path))
    tmp = os.path.join(folder, f".{stem}.{uuid.uuid4().hex}.tmp{extension}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (ordinary permissions, from the umask)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def write_json(path: str, data, indent: int = 2) -> None:
    """Write ``data`` as JSON to ``path`` whole or not at all.

    JSON has no NaN or infinity (Python's ``NaN`` token is refused by other readers: ``jq``,
    JavaScript's ``JSON.parse``), so a non-finite float is written as ``null``.

    Examples:
        >>> write_json("/tmp/metrics.json", {"cosine": 0.99})  # doctest: +SKIP
    """
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(_finite_or_null(data), f, indent=indent, allow_nan=False)


def _finite_or_null(data):
    """``data`` with every NaN or infinite float (in dicts, lists and tuples) replaced by None."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite_or_null(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite_or_null(value) for value in data]
    return data
