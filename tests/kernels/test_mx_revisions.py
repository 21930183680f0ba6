"""The MX rules of the libraries' next revisions (lscore.kernels.mx_* modes te-3262 and
floor-4725 ... rceil-4725) and TransformerEngine's NaN-free block amax, against torchao's
own outputs after pytorch/ao#4725 (recorded on the CPU by
tests/core/data/record_torchao_mx_4725.py into torchao_mx_4725.npz) and against cases
derived by hand from the cited source lines, at every ISA level and in the NumPy twin.

Sources: pytorch/ao at 5d73a0c10b02 (#4725), torchao/prototype/mx_formats/mx_tensor.py:
_f32_to_e8m0_rceil :111-129, _e8m0_scale_to_reciprocal_fp32 :132-158, _to_mx_rceil's
descale :185 and product :218-225 (no clamp), to_mx's NaN scale for a non-finite amax
:351-356 and product :358-359.  NVIDIA/TransformerEngine v2.18: the block amax of
common/cast/mxfp8/quantize_mxfp8.cuh:211-363 (fmaxf, __hmax and max.xorsign.abs from 0;
PTX max without .NaN returns the input that is not NaN), float_to_e8m0 and exp2f_rcp of
common/util/ptx.cuh:356-418.
"""

import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lscore import _reference_mx as ref
from lscore import kernels

ml_dtypes = pytest.importorskip("ml_dtypes")

DATA = np.load(pathlib.Path(__file__).parents[1] / "core" / "data" / "torchao_mx_4725.npz")
ELEMS = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1"}
TAO = ("floor", "ceil", "even", "rceil")
NAN_E4M3 = 0x7F  # +NaN, as torch and TE's satfinite cast write it


@pytest.fixture(params=kernels.isa_levels())
def isa(request):
    old = kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa(old)


def row(first, rest=1.0, n=32):
    x = np.full((1, n), rest, np.float32)
    x[0, : len(first)] = first
    return x


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("elem", list(ELEMS))
@pytest.mark.parametrize("mode", TAO)
def test_blocks_equal_torchao_after_4725(isa, dtype, elem, mode):
    """Every recorded block, byte for byte, under mode + "-4725"; the pinned mode (torchao
    v0.18.0) differs from it on some of them, so the recording exercises the change."""
    x = DATA[f"{dtype}_x"].view(np.float32 if dtype == "f32" else ml_dtypes.bfloat16)
    want_s = DATA[f"{dtype}_{elem}_{mode}_scale"]
    want_q = DATA[f"{dtype}_{elem}_{mode}_data"]
    s, q = kernels.mx_quantize(x, ELEMS[elem], f"{mode}-4725")
    np.testing.assert_array_equal(s[:, 0], want_s)
    np.testing.assert_array_equal(q, want_q)
    s0, q0 = kernels.mx_quantize(x, ELEMS[elem], mode)
    assert ((s0[:, 0] != want_s) | (q0 != want_q).any(axis=1)).sum() >= 10
    if isa == kernels.isa_levels()[0]:
        rs, rq = ref.mx_quantize(x.astype(np.float32), ELEMS[elem], f"{mode}-4725")
        np.testing.assert_array_equal(rs[:, 0], want_s)
        np.testing.assert_array_equal(rq, want_q)


def test_rceil_4725_by_hand(isa):
    """_to_mx_rceil after #4725, e4m3fn (max 448): descale = amax * float32(1 / 448);
    its code the biased exponent, + 1 for a non-zero mantissa (a subnormal: above
    0x400000); elements times the code's E8M0 reciprocal, unclamped."""
    # Inf: _f32_to_e8m0_rceil gives 255, the reciprocal is torch's NaN: every element NaN
    # (v0.18.0: 254, the Inf times 2**-127 saturating to 448, the rest 0)
    inf = row([np.inf])
    s, q = kernels.mx_quantize(inf, "float8_e4m3fn", "rceil-4725")
    assert s[0, 0] == 255 and np.all(q == NAN_E4M3)
    s, q = kernels.mx_quantize(inf, "float8_e4m3fn", "rceil")
    assert s[0, 0] == 254 and q[0, 0] == 0x7E and np.all(q[0, 1:] == 0)
    # a tiny block: amax 7 * 2**-124 = 448 * 2**-130, descale 2**-130 (0x00080000, exponent
    # 0, mantissa <= 0x400000): code 0, whose reciprocal is 2**127, so the element is 56
    # (e4m3fn 0x66); v0.18.0 multiplied code 0's block by 1.0, flushing it to 0
    tiny = row([7 * 2.0**-124], 0.0)
    s, q = kernels.mx_quantize(tiny, "float8_e4m3fn", "rceil-4725")
    assert s[0, 0] == 0 and q[0, 0] == 0x66 and np.all(q[0, 1:] == 0)
    s, q = kernels.mx_quantize(tiny, "float8_e4m3fn", "rceil")
    assert s[0, 0] == 0 and np.all(q == 0)
    # the float32 after 448 * 2**20: descale 2**20 * (1 + 2**-23), so 2**21 (code 148);
    # v0.18.0's float32 log2 of it rounds to 20 (code 147)
    a = np.nextafter(np.float32(448 * 2.0**20), np.float32(np.inf))
    assert kernels.mx_scale(a, "float8_e4m3fn", "rceil-4725") == 148
    assert kernels.mx_scale(a, "float8_e4m3fn", "rceil") == 147


