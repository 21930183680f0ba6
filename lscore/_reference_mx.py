"""NumPy-only twin of the compiled block-scaled formats (MX, NVFP4); slow, obvious, used only
by tests.

E8M0 scales, E2M1 elements, the MX block-scale rules (FLOOR, CEIL, EVEN,
torchao's and TransformerEngine's RCEIL) and the MX and NVFP4 block quantize,
computed with other algorithms than the compiled ones (a nearest-value table,
``frexp`` in float64) so that agreement means something.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lscore._reference_fp8 import f32, fp8_cast, fp8_decode

# ---- block-scaled formats (MX, NVFP4) ----------------------------------------

# element format -> (emax, largest value, mantissa bits)
_MX_ELEMS = {
    "float8_e4m3fn": (8, 448.0, 3),
    "float8_e5m2": (15, 57344.0, 2),
    "float4_e2m1": (2, 6.0, 1),
}
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_NAN32 = np.uint32(0x7FC00000).view(np.float32)
_TE_NAN = np.uint32(0x7FFFFFFF).view(np.float32)  # TransformerEngine exp2f_rcp(0xFF)
# torchao after #4725: the reciprocal of the NaN scale is torch's float8_e8m0fnu NaN
# 0x7F800001, which the product with an element quiets (and which wins over an element's)
_AO_NAN = np.uint32(0x7FC00001).view(np.float32)
#: the modes of the next revisions (TE #3262, torchao #4725) -> the pinned revision's mode
_NEXT = {"te-3262": "te", **{f"{m}-4725": m for m in ("floor", "ceil", "even", "rceil")}}


def e8m0_decode(q: Any) -> np.ndarray:
    """Reference for lscore._ext._mx.e8m0_decode: code c is 2**(c - 127), 0xFF NaN."""
    c = np.asarray(q).view(np.uint8).astype(np.float64)
    return np.where(c == 255, np.nan, 2.0 ** (c - 127)).astype(np.float32)


def e2m1_encode(x: Any) -> np.ndarray:
    """Reference for lscore._ext._mx.e2m1_encode: the nearest of +-{0, 0.5, 1, 1.5, 2, 3, 4,
    6} (a tie to the even code), beyond 6 saturated, the sign bit kept; a NaN, which E2M1
    cannot hold, gets the code torchao's bit arithmetic makes of its float32 bits."""
    v = np.asarray(x, np.float32)
    out = []
    for f, b in zip(v.ravel().tolist(), v.view(np.uint32).ravel().tolist(), strict=True):
        sign = (b >> 28) & 8
        a = b & 0x7FFFFFFF
        if math.isnan(f):
            code = ((a - (126 << 23) + 0x1FFFFF + ((a >> 22) & 1)) >> 22) & 0xFF
        elif abs(f) >= 6:
            code = 7
        else:
            d = np.abs(_E2M1 - abs(f))
            best = np.flatnonzero(d == d.min())
            code = int(best[0] if len(best) == 1 else best[best % 2 == 0][0])
        out.append(code | sign)
    return np.array(out, np.uint8).reshape(v.shape)


def e2m1_decode(q: Any) -> np.ndarray:
    """Reference for lscore._ext._mx.e2m1_decode: the value of each low-nibble code."""
    c = np.asarray(q).view(np.uint8).astype(np.int64)
    return np.where(c & 8, -_E2M1[c & 7], _E2M1[c & 7]).astype(np.float32)


