"""NaN and +/-Inf counted from an array's raw bits, and the arrays of a nested
structure named, for the overflow reports (``lscore.diagnostics`` re-exports both)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from lscore._ext import _codes
from lscore.dtypes import Code

_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_FORMAT_CODES = {
    "float16": Code.F16,
    "bfloat16": Code.BF16,
    "float32": Code.F32,
    "float64": Code.F64,
    "float8_e5m2": Code.E5M2,
    "float8_e4m3fn": Code.E4M3FN,
}


def _masks(code: Code) -> tuple:
    """(word type, sign, exponent, mantissa) masks of a float code, from lsc_codes.h.

    The mantissa is every bit below the exponent's lowest; e4m3fn has no Inf
    and its "exponent" (lowest bit 1) is its NaN pattern less the sign, so
    it gets no exponent mask and that pattern as its mantissa mask.
    """
    width = _codes.WIDTHS[code]
    expo, lsb = _codes.EXP[code]
    sign = 1 << (8 * width - 1)
    if lsb == 1:
        return _WORDS[width], sign, None, expo
    return _WORDS[width], sign, expo, lsb - 1


# sign, exponent and mantissa masks of each floating format, on the raw words
_FORMATS = {name: _masks(code) for name, code in _FORMAT_CODES.items()}
_CHUNK = 1 << 20  # elements per pass: bounds the temporaries on huge arrays


def count_nonfinite(a: Any, fmt: str | None = None) -> tuple[int, int, int]:
    """(NaN, +Inf, -Inf) counts of one NumPy array, from the raw bits.

    Integer and bool arrays have none.  Works for float16, bfloat16,
    float32, float64 and the float8 formats lscore scans, in any layout or
    byte order, without ml_dtypes' ufuncs.  `fmt` names the format of an
    array of raw words (a bfloat16 tensor viewed as int16, for instance).
    """
    a = np.asarray(a)
    if fmt is None and a.dtype.kind in "biu":
        return 0, 0, 0
    name = fmt or a.dtype.name
    masks = _FORMATS.get(name)
    if masks is None or a.dtype.itemsize != np.dtype(masks[0]).itemsize:
        raise TypeError(
            f"cannot count NaN/Inf in {name} ({a.dtype}); expected "
            f"{', '.join(_FORMATS)}, an integer or a bool dtype"
        )
    word, sign, expo, mant = masks
    if not a.dtype.isnative:
        a = a.byteswap().view(a.dtype.newbyteorder())
    flat = a.view(word).reshape(-1)
    nan = pos = neg = 0
    for i in range(0, flat.size, _CHUNK):
        w = flat[i : i + _CHUNK]
        if expo is None:  # e4m3fn: NaN only
            nan += int(np.count_nonzero((w & word(mant)) == word(mant)))
            continue
        special = (w & word(expo)) == word(expo)
        frac = (w & word(mant)) != 0
        nan += int(np.count_nonzero(special & frac))
        inf = special & ~frac
        negative = (w & word(sign)) != 0
        neg += int(np.count_nonzero(inf & negative))
        pos += int(np.count_nonzero(inf & ~negative))
    return nan, pos, neg


def named_arrays(arrays: Any, prefix: str = "") -> list[tuple[str, object]]:
    """Flatten `arrays` into (name, array) pairs.

    A mapping names its values by key (nested keys joined with "."); an
    iterable of (str, array) pairs (``model.named_parameters()``) keeps those
    names (a value may be an ``(array, format name)`` pair, see
    :func:`count_nonfinite`); other lists and tuples name by index; None
    entries are dropped.
    """
    out: list = []
    if arrays is None:
        return out
    if isinstance(arrays, Mapping):
        for k, v in arrays.items():
            out += named_arrays(v, f"{prefix}{k}." if not _is_leaf(v) else f"{prefix}{k}")
        return out
    if _is_leaf(arrays):
        out.append((prefix.rstrip(".") or "0", arrays))
        return out
    items = list(arrays)
    if items and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in items):
        for name, v in items:
            if v is not None:
                out.append((prefix + name, v))
        return out
    for i, v in enumerate(items):
        out += named_arrays(v, f"{prefix}{i}." if not _is_leaf(v) else f"{prefix}{i}")
    return out


def _is_leaf(x: Any) -> bool:
    return x is None or not isinstance(x, (Mapping, list, tuple))
