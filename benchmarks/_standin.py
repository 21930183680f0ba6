"""The stand-in device of ``--suite gpu-host``: CuPy-shaped views of host memory
(``StandInArray``: ``data.ptr``, ``data.device_id``, ``size``, ``dtype``, ``flags``)
and a backend whose launches and synchronisations do nothing (``NullBackend``), so that
the CuPy path's host side runs as on a GPU with only the device replaced.
"""

from __future__ import annotations

import types
import weakref
from typing import Any

import numpy as np

from lscore import cuda, kernels


class _MemoryPointer:
    """The fields of cupy.cuda.MemoryPointer that lscore reads."""

    __slots__ = ("device_id", "mem", "ptr")

    def __init__(self, ptr: int, device_id: int, mem):
        self.ptr, self.device_id, self.mem = ptr, device_id, mem


class _Flags:
    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, c: bool, f: bool):
        self.c_contiguous, self.f_contiguous, self.owndata = c, f, False


class StandInArray:
    """A cupy.ndarray-shaped view of host memory (for timing the host side without a GPU).

    ``data.ptr``, ``data.device_id``, ``size``, ``dtype``, ``_c_contiguous``
    and ``_f_contiguous`` are plain slots, as CuPy's are readonly C fields;
    ``flags`` builds an object on every read, as CuPy's does.  ``host`` is the
    NumPy array behind it.
    """

    __slots__ = (
        "__weakref__",
        "_c_contiguous",
        "_f_contiguous",
        "data",
        "dtype",
        "host",
        "shape",
        "size",
        "strides",
    )

    def __init__(self, host: np.ndarray, device: int = 0):
        self.host = host
        self.data = _MemoryPointer(host.ctypes.data, device, host)
        self.size, self.dtype, self.shape, self.strides = (
            host.size,
            host.dtype,
            host.shape,
            host.strides,
        )
        self._c_contiguous = host.flags.c_contiguous
        self._f_contiguous = host.flags.f_contiguous

    @property
    def flags(self) -> _Flags:
        return _Flags(self._c_contiguous, self._f_contiguous)


STANDIN_XP = types.SimpleNamespace(__name__="cupy", ndarray=StandInArray)


class NullBackend:
    """lscore.cuda backend whose device is host memory and whose launches do nothing.

    Everything up to the launch runs as on a GPU; ``launches`` counts the
    launches, ``syncs`` the reads of the flag (the one synchronisation) and
    ``uploads`` the host-to-device copies (each a synchronisation on a GPU).
    `large_kernel_params`: the launches carry 32 KB of arguments, as on a CUDA
    12.1+ driver with an sm_70+ device (``CupyBackend``'s test), or 4 KB.
    """

    xp = np

    def __init__(self, device: int = 0, *, large_kernel_params: bool = True):
        self.large_kernel_params = large_kernel_params
        self.device = device
        self.launches = 0
        self.syncs = 0
        self.uploads = 0
        self._ptrs: dict = {}

    def ptr(self, a) -> int:
        """`a`'s address.  CuPy reads it as a field (``a.data.ptr``, tens of ns); NumPy builds
        a ctypes object for it (about 2 us), so each array's address is remembered (by id,
        checked through a weak reference) to time what a GPU backend costs."""
        hit = self._ptrs.get(id(a))
        if hit is not None and hit[0]() is a:
            return hit[1]
        if len(self._ptrs) > 4096:
            self._ptrs.clear()
        addr = a.ctypes.data
        self._ptrs[id(a)] = (weakref.ref(a), addr)
        return addr

    def get(self, a) -> np.ndarray:
        return np.array(a)

    def to_device(self, host: np.ndarray) -> np.ndarray:
        self.uploads += 1
        return np.array(host, copy=True)

    def function(self, name: str) -> str:
        return name

    def enter(self) -> int:
        return self.device

    def leave(self, prev: int) -> None:
        pass

    def stream(self) -> int:
        return 0

    def launch_packed(self, fn, grid, block, params, widths, nparams, stream) -> None:
        self.launches += 1

    def read_word(self, a) -> int:
        self.syncs += 1
        return int(a[0])

    def launch(self, name: str, grid: int, block: int, args: tuple, stream=None) -> None:
        self.launches += 1


def standin_kernels(make_backend=NullBackend) -> cuda.ArrayKernels:
    """The CuPy adapter's ArrayKernels bound to StandInArray and `make_backend(device)`."""
    return cuda.ArrayKernels(
        STANDIN_XP, make_backend, array_type=StandInArray, kind=kernels.READ_CUDA_ARRAY
    )


class HostLists:
    """Lists of StandInArrays of the given sizes over one host buffer, 64-byte aligned;
    ``make(shift)`` starts `shift` slots in, so each shift gives every array a new address."""

    def __init__(self, sizes, dtype, shifts: int):
        self.dt = np.dtype(dtype)
        self.pad = 64 // self.dt.itemsize
        self.sizes = sizes
        self.starts = np.cumsum([0] + [-(-n // self.pad) * self.pad + self.pad for n in sizes])
        self.buf = np.ones(int(self.starts[-1]) + self.pad * (shifts + 1), self.dt)

    def make(self, shift: int = 0, wrap: Any = StandInArray) -> list:
        off = self.pad * shift
        return [
            wrap(self.buf[off + s : off + s + n])
            for s, n in zip(self.starts[:-1].tolist(), self.sizes, strict=True)
        ]


def null_adapter(kern: cuda.ArrayKernels | None = None):
    """lscore.adapters.cupy's optimizer classes bound to NumPy arrays and NullBackend
    (through `kern`, by default a new ``ArrayKernels`` of NullBackends).

    The fused step's host side as on a GPU (the walk and plan lookup, the
    packed launches of the check, the update and the scale update, the
    sync-free bookkeeping), with the launches and the one read of the
    default mode done by NullBackend.  CuPy's own per-step array operations
    (casting the device scale for ``minimize``) are NumPy's here, cheaper
    than a CuPy launch.
    """
    from lscore.adapters import device

    if kern is None:
        kern = cuda.ArrayKernels(np, NullBackend, kind=kernels.READ_NUMPY)
    return device.bind(np, kern)
