"""Compiled all_finite / unscale_ against lscore._reference on generated arrays."""

import numpy as np
import pytest

import lscore
from helpers import FLOAT8_DTYPES, FLOAT_DTYPES, INT_DTYPES, bits_equal_or_both_nan
from helpers.gen import LAYOUTS, make_array, nonfinite_values, special_values
from lscore import _reference as ref

SIZES = (0, 1, 2, 3, 7, 16, 31, 64, 100, 257, 1000, 4099, 9000)


def gen_cases(seed: int, count: int):
    rng = np.random.default_rng(seed)
    dtypes = FLOAT_DTYPES + FLOAT8_DTYPES
    for case in range(count):
        dt = dtypes[case % len(dtypes)]
        layout = LAYOUTS[(case // len(dtypes)) % len(LAYOUTS)]
        n = int(rng.choice(SIZES))
        kind = rng.integers(0, 6)
        bad = []
        if n and kind:
            pos = {1: 0, 2: n - 1, 3: int(rng.integers(0, n))}.get(
                int(kind), int(rng.integers(0, n))
            )
            v = rng.choice(nonfinite_values(dt))
            bad = [(pos, v)]
            if kind == 5:  # everything special at once
                sp = list(special_values(dt).values())
                bad += [(int(rng.integers(0, n)), x) for x in sp]
        if kind == 4 and n:  # finite edge values only
            bad = [(int(rng.integers(0, n)), x) for x in special_values(dt).values()]
        yield case, dt, layout, n, bad, rng


def test_all_finite_matches_reference_10000_cases():
    checked = 0
    for case, dt, layout, n, bad, rng in gen_cases(7, 10000):
        a = make_array(rng, dt, n, layout, bad)
        extra = [None, make_array(rng, dt, 5, "contiguous")]
        for arrays in (a, [extra[1], a, None], {"x": [a], "y": None}):
            want = ref.all_finite(arrays)
            got = lscore.all_finite(arrays)
            assert got is want, (
                f"case {case} dtype {dt} layout {layout} n {n} bad {bad}",
                got,
                want,
            )
        checked += 1
    assert checked == 10000


def test_unscale_matches_reference_generated():
    for case, dt, layout, n, bad, rng in gen_cases(11, 4000):
        if dt in FLOAT8_DTYPES:
            continue
        inv = float(rng.choice([0.5, 2.0, 1 / 3, 1.0, 1e-5, 65536.0, 3e-39, 1e30]))
        a = make_array(rng, dt, n, layout, bad)
        if not a.flags.writeable:
            continue
        e = make_array(rng, dt, int(rng.integers(0, 70)), "contiguous")
        b, f = a.copy(), e.copy()
        # odd cases as a flat list: plain arrays take the list's own fast path
        args, ref_args = (a, b) if case % 2 == 0 else ([e, None, a], [f, None, b])
        want = ref.unscale_(ref_args, inv)
        got = lscore.unscale_(args, inv)
        ctx = f"case {case} dtype {dt} layout {layout} n {n} inv {inv} bad {bad}"
        assert got is want, ctx
        assert bits_equal_or_both_nan(a, b), ctx
        assert bits_equal_or_both_nan(e, f), ctx


@pytest.mark.parametrize("inv", [0.5, 2.0, 1 / 3, 1e-8, 3.0e38, 1 / 65536])
def test_float16_every_bit_pattern(inv):
    """All 65,536 half values, widened, multiplied by float32(inv) and rounded back exactly."""
    a = np.arange(65536, dtype=np.uint16).view(np.float16)
    want = a.copy()
    ref.unscale_(want, inv)
    got = a.copy()
    lscore.unscale_(got, inv)
    assert bits_equal_or_both_nan(got, want)
    nan = np.isnan(got)
    signs = got.view(np.uint16)[nan] & 0x8000
    assert np.all((got.view(np.uint16)[nan] & 0x7FFF) == 0x7E00)
    assert signs.size == nan.sum()


@pytest.mark.parametrize("inv", [0.5, 2.0, 1 / 3, 1e-8, 3.0e38, 1 / 65536])
def test_bfloat16_every_bit_pattern(inv):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16)
    want = a.copy()
    ref.unscale_(want, inv)
    got = a.copy()
    lscore.unscale_(got, inv)
    assert bits_equal_or_both_nan(got, want)
    assert np.all(got.view(np.uint16)[np.isnan(got.astype(np.float32))] == 0x7FC0)


@pytest.mark.parametrize("dt", FLOAT_DTYPES + FLOAT8_DTYPES, ids=str)
def test_every_bit_pattern_classified(dt):
    """all_finite on each single value agrees with isfinite of its float64 widening."""
    w = dt.itemsize
    if w > 2:
        pytest.skip("exhaustive only for 8/16-bit formats")
    a = np.arange(2 ** (8 * w), dtype=f"u{w}").view(dt)
    fin = np.isfinite(a.astype(np.float64))
    got = np.array([lscore.all_finite(a[i : i + 1]) for i in range(a.size)])
    assert np.array_equal(got, fin)


@pytest.mark.parametrize("dt", INT_DTYPES, ids=str)
def test_integer_and_bool_are_finite(dt):
    a = np.arange(10).astype(dt)
    assert lscore.all_finite(a)
    assert lscore.all_finite([np.ones(2), {"k": a}])
    assert ref.all_finite(a)


@pytest.mark.parametrize("dt", INT_DTYPES, ids=str)
def test_unscale_refuses_integer_and_bool_before_any_write(dt):
    """unscale_ multiplies: an integer array cannot take 1/scale (torch refuses it too).
    The TypeError names the dtype and where the array is, and nothing is written, not even
    the float arrays before it."""
    a = np.arange(10).astype(dt)
    f, g = np.full(3, 4.0, np.float32), np.full(2, 8.0)
    for arrays, where in (
        (a, "the array"),
        ([a], "array 0"),
        ([f, None, {"k": (g, a)}], "array 2"),
        ([f, a, g], "array 1"),
    ):
        with pytest.raises(TypeError, match=f"{where}.* is {np.dtype(dt).name}"):
            lscore.unscale_(arrays, 0.5)
        with pytest.raises(TypeError, match=np.dtype(dt).name):
            ref.unscale_(arrays, 0.5)
        with pytest.raises(TypeError, match="floating-point"):
            lscore.unscale_(arrays, 0.5, stats=True)
    assert (f == 4.0).all() and (g == 8.0).all()
    assert np.array_equal(a, np.arange(10).astype(dt))


def test_python_numbers_and_scalars():
    assert lscore.all_finite([1.0, 2, True, np.float32(3), None])
    assert not lscore.all_finite([1.0, float("nan")])
    assert not lscore.all_finite(float("inf"))
    assert not lscore.all_finite(np.float16("inf"))
    assert lscore.all_finite([]) and lscore.all_finite(None) and lscore.all_finite({})


def test_all_finite_huge_array_over_2_31_elements():
    row = np.ones(1024, np.float32)
    row[-1] = np.inf
    n_rows = 2**21 + 1  # 2**31 + 1024 elements through one row of memory
    view = np.broadcast_to(row, (n_rows, 1024))
    assert view.size > 2**31
    assert not lscore.all_finite(view)
    flat = np.broadcast_to(np.float32(1.0), (2**31 + 7,))
    assert lscore.all_finite(flat)


@pytest.mark.slow
def test_unscale_huge_array_over_2_31_elements():
    a = np.ones(2**31 + 3, np.uint8).view(np.uint8)
    del a
    a = np.empty(2**31 + 3, np.float16)
    a[...] = 2.0
    a[-1] = np.inf
    assert not lscore.unscale_(a, 0.5)
    assert a[0] == 1.0 and a[2**31 + 1] == 1.0 and np.isinf(a[-1])
