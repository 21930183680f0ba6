"""TransformerEngine v2.18's NVFP4 recipe kernels (lsc_nvfp4.h, lscore.kernels.nvfp4_te_*,
hadamard16, philox4x32_10, e2m1_*): the generator against the published Philox4x32-10
answers, the worked examples derived from TE's source lines, and every pass against the
NumPy twin (lscore/_reference_nvfp4.py) on generated inputs at every ISA level and thread
count, both orientations, tiles, the Hadamard transform and stochastic rounding."""

import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lscore import _reference_nvfp4 as ref
from lscore import kernels

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16

# Random123's known answers for Philox4x32-10 (DEShawResearch/random123 tests/kat_vectors,
# the "philox4x32 10" lines): counter words, key words, output words
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def test_philox_known_answers():
    for ctr, key, want in KAT:
        assert tuple(kernels.philox4x32_10(np.array(ctr, np.uint32), key)) == want
        assert tuple(ref.philox4x32_10(np.array(ctr, np.uint32), key)) == want


def test_draws_are_tes_state_at_a_subsequence_and_offset():
    """A draw is what TE's philox4x32_native_state::init(seed, subsequence, offset) then
    generate4() gives: counter (offset low, high, subsequence low, high), key the seed."""
    seed, offset = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    subs = np.array([0, 1, 2**32 + 5, 2**63 | 7], np.uint64)
    ctr = np.stack(
        [np.full(4, offset & 0xFFFFFFFF), np.full(4, offset >> 32), subs & 0xFFFFFFFF, subs >> 32],
        axis=-1,
    ).astype(np.uint32)
    want = kernels.philox4x32_10(ctr, (seed & 0xFFFFFFFF, seed >> 32))
    np.testing.assert_array_equal(kernels.nvfp4_te_draws(subs, seed, offset), want)


def bits(n, lo=0, hi=2**32 - 1):
    """n float32 values from any bits in [lo, hi] (NaN, Inf, subnormals)."""
    return st.lists(st.integers(lo, hi), min_size=n, max_size=n).map(
        lambda b: np.array(b, np.uint64).astype(np.uint32).view(np.float32)
    )


def test_worked_examples():
    """The cases derived by hand from TE v2.18's kernels (core_nvfp4.cuh,
    quantize_transpose_nvfp4.cuh, dequantize_nvfp4.cuh) and nvfp4_tensor.py's signs."""
    word = lambda v: int(np.float32(v).view(np.uint32))  # noqa: E731
    x = np.zeros((1, 16), np.float32)
    x[0, :4] = [6, 1, -0.7, 0.2]
    senc, sdec, mult = kernels.nvfp4_te_scales(6.0)
    assert (word(senc), word(sdec), word(mult)) == (0x43E00000, 0x3B124925, 0x42955556)
    s, q = kernels.nvfp4_te_quantize(x, 6.0)
    assert s.tolist() == [[0x7E]] and q[0, :3].tolist() == [0x27, 0x09, 0x00]
    x[0, :4] = [1, -0.3125, 0.5625, 0.046875]
    senc, _, mult = kernels.nvfp4_te_scales(100.0)
    assert (word(senc), word(mult)) == (0x41D70A3D, 0x408F5C29)
    s, q = kernels.nvfp4_te_quantize(x, 100.0)
    assert s.tolist() == [[0x49]] and q[0, :2].tolist() == [0xC7, 0x15]
    sf, enc = kernels.nvfp4_te_block_scale(np.float32([1.0]), 100.0)
    assert sf.tolist() == [0x49] and word(enc[0]) == 0x40BF258C
    assert kernels.nvfp4_te_decode_scale(sf, 100.0)[0] == np.float32(0.16741072)
    # the transform of e0, e3 and ones down a column
    e = np.zeros((16, 3), np.float32)
    e[0, 0] = e[3, 1] = 1
    e[:, 2] = 1
    h = kernels.hadamard16(e.astype(BF16)).view(BF16).astype(np.float32)
    np.testing.assert_array_equal(h[:, 0], np.full(16, 0.25))
    pc = np.array([bin(3 & j).count("1") for j in range(16)])
    np.testing.assert_array_equal(h[:, 1], 0.25 * (-1.0) ** (1 + pc))
    np.testing.assert_array_equal(h[:, 2], [-1, 0, 1, 0, 1, 0, -1, 0, 1, 2, 1, 0, 1, 0, 1, -2])
    assert ref.SIGN_MASK == 0xD7E8
    # stochastic rounding over all 256 bytes: 2.6 -> 3 from byte 103, 5.5 -> 6 with p 3/4
    r = np.arange(256, dtype=np.uint8)
    c = kernels.e2m1_stochastic(np.full(256, 2.6, np.float32), r)
    np.testing.assert_array_equal(c, np.where(r >= 103, 5, 4))
    assert (kernels.e2m1_stochastic(np.full(256, 5.5, np.float32), r) == 7).sum() == 192
    assert (kernels.e2m1_stochastic(np.full(256, 7.0, np.float32), r) == 7).all()


