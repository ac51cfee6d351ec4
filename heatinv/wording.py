"""Counts in words for the console and error messages: ``1 epoch``, ``3 epochs``."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1.

    Example:
    >>> count(1, "epoch"), count(3, "batch", "batches")
    ('1 epoch', '3 batches')
    """
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
