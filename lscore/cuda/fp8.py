"""The float8 quantize kernels of fp8.cu on a device: the amax pass, the cast and dequantize.

Framework-neutral: an array is described by ``DeviceView`` (its device
address, shape, byte strides and dtype name), which the CuPy and torch
adapters build from their own arrays, and the launches go through a kernel
backend (``CupyBackend`` on a GPU, the host harness in the tests).  An input
is read in place as a 2-D view (rows along the last axis, the leading axes
merged into one stride); outputs are C-contiguous and the caller allocates
them: the amax words (uint32, zeroed, one per tensor or per row: ``|x|`` as
bits, a NaN above every number, read as float32) and the codes.  Results
are bitwise those of the CPU kernels (``lscore.kernels.fp8_cast``); the
GPU narrows with ``cvt.rn.satfinite`` on sm_89 and newer (fp8.cu).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from lscore import kernels
from lscore._fp8_checks import Cast, check_scale, format_name, nan_rule, row_axis
from lscore.cuda.sources import amax_name, cast_name, dequant_name
from lscore.cuda.views import (
    DeviceView,
    KernelLauncher,
    Shape,
    contiguous,
    cupy_hooks,
    is_host,
)
from lscore.dtypes import BY_NAME

__all__ = ["Float8Arrays", "Float8Launcher", "cupy_arrays"]


class Float8Launcher(KernelLauncher):
    """Launches fp8.cu's quantize kernels through `backend` (``launch(name, grid, block, args,
    stream)``), `block` threads a block and at most `max_blocks` blocks (a grid-stride loop
    covers the rest)."""

    def amax(
        self, x: DeviceView, amax_ptr: int, *, per_row: bool, propagate: bool, stream: Any = None
    ) -> None:
        """Fold ``max |x|`` (per tensor or per row) into the zeroed uint32 words at amax_ptr."""
        flags = kernels.FP8_FLAGS["AMAX_NAN"] if propagate else 0
        tail = (np.int32(flags), np.int32(per_row), np.uint64(amax_ptr))
        self._launch(amax_name(BY_NAME[x.dtype]), x, per_row, tail, stream)

    def cast(
        self,
        x: DeviceView,
        q_ptr: int,
        amax_ptr: int,
        *,
        fmt: str,
        scale: float,
        scales_ptr: int,
        per_row: bool,
        flags: int,
        hw: int = 1,
        stream: Any = None,
    ) -> None:
        """q = fp8(float32(x) * scale) (C-contiguous codes at q_ptr) and the amax words.

        The scale is `scale`, or when scales_ptr is not 0 the float32 device words there
        (one, or one per row with per_row); `flags` are ``lscore.kernels.FP8_FLAGS``' bits.
        """
        tail = (
            np.float32(scale),
            np.uint64(scales_ptr),
            np.int32(per_row),
            np.uint64(q_ptr),
            np.int32(flags),
            np.uint64(amax_ptr),
        )
        name = cast_name(BY_NAME[x.dtype], kernels.FP8_FORMATS[fmt], hw)
        self._launch(name, x, per_row, tail, stream, per_thread=2)

    def dequantize(
        self,
        q: DeviceView,
        out_ptr: int,
        out_dtype: str,
        *,
        fmt: str,
        scale: float,
        scales_ptr: int,
        per_row: bool,
        stream: Any = None,
    ) -> None:
        """out = float32(q) / scale rounded once to out_dtype (C-contiguous at out_ptr)."""
        tail = (np.float32(scale), np.uint64(scales_ptr), np.int32(per_row), np.uint64(out_ptr))
        name = dequant_name(BY_NAME[out_dtype], kernels.FP8_FORMATS[fmt])
        self._launch(name, q, per_row, tail, stream)


class Float8Arrays:
    """amax / quantize / dequantize over device arrays of one framework, by lscore.fp8's rules.

    The framework is given by hooks: ``view(a)`` (a ``DeviceView``),
    ``empty(like, shape, dtype)`` and ``zeros(like, n, dtype)`` (new device
    arrays beside `like`; dtype a name: "uint8", "uint32", "float32", ...),
    ``upload(like, host)`` (a float32 NumPy vector onto `like`'s device),
    ``as_float32(words)`` (uint32 words reinterpreted as float32),
    ``to_host(a)`` (a device array copied into NumPy),
    ``all_positive_finite(a)`` (one device reduction and read),
    ``launcher(a)`` (a ``Float8Launcher`` for `a`'s device) and ``stream(a)``
    (what to launch on; None: the backend's current stream).  The checks are
    lscore.fp8.quantize's and run before any launch.
    """

    def __init__(self, **hooks: Any) -> None:
        self.h = hooks

    def _flags(self, saturate: bool, nan_sign: bool, propagate: bool) -> int:
        f = kernels.FP8_FLAGS
        return (
            (f["SAT"] if saturate else 0)
            | (f["NAN_SIGN"] if nan_sign else 0)
            | (f["AMAX_NAN"] if propagate else 0)
        )

    def _check_float(self, v: DeviceView, what: str = "x") -> None:
        if v.dtype not in ("float32", "float16", "bfloat16"):
            raise TypeError(f"{what} must be float32, float16 or bfloat16, got {v.dtype}")

    def _scale(self, like: Any, scale: Any, rows: int | None) -> tuple[float, Any]:
        """(scale by value, device words or None) after lscore.fp8's check."""
        if rows is not None and hasattr(scale, "shape") and not is_host(scale):
            v = self.h["view"](scale)
            if v.dtype != "float32" or math.prod(v.shape) != rows or not contiguous(v):
                raise ValueError(
                    f"scale must hold one positive finite float32 per row ({rows}), "
                    f"got {v.dtype} of shape {v.shape}"
                )
            if not self.h["all_positive_finite"](scale):
                raise ValueError("scale must hold positive finite float32s")
            return 0.0, scale
        s = check_scale(scale, rows)
        if rows is None:
            return float(s), None
        return 0.0, self.h["upload"](like, s)

    def amax(self, x: Any, axis: int | None = None, nan: str = "ignore") -> Any:
        v = self.h["view"](x)
        self._check_float(v)
        per_row, propagate = row_axis(Shape(v.shape), axis), nan_rule(nan)
        rows = math.prod(v.shape[:-1]) if per_row else 1
        words = self.h["zeros"](x, rows, "uint32")
        self.h["launcher"](x).amax(
            v,
            self.h["view"](words).ptr,
            per_row=per_row,
            propagate=propagate,
            stream=self.h["stream"](x),
        )
        a = self.h["as_float32"](words)
        return a.reshape((*v.shape[:-1], 1)) if per_row else a.reshape(())

    def quantize(
        self, x: Any, scale: Any, c: Cast, *, out: Any = None, check: bool = True
    ) -> tuple[Any, Any]:
        """(uint8 codes, amax) of x cast as `c` (``cast_options``); `out` (a C-contiguous
        uint8 device array) is written in place when given.  check=False takes a host
        scale as it is (a recipe's computed scale, which may be 0 or NaN) instead of
        refusing what is not positive and finite."""
        v = self.h["view"](x)
        self._check_float(v)
        name = c.name
        per_row = row_axis(Shape(v.shape), c.axis)
        rows = math.prod(v.shape[:-1]) if per_row else None
        if out is not None:
            o = self.h["view"](out)
            if o.dtype not in ("uint8", name):
                raise TypeError(f"out must be uint8 or {name}, got {o.dtype}")
            if tuple(o.shape) != tuple(v.shape):
                raise ValueError(f"out must have the input's shape {tuple(v.shape)}, got {o.shape}")
            if not contiguous(o):
                raise ValueError("out must be a writable C-contiguous array")
        if check:
            by_value, words = self._scale(x, scale, rows)
        else:
            s = np.asarray(scale, np.float32)
            by_value, words = (
                (float(s), None)
                if rows is None
                else (0.0, self.h["upload"](x, np.ascontiguousarray(s).reshape(rows)))
            )
        q = out if out is not None else self.h["empty"](x, tuple(v.shape), "uint8")
        amaxes = self.h["zeros"](x, rows or 1, "uint32")
        self.h["launcher"](x).cast(
            v,
            self.h["view"](q).ptr,
            self.h["view"](amaxes).ptr,
            fmt=name,
            scale=by_value,
            scales_ptr=self.h["view"](words).ptr if words is not None else 0,
            per_row=per_row,
            flags=self._flags(c.saturate, c.nan_sign, c.propagate),
            stream=self.h["stream"](x),
        )
        a = self.h["as_float32"](amaxes)
        return q, (a.reshape((*v.shape[:-1], 1)) if per_row else a.reshape(()))

    def dequantize(
        self,
        q: Any,
        scale: Any,
        dtype: str = "float32",
        *,
        axis: int | None = None,
        fmt: str | None = None,
    ) -> Any:
        """float32(q) / scale rounded once to `dtype` (a name), from uint8 codes (`fmt` names
        their format) or float8 ones."""
        v = self.h["view"](q)
        if v.dtype == "uint8":
            if fmt is None:
                raise ValueError("fmt must name the format of uint8 codes, got None")
            name = format_name(fmt)
        elif v.dtype in ("float8_e4m3fn", "float8_e5m2"):
            name = v.dtype
            if fmt is not None and format_name(fmt) != name:
                raise ValueError(f"fmt must be q's format {name}, got {fmt!r}")
        else:
            raise TypeError(f"q must be float8_e4m3fn, float8_e5m2 or uint8, got {v.dtype}")
        if dtype not in ("float32", "float16", "bfloat16"):
            raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
        per_row = row_axis(Shape(v.shape), axis)
        by_value, words = self._scale(q, scale, math.prod(v.shape[:-1]) if per_row else None)
        out = self.h["empty"](q, tuple(v.shape), dtype)
        self.h["launcher"](q).dequantize(
            v,
            self.h["view"](out).ptr,
            dtype,
            fmt=name,
            scale=by_value,
            scales_ptr=self.h["view"](words).ptr if words is not None else 0,
            per_row=per_row,
            stream=self.h["stream"](q),
        )
        return out


@functools.cache
def cupy_arrays() -> Float8Arrays:
    """``Float8Arrays`` bound to CuPy arrays and ``CupyBackend`` (a launcher per device),
    launching on CuPy's current stream; CuPy has no bfloat16, so its inputs and outputs
    are float32 and float16."""
    return Float8Arrays(**cupy_hooks(Float8Launcher))
