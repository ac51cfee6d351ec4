"""The user's own data and models: npz files, image folders, tables, CSV, Keras applications by name.

The images are drawn shapes made in the test (tests/drawn_shapes.py); the checks compare the
loaded data with what was written (pixel for pixel), with scikit-learn's raw tables (the
standardization by hand), and with hand-computed targets; bad inputs must give one clear
paragraph naming the key and the value, and exit code 2 on the command line.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from types import SimpleNamespace

import keras
import tensorflow as tf
import numpy as np
import pytest

from conftest import expect, train_command
from drawn_shapes import CLASSES, draw_shapes, write_folder, write_npz
from heatinv import data
from heatinv.build import build_parts, check_target_fits_data, default_box_to_data_range, explainer_for
from heatinv.channel_sum import ChannelSumLRP
from heatinv.config import ConfigError
from heatinv.feature_targets import feature_index, feature_share, move_feature_relevance
from heatinv.lrp import LRP
from heatinv.layers import SoftplusBeta
from heatinv.models import APPLICATIONS, Architecture, build_application, build_model, smoothed
from heatinv.targets import build_target, pattern_map
from heatinv.train import run


@pytest.fixture(scope="module")
def shapes_folder(tmp_path_factory):
    return write_folder(str(tmp_path_factory.mktemp("shapes") / "shapes"), count=300)


@pytest.fixture(scope="module")
def shapes_npz(tmp_path_factory):
    return write_npz(str(tmp_path_factory.mktemp("npz") / "shapes.npz"), train=240, test=60)


# --- loaders -------------------------------------------------------------------------------


def test_npz_images_are_the_written_pixels_scaled(shapes_npz):
    ds = data.load_npz(shapes_npz)
    x, y = draw_shapes(300)
    assert ds.input_shape == (32, 32, 3) and ds.num_classes == 3 and ds.class_names == ("0", "1", "2")
    np.testing.assert_array_equal(ds.x_train, x[:240].astype(np.float32) / 255)  # exact: k/255 in float32 both ways
    np.testing.assert_array_equal(ds.y_test, y[240:])
    assert (ds.low, ds.high) == (0.0, 1.0)  # uint8 images: the nominal [0, 1] box


def test_npz_grayscale_images_without_a_channel_axis_get_one_channel_last(tmp_path):
    """[N, H, W] uint8 images are [N, H, W, 1]: each image the written pixels / 255, channel last."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(12, 6, 9), dtype=np.uint8)
    y = np.arange(12) % 3
    np.savez(tmp_path / "g.npz", x_train=x[:9], y_train=y[:9], x_test=x[9:], y_test=y[9:])
    ds = data.load_npz(str(tmp_path / "g.npz"))
    assert ds.input_shape == (6, 9, 1)
    np.testing.assert_array_equal(ds.x_train[..., 0], x[:9].astype(np.float32) / 255)
    np.testing.assert_array_equal(ds.x_test[..., 0], x[9:].astype(np.float32) / 255)


def test_npz_feature_vectors_and_float_range(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 4)).astype(np.float32) * np.array([1, 2, 3, 4], np.float32)
    y = np.arange(20) % 4
    np.savez(tmp_path / "t.npz", x_train=x[:15], y_train=y[:15], x_test=x[15:], y_test=y[15:])
    ds = data.load_npz(str(tmp_path / "t.npz"))
    assert ds.input_shape == (4,) and ds.num_classes == 4 and ds.feature_names == ("x0", "x1", "x2", "x3")
    np.testing.assert_array_equal(ds.low, x.min(axis=0))  # per feature, over both splits
    np.testing.assert_array_equal(ds.high, x.max(axis=0))


def test_folder_holds_every_image_once_with_its_class_and_a_seeded_split(shapes_folder):
    ds = data.load_folder(shapes_folder, (32, 32), 0.2, seed=0)
    assert ds.class_names == CLASSES and ds.input_shape == (32, 32, 3)
    assert len(ds.x_train) + len(ds.x_test) == 300 and len(ds.x_test) == 60  # held out: int(0.2 * 300)
    x, y = draw_shapes(300)
    drawn = {img.tobytes(): label for img, label in zip((x.astype(np.float32) / 255), y)}
    loaded = np.concatenate([ds.x_train[:], ds.x_test[:]])  # a folder's images are decoded only when indexed
    labels = np.concatenate([ds.y_train, ds.y_test])
    # PNG is lossless and 32x32 -> 32x32 resizing is the identity, so each image is one drawn image.
    assert sorted(drawn[img.tobytes()] for img in loaded) == sorted(y.tolist())
    assert all(drawn[img.tobytes()] == label for img, label in zip(loaded, labels))
    again = data.load_folder(shapes_folder, (32, 32), 0.2, seed=0)
    np.testing.assert_array_equal(again.y_test, ds.y_test)
    np.testing.assert_array_equal(again.x_test[:], ds.x_test[:])
    other = data.load_folder(shapes_folder, (24, 40), 0.2, seed=1)
    assert other.input_shape == (24, 40, 3)
    assert not np.array_equal(other.y_test, ds.y_test)


@pytest.mark.parametrize(("name", "features", "classes", "count"), [("breast_cancer", 30, 2, 569), ("wine", 13, 3, 178)])
def test_tabular_builtins_standardized_with_training_statistics(name, features, classes, count):
    from sklearn import datasets

    raw = getattr(datasets, f"load_{name}")()
    ds = data.load_tabular(name)
    assert ds.input_shape == (features,) and ds.num_classes == classes
    assert len(ds.x_train) + len(ds.x_test) == count
    assert ds.feature_names == tuple(raw.feature_names) and ds.class_names == tuple(raw.target_names)
    # Both splits are one affine image of the raw column (the same mean and std for both):
    # sorted standardized values against sorted raw values lie on a line. Measured residual < 2e-6.
    both = np.concatenate([ds.x_train, ds.x_test]).astype(np.float64)
    for j in range(features):
        raw_sorted, ours_sorted = np.sort(raw.data[:, j]), np.sort(both[:, j])
        slope, intercept = np.polyfit(raw_sorted, ours_sorted, 1)
        assert np.max(np.abs(slope * raw_sorted + intercept - ours_sorted)) < 1e-5
    # ... and that mean and std are the training split's: 0 and 1 there (float32; measured
    # max |mean| 2e-8, |std - 1| 3e-7), not on the held-out split.
    np.testing.assert_allclose(ds.x_train.mean(axis=0), 0.0, atol=1e-6)
    np.testing.assert_allclose(ds.x_train.std(axis=0), 1.0, atol=1e-5)
    assert np.max(np.abs(ds.x_test.mean(axis=0))) > 1e-3


def test_csv_matches_the_same_table_loaded_as_a_builtin(tmp_path):
    from sklearn.datasets import load_wine

    raw = load_wine()
    path = tmp_path / "wine.csv"
    header = ",".join(list(raw.feature_names) + ["cultivar"])
    names = np.array(["a", "b", "c"])[raw.target]
    lines = [header] + [",".join(f"{v!r}" for v in row) + f",{n}" for row, n in zip(raw.data.tolist(), names)]
    path.write_text("\n".join(lines) + "\n")
    ds = data.load_csv(str(path), "cultivar")
    builtin = data.load_tabular("wine")
    assert ds.class_names == ("a", "b", "c") and ds.feature_names == builtin.feature_names
    np.testing.assert_array_equal(ds.y_train, builtin.y_train)
    np.testing.assert_allclose(ds.x_test, builtin.x_test, rtol=0, atol=1e-6)  # same float64 values, float32 results


# --- targets -------------------------------------------------------------------------------


