"""Quantize to float8 and back, per tensor or per row, for NumPy arrays.

Design: the rule is torchao's (``torchao/float8/float8_training_tensor.py``
v0.18.0 and TransformerEngine's cast): ``q = fp8(float32(x) * scale)``,
the product rounded to float32 and then to the format (round to nearest
even; the saturation and NaN rules of ``lscore.kernels.fp8_cast``), and
``dequantize(q, scale) = float32(q) / scale``.  ``quantize`` is the one
pass of delayed scaling: the cast with a given scale, which also returns
the input's amax from the same read.  ``amax`` is the first pass of current
scaling.  Per row (``axis=-1``) each row along the last axis has its own
float32 scale and amax (torchao's axiswise granularity, ``keepdim=True``:
amaxes have the input's shape with the last axis 1).  Every pass reads the
input where it lies (any strides, no copy) and writes only the result.
Codes come back as ml_dtypes' float8 dtypes (views of the bytes).
Arguments are checked before anything is written.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from lscore import kernels
from lscore.fp8.checks import (
    Cast,
    cast_options,
    check_scale,
    dtype_name,
    float_input,
    format_name,
    fp8_dtype,
    nan_rule,
    out_dtype,
    row_axis,
    row_shape,
    rows_of,
)

__all__ = ["Float8", "amax", "dequantize", "quantize", "quantize_current"]


def _out(x: np.ndarray, out: Any, name: str) -> np.ndarray:
    if out is None:
        return np.empty(x.shape, np.uint8)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a NumPy array, got {type(out).__name__}")
    if dtype_name(out.dtype) not in ("uint8", name):
        raise TypeError(f"out must be uint8 or {name}, got {out.dtype}")
    if out.shape != x.shape:
        raise ValueError(f"out must have the input's shape {x.shape}, got {out.shape}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out must be a writable C-contiguous array")
    if np.shares_memory(out, x):
        raise ValueError("out must not overlap x")
    return out


def _device(x: Any) -> Any:
    """lscore.cuda's float8 kernels over CuPy arrays when x is a device array, else None."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__cuda_array_interface__"):
        return None
    from lscore.cuda.fp8 import cupy_arrays

    return cupy_arrays()


def amax(x: np.ndarray, axis: int | None = None, nan: str = "ignore") -> Any:
    """The largest ``|x|`` (float32), per tensor or per row (``axis=-1``: ``x.shape[:-1] + (1,)``).

    `nan`: "ignore" leaves NaN elements out (TransformerEngine's ``fmaxf``
    reduction), "propagate" makes the amax NaN where there is one
    (``torch.max``).  ±Inf gives Inf; an empty input or row gives 0.  A
    CuPy array gives a CuPy float32 array (0-d per tensor).
    """
    dev = _device(x)
    if dev is not None:
        return dev.amax(x, axis, nan)
    x = float_input(x)
    rows, propagate = row_axis(x, axis), nan_rule(nan)
    if not rows:
        return np.float32(kernels.fp8_amax(x, propagate))
    result = np.empty(rows_of(x), np.float32)
    kernels.fp8_amax_rows(x, result, propagate)
    return result.reshape(row_shape(x))


def quantize(
    x: np.ndarray,
    scale: Any,
    fmt: str = "e4m3fn",
    *,
    axis: int | None = None,
    saturate: bool = True,
    nan_sign: bool = True,
    amax_nan: str = "ignore",
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, Any]:
    """``(fp8(float32(x) * scale), amax(x))`` in one pass: delayed scaling's cast.

    `scale` is a positive finite float32 (per tensor) or, with ``axis=-1``,
    one per row (any array of that many values, e.g. shape
    ``x.shape[:-1] + (1,)``).  saturate: overflow and ±Inf give ±the
    largest finite value (always so for e4m3fn in torch >= 2.12 and
    TransformerEngine; without it e5m2 gives ±Inf, e4m3fn NaN); nan_sign: a
    NaN keeps its sign (torch: 0xFF when negative), else it is always 0x7F
    (TransformerEngine); amax_nan as `amax`'s `nan`.  Returns the codes
    (ml_dtypes' float8 dtype, or `out` itself, uint8 or float8, written in
    place) and the input's amax as `amax` returns it.  A CuPy array (float32
    or float16, any layout whose leading axes merge into one stride) gives
    CuPy uint8 codes and amax; its scale may also be a CuPy float32 array
    (per row), read on the device.
    """
    return quantize_as(x, scale, cast_options(fmt, axis, saturate, nan_sign, amax_nan), out)


def quantize_as(x: np.ndarray, scale: Any, c: Cast, out: Any = None) -> tuple[np.ndarray, Any]:
    """``quantize`` with its options checked once into `c` (``cast_options``)."""
    dev = _device(x)
    if dev is not None:
        return dev.quantize(x, scale, c, out=out)
    x = float_input(x)
    rows = row_axis(x, c.axis)
    s = check_scale(scale, rows_of(x) if rows else None)
    q = _out(x, out, c.name)
    if rows:
        amaxes = np.empty(rows_of(x), np.float32)
        kernels.fp8_cast_rows(x, q, s, amaxes, c.name, c.saturate, c.nan_sign, c.propagate)
        a: Any = amaxes.reshape(row_shape(x))
    else:
        a = np.float32(
            kernels.fp8_cast(x, q, float(s), c.name, c.saturate, c.nan_sign, c.propagate)
        )
    return (q if out is not None else q.view(fp8_dtype(c.name))), a


