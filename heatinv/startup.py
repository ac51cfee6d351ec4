"""Start TensorFlow without the start-up lines that alarm a user on a CPU machine.

TensorFlow's C++ runtime writes to the process's stderr before its logging is set up, so
``TF_CPP_MIN_LOG_LEVEL`` cannot hide those lines: on a CPU-only machine a CUDA build prints
"Could not find cuda drivers", a oneDNN notice, a CPU-instructions notice and an error line
``failed call to cuInit ... (303)``, none of which is a problem. :func:`start_tensorflow`
imports TensorFlow and creates its devices with file descriptor 2 pointed at a temporary
file, then writes back every captured line that is not one of those known notices, so an
unexpected message is still shown.

Only the command-line entry points call it, before anything imports TensorFlow, and
:mod:`heatinv.config` (the first heatinv module a joblib sweep's worker imports) for the
import alone, leaving the devices to the entry point. Later, the
same known notices are dropped around the one call that writes one (:func:`dropping_known_notices`
around the reference's ``fit``).

Examples:
    >>> from heatinv.startup import start_tensorflow
    >>> start_tensorflow()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading

from heatinv.cluster import asks_for_multi_worker

KNOWN_NOTICES = re.compile(
    "|".join(
        (
            r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
            r"cudart_stub\.cc.*Could not find cuda drivers",
            r"oneDNN custom operations are on",
            r"cpu_feature_guard\.cc",
            r"^To enable the following instructions",
            r"failed call to cuInit",
            r"Unable to register cu(DNN|FFT|BLAS) factory",
            r"computation_placer\.cc.*already registered",
            # Op determinism rewrites the parallel map of the pipeline Keras builds for fit()
            # into a plain map that lacks this attribute; TensorFlow ignores it, as it says.
            r"NodeDef mentions attribute use_unbounded_threadpool",
        )
    )
)
"""Start-up lines of a CUDA build of TensorFlow on a machine without a GPU, and harmless runtime notices."""


_started = {"import": False, "devices": False}
"""What :func:`start_tensorflow` has done in this process: TensorFlow imported, its devices created."""


def start_tensorflow(devices: bool = True) -> None:
    """Import TensorFlow and initialise its devices, dropping only :data:`KNOWN_NOTICES`.

    Sets ``TF_CPP_MIN_LOG_LEVEL=2`` (unless the user set it) so that later informational
    lines stay quiet too. Calling it again does nothing new; TensorFlow imported by anything
    else is left as it is.

    Args:
        devices: also create the devices (the entry points). Without, only the import is quiet,
            so a program importing a heatinv module can still configure its devices.
    """
    if asks_for_multi_worker(sys.argv):
        devices = False  # a multi-worker job's devices start with its strategy (heatinv.cluster)
    imported_elsewhere = "tensorflow" in sys.modules and not _started["import"]
    if imported_elsewhere or _started["devices"] or (_started["import"] and not devices):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no usable stderr (a detached daemon): nothing to keep quiet
        import tensorflow  # noqa: F401

        _started["import"] = True
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            _started["import"] = True
            if devices:
                tf.config.list_physical_devices()
                tf.constant(0.0)  # creates the eager context: the cuInit line is written here
                _started["devices"] = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        kept = [line for line in captured.read().decode(errors="replace").splitlines() if line.strip() and not KNOWN_NOTICES.search(line)]
    if kept:
        print("\n".join(kept), file=sys.stderr, flush=True)


@contextlib.contextmanager
def dropping_known_notices():
    """Within the block, lines written to file descriptor 2 pass on at once unless they are :data:`KNOWN_NOTICES`.

    TensorFlow's C++ runtime logs at graph-rewrite time, past Python's logging; a thread
    forwards every other line (progress, warnings, errors) to the real stderr as it comes.

    Examples:
        >>> with dropping_known_notices():  # doctest: +SKIP
        ...     model.fit(x, y)
    """
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no usable stderr: nothing to keep quiet
        yield
        return
    read_end, write_end = os.pipe()

    def forward() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not KNOWN_NOTICES.search(line.decode(errors="replace")):
                    try:
                        os.write(saved, line)
                    except OSError:  # stderr gone: keep draining, or the writers would block on a full pipe
                        pass

    forwarder = threading.Thread(target=forward, name="heatinv-stderr", daemon=True)
    forwarder.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the forwarder reads to its end and stops
        forwarder.join()
        os.close(saved)
