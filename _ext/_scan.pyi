# Types of the compiled scan (_scan.pyx); the checked public API is lscore.scan.
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

SUPPORTED: str

def all_finite(arrays: Any, threads: int = 0) -> bool: ...
@overload
def unscale_(
    arrays: Any, inv_scale: float, stats: Literal[False] = False, threads: int = 0
) -> bool: ...
@overload
def unscale_(
    arrays: Any, inv_scale: float, stats: Literal[True], threads: int = 0
) -> tuple[bool, float, float]: ...
@overload
def unscale_(
    arrays: Any, inv_scale: float, stats: bool, threads: int = 0
) -> bool | tuple[bool, float, float]: ...
def all_finite_raw(
    ptrs: npt.NDArray[np.uint64],
    counts: npt.NDArray[np.int64],
    strides: npt.NDArray[np.int64],
    codes: npt.NDArray[np.int32],
    threads: int = 0,
) -> bool: ...
@overload
def unscale_raw(
    ptrs: npt.NDArray[np.uint64],
    counts: npt.NDArray[np.int64],
    strides: npt.NDArray[np.int64],
    codes: npt.NDArray[np.int32],
    inv_scale: float,
    stats: Literal[False] = False,
    threads: int = 0,
) -> bool: ...
@overload
def unscale_raw(
    ptrs: npt.NDArray[np.uint64],
    counts: npt.NDArray[np.int64],
    strides: npt.NDArray[np.int64],
    codes: npt.NDArray[np.int32],
    inv_scale: float,
    stats: Literal[True],
    threads: int = 0,
) -> tuple[bool, float, float]: ...
@overload
def unscale_raw(
    ptrs: npt.NDArray[np.uint64],
    counts: npt.NDArray[np.int64],
    strides: npt.NDArray[np.int64],
    codes: npt.NDArray[np.int32],
    inv_scale: float,
    stats: bool,
    threads: int = 0,
) -> bool | tuple[bool, float, float]: ...
def isa() -> str: ...
def isa_levels() -> list[str]: ...
def set_isa(name: str) -> str: ...
def pool_size() -> int: ...
def bench_read_u64(a: np.ndarray) -> int: ...
def bench_copy(dst: np.ndarray, src: np.ndarray) -> None: ...
