"""Models: build the MLP or CNN, load a user's file safely, and train (once) the reference.

The reference model is the same architecture trained on the dataset; its heatmaps are the
``digit*`` targets and ``init=reference`` starts from its weights. It is trained once per
(dataset, architecture, seed, recipe) and cached as a ``.keras`` file: trained until a
validation split of the training images stops improving, seeded and deterministic.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import warnings
import zipfile
from dataclasses import asdict, dataclass

import h5py
import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

from heatinv.atomic import atomic_path
from heatinv.data import Dataset, image_key, reading
from heatinv.layers import SoftplusBeta
from heatinv.precise_batch_norm import batch_norm_layers, set_population_statistics
from heatinv.progress import FitProgress
from heatinv.transformers import text_classifier, vit
from heatinv.startup import dropping_known_notices
from heatinv.wording import count

log = logging.getLogger(__name__)

INPUT_SHAPE = (28, 28, 1)

APPLICATIONS = {
    "vgg16": "VGG16",
    "vgg19": "VGG19",
    "resnet50": "ResNet50",
    "resnet50v2": "ResNet50V2",
    "mobilenetv2": "MobileNetV2",
    "densenet121": "DenseNet121",
    "efficientnetb0": "EfficientNetB0",
}
"""``model.name`` -> the ``keras.applications`` constructor, built with ``weights=None`` (never downloaded)."""

POOLING = {"max": keras.layers.MaxPooling2D, "avg": keras.layers.AveragePooling2D, "strided": None}
"""``model.pool`` -> the cnn's 2x2 pooling layer; ``strided``: none, each convolution steps by 2 instead."""

APPLICATION_MIN_SIZE = 32  # the smallest height and width keras.applications accept


@dataclass(frozen=True)
class Architecture:
    """What :func:`build_model` needs; mirrors the ``model`` config group."""

    name: str = "mlp"
    hidden: tuple[int, ...] = (300, 100)
    filters: tuple[int, ...] = (16, 32)
    activation: str = "relu"
    output_activation: str = "linear"
    l2: float = 1e-4
    beta: float = 10.0  # sharpness of activation="softplus"
    pool: str = "max"  # the cnn's downsampling: "max" or "avg" pooling, or "strided" convolutions
    patch: int = 0  # the vit's patch side; 0: from the image size (:func:`vit_patch`)
    dim: int = 32
    depth: int = 2
    heads: int = 4


