"""unscale_(stats=True), threads and ISA levels of the compiled scan, against lscore._reference."""

import math
import os
import threading

import numpy as np
import pytest

import lscore
from helpers import FLOAT_DTYPES, bits_equal_or_both_nan
from helpers.gen import LAYOUTS, make_array, nonfinite_values
from lscore import _reference as ref
from lscore._ext import _scan
from lscore.dtypes import Code

CHUNK_BYTES = 256 * 1024  # lsc_pool.h LSC_CHUNK_BYTES
INVS = (0.5, 2.0, 1 / 3, 1.0, 1e-5, 65536.0)


@pytest.fixture(params=_scan.isa_levels())
def isa(request):
    """Run the test at each ISA level this CPU has (the dispatch picks the best)."""
    old = _scan.set_isa(request.param)
    yield request.param
    _scan.set_isa(old)


def same_stats(got, want):
    """all_finite equal, max |x| equal (or both NaN), norms equal to float64 rounding."""
    (f1, n1, m1), (f2, n2, m2) = got, want
    if f1 is not f2:
        return False
    if not (m1 == m2 or (math.isnan(m1) and math.isnan(m2))):
        return False
    if math.isnan(n1) or math.isnan(n2) or math.isinf(n1) or math.isinf(n2):
        return (math.isnan(n1) and math.isnan(n2)) or n1 == n2
    return math.isclose(n1, n2, rel_tol=1e-12, abs_tol=0.0)


