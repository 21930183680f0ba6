"""The quantize kernels of lsc_fp8.h (the amax pass, the row-wise cast, dequantize with a
scale) and lscore.fp8.quantize over them: equal to the slow twins of lscore._reference_fp8 at
every ISA level, on strided and non-contiguous inputs with zeros, subnormals, NaN, +-Inf and
overflowing values; and the bad-input checks, made before anything is written."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lscore.fp8 as Q
from helpers.fp8_inputs import FLOATS, HOWS, float8_input
from lscore import _reference_fp8 as ref
from lscore import kernels

ml_dtypes = pytest.importorskip("ml_dtypes")

E4, E5 = "float8_e4m3fn", "float8_e5m2"


@pytest.fixture(params=kernels.isa_levels())
def isa(request):
    old = kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa(old)


def same(a, b):
    """Equal as float32 values, NaN equal to NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_array_equal(a[~np.isnan(a)], b[~np.isnan(b)])


@st.composite
def layouts(draw):
    """A float array with specials in one of helpers.fp8_inputs' layouts."""
    dt = draw(st.sampled_from(sorted(FLOATS)))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    return float8_input(draw(st.integers(0, 2**32 - 1)), shape, dt, draw(st.sampled_from(HOWS)))


@settings(max_examples=60, deadline=None)
@given(
    x=layouts(),
    fmt=st.sampled_from([E4, E5]),
    saturate=st.booleans(),
    nan_sign=st.booleans(),
    amax_nan=st.booleans(),
    scale=st.sampled_from([1.0, 0.5, 3.0, 1 / 3, 2.0**-20, 2.0**20, 448.0]),
)
def test_kernels_equal_the_twins(x, fmt, saturate, nan_sign, amax_nan, scale):
    for level in kernels.isa_levels():
        old = kernels.set_isa(level)
        try:
            same(kernels.fp8_amax(x, amax_nan), ref.fp8_amax(x, amax_nan))
            rows = int(np.prod(x.shape[:-1]))
            am = np.full(rows, -1, np.float32)
            kernels.fp8_amax_rows(x, am, amax_nan)
            same(am, ref.fp8_amax(x, amax_nan, rows=True))
            scales = (np.float32(scale) * (1 + np.arange(rows) % 3)).astype(np.float32)
            q = np.empty(x.shape, np.uint8)
            am2 = np.full(rows, -1, np.float32)
            kernels.fp8_cast_rows(x, q, scales, am2, fmt, saturate, nan_sign, amax_nan)
            rq, ram = ref.fp8_cast_rows(x, scales, fmt, saturate, nan_sign, amax_nan)
            np.testing.assert_array_equal(q, rq)
            same(am2, ram)
            for dt in FLOATS.values():
                out = np.empty(x.shape, dt)
                kernels.fp8_decode_rows(q, out, scales, fmt)
                same(out.astype(np.float32), ref.fp8_dequantize(q, scales, fmt, dt, rows=True))
                kernels.fp8_decode(q, out, fmt, scale)
                same(out.astype(np.float32), ref.fp8_dequantize(q, scale, fmt, dt))
        finally:
            kernels.set_isa(old)


@pytest.mark.parametrize("dt", sorted(FLOATS))
@pytest.mark.parametrize("amax_nan", [False, True])
def test_amax_of_long_runs(isa, dt, amax_nan):
    """Runs longer than a vector and than the cast's chunk, the largest value (or the NaN)
    at every kind of position: first, last, in the tail after the vectors."""
    rng = np.random.default_rng(7)
    for n in (1, 7, 33, 511, 512, 513, 4099):
        for at in {0, n - 1, n // 2}:
            for special in (1e4, np.inf, np.nan, -np.inf):
                x = rng.standard_normal(n).astype(np.float32)
                x[at] = special
                x = x.astype(FLOATS[dt])
                same(kernels.fp8_amax(x, amax_nan), ref.fp8_amax(x, amax_nan))
                q = np.empty(n, np.uint8)
                same(
                    kernels.fp8_cast(x, q, 1.0, E4, True, True, amax_nan), ref.fp8_amax(x, amax_nan)
                )


def test_amax_of_nothing():
    assert kernels.fp8_amax(np.zeros(0, np.float32)) == 0
    am = np.full(3, -1, np.float32)
    kernels.fp8_amax_rows(np.zeros((3, 0), np.float16), am)
    np.testing.assert_array_equal(am, 0)


def test_decode_with_scale_one_keeps_the_nan_words():
    codes = np.arange(256, dtype=np.uint8)
    for fmt in (E4, E5):
        a, b = np.empty(256, np.float32), np.empty(256, np.float32)
        kernels.fp8_decode(codes, a, fmt)
        kernels.fp8_decode(codes, b, fmt, 1.0)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


# ---- lscore.fp8.quantize ------------------------------------------------------


def test_quantize_is_the_twin_and_returns_float8():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 40)) * 100).astype(np.float32)[:, ::3]
    q, a = Q.quantize(x, 1.5, "e5m2", saturate=False)
    assert q.dtype == ml_dtypes.float8_e5m2 and isinstance(a, np.float32)
    rq, ra = ref.fp8_cast(x, 1.5, E5, saturate=False)
    np.testing.assert_array_equal(q.view(np.uint8), rq)
    assert a == ra
    s = np.arange(1, 7, dtype=np.float32).reshape(6, 1)
    q, a = Q.quantize(x, s, axis=-1)
    assert q.dtype == ml_dtypes.float8_e4m3fn and a.shape == (6, 1)
    rq, ra = ref.fp8_cast_rows(x, s.ravel(), E4)
    np.testing.assert_array_equal(q.view(np.uint8), rq)
    np.testing.assert_array_equal(a.ravel(), ra)
    d = Q.dequantize(q, s, axis=-1)
    np.testing.assert_array_equal(d, q.astype(np.float32) / s)
    np.testing.assert_array_equal(Q.amax(x, axis=-1), a)
    assert Q.amax(x) == np.abs(x).max()


