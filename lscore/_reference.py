"""NumPy-only twin of the compiled core; slow, obvious, used only by tests.

It is never a fallback: ``import lscore`` fails without the compiled core.
Tests run the core and this module on the same generated inputs and demand
the same results and the same exceptions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from lscore.policy import Policy

APPLY, SKIP, FLOOR_ERROR = 1, 0, -1


@dataclasses.dataclass(frozen=True)
class RefState:
    """Reference for lscore._ext._state.CyState; slow, used only by tests."""

    policy: Policy
    scale: float
    next_scale: float = 0.0
    good_steps: int = 0
    hysteresis_left: int = 1
    steps: int = 0
    skipped: int = 0
    overflows_since_backoff: int = 0
    since_rescale: int = 0
    overflow_seen: int = 0

    @classmethod
    def initial(cls, policy: Policy) -> RefState:
        s = policy.round_scale(policy.init_scale)
        return cls(policy, s, s, 0, policy.hysteresis, 0, 0)


def _rnd(p: Policy, x: float) -> float:
    if p.precision == "float64":
        return x
    with np.errstate(over="ignore"):
        x = float(np.float32(x))
    if p.flush_subnormal and abs(x) < float(np.finfo(np.float32).tiny):
        x = math.copysign(0.0, x)
    return x


def _mul(p: Policy, x: float, f: float) -> float:
    if p.precision == "float32":
        with np.errstate(over="ignore"):
            return _rnd(p, float(np.float32(x) * np.float32(f)))
    return _rnd(p, x * f)


def _div(p: Policy, x: float, f: float) -> float:
    if p.precision == "float32":
        with np.errstate(over="ignore", divide="ignore"):
            return _rnd(p, float(np.float32(x) / np.float32(f)))
    return _rnd(p, x / f)


def _finite(p: Policy, x: float) -> bool:
    limit = float(np.finfo(np.float64 if p.precision == "float64" else np.float32).max)
    return -limit <= x <= limit


def update(state: RefState, finite: bool) -> tuple[RefState, int]:
    """Reference for lscore._ext._state.CyState.update; slow, used only by tests.

    The spec of every policy, with p = state.policy; "in p.precision" and
    every clamp value are rounded as the policy stores its scale::

        (p.apply_next: the rule below works on next_scale; at the end
         scale = old next_scale, next_scale = the result)
        if p.growth_mode == "never": count the step; return
        since = since_rescale + 1                    # this step included
        if finite:
            if "finite" in p.refill: hysteresis_left = p.hysteresis
            ge:     good += 1; grow = good >= interval; if grow: good = 0
            eq:     good += 1; grow = good == interval; if grow: good = 0
            modulo: good += 1; k = good - offset; grow = k > 0 and k % interval == 0
            if grow:
                f = p.growth_factor_after_overflow if set and overflow_seen else p.growth_factor
                new = scale * f                      (in p.precision)
                if p.guard_finite and new is not finite: new = scale
                if max_scale is not None: new = min(new, max_scale)
                scale = new; since = 0
                if "growth" in p.refill: hysteresis_left = p.hysteresis
        else:
            left = hysteresis_left - 1; overflows += 1; overflow_seen = 1
            if left <= 0 and overflows / since >= p.tolerance:
                if min_action == "raise_at" and scale == floor: return FLOOR_ERROR (nothing changed)
                new = scale / growth_factor if backoff_mode == "divide" else scale * backoff_factor
                if min_scale is not None: new = max(new, min_scale)
                scale = new; overflows = 0; since = 0
                if "backoff" in p.refill: left = p.hysteresis
            if p.hysteresis_saturate: left = max(left, 1)
            hysteresis_left = left; good = 0
            if min_action == "raise_below" and scale <= floor:
                keep the old scale, commit the counters, do not count the step: FLOOR_ERROR
        since_rescale = since; steps += 1; skipped += not should_apply
        should_apply = finite or p.apply_nonfinite

    floor is p.floor_scale, else p.min_scale.  "In p.precision": float32
    rounds the factor to float32 and multiplies in float32 (TF, Megatron);
    float32_float64 multiplies in double and rounds the result to float32
    (torch); float64 is a Python float (DeepSpeed).
    """
    p = state.policy
    s = dataclasses.replace(state)
    apply = bool(finite) or p.apply_nonfinite
    if p.growth_mode == "never":
        return dataclasses.replace(
            s, steps=s.steps + 1, skipped=s.skipped + (not apply)
        ), APPLY if apply else SKIP
    scale, nxt = s.scale, s.next_scale
    work = nxt if p.apply_next else scale
    good, left = s.good_steps, s.hysteresis_left
    overflows, since, seen = s.overflows_since_backoff, s.since_rescale + 1, s.overflow_seen
    floor = p.give_up_scale
    if finite:
        if "finite" in p.refill:
            left = p.hysteresis
        if p.growth_mode == "modulo":
            good += 1
            k = good - p.growth_offset
            grow = k > 0 and k % p.growth_interval == 0
        else:
            t = good + 1
            grow = t >= p.growth_interval if p.growth_mode == "ge" else t == p.growth_interval
            good = 0 if grow else t
        if grow:
            f = p.growth_factor
            if p.growth_factor_after_overflow is not None and seen:
                f = p.growth_factor_after_overflow
            new = _mul(p, work, f)
            if p.guard_finite and not _finite(p, new):
                new = work
            if p.max_scale is not None and new > _rnd(p, p.max_scale):
                new = _rnd(p, p.max_scale)
            work = new
            since = 0
            if "growth" in p.refill:
                left = p.hysteresis
    else:
        left -= 1
        overflows += 1
        seen = 1
        if left <= 0 and overflows / since >= p.tolerance:
            if p.min_action == "raise_at" and floor is not None and work == _rnd(p, floor):
                return state, FLOOR_ERROR
            if p.backoff_mode == "divide":
                new = _div(p, work, p.growth_factor)
            else:
                new = _mul(p, work, p.backoff_factor)
            if p.min_scale is not None and new < _rnd(p, p.min_scale):
                new = _rnd(p, p.min_scale)
            work = new
            overflows = since = 0
            if "backoff" in p.refill:
                left = p.hysteresis
        if p.hysteresis_saturate and left < 1:
            left = 1
        good = 0
        if p.min_action == "raise_below" and floor is not None and work <= _rnd(p, floor):
            return dataclasses.replace(
                state,
                good_steps=good,
                hysteresis_left=left,
                overflows_since_backoff=overflows,
                since_rescale=since,
                overflow_seen=seen,
            ), FLOOR_ERROR
    if p.apply_next:
        scale, nxt = nxt, work
    else:
        scale = work
    return RefState(
        p, scale, nxt, good, left, s.steps + 1, s.skipped + (not apply), overflows, since, seen
    ), APPLY if apply else SKIP


# ---- scan ------------------------------------------------------------------

_FLOAT8 = ("float8_e4m3fn", "float8_e5m2")
_FLOATS = ("float16", "bfloat16", "float32", "float64", *_FLOAT8)
_INTS = ("int4", "uint4", "int2", "uint2")


def _leaves(obj: Any, write: Any, depth: Any = 0) -> Any:
    if depth > 64:
        raise ValueError("arrays are nested deeper than 64 levels")
    if obj is None:
        return
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _leaves(x, write, depth + 1)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _leaves(x, write, depth + 1)
    elif isinstance(obj, (int, float)):
        if write:
            raise TypeError(f"unscale_ cannot write to a Python {type(obj).__name__}")
        yield np.asarray(obj)
    elif isinstance(obj, np.generic) and obj.dtype.kind in "biufV":
        if write:
            raise TypeError("unscale_ cannot write to a numpy scalar")
        yield np.asarray(obj)
    else:
        raise TypeError(f"unsupported array type {type(obj).__qualname__}")


def _kind(a: np.ndarray) -> str:
    name = a.dtype.name
    if a.dtype.kind in "biu" or name in _INTS:
        return "int"
    if name in _FLOATS:
        return name
    raise TypeError(f"unsupported dtype {name}")


def _overlaps(a: np.ndarray) -> bool:
    if a.size == 0:
        return False
    dims = sorted((abs(st), n) for st, n in zip(a.strides, a.shape, strict=True) if n > 1)
    span = a.itemsize
    for st, n in dims:
        if st < span:
            return True
        span += st * (n - 1)
    return False


def all_finite(arrays: Any) -> bool:
    """Reference for lscore.all_finite; slow, used only by tests."""
    leaves = [(a, _kind(a)) for a in _leaves(arrays, False)]
    for a, kind in leaves:
        if kind == "int" or a.size == 0:
            continue
        if kind in _FLOAT8:
            # float8 has no isfinite ufunc of its own in every ml_dtypes; widen (exact)
            a = a.astype(np.float32)
        if not np.isfinite(a).all():
            return False
    return True


def unscale_(arrays: Any, inv_scale: float, stats: bool = False) -> Any:
    """Reference for lscore.unscale_; slow, used only by tests.

    float32 and float16/bfloat16 multiply by float32(inv_scale) in float32 and
    round back (nearest even); float64 multiplies by the double inv_scale.
    Every floating array is multiplied completely; integers are left alone.
    With stats, also returns the L2 norm and the max |x| of every floating
    value after the multiply (float64; NaN if any NaN is left).
    """
    leaves = [(a, _kind(a)) for a in _leaves(arrays, True)]
    for a, kind in leaves:
        if kind == "int":
            continue
        if not a.flags.writeable:
            raise ValueError("unscale_ needs writable arrays")
        if kind in _FLOAT8:
            raise TypeError("unscale_ does not support float8")
        if _overlaps(a):
            raise ValueError("unscale_ needs arrays whose elements do not overlap")
    floats = [a for a, kind in leaves if kind != "int" and a.size]
    for i, a in enumerate(floats):
        for b in floats[i + 1 :]:
            if np.shares_memory(a, b):
                raise ValueError("unscale_ needs arrays that do not share memory")
    finite = True
    for a, kind in leaves:
        if kind == "int" or a.size == 0:
            continue
        wide = a.astype(np.float64 if kind == "float64" else np.float32)
        finite &= bool(np.isfinite(wide).all())
        if inv_scale == 1.0:
            continue
        if kind == "float64":
            out = wide * np.float64(inv_scale)
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                out = wide * np.float32(inv_scale)
        with np.errstate(over="ignore", invalid="ignore"):
            a[...] = out.astype(a.dtype)
    if not stats:
        return finite
    values = [a.astype(np.float64).ravel() for a, kind in leaves if kind != "int"]
    v = np.concatenate(values) if values else np.zeros(0)
    with np.errstate(over="ignore", invalid="ignore"):
        l2 = float(np.sqrt(np.sum(v * v)))
    max_abs = float(np.max(np.abs(v))) if v.size else 0.0
    return finite, l2, max_abs


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


def _f32(x: float) -> float:
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
    eps = _f32(eps)
    out = []
    for a in np.asarray(amax, np.float32).ravel().tolist():
        if a < eps:
            a = eps
        if math.isnan(a) or math.isinf(a) or a == 0:
            out.append(1.0)
            continue
        s = _f32(_f32(fp8_max) / a)
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
    k = math.floor(_f32(math.log2(s)))
    return _f32(2.0**k)


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
            s = _f32(np.float64(fp8_max) / np.float64(a))
        out.append(fp8_pow2_down_torch(s) if pow2 else s)
    return np.array(out, np.float32).reshape(np.shape(amax))


def fp8_scaled_max(fp8_max: float, margin: int) -> float:
    """Reference for lscore._ext._fp8_scale.scaled_max: fp8_max * 2**-margin in float32."""
    return _f32(fp8_max * 2.0**-margin)


def fp8_delayed_record(history: np.ndarray, amax: Any, amax_nan: bool) -> np.ndarray:
    """Reference for CyDelayed.record; slow: a new history whose row 0 is the maximum of
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
    """Reference for CyDelayed.update; slow, used only by tests.

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
            s = _f32(float(scaled_max[j]) / amax)
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


# ---- block-scaled formats (MX, NVFP4) ----------------------------------------

# element format -> (emax, largest value, mantissa bits)
_MX_ELEMS = {
    "float8_e4m3fn": (8, 448.0, 3),
    "float8_e5m2": (15, 57344.0, 2),
    "float4_e2m1": (2, 6.0, 1),
}
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_NAN32 = np.uint32(0x7FC00000).view(np.float32)


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
    0xFF, Inf 0xFE, 0 -> 0).
    """
    emax, top, mbits = _MX_ELEMS[elem]
    out = []
    for a in np.asarray(amax, np.float32).ravel().tolist():
        if math.isnan(a):
            out.append(255)
            continue
        if mode == "rceil":
            d = _f32(a / _f32(top))
            if math.isinf(d):
                out.append(254)
                continue
            lg = -math.inf if d == 0 else _f32(math.log2(d))
            out.append(int(min(max(math.ceil(lg) if d else -127, -127), 127)) + 127)
            continue
        if mode == "te":
            d = _f32(a * _f32(1.0 / top))
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
        if mode == "even" and 0 < a < math.inf:
            m, e = math.frexp(a)  # a = m * 2**e, m in [0.5, 1)
            if a >= 2.0**-126:
                step = 2.0 ** (e - 1 - mbits)  # the element's ulp at a
                a = _f32(math.floor(a / step + 0.5) * step)
            else:  # subnormal: the half ulp added to the bits carries into the exponent or not
                a = 2.0**-126 if a + 2.0 ** (-127 - mbits) >= 2.0**-126 else 0.0
        if a == 0 or a < 2.0**-126:
            e = -127
        elif math.isinf(a):
            e = 128
        else:
            e = math.frexp(a)[1] - 1
        e -= emax
        if (
            mode == "ceil"
            and a != 0
            and not math.isinf(a)
            and (a < 2.0**-126 or a != 2.0 ** (e + emax))
        ):
            e += 1
        out.append(min(max(e, -127), 128) + 127)
    return np.array(out, np.uint8).reshape(np.shape(amax))


