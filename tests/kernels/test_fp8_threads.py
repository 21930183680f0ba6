"""The float8 kernels on the package's thread pool: every thread count gives the same bytes
and amaxes as one thread and as the slow twins of lscore._reference_fp8, with NaN, +-Inf,
overflowing and subnormal values on both sides of every chunk edge; contiguous, strided,
reversed, transposed and N-d inputs, whole lines and lines split over chunks; the helpers
that run the chunks are the scan's."""

import os
import subprocess
import sys

import numpy as np
import pytest

from lscore import _reference_fp8 as ref
from lscore import kernels
from lscore._ext import _fp8, _scan

ml_dtypes = pytest.importorskip("ml_dtypes")

E4, E5 = "float8_e4m3fn", "float8_e5m2"
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
CHUNK = _fp8._CHUNK_ELEMS
# 0 (by size), serial, every count of the pool, and more than it has
THREADS = sorted({0, 1, 8, *range(2, kernels.pool_size() + 1)})
SPECIAL = np.array(
    [np.nan, -np.nan, np.inf, -np.inf, 1e38, -465.0, 6e4, 1e-45, -(2.0**-20), 448.0, 0.0, -0.0],
    np.float32,
)


def spread(n, dt, seed=0, every=CHUNK):
    """n values of dtype dt, normal with a wide exponent range, and SPECIAL's values on both
    sides of every multiple of `every` (the chunk edges of a contiguous run)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 4, n)).astype(np.float32)
    edges = np.arange(every, n, every)
    for k, at in enumerate(np.concatenate([edges - 1, edges, edges + 1])):
        if at < n:
            x[at] = SPECIAL[k % len(SPECIAL)]
    with np.errstate(over="ignore"):
        return x.astype(dt)


def same(a, b):
    """Equal as float32 values, NaN equal to NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_array_equal(a[~np.isnan(a)], b[~np.isnan(b)])


def by_threads(call):
    """call(threads) for every count of THREADS; each result equal to the serial one."""
    first = call(1)
    for t in THREADS:
        got = call(t)
        for a, b in zip(got, first, strict=True):
            if isinstance(a, np.ndarray) and a.dtype == np.uint8:
                np.testing.assert_array_equal(a, b, err_msg=f"threads={t}")
            else:
                same(a, b)
    return first


def cast(x, fmt, saturate, nan_sign, amax_nan, scale=3.0):
    def call(t):
        q = np.full(x.shape, 0xA5, np.uint8)  # a byte no chunk leaves behind unseen
        a = kernels.fp8_cast(x, q, scale, fmt, saturate, nan_sign, amax_nan, threads=t)
        return q, a

    q, a = by_threads(call)
    rq, ra = ref.fp8_cast(x, scale, fmt, saturate, nan_sign, amax_nan)
    np.testing.assert_array_equal(q, rq)
    same(a, ra)
    return q


def rows(x, fmt, amax_nan, nan_sign=True):
    """cast_rows and amax_rows of x (one scale per row) by thread count, against the twins."""
    nrows = int(np.prod(x.shape[:-1]))
    scales = (np.float32(0.75) * (1 + np.arange(nrows) % 5)).astype(np.float32)

    def call(t):
        q = np.full(x.shape, 0xA5, np.uint8)
        am = np.full(nrows, -1, np.float32)
        am2 = np.full(nrows, -1, np.float32)
        kernels.fp8_cast_rows(x, q, scales, am, fmt, True, nan_sign, amax_nan, threads=t)
        kernels.fp8_amax_rows(x, am2, amax_nan, threads=t)
        return q, am, am2

    q, am, am2 = by_threads(call)
    rq, ram = ref.fp8_cast_rows(x, scales, fmt, True, nan_sign, amax_nan)
    np.testing.assert_array_equal(q, rq)
    same(am, ram)
    same(am2, ram)
    return q, scales


