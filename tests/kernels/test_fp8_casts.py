"""The float8 casts of lsc_fp8.h (lscore.kernels.fp8_cast / fp8_decode) against torch 2.13's
float8 conversions, ml_dtypes and lscore._reference_fp8, at every ISA level.

torch's casts are the references where they exist: its e4m3fn cast saturates
(overflow and +-Inf give +-448, torch >= 2.12), its e5m2 cast does not (+-Inf);
the saturating e5m2 cast is torch's after a clamp to +-57344 (torchao's
to_fp8_saturated); the non-saturating e4m3fn cast (overflow to NaN) is
ml_dtypes'.  torch writes a NaN as 0x7F with its sign (0xFF), ml_dtypes
writes e5m2's NaN as 0x7E: NaNs are compared by value where the encodings
differ, and by byte against the rule the flags choose.
"""

import tracemalloc

import numpy as np
import pytest

from lscore import _reference_fp8 as ref
from lscore import kernels

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

E4, E5 = "float8_e4m3fn", "float8_e5m2"
TORCH = {E4: torch.float8_e4m3fn, E5: torch.float8_e5m2}
ML = {E4: ml_dtypes.float8_e4m3fn, E5: ml_dtypes.float8_e5m2}
MAX = {E4: 448.0, E5: 57344.0}
HALVES = {"bfloat16": (ml_dtypes.bfloat16, torch.bfloat16), "float16": (np.float16, torch.float16)}
# (format, saturate): every rule that exists
MODES = [(E4, True), (E4, False), (E5, True), (E5, False)]
MODE_IDS = ["e4m3fn-sat", "e4m3fn-nosat", "e5m2-sat", "e5m2-nosat"]


@pytest.fixture(params=kernels.isa_levels())
def isa(request):
    old = kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa(old)


def cast(x, scale=1.0, fmt=E4, saturate=True, nan_sign=True, amax_nan=False):
    q = np.empty(x.shape, np.uint8)
    amax = kernels.fp8_cast(x, q, scale, fmt, saturate, nan_sign, amax_nan)
    return q, amax


def expected(x32, fmt, saturate):
    """The codes torch (or, for e4m3fn without saturation, ml_dtypes) gives for float32
    values x32, with torch's NaN (0x7F and the sign); None where no library has the rule."""
    if fmt == E4 and not saturate:
        with np.errstate(invalid="ignore"):
            return x32.astype(ML[fmt]).view(np.uint8)  # ml_dtypes: overflow and Inf to NaN
    t = torch.from_numpy(x32)
    if saturate and fmt == E5:
        t = t.clamp(-MAX[fmt], MAX[fmt])  # clamp keeps NaN
    return t.to(TORCH[fmt]).view(torch.uint8).numpy()


def check_codes(q, x32, fmt, saturate, nan_sign):
    """q against the library codes of x32: bitwise, NaNs as the flags ask."""
    want = expected(x32, fmt, saturate).copy()
    nan = np.isnan(x32)
    # a NaN input follows nan_sign; ml_dtypes' overflow NaN keeps the value's sign regardless
    want[nan] = np.where(np.signbit(x32[nan]) & nan_sign, 0xFF, 0x7F)
    bad = np.nonzero(q != want)[0]
    assert bad.size == 0, [
        (hex(x32[i : i + 1].view(np.uint32)[0]), hex(q[i]), hex(want[i])) for i in bad[:8]
    ]


