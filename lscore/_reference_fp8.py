"""NumPy-only twin of the compiled float8 kernels and scale rules; slow, obvious, used only by
tests (the loss-scale state machine's and the scan's twin is ``lscore._reference``).

The float8 casts and decodes, TransformerEngine's and torchao's scale rules,
TransformerEngine's delayed-scaling record and update, the amax pass, the
row-wise cast and the dequantize, each computed the plain way the compiled
code must match bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# ---- float8 casts ------------------------------------------------------------

# (mantissa bits, exponent bias, largest finite code) of each float8 format
_FP8 = {"float8_e4m3fn": (3, 7, 0x7E), "float8_e5m2": (2, 15, 0x7B)}


def _fp8_values(fmt: str) -> np.ndarray:
    """The values of codes 0 .. largest finite + 1 of `fmt` (float64, increasing): the
    last one is where the next code would be, had the format one more finite value."""
    mbits, bias, top = _FP8[fmt]
    c = np.arange(top + 2)
    e, m = c >> mbits, c & ((1 << mbits) - 1)
    sub = m * 2.0 ** (1 - bias - mbits)
    normal = (1 + m / 2**mbits) * 2.0 ** (e - bias)
    return np.where(e == 0, sub, normal)


def fp8_cast(
    x: np.ndarray,
    scale: float,
    fmt: str,
    saturate: bool = True,
    nan_sign: bool = True,
    amax_nan: bool = False,
) -> tuple[np.ndarray, float]:
    """Reference for lscore._ext._fp8.cast; slow, used only by tests.

    Returns (codes, amax).  Each input widens to float32 and is multiplied by
    float32(scale) in float32; |product| goes to the nearest of the format's
    values, a tie to the even code.  Past the largest finite value (where it
    would round beyond it; +-Inf too): that value with saturate, else e5m2's
    Inf (0x7C) or e4m3fn's NaN (0x7F).  The sign bit is the product's; a NaN
    is 0x7F, with its sign only under nan_sign.  amax = max |x| of the input,
    NaN elements skipped (or, amax_nan, NaN if there is one); 0 when empty.
    """
    wide = np.asarray(x).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = (wide * np.float32(scale)).ravel()
    _, _, top = _FP8[fmt]
    values = _fp8_values(fmt)
    a = np.abs(y.astype(np.float64))
    nan = np.isnan(a)
    a[nan] = 0
    hi = np.minimum(np.searchsorted(values, a), top + 1)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - values[lo], values[hi] - a
    code = np.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo)
    over = code > top
    code[over] = top if saturate else (0x7C if fmt == "float8_e5m2" else 0x7F)
    sign = np.signbit(y).astype(np.int64) << 7
    code[nan] = 0x7F
    if not nan_sign:
        sign[nan] = 0
    codes = (code | sign).astype(np.uint8).reshape(np.shape(x))
    mags = np.abs(wide.ravel())
    if amax_nan and np.isnan(mags).any():
        return codes, float("nan")
    finite_or_inf = mags[~np.isnan(mags)]
    return codes, float(finite_or_inf.max()) if finite_or_inf.size else 0.0


def fp8_decode(q: np.ndarray, fmt: str) -> np.ndarray:
    """Reference for lscore._ext._fp8.decode; slow, used only by tests: the float64 value of
    each code (NaN codes NaN, e5m2's 0x7C +-Inf)."""
    _, _, top = _FP8[fmt]
    c = np.asarray(q).view(np.uint8).astype(np.int64)
    mag = c & 0x7F
    v = _fp8_values(fmt)[np.minimum(mag, top)]
    v = np.where(mag > top, np.nan, v)
    if fmt == "float8_e5m2":
        v = np.where(mag == 0x7C, np.inf, v)
    return np.where(c & 0x80, -v, v)


# ---- float8 scales and delayed scaling -------------------------------------------

_F32_MAX = float(np.finfo(np.float32).max)


def f32(x: float) -> float:
    """`x` rounded to float32 (overflow to +-Inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def fp8_scale_te(amax: Any, fp8_max: float, pow2: bool, eps: float) -> np.ndarray:
    """Reference for lscore._ext._fp8_scale.scale_te; slow, used only by tests.

    TransformerEngine's compute_scale_from_amax, one amax at a time: an amax
    below eps counts as eps; Inf, 0 or NaN gives 1; else fp8_max / amax
    rounded to float32 (a float64 quotient of two float32 values rounds to
    the float32 quotient exactly), +Inf -> FLT_MAX; pow2 keeps the largest
    power of two <= the scale (0 for a subnormal scale).
    """
    eps = f32(eps)
    out = []
    for a in np.asarray(amax, np.float32).ravel().tolist():
        if a < eps:
            a = eps
        if math.isnan(a) or math.isinf(a) or a == 0:
            out.append(1.0)
            continue
        s = f32(f32(fp8_max) / a)
        if math.isinf(s):
            s = _F32_MAX
        if pow2:
            s = math.copysign(0.0 if abs(s) < 2.0**-126 else 2.0 ** (math.frexp(s)[1] - 1), s)
        out.append(s)
    return np.array(out, np.float32).reshape(np.shape(amax))


def fp8_pow2_down_torch(s: float) -> float:
    """torchao's exp2(floor(log2(s))) as torch computes it on float32: log2 rounded to float32
    (the nearest float32 to the exact logarithm), floored, exp2 exact (2**128: +Inf)."""
    if math.isnan(s) or s < 0:
        return math.nan
    if s == 0:
        return 0.0
    if math.isinf(s):
        return s
    k = math.floor(f32(math.log2(s)))
    return f32(2.0**k)


def fp8_scale_torchao(amax: Any, fp8_max: float, pow2: bool, eps: float) -> np.ndarray:
    """Reference for lscore._ext._fp8_scale.scale_torchao; slow, used only by tests.

    torchao's amax_to_scale: fp8_max / max(amax, eps) in float64 (a NaN amax
    stays NaN, an Inf one gives 0), rounded to float32, then with pow2
    ``fp8_pow2_down_torch``.
    """
    out = []
    for a in np.asarray(amax, np.float32).ravel().tolist():
        if a < eps:
            a = eps
        with np.errstate(divide="ignore"):  # eps 0: an amax of 0 gives Inf, as in float64
            s = f32(np.float64(fp8_max) / np.float64(a))
        out.append(fp8_pow2_down_torch(s) if pow2 else s)
    return np.array(out, np.float32).reshape(np.shape(amax))


def fp8_scaled_max(fp8_max: float, margin: int) -> float:
    """Reference for lscore._ext._fp8_scale.scaled_max: fp8_max * 2**-margin in float32."""
    return f32(fp8_max * 2.0**-margin)


def fp8_delayed_record(history: np.ndarray, amax: Any, amax_nan: bool) -> np.ndarray:
    """Reference for Fp8Delayed.record; slow: a new history whose row 0 is the maximum of
    row 0 and `amax` (a NaN amax skipped, or with amax_nan making the slot NaN)."""
    h = np.array(history, np.float32)
    for j, a in enumerate(np.asarray(amax, np.float32).tolist()):
        r = float(h[0, j])
        if math.isnan(a):
            h[0, j] = a if amax_nan else r
        elif math.isnan(r):
            h[0, j] = r if amax_nan else a
        else:
            h[0, j] = max(r, a)
    return h


def fp8_delayed_update(
    history: np.ndarray, scale: np.ndarray, scaled_max: np.ndarray, algo: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reference for Fp8Delayed.update; slow, used only by tests.

    TransformerEngine's fused update, tensor by tensor (column j), current
    amax c = history[0, j]: c == 0 leaves the column and the scale as they
    are.  Otherwise the amax is c ("most_recent") or the largest non-NaN
    value among c and rows 1.. (0 if none: "max"); the column becomes
    [0, rows 2.., c] (a history of one row: [0]); the scale becomes
    scaled_max / amax in float32 when 0 < amax < Inf (Inf -> FLT_MAX), else
    stays.  Returns (history, scale, scale_inv = 1 / scale).
    """
    h = np.array(history, np.float32)
    length, n = h.shape
    new_scale = np.array(scale, np.float32)
    for j in range(n):
        col = h[:, j].tolist()
        c = col[0]
        if c == 0:
            amax = 0.0
        else:
            if algo == "max":
                amax = max([0.0] + [v for v in [c, *col[1:]] if not math.isnan(v)])
            else:
                amax = c
            h[:, j] = [0.0] if length == 1 else [0.0, *col[2:], c]
        if 0 < amax < math.inf:
            s = f32(float(scaled_max[j]) / amax)
            new_scale[j] = _F32_MAX if math.isinf(s) else s
    with np.errstate(divide="ignore", over="ignore"):  # a subnormal scale: Inf
        inv = np.float32(1) / new_scale
    return h, new_scale, inv