def build_model(
    arch: Architecture, num_classes: int = 10, seed: int | None = None, input_shape: tuple[int, ...] = INPUT_SHAPE,
    vocabulary: int | None = None,
) -> keras.Model:
    """A fresh, untrained model taking ``[batch, *input_shape]`` inputs and scoring ``num_classes`` classes.

    ``mlp``: Flatten -> Dense(hidden..., activation) -> Dense(classes, output_activation).
    ``cnn``: Conv 3x3 -> Pool 2 -> Conv 3x3 -> Pool 2 -> Flatten -> Dense(classes), the pooling
    max (``pool="max"``) or average (``pool="avg"``); ``pool="strided"`` drops the pooling
    and steps each convolution by 2 instead.
    ``transformer``: an encoder of ``vocabulary`` token ids ``[length]`` (:func:`heatinv.transformers.text_classifier`:
    embedding with padding masked, learned positions, ``depth`` pre-norm blocks, the mean token);
    the only model of token ids.
    ``vit``: a Vision Transformer (:func:`heatinv.transformers.vit`: patches embedded by a
    strided Conv2D, learned positions, ``depth`` pre-norm blocks of ``heads`` heads, the mean
    token, linear logits).
    ``activation="softplus"`` puts a :class:`~heatinv.layers.SoftplusBeta` (sharpness
    ``beta``) after each hidden layer instead of a ReLU. A name of :data:`APPLICATIONS`
    builds that Keras application (``weights=None``, linear logits).

    Examples:
        >>> build_model(Architecture("mlp", hidden=(300, 100))).count_params()
        266610
    """
    if seed is not None:
        keras.utils.set_random_seed(seed)
    input_shape = tuple(input_shape)
    if arch.name in APPLICATIONS:
        model = build_application(arch.name, input_shape, num_classes)
        return smoothed(model, arch.beta) if arch.activation == "softplus" else model
    if (arch.name == "transformer") != (vocabulary is not None):
        raise ValueError(
            "model=transformer reads token ids, which data=text gives (data.path=<texts>.csv); the other models read "
            f"images or feature vectors. Got model={arch.name} for {'token ids' if vocabulary else f'inputs of shape {input_shape}'}: "
            f"{'use model=transformer' if vocabulary else 'use data=text with model=transformer, or another model'}."
        )
    if arch.name == "transformer":
        return text_classifier(input_shape[0], vocabulary, num_classes, dim=arch.dim, depth=arch.depth, heads=arch.heads)
    if arch.name == "vit":
        if len(input_shape) != 3:
            raise ValueError(f"model=vit needs images [H, W, C]; the data gives feature vectors of shape {input_shape}. Use model=mlp.")
        patch = arch.patch or vit_patch(input_shape)
        return vit(input_shape, num_classes, patch=patch, dim=arch.dim, depth=arch.depth, heads=arch.heads)
    if arch.name == "cnn" and len(input_shape) != 3:
        raise ValueError(
            f"model=cnn needs images [H, W, C]; the data gives feature vectors of shape {input_shape}. "
            "Use model=mlp for a table."
        )
    if arch.name == "cnn" and arch.pool not in POOLING:
        raise ValueError(f"Unknown pooling {arch.pool!r} (model.pool); expected one of {list(POOLING)}.")
    smallest = 2 ** len(arch.filters)  # each pooling (or stride 2) halves the height and width
    if arch.name == "cnn" and POOLING[arch.pool] is not None and min(input_shape[:2]) < smallest:
        raise ValueError(
            f"model=cnn with {len(arch.filters)} convolutions (model.filters={list(arch.filters)}), each followed by a 2x2 "
            f"pooling, needs images of at least {smallest}x{smallest} pixels; the data gives {input_shape[0]}x{input_shape[1]} "
            f"(shape {input_shape}). Use fewer convolutions (e.g. model.filters=[16]), model.pool=strided, or model=mlp."
        )
    regularizer = keras.regularizers.L2(arch.l2) if arch.l2 else None
    smooth = arch.activation == "softplus"
    hidden_activation = None if smooth else arch.activation

    def activated(layer: keras.layers.Layer, i: int) -> list[keras.layers.Layer]:
        return [layer, SoftplusBeta(arch.beta, name=f"softplus_{i}")] if smooth else [layer]

    # Fixed layer names: TensorBoard tags (grad_norm/<layer>/<variable>) then read the same
    # in every run, whatever other models the Keras session has named before.
    layers: list[keras.layers.Layer] = [keras.Input(input_shape)]
    if arch.name == "mlp":
        layers.append(keras.layers.Flatten(name="flatten"))
        for i, units in enumerate(arch.hidden, 1):
            dense = keras.layers.Dense(units, activation=hidden_activation, kernel_regularizer=regularizer, name=f"dense_{i}")
            layers += activated(dense, i)
    elif arch.name == "cnn":
        for i, filters in enumerate(arch.filters, 1):
            pooling = POOLING[arch.pool]
            conv = keras.layers.Conv2D(
                filters, 3, strides=1 if pooling else 2, padding="same", activation=hidden_activation,
                kernel_regularizer=regularizer, name=f"conv_{i}",
            )
            layers += activated(conv, i)
            if pooling:
                layers.append(pooling(2, name=f"pool_{i}"))
        layers.append(keras.layers.Flatten(name="flatten"))
    else:
        raise ValueError(f"Unknown architecture {arch.name!r}; expected 'mlp', 'cnn' or one of {list(APPLICATIONS)}.")
    layers.append(
        keras.layers.Dense(num_classes, activation=arch.output_activation, kernel_regularizer=regularizer, name="output")
    )
    return keras.Sequential(layers, name=arch.name)


VIT_FIELDS = ("patch", "dim", "depth", "heads")


def vocabulary_size(dataset: Dataset) -> int | None:
    """The number of token ids of a text data set (padding and ``[UNK]`` included), None for other data."""
    return len(dataset.vocabulary) if dataset.is_text else None


