"""Right for the right reasons with Keras's fit: a confounder the explanation term teaches a model to ignore.

    python scripts/right_for_the_right_reasons.py [--epochs 30] [--weight 10]

Decoy digits (after Ross et al. 2017's Decoy MNIST, on scikit-learn's bundled digits): each
training image gets a 4x4 swatch in a random corner whose shade tells its label (1 - 0.09 y);
the held-out images get the swatch with a random shade, so the shade is no use there. Two
models of the same architecture and seed are trained for the same epochs: one by cross-entropy
alone (``model.fit``), one by :class:`heatinv.keras.ExplanationTrainer` adding the share of its
LRP relevance that lies on the four corners (``explanation_loss="masked"``: the mask says
where a confounder may be, not what it is). Printed: held-out accuracy with random swatches and
without any, and the share of relevance on the corners.
"""

from __future__ import annotations

import argparse

from heatinv.startup import start_tensorflow

start_tensorflow()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from heatinv.data import load_digits  # noqa: E402
from heatinv.keras import ExplanationTrainer, masked_share  # noqa: E402
from heatinv.lrp import LRP  # noqa: E402

SWATCH = 4
COMPOSITE = "epsilon_plus"


def corners(shape: tuple[int, ...]) -> np.ndarray:
    """``[H, W, 1]``: 1 on the four corner swatches."""
    mask = np.zeros(shape, np.float32)
    for rows in (slice(0, SWATCH), slice(-SWATCH, None)):
        for cols in (slice(0, SWATCH), slice(-SWATCH, None)):
            mask[rows, cols] = 1.0
    return mask


def with_swatch(x: np.ndarray, shades: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``x`` with a ``shades``-coloured swatch in a random corner of each image."""
    x = x.copy()
    for image, shade, corner in zip(x, shades, rng.integers(0, 4, len(x))):
        rows = slice(0, SWATCH) if corner < 2 else slice(-SWATCH, None)
        cols = slice(0, SWATCH) if corner % 2 == 0 else slice(-SWATCH, None)
        image[rows, cols] = shade
    return x


def model_for(input_shape) -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10)])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--weight", type=float, default=10.0, help="the explanation term's weight")
    args = parser.parse_args(argv)
    digits, rng = load_digits(), np.random.default_rng(0)
    y_train, y_test = digits.y_train.astype("int32"), digits.y_test.astype("int32")
    x_train = with_swatch(digits.x_train, 1.0 - 0.09 * y_train, rng)
    x_random = with_swatch(digits.x_test, rng.uniform(0.1, 1.0, len(y_test)), rng)
    mask = np.repeat(corners(digits.input_shape)[None], len(x_train), axis=0)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    plain = model_for(digits.input_shape)
    plain.compile(keras.optimizers.Adam(1e-3), loss, metrics=["accuracy"])
    plain.fit(x_train, y_train, batch_size=64, epochs=args.epochs, verbose=0)

    trainer = ExplanationTrainer(model_for(digits.input_shape), composite=COMPOSITE)
    trainer.compile(keras.optimizers.Adam(1e-3), loss, explanation_loss="masked", explanation_weight=args.weight, metrics=["accuracy"])
    data = tf.data.Dataset.from_tensor_slices((x_train, y_train, mask)).shuffle(len(x_train), seed=0).batch(64)
    trainer.fit(data, epochs=args.epochs, verbose=0)

    results = {}
    for name, model in (("cross-entropy only", plain), ("with the explanation term", trainer.student)):
        row = {}
        for split, x in (("random swatch", x_random), ("no swatch", digits.x_test)):
            row[split] = float(np.mean(np.argmax(model.predict(x, verbose=0), axis=-1) == y_test))
        heatmaps = LRP(model, COMPOSITE)(x_random, y_test)
        row["share on corners"] = float(masked_share(heatmaps, np.repeat(corners(digits.input_shape)[None], len(y_test), axis=0)))
        results[name] = row
        print(f"{name:26s}  held-out accuracy: random swatch {row['random swatch']:.3f}, no swatch {row['no swatch']:.3f}; "
              f"relevance on the corners {row['share on corners']:.3f}")
    return results


if __name__ == "__main__":
    main()
