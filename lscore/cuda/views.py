"""Device arrays as the quantize kernels read them, and what every launcher of them shares.

A ``DeviceView`` describes an array (address, shape, byte strides, dtype
name) whichever framework holds it; ``view_args`` turns it into the head of
arguments every quantize kernel of fp8.cu and mx.cu takes; a
``KernelLauncher`` holds the backend, the block size and the grid cap and
launches such a kernel; ``cupy_hooks`` binds an arrays class of
``lscore.cuda`` to CuPy.  The one home of launch-argument packing for
``lscore.cuda.fp8`` and ``lscore.cuda.mx``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "DeviceView",
    "KernelLauncher",
    "Shape",
    "contiguous",
    "cupy_hooks",
    "is_host",
    "view2d",
    "view_args",
]


class DeviceView(NamedTuple):
    """A device array as the kernels read it: address, shape, byte strides, dtype name."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    itemsize: int


def view2d(v: DeviceView, per_row: bool) -> tuple[int, int, int, int]:
    """(rows, cols, row stride, col stride), strides in elements, of `v` read along its last
    axis; per tensor, a C-contiguous array is one row (no division per element).
    ValueError when the leading axes do not merge into one stride (the kernels read one
    row stride) or a stride is not whole elements."""
    if any(s % v.itemsize for s in v.strides):
        raise ValueError(f"x's strides must be whole elements, got {v.strides}")
    shape = list(v.shape) or [1]
    strides = [s // v.itemsize for s in v.strides] or [1]
    n = math.prod(shape)
    dims = [(d, s) for d, s in zip(shape, strides, strict=True) if d != 1]
    contiguous = all(s == math.prod(d for d, _ in dims[k + 1 :]) for k, (_, s) in enumerate(dims))
    if not per_row and contiguous:
        return 1, n, n, 1
    cols, cs = shape[-1], strides[-1]
    lead = [(d, s) for d, s in zip(shape[:-1], strides[:-1], strict=True) if d != 1]
    for k in range(len(lead) - 1):
        if lead[k][1] != lead[k + 1][1] * lead[k + 1][0]:
            raise ValueError(
                f"x's leading axes must merge into one stride (shape {v.shape}, "
                f"strides {v.strides}); pass a copy made contiguous"
            )
    rows = math.prod(d for d, _ in lead)
    return rows, cols, (lead[-1][1] if lead else cols * cs), cs


def view_args(v: DeviceView, per_row: bool) -> tuple[int, tuple]:
    """(element count, the kernel arguments that describe `v`: address, rows, cols, row
    stride, col stride as uint64 / int64), read as ``view2d`` reads it: the head every
    quantize kernel of fp8.cu and mx.cu takes."""
    rows, cols, rs, cs = view2d(v, per_row)
    head = (np.uint64(v.ptr), np.int64(rows), np.int64(cols), np.int64(rs), np.int64(cs))
    return rows * cols, head


class Shape:
    """A shape as the axis checks of ``lscore._fp8_checks`` read an array: ndim and shape."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.ndim = len(shape)
        self.shape = shape


class KernelLauncher:
    """Launches kernels through `backend` (``launch(name, grid, block, args, stream)``),
    `block` threads a block and at most `max_blocks` blocks (a grid-stride loop covers the
    rest)."""

    def __init__(self, backend: Any, *, block: int = 256, max_blocks: int = 4096) -> None:
        self.backend = backend
        self.block = block
        self.max_blocks = max_blocks

    def _grid(self, n: int, per_thread: int = 1) -> int:
        return max(1, min(self.max_blocks, -(-n // (self.block * per_thread))))

    def _launch(
        self, name: str, v: DeviceView, per_row: bool, tail: tuple, stream: Any, per_thread: int = 1
    ) -> None:
        """Kernel `name` over `v` (``view_args``' head, then `tail`), `per_thread` elements a
        thread; nothing for an empty array."""
        n, head = view_args(v, per_row)
        if n:
            self.backend.launch(name, self._grid(n, per_thread), self.block, (*head, *tail), stream)


def contiguous(v: DeviceView) -> bool:
    """Whether `v` is C-contiguous (axes of one element aside)."""
    want = v.itemsize
    for d, s in zip(reversed(v.shape), reversed(v.strides), strict=True):
        if d != 1 and s != want:
            return False
        want *= d
    return True


def is_host(a: Any) -> bool:
    """Whether `a` is host data (a NumPy array, list or tuple), not a device array."""
    return type(a) is np.ndarray or isinstance(a, (list, tuple))


def cupy_hooks(make_launcher: Any) -> dict[str, Any]:
    """The hooks that bind an arrays class of lscore.cuda (``Float8Arrays``,
    ``lscore.cuda.mx.BlockArrays``) to CuPy arrays: a launcher per device,
    ``make_launcher(CupyBackend(device))``, launching on CuPy's current stream."""
    import cupy

    from lscore.cuda.cupy_backend import CupyBackend

    launchers: dict[int, Any] = {}

    def launcher(a: Any) -> Any:
        dev = a.device.id
        if dev not in launchers:
            launchers[dev] = make_launcher(CupyBackend(dev))
        return launchers[dev]

    def on(like: Any, make: Any) -> Any:
        with cupy.cuda.Device(like.device.id):
            return make()

    def empty(like: Any, shape: tuple[int, ...], dtype: str) -> Any:
        if dtype == "bfloat16":
            raise TypeError("dtype must be float32 or float16 for CuPy arrays, got 'bfloat16'")
        return on(like, lambda: cupy.empty(shape, dtype))

    return dict(
        view=lambda a: DeviceView(a.data.ptr, a.shape, a.strides, a.dtype.name, a.itemsize),
        empty=empty,
        zeros=lambda like, n, dtype: on(like, lambda: cupy.zeros(n, dtype)),
        upload=lambda like, host: on(like, lambda: cupy.asarray(host)),
        as_float32=lambda w: w.view(cupy.float32),
        to_host=lambda a: a.get(),
        all_positive_finite=lambda a: bool(((a > 0) & cupy.isfinite(a)).all()),
        launcher=launcher,
        stream=lambda a: None,
    )
