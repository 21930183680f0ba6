"""Dtype codes of the compiled core (lsc_codes.h, read through _codes); public for the adapters."""

import enum

from lscore._ext._codes import CODES


class Code(enum.IntEnum):
    """The dtype code of each format the core reads (lsc_codes.h); ``INT`` is integer and bool."""

    INT = CODES["INT"]  # integer and bool: finite, never written
    F16 = CODES["F16"]
    BF16 = CODES["BF16"]
    F32 = CODES["F32"]
    F64 = CODES["F64"]
    E4M3FN = CODES["E4M3FN"]
    E5M2 = CODES["E5M2"]


# str(dtype) -> code; works for numpy/ml_dtypes, cupy and torch dtype names alike
BY_NAME = {
    "float16": Code.F16,
    "half": Code.F16,
    "bfloat16": Code.BF16,
    "float32": Code.F32,
    "float": Code.F32,
    "float64": Code.F64,
    "double": Code.F64,
    "float8_e4m3fn": Code.E4M3FN,
    "float8_e5m2": Code.E5M2,
    "bool": Code.INT,
    **{f"{s}int{b}": Code.INT for s in ("", "u") for b in (2, 4, 8, 16, 32, 64)},
}
