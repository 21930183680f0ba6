"""The block-scaled kernels of mx.cu on a device: MX and NVFP4 quantize and dequantize.

Framework-neutral as ``lscore.cuda.fp8`` is: an input is a ``DeviceView``
read in place as a strided 2-D view, blocked along its last axis (``axis=-1``)
or along the first axis of a 2-D array (``axis=0``, TransformerEngine's
columnwise orientation), and the launches go through a kernel backend
(``CupyBackend`` on a GPU, the host harness in the tests).  Results are
bitwise those of the CPU kernels (``lscore.kernels.mx_quantize`` /
``nvfp4_quantize``) in their layout: scale codes (uint8; ``axis=-1``: the
input's shape with the last axis divided by the block, ``axis=0``: the first)
and element codes (uint8: float8 codes in the input's shape, E2M1 codes two
per byte along the blocked axis, the first in the low nibble).  Every check
runs before a launch.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from lscore import kernels
from lscore._fp8_checks import block_axis
from lscore.cuda.blockwise import BlockwiseLauncher, dequantize_blockwise, quantize_blockwise
from lscore.cuda.sources import mx_dequant_name, mx_name
from lscore.cuda.views import DeviceView, Shape, contiguous, cupy_hooks, is_host
from lscore.dtypes import BY_NAME

__all__ = ["BlockArrays", "MxLauncher", "block_shapes", "cupy_blocks"]

#: element format names (the kernels layer's, and their short forms) -> lsc_mx.h's codes
ELEMS = {
    **kernels.MX_ELEMS,
    **{name.split("_", 1)[1]: code for name, code in kernels.MX_ELEMS.items()},
}
#: the mode code mx.cu reads as NVFP4's rule (E4M3 scales per 16, a per-tensor scale)
NVFP4 = "nvfp4"
_NVFP4_CODE = -1
_E2M1 = kernels.MX_ELEMS["float4_e2m1"]
_FLOATS = ("float32", "float16", "bfloat16")


def _elem_code(elem: str) -> int:
    code = ELEMS.get(elem) if isinstance(elem, str) else None
    if code is None:
        raise ValueError(f"elem must be one of: {', '.join(ELEMS)}; got {elem!r}")
    return code


def _mode_code(mode: str) -> int:
    if mode == NVFP4:
        return _NVFP4_CODE
    modes = {**kernels.MX_MODES, **kernels.BLOCKWISE_MODES}
    code = modes.get(mode) if isinstance(mode, str) else None
    if code is None:
        names = ", ".join((*modes, NVFP4))
        raise ValueError(f"mode must be one of: {names}; got {mode!r}")
    return code


def _codes(elem: str, mode: str, block: Any) -> tuple[int, int, int]:
    """(element code, mode code, block) after the checks: NVFP4 takes E2M1 in blocks of 16."""
    e, m = _elem_code(elem), _mode_code(mode)
    b = _check_block(block, mode)
    if m == _NVFP4_CODE and e != _E2M1:
        raise ValueError(f"elem must be float4_e2m1 for nvfp4, got {elem!r}")
    return e, m, b


def _check_block(block: Any, mode: str) -> int:
    if mode == NVFP4:
        if block != 16:
            raise ValueError(f"block must be 16 for nvfp4, got {block!r}")
        return 16
    ok = isinstance(block, int) and not isinstance(block, bool) and 2 <= block <= 64
    if not ok or block & (block - 1):
        # a block's lanes must be a power-of-two group of one warp (mx.cu)
        raise ValueError(f"block must be a power of two from 2 to 64 on a GPU, got {block!r}")
    return int(block)


def block_shapes(
    shape: tuple[int, ...], block: int, cols: bool, e2m1: bool
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(scales' shape, element codes' shape) of an input of `shape` blocked along its last
    axis or (cols) its first: ``lscore.kernels.mx_block_shapes``, the CPU kernels' check."""
    return kernels.mx_block_shapes(tuple(shape), block, 0 if cols else -1, e2m1)


