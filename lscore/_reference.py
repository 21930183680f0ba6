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
    Every floating array is multiplied completely; integer and bool arrays are a
    TypeError (nothing is written).
    With stats, also returns the L2 norm and the max |x| of every floating
    value after the multiply (float64; NaN if any NaN is left).
    """
    leaves = [(a, _kind(a)) for a in _leaves(arrays, True)]
    for a, kind in leaves:
        if kind == "int":
            raise TypeError(f"unscale_ needs floating-point gradients, got {a.dtype}")
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
