"""The blockwise FP8 and square-tile kernels on the GPU (_ext/blockwise.cu): the host harness
runs them bit for bit like the CPU kernels (lscore.kernels.mx_quantize with a float32 rule or
tile=True) and reads them back like lscore.fp8.dequantize_blocks: TE's and torchao's float32
rules, blocks along the rows and the columns, 128x128 and 32x32 tiles under every rule,
float32 / float16 / bfloat16 inputs read in place through strided views; and through
lscore.fp8's own device path (quantize_on / dequantize_on) for every float32-scale preset and
the 32x32 MXFP8 weight tiles.  NVRTC compiles blockwise.cu in test_cuda_nvrtc.py."""

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lscore.fp8
from lscore import kernels
from lscore.fp8 import block_dequant, blocks

ml_dtypes = pytest.importorskip("ml_dtypes")
if shutil.which("g++") is None:  # pragma: no cover
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from helpers import cuda_host
from helpers.cuda_host.blocks import harness_blocks

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
RULES = (("te-fp32", True, 0.0), ("te-fp32", False, 1e-30), ("torchao-fp32", False, 1e-12))
MX = tuple(kernels.MX_MODES)


@pytest.fixture(scope="module")
def dev():
    return harness_blocks(cuda_host.HostBackend())


def inputs(seed, rows, cols, dtype):
    """Random magnitudes over a wide range, NaN, +-Inf, zeros, subnormals, an all-zero
    row, in `dtype`: contiguous, strided and reversed views of the same values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-40, 40, (rows, cols))
    flat = x.ravel()
    pick = rng.random(flat.size) < 0.01
    flat[pick] = rng.choice([np.nan, np.inf, -np.inf, 0.0, 1e-41, -1e-39], pick.sum())
    x[-1] = 0
    with np.errstate(over="ignore"):
        x = x.astype(np.float32).astype(DTYPES[dtype])
    base = np.zeros((2 * rows, cols + 8), x.dtype)
    base[::2, 3 : 3 + cols] = x
    return {"contiguous": x, "strided": base[::2, 3 : 3 + cols], "reversed": x[:, ::-1]}


def same(got, want, what):
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, what
        np.testing.assert_array_equal(
            np.ascontiguousarray(g).view(np.uint8), np.ascontiguousarray(w).view(np.uint8), what
        )


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_rows_and_columns_equal_the_cpu_kernels(dev, dtype):
    for what, x in inputs(3, 256, 384, dtype).items():
        for elem in ("float8_e4m3fn", "float8_e5m2"):
            for mode, pow2, eps in RULES:
                for axis in (-1, 0):
                    kw = dict(axis=axis, pow2=pow2, eps=eps)
                    got = dev.quantize(x, elem, mode, 128, **kw)
                    want = kernels.mx_quantize(np.ascontiguousarray(x), elem, mode, 128, **kw)
                    same(got, want, f"{what} {elem} {mode} {pow2} axis {axis}")


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_tiles_equal_the_cpu_kernels(dev, dtype):
    """Square tiles of 128 and 32 under the float32 rules, of 32 under every MX rule, a
    partial tile at the bottom and right edges."""
    for what, x in inputs(4, 200, 300, dtype).items():
        for mode, pow2, eps in RULES:
            for t in (128, 32):
                kw = dict(tile=True, pow2=pow2, eps=eps)
                got = dev.quantize(x, "float8_e4m3fn", mode, t, **kw)
                want = kernels.mx_quantize(np.ascontiguousarray(x), "float8_e4m3fn", mode, t, **kw)
                same(got, want, f"{what} {mode} {pow2} {t}")
        for mode in MX:
            for elem in ("float8_e4m3fn", "float8_e5m2"):
                got = dev.quantize(x[:70, :97], elem, mode, 32, tile=True)
                want = kernels.mx_quantize(
                    np.ascontiguousarray(x[:70, :97]), elem, mode, 32, tile=True
                )
                same(got, want, f"{what} {mode} {elem}")


@settings(max_examples=8, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(sorted(DTYPES)),
    st.integers(1, 150),
    st.integers(1, 150),
)
def test_generated_tiles_equal_the_cpu_kernels(dev, seed, dtype, m, k):
    x = np.ascontiguousarray(inputs(seed, m, k, dtype)["contiguous"])
    for mode, pow2, eps in RULES:
        for t in (128, 32):
            kw = dict(tile=True, pow2=pow2, eps=eps)
            same(
                dev.quantize(x, "float8_e4m3fn", mode, t, **kw),
                kernels.mx_quantize(x, "float8_e4m3fn", mode, t, **kw),
                f"{mode} {t} {x.shape}",
            )


PRESETS = [
    ("te-blockwise", {}),
    ("te-blockwise", {"fp8_format": "HYBRID"}),
    ("torchao-blockwise", {}),
    ("te-mxfp8", {"weight_block": 32}),
    ("torchao-mx-rceil", {"weight_block": 32}),
]


@pytest.mark.parametrize("name, kw", PRESETS)
@pytest.mark.parametrize("role", ["input", "grad", "weight"])
def test_presets_on_the_device_equal_lscore_fp8(dev, name, kw, role):
    """lscore.fp8's device path (quantize_on, dequantize_on) over the harness: the codes
    and the values read back in every dtype of quantize_blocks / dequantize_blocks."""
    r = lscore.fp8.recipe(name, **kw)
    x = inputs(5, 256, 256, "float32")["contiguous"]
    x[5, 40] = 3e38  # beyond float16's range once read back
    elem = r.role_element(role)
    for axis in (-1, 0):
        want = lscore.fp8.quantize_blocks(x, r, role=role, axis=axis)
        got = blocks.quantize_on(dev, None, x, r, elem, axis, role)
        assert (got.axis, got.role, got.element, got.tiles) == (
            want.axis,
            role,
            want.element,
            want.tiles,
        )
        same((got.scales, got.data), (_raw(want.scales), want.data.view(np.uint8)), role)
        for dst, dt in DTYPES.items():
            back = block_dequant.dequantize_on(dev, got, dst)
            w = lscore.fp8.dequantize_blocks(want, dt)
            nan = np.isnan(w.astype(np.float32))
            assert np.isnan(back.astype(np.float32)[nan]).all()
            np.testing.assert_array_equal(
                back.view(f"u{w.itemsize}")[~nan], w.view(f"u{w.itemsize}")[~nan], f"{dst}"
            )


def _raw(scales):
    return scales if scales.dtype == np.float32 else scales.view(np.uint8)


def test_stacked_device_weights_need_whole_tiles(dev):
    r = lscore.fp8.recipe("te-blockwise")
    x = inputs(6, 256, 128, "bfloat16")["contiguous"].reshape(2, 128, 128)
    got = blocks.quantize_on(dev, None, x, r, "e4m3fn", -1, "weight")
    want = lscore.fp8.quantize_blocks(x, r, role="weight")
    assert got.scales.shape == (2, 1, 1)
    same((got.scales, got.data), (want.scales, want.data.view(np.uint8)), "stacked")
    with pytest.raises(ValueError, match="second-to-last length a multiple of 128"):
        blocks.quantize_on(dev, None, x[:, :100], r, "e4m3fn", -1, "weight")


def test_bad_arguments_are_refused_before_a_launch(dev):
    backend = dev.h["launcher"](None).backend
    before = len(backend.launches)
    x = np.zeros((128, 256), np.float32)
    with pytest.raises(ValueError, match="elem must be a float8 format for float32 scales"):
        dev.quantize(x, "float4_e2m1", "te-fp32", 128)
    with pytest.raises(ValueError, match="block must be an even integer from 2 to 1024"):
        dev.quantize(x, "e4m3fn", "te-fp32", 127)
    with pytest.raises(ValueError, match="tile must be an even integer from 2 to 1024"):
        dev.quantize(x, "e4m3fn", "floor", 2048, tile=True)
    with pytest.raises(ValueError, match=r"tiles need a 2-D input, got shape \(2, 64, 256\)"):
        dev.quantize(x.reshape(2, 64, 256), "e4m3fn", "te-fp32", 128, tile=True)
    with pytest.raises(ValueError, match="the last axis must be a multiple of 128"):
        dev.quantize(x[:, :200], "e4m3fn", "te-fp32", 128)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        dev.quantize(x, "e4m3fn", "te-fp32", 128, eps=-1.0)
    with pytest.raises(ValueError, match="pow2 and eps are the float32 rules'"):
        dev.quantize(x, "e4m3fn", "floor", 32, pow2=True)
    with pytest.raises(ValueError, match="nvfp4 and pts take neither"):
        dev.quantize(x, "e4m3fn", "te-fp32", 128, pts=1.0)
    s, d = dev.quantize(x, "e4m3fn", "te-fp32", 128)
    with pytest.raises(ValueError, match="scales must be a C-contiguous float32 array"):
        dev.dequantize(s.view(np.uint8), d, "e4m3fn", "te-fp32", 128)
    with pytest.raises(ValueError, match=r"scales must have shape \(1, 2\)"):
        dev.dequantize(s, d, "e4m3fn", "te-fp32", 128, tile=True)
    assert len(backend.launches) == before + 1