@dataclasses.dataclass(frozen=True)
class Float8:
    """A quantized tensor: `data` (float8 codes), `scale` and `scale_inv` (float32, 0-d or
    one per row with the input's shape and last axis 1: ``data = fp8(x * scale)``,
    ``scale_inv = 1 / scale`` rounded to float32), the input's `amax` (same shape) and
    `fmt` ("e4m3fn" or "e5m2").  Arrays of the input's framework."""

    data: Any
    scale: Any
    scale_inv: Any
    amax: Any
    fmt: str


def _short(name: str) -> str:
    return name.removeprefix("float8_")


def cast_flags(recipe: Any, name: str) -> tuple[bool, bool]:
    """(saturate, nan_sign) of a recipe's cast to format `name`: e4m3fn always saturates."""
    return (name == "float8_e4m3fn" or bool(recipe.saturate)), bool(recipe.nan_sign)


def quantize_current(x: np.ndarray, recipe: Any, fmt: str | None = None) -> Float8:
    """Current scaling of x in two passes: the amax, the recipe's scale, the cast.

    `recipe` is an ``lscore.fp8.Recipe`` (its granularity picks per tensor or
    per row, its ``amax_nan`` the amax's NaN rule, ``scale_from_amax`` the
    scale, ``saturate`` and ``nan_sign`` the cast); `fmt` defaults to its
    forward format.  The scale is the recipe's even where it is 0 or NaN
    (torchao's rule for an Inf or NaN amax), and the cast then gives what
    torchao's does.  A CuPy array reads its amax back to the host once.
    """
    from lscore.fp8.recipes import Recipe

    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an lscore.fp8.Recipe, got {type(recipe).__name__}")
    name = format_name(recipe.forward_format if fmt is None else fmt)
    dev = _device(x)
    if dev is not None:
        return current_on(dev, x, recipe, name)
    axis = -1 if recipe.granularity == "row" else None
    saturate, nan_sign = cast_flags(recipe, name)
    x = float_input(x)
    rows = row_axis(x, axis)
    a = amax(x, axis, recipe.amax_nan)
    s = recipe.scale_from_amax(a, _short(name)).reshape(np.shape(a))
    q = np.empty(x.shape, np.uint8)
    if rows:
        kernels.fp8_cast_rows(
            x,
            q,
            np.ascontiguousarray(s).reshape(rows_of(x)),
            np.empty(rows_of(x), np.float32),
            name,
            saturate,
            nan_sign,
        )
    else:
        kernels.fp8_cast(x, q, float(s), name, saturate, nan_sign)
        s = s[()]  # a float32 scalar, as amax returns it
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.float32(1) / s
    return Float8(q.view(fp8_dtype(name)), s, inv, a, _short(name))


def current_on(dev: Any, x: Any, recipe: Any, name: str) -> Float8:
    """quantize_current of a device array through `dev` (an ``lscore.cuda.fp8.Float8Arrays``):
    the amax on the device, read back once, the recipe's scale on the host, the cast."""
    axis = -1 if recipe.granularity == "row" else None
    saturate, nan_sign = cast_flags(recipe, name)
    a = dev.amax(x, axis, recipe.amax_nan)
    a_host = np.asarray(dev.h["to_host"](a), np.float32)
    s = recipe.scale_from_amax(a_host, _short(name)).reshape(a_host.shape)
    q, _ = dev.quantize(x, s, cast_options(name, axis, saturate, nan_sign), check=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.float32(1) / s
    up = dev.h["upload"]
    return Float8(
        q,
        up(x, np.ascontiguousarray(s).ravel()).reshape(s.shape),
        up(x, np.ascontiguousarray(inv).ravel()).reshape(s.shape),
        a,
        _short(name),
    )


def dequantize(
    q: np.ndarray,
    scale: Any,
    dtype: Any = np.float32,
    *,
    axis: int | None = None,
    fmt: str | None = None,
) -> np.ndarray:
    """``float32(q) / scale``, rounded once to `dtype` (float32, float16 or bfloat16).

    torchao's dequantize (``data.to(float32) / scale``).  `q` holds float8
    codes: an ml_dtypes float8 array, or uint8 with `fmt` naming the
    format.  `scale` as `quantize` takes it (per row with ``axis=-1``).  CuPy
    uint8 codes give a CuPy array (float32 or float16).
    """
    dev = _device(q)
    if dev is not None:
        return dev.dequantize(q, scale, np.dtype(dtype).name, axis=axis, fmt=fmt)
    if not isinstance(q, np.ndarray):
        raise TypeError(f"q must be a NumPy array, got {type(q).__name__}")
    qname = dtype_name(q.dtype)
    if qname == "uint8":
        if fmt is None:
            raise ValueError("fmt must name the format of uint8 codes, got None")
        name = format_name(fmt)
    else:
        if qname not in ("float8_e4m3fn", "float8_e5m2"):
            raise TypeError(f"q must be float8_e4m3fn, float8_e5m2 or uint8, got {q.dtype}")
        name = qname
        if fmt is not None and format_name(fmt) != name:
            raise ValueError(f"fmt must be q's format {name}, got {fmt!r}")
    dname = out_dtype(dtype)
    rows = row_axis(q, axis)
    s = check_scale(scale, rows_of(q) if rows else None)
    result = np.empty(q.shape, fp8_dtype(dname) if dname == "bfloat16" else dname)
    decode_into(q, result, s, name, rows)
    return result


def decode_into(q: np.ndarray, out: np.ndarray, scale: Any, name: str, rows: bool) -> None:
    """Write float32(q) / scale into `out`: the checked arguments of `dequantize`."""
    if rows:
        kernels.fp8_decode_rows(q, out, scale, name)
    else:
        kernels.fp8_decode(q, out, name, float(scale))
