"""The float32-scale block passes (blockwise FP8: TE's and torchao's rules) and the square
tile pass (weights in 128x128 or 32x32 tiles, every rule) of lsc_mx.h: every ISA level,
rows, columns and tiles, float32 / float16 / bfloat16 inputs, ragged tiles, thread counts
and preallocated outputs give the bytes of the slow NumPy twin
(lscore/_reference_blockwise.py)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lscore import _reference_blockwise as ref
from lscore import kernels

ml_dtypes = pytest.importorskip("ml_dtypes")

F8 = ("float8_e4m3fn", "float8_e5m2")
# (mode, pow2, eps): TE's defaults, TE with float32 scales and an epsilon, torchao's
RULES = (("te-fp32", True, 0.0), ("te-fp32", False, 1e-30), ("torchao-fp32", False, 1e-12))
MX = ("floor", "ceil", "even", "rceil", "te", "ocp")
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def bits(seed, n):
    """n float32 values from any bits: NaN, Inf, zeros, subnormals included."""
    return np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint32).view(np.float32)


def shaped(x, rows, dtype):
    """x as `rows` rows of `dtype`, every other row scaled down so that blocks of tiny
    amaxes (TE's Inf quotient, torchao's epsilon) occur, and one row all zero."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.reshape(rows, -1).copy()
        y[1::2] = (y[1::2] * np.float32(2.0**-120)).astype(np.float32)
        y[-1] = 0
        return y.astype(DTYPES[dtype])


def same(got, want, what):
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, what
        g, w = np.ascontiguousarray(g).view(np.uint8), np.ascontiguousarray(w).view(np.uint8)
        np.testing.assert_array_equal(g, w, err_msg=what)


def levels():
    for level in kernels.isa_levels():
        old = kernels.set_isa(level)
        try:
            yield level
        finally:
            kernels.set_isa(old)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(list(DTYPES)))
def test_rows_and_columns_equal_twin_at_every_level(seed, dtype):
    """Blocks of 128 along the rows, and down the columns of the transpose (axis 0: the
    same blocks, TE's columnwise copy)."""
    x = shaped(bits(seed, 4 * 256), 4, dtype)
    x32 = x.astype(np.float32)
    cases = [(e, m, p, eps) for e in F8 for m, p, eps in RULES if m == "te-fp32" or e == F8[0]]
    wants = [ref.blockwise_quantize(x32, e, m, 128, p, eps, dtype) for e, m, p, eps in cases]
    xt = np.ascontiguousarray(x.T)
    for level in levels():
        for (elem, mode, pow2, eps), (s, q) in zip(cases, wants, strict=True):
            what = f"{level} {elem} {mode} {pow2} {dtype}"
            same(kernels.mx_quantize(x, elem, mode, 128, pow2=pow2, eps=eps), (s, q), what)
            cols = kernels.mx_quantize(xt, elem, mode, 128, axis=0, pow2=pow2, eps=eps)
            same(cols, (s.T, q.T), what + " axis 0")


@settings(max_examples=8, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(list(DTYPES)),
    st.integers(1, 160),
    st.integers(1, 200),
)
def test_tiles_equal_twin_at_every_level(seed, dtype, m, k):
    """Square tiles of 128 (float32 rules) and 32 (every MX rule), a partial tile at the
    bottom and right edges scaled from the elements it has."""
    x = shaped(bits(seed, 160 * 200), 160, dtype)[:m, :k]
    x32 = x.astype(np.float32)
    cases = [
        (("float8_e4m3fn", mode, t), dict(pow2=pow2, eps=eps), (pow2, eps, dtype))
        for mode, pow2, eps in RULES
        for t in (128, 32)
    ] + [((elem, mode, 32), {}, ()) for mode in MX for elem in F8]
    wants = [ref.tile_quantize(x32, *args, *rest) for args, _, rest in cases]
    for level in levels():
        for (args, kw, _), want in zip(cases, wants, strict=True):
            got = kernels.mx_quantize(x, *args, tile=True, **kw)
            same(got, want, f"{level} {args} {kw} {dtype} {x.shape}")


