"""The vector kernels of the compiled scan (float16/bfloat16 conversions, the one-pass
statistics) at every ISA level this CPU runs, against lscore._reference: NaN, Inf and
subnormals at every lane position, misaligned starts, every tail length, and the
statistics' bits unchanged by the thread count."""

from __future__ import annotations

import math

import numpy as np
import pytest

import lscore
from helpers import FLOAT_DTYPES, bits_equal_or_both_nan
from lscore import _reference as ref
from lscore._ext import _scan
from lscore.dtypes import Code

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st

ISAS = _scan.isa_levels()
CODES = {"float16": Code.F16, "bfloat16": Code.BF16, "float32": Code.F32, "float64": Code.F64}
INVS = (0.5, 2.0, 1 / 3, 1.0, 1e-8, 65536.0, 3.0e38, 1e-50)  # float32(1e-50) is 0
KINDS = ("nan", "inf", "-inf", "subnormal", "-subnormal", "max", "-zero")
# 32 statistics lanes, 4..16 elements a vector, 32-element groups: 80 reaches every lane
# position of every vector and of every group, with a tail after two whole groups
LANE_N = 80


def special(dt: np.dtype, kind: str) -> float:
    if kind in ("nan", "inf", "-inf"):
        return float(kind)
    info = np.finfo(dt) if dt.name != "bfloat16" else __import__("ml_dtypes").finfo(dt)
    return {
        "subnormal": float(info.smallest_subnormal),
        "-subnormal": -float(info.smallest_subnormal),
        "max": float(info.max),
        "-zero": -0.0,
    }[kind]


def same_stats(got, want) -> bool:
    """all_finite equal, max |x| exact (or both NaN), the 2-norm within 1e-12 relative."""
    (f1, n1, m1), (f2, n2, m2) = got, want
    if f1 is not f2 or not (m1 == m2 or (math.isnan(m1) and math.isnan(m2))):
        return False
    if not (math.isfinite(n1) and math.isfinite(n2)):
        return n1 == n2 or (math.isnan(n1) and math.isnan(n2))
    return math.isclose(n1, n2, rel_tol=1e-12, abs_tol=0.0)


def misaligned(a: np.ndarray, shift: int) -> np.ndarray:
    """A copy of `a` starting `shift` bytes past a 64-byte boundary (contiguous)."""
    raw = np.zeros(a.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + shift
    out = raw[start : start + a.nbytes].view(a.dtype)
    out[...] = a
    return out


def check_all(a: np.ndarray, inv: float, ctx) -> None:
    """all_finite, unscale_ and unscale_(stats=True) on copies of `a`, against the reference."""
    assert lscore.all_finite(a) is ref.all_finite(a), ctx
    want = a.copy()
    ok = ref.unscale_(want, inv)
    for shift in (0, 2, 6) if a.itemsize == 2 else (0, a.itemsize // 2, 4):
        got = misaligned(a, shift)
        assert lscore.unscale_(got, inv) is ok, (ctx, shift)
        assert bits_equal_or_both_nan(got, want), (ctx, shift)
        got = misaligned(a, shift)
        want_s = a.copy()
        stats_want = ref.unscale_(want_s, inv, True)
        stats_got = lscore.unscale_(got, inv, stats=True)
        assert same_stats(stats_got, stats_want), (ctx, shift, stats_got, stats_want)
        assert bits_equal_or_both_nan(got, want_s), (ctx, shift)


@pytest.fixture(params=ISAS)
def isa(request):
    old = _scan.set_isa(request.param)
    yield request.param
    _scan.set_isa(old)


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_special_value_at_every_lane_position(isa, dt, kind):
    rng = np.random.default_rng(17)
    base = (rng.standard_normal(LANE_N) * 4).astype(dt)
    for pos in range(LANE_N):
        a = base.copy()
        a[pos] = special(dt, kind)
        for inv in (0.5, 3.0e38, 1e-50):
            check_all(a, inv, (isa, dt, kind, pos, inv))


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=str)
def test_every_tail_length(isa, dt):
    rng = np.random.default_rng(5)
    for n in range(100):
        a = (rng.standard_normal(n) * 100).astype(dt)
        check_all(a, 1 / 3, (isa, dt, n))


VALUES = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "subnormal", "-subnormal", "max", "-zero"]),
    st.floats(-1e4, 1e4, allow_nan=False, width=32),
)


