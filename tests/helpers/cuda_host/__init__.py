"""Host harness: lscore's CUDA kernels compiled with g++ and run on the CPU (tests only).

``build()`` compiles harness.cpp (which includes the .cu files of _ext/
verbatim) into a shared library in a temporary directory, once per test
session.  ``HostBackend`` is the backend lscore.cuda expects: NumPy arrays
stand in for device arrays and ``launch`` / ``launch_packed`` run the kernel
through the library (the packed form takes the ``void*[]`` and byte widths
lscore.cuda packs for cuLaunchKernel, and the harness checks every width
against the kernel's signature), so lscore.cuda and the CuPy adapter run
unchanged on top of it.  ``read_word`` is the one synchronisation of a call.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import importlib.resources
import os
import shutil
import subprocess
import tempfile

import numpy as np

from ..standin import HostMemory

HERE = os.path.dirname(os.path.abspath(__file__))
# the kernel sources lscore loads at run time: those of the package under test (in a wheel
# install, its lscore/_ext/; in an editable one, the checkout's _ext/)
EXT = str(importlib.resources.files("lscore._ext"))
CXXFLAGS = [
    "-std=c++17",
    "-O2",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-shared",
    "-fPIC",
]


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


@functools.cache
def build() -> ctypes.CDLL:
    """Compile the harness (fails loudly on any compiler warning) and load it."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) found")
    out = tempfile.mkdtemp(prefix="lsc_cuda_host_")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    lib = os.path.join(out, "lsch.so")
    cmd = [cxx, *CXXFLAGS, f"-I{EXT}", f"-I{HERE}", os.path.join(HERE, "harness.cpp"), "-o", lib]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or r.stderr.strip():
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr}")
    dll = ctypes.CDLL(lib)
    dll.lsch_launch.restype = ctypes.c_int
    dll.lsch_launch.argtypes = [
        ctypes.c_char_p,
        ctypes.c_uint,
        ctypes.c_uint,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_longlong),
        ctypes.c_int,
    ]
    dll.lsch_names.restype = ctypes.c_char_p
    return dll


def names() -> list[str]:
    return build().lsch_names().decode().splitlines()


class HostBackend(HostMemory):
    """lscore.cuda backend on the CPU: NumPy for device memory, the harness for launches."""

    def __init__(self):
        super().__init__(0)
        self.lib = build()
        self.launches: list[tuple[str, int, int]] = []

    def read_word(self, a: np.ndarray) -> int:
        return int(self.get(a)[0])

    def launch_packed(
        self, fn: str, grid: int, block: int, params: int, widths: int, nparams: int, stream: int
    ) -> None:
        """Run kernel `fn` with its parameters packed as cuLaunchKernel takes them."""
        rc = self.lib.lsch_launch(
            fn.encode(),
            grid,
            block,
            ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p)),
            ctypes.cast(widths, ctypes.POINTER(ctypes.c_longlong)),
            nparams,
        )
        self._check(
            fn,
            rc,
            nparams,
            lambda i: f"{ctypes.c_longlong.from_address(widths + 8 * i).value} bytes",
        )
        self.launches.append((fn, grid, block))

    def _check(self, name, rc, n, what):
        if rc == -1:
            raise KeyError(f"the harness has no kernel {name!r}")
        if rc == -2:
            raise TypeError(f"{name}: wrong number of arguments ({n})")
        if rc < -2:
            raise TypeError(f"{name}: argument {-3 - rc} has the wrong size ({what(-3 - rc)})")

    def launch(self, name: str, grid: int, block: int, args: tuple, stream=None) -> None:
        for a in args:
            if not isinstance(a, np.generic):
                # CuPy packs a kernel argument by its NumPy type; a bare int has none
                raise TypeError(f"kernel argument {a!r} of {name} is not a NumPy scalar")
        vals = [np.array(a) for a in args]
        params = (ctypes.c_void_p * len(vals))(*[v.ctypes.data for v in vals])
        sizes = (ctypes.c_longlong * len(vals))(*[v.itemsize for v in vals])
        rc = self.lib.lsch_launch(name.encode(), grid, block, params, sizes, len(vals))
        self._check(name, rc, len(vals), lambda i: f"{vals[i].itemsize} bytes, {vals[i].dtype}")
        self.launches.append((name, grid, block))


# the word a NaN narrows to on the GPU (cvt.rn.f16.f32 / cvt.rn.bf16.f32: the canonical NaN,
# sign dropped); the CPU core's C conversion keeps the sign and gives 0x7E00 / 0x7FC0
DEVICE_NAN16 = 0x7FFF


def device_words(a: np.ndarray, written: bool = True) -> np.ndarray:
    """The words of `a` (a CPU result) as the kernels leave them: where the kernels wrote a
    float16/bfloat16 NaN (`written`), the conversion instruction's canonical NaN."""
    words = np.ascontiguousarray(a).view(f"u{a.itemsize}").copy()
    if written and a.dtype.name in ("float16", "bfloat16"):
        words[np.isnan(a.astype(np.float32))] = DEVICE_NAN16
    return words
