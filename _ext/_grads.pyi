# Types of the parameter-group gradient table (_grads.pyx), reached through lscore.kernels.
from typing import Any

import numpy as np

FP16_MESSAGE: str

class GradTable:
    size: int
    def __init__(
        self,
        fast_type: type,
        codes: dict,
        strided: Any,
        tensor_type: type,
        assert_error: type = ...,
        capacity: int = 64,
    ) -> None: ...
    @property
    def uses_dlpack(self) -> bool: ...
    def clear(self) -> None: ...
    def add(self, ptr: int, count: int, stride: int, code: int) -> None: ...
    def collect_grads(
        self, param_groups: Any, allow_fp16: bool, written: list, others: list
    ) -> None: ...
    def add_tensor(self, obj: Any, code: int) -> bool: ...
    def views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...
