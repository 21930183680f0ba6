"""The blockwise FP8 presets and the 32x32 MXFP8 weight tiles against their libraries, bit for
bit: vectors recorded from torchao 0.18.0 (its blockwise FP8 training prototype's torch
reference quantizers, its 32x32 MXFP8 reference) and from TransformerEngine v2.18's
pure-PyTorch reference quantizer, by tests/core/data/record_blockwise.py; and the cases TE's
reference does not cover (NaN, Inf), derived by hand from TE v2.18's kernel lines:
transformer_engine/common/recipe/recipe_common.cuh:14-69 and
transformer_engine/common/transpose/quantize_transpose_vector_blockwise.cu:274-316."""

import pathlib

import numpy as np
import pytest

import lscore.fp8 as fp8

ml_dtypes = pytest.importorskip("ml_dtypes")

DATA = pathlib.Path(__file__).parent / "data"
AO = np.load(DATA / "torchao_blockwise.npz")
TE = np.load(DATA / "te_blockwise.npz")


def values(bits):
    return bits.view(np.float32) if bits.dtype == np.uint32 else bits.view(ml_dtypes.bfloat16)


def same_scales(got, want_bits):
    """float32 scales equal the recorded bits; a NaN scale matches any NaN (torch's NaN
    bits come from its reduction kernel: 0x7FC00000 for float32 input, 0x7FFF0000 for
    bfloat16; lscore writes 0x7FC00000)."""
    want = want_bits.view(np.float32)
    assert got.dtype == np.float32 and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want_bits[~nan])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize(
    "name, kw",
    [("lhs", {}), ("rhs", {"axis": 0}), ("weight", {"role": "weight"})],
    ids=["1x128", "128x1", "128x128"],
)
def test_torchao_blockwise_equals_torchao(dtype, name, kw):
    x = values(AO[f"{dtype}_{name}_x"])
    b = fp8.quantize_blocks(x, "torchao-blockwise", **kw)
    same_scales(b.scales, AO[f"{dtype}_{name}_scale_inv"])
    np.testing.assert_array_equal(b.data.view(np.uint8), AO[f"{dtype}_{name}_data"])
    # what the vectors hold: NaN blocks, Inf blocks (scale 0), tiny blocks at the epsilon
    inv = b.scales
    assert np.isnan(inv).any() and np.isinf(inv).any()
    assert (inv == np.float32(1) / np.float32(448 / 1e-12)).any() or name == "rhs"


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("mode", ["rceil", "floor", "ceil", "even"])
def test_torchao_mxfp8_32x32_equals_torchao(dtype, mode):
    x = values(AO[f"{dtype}_mx32_x"])  # (E, N, K) expert weights
    r = fp8.recipe(f"torchao-mx-{mode}", weight_block=32)
    b = fp8.quantize_blocks(x, r, role="weight")
    want = AO[f"{dtype}_mx32_{mode}_scale"]
    assert b.scales.shape == want.shape[:3] == (2, 3, 2)
    np.testing.assert_array_equal(b.scales.view(np.uint8), want.reshape(b.scales.shape))
    np.testing.assert_array_equal(b.data.view(np.uint8), AO[f"{dtype}_mx32_{mode}_data"])


TE_KEYS = sorted({k.rsplit("_data", 1)[0] for k in TE.files if k.endswith("_data")})


@pytest.mark.parametrize("key", TE_KEYS)
def test_te_blockwise_equals_te_reference(key):
    """TE v2.18's reference quantizer: rowwise and columnwise copies of 1x128 blocks (the
    columnwise copy transposed, as TE stores it), 128x128 tiles and their transpose,
    E4M3 and E5M2, power-of-two and float32 scales, whole and ragged shapes."""
    sname, dtype, elem, scales, tile = key.split("_")
    x = values(TE[f"{sname}_{dtype}_x"])
    element = "e4m3fn" if elem == "e4m3" else "e5m2"
    # an E5M2 tensor is a gradient (HYBRID); TE's reference quantizes any tensor to either
    r = fp8.recipe(
        "te-blockwise", element="e4m3fn", grad_element=element, power_2_scales=scales == "pow2"
    )
    if tile == "1":
        rows = fp8.quantize_blocks(x, r, role="grad")
        cols = fp8.quantize_blocks(x, r, role="grad", axis=0)
        got = [rows.data, rows.scales, cols.data.T, cols.scales.T]
    else:
        w = fp8.quantize_blocks(x, r, role="weight", element=element)
        rows = w
        got = [w.data, w.scales, w.data.T, w.scales.T]  # TE's columnwise weight: transposed
    wants = [TE[f"{key}_{k}"] for k in ("data", "scale_inv", "data_t", "scale_inv_t")]
    for g, want in zip(got, wants, strict=True):
        g = np.ascontiguousarray(g).view(want.dtype)
        assert g.shape == want.shape
        np.testing.assert_array_equal(g, want)
    if f"{key}_deq" in TE:  # TE's reference dequantize, to the input's dtype
        dt = np.float32 if dtype == "f32" else ml_dtypes.bfloat16
        back = fp8.dequantize_blocks(rows, dt)
        np.testing.assert_array_equal(back.view(TE[f"{key}_deq"].dtype), TE[f"{key}_deq"])


