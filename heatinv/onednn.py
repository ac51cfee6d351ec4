"""Whether TensorFlow runs oneDNN's CPU kernels: which form of a computation is faster depends on it."""

from __future__ import annotations


def onednn_enabled() -> bool | None:
    """Whether this TensorFlow runs oneDNN's CPU kernels; None where it cannot tell.

    TensorFlow turns them on by default only on CPUs with AVX-512's neural-network
    instructions (the Intel Xeon of earlier runs, an AMD EPYC with AVX-512), off elsewhere (an AMD EPYC without);
    ``TF_ENABLE_ONEDNN_OPTS=1`` / ``0`` set them before TensorFlow is imported. TensorFlow
    has no public way to ask, so this reads the flag its own tests read.

    Examples:
        >>> onednn_enabled() in (True, False, None)
        True
    """
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None