def architecture_key(arch: Architecture) -> dict:
    """What names the architecture in a cache key: its fields, the vit's own only for a vit (other keys stay as they were)."""
    fields = asdict(arch)
    return fields if arch.name in ("vit", "transformer") else {k: v for k, v in fields.items() if k not in VIT_FIELDS}


def vit_patch(input_shape: tuple[int, ...], most_tokens: int = 64) -> int:
    """The smallest patch side that divides both image sides and leaves at most ``most_tokens`` patches.

    Examples:
        >>> vit_patch((28, 28, 1)), vit_patch((32, 32, 3)), vit_patch((224, 224, 3))
        (4, 4, 28)
    """
    height, width = input_shape[:2]
    for patch in range(1, math.gcd(height, width) + 1):
        if height % patch == 0 and width % patch == 0 and (height // patch) * (width // patch) <= most_tokens:
            return patch
    raise ValueError(
        f"model=vit cuts {height}x{width} images into square patches that divide both sides; none leaves at most "
        f"{most_tokens} tokens. Give model.patch, or images whose sides share a larger divisor."
    )


def build_application(name: str, input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """The Keras application ``name`` for ``input_shape`` images and ``num_classes`` linear logits.

    Built with ``weights=None``: nothing is downloaded; pretrained weights come from a local
    file (``model.weights``, see :func:`reference_model`).

    Examples:
        >>> build_application("mobilenetv2", (32, 32, 3), 3).output.shape
        (None, 3)
    """
    if len(input_shape) != 3:
        raise ValueError(
            f"model={name} is an image network; the data gives feature vectors of shape {input_shape}. "
            "Use model=mlp for a table."
        )
    if min(input_shape[:2]) < APPLICATION_MIN_SIZE:
        raise ValueError(
            f"model={name} needs images of at least {APPLICATION_MIN_SIZE}x{APPLICATION_MIN_SIZE} pixels; the data "
            f"gives inputs of shape {input_shape}. Resize the images (data=folder data.image_size=[32,32]) or use "
            "model=mlp or model=cnn."
        )
    constructor = getattr(keras.applications, APPLICATIONS[name])
    return constructor(
        include_top=True, weights=None, input_shape=input_shape, classes=num_classes, classifier_activation=None
    )


def smoothed(model: keras.Model, beta: float) -> keras.Model:
    """``model`` with each ReLU (ReLU6 included) a :class:`~heatinv.layers.SoftplusBeta`.

    A ReLU network's units that are off for an input give the heatmap's derivative nothing
    to follow there: relevance cannot be moved into regions the features ignore (Anders et
    al. 2020 manipulate softplus networks for this reason). A ReLU layer or
    ``Activation("relu")`` becomes a softplus layer of the same name; a layer that applies
    its ReLU itself (``Conv2D(activation="relu")``, as in VGG) becomes a small Sequential
    ``<name>_smoothed`` of that layer, same name, without its activation, and a softplus
    ``<name>_softplus``. The weights keep their order and count, so
    ``set_weights(model.get_weights())`` fits; ReLU6's upper clip is dropped.

    Examples:
        >>> model = smoothed(build_application("mobilenetv2", (32, 32, 3), 3), beta=10.0)
        >>> sum(isinstance(layer, SoftplusBeta) for layer in model.layers)
        35
    """

    def swap(layer: keras.layers.Layer) -> keras.layers.Layer:
        if isinstance(layer, keras.layers.ReLU) or (isinstance(layer, keras.layers.Activation) and _is_relu(layer.activation)):
            return SoftplusBeta(beta, name=layer.name)
        config = layer.get_config()
        if not isinstance(layer, keras.layers.Activation) and _is_relu(getattr(layer, "activation", None)):
            config["activation"] = None
            linear = layer.__class__.from_config(config)
            return keras.Sequential([linear, SoftplusBeta(beta, name=f"{layer.name}_softplus")], name=f"{layer.name}_smoothed")
        return layer.__class__.from_config(config)

    return keras.models.clone_model(model, clone_function=swap, recursive=True)


def _is_relu(activation) -> bool:
    return getattr(activation, "__name__", "") in ("relu", "relu6")


def load_model_file(path: str) -> keras.Model:
    """Load a user's ``.keras`` / ``.h5`` model with ``safe_mode=True``; no code is executed.

    Raises:
        FileNotFoundError: naming the path and the config key.
        ValueError: for a file that is no Keras model (a folder, a weights file, another
            format) or that Keras refuses (a ``Lambda`` layer under safe mode, say).
    """
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):  # Keras's unzipped format has one
        raise ValueError(
            f"Model path {path} (model.path) is a folder (a TensorFlow SavedModel?), not a model file; Keras 3 "
            "loads a SavedModel for inference only. Save the model from the code that built it with "
            "model.save('<name>.keras') and point model.path at that file."
        )
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"Model file {path} (model.path) does not exist. Point model.path at a Keras .keras or .h5 file."
        )
    wrong_kind = _not_a_model_file(path)
    if wrong_kind:
        raise ValueError(f"Model file {path} (model.path) {wrong_kind}")
    try:
        return keras.saving.load_model(path, compile=False, safe_mode=True)
    except Exception as error:  # Keras raises several types; all mean "refused"
        hint = (
            " It contains a Lambda layer or other serialized Python code, which safe_mode refuses so that "
            "opening a model never runs code; rebuild the model without it."
            if "safe_mode" in str(error) or "Lambda" in str(error)
            else ""
        )
        raise ValueError(f"Keras could not load model file {path} (model.path): {keras_reason(error)}{hint}") from error


