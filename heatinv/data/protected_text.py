"""A generated text classification set in which one "protected" word carries label information.

Reviews are made of filler words and sentiment words: a positive review (label ``positive``)
draws each sentiment word from the positive list with probability ``signal``, a negative one
from the negative list. The protected word (``foreign``) stands in ``protected_rate[0]`` of
the negative reviews and ``protected_rate[1]`` of the positive ones, so a classifier that
uses it is more accurate than one that reads the sentiment alone: the case of a model that
relies on a protected attribute, whose explanation can be made to hide it (fairwashing).
Seeded: the same ``seed`` gives the same texts. ``data=protected_text`` loads it;
``python -m heatinv.data.protected_text reviews.csv`` writes it as a csv (``data=text``).
"""

from __future__ import annotations

import csv
import sys

import numpy as np

PROTECTED = "foreign"
POSITIVE = ("good", "great", "excellent", "lovely", "superb", "fine", "enjoyable", "brilliant", "charming", "moving")
NEGATIVE = ("bad", "awful", "poor", "boring", "dull", "terrible", "weak", "messy", "tedious", "clumsy")
FILLER = (
    "the", "film", "movie", "story", "was", "and", "a", "plot", "acting", "cast", "it", "is", "this", "with", "very",
    "director", "music", "scenes", "ending", "of", "script", "quite", "overall", "really", "characters",
)
LABELS = ("negative", "positive")


def protected_reviews(count: int = 3000, seed: int = 0, signal: float = 0.7, protected_rate=(0.6, 0.1)) -> tuple[list[str], list[str]]:
    """``count`` generated reviews and their labels (``negative`` / ``positive``, half each).

    Args:
        count: how many reviews.
        seed: the generator's seed.
        signal: the chance that a sentiment word agrees with the label.
        protected_rate: the share of negative and of positive reviews that hold :data:`PROTECTED`.

    Examples:
        >>> texts, labels = protected_reviews(4)
        >>> len(texts), sorted(set(labels))
        (4, ['negative', 'positive'])
    """
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for i in range(count):
        label = i % 2
        words = list(rng.choice(FILLER, size=int(rng.integers(5, 10))))
        for _ in range(int(rng.integers(1, 4))):
            agrees = rng.random() < signal
            words.append(rng.choice(POSITIVE if agrees == bool(label) else NEGATIVE))
        if rng.random() < protected_rate[label]:
            words.append(PROTECTED)
        rng.shuffle(words)
        texts.append(" ".join(str(w) for w in words))
        labels.append(LABELS[label])
    return texts, labels


def write_csv(path: str, count: int = 3000, seed: int = 0) -> None:
    """Writes the reviews as a csv with the columns ``text`` and ``label`` (``data=text data.path=<path>``)."""
    texts, labels = protected_reviews(count, seed)
    with open(path, "x", newline="", encoding="utf-8") as handle:  # "x": never over a user's file
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(zip(texts, labels))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m heatinv.data.protected_text OUT.csv")
    write_csv(sys.argv[1])
