"""What a kernel backend provides: the interface lscore.cuda's launchers call.

A backend is one device's memory and launches.  ``CupyBackend`` (CuPy's memory, the
CUDA driver's launches, CuPy's current stream) is the one lscore ships for GPUs;
the torch adapter's ``TorchCudaBackend`` keeps its launches and swaps the memory
and stream for torch's.  The tests' host harness and ``lscore bench --suite
gpu-host``'s stand-in implement the same calls on host memory.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    """The calls ``MultiTensor``, ``FusedLauncher`` and ``DeviceState`` make on a backend.

    ``device`` is the device's index; ``large_kernel_params`` (optional, False when
    absent) says the launches may carry 32 KB of arguments instead of 4 KB.
    ``isinstance(b, Backend)`` checks that `b` has every call (not their signatures).
    """

    device: int

    def ptr(self, a: Any) -> int:
        """The device address of array `a`."""
        ...

    def get(self, a: Any) -> np.ndarray:
        """A host copy of device array `a`."""
        ...

    def to_device(self, host: np.ndarray) -> Any:
        """A device copy of `host`, ready for launches on the backend's stream."""
        ...

    def function(self, name: str) -> Any:
        """The handle of kernel `name` (a name expression of ``lscore.cuda.sources``) that
        ``launch_packed`` takes."""
        ...

    def enter(self) -> Any:
        """Make this device current for the launches; returns what ``leave`` restores."""
        ...

    def leave(self, prev: Any) -> None:
        """Restore the device ``enter`` replaced."""
        ...

    def stream(self) -> int:
        """The stream the launches go to (the framework's current stream of the device)."""
        ...

    def launch_packed(
        self, fn: Any, grid: int, block: int, params: int, widths: int, nparams: int, stream: int
    ) -> None:
        """Launch `fn` with its arguments packed as cuLaunchKernel takes them: `params` the
        address of a ``void*[nparams]``, `widths` that of the arguments' byte widths."""
        ...

    def read_word(self, a: Any) -> int:
        """The first uint32 of device array `a`, after the launches on the stream (a sync)."""
        ...

    def launch(self, name: str, grid: int, block: int, args: tuple, stream: Any = None) -> None:
        """Launch kernel `name` with NumPy-scalar `args` on `stream` (None: the current one)."""
        ...
