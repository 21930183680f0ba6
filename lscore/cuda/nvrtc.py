"""NVRTC: lscore's kernels compiled through CuPy's NVRTC with exact IEEE float32 options."""

from __future__ import annotations

import io
from typing import Any

from lscore.cuda import sources

__all__ = ["NVRTC_OPTIONS", "compile_kernels"]

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

    text = sources.source(name, inline_includes=include_dir is None)
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
            name_expressions=sources.KERNELS[name],
            log_stream=log,
        )
    except compiler.CompileException as e:
        raise RuntimeError(
            f"NVRTC could not compile {name} for {arch or 'this device'}:\n{e}"
        ) from e
    return image, lowered, log.getvalue().rstrip("\x00 \n")
