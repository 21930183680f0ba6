"""The block-scaled formats' rules of lsc_mx.h (lscore.kernels.mx_* / nvfp4_* / e8m0_* /
e2m1_*) against the slow NumPy twin and against torchao 0.18.0's own outputs, recorded on
the CPU by tests/core/data/record_torchao_mx.py into torchao_mx.npz.

Every recorded block must come out of the kernels and of the twin byte for byte, NaN
blocks included; where torchao departs from the rule it names, its mode reproduces
torchao and the exact rule does not, asserted both ways.
"""

import math
import pathlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lscore import _reference_fp8 as ref8
from lscore import _reference_mx as ref
from lscore import kernels

ml_dtypes = pytest.importorskip("ml_dtypes")

DATA = np.load(pathlib.Path(__file__).parents[1] / "core" / "data" / "torchao_mx.npz")
ELEMS = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1"}
TAO_MODES = ("floor", "ceil", "even", "rceil")
MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "float4_e2m1": 6.0}


def inputs(dtype, kind):
    x = DATA[f"{dtype}_{kind}_x"]
    if dtype == "f32":
        return x.view(np.float32)
    return x.view(ml_dtypes.bfloat16)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("elem", list(ELEMS))
@pytest.mark.parametrize("mode", TAO_MODES)
def test_mx_blocks_equal_torchao(dtype, elem, mode):
    x = inputs(dtype, "mx")
    want_s = DATA[f"{dtype}_{elem}_{mode}_scale"][:, 0]
    want_q = DATA[f"{dtype}_{elem}_{mode}_data"]
    s, q = kernels.mx_quantize(x, ELEMS[elem], mode)
    np.testing.assert_array_equal(s[:, 0], want_s)
    np.testing.assert_array_equal(q, want_q)
    rs, rq = ref.mx_quantize(x.astype(np.float32), ELEMS[elem], mode)
    np.testing.assert_array_equal(rs[:, 0], want_s)
    np.testing.assert_array_equal(rq, want_q)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_nvfp4_blocks_equal_torchao(dtype):
    x = inputs(dtype, "nv")
    for got in (kernels.nvfp4_quantize(x), ref.nvfp4_quantize(x.astype(np.float32))):
        np.testing.assert_array_equal(got[0][:, 0], DATA[f"{dtype}_nvfp4_scale"][:, 0])
        np.testing.assert_array_equal(got[1], DATA[f"{dtype}_nvfp4_data"])
    pts = DATA[f"{dtype}_nvfp4_pts"].view(np.float32)
    for g, p in enumerate(pts):
        xs = x[g * 8 : (g + 1) * 8]
        want = (
            DATA[f"{dtype}_nvfp4_pts_scale"][g * 8 : (g + 1) * 8, 0],
            DATA[f"{dtype}_nvfp4_pts_data"][g * 8 : (g + 1) * 8],
        )
        amax = np.float32(np.max(np.abs(xs.astype(np.float32))))
        for tensor_scale in (kernels.nvfp4_tensor_scale, ref.nvfp4_tensor_scale):
            np.testing.assert_array_equal(np.float32(tensor_scale(amax)), p)
        for got in (kernels.nvfp4_quantize(xs, p), ref.nvfp4_quantize(xs.astype(np.float32), p)):
            np.testing.assert_array_equal(got[0][:, 0], want[0])
            np.testing.assert_array_equal(got[1], want[1])


def exact_rceil(amax, top):
    """The biased exponent of the least power of two >= amax / top, exactly."""
    q = Fraction(float(amax)) / Fraction(top)
    k = math.floor(math.log2(q)) - 1
    while Fraction(2) ** k < q:
        k += 1
    return min(max(k, -127), 127) + 127


@pytest.mark.parametrize("elem", list(ELEMS))
def test_rceil_log2_quirk_is_torchao_only(elem):
    """torchao's RCEIL takes ceil(log2(amax / max)) in float32: a maximum just above
    max * 2**k gets k.  The recorded blocks where that departs from the exact rule are
    reproduced by 'rceil' and not by 'te', which follows the exact rule there."""
    x = inputs("f32", "mx")
    amax = np.max(np.abs(x), axis=1)
    rec = DATA[f"f32_{elem}_rceil_scale"][:, 0]
    finite = np.isfinite(amax) & (amax > 0)
    exact = np.array(
        [exact_rceil(a, MAX[ELEMS[elem]]) if f else 0 for a, f in zip(amax, finite, strict=True)]
    )
    departs = finite & (exact != rec)
    assert departs.sum() >= 10  # the recorded neighbours of max * 2**k
    assert np.all(rec[departs] == exact[departs] - 1)
    np.testing.assert_array_equal(
        kernels.mx_scale(amax[departs], ELEMS[elem], "rceil"), rec[departs]
    )
    np.testing.assert_array_equal(
        kernels.mx_scale(amax[departs], ELEMS[elem], "te"), exact[departs]
    )