class MxLauncher(BlockwiseLauncher):
    """Launches mx.cu's kernels (and, as a ``BlockwiseLauncher``, blockwise.cu's) through
    `backend` (``launch(name, grid, block, args, stream)``), `block` threads a block (a
    multiple of 32: the rows kernel folds a block's amax across lanes of one warp) and at
    most `max_blocks` blocks (a grid-stride loop covers the rest)."""

    def __init__(self, backend: Any, *, block: int = 256, max_blocks: int = 4096) -> None:
        if block % 32:
            raise ValueError(f"block must be a multiple of 32, got {block}")
        super().__init__(backend, block=block, max_blocks=max_blocks)

    def quantize(
        self,
        x: DeviceView,
        scales_ptr: int,
        data_ptr: int,
        *,
        elem: int,
        mode: int,
        block: int,
        cols: bool,
        pts_ptr: int = 0,
        hw: int = 1,
        stream: Any = None,
    ) -> None:
        """Scale and element codes of `x` (C-contiguous at scales_ptr and data_ptr, shaped
        as ``block_shapes`` says); elem and mode are codes (mode -1: NVFP4, whose
        per-tensor scale is the float32 at pts_ptr when that is not 0).  The caller has
        checked every argument."""
        tail = (
            np.int32(block),
            np.int32(elem),
            np.int32(mode),
            np.uint64(pts_ptr),
            np.uint64(scales_ptr),
            np.uint64(data_ptr),
        )
        # a thread per pair of elements (rows) or per block of a column (cols)
        name = mx_name(BY_NAME[x.dtype], cols, hw)
        self._launch(name, x, True, tail, stream, per_thread=block if cols else 2)

    def dequantize(
        self,
        scales_ptr: int,
        data_ptr: int,
        out_ptr: int,
        out_dtype: str,
        *,
        rows: int,
        cols: int,
        elem: int,
        mode: int,
        block: int,
        along_cols: bool,
        pts_ptr: int = 0,
        stream: Any = None,
    ) -> None:
        """out (rows x cols, C-contiguous, out_dtype) = element * scale [* per-tensor scale]
        in float32, rounded once, from the codes ``quantize`` writes."""
        if rows * cols == 0:
            return
        args = (
            np.uint64(scales_ptr),
            np.uint64(data_ptr),
            np.int64(rows),
            np.int64(cols),
            np.int32(block),
            np.int32(along_cols),
            np.int32(elem),
            np.int32(mode),
            np.uint64(pts_ptr),
            np.uint64(out_ptr),
        )
        name = mx_dequant_name(BY_NAME[out_dtype])
        self.backend.launch(name, self._grid(rows * cols), self.block, args, stream)


