"""The block-scaled kernels on the GPU (_ext/mx.cu): NVRTC compiles them for sm_80 (the
rules of lsc_mx.h), sm_90 (cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32) and sm_100a (also
cvt.rn.satfinite.e2m1x2.f32 and cvt.rp.satfinite.ue8m0x2.f32), and the host harness runs
them, both paths, bit for bit like the CPU kernels (lscore.kernels.mx_quantize /
nvfp4_quantize) and the NumPy twin: every mode and element, blocks along the rows and the
columns, float32 / float16 / bfloat16 inputs read in place through strided views.

The harness runs the instructions as the PTX ISA documents them, with NaN codes of its own,
through the kernels' fixes to the rule (lsc_fp8.h, mx.cu).
"""

import re
import shutil
import subprocess

import numpy as np
import pytest

import lscore.fp8
from lscore import _reference_mx as ref
from lscore import cuda, kernels
from lscore.cuda import mx as cuda_mx

ml_dtypes = pytest.importorskip("ml_dtypes")

ELEMS = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1")
MODES = tuple(kernels.MX_MODES)
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# each architecture's conversion instructions in mx.cu's PTX
INSTRUCTIONS = ("e4m3x2.f32", "e5m2x2.f32", "e2m1x2.f32", "ue8m0x2.f32")
HAS = {"80": (), "90": INSTRUCTIONS[:2], "100a": INSTRUCTIONS}


def mx_ptx(arch):
    if arch == "100a":
        from cupy.cuda import compiler

        if compiler._get_nvrtc_version() < (12, 8):
            pytest.skip("sm_100a needs NVRTC 12.8 or newer")
    ptx, lowered, log = cuda.compile_kernels("mx.cu", arch)
    assert log == "", log
    assert set(lowered) == set(cuda.KERNELS["mx.cu"])
    return ptx.rstrip(b"\x00").decode()


@pytest.mark.parametrize("arch", sorted(HAS))
def test_compiles_with_nvrtc(cupy_compiler, arch):
    ptx = mx_ptx(arch)
    assert f".target sm_{arch}" in ptx
    assert ".ftz" not in ptx and "fma." not in ptx and "approx" not in ptx
    assert "shfl.sync.bfly" in ptx
    assert tuple(i for i in INSTRUCTIONS if i in ptx) == HAS[arch]


