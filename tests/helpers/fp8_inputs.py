"""Seeded inputs of the float8 quantize tests, for NumPy and torch alike.

``float8_input(seed, shape, dtype, how)`` is a view of `shape` into a larger float array
(float32, float16 or bfloat16) that mixes normals over 14 decades with ``SPECIAL`` values
(zeros of both signs, subnormals, NaN of both signs, +-Inf, values that overflow e4m3fn and
e5m2), about half of each; `how` picks the layout: ``"contiguous"`` (a C-ordered view),
``"step"`` (every second row, every fourth column), ``"transpose"`` (the axes reversed) or
``"reverse"`` (the last axis backwards, NumPy only: torch has no negative strides).  With
``torch=True`` the same values and layout as a torch tensor, a view of one tensor too.
"""

from __future__ import annotations

import numpy as np

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

#: the float8 casts' edge values: zeros, subnormals, e4m3fn's 448 and its rounding edge 464,
#: values past e4m3fn and e5m2, float16's 65504, +-Inf, NaN of both signs
SPECIAL = np.array(
    [
        0.0,
        -0.0,
        1e-45,
        -1e-40,
        2.0**-10,
        2.0**-20,
        1.0,
        -3.0,
        448.0,
        464.0,
        465.0,
        6e4,
        65504.0,
        1e38,
        np.inf,
        -np.inf,
        np.nan,
        -np.nan,
    ],
    np.float32,
)
#: the input dtypes the float8 casts read, by name
FLOATS = {"float32": np.float32, "float16": np.float16}
if ml_dtypes is not None:
    FLOATS["bfloat16"] = ml_dtypes.bfloat16
HOWS = ("contiguous", "step", "transpose", "reverse")


def float8_input(seed: int, shape: tuple, dtype: str, how: str, *, torch: bool = False):
    """A `how` view of `shape` (see the module) of `dtype` (a name of ``FLOATS``)."""
    rng = np.random.default_rng(seed)
    full = (*(s * 2 for s in shape[:-1]), shape[-1] * 4)
    m = int(np.prod(full))
    big = np.concatenate(
        [rng.standard_normal(m) * 10.0 ** rng.integers(-8, 6, m), rng.choice(SPECIAL, m)]
    )
    with np.errstate(over="ignore"):  # float16 overflows to Inf: one more special
        base = rng.permutation(big)[:m].astype(np.float32).astype(FLOATS[dtype]).reshape(full)
    if torch:
        base = _to_torch(base)
    head = tuple(slice(0, s) for s in shape)
    if how == "contiguous":
        return base[head]
    if how == "step":
        return base[(*(slice(0, 2 * s, 2) for s in shape[:-1]), slice(0, 4 * shape[-1], 4))]
    if how == "transpose":
        v = base[head]
        return v.permute(*reversed(range(v.ndim))) if torch else v.T
    if how == "reverse" and not torch:
        return base[head][..., ::-1]
    raise ValueError(f"how must be one of {HOWS} (torch: not 'reverse'), got {how!r}")


def _to_torch(a: np.ndarray):
    """`a` as a torch tensor sharing its memory (bfloat16 through its 16-bit words)."""
    import torch

    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