def test_quantize_into_out():
    x = np.linspace(-500, 500, 24, dtype=np.float32).reshape(4, 6)
    out = np.zeros((4, 6), np.uint8)
    q, _ = Q.quantize(x, 1.0, out=out)
    assert q is out
    np.testing.assert_array_equal(out, ref.fp8_cast(x, 1.0, E4)[0])
    assert Q.dequantize(out, 1.0, "bfloat16", fmt="e4m3fn").dtype == ml_dtypes.bfloat16


def test_nan_rules():
    x = np.array([1.0, np.nan, -2.0], np.float32)
    assert Q.amax(x) == 2.0 and np.isnan(Q.amax(x, nan="propagate"))
    q, a = Q.quantize(-x, 1.0, nan_sign=False, amax_nan="propagate")
    assert np.isnan(a) and q.view(np.uint8)[1] == 0x7F


def bad_calls():
    x = np.ones((3, 4), np.float32)
    out = np.full((3, 4), 0xAA, np.uint8)
    return out, [
        (dict(x=x.astype(np.float64), scale=1.0), TypeError, "float32, float16 or bfloat16"),
        (dict(x=x.astype(np.int32), scale=1.0), TypeError, "float32, float16 or bfloat16"),
        (dict(x=[1.0], scale=1.0), TypeError, "NumPy array"),
        (dict(x=x, scale=1.0, fmt="e4m3"), ValueError, "fmt must be one of"),
        (dict(x=x, scale=0.0), ValueError, "positive finite float32, got 0.0"),
        (dict(x=x, scale=-1.0), ValueError, "positive finite float32"),
        (dict(x=x, scale=np.inf), ValueError, "positive finite float32"),
        (dict(x=x, scale=np.nan), ValueError, "positive finite float32"),
        (dict(x=x, scale=1e39), ValueError, "positive finite float32"),
        (dict(x=x, scale=1e-50), ValueError, "positive finite float32"),
        (dict(x=x, scale="2"), ValueError, "positive finite float32"),
        (dict(x=x, scale=np.ones(3)), ValueError, "positive finite float32"),
        (
            dict(x=x, scale=np.ones(4), axis=-1),
            ValueError,
            r"one positive finite float32 per row \(3\)",
        ),
        (dict(x=x, scale=np.array([1, 0, 1.0]), axis=-1), ValueError, "at row 1"),
        (dict(x=x, scale=1.0, axis=0), ValueError, "axis must be None"),
        (dict(x=x, scale=1.0, amax_nan="drop"), ValueError, "amax_nan must be"),
        (dict(x=x, scale=1.0, out=np.zeros((4, 3), np.uint8)), ValueError, "input's shape"),
        (dict(x=x, scale=1.0, out=np.zeros((3, 4), np.int8)), TypeError, "out must be uint8"),
        (
            dict(x=x, scale=1.0, fmt="e5m2", out=np.zeros((3, 4), ml_dtypes.float8_e4m3fn)),
            TypeError,
            "out must be uint8 or float8_e5m2",
        ),
        (dict(x=x, scale=1.0, out=np.zeros((4, 6), np.uint8)[:3, :4]), ValueError, "C-contiguous"),
    ]


def test_bad_input_is_refused_before_anything_is_written():
    out, cases = bad_calls()
    for kw, exc, msg in cases:
        o = kw.pop("out", out)
        before = o.copy()
        with pytest.raises(exc, match=msg):
            Q.quantize(**kw, out=o)
        np.testing.assert_array_equal(o, before)
    with pytest.raises(ValueError, match="out must not overlap x"):
        buf = np.zeros(16, np.float32)
        Q.quantize(buf, 1.0, out=buf.view(np.uint8)[:16])


def test_dequantize_bad_input():
    q = np.zeros((2, 3), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="fmt must name the format"):
        Q.dequantize(q.view(np.uint8), 1.0)
    with pytest.raises(ValueError, match="fmt must be q's format"):
        Q.dequantize(q, 1.0, fmt="e5m2")
    with pytest.raises(TypeError, match="q must be float8_e4m3fn"):
        Q.dequantize(np.zeros(3, np.float32), 1.0)
    with pytest.raises(TypeError, match="dtype must be float32"):
        Q.dequantize(q, 1.0, np.float64)
    with pytest.raises(ValueError, match="per row"):
        Q.dequantize(q, np.ones(3, np.float32), axis=-1)
    with pytest.raises(ValueError, match="axis must be None"):
        Q.amax(np.ones((), np.float32), axis=-1)
