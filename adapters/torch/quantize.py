"""Quantize torch tensors to float8 and back, per tensor or per row (``lscore.fp8``'s rule).

Design: a CPU tensor goes to the compiled kernels as a NumPy view of its own
memory (bfloat16 through an int16 view of the same bytes; any strides, no
copy) and the codes come back as a ``torch.float8_e4m3fn`` /
``torch.float8_e5m2`` view of a uint8 tensor the kernel wrote; every check
is ``lscore.fp8.quantize``'s, made before anything is written.  Scales and
amaxes are float32 tensors: a 0-d one per tensor, shape ``x.shape[:-1] +
(1,)`` per row (torchao's axiswise ``keepdim=True``).  A CUDA tensor goes
to lscore.cuda's float8 kernels (CuPy launches them, on torch's current
stream), read in place when its leading axes merge into one stride.
Block-scaled formats (``quantize_blocks`` / ``dequantize_blocks``) take the
same zero-copy route on the CPU and give a ``lscore.fp8.BlockScaled`` of
tensors (torch's float8 dtypes, ``torch.float8_e8m0fnu`` scales).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

import numpy as np
import torch

from lscore.fp8 import (
    BlockScaled,
    BlockStats,
    Float8,
    block_dequant,
    block_diagnostics,
    blocks,
    casting,
    checks,
)

__all__ = [
    "amax",
    "block_stats",
    "dequantize",
    "dequantize_blocks",
    "quantize",
    "quantize_blocks",
    "quantize_current",
]

_TORCH_FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
_FLOATS = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_TORCH_SCALES = {"float8_e8m0fnu": torch.float8_e8m0fnu, "float8_e4m3fn": torch.float8_e4m3fn}


def _cpu(t: Any, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"{what} must be a CPU or CUDA tensor, got one on {t.device}")
    return t


def _on_cuda(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


def _torch_hooks(make_launcher: Any) -> dict[str, Any]:
    """The hooks that bind an arrays class of lscore.cuda (``Float8Arrays``,
    ``BlockArrays``) to CUDA tensors, bfloat16 included: a launcher per device,
    ``make_launcher(CupyBackend(device))``, launching on torch's current stream."""
    from lscore.cuda.cupy_backend import CupyBackend
    from lscore.cuda.views import DeviceView

    launchers: dict[int, Any] = {}

    def view(t: torch.Tensor) -> Any:
        w = t.element_size()
        name = str(t.dtype).removeprefix("torch.")
        return DeviceView(
            t.data_ptr(),
            tuple(t.shape),
            tuple(s * w for s in t.stride()),
            "uint32" if name == "int32" else name,
            w,
        )

    def launcher(t: torch.Tensor) -> Any:
        dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
        if dev not in launchers:
            launchers[dev] = make_launcher(CupyBackend(dev))
        return launchers[dev]

    def dtype(name: str) -> torch.dtype:
        return torch.int32 if name == "uint32" else getattr(torch, name)

    return dict(
        view=view,
        empty=lambda like, shape, dt: torch.empty(shape, dtype=dtype(dt), device=like.device),
        zeros=lambda like, n, dt: torch.zeros(n, dtype=dtype(dt), device=like.device),
        upload=lambda like, host: torch.from_numpy(host).to(like.device),
        as_float32=lambda w: w.view(torch.float32),
        to_host=lambda t: t.cpu().numpy(),
        all_positive_finite=lambda a: bool(((a > 0) & a.isfinite()).all()),
        launcher=launcher,
        stream=lambda t: torch.cuda.current_stream(t.device).cuda_stream,
    )


@functools.cache
def _cuda() -> Any:
    """lscore.cuda's Float8Arrays bound to CUDA tensors."""
    from lscore.cuda.fp8 import Float8Arrays, Float8Launcher

    return Float8Arrays(**_torch_hooks(Float8Launcher))