def _holds_keras_config(path: str) -> bool:
    with zipfile.ZipFile(path) as archive:
        return "config.json" in archive.namelist()


def _not_a_model_file(path: str) -> str | None:
    """Why ``path`` cannot be a Keras model file, told by its name and first bytes; None when it may be one."""
    if os.path.isdir(path):
        return None
    if path.endswith(".weights.h5"):
        return (
            "holds weights only (model.save_weights). Give them to the architecture they came from: "
            "model=<name> model.weights=<file>.weights.h5, or save the whole model with model.save('<name>.keras')."
        )
    extension = os.path.splitext(path)[1].lower()
    if extension == ".keras" and zipfile.is_zipfile(path) and not _holds_keras_config(path):
        return (
            "is a zip archive without the config.json every .keras file holds (an .npz renamed?). Save the model "
            "with model.save('<name>.keras') and point model.path at that file."
        )
    if extension == ".keras" and not zipfile.is_zipfile(path):
        return (
            "is not a .keras archive (a .keras file is a zip archive, and this one is not: a file of another kind, "
            "renamed, or one cut short). Save the model again with model.save('<name>.keras')."
        )
    if extension in (".h5", ".hdf5") and not h5py.is_hdf5(path):
        return "is not an HDF5 file (a cut or renamed file?). Save the model again with model.save('<name>.keras')."
    if extension not in (".keras", ".h5", ".hdf5"):
        return (
            f"ends with {extension or 'no extension'}; Keras reads models saved as .keras (model.save('<name>.keras')) "
            "or legacy .h5 files."
        )
    return None


def keras_reason(error: Exception, limit: int = 400) -> str:
    """Keras's error as one line: a shape mismatch as the variable and both shapes, else its text, arrays left out.

    Examples:
        >>> keras_reason(ValueError("Could not load. ... must match. variable.shape=(4, 5), Received: "
        ...     "value.shape=(4, 3). Target variable: <Variable path=dense/kernel, shape=(4, 5), value=[[0.1 0.2]]>"))
        'dense/kernel has shape (4, 5) in the model and (4, 3) in the file.'
    """
    text = " ".join(str(error).split())
    mismatch = re.search(
        r"variable\.shape=(\(.*?\)), Received: value\.shape=(\(.*?\))\. Target variable: <Variable path=([^,]+)", text
    )
    if mismatch:
        own, saved, variable = mismatch.groups()
        return f"{variable} has shape {own} in the model and {saved} in the file."
    text = re.sub(r"value=\[.*?\]>", ">", text)  # a variable's values, printed whole
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + " ..."
    return text if text.endswith((".", "...")) else text + "."


