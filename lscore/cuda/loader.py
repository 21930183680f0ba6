"""Loader of lscore's CUDA kernels: the ``.cu`` text, NVRTC, modules per device, CuPy launches.

Design: the kernels are the ``.cu`` files shipped in ``lscore._ext`` (package
data); this module is the only place that knows their file and kernel names.
The code comes from CuPy's NVRTC (``compile_kernels``, the same function the
CI tests run without a GPU) with exact IEEE float32 options, is kept in a
disk cache of the user's own (``kernel_image``: one compile per machine, not
per process, device and rank) and is loaded once per device.  CuPy is
imported only when a kernel is first compiled or launched.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import io
import json
import os
import re
import struct
import tempfile
import threading
import warnings
from typing import Any

import numpy as np

from lscore import kernels
from lscore.cuda.fp8 import FP8_KERNELS
from lscore.dtypes import Code

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_ENV",
    "KERNELS",
    "NVRTC_OPTIONS",
    "OPS",
    "OPT_GRADS",
    "OPT_METAS",
    "OPT_VARIANTS",
    "TRAITS",
    "UPDATE_KERNEL",
    "CupyBackend",
    "compile_kernels",
    "kernel_cache_dir",
    "kernel_image",
    "kernel_name",
    "module",
    "optim_kernel_name",
    "source",
]

#: dtype code -> traits struct of _ext/scan.cu
TRAITS = {Code.F16: "lsc_f16", Code.BF16: "lsc_bf16", Code.F32: "lsc_f32", Code.F64: "lsc_f64"}
#: the scan kernels of _ext/scan.cu, one per dtype each
OPS = ("unscale", "all_finite")
#: the device-side state update of _ext/update.cu
UPDATE_KERNEL = "lsc_device_update"
# NVRTC options of every compile.  Exact IEEE float32 (no flush of
# subnormals to zero, no multiply-add contraction, correctly rounded
# division and square root) so the device rounds like the CPU core.  This is
# why the package compiles with compile_using_nvrtc, not cupy.RawModule:
# RawModule appends -ftz=true after the user's options on every compile, and
# NVRTC keeps the last one.  compile_using_nvrtc adds only the architecture,
# --device-as-default-execution-space (and --pch under CUPY_NVRTC_USE_PCH).
#: the NVRTC options of every kernel compile: exact IEEE float32
NVRTC_OPTIONS = (
    "--std=c++17",
    "--ftz=false",
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
)


# the scan kernels' argument structs (_ext/scan.cu's lsc_meta): 4 KB and 32 KB of parameters
METAS = ("lsc_meta_4k", "lsc_meta_32k")


def kernel_name(op: str, code: int, meta: str = METAS[0]) -> str:
    """The name expression of the scan kernel `op` for dtype code `code` and argument `meta`."""
    return f"lsc_mt_{op}<{TRAITS[Code(code)]}, {meta}>"


#: the fused optimizers' argument structs (_ext/optim.cu's lsc_opt_meta), 4 KB and 32 KB
OPT_METAS = {kind: tuple(f"lsc_{kind}_meta_{k}" for k in ("4k", "32k")) for kind in ("sgd", "adam")}
_OPT = kernels.OPTIM_FLAGS
#: each fused optimizer's kernel variants: the flag bits that pick one (optim.cu's V)
OPT_VARIANTS = {
    "sgd": (0, _OPT["SLOT"], _OPT["SLOT"] | _OPT["NESTEROV"]),
    "adam": (0, _OPT["AMSGRAD"]),
}
#: the gradient dtypes the fused optimizers read (float32 master weights and slots)
OPT_GRADS = (Code.F16, Code.BF16, Code.F32)


def optim_kernel_name(kind: str, code: int, meta: str, flags: int = 0) -> str:
    """The name expression of fused `kind` ("sgd", "adam"; "check" for the check over
    either's argument `meta`) for gradient dtype `code`, its variant taken from `flags`."""
    if kind == "check":
        return f"lsc_mt_opt_check<{TRAITS[Code(code)]}, {meta}>"
    variant = flags & OPT_VARIANTS[kind][-1]
    if kind == "sgd" and not variant & _OPT["SLOT"]:
        variant = 0  # nesterov needs the momentum slot
    return f"lsc_mt_{kind}<{TRAITS[Code(code)]}, {meta}, {variant}>"


#: .cu file -> the kernel names (NVRTC name expressions) the package launches from it
KERNELS = {
    # the one-pass norm (lscore.cuda.launch.MultiTensor.launch_norm) beside the scan
    "scan.cu": tuple(
        kernel_name(op, c, m)
        for op in (*OPS, "unscale_norm", "clip")
        for c in TRAITS
        for m in METAS
    ),
    "update.cu": (UPDATE_KERNEL,),
    # fused optimizers: float32 master weights, float16/bfloat16/float32 gradients, each
    # variant and argument size, and the check over either argument
    "optim.cu": tuple(
        optim_kernel_name(kind, c, m, v)
        for kind in ("sgd", "adam")
        for m in OPT_METAS[kind]
        for c in OPT_GRADS
        for v in OPT_VARIANTS[kind]
    )
    + tuple(
        optim_kernel_name("check", c, m)
        for kind in ("sgd", "adam")
        for m in OPT_METAS[kind]
        for c in OPT_GRADS
    ),
    # the float8 quantize kernels (lscore.cuda.fp8)
    "fp8.cu": FP8_KERNELS,
}
_FILE_OF = {k: f for f, names in KERNELS.items() for k in names}
_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.]+)"[ \t]*$', re.M)


