"""Loader of lscore's CUDA kernels: the names every compile, load and launch goes through.

Design: the kernels are the ``.cu`` files shipped in ``lscore._ext`` (package
data), named in ``lscore.cuda.sources``.  The code comes from CuPy's NVRTC
(``lscore.cuda.nvrtc.compile_kernels``, the same function the CI tests run
without a GPU) with exact IEEE float32 options, is kept in a disk cache of the
user's own (``lscore.cuda.cache.kernel_image``: one compile per machine, not per
process, device and rank) and is loaded once per device by the CuPy backend
(``lscore.cuda.cupy_backend``).  CuPy is imported only when a kernel is first
compiled or launched.
"""

from __future__ import annotations

from lscore.cuda import cache, cupy_backend, nvrtc, sources
from lscore.cuda.cache import *  # noqa: F403
from lscore.cuda.cupy_backend import *  # noqa: F403
from lscore.cuda.nvrtc import *  # noqa: F403
from lscore.cuda.sources import *  # noqa: F403

__all__ = [*sources.__all__, *nvrtc.__all__, *cache.__all__, *cupy_backend.__all__]
