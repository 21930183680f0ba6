"""Multi-tensor launch plans: tensors split into chunked launches, their tables and packing.

``plan_launches`` splits tensors into launches of chunks (the compiled
planner of ``lscore.kernels``); ``Launches`` holds one device's packed
launches; ``argument_widths`` and ``launch_entries`` describe a packed
launch's parameters; ``scan_threads`` picks a scan launch's block size.
``lscore.cuda.launch.MultiTensor`` launches what these plan.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from lscore import kernels
from lscore.cuda.config import CHUNK, MAX_BLOCKS, MAX_TENSORS
from lscore.cuda.sources import OPS, TRAITS
from lscore.dtypes import Code

__all__ = [
    "MIN_THREADS",
    "THREAD_BYTES",
    "Launches",
    "Plan",
    "argument_widths",
    "kernel_code",
    "launch_entries",
    "meta_dtype",
    "plan_launches",
    "scan_threads",
]

#: a scan launch over small arrays runs enough threads per block for this many bytes of its
#: largest block's work per thread (four 16-byte vectors; see scan_threads)
THREAD_BYTES = 64
#: the fewest threads per block of a scan launch (or `block`, when smaller)
MIN_THREADS = 128
_ITEMSIZE = {Code.F16: 2, Code.BF16: 2, Code.F32: 4, Code.F64: 8}

Plan = collections.namedtuple("Plan", "table launches")
Plan.__doc__ = """Host tables of one dtype group: `table` (uint64) holds every launch's
table back to back; `launches` lists (offset in words, ntensors, nblocks)."""


def plan_launches(
    ptrs: Any,
    sizes: Any,
    *,
    chunk: int = CHUNK,
    max_tensors: int = MAX_TENSORS,
    max_blocks: int = MAX_BLOCKS,
) -> Plan:
    """Split tensors (device addresses, element counts) into launches of chunks.

    Each block of a launch handles one chunk of one tensor; a launch holds at
    most `max_tensors` tensors and `max_blocks` blocks, and a tensor that does
    not fit is continued in the next launch (as apex's multi_tensor_apply
    does).  Empty tensors get no block.  The table layout is the one
    documented in _ext/scan.cu; the work is compiled (lscore.kernels).
    """
    table, launches = kernels.plan_launches(ptrs, sizes, chunk, max_tensors, max_blocks)
    return Plan(table, launches)


@functools.cache
def meta_dtype(meta: str) -> np.dtype:
    """NumPy's layout of scan.cu's lsc_meta `meta` (packed as C lays it out: no padding)."""
    nt, nb = kernels.META[meta]
    return np.dtype(
        [
            ("ptr", "<u8", (nt,)),
            ("size", "<i8", (nt,)),
            ("chunk_of", "<i4", (nb,)),
            ("tensor_of", "<u2", (nb,)),
        ]
    )


def scan_threads(block: int, chunk: int, largest: int, code: int) -> int:
    """Threads per block of a scan launch whose largest array has `largest` elements of
    dtype `code`: one per `THREAD_BYTES` of its fullest block (at most `chunk` elements),
    rounded up to a warp, between ``min(MIN_THREADS, block)`` and `block`.

    On an H200 (``lscore bench --suite gpu-tune``), an unscale over 300 arrays of 64
    float32 elements took 51 µs with 128 or 256 threads per block and 59 µs with 1024,
    whatever the chunk: a block of 1024 threads holds a multiprocessor's registers
    alone, so 300 of them run in waves.  Over arrays of a chunk or more the launch
    keeps `block` threads.
    """
    need = -(-min(chunk, largest) * _ITEMSIZE[Code(code)] // THREAD_BYTES)
    return max(min(MIN_THREADS, block), min(block, -(-need // 32) * 32))


def kernel_code(code: Any) -> int:
    """`code` as an int; TypeError when no scan kernel takes that dtype."""
    code = int(code)
    if code not in TRAITS:
        raise TypeError(
            f"dtype code {code} has no CUDA kernel; supported: "
            f"{', '.join(Code(k).name for k in TRAITS)}"
        )
    return code


def argument_widths(struct_size: int, call_widths: Iterable[int]) -> np.ndarray:
    """The byte widths (int64) of a packed launch's parameters, the array ``launch_packed``
    reads: the argument struct passed by value (`struct_size` bytes), the chunk (an int64),
    then each per-call parameter (`call_widths`), as the kernels of scan.cu and optim.cu
    declare them.  Their ``void*[]`` is a row of ``kernels.launch_params`` (one per packed
    launch) or, for one launch, ``MultiTensor.pack``'s."""
    return np.array([struct_size, 8, *call_widths], np.int64)


def launch_entries(
    rows: tuple[np.ndarray, int],
    specs: Iterable[tuple[int, int]],
    kernel: Callable[[int], Any],
    threads: Callable[[int], int],
    widths: np.ndarray,
) -> list[tuple]:
    """The entries ``MultiTensor.enqueue`` launches over the ``void*[]`` rows of
    ``kernels.launch_params`` (`rows`: the rows and the first one's address): launch k of
    `specs` (dtype code, blocks) runs ``kernel(code)`` with ``threads(code)`` threads per
    block and the first ``len(widths)`` words of row k."""
    params, base = rows
    step = 8 * params.shape[1]
    waddr, count = widths.ctypes.data, len(widths)
    return [
        (kernel(code), nb, threads(code), base + k * step, waddr, count)
        for k, (code, nb) in enumerate(specs)
    ]


class Launches:
    """The packed launches of one device's groups (built by ``MultiTensor.prepare``).

    ``ops[op]`` lists (kernel handle, grid, block, address of the
    ``void*[]``, address of the byte widths, parameter count); the device
    argument structs and the host argument blocks are held here for as long as this
    lives.  ``norm`` (packed by the first ``MultiTensor.launch_norm``) holds
    the one-pass norm's launches, its buffers and ``result``: the device
    float64 [norm, clip coefficient, found (1.0/0.0), folded total].
    """

    __slots__ = ("_keep", "count", "norm", "ops", "specs")

    def __init__(self) -> None:
        self.ops: dict[str, list] = {op: [] for op in OPS}
        self.count = 0
        self.norm: Any = None  # the one-pass norm (a _Norm), packed on first use
        # (dtype code, address of its argument block, blocks) of every launch
        self.specs: list[tuple] = []
        self._keep: list = []