@functools.cache
def _cuda_blocks() -> Any:
    """lscore.cuda.mx's BlockArrays bound to CUDA tensors (the block kernels read bfloat16
    tensors in place, which a CuPy array cannot hold)."""
    _require_cuda_blocks()
    from lscore.cuda.mx import BlockArrays, MxLauncher

    return BlockArrays(**_torch_hooks(MxLauncher))


def _view(x: Any, what: str = "x") -> np.ndarray:
    """A NumPy view of the CPU float tensor x's memory (strides kept)."""
    x = _cpu(x, what)
    if x.dtype not in _FLOATS:
        raise TypeError(f"{what} must be float32, float16 or bfloat16, got {x.dtype}")
    x = x.detach()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(checks.fp8_dtype("bfloat16"))
    return x.numpy()


def _scale(scale: Any) -> Any:
    """A scale as lscore.fp8 takes it: a number (a 0-d tensor read once), a NumPy vector (a
    CPU tensor), or a contiguous float32 CUDA tensor, read on the device (per row)."""
    if not isinstance(scale, torch.Tensor):
        return scale
    if not scale.is_floating_point():
        raise ValueError(f"scale must be a positive finite float32, got a {scale.dtype} tensor")
    s = scale.detach().float()
    if s.dim() == 0:
        return np.float32(s.item())
    return s.contiguous() if _on_cuda(s) else s.numpy()


def amax(x: torch.Tensor, axis: int | None = None, nan: str = "ignore") -> torch.Tensor:
    """``lscore.fp8.amax`` of a tensor: a float32 tensor (0-d, or ``x.shape[:-1] + (1,)``)."""
    if _on_cuda(x):
        return _cuda().amax(x.detach(), axis, nan)
    return torch.as_tensor(casting.amax(_view(x), axis, nan))


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
    c = checks.cast_options(fmt, axis, saturate, nan_sign, amax_nan)
    name = c.name
    if _on_cuda(x):
        if out is not None and not _on_cuda(out):
            raise TypeError(f"out must be on x's device {x.device}, got {out.device}")
        q, a = _cuda().quantize(
            x.detach(), _scale(scale), c, out=None if out is None else out.view(torch.uint8)
        )
        return (out if out is not None else q.view(_TORCH_FP8[name])), a
    xv = _view(x)
    if out is None:
        q = torch.empty(tuple(xv.shape), dtype=torch.uint8)
    else:
        q = _cpu(out, "out")
        if q.dtype not in (torch.uint8, _TORCH_FP8[name]):
            raise TypeError(f"out must be uint8 or {_TORCH_FP8[name]}, got {q.dtype}")
        if not q.is_contiguous():
            raise ValueError("out must be a writable C-contiguous array")
    _, a = casting.quantize_as(xv, _scale(scale), c, out=q.view(torch.uint8).numpy())
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
    if _on_cuda(q):
        if dtype not in _FLOATS:
            raise TypeError(f"dtype must be torch.float32, float16 or bfloat16, got {dtype!r}")
        return _cuda().dequantize(q.detach(), _scale(scale), _FLOATS[dtype], axis=axis, fmt=fmt)
    q = _cpu(q, "q")
    names = {v: k for k, v in _TORCH_FP8.items()}
    if q.dtype in names:
        name = names[q.dtype]
        if fmt is not None and checks.format_name(fmt) != name:
            raise ValueError(f"fmt must be q's format {name}, got {fmt!r}")
    elif q.dtype == torch.uint8:
        if fmt is None:
            raise ValueError("fmt must name the format of uint8 codes, got None")
        name = checks.format_name(fmt)
    else:
        raise TypeError(f"q must be float8_e4m3fn, float8_e5m2 or uint8, got {q.dtype}")
    if dtype not in _FLOATS:
        raise TypeError(f"dtype must be torch.float32, float16 or bfloat16, got {dtype!r}")
    codes = q.detach().view(torch.uint8).numpy()
    out = torch.empty(tuple(q.shape), dtype=dtype)
    ov = _view(out, "out")
    rows = checks.rows_of(codes) if checks.row_axis(codes, axis) else None
    s = checks.check_scale(_scale(scale), rows)
    casting.decode_into(codes, ov, s, name, axis is not None)
    return out


