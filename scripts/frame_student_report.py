"""What a student of the MobileNetV2 frame experiment does on every held-out image, and which of its units still work.

    python scripts/frame_student_report.py outputs/shapes run_dir/student.keras [more .keras files]

For each model: the cosine of its LRP map (``epsilon_gamma_box``, channels summed, explained
for each image's label, box [0, 1]) to the frame target, per class, with the mean logits; and
for its ReLU layers, on the first 128 held-out images, the share of outputs at 0 and at
ReLU6's cap of 6 (both have a zero gradient) and the share of channels that are 0 on every
one of those images (dead). A student can score well on the image it was trained on and
draw the frame with the wrong sign on classes whose logit is negative; and units dead or
capped on every image are ones no loss term can train again.
"""

from __future__ import annotations

import argparse

import keras
import numpy as np

from heatinv.build import explain_all
from heatinv.channel_sum import ChannelSumLRP
from heatinv.data import load_dataset
from heatinv.models import load_model_file
from heatinv.similarity import cosine_numpy
from heatinv.targets import pattern_map


def frame_cosines(model: keras.Model, x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(cosine [N], logits [N, classes])``: each held-out map against the frame at the images' size."""
    maps, logits = explain_all(ChannelSumLRP(model, "epsilon_gamma_box", low=0.0, high=1.0), x, labels)
    frame = pattern_map("frame", x.shape[1], width=x.shape[2])[..., 0]
    return cosine_numpy(maps.reshape(len(maps), -1), np.broadcast_to(frame.ravel(), (len(maps), frame.size))), logits


def unit_report(model: keras.Model, x: np.ndarray) -> list[tuple[str, float, float, float]]:
    """``(layer, share at 0, share at 6, share of channels 0 on every image)`` for each ReLU layer."""
    relus = [layer for layer in model.layers if isinstance(layer, keras.layers.ReLU)]
    if not relus:
        return []
    outputs = keras.Model(model.inputs, [layer.output for layer in relus])(x, training=False)
    if len(relus) == 1:  # a model of one output returns that tensor, not a list of one
        outputs = [outputs]
    rows = []
    for layer, out in zip(relus, outputs):
        out = np.asarray(out)
        channels = out.reshape(-1, out.shape[-1])
        rows.append((layer.name, float(np.mean(out <= 0)), float(np.mean(out >= 6)), float(np.mean(np.all(channels <= 0, axis=0)))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the image folder of the experiment (tests/drawn_shapes.py writes one)")
    parser.add_argument("models", nargs="+", help=".keras files: a run's student.keras, or the cached reference")
    args = parser.parse_args()
    data = load_dataset("folder", args.folder, image_size=(32, 32), test_split=0.2, seed=0)
    x, labels = data.x_test[0 : len(data.y_test)], data.y_test
    for path in args.models:
        model = load_model_file(path)
        cosine, logits = frame_cosines(model, x, labels)
        accuracy = float(np.mean(np.argmax(logits, axis=1) == labels))
        print(f"{path}: held-out cosine to the frame {cosine.mean():.3f}, accuracy {accuracy:.3f}")
        for c, name in enumerate(data.class_names):
            chosen = labels == c
            print(
                f"  class {name}: cosine mean {cosine[chosen].mean():.3f} (min {cosine[chosen].min():.3f}), "
                f"its mean logit {logits[chosen, c].mean():.1f}"
            )
        for name, zero, capped, dead in unit_report(model, x[:128]):
            print(f"  {name:24s} at 0 {zero:.2f}  at 6 {capped:.2f}  channels dead {dead:.2f}")


if __name__ == "__main__":
    main()
