"""Every CUDA kernel compiles with NVRTC (from pip, no GPU, no driver) without a warning.

cuda.bindings' nvrtc is used directly: cupy.cuda.compiler asks the driver
for the device's architecture and fails on a machine without a GPU.  Each
.cu file is compiled on its own with only _ext/ on the include path, and
again as the self-contained text lscore._cuda hands to cupy.RawModule, for
compute_75, compute_80 and compute_90, with every name expression the
package launches.
"""
import os

import pytest

from lscore import _cuda

try:
    from cuda.bindings import nvrtc
except ImportError as e:  # pragma: no cover - the test extra installs it
    if os.environ.get("CI"):
        raise
    pytest.skip(f"cuda-bindings is not installed ({e}); pip install -e '.[test]'",
                allow_module_level=True)

ARCHS = ("compute_75", "compute_80", "compute_90")
EXT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_ext")


def _check(result, what):
    """The value of an nvrtc call's (status, value) result, after checking the status."""
    assert result[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"{what}: {result[0]}"
    return result[1] if len(result) == 2 else result[1:]


def compile_ptx(text: str, filename: str, arch: str, names, include: bool):
    prog = _check(nvrtc.nvrtcCreateProgram(text.encode(), filename.encode(), 0, [], []),
                  "nvrtcCreateProgram")
    try:
        for n in names:
            _check(nvrtc.nvrtcAddNameExpression(prog, n.encode()), f"add name {n}")
        opts = [f"--gpu-architecture={arch}", *_cuda.NVRTC_OPTIONS]
        if include:
            opts.append(f"--include-path={EXT}")
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        log = b" " * size
        _check(nvrtc.nvrtcGetProgramLog(prog, log), "log")
        log = log.rstrip(b"\x00 \n").decode()
        assert res[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"{filename} {arch}:\n{log}"
        assert log == "", f"{filename} {arch} compiled with diagnostics:\n{log}"
        lowered = {n: _check(nvrtc.nvrtcGetLoweredName(prog, n.encode()), f"lowered {n}")
                   for n in names}
        size = _check(nvrtc.nvrtcGetPTXSize(prog), "ptx size")
        ptx = b" " * size
        _check(nvrtc.nvrtcGetPTX(prog, ptx), "ptx")
        return ptx.rstrip(b"\x00").decode(), {k: v.decode() for k, v in lowered.items()}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def test_nvrtc_version():
    major, minor = _check(nvrtc.nvrtcVersion(), "version")
    assert (major, minor) >= (12, 0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("filename", sorted(_cuda.KERNELS))
@pytest.mark.parametrize("form", ["file_with_include_path", "inlined_for_rawmodule"])
def test_kernels_compile(filename, arch, form):
    names = _cuda.KERNELS[filename]
    if form == "file_with_include_path":
        with open(os.path.join(EXT, filename), encoding="utf-8") as f:
            text = f.read()
    else:
        text = _cuda.source(filename)
        assert '#include "' not in text
    ptx, lowered = compile_ptx(text, filename, arch, names, form == "file_with_include_path")
    assert f".target sm_{arch.split('_')[1]}" in ptx
    for name in names:
        assert f".entry {lowered[name]}(" in ptx, name


def test_scan_kernels_use_16_byte_vector_loads():
    """The aligned path really compiles to 128-bit loads and stores."""
    ptx, _ = compile_ptx(_cuda.source("scan.cu"), "scan.cu", "compute_80",
                         _cuda.KERNELS["scan.cu"], False)
    assert "ld.v4.u32" in ptx or "ld.global.v4.u32" in ptx
    assert "st.v4.u32" in ptx or "st.global.v4.u32" in ptx


def test_no_multiply_add_contraction_in_update():
    """--fmad=false: the device rounds each multiply like the CPU core."""
    ptx, _ = compile_ptx(_cuda.source("update.cu"), "update.cu", "compute_80",
                         _cuda.KERNELS["update.cu"], False)
    assert "fma." not in ptx
