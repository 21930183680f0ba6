"""The CUDA side of the core: lscore's kernels on CuPy, for any framework's device arrays.

Neutral ground for the adapters: the CuPy adapter and the torch adapter
(CUDA tensors) both launch lscore's kernels through this package and never
import each other.  Importing it imports no GPU framework; CuPy is
imported when a kernel is first compiled or launched.

What a user needs is here: ``ArrayKernels`` (all_finite / unscale_ /
unscale_and_norm / unscale_and_clip_ over nested device arrays of an array
module, launched by a backend such as ``CupyBackend``), ``LaunchConfig`` and
``launch_config`` (chunk, block and launch limits; ``LSCORE_CUDA_LAUNCH``),
``device_missing``, the compiled-kernel cache (``kernel_image``,
``kernel_cache_dir``, ``LSCORE_KERNEL_CACHE_DIR``, ``LSCORE_KERNEL_CACHE``) and
the NVRTC compile itself (``compile_kernels``, ``source``, ``KERNELS``,
``NVRTC_OPTIONS``).  The machinery lives in the submodules:

- ``loader``: the ``.cu`` sources, NVRTC, the disk cache, modules per device
- ``launch``: ``MultiTensor`` (chunked launches per dtype group, the tensors in the kernel
  arguments, packed once)
- ``device_state``: ``DeviceState``, one ``lsc_state`` and its flags on a device
- ``optim``: ``FusedLauncher``, the fused SGD/Adam kernels, and ``bias_table``
- ``arrays``: ``ArrayKernels``
"""

from lscore.cuda.arrays import ArrayKernels
from lscore.cuda.launch import LaunchConfig, launch_config
from lscore.cuda.loader import (
    CACHE_DIR_ENV,
    CACHE_ENV,
    KERNELS,
    NVRTC_OPTIONS,
    CupyBackend,
    compile_kernels,
    device_missing,
    kernel_cache_dir,
    kernel_image,
    source,
)

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_ENV",
    "KERNELS",
    "NVRTC_OPTIONS",
    "ArrayKernels",
    "CupyBackend",
    "LaunchConfig",
    "compile_kernels",
    "device_missing",
    "kernel_cache_dir",
    "kernel_image",
    "launch_config",
    "source",
]