def decodes(q, fmt, scales):
    """decode and decode_rows of the codes q (any layout) by thread count, against the twin."""
    for dt in DTYPES.values():

        def call(t, dt=dt):
            out = np.empty(q.shape, dt)
            out_rows = np.empty(q.shape, dt)
            kernels.fp8_decode(q, out, fmt, 2.0, threads=t)
            kernels.fp8_decode_rows(q, out_rows, scales, fmt, threads=t)
            return out.astype(np.float32), out_rows.astype(np.float32)

        out, out_rows = by_threads(call)
        same(out, ref.fp8_dequantize(q, 2.0, fmt, dt))
        same(out_rows, ref.fp8_dequantize(q, scales, fmt, dt, rows=True))


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("fmt", [E4, E5])
@pytest.mark.parametrize("saturate", [True, False], ids=["sat", "nosat"])
@pytest.mark.parametrize("amax_nan", [False, True], ids=["nan-skipped", "nan-amax"])
def test_contiguous_run_by_threads(dt, fmt, saturate, amax_nan):
    """Six chunks and a tail, specials at every chunk edge: the cast's bytes and amax, the
    amax pass and the decode."""
    x = spread(6 * CHUNK + 123, DTYPES[dt])
    q = cast(x, fmt, saturate, not saturate, amax_nan)
    same(
        by_threads(lambda t: (kernels.fp8_amax(x, amax_nan, threads=t),))[0],
        ref.fp8_amax(x, amax_nan),
    )
    decodes(q.reshape(1, -1), fmt, np.array([0.5], np.float32))


def test_nan_and_inf_in_different_chunks():
    """The amax of the parts is max-combined: the NaN of one chunk and the Inf of another
    give Inf when NaN elements are skipped and NaN when they make the amax NaN, for a
    tensor and for a row split over chunks; a chunk of zeros adds nothing."""
    x = np.zeros(5 * CHUNK, np.float32)
    x[CHUNK + 5] = np.nan
    x[3 * CHUNK - 1] = -np.inf
    x[4 * CHUNK] = 7.0
    for t in THREADS:
        assert kernels.fp8_amax(x, False, threads=t) == np.inf
        assert np.isnan(kernels.fp8_amax(x, True, threads=t))
        am = np.empty(2, np.float32)
        kernels.fp8_amax_rows(np.stack([x, np.ones_like(x)]), am, False, threads=t)
        assert am.tolist() == [np.inf, 1.0]
        kernels.fp8_amax_rows(np.stack([x, x]), am, True, threads=t)
        assert np.isnan(am).all()
    y = np.zeros(4 * CHUNK, np.float32)
    y[-1] = 2.5  # the largest value alone in the last part of the row
    am = np.empty(3, np.float32)
    for t in THREADS:
        kernels.fp8_amax_rows(np.stack([y, y[::-1], np.zeros_like(y)]), am, threads=t)
        assert am.tolist() == [2.5, 2.5, 0.0]