def quantize_current(x: torch.Tensor, recipe: Any, fmt: str | None = None) -> Float8:
    """``lscore.fp8.quantize_current`` of a tensor: a ``lscore.fp8.Float8`` of tensors (the
    codes as torch's float8 dtype, the scale, scale_inv and amax float32 on x's device)."""
    from lscore.fp8.recipes import Recipe

    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an lscore.fp8.Recipe, got {type(recipe).__name__}")
    name = checks.format_name(recipe.forward_format if fmt is None else fmt)
    if _on_cuda(x):
        r = casting.current_on(_cuda(), x.detach(), recipe, name)
        data = r.data.view(_TORCH_FP8[name])
        return Float8(data, r.scale, r.scale_inv, r.amax, r.fmt)
    r = casting.quantize_current(_view(x), recipe, name)
    return Float8(
        torch.from_numpy(r.data.view(np.uint8)).view(_TORCH_FP8[name]),
        torch.as_tensor(r.scale),
        torch.as_tensor(r.scale_inv),
        torch.as_tensor(r.amax),
        r.fmt,
    )


def _require_cuda_blocks() -> None:
    """A TypeError naming what is missing where lscore.cuda.mx's block kernels are not built."""
    try:  # by name: the CUDA block kernels are an optional part of the build
        importlib.import_module("lscore.cuda.mx")
    except ImportError as e:
        raise TypeError(
            "block-scaled quantization of a CUDA tensor needs lscore.cuda.mx's "
            f"kernels, which this build lacks ({e})"
        ) from None


def _raw(t: torch.Tensor) -> torch.Tensor:
    """Codes as the kernels take them: uint8, float32 scales (blockwise FP8) as they are."""
    return t if t.dtype == torch.float32 else t.view(torch.uint8)


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor over NumPy codes (ml_dtypes float8 or uint8, or float32 scales), as
    torch's dtype of them."""
    name = checks.dtype_name(a.dtype)
    if name == "float32":
        return torch.from_numpy(a)
    t = torch.from_numpy(a.view(np.uint8))
    if name in _TORCH_FP8:
        return t.view(_TORCH_FP8[name])
    return t.view(_TORCH_SCALES[name]) if name in _TORCH_SCALES else t


def quantize_blocks(
    x: torch.Tensor,
    recipe: Any,
    *,
    axis: int = -1,
    role: str | None = None,
    element: str | None = None,
    out: BlockScaled | None = None,
    seed: int | None = None,
    offset: int = 0,
) -> BlockScaled:
    """``lscore.fp8.quantize_blocks`` of a tensor: a ``BlockScaled`` of tensors.

    `data` is ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` (uint8 for
    E2M1, two codes a byte), `scales` ``torch.float8_e8m0fnu`` (MX),
    ``torch.float8_e4m3fn`` (NVFP4) or ``torch.float32`` (blockwise FP8:
    the inverse scales); a CPU tensor (float32, float16 or bfloat16, any
    strides) is read in place.  `role` ("input", "weight", "grad") picks
    the element format and a weight's square tiles, as in
    ``lscore.fp8.quantize_blocks``.  A CUDA tensor goes to the CUDA block
    kernels, which read it in place, and its codes stay on its device.
    `out`, the result of an earlier call on a CPU tensor with the same
    recipe, element, axis, role and shape, has its tensors written in place
    and is returned with this call's tensor scale, as in
    ``lscore.fp8.quantize_blocks``, whose `role`, `seed` and `offset` these
    are (TE's NVFP4 recipe, ``te-nvfp4``, on either device).
    """
    if out is not None and not isinstance(out, BlockScaled):
        raise TypeError(f"out must be an lscore.fp8.BlockScaled, got {type(out).__name__}")
    if _on_cuda(x):
        if out is not None:
            raise TypeError("out= takes CPU tensors; a CUDA tensor gets new device tensors")
        r = blocks.as_block_recipe(recipe)
        elem = r.role_element(role) if element is None else r.allows(element)
        b = blocks.quantize_on(
            _cuda_blocks(), _cuda(), x.detach(), r, elem, axis, role, seed, offset
        )
        data = b.data
        if b.element != "e2m1":
            data = data.view(_TORCH_FP8[blocks.element_dtype(b.element)])
        if r.scale_format == "float32":
            return dataclasses.replace(b, data=data, scales=b.scales.view(torch.float32))
        scale_name = "float8_e8m0fnu" if r.scale_format == "e8m0" else "float8_e4m3fn"
        return dataclasses.replace(b, data=data, scales=b.scales.view(_TORCH_SCALES[scale_name]))
    raw = None
    if out is not None:
        raw = dataclasses.replace(
            out,
            data=_codes_in_place(out.data, "out.data"),
            scales=_codes_in_place(out.scales, "out.scales"),
        )
    b = blocks.quantize_blocks(
        _view(x), recipe, axis=axis, role=role, element=element, out=raw, seed=seed, offset=offset
    )
    if out is not None:
        return dataclasses.replace(out, tensor_scale=b.tensor_scale)
    return dataclasses.replace(b, data=_tensor(b.data), scales=_tensor(b.scales))


