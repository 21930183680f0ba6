"""``ArrayBackend``: what the CuPy adapter's classes need of a framework, in one object.

Its array module, lscore's kernels over its arrays (``lscore.cuda.ArrayKernels``),
the current device, where an array lives and whether a CUDA graph is being
captured; and ``all_finite`` / ``unscale_`` / ``unscale_and_norm`` /
``unscale_and_clip_`` over nested device arrays, refused while a graph is being
captured.  ``lscore.adapters.cupy`` makes one with cupy's; the tests and
``lscore bench --suite gpu-host`` make others (``lscore.adapters.device.bind``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from lscore.cuda.arrays import ArrayKernels
from lscore.cuda.optim import FusedLauncher


def refuse_in_capture(capturing: bool, what: str, instead: str) -> None:
    """RuntimeError instead of an operation that would break a CUDA stream capture."""
    if capturing:
        raise RuntimeError(
            f"{what} while the current stream is capturing a CUDA graph "
            f"would break the capture; {instead}"
        )


def _device_zero() -> int:
    return 0


def anywhere(a: Any, device: int) -> bool:
    return True


def _never() -> bool:
    return False


@dataclasses.dataclass(frozen=True, eq=False)
class ArrayBackend:
    """What the device-array classes need of a framework, in one object.

    `xp` is the array module, `kernels` lscore's kernels over its arrays (an
    ``ArrayKernels``), `current_device()` the device now current,
    `on_device(a, device)` whether array `a` lives on `device`, and
    `capturing()` whether the current stream is capturing a CUDA graph.  The
    four reading calls below refuse (RuntimeError) while capturing: they read
    a flag or a norm back, which would break the capture.
    """

    xp: Any
    kernels: ArrayKernels
    current_device: Callable[[], int] = _device_zero
    on_device: Callable[[Any, int], bool] = anywhere
    capturing: Callable[[], bool] = _never
    _launchers: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

    def refuse_in_capture(self, what: str, instead: str) -> None:
        refuse_in_capture(self.capturing(), what, instead)

    def fused_launcher(self, device: int) -> FusedLauncher:
        """The fused kernels' launcher of `device` (on that device's ``MultiTensor``)."""
        runner = self.kernels.device(device)
        hit = self._launchers.get(device)
        if hit is None or hit.runner is not runner:
            hit = self._launchers[device] = FusedLauncher(runner)
        return hit

    def all_finite(self, arrays: Any) -> bool:
        self.refuse_in_capture(
            "all_finite (it reads a flag back)",
            "check inside a capture with LossScaleOptimizer(sync_free=True)",
        )
        return self.kernels.all_finite(arrays)

    def unscale_(self, arrays: Any, inv_scale: float) -> bool:
        self.refuse_in_capture(
            "unscale_ (it reads a flag back)",
            "unscale inside a capture with LossScaleOptimizer(sync_free=True)",
        )
        return self.kernels.unscale_(arrays, inv_scale)

    def unscale_and_norm(
        self, arrays: Any, inv_scale: float, norm_type: Any = 2.0
    ) -> tuple[bool, float]:
        self.refuse_in_capture(
            "unscale_and_norm (it reads the norm back)", "take the norm outside the captured step"
        )
        return self.kernels.unscale_and_norm(arrays, inv_scale, norm_type)

    def unscale_and_clip_(
        self, arrays: Any, inv_scale: float, max_norm: float, norm_type: Any = 2.0
    ) -> tuple[bool, float]:
        self.refuse_in_capture(
            "unscale_and_clip_ (it reads the norm back)", "clip outside the captured step"
        )
        return self.kernels.unscale_and_clip_(arrays, inv_scale, max_norm, norm_type)

    all_finite.__doc__ = ArrayKernels.all_finite.__doc__
    unscale_.__doc__ = ArrayKernels.unscale_.__doc__
    unscale_and_norm.__doc__ = ArrayKernels.unscale_and_norm.__doc__
    unscale_and_clip_.__doc__ = ArrayKernels.unscale_and_clip_.__doc__


ONE_STEP = (
    "run one eager step with these very arrays before begin_capture(), so that "
    "everything is planned and allocated"
)
