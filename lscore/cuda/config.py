"""How lscore's CUDA kernels split their work: ``LaunchConfig`` (chunk, threads per block,
tensors and blocks per launch), its defaults, and the process's choice,
``LSCORE_CUDA_LAUNCH``."""

from __future__ import annotations

import dataclasses
import numbers
import os

__all__ = ["ENV", "LaunchConfig", "launch_config"]

CHUNK = 65536  #: elements per block
BLOCK = 1024  #: threads per block of the scan kernels (torch and apex use 512; see LaunchConfig)
OPT_BLOCK = 512  #: threads per block of the fused optimizers
MAX_TENSORS = 4096  #: tensors per launch
MAX_BLOCKS = 65535  #: blocks (chunks) per launch
# elements in the scan kernels' 16-byte vector load of the narrowest dtype (float16/bfloat16):
# a chunk that is a multiple of it keeps every chunk on the vector path (scan.cu)
VECTOR = 8
#: the environment variable holding the process's launch configuration
ENV = "LSCORE_CUDA_LAUNCH"


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """How the kernels split their work: elements per block (`chunk`), threads per block
    of the scan kernels (`block`, at most: see below) and of the fused optimizers
    (`opt_block`), and the tensors and blocks one launch holds at most.

    The chunk is torch's and apex's multi-tensor one (65536 elements).  The block
    (1024 threads, where torch and apex take 512) is what ``lscore bench --suite
    gpu-tune`` chose on an H200: over its grid of 3 chunks x 4 blocks and six
    workloads it had the smallest geometric mean of time over each workload's best
    (1.05, against 1.06 for block 512), and ``unscale_`` over arrays of 1e8 float32
    and 2e8 float16 or bfloat16 elements ran 1-7% faster with it than with 512.
    Over small arrays the same grid preferred 128 or 256 threads, so a scan launch
    whose blocks hold less than 64 bytes a thread runs fewer threads: enough for 64
    bytes each, at least 128.  The fused optimizers keep 512 threads: on the same H200,
    a replayed SGD or Adam step over 2000 arrays of 4096 elements took 10-12%
    longer with 1024.  Run that suite on another GPU to choose for it.  ``str()``
    gives the form ``LSCORE_CUDA_LAUNCH`` and ``parse`` read.
    """

    chunk: int = CHUNK
    block: int = BLOCK
    opt_block: int = OPT_BLOCK
    max_tensors: int = MAX_TENSORS
    max_blocks: int = MAX_BLOCKS

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"{f.name} must be an int, got {v!r}")
            object.__setattr__(self, f.name, int(v))
        if self.chunk < VECTOR or self.chunk % VECTOR:
            raise ValueError(
                f"chunk must be a positive multiple of {VECTOR} (the vector "
                f"width of float16), got {self.chunk}"
            )
        for name in ("block", "opt_block"):
            v = getattr(self, name)
            if not (32 <= v <= 1024 and v % 32 == 0):
                raise ValueError(f"{name} must be a multiple of 32 in [32, 1024], got {v}")
        # the block table packs the tensor index into 32 bits; a grid's x is below 2**31
        if not 1 <= self.max_tensors <= 0xFFFFFFFF:
            raise ValueError(f"max_tensors must be in [1, 2**32 - 1], got {self.max_tensors}")
        if not 1 <= self.max_blocks <= 0x7FFFFFFF:
            raise ValueError(f"max_blocks must be in [1, 2**31 - 1], got {self.max_blocks}")

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))

    @classmethod
    def parse(cls, text: str, *, base: LaunchConfig | None = None) -> LaunchConfig:
        """`base` (default: the defaults) with the ``key=value`` pairs of `text` changed,
        e.g. ``"chunk=16384,block=256"``; ValueError naming the bad pair."""
        keys = [f.name for f in dataclasses.fields(cls)]
        values = {}
        for item in (x.strip() for x in text.split(",")):
            if not item:
                continue
            key, eq, value = (x.strip() for x in item.partition("="))
            if not eq:
                raise ValueError(f"launch setting {item!r} is not key=value, e.g. chunk=16384")
            if key not in keys:
                raise ValueError(
                    f"unknown launch setting {key!r}; expected one of: {', '.join(keys)}"
                )
            if key in values:
                raise ValueError(f"launch setting {key!r} given twice")
            try:
                values[key] = int(value)
            except ValueError:
                raise ValueError(
                    f"launch setting {key} must be an integer, got {value!r}"
                ) from None
        return dataclasses.replace(base if base is not None else cls(), **values)


def launch_config() -> LaunchConfig:
    """The process's launch configuration: the defaults, changed by ``LSCORE_CUDA_LAUNCH``.

    Read whenever a launcher is built (a ``MultiTensor`` per device), so set the
    variable before the first GPU call.  ValueError, naming the variable, on a bad value.
    """
    text = os.environ.get(ENV, "")
    try:
        return LaunchConfig.parse(text)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{ENV}={text!r}: {e}") from None
