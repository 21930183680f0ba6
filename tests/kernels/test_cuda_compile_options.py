"""What reaches NVRTC when lscore compiles its kernels through CuPy.

The kernels must round like the CPU core, so NVRTC has to see exact IEEE
float32 options and no flush-to-zero: cupy.RawModule appends -ftz=true to
every compile, which is why the loader calls compile_using_nvrtc instead.
These tests record the options at CuPy's NVRTC binding, so a CuPy release
that starts adding an option of its own fails here.
"""

import pytest

from lscore import cuda
from lscore.cuda import loader

EXACT = ("--ftz=false", "--fmad=false", "--prec-div=true", "--prec-sqrt=true")


@pytest.fixture
def nvrtc_options(cupy_compiler, monkeypatch):
    """The option tuples CuPy hands to nvrtcCompileProgram, one per compile."""
    seen = []
    compile_program = cupy_compiler.nvrtc.compileProgram

    def recording(prog, options):
        seen.append(tuple(options))
        return compile_program(prog, options)

    monkeypatch.setattr(cupy_compiler.nvrtc, "compileProgram", recording)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("filename", sorted(cuda.KERNELS))
def test_options_reach_nvrtc_as_written(nvrtc_options, cupy_compiler, monkeypatch, filename):
    monkeypatch.setattr(cupy_compiler, "_use_pch", False)
    cuda.compile_kernels(filename, "80")
    assert nvrtc_options == [
        (*cuda.NVRTC_OPTIONS, "-arch=compute_80", "--device-as-default-execution-space")
    ]


@pytest.mark.slow
def test_options_are_exact_ieee_with_a_precompiled_header_too(
    nvrtc_options, cupy_compiler, monkeypatch
):
    """CUPY_NVRTC_USE_PCH adds --pch (NVRTC 12.8 and later) and nothing that changes rounding."""
    monkeypatch.setattr(cupy_compiler, "_use_pch", True)
    cuda.compile_kernels("scan.cu", "80")
    (options,) = nvrtc_options
    assert options[-1] == "--pch"
    for flag in EXACT:
        assert flag in options
    ftz = [o for o in options if "ftz" in o]
    assert ftz == ["--ftz=false"], "a later -ftz would win: NVRTC keeps the last one"
    assert not any("fast_math" in o or "fast-math" in o for o in options)


@pytest.mark.slow
def test_the_include_path_form_adds_only_the_include_path(
    nvrtc_options, cupy_compiler, monkeypatch, ext_dir
):
    monkeypatch.setattr(cupy_compiler, "_use_pch", False)
    cuda.compile_kernels("scan.cu", "80", include_dir=ext_dir)
    (options,) = nvrtc_options
    assert options[: len(cuda.NVRTC_OPTIONS) + 1] == (
        *cuda.NVRTC_OPTIONS,
        f"--include-path={ext_dir}",
    )
    assert options[len(cuda.NVRTC_OPTIONS) + 1 :] == (
        "-arch=compute_80",
        "--device-as-default-execution-space",
    )


def test_a_cubin_when_cupy_picks_the_real_architecture(cupy_compiler, monkeypatch):
    """On a device CuPy compiles SASS for it; the loader hands those bytes to Module.load."""
    monkeypatch.setattr(
        cupy_compiler,
        "_get_arch_for_options_for_nvrtc",
        lambda arch=None: (f"-arch=sm_{arch}", "cubin"),
    )
    image, lowered, log = cuda.compile_kernels("update.cu", "80")
    assert image[:4] == b"\x7fELF" and log == ""
    assert lowered[loader.UPDATE_KERNEL].encode() in image


@pytest.mark.gpu
@pytest.mark.parametrize("filename", sorted(cuda.KERNELS))
def test_the_device_loads_a_cubin_of_its_own_architecture(filename):
    """The loader's real path: CuPy picks the device's architecture, the module loads."""
    import cupy

    with cupy.cuda.Device(0) as device:
        image, lowered, log = cuda.compile_kernels(filename)
        assert image[:4] == b"\x7fELF" and log == ""
        module, names = loader.module(filename, device.id)
    assert names == lowered
    for name in cuda.KERNELS[filename]:
        assert module.get_function(lowered[name]).ptr != 0