def test_torchao_departures_from_ocp_rule():
    """FLOOR as torchao runs it: an Inf block gets the finite scale 247 (E4M3), a block with
    one NaN one NaN element (RCEIL: all 32), and a tiny block dequantizes to half."""
    x = inputs("f32", "mx")
    inf_row = int(np.flatnonzero(np.all(np.isinf(x), axis=1))[0])
    assert DATA["f32_e4m3fn_floor_scale"][inf_row, 0] == 247
    assert kernels.mx_scale(np.float32(np.inf), "float8_e4m3fn", "floor") == 247
    assert kernels.mx_scale(np.float32(np.inf), "float8_e4m3fn", "te") == 0xFE
    one_nan = int(np.flatnonzero(np.isnan(x).sum(axis=1) == 1)[0])
    nan_codes = {0x7F, 0xFF}
    for mode, count in (("floor", 1), ("rceil", 32)):
        q = DATA[f"f32_e4m3fn_{mode}_data"][one_nan]
        assert np.isin(q, list(nan_codes)).sum() == count
        assert (
            np.isin(
                kernels.mx_quantize(x[one_nan], "float8_e4m3fn", mode)[1], list(nan_codes)
            ).sum()
            == count
        )
    tiny = np.full(32, 2.0**-130, np.float32)
    s, q = kernels.mx_quantize(tiny, "float8_e4m3fn", "floor")
    assert s[0] == 0
    back = kernels.e8m0_decode(s)[0].astype(np.float64) * ref8.fp8_decode(q, "float8_e4m3fn")
    np.testing.assert_array_equal(back, tiny.astype(np.float64) / 2)


def test_nvfp4_block_scale_clamped():
    """NVFP4 block scales stay in [2**-6, 448]: a tiny block gets 2**-6 (code 0x08)."""
    s, q = kernels.nvfp4_quantize(np.full(16, 1e-6, np.float32))
    assert s[0] == 0x08
    assert np.all(q == 0)
    s, _ = kernels.nvfp4_quantize(np.full(16, 1e6, np.float32))
    assert s[0] == 0x7E


def test_e8m0_codes():
    c = np.arange(256, dtype=np.uint8)
    got, want = kernels.e8m0_decode(c), ref.e8m0_decode(c)
    np.testing.assert_array_equal(got[:255].view(np.uint32), want[:255].view(np.uint32))
    assert np.isnan(got[255]) and np.isnan(want[255])
    assert got[0] == 2.0**-127 and got[127] == 1.0 and got[254] == 2.0**127
    np.testing.assert_array_equal(kernels.e8m0_encode(got[:255]), c[:255])
    bad = np.array([0.0, 3.0, -1.0, np.inf, np.nan, 2.0**-128, 1.5], np.float32)
    assert np.all(kernels.e8m0_encode(bad) == 0xFF)


def test_e2m1_codes():
    c = np.arange(16, dtype=np.uint8)
    vals = kernels.e2m1_decode(c)
    np.testing.assert_array_equal(vals, ref.e2m1_decode(c))
    np.testing.assert_array_equal(vals[:8], [0, 0.5, 1, 1.5, 2, 3, 4, 6])
    np.testing.assert_array_equal(kernels.e2m1_encode(vals), c)
    # ties to even, saturation, signed zero
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, np.inf, -0.0, -5.5], np.float32)
    np.testing.assert_array_equal(kernels.e2m1_encode(x), [0, 2, 2, 4, 4, 6, 6, 7, 7, 8, 15])


def f32s(n):
    return st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n).map(
        lambda b: np.array(b, np.uint64).astype(np.uint32).view(np.float32)
    )


@settings(max_examples=60, deadline=None)
@given(f32s(64))
def test_scalar_rules_equal_twin(x):
    with np.errstate(invalid="ignore"):
        amax = np.abs(x)
    for elem in ELEMS.values():
        for mode in kernels.MX_MODES:
            np.testing.assert_array_equal(
                kernels.mx_scale(amax, elem, mode), ref.mx_scale(amax, elem, mode), err_msg=mode
            )
    np.testing.assert_array_equal(kernels.e2m1_encode(x), ref.e2m1_encode(x))