def test_element_rounding_edges():
    v = np.float32([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -0.25, 0.75, 5.0, 7.0])
    want = [0x7, 0x7, 0x7, 0xF, 0x8, 0x0, 0x0, 0x8, 0x2, 0x6, 0x7]
    assert kernels.e2m1_satfinite(v).tolist() == want
    np.testing.assert_array_equal(ref.e2m1_satfinite(v), want)
    for byte in (0, 255):
        sr = kernels.e2m1_stochastic(v, byte)
        assert sr[:4].tolist() == [0x7, 0x7, 0x7, 0xF] and sr[4] == 0x8  # NaN +6, -0 kept
        np.testing.assert_array_equal(sr, ref.e2m1_stochastic(v, byte))


@settings(max_examples=30, deadline=None)
@given(v=bits(64), r=st.lists(st.integers(0, 255), min_size=64, max_size=64))
def test_element_rounding_equals_twin(v, r):
    with np.errstate(invalid="ignore"):
        scaled = (v * np.float32(2.0**-100)).astype(np.float32)  # half of them near the grid
        w = np.where(np.arange(64) % 2, v, np.where(np.isfinite(v), scaled % 8, v))
    w = w.astype(np.float32)
    np.testing.assert_array_equal(kernels.e2m1_satfinite(w), ref.e2m1_satfinite(w))
    rb = np.array(r, np.uint8)
    np.testing.assert_array_equal(kernels.e2m1_stochastic(w, rb), ref.e2m1_stochastic(w, rb))


def at_every_level(check):
    """check(level) at each ISA level this CPU runs, the level restored after."""
    for level in kernels.isa_levels():
        old = kernels.set_isa(level)
        try:
            check(level)
        finally:
            kernels.set_isa(old)