def _read(name: str) -> str:
    return importlib.resources.files("lscore._ext").joinpath(name).read_text(encoding="utf-8")


def source(name: str, *, inline_includes: bool = True) -> str:
    """The text of ``_ext/<name>``; its ``#include "x.h"`` lines replaced by the headers.

    Inlining (of the headers' own includes too, each header once, as their
    include guards would) makes the text self-contained: no include path is
    needed, and the text alone identifies the build.
    """
    return _inlined(name, set()) if inline_includes else _read(name)


def _inlined(name: str, seen: set) -> str:
    def header(m: Any) -> Any:
        if m.group(1) in seen:
            return ""
        seen.add(m.group(1))
        return _inlined(m.group(1), seen)

    return _INCLUDE.sub(header, _read(name))


def compile_kernels(name: str, arch: str | None = None, *, include_dir: str | None = None) -> Any:
    """The compiled image of ``_ext/<name>``, its lowered kernel names and NVRTC's log.

    Compiles through CuPy's NVRTC (``cupy.cuda.compiler.compile_using_nvrtc``),
    so CuPy and NVRTC are all the GPU path needs.  `arch` is a compute
    capability ("80"); None takes the current device's, capped at the newest
    this NVRTC knows.  CuPy then compiles a cubin for that architecture (or
    PTX, under ``CUPY_COMPILE_WITH_PTX``): a cubin also runs on an older
    driver of the same CUDA major, where PTX from a newer NVRTC would not load.
    CuPy asks the driver for the current device even when `arch` is given,
    so this needs a GPU; the CI tests stand in for that one query.

    With `include_dir` the file's own text is compiled against that include
    path; otherwise the self-contained ``source(name)``.  Returns
    ``(image bytes, {name expression: lowered name}, log)``; raises
    RuntimeError with NVRTC's log when the compile fails.
    """
    from cupy.cuda import compiler

    text = source(name, inline_includes=include_dir is None)
    options = (
        NVRTC_OPTIONS if include_dir is None else (*NVRTC_OPTIONS, f"--include-path={include_dir}")
    )
    log = io.StringIO()
    try:
        image, lowered = compiler.compile_using_nvrtc(
            text,
            options=options,
            arch=arch,
            filename=name,
            name_expressions=KERNELS[name],
            log_stream=log,
        )
    except compiler.CompileException as e:
        raise RuntimeError(
            f"NVRTC could not compile {name} for {arch or 'this device'}:\n{e}"
        ) from e
    return image, lowered, log.getvalue().rstrip("\x00 \n")


# -- the disk cache of compiled kernels ---------------------------------------------------------
#: the environment variable naming the folder of the kernel cache
CACHE_DIR_ENV = "LSCORE_KERNEL_CACHE_DIR"
#: the environment variable that turns the kernel cache off (0 or off) or on (1 or on)
CACHE_ENV = "LSCORE_KERNEL_CACHE"
_FORMAT = 1
# an entry: magic, payload length (uint64), SHA-256 of the payload, then the payload: the
# lowered names as JSON (its length a uint32 first) and the image.  A file whose length or
# digest does not match (truncated by a crash, damaged) is compiled again, never loaded.
_MAGIC = b"lsckrn1\n"
_HEAD = struct.Struct("<8sQ32s")
_NAMES = struct.Struct("<I")
_OFF = ("0", "off", "false", "no")
_ON = ("", "1", "on", "true", "yes")


def kernel_cache_dir() -> str | None:
    """The directory of the compiled-kernel cache, or None when ``LSCORE_KERNEL_CACHE=0``.

    ``LSCORE_KERNEL_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/lscore/kernels``, else
    ``~/.cache/lscore/kernels``.  ValueError, naming the variable, for a value of
    ``LSCORE_KERNEL_CACHE`` other than 0/1 (off/on).
    """
    switch = os.environ.get(CACHE_ENV, "")
    if switch.strip().lower() in _OFF:
        return None
    if switch.strip().lower() not in _ON:
        raise ValueError(f"{CACHE_ENV} must be 0 or 1 (off or on), got {switch!r}")
    where = os.environ.get(CACHE_DIR_ENV)
    if where:
        return os.path.abspath(os.path.expanduser(where))
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG rule: a relative path is ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lscore", "kernels")


