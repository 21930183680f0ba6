"""The float8 quantize kernels of fp8.cu on a device: the amax pass, the cast and dequantize.

Framework-neutral: an array is described by ``DeviceView`` (its device
address, shape, byte strides and dtype name), which the CuPy and torch
adapters build from their own arrays, and the launches go through a kernel
backend (``CupyBackend`` on a GPU, the host harness in the tests).  An input
is read in place as a 2-D view (rows along the last axis, the leading axes
merged into one stride); outputs are C-contiguous and the caller allocates
them: the amax words (uint32, zeroed, one per tensor or per row: |x| as
bits, a NaN above every number, read as float32) and the codes.  Results
are bitwise those of the CPU kernels (``lscore.kernels.fp8_cast``); the
GPU narrows with ``cvt.rn.satfinite`` on sm_89 and newer (fp8.cu).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from lscore import kernels
from lscore.dtypes import BY_NAME, Code

__all__ = ["FP8_KERNELS", "DeviceView", "Float8Launcher", "amax_name", "cast_name", "view2d"]

_FLOATS = (Code.F16, Code.BF16, Code.F32)
_FMTS = (Code.E4M3FN, Code.E5M2)


def amax_name(code: int) -> str:
    """The amax kernel of an input dtype code."""
    return f"lsc_fp8_amax2d<{int(code)}>"


def cast_name(code: int, fmt: int, hw: int = 1) -> str:
    """The cast kernel of an input dtype code and float8 format code (hw: the instruction)."""
    return f"lsc_fp8_cast2d<{int(code)}, {int(fmt)}, {hw}>"


def dequant_name(code: int, fmt: int) -> str:
    """The dequantize kernel of an output dtype code and float8 format code."""
    return f"lsc_fp8_dequant2d<{int(code)}, {int(fmt)}>"


#: the kernel names (NVRTC name expressions) of fp8.cu that lscore.cuda launches
FP8_KERNELS = (
    tuple(amax_name(c) for c in _FLOATS)
    + tuple(cast_name(c, f, hw) for c in _FLOATS for f in _FMTS for hw in (0, 1))
    + tuple(dequant_name(c, f) for c in _FLOATS for f in _FMTS)
)


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


class Float8Launcher:
    """Launches fp8.cu's quantize kernels through `backend` (``launch(name, grid, block, args,
    stream)``), `block` threads a block and at most `max_blocks` blocks (a grid-stride loop
    covers the rest)."""

    def __init__(self, backend: Any, *, block: int = 256, max_blocks: int = 4096) -> None:
        self.backend = backend
        self.block = block
        self.max_blocks = max_blocks

    def _grid(self, n: int, per_thread: int) -> int:
        return max(1, min(self.max_blocks, -(-n // (self.block * per_thread))))

    def amax(self, x: DeviceView, amax_ptr: int, *, per_row: bool, propagate: bool,
             stream: Any = None) -> None:
        """Fold max |x| (per tensor or per row) into the zeroed uint32 words at amax_ptr."""
        import numpy as np

        rows, cols, rs, cs = view2d(x, per_row)
        n = rows * cols
        if n == 0:
            return
        flags = kernels.FP8_FLAGS["AMAX_NAN"] if propagate else 0
        args = (
            np.uint64(x.ptr), np.int64(rows), np.int64(cols), np.int64(rs), np.int64(cs),
            np.int32(flags), np.int32(per_row), np.uint64(amax_ptr),
        )
        self.backend.launch(amax_name(BY_NAME[x.dtype]), self._grid(n, 1), self.block, args,
                            stream)

    def cast(self, x: DeviceView, q_ptr: int, amax_ptr: int, *, fmt: str, scale: float,
             scales_ptr: int, per_row: bool, flags: int, hw: int = 1,
             stream: Any = None) -> None:
        """q = fp8(float32(x) * scale) (C-contiguous codes at q_ptr) and the amax words.

        The scale is `scale`, or when scales_ptr is not 0 the float32 device words there
        (one, or one per row with per_row); `flags` are ``lscore.kernels.FP8_FLAGS``' bits.
        """
        import numpy as np

        rows, cols, rs, cs = view2d(x, per_row)
        n = rows * cols
        if n == 0:
            return
        args = (
            np.uint64(x.ptr), np.int64(rows), np.int64(cols), np.int64(rs), np.int64(cs),
            np.float32(scale), np.uint64(scales_ptr), np.int32(per_row), np.uint64(q_ptr),
            np.int32(flags), np.uint64(amax_ptr),
        )
        name = cast_name(BY_NAME[x.dtype], kernels.FP8_FORMATS[fmt], hw)
        self.backend.launch(name, self._grid(n, 2), self.block, args, stream)

    def dequantize(self, q: DeviceView, out_ptr: int, out_dtype: str, *, fmt: str,
                   scale: float, scales_ptr: int, per_row: bool, stream: Any = None) -> None:
        """out = float32(q) / scale rounded once to out_dtype (C-contiguous at out_ptr)."""
        import numpy as np

        rows, cols, rs, cs = view2d(q, per_row)
        n = rows * cols
        if n == 0:
            return
        args = (
            np.uint64(q.ptr), np.int64(rows), np.int64(cols), np.int64(rs), np.int64(cs),
            np.float32(scale), np.uint64(scales_ptr), np.int32(per_row), np.uint64(out_ptr),
        )
        name = dequant_name(BY_NAME[out_dtype], kernels.FP8_FORMATS[fmt])
        self.backend.launch(name, self._grid(n, 1), self.block, args, stream)
