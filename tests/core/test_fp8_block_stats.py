"""lscore.fp8.block_stats: the statistics of a block-scaled quantize (MX, NVFP4) equal what a
slow element-by-element twin counts from the NumPy reference quantize, on worked cases and on
generated inputs (zeros, NaN, Inf, subnormals, huge and tiny blocks); its table; bad input."""

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

import lscore.fp8 as F
from lscore import _reference_fp8 as ref8
from lscore import _reference_mx as ref

ml_dtypes = pytest.importorskip("ml_dtypes")

ELEMS = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1"}
# the preset of each scale rule
PRESET = {
    "ocp": "ocp-mx",
    "te": "te-mxfp8",
    **{m: f"torchao-mx-{m}" for m in ("floor", "ceil", "even", "rceil")},
    "nvfp4": "nvfp4",
}
TOP = {"e4m3fn": 448, "e5m2": 57344, "e2m1": 6}
# the smallest |x / scale| that rounds above the largest value (exact rationals)
ROUNDS_ABOVE = {"e4m3fn": Fraction(464), "e5m2": Fraction(61440), "e2m1": Fraction(7)}


def element_values(codes, element):
    """The value of each element code, one code at a time (E2M1 unpacked low nibble first)."""
    out = []
    for c in np.asarray(codes).reshape(-1).tolist():
        if element == "e2m1":
            out += [
                float(ref.e2m1_decode(np.uint8(c & 0xF))),
                float(ref.e2m1_decode(np.uint8(c >> 4))),
            ]
        else:
            out.append(float(ref8.fp8_decode(np.uint8(c), ELEMS[element])))
    return out


def floor_log2(q):
    """floor(log2(q)) of a positive rational, exactly."""
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    return e


def blocks_of(a, block):
    """Each block of a (along its last axis) as its elements; a partial last block as is."""
    for line in a.reshape(-1, a.shape[-1]):
        for i in range(0, line.size, block):
            yield line[i : i + block]


def slow_stats(x, element, mode, block, axis=-1):
    """The twin: each block quantized on its own by the NumPy reference (a partial block
    padded with zeros), each element looked at on its own in exact rational arithmetic."""
    a = np.asarray(x).astype(np.float32)  # float16 / bfloat16 widen exactly
    if axis == 0:
        a = a.T
    pts = None
    if mode == "nvfp4":
        pts = ref.nvfp4_tensor_scale(np.float32(np.max(np.abs(a))))
    hist, nan_scales, sat, flushed, nonzero, nan, inf = Counter(), 0, 0, 0, 0, 0, 0
    for row in blocks_of(np.ascontiguousarray(a), block):
        padded = np.zeros(block, np.float32)
        padded[: row.size] = row
        if mode == "nvfp4":
            s, q = ref.nvfp4_quantize(padded[None], pts)
            scale = float(ref8.fp8_decode(s.reshape(-1), "float8_e4m3fn")[0])
        else:
            s, q = ref.mx_quantize(padded[None], ELEMS[element], mode, block)
            scale = float(ref.e8m0_decode(s.reshape(-1))[0])
        if not math.isnan(scale) and scale != 0:
            hist[floor_log2(Fraction(scale))] += 1
        nan_scales += math.isnan(scale)
        if pts is not None:
            scale = scale * pts
        for v, got in zip(row.tolist(), element_values(q, element)[: row.size], strict=False):
            nan += math.isnan(v)
            inf += math.isinf(v)
            if not math.isfinite(v) or math.isnan(scale):
                continue
            if (
                abs(got) == TOP[element]
                and Fraction(abs(v)) / Fraction(scale) >= ROUNDS_ABOVE[element]
            ):
                sat += 1
            if v != 0:
                nonzero += 1
                flushed += got == 0
    return dict(hist), nan_scales, sat, flushed, nonzero, nan, inf, pts