def cases(seed, count):
    rng = np.random.default_rng(seed)
    for case in range(count):
        dt = FLOAT_DTYPES[case % len(FLOAT_DTYPES)]
        layout = LAYOUTS[(case // len(FLOAT_DTYPES)) % len(LAYOUTS)]
        n = int(rng.choice([0, 1, 15, 16, 17, 100, 1023, 1024, 1025, 3000]))
        bad = []
        if n and rng.random() < 0.4:
            bad = [(int(rng.integers(0, n)), rng.choice(nonfinite_values(dt)))]
        inv = float(rng.choice(INVS))
        yield (
            f"case {case} {dt} {layout} n={n} bad={bad} inv={inv}",
            make_array(rng, dt, n, layout, bad),
            inv,
        )


def test_stats_match_reference(isa):
    for ctx, a, inv in cases(3, 600):
        if not a.flags.writeable:
            continue
        b = a.copy()
        got = lscore.unscale_([a, None, np.ones(4, np.float32)], inv, stats=True)
        want = ref.unscale_([b, None, np.ones(4, np.float32)], inv, True)
        assert same_stats(got, want), (ctx, isa, got, want)
        assert bits_equal_or_both_nan(a, b), (ctx, isa)


def test_scan_and_unscale_match_reference_at_each_isa(isa):
    for ctx, a, inv in cases(5, 600):
        assert lscore.all_finite(a) is ref.all_finite(a), (ctx, isa)
        if not a.flags.writeable:
            continue
        b = a.copy()
        assert lscore.unscale_(a, inv) is ref.unscale_(b, inv), (ctx, isa)
        assert bits_equal_or_both_nan(a, b), (ctx, isa)


@pytest.mark.parametrize("inv", [0.5, 2.0, 1 / 3, 1e-8, 3.0e38, 1.0])
def test_half_types_every_bit_pattern_at_each_isa(isa, inv):
    """All 65,536 values of float16 and bfloat16 through each level's kernels (F16C or words)."""
    dts = [np.dtype(np.float16)] + [d for d in FLOAT_DTYPES if d.name == "bfloat16"]
    for dt in dts:
        a = np.arange(65536, dtype=np.uint16).view(dt)
        want = a.copy()
        want_stats = ref.unscale_(want, inv, True)
        got = a.copy()
        got_stats = lscore.unscale_(got, inv, stats=True)
        assert bits_equal_or_both_nan(got, want), (dt, isa)
        words = got.view(np.uint16)[np.isnan(got.astype(np.float32))]
        canonical = (words & 0x7FFF) == 0x7E00 if dt.name == "float16" else words == 0x7FC0
        assert inv == 1.0 or np.all(canonical), (dt, isa)  # inv 1 writes nothing
        assert same_stats(got_stats, want_stats), (dt, isa, got_stats, want_stats)
        assert lscore.unscale_(a[:-7].copy(), inv) is ref.unscale_(a[:-7].copy(), inv)


def test_stats_after_overflow_and_nan():
    a = np.array([60000.0, 1.0], np.float16)  # finite input, inf after * 2
    got = lscore.unscale_(a, 2.0, stats=True)
    assert got[0] is True and got[1] == math.inf and got[2] == math.inf
    b = np.array([1.0, np.nan, np.inf], np.float32)
    ok, norm, mx = lscore.unscale_(b, 0.5, stats=True)
    assert ok is False and math.isnan(norm) and math.isnan(mx)
    assert lscore.unscale_([], 0.5, stats=True) == (True, 0.0, 0.0)
    c = np.array([3.0, -4.0])
    assert lscore.unscale_(c, 1.0, stats=True) == (True, 5.0, 4.0)


def big_inputs(dt, rng):
    """Arrays a few chunks long, with a non-finite value near chunk edges."""
    per_chunk = CHUNK_BYTES // dt.itemsize
    n = 3 * per_chunk + 5
    out = [("finite", make_array(rng, dt, n, "contiguous"))]
    for pos in (0, per_chunk - 1, per_chunk, 2 * per_chunk + 1, n - 1):
        bad = [(pos, nonfinite_values(dt)[0])]
        out.append((f"bad at {pos}", make_array(rng, dt, n, "contiguous", bad)))
    out.append(("strided", make_array(rng, dt, n, "strided")))
    out.append(("nd_strided", make_array(rng, dt, n + 1 - n % 2, "nd_strided")))
    return out


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=str)
def test_threads_give_the_same_bits(dt):
    rng = np.random.default_rng(11)
    for label, a in big_inputs(dt, rng):
        want_copy = a.copy()
        want = ref.unscale_(want_copy, 0.25, True)
        results = []
        for threads in (1, 2, None):
            x = a.copy()
            assert lscore.all_finite(x, threads=threads) is ref.all_finite(a), (label, threads)
            results.append((lscore.unscale_(x, 0.25, stats=True, threads=threads), x))
        for got, x in results:
            assert same_stats(got, want), (label, got, want)
            assert bits_equal_or_both_nan(x, want_copy), label
        # per-chunk sums in chunk order: bit-identical whatever the thread count
        assert results[0][0][1] == results[1][0][1] == results[2][0][1] or math.isnan(want[1])


@pytest.mark.skipif(_scan.pool_size() < 2, reason="one CPU: no helper threads")
def test_helpers_take_chunks():
    a = np.ones(4_000_000, np.float32)
    before = _scan._helper_chunks()
    for _ in range(200):  # a helper may be late (busy machine); it joins eventually
        lscore.unscale_(a, 1.0, stats=True, threads=2)
        if _scan._helper_chunks() > before:
            break
    assert _scan._helper_chunks() > before
    assert lscore.unscale_(a, 1.0, stats=True, threads=2) == (True, 2000.0, 1.0)


def test_threads_over_a_mixed_table():
    rng = np.random.default_rng(12)
    dts = FLOAT_DTYPES
    arrays = [
        make_array(
            rng,
            dts[k % len(dts)],
            int(rng.integers(1, 200_000)),
            ("contiguous", "strided", "byteswapped")[k % 3],
        )
        for k in range(12)
    ]
    arrays += [None, make_array(rng, dts[0], 7, "contiguous")]
    for threads in (1, 2):
        x = [a.copy() if a is not None else None for a in arrays]
        y = [a.copy() if a is not None else None for a in arrays]
        got = lscore.unscale_(x, 0.5, stats=True, threads=threads)
        want = ref.unscale_(y, 0.5, True)
        assert same_stats(got, want), (threads, got, want)
        for u, v in zip(x, y, strict=True):
            if u is not None:
                assert bits_equal_or_both_nan(u, v)


def test_views_of_one_buffer_are_multiplied_in_order():
    """Raw tables may alias (adapters hand over pointers): threads must not write
    aliased runs at once, so they run serially, in order.  The NumPy entry
    point refuses arrays that share memory instead."""
    rng = np.random.default_rng(15)
    a = make_array(rng, np.dtype(np.float32), 900_000, "contiguous")
    b = a.copy()
    views = [a, a[10:], a[100:5100]]
    ptrs = np.array([v.ctypes.data for v in views], np.uint64)
    counts = np.array([v.size for v in views], np.int64)
    strides = np.array([v.strides[0] for v in views], np.int64)
    codes = np.full(len(views), int(Code.F32), np.int32)
    got = _scan.unscale_raw(ptrs, counts, strides, codes, 0.5, False, 2)
    # a list, not a generator: every view is unscaled even after a non-finite one
    want = all([ref.unscale_(v, 0.5) for v in (b, b[10:], b[100:5100])])  # noqa: C419
    assert got is want
    assert bits_equal_or_both_nan(a, b)
    with pytest.raises(ValueError, match="do not share memory"):
        lscore.unscale_([a, a[10:]], 0.5, threads=2)


@pytest.mark.parametrize("n", [1000, 900_000])
def test_raw_tables_small_and_large_alias_and_stride_like_the_reference(n):
    """Small contiguous tables go straight to the kernels, large or strided
    ones through the runs: either way aliased buffers are multiplied one
    after another, in table order, and a NaN is found wherever it is."""
    rng = np.random.default_rng(n)
    for case in range(20):
        a = make_array(rng, np.dtype(np.float32), n, "contiguous")
        if case % 3 == 0:
            a[int(rng.integers(0, n))] = np.nan
        b = a.copy()
        step = 1 + case % 2  # odd cases: a strided buffer
        lo = int(rng.integers(0, n // 2))
        views = [a, a[lo:], a[lo : lo + 50 : step]]
        ptrs = np.array([v.ctypes.data for v in views], np.uint64)
        counts = np.array([v.size for v in views], np.int64)
        strides = np.array([v.strides[0] for v in views], np.int64)
        codes = np.full(3, int(Code.F32), np.int32)
        got = _scan.unscale_raw(ptrs, counts, strides, codes, 0.5)
        # a list, not a generator: every view is unscaled even after a non-finite one
        want = all([ref.unscale_(v, 0.5) for v in (b, b[lo:], b[lo : lo + 50 : step])])  # noqa: C419
        assert got is want
        assert bits_equal_or_both_nan(a, b)
        assert _scan.all_finite_raw(ptrs, counts, strides, codes) is (case % 3 != 0)


def test_raw_tables_take_stats_and_threads():
    rng = np.random.default_rng(13)
    arrays = [make_array(rng, np.dtype(np.float32), n, "contiguous") for n in (5, 70_000, 200_000)]
    arrays[1][123] = np.inf
    copies = [a.copy() for a in arrays]
    ptrs = np.array([a.ctypes.data for a in arrays], np.uint64)
    counts = np.array([a.size for a in arrays], np.int64)
    strides = np.array([a.strides[0] for a in arrays], np.int64)
    codes = np.full(len(arrays), int(Code.F32), np.int32)
    assert _scan.all_finite_raw(ptrs, counts, strides, codes, 2) is False
    got = _scan.unscale_raw(ptrs, counts, strides, codes, 2.0, True, 2)
    want = lscore.unscale_(copies, 2.0, stats=True, threads=1)
    assert got == want
    for a, b in zip(arrays, copies, strict=True):
        assert bits_equal_or_both_nan(a, b)


def test_bad_arguments_change_nothing():
    a = np.ones(10, np.float32)
    for kwargs, exc in (
        ({"threads": 0}, ValueError),
        ({"threads": 1.5}, TypeError),
        ({"threads": True}, TypeError),
        ({"stats": "yes"}, TypeError),
    ):
        with pytest.raises(exc):
            lscore.unscale_(a, 0.5, **kwargs)
        assert np.all(a == 1.0)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        lscore.all_finite(a, threads=-1)


def test_concurrent_callers_share_the_pool():
    """Two Python threads unscaling big arrays at once: one gets the pool, one runs serially."""
    rng = np.random.default_rng(14)
    arrays = [make_array(rng, np.dtype(np.float32), 1_500_000, "contiguous") for _ in range(4)]
    wants = [ref.unscale_(a.copy(), 0.5, True) for a in arrays]
    results = [None] * 4

    def work(i):
        results[i] = lscore.unscale_(arrays[i], 0.5, stats=True, threads=2)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for got, want in zip(results, wants, strict=True):
        assert same_stats(got, want)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_pool_works_after_fork():
    a = np.ones(1_000_000, np.float32)
    assert lscore.unscale_(a, 0.5, threads=2)  # the pool exists now
    pid = os.fork()
    if pid == 0:  # child: helpers are gone; must not hang
        ok = lscore.unscale_(a, 2.0, threads=2) and bool(np.all(a == 1.0))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert np.all(a == 0.5)


def test_isa_controls():
    levels = _scan.isa_levels()
    assert _scan.isa() in levels
    assert _scan.pool_size() >= 1
    with pytest.raises(ValueError, match="not available"):
        _scan.set_isa("v9")


def _shared_memory_case(rng):
    """A list of arrays drawn from a few owned buffers: whole buffers, slices
    (stepped, reversed, interleaved), copies and repeats, in a random order."""
    bases = [np.arange(int(rng.integers(4, 40)), dtype=np.float32) for _ in range(3)]
    pool = []
    for b in bases:
        n = b.size
        i, j = sorted(int(x) for x in rng.integers(0, n + 1, 2))
        pool += [b, b[i:j], b[::2], b[1::2], b[::-1], b[i:j][::-1], b[j:], b.copy()]
    arrays = [pool[int(k)] for k in rng.integers(0, len(pool), int(rng.integers(2, 7)))]
    order = rng.integers(0, 3)  # shuffled, by address going up, going down
    if order:
        arrays.sort(key=lambda a: a.__array_interface__["data"][0], reverse=bool(order == 2))
    return arrays


def test_unscale_refuses_exactly_the_arrays_that_share_memory():
    """The disjointness check's shortcuts (arrays in address order either way,
    arrays that own their memory) and its general path agree with
    np.shares_memory, for lists (the plain-list path) and tuples (the table)."""
    rng = np.random.default_rng(21)
    refused = accepted = 0
    for _ in range(3000):
        arrays = [a for a in _shared_memory_case(rng) if a.size]
        clash = any(np.shares_memory(a, b) for k, a in enumerate(arrays) for b in arrays[k + 1 :])
        before = [a.copy() for a in arrays]
        arg = arrays if rng.random() < 0.5 else tuple(arrays)
        if clash:
            with pytest.raises(ValueError, match="do not share memory"):
                lscore.unscale_(arg, 0.5)
            for a, b in zip(arrays, before, strict=True):
                assert np.array_equal(a, b)
            refused += 1
        else:
            assert lscore.unscale_(arg, 0.5) is True
            for a, b in zip(arrays, before, strict=True):
                assert np.array_equal(a, b * np.float32(0.5))
            accepted += 1
    assert refused > 300 and accepted > 300, (refused, accepted)


@pytest.mark.parametrize("m", [2, 700, 5000])
def test_unscale_finds_one_repeated_array_among_many(m):
    """Arrays that own their memory are told apart by identity, in a table
    on the stack or on the heap for long lists."""
    rng = np.random.default_rng(m)
    arrays = [np.ones(3, np.float32) for _ in range(m)]
    rng.shuffle(arrays)
    assert lscore.unscale_(arrays, 0.5) is True
    i, j = sorted(int(x) for x in rng.choice(m, 2, replace=False))
    arrays[j] = arrays[i]
    with pytest.raises(ValueError, match=f"arrays {i} and {j} .* overlap"):
        lscore.unscale_(arrays, 0.5)
    assert all(np.all(a == 0.5) for a in arrays)


def test_flat_lists_of_plain_arrays_and_the_general_path_agree():
    """A flat list of plain arrays of up to 256 KiB goes straight to the
    kernels; anything else in it (a strided or read-only array, a tuple, too
    many bytes) sends the whole call down the general path, with its errors."""
    small = [np.ones(64, np.float32) for _ in range(50)]
    small[3][7] = np.nan
    assert lscore.all_finite(small) is False
    assert lscore.all_finite([*small, np.ones(8)[::2]]) is False
    with pytest.raises(TypeError, match="unsupported dtype"):
        lscore.all_finite([*small, np.zeros(2, np.complex64)])
    many = [np.ones(1024, np.float32) for _ in range(400)]  # 1.6 MB: the general path
    many[-1][-1] = np.inf
    assert lscore.all_finite(many) is False
    many[-1][-1] = 0
    assert lscore.all_finite(many) is True
    # unscale_: one read-only array anywhere leaves every array untouched
    arrays = [np.full(16, 4.0, np.float32) for _ in range(20)]
    ro = np.full(16, 4.0, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        lscore.unscale_([*arrays, ro], 0.5)
    with pytest.raises(ValueError, match="read-only"):
        lscore.unscale_([*arrays, ro], 1.0)
    assert all(np.all(a == 4.0) for a in arrays)
    with pytest.raises(TypeError, match=r"array 20 \(in flattened order\) is int64"):
        lscore.unscale_([*arrays, None, np.arange(3)], 0.5)  # integers cannot be unscaled
    assert all(np.all(a == 4.0) for a in arrays)
    assert lscore.unscale_([*arrays, None], 0.5) is True
    assert all(np.all(a == 2.0) for a in arrays)
