"""The kernels of blockwise.cu on a device: blockwise FP8 (float32 scales) and square weight
tiles, quantize and dequantize.

``BlockwiseLauncher`` launches them; ``lscore.cuda.mx.BlockArrays`` checks
the arguments and allocates (its launcher is an ``MxLauncher``, which is one
of these).  Results are bitwise those of the CPU kernels
(``lscore.kernels.mx_quantize`` with a float32 rule of
``lscore.kernels.BLOCKWISE_MODES``, or ``tile=True``) in their layout:
float32 inverse scales (an E8M0 byte per tile under an MX rule) and uint8
float8 codes in the input's shape.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lscore import kernels
from lscore._fp8_checks import block_axis
from lscore.cuda.sources import bw_name
from lscore.cuda.views import DeviceView, KernelLauncher, Shape, contiguous, view_args
from lscore.dtypes import BY_NAME

__all__ = ["LAYOUTS", "BlockwiseLauncher", "dequantize_blockwise", "quantize_blockwise"]

#: how blocks lie (blockwise.cu's dequantize ``layout``): along the rows, down the columns,
#: square tiles
LAYOUTS = {"rows": 0, "cols": 1, "tiles": 2}


class BlockwiseLauncher(KernelLauncher):
    """Launches blockwise.cu's kernels through `backend`, `block` threads a thread block (a
    multiple of 32: the rows kernel runs a warp per block, the tiles kernel a thread block
    per tile) and at most `max_blocks` thread blocks (a grid-stride loop covers the rest)."""

    def quantize_blockwise(
        self,
        x: DeviceView,
        scales_ptr: int,
        data_ptr: int,
        *,
        elem: int,
        mode: int,
        block: int,
        kind: str,
        pow2: bool = False,
        eps: float = 0.0,
        stream: Any = None,
    ) -> None:
        """Scales and float8 codes of `x` in blocks of `block` along its rows (kind "rows"),
        down its columns ("cols"; float32 rules) or in square tiles of that side ("tiles";
        any rule), into C-contiguous arrays at scales_ptr and data_ptr; elem and mode are
        lsc_mx.h's codes.  The caller has checked every argument."""
        tail = (
            np.int32(block),
            np.int32(elem),
            np.int32(mode),
            np.int32(pow2),
            np.float64(eps),
            np.uint64(scales_ptr),
            np.uint64(data_ptr),
        )
        name = bw_name(kind, BY_NAME[x.dtype])
        if kind == "tiles":  # a thread block per tile
            n, head = view_args(x, True)
            rows = int(head[1])
            tiles = -(-rows // block) * -(-(n // max(rows, 1)) // block)
            if n:
                grid = max(1, min(self.max_blocks, tiles))
                self.backend.launch(name, grid, self.block, (*head, *tail), stream)
            return
        # a warp per block (rows), a thread per block of a column (cols)
        per_thread = block // 32 if kind == "rows" else block
        self._launch(name, x, True, tail, stream, per_thread=max(per_thread, 1))

    def dequantize_blockwise(
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
        layout: str,
        stream: Any = None,
    ) -> None:
        """out (rows x cols, C-contiguous, out_dtype) = code * scale in float32, rounded once,
        from the codes ``quantize_blockwise`` writes (`layout` a name of ``LAYOUTS``)."""
        if rows * cols == 0:
            return
        args = (
            np.uint64(scales_ptr),
            np.uint64(data_ptr),
            np.int64(rows),
            np.int64(cols),
            np.int32(block),
            np.int32(LAYOUTS[layout]),
            np.int32(elem),
            np.int32(mode),
            np.uint64(out_ptr),
        )
        name = bw_name("dequant", BY_NAME[out_dtype])
        self.backend.launch(name, self._grid(rows * cols), self.block, args, stream)


def _check_side(block: Any, what: str) -> int:
    ok = isinstance(block, int) and not isinstance(block, bool) and 2 <= block <= 1024
    if not ok or block % 2:
        raise ValueError(f"{what} must be an even integer from 2 to 1024, got {block!r}")
    return int(block)


def quantize_blockwise(
    h: dict[str, Any],
    x: Any,
    e: int,
    m: int,
    block: int,
    *,
    tile: bool,
    axis: int,
    pow2: bool,
    eps: float,
    wide: bool,
) -> tuple[Any, Any]:
    """``lscore.cuda.mx.BlockArrays.quantize`` of a float32 rule (`wide`) or of square
    tiles, through the hooks `h`: (scales, codes) device arrays (float32 or uint8 scales)."""
    v = h["view"](x)
    if e == kernels.MX_ELEMS["float4_e2m1"]:
        raise ValueError("elem must be a float8 format for float32 scales or tiles, got E2M1")
    b = _check_side(block, "tile" if tile else "block")
    shape = tuple(v.shape)
    if tile:
        if len(shape) != 2:
            raise ValueError(f"tiles need a 2-D input, got shape {shape}")
        s_shape: tuple[int, ...] = (-(-shape[0] // b), -(-shape[1] // b))
        kind = "tiles"
    else:
        cols = block_axis(Shape(shape), axis)
        s_shape = kernels.mx_block_shapes(shape, b, 0 if cols else -1, False)[0]
        kind = "cols" if cols else "rows"
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    scales = h["empty"](x, s_shape, "float32" if wide else "uint8")
    data = h["empty"](x, shape, "uint8")
    h["launcher"](x).quantize_blockwise(
        v,
        h["view"](scales).ptr,
        h["view"](data).ptr,
        elem=e,
        mode=m,
        block=b,
        kind=kind,
        pow2=pow2,
        eps=float(eps),
        stream=h["stream"](x),
    )
    return scales, data


def dequantize_blockwise(
    h: dict[str, Any],
    scales: Any,
    data: Any,
    e: int,
    m: int,
    block: int,
    *,
    tile: bool,
    axis: int,
    dtype: str,
    wide: bool,
) -> Any:
    """``lscore.cuda.mx.BlockArrays.dequantize`` of float32 scales or of tiles through the
    hooks `h`: a new device array of the codes' shape."""
    b = _check_side(block, "tile" if tile else "block")
    sv, dv = h["view"](scales), h["view"](data)
    kinds = (("scales", sv, "float32" if wide else "uint8"), ("data", dv, "uint8"))
    for what, w, dt in kinds:
        if w.dtype != dt or not contiguous(w):
            raise ValueError(f"{what} must be a C-contiguous {dt} array, got {w.dtype}")
    shape = tuple(dv.shape)
    if tile:
        if len(shape) != 2:
            raise ValueError(f"tiles need 2-D codes, got shape {shape}")
        want: tuple[int, ...] = (-(-shape[0] // b), -(-shape[1] // b))
        layout = "tiles"
    else:
        cols = block_axis(Shape(shape), axis)
        want = kernels.mx_block_shapes(shape, b, 0 if cols else -1, False)[0]
        layout = "cols" if cols else "rows"
    if tuple(sv.shape) != want:
        raise ValueError(
            f"scales must have shape {want} for data of shape {shape}, got {tuple(sv.shape)}"
        )
    out = h["empty"](data, shape, dtype)
    h["launcher"](data).dequantize_blockwise(
        sv.ptr,
        dv.ptr,
        h["view"](out).ptr,
        dtype,
        rows=shape[0] if layout == "cols" else math.prod(shape[:-1]),
        cols=shape[-1] if shape else 1,
        elem=e,
        mode=m,
        block=b,
        layout=layout,
        stream=h["stream"](data),
    )
    return out
