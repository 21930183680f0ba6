"""Public non-finite scan and fused unscale for NumPy arrays."""
from __future__ import annotations

from lscore._ext import _scan
from lscore._params import positive_scale

__all__ = ["all_finite", "unscale_"]


def all_finite(arrays) -> bool:
    """True when no floating element of `arrays` is NaN or +/-Inf.

    `arrays` is a NumPy array, a Python number or any nested list/tuple/dict
    of them; None entries are ignored, integer and bool arrays count as
    finite, and empty input is finite.  Stops at the first non-finite block.
    """
    return _scan.all_finite(arrays)


def unscale_(arrays, inv_scale) -> bool:
    """Multiply every floating array in place by `inv_scale`; True when all inputs were finite.

    The check is on the input values, as torch does, and every floating array
    is multiplied completely even after a non-finite value.  float32 and
    float16/bfloat16 multiply by float32(inv_scale) (half types widened to
    float32 and rounded back to nearest even), float64 by the double.
    Read-only arrays, Python numbers, arrays whose elements overlap and
    arrays that share memory with each other raise;
    on error no array is modified.
    """
    # float32 and half arrays multiply by float32(inv_scale): it must be finite there too
    return _scan.unscale_(arrays, positive_scale("inv_scale", inv_scale))