def _codes_in_place(t: Any, what: str) -> np.ndarray:
    """The bytes of a contiguous CPU tensor of codes, as a NumPy array over its storage."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(
            f"{what} must be a CPU tensor, as out= takes for a CPU input, got {t.device}"
        )
    if not t.is_contiguous():
        raise ValueError(f"{what} must be a C-contiguous tensor")
    return _raw(t.detach()).numpy()


def dequantize_blocks(b: BlockScaled, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``lscore.fp8.dequantize_blocks`` of a ``BlockScaled`` of tensors: a tensor of `dtype`
    (torch.float32, float16 or bfloat16) on the codes' device."""
    if not isinstance(b, BlockScaled):
        raise TypeError(f"b must be an lscore.fp8.BlockScaled, got {type(b).__name__}")
    if dtype not in _FLOATS:
        raise TypeError(f"dtype must be torch.float32, float16 or bfloat16, got {dtype!r}")
    for name in ("data", "scales"):
        if not isinstance(getattr(b, name), torch.Tensor):
            raise TypeError(
                f"b.{name} must be a torch.Tensor, got {type(getattr(b, name)).__name__}"
            )
    if _on_cuda(b.data):
        if b.scales.device != b.data.device:
            raise ValueError(
                f"b.scales must be on b.data's device {b.data.device}, got {b.scales.device}"
            )
        raw = dataclasses.replace(b, data=b.data.view(torch.uint8), scales=_raw(b.scales))
        return block_dequant.dequantize_on(_cuda_blocks(), raw, _FLOATS[dtype])
    raw = dataclasses.replace(
        b,
        data=_cpu(b.data, "b.data").detach().contiguous().view(torch.uint8).numpy(),
        scales=_raw(_cpu(b.scales, "b.scales").detach().contiguous()).numpy(),
    )
    y = block_dequant.dequantize_blocks(raw, _FLOATS[dtype])
    if dtype == torch.bfloat16:
        return torch.from_numpy(y.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(y)


def block_stats(
    x: torch.Tensor,
    recipe: Any,
    *,
    axis: int = -1,
    role: str | None = None,
    element: str | None = None,
    seed: int | None = None,
    offset: int = 0,
) -> BlockStats:
    """``lscore.fp8.block_stats`` of a tensor: what quantizing it in blocks by `recipe`
    produces (saturated, flushed, the scale exponents' histogram), with the same arguments.

    A CPU tensor (float32, float16 or bfloat16, any strides) is read in place; a CUDA
    tensor is copied to the host and counted there (the codes are the CUDA kernels' bit for
    bit)."""
    if _on_cuda(x):
        x = x.detach().cpu()
    return block_diagnostics.block_stats(
        _view(x), recipe, axis=axis, role=role, element=element, seed=seed, offset=offset
    )
