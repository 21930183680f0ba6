"""Every CUDA kernel compiles with CuPy's NVRTC (from pip, no GPU, no driver) without a warning.

lscore.cuda.compile_kernels is the very function the CuPy path uses to
build its kernels; the `cupy_compiler` fixture stands in only for the
driver query CuPy makes to pick cubin or PTX.  Each .cu file is compiled on
its own with only _ext/ on the include path, and as the self-contained text
the loader compiles, for compute capabilities 7.5, 8.0 and 9.0, with every
name expression the package launches.
"""

import pytest

from lscore import cuda

ARCHS = ("75", "80", "90")


def ptx_text(ptx: bytes) -> str:
    return ptx.rstrip(b"\x00").decode()


def test_nvrtc_version(cupy_compiler):
    assert cupy_compiler._get_nvrtc_version() >= (12, 0)


# the fast tier compiles the loader's form for the newest architecture; the slow tier every pair
FORMS_ARCHS = [
    pytest.param(form, arch, marks=() if (form, arch) == ("inlined", "90") else pytest.mark.slow)
    for form in ("file_with_include_path", "inlined")
    for arch in ARCHS
]


@pytest.mark.parametrize("filename", sorted(cuda.KERNELS))
@pytest.mark.parametrize(("form", "arch"), FORMS_ARCHS)
def test_kernels_compile_without_diagnostics(cupy_compiler, ext_dir, filename, arch, form):
    include = ext_dir if form == "file_with_include_path" else None
    ptx, lowered, log = cuda.compile_kernels(filename, arch, include_dir=include)
    assert log == "", f"{filename} sm_{arch} compiled with diagnostics:\n{log}"
    ptx = ptx_text(ptx)
    assert f".target sm_{arch}" in ptx
    assert set(lowered) == set(cuda.KERNELS[filename])
    for name in cuda.KERNELS[filename]:
        assert f".entry {lowered[name]}(" in ptx, name
    if form == "inlined":
        assert '#include "' not in cuda.source(filename)


@pytest.mark.parametrize("filename", sorted(cuda.KERNELS))
def test_exact_ieee_float32(cupy_compiler, filename):
    """No flush-to-zero and no multiply-add: the device rounds like the CPU core."""
    ptx = ptx_text(cuda.compile_kernels(filename, "80")[0])
    assert ".ftz" not in ptx and "fma." not in ptx and "approx" not in ptx


def test_scan_kernels_use_16_byte_vector_loads(cupy_compiler):
    """The aligned path really compiles to 128-bit loads and stores."""
    ptx = ptx_text(cuda.compile_kernels("scan.cu", "80")[0])
    assert "ld.v4.u32" in ptx or "ld.global.v4.u32" in ptx
    assert "st.v4.u32" in ptx or "st.global.v4.u32" in ptx


def test_compile_errors_carry_the_log(cupy_compiler, monkeypatch):
    monkeypatch.setitem(cuda.KERNELS, "scan.cu", ("lsc_mt_unscale<no_such_type>",))
    with pytest.raises(RuntimeError, match=r"(?s)could not compile scan.cu for 80.*no_such_type"):
        cuda.compile_kernels("scan.cu", "80")