@pytest.mark.parametrize("mode", ["floor", "ceil", "even"])
def test_floor_ceil_even_4725_by_hand(isa, mode):
    """to_mx after #4725: an Inf or NaN amax gives the NaN scale 255 and every element NaN
    (v0.18.0: Inf a finite 247 for e4m3fn, NaN only the NaN element); a block below
    2**-126 is multiplied by 2**127 (v0.18.0: divided by 2**-126), so it reads back whole."""
    m = f"{mode}-4725"
    for special in (np.inf, np.nan):
        s, q = kernels.mx_quantize(row([special]), "float8_e4m3fn", m)
        assert s[0, 0] == 255 and np.all(q == NAN_E4M3)
    s, q = kernels.mx_quantize(row([np.inf]), "float8_e4m3fn", mode)
    assert s[0, 0] == 247 and q[0, 0] == 0x7E and np.all(q[0, 1:] == 0)
    s, q = kernels.mx_quantize(row([np.nan]), "float8_e4m3fn", mode)
    assert s[0, 0] == 255 and q[0, 0] == NAN_E4M3 and np.all(q[0, 1:] == 0)
    tiny = np.full((1, 32), 2.0**-130, np.float32)  # floor(log2) - 8 = -138: code 0
    s, q = kernels.mx_quantize(tiny, "float8_e4m3fn", m)
    assert s[0, 0] == 0 and np.all(q == 0x20)  # 2**-3
    s, q = kernels.mx_quantize(tiny, "float8_e4m3fn", mode)
    assert s[0, 0] == 0 and np.all(q == 0x18)  # 2**-4
    # FLT_MAX: EVEN rounds it to the next power of two, Inf, so 255 (v0.18.0: 247); FLOOR
    # keeps its exponent, 127 - 8 (246: the element 511.99 saturates to 448), CEIL rounds
    # it up (247: 255.99 rounds to 256, 0x78)
    flt_max = row([np.finfo(np.float32).max])
    s, q = kernels.mx_quantize(flt_max, "float8_e4m3fn", m)
    if mode == "even":
        assert s[0, 0] == 255 and np.all(q == NAN_E4M3)
        assert kernels.mx_scale(flt_max[0, :1], "float8_e4m3fn", mode)[0] == 247
    else:
        assert (s[0, 0], q[0, 0]) == {"floor": (246, 0x7E), "ceil": (247, 0x78)}[mode]


