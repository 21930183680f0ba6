"""The CUDA side of the core: kernel loading, multi-tensor launches, the device-resident state.

Neutral ground for the adapters: the CuPy adapter and the torch adapter
(CUDA tensors) both launch lscore's kernels through this package and never
import each other.  Importing it imports no GPU framework; CuPy is
imported when a kernel is first compiled or launched.

- ``loader``: the ``.cu`` sources, CuPy's NVRTC (``compile_kernels``), modules per
  device, ``CupyBackend``
- ``launch``: ``LaunchConfig`` / ``launch_config`` (chunk, block and launch limits; the
  process's from ``LSCORE_CUDA_LAUNCH``), ``plan_launches`` and ``MultiTensor`` (chunked
  launches per dtype group, the tensors in the kernel arguments, packed once)
- ``device_state``: ``DeviceState``, one ``lsc_state`` and its flags on a device
- ``optim``: ``FusedLauncher``, the fused SGD/Adam kernels over planned records
  (float32 master weights), and ``bias_table`` (Adam's bias correction for a device counter)
- ``arrays``: ``ArrayKernels``, all_finite / unscale_ over nested device arrays
  (compiled walk, cached plans, packed launches, one read of the flag)
"""

from lscore.cuda.arrays import ArrayKernels
from lscore.cuda.device_state import DeviceState
from lscore.cuda.launch import (
    BLOCK,
    CHUNK,
    MAX_BLOCKS,
    MAX_TENSORS,
    LaunchConfig,
    Launches,
    MultiTensor,
    Plan,
    launch_config,
    plan_launches,
)
from lscore.cuda.loader import (
    KERNELS,
    NVRTC_OPTIONS,
    OPS,
    TRAITS,
    UPDATE_KERNEL,
    CupyBackend,
    compile_kernels,
    device_missing,
    kernel_name,
    module,
    source,
)
from lscore.cuda.optim import FusedLauncher, FusedPlan, bias_table

__all__ = [
    "BLOCK",
    "CHUNK",
    "KERNELS",
    "MAX_BLOCKS",
    "MAX_TENSORS",
    "NVRTC_OPTIONS",
    "OPS",
    "TRAITS",
    "UPDATE_KERNEL",
    "ArrayKernels",
    "CupyBackend",
    "DeviceState",
    "FusedLauncher",
    "FusedPlan",
    "LaunchConfig",
    "Launches",
    "MultiTensor",
    "Plan",
    "bias_table",
    "compile_kernels",
    "device_missing",
    "kernel_name",
    "launch_config",
    "module",
    "plan_launches",
    "source",
]