def _mx_amax(x: np.ndarray) -> np.ndarray:
    """max |x| along the last axis, the quiet NaN 0x7FC00000 where a row holds a NaN."""
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
    TransformerEngine's (0: 1, else the float32 bits (254 - code) << 23).
    """
    top = _MX_ELEMS[elem][1]
    v = np.asarray(x, np.float32)
    b = v.reshape(*v.shape[:-1], v.shape[-1] // block, block)
    amax = _mx_amax(b)
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
        elif mode == "te":
            r = np.where(sc == 0, f32(1), ((254 - sc) << 23).astype(np.uint32).view(f32))
            y = (b * r.astype(f32)).astype(f32)
        else:
            d = np.where(sc == 255, np.inf, np.maximum(2.0 ** (sc - 127.0), 2.0**-126))
            y = (b / d.astype(f32)).astype(f32)
            if elem != "float4_e2m1":
                y = np.clip(y, -top, top).astype(f32)
    codes = _mx_narrow(y, elem, te=mode == "te")
    if elem == "float4_e2m1":
        codes = _pack4(codes)
    return s, codes.reshape(*v.shape[:-1], -1)


def nvfp4_tensor_scale(amax: float) -> float:
    """Reference for lscore._ext._mx.nvfp4_tensor_scale: amax / (448 * 6) in float32."""
    return _f32(_f32(amax) / 2688.0)


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
