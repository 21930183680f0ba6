# Types of the compiled float8 scale rules and delayed-scaling state (_fp8_scale.pyx);
# lscore.kernels names them for the rooms above, lscore.fp8 is their public face.
import numpy as np
import numpy.typing as npt

AMAX_ALGOS: dict[str, int]

def scale_te(
    amax: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
    fp8_max: float,
    pow2: bool,
    eps: float,
) -> None: ...
def scale_torchao(
    amax: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
    fp8_max: float,
    pow2: bool,
    eps: float,
) -> None: ...
def scaled_max(fp8_max: float, margin: int) -> float: ...

class Fp8Delayed:
    def __init__(
        self,
        n: int,
        length: int,
        algo: str,
        amax_nan: bool,
        scaled_max: npt.NDArray[np.float32],
    ) -> None: ...
    def record(self, amax: npt.NDArray[np.float32]) -> None: ...
    def update(self) -> None: ...
    def set_current(self, amax: npt.NDArray[np.float32]) -> None: ...
    def load(
        self,
        history: npt.NDArray[np.float32],
        scale: npt.NDArray[np.float32],
        scale_inv: npt.NDArray[np.float32],
    ) -> None: ...
    @property
    def history(self) -> npt.NDArray[np.float32]: ...
    @property
    def current(self) -> npt.NDArray[np.float32]: ...
    @property
    def scale(self) -> npt.NDArray[np.float32]: ...
    @property
    def scale_inv(self) -> npt.NDArray[np.float32]: ...
