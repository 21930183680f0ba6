"""The argument checks of the float8 quantize, one home for every array library.

``lscore.fp8.quantize`` (NumPy), the CuPy launcher in ``lscore.cuda.fp8``,
the torch adapter's quantize and ``lscore.fp8.diagnostics`` take their
format names, NaN rules, row axes and scales through these, so a bad
argument reads the same wherever it is given.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from lscore import _fp8_checks
from lscore._fp8_checks import (
    Cast,
    block_axis,
    cast_options,
    check_scale,
    dtype_name,
    format_name,
    nan_rule,
    row_axis,
)
from lscore.policy import choice

__all__ = [
    "FLOATS",
    "FORMATS",
    "Cast",
    "block_axis",
    "cast_options",
    "check_scale",
    "dtype_name",
    "exact_fields",
    "float_input",
    "format_name",
    "fp8_dtype",
    "nan_rule",
    "out_dtype",
    "preset_fields",
    "row_axis",
    "row_shape",
    "rows_of",
]

#: float8 format names: the short ones (TransformerEngine's, torchao's recipes) and the dtype names
FORMATS = _fp8_checks.FORMATS
#: the input dtypes the casts read
FLOATS = ("float32", "float16", "bfloat16")


def float_input(x: Any, what: str = "x") -> np.ndarray:
    """x as a NumPy array of float32, float16 or bfloat16 (read in place, never copied)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what} must be a NumPy array, got {type(x).__name__}")
    if dtype_name(x.dtype) not in FLOATS:
        raise TypeError(f"{what} must be float32, float16 or bfloat16, got {x.dtype}")
    if not x.dtype.isnative:
        raise ValueError(f"{what} must be in native byte order, got {x.dtype.str}")
    return x


def out_dtype(dtype: Any) -> str:
    """A result dtype's name: float32, float16 or bfloat16 (a NumPy or ml_dtypes dtype or name)."""
    name = "bfloat16" if isinstance(dtype, str) and dtype == "bfloat16" else None
    if name is None:
        try:
            name = dtype_name(np.dtype(dtype))
        except TypeError:
            name = repr(dtype)
    if name not in FLOATS:
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
    return name


def rows_of(x: Any) -> int:
    """The number of rows (along the last axis) of an array of at least one dimension."""
    return math.prod(x.shape[:-1])


def row_shape(x: np.ndarray) -> tuple[int, ...]:
    """The shape of per-row amaxes and scales: the input's, with the last axis 1."""
    return (*x.shape[:-1], 1)


def fp8_dtype(name: str) -> Any:
    """ml_dtypes' dtype of that name (float8_e4m3fn, float8_e5m2, bfloat16)."""
    try:
        import ml_dtypes
    except ImportError as e:
        # a dependency of lscore: missing only after an install with --no-deps
        raise ImportError(
            f"NumPy's {name} comes from ml_dtypes, a dependency of lscore that is not "
            "installed here: install it with `pip install ml_dtypes`"
        ) from e
    return np.dtype(getattr(ml_dtypes, name))


# TransformerEngine's fp8_format -> (forward, backward) float8 formats
_TE_FORMATS = {"E4M3": ("e4m3fn", "e4m3fn"), "HYBRID": ("e4m3fn", "e5m2")}


def exact_fields(cls: Any, d: Any, *, defaults: bool = False) -> dict[str, Any]:
    """`d` if it is a dict with exactly the fields of dataclass `cls`, else an error naming
    the unknown and missing ones; with `defaults`, a field that has a default may be
    missing (a dict written before the field was added)."""
    if not isinstance(d, dict):
        raise TypeError(f"a recipe dict must be a dict, got {type(d).__name__}")
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    optional = {f.name for f in fields if f.default is not dataclasses.MISSING and defaults}
    unknown = sorted(set(d) - set(names))
    missing = [k for k in names if k not in d and k not in optional]
    if unknown or missing:
        raise ValueError(
            "a recipe dict must have exactly the fields "
            + ", ".join(names)
            + f"; unknown: {unknown}, missing: {missing}"
        )
    return d


def preset_fields(
    name: str,
    table: dict[str, dict[str, Any]],
    overrides: dict[str, Any],
    te: bool,
    te_fields: tuple[str, str],
) -> dict[str, Any]:
    """The fields of preset `name` of `table` with `overrides`; a TE preset also takes TE's
    ``fp8_format`` ("E4M3" / "HYBRID"), which sets its two `te_fields` (forward, backward).
    An unknown field is a ValueError listing the known ones."""
    fields: dict[str, Any] = {"name": name, **table[name]}
    overrides = dict(overrides)
    if "fp8_format" in overrides:
        fmt = overrides.pop("fp8_format")
        if not te:
            raise ValueError(f"fp8_format is a TE recipe's field, and {name!r} is not TE's")
        if fmt == "E5M2":
            raise ValueError(
                "fp8_format must be 'E4M3' or 'HYBRID': pure E5M2 training is not supported "
                "(as TE refuses it), got 'E5M2'"
            )
        fields[te_fields[0]], fields[te_fields[1]] = _TE_FORMATS[
            choice("fp8_format", fmt, tuple(_TE_FORMATS))
        ]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown recipe field {unknown[0]!r}; expected one of: "
            + ", ".join(fields)
            + (", fp8_format" if te else "")
        )
    fields.update(overrides)
    return fields