@pytest.mark.parametrize("src", sorted(HALVES))
@pytest.mark.parametrize(("fmt", "saturate"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("nan_sign", [True, False], ids=["nan-signed", "nan-7f"])
def test_every_half_pattern(isa, src, fmt, saturate, nan_sign):
    """All 65536 bfloat16 / float16 words, unscaled: torch's (or ml_dtypes') codes."""
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    x = words.view(HALVES[src][0])
    q, _ = cast(x, 1.0, fmt, saturate, nan_sign)
    check_codes(q, x.astype(np.float32), fmt, saturate, nan_sign)
    # torch converts its own half tensors the same way
    if not (fmt == E4 and not saturate):
        t = torch.from_numpy(words.view(np.int16)).view(HALVES[src][1]).float()
        if saturate:
            t = t.clamp(-MAX[fmt], MAX[fmt])
        tq = t.to(TORCH[fmt]).view(torch.uint8).numpy()
        if nan_sign:
            np.testing.assert_array_equal(q, tq)


@pytest.mark.parametrize("src", sorted(HALVES))
@pytest.mark.parametrize(("fmt", "saturate"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("scale", [1.0, 3.0, 1 / 3, 448 / 65504, 2.0**-20, 2.0**20, 0.0, np.inf])
def test_every_half_pattern_scaled_matches_reference(src, fmt, saturate, scale):
    """All 65536 words times a float32 scale (the product rounds, then narrows): the slow
    twin's codes and amax, and ml_dtypes' value of float32(x * scale)."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(HALVES[src][0])
    for nan_sign, amax_nan in ((True, False), (False, True)):
        q, amax = cast(x, scale, fmt, saturate, nan_sign, amax_nan)
        rq, ramax = ref.fp8_cast(x, scale, fmt, saturate, nan_sign, amax_nan)
        np.testing.assert_array_equal(q, rq)
        assert (np.isnan(amax) and np.isnan(ramax)) or amax == ramax
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.astype(np.float32) * np.float32(scale)
    if saturate:
        y = np.clip(y, -MAX[fmt], MAX[fmt])
    got = q.view(ML[fmt]).astype(np.float32)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, y.astype(ML[fmt]).astype(np.float32))


def dense_float32():
    """Every float32 exponent and sign, with the mantissas next to every place a rounding
    boundary of either format can fall (each bit position: the kept pattern's low bits, the
    half-ulp, +-1), and random mantissas."""
    shift = np.arange(24)[:, None, None]
    kept = np.arange(8)[None, :, None]
    nudge = np.array([-1, 0, 1])[None, None, :]
    mant = (((kept << shift) + nudge) & 0x7FFFFF).ravel().astype(np.uint32)
    rng = np.random.default_rng(34)
    mant = np.unique(np.concatenate([mant, rng.integers(0, 1 << 23, 2000, dtype=np.uint32)]))
    exp = np.arange(256, dtype=np.uint32)
    words = ((exp[:, None] << 23) | mant[None, :]).ravel()
    words = np.concatenate([words, words | 0x80000000])
    return words.view(np.float32)


@pytest.mark.parametrize(("fmt", "saturate"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("nan_sign", [True, False], ids=["nan-signed", "nan-7f"])
def test_dense_float32_sample(isa, fmt, saturate, nan_sign):
    """~1.3M float32 patterns around every rounding boundary of every exponent."""
    x = dense_float32()
    q, _ = cast(x, 1.0, fmt, saturate, nan_sign)
    check_codes(q, x, fmt, saturate, nan_sign)


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "saturate"), MODES, ids=MODE_IDS)
def test_every_float32_pattern(fmt, saturate):
    """All 2**32 float32 patterns, in chunks of 2**24 (vectorised end to end; about a
    minute per mode on one core of a shared 2-core machine): torch's (ml_dtypes') codes;
    both NaN encodings."""
    chunk = 1 << 24
    q = np.empty(chunk, np.uint8)
    q7f = np.empty(chunk, np.uint8)
    base = np.arange(chunk, dtype=np.uint32)
    for start in range(0, 1 << 32, chunk):
        x = (base + np.uint32(start)).view(np.float32)
        kernels.fp8_cast(x, q, 1.0, fmt, saturate, True)
        kernels.fp8_cast(x, q7f, 1.0, fmt, saturate, False)
        want = expected(x, fmt, saturate)  # NaN: 0x7F with the sign, in every library
        nan = np.isnan(x)
        assert np.array_equal(q, want), hex(start)
        assert np.array_equal(q7f[~nan], want[~nan]) and (q7f[nan] == 0x7F).all(), hex(start)


@pytest.mark.parametrize(("fmt", "saturate"), MODES, ids=MODE_IDS)
def test_scaled_cast_is_torchs_recipe(isa, fmt, saturate):
    """q = cast(float32(x) * scale): torch's `(x.float() * s)` then its cast (clamped first
    where the rule saturates), for bfloat16 and float32 inputs and scales that round."""
    rng = np.random.default_rng(7)
    x32 = (rng.standard_normal(5000) * rng.choice([1e-6, 1e-2, 1, 100, 1e5], 5000)).astype(
        np.float32
    )
    x32[:6] = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0]
    for s in (1.0, 3.7, 448 / 3.1, 1e-3, 2.0**-133, 7e30):
        for x in (x32, x32.astype(ml_dtypes.bfloat16)):
            t = torch.from_numpy(x.astype(np.float32)) * torch.tensor(s, dtype=torch.float32)
            q, _ = cast(x, s, fmt, saturate)
            check_codes(q, t.numpy(), fmt, saturate, True)


def test_amax_ignores_or_propagates_nan(isa):
    """amax of the input (before the scale): TE's fmaxf skips NaN elements, torch.max
    propagates NaN; an Inf is the amax either way; empty or all-NaN (skipping) gives 0."""
    x = np.array([1.5, -np.nan, -7.25, 3.0], np.float32)
    assert cast(x, 1e-3)[1] == 7.25
    assert np.isnan(cast(x, 1e-3, amax_nan=True)[1])
    assert np.isnan(float(torch.from_numpy(x).abs().max()))
    assert cast(np.array([np.nan, -np.nan], np.float32))[1] == 0.0
    assert cast(np.zeros(0, np.float32))[1] == 0.0
    assert cast(np.array([-np.inf, np.nan, 2], np.float32))[1] == np.inf
    assert cast(np.array([-np.inf, 2], np.float32), amax_nan=True)[1] == np.inf
    assert cast(np.array([-0.0], np.float32))[1] == 0.0
    for src in (np.float16, ml_dtypes.bfloat16):
        rng = np.random.default_rng(1)
        v = (rng.standard_normal(1001) * 300).astype(src)
        v[500] = np.nan
        for amax_nan in (False, True):
            _, amax = cast(v, 2.0, E5, amax_nan=amax_nan)
            _, want = ref.fp8_cast(v, 2.0, E5, amax_nan=amax_nan)
            assert (np.isnan(amax) and np.isnan(want)) or amax == want


@pytest.mark.parametrize("src", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_strided_input_read_in_place(isa, src):
    """Transposed, stepped, negative-stride and 0-d inputs give the codes and amax of their
    contiguous copy, and the call allocates nothing the size of the input."""
    rng = np.random.default_rng(3)
    base = (rng.standard_normal((37, 66)) * 200).astype(src)
    base[5, 7] = np.nan
    views = [base.T, base[::3, 1::2], base[::-1, ::-2], base[4], base[:, 5], base[2, 3, ...]]
    for v in views:
        for amax_nan in (False, True):
            q, amax = cast(v, 3.0, E4, amax_nan=amax_nan)
            qc, amaxc = cast(np.ascontiguousarray(v), 3.0, E4, amax_nan=amax_nan)
            np.testing.assert_array_equal(q, qc)
            assert (np.isnan(amax) and np.isnan(amaxc)) or amax == amaxc
    big = np.zeros((2000, 2000), src)[:, ::2]
    out = np.empty(big.shape, np.uint8)
    tracemalloc.start()
    try:
        kernels.fp8_cast(big, out, 1.0, E4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < big.nbytes // 16, peak


def test_every_level_equals_the_scalar_path():
    """Each ISA level's contiguous kernels give the bits of the scalar function, which a
    strided run calls element by element (lengths around every vector width)."""
    rng = np.random.default_rng(11)
    x = dense_float32()
    x = x[rng.permutation(x.size)][:40000]
    strided = np.repeat(x, 2)[::2]
    old = kernels.set_isa("")
    try:
        for level in kernels.isa_levels():
            kernels.set_isa(level)
            for n in (0, 1, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 40000):
                for fmt, sat in MODES:
                    for flags in ((True, False), (False, True)):
                        q, a = cast(x[:n], 0.75, fmt, sat, *flags)
                        qs, s = cast(strided[:n], 0.75, fmt, sat, *flags)
                        np.testing.assert_array_equal(q, qs, err_msg=f"{level} {n} {fmt}")
                        assert (np.isnan(a) and np.isnan(s)) or a == s
    finally:
        kernels.set_isa(old)


def test_set_isa_switches_every_cpu_kernel():
    from lscore._ext import _fp8, _scan

    old = kernels.set_isa(kernels.isa_levels()[0])
    try:
        assert _fp8.isa() == _scan.isa() == kernels.isa_levels()[0]
    finally:
        kernels.set_isa(old)
    with pytest.raises(ValueError, match="not available"):
        kernels.set_isa("v9")


@pytest.mark.parametrize("fmt", [E4, E5])
def test_decode_every_code(isa, fmt):
    """All 256 codes widen exactly: float32 bit for bit as torch widens them (NaN words
    included), float16 and bfloat16 by value (NaN where torch has NaN)."""
    codes = np.arange(256, dtype=np.uint8)
    t = torch.from_numpy(codes).view(TORCH[fmt])
    values = ref.fp8_decode(codes, fmt)
    for name, want in (("float32", t.float()), ("float16", t.half()), ("bfloat16", t.bfloat16())):
        dt = np.float32 if name == "float32" else HALVES[name][0]
        out = np.empty(256, dt)
        kernels.fp8_decode(codes, out, fmt)
        w = want.float().numpy()
        np.testing.assert_array_equal(out.astype(np.float64), values)
        np.testing.assert_array_equal(out.astype(np.float32), w)
        if name == "float32":
            np.testing.assert_array_equal(out.view(np.uint32), w.view(np.uint32))
    # the float8 dtype itself, and a strided, 2-d run of codes
    out = np.empty(128, np.float32)
    kernels.fp8_decode(codes[::2].view(ML[fmt]), out, fmt)
    np.testing.assert_array_equal(out.astype(np.float64), values[::2])
    out2 = np.empty((16, 8), np.float32)
    kernels.fp8_decode(codes.reshape(16, 16)[:, ::2], out2, fmt)
    np.testing.assert_array_equal(out2.ravel(), out)


@pytest.mark.parametrize("fmt", [E4, E5])
def test_round_trip(isa, fmt):
    """Every finite code casts back to itself from each float dtype it widens to."""
    codes = np.arange(256, dtype=np.uint8)
    finite = np.isfinite(ref.fp8_decode(codes, fmt))
    for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
        wide = np.empty(256, dt)
        kernels.fp8_decode(codes, wide, fmt)
        q, _ = cast(wide, 1.0, fmt, saturate=False)
        np.testing.assert_array_equal(q[finite], codes[finite])


def test_errors():
    x = np.ones(4, np.float32)
    q = np.empty(4, np.uint8)
    with pytest.raises(ValueError, match="unknown float8 format 'e4m3'; expected one of"):
        kernels.fp8_cast(x, q, 1.0, "e4m3")
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16, got float64"):
        kernels.fp8_cast(x.astype(np.float64), q, 1.0, E4)
    with pytest.raises(TypeError, match="out must be uint8 or the format's float8 dtype"):
        kernels.fp8_cast(x, np.empty(4, ml_dtypes.float8_e5m2), 1.0, E4)
    with pytest.raises(ValueError, match=r"out must have the input's shape \(4,\), got \(2, 2\)"):
        kernels.fp8_cast(x, q.reshape(2, 2), 1.0, E4)
    with pytest.raises(ValueError, match="writable C-contiguous"):
        kernels.fp8_cast(x[:2], np.empty(4, np.uint8)[::2], 1.0, E4)
    ro = np.empty(4, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable C-contiguous"):
        kernels.fp8_cast(x, ro, 1.0, E4)
    with pytest.raises(ValueError, match="native byte order"):
        kernels.fp8_cast(x.astype(">f4"), q, 1.0, E4)
    with pytest.raises(TypeError, match="out must be float32, float16 or bfloat16"):
        kernels.fp8_decode(q, np.empty(4, np.float64), E4)
    out = np.empty(4, ml_dtypes.float8_e4m3fn)
    kernels.fp8_cast(x, out, 1.0, E4)
    assert out.view(np.uint8).tolist() == [0x38] * 4
