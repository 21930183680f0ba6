"""The CuPy backend: lscore's kernels loaded once per device by CuPy and launched on CuPy's
(or a framework's) current stream through the CUDA driver."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from lscore.cuda import cache
from lscore.cuda.sources import FILE_OF

__all__ = ["CupyBackend", "device_missing", "module"]

_DEVICE_TO_HOST = 2  # cudaMemcpyDeviceToHost
_modules: dict = {}
_modules_lock = threading.Lock()


def device_missing() -> str | None:
    """Why lscore's kernels cannot run on a GPU here (no CuPy, or no device it can see), or
    None when they can."""
    try:
        import cupy
    except ImportError:
        return (
            "no CUDA device: CuPy is not installed "
            '(pip install ".[cuda12]", or ".[cuda13]" for a CUDA 13 driver, in the checkout '
            "of lscore)"
        )
    try:
        if not cupy.cuda.is_available():
            return "no CUDA device (CuPy sees none)"
    except Exception as e:  # a broken driver install reads as no device
        return f"no CUDA device ({e})"
    return None


def module(name: str, device: int) -> Any:
    """(cupy Module, lowered names) of ``_ext/<name>`` on `device`, loaded once per process.

    The image comes from ``kernel_image``: the disk cache, or NVRTC on a miss.  A cached
    image the driver refuses (a damaged file, PTX newer than the driver) is compiled again
    and its entry replaced; a freshly compiled one that fails raises.
    """
    key = (name, int(device))
    with _modules_lock:
        hit = _modules.get(key)
        if hit is None:
            import cupy
            from cupy.cuda import function

            with cupy.cuda.Device(device):
                image, lowered, cached = cache.kernel_image(name)
                mod = function.Module()
                try:
                    mod.load(image)
                except Exception:
                    if not cached:
                        raise
                    image, lowered, _ = cache.kernel_image(name, refresh=True)
                    mod = function.Module()
                    mod.load(image)
            hit = _modules[key] = (mod, lowered)
    return hit


class CupyBackend:
    """Launches on one CUDA device through CuPy, on CuPy's current stream of that device.

    The packed launch goes straight to ``cuLaunchKernel`` (CuPy's
    ``driver.launchKernel``) with the ``void*[]`` the launcher packed once,
    so a launch costs no argument marshalling; ``read_word`` copies one
    word into pinned host memory and synchronises that stream once.
    """

    def __init__(self, device: int | None = None):
        import cupy

        self.xp = cupy
        self._driver = cupy.cuda.driver
        self._runtime = cupy.cuda.runtime
        self.device = cupy.cuda.Device(device).id if device is not None else cupy.cuda.Device().id
        # 32 KB of kernel parameters (the scan kernels' lsc_meta_32k): a CUDA 12.1 driver and
        # sm_70 or newer, as torch's multi_tensor_apply requires
        cc = int(cupy.cuda.Device(self.device).compute_capability)
        self.large_kernel_params = self._runtime.driverGetVersion() >= 12010 and cc >= 70
        self._functions: list = []  # the Function objects behind the handles
        with cupy.cuda.Device(self.device):
            self._pinned = cupy.cuda.alloc_pinned_memory(8)
        self._word = np.ndarray((1,), np.uint32, buffer=self._pinned)

    def ptr(self, a: Any) -> int:
        return a.data.ptr

    def get(self, a: Any) -> np.ndarray:
        with self.xp.cuda.Device(self.device):
            return a.get()

    def to_device(self, host: np.ndarray) -> Any:
        """A device copy of `host`, complete on return (kernels on any stream may read it)."""
        with self.xp.cuda.Device(self.device):
            a = self.xp.asarray(host)
            self.xp.cuda.get_current_stream().synchronize()
            return a

    def function(self, name: str) -> int:
        """The CUfunction handle of kernel `name` on this device (the module loaded once)."""
        mod, lowered = module(FILE_OF[name], self.device)
        fn = mod.get_function(lowered[name])
        self._functions.append(fn)
        return fn.ptr

    def enter(self) -> int:
        """Make this device current (for the launches); returns the device to restore."""
        prev = self._runtime.getDevice()
        self._runtime.setDevice(self.device)  # also makes its primary context current
        return prev

    def leave(self, prev: int) -> None:
        if prev != self.device:
            self._runtime.setDevice(prev)

    def stream(self) -> int:
        """CuPy's current stream of this device (what the user's own kernels are ordered on)."""
        return self.xp.cuda.get_current_stream(self.device).ptr

    def launch_packed(
        self, fn: int, grid: int, block: int, params: int, widths: int, nparams: int, stream: int
    ) -> None:
        self._driver.launchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, 0)

    def read_word(self, a: Any) -> int:
        """The first uint32 of device array `a`, after this device's current stream (one sync)."""
        prev = self.enter()
        try:
            s = self.stream()
            self._runtime.memcpyAsync(self._word.ctypes.data, a.data.ptr, 4, _DEVICE_TO_HOST, s)
            self._runtime.streamSynchronize(s)
        finally:
            self.leave(prev)
        return int(self._word[0])

    def launch(self, name: str, grid: int, block: int, args: tuple, stream: Any = None) -> None:
        """Launch kernel `name` with NumPy-scalar `args` on `stream` (None: CuPy's current)."""
        mod, lowered = module(FILE_OF[name], self.device)
        fn = mod.get_function(lowered[name])
        with self.xp.cuda.Device(self.device):
            if stream is None:
                fn((grid,), (block,), args)
            else:
                fn(
                    (grid,),
                    (block,),
                    args,
                    stream=self.xp.cuda.ExternalStream(int(stream), self.device),
                )