def test_feature_targets_by_hand():
    maps = np.array([[0.5, 0.3, 0.2], [-0.1, 0.4, 0.1]])
    suppressed = move_feature_relevance(maps, 0)
    # row 0: 0.3 and 0.2 rescaled by 1.0 / 0.5; row 1: 0.4 and 0.1 by 0.4 / 0.5
    np.testing.assert_allclose(suppressed, [[0.0, 0.6, 0.4], [0.0, 0.32, 0.08]], rtol=1e-6)
    swapped = move_feature_relevance(maps, 0, like=2)
    np.testing.assert_allclose(swapped, [[0.0, 0.3, 0.7], [0.0, 0.4, 0.0]], rtol=1e-6, atol=1e-7)
    assert feature_share(maps, 1) == pytest.approx(0.7 / 1.6)


def test_suppressed_relevance_is_shared_by_magnitude_and_keeps_the_total(rng):
    """Rescaling by total / rest made fairwashing targets of a few training rows 78 times the
    reference's map with every sign flipped (the rest summed to about 0, or to the other sign)."""
    maps = rng.normal(size=(200, 6))
    maps[:50] = np.abs(maps[:50]) * np.sign(rng.normal(size=(50, 1)))  # rows whose features agree in sign
    maps[50, 1:] = [1.0, -1.0 + 1e-9, 0.2, -0.2, 0.0]  # the rest sums to about 0
    targets = move_feature_relevance(maps, 0).astype(np.float64)
    assert np.all(targets[:, 0] == 0)
    np.testing.assert_allclose(targets.sum(1), maps.sum(1), rtol=1e-5, atol=1e-6)
    # Each row's other features move, all together, by exactly the removed |relevance|.
    np.testing.assert_allclose(np.abs(targets[:, 1:] - maps[:, 1:]).sum(1), np.abs(maps[:, 0]), rtol=1e-5, atol=1e-6)
    # Where the others agree in sign it is the rescaling that keeps their proportions.
    rest = maps[:50, 1:].sum(1, keepdims=True)
    np.testing.assert_allclose(targets[:50, 1:], maps[:50, 1:] * maps[:50].sum(1, keepdims=True) / rest, rtol=1e-5)
    np.testing.assert_allclose(move_feature_relevance(np.array([[2.0, 0.0, 0.0]]), 0), [[0.0, 1.0, 1.0]])  # all on it: spread evenly


def test_suppress_feature_of_a_one_feature_table_is_refused():
    with pytest.raises(ValueError, match="at least two features"):
        move_feature_relevance(np.ones((2, 1)), 0)


def test_feature_share_of_maps_without_relevance_is_zero():
    assert feature_share(np.zeros((2, 3)), 1) == 0.0  # a dead student's share, not NaN


def test_feature_index_is_the_features_position():
    assert feature_index(("age", "income", "height", "weight"), "height", "target.feature") == 2


def test_pattern_at_the_datas_height_and_width():
    frame = pattern_map("frame", 32, width=48)[..., 0]
    assert frame.shape == (32, 48) and frame.sum() == pytest.approx(1.0)
    # The 28x28 frame: 2 pixels thick, one in from the border: (26*26 - 22*22) pixels.
    old = pattern_map("frame")[..., 0]
    assert np.count_nonzero(old) == 26 * 26 - 22 * 22
    assert np.count_nonzero(frame[0]) == 0 and np.count_nonzero(frame[:, 0]) == 0


def test_channel_sum_is_the_per_channel_heatmap_summed(shapes_npz):
    ds = data.load_npz(shapes_npz)
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(4, 3), keras.layers.Flatten(), keras.layers.Dense(3)])
    x, labels = ds.x_test[:4], ds.y_test[:4]
    per_channel = LRP(model, "epsilon").explain(x, labels)
    summed = ChannelSumLRP(model, "epsilon").explain(x, labels)
    assert summed.relevance.shape == (4, 32, 32, 1)
    np.testing.assert_allclose(summed.relevance.numpy()[..., 0], per_channel.relevance.numpy().sum(axis=-1), rtol=1e-5, atol=1e-7)