def with_input_shape(model: keras.Model, input_shape: tuple[int, ...]) -> keras.Model:
    """``model`` for inputs of ``input_shape`` (no batch axis): itself when its input says so, else a copy with its weights.

    A model saved with sizes left open (``keras.Input((None, None, 3))``) is built again
    for the data's size, so every layer has the static shapes the explainer reads.

    Examples:
        >>> inputs = keras.Input((None, None, 3))
        >>> open_model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(inputs)))
        >>> tuple(with_input_shape(open_model, (32, 32, 3)).inputs[0].shape)
        (None, 32, 32, 3)
    """
    if tuple(model.inputs[0].shape[1:]) == tuple(input_shape):
        return model
    # in the structure of model.input: a model saved as keras.Model([x], y) wants a list. A loaded
    # Sequential has inputs but no model.input (it "has never been called"), and wants one tensor.
    structure = model.inputs[0] if isinstance(model, keras.Sequential) else model.input
    inputs = keras.tree.map_structure(lambda x: keras.Input(shape=input_shape, dtype=x.dtype), structure)
    clone = keras.models.clone_model(model, input_tensors=inputs)
    clone.set_weights(model.get_weights())
    return clone


def variable_tag(variable) -> str:
    """``<layer>/<variable>`` from a Keras variable's path (``sequential/dense/kernel``): TensorBoard tags and the doctor's names."""
    return "/".join(variable.path.split("/")[-2:])


def variable_tags(variables) -> list[str]:
    """:func:`variable_tag` of each variable, or its whole path where two variables would share one
    (the sublayers of two attention layers are both ``query/kernel``).

    Examples:
        >>> from types import SimpleNamespace as V
        >>> variable_tags([V(path="a/query/kernel"), V(path="b/query/kernel"), V(path="m/dense/bias")])
        ['a/query/kernel', 'b/query/kernel', 'dense/bias']
    """
    tags = [variable_tag(v) for v in variables]
    return [v.path if tags.count(tag) > 1 else tag for v, tag in zip(variables, tags)]