def _target(arch: str | None) -> tuple[str, str, str]:
    """(architecture, NVRTC's -arch option, "cubin" or "ptx"): what CuPy compiles for `arch`.

    CuPy makes this choice (the device's capability capped at the newest this NVRTC
    knows; PTX under ``CUPY_COMPILE_WITH_PTX``) in these two functions; the cache key
    takes their answer, so a cached image is the one ``compile_kernels`` would give.
    """
    from cupy.cuda import compiler

    if arch is None:
        arch = compiler._get_arch()
    option, kind = compiler._get_arch_for_options_for_nvrtc(arch)
    return str(arch), option, kind


def _cache_key(name: str, text: str, target: tuple[str, str, str]) -> str:
    """SHA-256 of everything the image depends on: source text, options, target, NVRTC."""
    import cupy
    from cupy.cuda import compiler

    material = {
        "format": _FORMAT,
        "file": name,
        "source": text,
        "options": list(NVRTC_OPTIONS),
        "names": list(KERNELS[name]),
        "target": list(target),
        "nvrtc": list(compiler._get_nvrtc_version()),
        "cupy": cupy.__version__,  # the options compile_using_nvrtc adds are CuPy's
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _read_entry(path: str) -> tuple[bytes, dict] | None:
    """(image, lowered names) of the entry at `path`, or None: missing, short or damaged."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < _HEAD.size + _NAMES.size:
        return None
    magic, size, digest = _HEAD.unpack_from(data)
    payload = data[_HEAD.size :]
    if magic != _MAGIC or len(payload) != size or hashlib.sha256(payload).digest() != digest:
        return None
    (n,) = _NAMES.unpack_from(payload)
    try:
        lowered = json.loads(payload[_NAMES.size : _NAMES.size + n])
    except ValueError:
        return None
    if not isinstance(lowered, dict):
        return None
    return payload[_NAMES.size + n :], lowered


def _private_dirs(path: str) -> None:
    """Create `path` and its missing parents, each open to the user alone (0o700)."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue  # another process made it first
        os.chmod(d, 0o700)  # whatever the umask


def _write_entry(path: str, image: bytes, lowered: dict) -> None:
    """Write an entry atomically: a private temporary file in the same directory, then
    ``os.replace``, so a reader (another rank starting at the same time) sees the whole
    entry or none."""
    names = json.dumps(lowered, sort_keys=True).encode()
    payload = _NAMES.pack(len(names)) + names + image
    data = _HEAD.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload
    directory = os.path.dirname(path)
    _private_dirs(directory)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")  # mode 0o600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def kernel_image(
    name: str, arch: str | None = None, *, refresh: bool = False
) -> tuple[bytes, dict, bool]:
    """The image of ``_ext/<name>`` and its lowered names, compiled once per machine:
    ``(image, {name expression: lowered name}, whether it came from the cache)``.

    The cache (``kernel_cache_dir()``) holds one file per source text, NVRTC options,
    architecture (`arch`; None: the current device's, as ``compile_kernels``), NVRTC and
    CuPy version, so a second process, device or rank compiles nothing.  A missing,
    truncated or damaged entry (and any entry, with `refresh`) is compiled by
    ``compile_kernels`` and written.  A cache that cannot be written warns and compiles.
    """
    text = source(name)
    target = _target(arch)
    directory = kernel_cache_dir()
    path = None
    if directory is not None:
        path = os.path.join(directory, f"{name}-{_cache_key(name, text, target)}")
        hit = None if refresh else _read_entry(path)
        if hit is not None:
            return hit[0], hit[1], True
    image, lowered, _ = compile_kernels(name, target[0])
    if path is not None:
        try:
            _write_entry(path, image, dict(lowered))
        except OSError as e:
            warnings.warn(
                f"lscore could not write its kernel cache ({e}); the kernels will be "
                f"compiled again by the next process: set {CACHE_DIR_ENV} to a writable "
                f"directory, or {CACHE_ENV}=0",
                RuntimeWarning,
                stacklevel=2,
            )
    return image, dict(lowered), False


_DEVICE_TO_HOST = 2  # cudaMemcpyDeviceToHost
_modules: dict = {}
_modules_lock = threading.Lock()


def device_missing() -> str | None:
    """Why lscore's kernels cannot run on a GPU here (no CuPy, or no device it can see), or
    None when they can."""
    try:
        import cupy
    except ImportError:
        return (
            "no CUDA device: CuPy is not installed "
            "(pip install 'lscore[cuda12]' or 'lscore[cuda13]')"
        )
    try:
        if not cupy.cuda.is_available():
            return "no CUDA device (CuPy sees none)"
    except Exception as e:  # a broken driver install reads as no device
        return f"no CUDA device ({e})"
    return None


