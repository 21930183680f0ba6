"""Public non-finite scan and fused unscale for NumPy arrays."""

from __future__ import annotations

import math
from typing import Any, Literal, overload

from lscore._ext import _scan
from lscore.policy import boolean, integer, positive_scale

__all__ = ["all_finite", "unscale_"]

#: what clip_grad_norm_ adds to the norm before dividing max_norm by it
CLIP_EPS = 1e-6


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
    """Multiply every floating array in place by `inv_scale`; True when all inputs were finite.

    The check is on the input values, as torch does, and every floating array
    is multiplied completely even after a non-finite value.  float32 and
    float16/bfloat16 multiply by float32(inv_scale) (half types widened to
    float32 and rounded back to nearest even), float64 by the double.
    Read-only arrays, Python numbers, arrays whose elements overlap and
    arrays that share memory with each other raise;
    on error no array is modified.

    With ``stats=True`` returns ``(all_finite, l2_norm, max_abs)``: the
    Euclidean norm (accumulated in float64) and the largest magnitude of
    all the floating values after the multiply, gathered in the same memory
    pass (NaN when a NaN is left, inf when an inf is).  The sums do not
    depend on `threads` or on the CPU's vector width.  `threads` as in
    `all_finite`.
    """
    # float32 and half arrays multiply by float32(inv_scale): it must be finite there too
    inv = positive_scale("inv_scale", inv_scale)
    return _scan.unscale_(arrays, inv, boolean("stats", stats), _threads(threads))
