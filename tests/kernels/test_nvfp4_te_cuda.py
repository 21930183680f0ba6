"""TE v2.18's NVFP4 recipe on the GPU (_ext/nvfp4.cu): NVRTC compiles it for sm_80, sm_90
and sm_100a (the last with cvt.rn.satfinite.e2m1x2.f32), and the host harness runs it bit for
bit like the CPU kernels (lscore.kernels.nvfp4_te_quantize, hadamard16_amax) and the NumPy
twin: every orientation, tiles, the Hadamard transform, stochastic rounding, float32 /
float16 / bfloat16 inputs read in place through strided views, and the decode."""

import shutil

import numpy as np
import pytest

from lscore import _reference_nvfp4 as ref
from lscore import cuda, kernels
from lscore.cuda import nvfp4 as cuda_nv4
from lscore.cuda.views import DeviceView

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": BF16}


@pytest.mark.parametrize("arch", ["80", "90", "100a"])
def test_compiles_with_nvrtc(cupy_compiler, arch):
    if arch == "100a" and cupy_compiler._get_nvrtc_version() < (12, 8):
        pytest.skip("sm_100a needs NVRTC 12.8 or newer")
    ptx, lowered, log = cuda.compile_kernels("nvfp4.cu", arch)
    assert log == "", log
    assert set(lowered) == set(cuda.KERNELS["nvfp4.cu"])
    text = ptx.rstrip(b"\x00").decode()
    assert f".target sm_{arch}" in text
    assert ".ftz" not in text and "fma." not in text and "approx" not in text
    assert ("e2m1x2.f32" in text) == (arch == "100a")


if shutil.which("g++") is None:  # pragma: no cover
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from helpers import cuda_host


@pytest.fixture(scope="module")
def backend():
    return cuda_host.HostBackend()


def arrays(backend, hw=1):
    """lscore.cuda.nvfp4.Nv4Arrays on NumPy arrays as device memory and the harness, the
    conversion instruction's path (hw 1) or the rule's (hw 0)."""

    class Launcher(cuda_nv4.Nv4Launcher):
        def quantize(self, *a, **kw):
            super().quantize(*a, **kw, hw=hw)

    launcher = Launcher(backend, block=64, max_blocks=3)
    return cuda_nv4.Nv4Arrays(
        view=lambda a: DeviceView(a.ctypes.data, a.shape, a.strides, a.dtype.name, a.itemsize),
        empty=lambda like, shape, dt: np.empty(shape, BF16 if dt == "bfloat16" else dt),
        zeros=lambda like, n, dt: np.zeros(n, dt),
        to_host=lambda a: a,
        launcher=lambda a: launcher,
        stream=lambda a: None,
    )


@pytest.fixture
def dev(backend):
    return arrays(backend)