def special_blocks(dtype):
    """Blocks of 128: a NaN, +Inf, -Inf, all zeros, subnormals only, an amax whose TE
    quotient overflows, amaxes at powers of two and beside them, ordinary values."""
    rng = np.random.default_rng(7)
    rows = []
    tops = [2.0**e for e in (-140, -133, -126, -100, -1, 0, 1, 8, 15, 100, 127)]
    for top in [np.nan, np.inf, -np.inf, 0.0, 1e-40, 1e-38, 3.0, 3.75, 7.0, 448.0, *tops]:
        v = rng.uniform(-1, 1, 128) * (top if np.isfinite(top) and top else 1.0)
        v[rng.integers(128)] = top
        rows.append(v)
    for top in tops:
        for s in (0, np.inf):
            v = rng.uniform(-1, 1, 128) * top
            v[5] = np.nextafter(np.float32(top), np.float32(s))
            rows.append(v)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.array(rows).astype(np.float32).astype(DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_special_blocks_equal_twin(dtype):
    x = special_blocks(dtype)
    x32 = x.astype(np.float32)
    cases = [(e, m, p, eps) for e in F8 for m, p, eps in RULES if m == "te-fp32" or e == F8[0]]
    wants = [ref.blockwise_quantize(x32, e, m, 128, p, eps, dtype) for e, m, p, eps in cases]
    for level in levels():
        for (elem, mode, pow2, eps), want in zip(cases, wants, strict=True):
            got = kernels.mx_quantize(x, elem, mode, 128, pow2=pow2, eps=eps)
            same(got, want, f"{level} {mode} {elem} {pow2}")
            tiles = kernels.mx_quantize(x, elem, mode, 32, tile=True, pow2=pow2, eps=eps)
            same(tiles, ref.tile_quantize(x32, elem, mode, 32, pow2, eps, dtype), "tiles")


def test_the_rules_special_values():
    """The lines of each rule that the special blocks reach, by hand: TE gives scale 1 to
    an all-zero, NaN-free-Inf or NaN-only block and the input dtype's largest value to an
    Inf quotient; torchao's epsilon, its scale 0 for an Inf and NaN for a NaN."""
    s = kernels.mx_blockwise_scale
    amax = np.array([0, np.inf, np.nan, 1e-38, 3.0], np.float32)
    np.testing.assert_array_equal(
        s(amax, "float8_e4m3fn", "te-fp32", True, 0.0, "bfloat16"),
        np.array([1, 1, 1, 2.0**127, 128], np.float32),
    )
    np.testing.assert_array_equal(
        s(amax, "float8_e4m3fn", "te-fp32", False, 0.0, "float16")[3], np.float32(65504)
    )
    ao = s(amax, "float8_e4m3fn", "torchao-fp32", False, 1e-12)
    np.testing.assert_array_equal(ao[:2], np.array([np.float32(448 / 1e-12), 0], np.float32))
    assert np.isnan(ao[2]) and ao[4] == np.float32(448 / 3)
    # TE's epsilon is taken as float32; a block whose amax is below it scales as at eps
    eps = s(np.float32(1e-3), "float8_e5m2", "te-fp32", False, 0.5)
    assert eps == np.float32(57344 / 0.5)
    # the codes: TE keeps NaN elements out of the amax; torchao's NaN block is all NaN and
    # its Inf block 0s (signed) and, where the Inf was, the x86 NaN 0xFF
    x = np.zeros((2, 128), np.float32)
    x[0, :3] = [np.nan, 3.0, -1.5]
    x[1, :3] = [-np.inf, 1.0, -2.0]
    s_te, q_te = kernels.mx_quantize(x, "float8_e4m3fn", "te-fp32", 128, pow2=True)
    assert list(q_te[0, :3]) == [0x7F, 0x7C, 0xF4] and s_te[0, 0] == np.float32(2.0**-7)
    assert list(q_te[1, :3]) == [0xFE, 0x38, 0xC0] and s_te[1, 0] == 1
    s_ao, q_ao = kernels.mx_quantize(x, "float8_e4m3fn", "torchao-fp32", 128, eps=1e-12)
    assert (q_ao[0] == 0x7F).all() and s_ao.view(np.uint32)[0, 0] == 0x7FC00000
    assert list(q_ao[1, :3]) == [0xFF, 0x00, 0x80] and s_ao[1, 0] == np.inf


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiles_of_many_bands(dtype):
    """From 8 bands of tiles on, the tile pass cuts whole bands, wider than 8192 columns in
    equal pieces: the twin's bytes for 9 bands of 32 (the last one ragged), and the bytes
    of each band quantized alone (cut otherwise) for 9 bands of 128 by 8320 + 5 columns."""
    x = shaped(bits(5, 261 * 300), 261, dtype)
    kw = dict(pow2=True, eps=0.0)
    want = ref.tile_quantize(x.astype(np.float32), "float8_e4m3fn", "te-fp32", 32, True, 0.0, dtype)
    for level in levels():
        same(kernels.mx_quantize(x, "float8_e4m3fn", "te-fp32", 32, tile=True, **kw), want, level)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((8 * 128 + 7, 8325)) * 2.0 ** rng.integers(-9, 9, 8325)).astype(
        DTYPES[dtype]
    )
    for level in levels():
        s, q = kernels.mx_quantize(x, "float8_e4m3fn", "te-fp32", 128, tile=True, **kw)
        for b in range(0, x.shape[0], 128):
            one = kernels.mx_quantize(
                x[b : b + 128], "float8_e4m3fn", "te-fp32", 128, tile=True, **kw
            )
            same((s[b // 128 : b // 128 + 1], q[b : b + 128]), one, f"{level} band {b // 128}")


@pytest.mark.parametrize("tile", [False, True])
def test_threads_strides_and_out_give_the_same_bytes(tile):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((512, 1536)) * 2.0 ** rng.integers(-30, 30, (512, 1))).astype(
        ml_dtypes.bfloat16
    )
    args = ("float8_e4m3fn", "te-fp32", 128)
    one = kernels.mx_quantize(x, *args, tile=tile, pow2=True, threads=1)
    for threads in (0, 2, 3):
        same(kernels.mx_quantize(x, *args, tile=tile, pow2=True, threads=threads), one, threads)
    wide = np.zeros((512, 3072), ml_dtypes.bfloat16)
    wide[:, ::2] = x
    same(kernels.mx_quantize(wide[:, ::2], *args, tile=tile, pow2=True), one, "strided")
    out = (np.empty_like(one[0]), np.empty_like(one[1]))
    got = kernels.mx_quantize(x, *args, tile=tile, pow2=True, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    same(got, one, "out")


def test_bad_arguments():
    x = np.ones((4, 128), np.float32)
    with pytest.raises(ValueError, match="elem must be float8_e4m3fn or float8_e5m2 for mode"):
        kernels.mx_quantize(x, "float4_e2m1", "te-fp32", 128)
    with pytest.raises(ValueError, match="for tiles, got 'float4_e2m1'"):
        kernels.mx_quantize(x, "float4_e2m1", "floor", 32, tile=True)
    with pytest.raises(ValueError, match="pow2 and eps are the float32 rules'"):
        kernels.mx_quantize(x, "float8_e4m3fn", "floor", 32, pow2=True)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        kernels.mx_quantize(x, "float8_e4m3fn", "te-fp32", 128, eps=-1.0)
    with pytest.raises(ValueError, match=r"tiles need a 2-D input, got shape \(2, 4, 128\)"):
        kernels.mx_quantize(np.ones((2, 4, 128)), "float8_e4m3fn", "te-fp32", 128, tile=True)
    with pytest.raises(ValueError, match="out scales must be a NumPy array of float32 scales"):
        kernels.mx_quantize(
            x, "float8_e4m3fn", "te-fp32", 128, out=(np.empty((4, 1), np.uint8), None)
        )
    with pytest.raises(ValueError, match="has float32 scales: see blockwise_scale"):
        kernels.mx_scale(np.ones(2, np.float32), "float8_e4m3fn", "te-fp32")
    with pytest.raises(ValueError, match="dtype must be one of: float32, float16, bfloat16"):
        kernels.mx_blockwise_scale(np.ones(2, np.float32), "float8_e4m3fn", "te-fp32", dtype="x")