def test_te_reference_vectors_cover_every_case():
    assert len(TE_KEYS) == 2 * 2 * 2 * 2 * 2  # shapes, dtypes, elements, scales, tiles
    assert sum(k.endswith("_deq") for k in TE.files) == 2 * 2 * 2


# ---- what TE's kernels do where its reference does not run: hand-derived ----------------


def te(x, **kw):
    return fp8.quantize_blocks(np.asarray(x), fp8.recipe("te-blockwise", **kw), role="input")


def block(*head, dtype=np.float32):
    x = np.zeros((1, 128), np.float32)
    x[0, : len(head)] = head
    return x.astype(dtype)


def test_te_worked_example():
    """bf16 [3.0, -1.5, 0.1, 0, ...]: RN(448 / 3) = 149.33333; the power of two 128 gives
    384, -192, 12.8125 -> 0x7C, 0xF4, 0x55 and scale_inv 2**-7; float32 scales give 448
    (3 * 149.33333 rounds to 448), -224, 14.9479 -> 0x7E, 0xF6, 0x57 and scale_inv
    RN(1 / 149.33333) = 0x3BDB6DB7."""
    x = block(3.0, -1.5, 0.1, dtype=ml_dtypes.bfloat16)
    b = te(x)
    assert list(b.data.view(np.uint8)[0, :4]) == [0x7C, 0xF4, 0x55, 0x00]
    assert b.scales[0, 0] == np.float32(2.0**-7)
    b = te(x, power_2_scales=False)
    assert list(b.data.view(np.uint8)[0, :4]) == [0x7E, 0xF6, 0x57, 0x00]
    assert b.scales.view(np.uint32)[0, 0] == 0x3BDB6DB7
    # amax 3.75: 448 / 3.75 = 119.47 -> 64, 240 (0x77); amax 7: 64 exactly, 448 (0x7E)
    assert te(block(3.75)).data.view(np.uint8)[0, 0] == 0x77
    assert te(block(7.0)).data.view(np.uint8)[0, 0] == 0x7E


def test_te_special_blocks():
    """NaN elements never reach the amax (fmaxf from 0) and cast to 0x7F; an Inf amax gives
    scale 1 (so the Inf casts to +-448 and the block's values are cast unscaled); an
    all-zero block scale 1; an amax whose quotient overflows float32 the input dtype's
    largest value (bfloat16: 0x1.FEp127, masked to 2**127; float32: FLT_MAX, whose inverse
    is subnormal)."""
    b = te(block(np.nan, 3.0, -1.5))
    assert list(b.data.view(np.uint8)[0, :3]) == [0x7F, 0x7C, 0xF4] and b.scales[0, 0] == 2.0**-7
    b = te(block(-np.inf, 1.0, -500.0, 1e-4))
    assert list(b.data.view(np.uint8)[0, :4]) == [0xFE, 0x38, 0xFE, 0x00]
    assert b.scales[0, 0] == 1
    b = te(block())
    assert b.scales[0, 0] == 1 and not b.data.view(np.uint8).any()
    tiny = te(block(1e-38, dtype=ml_dtypes.bfloat16))
    assert tiny.scales[0, 0] == np.float32(2.0**-127)
    assert tiny.scales.view(np.uint32)[0, 0] == 0x00400000  # subnormal 2**-127
    big = te(block(1e-39), power_2_scales=False)
    assert big.scales[0, 0] == np.float32(1) / np.finfo(np.float32).max
    # a ragged block is scaled from the elements it has (zero-filled, as the kernel loads it)
    ragged = te(np.array([[3.0] * 5], np.float32))
    assert ragged.scales.shape == (1, 1) and ragged.scales[0, 0] == 2.0**-7


def test_te_hybrid_gradients_are_e5m2():
    r = fp8.recipe("te-blockwise", fp8_format="HYBRID")
    g = fp8.quantize_blocks(block(3.0, 1e-3), r, role="grad")
    # 57344 / 3 = 19114.67 -> 16384; 3 * 16384 = 49152 (0x7A), 16.384 -> 16 (0x4C)
    assert g.element == "e5m2" and g.scales[0, 0] == np.float32(2.0**-14)
    assert list(g.data.view(np.uint8)[0, :2]) == [0x7A, 0x4C]


def test_te_mxfp8_32x32_worked_example():
    """TE's 2-D MXFP8 (after v2.18, d8815c4c30b5): one float_to_e8m0(amax * (1 / 448)) per
    32x32 tile: amax 3 -> E8M0 120 (2**-7), 3 -> 384 (0x7C); amax 3.75 -> 121, 240 (0x77);
    torchao's FLOOR for 3.75 -> 120, 480 saturating to 448 (0x7E)."""
    x = np.zeros((64, 32), np.float32)
    x[5, 7], x[40, 3] = 3.0, 3.75
    b = fp8.quantize_blocks(x, fp8.recipe("te-mxfp8", weight_block=32), role="weight")
    assert list(b.scales.view(np.uint8).ravel()) == [120, 121]
    assert b.data.view(np.uint8)[5, 7] == 0x7C and b.data.view(np.uint8)[40, 3] == 0x77
    f = fp8.quantize_blocks(x, fp8.recipe("torchao-mx-floor", weight_block=32), role="weight")
    assert list(f.scales.view(np.uint8).ravel()) == [120, 120]
    assert f.data.view(np.uint8)[40, 3] == 0x7E
