# Types of the launch splitting and packing (_pack.pyx), reached through lscore.kernels.
from typing import Any

import numpy as np

def plan_launches(
    ptrs: Any, sizes: Any, chunk: int, max_tensors: int, max_blocks: int
) -> tuple[np.ndarray, list[tuple[int, int, int]]]: ...
def pack_launches(
    codes: Any,
    counts: Any,
    records: Any,
    chunk: int,
    max_tensors: int,
    max_blocks: int,
    depth: int,
    meta_tensors: int,
    meta_blocks: int,
    meta_size: int,
) -> tuple[np.ndarray, list[tuple[int, int]]]: ...
def launch_params(
    arguments: np.ndarray, meta_size: int, words: int, nwords: int
) -> tuple[np.ndarray, int]: ...