def spread(x):
    """Half the values scaled far down, so that tiny, huge and special blocks meet."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.copy()
        y[::3] = (y[::3] * np.float32(2.0**-110)).astype(np.float32)
        return y


AMAXES = st.one_of(
    st.just(None),  # the input's own
    st.sampled_from([0.0, np.inf, np.nan, 1e-45, 3e38, 6.0]),
    st.floats(width=32, min_value=0, allow_nan=False),
)


@settings(max_examples=10, deadline=None)
@given(x=bits(32 * 48), amax=AMAXES, seed=st.integers(0, 2**64 - 1), offset=st.integers(0, 99))
def test_quantize_equals_twin_at_every_level_and_thread_count(x, amax, seed, offset):
    """Every orientation (rows, columns, 16 x 16 tiles both ways), rounding (nearest,
    stochastic) and input dtype, at every ISA level and 1, 2 or any threads."""
    x = spread(x).reshape(32, 48)
    cases = [(-1, False, None), (0, False, None), (-1, True, None), (0, True, None)]
    cases += [(-1, False, seed), (0, False, seed)]
    for dt in (np.float32, np.float16, BF16):
        with np.errstate(over="ignore", invalid="ignore"):
            xd = x.astype(dt)
        x32 = xd.astype(np.float32)
        a = ref.global_amax(x32) if amax is None else amax
        for axis, tile, sd in cases:
            want = ref.quantize(x32, a, axis=axis, tile=tile, seed=sd, offset=offset)

            def check(level, xd=xd, a=a, axis=axis, tile=tile, sd=sd, want=want):
                for t in (1, 2, 0):
                    got = kernels.nvfp4_te_quantize(
                        xd, a, axis=axis, tile=tile, seed=sd, offset=offset, threads=t
                    )
                    msg = f"{level} {xd.dtype} axis={axis} tile={tile} seed={sd} threads={t}"
                    np.testing.assert_array_equal(got[0], want[0], err_msg=msg)
                    np.testing.assert_array_equal(got[1], want[1], err_msg=msg)

            at_every_level(check)


def bf16_bits(n):
    return st.lists(st.integers(0, 0xFFFF), min_size=n, max_size=n).map(
        lambda b: np.array(b, np.uint16).view(BF16)
    )


@settings(max_examples=10, deadline=None)
@given(x=bf16_bits(32 * 40), seed=st.integers(0, 2**64 - 1))
def test_hadamard_and_its_quantize_equal_twin(x, seed):
    """Any bfloat16 bits (sums overflow, Inf - Inf): the transform's words, its amax (NaN
    left out) and the columnwise quantize of it, nearest and stochastic, at every level."""
    x = x.reshape(32, 40)
    x32 = x.astype(np.float32)
    words = ref.hadamard16(x32)
    amax = ref.global_amax(x32, rht=True)
    want = [ref.quantize(x32, amax, axis=0, rht=True, seed=sd, offset=1) for sd in (None, seed)]

    def check(level):
        np.testing.assert_array_equal(kernels.hadamard16(x), words, err_msg=level)
        assert kernels.hadamard16_amax(x) == amax  # never NaN: NaN results are left out
        for sd, w in zip((None, seed), want, strict=True):
            got = kernels.nvfp4_te_quantize(x, amax, axis=0, rht=True, seed=sd, offset=1)
            np.testing.assert_array_equal(got[0], w[0], err_msg=level)
            np.testing.assert_array_equal(got[1], w[1], err_msg=level)

    at_every_level(check)


@settings(max_examples=20, deadline=None)
@given(
    m=st.lists(st.integers(0, 0x7F), min_size=16 * 24, max_size=16 * 24),
    e=st.lists(st.integers(0, 12), min_size=16 * 24, max_size=16 * 24),
    base=st.integers(1, 254 - 12),
    signs=st.integers(0, 2**31 - 1),
)
def test_hadamard_within_12_binades_is_the_exact_sum(m, e, base, signs):
    """Where a chunk's 16 magnitudes lie within 2**12 of each other every partial sum is
    exact, so the butterflies give the exact sum rounded once to bfloat16: the result of any
    summation order, TE's tensor cores' included."""
    sign = (np.arange(16 * 24) * 7 + signs) % 3 == 0
    w = (np.array(e) + base) << 7 | np.array(m) | np.where(sign, 0x8000, 0)
    x = w.astype(np.uint16).view(BF16).reshape(16, 24)
    want = ref.hadamard16_exact(x.astype(np.float32))
    at_every_level(lambda level: np.testing.assert_array_equal(kernels.hadamard16(x), want))


def test_rows_split_in_pieces_and_threads_give_the_same_bytes():
    """Rows longer than a chunk (32768 elements) are cut in pieces and bands in pieces of
    columns: every piece's draws are its elements' own, so any thread count gives the bytes
    of the serial run, and the twin's on a band of it."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((32, 40000)) * 2.0 ** rng.integers(-8, 8, (32, 40000))).astype(BF16)
    a = kernels.fp8_amax(x)
    for axis, rht in ((-1, False), (0, False), (0, True)):
        aa = kernels.hadamard16_amax(x) if rht else a
        serial = kernels.nvfp4_te_quantize(x, aa, axis=axis, rht=rht, seed=9, threads=1)
        for t in (2, 0):
            got = kernels.nvfp4_te_quantize(x, aa, axis=axis, rht=rht, seed=9, threads=t)
            np.testing.assert_array_equal(got[0], serial[0])
            np.testing.assert_array_equal(got[1], serial[1])
    # the twin on the rows pass of the first 16 rows, whose draws do not depend on the rest
    head = x[:16, :4096].astype(np.float32)
    got = kernels.nvfp4_te_quantize(x[:16, :4096], a, seed=9)
    want = ref.quantize(head, a, seed=9)
    np.testing.assert_array_equal(got[1], want[1])


