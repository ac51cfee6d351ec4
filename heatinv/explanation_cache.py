"""The frozen reference's explanations of a streamed split, computed once and kept on disk.

The dataset task compares the student with targets made from the reference's heatmaps. For
an image folder these used to be recomputed from the decoded images at every pass (every
epoch's held-out evaluation, every training batch), although the reference never changes.
Here each split's heatmaps and logits are computed in one pass and written to the cache as
two ``.npy`` files, read back memory-mapped: a batch reads its own rows, so the split is
never held in memory whole, however large the folder.

The entry's name is a digest of everything the numbers depend on: the reference's
architecture and weights, the LRP settings (composite, box, epsilon, gamma, output, the
channel sum), the split's files (path, size, modification time), image size and labels, and
the code (the LRP engine's, the decoder's and the channel sum's source, TensorFlow's and
Keras's versions). Another reference, rule, changed file or changed engine gives another
entry, never a stale one (a file rewritten with the same size and time, as ``cp -p`` can
leave it, is not noticed: touch it, or empty the cache); the same run
resumed, or another run of the same reference and rule (say with another learning rate),
reuses it. Both files are written under temporary names and renamed into place (the logits
first, the heatmaps last, and a reader needs both), so a crash or a parallel writer never
leaves half an entry.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os

import keras
import numpy as np

from heatinv.atomic import atomic_path
from heatinv.data import Dataset, image_key, reading
from heatinv.progress import Progress

log = logging.getLogger(__name__)

BATCH_SIZE = 256  # as explain_all's: the same batches give the in-memory path's numbers bit for bit


def split_fingerprint(dataset: Dataset, split: str) -> str:
    """A digest of an image folder's split without reading it: its files (path, size, time), image size and labels.

    Examples:
        >>> split_fingerprint(load_folder("shapes/", (32, 32), 0.2), "test")  # doctest: +SKIP
        '3f0c...'
    """
    files, labels = getattr(dataset, f"x_{split}"), getattr(dataset, f"y_{split}")
    digest = hashlib.sha256(image_key(files).encode())
    for path in files.paths:
        status = os.stat(path)
        digest.update(f"{path}\0{status.st_size}\0{status.st_mtime_ns}\n".encode())
    digest.update(np.asarray(labels, np.int64).tobytes())
    return digest.hexdigest()


def model_fingerprint(model: keras.Model) -> str:
    """A digest of a model's architecture (its JSON) and every weight's values, in order.

    What does not change the explanations is left out, so the model a run has just trained
    and the copy later runs load from the cache digest alike: the compile state (the trained
    one is compiled) and the weights' paths (prefixed with the model's name until saved).
    """
    architecture = json.loads(model.to_json())
    architecture.pop("compile_config", None)
    digest = hashlib.sha256(json.dumps(architecture, sort_keys=True).encode())
    for weight in model.weights:
        value = np.asarray(weight)
        digest.update(f"{value.shape}{value.dtype}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def code_fingerprint() -> str:
    """A digest of the code the cached numbers come from: the LRP engine, the image decoder
    and the channel sum (their source files), and the TensorFlow and Keras versions.

    A fix to a rule or to decoding then makes new entries instead of reusing old numbers.
    """
    import tensorflow as tf

    package = os.path.dirname(os.path.abspath(__file__))
    sources = sorted(glob.glob(os.path.join(package, "lrp", "*.py"))) + [
        os.path.join(package, name) for name in (os.path.join("data", "image_files.py"), "channel_sum.py")
    ]
    digest = hashlib.sha256(f"{tf.__version__} {keras.__version__}".encode())
    for path in sources:
        with open(path, "rb") as source:
            digest.update(source.read())
    return digest.hexdigest()


def entry_paths(cache_dir: str, explainer, dataset: Dataset, split: str, lrp_settings: dict) -> tuple[str, str]:
    """``(heatmaps .npy, logits .npy)``: where the reference's explanations of ``split`` are kept."""
    key = {
        "code": code_fingerprint(),
        "reference": model_fingerprint(explainer.model),
        "explainer": type(explainer).__name__,  # LRP, or ChannelSumLRP (colour maps summed over channels)
        "lrp": lrp_settings,
        "split": split,
        "files": split_fingerprint(dataset, split),
        "batch_size": BATCH_SIZE,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    stem = os.path.join(cache_dir, f"explanations-{split}-{digest}")
    return f"{stem}.maps.npy", f"{stem}.logits.npy"


def cached_explanations(explain, explainer, dataset: Dataset, split: str, cache_dir: str, lrp_settings: dict):
    """The reference's ``(heatmaps, logits)`` of every image of ``split``, memory-mapped from the cache.

    Args:
        explain: the compiled ``(images, labels) -> (heatmaps, logits)`` of ``explainer``.
        explainer: the reference's explainer (its model and class enter the cache key).
        dataset: a streamed image folder.
        split: ``"train"`` or ``"test"``.
        cache_dir: where the entry is kept (``paths.cache_dir``).
        lrp_settings: the ``lrp`` config group, resolved (enters the cache key).

    Returns:
        Two read-only ``np.memmap`` arrays, ``[N, *heatmap shape]`` and ``[N, classes]``, in split order.

    Examples:
        >>> maps, logits = cached_explanations(explain, explainer, dataset, "test", "outputs/cache", {...})  # doctest: +SKIP
        >>> maps[10:20].shape  # reads only these rows  # doctest: +SKIP
        (10, 32, 32, 1)
    """
    maps_path, logits_path = entry_paths(cache_dir, explainer, dataset, split, lrp_settings)
    if not (os.path.isfile(maps_path) and os.path.isfile(logits_path)):
        _write_entry(explain, dataset, split, maps_path, logits_path)
    else:
        log.info(f"heatinv: the reference's explanations of the {_split_name(split)} images come from the cache ({maps_path})")
    return np.load(maps_path, mmap_mode="r"), np.load(logits_path, mmap_mode="r")


def _split_name(split: str) -> str:
    return "held-out" if split == "test" else "training"


def _write_entry(explain, dataset: Dataset, split: str, maps_path: str, logits_path: str) -> None:
    """One pass over ``split``, each batch's explanations written into the two files' rows as they come."""
    files, labels = getattr(dataset, f"x_{split}"), getattr(dataset, f"y_{split}")
    count = len(labels)
    progress = Progress(f"explaining the {_split_name(split)} images once, into the cache", count, "images")
    maps = logits = None
    with atomic_path(maps_path) as maps_tmp, atomic_path(logits_path) as logits_tmp, reading(files):
        done = 0
        for x, batch_labels in dataset.batches(split, BATCH_SIZE).prefetch(2):
            batch_maps, batch_logits = (value.numpy() for value in explain(x, batch_labels))
            if maps is None:  # the shapes are known from the first batch
                maps = np.lib.format.open_memmap(maps_tmp, "w+", np.float32, (count, *batch_maps.shape[1:]))
                logits = np.lib.format.open_memmap(logits_tmp, "w+", np.float32, (count, *batch_logits.shape[1:]))
            maps[done : done + len(batch_maps)] = batch_maps
            logits[done : done + len(batch_maps)] = batch_logits
            done += len(batch_maps)
            progress.update(done)
        if done != count:  # the pipeline gave fewer images than the split holds: never rename a short entry
            raise RuntimeError(f"heatinv: explained {done} of the {count} images of the {split} split; the cache entry was not written.")
        maps.flush()
        logits.flush()
        del maps, logits  # closes the mappings before the files are renamed
