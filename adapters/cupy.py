"""CuPy adapter: LossScaleOptimizer, SGD, Adam, all_finite and unscale_ on CuPy arrays.

The same names as ``lscore.adapters.numpy``, for arrays on a CUDA device.
``all_finite``, ``unscale_`` and the one-pass ``unscale_and_norm`` /
``unscale_and_clip_`` (the gradient norm gathered while unscaling, then
torch's clip) run lscore's multi-tensor kernels
(_ext/scan.cu, compiled once per device by NVRTC, see lscore/cuda/):
one launch per dtype covers a whole list of arrays, float16, bfloat16,
float32 and float64, with the CPU core's arithmetic.  The walk over the
arrays is compiled and its plan cached: a training loop that passes the
same arrays every step pays the walk once, and a call is then its launches
on CuPy's current stream (no uploads, no extra kernels) plus one read of
the flag through pinned memory (one host sync per device).

``SGD`` and ``Adam`` update dense float32 variables from float16, bfloat16
or float32 gradients through the fused kernels (_ext/optim.cu): one launch
per gradient dtype reads each gradient once and updates the variable and
its slots, bit for bit as lscore.adapters.numpy; the records and launch
tables are planned once per list of arrays.  Other variable dtypes, and
clipped steps, take the elementwise path (CuPy array expressions).

``LossScaleOptimizer`` has two modes:

- default: the NumPy adapter's behaviour; the check runs on the GPU and the
  step decision is made on the host after one sync per step (as torch's
  GradScaler.step does), then the same fused kernels update;
- ``sync_free=True`` (Keras shape, with this module's SGD or Adam): the scale
  and its counters, and Adam's step counter, live on the device and are
  advanced there (the scale by the CPU core's own state machine,
  _ext/update.cu); the fused kernels read this step's found flag and leave
  variables and slots untouched on overflow (no copies).  Nothing is copied
  to the host unless you read ``loss_scale``, ``dynamic_counter`` or call
  ``sync_state()``.  After one eager step such a step can be captured in a
  CUDA graph (``stream.begin_capture()`` / ``end_capture()``) and replayed;
  see the README's CuPy section.  While the current stream is capturing,
  calls that would synchronise or upload raise RuntimeError.

Example::

    import cupy as cp
    from lscore.adapters.cupy import LossScaleOptimizer, SGD

    w = cp.ones(3, cp.float32)
    opt = LossScaleOptimizer(SGD(learning_rate=0.1), sync_free=True)
    def loss_and_grads(scale):               # your backward pass, seeded with scale
        return (w * w).sum(), [2 * w * scale]
    opt.minimize(loss_and_grads, [w])

Arrays must be dense (C- or F-contiguous); integer and bool arrays count
as finite and are never written.
"""

from __future__ import annotations

from typing import ClassVar

import cupy

from lscore import cuda
from lscore.adapters import _arrays, _device, _optim
from lscore.loss_scale import DynamicLossScale, FixedLossScale, LossScale, get
from lscore.managers import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    LossScaleManager,
)

__all__ = [
    "SGD",
    "Adam",
    "DynamicLossScale",
    "ExponentialUpdateLossScaleManager",
    "FixedLossScale",
    "FixedLossScaleManager",
    "LossScale",
    "LossScaleManager",
    "LossScaleOptimizer",
    "all_finite",
    "get",
    "unscale_",
    "unscale_and_clip_",
    "unscale_and_norm",
]

_KERNELS = _device.ArrayKernels(cupy, cuda.CupyBackend, array_type=cupy.ndarray)


def _capturing() -> bool:
    return cupy.cuda.get_current_stream().is_capturing()


all_finite, unscale_, unscale_and_norm, unscale_and_clip_ = _device.reading_calls(
    _KERNELS, _capturing
)


class _Bound:
    _xp = cupy
    _kernels = _KERNELS
    _current_device = staticmethod(lambda: cupy.cuda.Device().id)
    _on_device = staticmethod(lambda a, dev: a.device.id == dev)
    _capturing = staticmethod(_capturing)


class SGD(_Bound, _device.GatedSGD, _arrays.SGD):
    __doc__ = f"{_arrays.SGD.__doc__}\n{_device.Gated.__doc__}"


class Adam(_Bound, _device.GatedAdam, _arrays.Adam):
    __doc__ = f"{_arrays.Adam.__doc__}\n{_device.Gated.__doc__}\n{_device.GatedAdam.__doc__}"


class LossScaleOptimizer(_Bound, _device.DeviceLossScaleOptimizer):
    __doc__ = f"{_device.DeviceLossScaleOptimizer.__doc__}\n{_optim.LossScaleOptimizerBase.__doc__}"
    _all_finite = staticmethod(all_finite)
    _optimizer_classes: ClassVar[dict[str, type]] = {"SGD": SGD, "Adam": Adam}