@settings(max_examples=60, deadline=None)
@given(
    dt=st.sampled_from(FLOAT_DTYPES),
    values=st.lists(VALUES, max_size=150),
    inv=st.sampled_from(INVS),
    data=st.data(),
)
def test_generated_arrays_at_every_isa(dt, values, inv, data):
    a = np.array([special(dt, v) if isinstance(v, str) else v for v in values], np.float64).astype(
        dt
    )
    isa = data.draw(st.sampled_from(ISAS), label="isa")
    old = _scan.set_isa(isa)
    try:
        check_all(a, inv, (isa, dt, inv))
    finally:
        _scan.set_isa(old)


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("inv", [0.25, 1.0])
def test_stats_bits_independent_of_threads_and_chunk_edges(dt, inv):
    """Several pool chunks of the statistics op, a NaN near a chunk edge or none:
    the same bits at 1, 2 and the automatic thread count, at every ISA level."""
    chunk = _scan._chunk_elems(int(CODES[dt.name]), True, inv != 1.0)
    assert chunk % 32 == 0 and chunk > 0
    rng = np.random.default_rng(23)
    n = 3 * chunk + 37
    base = (rng.standard_normal(n) * 8).astype(dt)
    for bad in (None, chunk - 1, chunk, 2 * chunk + 36):
        a = base.copy()
        if bad is not None:
            a[bad] = np.nan
        want_a = a.copy()
        want = ref.unscale_(want_a, inv, True)
        seen = set()
        for level in ISAS:
            old = _scan.set_isa(level)
            try:
                for threads in (1, 2, None):
                    x = a.copy()
                    got = lscore.unscale_(x, inv, stats=True, threads=threads)
                    assert same_stats(got, want), (level, threads, bad, got, want)
                    assert bits_equal_or_both_nan(x, want_a), (level, threads, bad)
                    seen.add(got[1] if not math.isnan(got[1]) else "nan")
            finally:
                _scan.set_isa(old)
        assert len(seen) == 1, (bad, seen)


def test_work_based_split_reaches_the_pool():
    """A cache-sized float16 array under stats=True is worth two threads: its chunks
    are cut by work, not bytes."""
    if _scan.pool_size() < 2:
        pytest.skip("one CPU: no pool")
    f16_stats = _scan._chunk_elems(int(Code.F16), True) * 2
    assert f16_stats < _scan._chunk_elems(int(Code.F32), False) * 4  # bytes per chunk
    a = np.ones(100_000, np.float16)
    before = _scan._helper_chunks()
    for _ in range(3000):
        assert lscore.unscale_(a, 2.0, stats=True) == (True, 2.0 * math.sqrt(a.size), 2.0)
        lscore.unscale_(a, 0.5, stats=True)
        if _scan._helper_chunks() > before:
            break
    assert _scan._helper_chunks() > before
    assert np.all(a == 1.0)


def test_float8_statistics_refused_on_raw_tables():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.zeros(8, ml_dtypes.float8_e4m3fn)
    table = (
        np.array([a.ctypes.data], np.uint64),
        np.array([a.size], np.int64),
        np.array([1], np.int64),
        np.array([int(Code.E4M3FN)], np.int32),
    )
    with pytest.raises(TypeError, match="float8"):
        _scan.unscale_raw(*table, 1.0, True)


# what lscore.unscale_ refuses but the kernels take (lscore.kernels is unvalidated):
# float32(1e39) is inf; an infinite or NaN inverse takes the statistics in a second
# pass, since the largest value left need not then be the largest input's (0 * inf)
RAW_INVS = (1e39, math.inf, -math.inf, math.nan, -2.0, -0.0)


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("inv", RAW_INVS, ids=repr)
def test_unvalidated_inverses_through_the_kernels(isa, dt, inv):
    rng = np.random.default_rng(29)
    base = (rng.standard_normal(LANE_N) * 4).astype(dt)
    base[5] = 0.0
    for kind in (None, "nan", "inf", "subnormal", "max"):
        a = base.copy()
        if kind is not None:
            a[LANE_N - 7] = special(dt, kind)
        want = a.copy()
        stats_want = ref.unscale_(want, inv, True)
        for shift in (0, 2) if a.itemsize == 2 else (0, 4):
            got = misaligned(a, shift)
            stats_got = _scan.unscale_(got, inv, True)
            assert same_stats(stats_got, stats_want), (isa, dt, kind, shift, stats_got, stats_want)
            assert bits_equal_or_both_nan(got, want), (isa, dt, kind, shift)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("inv", [0.5, 1 / 3, 3.0, 21834.667, 1e-30], ids=repr)
def test_every_16_bit_word(isa, name, inv):
    """All 65,536 words in order (the NaN and Inf words sit together, so the other
    vectors take the vector path): the reference's values and statistics."""
    dt = {d.name: d for d in FLOAT_DTYPES}[name]
    a = np.arange(1 << 16, dtype=np.uint16).view(dt)
    want = a.copy()
    ok = ref.unscale_(want, inv)
    got = a.copy()
    assert lscore.unscale_(got, inv) is ok
    assert bits_equal_or_both_nan(got, want), (isa, name, inv)
    finite = a[np.isfinite(a.astype(np.float32))]
    want = finite.copy()
    stats_want = ref.unscale_(want, inv, True)
    got = finite.copy()
    assert same_stats(lscore.unscale_(got, inv, stats=True), stats_want)
    assert bits_equal_or_both_nan(got, want)
