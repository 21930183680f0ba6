"""The one-pass unscale + check + norm kernels (_ext/scan.cu) on the CPU host harness.

lscore.cuda.ArrayKernels runs unchanged on NumPy arrays and the harness, so
these are the CuPy adapter's ``unscale_and_norm`` / ``unscale_and_clip_``
end to end: the unscaled values must equal the CPU core's ``lscore.unscale_``
bit for bit, the found flag its answer, the inf-norm the exact largest
magnitude, the 2-norm a float64 NumPy reference within 1e-12 (relative) and
the same bits from call to call; the clip must be torch's formula.  Small
chunks, blocks and launch limits put chunk edges, several launches per dtype
and several fold levels into small arrays.
"""

import math
import shutil

import numpy as np
import pytest

import lscore
from helpers import FLOAT_DTYPES, bits_equal_or_both_nan
from helpers.gen import nonfinite_values, special_values
from lscore import cuda, kernels
from lscore.cuda.arrays import clip_coefficient

if shutil.which("g++") is None:
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from helpers import cuda_host

# (chunk, block, max_tensors, max_blocks): the last ones force many launches
CONFIGS = [
    (8, 1, 4096, 65535),
    (16, 3, 4096, 65535),
    (64, 32, 3, 5),
    (8, 4, 2, 3),
    (1024, 64, 1, 1),
    (16, 70, 4096, 65535),
]
INVS = [0.5, 2.0, 1 / 3, 1.0, 1e-5, 65536.0, float(np.float32(1 / 3000))]
L2_RTOL = 1e-12


def _kernels(cfg) -> cuda.ArrayKernels:
    chunk, block, mt, mb = cfg
    return cuda.ArrayKernels(
        np,
        lambda dev: cuda_host.HostBackend(),
        kind=kernels.READ_NUMPY,
        limits=dict(chunk=chunk, block=block, max_tensors=mt, max_blocks=mb),
    )


def _tensor(rng, dt, n, chunk, offset, bad_at):
    """n elements starting `offset` elements into a fresh buffer; NaN/Inf where `bad_at` says."""
    buf = (rng.standard_normal(n + offset) * rng.choice([1e-3, 1.0, 300.0])).astype(dt)
    a = buf[offset:]
    if n and bad_at:
        bad = rng.choice(nonfinite_values(dt))
        pos = {"first": 0, "last": n - 1, "chunk_edge": min(n - 1, chunk)}[bad_at]
        a[pos] = bad
    if n and rng.random() < 0.3:
        for v in special_values(dt).values():
            a[int(rng.integers(0, n))] = v
    return a


