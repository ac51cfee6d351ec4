"""The summaries' own encodings, checked against TensorBoard's and TensorFlow's implementations.

:class:`heatinv.summaries.Summaries` builds its records from numpy instead of calling
``tf.summary``; these tests compare what it writes with what TensorBoard's histogram
implementation computes and what TensorFlow's PNG decoder reads, and read a whole event
file back through TensorBoard's ``EventAccumulator``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.plugins.histogram.summary_v2 import histogram_pb
from tensorboard.util import tensor_util

from heatinv.summaries import Summaries, histogram_buckets, image_tensor, scalar_tensor


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
