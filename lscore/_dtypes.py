"""Dtype codes of the compiled core (mirror of the enum in _ext/lsc_scan.h)."""
import enum


class Code(enum.IntEnum):
    INT = 0        # integer and bool: finite, never written
    F16 = 1
    BF16 = 2
    F32 = 3
    F64 = 4
    E4M3FN = 5
    E5M2 = 6


# str(dtype) -> code; works for numpy/ml_dtypes, cupy and torch dtype names alike
BY_NAME = {
    "float16": Code.F16, "half": Code.F16,
    "bfloat16": Code.BF16,
    "float32": Code.F32, "float": Code.F32,
    "float64": Code.F64, "double": Code.F64,
    "float8_e4m3fn": Code.E4M3FN,
    "float8_e5m2": Code.E5M2,
    "bool": Code.INT,
    **{f"{s}int{b}": Code.INT for s in ("", "u") for b in (2, 4, 8, 16, 32, 64)},
}