def check(x, element, mode, block, axis=-1):
    got = F.block_stats(x, PRESET[mode], axis=axis, element=element)
    assert got.recipe == PRESET[mode] and got.block == block
    hist, nan_scales, sat, flushed, nonzero, nan, inf, pts = slow_stats(
        x, element, mode, block, axis
    )
    assert got.exponents == hist
    assert (got.nan_scales, got.saturated, got.flushed, got.nonzero) == (
        nan_scales,
        sat,
        flushed,
        nonzero,
    )
    assert (got.nan, got.posinf + got.neginf) == (nan, inf)
    assert got.tensor_scale == (None if pts is None else pts) or (
        math.isnan(got.tensor_scale) and math.isnan(pts)
    )
    lines = np.asarray(x).size // np.shape(x)[axis]
    assert got.blocks == lines * -(-np.shape(x)[axis] // block) and got.size == np.asarray(x).size
    return got


def generated(rng, n, block, dtype=np.float32):
    """Blocks of every kind: normal values of random magnitude per block, all-zero, a NaN,
    an Inf, subnormal and tiny maxima, maxima next to powers of two, huge maxima."""
    rows = []
    for _ in range(n // block):
        kind = rng.integers(9)
        v = rng.standard_normal(block) * 2.0 ** rng.integers(-20, 20)
        if kind == 0:
            v[:] = 0
        elif kind == 1:
            v[rng.integers(block)] = np.nan
        elif kind == 2:
            v[rng.integers(block)] = rng.choice([np.inf, -np.inf])
        elif kind == 3:
            v = rng.standard_normal(block) * 2.0**-140  # subnormal float32
        elif kind == 4:
            v = rng.standard_normal(block) * 2.0**-120  # where the floor rules' divisor clamps
        elif kind == 5:
            v = rng.standard_normal(block) * 2.0**120
        elif kind == 6:  # a maximum a few ulps from a power of two, times the element's max
            v[0] = np.nextafter(
                np.float32(2.0 ** rng.integers(-30, 30)), np.float32(rng.choice([0, np.inf]))
            )
        elif kind == 7:  # spread over many binades: the small ones flush
            v = rng.choice([-1.0, 1.0], block) * 2.0 ** rng.uniform(-30, 0, block)
        rows.append(v)
    with np.errstate(over="ignore"):  # float16 holds 2**120 as Inf: one more Inf block
        return np.concatenate(rows).astype(np.float32).astype(dtype)


def test_floor_saturates_where_rceil_does_not():
    """floor(log2 1.9) - 8 = -8: 1.9 * 256 = 486.4 rounds above 448; TE's rule takes 2**-7."""
    x = np.ones(32, np.float32)
    x[3] = 1.9
    floor = check(x, "e4m3fn", "floor", 32)
    assert floor.exponents == {-8: 1} and floor.saturated == 1
    assert floor.saturated_fraction == 1 / 32
    te = check(x, "e4m3fn", "te", 32)
    assert te.exponents == {-7: 1} and te.saturated == 0


def test_flushed_counts_the_elements_written_as_zero():
    """Scale 1 (amax 448): 2**-10 is half the smallest e4m3 subnormal and rounds to 0 (the tie
    to even), just above it rounds to 2**-9."""
    x = np.zeros(32, np.float32)
    x[0] = 448
    x[1] = 2.0**-10
    x[2] = np.nextafter(np.float32(2.0**-10), np.float32(1))
    x[3] = -(2.0**-12)
    s = check(x, "e4m3fn", "floor", 32)
    assert (s.exponents, s.flushed, s.nonzero) == ({0: 1}, 2, 4)
    assert s.flushed_fraction == 0.5


def test_nvfp4_histogram_is_of_the_e4m3_block_scales():
    """With the tensor scale 6 / 2688, a block of 6.0 has the E4M3 scale 448 (exponent 8),
    a block of 0.75 the scale 56 (exponent 5)."""
    x = np.concatenate([np.full(16, 6.0), np.full(16, 0.75)]).astype(np.float32)
    s = check(x, "e2m1", "nvfp4", 16)
    assert s.exponents == {8: 1, 5: 1}
    assert s.tensor_scale == np.float32(6.0) / np.float32(2688.0)
    assert (s.scale_format, s.element, s.block) == ("e4m3fn", "e2m1", 16)
    assert s.saturated == s.flushed == 0


def test_a_nan_scale_loses_its_block():
    """torchao's FLOOR gives a NaN block the scale 0xFF; its other elements are not counted
    as flushed though their bytes are zero."""
    x = np.ones(64, np.float32)
    x[5] = np.nan
    s = check(x, "e4m3fn", "floor", 32)
    assert (s.nan_scales, s.nan, s.flushed, s.nonzero) == (1, 1, 0, 32)
    assert s.exponents == {-8: 1}


@pytest.mark.parametrize("element", list(ELEMS))
@pytest.mark.parametrize("mode", ["ocp", "floor", "ceil", "even", "rceil", "te"])
def test_mx_equals_the_twin(element, mode):
    if mode == "te" and element == "e2m1":
        pytest.skip("te-mxfp8 quantizes to float8 only (TE's 4-bit format is NVFP4)")
    rng = np.random.default_rng(35)
    check(generated(rng, 32 * 60, 32), element, mode, 32)


@pytest.mark.parametrize("element", ["e4m3fn", "e2m1"])
def test_a_padded_partial_block_equals_the_twin(element):
    """ocp-mx scales a last partial block from its own elements (zero-padded)."""
    rng = np.random.default_rng(38)
    x = generated(rng, 32 * 12, 32).reshape(12, 32)[:, :21]
    s = check(x, element, "ocp", 32)
    assert s.blocks == 12
    check(np.ascontiguousarray(x[:, :20].T), element, "ocp", 32, axis=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_nvfp4_and_dtypes_equal_the_twin(dtype):
    rng = np.random.default_rng(36)
    x = generated(rng, 16 * 80, 16, dtype)
    x = x[np.isfinite(x.astype(np.float32))]  # one NaN would make every scale NaN
    x = x[: x.size // 16 * 16]
    check(x, "e2m1", "nvfp4", 16)
    check(x[: x.size // 32 * 32], "e4m3fn", "floor", 32)


def test_axis_0_blocks_the_columns():
    rng = np.random.default_rng(37)
    x = generated(rng, 64 * 8, 32).reshape(64, 8)
    rows = check(x, "e4m3fn", "rceil", 32, axis=0)
    assert rows.axis == 0 and rows.blocks == 16
    assert F.block_stats(np.ascontiguousarray(x.T), "torchao-mx-rceil") == rows.__class__(
        **{**rows.__dict__, "axis": -1}
    )


def test_nvfp4_without_a_tensor_scale():
    x = np.concatenate([np.full(16, 3.0), np.full(32, -1.5), np.full(16, 0.0)]).astype(np.float32)
    s = F.block_stats(x, F.recipe("nvfp4", tensor_scale=False))
    assert s.recipe == "nvfp4" and s.tensor_scale is None
    # scales amax / 6: 0.5 and 0.25; an all-zero block takes the clamp's 2**-6
    assert s.exponents == {-1: 1, -2: 2, -6: 1}


def test_table():
    x = np.ones(64, np.float32)
    x[3] = 1.9
    x[40] = np.inf
    out = F.block_stats(x, "torchao-mx-floor").table()
    assert out.splitlines()[0] == "torchao-mx-floor: 2 blocks of 32 e4m3fn, e8m0 scales"
    # torchao's FLOOR reads an Inf's exponent bits (128 - 8): its block's 31 ones flush
    lines = out.splitlines()
    assert lines[1] == "saturated 1.56% (1), flushed 49.21% (31), NaN 0, Inf 1, NaN scales 0"
    assert lines[2].split() == ["exponent", "blocks", "share"]
    assert [r.split() for r in lines[4:]] == [["-8", "1", "50.00%"], ["120", "1", "50.00%"]]


@pytest.mark.parametrize(
    "recipe, axis, element, match",
    [
        ("te-mxfp8x", -1, None, "unknown block recipe 'te-mxfp8x'"),
        ("te-mxfp8", -1, "e2m1", "element must be one of e4m3fn, e5m2 under mode 'te'"),
        ("torchao-mx-floor", 1, None, "axis"),
        ("torchao-mx-floor", -1, "e3m4", "element must be one of e4m3fn, e5m2, e2m1"),
    ],
)
def test_bad_input(recipe, axis, element, match):
    with pytest.raises(ValueError, match=match):
        F.block_stats(np.zeros(64, np.float32), recipe, axis=axis, element=element)


def test_what_the_recipe_refuses_is_refused():
    with pytest.raises(ValueError, match="multiple of the block 32"):
        F.block_stats(np.zeros(40, np.float32), "torchao-mx-floor")
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        F.block_stats(np.zeros(64), "te-mxfp8")

    class DeviceArray:  # what quantize_blocks would send to the GPU kernels
        def __init__(self):
            self.__cuda_array_interface__ = {"shape": (64,), "typestr": "<f4", "data": (0, False)}

    with pytest.raises(TypeError, match="x must be a NumPy array, got DeviceArray"):
        F.block_stats(DeviceArray(), "te-mxfp8")
    with pytest.raises(TypeError, match="BlockRecipe or a preset name"):
        F.block_stats(np.zeros(64, np.float32), ("e4m3fn", "floor", 32))


def test_a_tiny_block_is_not_saturated():
    """torchao's FLOOR gives amax 480 * 2**-127 the scale byte 0 (2**-127) but divides by
    2**-126: the element is written as 240, so it does not count as saturated though
    |x| / 2**-127 = 480 would round above 448."""
    x = np.full(32, 2.0**-127, np.float32)
    x[0] = 480 * 2.0**-127
    s = check(x, "e4m3fn", "floor", 32)
    assert s.exponents == {-127: 1} and s.saturated == 0
    ocp = check(x, "e4m3fn", "ocp", 32)  # the rule divides by 2**-127: 480 saturates
    assert ocp.exponents == {-127: 1} and ocp.saturated == 1