def inputs(dt, seed=3):
    """(48, 64) inputs of dtype dt: random magnitudes with NaN, Inf, zeros, subnormals, a
    zero tile, contiguous, strided and reversed."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((48, 64)) * 2.0 ** rng.integers(-20, 20, (48, 64))).astype(np.float32)
    x[rng.random(x.shape) < 0.03] = np.nan
    x[5, 7], x[9, 1], x[:16, 16:32] = np.inf, -0.0, 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        c = x.astype(dt)
        base = np.zeros((96, 200), dt)
    base[::2, 5:69] = c
    return {"contiguous": c, "strided": base[::2, 5:69], "reversed": c[:, ::-1]}


@pytest.mark.parametrize("src", sorted(DTYPES))
def test_quantize_equals_the_cpu_kernels(backend, src):
    devs = {hw: arrays(backend, hw) for hw in (0, 1)}
    for what, x in inputs(DTYPES[src]).items():
        for axis, tile, seed in [
            (-1, False, None),
            (0, False, None),
            (-1, True, None),
            (0, True, None),
            (-1, False, 2**64 - 5),
            (0, False, 77),
        ]:
            for hw in (0, 1):
                got = devs[hw].quantize(x, 3e3, axis=axis, tile=tile, seed=seed, offset=9)
                want = kernels.nvfp4_te_quantize(x, 3e3, axis=axis, tile=tile, seed=seed, offset=9)
                msg = f"{what} axis={axis} tile={tile} seed={seed} hw={hw}"
                np.testing.assert_array_equal(got[0], want[0], err_msg=msg)
                np.testing.assert_array_equal(got[1], want[1], err_msg=msg)


def test_hadamard_quantize_and_amax_equal_the_cpu_kernels(dev):
    for what, x in inputs(BF16).items():
        amax = kernels.hadamard16_amax(x)
        assert dev.rht_amax(x) == amax, what
        for seed in (None, 12345):
            got = dev.quantize(x, amax, axis=0, rht=True, seed=seed, offset=3)
            want = kernels.nvfp4_te_quantize(x, amax, axis=0, rht=True, seed=seed, offset=3)
            np.testing.assert_array_equal(got[0], want[0], err_msg=f"{what} {seed}")
            np.testing.assert_array_equal(got[1], want[1], err_msg=f"{what} {seed}")


@pytest.mark.parametrize("dst", sorted(DTYPES))
def test_dequantize_equals_the_twin(dev, dst):
    x = inputs(np.float32)["contiguous"]
    amax = ref.global_amax(x)
    for axis, tile in ((-1, False), (0, False), (-1, True), (0, True)):
        s, d = dev.quantize(x, amax, axis=axis, tile=tile)
        got = dev.dequantize(s, d, amax, axis=axis, tile=tile, dtype=dst)
        want = ref.decode(s, d, amax, axis=axis, tile=tile)
        with np.errstate(over="ignore"):
            want = want.astype(DTYPES[dst])
        assert got.shape == x.shape
        # a NaN narrowed on the device is the instruction's canonical word
        np.testing.assert_array_equal(
            got.view(f"u{want.itemsize}"), cuda_host.device_words(want), err_msg=f"{axis} {tile}"
        )


def test_bad_arguments_refused_before_a_launch(dev):
    x = np.zeros((32, 48), np.float32)
    with pytest.raises(ValueError, match="axis must be -1 or 0, got 2"):
        dev.quantize(x, 1.0, axis=2)
    with pytest.raises(ValueError, match=r"the last axis must be a multiple of 16.*\(32, 40\)"):
        dev.quantize(x[:, :40], 1.0)
    with pytest.raises(ValueError, match="bfloat16 input"):
        dev.quantize(x, 1.0, axis=0, rht=True)
    with pytest.raises(ValueError, match="not one of the 16 x 16 tiles"):
        dev.quantize(x, 1.0, tile=True, seed=1)
    with pytest.raises(ValueError, match="seed must be an integer from 0 to 2"):
        dev.quantize(x, 1.0, seed=-2)
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16, got float64"):
        dev.quantize(x.astype(np.float64), 1.0)
    with pytest.raises(ValueError, match="x must be 2-D bfloat16"):
        dev.rht_amax(x)


def test_quantize_blocks_on_a_device_equals_numpy(backend):
    """lscore.fp8's device path for te-nvfp4 (blocks.quantize_on, block_dequant.dequantize_on:
    the amax kernels, nvfp4.cu on the same framework's hooks) gives the NumPy path's codes,
    amax and values for every role and orientation."""
    import lscore.fp8 as fp8
    from lscore.cuda import fp8 as cuda_fp8
    from lscore.cuda import mx as cuda_mx
    from lscore.fp8 import block_dequant, blocks

    hooks = dict(
        view=lambda a: DeviceView(a.ctypes.data, a.shape, a.strides, a.dtype.name, a.itemsize),
        empty=lambda like, shape, dt: np.empty(shape, BF16 if dt == "bfloat16" else dt),
        zeros=lambda like, n, dt: np.zeros(n, dt),
        upload=lambda like, host: np.array(host, np.float32),
        as_float32=lambda w: w.view(np.float32),
        to_host=np.asarray,
        all_positive_finite=lambda a: bool(((a > 0) & np.isfinite(a)).all()),
        stream=lambda a: None,
    )
    f8 = cuda_fp8.Float8Launcher(backend, block=32, max_blocks=4)
    arrays = cuda_fp8.Float8Arrays(**hooks, launcher=lambda a: f8)
    mx = cuda_mx.MxLauncher(backend, block=64, max_blocks=3)
    dev = cuda_mx.BlockArrays(**hooks, launcher=lambda a: mx)
    x = inputs(BF16, 5)["strided"]
    r = fp8.recipe("te-nvfp4")
    for role, axis in (("input", -1), ("input", 0), ("weight", -1), ("grad", -1), ("grad", 0)):
        elem = r.role_element(role)
        got = blocks.quantize_on(dev, arrays, x, r, elem, axis, role, 41, 7)
        want = fp8.quantize_blocks(x, r, role=role, axis=axis, seed=41, offset=7)
        np.testing.assert_array_equal(got.data, want.data, err_msg=f"{role} {axis}")
        np.testing.assert_array_equal(got.scales, want.scales.view(np.uint8))
        assert (got.tensor_scale, got.axis, got.tiles) == (want.tensor_scale, want.axis, want.tiles)
        y = block_dequant.dequantize_on(dev, got, "float32")
        np.testing.assert_array_equal(y, fp8.dequantize_blocks(want), err_msg=f"{role} {axis}")