def _lines(x: np.ndarray) -> np.ndarray:
    """x as a 2-D array of its rows along the last axis (empty rows included)."""
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def fp8_amax(x: np.ndarray, amax_nan: bool = False, rows: bool = False) -> Any:
    """Reference for lscore._ext._fp8.amax / amax_rows; slow, used only by tests: max |x|
    of the float32 widening (per row along the last axis with `rows`, as float32), NaN
    elements skipped (or, amax_nan, the result NaN where there is one); 0 when empty."""
    wide = np.abs(np.asarray(x).astype(np.float32))
    wide = _lines(wide) if rows else wide.reshape(1, -1)
    out = np.zeros(wide.shape[0], np.float32)
    for r, row in enumerate(wide):
        nan = np.isnan(row)
        if amax_nan and nan.any():
            out[r] = np.nan
        elif (~nan).any():
            out[r] = row[~nan].max()
    return out if rows else float(out[0])


def fp8_cast_rows(
    x: np.ndarray,
    scales: np.ndarray,
    fmt: str,
    saturate: bool = True,
    nan_sign: bool = True,
    amax_nan: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Reference for lscore._ext._fp8.cast_rows; slow, used only by tests: fp8_cast of each
    row (along the last axis, C order over the others) with its own scale; (codes, amaxes)."""
    x = np.asarray(x)
    lines = _lines(x)
    codes = np.empty(lines.shape, np.uint8)
    amaxes = np.empty(len(lines), np.float32)
    for r, line in enumerate(lines):
        codes[r], amaxes[r] = fp8_cast(line, float(scales[r]), fmt, saturate, nan_sign, amax_nan)
    return codes.reshape(x.shape), amaxes


def fp8_dequantize(q: np.ndarray, scale: Any, fmt: str, dtype: Any, rows: bool = False) -> Any:
    """Reference for lscore._ext._fp8.decode / decode_rows with a scale; slow, used only by
    tests: the code's value in float32 divided by float32 `scale` (per row along the last
    axis with `rows`) in float32, then one rounding to `dtype`."""
    v = fp8_decode(q, fmt).astype(np.float32)
    s = np.asarray(scale, np.float32)
    if rows:
        s = s.reshape((*v.shape[:-1], 1))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (v / s).astype(dtype)