def _views(dt):
    """Strided and N-d reads: (name, view), each of several chunks."""
    n = 3 * CHUNK + 5
    base = spread(3 * n, dt, seed=1, every=CHUNK // 2)
    wide = spread(4 * (2 * CHUNK + 17), dt, seed=2).reshape(4, -1)  # rows split in parts
    narrow = spread(1200 * 100, dt, seed=3, every=97).reshape(1200, 100)  # rows per chunk
    cube = spread(6 * 8 * 3100, dt, seed=4, every=1001).reshape(6, 8, 3100)
    return [
        ("step", base[::3]),
        ("reverse", base[::-1]),
        ("rows-split", wide),
        ("rows-split-strided", wide[::2, ::2]),
        ("rows-per-chunk", narrow),
        ("transposed", narrow.T),
        ("3d-sliced", cube[:5, 1:, :3000]),
        ("3d-transposed", cube.transpose(1, 0, 2)),
    ]


@pytest.mark.parametrize(
    "dt",
    [pytest.param(d, marks=() if d == "float32" else pytest.mark.slow) for d in sorted(DTYPES)],
)
@pytest.mark.parametrize("fmt", [E4, pytest.param(E5, marks=pytest.mark.slow)])
def test_strided_and_nd_by_threads(dt, fmt):
    """Tensor-wise and row-wise casts, amaxes and decodes of non-contiguous views, read in
    place, with every thread count."""
    for name, v in _views(DTYPES[dt]):
        for amax_nan in (False, True):
            try:
                cast(v, fmt, True, True, amax_nan)
                q, scales = rows(v, fmt, amax_nan)
            except AssertionError as e:
                raise AssertionError(f"{name} {v.shape} {v.strides} amax_nan={amax_nan}") from e
        decodes(q, fmt, scales)
        decodes(q.reshape(-1, q.shape[-1])[::-1], fmt, scales[::-1].copy())


def test_strided_codes_decode_by_threads():
    """Codes read with a stride (every code of both formats, repeated over chunks)."""
    q = np.tile(np.arange(256, dtype=np.uint8), 3 * CHUNK // 128)
    for fmt in (E4, E5):
        view = q[::2].reshape(3, -1)
        decodes(view, fmt, np.array([1.0, 0.5, 3.0], np.float32))


def test_threads_must_not_be_negative():
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match="threads must be >= 0, got -1"):
        kernels.fp8_cast(x, np.empty(10, np.uint8), 1.0, E4, threads=-1)
    with pytest.raises(ValueError, match="threads must be >= 0, got -2"):
        kernels.fp8_amax(x, threads=-2)


@pytest.mark.skipif(kernels.pool_size() < 2, reason="one CPU: no helper threads")
def test_helpers_run_float8_chunks():
    """A large cast with two threads reaches the scan's helpers (their chunk count grows;
    a late helper may find none, so the cast is repeated), with the serial bytes each time."""
    x = spread(30 * CHUNK, np.float32)
    want = np.empty(x.size, np.uint8)
    want_a = kernels.fp8_cast(x, want, 2.0, E4, threads=1)
    q = np.empty(x.size, np.uint8)
    before = _scan._helper_chunks()
    for _ in range(2000):
        q[:] = 0
        assert kernels.fp8_cast(x, q, 2.0, E4, threads=2) == want_a
        np.testing.assert_array_equal(q, want)
        if _scan._helper_chunks() > before:
            break
    assert _scan._helper_chunks() > before


_ONE_POOL = """
import os, numpy as np
from lscore import kernels
tasks = lambda: len(os.listdir("/proc/self/task"))
x = np.ones(4_000_000, np.float32)
q = np.empty(x.size, np.uint8)
start = tasks()
kernels.fp8_cast(x, q, 1.0, "float8_e4m3fn", threads=2)
after_fp8 = tasks()
kernels.unscale_(x, 0.5, threads=2)
kernels.fp8_amax(x, threads=2)
print(start, after_fp8, tasks())
"""


@pytest.mark.skipif(kernels.pool_size() < 2, reason="one CPU: no helper threads")
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_one_pool_in_the_process():
    """The float8 kernels start the pool's helpers and the scan then uses the same ones: the
    process gains pool_size() - 1 threads, once."""
    out = subprocess.run(
        [sys.executable, "-P", "-c", _ONE_POOL], capture_output=True, text=True, check=True
    ).stdout.split()
    start, after_fp8, end = map(int, out)
    assert after_fp8 - start == kernels.pool_size() - 1
    assert end == after_fp8


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_float8_pool_works_after_fork():
    x = spread(10 * CHUNK, np.float32)
    want = np.empty(x.size, np.uint8)
    kernels.fp8_cast(x, want, 1.0, E4, threads=2)  # the pool exists now
    pid = os.fork()
    if pid == 0:  # child: the helpers are gone; a threaded call must not hang
        q = np.empty(x.size, np.uint8)
        kernels.fp8_cast(x, q, 1.0, E4, threads=2)
        os._exit(0 if np.array_equal(q, want) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
