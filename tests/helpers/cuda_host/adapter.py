"""lscore.adapters.cupy's classes bound to NumPy and the host harness.

The same binding lscore.adapters.cupy makes to cupy and lscore.cuda.CupyBackend,
with ``numpy`` standing in for cupy and ``CountingBackend`` (a HostBackend that
counts device-to-host reads) for the GPU: the CuPy adapter's logic runs
without a GPU.  Nothing is compiled until a kernel first runs.
"""

import numpy as np

from lscore import kernels
from lscore.adapters import device
from lscore.cuda.arrays import ArrayKernels

from . import HostBackend


class CountingBackend(HostBackend):
    """Counts device-to-host reads (each one is a host sync on a GPU) and uploads.

    ``capturing`` pretends that the current stream is capturing a CUDA graph:
    the bound classes see it (their ``_capturing``), and a read or an upload
    then fails here as it would break a real capture.
    """

    syncs = 0
    uploads = 0
    capturing = False

    def get(self, a):
        if CountingBackend.capturing:
            raise AssertionError("a device-to-host read while capturing")
        CountingBackend.syncs += 1
        return super().get(a)

    def to_device(self, host):
        if CountingBackend.capturing:
            raise AssertionError("an upload while capturing")
        CountingBackend.uploads += 1
        return super().to_device(host)


def _capturing() -> bool:
    return CountingBackend.capturing


def bind(kernels):
    """(all_finite, unscale_, SGD, Adam, LossScaleOptimizer) bound to `kernels` (an
    ArrayKernels on the harness), as lscore.adapters.cupy binds them to its own."""
    b = device.bind(np, kernels, capturing=_capturing)
    return b.all_finite, b.unscale_, b.SGD, b.Adam, b.LossScaleOptimizer


KERNELS = ArrayKernels(np, lambda dev: CountingBackend(), kind=kernels.READ_NUMPY)
all_finite, unscale_, SGD, Adam, LossScaleOptimizer = bind(KERNELS)
unscale_and_norm = KERNELS.unscale_and_norm
unscale_and_clip_ = KERNELS.unscale_and_clip_
