"""lscore's CUDA sources: the ``.cu`` files shipped in ``lscore._ext``, their kernel names,
and the self-contained text NVRTC compiles.

The only place that knows the files' and kernels' names: the launchers ask here for
a kernel's name expression, the compiler for a file's text and names.
"""

from __future__ import annotations

import importlib.resources
import re
from typing import Any

from lscore import kernels
from lscore.dtypes import Code

__all__ = [
    "BW_KERNELS",
    "FILE_OF",
    "FP8_KERNELS",
    "KERNELS",
    "METAS",
    "MX_KERNELS",
    "NV4_KERNELS",
    "OPS",
    "OPT_GRADS",
    "OPT_METAS",
    "OPT_VARIANTS",
    "TRAITS",
    "UPDATE_KERNEL",
    "amax_name",
    "bw_name",
    "cast_name",
    "dequant_name",
    "kernel_name",
    "mx_dequant_name",
    "mx_name",
    "nv4_name",
    "optim_kernel_name",
    "source",
]

#: dtype code -> traits struct of _ext/scan.cu
TRAITS = {Code.F16: "lsc_f16", Code.BF16: "lsc_bf16", Code.F32: "lsc_f32", Code.F64: "lsc_f64"}
#: the scan kernels of _ext/scan.cu, one per dtype each
OPS = ("unscale", "all_finite")
#: the device-side state update of _ext/update.cu
UPDATE_KERNEL = "lsc_device_update"


#: the scan kernels' argument structs (_ext/scan.cu's lsc_meta): 4 KB and 32 KB of parameters
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


_FP8_INPUTS = (Code.F16, Code.BF16, Code.F32)
_FP8_FORMATS = (Code.E4M3FN, Code.E5M2)


def amax_name(code: int) -> str:
    """The amax kernel of an input dtype code."""
    return f"lsc_fp8_amax2d<{int(code)}>"


def cast_name(code: int, fmt: int, hw: int = 1) -> str:
    """The cast kernel of an input dtype code and float8 format code (hw: the instruction)."""
    return f"lsc_fp8_cast2d<{int(code)}, {int(fmt)}, {hw}>"


def dequant_name(code: int, fmt: int) -> str:
    """The dequantize kernel of an output dtype code and float8 format code."""
    return f"lsc_fp8_dequant2d<{int(code)}, {int(fmt)}>"


#: the kernel names (NVRTC name expressions) of fp8.cu that lscore.cuda.fp8 launches
FP8_KERNELS = (
    tuple(amax_name(c) for c in _FP8_INPUTS)
    + tuple(cast_name(c, f, hw) for c in _FP8_INPUTS for f in _FP8_FORMATS for hw in (0, 1))
    + tuple(dequant_name(c, f) for c in _FP8_INPUTS for f in _FP8_FORMATS)
)


def mx_name(code: int, cols: bool, hw: int = 1) -> str:
    """The block-scaled quantize kernel of an input dtype code, blocked along the rows or the
    columns (hw: the conversion instructions)."""
    return f"lsc_mx_{'cols' if cols else 'rows'}<{int(code)}, {hw}>"


def mx_dequant_name(code: int) -> str:
    """The block-scaled dequantize kernel of an output dtype code."""
    return f"lsc_mx_dequant<{int(code)}>"


#: the kernel names of mx.cu that lscore.cuda.mx launches
MX_KERNELS = tuple(
    mx_name(c, cols, hw) for c in _FP8_INPUTS for cols in (False, True) for hw in (0, 1)
) + tuple(mx_dequant_name(c) for c in _FP8_INPUTS)


def bw_name(kind: str, code: int) -> str:
    """A kernel of blockwise.cu: `kind` "rows", "cols", "tiles" (quantize, input dtype code)
    or "dequant" (output dtype code)."""
    return f"lsc_bw_{kind}<{int(code)}>"


#: the kernel names of blockwise.cu that lscore.cuda.blockwise launches
BW_KERNELS = tuple(
    bw_name(kind, c) for kind in ("rows", "cols", "tiles", "dequant") for c in _FP8_INPUTS
)


def nv4_name(kind: str, code: int, hw: int = 1) -> str:
    """A kernel of TE's NVFP4 recipe (nvfp4.cu): kind rows, cols or tiles (quantize; hw: the
    conversion instruction) or dequant, of an input / output dtype code."""
    if kind == "dequant":
        return f"lsc_nv4_dequant<{int(code)}>"
    return f"lsc_nv4_{kind}<{int(code)}, {hw}>"


#: the kernel names of nvfp4.cu that lscore.cuda.nvfp4 launches
NV4_KERNELS = (
    tuple(
        nv4_name(k, c, hw) for k in ("rows", "cols", "tiles") for c in _FP8_INPUTS for hw in (0, 1)
    )
    + tuple(nv4_name("dequant", c) for c in _FP8_INPUTS)
    + ("lsc_nv4_rht",)
)


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
    # the float8 amax, cast and dequantize kernels (lscore.cuda.fp8)
    "fp8.cu": FP8_KERNELS,
    # the MX and NVFP4 block quantize and dequantize kernels (lscore.cuda.mx)
    "mx.cu": MX_KERNELS,
    # blockwise FP8 (float32 scales) and square weight tiles (lscore.cuda.blockwise)
    "blockwise.cu": BW_KERNELS,
    # TE v2.18's NVFP4 recipe: quantize, the Hadamard transform's amax, decode
    # (lscore.cuda.nvfp4)
    "nvfp4.cu": NV4_KERNELS,
}
#: kernel name expression -> the .cu file that defines it
FILE_OF = {k: f for f, names in KERNELS.items() for k in names}
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
