"""lscore.fp8's blockwise FP8 presets (te-blockwise, torchao-blockwise) and square weight
tiles (128x128, and the 32x32 MXFP8 override): quantize_blocks by role against the NumPy
twin, the read-back, tails, out=, block_stats against a slow element-by-element count."""

import math

import numpy as np
import pytest

import lscore.fp8 as fp8
from lscore import _reference_blockwise as ref
from lscore import _reference_fp8 as ref8

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
ELEMS = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def generated(rng, shape, dtype):
    """Values over a wide range of magnitudes, a NaN, +-Inf, an all-zero row and a row of
    subnormals, as `dtype`."""
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-40, 40, (shape[0], 1))
    k = shape[1] - 1
    x[0, min(3, k)] = np.nan
    x[1, min(5, k)] = np.inf
    x[2, min(1, k)] = -np.inf
    x[3] = 0
    x[4] = rng.uniform(-1, 1, shape[1]) * 1e-41
    with np.errstate(over="ignore"):
        return x.astype(np.float32).astype(DTYPES[dtype])


def twin(x, r, role, axis=-1):
    """The twin's (scales, codes) of x as a tensor of `role` under blockwise recipe r."""
    elem = ELEMS[r.role_element(role)]
    x32 = x.astype(np.float32)
    dt = np.dtype(x.dtype).name
    eps = r.amax_epsilon
    if axis == 0 and r.mode == "torchao-fp32":  # torchao's 128x1 clamps in the input dtype
        eps = float(np.asarray(eps).astype(x.dtype))
    args = (r.power_2_scales, eps, dt)
    if role == "weight" and r.weight_block:
        return ref.tile_quantize(x32, elem, r.mode, r.weight_block, *args)
    v = x32.T if axis == 0 else x32
    n = v.shape[-1]
    padded = np.zeros((*v.shape[:-1], -(-n // r.block) * r.block), np.float32)
    padded[..., :n] = v
    s, q = ref.blockwise_quantize(padded, elem, r.mode, r.block, *args)
    q = q[..., :n]
    return (s.T, q.T) if axis == 0 else (s, q)


RECIPES = [
    ("te-blockwise", {}),
    ("te-blockwise", {"fp8_format": "HYBRID"}),
    ("te-blockwise", {"power_2_scales": False, "amax_epsilon": 1e-20}),
    ("torchao-blockwise", {}),
]


@pytest.mark.parametrize("name, kw", RECIPES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("role", [None, "input", "grad", "weight"])
def test_presets_equal_twin_by_role(name, kw, dtype, role):
    r = fp8.recipe(name, **kw)
    x = generated(np.random.default_rng(3), (256, 384), dtype)
    for axis in (-1, 0):
        b = fp8.quantize_blocks(x, r, role=role, axis=axis)
        s, q = twin(x, r, role, axis)
        assert b.role == role and b.element == r.role_element(role)
        assert b.scales.dtype == np.float32 and b.scales.shape == s.shape
        assert b.data.dtype == np.dtype(getattr(ml_dtypes, ELEMS[b.element]))
        np.testing.assert_array_equal(b.scales.view(np.uint32), s.view(np.uint32))
        np.testing.assert_array_equal(b.data.view(np.uint8), q)
        if b.tiles:  # TE's columnwise weight: the same tiles
            assert b.axis == -1 and b.scales.shape == (2, 3)
        # the read-back: each code times its inverse scale in float32, rounded once
        if b.tiles:
            full = np.repeat(np.repeat(s, r.weight_block, 0), r.weight_block, 1)
        else:
            full = np.repeat(s, r.block, 0 if axis == 0 else 1)
        with np.errstate(invalid="ignore"):
            exact = ref8.fp8_decode(q, ELEMS[b.element]) * full
        for t in DTYPES.values():
            with np.errstate(over="ignore", invalid="ignore"):
                want = exact.astype(np.float32).astype(t)
                got = fp8.dequantize_blocks(b, t)
            np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("shape", [(100, 300), (129, 1), (1, 1000), (3, 257)])
def test_te_pads_a_partial_block_and_tile(shape):
    """TE's kernels zero-fill a ragged edge: a partial block or tile is scaled from the
    elements it has; torchao's prototype refuses one."""
    x = generated(np.random.default_rng(shape[0]), (max(shape[0], 5), shape[1]), "bfloat16")
    x = x[: shape[0]]
    r = fp8.recipe("te-blockwise")
    for role in ("input", "weight"):
        b = fp8.quantize_blocks(x, r, role=role)
        s, q = twin(x, r, role)
        np.testing.assert_array_equal(b.scales.view(np.uint32), s.view(np.uint32))
        np.testing.assert_array_equal(b.data.view(np.uint8), q)
        assert fp8.dequantize_blocks(b).shape == shape
    with pytest.raises(ValueError, match="multiple of the block 128"):
        fp8.quantize_blocks(x, "torchao-blockwise")
    with pytest.raises(ValueError, match="multiples of the tile 128"):
        fp8.quantize_blocks(x, "torchao-blockwise", role="weight")


def test_stacked_weights_are_tiled_matrix_by_matrix():
    x = generated(np.random.default_rng(9), (3 * 160, 200), "float32").reshape(3, 160, 200)
    r = fp8.recipe("te-blockwise")
    b = fp8.quantize_blocks(x, r, role="weight")
    assert b.scales.shape == (3, 2, 2) and b.data.shape == x.shape
    for i in range(3):
        s, q = twin(x[i], r, "weight")
        np.testing.assert_array_equal(b.scales[i], s)
        np.testing.assert_array_equal(b.data[i].view(np.uint8), q)
    y = fp8.dequantize_blocks(b)
    np.testing.assert_array_equal(
        y[1], fp8.dequantize_blocks(fp8.quantize_blocks(x[1], r, role="weight"))
    )
    with pytest.raises(ValueError, match="must have at least 2 dimensions"):
        fp8.quantize_blocks(np.ones(128, np.float32), r, role="weight")


@pytest.mark.parametrize("name", ["te-mxfp8", "torchao-mx-floor", "torchao-mx-rceil"])
def test_mxfp8_weights_in_32x32_tiles(name):
    r = fp8.recipe(name, weight_block=32)
    x = generated(np.random.default_rng(4), (96, 64), "bfloat16")
    b = fp8.quantize_blocks(x, r, role="weight")
    s, q = ref.tile_quantize(x.astype(np.float32), "float8_e4m3fn", r.mode, 32)
    assert b.scales.dtype == ml_dtypes.float8_e8m0fnu and b.scales.shape == (3, 2)
    np.testing.assert_array_equal(b.scales.view(np.uint8), s)
    np.testing.assert_array_equal(b.data.view(np.uint8), q)
    # read back: the tile's scale over its 32 x 32 elements, as the 1x32 layouts the
    # libraries replicate it into
    rows = fp8.quantize_blocks(x, r)  # an input: blocks of 32 along the rows
    assert rows.scales.shape == (96, 2)
    expand = np.repeat(b.scales.view(np.uint8), 32, axis=0)
    lines = fp8.BlockScaled(b.data, expand.view(ml_dtypes.float8_e8m0fnu), None, r, "e4m3fn",
                            -1, x.shape)  # fmt: skip
    np.testing.assert_array_equal(fp8.dequantize_blocks(b), fp8.dequantize_blocks(lines))


def test_out_is_written_in_place_for_tiles_and_float32_scales():
    rng = np.random.default_rng(8)
    x, y = (rng.standard_normal((256, 384)).astype(np.float32) for _ in range(2))
    for role in ("input", "weight"):
        out = fp8.quantize_blocks(x, "te-blockwise", role=role)
        scales, data = out.scales, out.data
        got = fp8.quantize_blocks(y, "te-blockwise", role=role, out=out)
        want = fp8.quantize_blocks(y, "te-blockwise", role=role)
        assert got.scales is scales and got.data is data
        np.testing.assert_array_equal(got.scales, want.scales)
        np.testing.assert_array_equal(got.data.view(np.uint8), want.data.view(np.uint8))
    out = fp8.quantize_blocks(x, "te-blockwise", role="weight")
    with pytest.raises(ValueError, match="role 'weight', shape"):
        fp8.quantize_blocks(y, "te-blockwise", role="input", out=out)


def test_bad_roles():
    x = np.ones((128, 128), np.float32)
    with pytest.raises(ValueError, match="unknown role 'bias'; expected one of: None, input"):
        fp8.quantize_blocks(x, "te-blockwise", role="bias")
    with pytest.raises(ValueError, match="element must be one of e4m3fn under mode"):
        fp8.quantize_blocks(x, "torchao-blockwise", role="grad", element="e5m2")
    r = fp8.recipe("te-blockwise", fp8_format="HYBRID")
    assert fp8.quantize_blocks(x, r, role="grad").element == "e5m2"
    assert fp8.quantize_blocks(x, r, role="grad", element="e4m3fn").element == "e4m3fn"


# ---- block_stats ----------------------------------------------------------------------------


def slow_stats(x, r, role):
    """Each block (tile) of the twin looked at element by element: the exponent of its
    inverse scale, saturated (the top code where |float32(x * scale)| rounds above 448),
    flushed and non-zero finite elements in blocks whose scale is not NaN."""
    elem = r.role_element(role)
    x32 = x.astype(np.float32)
    dt = np.dtype(x.dtype).name
    tiles = role == "weight"
    side = r.weight_block if tiles else r.block
    rows = ref.to_tiles(x32, side).reshape(-1, side * side) if tiles else x32.reshape(-1, side)
    hist, nan_s, inf_s, sat, flushed, nonzero = {}, 0, 0, 0, 0, 0
    for blk in rows:
        mags = np.abs(blk)
        amax = np.max(np.where(np.isnan(mags), 0, mags)) if r.mode == "te-fp32" else np.max(mags)
        s, inv = ref.blockwise_scale(
            np.float32(amax), ELEMS[elem], r.mode, r.power_2_scales, r.amax_epsilon, dt
        )
        _, q = ref.blockwise_quantize(
            blk[None], ELEMS[elem], r.mode, blk.size, r.power_2_scales, r.amax_epsilon, dt
        )
        inv = float(inv)
        if math.isnan(inv):
            nan_s += 1
            continue
        if math.isinf(inv):
            inf_s += 1
        else:
            e = math.frexp(inv)[1] - 1
            hist[e] = hist.get(e, 0) + 1
        for v, c in zip(blk.tolist(), q.ravel().tolist(), strict=True):
            if not math.isfinite(v) or v == 0:
                continue
            nonzero += 1
            flushed += (c & 0x7F) == 0
            with np.errstate(over="ignore"):
                p = abs(float(np.float32(v) * np.float32(s)))
            sat += (c & 0x7F) == (0x7E if elem == "e4m3fn" else 0x7B) and p >= (
                fp8.diagnostics.SATURATE_FROM[elem]
            )
    return hist, nan_s, inf_s, sat, flushed, nonzero


@pytest.mark.parametrize("name", ["te-blockwise", "torchao-blockwise"])
@pytest.mark.parametrize("role", ["input", "weight"])
def test_block_stats_equal_slow_count(name, role):
    rng = np.random.default_rng(21)
    x = generated(rng, (256, 256), "bfloat16")
    x[7, :] = (rng.uniform(-1, 1, 256) * 448 * 2.0**-30).astype(ml_dtypes.bfloat16)
    x[200, 3] = 1e30  # a block whose other elements flush
    x[250, 250] = -np.inf  # in a tile of its own
    r = fp8.recipe(name)
    got = fp8.block_stats(x, r, role=role)
    hist, nan_s, inf_s, sat, flushed, nonzero = slow_stats(x, r, role)
    assert (got.exponents, got.nan_scales, got.inf_scales) == (hist, nan_s, inf_s)
    assert (got.saturated, got.flushed, got.nonzero) == (sat, flushed, nonzero)
    assert got.tiles == (role == "weight") and got.scale_format == "float32"
    assert got.blocks == (4 if role == "weight" else 512) and got.block == 128
    assert got.flushed > 0 and (got.inf_scales > 0) == (name == "torchao-blockwise")
    # a scale maps the amax to at most the largest value, so only TE's blocks holding an
    # Inf (scale 1) saturate finite elements; torchao's get scale 0
    assert (got.saturated > 0) == (name == "te-blockwise")
    head = got.table().splitlines()[0]
    assert head.startswith(f"{name}: {got.blocks} ") and "float32 scales" in head
