"""The summaries' own encodings, checked against TensorBoard's and TensorFlow's implementations.

:class:`heatinv.summaries.Summaries` builds its records from numpy instead of calling
``tf.summary``; these tests compare what it writes with what TensorBoard's histogram
implementation computes and what TensorFlow's PNG decoder reads, and read a whole event
file back through TensorBoard's ``EventAccumulator``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.plugins.histogram.summary_v2 import histogram_pb
from tensorboard.util import tensor_util

from conftest import dense_model
from heatinv.models import variable_tag
from heatinv.summaries import Summaries, compared_hparams, histogram_buckets, image_tensor, scalar_tensor, trial_name


@pytest.mark.parametrize("size", [1, 7, 1000])
def test_histogram_buckets_match_tensorboards_own_histogram(size):
    data = np.random.default_rng(size).normal(size=size)
    expected = tensor_util.make_ndarray(histogram_pb("h", data).value[0].tensor)
    np.testing.assert_allclose(histogram_buckets(data), expected, rtol=1e-12, atol=1e-12)


def test_histogram_buckets_of_constant_and_nonfinite_values():
    constant = histogram_buckets(np.full(5, 2.5))
    expected = tensor_util.make_ndarray(histogram_pb("h", np.full(5, 2.5)).value[0].tensor)
    np.testing.assert_array_equal(constant, expected)  # all in the last bucket, as TensorBoard does
    mixed = histogram_buckets(np.array([0.0, 1.0, np.nan, np.inf, -np.inf]), buckets=2)
    assert mixed[:, 2].tolist() == [1.0, 1.0]  # only the finite values are counted
    assert histogram_buckets(np.array([np.nan]), buckets=3).tolist() == [[0.0, 0.0, 0.0]] * 3


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # np.float32(1e300) is inf, as it should be
@pytest.mark.parametrize("value", [0.0, -0.0, 0.1, -3.5e38, 1e-40, 1e300, np.nan, np.inf, -np.inf, np.float32(0.7), 3])
def test_scalar_tensor_is_what_tensorboard_and_tensorflow_write(value):
    """Byte for byte the message of TensorBoard's ``make_tensor_proto`` and TensorFlow's, float32 rounding included."""
    ours = scalar_tensor(value).SerializeToString()
    assert ours == tensor_util.make_tensor_proto(np.float32(value)).SerializeToString()
    assert ours == tf.make_tensor_proto(np.float32(value)).SerializeToString()


def test_image_tensor_is_width_height_and_a_png_of_the_pixels():
    rgb = np.random.default_rng(0).integers(0, 256, size=(5, 9, 3), dtype=np.uint8)
    width, height, png = image_tensor(rgb)
    assert (int(width), int(height)) == (9, 5)
    np.testing.assert_array_equal(tf.io.decode_png(png).numpy(), rgb)


def test_event_file_reads_back_with_plugins_and_steps(tmp_path):
    with Summaries(str(tmp_path), axis="step") as summaries:
        summaries.match(3, {"loss": 0.5, "cosine": 0.25})
        summaries.match(6, {"loss": 0.25, "cosine": 0.75})
        summaries.text("note", "a\nb")
        summaries.hparams({"loss.name": "l1"}, {"cosine": 0.75, "objective": 0.25}, trial_id="run")
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    series = [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors("1_match_per_step/one_minus_cosine")]
    assert series == [(3, 0.75), (6, 0.25)]
    assert events.SummaryMetadata("1_match_per_step/loss").plugin_data.plugin_name == "scalars"
    assert events.SummaryMetadata("note").plugin_data.plugin_name == "text"
    assert tf.make_ndarray(events.Tensors("note")[0].tensor_proto).item() == b"a\nb"
    assert [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors("final/cosine")] == [0.75]
    assert set(events.PluginTagToContent("hparams")) == {"_hparams_/session_start_info", "_hparams_/experiment"}


def test_a_resumed_run_replaces_what_was_logged_after_its_checkpoint(tmp_path):
    """The first process logged steps 10-40 and saved a checkpoint at 20; the resumed one redoes 30 and 40."""
    with Summaries(str(tmp_path), axis="step") as first:
        first.start_session(0)
        for step in (10, 20, 30, 40):
            first.match(step, {"loss": 1.0, "cosine": step / 100})
    with Summaries(str(tmp_path), axis="step") as resumed:
        resumed.start_session(21)
        for step in (30, 40, 50):
            resumed.match(step, {"loss": 1.0, "cosine": step / 100 + 0.5})
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0}).Reload()
    series = [(e.step, round(float(tf.make_ndarray(e.tensor_proto)), 6)) for e in events.Tensors("1_match_per_step/cosine")]
    assert series == [(10, 0.1), (20, 0.2), (30, 0.8), (40, 0.9), (50, 1.0)]


def _read(logdir) -> EventAccumulator:
    return EventAccumulator(str(logdir), size_guidance={"tensors": 0}).Reload()


def _values(events, tag) -> list[tuple[int, float]]:
    return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]


def _pixels(events, tag) -> np.ndarray:
    width, height, png = tf.make_ndarray(events.Tensors(tag)[0].tensor_proto)
    with Image.open(io.BytesIO(png)) as image:
        assert image.size == (int(width), int(height))
        return np.asarray(image.convert("RGB")).astype(int)


def test_health_puts_each_variables_norm_and_zero_fraction_under_its_own_tag(tmp_path):
    variables = dense_model().trainable_variables
    names = [variable_tag(v) for v in variables]
    norms, zeros = [1.0 + k for k in range(6)], [k / 8 for k in range(6)]
    with Summaries(str(tmp_path), axis="step") as summaries:
        summaries.health(5, 2, variables, norms, zeros)
    events = _read(tmp_path)
    assert _values(events, "3_health_per_step/nonfinite_steps") == [(5, 2.0)]
    for name, norm, zero in zip(names, norms, zeros):
        assert _values(events, f"4_grad_norm_per_step/{name}") == [(5, norm)]
        assert _values(events, f"3_health_per_step/zero_grad_fraction/{name}") == [(5, zero)]


def test_gradient_histograms_are_of_each_variables_own_gradient(tmp_path):
    variables = dense_model().trainable_variables
    rng = np.random.default_rng(0)
    # Far-apart ranges: a histogram of the weights, or of another variable's gradient, has other edges.
    gradients = [rng.normal(size=v.shape) + 100.0 * (k + 1) for k, v in enumerate(variables)]
    with Summaries(str(tmp_path)) as summaries:
        summaries.histograms(3, variables, gradients)
    events = _read(tmp_path)
    for variable, gradient in zip(variables, gradients):
        for prefix, values in (("weights", variable.numpy()), ("gradients", gradient)):
            (event,) = events.Tensors(f"{prefix}/{variable_tag(variable)}")
            buckets = tf.make_ndarray(event.tensor_proto)
            assert event.step == 3 and buckets.shape == (30, 3)
            assert (buckets[0, 0], buckets[-1, 1]) == (float(values.min()), float(values.max()))
            assert buckets[:, 2].sum() == values.size


def test_heatmap_tiles_share_the_targets_scale_red_positive(tmp_path):
    target = np.zeros((4, 5))
    target[0, 0], target[0, 1] = 2.0, -1.0
    with Summaries(str(tmp_path)) as summaries:
        summaries.heatmaps_once(np.zeros((4, 5)), target, 0.5 * target)
        summaries.current_heatmap(7, target, 0.5 * target)
    events = _read(tmp_path)
    # On [-2, 2]: +2 is pure red, -1 half blue; half the target is half as saturated, not its own full red.
    expected = [[255, 0, 0], [128, 128, 255], [255, 255, 255]]
    np.testing.assert_allclose(_pixels(events, "heatmap/target")[0, :3], expected, atol=1)
    for tag in ("heatmap/initial", "heatmap/current"):
        np.testing.assert_allclose(_pixels(events, tag)[0, :2], [[255, 128, 128], [191, 191, 255]], atol=1)
    assert [e.step for e in events.Tensors("heatmap/current")] == [7]


def test_an_all_zero_target_is_drawn_white_and_the_initial_map_on_its_own_scale(tmp_path):
    initial = np.zeros((3, 3))
    initial[1, 1] = -0.25
    with Summaries(str(tmp_path)) as summaries:
        summaries.heatmaps_once(np.zeros((3, 3)), np.zeros((3, 3)), initial)
    events = _read(tmp_path)
    assert (_pixels(events, "heatmap/target") == 255).all()
    assert _pixels(events, "heatmap/initial")[1, 1].tolist() == [0, 0, 255]


def test_preformatted_text_is_one_code_block_at_its_step(tmp_path):
    with Summaries(str(tmp_path)) as summaries:
        summaries.preformatted("diagnosis", "\nno finding\n  layer   share\n\n", step=7)
    (event,) = _read(tmp_path).Tensors("diagnosis")
    assert event.step == 7
    assert tf.make_ndarray(event.tensor_proto).item().decode() == "```\nno finding\n  layer   share\n```"


def test_flush_puts_what_was_written_on_disk_and_leaving_closes_the_file(tmp_path):
    """A checkpoint follows a flush: the events before it must be readable even if the process dies next."""
    with Summaries(str(tmp_path)) as summaries:
        summaries.match(4, {"loss": 0.5})
        summaries.flush()
        (path,) = tmp_path.glob("events.out.tfevents.*")
        tags = [value.tag for event in tf.compat.v1.train.summary_iterator(str(path)) for value in event.summary.value]
        assert tags == ["1_match_per_step/loss"]
    with pytest.raises(OSError, match="closed"):
        summaries.match(5, {"loss": 0.25})


@pytest.mark.parametrize(
    "out, expected",
    [
        ("outputs/multirun/2026-12-04/22-24-44/0_loss=l1", "0_loss=l1 (multirun/2026-12-04/22-24-44)"),
        ("outputs/run-a", "run-a"),  # directly under the root: no empty "()"
        ("/elsewhere/run-b/", "run-b"),  # outside the root: the folder alone
    ],
)
def test_trial_name_is_the_folder_then_where_it_lies_under_the_root(out, expected):
    assert trial_name(out, "outputs") == expected


def test_hparams_row_strips_override_syntax_and_leaves_out_how_a_job_starts():
    flat = {"loss.name": "huber", "loss.delta": 0.2, "loss.delta_max": 1.0, "lrp.gamma": 0.5, "lrp.epsilon": 1e-6,
            "model.name": "mlp", "init.kind": None, "trainer.resume": True, "data.name": "mnist"}
    overrides = ["+loss.delta=0.2", "++lrp.gamma=0.5", "data@data=mnist", "trainer.resume=true"]
    row = compared_hparams(flat, overrides)
    # "loss.delta" is one key, not the start of "loss.delta_max"; None is a string HParams can show.
    assert row == {"loss.name": "huber", "loss.delta": 0.2, "lrp.gamma": 0.5, "model.name": "mlp", "init.kind": "none",
                   "data.name": "mnist"}


def test_trial_name_keeps_where_a_run_lies_under_a_dot_named_folder():
    """Only "." and ".." mean outside the root: a folder named ".sweeps" is inside it."""
    assert trial_name("outputs/.sweeps/2026-12-04/0_loss=l1", "outputs") == "0_loss=l1 (.sweeps/2026-12-04)"


def test_two_attention_layers_get_a_tag_each():
    """Their sublayers' variables end alike (``query/kernel``): each keeps its own curve, under its whole path."""
    from heatinv.models import variable_tags
    from heatinv.transformers import text_classifier

    variables = text_classifier(6, 20, 2, dim=8, depth=2, heads=2).trainable_variables
    tags = variable_tags(variables)
    assert len(set(tags)) == len(tags) and "block1_attention/query/kernel" in tags and "embedding/embeddings" in tags
