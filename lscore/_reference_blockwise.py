"""NumPy-only twin of the compiled blockwise FP8 passes (float32 block scales) and of square
weight tiles; slow, obvious, used only by tests.

The float32 scale rules of TransformerEngine v2.18's Float8BlockScaling
("te-fp32") and torchao v0.18.0's blockwise FP8 training ("torchao-fp32")
written from their sources one block at a time, with Python floats and
``frexp`` where the compiled rules use float32 bit masks, so that agreement
means something; and the tiles of a weight (blockwise 128x128, MXFP8 32x32)
as blocks of t * t values: the tiles copied out into rows, the compiled
passes read them in place.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lscore._reference_fp8 import f32, fp8_cast
from lscore._reference_mx import mx_quantize

# the largest finite value of each input dtype: TE's value_for_inf
# (TE:transformer_engine/common/common.h:706-716, TypeExtrema)
_INPUT_MAX = {
    "float32": float(np.finfo(np.float32).max),
    "bfloat16": float.fromhex("0x1.FEp127"),
    "float16": 65504.0,
}
_TOP = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
# the NaN an x86 CPU writes for Inf * 0 (its "default NaN", the sign bit set): torch's
_X86_NAN = np.uint32(0xFFC00000).view(np.float32)


def blockwise_scale(
    amax: Any, elem: str, rule: str, pow2: bool = False, eps: float = 0.0, dtype: str = "float32"
) -> tuple[np.ndarray, np.ndarray]:
    """(scale, scale_inv) float32 arrays of each float32 block amax.

    te-fp32 (TE's compute_scale_from_amax): an amax below float32(eps) counts as it; Inf,
    0 or NaN gives 1; else fp8_max / amax rounded to float32, an Inf quotient the input
    dtype's largest value, with pow2 the largest power of two not above it.  torchao-fp32:
    fp8_max / max(amax, eps) in float64 rounded to float32 (Inf: 0, NaN: NaN).  scale_inv
    is 1 / scale rounded to float32.
    """
    top = _TOP[elem]
    scales, invs = [], []
    for a in np.asarray(amax, np.float32).ravel().tolist():
        if rule == "te-fp32":
            a = max(a, f32(eps)) if not math.isnan(a) else a
            if math.isnan(a) or math.isinf(a) or a == 0:
                s = 1.0
            else:
                s = f32(top / a)
                if math.isinf(s):
                    s = _INPUT_MAX[dtype]
                if pow2:
                    s = 2.0 ** (math.frexp(s)[1] - 1)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                s = f32(np.float64(top) / np.float64(max(a, eps) if not math.isnan(a) else a))
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = f32(np.float64(1.0) / np.float64(s))
        scales.append(s)
        invs.append(inv)
    shape = np.shape(amax)
    return np.array(scales, np.float32).reshape(shape), np.array(invs, np.float32).reshape(shape)


def blockwise_quantize(
    x: Any,
    elem: str,
    rule: str,
    block: int = 128,
    pow2: bool = False,
    eps: float = 0.0,
    dtype: str = "float32",
) -> tuple[np.ndarray, np.ndarray]:
    """Reference for lscore._ext._mx.quantize under a float32 rule: (scale_inv float32,
    element codes) of the blocks of `block` along the last axis of x (float32 values of an
    input of `dtype`; a whole number of blocks).

    te-fp32: the block amax skips NaN elements (fmaxf); each element times the scale in
    float32, cast RN-satfinite, a NaN 0x7F.  torchao-fp32: the amax is NaN when an element
    is; a NaN scale makes every element its NaN (0x7F), Inf * 0 is the x86 NaN (0xFF, torch
    on the CPU); the product clamped to +-fp8_max, then cast keeping a NaN's sign.
    """
    v = np.asarray(x, np.float32)
    b = v.reshape(*v.shape[:-1], v.shape[-1] // block, block)
    mags = np.abs(b)
    if rule == "te-fp32":
        amax = np.where(np.isnan(mags), 0, mags).max(axis=-1, initial=0)
    else:
        amax = mags.max(axis=-1, initial=0)
    s, inv = blockwise_scale(amax, elem, rule, pow2, eps, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        p = (b * s[..., None]).astype(np.float32)
    if rule == "te-fp32":
        codes = fp8_cast(p, 1.0, elem, saturate=True, nan_sign=False)[0]
    else:
        sn = np.broadcast_to(s[..., None], p.shape)
        p = np.where(np.isnan(sn), sn, p)
        p = np.where(np.isnan(p) & ~np.isnan(b) & ~np.isnan(sn), _X86_NAN, p)
        top = np.float32(_TOP[elem])
        p = np.where(p > top, top, np.where(p < -top, -top, p)).astype(np.float32)
        codes = fp8_cast(p, 1.0, elem, saturate=True, nan_sign=True)[0]
    return inv, codes.reshape(v.shape)


def to_tiles(x: Any, t: int) -> np.ndarray:
    """The square tiles of side t of x's last two axes, zero-padded to whole tiles, as rows
    of t * t values (row-major within a tile): shape (..., ceil(M/t), ceil(K/t), t * t)."""
    v = np.asarray(x)
    *lead, m, k = v.shape
    pm, pk = -m % t, -k % t
    padded = np.zeros((*lead, m + pm, k + pk), v.dtype)
    padded[..., :m, :k] = v
    tm, tk = (m + pm) // t, (k + pk) // t
    tiles = padded.reshape(*lead, tm, t, tk, t).swapaxes(-3, -2)
    return np.ascontiguousarray(tiles).reshape(*lead, tm, tk, t * t)


def from_tiles(rows: Any, shape: tuple[int, ...], t: int) -> np.ndarray:
    """The inverse of to_tiles: an array of `shape` (the input's) from its tiles' rows."""
    r = np.asarray(rows)
    *lead, tm, tk, _ = r.shape
    full = r.reshape(*lead, tm, tk, t, t).swapaxes(-3, -2).reshape(*lead, tm * t, tk * t)
    return np.ascontiguousarray(full[..., : shape[-2], : shape[-1]])


def tile_quantize(
    x: Any,
    elem: str,
    mode: str,
    t: int,
    pow2: bool = False,
    eps: float = 0.0,
    dtype: str = "float32",
) -> tuple[np.ndarray, np.ndarray]:
    """Reference for lscore._ext._mx.quantize(tile=True): (one scale per t x t tile, shaped
    (..., ceil(M/t), ceil(K/t)); the element codes of x's shape) of x's last two axes, each
    tile quantized as one block of its t * t values by `mode` (an MX rule or a float32 one;
    float8 elements), a partial tile as if padded with zeros."""
    v = np.asarray(x, np.float32)
    rows = to_tiles(v, t)
    if mode in ("te-fp32", "torchao-fp32"):
        s, q = blockwise_quantize(rows, elem, mode, t * t, pow2, eps, dtype)
    else:
        s, q = mx_quantize(rows, elem, mode, t * t)
    return s.reshape(rows.shape[:-1]), from_tiles(q, v.shape, t)