def test_te_3262_quantizes_as_te(isa):
    """NVIDIA/TransformerEngine#3262 changed only ptx::exp2f, which the MXFP8 dequantize
    reads; the cast kernels are v2.18's."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 64)) * 2.0 ** rng.integers(-140, 120, (64, 64))).astype(
        np.float32
    )
    x[0, 3], x[1, :32], x[2, 5], x[:32, 7] = np.nan, np.nan, np.inf, np.nan
    for elem in ("float8_e4m3fn", "float8_e5m2"):
        for axis in (-1, 0):
            for got, want in zip(
                kernels.mx_quantize(x, elem, "te-3262", axis=axis),
                kernels.mx_quantize(x, elem, "te", axis=axis),
                strict=True,
            ):
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16", np.float16])
@pytest.mark.parametrize("mode", ["te", "te-3262"])
def test_te_amax_leaves_nan_out(isa, dtype, mode):
    """TE's block amax is fmaxf / __hmax / max.xorsign.abs from 0, which return the input
    that is not NaN: [NaN, 3, 1, ...] has amax 3, scale 120 (3 / 448 rounded up to 2**-7),
    the NaN element 0x7F and 3 -> 384 (0x7C), 1 -> 128 (0x70); an all-NaN block has amax
    0, scale 0 and every element NaN; Inf beside a NaN still gives 0xFE.  The same along
    either axis, from float32, float16 and bfloat16 (x86-64-v4's 16-bit lanes)."""
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    x = np.ones((4, 64), np.float32)
    x[0, :2] = (np.nan, 3.0)
    x[0, 32:34] = (-np.nan, -3.0)
    x[1, :32] = np.nan
    x[2, :3] = (np.nan, np.inf, 1.0)
    x[3, :] = np.linspace(-2, 2, 64)
    want_s = np.array([[120, 120], [0, 119], [254, 119], [120, 120]], np.uint8)
    x = x.astype(dt)
    for axis in (-1, 0):
        a = x if axis == -1 else np.ascontiguousarray(np.tile(x.T, (1, 8)))
        s, q = kernels.mx_quantize(a, "float8_e4m3fn", mode, axis=axis)
        if axis == 0:  # the first 4 columns are x's rows: blocks of 32 down them
            s, q = s[:, :4].T, q[:, :4].T
        np.testing.assert_array_equal(s, want_s)
        assert q[0, 0] == q[0, 32] == NAN_E4M3
        assert q[0, 1] == 0x7C and q[0, 33] == 0xFC and q[0, 2] == 0x70
        assert np.all(q[1, :32] == NAN_E4M3)
        assert tuple(q[2, :3]) == (NAN_E4M3, 0x7E, 0)
        a32 = np.asarray(a, np.float32)
        ws, wq = ref.mx_quantize(a32.T if axis == 0 else a32, "float8_e4m3fn", mode)
        got = kernels.mx_quantize(a, "float8_e4m3fn", mode, axis=axis)
        np.testing.assert_array_equal(got[0], ws.T if axis == 0 else ws)
        np.testing.assert_array_equal(got[1], wq.T if axis == 0 else wq)


def special_values():
    """Zero, NaN, Inf, subnormals, float32's largest, and powers of two with their float32
    neighbours around each format's largest value times 2**k: where the rules part."""
    out = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, 2.0**-127, 2.0**-126]
    out += [float(np.finfo(np.float32).max), 3.3e38]
    for top in (6.0, 448.0, 57344.0, 1.0):
        for k in (-140, -130, -127, -8, 0, 20, 118, 120):
            with np.errstate(over="ignore"):
                p = np.float32(top * 2.0**k)
            out += [p, np.nextafter(p, np.float32(np.inf)), np.nextafter(p, np.float32(0))]
    return np.array(out, np.float32)


def test_scale_rules_equal_twin_at_special_amaxes():
    amax = np.abs(special_values())
    for elem in ELEMS.values():
        for mode in kernels.MX_MODES:
            np.testing.assert_array_equal(
                kernels.mx_scale(amax, elem, mode), ref.mx_scale(amax, elem, mode), err_msg=mode
            )


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=128, max_size=128), st.booleans())
def test_special_blocks_equal_twin_at_every_level(picks, bf16):
    """Blocks drawn from the special values (NaN and Inf among finite ones, whole NaN
    blocks): every mode and element format, both axes, every ISA level, the twin's bytes."""
    pool = special_values()
    x = pool[np.array(picks) % len(pool)].reshape(4, 32)
    x = np.concatenate([x, x[::-1] * np.float32(0.75)], axis=0).reshape(8, 32)
    x = np.tile(x, (4, 2))  # 32 x 64: whole blocks along either axis
    if bf16:
        x = x.astype(ml_dtypes.bfloat16)
    x32 = np.asarray(x, np.float32)
    for level in kernels.isa_levels():
        old = kernels.set_isa(level)
        try:
            for elem in ELEMS.values():
                for mode in kernels.MX_MODES:
                    for axis in (-1, 0):
                        s, q = kernels.mx_quantize(x, elem, mode, axis=axis)
                        ws, wq = ref.mx_quantize(x32.T if axis == 0 else x32, elem, mode)
                        msg = f"{level} {elem} {mode} {axis}"
                        np.testing.assert_array_equal(s, ws.T if axis == 0 else ws, err_msg=msg)
                        np.testing.assert_array_equal(q, wq.T if axis == 0 else wq, err_msg=msg)
        finally:
            kernels.set_isa(old)
