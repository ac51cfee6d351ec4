"""The three zero-gradient questions heatinv was built for, rebuilt and diagnosed.

    python scripts/doctor_cases.py

1. Differentiating an LRP heatmap with respect to the weights of the 784-300-100-10 MLP
   whose last layer is a ReLU, with an L1 loss to a target heatmap made from the same
   weights, starting LRP from ``A[L] * onehot`` (the post-ReLU output).
2. The gradient of a cross-entropy with respect to the input of an MNIST-like model with a
   softmax output, on an image it classifies with full confidence.
3. A saliency map of a convolutional classifier with a two-class softmax head whose
   prediction is [1.0, 2e-25] (VGG16 in the question; its weights cannot be downloaded
   here, so a small conv net with the same head stands in).

Everything runs on the bundled digits data; the output is pasted in docs/doctor.md.
"""

from __future__ import annotations

import os
import tempfile

from heatinv.startup import start_tensorflow

start_tensorflow()  # before keras brings TensorFlow in: no CUDA or oneDNN notices on a CPU machine

import keras  # noqa: E402
import numpy as np  # noqa: E402

from heatinv.data import load_digits  # noqa: E402
from heatinv.doctor import HeatmapObjective, SaliencyObjective, diagnose, format_report  # noqa: E402
from heatinv.lrp import LRP  # noqa: E402
from heatinv.models import Architecture, reference_model  # noqa: E402


def case_1(data, cache: str) -> None:
    model, acc = reference_model(Architecture(hidden=(300, 100), output_activation="relu"), data, 20, cache)
    lrp = LRP(model, composite="epsilon_gamma_box", output="activation")  # A[L] * onehot
    logits = model(data.x_test).numpy()
    dead = np.all(logits <= 0, axis=1)
    print(f"Case 1: MLP with a final ReLU, test accuracy {acc:.3f}; all ten outputs are 0 for "
          f"{dead.mean():.0%} of the test images.\n")
    alive = int(np.flatnonzero(~dead & (np.argmax(logits, 1) == data.y_test))[0])
    x, label = data.x_test[alive : alive + 1], int(data.y_test[alive])
    own_target = lrp(x, label).numpy()  # the target heatmap, from the same weights
    print(format_report(diagnose(model, x, label, HeatmapObjective(own_target, lrp, loss="l1")),
                        f"case 1a, test image {alive}, target made from the same weights"))
    print()
    off = int(np.flatnonzero(dead)[0])
    x, label = data.x_test[off : off + 1], int(data.y_test[off])
    print(format_report(diagnose(model, x, label, HeatmapObjective(own_target, lrp, loss="l1")),
                        f"case 1b, test image {off}, all outputs 0"))
    print()


def case_2(data, cache: str) -> None:
    model, acc = reference_model(Architecture(hidden=(300, 100), output_activation="softmax"), data, 60, cache)
    probabilities = model(data.x_test).numpy()
    confident = int(np.argmax(probabilities.max(axis=1)))
    x, label = data.x_test[confident : confident + 1], int(np.argmax(probabilities[confident]))
    print(f"Case 2: softmax MLP, test accuracy {acc:.3f}; most confident test image {confident}, "
          f"p = {probabilities[confident].max():.8f}.\n")
    print(format_report(diagnose(model, x, label, SaliencyObjective()), "case 2, cross-entropy wrt the input"))
    print()
    print(format_report(diagnose(model, x, label, SaliencyObjective(loss="logit")), "case 2, the fix: the logit"))
    print()


def case_3(data) -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(8, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )
    x = data.x_test[:1]
    hidden = x
    for layer in model.layers[:-1]:
        hidden = layer(hidden)
    hidden = hidden.numpy()[0]
    # Set the head so the prediction is [1.0, ~2e-25], as in the question.
    head = model.layers[-1]
    kernel = np.zeros((16, 2), "float32")
    kernel[:, 0] = 57.0 / max(hidden.sum(), 1e-6)
    head.set_weights([kernel, np.zeros(2, "float32")])
    p = model(x).numpy()[0]
    print(f"Case 3: conv net with a 2-class softmax head, prediction [{p[0]:.7f}, {p[1]:.3g}].\n")
    print(format_report(diagnose(model, x, 0, SaliencyObjective()), "case 3, saliency of the loss"))
    print()
    print(format_report(diagnose(model, x, 0, SaliencyObjective(loss="logit")), "case 3, the fix: the logit"))


def main() -> None:
    data = load_digits()
    cache = os.path.join(tempfile.gettempdir(), "heatinv-doctor-cases")
    case_1(data, cache)
    case_2(data, cache)
    case_3(data)


if __name__ == "__main__":
    main()
