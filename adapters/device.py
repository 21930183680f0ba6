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
from typing import Any, ClassVar

from lscore.adapters import _arrays, _device

__all__ = ["bind"]


def bind(xp: Any, kernels: Any, *, capturing: Any = lambda: False) -> types.SimpleNamespace:
    """``all_finite``, ``unscale_``, ``unscale_and_norm``, ``unscale_and_clip_``, ``SGD``,
    ``Adam`` and ``LossScaleOptimizer`` on `xp`'s arrays through `kernels` (an
    ``ArrayKernels``), device 0 being current; `capturing()` says whether a CUDA graph is
    being captured (the calls that would break one refuse)."""
    all_finite, unscale_, unscale_and_norm, unscale_and_clip_ = _device.reading_calls(
        kernels, capturing
    )

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
        _optimizer_classes: ClassVar[dict[str, type]] = {"SGD": SGD, "Adam": Adam}

    return types.SimpleNamespace(
        all_finite=all_finite,
        unscale_=unscale_,
        unscale_and_norm=unscale_and_norm,
        unscale_and_clip_=unscale_and_clip_,
        SGD=SGD,
        Adam=Adam,
        LossScaleOptimizer=LossScaleOptimizer,
    )