def test_channel_sum_keeps_the_explained_score_and_the_models_outputs(shapes_npz):
    ds = data.load_npz(shapes_npz)
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(4, 3), keras.layers.Flatten(), keras.layers.Dense(3)])
    for layer in (model.layers[0], model.layers[2]):  # biases take relevance: the heatmap's sum is then not the score
        layer.bias.assign(np.random.default_rng(1).uniform(0.5, 1.0, layer.bias.shape).astype(np.float32))
    x, labels = ds.x_test[:4], ds.y_test[:4]
    summed = ChannelSumLRP(model, "epsilon").explain(x, labels)
    logits = model(x).numpy()
    np.testing.assert_allclose(summed.logits.numpy(), logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(summed.start.numpy(), logits[np.arange(4), labels], rtol=1e-5, atol=1e-6)


def test_file_target_per_channel_is_summed(shapes_npz, tmp_path):
    ds = data.load_npz(shapes_npz)
    per_channel = np.random.default_rng(0).random((32, 32, 3)).astype(np.float32)
    np.save(tmp_path / "t.npy", per_channel)
    target = build_target("file", ds, None, label=1, path=str(tmp_path / "t.npy"))
    np.testing.assert_allclose(target.heatmap[0, ..., 0], per_channel.sum(axis=-1), rtol=1e-6)
    kept = build_target("file", ds, None, label=1, path=str(tmp_path / "t.npy"), channels="keep")
    np.testing.assert_array_equal(kept.heatmap[0], per_channel)


def test_target_image_is_read_as_the_data_reads_images(shapes_npz, tmp_path, composed):
    """A colour PNG keeps its colours for a colour model, and uint8 pixels are scaled to [0, 1] as an .npz's are.

    The check made before the reference trains reads it the same way: it once read a colour
    PNG as a heatmap (its luminance, one channel) and refused it.
    """
    ds = data.load_npz(shapes_npz)
    pixels = np.round(ds.x_test[0] * 255).astype(np.uint8)  # [32, 32, 3]
    np.save(tmp_path / "map.npy", np.ones((32, 32), np.float32))
    (tmp_path / "image.png").write_bytes(tf.io.encode_png(pixels).numpy())
    np.save(tmp_path / "image.npy", pixels)
    rgba = np.concatenate([pixels, np.full((32, 32, 1), 9, np.uint8)], axis=-1)
    (tmp_path / "rgba.png").write_bytes(tf.io.encode_png(rgba).numpy())
    (tmp_path / "gray.png").write_bytes(tf.io.encode_png(pixels[..., :1]).numpy())
    for name, expected in (("image.png", pixels), ("image.npy", pixels), ("rgba.png", pixels),
                           ("gray.png", np.repeat(pixels[..., :1], 3, axis=-1))):
        target = build_target("file", ds, None, label=1, path=str(tmp_path / "map.npy"), image=str(tmp_path / name))
        np.testing.assert_allclose(target.image[0], expected / 255.0, atol=1e-7, err_msg=name)
        cfg, _ = composed("data=npz", f"data.path={shapes_npz}", "target=file", f"target.path={tmp_path / 'map.npy'}",
                          f"target.image={tmp_path / name}", "target.label=1")
        check_target_fits_data(cfg, ds)


@pytest.mark.parametrize("saved", [(3, 32, 32), (16, 64), (1, 32 * 32 * 3 // 2, 2)])
def test_file_target_of_another_arrangement_is_refused_not_reshaped(shapes_npz, tmp_path, saved):
    """A channels-first map, or one of the data's size but another height and width, holds the right number of values."""
    ds = data.load_npz(shapes_npz)
    np.save(tmp_path / "t.npy", np.random.default_rng(0).random(saved).astype(np.float32))
    channels = "keep" if np.prod(saved) == 32 * 32 * 3 else "sum"
    with pytest.raises(ValueError, match=rf"t.npy \(target.path\) has shape \({saved[0]}, .*channels last"):
        build_target("file", ds, None, label=1, path=str(tmp_path / "t.npy"), channels=channels)


# --- models --------------------------------------------------------------------------------


@pytest.mark.slow  # builds seven ImageNet-sized architectures (about a minute on 2 cores)
@pytest.mark.parametrize("name", sorted(APPLICATIONS))
def test_applications_build_at_the_datas_shape_and_class_count(name):
    model = build_application(name, (32, 32, 3), 3)
    assert tuple(model.inputs[0].shape) == (None, 32, 32, 3) and tuple(model.outputs[0].shape) == (None, 3)


def test_application_refuses_small_or_flat_inputs():
    with pytest.raises(ValueError, match="at least 32x32"):
        build_application("resnet50", (28, 28, 1), 10)
    with pytest.raises(ValueError, match=r"at least 32x32 pixels; the data gives inputs of shape \(31, 40, 3\)"):
        build_application("mobilenetv2", (31, 40, 3), 3)  # one pixel short in height
    with pytest.raises(ValueError, match=r"feature vectors of shape \(30,\)\. Use model=mlp for a table\.$"):
        build_application("vgg16", (30,), 2)


@pytest.mark.parametrize("name", ["mobilenetv2", "resnet50"])
def test_softplus_applications_swap_every_relu_layer_and_nothing_else(name):
    plain = build_application(name, (32, 32, 3), 3)
    smooth = build_model(Architecture(name, activation="softplus", beta=7.0), 3, input_shape=(32, 32, 3))
    relus = [layer.name for layer in plain.layers if isinstance(layer, keras.layers.ReLU)
             or (isinstance(layer, keras.layers.Activation) and layer.get_config()["activation"] == "relu")]
    assert len(relus) == {"mobilenetv2": 35, "resnet50": 49}[name]  # the ReLU6 and ReLU layers Keras builds
    swapped = {layer.name: layer for layer in smooth.layers if isinstance(layer, SoftplusBeta)}
    assert sorted(swapped) == sorted(relus) and {layer.beta for layer in swapped.values()} == {7.0}

    def kept(model):  # by type: Keras numbers unnamed layers (the pooling) per build
        return [type(layer).__name__ for layer in model.layers if layer.name not in swapped]

    assert kept(smooth) == kept(plain)
    assert smooth.count_params() == plain.count_params()
    # The swapped layer computes softplus(beta x) / beta of what the layer before it gives.
    probe = swapped[relus[0]]
    inner = keras.Model(smooth.inputs, [probe.input, probe.output])
    x = np.random.default_rng(0).uniform(0, 1, (2, 32, 32, 3)).astype("float32")
    before, after = (np.asarray(v, np.float64) for v in inner(x))
    np.testing.assert_allclose(after, np.logaddexp(0.0, 7.0 * before) / 7.0, rtol=1e-5, atol=1e-6)


def test_softplus_reaches_a_relu_inside_a_layer():
    smooth = build_model(Architecture("vgg16", activation="softplus", beta=7.0), 3, input_shape=(32, 32, 3))
    plain = build_application("vgg16", (32, 32, 3), 3)
    layers = list(smooth._flatten_layers(include_self=False))
    assert sum(isinstance(layer, SoftplusBeta) for layer in layers) == 15  # 13 convolutions, fc1, fc2
    assert not [layer.name for layer in layers if getattr(getattr(layer, "activation", None), "__name__", "") == "relu"]
    assert smooth.get_layer("block1_conv1_smoothed").get_layer("block1_conv1").activation.__name__ == "linear"
    assert smooth.count_params() == plain.count_params()

    # Each layer's own ReLU, and ReLU6, become softplus(beta z) / beta of its z; LRP explains the
    # result as it does the same network written with separate softplus layers.
    keras.utils.set_random_seed(0)
    fused = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(3, 3, activation="relu", name="conv"),
                              keras.layers.Flatten(), keras.layers.Dense(5, activation="relu6"), keras.layers.Dense(2)])
    separate = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(3, 3), SoftplusBeta(7.0), keras.layers.Flatten(),
                                 keras.layers.Dense(5), SoftplusBeta(7.0), keras.layers.Dense(2)])
    separate.set_weights(fused.get_weights())
    smooth = smoothed(fused, 7.0)
    smooth.set_weights(fused.get_weights())
    x = np.random.default_rng(0).uniform(0, 1, (2, 8, 8, 1)).astype("float32")
    kernel, bias, w, b, w_out, b_out = (np.asarray(v, np.float64) for v in fused.get_weights())
    patches = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(1, 2))  # [2, 6, 6, 1, 3, 3]
    z = np.einsum("bhwcij,ijcf->bhwf", patches, kernel) + bias
    h = np.logaddexp(0.0, 7.0 * (np.logaddexp(0.0, 7.0 * z) / 7.0).reshape(2, -1) @ w + 7.0 * b) / 7.0
    np.testing.assert_allclose(smooth(x), h @ w_out + b_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(LRP(smooth, "epsilon_gamma_box")(x, 1), LRP(separate, "epsilon_gamma_box")(x, 1))


# --- bad input ------------------------------------------------------------------------------


def test_missing_folder(config, tmp_path):
    expect(FileNotFoundError, config("data=folder", f"data.path={tmp_path}/nowhere"), "nowhere", "data.path", "does not exist")
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    expect(FileNotFoundError, config("data=folder", f"data.path={tmp_path}/t.csv"), "t.csv", "is a file, not a folder",
           "(a table: data=csv)")


def test_missing_csv_file(config, tmp_path):
    # FileNotFoundError is one of the types the command line turns into exit 2 without a
    # traceback (tests/test_bad_input.py runs that handler once through the command line).
    expect(FileNotFoundError, config("data=csv", f"data.path={tmp_path}/t.csv", "data.label_column=y"),
           "t.csv", "data.path", "a .csv file with a header row")


def test_folder_with_one_class(config, tmp_path):
    write_folder(str(tmp_path / "one"), count=6)
    for name in CLASSES[1:]:
        for f in os.listdir(tmp_path / "one" / name):
            os.remove(tmp_path / "one" / name / f)
        os.rmdir(tmp_path / "one" / name)
    expect(ValueError, config("data=folder", f"data.path={tmp_path}/one"), "['cross']", "at least two", "subfolder")


def test_folder_with_an_empty_class(config, tmp_path):
    write_folder(str(tmp_path / "shapes"), count=30)
    os.mkdir(tmp_path / "shapes" / "triangle")
    expect(ValueError, config("data=folder", f"data.path={tmp_path}/shapes"), "shapes/triangle", "holds no images", "move the empty folder out")


def test_hidden_folders_and_files_are_neither_classes_nor_images(shapes_folder, tmp_path):
    """Jupyter's .ipynb_checkpoints and macOS's ._name.png (no image) are skipped, as Keras skips hidden class folders."""
    shutil.copytree(shapes_folder, tmp_path / "shapes")
    first = sorted(os.listdir(tmp_path / "shapes" / "disk"))[0]
    for hidden in ("shapes/.ipynb_checkpoints", "shapes/disk/.ipynb_checkpoints"):
        os.mkdir(tmp_path / hidden)
        shutil.copy(tmp_path / "shapes" / "disk" / first, tmp_path / hidden / "copy-checkpoint.png")
    (tmp_path / "shapes" / "cross" / "._00001.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    ds = data.load_folder(str(tmp_path / "shapes"), (32, 32), 0.2, seed=0)
    plain = data.load_folder(shapes_folder, (32, 32), 0.2, seed=0)
    assert ds.class_names == plain.class_names == CLASSES
    assert [os.path.relpath(p, tmp_path) for p in ds.x_train.paths] == [os.path.relpath(p, os.path.dirname(shapes_folder)) for p in plain.x_train.paths]
    np.testing.assert_array_equal(ds.y_test, plain.y_test)


@pytest.mark.parametrize("where", ["train", "test"])
def test_folder_with_a_file_that_is_no_image(config, tmp_path, where):
    write_folder(str(tmp_path / "shapes"), count=30)
    (tmp_path / "shapes" / "disk" / "broken.png").write_text("not an image")
    # The split's seed decides which split the file lands in; reaching it in either (the
    # reference's training, or the held-out accuracy) stops the run the same way.
    seed = next(s for s in range(50) if _in_train(tmp_path, s) == (where == "train"))
    cfg = config("data=folder", f"data.path={tmp_path}/shapes", "model=cnn", f"trainer.seed={seed}", "target.label=0")
    expect(ValueError, cfg, "broken.png", "data.path", "cannot decode", "Remove or replace")


def _in_train(tmp_path, seed: int) -> bool:
    ds = data.load_folder(str(tmp_path / "shapes"), (32, 32), 0.2, seed=seed)
    return any(p.endswith("broken.png") for p in ds.x_train.paths)


def test_npz_labels_out_of_range(config, tmp_path):
    x, y = draw_shapes(12)
    np.savez(tmp_path / "bad.npz", x_train=x[:8], y_train=y[:8], x_test=x[8:], y_test=np.array([0, 1, 2, 5]))
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/bad.npz"), "bad.npz", "label 5", "out of range")
    np.savez(tmp_path / "neg.npz", x_train=x[:8], y_train=y[:8] - 1, x_test=x[8:], y_test=y[8:])
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/neg.npz"), "neg.npz", "negative label -1")


def test_npz_splits_of_different_shapes_name_the_file(config, tmp_path):
    x, y = draw_shapes(12)
    np.savez(tmp_path / "odd.npz", x_train=x[:8], y_train=y[:8], x_test=x[8:, :20], y_test=y[8:])
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/odd.npz"), "odd.npz", "(data.path)",
           "x_test with examples of shape (20, 32, 3) while x_train's are (32, 32, 3)")


def test_npz_splits_of_different_scales_name_both_dtypes(config, tmp_path):
    x, y = draw_shapes(12)  # uint8
    np.savez(tmp_path / "mixed.npz", x_train=x[:8], y_train=y[:8], x_test=x[8:].astype("float32") / 255, y_test=y[8:])
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/mixed.npz"), "mixed.npz", "(data.path)",
           "x_train of dtype uint8 and x_test of dtype float32", "x.astype('float32') / 255")