def ptxas_release():
    """ptxas's (major, minor) release, or None where it is not installed."""
    if shutil.which("ptxas") is None:
        return None
    out = subprocess.run(["ptxas", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


@pytest.mark.slow
def test_ptxas_assembles_the_sm100a_instructions(cupy_compiler, tmp_path):
    """NVRTC passes inline PTX through unread: ptxas checks the E2M1 and UE8M0 conversions."""
    release = ptxas_release()
    if release is None or release < cupy_compiler._get_nvrtc_version():
        pytest.skip(f"no ptxas as new as NVRTC to assemble its PTX (ptxas {release})")
    path = tmp_path / "mx.ptx"
    path.write_text(mx_ptx("100a"))
    r = subprocess.run(
        ["ptxas", "-arch=sm_100a", str(path), "-o", str(tmp_path / "mx.cubin")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr


if shutil.which("g++") is None:  # pragma: no cover
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import cuda_host
from helpers.cuda_host.blocks import harness_blocks


@pytest.fixture(scope="module")
def backend():
    return cuda_host.HostBackend()


def specials():
    """Zeros, NaN, Inf, subnormals, and powers of two with their float32 neighbours scaled
    to each element format's largest value: the values where the rules part."""
    out = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-42, 1e-39, 2.0**-126]
    with np.errstate(over="ignore"):  # 448 * 2**127 and more: Inf, one more special
        for top in (6.0, 448.0, 57344.0, 1.0):
            for k in (-140, -127, -100, -3, 0, 1, 20, 100, 120, 127):
                p = np.float32(top * 2.0**k)
                out += [p, np.nextafter(p, np.float32(np.inf)), np.nextafter(p, np.float32(0))]
    return np.array(out, np.float32)


def blocks_of(rows, cols, seed):
    """A float32 (rows, cols) input: random magnitudes with specials sprinkled in, a
    zero block, a NaN block and an Inf block along each axis."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-30, 30, (rows, cols))).astype(
        np.float32
    )
    s = specials()
    flat = x.ravel()
    pick = rng.random(flat.size) < 0.2
    flat[pick] = rng.choice(s, pick.sum())
    x[0, :32] = 0.0
    x[1, :16] = np.nan
    x[:32, 2] = 0.0
    x[:16, 3] = np.inf
    return x


def want(x, elem, mode, block, cols, pts=None):
    """The CPU kernels' codes of x (float32 widened, exact), blocked along its rows or (cols)
    along its first axis, in mx.cu's layout."""
    a = np.ascontiguousarray(np.asarray(x, np.float32).T if cols else np.asarray(x, np.float32))
    if mode == "nvfp4":
        s, d = kernels.nvfp4_quantize(a, pts)
    else:
        s, d = kernels.mx_quantize(a, elem, mode, block)
    return (s.T, d.T) if cols else (s, d)


def layouts(dt, seed=3):
    x = blocks_of(64, 96, seed)
    with np.errstate(over="ignore"):
        base = np.zeros((128, 200), dt)
        base[::2, 5:101] = x.astype(dt)
    return {
        "contiguous": x.astype(dt),
        "strided": base[::2, 5:101],
        "reversed": x.astype(dt)[:, ::-1],
    }


@pytest.mark.parametrize("src", sorted(DTYPES))
@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("hw", [0, 1], ids=["rule", "instructions"])
def test_mx_quantize_equals_the_cpu_kernels(backend, src, elem, hw):
    dev = harness_blocks(backend, hw)
    for what, x in layouts(DTYPES[src]).items():
        for mode in MODES:
            for axis in (-1, 0):
                s, d = dev.quantize(x, elem, mode, 32, axis=axis)
                ws, wd = want(x, elem, mode, 32, axis == 0)
                msg = f"{what} {mode} axis={axis}"
                np.testing.assert_array_equal(s, ws, err_msg=msg)
                np.testing.assert_array_equal(d, wd, err_msg=msg)


def unaligned_empty(like, shape, dt):
    """A new C-contiguous array one byte past an aligned address."""
    dt = np.dtype(ml_dtypes.bfloat16 if dt == "bfloat16" else dt)
    raw = np.empty(int(np.prod(shape)) * dt.itemsize + 16, np.uint8)
    start = (-raw.ctypes.data) % 16 + 1
    return raw[start : start + int(np.prod(shape)) * dt.itemsize].view(dt).reshape(shape)


@pytest.mark.parametrize("src", sorted(DTYPES))
def test_rows_take_16_byte_loads_and_fall_back_where_unaligned(backend, src):
    """The rows kernel reads aligned rows of unit stride 16 bytes a thread (blocks of 8 and
    more elements) and stores their codes 8, 4 or 2 at a time; unaligned input or codes and
    smaller blocks take the pair path: the CPU kernels' codes on every path."""
    dev = harness_blocks(backend)
    odd = cuda_mx.BlockArrays(**{**dev.h, "empty": unaligned_empty})
    x = blocks_of(64, 128, 5).astype(DTYPES[src])
    assert x.ctypes.data % 16 == 0
    buf = np.zeros(x.size + 8, x.dtype)
    shifted = buf[1 : 1 + x.size].reshape(x.shape)
    shifted[...] = x
    for elem, mode, block in (
        ("float8_e4m3fn", "floor", 32),
        ("float8_e5m2", "te", 64),
        ("float8_e4m3fn", "rceil", 8),
        ("float4_e2m1", "even", 16),
        ("float4_e2m1", "nvfp4", 16),
        ("float8_e4m3fn", "ocp", 4),
    ):
        ws, wd = want(x, elem, mode, block, False)
        for what, arrays, a in (("aligned", dev, x), ("x", dev, shifted), ("codes", odd, x)):
            s, d = arrays.quantize(a, elem, mode, block)
            if what == "codes":
                assert d.ctypes.data % 2 == 1
            msg = f"{what} {elem} {mode} {block}"
            np.testing.assert_array_equal(s, ws, err_msg=msg)
            np.testing.assert_array_equal(d, wd, err_msg=msg)


@pytest.mark.parametrize("src", sorted(DTYPES))
@pytest.mark.parametrize("hw", [0, 1], ids=["rule", "instructions"])
def test_nvfp4_quantize_equals_the_cpu_kernels(backend, src, hw):
    dev = harness_blocks(backend, hw)
    for what, x in layouts(DTYPES[src]).items():
        x32 = np.asarray(x, np.float32)
        amax = float(np.nanmax(np.abs(x32[np.isfinite(x32)])))
        for pts in (None, kernels.nvfp4_tensor_scale(amax), 3.0):
            for axis in (-1, 0):
                s, d = dev.nvfp4_quantize(x, pts, axis=axis)
                ws, wd = want(x, "float4_e2m1", "nvfp4", 16, axis == 0, pts)
                msg = f"{what} pts={pts} axis={axis}"
                np.testing.assert_array_equal(s, ws, err_msg=msg)
                np.testing.assert_array_equal(d, wd, err_msg=msg)
    # the per-tensor scale read from the device, as a scale computed there would be
    pts = np.array([0.75], np.float32)
    s, d = dev.nvfp4_quantize(layouts(np.float32)["strided"], pts)
    ws, wd = want(layouts(np.float32)["strided"], None, "nvfp4", 16, False, 0.75)
    np.testing.assert_array_equal(s, ws)
    np.testing.assert_array_equal(d, wd)


def test_blocks_of_every_size_and_a_3d_view(backend):
    dev = harness_blocks(backend)
    x = blocks_of(8, 64, 7).reshape(2, 4, 64)[:, ::2, :]
    for block in (2, 4, 8, 16, 32, 64):
        for elem in ELEMS:
            s, d = dev.quantize(x, elem, "rceil", block)
            ws, wd = kernels.mx_quantize(np.ascontiguousarray(x), elem, "rceil", block)
            np.testing.assert_array_equal(s, ws, err_msg=f"{block} {elem}")
            np.testing.assert_array_equal(d, wd, err_msg=f"{block} {elem}")


@pytest.mark.slow
def test_rceil_scale_needs_no_logarithm(backend):
    """mx.cu's RCEIL scale (no log2, which the GPU's math library rounds otherwise than the
    CPU's) equals the reference's, which takes the logarithm, at every power of two from
    2**-150 to 2**127 times each element's largest value, and the 1024 floats above and
    below each."""
    dev = harness_blocks(backend)
    k = np.arange(-150, 128, dtype=np.float64)[:, None]
    m = np.concatenate([np.arange(1024), 2**23 - np.arange(1, 1025)])[None, :]
    for elem, top in (("float8_e4m3fn", 448.0), ("float8_e5m2", 57344.0), ("float4_e2m1", 6.0)):
        with np.errstate(over="ignore"):
            amax = (top * 2.0**k * (1 + m * 2.0**-23)).astype(np.float32).reshape(-1, 1)
        x = np.concatenate([amax, np.zeros_like(amax)], axis=1)  # blocks of 2
        s, _ = dev.quantize(x, elem, "rceil", 2)
        np.testing.assert_array_equal(s[:, 0], ref.mx_scale(amax[:, 0], elem, "rceil"))


RCEIL_EVERY_AMAX = r"""
#include <cmath>
#include <cstdio>
#include "cuda_shim.h"
#include "mx.cu"
/* torchao's rule as it is written: the float32 logarithm (the float64 one,
   correctly rounded here, rounded to float32), ceiled and clamped */
static lsc_u32 by_logarithm(float amax, int e)
{
    float d = amax / lsc_mx_max(e);
    if (d != d)
        return 0xFFu;
    if (d > 3.40282346638528859812e+38f)
        return 0xFEu;
    float l = d > 0.0f ? std::ceil((float)std::log2((double)d)) : -1e30f;
    l = l < -127.0f ? -127.0f : l > 127.0f ? 127.0f : l;
    return (lsc_u32)((int)l + 127);
}
int main()
{
    const int elems[3] = {LSC_CODE_E4M3FN, LSC_CODE_E5M2, LSC_MX_E2M1};
    unsigned long bad = 0;
    for (int e : elems)
        for (unsigned long long w = 0; w <= 0x7FFFFFFFull; ++w) {
            float amax = lsc_f32_from_bits((lsc_u32)w);
            if (lsc_mx_scale(amax, e, LSC_MX_RCEIL) != by_logarithm(amax, e) && bad++ < 5)
                std::printf("%d %08llx\n", e, w);
        }
    std::printf("%lu\n", bad);
    return 0;
}
"""


@pytest.mark.slow
def test_rceil_scale_needs_no_logarithm_at_every_amax(tmp_path):
    """lsc_mx_scale's RCEIL (from the bits) equals the logarithm's rule at every non-negative
    float32 amax and NaN, for each element format (2**31 patterns each; about three minutes
    on a shared core)."""
    src, exe = tmp_path / "rceil.cpp", tmp_path / "rceil"
    src.write_text(RCEIL_EVERY_AMAX)
    cmd = [cuda_host.compiler(), "-std=c++17", "-O2", "-ffp-contract=off", "-fno-strict-aliasing"]
    cmd += [f"-I{cuda_host.EXT}", f"-I{cuda_host.HERE}", str(src), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    assert subprocess.run([str(exe)], capture_output=True, text=True).stdout == "0\n"


@st.composite
def block_inputs(draw):
    """(32, 64) float32 inputs of whole blocks: 64 values drawn from the specials and all
    floats, laid out in a drawn order (blocks along either axis mix them differently)."""
    vals = st.one_of(
        st.sampled_from(specials().tolist()),
        st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    )
    drawn = np.array(draw(st.lists(vals, min_size=64, max_size=64)), np.float32)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return rng.permutation(np.resize(drawn, 32 * 64)).reshape(32, 64)


@settings(max_examples=12, deadline=None)
@given(x=block_inputs(), src=st.sampled_from(sorted(DTYPES)), hw=st.sampled_from([0, 1]))
def test_generated_blocks_equal_the_kernels_and_the_twin(backend, x, src, hw):
    dev = harness_blocks(backend, hw)
    with np.errstate(over="ignore"):
        xs = x.astype(DTYPES[src])
    x32 = np.asarray(xs, np.float32)
    for elem in ELEMS:
        for mode in MODES:
            for axis in (-1, 0):
                s, d = dev.quantize(xs, elem, mode, axis=axis)
                ws, wd = want(xs, elem, mode, 32, axis == 0)
                np.testing.assert_array_equal(s, ws, err_msg=f"{elem} {mode} {axis}")
                np.testing.assert_array_equal(d, wd, err_msg=f"{elem} {mode} {axis}")
        ts, td = ref.mx_quantize(x32, elem, "te")
        s, d = dev.quantize(xs, elem, "te")
        np.testing.assert_array_equal(s, ts)
        np.testing.assert_array_equal(d, td)
    for pts in (None, 0.5):
        s, d = dev.nvfp4_quantize(xs, pts)
        ts, td = ref.nvfp4_quantize(x32, pts)
        np.testing.assert_array_equal(s, ts)
        np.testing.assert_array_equal(d, td)


# te-nvfp4 runs nvfp4.cu's kernels (tests/kernels/test_nvfp4_te_cuda.py)
@pytest.mark.parametrize(
    "name",
    [
        n
        for n in lscore.fp8.BLOCK_RECIPES
        if lscore.fp8.recipe(n).scale_format != "float32"
        and lscore.fp8.recipe(n).mode != "te-nvfp4"
    ],
)
def test_recipes_quantize_and_dequantize_like_lscore_fp8(backend, name):
    """Each block recipe's codes and values read back (every dtype) equal lscore.fp8's
    quantize_blocks / dequantize_blocks on NumPy arrays, blocks along either axis (the
    float32-scale recipes: tests/kernels/test_blockwise_cuda.py)."""
    dev = harness_blocks(backend)
    r = lscore.fp8.recipe(name)
    x = blocks_of(64, 64, 9)
    x[5, 40] = 3e38  # beyond float16's range once scaled back
    for elem in ("e4m3fn", "e5m2", "e2m1"):
        try:
            r.allows(elem)
        except ValueError:
            continue  # not an element of this recipe
        for axis in (-1, 0):
            b = lscore.fp8.quantize_blocks(x, r, axis=axis, element=elem)
            s, d = dev.quantize(x, elem, r.mode, r.block, axis=axis, pts=b.tensor_scale)
            np.testing.assert_array_equal(s, b.scales.view(np.uint8), err_msg=f"{elem} {axis}")
            np.testing.assert_array_equal(d, b.data.view(np.uint8), err_msg=f"{elem} {axis}")
            for dst, dt in DTYPES.items():
                got = dev.dequantize(
                    s, d, elem, r.mode, r.block, axis=axis, pts=b.tensor_scale, dtype=dst
                )
                w = lscore.fp8.dequantize_blocks(b, dt)
                assert got.shape == x.shape and got.dtype == w.dtype
                # a NaN by value: which NaN a product of NaNs gives is the operands' order
                nan = np.isnan(w.astype(np.float32))
                assert np.isnan(got.astype(np.float32)[nan]).all()
                np.testing.assert_array_equal(
                    got.view(f"u{w.itemsize}")[~nan],
                    w.view(f"u{w.itemsize}")[~nan],
                    err_msg=f"{elem} {axis} {dst}",
                )


def test_bad_arguments_are_refused_before_a_launch(backend):
    dev = harness_blocks(backend)
    before = len(backend.launches)
    x = np.zeros((32, 48), np.float32)
    with pytest.raises(ValueError, match=r"the last axis must be a multiple of 32, got shape"):
        dev.quantize(x, "float8_e4m3fn", "floor")
    with pytest.raises(ValueError, match=r"the first axis must be a multiple of 16"):
        dev.nvfp4_quantize(x[:24], axis=0)
    with pytest.raises(ValueError, match=r"mode must be one of: floor, .*nvfp4; got 'up'"):
        dev.quantize(x, "float8_e4m3fn", "up", 16)
    with pytest.raises(ValueError, match=r"elem must be one of: .*; got 'e3m4'"):
        dev.quantize(x, "e3m4", "floor", 16)
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16, got float64"):
        dev.quantize(x.astype(np.float64), "e4m3fn", "floor", 16)
    with pytest.raises(ValueError, match="block must be a power of two from 2 to 64"):
        dev.quantize(x, "e4m3fn", "floor", 24)
    with pytest.raises(ValueError, match="block must be 16 for nvfp4, got 32"):
        dev.quantize(x, "e2m1", "nvfp4")
    with pytest.raises(ValueError, match="elem must be float4_e2m1 for nvfp4"):
        dev.quantize(x, "e4m3fn", "nvfp4", 16)
    with pytest.raises(ValueError, match="pts is NVFP4's per-tensor scale"):
        dev.quantize(x, "e4m3fn", "floor", 16, pts=1.0)
    with pytest.raises(ValueError, match=r"axis must be -1 .* or 0 .* of 3 dimensions, got 0"):
        dev.quantize(x.reshape(2, 16, 48), "e4m3fn", "floor", 16, axis=0)
    s, d = dev.quantize(x, "e5m2", "even", 16)
    with pytest.raises(ValueError, match=r"scales must have shape \(32, 3\)"):
        dev.dequantize(s[:, :2].copy(), d, "e5m2", "even", 16)
    assert len(backend.launches) == before + 1
    # the short element names are the kernels layer's long ones
    np.testing.assert_array_equal(d, dev.quantize(x, "float8_e5m2", "even", 16)[1])
