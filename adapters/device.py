"""The CuPy adapter's optimizer classes for any array module and kernel backend.

``lscore.adapters.cupy`` binds ``_device``'s classes to ``cupy`` and its
``ArrayKernels`` once, at module level.  ``bind`` makes the same binding for
another array module and ``lscore.cuda.ArrayKernels``: the tests bind NumPy
and the CPU host harness (the adapter's logic, kernels included, without a
GPU), and ``lscore bench --suite gpu-host`` binds NumPy and a backend whose
launches do nothing (the host's cost of a step).
"""
from __future__ import annotations

import types

from lscore.adapters import _arrays, _device

__all__ = ["bind"]


def bind(xp, kernels, *, capturing=lambda: False) -> types.SimpleNamespace:
    """``all_finite``, ``unscale_``, ``SGD``, ``Adam`` and ``LossScaleOptimizer`` on `xp`'s
    arrays through `kernels` (an ``ArrayKernels``), device 0 being current; `capturing()`
    says whether a CUDA graph is being captured (the calls that would break one refuse)."""
    def all_finite(arrays) -> bool:
        _device.refuse_in_capture(capturing(), "all_finite (it reads a flag back)",
                                  "check inside a capture with LossScaleOptimizer(sync_free=True)")
        return kernels.all_finite(arrays)

    def unscale_(arrays, inv_scale) -> bool:
        _device.refuse_in_capture(capturing(), "unscale_ (it reads a flag back)",
                                  "unscale inside a capture with "
                                  "LossScaleOptimizer(sync_free=True)")
        return kernels.unscale_(arrays, inv_scale)

    class Bound:
        _xp = xp
        _kernels = kernels
        _capturing = staticmethod(capturing)

    class SGD(Bound, _device.GatedSGD, _arrays.SGD):
        __doc__ = _arrays.SGD.__doc__

    class Adam(Bound, _device.GatedAdam, _arrays.Adam):
        __doc__ = _arrays.Adam.__doc__

    class LossScaleOptimizer(Bound, _device.DeviceLossScaleOptimizer):
        __doc__ = _device.DeviceLossScaleOptimizer.__doc__
        _all_finite = staticmethod(all_finite)
        _optimizer_classes = {"SGD": SGD, "Adam": Adam}

    return types.SimpleNamespace(all_finite=all_finite, unscale_=unscale_, SGD=SGD, Adam=Adam,
                                 LossScaleOptimizer=LossScaleOptimizer)