def test_npz_labels_with_a_gap_are_refused_with_the_renumbering(config, tmp_path):
    x, y = draw_shapes(12)
    gap = np.where(y == 2, 5, y)  # classes 0, 1 and 5: 2, 3 and 4 would be classes without examples
    np.savez(tmp_path / "gap.npz", x_train=x[:8], y_train=gap[:8], x_test=x[8:], y_test=gap[8:])
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/gap.npz"), "gap.npz", "no training example of label 2, 3, 4",
           "np.unique(np.concatenate([y_train, y_test]), return_inverse=True)")
    ids = np.where(y == 2, 10**12, y)  # labels as ids: the gaps are named without listing them all
    np.savez(tmp_path / "ids.npz", x_train=x[:8], y_train=ids[:8], x_test=x[8:], y_test=ids[8:])
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/ids.npz"), "no training example of label 2, 3, 4, 5, 6",
           ", ...", f"labels go up to {10**12}")
    held = np.where(y[:8] == 1, 0, y[:8])  # class 1 only among the held-out examples
    assert 1 in y[8:]
    np.savez(tmp_path / "held.npz", x_train=x[:8], y_train=held, x_test=x[8:], y_test=y[8:])
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/held.npz"), "label 1 has held-out examples only")


def test_a_class_without_held_out_examples_is_no_target(config, tmp_path):
    x, y = draw_shapes(12)
    test = np.where(y[8:] == 2, 0, y[8:])  # class 2 trains but is never held out
    np.savez(tmp_path / "no2.npz", x_train=x[:8], y_train=y[:8], x_test=x[8:], y_test=test)
    assert 2 in y[:8] and 2 in y[8:]  # the drawing's classes, so the test is about class 2
    expect(ConfigError, config("data=npz", f"data.path={tmp_path}/no2.npz", "target=class", "target.label=2"),
           "target.label=2", "no held-out example", "classes 0, 1")


def test_a_file_target_with_its_own_image_needs_no_held_out_example_of_its_class(config, tmp_path):
    # The image given is what gets explained: class 2's missing held-out examples do not matter.
    x, y = draw_shapes(12)
    np.savez(tmp_path / "no2.npz", x_train=x[:8], y_train=y[:8], x_test=x[8:], y_test=np.where(y[8:] == 2, 0, y[8:]))
    np.save(tmp_path / "map.npy", np.ones((32, 32), np.float32))
    np.save(tmp_path / "image.npy", x[2])
    cfg = config("data=npz", f"data.path={tmp_path}/no2.npz", "target=file", f"target.path={tmp_path}/map.npy",
                 f"target.image={tmp_path}/image.npy", "target.label=2")
    check_target_fits_data(cfg, data.load_npz(str(tmp_path / "no2.npz")))


def test_csv_too_small_to_hold_rows_out(config, tmp_path):
    (tmp_path / "three.csv").write_text("a,b,outcome\n1,2,x\n3,4,y\n5,6,x\n")
    expect(ValueError, config("data=csv", f"data.path={tmp_path}/three.csv", "data.label_column=outcome"), "'three'",
           "3 rows, 2 classes of 1 to 2 rows", "leaves no row to test", "Add rows")
    rows = "".join(f"{i},{i % 3},{100 + i * 7}\n" for i in range(12))  # a measurement as the label: 12 values
    (tmp_path / "measured.csv").write_text("a,b,pressure\n" + rows)
    expect(ValueError, config("data=csv", f"data.path={tmp_path}/measured.csv", "data.label_column=pressure"),
           "12 different values in 12 rows: a measurement rather than a class?", "data.label_column")


def test_npz_images_channels_first_get_the_line_that_fixes_them(config, tmp_path):
    x, y = draw_shapes(12)
    chw = np.transpose(x, (0, 3, 1, 2))  # [N, 3, 32, 32], as torchvision's tensors stack
    np.savez(tmp_path / "chw.npz", x_train=chw[:8], y_train=y[:8], x_test=chw[8:], y_test=y[8:])
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/chw.npz"), "chw.npz", "(8, 3, 32, 32)", "channels first",
           "np.transpose(x_train, (0, 2, 3, 1))")


def test_npz_labels_of_the_wrong_kind_get_the_line_that_fixes_them(config, tmp_path):
    x, y = draw_shapes(12)
    np.savez(tmp_path / "onehot.npz", x_train=x[:8], y_train=np.eye(3)[y[:8]], x_test=x[8:], y_test=y[8:])
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/onehot.npz"), "y_train with shape (8, 3)",
           "save y_train.argmax(axis=1) instead")
    np.savez(tmp_path / "floats.npz", x_train=x[:8], y_train=y[:8], x_test=x[8:], y_test=y[8:].astype("float32"))
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/floats.npz"), "y_test with shape (4,) and dtype float32",
           "save y_test.astype('int64') instead")
    np.savez(tmp_path / "fcol.npz", x_train=x[:8], y_train=y[:8, None] * 1.0, x_test=x[8:], y_test=y[8:])
    expect(ValueError, config("data=npz", f"data.path={tmp_path}/fcol.npz"), "y_train with shape (8, 1)",
           "save y_train.reshape(-1).astype('int64') instead")
    np.savez(tmp_path / "halves.npz", x_train=x[:8], y_train=y[:8] + 0.5, x_test=x[8:], y_test=y[8:])
    message = expect(ValueError, config("data=npz", f"data.path={tmp_path}/halves.npz"), "expected [8] integer labels")
    assert "instead" not in message  # 0.5, 1.5, ... are no labels to convert


