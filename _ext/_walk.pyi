# Types of the device-array walk (_walk.pyx), reached through lscore.kernels.
from collections.abc import Callable
from typing import Any

import numpy as np

READ_NUMPY: int
READ_CUDA_ARRAY: int
READ_DLPACK: int
DLPACK_DEVICES: dict[str, int]

class DevicePlan:
    narrays: int
    groups: list[tuple[int, int, np.ndarray, np.ndarray]]
    devices: tuple[int, ...]
    codes: tuple[int, ...]
    leaf_addresses: np.ndarray
    leaf_counts: np.ndarray
    leaf_codes: np.ndarray
    leaf_devices: np.ndarray
    leaf_c_contiguous: np.ndarray
    leaf_writable: np.ndarray
    leaf_type: type | None
    write_error: str | None
    payload: dict
    def same_shapes(self, other: DevicePlan) -> bool | None: ...

class DeviceTable:
    hits: int
    misses: int
    def __init__(
        self,
        array_type: type,
        kind: int,
        classify: Callable[[Any], int | None],
        expected: str,
        hint: str = ...,
        device: int = ...,
        cache_size: int = ...,
        dl_device: int = ...,
    ) -> None: ...
    def clear(self) -> None: ...
    def plan(self, arrays: Any, attr: str | None = None) -> DevicePlan: ...
