"""The fused block passes of lsc_mx.h (lscore.kernels.mx_quantize / nvfp4_quantize): every
ISA level, both orientations, float32 / float16 / bfloat16 inputs read in place at any
strides, and preallocated outputs give the bytes of the slow NumPy twin."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lscore import _reference_mx as ref
from lscore import kernels

ml_dtypes = pytest.importorskip("ml_dtypes")

ELEMS = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1")
MODES = tuple(kernels.MX_MODES)


@pytest.fixture(params=kernels.isa_levels())
def isa(request):
    old = kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa(old)


def bits(n):
    """n float32 values from any bits (NaN, Inf, subnormals included), half of them scaled
    down to small magnitudes so that blocks of every size occur."""
    return st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n).map(
        lambda b: np.array(b, np.uint64).astype(np.uint32).view(np.float32)
    )


def spread(x):
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.copy()
        y[::2] = (y[::2] * np.float32(2.0**-100)).astype(np.float32)
    return y


def twin(x, elem, mode):
    return ref.mx_quantize(np.asarray(x, np.float32), elem, mode)


@settings(max_examples=8, deadline=None)
@given(bits(256))
def test_rows_equal_twin_at_every_level(x):
    x = spread(x).reshape(4, 64)
    for level in kernels.isa_levels():
        old = kernels.set_isa(level)
        try:
            for elem in ELEMS:
                for mode in MODES:
                    got, want = kernels.mx_quantize(x, elem, mode), twin(x, elem, mode)
                    for g, w in zip(got, want, strict=True):
                        np.testing.assert_array_equal(g, w, err_msg=f"{level} {elem} {mode}")
            for pts in (None, np.float32(0.25)):
                got, want = kernels.nvfp4_quantize(x, pts), ref.nvfp4_quantize(x, pts)
                for g, w in zip(got, want, strict=True):
                    np.testing.assert_array_equal(g, w, err_msg=f"{level} nvfp4 {pts}")
        finally:
            kernels.set_isa(old)


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_columns_are_the_rows_of_the_transpose(seed):
    """axis 0 (blocks down the columns): the scales and codes of the transposed input's
    rows, transposed; E2M1 packs the two rows of a pair into one byte."""
    words = np.random.default_rng(seed).integers(0, 2**32, 64 * 96, dtype=np.uint32)
    x = spread(words.view(np.float32)).reshape(64, 96)
    for level in kernels.isa_levels():
        old = kernels.set_isa(level)
        try:
            for elem in ELEMS:
                for mode in MODES:
                    s, q = kernels.mx_quantize(x, elem, mode, axis=0)
                    ws, wq = ref.mx_quantize(np.ascontiguousarray(x.T), elem, mode)
                    np.testing.assert_array_equal(s, ws.T, err_msg=f"{level} {elem} {mode}")
                    np.testing.assert_array_equal(q, wq.T, err_msg=f"{level} {elem} {mode}")
            s, q = kernels.nvfp4_quantize(x, axis=0)
            ws, wq = ref.nvfp4_quantize(np.ascontiguousarray(x.T))
            np.testing.assert_array_equal(s, ws.T)
            np.testing.assert_array_equal(q, wq.T)
        finally:
            kernels.set_isa(old)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_half_inputs_read_in_place(isa, dtype, axis):
    """float16 and bfloat16 widen exactly: the bytes of their float32 widening."""
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    rng = np.random.default_rng(5)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal((64, 96)) * 2.0 ** rng.integers(-20, 20, (64, 96))).astype(dt)
    x[3, 7] = np.nan
    x[40, 1] = -np.inf
    for elem in ELEMS:
        for mode in MODES:
            got = kernels.mx_quantize(x, elem, mode, axis=axis)
            want = kernels.mx_quantize(x.astype(np.float32), elem, mode, axis=axis)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w, err_msg=f"{elem} {mode}")
    for g, w in zip(
        kernels.nvfp4_quantize(x, axis=axis),
        kernels.nvfp4_quantize(x.astype(np.float32), axis=axis),
        strict=True,
    ):
        np.testing.assert_array_equal(g, w)


@pytest.mark.slow
def test_every_bfloat16_at_every_block_scale(isa):
    """Every bfloat16 pattern, 31 to a block beside an anchor whose exponent sets the block's
    scale (every fourth exponent from 2**-133 to 2**127, subnormal anchors included), gives
    the codes of its exact float32 widening in both float8 formats and every mode: x86-64-v4
    narrows the blocks whose factor is a power of two in 16-bit lanes, the others as float32.
    Along axis 0 (the transpose: 13,959 columns, a partial vector of 7 at the end of each
    tile row) the same blocks give the same codes, transposed."""
    pats = np.arange(2**16, dtype=np.uint16)
    pats = np.concatenate([pats, np.zeros(-len(pats) % 31, np.uint16)]).reshape(-1, 31)
    blocks = []
    for t in range(-133, 128, 4):
        a = ((t + 127) << 7 | (t * 37) & 0x7F) if t >= -126 else 1 << (t + 133)
        anchor = np.full((len(pats), 1), a | (0x8000 if t % 8 else 0), np.uint16)
        blocks.append(np.concatenate([anchor, pats], axis=1))
    x = np.concatenate(blocks).reshape(-1, 320).view(ml_dtypes.bfloat16)  # 10 blocks a row
    wide = x.astype(np.float32)
    cols = np.ascontiguousarray(x.T)
    for elem in ELEMS[:2]:
        for mode in MODES:
            got = kernels.mx_quantize(x, elem, mode)
            want = kernels.mx_quantize(wide, elem, mode)
            down = kernels.mx_quantize(cols, elem, mode, axis=0)
            for g, d, w in zip(got, down, want, strict=True):
                np.testing.assert_array_equal(g, w, err_msg=f"{isa} {elem} {mode}")
                np.testing.assert_array_equal(d, w.T, err_msg=f"{isa} {elem} {mode} axis 0")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bfloat16"])
def test_strided_views(isa, dtype):
    """Views with any strides (every other column, a transpose, leading axes that do not
    collapse into one) give the bytes of their contiguous copies."""
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    rng = np.random.default_rng(9)
    base = (rng.standard_normal((6, 64, 128)) * 1e3).astype(dt)
    views = [
        (base[0, :, ::2], -1),
        (base[1].T, -1),
        (base[:, ::2, :64], -1),
        (base[2, :, ::2], 0),
        (base[3].T[:, :64], 0),
    ]
    for v, axis in views:
        c = np.ascontiguousarray(v)
        for elem, mode in (
            ("float8_e4m3fn", "te"),
            ("float4_e2m1", "floor"),
            ("float8_e5m2", "ocp"),
        ):
            for g, w in zip(
                kernels.mx_quantize(v, elem, mode, axis=axis),
                kernels.mx_quantize(c, elem, mode, axis=axis),
                strict=True,
            ):
                np.testing.assert_array_equal(g, w)
        for g, w in zip(
            kernels.nvfp4_quantize(v, axis=axis), kernels.nvfp4_quantize(c, axis=axis), strict=True
        ):
            np.testing.assert_array_equal(g, w)


def test_out_arrays_are_written_and_returned():
    x = np.linspace(-500, 500, 4 * 64, dtype=np.float32).reshape(4, 64)
    want = kernels.mx_quantize(x, "float8_e4m3fn", "floor")
    s = np.zeros((4, 2), ml_dtypes.float8_e8m0fnu)
    q = np.zeros((4, 64), ml_dtypes.float8_e4m3fn)
    got = kernels.mx_quantize(x, "float8_e4m3fn", "floor", out=(s, q))
    assert got[0] is s and got[1] is q
    np.testing.assert_array_equal(s.view(np.uint8), want[0])
    np.testing.assert_array_equal(q.view(np.uint8), want[1])
    s4, q4 = np.zeros((2, 4), np.uint8), np.zeros((32, 4), np.uint8)
    kernels.mx_quantize(x.T.copy(), "float4_e2m1", "ocp", axis=0, out=(s4, q4))
    w4 = kernels.mx_quantize(x, "float4_e2m1", "ocp")
    np.testing.assert_array_equal(s4, w4[0].T)
    np.testing.assert_array_equal(q4, w4[1].T)
    sn, qn = np.zeros((4, 4), np.uint8), np.zeros((4, 32), np.uint8)
    kernels.nvfp4_quantize(x, out=(sn, qn))
    for g, w in zip((sn, qn), kernels.nvfp4_quantize(x), strict=True):
        np.testing.assert_array_equal(g, w)


def test_bad_arguments_refused_before_writing():
    x = np.ones((64, 48), np.float32)
    s, q = np.full((64, 1), 7, np.uint8), np.full((64, 48), 7, np.uint8)
    cases = [
        (dict(axis=1), "axis must be -1 or 0, got 1"),
        (dict(out=(s[:, :0], q)), r"out scales must have shape \(64, 1\)"),
        (dict(out=(np.zeros((64, 1), np.uint16), q)), "1-byte codes"),
        (dict(out=(s, np.zeros((48, 64), np.uint8).T)), "C-contiguous"),
        (dict(out=[s, q]), "tuple"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            kernels.mx_quantize(x[:, :32], "float8_e4m3fn", "floor", **kwargs)
    assert np.all(s == 7) and np.all(q == 7)
    with pytest.raises(ValueError, match="axis 0 needs a 2-D input"):
        kernels.mx_quantize(np.ones((2, 32, 32), np.float32), "float8_e4m3fn", "te", axis=0)
    with pytest.raises(ValueError, match="first axis must be a multiple of 32"):
        kernels.mx_quantize(np.ones((48, 32), np.float32), "float8_e4m3fn", "te", axis=0)
    with pytest.raises(ValueError, match="first axis must be a multiple of 16"):
        kernels.nvfp4_quantize(np.ones((24, 16), np.float32), axis=0)
    with pytest.raises(ValueError, match="block must be an even integer from 2 to 1024"):
        kernels.mx_quantize(np.ones(2048, np.float32), "float8_e4m3fn", "te", block=2048)


def test_other_block_lengths(isa):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 192)) * 100).astype(np.float32)
    for block in (2, 6, 64, 192):
        for mode in ("floor", "te", "ocp", "rceil"):
            got = kernels.mx_quantize(x, "float8_e4m3fn", mode, block)
            want = ref.mx_quantize(x, "float8_e4m3fn", mode, block)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w, err_msg=f"{block} {mode}")


@pytest.mark.parametrize("axis", [-1, 0])
def test_same_bytes_with_any_thread_count(axis):
    """The passes are cut in chunks from the work alone (whole rows, or pieces of a long
    row), each writing its own bytes: one thread, two, or as many as the pool has give the
    same scales and codes."""
    rng = np.random.default_rng(4)
    shapes = [(256, 1024), (64, 4096)] + ([(96 * 1024,)] if axis == -1 else [(4096, 96)])
    for shape in shapes:
        x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(np.float32)
        x.ravel()[::997] = np.nan
        for elem, mode in (
            ("float8_e4m3fn", "floor"),
            ("float8_e5m2", "te"),
            ("float4_e2m1", "ocp"),
        ):
            runs = [kernels.mx_quantize(x, elem, mode, axis=axis, threads=t) for t in (1, 2, 0)]
            for got in runs[1:]:
                for g, w in zip(got, runs[0], strict=True):
                    np.testing.assert_array_equal(g, w, err_msg=f"{shape} {elem} {mode}")
        runs = [kernels.nvfp4_quantize(x, axis=axis, threads=t) for t in (1, 2, 0)]
        for got in runs[1:]:
            for g, w in zip(got, runs[0], strict=True):
                np.testing.assert_array_equal(g, w)
    with pytest.raises(ValueError, match="threads must be >= 0, got -1"):
        kernels.mx_quantize(np.zeros(32, np.float32), "float8_e4m3fn", "te", threads=-1)