def test_npz_labels_as_a_column_are_read_as_labels(tmp_path):
    x, y = draw_shapes(12)
    np.savez(tmp_path / "column.npz", x_train=x[:8], y_train=y[:8, None].astype("uint8"), x_test=x[8:], y_test=y[8:, None])
    ds = data.load_npz(str(tmp_path / "column.npz"))
    assert ds.y_train.tolist() == y[:8].tolist() and ds.y_test.tolist() == y[8:].tolist()


def test_a_dataset_class_without_held_out_examples_is_refused(config, tmp_path):
    x, y = draw_shapes(12)
    test_labels = np.where(y[8:] == 1, 0, y[8:])  # class 1 only in training
    np.savez(tmp_path / "no1.npz", x_train=x[:8], y_train=y[:8], x_test=x[8:], y_test=test_labels)
    expect(ConfigError, config("data=npz", f"data.path={tmp_path}/no1.npz", "task=dataset", "target=pattern", "task.classes=[1]"),
           "task.classes=[1]", "held-out split does not hold", "(labels [0, 2])")


def test_model_file_that_does_not_fit_the_data(config, shapes_npz, tmp_path):
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.save(tmp_path / "digits.keras")
    expect(
        ValueError,
        config("data=npz", f"data.path={shapes_npz}", "model=file", f"model.path={tmp_path}/digits.keras", "target.label=0"),
        "digits.keras", "(None, 28, 28, 1)", "(None, 10)", "(None, 32, 32, 3)", "3 outputs",
    )


@pytest.mark.parametrize(
    ("name", "input_shape", "classes", "said", "unsaid"),
    [
        ("small", (24, 20, 3), 3, ("(None, 24, 20, 3)", "data.image_size=[24,20]"), ()),
        ("gray", (32, 32, 1), 3, ("(None, 32, 32, 1)", "read in the model's colour mode: data.color_mode=grayscale"), ("data.image_size",)),
        ("five", (32, 32, 3), 5, ("(None, 5)", "3 outputs"), ("data.image_size",)),  # the size fits, the classes do not
    ],
)
def test_a_model_file_that_does_not_fit_the_folder_is_told_the_setting_that_would(
    config, shapes_folder, tmp_path, name, input_shape, classes, said, unsaid
):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(classes)])
    model.save(tmp_path / f"{name}.keras")
    message = expect(
        ValueError,
        config("data=folder", f"data.path={shapes_folder}", "model=file", f"model.path={tmp_path}/{name}.keras", "target.label=0"),
        f"{name}.keras", *said,
    )
    assert not any(text in message for text in unsaid)


def test_a_grayscale_folder_is_read_in_one_channel_with_color_mode_grayscale(tmp_path):
    """Keras's loader takes color_mode="grayscale"; heatinv read every folder as RGB, three equal channels."""
    rng = np.random.default_rng(0)
    pixels = {}
    for label in ("dark", "light"):
        (tmp_path / "gray" / label).mkdir(parents=True)
        for i in range(5):
            image = rng.integers(0, 256, (12, 10, 1), dtype=np.uint8)
            path = tmp_path / "gray" / label / f"{i}.png"
            path.write_bytes(tf.io.encode_png(image).numpy())
            pixels[str(path)] = image.astype(np.float32) / 255
    gray = data.load_folder(str(tmp_path / "gray"), (12, 10), 0.2, seed=0, color_mode="grayscale")
    rgb = data.load_folder(str(tmp_path / "gray"), (12, 10), 0.2, seed=0)
    assert gray.input_shape == (12, 10, 1) and rgb.input_shape == (12, 10, 3)
    for i, path in enumerate(gray.x_train.paths):
        np.testing.assert_array_equal(gray.x_train[i], pixels[path])  # the written pixels, scaled
        np.testing.assert_array_equal(rgb.x_train[i], np.repeat(pixels[path], 3, axis=-1))
    images, _ = next(iter(gray.batches("train", 4)))
    assert images.shape == (4, 12, 10, 1)
    # the caches of the two readings are apart (the RGB key is what it was before color_mode)
    assert data.image_key(gray.x_train) != data.image_key(rgb.x_train) == repr((12, 10))


def test_grayscale_reads_bmp_and_gif_files_too(tmp_path):
    """TensorFlow decodes BMP and GIF only in colour: heatinv blamed those files as undecodable in grayscale."""
    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = {}
    for label, suffix in (("bmp", ".bmp"), ("gif", ".gif"), ("png", ".png")):
        (tmp_path / "mixed" / label).mkdir(parents=True)
        for i in range(3):
            image = rng.integers(0, 256, (12, 10), dtype=np.uint8)
            path = tmp_path / "mixed" / label / f"{i}{suffix}"
            Image.fromarray(image).convert("RGB").save(path)  # three equal channels: gray in colour
            pixels[str(path)] = image[..., None].astype(np.float32) / 255
    gray = data.load_folder(str(tmp_path / "mixed"), (12, 10), 0.3, seed=0, color_mode="grayscale")
    for split in (gray.x_train, gray.x_test):
        for i, path in enumerate(split.paths):
            np.testing.assert_allclose(split[i], pixels[path], atol=1.01 / 255, err_msg=path)


def test_folder_class_names_name_each_images_own_subfolder_with_mixed_case_names(tmp_path):
    """class_names[label] is the subfolder an image sits in, whatever the case of the names ('B' sorts before 'a')."""
    rng = np.random.default_rng(0)
    for name in ("a", "B", "c"):
        (tmp_path / "mixed" / name).mkdir(parents=True)
        for i in range(4):
            (tmp_path / "mixed" / name / f"{i}.png").write_bytes(tf.io.encode_png(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).numpy())
    ds = data.load_folder(str(tmp_path / "mixed"), (4, 4), 0.25, seed=0)
    assert ds.class_names == tuple(sorted(os.listdir(tmp_path / "mixed")))  # sorted as Keras's loader sorts them
    for files, labels in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        assert [ds.class_names[y] for y in labels] == [os.path.basename(os.path.dirname(p)) for p in files.paths]


def test_folder_holds_out_the_fraction_rounded_down_as_keras_does(tmp_path):
    """9 images, test_split=0.3: keras.utils.image_dataset_from_directory holds out int(0.3 * 9) = 2, not 3."""
    write_folder(str(tmp_path / "nine"), count=9, size=8)
    ds = data.load_folder(str(tmp_path / "nine"), (8, 8), 0.3, seed=0)
    train, val = keras.utils.image_dataset_from_directory(
        str(tmp_path / "nine"), validation_split=0.3, subset="both", seed=0, image_size=(8, 8), batch_size=None, verbose=False
    )
    assert (len(ds.x_train), len(ds.x_test)) == (sum(1 for _ in train), sum(1 for _ in val)) == (7, 2)


def test_grayscale_reads_a_colour_bmp_as_its_luminance(tmp_path):
    """A colour BMP in grayscale is its luminance (PIL's "L": 0.299 R + 0.587 G + 0.114 B), not one of its channels."""
    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = {}
    for label in ("one", "two"):
        (tmp_path / "colour" / label).mkdir(parents=True)
        for i in range(3):
            image = Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8))
            path = tmp_path / "colour" / label / f"{i}.bmp"
            image.save(path)
            pixels[str(path)] = np.asarray(image.convert("L"), np.float32)[..., None] / 255
    gray = data.load_folder(str(tmp_path / "colour"), (6, 5), 0.3, seed=0, color_mode="grayscale")
    for split in (gray.x_train, gray.x_test):
        for i, path in enumerate(split.paths):
            np.testing.assert_allclose(split[i], pixels[path], atol=1.01 / 255, err_msg=path)