def module(name: str, device: int) -> Any:
    """(cupy Module, lowered names) of ``_ext/<name>`` on `device`, loaded once per process.

    The image comes from ``kernel_image``: the disk cache, or NVRTC on a miss.  A cached
    image the driver refuses (a damaged file, PTX newer than the driver) is compiled again
    and its entry replaced; a freshly compiled one that fails raises.
    """
    key = (name, int(device))
    with _modules_lock:
        hit = _modules.get(key)
        if hit is None:
            import cupy
            from cupy.cuda import function

            with cupy.cuda.Device(device):
                image, lowered, cached = kernel_image(name)
                mod = function.Module()
                try:
                    mod.load(image)
                except Exception:
                    if not cached:
                        raise
                    image, lowered, _ = kernel_image(name, refresh=True)
                    mod = function.Module()
                    mod.load(image)
            hit = _modules[key] = (mod, lowered)
    return hit


class CupyBackend:
    """Launches on one CUDA device through CuPy, on CuPy's current stream of that device.

    The packed launch goes straight to ``cuLaunchKernel`` (CuPy's
    ``driver.launchKernel``) with the ``void*[]`` the launcher packed once,
    so a launch costs no argument marshalling; ``read_word`` copies one
    word into pinned host memory and synchronises that stream once.
    """

    def __init__(self, device: int | None = None):
        import cupy

        self.xp = cupy
        self._driver = cupy.cuda.driver
        self._runtime = cupy.cuda.runtime
        self.device = cupy.cuda.Device(device).id if device is not None else cupy.cuda.Device().id
        # 32 KB of kernel parameters (the scan kernels' lsc_meta_32k): a CUDA 12.1 driver and
        # sm_70 or newer, as torch's multi_tensor_apply requires
        cc = int(cupy.cuda.Device(self.device).compute_capability)
        self.large_kernel_params = self._runtime.driverGetVersion() >= 12010 and cc >= 70
        self._functions: list = []  # the Function objects behind the handles
        with cupy.cuda.Device(self.device):
            self._pinned = cupy.cuda.alloc_pinned_memory(8)
        self._word = np.ndarray((1,), np.uint32, buffer=self._pinned)

    def ptr(self, a: Any) -> int:
        return a.data.ptr

    def get(self, a: Any) -> np.ndarray:
        with self.xp.cuda.Device(self.device):
            return a.get()

    def to_device(self, host: np.ndarray) -> Any:
        """A device copy of `host`, complete on return (kernels on any stream may read it)."""
        with self.xp.cuda.Device(self.device):
            a = self.xp.asarray(host)
            self.xp.cuda.get_current_stream().synchronize()
            return a

    def function(self, name: str) -> int:
        """The CUfunction handle of kernel `name` on this device (the module loaded once)."""
        mod, lowered = module(_FILE_OF[name], self.device)
        fn = mod.get_function(lowered[name])
        self._functions.append(fn)
        return fn.ptr

    def enter(self) -> int:
        """Make this device current (for the launches); returns the device to restore."""
        prev = self._runtime.getDevice()
        self._runtime.setDevice(self.device)  # also makes its primary context current
        return prev

    def leave(self, prev: int) -> None:
        if prev != self.device:
            self._runtime.setDevice(prev)

    def stream(self) -> int:
        """CuPy's current stream of this device (what the user's own kernels are ordered on)."""
        return self.xp.cuda.get_current_stream(self.device).ptr

    def launch_packed(
        self, fn: int, grid: int, block: int, params: int, widths: int, nparams: int, stream: int
    ) -> None:
        self._driver.launchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, 0)

    def read_word(self, a: Any) -> int:
        """The first uint32 of device array `a`, after this device's current stream (one sync)."""
        prev = self.enter()
        try:
            s = self.stream()
            self._runtime.memcpyAsync(self._word.ctypes.data, a.data.ptr, 4, _DEVICE_TO_HOST, s)
            self._runtime.streamSynchronize(s)
        finally:
            self.leave(prev)
        return int(self._word[0])

    def launch(self, name: str, grid: int, block: int, args: tuple, stream: Any = None) -> None:
        """Launch kernel `name` with NumPy-scalar `args` on `stream` (None: CuPy's current)."""
        mod, lowered = module(_FILE_OF[name], self.device)
        fn = mod.get_function(lowered[name])
        with self.xp.cuda.Device(self.device):
            if stream is None:
                fn((grid,), (block,), args)
            else:
                fn(
                    (grid,),
                    (block,),
                    args,
                    stream=self.xp.cuda.ExternalStream(int(stream), self.device),
                )
