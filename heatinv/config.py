"""The typed shape of a training config: Hydra validates every YAML file and override against it.

A typo in a key (``loss.detla``) or a wrong type (``trainer.steps=many``) fails when the
config is composed, with Hydra naming the key; values whose range matters are checked in
:func:`validate`, which names the key, the value and what is allowed.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from heatinv.job_log import UNREAD_MARK
from heatinv.startup import start_tensorflow
from heatinv.wording import as_command_line

# A joblib (loky) worker of a sweep unpickles Hydra's ConfigStore, which holds this module's
# schema, before it reaches the entry point: here TensorFlow is first imported there. The
# devices are left to the entry point, so that a program importing heatinv can set them up.
start_tensorflow(devices=False)

from heatinv.data import COLOR_MODES, DATASET_NAMES, TABULAR_NAMES, TEXT_NAMES  # noqa: E402
from heatinv.lrp import COMPOSITES  # noqa: E402
from heatinv.models import APPLICATIONS  # noqa: E402


@dataclass
class DataConfig:
    name: str = "digits"  # digits | mnist | npz | folder | csv | text | tokens | protected_text | breast_cancer | wine (data=tabular)
    path: Optional[str] = None  # mnist.npz for data=mnist (default: ~/.keras/datasets/mnist.npz); the file or folder of npz, folder, csv
    image_size: list[int] = field(default_factory=lambda: [32, 32])  # folder: every image resized to [height, width]
    test_split: float = 0.2  # folder, text: the held-out fraction (seeded split)
    color_mode: str = "rgb"  # folder: rgb (3 channels) | grayscale (1), as keras.utils.image_dataset_from_directory
    label_column: Optional[str] = None  # csv, text: the header of the label column (text: default "label")
    text_column: str = "text"  # text: the header of the text column
    max_tokens: int = 2000  # text: the vocabulary's size (padding and [UNK] included)
    length: int = 32  # text: token ids per example (padded with 0 or cut)


@dataclass
class ModelConfig:
    name: str = "mlp"  # mlp | cnn | vit | transformer (text) | file | a Keras application (vgg16, resnet50, mobilenetv2, ...)
    path: Optional[str] = None  # a .keras/.h5 file for model=file
    weights: Optional[str] = None  # a local <file>.weights.h5 for the reference (none: trained here); not with model=file
    hidden: list[int] = field(default_factory=lambda: [300, 100])  # mlp: the hidden Dense layers' widths
    filters: list[int] = field(default_factory=lambda: [16, 32])  # cnn: the convolutions' channels, one block each
    activation: str = "relu"  # relu | softplus
    beta: float = 10.0  # softplus sharpness: softplus(beta x) / beta
    pool: str = "max"  # cnn: max | avg (2x2 pooling after each convolution) | strided (convolutions step by 2)
    output_activation: str = "linear"  # linear | relu | softmax
    l2: float = 1e-4  # mlp, cnn: L2 weight penalty of every kernel (0: none)
    reference_epochs: int = 20  # epochs of supervised training of the reference model (cached in paths.cache_dir)
    patch: int = 0  # vit: the patches' side (0: the smallest that leaves at most 64 tokens)
    dim: int = 32  # vit: the tokens' width
    depth: int = 2  # vit: encoder blocks
    heads: int = 4  # vit: attention heads per block


@dataclass
class TargetConfig:
    kind: str = "class"  # class | file | pattern | tokens (single); pattern | swap | suppress (dataset); suppress_feature, swap_features (tables), suppress_token (text): both
    label: Any = 7  # the class explained (and whose held-out image is used): its index, or its name in the data
    index: int = 0  # which held-out image of that class
    channels: str = "sum"  # colour images: compare maps summed over channels (sum) or per channel (keep)
    feature: Optional[str] = None  # tables: suppress_feature / swap_features: the feature whose relevance moves
    path: Optional[str] = None  # kind=file: the heatmap (.npy or .png)
    image: Optional[str] = None  # kind=file: the input it belongs to (.npy or .png)
    pattern: str = "square"  # kind=pattern: square | cross | frame | file (from target.path)
    scale: float = 1.0  # task=single, kind=pattern or tokens: total relevance of the target
    like: Any = 0  # kind=swap: the class whose reference heatmaps the images get; swap_features: the feature that receives the relevance
    top_k: int = 50  # kind=suppress: how many of the most relevant pixels to empty
    token: Optional[str] = None  # text: suppress_token: the word whose relevance goes to the other tokens
    positions: Optional[list[int]] = None  # text: kind=tokens: the positions that hold the relevance


@dataclass
class TaskConfig:
    kind: str = "single"  # single: one heatmap of one image | dataset: many images' heatmaps
    classes: Optional[list[Any]] = None  # dataset: the classes whose heatmaps move, by index or name (None: all)
    epochs: int = 20  # dataset: passes over the training images
    batch_size: int = 64  # dataset: images per update
    heatmap_weight: float = 1.0  # dataset: the heatmap loss's weight in the objective
    ce_weight: float = 1.0  # dataset: the cross-entropy on the true labels' weight (keeps the accuracy)
    logit_weight: float = 0.0  # dataset: the weight of the term that keeps the logits near the reference's (task.teacher)
    lr_schedule: str = "constant"  # dataset: constant | cosine (decays optimizer.lr to 0 over the run)
    teacher: str = "mse"  # dataset: the logit_weight term: mse of the logits | kl of the softmax at temperature
    temperature: float = 1.0  # teacher=kl: softmax temperature T
    early_stopping: bool = False  # dataset: train on the reference's fit split, restore the best validation epoch
    min_agreement: float = 0.97  # early_stopping: an epoch qualifies at this validation agreement with the reference...
    max_accuracy_drop: float = 0.01  # ...and at most this validation accuracy below the reference's
    success_threshold: float = 0.8  # dataset: a held-out image counts as manipulated at this cosine to its target


@dataclass
class InitConfig:
    kind: str = "random"  # random | reference


@dataclass
class LossConfig:
    name: str = "mse"  # l1 | mse | huber
    delta: float = 0.1  # huber: delta as a fraction of max |target|
    normalize: str = "none"  # none | sum | max


@dataclass
class LrpConfig:
    composite: str = "epsilon_gamma_box"  # the LRP rules per layer kind (one file per name in configs/lrp/)
    epsilon: float = 1e-6  # the epsilon rule's stabilizer
    gamma: float = 0.25  # the gamma rule's weight of positive contributions
    low: Optional[Any] = None  # zbox input range: a float or one per channel/feature (None: the data's range)
    high: Optional[Any] = None  # zbox input range's upper end, as low
    output: str = "logit"  # logit | activation
    recompute: bool = False  # the conv rules run again in the gradient instead of keeping their intermediates: memory for time


@dataclass
class OptimizerConfig:
    name: str = "adam"  # adam | sgd
    lr: float = 1e-3  # learning rate
    momentum: float = 0.0  # sgd
    global_clipnorm: Optional[float] = None  # rescale each update's gradients to at most this global norm (None: no clipping)


@dataclass
class TrainerConfig:
    steps: int = 300  # single: optimizer updates (dataset runs task.epochs)
    log_every: int = 25  # single: steps between logged scalars and images (dataset logs each epoch)
    seed: int = 0  # seeds the student's weights, the data split and the batches (the reference has a seed of its own)
    jit_compile: Any = "auto"  # auto | true | false: XLA where it was measured faster (heatinv.step.auto_mode)
    precision: str = "float32"  # float32 | float64
    strategy: str = "none"  # none | mirrored | multi_worker (task=dataset: the GPUs of one machine; several machines, heatinv.cluster)
    collective_timeout: float = 300.0  # multi_worker: seconds a step waits for the other workers before it stops the job
    steps_per_execution: int = 25  # updates per compiled call (one dispatch and host read per call)
    checkpoint_seconds: float = 60.0  # wall time between checkpoints (0: none by time)
    checkpoint_every: int = 0  # steps between checkpoints (0: none by steps; tests set it for known steps)
    resume: bool = False  # continue the run in hydra.run.dir from its last checkpoint
    overwrite: bool = False  # replace the results already in hydra.run.dir
    max_nonfinite: int = 10  # stop after this many steps in a row with NaN/Inf loss or gradients (0: never stop)


@dataclass
class PathsConfig:
    root: str = MISSING  # outputs/ in the folder the command runs in
    output_dir: str = MISSING  # the run's folder: hydra.run.dir (outputs/<date>/<time>_<overrides>)
    cache_dir: str = MISSING  # trained reference models and their heatmaps, shared by runs (paths.root/cache)


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    init: InitConfig = field(default_factory=InitConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    lrp: LrpConfig = field(default_factory=LrpConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    experiment: Optional[Any] = None


CHOICES = {
    "data.name": DATASET_NAMES[:-2] + TABULAR_NAMES + ("csv",),
    "model.name": ("mlp", "cnn", "vit", "transformer", "file") + tuple(APPLICATIONS),
    "model.activation": ("relu", "softplus"),
    "model.pool": ("max", "avg", "strided"),
    "data.color_mode": tuple(COLOR_MODES),
    "model.output_activation": ("linear", "relu", "softmax"),
    "target.kind": ("class", "file", "pattern", "tokens", "swap", "suppress", "suppress_feature", "swap_features", "suppress_token"),
    "target.pattern": ("square", "cross", "frame", "file"),
    "target.channels": ("sum", "keep"),
    "task.kind": ("single", "dataset"),
    "task.lr_schedule": ("constant", "cosine"),
    "task.teacher": ("mse", "kl"),
    "init.kind": ("random", "reference"),
    "loss.name": ("l1", "mse", "huber"),
    "loss.normalize": ("none", "sum", "max"),
    "lrp.composite": tuple(sorted(COMPOSITES)),
    "lrp.output": ("logit", "activation"),
    "optimizer.name": ("adam", "sgd"),
    "trainer.precision": ("float32", "float64"),
    "trainer.strategy": ("none", "mirrored", "multi_worker"),
    "trainer.jit_compile": ("auto", True, False),
}

POSITIVE = (
    "trainer.steps",
    "trainer.log_every",
    "trainer.steps_per_execution",
    "optimizer.lr",
    "loss.delta",
    "model.reference_epochs",
    "model.beta",
    "task.epochs",
    "task.batch_size",
    "task.temperature",
    "target.top_k",
)


class ConfigError(ValueError):
    """A config value outside what heatinv accepts."""


OBJECTIVE_WEIGHTS = ("heatmap_weight", "ce_weight", "logit_weight")
"""The dataset objective's terms' weights (``task.<key>``): each finite and >= 0, not all 0."""


def _check_objective_weights(task) -> None:
    """A negative weight maximizes its term (a negative cross-entropy weight trains the accuracy away), a
    NaN or Inf one makes every loss non-finite, and all zero leave nothing to optimize."""
    for key in OBJECTIVE_WEIGHTS:
        value = task[key]
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(
                f"Config value task.{key}={value!r} must be a finite weight >= 0 (0 leaves its term out); a negative "
                f"weight maximizes its term. E.g. task.{key}=1.0."
            )
    if not any(task[key] > 0 for key in OBJECTIVE_WEIGHTS):
        raise ConfigError(
            f"Config values {', '.join(f'task.{key}=0' for key in OBJECTIVE_WEIGHTS)} leave the dataset objective "
            "nothing to optimize. Give the heatmap term a weight, e.g. task.heatmap_weight=1.0."
        )


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadOnlyWhen:
    """Keys that only some choices read: set for another choice, they would be silently ignored."""

    keys: tuple[str, ...]
    when: Callable[[Any], bool]
    by: str  # who reads them, as the user would pick it: "loss=huber"
    on: tuple[str, ...]  # the choices deciding it, shown with this run's values


def _composites_with(rule: str) -> tuple[str, ...]:
    return tuple(sorted(name for name, spec in COMPOSITES.items() if rule in spec.values()))


_DATASET_TASK_KEYS = (
    "task.classes", "task.epochs", "task.batch_size", "task.heatmap_weight", "task.ce_weight", "task.logit_weight",
    "task.lr_schedule", "task.early_stopping", "task.success_threshold",
)
_FEATURE_KINDS = ("suppress_feature", "swap_features")

READ_ONLY_WHEN = (
    ReadOnlyWhen(("loss.delta",), lambda c: c.loss.name == "huber", "loss=huber", ("loss.name",)),
    ReadOnlyWhen(("optimizer.momentum",), lambda c: c.optimizer.name == "sgd", "optimizer=sgd", ("optimizer.name",)),
    ReadOnlyWhen(("model.hidden",), lambda c: c.model.name == "mlp", "model=mlp", ("model.name",)),
    ReadOnlyWhen(("model.filters", "model.pool"), lambda c: c.model.name == "cnn", "model=cnn", ("model.name",)),
    ReadOnlyWhen(("model.patch",), lambda c: c.model.name == "vit", "model=vit", ("model.name",)),
    ReadOnlyWhen(
        ("model.dim", "model.depth", "model.heads"), lambda c: c.model.name in ("vit", "transformer"), "model=vit and model=transformer",
        ("model.name",),
    ),
    ReadOnlyWhen(
        ("model.output_activation", "model.l2"), lambda c: c.model.name in ("mlp", "cnn"),
        "model=mlp and model=cnn (an application ends in linear logits; a model file is used as saved)", ("model.name",),
    ),
    ReadOnlyWhen(("model.beta",), lambda c: c.model.activation == "softplus", "model.activation=softplus", ("model.activation",)),
    ReadOnlyWhen(
        ("model.reference_epochs",), lambda c: c.model.name != "file" and not c.model.weights,
        "a reference trained here (model=mlp, cnn or an application, without model.weights)", ("model.name", "model.weights"),
    ),
    ReadOnlyWhen(("target.pattern",), lambda c: c.target.kind == "pattern", "target=pattern", ("target.kind",)),
    ReadOnlyWhen(
        ("target.scale",), lambda c: c.target.kind in ("pattern", "tokens") and c.task.kind == "single",
        "target=pattern and target=tokens with task=single (task=dataset keeps each image's own total relevance)", ("target.kind", "task.kind"),
    ),
    ReadOnlyWhen(("target.like",), lambda c: c.target.kind in ("swap", "swap_features"), "target=swap and target=swap_features", ("target.kind",)),
    ReadOnlyWhen(("target.top_k",), lambda c: c.target.kind == "suppress", "target=suppress", ("target.kind",)),
    ReadOnlyWhen(
        ("target.feature",), lambda c: c.target.kind in _FEATURE_KINDS, "target=suppress_feature and target=swap_features", ("target.kind",)
    ),
    ReadOnlyWhen(("target.token",), lambda c: c.target.kind == "suppress_token", "target=suppress_token", ("target.kind",)),
    ReadOnlyWhen(("target.positions",), lambda c: c.target.kind == "tokens", "target=tokens", ("target.kind",)),
    ReadOnlyWhen(
        ("target.label",), lambda c: c.task.kind == "single",
        "task=single (task=dataset moves the heatmaps of task.classes)", ("task.kind",),
    ),
    ReadOnlyWhen(
        ("target.index",), lambda c: c.task.kind == "single" and not c.target.image,
        "task=single without target.image", ("task.kind", "target.image"),
    ),
    ReadOnlyWhen(("trainer.steps",), lambda c: c.task.kind == "single", "task=single (task=dataset runs task.epochs)", ("task.kind",)),
    ReadOnlyWhen(
        ("trainer.log_every", "trainer.steps_per_execution"), lambda c: c.task.kind == "single",
        "task=single (task=dataset runs one batch per call and logs once per epoch)", ("task.kind",),
    ),
    ReadOnlyWhen(_DATASET_TASK_KEYS, lambda c: c.task.kind == "dataset", "task=dataset", ("task.kind",)),
    ReadOnlyWhen(
        ("task.teacher",), lambda c: c.task.kind == "dataset" and c.task.logit_weight > 0,
        "task=dataset with a teacher term, task.logit_weight > 0", ("task.kind", "task.logit_weight"),
    ),
    ReadOnlyWhen(
        ("task.temperature",), lambda c: c.task.kind == "dataset" and c.task.teacher == "kl" and c.task.logit_weight > 0,
        "task=dataset with task.teacher=kl and task.logit_weight > 0", ("task.kind", "task.teacher", "task.logit_weight"),
    ),
    ReadOnlyWhen(
        ("task.min_agreement", "task.max_accuracy_drop"), lambda c: c.task.kind == "dataset" and c.task.early_stopping,
        "task=dataset with task.early_stopping=true", ("task.kind", "task.early_stopping"),
    ),
    ReadOnlyWhen(
        ("trainer.collective_timeout",), lambda c: c.trainer.strategy == "multi_worker", "trainer.strategy=multi_worker",
        ("trainer.strategy",),
    ),
    ReadOnlyWhen(("data.image_size", "data.color_mode"), lambda c: c.data.name == "folder", "data=folder", ("data.name",)),
    ReadOnlyWhen(
        ("data.test_split",), lambda c: c.data.name in ("folder",) + TEXT_NAMES, "data=folder, data=text and data=protected_text", ("data.name",)
    ),
    ReadOnlyWhen(("data.label_column",), lambda c: c.data.name in ("csv", "text"), "data=csv and data=text", ("data.name",)),
    ReadOnlyWhen(("data.text_column",), lambda c: c.data.name == "text", "data=text", ("data.name",)),
    ReadOnlyWhen(("data.max_tokens", "data.length"), lambda c: c.data.name in TEXT_NAMES, "data=text and data=protected_text", ("data.name",)),
    ReadOnlyWhen(
        ("lrp.epsilon",), lambda c: c.lrp.composite in _composites_with("epsilon"),
        f"the composites with an epsilon rule (lrp={', '.join(_composites_with('epsilon'))})", ("lrp.composite",),
    ),
    ReadOnlyWhen(
        ("lrp.gamma",), lambda c: c.lrp.composite in _composites_with("gamma"),
        f"the composites with a gamma rule (lrp={', '.join(_composites_with('gamma'))})", ("lrp.composite",),
    ),
    ReadOnlyWhen(
        ("lrp.low", "lrp.high"), lambda c: c.lrp.composite in _composites_with("zbox"),
        f"the composites with a zbox rule (lrp={', '.join(_composites_with('zbox'))})", ("lrp.composite",),
    ),
)
"""Which choices read which keys. A key typed on the command line that this run's choices do
not read is refused (a sweep's jobs only warn: a sweep crosses keys with choices)."""


def _names_a_class(value) -> bool:
    """An int (an index) or a str (a name); YAML's true/false are ints to Python, and no class."""
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def validate(cfg) -> None:
    """Check ranges and choices that types alone cannot express; raise :class:`ConfigError`.

    Run by Hydra, the keys typed on the command line are also checked against the choices
    that read them (:data:`READ_ONLY_WHEN`).
    """
    _check_known_keys(cfg)
    for key, allowed in CHOICES.items():
        value = _get(cfg, key)
        if value not in allowed and key == "data.name":
            raise ConfigError(
                f"Config value data.name={value!r} names no data heatinv has: the bundled ones are data=digits, "
                f"data=mnist (a local mnist.npz) and data=tabular with data.name={' or '.join(TABULAR_NAMES)} "
                "(scikit-learn's tables). Data of your own: data=csv data.path=<file>.csv data.label_column=<column>, "
                "data=npz data.path=<file>.npz, or data=folder data.path=<folder of class subfolders>."
            )
        if value not in allowed:
            raise ConfigError(
                f"Config value {key}={value!r} is not one of {list(allowed)}. "
                f"Fix it on the command line, e.g. `{key}={allowed[0]}`."
            )
    for key in POSITIVE:
        value = _get(cfg, key)
        if not value > 0:
            usual = OmegaConf.select(OmegaConf.structured(TrainConfig), key)
            raise ConfigError(f"Config value {key}={value!r} must be > 0, e.g. `{key}={usual}` (the default).")
    clip = cfg.optimizer.global_clipnorm
    if clip is not None and not clip > 0:
        raise ConfigError(
            f"Config value optimizer.global_clipnorm={clip!r} must be > 0 (the largest global norm of a step's gradients), "
            "or null for no clipping, e.g. `optimizer.global_clipnorm=1.0`."
        )
    for key, example in (("task.min_agreement", 0.97), ("task.max_accuracy_drop", 0.01)):
        if not 0 <= _get(cfg, key) <= 1:
            raise ConfigError(f"Config value {key}={_get(cfg, key)!r} must be a share between 0 and 1, e.g. `{key}={example}`.")
    for key, meaning in (
        ("trainer.checkpoint_every", "steps between checkpoints, 0 for none by steps, e.g. `trainer.checkpoint_every=1000`"),
        ("trainer.checkpoint_seconds", "seconds between checkpoints, 0 for none by time, e.g. `trainer.checkpoint_seconds=60`"),
        ("trainer.max_nonfinite", "NaN/Inf steps in a row before the run stops, e.g. `trainer.max_nonfinite=10`"),
    ):
        if _get(cfg, key) < 0:
            raise ConfigError(f"Config value {key}={_get(cfg, key)!r} must be >= 0 ({meaning}).")
    if not cfg.trainer.collective_timeout > 0:
        raise ConfigError(
            f"Config value trainer.collective_timeout={cfg.trainer.collective_timeout!r} must be > 0 (seconds a step waits "
            "for the other workers before the job stops), e.g. `trainer.collective_timeout=300`."
        )
    if cfg.task.kind == "dataset":
        _check_objective_weights(cfg.task)
    for key, usual in (("lrp.epsilon", "1e-6"), ("lrp.gamma", "0.25")):
        if not (math.isfinite(_get(cfg, key)) and _get(cfg, key) >= 0):
            raise ConfigError(f"Config value {key}={_get(cfg, key)!r} must be a finite number >= 0, e.g. `{key}={usual}`.")
    if cfg.trainer.resume and cfg.trainer.overwrite:
        raise ConfigError(
            "Config values trainer.resume=true and trainer.overwrite=true contradict each other: resume continues "
            "the run in hydra.run.dir, overwrite starts it over. Keep one of them."
        )
    label = cfg.target.label
    if not _names_a_class(label) or (isinstance(label, int) and label < 0):
        raise ConfigError(
            f"Config value target.label={label!r} must be a class index >= 0 or a class's name as the data's log lists "
            "them (a csv's label, a folder's subfolder), e.g. target.label=0."
        )
    feature_kinds = ("suppress_feature", "swap_features")
    single_kinds = ("class", "file", "pattern", "tokens", "suppress_token") + feature_kinds
    dataset_kinds = ("pattern", "swap", "suppress", "suppress_token") + feature_kinds
    allowed = single_kinds if cfg.task.kind == "single" else dataset_kinds
    if cfg.target.kind not in allowed:
        table = cfg.data.name in TABULAR_NAMES + ("csv",)
        text = cfg.data.name in TEXT_NAMES + ("tokens",)
        example = "target=suppress_feature target.feature=<name>" if table else "target=suppress_token target.token=<word>" if text else "target=pattern"
        raise ConfigError(
            f"Config value target.kind={cfg.target.kind!r} does not go with task.kind={cfg.task.kind!r}, which takes "
            f"target.kind in {list(allowed)}. Pick one (e.g. {example}) or switch task "
            f"(task={'dataset' if cfg.task.kind == 'single' else 'single'})."
        )
    if cfg.trainer.strategy != "none" and cfg.task.kind != "dataset":
        raise ConfigError(
            f"Config value trainer.strategy={cfg.trainer.strategy!r} only applies to the dataset objective "
            f"(task=dataset); a single-heatmap run (task.kind={cfg.task.kind!r}) trains one image on one device. "
            "Drop the override (trainer.strategy=none) or switch task (task=dataset)."
        )
    if cfg.task.classes is not None and len(cfg.task.classes) == 0:
        raise ConfigError(
            "Config value task.classes=[] selects no class, so no heatmap would move. Name the classes whose heatmaps "
            "move (e.g. task.classes=[1]), or leave it null for all of them (task.classes=null)."
        )
    wrong = [c for c in cfg.task.classes or () if not _names_a_class(c)]
    if wrong:
        raise ConfigError(
            f"Config value task.classes={as_command_line(cfg.task.classes)} holds {as_command_line(wrong[0])}, which is "
            "neither a class index nor a class's name as the data's log lists them (a csv's label, a folder's "
            "subfolder). Give indices or names, e.g. task.classes=[1]."
        )
    if cfg.task.classes is not None and len(set(cfg.task.classes)) != len(cfg.task.classes):
        twice = sorted({c for c in cfg.task.classes if list(cfg.task.classes).count(c) > 1}, key=str)
        raise ConfigError(
            f"Config value task.classes={as_command_line(cfg.task.classes)} names class {', '.join(map(str, twice))} more than once. "
            f"Name each class once, e.g. task.classes={as_command_line(sorted(set(cfg.task.classes), key=str))}."
        )
    if cfg.task.kind == "dataset" and not 0 <= cfg.task.success_threshold <= 1:
        raise ConfigError(f"Config value task.success_threshold={cfg.task.success_threshold} must be in [0, 1].")
    if cfg.target.pattern == "file" and not cfg.target.path:
        raise ConfigError("target.pattern=file needs target.path=/path/to/pattern.npy (or .png).")
    if cfg.target.kind == "suppress_token" and not cfg.target.token:
        raise ConfigError("target=suppress_token needs target.token=<a word of the texts' vocabulary>, e.g. target.token=foreign.")
    if cfg.target.kind == "tokens" and not cfg.target.positions:
        raise ConfigError("target=tokens needs target.positions=[...], the token positions that hold the relevance, e.g. target.positions=[0,1].")
    if cfg.target.kind in feature_kinds and not cfg.target.feature:
        raise ConfigError(f"target={cfg.target.kind} needs target.feature=<a feature name of the table>.")
    if cfg.target.kind == "swap_features" and not isinstance(cfg.target.like, str):
        raise ConfigError(f"target=swap_features needs target.like=<the feature name that receives the relevance>, got {cfg.target.like!r}.")
    if cfg.target.kind == "swap" and not _names_a_class(cfg.target.like):
        raise ConfigError(f"target=swap needs target.like=<a class index or name>, got {cfg.target.like!r}.")
    if cfg.target.kind == "swap_features" and cfg.target.like == cfg.target.feature:
        raise ConfigError(
            f"Config values target.feature={cfg.target.feature!r} and target.like={cfg.target.like!r} name one feature: "
            "its relevance would go to itself, and nothing would be manipulated. Name another feature in target.like."
        )
    if cfg.target.index < 0:
        raise ConfigError(
            f"Config value target.index={cfg.target.index!r} must be >= 0: it counts the held-out examples of class "
            "target.label from 0, e.g. `target.index=0`."
        )
    if not 0.0 < cfg.data.test_split < 1.0:
        raise ConfigError(
            f"Config value data.test_split={cfg.data.test_split!r} must be in (0, 1): the share of an image folder held "
            "out, e.g. `data.test_split=0.2`."
        )
    if len(cfg.data.image_size) != 2 or min(cfg.data.image_size) < 1:
        raise ConfigError(f"Config value data.image_size={list(cfg.data.image_size)} must be [height, width], both >= 1.")
    if cfg.data.name in ("npz", "folder", "csv") and not cfg.data.path:
        raise ConfigError(f"data={cfg.data.name} needs data.path=/path/to/your/{'folder' if cfg.data.name == 'folder' else 'file.' + cfg.data.name}.")
    if cfg.data.name == "csv" and not cfg.data.label_column:
        raise ConfigError("data=csv needs data.label_column=<the header of the column holding each row's class>.")
    low, high = cfg.lrp.low, cfg.lrp.high
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > high:
        raise ConfigError(f"Config values lrp.low={cfg.lrp.low} > lrp.high={cfg.lrp.high}; the input range needs low <= high.")
    if cfg.model.name == "file" and not cfg.model.path:
        raise ConfigError("model=file needs model.path=/path/to/model.keras (a Keras .keras or .h5 file).")
    model, data, target = cfg.model, cfg.data, cfg.target
    _check_read(cfg, "model.path", model.name == "file", f"model={model.name} builds its own model", "model=file model.path={}")
    _check_read(
        cfg, "model.weights", model.name != "file", "model=file loads the model, weights and all, from model.path",
        "model=<mlp, cnn or an application> model.weights={}",
    )
    _check_read(
        cfg, "data.path", data.name in ("npz", "folder", "csv", "text", "tokens", "mnist"), f"data {data.name!r} is bundled",
        "data=npz (or folder, csv, mnist) data.path={}",
    )
    pattern_file = target.kind == "pattern" and target.pattern == "file"
    _check_read(
        cfg, "target.path", target.kind == "file" or pattern_file, f"target={target.kind} builds its own heatmap",
        "target=file target.path={} (a heatmap), or target=pattern target.pattern=file target.path={} (a pattern)",
    )
    _check_read(cfg, "target.image", target.kind == "file", f"target={target.kind} explains a held-out image", "target=file target.path=<heatmap>.npy target.image={}")
    if cfg.target.kind == "file" and not cfg.target.path:
        raise ConfigError(
            "target=file needs target.path=/path/to/heatmap.npy (or .png), and target.image=/path/to/input.npy "
            "for the input it belongs to."
        )
    _check_typed_keys_are_read(cfg)


def unread_keys(cfg, overrides: list[str]) -> list[str]:
    """The keys among ``overrides`` (``loss.delta=0.3``) that ``cfg``'s choices do not read, each said in a sentence.

    Examples:
        >>> cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(["loss.delta=0.3"]))
        >>> unread_keys(cfg, ["loss.delta=0.3", "optimizer.lr=0.1"])
        ["loss.delta=0.3 is read only with loss=huber, and this run has loss.name='mse'"]
    """
    typed = {override.split("=", 1)[0].lstrip("+").split("@", 1)[0] for override in overrides if not override.startswith("~")}
    sentences = []
    for entry in READ_ONLY_WHEN:
        for key in entry.keys:
            if key in typed and not entry.when(cfg):
                has = " and ".join(f"{on}={_typed(_get(cfg, on))}" for on in entry.on)
                sentences.append(f"{key}={as_command_line(_get(cfg, key))} is read only with {entry.by}, and this run has {has}")
    return sentences


def _check_typed_keys_are_read(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return  # composed without Hydra's job (a test, the benchmark): nothing was typed
    hydra = HydraConfig.get()
    unread = unread_keys(cfg, list(hydra.overrides.task))
    if unread and hydra.mode == RunMode.MULTIRUN:
        for sentence in unread:  # a sweep crosses keys with choices: its jobs go on as composed
            log.warning(f"heatinv: {sentence}{UNREAD_MARK}")
    elif unread:
        raise ConfigError(
            f"Config value {unread[0]}: the run would ignore it and train something other than asked. "
            "Pick the choice that reads it on the same command line, or drop the key."
            + (f" Also: {'; '.join(unread[1:])}." if unread[1:] else "")
        )


def _typed(value) -> str:
    """A choice as the command line types it: booleans lowercase, text quoted (``loss.name='mse'``)."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _check_read(cfg, key: str, read: bool, why_not: str, how: str) -> None:
    """A file given where nothing reads it: the run would go on without it, so refuse it."""
    value = _get(cfg, key)
    if value and not read:
        raise ConfigError(
            f"Config value {key}={value!r} is not read here: {why_not}. To use the file: {how.format(value, value)}; "
            f"otherwise drop {key}."
        )


def _check_known_keys(cfg) -> None:
    """Keys added with Hydra's ``+`` bypass the schema; refuse the ones no code reads."""
    for section, schema in TrainConfig.__dataclass_fields__.items():
        node = cfg.get(section) if hasattr(cfg, "get") else getattr(cfg, section, None)
        fields = getattr(schema.default_factory, "__dataclass_fields__", None) if callable(schema.default_factory) else None
        if node is None or fields is None or not hasattr(node, "keys"):
            continue
        unknown = sorted(set(node.keys()) - set(fields))
        if unknown:
            raise ConfigError(
                f"Unknown config key {section}.{unknown[0]} (not read by heatinv); the keys of {section} are "
                f"{sorted(fields)}. Check the spelling."
            )


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


# Keys a resumed run may change: how long it runs, how often it logs and saves, how the same
# updates are executed. Any other key changes the model, the data, the target or the
# objective, and the checkpoint would continue a different run.
MAY_CHANGE_ON_RESUME = (
    "trainer.steps",
    "task.epochs",
    "trainer.log_every",
    "trainer.checkpoint_every",
    "trainer.checkpoint_seconds",
    "trainer.max_nonfinite",
    "trainer.steps_per_execution",
    "trainer.jit_compile",
    "trainer.strategy",
    "trainer.collective_timeout",
    "trainer.resume",
    "trainer.overwrite",
)


def register() -> None:
    """Register the schema with Hydra's ConfigStore as ``train_schema``, and :func:`run_folder_name`
    and :func:`job_folder_name` as the resolvers ``heatinv.run_folder`` and ``heatinv.job_folder``
    (``configs/hydra/default.yaml`` names run and sweep job folders with them)."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    if not OmegaConf.has_resolver("heatinv.run_folder"):
        OmegaConf.register_new_resolver("heatinv.run_folder", run_folder_name)
    if not OmegaConf.has_resolver("heatinv.job_folder"):
        OmegaConf.register_new_resolver("heatinv.job_folder", job_folder_name)


def flat_config(cfg) -> dict:
    """The config's leaves by dotted key, unresolved, without ``paths`` and ``hydra``.

    Where a run lives is not what it is: HParams, ``metrics.json`` and the resume check
    compare these.

    Examples:
        >>> flat_config(OmegaConf.create({"loss": {"name": "mse"}, "paths": {"root": "."}}))
        {'loss.name': 'mse'}
    """
    container = OmegaConf.to_container(cfg, resolve=False)
    flat: dict = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}{key}.", value)
        else:
            flat[prefix[:-1]] = node

    walk("", {key: value for key, value in container.items() if key not in ("paths", "hydra")})
    return flat


def run_folder_name(time: str, overrides: str) -> str:
    """A single run's folder: its start time, then what its command line changes (as a sweep's job folders).

    Examples:
        >>> run_folder_name("23-37-04", "loss=l1"), run_folder_name("23-37-04", "")
        ('23-37-04_loss=l1', '23-37-04')
    """
    return f"{time}_{overrides}" if overrides else time


def job_folder_name(num, overrides: str) -> str:
    """A sweep job's folder: its number, then its overrides but those a resume may change.

    So a sweep extended with more ``trainer.steps`` (its command plus ``trainer.resume=true``)
    finds its jobs in their folders. A single run keeps them in its name: two runs started in
    the same second that differ only in ``trainer.steps`` get two folders.

    Examples:
        >>> job_folder_name(0, "loss=l1,trainer.steps=20"), job_folder_name(1, "trainer.steps=20")
        ('0_loss=l1', '1_')
    """
    kept = [item for item in re.split(r",(?=[+~]?[\w.]+=)", overrides) if item and item.split("=", 1)[0] not in MAY_CHANGE_ON_RESUME]
    return f"{num}_{','.join(kept)}"
