"""lscore.cuda.mx's BlockArrays bound to NumPy arrays as device memory and the host harness:
the block-scaled kernels (mx.cu, blockwise.cu) run on the CPU."""

import numpy as np

from lscore.cuda import mx as cuda_mx
from lscore.cuda.views import DeviceView


def view(a):
    """A NumPy array as the DeviceView lscore.cuda reads."""
    return DeviceView(a.ctypes.data, a.shape, a.strides, a.dtype.name, a.itemsize)


def harness_blocks(backend, hw=1):
    """BlockArrays over NumPy arrays and `backend` (a HostBackend); hw: mx.cu's conversion
    instructions as the harness runs them (1) or the rules (0)."""
    import ml_dtypes

    class Launcher(cuda_mx.MxLauncher):
        def quantize(self, *a, **kw):
            super().quantize(*a, **kw, hw=hw)

    launcher = Launcher(backend, block=64, max_blocks=3)
    return cuda_mx.BlockArrays(
        view=view,
        empty=lambda like, shape, dt: np.empty(
            shape, ml_dtypes.bfloat16 if dt == "bfloat16" else dt
        ),
        upload=lambda like, host: np.array(host, np.float32),
        launcher=lambda a: launcher,
        stream=lambda a: None,
    )
