"""TransformerEngine v2.18's NVFP4 recipe kernels of nvfp4.cu on a device.

Framework-neutral as ``lscore.cuda.mx`` is: an input is a ``DeviceView``
read in place as a strided 2-D view, the launches go through a kernel
backend (``CupyBackend`` on a GPU, the host harness in the tests), and the
results are bitwise those of the CPU kernels (``lscore.kernels.
nvfp4_te_quantize``, ``hadamard16_amax``) in their layouts: blocks of 16
along the last axis (scales: the input's shape with the last axis divided
by 16, codes by 2), down the columns of a 2-D input (``axis=0``: scales
(rows / 16, cols), codes (rows / 2, cols)), or 16 x 16 tiles (scales (rows /
16, cols / 16)).  Every check runs before a launch.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from lscore import kernels
from lscore.cuda.sources import nv4_name
from lscore.cuda.views import DeviceView, KernelLauncher, cupy_hooks
from lscore.dtypes import BY_NAME

__all__ = ["Nv4Arrays", "Nv4Launcher", "cupy_nvfp4", "nvfp4_arrays"]

_FLOATS = ("float32", "float16", "bfloat16")
_U64 = 2**64


def _word(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < _U64:
        raise ValueError(f"{what} must be an integer from 0 to 2**64 - 1, got {v!r}")
    return v


class Nv4Launcher(KernelLauncher):
    """Launches nvfp4.cu's kernels (``KernelLauncher``'s backend, block and grid)."""

    def quantize(
        self,
        x: DeviceView,
        scales_ptr: int,
        data_ptr: int,
        *,
        amax: float,
        axis: int,
        tile: bool,
        rht: bool,
        seed: int | None,
        offset: int,
        hw: int = 1,
        stream: Any = None,
    ) -> None:
        """The codes of `x` (checked by the caller) at scales_ptr and data_ptr, C-contiguous
        and shaped as ``nv4_shapes`` says."""
        import numpy as np

        s, o = seed or 0, offset
        rng: tuple = (np.int32(seed is not None), np.uint32(s & 0xFFFFFFFF), np.uint32(s >> 32))
        rng += (np.uint32(o & 0xFFFFFFFF), np.uint32(o >> 32))
        out = (np.uint64(scales_ptr), np.uint64(data_ptr))
        code = BY_NAME[x.dtype]
        tail: tuple
        if tile:  # a thread per 16 x 16 tile, or per block of 16
            name, tail, per = nv4_name("tiles", code, hw), (np.int32(axis == 0), *out), 256
        elif axis == 0:
            name, tail, per = nv4_name("cols", code, hw), (np.int32(rht), *rng, *out), 16
        else:
            name, tail, per = nv4_name("rows", code, hw), (*rng, *out), 16
        self._launch(name, x, True, (np.float32(amax), *tail), stream, per)

    def rht(self, x: DeviceView, out_ptr: int, amax_ptr: int, stream: Any = None) -> None:
        """The transform of a bfloat16 `x` down its columns into out_ptr (0: none), its amax
        bits folded into the zeroed uint32 at amax_ptr."""
        import numpy as np

        tail = (np.uint64(out_ptr), np.uint64(amax_ptr))
        self._launch("lsc_nv4_rht", x, True, tail, stream, 16)

    def dequantize(
        self,
        scales_ptr: int,
        data_ptr: int,
        out_ptr: int,
        out_dtype: str,
        *,
        rows: int,
        cols: int,
        layout: int,
        amax: float,
        stream: Any = None,
    ) -> None:
        """out (rows x cols, C order) = e2m1 * TE's decode scale, from codes of `layout` (0
        rows, 1 columns, 2 tiles along the rows, 3 tiles down the columns)."""
        import numpy as np

        if rows * cols == 0:
            return
        args: tuple = (np.uint64(scales_ptr), np.uint64(data_ptr), np.int64(rows), np.int64(cols))
        args += (np.int32(layout), np.float32(amax), np.uint64(out_ptr))
        name = nv4_name("dequant", BY_NAME[out_dtype])
        self.backend.launch(name, self._grid(rows * cols), self.block, args, stream)


class Nv4Arrays:
    """TE's NVFP4 quantize and decode over device arrays of one framework, bound by hooks as
    ``lscore.cuda.mx.BlockArrays`` is: ``view``, ``empty``, ``zeros``, ``to_host``,
    ``launcher`` (an ``Nv4Launcher``) and ``stream``."""

    def __init__(self, **hooks: Any) -> None:
        self.h = hooks

    def _float(self, x: Any) -> DeviceView:
        v = self.h["view"](x)
        if v.dtype not in _FLOATS:
            raise TypeError(f"x must be float32, float16 or bfloat16, got {v.dtype}")
        return v

    def rht_amax(self, x: Any) -> float:
        """The amax of the Hadamard transform of a 2-D bfloat16 `x` down its columns, NaN
        left out (one read back to the host)."""
        import numpy as np

        v = self._float(x)
        if v.dtype != "bfloat16" or len(v.shape) != 2 or v.shape[0] % 16:
            raise ValueError(
                f"x must be 2-D bfloat16 with rows a multiple of 16, got {v.dtype} {v.shape}"
            )
        word = self.h["zeros"](x, 1, "uint32")
        launcher = self.h["launcher"](x)
        launcher.rht(v, 0, self.h["view"](word).ptr, stream=self.h["stream"](x))
        return float(np.asarray(self.h["to_host"](word), np.uint32).view(np.float32)[0])

    def quantize(
        self,
        x: Any,
        amax: float,
        *,
        axis: int = -1,
        tile: bool = False,
        rht: bool = False,
        seed: int | None = None,
        offset: int = 0,
    ) -> tuple[Any, Any]:
        """(scale codes, packed codes) of x with the global amax `amax`, uint8 device arrays
        in the CPU kernels' layouts (``lscore.kernels.nvfp4_te_quantize``'s arguments)."""
        v = self._float(x)
        shape = tuple(v.shape)
        s_shape, d_shape = kernels.nvfp4_te_shapes(
            shape, axis, tile, rht, seed is not None, v.dtype
        )
        _word(seed if seed is not None else 0, "seed")
        _word(offset, "offset")
        scales, data = (self.h["empty"](x, sh, "uint8") for sh in (s_shape, d_shape))
        ptrs = (self.h["view"](scales).ptr, self.h["view"](data).ptr)
        opts = dict(amax=amax, axis=axis, tile=tile, rht=rht, seed=seed, offset=offset)
        self.h["launcher"](x).quantize(v, *ptrs, **opts, stream=self.h["stream"](x))
        return scales, data

    def dequantize(
        self,
        scales: Any,
        data: Any,
        amax: float,
        *,
        axis: int = -1,
        tile: bool = False,
        dtype: str = "float32",
    ) -> Any:
        """The values the codes stand for, shaped as the quantized input: e2m1 times TE's
        decode scale in float32, rounded once to `dtype` (a name)."""
        if dtype not in _FLOATS:
            raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
        d_shape = tuple(self.h["view"](data).shape)
        shape = (d_shape[0] * 2, d_shape[1]) if axis == 0 else (*d_shape[:-1], d_shape[-1] * 2)
        want, _ = kernels.nvfp4_te_shapes(shape, axis, tile)
        if tuple(self.h["view"](scales).shape) != want:
            raise ValueError(f"scales must have shape {want} for data of shape {d_shape}")
        out = self.h["empty"](data, shape, dtype)
        cols = shape[-1]
        self.h["launcher"](data).dequantize(
            self.h["view"](scales).ptr,
            self.h["view"](data).ptr,
            self.h["view"](out).ptr,
            dtype,
            rows=math.prod(shape[:-1]),
            cols=cols,
            layout=(2 if tile else 0) + (axis == 0),
            amax=amax,
            stream=self.h["stream"](data),
        )
        return out


@functools.cache
def cupy_nvfp4() -> Nv4Arrays:
    """``Nv4Arrays`` bound to CuPy arrays and ``CupyBackend``, launching on CuPy's current
    stream (float32 and float16: CuPy has no bfloat16)."""
    return Nv4Arrays(**cupy_hooks(Nv4Launcher))


@functools.cache
def nvfp4_arrays(arrays: Any) -> Nv4Arrays:
    """``Nv4Arrays`` on the framework of `arrays`, an arrays class of lscore.cuda bound by the
    same hooks (``lscore.cuda.fp8.Float8Arrays``, ``lscore.cuda.mx.BlockArrays``): an
    ``Nv4Launcher`` on the backend of each of its launchers."""
    launch = arrays.h["launcher"]
    return Nv4Arrays(**{**arrays.h, "launcher": lambda a: Nv4Launcher(launch(a).backend)})