def test_strided_and_nd_inputs_read_as_their_copies():
    rng = np.random.default_rng(4)
    base = rng.standard_normal((4, 32, 64)).astype(np.float32)
    for v, axis in ((base[0, :, ::2], -1), (base[1].T, 0), (base, -1), (base[:, ::2], -1)):
        c = np.ascontiguousarray(v)
        for g, w in zip(
            kernels.nvfp4_te_quantize(v, 3.0, axis=axis, seed=1),
            kernels.nvfp4_te_quantize(c, 3.0, axis=axis, seed=1),
            strict=True,
        ):
            np.testing.assert_array_equal(g, w)
    s, q = kernels.nvfp4_te_quantize(base, 3.0)
    assert s.shape == (4, 32, 4) and q.shape == (4, 32, 32)


def test_bad_arguments():
    x = np.ones((32, 48), np.float32)
    cases = [
        (dict(axis=1), ValueError, "axis must be -1 or 0, got 1"),
        (dict(rht=True, axis=0), ValueError, "bfloat16 input"),
        (dict(tile=True, seed=3), ValueError, "not one of the 16 x 16 tiles"),
        (dict(seed=-1), ValueError, r"seed must be an integer from 0 to 2\*\*64 - 1, got -1"),
        (dict(seed=3, offset=2**64), ValueError, "offset must be an integer"),
        (dict(threads=-1), ValueError, "threads must be >= 0"),
    ]
    for kw, err, match in cases:
        with pytest.raises(err, match=match):
            kernels.nvfp4_te_quantize(x, 1.0, **kw)
    with pytest.raises(
        ValueError, match=r"last axis must be a multiple of 16, got shape \(32, 40\)"
    ):
        kernels.nvfp4_te_quantize(x[:, :40], 1.0)
    with pytest.raises(ValueError, match="first axis must be a multiple of 16"):
        kernels.nvfp4_te_quantize(x[:24], 1.0, axis=0)
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16"):
        kernels.nvfp4_te_quantize(x.astype(np.float64), 1.0)
    with pytest.raises(ValueError, match="x must be a 2-D bfloat16 array, got float32"):
        kernels.hadamard16(x)


RN_EVERY_FLOAT = r"""
#include <stdio.h>
#include "lsc_nvfp4.h"
/* the rule as lsc_mx.h's E2M1 narrowing (torchao's bit arithmetic) and the NaN +6 */
static lsc_u32 by_torchao_bits(float v)
{
    lsc_u32 nan = -(lsc_u32)((lsc_f32_bits(v) & 0x7FFFFFFFu) > 0x7F800000u);
    return (lsc_e2m1_from_f32(v) & ~nan) | (7u & nan);
}
int main(void)
{
    unsigned long bad = 0;
    for (unsigned long long w = 0; w <= 0xFFFFFFFFull; ++w) {
        float f = lsc_f32_from_bits((lsc_u32)w);
        if (lsc_nv4_rn(f) != by_torchao_bits(f) && bad++ < 5)
            printf("%08llx\n", w);
    }
    printf("%lu\n", bad);
    return 0;
}
"""


@pytest.mark.slow
def test_rn_equals_the_bit_rule_at_every_float(tmp_path):
    """lsc_nv4_rn (regions and a 2**23 rounding add) equals lsc_mx.h's E2M1 narrowing with
    NaN +6 at every float32 bit pattern (2**32 of them, about a minute)."""
    import shutil
    import subprocess

    import lscore._ext

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    src, exe = tmp_path / "rn.c", tmp_path / "rn"
    src.write_text(RN_EVERY_FLOAT)
    inc = str(pathlib.Path(lscore._ext.__file__).parent)
    cmd = [cc, "-O2", "-ffp-contract=off", "-DLSC_LEVEL=v2", f"-I{inc}", str(src), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    assert subprocess.run([str(exe)], capture_output=True, text=True).stdout == "0\n"
