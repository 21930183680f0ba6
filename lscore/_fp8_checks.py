"""The float8 argument checks that lscore.cuda's kernels and lscore.fp8 both take.

They live outside both packages so that ``lscore.cuda`` imports nothing of
``lscore.fp8`` (which reaches ``lscore.cuda`` only lazily, for device arrays);
``lscore.fp8.checks`` is their public home and re-exports them.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

#: float8 format names: the short ones (TransformerEngine's, torchao's recipes) and the dtype names
FORMATS = {
    "e4m3fn": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
}
_NAN = ("ignore", "propagate")
_FLT_MAX = float(np.finfo(np.float32).max)


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dt: np.dtype) -> str:
    """dt.name, cached: NumPy computes the name in Python on every access (microseconds)."""
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = dt.name
    return name


def format_name(fmt: Any) -> str:
    """The dtype name ("float8_e4m3fn" / "float8_e5m2") of a format name or float8 dtype."""
    name = FORMATS.get(fmt) if isinstance(fmt, str) else FORMATS.get(dtype_name(np.dtype(fmt)))
    if name is None:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return name


def row_axis(x: Any, axis: Any) -> bool:
    """True for per-row (axis -1 or ndim - 1), False for per-tensor (None)."""
    if axis is None:
        return False
    is_int = isinstance(axis, (int, np.integer)) and not isinstance(axis, bool)
    if is_int and x.ndim >= 1 and axis in (-1, x.ndim - 1):
        return True
    raise ValueError(
        f"axis must be None (per tensor) or -1 (per row, along the last axis) "
        f"for an array of {x.ndim} dimensions, got {axis!r}"
    )


def block_axis(x: Any, axis: Any) -> bool:
    """False for blocks along the last axis (-1 or ndim - 1), True along the first of a 2-D x."""
    is_int = isinstance(axis, (int, np.integer)) and not isinstance(axis, bool)
    if is_int and x.ndim >= 1 and axis in (-1, x.ndim - 1):
        return False
    if is_int and x.ndim == 2 and axis == 0:
        return True
    raise ValueError(
        "axis must be -1 (blocks along the last axis) or 0 (along the first axis of a 2-D "
        f"array) for an array of {x.ndim} dimensions, got {axis!r}"
    )


def nan_rule(nan: Any, what: str = "nan") -> bool:
    """True when a NaN input makes the amax NaN ("propagate"), False when skipped ("ignore")."""
    if nan not in _NAN:
        raise ValueError(f"{what} must be 'ignore' or 'propagate', got {nan!r}")
    return nan == "propagate"


def check_scale(scale: Any, rows: int | None) -> Any:
    """The scale as float32: a positive finite scalar (rows None) or a vector of one per row."""
    if rows is None:
        if type(scale) is float and 0 < scale <= _FLT_MAX:  # the common case, without NumPy
            s = np.float32(scale)
            if s > 0:
                return s
        if type(scale) is np.float32 and 0 < scale < np.inf:
            return scale
        s = None
        if not isinstance(scale, (str, bytes, bool, np.bool_)) and np.ndim(scale) == 0:
            try:
                with np.errstate(over="ignore"):
                    s = np.float32(scale)
            except (TypeError, ValueError):
                s = None
        if s is None or not (math.isfinite(s) and s > 0):
            raise ValueError(f"scale must be a positive finite float32, got {scale!r}")
        return s
    a = np.asarray(scale)
    if a.dtype.kind not in "fiu" or a.size != rows or a.ndim == 0:
        raise ValueError(
            f"scale must hold one positive finite float32 per row ({rows}), "
            f"got {a.dtype} of shape {a.shape}"
        )
    s = np.ascontiguousarray(a, np.float32).reshape(rows)
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        raise ValueError(
            f"scale must hold positive finite float32s, "
            f"got {s[bad][0]!r} at row {int(bad.argmax())}"
        )
    return s


class Cast(NamedTuple):
    """A float8 cast's options, checked once: the one home of the quantize signature.

    ``lscore.fp8.quantize``, the torch adapter's ``quantize`` and the device
    launchers in ``lscore.cuda.fp8`` all take their keywords through
    ``cast_options``, so each is checked and reads the same wherever given.
    """

    #: the format's dtype name, "float8_e4m3fn" or "float8_e5m2"
    name: str
    #: None per tensor, -1 per row (checked against the input by ``row_axis``)
    axis: Any
    saturate: bool
    nan_sign: bool
    #: True when a NaN input makes the amax NaN (``amax_nan="propagate"``)
    propagate: bool


def cast_options(
    fmt: Any = "e4m3fn",
    axis: Any = None,
    saturate: bool = True,
    nan_sign: bool = True,
    amax_nan: str = "ignore",
) -> Cast:
    """``quantize``'s keywords as a checked ``Cast`` (the format and NaN rule named in errors)."""
    return Cast(
        format_name(fmt), axis, bool(saturate), bool(nan_sign), nan_rule(amax_nan, "amax_nan")
    )
