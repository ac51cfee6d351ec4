"""TensorFlow's start-up notices are dropped from the console; any other line is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from heatinv.startup import KNOWN_NOTICES

PROGRAM = "import tensorflow as tf; tf.constant(1.0); print('ok')"
QUIET = "from heatinv.startup import start_tensorflow; start_tensorflow(); " + PROGRAM


def _stderr(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    return done.stderr


@pytest.mark.slow
def test_start_up_notices_are_dropped():
    noisy = _stderr(PROGRAM)
    if not any(KNOWN_NOTICES.search(line) for line in noisy.splitlines()):
        pytest.skip("this TensorFlow build prints no start-up notices here, so there is nothing to drop")
    assert _stderr(QUIET).strip() == ""


@pytest.mark.slow
def test_importing_heatinv_leaves_the_devices_to_the_program():
    """Importing heatinv.config created TensorFlow's devices, so a program could no longer set them up."""
    _stderr(
        "import heatinv.config, tensorflow as tf; cpu = tf.config.list_physical_devices('CPU')[0]; "
        "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2); "
        "assert len(tf.config.list_logical_devices('CPU')) == 2; print('ok')"
    )


@pytest.mark.parametrize(
    "line",
    [
        "W0000 00:00:1796070531.7 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.",
        "E0000 00:00:1796070540.3 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
        "I0000 00:00:1796070531.7 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    ],
)
def test_known_notices(line):
    assert KNOWN_NOTICES.search(line)


@pytest.mark.parametrize(
    "line",
    [
        "E0000 00:00:1796070540.3 op_kernel.cc:1830] OP_REQUIRES failed at conv_ops.cc: RESOURCE_EXHAUSTED: OOM",
        "Traceback (most recent call last):",
        "W tensorflow/core/framework/op_kernel.cc: Invalid argument: Nan in summary histogram",
    ],
)
def test_other_lines_are_kept(line):
    assert not KNOWN_NOTICES.search(line)


def test_dropping_known_notices_forwards_every_other_line_at_once(capfd):
    """A C++-level write of the determinism notice is dropped; other fd-2 lines pass, in order, before the block ends."""
    from heatinv.startup import dropping_known_notices

    notice = (
        b"E0000 00:00:1796086429.934292 8924 node_def_util.cc:682] NodeDef mentions attribute "
        b"use_unbounded_threadpool which is not in the op definition: Op<name=MapDataset>\n"
    )
    with dropping_known_notices():
        os.write(2, b"first\n")
        os.write(2, notice)
        os.write(2, b"second\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err.splitlines() == ["first", "second", "after"]


def test_training_the_reference_writes_no_determinism_notice(capfd):
    """The reference trains under op determinism; TensorFlow's rewrite of Keras's pipeline logs one E0000 line."""
    from heatinv.data import load_dataset
    from heatinv.models import Architecture, train_reference

    train_reference(Architecture("mlp", hidden=(8,)), load_dataset("digits"), 1)
    assert "use_unbounded_threadpool" not in capfd.readouterr().err