def accuracy(model: keras.Model, x: np.ndarray, y: np.ndarray, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` on ``(x, y)``.

    Calls the model directly rather than ``model.predict``, which compiles a new function
    for every model and warns about retracing in a sweep.
    """
    correct = 0
    for start in range(0, len(x), batch_size):
        logits = model(x[start : start + batch_size], training=False)
        correct += int(np.sum(np.argmax(logits, axis=-1) == y[start : start + batch_size]))
    return correct / len(x)


# The reference recipe: bump when it changes, so an entry trained by an older recipe is never reused.
REFERENCE_RECIPE = "early-stopping-precise-bn-v2"
FIT_BATCH_NORM_MOMENTUM = 0.9
"""BatchNormalization's momentum while the reference is fitted: its moving statistics follow the last ~10 batches.

Keras's applications come with 0.99 (0.999 in MobileNetV2), made for long trainings; in a fit
of a few dozen steps they barely leave their initial values, so the validation loss that stops
the training would be measured with stale statistics. The final statistics are recomputed
after the fit in any case (:func:`~heatinv.precise_batch_norm.set_population_statistics`).
"""
VALIDATION_FRACTION = 0.15  # of the training images, carved out with the seed
REFERENCE_SEED = 0  # the trainer's reference: its initial weights and its validation split
PATIENCE = 10  # epochs without a better validation loss before training stops


def validation_split(count: int, seed: int, fraction: float = VALIDATION_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """Indices of ``count`` training images split into (fit, validation), drawn from ``seed`` only.

    The validation images are training images: the held-out test set is never looked at
    before the final metrics.

    Examples:
        >>> fit, val = validation_split(100, seed=0)
        >>> len(fit), len(val), len(set(fit) | set(val))
        (85, 15, 100)
    """
    order = np.random.default_rng([seed, count]).permutation(count)
    size = max(1, int(round(fraction * count)))
    return np.sort(order[size:]), np.sort(order[:size])


def reference_model(
    arch: Architecture, dataset: Dataset, epochs: int, cache_dir: str, seed: int = 0, weights: str | None = None
) -> tuple[keras.Model, float]:
    """The trained reference and its test accuracy, from the cache or trained now.

    Trained with Adam on the training images minus a validation split
    (:func:`validation_split`) for at most ``epochs`` epochs, stopped once the validation
    loss has not improved for ``PATIENCE`` epochs, with the best epoch's weights restored.
    A model with BatchNormalization is fitted with momentum :data:`FIT_BATCH_NORM_MOMENTUM`
    (restored to the layer's own afterwards), and its moving statistics are then set to the
    population statistics of those training images under the final weights ("precise BN").
    Seeded and run with TensorFlow's op determinism, so the same call gives the same
    weights on a machine with the same versions and CPU (see docs/manipulation.md on what is not
    bit-reproducible). The cache key covers the dataset, the architecture, the epochs, the
    seed and the recipe, so a changed config never reuses a stale model. ``weights`` (a local
    ``.weights.h5``, ``model.weights``) replaces the training: the architecture gets those weights.

    Args:
        arch: the architecture.
        dataset: its training images train (and validate) the model; its test images only
            give the returned accuracy.
        epochs: the most epochs to train.
        cache_dir: where trained references are kept.
        seed: initial weights, validation split and batch order.
        weights: a local ``.weights.h5`` to use instead of training, or None.

    Returns:
        ``(model, test accuracy)``.

    Examples:
        >>> model, acc = reference_model(Architecture("cnn"), load_dataset("digits"), 100, "cache")  # doctest: +SKIP
    """
    if weights is not None:
        model = build_model(arch, dataset.num_classes, seed=seed, input_shape=dataset.input_shape, vocabulary=vocabulary_size(dataset))
        load_weights_file(model, weights, arch.name)
        return model, accuracy(model, dataset.x_test, dataset.y_test)
    key = {"data": dataset.name, "fingerprint": fingerprint(dataset), "arch": architecture_key(arch), "epochs": epochs, "seed": seed,
           "recipe": REFERENCE_RECIPE}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, f"reference-{arch.name}-{digest}.keras")
    if os.path.isfile(path):
        model = keras.saving.load_model(path, compile=False, safe_mode=True)
    else:
        model = train_reference(arch, dataset, epochs, seed)
        os.makedirs(cache_dir, exist_ok=True)
        # A temporary name of this writer's own, renamed into place: a crash never leaves a
        # truncated entry, and parallel sweep jobs training the same reference never collide.
        with atomic_path(path) as tmp:
            model.save(tmp)
    return model, accuracy(model, dataset.x_test, dataset.y_test)


def fingerprint(dataset: Dataset) -> str:
    """A digest of the training split: its values, or for an image folder its files (path, size, time) and image size.

    A folder is never read whole for this: a changed, added or removed file changes its
    size, modification time or the list, and so the digest.

    Examples:
        >>> fingerprint(load_dataset("digits")) == fingerprint(load_dataset("digits"))  # doctest: +SKIP
        True
    """
    digest = hashlib.sha256()
    if dataset.streamed:
        digest.update(image_key(dataset.x_train).encode())
        for path in dataset.x_train.paths:
            status = os.stat(path)
            digest.update(f"{path}\0{status.st_size}\0{status.st_mtime_ns}\n".encode())
    else:
        digest.update(dataset.x_train.tobytes())
    digest.update(dataset.y_train.tobytes())
    return digest.hexdigest()


def load_weights_file(model: keras.Model, path: str, architecture_name: str) -> None:
    """Load a local ``.weights.h5`` into ``model`` (``model=<architecture_name>``); the errors name ``model.weights`` and the fix."""
    file = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(file) or not file.endswith(".weights.h5"):
        raise FileNotFoundError(
            f"Weights file {path} (model.weights) is not a .weights.h5 file on disk. Save them with "
            "model.save_weights('<name>.weights.h5') from the same architecture, data shape and class count; "
            "heatinv never downloads weights."
        )
    try:
        with warnings.catch_warnings(record=True) as caught:  # one per layer that does not fit: the error below says it once
            warnings.simplefilter("always")
            model.load_weights(file)
    except Exception as error:  # Keras raises several types; all mean "does not fit"
        raise ValueError(
            f"Weights file {file} (model.weights) does not fit model={architecture_name} built for inputs "
            f"{tuple(model.inputs[0].shape)} and {model.outputs[0].shape[-1]} classes: {keras_reason(error)} "
            "Save the weights from a model of the same architecture, input shape and class count."
        ) from error
    for warning in caught:  # loaded: what Keras said (layers it skipped keep their initial weights) is the user's to see
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def train_reference(arch: Architecture, dataset: Dataset, epochs: int, seed: int = 0) -> keras.Model:
    """A fresh ``arch`` trained by the reference recipe (see :func:`reference_model`), uncached.

    Examples:
        >>> model = train_reference(Architecture("mlp", hidden=(8,)), load_dataset("digits"), 1)  # doctest: +SKIP
    """
    was_deterministic = tf_config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    try:
        keras.utils.set_random_seed(seed)  # Python, NumPy and TensorFlow: initial weights and batch order
        model = build_model(arch, dataset.num_classes, input_shape=dataset.input_shape, vocabulary=vocabulary_size(dataset))
        from_logits = arch.output_activation != "softmax"
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits),
        )
        fit, val = validation_split(len(dataset.x_train), seed)
        own_momentum = {layer: layer.momentum for layer in batch_norm_layers(model)}
        for layer in own_momentum:
            layer.momentum = FIT_BATCH_NORM_MOMENTUM
        batches = -(-len(fit) // 32)
        progress = FitProgress(f"training the reference {arch.name} (at most {count(epochs, 'epoch')})", epochs, batches)
        stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=PATIENCE, restore_best_weights=True)
        if dataset.streamed:  # the folder's batches are decoded as fit reads them; an epoch's order from the seed
            train, validation = dataset.batches("train", 32, fit, shuffle_seed=seed), dataset.batches("train", 32, val)
            with reading(dataset.x_train):
                history = model.fit(
                    train, epochs=epochs, verbose=0, shuffle=False, validation_data=validation, callbacks=[progress, stop]
                )
        else:
            with dropping_known_notices():  # the array pipeline under op determinism: one harmless E0000 line
                history = model.fit(
                    dataset.x_train[fit], dataset.y_train[fit], epochs=epochs, batch_size=32, verbose=0, shuffle=True,
                    validation_data=(dataset.x_train[val], dataset.y_train[val]), callbacks=[progress, stop],
                )
        # The progress display ends where early stopping ended the fit: say so, and which epoch is kept.
        log.info(
            f"heatinv: the reference {arch.name} trained {len(history.epoch)} of at most {count(epochs, 'epoch')}; "
            f"kept epoch {stop.best_epoch + 1}, the lowest validation loss ({stop.best:.4g})"
        )
        for layer, momentum in own_momentum.items():
            layer.momentum = momentum
        if own_momentum:  # the final weights' statistics, over the images the model was fitted on
            with reading(dataset.x_train) if dataset.streamed else dropping_known_notices():
                set_population_statistics(model, dataset.batches("train", 32, fit))
    finally:
        if not was_deterministic:  # the rest of the run keeps TensorFlow's faster, non-deterministic kernels
            tf_config.disable_op_determinism()
    return model


def copy_with_weights(model: keras.Model, precision: str = "float32") -> keras.Model:
    """A copy of ``model`` with its weights (the model itself untouched), in float64 for ``precision="float64"``.

    Examples:
        >>> copy = copy_with_weights(model)  # doctest: +SKIP
    """
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return with_dtype(copy, "float64") if precision == "float64" else copy


def with_dtype(model: keras.Model, dtype: str) -> keras.Model:
    """The same model with ``dtype`` inputs, variables and arithmetic, and the same weights.

    ``trainer.precision=float64`` trains the float64 copy, and the doctor differentiates
    copies for its probes: feeding float64 inputs to a float32 model would still compute (and
    round) in float32, and a gradient with respect to a float32 (or float16) variable is
    rounded to that variable's dtype.

    Examples:
        >>> {w.dtype for w in with_dtype(build_model(Architecture("mlp", hidden=(4,))), "float64").weights}  # doctest: +SKIP
        {'float64'}
    """

    def copy(layer):
        if not isinstance(layer, keras.layers.Layer):
            return layer  # a Keras op written into the model (``x * 2.0``) has no weights or dtype to change
        return layer.__class__.from_config({**layer.get_config(), "dtype": dtype})

    inputs = keras.Input(model.inputs[0].shape[1:], dtype=dtype)
    clone = keras.models.clone_model(model, input_tensors=inputs, clone_function=copy)
    clone.set_weights([np.asarray(w, dtype) for w in model.get_weights()])
    return clone
