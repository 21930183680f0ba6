"""`lscore bench --suite gpu-static`: the kernels' machine code for sm_90, read without a GPU.

Each streaming kernel is compiled for sm_90 with NVRTC (the options the
package uses) into a cubin, disassembled with ``cuobjdump -sass`` (both from
pip: ``nvidia-cuda-nvrtc-cu12``, ``nvidia-cuda-cuobjdump``), and its hottest
loop is measured: the loop that moves the widest global accesses, most bytes
first (the whole body where there is no loop).  A loop is the code between a
backward branch and its target; its instructions are counted as written
(NOPs left out), its bytes as the widths of its global loads and stores.

The figure that matters is instructions per byte: an H100 issues about 33e12
thread-instructions per second against 3.35e12 bytes per second of HBM3,
about 10 per byte before a kernel stops being memory-bound.  The targets
leave room for latency stalls: at most 2.5 per byte for the scan kernels and
4 for the fused optimizers (whose exact division and square root are math
the others do not have), with 16-byte global accesses.  Instruction counts
are deterministic for a given NVRTC, so a test holds them.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from lscore import cuda, kernels
from lscore.cuda.sources import OPT_GRADS, OPT_METAS, TRAITS, optim_kernel_name

__all__ = [
    "ARCH",
    "HOT_LOOPS",
    "LIMITS",
    "KernelFigures",
    "compile_cubin",
    "cuobjdump",
    "figures",
    "format_static",
    "hottest_loop",
    "run_static",
]

ARCH = "90"
# (file, name expression, row label, dtype label) of every streaming kernel
_DTYPES = {"lsc_f16": "float16", "lsc_bf16": "bfloat16", "lsc_f32": "float32", "lsc_f64": "float64"}
_SCAN_OPS = {
    "unscale": "unscale",
    "unscale_norm": "unscale + norm",
    "clip": "clip",
    "all_finite": "all_finite",
}
_OPT = kernels.OPTIM_FLAGS
# the fused optimizers' rows: (kind, variant flags, row label)
_OPTIM = (
    ("sgd", _OPT["SLOT"], "fused SGD"),
    ("sgd", 0, "fused SGD, no momentum"),
    ("sgd", _OPT["SLOT"] | _OPT["NESTEROV"], "fused SGD, nesterov"),
    ("adam", 0, "fused Adam"),
    ("adam", _OPT["AMSGRAD"], "fused Adam, amsgrad"),
    ("check", 0, "fused check"),
)
# the kernels whose hottest loop is read, built as an sm_90 device on CUDA >= 12.1 runs
# them (32 KB kernel arguments): (file, name expression, label, dtype)
HOT_LOOPS = tuple(
    ("scan.cu", f"lsc_mt_{op}<{t}, lsc_meta_32k>", label, dt)
    for op, label in _SCAN_OPS.items()
    for t, dt in _DTYPES.items()
) + tuple(
    (
        "optim.cu",
        optim_kernel_name(kind, c, OPT_METAS["adam" if kind == "check" else kind][1], v),
        label,
        _DTYPES[TRAITS[c]],
    )
    for kind, v, label in _OPTIM
    for c in OPT_GRADS
)
# most instructions per byte allowed, by row label; every row needs 16-byte accesses
LIMITS = {label: 4.0 for _, _, label in _OPTIM}
DEFAULT_LIMIT = 2.5
WIDEST = 16

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"^(?:@!?U?P[T0-9]+\s+)?BRA(?:\.\w+)*\s+(?:\w+\s+)?0x([0-9a-f]+)")
_WIDTH = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}


@dataclass
class KernelFigures:
    """The hottest loop of one kernel: instructions, bytes moved and widest access per
    iteration (per thread), and whether it is a loop or the whole body."""

    label: str
    dtype: str
    instructions: int
    bytes: int
    widest: int
    loop: bool

    @property
    def per_byte(self) -> float:
        return self.instructions / self.bytes if self.bytes else float("inf")

    @property
    def limit(self) -> float:
        return LIMITS.get(self.label, DEFAULT_LIMIT)

    @property
    def ok(self) -> bool:
        return self.per_byte <= self.limit and self.widest >= WIDEST


def _nvrtc() -> ctypes.CDLL:
    """NVRTC from the nvidia-cuda-nvrtc wheel (or the system's)."""
    paths = []
    try:
        import nvidia.cuda_nvrtc as wheel  # type: ignore[import-not-found]

        for root in wheel.__path__:
            paths += sorted(glob.glob(os.path.join(root, "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    paths += ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"]
    for p in paths:
        try:
            return ctypes.CDLL(p)
        except OSError:
            continue
    raise RuntimeError(
        'NVRTC not found: pip install ".[test]" in the checkout of lscore (nvidia-cuda-nvrtc-cu12)'
    )


def compile_cubin(name: str, arch: str = ARCH) -> tuple[bytes, dict[str, str]]:
    """The sm_`arch` cubin of ``_ext/<name>`` (the package's NVRTC options) and the lowered
    names of its kernels.

    NVRTC is called directly: CuPy's binding asks the driver for a device and drops the
    cubin's last byte.
    """
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    src = cuda.source(name).encode()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        exprs = cuda.KERNELS[name]
        for e in exprs:
            lib.nvrtcAddNameExpression(prog, e.encode())
        opts = [o.encode() for o in (*cuda.NVRTC_OPTIONS, f"-arch=sm_{arch}")]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        if rc:
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC could not compile {name}:\n{(log.value or b'').decode()}")
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, cubin)
        lowered = {}
        for e in exprs:
            out = ctypes.c_char_p()
            lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(out))
            lowered[e] = (out.value or b"").decode()
        return cubin.raw, lowered
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def cuobjdump() -> str:
    """The path of cuobjdump: from the nvidia-cuda-cuobjdump wheel, else on PATH."""
    base = os.path.dirname(os.path.dirname(os.path.abspath(os.__file__)))
    roots = [p for p in sys.path if p.endswith("site-packages")] + [base]
    for root in roots:
        for hit in sorted(glob.glob(os.path.join(root, "nvidia", "*", "bin", "cuobjdump"))):
            return hit
    found = shutil.which("cuobjdump")
    if found is None:
        raise RuntimeError(
            'cuobjdump not found: pip install ".[test]" in the checkout of lscore '
            "(nvidia-cuda-cuobjdump)"
        )
    return found


def disassemble(cubin: bytes) -> dict[str, list[tuple[int, str]]]:
    """{lowered kernel name: [(address, instruction)]} of a cubin, NOPs left out."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        r = subprocess.run([cuobjdump(), "-sass", path], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"cuobjdump failed: {r.stderr}")
    out: dict[str, list[tuple[int, str]]] = {}
    body: list[tuple[int, str]] = []
    for line in r.stdout.splitlines():
        s = line.strip()
        if s.startswith("Function : "):
            body = out.setdefault(s.split(" : ", 1)[1].strip(), [])
            continue
        m = _LINE.search(line)
        if m and not m.group(2).startswith("NOP"):
            body.append((int(m.group(1), 16), m.group(2)))
    return out


def _access(ins: str) -> int:
    """Bytes of a global (or generic: an address read from memory) load or store
    instruction; 0 for anything else."""
    op = re.sub(r"^@!?U?P[T0-9]+\s+", "", ins).split()[0]
    parts = op.split(".")
    if parts[0] not in ("LDG", "STG", "LD", "ST"):
        return 0
    for p in parts[1:]:
        if p in _WIDTH:
            return _WIDTH[p]
    return 4


def hottest_loop(body: list[tuple[int, str]]) -> tuple[int, int, int, bool]:
    """(instructions, bytes, widest access, is a loop) of the hottest loop of `body`: of the
    innermost loops (no backward branch inside) that access global memory, the one with
    the widest accesses, then the most bytes, then the most instructions."""
    spans = []
    for i, (addr, ins) in enumerate(body):
        m = _BRANCH.match(ins)
        if m and int(m.group(1), 16) < addr:
            spans.append((int(m.group(1), 16), addr, i))
    loops = []
    for lo, hi, i in spans:
        if any(lo <= a and b < hi for a, b, _ in spans if (a, b) != (lo, hi)):
            continue  # an outer loop: its inner one is hotter
        span = [x for a, x in body[: i + 1] if a >= lo]
        sizes = [_access(x) for x in span]
        if any(sizes):
            loops.append((max(sizes), sum(sizes), len(span)))
    if loops:
        widest, nbytes, n = max(loops)
        return n, nbytes, widest, True
    sizes = [_access(x) for _, x in body]
    return len(body), sum(sizes), max(sizes, default=0), False


def figures(arch: str = ARCH) -> list[KernelFigures]:
    """Every streaming kernel's figures (compiles and disassembles each .cu file once)."""
    sass: dict[str, tuple[dict, dict]] = {}
    out = []
    for name, expr, label, dtype in HOT_LOOPS:
        if name not in sass:
            cubin, lowered = compile_cubin(name, arch)
            sass[name] = (disassemble(cubin), lowered)
        code, lowered = sass[name]
        n, nbytes, widest, loop = hottest_loop(code[lowered[expr]])
        out.append(KernelFigures(label, dtype, n, nbytes, widest, loop))
    return out


def run_static() -> dict:
    """The gpu-static result: one row and one target per kernel and dtype."""
    rows, found = [], []
    for k in figures():
        name = f"{k.label} {k.dtype}"
        rows.append(
            {
                "group": "gpu-static",
                "method": name,
                "instr_per_byte": round(k.per_byte, 3),
                "widest_access_bytes": k.widest,
                "instructions": k.instructions,
                "bytes": k.bytes,
                "loop": k.loop,
            }
        )
        found.append(
            {
                "target": f"{name}: sm_{ARCH} SASS instructions per byte, 16-byte accesses",
                "unit": "instr_per_byte",
                "required": k.limit,
                "measured": round(k.per_byte, 3),
                "widest_access_bytes": k.widest,
                "met": k.ok,
            }
        )
    return {"suite": "gpu-static", "arch": f"sm_{ARCH}", "rows": rows, "targets": found}


def format_static(result: dict) -> str:
    """The table of instructions per byte and widest access, per kernel and dtype."""
    lines = [
        f"| kernel (sm_{ARCH} SASS) | instr/B | widest access | instr/iteration "
        "| bytes/iteration | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, t in zip(result["rows"], result["targets"], strict=True):
        where = "" if r["loop"] else " (whole body: no loop)"
        lines.append(
            f"| {r['method']}{where} | {r['instr_per_byte']:.2f} | {r['widest_access_bytes']} B "
            f"| {r['instructions']} | {r['bytes']} | <= {t['required']} | "
            f"{'yes' if t['met'] else 'NO'} |"
        )
    return "\n".join(lines)