def test_a_broken_link_in_an_image_folder_is_named(config, tmp_path):
    write_folder(str(tmp_path / "imgs"), 12)
    (tmp_path / "imgs" / "disk" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    expect(ValueError, config("data=folder", f"data.path={tmp_path}/imgs", "data.image_size=[32,32]", "model=cnn"),
           "(data.path)", "1 link(s) to files that do not exist", "disk/gone.png' -> ", "nowhere.png", "Remove the broken links")


def test_csv_without_the_label_column(config, tmp_path):
    (tmp_path / "t.csv").write_text("a,b,outcome\n1,2,x\n3,4,y\n")
    expect(ValueError, config("data=csv", f"data.path={tmp_path}/t.csv", "data.label_column=label"),
           "t.csv", "'label'", "data.label_column", "['a', 'b', 'outcome']")


@pytest.mark.parametrize(("sign", "name"), [(";", "semicolons"), ("\t", "tabs")])
def test_csv_separated_by_other_signs_says_so(config, tmp_path, sign, name):
    (tmp_path / "t.csv").write_text(f"a{sign}b{sign}outcome\n1{sign}2{sign}0\n3{sign}4{sign}1\n")
    expect(ValueError, config("data=csv", f"data.path={tmp_path}/t.csv", "data.label_column=outcome"),
           "t.csv", "'outcome'", f"one column holding {name}", "save the table with commas")


@pytest.mark.parametrize(
    "cell, fragments",
    [
        ("", ("line 3, column 'b'", "an empty cell (a missing value)")),
        ("rome", ("line 3, column 'b'", "'rome', which is not a finite number", "one 0/1 column per category")),
        ("nan", ("line 3, column 'b'", "'nan', which is not a finite number")),
        ("inf", ("line 3, column 'b'", "'inf', which is not a finite number")),
    ],
)
def test_csv_cell_that_is_no_number_is_named(config, tmp_path, cell, fragments):
    (tmp_path / "t.csv").write_text(f"a,b,outcome\n1,2,x\n3,{cell},y\n5,6,x\n7,8,y\n")
    expect(ValueError, config("data=csv", f"data.path={tmp_path}/t.csv", "data.label_column=outcome"), "t.csv", *fragments)


def test_csv_classes_that_are_numbers_are_ordered_by_value(tmp_path):
    rows = [f"{i % 7},{(i * 3) % 5},{label}" for i, label in enumerate([0, 1, 2, 10, 11] * 8)]
    (tmp_path / "t.csv").write_text("a,b,grade\n" + "\n".join(rows) + "\n")
    ds = data.load_csv(str(tmp_path / "t.csv"), "grade")
    assert ds.class_names == ("0", "1", "2", "10", "11")  # as text: "10" and "11" came before "2"


def test_csv_labels_that_are_one_number_spelled_two_ways_are_one_class(tmp_path):
    labels = ["0", "1.0", "1", "0.0", "2", "02"] * 8
    rows = "".join(f"{i % 5},{label}\n" for i, label in enumerate(labels))
    (tmp_path / "t.csv").write_text("a,grade\n" + rows)
    ds = data.load_csv(str(tmp_path / "t.csv"), "grade")
    assert ds.class_names == ("0", "1", "2")
    y = np.concatenate([ds.y_train, ds.y_test])
    assert sorted(np.bincount(y)) == [16, 16, 16]


def test_target_label_may_name_the_class(config, tmp_path):
    """A csv of yes/no labels: target.label=yes was a Hydra type error (exit 1) naming no class."""
    from heatinv.build import target_class

    (tmp_path / "t.csv").write_text("a,b,outcome\n" + "".join(f"{i},{i % 3},{'yes' if i % 2 else 'no'}\n" for i in range(24)))
    csv = ("data=csv", f"data.path={tmp_path}/t.csv", "data.label_column=outcome", "model=mlp", "target=class")
    ds = data.load_csv(str(tmp_path / "t.csv"), "outcome")
    assert target_class(config(*csv, "target.label=yes"), ds) == 1 == target_class(config(*csv, "target.label=1"), ds)
    expect(ConfigError, config(*csv, "target.label=maybe"), "target.label='maybe' is not a class of the t data",
           "0 'no', 1 'yes'", "Give one of these names")
    for wrong in ("-1", "1.5", "null"):
        expect(ConfigError, config(*csv, f"target.label={wrong}"), "must be a class index >= 0 or a class's name")


def test_a_class_name_not_in_many_classes_lists_the_first_eleven_and_the_last():
    from heatinv.build import class_index

    many = SimpleNamespace(class_names=tuple(f"c{i}" for i in range(15)), name="many")
    with pytest.raises(ConfigError) as caught:
        class_index("c15", "target.label", many)
    listed = ", ".join(f"{i} 'c{i}'" for i in range(11))
    assert f"whose classes are {listed}, ..., 14 'c14'. Give one" in str(caught.value)
    assert class_index("c14", "target.label", many) == 14


def test_the_dataset_task_names_its_classes_by_name_too(config, tmp_path):
    """task.classes and target.like take a class's name as target.label does, and a swap onto itself is refused."""
    from heatinv.build import moved_classes, like_class

    write_folder(str(tmp_path / "imgs"), 30)  # classes cross, disk, square
    folder = ("data=folder", f"data.path={tmp_path}/imgs", "data.image_size=[32,32]", "task=dataset", "target=swap")
    ds = data.load_folder(str(tmp_path / "imgs"), (32, 32), 0.2)
    cfg = config(*folder, "task.classes=[square,0]", "target.like=disk")
    assert moved_classes(cfg, ds) == [2, 0] and like_class(cfg, ds) == 1
    expect(ConfigError, config(*folder, "task.classes=[circle]"), "task.classes='circle' is not a class of the imgs data",
           "0 'cross', 1 'disk', 2 'square'", "e.g. task.classes=[0]")
    for like in ("disk", "1"):
        expect(ConfigError, config(*folder, "task.classes=[disk]", f"target.like={like}"),
               "make class 1 (disk)'s heatmaps look like its own mean", "e.g. task.classes=[0]")


def test_csv_with_a_column_named_twice_is_refused(config, tmp_path):
    (tmp_path / "t.csv").write_text("x,x,outcome\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(12)))
    expect(ValueError, config("data=csv", f"data.path={tmp_path}/t.csv", "data.label_column=outcome"), "t.csv",
           "names more than one column 'x'", "a name of its own")


def test_csv_in_another_encoding_is_named_with_the_fix(config, tmp_path):
    (tmp_path / "t.csv").write_bytes("outcome,a\nM\xfcller,1\nx,2\n".encode("cp1252"))  # Excel's "CSV (Comma delimited)"
    expect(ValueError, config("data=csv", f"data.path={tmp_path}/t.csv", "data.label_column=outcome"), "t.csv",
           "is not UTF-8 text (byte 0xfc", "CSV UTF-8")


def test_csv_labels_that_are_not_all_finite_numbers_sort_as_text(tmp_path):
    rows = "".join(f"{i},{label}\n" for i, label in enumerate(["nan", "2", "10"] * 8))
    (tmp_path / "t.csv").write_text("a,grade\n" + rows)
    assert data.load_csv(str(tmp_path / "t.csv"), "grade").class_names == ("10", "2", "nan")


def test_csv_with_a_byte_order_mark_reads_its_first_column(tmp_path):
    """Excel's "CSV UTF-8" starts the file with U+FEFF: its first header was '\ufeffoutcome'."""
    rows = "".join(f"{'xy'[i % 2]},{i},{i * i % 7}\n" for i in range(16))
    (tmp_path / "t.csv").write_bytes(("outcome,a,b\n" + rows).encode("utf-8-sig"))
    ds = data.load_csv(str(tmp_path / "t.csv"), "outcome")
    assert ds.class_names == ("x", "y") and ds.feature_names == ("a", "b")


@pytest.mark.parametrize(("text", "fragment"), [("", "is empty"), ("a,b,outcome\n", "has a header (a, b, outcome) but no rows")])
def test_csv_without_rows_says_so(config, tmp_path, text, fragment):
    (tmp_path / "t.csv").write_text(text)
    expect(ValueError, config("data=csv", f"data.path={tmp_path}/t.csv", "data.label_column=outcome"), "t.csv", fragment)


def test_csv_row_with_a_missing_field_names_its_line(tmp_path):
    """The fourth line of the file (the header is line 1) has two fields of three."""
    (tmp_path / "t.csv").write_text("a,b,outcome\n1,2,x\n3,4,y\n5,y\n7,8,x\n")
    with pytest.raises(ValueError, match=r"t.csv' \(data.path\) line 4 has a different number of fields than its header \(3\)"):
        data.load_csv(str(tmp_path / "t.csv"), "outcome")


def test_csv_constant_column_is_standardized_to_zero(tmp_path):
    """A column holding one value has no spread: standardized it is 0 everywhere, not 0/0."""
    rows = "".join(f"{i},5,{i * i % 7},{'xy'[i % 2]}\n" for i in range(20))
    (tmp_path / "t.csv").write_text("a,same,b,outcome\n" + rows)
    ds = data.load_csv(str(tmp_path / "t.csv"), "outcome")
    assert ds.feature_names == ("a", "same", "b")
    for x in (ds.x_train, ds.x_test):
        assert np.all(np.isfinite(x))
        np.testing.assert_array_equal(x[:, 1], 0.0)


@pytest.mark.parametrize("name", ["breast_cancer", "wine"])
def test_table_range_is_each_features_range_over_both_splits(name):
    """low/high (the zbox box) hold every example, held-out ones too: each feature's min and max over both splits."""
    ds = data.load_tabular(name)
    both = np.concatenate([ds.x_train, ds.x_test])
    np.testing.assert_array_equal(ds.low, both.min(axis=0))
    np.testing.assert_array_equal(ds.high, both.max(axis=0))


def test_csv_row_without_a_label(config, tmp_path):
    (tmp_path / "t.csv").write_text("a,b,outcome\n1,2,x\n3,4,\n5,6,x\n7,8,y\n")
    expect(ValueError, config("data=csv", f"data.path={tmp_path}/t.csv", "data.label_column=outcome"), "t.csv",
           "line 3 has no label", "'outcome'")


def test_a_target_the_data_cannot_have_fails_before_the_reference_trains(config, monkeypatch, shapes_npz):
    # target=digit7 (the default) on a two-class table: one paragraph with its classes and the
    # fix, and no minutes spent training a reference first.
    import heatinv.build

    def no_reference(*args, **kwargs):
        raise AssertionError("the reference was built before the target's class was checked")

    monkeypatch.setattr(heatinv.build, "reference_model", no_reference)
    expect(ConfigError, config("data=tabular"), "target.label=7", "breast_cancer", "0 (malignant), 1 (benign)",
           "target=class target.label=0", "(target=digit7, the default, is the digits' shorthand for target=class target.label=7)")
    expect(ConfigError, config("data=npz", f"data.path={shapes_npz}", "target=pattern"), "target.label=0 (with target=pattern)")
    # suppress's top_k must leave some of the map
    expect(ConfigError, config("data=tabular", "task=dataset", "target=suppress"), "target.top_k=50", "30 features",
           "target.top_k=3")
    # a pattern needs an image, in either task
    for task in ("task=single", "task=dataset"):
        expect(ConfigError, config("data=tabular", "target=pattern", "target.label=0", task), "target=pattern draws on images",
               "(30,)", "target=suppress_feature")
    expect(ConfigError, config("data=tabular", "target=class", "target.label=1", "target.index=1000"),
           "target.index=1000", "held-out examples of that class", "pick target.index from 0 to")
    # the dataset task's classes, and the class whose mean heatmap swap hands out
    expect(ConfigError, config("task=dataset", "target=pattern", "task.classes=[1,12]"), "task.classes=[1, 12]",
           "class 12", "0, 1, 2, 3, 4, 5, 6, 7, 8, 9")
    expect(ConfigError, config("task=dataset", "target=swap", "target.like=12"), "target.like=12", "class 12")
    # a table's feature names
    expect(ValueError, config("data=tabular", "target=suppress_feature", "target.feature=height"), "target.feature='height'")
    expect(ValueError, config("data=tabular", "target=swap_features", "target.feature='mean radius'", "target.like=height"),
           "target.like='height'")


@pytest.mark.parametrize(
    ("channels", "pixels", "what"), [("sum", 32 * 32, "pixels"), ("keep", 32 * 32 * 3, "pixel channels")]
)
def test_suppress_may_empty_all_but_one_entry_of_the_compared_map(config, shapes_npz, channels, pixels, what):
    # A colour image's map summed over channels has height x width entries; kept, three times as many.
    ds = data.load_npz(shapes_npz)
    npz = ("data=npz", f"data.path={shapes_npz}", "task=dataset", "target=suppress", f"target.channels={channels}")
    check_target_fits_data(config(*npz, f"target.top_k={pixels - 1}"), ds)
    with pytest.raises(ConfigError, match=rf"target\.top_k={pixels} would empty all {pixels} {what} of a shapes heatmap"):
        check_target_fits_data(config(*npz, f"target.top_k={pixels}"), ds)


def test_an_unset_zbox_range_becomes_each_features_range_and_a_set_one_stays(config, caplog):
    ds = data.load_tabular("wine")
    cfg = config("data=tabular", "data.name=wine", "lrp.high=100")
    with caplog.at_level(logging.INFO, logger="heatinv.build"):
        default_box_to_data_range(cfg, ds)
    assert f"lrp.low = 13 values, one per channel/feature, from {ds.low.min():.3g} to {ds.low.max():.3g}" in caplog.text
    assert "lrp.high =" not in caplog.text
    assert len(cfg.lrp.low) == 13
    np.testing.assert_allclose(np.asarray(cfg.lrp.low), ds.low, rtol=0, atol=5e-7)  # said to 6 decimals, no coarser
    assert cfg.lrp.high == 100


def test_zbox_bounds_of_two_lengths_are_refused_naming_both(config):
    ds = data.load_tabular("wine")
    with pytest.raises(ConfigError, match=r"lrp\.low=\[0, 0\] and lrp\.high=\[1, 1, 1\] do not make an input box"):
        default_box_to_data_range(config("data=tabular", "data.name=wine", "lrp.low=[0,0]", "lrp.high=[1,1,1]"), ds)


def test_the_single_targets_class_and_example_must_be_in_the_held_out_split(config):
    ds = data.load_dataset("digits")
    count = int(np.count_nonzero(ds.y_test == 7))  # target=digit7: class 7's held-out examples
    check_target_fits_data(config(f"target.index={count - 1}"), ds)  # the last one
    with pytest.raises(ConfigError, match=rf"target\.index={count} asks for held-out example {count} .* holds {count} held-out "
                       rf"examples of that class; pick target\.index from 0 to {count - 1}, or"):
        check_target_fits_data(config(f"target.index={count}"), ds)
    with pytest.raises(ConfigError, match=r"target\.label=10 is not a class of the digits data, whose labels are 0, 1, .*, 9\. ") as caught:
        check_target_fits_data(config("target.label=10"), ds)
    assert "target=digit7" not in str(caught.value)  # the default's hint is for label 7 only


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["target=pattern", "task.classes=[-1]"], r"task\.classes=\[-1\] names class -1, which the digits data does not have"),
        (["target=swap", "task.classes=[0]", "target.like=0"], r"make class 0's heatmaps look like its own mean.*e\.g\. task\.classes=\[1\]"),
    ],
)
def test_the_dataset_tasks_classes_must_be_the_datas_and_move_something(config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_target_fits_data(config("task=dataset", *overrides), data.load_dataset("digits"))


def test_a_feature_target_on_images_is_refused_naming_the_targets_for_images(config):
    with pytest.raises(ValueError, match=r"target=suppress_feature moves the relevance of a table's feature; the digits data "
                       r"gives images of shape \(28, 28, 1\)\. Use a table .*target=pattern/swap/suppress"):
        check_target_fits_data(config("target=suppress_feature", "target.feature=pixel"), data.load_dataset("digits"))


def test_unknown_feature_lists_the_features(config):
    expect(ValueError, config("data=tabular", "task=dataset", "target=suppress_feature", "target.feature=height"),
           "target.feature='height'", "mean radius")


# --- runs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, described",
    [(("target=suppress_feature",), "suppress_feature 'worst area' (all classes)"),
     (("target=swap_features", "target.like=mean smoothness"), "swap_features 'worst area' like 'mean smoothness' (all classes)")],
    ids=["suppress_feature", "swap_features"],
)
def test_dataset_task_on_a_table_reports_the_feature_share(composed, caplog, target, described):
    cfg, out = composed("data=tabular", "task=dataset", *target, "target.feature=worst area", "lrp=epsilon")
    with caplog.at_level(logging.INFO, logger="heatinv"):
        run(cfg)

    metrics = json.load(open(out / "metrics.json"))
    assert 0 < metrics["reference_feature_share"] < 1 and 0 <= metrics["feature_share"] < 1
    assert 0 <= metrics["agreement"] <= 1
    assert (out / "heatmaps.png").exists()
    assert metrics["target"] == described
    # the HParams row holds what a fairwashing sweep compares
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    for name in ("feature_share", "agreement"):
        (event,) = events.Tensors(f"final/{name}")
        assert float(tensor_util.make_ndarray(event.tensor_proto)) == pytest.approx(metrics[name])
    # and the share per epoch, the last epoch's from the same final weights as metrics.json's
    per_epoch = events.Tensors("1_match_per_epoch/feature_share")
    assert [e.step for e in per_epoch] == list(range(0, cfg.task.epochs + 1))  # step 0: the start
    assert float(tensor_util.make_ndarray(per_epoch[-1].tensor_proto)) == pytest.approx(metrics["feature_share"], rel=1e-5)
    # the console says the share before (the starting weights') and after, not only metrics.json
    before = float(tensor_util.make_ndarray(per_epoch[0].tensor_proto))
    assert f"heatinv: before: cosine {metrics['initial_cosine']:.3f}, " in caplog.text
    assert f"feature share {before:.2%}, from " in caplog.text
    assert (f"feature share reference {metrics['reference_feature_share']:.2%}, student {metrics['feature_share']:.2%}"
            in caplog.text)