def mx_scale(amax: Any, elem: str, mode: str) -> np.ndarray:
    """Reference for lscore._ext._mx.scale: the E8M0 scale code of each float32 amax.

    floor: floor(log2(amax)) - emax, with zero and subnormal amaxes at 2**-127 and Inf at
    2**128; ceil: the same rounded up where amax is not a normal power of two; even: floor
    of amax rounded half up to the element's mantissa bits; all three clamped to [-127, 128]
    and biased by 127 (NaN: 0xFF).  rceil: torchao's, ceil of log2(amax / max) rounded to
    float32, clamped to [-127, 127] (NaN 0xFF, Inf 0xFE).  te: TransformerEngine's, amax *
    float32(1 / max) rounded up to a power of two (to 0xFE at most, 2**-127 below it; NaN
    0xFF, Inf 0xFE, 0 -> 0).  ocp: floor(log2(amax)) - emax, a zero amax read as 2**-126,
    at least -127; NaN and Inf (beyond 127) 0xFF.  te-3262: te's.  floor-4725, ceil-4725,
    even-4725: the pinned rule's, but 0xFF for an amax that is not finite (even: once
    rounded).  rceil-4725: amax * float32(1 / max) rounded up to a power of two
    2**(c - 127) with no ceiling (above 2**127: 0xFF), 0 for <= 2**-127; NaN, Inf 0xFF.
    """
    emax, top, mbits = _MX_ELEMS[elem]
    out = []
    base = _NEXT.get(mode, mode)
    ao_next = mode in _NEXT and base != "te"  # torchao after #4725
    for a in np.asarray(amax, np.float32).ravel().tolist():
        if math.isnan(a):
            out.append(255)
            continue
        if mode == "rceil-4725":
            d = f32(a * f32(1.0 / top))
            if math.isinf(d):
                out.append(255)
            elif d <= 2.0**-127:
                out.append(0)
            else:
                m, e = math.frexp(d)  # d = m * 2**e: the least 2**k >= d is 2**(e - 1) or 2**e
                out.append(e - 1 + 127 if m == 0.5 else e + 127)
            continue
        if ao_next and math.isinf(a):
            out.append(255)
            continue
        if mode == "rceil":
            d = f32(a / f32(top))
            if math.isinf(d):
                out.append(254)
                continue
            lg = -math.inf if d == 0 else f32(math.log2(d))
            out.append(int(min(max(math.ceil(lg) if d else -127, -127), 127)) + 127)
            continue
        if base == "te":
            d = f32(a * f32(1.0 / top))
            if math.isinf(d):
                out.append(254)
            elif d == 0 or d <= 2.0**-127:
                out.append(0)
            elif d < 2.0**-126:
                out.append(1)
            else:
                m, e = math.frexp(d)
                field = e - 1 + 127
                out.append(field if m == 0.5 or field == 254 else field + 1)
            continue
        if mode == "ocp":
            if math.isinf(a):
                out.append(255)
                continue
            m, e = math.frexp(a if a else 2.0**-126)  # a = m * 2**e, m in [0.5, 1)
            out.append(max(e - 1 - emax, -127) + 127)
            continue
        if base == "even" and 0 < a < math.inf:
            m, e = math.frexp(a)  # a = m * 2**e, m in [0.5, 1)
            if a >= 2.0**-126:
                step = 2.0 ** (e - 1 - mbits)  # the element's ulp at a
                a = f32(math.floor(a / step + 0.5) * step)
            else:  # subnormal: the half ulp added to the bits carries into the exponent or not
                a = 2.0**-126 if a + 2.0 ** (-127 - mbits) >= 2.0**-126 else 0.0
            if ao_next and math.isinf(a):  # rounded past float32's largest
                out.append(255)
                continue
        if a == 0 or a < 2.0**-126:
            e = -127
        elif math.isinf(a):
            e = 128
        else:
            e = math.frexp(a)[1] - 1
        e -= emax
        if (
            base == "ceil"
            and a != 0
            and not math.isinf(a)
            and (a < 2.0**-126 or a != 2.0 ** (e + emax))
        ):
            e += 1
        out.append(min(max(e, -127), 128) + 127)
    return np.array(out, np.uint8).reshape(np.shape(amax))


def _mx_amax(x: np.ndarray, skip_nan: bool = False) -> np.ndarray:
    """max |x| along the last axis, the quiet NaN 0x7FC00000 where a row holds a NaN; with
    `skip_nan` (TransformerEngine's fmaxf) the largest of the others, 0 for none."""
    if skip_nan:
        return np.max(np.where(np.isnan(x), np.float32(0), np.abs(x)), axis=-1).astype(np.float32)
    a = np.max(np.abs(x), axis=-1)
    return np.where(np.isnan(a), _NAN32, a).astype(np.float32)


def _mx_narrow(y: np.ndarray, elem: str, te: bool = False) -> np.ndarray:
    if elem == "float4_e2m1":
        return e2m1_encode(y)
    return fp8_cast(y, 1.0, elem, saturate=True, nan_sign=not te)[0]


