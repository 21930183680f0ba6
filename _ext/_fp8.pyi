# Types of the compiled float8 casts (_fp8.pyx); lscore.kernels names them for the rooms above.
import numpy as np
import numpy.typing as npt

FORMATS: dict[str, int]
SAT: int
NAN_SIGN: int
AMAX_NAN: int

def cast(
    x: npt.NDArray[np.generic],
    out: npt.NDArray[np.generic],
    scale: float,
    fmt: str,
    saturate: bool = True,
    nan_sign: bool = True,
    amax_nan: bool = False,
    threads: int = 0,
) -> float: ...
def cast_rows(
    x: npt.NDArray[np.generic],
    out: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    amaxes: npt.NDArray[np.float32],
    fmt: str,
    saturate: bool = True,
    nan_sign: bool = True,
    amax_nan: bool = False,
    threads: int = 0,
) -> None: ...
def amax(x: npt.NDArray[np.generic], amax_nan: bool = False, threads: int = 0) -> float: ...
def amax_rows(
    x: npt.NDArray[np.generic],
    amaxes: npt.NDArray[np.float32],
    amax_nan: bool = False,
    threads: int = 0,
) -> None: ...
def decode(
    q: npt.NDArray[np.generic],
    out: npt.NDArray[np.generic],
    fmt: str,
    scale: float = 1.0,
    threads: int = 0,
) -> None: ...
def decode_rows(
    q: npt.NDArray[np.generic],
    out: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    fmt: str,
    threads: int = 0,
) -> None: ...
def isa() -> str: ...
def isa_levels() -> list[str]: ...
def set_isa(name: str) -> str: ...
def block_shapes(
    shape: tuple[int, ...], block: int, axis: int, e2m1: bool
) -> tuple[tuple[int, ...], tuple[int, ...]]: ...