class BlockArrays:
    """MX / NVFP4 quantize and dequantize over device arrays of one framework.

    The framework is given by hooks, as for ``lscore.cuda.fp8.Float8Arrays``:
    ``view(a)`` (a ``DeviceView``), ``empty(like, shape, dtype)`` (a new
    C-contiguous device array beside `like`; dtype a name), ``upload(like,
    host)`` (a float32 NumPy vector onto `like`'s device), ``launcher(a)`` (an
    ``MxLauncher`` for `a`'s device) and ``stream(a)`` (what to launch on;
    None: the backend's current stream).
    """

    def __init__(self, **hooks: Any) -> None:
        self.h = hooks

    def _pts(self, like: Any, pts: Any) -> tuple[int, Any]:
        """(address of the per-tensor scale's float32 on the device or 0, what keeps it)."""
        if pts is None:
            return 0, None
        host = is_host(pts) or isinstance(pts, (int, float, np.generic))
        if not host and hasattr(pts, "shape"):
            v = self.h["view"](pts)
            if v.dtype != "float32" or math.prod(v.shape) != 1:
                raise ValueError(
                    f"pts must be one float32 on the device, got {v.dtype} of shape {v.shape}"
                )
            return v.ptr, pts
        value = np.asarray(pts, np.float32).reshape(-1)
        if value.size != 1:
            raise ValueError(f"pts must be one float32, got {value.size} values")
        words = self.h["upload"](like, value)
        return self.h["view"](words).ptr, words

    def quantize(
        self,
        x: Any,
        elem: str,
        mode: str,
        block: int = 32,
        *,
        axis: int = -1,
        pts: Any = None,
        tile: bool = False,
        pow2: bool = False,
        eps: float = 0.0,
    ) -> tuple[Any, Any]:
        """(scale codes, element codes) of x, uint8 device arrays in the kernels layer's
        layout; mode "nvfp4" is NVFP4's rule (E2M1 elements, blocks of 16) with the
        per-tensor scale `pts` (a float, or one float32 on the device) or none.  A float32
        rule (``lscore.kernels.BLOCKWISE_MODES``; `pow2`, `eps`) gives float32 inverse
        scales; `tile` square tiles of side `block` of a 2-D x (blockwise.cu)."""
        v = self.h["view"](x)
        if v.dtype not in _FLOATS:
            raise TypeError(f"x must be float32, float16 or bfloat16, got {v.dtype}")
        wide = mode in kernels.BLOCKWISE_MODES
        if wide or tile:
            e, m = _elem_code(elem), _mode_code(mode)
            if m == _NVFP4_CODE or pts is not None:
                raise ValueError("nvfp4 and pts take neither float32 scales nor tiles")
            return quantize_blockwise(
                self.h, x, e, m, block, tile=tile, axis=axis, pow2=pow2, eps=eps, wide=wide
            )
        if pow2 or eps:
            raise ValueError(f"pow2 and eps are the float32 rules', not mode {mode!r}'s")
        e, m, b = _codes(elem, mode, block)
        if pts is not None and m != _NVFP4_CODE:
            raise ValueError(f"pts is NVFP4's per-tensor scale, not one of mode {mode!r}")
        shape = tuple(v.shape)
        cols = block_axis(Shape(shape), axis)
        s_shape, d_shape = block_shapes(shape, b, cols, e == _E2M1)
        pts_ptr, _alive = self._pts(x, pts)  # the upload, held until the launch
        scales = self.h["empty"](x, s_shape, "uint8")
        data = self.h["empty"](x, d_shape, "uint8")
        self.h["launcher"](x).quantize(
            v,
            self.h["view"](scales).ptr,
            self.h["view"](data).ptr,
            elem=e,
            mode=m,
            block=b,
            cols=cols,
            pts_ptr=pts_ptr,
            stream=self.h["stream"](x),
        )
        return scales, data

    def nvfp4_quantize(self, x: Any, pts: Any = None, *, axis: int = -1) -> tuple[Any, Any]:
        """NVFP4's (E4M3 scale codes, packed E2M1 codes) of x, with the per-tensor scale
        `pts` or none."""
        return self.quantize(x, "float4_e2m1", NVFP4, 16, axis=axis, pts=pts)

    def dequantize(
        self,
        scales: Any,
        data: Any,
        elem: str,
        mode: str,
        block: int,
        *,
        axis: int = -1,
        pts: Any = None,
        dtype: str = "float32",
        tile: bool = False,
    ) -> Any:
        """The values the codes stand for, shaped as the quantized input: each element
        times its block's scale in float32 rounded once to `dtype` (a name), as
        ``lscore.fp8.dequantize_blocks`` reads them back (NVFP4: the per-tensor times the
        block scale first; torchao's modes floor, ceil, even and rceil: the scale rounded
        to float16 first for a float16 result; float32 rules: the inverse scale); `tile`:
        square tiles of side `block`."""
        if dtype not in _FLOATS:
            raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
        wide = mode in kernels.BLOCKWISE_MODES
        if wide or tile:
            e, m = _elem_code(elem), _mode_code(mode)
            return dequantize_blockwise(
                self.h, scales, data, e, m, block, tile=tile, axis=axis, dtype=dtype, wide=wide
            )
        e, m, b = _codes(elem, mode, block)
        sv, dv = self.h["view"](scales), self.h["view"](data)
        for what, w in (("scales", sv), ("data", dv)):
            if w.dtype != "uint8" or not contiguous(w):
                raise ValueError(f"{what} must be a C-contiguous uint8 array, got {w.dtype}")
        e2m1 = e == _E2M1 or m == _NVFP4_CODE
        d_shape = tuple(dv.shape)
        cols = block_axis(Shape(d_shape), axis)
        ax = 0 if cols else len(d_shape) - 1
        shape = (*d_shape[:ax], d_shape[ax] * 2, *d_shape[ax + 1 :]) if e2m1 else d_shape
        want, _ = block_shapes(shape, b, cols, e2m1)
        if tuple(sv.shape) != want:
            raise ValueError(
                f"scales must have shape {want} for data of shape {d_shape}, got {tuple(sv.shape)}"
            )
        pts_ptr, _alive = self._pts(data, pts)  # the upload, held until the launch
        out = self.h["empty"](data, shape, dtype)
        rows = shape[0] if cols else math.prod(shape[:-1])
        self.h["launcher"](data).dequantize(
            sv.ptr,
            dv.ptr,
            self.h["view"](out).ptr,
            dtype,
            rows=rows,
            cols=shape[-1] if shape else 1,
            elem=e,
            mode=m,
            block=b,
            along_cols=cols,
            pts_ptr=pts_ptr,
            stream=self.h["stream"](data),
        )
        return out


@functools.cache
def cupy_blocks() -> BlockArrays:
    """``BlockArrays`` bound to CuPy arrays and ``CupyBackend`` (a launcher per device),
    launching on CuPy's current stream; CuPy has no bfloat16, so its inputs and outputs
    are float32 and float16."""
    return BlockArrays(**cupy_hooks(MxLauncher))