def _pack4(c: np.ndarray) -> np.ndarray:
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def _times(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    """x * r in float32, a NaN r winning over a NaN x (torch's CPU product)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.isnan(r), r, x * r).astype(np.float32)


def mx_quantize(x: Any, elem: str, mode: str, block: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Reference for lscore._ext._mx.quantize: (scale codes, element codes) of the blocks of
    `block` along the last axis (E2M1 packed two per byte, the first in the low nibble).

    floor / ceil / even divide the elements by 2**(code - 127) as float32 (code 0 by
    2**-126, code 0xFF by Inf) and clamp to +-max; rceil multiplies by torchao's factor
    (0xFF: the NaN descale, 0xFE: 2**-127, 0: 1, else 2**(127 - code)) and clamps; te by
    TransformerEngine v2.18's (0xFF: NaN, 0xFE: 2**-127, else the float32 bits
    (254 - code) << 23, 2**127 for code 0); ocp divides by
    2**(code - 127) exactly (in float64, rounded once to float32) and clamps, every element
    of a 0xFF block float32's NaN 0x7FC00000.  te and te-3262 leave NaN elements out of the
    block amax.  floor-4725 ... rceil-4725 multiply by 2**(127 - code) (code 0xFF: a NaN
    that wins over the element's) and clamp (a saturating cast).
    """
    top = _MX_ELEMS[elem][1]
    v = np.asarray(x, np.float32)
    b = v.reshape(*v.shape[:-1], v.shape[-1] // block, block)
    te = _NEXT.get(mode, mode) == "te"
    amax = _mx_amax(b, skip_nan=te)
    s = mx_scale(amax, elem, mode)
    sc = s.astype(np.int64)[..., None]
    f32 = np.float32
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if mode == "rceil":
            descale = (amax / f32(top)).astype(f32)[..., None]
            pow2 = (2.0 ** (127.0 - sc)).astype(f32)
            r = np.where(sc == 255, descale, np.where(sc == 254, f32(2.0**-127), pow2))
            r = np.where(sc == 0, f32(1), r).astype(f32)
            y = np.clip(_times(b, r), -top, top).astype(f32)
        elif mode == "ocp":
            e = np.where(sc == 255, 0, sc - 127)
            y = np.clip((b.astype(np.float64) / 2.0**e).astype(f32), -top, top).astype(f32)
            y = np.where(sc == 255, _NAN32, y).astype(f32)
        elif mode in _NEXT and not te:
            r = np.where(sc == 255, _AO_NAN, 2.0 ** (127.0 - np.minimum(sc, 254))).astype(f32)
            y = np.clip(_times(b, r), -top, top).astype(f32)
        elif te:
            pow2 = ((254 - np.minimum(sc, 253)) << 23).astype(np.uint32).view(f32)
            r = np.where(sc == 254, f32(2.0**-127), pow2).astype(f32)
            # x * NaN is the NaN 0x7FFFFFFF itself on the GPU, whatever x is
            y = np.where(sc == 255, _TE_NAN, (b * r).astype(f32)).astype(f32)
        else:
            d = np.where(sc == 255, np.inf, np.maximum(2.0 ** (sc - 127.0), 2.0**-126))
            y = (b / d.astype(f32)).astype(f32)
            if elem != "float4_e2m1":
                y = np.clip(y, -top, top).astype(f32)
    codes = _mx_narrow(y, elem, te=te)
    if elem == "float4_e2m1":
        codes = _pack4(codes)
    return s, codes.reshape(*v.shape[:-1], -1)


def nvfp4_tensor_scale(amax: float) -> float:
    """Reference for lscore._ext._mx.nvfp4_tensor_scale: amax / (448 * 6) in float32."""
    return f32(f32(amax) / 2688.0)


def nvfp4_quantize(x: Any, pts: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reference for lscore._ext._mx.nvfp4_quantize: (E4M3 block scale codes, packed E2M1
    codes) of the blocks of 16 along the last axis.  Block scale amax / 6 (over pts when
    given) clamped to [2**-6, 448] and narrowed to E4M3; the elements times 1 / that scale
    ((1 / pts) / scale), a NaN scale read as torch's word 0x7FF00000 with its sign, clamped
    to +-6."""
    f32 = np.float32
    v = np.asarray(x, f32)
    b = v.reshape(*v.shape[:-1], v.shape[-1] // 16, 16)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        bs = (_mx_amax(b) / f32(6)).astype(f32)
        if pts is not None:
            bs = (bs / f32(pts)).astype(f32)
        s = fp8_cast(np.clip(bs, f32(2.0**-6), f32(448)), 1.0, "float8_e4m3fn")[0]
        s32 = fp8_decode(s, "float8_e4m3fn").astype(f32)
        word = (np.uint32(0x7FF00000) | ((s.astype(np.uint32) & 0x80) << 24)).view(f32)
        s32 = np.where(np.isnan(s32), word, s32)
        one = f32(1) if pts is None else (f32(1) / f32(pts)).astype(f32)
        r = (one / s32).astype(f32)[..., None]
        y = np.clip(_times(b, r), f32(-6), f32(6)).astype(f32)
    return s, _pack4(e2m1_encode(y)).reshape(*v.shape[:-1], -1)
