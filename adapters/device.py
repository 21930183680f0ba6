"""The CuPy adapter's classes bound to any array module and kernel backend.

``lscore.adapters.cupy`` subclasses ``_device``'s and ``_device_wrapper``'s
classes with cupy's ``ArrayBackend`` (``_backend``) once, at module level.
``bind`` makes the same classes for another array module and
``lscore.cuda.ArrayKernels``: the tests bind NumPy and the CPU host harness (the
adapter's logic, kernels included, without a GPU), and ``lscore bench --suite
gpu-host`` binds NumPy and a backend whose launches do nothing (the host's cost of
a step).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from lscore.adapters import _device, _device_wrapper
from lscore.adapters._backend import ArrayBackend
from lscore.cuda.arrays import ArrayKernels

__all__ = ["bind"]


def bind(
    xp: Any,
    kernels: ArrayKernels,
    *,
    capturing: Callable[[], bool] = ArrayBackend.capturing,
    current_device: Callable[[], int] = ArrayBackend.current_device,
    on_device: Callable[[Any, int], bool] = ArrayBackend.on_device,
) -> types.SimpleNamespace:
    """``all_finite``, ``unscale_``, ``unscale_and_norm``, ``unscale_and_clip_``, ``SGD``,
    ``Adam`` and ``LossScaleOptimizer`` on `xp`'s arrays through `kernels`.

    `capturing()` says whether a CUDA graph is being captured (the calls that would
    break one refuse), `current_device()` which device is current (default: always
    0) and `on_device(a, device)` whether array `a` lives on `device` (default: yes).
    """
    backend = ArrayBackend(
        xp, kernels, current_device=current_device, on_device=on_device, capturing=capturing
    )

    def bound(cls: type, **attrs: Any) -> type:
        return type(cls.__name__, (cls,), {"_backend": backend, "__module__": __name__, **attrs})

    sgd, adam = bound(_device.SGD), bound(_device.Adam)
    lso = bound(_device_wrapper.LossScaleOptimizer, _optimizer_classes={"SGD": sgd, "Adam": adam})
    return types.SimpleNamespace(
        backend=backend,
        all_finite=backend.all_finite,
        unscale_=backend.unscale_,
        unscale_and_norm=backend.unscale_and_norm,
        unscale_and_clip_=backend.unscale_and_clip_,
        SGD=sgd,
        Adam=adam,
        LossScaleOptimizer=lso,
    )
