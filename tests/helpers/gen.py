"""Seeded generators of arrays and event sequences for differential tests."""

from __future__ import annotations

import numpy as np

from lscore import Policy

LAYOUTS = (
    "contiguous",
    "strided",
    "reversed",
    "transposed",
    "byteswapped",
    "unaligned",
    "zero_d",
    "empty",
    "nd_strided",
)


def special_values(dtype: np.dtype) -> dict:
    """Edge values for `dtype`, computed in float64 and cast."""
    try:
        info = np.finfo(dtype)
    except ValueError:
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
    vals = {
        "max": float(info.max),
        "-max": -float(info.max),
        "tiny": float(info.tiny),
        "subnormal": float(info.smallest_subnormal),
        "zero": 0.0,
        "-zero": -0.0,
        "one": 1.0,
    }
    return vals


def nonfinite_values(dtype: np.dtype) -> list:
    if dtype.name == "float8_e4m3fn":
        return [np.nan]
    return [np.nan, np.inf, -np.inf]


def make_array(
    rng: np.random.Generator,
    dtype: np.dtype,
    n: int,
    layout: str,
    bad: list[tuple[int, float]] = (),
) -> np.ndarray:
    """An array of `dtype` with `n` logical elements in `layout`; `bad` puts values at indices."""
    base = rng.standard_normal(max(n, 1)) * rng.choice([1e-3, 1.0, 100.0])
    if dtype.name == "float8_e4m3fn":
        base = np.clip(base, -400, 400)
    vals = base.astype(dtype)[:n].copy()
    flat = vals.reshape(-1)
    for i, v in bad:
        flat[i % max(n, 1)] = v
    if layout == "contiguous":
        return vals
    if layout == "strided":
        out = np.zeros(2 * n, dtype)
        out[::2] = vals
        return out[::2]
    if layout == "reversed":
        return vals[::-1].copy()[::-1]
    if layout == "transposed":
        k = _factor(n)
        return vals.reshape(n // k, k).T.copy(order="C").T if n else vals
    if layout == "byteswapped":
        if dtype.itemsize == 1 or dtype.names is not None:
            return vals
        try:
            sw = vals.astype(vals.dtype.newbyteorder())
        except TypeError:
            return vals
        return sw
    if layout == "unaligned":
        raw = np.zeros(n * dtype.itemsize + 1, np.uint8)
        out = raw[1:].view(dtype)
        out[...] = vals
        return out
    if layout == "zero_d":
        return vals[:1].reshape(()).copy() if n else np.zeros((), dtype)
    if layout == "empty":
        return np.zeros((0, 3), dtype)
    if layout == "nd_strided":
        k = _factor(n)
        big = np.zeros((n // k, 2 * k), dtype)
        big[:, ::2] = vals.reshape(n // k, k)
        return big[:, ::2]
    raise ValueError(layout)


def _factor(n: int) -> int:
    for k in (7, 5, 3, 2):
        if n % k == 0 and n // k > 1:
            return k
    return 1


def event_sequence(rng: np.random.Generator, n: int) -> list[bool]:
    """Finite/non-finite events with runs of both, biased toward finite."""
    p = rng.choice([0.05, 0.2, 0.5, 0.8])
    return [bool(x) for x in rng.random(n) > p]


F32_MAX = float(np.finfo(np.float32).max)


def random_policy(rng: np.random.Generator) -> Policy:
    mode = str(rng.choice(["ge", "eq", "modulo", "never"]))
    interval = int(rng.choice([1, 2, 3, 7]))  # a positive integer (policy.growth_interval)
    min_scale = rng.choice([None, 0.0, 1.0, 0.25, 1e-4, 8.0], p=[0.3, 0.1, 0.3, 0.1, 0.1, 0.1])
    max_scale = rng.choice([None, 2.0**24, 1e5, F32_MAX], p=[0.55, 0.15, 0.15, 0.15])
    if min_scale is not None and max_scale is not None and min_scale > max_scale:
        max_scale = None
    floor_scale = rng.choice([None, 1.0, 1e-4, 0.5, 16.0], p=[0.6, 0.1, 0.1, 0.1, 0.1])
    floor_scale = None if floor_scale is None else float(floor_scale)
    action = (
        "clamp"
        if min_scale is None and floor_scale is None
        else str(rng.choice(["clamp", "raise_at", "raise_below"]))
    )
    precision = str(rng.choice(["float32", "float32_float64", "float64"]))
    init = float(
        rng.choice([1.0, 4.0, 0.5, 2.0**16, 3.0, F32_MAX / 4, F32_MAX, 1e-30, 2.0**-126, 1000.0])
    )
    refill = tuple(str(r) for r in ("finite", "growth", "backoff") if rng.random() < 0.4)
    return Policy(
        name="gen",
        init_scale=init,
        growth_factor=float(rng.choice([1.0, 1.1, 2.0, 3.0, 2**0.25, 1e10])),
        backoff_factor=float(rng.choice([0.5, 0.8, 1 / 3, 1.0, 0.1])),
        growth_interval=interval,
        hysteresis=int(rng.choice([1, 1, 2, 3])),
        min_scale=None if min_scale is None else float(min_scale),
        max_scale=None if max_scale is None else float(max_scale),
        precision=precision,
        growth_mode=mode,
        growth_offset=int(rng.choice([0, 1])),
        backoff_mode=str(rng.choice(["multiply", "divide"])),
        min_action=action,
        guard_finite=bool(rng.random() < 0.7),
        refill=refill,
        hysteresis_saturate=bool(rng.random() < 0.3),
        apply_nonfinite=bool(rng.random() < 0.1),
        flush_subnormal=bool(rng.random() < 0.2),
        apply_next=bool(rng.random() < 0.15),
        tolerance=float(rng.choice([0.0, 0.0, 0.25, 0.5, 1.0])),
        floor_scale=floor_scale,
        growth_factor_after_overflow=(
            None if rng.random() < 0.7 else float(rng.choice([2**0.25, 1.5, 1.0]))
        ),
    )
