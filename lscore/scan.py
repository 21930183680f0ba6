"""Public non-finite scan and fused unscale for NumPy arrays."""

from __future__ import annotations

import math
from typing import Any, Literal, overload

import numpy as np

from lscore._ext import _scan
from lscore.policy import boolean, integer, positive_scale

__all__ = ["all_finite", "unscale_"]

#: what clip_grad_norm_ adds to the norm before dividing max_norm by it
CLIP_EPS = 1e-6

#: the dtypes unscale_ multiplies
FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")
# integer formats of ml_dtypes (NumPy kind "V"); the core reads them as integers
_SMALL_INTS = ("int2", "uint2", "int4", "uint4")
# deeper nesting is the compiled walk's error to raise
_MAX_DEPTH = 64


def norm_order(norm_type: Any) -> float | None:
    """The p of a p-norm as ``torch.nn.utils.clip_grad_norm_`` converts `norm_type`
    (``float(norm_type)``: a number, or a string such as ``"inf"``); None when it is not a
    number (NaN included)."""
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(p) else p


def clip_coefficient(norm: Any, max_norm: float, found: bool = False) -> Any:
    """``clip_grad_norm_``'s coefficient, ``max_norm / (norm + 1e-6)`` clamped to 1.

    `norm` a float: the coefficient in float64, and 1 when `found` (the check saw
    NaN/Inf) or the norm is not finite (scan.cu's lsc_norm_end, its device twin).
    `norm` a torch tensor: the coefficient as torch computes it, a tensor of the
    norm's dtype on its device (no host sync); a skipped step is the caller's to mask
    there, `found` is not read.
    """
    if isinstance(norm, (int, float)):
        if found or not math.isfinite(norm):
            return 1.0
        return min(1.0, max_norm / (norm + CLIP_EPS))
    return (max_norm / (norm + CLIP_EPS)).clamp(max=1.0)


def _threads(threads: int | None) -> int:
    """The core's thread setting: 0 = automatic (None), else an int >= 1."""
    return 0 if threads is None else integer("threads", threads, minimum=1)


def all_finite(arrays: Any, *, threads: int | None = None) -> bool:
    """True when no floating element of `arrays` is NaN or +/-Inf.

    `arrays` is a NumPy array, a Python number or any nested list/tuple/dict
    of them; None entries are ignored, integer and bool arrays count as
    finite, and empty input is finite.  Stops at the first non-finite block.
    `threads`: None splits inputs of several MB over the core's threads
    (env LSCORE_NUM_THREADS caps them), 1 stays on the calling thread, k
    uses at most k threads.
    """
    if threads is None:
        return _scan.all_finite(arrays)
    return _scan.all_finite(arrays, _threads(threads))


def not_float_error(what: str, which: str, dtype: Any) -> TypeError:
    """The refusal of an integer or bool gradient, the same for every unscaling path:
    `what` the call, `which` the array (``"array 2 (in flattened order)"``)."""
    return TypeError(
        f"{what} needs floating-point gradients ({', '.join(FLOAT_NAMES)}); {which} "
        f"is {dtype}: an integer or bool array cannot be scaled or unscaled"
    )


def is_integer_dtype(dtype: Any) -> bool:
    """True for the NumPy (or CuPy) dtypes of integers and bools, ml_dtypes' int4 included."""
    kind = getattr(dtype, "kind", None)
    return kind is not None and (kind in "biu" or (kind == "V" and dtype.name in _SMALL_INTS))


def _first_integer(obj: Any, at: list, depth: int = 0) -> Any:
    """The dtype of the first integer or bool array among the leaves of `obj` (None when
    there is none), counting the leaves before it in `at[0]` (the compiled walk's order)."""
    if depth > _MAX_DEPTH:
        return None  # the compiled walk refuses it
    if obj is None:
        return None
    if isinstance(obj, (list, tuple, dict)):
        for x in obj.values() if isinstance(obj, dict) else obj:
            found = _first_integer(x, at, depth + 1)
            if found is not None:
                return found
        return None
    dt = getattr(obj, "dtype", None)
    if dt is not None and is_integer_dtype(dt):
        return dt
    at[0] += 1
    return None


def refuse_integers(what: str, arrays: Any) -> None:
    """TypeError (see `not_float_error`) when `arrays` (a NumPy or CuPy array or nested
    lists, tuples and dicts of them) holds an integer or bool array; other leaves are left
    to the core."""
    if type(arrays) is np.ndarray:  # the common calls: one test, or one per distinct dtype
        if arrays.dtype.kind == "f" or not is_integer_dtype(arrays.dtype):
            return
    elif type(arrays) is list:
        try:
            dtypes = {a.dtype for a in arrays}
        except AttributeError:  # None, a container or a number among them: the whole walk
            pass
        else:
            if not any(map(is_integer_dtype, dtypes)):
                return
    at = [0]
    dt = _first_integer(arrays, at)
    if dt is not None:
        which = "the array" if hasattr(arrays, "dtype") else f"array {at[0]} (in flattened order)"
        raise not_float_error(what, which, dt)


@overload
def unscale_(
    arrays: Any, inv_scale: float, *, stats: Literal[False] = False, threads: int | None = None
) -> bool: ...
@overload
def unscale_(
    arrays: Any, inv_scale: float, *, stats: Literal[True], threads: int | None = None
) -> tuple[bool, float, float]: ...
@overload
def unscale_(
    arrays: Any, inv_scale: float, *, stats: bool, threads: int | None = None
) -> bool | tuple[bool, float, float]: ...
def unscale_(
    arrays: Any, inv_scale: float, *, stats: bool = False, threads: int | None = None
) -> bool | tuple[bool, float, float]:
    """Multiply every array in place by `inv_scale`; True when all inputs were finite.

    The check is on the input values, as torch does, and every array is
    multiplied completely even after a non-finite value.  float32 and
    float16/bfloat16 multiply by float32(inv_scale) (half types widened to
    float32 and rounded back to nearest even), float64 by the double.
    Integer and bool arrays (which cannot be multiplied by a fraction; torch
    refuses them too) are a TypeError naming their dtype; read-only arrays,
    Python numbers, arrays whose elements overlap and arrays that share
    memory with each other raise too; on error no array is modified.

    With ``stats=True`` returns ``(all_finite, l2_norm, max_abs)``: the
    Euclidean norm (accumulated in float64) and the largest magnitude of
    all the floating values after the multiply, gathered in the same memory
    pass (NaN when a NaN is left, inf when an inf is).  The sums do not
    depend on `threads` or on the CPU's vector width.  `threads` as in
    `all_finite`.
    """
    # float32 and half arrays multiply by float32(inv_scale): it must be finite there too
    inv = positive_scale("inv_scale", inv_scale)
    refuse_integers("unscale_", arrays)
    return _scan.unscale_(arrays, inv, boolean("stats", stats), _threads(threads))
