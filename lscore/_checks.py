"""The range checks every argument of lscore goes through, each naming the argument.

``lscore.policy`` is their public home and re-exports them; ``Policy`` and every
class that imitates TF, Keras or torch take their arguments through these.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from typing import Any

import numpy as np

F32_MAX = float(np.finfo(np.float32).max)


# float32(v) rounds to nearest even: a double at or above the midpoint of float32's max,
# 2**128 * (1 - 2**-24), and 2**128 rounds up to inf (at the midpoint too: the max's last
# mantissa bit is odd); anything below rounds to a finite float32
F32_OVERFLOW = 2.0**128 * (1 - 2.0**-25)


def overflows_f32(v: float) -> bool:
    """True when float32(v) would be +/-inf (False for NaN).

    A plain comparison: it runs on every ``unscale_`` call, where building a NumPy scalar
    under ``np.errstate`` cost more than the rest of the call.
    """
    return abs(v) >= F32_OVERFLOW


def _is_real(value: Any) -> bool:
    return isinstance(value, (numbers.Real, np.bool_)) and not isinstance(value, np.datetime64)


def real(name: str, value: Any) -> float:
    """`value` as a float; TypeError naming `name` unless it is a real number."""
    if type(value) is float:  # the common call (an inverse scale per step): no ABC check
        return value
    if not _is_real(value):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    return float(value)


def positive_scale(name: str, value: Any, *, precision: str = "float32") -> float:
    """A finite scale > 0, representable in the policy's precision."""
    v = real(name, value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    if precision != "float64" and overflows_f32(v):
        raise ValueError(f"{name} must be finite in float32 (at most {F32_MAX:.8g}), got {value!r}")
    return v


def fixed_scale(name: str, value: Any, message: str) -> float:
    """A fixed loss scale: finite, >= 1 (else ValueError(message)), finite in float32."""
    v = real(name, value)
    if math.isnan(v) or math.isinf(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if v < 1:
        raise ValueError(message)
    if overflows_f32(v):
        raise ValueError(f"{name} must be finite in float32 (at most {F32_MAX:.8g}), got {value!r}")
    return v


# the core keeps integers in int64; beyond this they would overflow in C
I64_MAX = 2**63 - 1


def _fits_i64(name: str, v: int) -> int:
    if not -I64_MAX <= v <= I64_MAX:
        raise ValueError(f"{name} must fit in a signed 64-bit integer, got {v!r}")
    return v


def integer(name: str, value: Any, *, minimum: int | None = None) -> int:
    """An integral number (bools excluded), optionally at least `minimum`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral,)):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise TypeError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return _fits_i64(name, value)


def growth_interval(name: str, value: Any) -> int:
    """A growth interval (steps between growths, under any peer's name): a positive integer.

    The one rule of every scaler, manager and preset.  An integral float (``2000.0``
    from a JSON config) is taken; a bool or a non-number is a TypeError, and 0, a
    negative count, a fraction (``2.5``), NaN or inf a ValueError, each naming `name`.
    """
    allowed = f"{name} must be a positive integer (1, 2, 3, ...), got {value!r}"
    if isinstance(value, (bool, np.bool_)) or not _is_real(value):
        raise TypeError(allowed)
    if isinstance(value, numbers.Integral):
        v = int(value)
    else:
        f = float(value)
        if not f.is_integer():  # a fraction, NaN or inf
            raise ValueError(allowed)
        v = int(f)
    if v < 1:
        raise ValueError(allowed)
    return _fits_i64(name, v)


def scale_bounds(init_scale: float, min_scale: float | None, max_scale: float | None) -> None:
    """The initial scale lies within [min_scale, max_scale] (each optional)."""
    if min_scale is not None and min_scale > init_scale:
        raise ValueError(f"min_scale must be <= init_scale ({init_scale!r}), got {min_scale!r}")
    if max_scale is not None and max_scale < init_scale:
        raise ValueError(f"max_scale must be >= init_scale ({init_scale!r}), got {max_scale!r}")


def factor_at_least_one(name: str, value: Any) -> float:
    """`value` as a float that is finite and >= 1, else ValueError naming `name`."""
    v = real(name, value)
    if not math.isfinite(v) or v < 1:
        raise ValueError(f"{name} must be finite and >= 1, got {value!r}")
    return v


def factor_above_one(name: str, value: Any) -> float:
    """`value` as a float that is finite and > 1, else ValueError naming `name`."""
    v = real(name, value)
    if not math.isfinite(v) or v <= 1:
        raise ValueError(f"{name} must be finite and > 1, got {value!r}")
    return v


def fraction(name: str, value: Any, *, closed: bool = True) -> float:
    """A factor in (0, 1], or (0, 1) with closed=False."""
    v = real(name, value)
    ok = math.isfinite(v) and v > 0 and (v <= 1 if closed else v < 1)
    if not ok:
        raise ValueError(f"{name} must be in (0, 1{']' if closed else ')'}, got {value!r}")
    return v


def choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """`value` if it is one of `choices`, else ValueError listing them."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of: {', '.join(choices)}")
    return value


def boolean(name: str, value: Any) -> bool:
    """A bool (NumPy bools included); TypeError naming `name` otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def scale_value(name: str, value: Any, *, precision: str = "float32") -> float:
    """A loss scale given by the user: positive_scale, NumPy/torch 0-d values included."""
    if hasattr(value, "item") and not isinstance(value, (float, int)):
        with contextlib.suppress(TypeError, ValueError):
            value = value.item()
    return positive_scale(name, value, precision=precision)