def _cases(seed, count):
    """(case, config, arrays, inv): every dtype, sizes around the chunk, misaligned starts,
    empty arrays, NaN/Inf first, last and on a chunk edge (integer arrays are refused:
    test_integer_arrays_are_refused)."""
    rng = np.random.default_rng(seed)
    for case in range(count):
        cfg = CONFIGS[case % len(CONFIGS)]
        chunk = cfg[0]
        dts = [FLOAT_DTYPES[(case // len(CONFIGS)) % len(FLOAT_DTYPES)]]
        if case % 5 == 0:
            dts = list(FLOAT_DTYPES)
        sizes = [0, 1, 2, chunk - 1, chunk, chunk + 1, 2 * chunk, 3 * chunk + 5, 31]
        bad_at = rng.choice([None, None, "first", "last", "chunk_edge"])
        arrays = []
        for k in range(int(rng.integers(1, 9))):
            dt = dts[int(rng.integers(0, len(dts)))]
            n = int(rng.choice(sizes))
            offset = int(rng.choice([0, 0, 1, 3]))  # misaligned starts take the scalar path
            if dt not in FLOAT_DTYPES:
                arrays.append(rng.integers(-5, 5, n + offset).astype(dt)[offset:])
                continue
            # NaN/Inf first: in the first array only; last or on a chunk edge: in any
            bad = bad_at if (k == 0 or bad_at != "first") and rng.random() < 0.5 else None
            arrays.append(_tensor(rng, dt, n, chunk, offset, bad))
        yield case, cfg, arrays, float(rng.choice(INVS))


def _reference_norm(values, inf_norm: bool) -> float:
    """The float64 NumPy norm of every floating array in `values`."""
    flat = [a.astype(np.float64).ravel() for a in values if a.dtype in FLOAT_DTYPES]
    x = np.concatenate(flat) if flat else np.zeros(0)
    if inf_norm:
        return float(np.max(np.abs(x))) if x.size else 0.0
    with np.errstate(over="ignore"):  # float64 max squared: Inf, as in the kernels
        return float(np.sqrt(np.sum(x * x)))


def _assert_norm(got: float, want: float, inf_norm: bool, ctx) -> None:
    if math.isnan(want) or inf_norm:
        assert bits_equal_or_both_nan(np.float64(got), np.float64(want)), (got, want, ctx)
    else:
        assert got == pytest.approx(want, rel=L2_RTOL, abs=0.0), ctx


@pytest.mark.parametrize("norm_type", [2.0, math.inf], ids=["l2", "inf"])
def test_unscale_and_norm_matches_cpu_core_and_float64_reference(norm_type):
    inf_norm = norm_type == math.inf
    for case, cfg, arrays, inv in _cases(11 if inf_norm else 12, 240):
        cpu = [a.copy() for a in arrays]
        finite_cpu, l2_cpu, max_cpu = lscore.unscale_(cpu, inv, stats=True)
        finite, norm = _kernels(cfg).unscale_and_norm(arrays, inv, norm_type)
        ctx = (case, cfg, inv, [(a.dtype.name, a.size, a.ctypes.data % 16) for a in arrays])
        assert finite == finite_cpu, ctx
        for k, (g, c) in enumerate(zip(arrays, cpu, strict=True)):
            want = cuda_host.device_words(c, written=inv != 1.0)
            assert np.array_equal(g.view(f"u{g.itemsize}"), want), (ctx, k)
        _assert_norm(norm, _reference_norm(cpu, inf_norm), inf_norm, ctx)
        _assert_norm(norm, max_cpu if inf_norm else l2_cpu, inf_norm, ctx)
        if not finite:
            assert not math.isfinite(norm), ctx


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("norm_type", [2.0, math.inf], ids=["l2", "inf"])
def test_norm_is_the_same_bits_call_after_call(cfg, norm_type):
    rng = np.random.default_rng(7)
    arrays = [
        (rng.standard_normal(n) * 1e3).astype(dt)
        for n, dt in zip([1000, 77, 4096, 3], FLOAT_DTYPES, strict=True)
    ]
    ak = _kernels(cfg)
    norms = {np.float64(ak.unscale_and_norm(arrays, 1.0, norm_type)[1]).tobytes() for _ in range(3)}
    # a fresh launcher (new buffers, new tables) over the same arrays: the same bits too
    norms.add(np.float64(_kernels(cfg).unscale_and_norm(arrays, 1.0, norm_type)[1]).tobytes())
    assert len(norms) == 1


def _torch_clip_reference(values, max_norm: float, norm: float, found: bool) -> list:
    """torch's clip on the unscaled `values`: coefficient max_norm / (norm + 1e-6) clamped
    to 1, float32(coef) below float64 (widen, multiply, round to nearest even)."""
    coef = 1.0 if found or not math.isfinite(norm) else min(1.0, max_norm / (norm + 1e-6))
    out = []
    for a in values:
        if a.dtype not in FLOAT_DTYPES or coef == 1.0:
            out.append(a.copy())
        elif a.dtype == np.float64:
            out.append(a * coef)
        else:
            out.append((a.astype(np.float32) * np.float32(coef)).astype(a.dtype))
    return out


@pytest.mark.parametrize("norm_type", [2.0, math.inf], ids=["l2", "inf"])
def test_unscale_and_clip_is_torchs_formula(norm_type):
    inf_norm = norm_type == math.inf
    rng = np.random.default_rng(5)
    clipped = 0
    for case, cfg, arrays, inv in _cases(21 if inf_norm else 22, 180):
        unscaled = [a.copy() for a in arrays]
        finite_cpu = lscore.unscale_(unscaled, inv)
        want_norm = _reference_norm(unscaled, inf_norm)
        # below, near and above the norm, so both branches of the clamp run
        base = want_norm if 1e-3 < want_norm < 1e300 else 1.0
        max_norm = base * float(rng.choice([0.25, 0.999, 1.5]))
        finite, norm = _kernels(cfg).unscale_and_clip_(arrays, inv, max_norm, norm_type)
        ctx = (case, cfg, inv, max_norm)
        assert finite == finite_cpu, ctx
        _assert_norm(norm, want_norm, inf_norm, ctx)
        want = _torch_clip_reference(unscaled, max_norm, norm, not finite)
        for k, (g, w) in enumerate(zip(arrays, want, strict=True)):
            words = cuda_host.device_words(w, written=inv != 1.0)
            assert np.array_equal(g.view(f"u{g.itemsize}"), words), (ctx, k)
        clipped += finite and clip_coefficient(norm, max_norm, False) < 1.0
    assert clipped > 20


def test_clip_leaves_nonfinite_steps_alone():
    a = np.array([3.0, np.inf, 4.0], np.float32)
    b = np.full(40, 2.0, np.float16)
    finite, norm = _kernels(CONFIGS[1]).unscale_and_clip_([a, b], 0.5, 1e-3)
    assert not finite and norm == math.inf
    assert a.tolist() == [1.5, math.inf, 2.0] and np.all(b == 1.0)


def test_nan_wins_over_inf_in_both_norms():
    for norm_type in (2.0, "inf"):
        a = np.array([np.inf, 1.0, np.nan, -np.inf], np.float32)
        finite, norm = _kernels(CONFIGS[0]).unscale_and_norm([a], 1.0, norm_type)
        assert not finite and math.isnan(norm)


def test_empty_input_has_norm_zero_and_clips_nothing():
    ak = _kernels(CONFIGS[2])
    assert ak.unscale_and_norm([], 0.5) == (True, 0.0)
    assert ak.unscale_and_norm([np.zeros(0, np.float16), None], 0.5, "inf") == (True, 0.0)


def test_integer_arrays_are_refused():
    """unscale_, unscale_and_norm and unscale_and_clip_ refuse integer and bool arrays
    (they cannot be unscaled) before any launch; all_finite counts them as finite."""
    ak = _kernels(CONFIGS[2])
    ints, f = np.arange(5, dtype=np.int64), np.full(3, 4.0, np.float32)
    assert ak.all_finite([f, {"a": ints}])
    for call in (
        lambda: ak.unscale_([f, {"a": ints}], 0.5),
        lambda: ak.unscale_and_norm([f, {"a": ints}], 0.5),
        lambda: ak.unscale_and_clip_([f, {"a": ints}], 0.5, 1.0),
    ):
        with pytest.raises(TypeError, match=r"array 1 \(in flattened order\) is int64"):
            call()
    assert ints.tolist() == [0, 1, 2, 3, 4] and np.all(f == 4.0)


def test_many_blocks_and_launches_fold_on_the_device():
    backend = cuda_host.HostBackend()
    ak = cuda.ArrayKernels(
        np,
        lambda dev: backend,
        kind=kernels.READ_NUMPY,
        limits=dict(chunk=16, block=70, max_tensors=3, max_blocks=4),
    )
    arrays = [np.full(n, 0.5, np.float32) for n in (300, 17, 0, 129, 64)]
    finite, norm = ak.unscale_and_norm(arrays, 2.0)
    # 510 ones: exact in any order
    assert finite and norm == math.sqrt(510)
    names = [name for name, _, _ in backend.launches]
    # 33 blocks of 70 threads (three warps, the last one partial) over 9 launches: each
    # block folds its threads, the last block of each launch the launch's blocks, the last
    # launch the call's total; no other launch, and the arrival ticket is 0 again
    assert set(names) == {"lsc_mt_unscale_norm<lsc_f32, lsc_meta_4k>"} and len(names) == 9
    assert ak.device(0)._norm_dev[5] == 0.0
    finite, again = ak.unscale_and_norm(arrays, 1.0)
    assert finite and again == math.sqrt(510)


@pytest.mark.parametrize(
    "bad",
    [
        dict(norm_type=1.0),
        dict(norm_type=3),
        dict(norm_type="fro"),
        dict(norm_type=None),
        dict(max_norm=0.0),
        dict(max_norm=-1.0),
        dict(max_norm=math.nan),
        dict(max_norm=math.inf),
        dict(inv_scale=0.0),
        dict(inv_scale=math.inf),
    ],
    ids=lambda d: f"{next(iter(d))}={next(iter(d.values()))!r}",
)
def test_bad_arguments_are_refused_before_any_write(bad):
    a = np.array([1.0, 2.0, 3.0], np.float32)
    args = dict(inv_scale=0.5, max_norm=1.0, norm_type=2.0) | bad
    ak = _kernels(CONFIGS[0])
    with pytest.raises(ValueError, match=next(iter(bad))):
        ak.unscale_and_clip_([a], **args)
    if "max_norm" not in bad:
        with pytest.raises(ValueError, match=next(iter(bad))):
            ak.unscale_and_norm([a], args["inv_scale"], args["norm_type"])
    assert a.tolist() == [1.0, 2.0, 3.0]


def test_read_only_and_shared_arrays_are_refused_before_any_write():
    a = np.array([1.0, 2.0], np.float32)
    ro = np.array([1.0, 2.0], np.float32)
    ro.flags.writeable = False
    ak = _kernels(CONFIGS[0])
    with pytest.raises(ValueError, match="read-only"):
        ak.unscale_and_norm([a, ro], 0.5)
    with pytest.raises(ValueError):
        ak.unscale_and_clip_([a, a[1:]], 0.5, 1.0)
    assert a.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_every_half_bit_pattern(dt):
    """All 65,536 words (NaNs and Infs removed), through the vector path."""
    a = np.arange(65536, dtype=np.uint16).view(np.dtype(dt))
    a = a[np.isfinite(a.astype(np.float32))].copy()
    for inv in (0.5, 1.5, 2.0**-20):
        x = a.copy()
        cpu = a.copy()
        _, l2_cpu, max_cpu = lscore.unscale_(cpu, inv, stats=True)
        _, l2 = _kernels((4096, 64, 4096, 65535)).unscale_and_norm(x, inv)
        y = a.copy()
        _, mx = _kernels((4096, 64, 4096, 65535)).unscale_and_norm(y, inv, "inf")
        assert np.array_equal(x.view(np.uint16), cpu.view(np.uint16))
        assert mx == max_cpu and l2 == pytest.approx(l2_cpu, rel=L2_RTOL, abs=0.0)
