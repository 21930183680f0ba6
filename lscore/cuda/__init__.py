"""The CUDA side of the core: lscore's kernels on CuPy, for any framework's device arrays.

Neutral ground for the adapters: the CuPy adapter and the torch adapter
(CUDA tensors) both launch lscore's kernels through this package and never
import each other.  Importing it imports no GPU framework; CuPy is
imported when a kernel is first compiled or launched.

What a user needs is here: ``ArrayKernels`` (all_finite / unscale_ /
unscale_and_norm / unscale_and_clip_ over nested device arrays of an array
module, launched by a ``Backend`` such as ``CupyBackend``), ``LaunchConfig`` and
``launch_config`` (chunk, block and launch limits; ``LSCORE_CUDA_LAUNCH``),
``device_missing``, the compiled-kernel cache (``kernel_image``,
``kernel_cache_dir``, ``LSCORE_KERNEL_CACHE_DIR``, ``LSCORE_KERNEL_CACHE``) and
the NVRTC compile itself (``compile_kernels``, ``source``, ``KERNELS``,
``NVRTC_OPTIONS``).  The machinery lives in the submodules:

- ``sources``: the ``.cu`` files, their kernel names and the text NVRTC compiles
- ``nvrtc``: the compile, with exact IEEE float32 options
- ``cache``: the disk cache of compiled kernels
- ``backend``: ``Backend``, the interface every backend provides
- ``cupy_backend``: ``CupyBackend``, modules loaded once per device
- ``loader``: every name of the four above, from one import
- ``config``: ``LaunchConfig``, its defaults and ``LSCORE_CUDA_LAUNCH``
- ``launch``: ``MultiTensor`` (chunked launches per dtype group, the tensors in the kernel
  arguments, packed once)
- ``device_state``: ``DeviceState``, one ``lsc_state`` and its flags on a device
- ``optim``: ``FusedLauncher``, the fused SGD/Adam kernels, and ``bias_table``
- ``arrays``: ``ArrayKernels``
"""

from lscore.cuda.arrays import ArrayKernels
from lscore.cuda.backend import Backend
from lscore.cuda.cache import CACHE_DIR_ENV, CACHE_ENV, kernel_cache_dir, kernel_image
from lscore.cuda.config import LaunchConfig, launch_config
from lscore.cuda.cupy_backend import CupyBackend, device_missing
from lscore.cuda.nvrtc import NVRTC_OPTIONS, compile_kernels
from lscore.cuda.sources import KERNELS, source

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_ENV",
    "KERNELS",
    "NVRTC_OPTIONS",
    "ArrayKernels",
    "Backend",
    "CupyBackend",
    "LaunchConfig",
    "compile_kernels",
    "device_missing",
    "kernel_cache_dir",
    "kernel_image",
    "launch_config",
    "source",
]
