"""lscore.adapters.cupy's classes bound to NumPy and the host harness.

The same binding lscore.adapters.cupy makes to cupy and lscore.cuda.CupyBackend,
with ``numpy`` standing in for cupy and ``CountingBackend`` (a HostBackend that
counts device-to-host reads) for the GPU: the CuPy adapter's logic runs
without a GPU.  Nothing is compiled until a kernel first runs.
"""
import numpy as np

from lscore import kernels
from lscore.adapters import _arrays, _device

from . import HostBackend


class CountingBackend(HostBackend):
    """Counts device-to-host reads (each one is a host sync on a GPU) and uploads."""

    syncs = 0
    uploads = 0

    def get(self, a):
        CountingBackend.syncs += 1
        return super().get(a)

    def to_device(self, host):
        CountingBackend.uploads += 1
        return super().to_device(host)


KERNELS = _device.ArrayKernels(np, lambda dev: CountingBackend(), kind=kernels.READ_NUMPY)
all_finite = KERNELS.all_finite
unscale_ = KERNELS.unscale_
unscale_and_norm = KERNELS.unscale_and_norm
unscale_and_clip_ = KERNELS.unscale_and_clip_


class SGD(_device.Gated, _arrays.SGD):
    _xp = np


class Adam(_device.Gated, _arrays.Adam):
    _xp = np


class LossScaleOptimizer(_device.DeviceLossScaleOptimizer):
    _xp = np
    _kernels = KERNELS
    _all_finite = staticmethod(KERNELS.all_finite)
    _optimizer_classes = {"SGD": SGD, "Adam": Adam}
