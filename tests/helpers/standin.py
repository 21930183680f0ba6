"""Stand-ins for a CUDA device, over host memory: the tests' own (the bench keeps its own).

``DeviceArray`` is a CuPy-shaped view of a NumPy array on a chosen device id:
lscore's CUDA layer reads a CuPy array through its attributes (``data.ptr``,
``data.device_id``, ``size``, ``dtype``, ``shape``, ``strides``, and its
``_c_contiguous`` / ``_f_contiguous`` fields, or ``flags`` where those are missing:
``lscore.kernels.READ_CUDA_ARRAY``), so ``lscore.cuda.ArrayKernels(XP, ...,
array_type=DeviceArray)`` walks, groups and plans these exactly as CuPy arrays,
arrays of several devices in one call included.  ``HostMemory`` is the memory
side of a kernel backend (device memory is host memory); the host harness
(``helpers.cuda_host``) adds launches that run.
"""

from __future__ import annotations

import types

import numpy as np


class DeviceArray:
    """A cupy.ndarray-shaped view of the NumPy array `host`, living on device `device`.

    ``data``, ``size``, ``dtype`` and ``host`` may be replaced, as a test that moves an
    array (a new address, size or dtype under the same object) does.
    """

    __slots__ = (
        "__weakref__",
        "_c_contiguous",
        "_f_contiguous",
        "data",
        "dtype",
        "flags",
        "host",
        "shape",
        "size",
        "strides",
    )

    def __init__(self, host: np.ndarray, device: int = 0):
        self.host = host
        self.data = types.SimpleNamespace(ptr=host.ctypes.data, device_id=device, mem=host)
        self.size, self.dtype = host.size, host.dtype
        self.shape, self.strides = host.shape, host.strides
        self.flags = types.SimpleNamespace(
            c_contiguous=host.flags.c_contiguous,
            f_contiguous=host.flags.f_contiguous,
            owndata=False,
        )
        self._c_contiguous, self._f_contiguous = self.flags.c_contiguous, self.flags.f_contiguous


#: the array module of DeviceArray, named as CuPy's (the name the kernels' messages give)
XP = types.SimpleNamespace(__name__="cupy", ndarray=DeviceArray)


class HostMemory:
    """The memory side of an ``lscore.cuda`` kernel backend on device `device`, in host
    memory: addresses, uploads, reads, kernel handles (their names), the current stream."""

    xp = np

    def __init__(self, device: int = 0):
        self.device = device

    def ptr(self, a: np.ndarray) -> int:
        return a.ctypes.data

    def get(self, a: np.ndarray) -> np.ndarray:
        return np.array(a)

    def to_device(self, host: np.ndarray) -> np.ndarray:
        return np.array(host, copy=True)

    def function(self, name: str) -> str:
        return name

    def enter(self) -> int:
        return self.device

    def leave(self, prev: int) -> None:
        """Nothing to restore: every stand-in device is the host."""

    def stream(self) -> int:
        return 0