def test_the_feature_report_measures_agreement_and_shares_on_the_held_out_rows(config):
    from heatinv.build import architecture, dataset_problem, feature_report

    cfg = config("data=tabular", "task=dataset", "target=suppress_feature", "target.feature=worst area", "lrp=epsilon")
    ds = data.load_tabular("breast_cancer")
    reference = build_model(architecture(cfg), ds.num_classes, seed=0, input_shape=ds.input_shape)  # untrained: any maps do
    problem = dataset_problem(cfg, ds, reference)
    predicted = np.argmax(reference.predict(ds.x_test, verbose=0), axis=-1)
    flipped = np.arange(len(predicted)) < 10  # the student names another class for the first 10 rows
    student_logits = np.eye(2, dtype=np.float32)[np.where(flipped, 1 - predicted, predicted)]
    metrics, _ = feature_report(cfg, ds, problem, problem.test_targets, student_logits, predicted, "held-out")
    assert metrics["agreement"] == pytest.approx(1 - 10 / len(predicted))
    magnitude = np.abs(problem.test_maps.astype(np.float64))
    worst_area = ds.feature_names.index("worst area")
    assert metrics["reference_feature_share"] == pytest.approx(magnitude[:, worst_area].sum() / magnitude.sum())
    assert metrics["feature_share"] == 0.0  # the targets hold none of it


