"""TensorFlow's start-up notices are dropped from the console; any other line is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import types

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
        # shown when the user sets TF_CPP_MIN_LOG_LEVEL=0 (start_tensorflow keeps it)
        "I0000 00:00:1796557172.9 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.",
        "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.",
        # CUDA builds of TensorFlow 2.16 to 2.18
        "E0000 00:00:1796070531.7 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered",
        "E0000 00:00:1796070531.7 cuda_fft.cc:485] Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT when one has already been registered",
        "E0000 00:00:1796070531.7 cuda_blas.cc:1418] Unable to register cuBLAS factory: Attempting to register factory for plugin cuBLAS when one has already been registered",
        "W0000 00:00:1796070531.7 computation_placer.cc:177] computation placer already registered. Please check linkage and avoid linking the same target more than once.",
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


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_start_tensorflow_drops_the_known_notices_of_creating_devices_and_prints_the_rest(capfd, monkeypatch):
    """A stand-in TensorFlow (already imported, devices not created) writes a known notice, blank lines and an unknown line on fd 2."""
    from heatinv import startup

    calls = []

    def constant(value):
        calls.append("constant")
        os.write(2, b"E0000 00:00:1796070540.3 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n\n   \n")
        os.write(2, b"E0000 something unexpected\n")

    tensorflow = types.ModuleType("tensorflow")
    tensorflow.config = types.SimpleNamespace(list_physical_devices=lambda: calls.append("devices"))
    tensorflow.constant = constant
    monkeypatch.setitem(sys.modules, "tensorflow", tensorflow)
    monkeypatch.setattr(startup, "_started", {"import": True, "devices": False})
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    descriptors = _open_descriptors()
    startup.start_tensorflow()
    startup.start_tensorflow()  # the devices exist: nothing again
    assert calls == ["devices", "constant"]
    assert capfd.readouterr().err.splitlines() == ["E0000 something unexpected"]
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"  # the user's level is kept
    assert _open_descriptors() == descriptors


def test_dropping_known_notices_leaves_no_descriptor_open(capfd):
    from heatinv.startup import dropping_known_notices

    descriptors = _open_descriptors()
    with dropping_known_notices():
        os.write(2, b"kept\n")
    assert _open_descriptors() == descriptors
    assert capfd.readouterr().err == "kept\n"
