"""A ``cupy`` module over NumPy and the host harness: the documented GPU examples on the CPU.

``install(monkeypatch)`` puts this module in ``sys.modules`` as ``cupy`` and the CuPy
adapter's classes bound to it as ``lscore.adapters.cupy``, so a page's GPU block runs
unchanged, lscore's kernels on the harness (the same kernel text, bit for bit).

Arrays are ``ndarray``, a NumPy subclass.  Streams capture as CUDA captures: while the
current stream captures, array operations (ufuncs, ``copyto``, ``astype``, ``copy``,
``fill``, item assignment) and kernel launches are recorded, not run, with the
arguments a launch was given copied as cuLaunchKernel copies them; ``Graph.launch``
replays the record in order.  What CuPy refuses while a stream captures is refused
here the same way: a matrix product (CuPy calls cuBLAS for floating-point products and
raises NotImplementedError), a host-to-device or device-to-host copy, a
synchronisation.  Any other NumPy function is refused while capturing, so that a page
never relies on something this stand-in would run at once where a GPU records it.

``LAUNCHES.count`` counts what CuPy would launch on the device, run or recorded: each
ufunc, ``copyto``, ``astype``/``copy``, device-side item assignment (a fill or a copy)
and lscore kernel launch.  Allocations (``empty``) and views launch nothing.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from lscore import kernels
from lscore.adapters import device
from lscore.cuda.arrays import ArrayKernels

from . import HostBackend

#: CuPy's message for any cuBLAS call while the current stream captures (cupy_backends'
#: cuBLAS wrapper raises it as NotImplementedError)
CUBLAS_IN_CAPTURE = "calling cuBLAS API during stream capture is currently unsupported"
# the functions CuPy runs through cuBLAS for floating-point operands
_CUBLAS = {np.dot, np.vdot, np.inner, np.tensordot, np.einsum}
_ptrs = itertools.count(0x1000)
#: the device operations launched so far (see the module docstring)
LAUNCHES = types.SimpleNamespace(count=0)


class Stream:
    """A CUDA stream: the current one while entered; records what runs on it while it
    captures."""

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int = 0) -> None:
        self.ptr = 0 if null else ptr or next(_ptrs)
        self._record: list | None = None

    def __enter__(self) -> Stream:
        _current.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _current.pop()

    def is_capturing(self) -> bool:
        return self._record is not None

    def begin_capture(self, mode: Any = None) -> None:
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the legacy default stream")
        if self._record is not None:
            raise RuntimeError("this stream is already capturing")
        self._record = []

    def end_capture(self) -> Graph:
        if self._record is None:
            raise RuntimeError("this stream is not capturing")
        graph, self._record = Graph(self._record), None
        return graph

    def record(self, op: Callable[[], Any]) -> None:
        assert self._record is not None
        self._record.append(op)

    def synchronize(self) -> None:
        refuse_sync("a stream synchronisation")


Stream.null = Stream(null=True)  # type: ignore[attr-defined]
_current: list[Stream] = [Stream.null]  # type: ignore[attr-defined]


class Graph:
    """What a stream recorded between ``begin_capture`` and ``end_capture``."""

    def __init__(self, ops: list) -> None:
        self._ops = ops

    def launch(self, stream: Stream | None = None) -> None:
        for op in self._ops:
            op()

    def upload(self, stream: Stream | None = None) -> None:
        """Nothing to upload: host memory is device memory."""


def get_current_stream() -> Stream:
    return _current[-1]


def capturing() -> bool:
    return get_current_stream().is_capturing()


def refuse_sync(what: str) -> None:
    if capturing():
        # cudaErrorStreamCaptureUnsupported, as CuPy raises it
        raise RuntimeError(f"{what} while the current stream is capturing is not permitted")


class Device:
    """Device 0, the only one."""

    def __init__(self, device: int | None = None) -> None:
        self.id = 0 if device is None else device

    def synchronize(self) -> None:
        refuse_sync("a device synchronisation")

    def use(self) -> None:
        """Device 0 is always current."""

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _plain(a: Any) -> Any:
    if isinstance(a, ndarray):
        return a.view(np.ndarray)
    if isinstance(a, tuple):
        return tuple(_plain(b) for b in a)
    return a


def _plain_kwargs(kwargs: dict) -> dict:
    return {k: _plain(v) for k, v in kwargs.items()}


def _on_host(a: Any) -> bool:
    """Whether `a` is a host array (writing it to the device is an upload)."""
    return isinstance(a, (np.ndarray, list)) and not isinstance(a, ndarray)


def _wrap(a: Any) -> Any:
    """A result as CuPy gives it: an ``ndarray`` (0-d for a scalar)."""
    if isinstance(a, tuple):
        return tuple(_wrap(b) for b in a)
    if isinstance(a, (np.ndarray, np.generic)):
        return np.asarray(a).view(ndarray)
    return a


def _pending(like: Any) -> Any:
    """A new buffer for a result a capture recorded but did not compute (NaN where it can
    hold one: reading it before a replay shows)."""
    buf = np.empty_like(np.asarray(like))
    buf[...] = np.nan if buf.dtype.kind in "fc" else 0
    return buf


def _deferred(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Record ``fn(*args, **kwargs)`` on the capturing stream and return its result: the
    arrays of `kwargs`' ``out`` when given, else new buffers shaped as the result (worked
    out now, on the current values, and thrown away: the graph's replays write them)."""
    if kwargs.get("out") is not None:
        get_current_stream().record(lambda: fn(*args, **kwargs))
        return None
    shaped = fn(*args, **kwargs)
    many = isinstance(shaped, tuple)
    out = tuple(map(_pending, shaped)) if many else (_pending(shaped),)
    kwargs = {**kwargs, "out": out if many else out[0]}
    get_current_stream().record(lambda: fn(*args, **kwargs))
    return _wrap(out if many else out[0])


