"""Quantize torch tensors to float8 and back, per tensor or per row (``lscore.fp8``'s rule).

Design: a CPU tensor goes to the compiled kernels as a NumPy view of its own
memory (bfloat16 through an int16 view of the same bytes; any strides, no
copy) and the codes come back as a ``torch.float8_e4m3fn`` /
``torch.float8_e5m2`` view of a uint8 tensor the kernel wrote; every check
is ``lscore.fp8.quantize``'s, made before anything is written.  Scales and
amaxes are float32 tensors: a 0-d one per tensor, shape ``x.shape[:-1] +
(1,)`` per row (torchao's axiswise ``keepdim=True``).  A CUDA tensor raises
a TypeError naming the CPU as the device these functions take.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lscore.fp8 import quantize as _q

__all__ = ["amax", "dequantize", "quantize"]

_TORCH_FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
_FLOATS = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _cpu(t: Any, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"{what} must be a CPU tensor, got one on {t.device}")
    return t


def _view(x: Any, what: str = "x") -> np.ndarray:
    """A NumPy view of the CPU float tensor x's memory (strides kept)."""
    x = _cpu(x, what)
    if x.dtype not in _FLOATS:
        raise TypeError(f"{what} must be float32, float16 or bfloat16, got {x.dtype}")
    x = x.detach()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(_q.fp8_dtype("bfloat16"))
    return x.numpy()


def _scale(scale: Any) -> Any:
    """A tensor scale as NumPy (float32 values); anything else as it is."""
    if isinstance(scale, torch.Tensor):
        s = _cpu(scale, "scale").detach()
        if not s.is_floating_point():
            raise ValueError(f"scale must be a positive finite float32, got a {s.dtype} tensor")
        return s.float().numpy() if s.dim() else np.float32(s.item())
    return scale


def amax(x: torch.Tensor, axis: int | None = None, nan: str = "ignore") -> torch.Tensor:
    """``lscore.fp8.amax`` of a CPU tensor: a float32 tensor (0-d, or ``x.shape[:-1] + (1,)``)."""
    return torch.as_tensor(_q.amax(_view(x), axis, nan))


def quantize(
    x: torch.Tensor,
    scale: Any,
    fmt: str = "e4m3fn",
    *,
    axis: int | None = None,
    saturate: bool = True,
    nan_sign: bool = True,
    amax_nan: str = "ignore",
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``lscore.fp8.quantize`` of a CPU tensor: ``(codes, amax)``.

    The codes are a ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` tensor
    (or `out`, a contiguous CPU tensor of that dtype or uint8, written in
    place); `scale` a number or a float32 tensor (0-d, or one per row with
    ``axis=-1``); the amax a float32 tensor.
    """
    name = _q.format_name(fmt)
    xv = _view(x)
    if out is None:
        q = torch.empty(tuple(xv.shape), dtype=torch.uint8)
    else:
        q = _cpu(out, "out")
        if q.dtype not in (torch.uint8, _TORCH_FP8[name]):
            raise TypeError(f"out must be uint8 or {_TORCH_FP8[name]}, got {q.dtype}")
        if not q.is_contiguous():
            raise ValueError("out must be a writable C-contiguous array")
    qv = q.view(torch.uint8).numpy()
    _, a = _q.quantize(
        xv,
        _scale(scale),
        name,
        axis=axis,
        saturate=saturate,
        nan_sign=nan_sign,
        amax_nan=amax_nan,
        out=qv,
    )
    return (q if out is not None else q.view(_TORCH_FP8[name])), torch.as_tensor(a)


def dequantize(
    q: torch.Tensor,
    scale: Any,
    dtype: torch.dtype = torch.float32,
    *,
    axis: int | None = None,
    fmt: str | None = None,
) -> torch.Tensor:
    """``lscore.fp8.dequantize`` of a CPU float8 tensor: ``float32(q) / scale`` rounded once
    to `dtype` (torch.float32, float16 or bfloat16); uint8 codes need `fmt`."""
    q = _cpu(q, "q")
    names = {v: k for k, v in _TORCH_FP8.items()}
    if q.dtype in names:
        name = names[q.dtype]
        if fmt is not None and _q.format_name(fmt) != name:
            raise ValueError(f"fmt must be q's format {name}, got {fmt!r}")
    elif q.dtype == torch.uint8:
        if fmt is None:
            raise ValueError("fmt must name the format of uint8 codes, got None")
        name = _q.format_name(fmt)
    else:
        raise TypeError(f"q must be float8_e4m3fn, float8_e5m2 or uint8, got {q.dtype}")
    if dtype not in _FLOATS:
        raise TypeError(f"dtype must be torch.float32, float16 or bfloat16, got {dtype!r}")
    codes = q.detach().view(torch.uint8).numpy()
    out = torch.empty(tuple(q.shape), dtype=dtype)
    ov = _view(out, "out")
    s = _q.check_scale(_scale(scale), _q.rows_of(codes) if _q.row_axis(codes, axis) else None)
    _q.decode_into(codes, ov, s, name, axis is not None)
    return out