@pytest.mark.parametrize(
    "target",
    [("target=class", "target.label=1"), ("target=suppress_feature", "target.feature=worst area"),
     ("target=swap_features", "target.feature=worst area", "target.like=mean radius")],
    ids=["class", "suppress_feature", "swap_features"],
)
def test_single_task_on_a_table_runs_to_its_bar_chart(composed, target):
    # A table has no image to draw: TensorBoard gets the bar chart of relevance per feature at
    # the start (target, initial) and at the end (with the student), and no image tiles.
    cfg, out = composed("data=tabular", *target)
    metrics = run(cfg)
    assert metrics["steps"] == cfg.trainer.steps and (out / "heatmaps.png").exists()
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert [e.step for e in events.Tensors("heatmap/figure_initial")] == [0]
    assert [e.step for e in events.Tensors("heatmap/figure")] == [cfg.trainer.steps]
    assert not any(tag in tags for tag in ("heatmap/input", "heatmap/target", "heatmap/current"))


def test_single_task_on_npz_images_with_a_pattern(composed, shapes_npz):
    cfg, out = composed("data=npz", f"data.path={shapes_npz}", "model=cnn", "target=pattern", "target.pattern=frame", "target.label=1")
    parts = build_parts(cfg)
    assert isinstance(explainer_for(parts.student, cfg), ChannelSumLRP)
    run(cfg)
    assert (out / "metrics.json").exists()


@pytest.mark.slow
def test_resnet50_with_a_weights_file_trains_a_few_steps_at_32x32(tmp_path):
    """README: ``model=resnet50 model.weights=<file>.weights.h5``: those weights are the reference.

    The reference comes from the file rather than from training: fitting a ResNet50 reference
    was about half of this run (measured: 158 of ~330 s on the loaded 2-core machine), and the
    reference recipe's training is the same code for every architecture (tests/test_models.py).
    """
    path = write_npz(str(tmp_path / "tiny.npz"), train=24, test=12)
    weights = str(tmp_path / "resnet50_mine.weights.h5")
    build_application("resnet50", (32, 32, 3), len(CLASSES)).save_weights(weights)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        train_command(tmp_path / "run", tmp_path / "cache", "data=npz", f"data.path={path}", "model=resnet50",
                      f"model.weights={weights}", "target=pattern", "target.pattern=frame", "target.label=1",
                      "trainer.steps=2"),
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training the reference" not in done.stdout + done.stderr  # the file is the reference
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_mobilenetv2_trains_its_reference_and_a_few_steps_at_32x32(tmp_path):
    """An application's reference fitted through the command line (the ResNet50 test reads its from a file).

    A fresh MobileNetV2 at 32x32 in inference mode, with its BatchNorm statistics still at their
    initial 0 and 1, has penultimate features of at most 3e-12 (measured): every gradient is 0
    in float32 and the doctor stops the run. The reference's statistics are the training images'
    own (heatinv.precise_batch_norm), so the run starts from the reference.
    """
    path = write_npz(str(tmp_path / "tiny.npz"), train=24, test=12)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        train_command(tmp_path / "run", tmp_path / "cache", "data=npz", f"data.path={path}", "model=mobilenetv2",
                      "init=reference", "target=pattern", "target.pattern=frame", "target.label=1", "trainer.steps=2"),
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training the reference mobilenetv2" in done.stdout + done.stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["steps"] == 2