def _copied(like: np.ndarray, src: np.ndarray) -> Any:
    """A new buffer shaped as `like` that the capturing stream fills from `src` (a kernel
    that writes a new allocation: recorded, not run)."""
    buf = _pending(like)
    get_current_stream().record(lambda: np.copyto(buf, src, casting="unsafe"))
    return _wrap(buf)


def _floating(arrays: tuple) -> bool:
    return any(np.asarray(a).dtype.kind in "fc" for a in arrays)


class ndarray(np.ndarray):  # cupy.ndarray's name
    """A device array in host memory; see the module docstring for what a capture does."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if ufunc is np.matmul and capturing() and _floating(inputs):
            raise NotImplementedError(CUBLAS_IN_CAPTURE)
        LAUNCHES.count += 1
        out = kwargs.get("out")
        fn, args = getattr(ufunc, method), _plain(inputs)
        kwargs = _plain_kwargs(kwargs)
        result = _deferred(fn, args, kwargs) if capturing() else _wrap(fn(*args, **kwargs))
        if out is not None:  # the caller's own arrays, as NumPy returns them
            return out[0] if len(out) == 1 else out
        return result

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func is np.copyto:
            LAUNCHES.count += 1
        if not capturing():
            return _wrap(super().__array_function__(func, types, args, kwargs))
        args, kw = _plain(tuple(args)), _plain_kwargs(kwargs)
        if func in _CUBLAS and _floating(args):
            raise NotImplementedError(CUBLAS_IN_CAPTURE)
        if func is not np.copyto:
            raise NotImplementedError(f"the CuPy stand-in does not capture numpy.{func.__name__}")
        get_current_stream().record(lambda: np.copyto(*args, **kw))
        return None

    def astype(self, dtype: Any, *args: Any, **kwargs: Any) -> Any:
        LAUNCHES.count += 1
        plain = self.view(np.ndarray)
        if capturing():
            return _copied(plain.astype(dtype), plain)
        return _wrap(plain.astype(dtype, *args, **kwargs))

    def copy(self, order: str = "C") -> Any:
        return self.astype(self.dtype)

    def fill(self, value: Any) -> None:
        self[...] = value

    def __getitem__(self, key: Any) -> Any:
        got = super().__getitem__(key)
        if isinstance(got, np.generic):  # CuPy gives a 0-d array, a view
            return super().__getitem__((*(key if isinstance(key, tuple) else (key,)), ...))
        return got

    def __setitem__(self, key: Any, value: Any) -> None:
        """A fill or a copy on the device; from a host array, an upload."""
        if capturing() and _on_host(value):
            raise RuntimeError("the current stream is capturing, so H2D transfers are disallowed")
        LAUNCHES.count += not _on_host(value)
        plain, value = self.view(np.ndarray), _plain(value)
        if capturing():  # a scalar goes by value, as a fill kernel's argument
            get_current_stream().record(lambda: plain.__setitem__(key, value))
        else:
            plain[key] = value

    def get(self, stream: Any = None) -> np.ndarray:
        """A host copy (a device-to-host transfer: refused while capturing)."""
        if capturing():
            raise RuntimeError("the current stream is capturing, so D2H transfers are disallowed")
        return np.array(self.view(np.ndarray))

    def item(self, *args: Any) -> Any:
        return self.get().item(*args)

    def tolist(self) -> Any:
        return self.get().tolist()

    def __float__(self) -> float:
        return float(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __bool__(self) -> bool:
        return bool(self.get())

    def __repr__(self) -> str:
        return repr(self.view(np.ndarray))

    def __str__(self) -> str:
        return str(self.view(np.ndarray))

    def __format__(self, spec: str) -> str:
        return format(self.get()[()] if self.ndim == 0 else self.get(), spec)


def _creating(fn: Callable[..., Any]) -> Callable[..., Any]:
    """NumPy's `fn` making a device array: from host data, an upload (refused while
    capturing, as CuPy refuses it); from a shape, an allocation and a fill, recorded."""

    def make(*args: Any, **kwargs: Any) -> Any:
        if capturing() and args and (_on_host(args[0]) or isinstance(args[0], float)):
            raise RuntimeError("the current stream is capturing, so H2D transfers are disallowed")
        if capturing():
            made = fn(*_plain(args), **kwargs)
            return _copied(made, made)
        return _wrap(fn(*_plain(args), **kwargs))

    make.__name__ = fn.__name__
    return make


class CaptureBackend(HostBackend):
    """The harness's kernel backend for this module's arrays: uploads make ``ndarray``, and
    while the current stream captures, launches are recorded (their arguments copied) and
    transfers refused."""

    def to_device(self, host: np.ndarray) -> Any:
        if capturing():
            raise RuntimeError("the current stream is capturing, so H2D transfers are disallowed")
        return np.array(host, copy=True).view(ndarray)

    def get(self, a: Any) -> np.ndarray:
        if capturing():
            raise RuntimeError("the current stream is capturing, so D2H transfers are disallowed")
        return np.array(_plain(a))

    def launch_packed(
        self, fn: str, grid: int, block: int, params: int, widths: int, nparams: int, stream: int
    ) -> None:
        LAUNCHES.count += 1
        if not capturing():
            return super().launch_packed(fn, grid, block, params, widths, nparams, stream)
        sizes = np.frombuffer((ctypes.c_int64 * nparams).from_address(widths), np.int64).copy()
        addrs = np.frombuffer((ctypes.c_uint64 * nparams).from_address(params), np.uint64)
        values = [
            np.frombuffer(ctypes.string_at(int(a), int(w)), np.uint8).copy()
            for a, w in zip(addrs, sizes, strict=True)
        ]
        copied = np.array([v.ctypes.data for v in values], np.uint64)
        launch = super().launch_packed
        get_current_stream().record(
            lambda: (
                values,
                launch(fn, grid, block, copied.ctypes.data, sizes.ctypes.data, nparams, stream),
            )
        )
        return None

    def launch(self, name: str, grid: int, block: int, args: tuple, stream: Any = None) -> None:
        LAUNCHES.count += 1
        if not capturing():
            return super().launch(name, grid, block, args, stream)
        copied = tuple(np.array(a)[()] for a in args)  # by value, as cuLaunchKernel takes them
        launch = super().launch
        get_current_stream().record(lambda: launch(name, grid, block, copied, stream))
        return None


# NumPy's names this module passes through (dtypes, ufuncs, functions: an operation on
# this module's arrays comes back through ndarray's __array_ufunc__ / __array_function__)
_SAME = [
    "float16",
    "float32",
    "float64",
    "int32",
    "int64",
    "uint32",
    "bool_",
    "dtype",
    "add",
    "subtract",
    "multiply",
    "divide",
    "true_divide",
    "negative",
    "sqrt",
    "abs",
    "square",
    "exp",
    "log",
    "maximum",
    "minimum",
    "max",
    "min",
    "all",
    "any",
    "equal",
    "logical_not",
    "isfinite",
    "matmul",
    "dot",
    "mean",
    "sum",
    "copyto",
    "where",
]
# NumPy's functions that make an array, made device arrays (``_creating``)
_MAKING = [
    "asarray",
    "array",
    "zeros",
    "ones",
    "full",
    "empty",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "arange",
    "linspace",
]


def _module() -> types.ModuleType:
    mod = types.ModuleType("cupy", "lscore's tests' CuPy stand-in (tests/helpers/cuda_host)")
    for name in _SAME:
        setattr(mod, name, getattr(np, name))
    for name in _MAKING:
        setattr(mod, name, _creating(getattr(np, name)))
    mod.ndarray = ndarray  # type: ignore[attr-defined]
    mod.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        Stream=Stream, Device=Device, Graph=Graph, get_current_stream=get_current_stream
    )
    return mod


cupy = _module()
KERNELS = ArrayKernels(cupy, lambda dev: CaptureBackend(), kind=kernels.READ_NUMPY)


def adapter_module() -> types.ModuleType:
    """A module with ``lscore.adapters.cupy``'s public names, bound to this stand-in."""
    from lscore import loss_scale, managers

    bound = device.bind(cupy, KERNELS, capturing=capturing)
    mod = types.ModuleType("lscore.adapters.cupy", "the CuPy adapter on the CuPy stand-in")
    for name in ("all_finite", "unscale_", "unscale_and_norm", "unscale_and_clip_"):
        setattr(mod, name, getattr(bound, name))
    for name in ("SGD", "Adam", "LossScaleOptimizer"):
        setattr(mod, name, getattr(bound, name))
    for name in ("DynamicLossScale", "FixedLossScale", "LossScale", "get"):
        setattr(mod, name, getattr(loss_scale, name))
    for name in ("ExponentialUpdateLossScaleManager", "FixedLossScaleManager", "LossScaleManager"):
        setattr(mod, name, getattr(managers, name))
    return mod


def install(monkeypatch: Any) -> None:
    """``import cupy`` and ``from lscore.adapters import cupy`` give the stand-ins for the
    rest of the test (`monkeypatch` undoes it)."""
    import lscore.adapters

    adapter = adapter_module()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "lscore.adapters.cupy", adapter)
    monkeypatch.setattr(lscore.adapters, "cupy", adapter, raising=False)