def test_rceil_near_powers_of_two_equals_twin():
    """RCEIL's exponent comes from the bits of amax / max except where a float32 logarithm
    can round onto the power of two below (the quotient's mantissa under 2**7): quotients
    2**k * (1 + m / 2**23) around that edge, at every exponent and in the subnormals,
    give the twin's codes (which take the logarithm of each)."""
    mant = np.array([0, 1, 2, 63, 126, 127, 128, 129, 255, 256, 2**22, 2**23 - 1], np.uint32)
    expo = np.arange(0, 255, dtype=np.uint32)
    d = ((expo[:, None] << 23) | mant[None, :]).ravel().view(np.float32)
    for elem in ELEMS.values():
        with np.errstate(over="ignore"):
            amax = (d * np.float32(MAX[elem])).astype(np.float32)
        for a in (amax, np.nextafter(amax, np.float32(0)), np.nextafter(amax, np.float32(np.inf))):
            np.testing.assert_array_equal(
                kernels.mx_scale(a, elem, "rceil"), ref.mx_scale(a, elem, "rceil"), err_msg=elem
            )


@settings(max_examples=40, deadline=None)
@given(f32s(64), st.integers(-140, 127), st.booleans())
def test_blocks_equal_twin(bits, shift, has_pts):
    with np.errstate(over="ignore", invalid="ignore"):
        x = (bits * np.float32(2.0**-100)).astype(np.float32) if shift < 0 else bits
    x = x.reshape(2, 32)
    for elem in ELEMS.values():
        for mode in kernels.MX_MODES:
            got, want = kernels.mx_quantize(x, elem, mode), ref.mx_quantize(x, elem, mode)
            np.testing.assert_array_equal(got[0], want[0], err_msg=f"{elem} {mode}")
            np.testing.assert_array_equal(got[1], want[1], err_msg=f"{elem} {mode}")
    pts = np.float32(2.0 ** (shift // 4)) if has_pts else None
    got, want = kernels.nvfp4_quantize(x, pts), ref.nvfp4_quantize(x, pts)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_bad_input():
    x = np.zeros(48, np.float32)
    with pytest.raises(ValueError, match="multiple of 32"):
        kernels.mx_quantize(x, "float8_e4m3fn", "floor")
    with pytest.raises(ValueError, match="multiple of 16"):
        kernels.nvfp4_quantize(np.zeros(24, np.float32))
    with pytest.raises(ValueError, match="mode must be one of"):
        kernels.mx_scale(x, "float8_e4m3fn", "nearest")
    with pytest.raises(ValueError, match="elem must be one of"):
        kernels.mx_quantize(x[:32], "int8", "floor")


MX_KERNEL = r"""
#include "lsc_mx.h"
extern "C" __global__ void mx_probe(const float *x, unsigned char *q, unsigned char *s, float *f)
{
    s[0] = (unsigned char)lsc_mx_block(x, 32, LSC_CODE_E4M3FN, LSC_MX_RCEIL, q);
    s[1] = (unsigned char)lsc_mx_block(x, 32, LSC_MX_E2M1, LSC_MX_TE, q + 32);
    s[2] = (unsigned char)lsc_nvfp4_block(x, 16, 1, lsc_nvfp4_tensor_scale(x[0]), q + 48);
    f[0] = lsc_e8m0_to_f32(lsc_e8m0_from_f32(x[1])) + lsc_e2m1_to_f32(lsc_e2m1_from_f32(x[2]));
}
"""


@pytest.mark.parametrize("arch", ["75", "90"])
def test_header_compiles_with_nvrtc(cupy_compiler, arch):
    """lsc_mx.h is CUDA as well as C: NVRTC compiles its functions without a diagnostic."""
    import io

    from lscore.cuda import nvrtc

    log = io.StringIO()
    include = str(pathlib.Path(__file__).parents[2] / "_ext")
    cupy_compiler.compile_using_nvrtc(
        MX_KERNEL,
        options=(*nvrtc.NVRTC_OPTIONS, f"--include-path={include}"),
        arch=arch,
        filename="mx_probe.cu",
        name_expressions=["mx_probe"],
        log_stream=log,
    )
    assert log.getvalue().rstrip("\x00 \n") == ""


@settings(max_examples=60, deadline=None)
@given(f32s(64))
def test_te_rule_rounds_the_float32_descale_up(x):
    """TransformerEngine's rule, from its source (ptx.cuh float_to_e8m0): the descale
    amax * float32(1 / max), a float32 product, rounded up to a power of two 2**(c - 127),
    c at most 0xFE and at least 0 (a descale <= 2**-127 gives 0); NaN 0xFF, Inf 0xFE."""
    amax = np.abs(x)
    for elem, top in MAX.items():
        got = kernels.mx_scale(amax, elem, "te")
        with np.errstate(over="ignore", invalid="ignore"):
            descale = amax * np.float32(1 / top)
        for d, c in zip(descale.tolist(), got.tolist(), strict=True):
            if math.isnan(d):
                assert c == 0xFF
            elif math.isinf(d):
                assert c == 0xFE
            else:
                k = -127
                while k < 127 and Fraction(2) ** k < Fraction(d):
                    k += 1
                assert c == k + 127, (d, c)


@pytest.mark.parametrize("elem", list(ELEMS.values()))
def test_ocp_mode_departs_from_torchao_floor(elem):
    """'ocp' is the OCP rule as microxcaling computes it and 'floor' torchao's FLOOR: the
    same scale for finite blocks, but a tiny block dequantizes exactly under 'ocp' (divided
    by 2**-127, not torchao's 2**-126) and an Inf block gets the NaN scale 0xFF (torchao:
    the finite 128 - emax + 127) with every element NaN."""
    decode = ref.e2m1_decode if elem == "float4_e2m1" else (lambda q: ref8.fp8_decode(q, elem))

    def back(s, q):
        if elem == "float4_e2m1":
            q = np.stack([q & 15, q >> 4], axis=-1).reshape(len(q), -1)
        return kernels.e8m0_decode(s).astype(np.float64) * decode(q).astype(np.float64)

    tiny = np.full((1, 32), 2.0**-126, np.float32)
    tiny[0, 1::2] = -(2.0**-127)
    for mode, factor in (("ocp", 1.0), ("floor", 0.5)):
        s, q = kernels.mx_quantize(tiny, elem, mode)
        assert s[0, 0] == 0
        np.testing.assert_array_equal(back(s, q), tiny.astype(np.float64) * factor)
    inf = np.linspace(-3, 3, 32, dtype=np.float32)[None]
    inf[0, 5] = np.inf
    s_ocp, q_ocp = kernels.mx_quantize(inf, elem, "ocp")
    s_floor, _ = kernels.mx_quantize(inf, elem, "floor")
    assert s_ocp[0, 0] == 0xFF
    assert s_floor[0, 0] == 128 - ref._MX_ELEMS[elem][0] + 127
    assert np.all(np.isnan(back(s_ocp, q_ocp)))
    np.testing.assert_array_equal(
        q_ocp, kernels.mx_quantize(np.full((1, 32), np.nan, np.float32), elem, "ocp")[1]
    )
    # finite blocks, zero included: the same scale and codes under both
    x = np.concatenate([np.zeros(32), np.linspace(-1e3, 7e2, 32), 2.0 ** np.arange(-60, -28)])
    x = x.astype(np.float32).reshape(3, 32)
    for got, want in zip(
        kernels.mx_quantize(x, elem, "ocp"), kernels.mx_quantize(x, elem, "floor"), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    assert kernels.mx_scale(np.float32(0), elem, "ocp") == 0
    assert kernels.mx_scale(np.float32(np.nan), elem, "ocp") == 0xFF


@pytest.mark.parametrize("elem", ["float8_e4m3fn", "float8_e5m2"])
def test_te_elements_use_v2_18_reciprocal(elem):
    """TransformerEngine v2.18 multiplies a block by exp2f_rcp(code) (ptx.cuh): NaN for
    the NaN scale 0xFF, 2**-127 for 0xFE and the bits (254 - code) << 23 otherwise, 2**127
    for code 0; the cast then saturates and writes NaN as 0x7F.  Its block amax leaves a
    NaN out (fmaxf from 0), so a NaN element is NaN (0x7F) among codes scaled by the
    others, an Inf element becomes the format's largest value (its finite neighbours
    round to 0), and a block whose descale rounds to code 0 keeps its values."""
    top = MAX[elem]
    nan = np.linspace(-1, 1, 32, dtype=np.float32)[None]
    nan[0, 3] = -np.nan
    s, q = kernels.mx_quantize(nan, elem, "te")
    finite = np.arange(32) != 3
    assert s[0, 0] == kernels.mx_scale(np.float32(1.0), elem, "te")
    assert q[0, 3] == 0x7F
    np.testing.assert_array_equal(
        q[0, finite], kernels.mx_quantize(np.where(finite, nan, 0), elem, "te")[1][0, finite]
    )
    inf = np.linspace(-1, 1, 32, dtype=np.float32)[None]
    inf[0, 7] = np.inf
    s, q = kernels.mx_quantize(inf, elem, "te")
    back = ref8.fp8_decode(q, elem)
    assert s[0, 0] == 0xFE
    assert back[0, 7] == top
    assert np.all(back[0, np.arange(32) != 7] == 0)
    tiny = np.zeros((1, 32), np.float32)
    tiny[0, 0] = np.float32(top * 2.0**-128)
    tiny[0, 1] = -tiny[0, 0]
    s, q = kernels.mx_quantize(tiny, elem, "te")
    assert s[0, 0] == 0
    np.testing.assert_array_equal(ref8.fp8_decode(q, elem)[0, :2], [top / 2, -top / 2])
    for got, want in zip(
        kernels.mx_quantize(np.concatenate([nan, inf, tiny]), elem, "te"),
        ref.mx_quantize(np.concatenate([nan, inf, tiny]), elem, "te"),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)
