# Types of the compiled block-scaled format rules (_mx.pyx); lscore.kernels names them.
from typing import Any

import numpy as np
import numpy.typing as npt

MODES: dict[str, int]
WIDE_MODES: dict[str, int]
ELEMS: dict[str, int]

def e8m0_decode(q: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
def e8m0_encode(x: npt.ArrayLike) -> npt.NDArray[np.uint8]: ...
def e2m1_encode(x: npt.ArrayLike) -> npt.NDArray[np.uint8]: ...
def e2m1_decode(q: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
def scale(amax: npt.ArrayLike, elem: str, mode: str) -> npt.NDArray[np.uint8]: ...
def blockwise_scale(
    amax: npt.ArrayLike,
    elem: str,
    mode: str,
    pow2: bool = False,
    eps: float = 0.0,
    dtype: str = "float32",
) -> npt.NDArray[np.float32]: ...
def block_shapes(
    shape: tuple[int, ...], block: int, axis: int, e2m1: bool
) -> tuple[tuple[int, ...], tuple[int, ...]]: ...
def quantize(
    x: npt.ArrayLike,
    elem: str,
    mode: str,
    block: int = 32,
    *,
    axis: int = -1,
    out: tuple[npt.NDArray[Any], npt.NDArray[Any]] | None = None,
    threads: int = 0,
    tile: bool = False,
    pow2: bool = False,
    eps: float = 0.0,
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]: ...
def nvfp4_tensor_scale(amax: float) -> float: ...
def nvfp4_quantize(
    x: npt.ArrayLike,
    pts: float | None = None,
    *,
    axis: int = -1,
    out: tuple[npt.NDArray[Any], npt.NDArray[Any]] | None = None,
    threads: int = 0,
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]: ...
def isa() -> str: ...
def set_isa(name: str) -> str: ...
