"""The te-nvfp4 preset (TransformerEngine v2.18 NVFP4BlockScaling) through quantize_blocks.

Bitwise against TE's own pure-PyTorch reference quantizer (custom_recipes/
quantization_ref_nvfp4.py at v2.18) run on generated inputs, recorded by
tests/core/data/record_te_nvfp4.py: 1x16 blocks, 16x16 weight tiles and the random Hadamard
transform, both orientations, and the global amaxes; where the reference's cast differs from
TE's kernels (NaN, -0.0) the kernels' rule is what lscore follows.  Then the role table, TE's
switches, stochastic rounding's seed and offset, the decode and the twin.
"""

import json
import pathlib

import numpy as np
import pytest

import lscore.fp8 as fp8
from lscore import _reference_nvfp4 as ref
from lscore import kernels

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16
DATA = np.load(pathlib.Path(__file__).parent / "data" / "te_nvfp4.npz")
NAMES = ("f32", "bf16", "f32inf", "bf16inf", "zero")


def recorded_input(name):
    bits = DATA[f"{name}_x"]
    return bits.view(np.float32) if name.startswith("f32") else bits.view(np.uint16).view(BF16)


def unpack(codes):
    """One E2M1 code a byte from packed pairs along the last axis (low nibble first)."""
    return np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1)


def repack(nibbles):
    return (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).astype(np.uint8)


@pytest.mark.parametrize("name", NAMES)
def test_1x16_blocks_equal_tes_reference(name):
    """Inputs and gradients without the transform or stochastic rounding: TE's rowwise data
    and scales (M, K/2), (M, K/16), and its columnwise ones (K, M/2), (K, M/16), whose
    transposes lscore's axis=0 layout holds."""
    x = recorded_input(name)
    r = fp8.recipe("te-nvfp4", disable_rht=True, disable_stochastic_rounding=True)
    key = f"{name}_1x16"
    row = fp8.quantize_blocks(x, r, role="input")
    col = fp8.quantize_blocks(x, r, role="grad", axis=0)
    np.testing.assert_array_equal(row.data, DATA[f"{key}_data"])
    np.testing.assert_array_equal(row.scales.view(np.uint8), DATA[f"{key}_scale"])
    np.testing.assert_array_equal(col.data.T, DATA[f"{key}_data_t"])
    np.testing.assert_array_equal(col.scales.view(np.uint8).T, DATA[f"{key}_scale_t"])
    amax = DATA[f"{key}_global_amax_row"].view(np.float32)[0]
    assert np.float32(row.tensor_scale) == amax == np.float32(col.tensor_scale)


@pytest.mark.parametrize("name", NAMES)
def test_weight_tiles_equal_tes_reference(name):
    """16x16 tiles: one scale a tile, which TE's layouts repeat on the 16 rows of each tile
    (rowwise) and of its transpose (columnwise); the columnwise codes are the transpose of
    the rowwise ones, value for value."""
    x = recorded_input(name)
    key = f"{name}_16x16"
    w = fp8.quantize_blocks(x, "te-nvfp4", role="weight")
    assert w.tiles and w.axis == -1 and w.scales.shape == (x.shape[0] // 16, x.shape[1] // 16)
    tiles = w.scales.view(np.uint8)
    np.testing.assert_array_equal(w.data, DATA[f"{key}_data"])
    np.testing.assert_array_equal(np.repeat(tiles, 16, axis=0), DATA[f"{key}_scale"])
    np.testing.assert_array_equal(np.repeat(tiles.T, 16, axis=0), DATA[f"{key}_scale_t"])
    np.testing.assert_array_equal(repack(unpack(w.data).T), DATA[f"{key}_data_t"])
    assert np.float32(w.tensor_scale) == DATA[f"{key}_global_amax_row"].view(np.float32)[0]


@pytest.mark.parametrize("name", ["bf16", "bf16inf", "zero"])
def test_hadamard_columnwise_copy_equals_tes_reference(name):
    """The transformed columnwise copy of an input, with its own amax (of the transform's
    bfloat16 results), and the untransformed rowwise copy beside it."""
    x = recorded_input(name)
    key = f"{name}_rht"
    col = fp8.quantize_blocks(x, "te-nvfp4", role="input", axis=0)
    row = fp8.quantize_blocks(x, "te-nvfp4", role="input")
    np.testing.assert_array_equal(col.data.T, DATA[f"{key}_data_t"])
    np.testing.assert_array_equal(col.scales.view(np.uint8).T, DATA[f"{key}_scale_t"])
    np.testing.assert_array_equal(row.data, DATA[f"{key}_data"])
    assert np.float32(col.tensor_scale) == DATA[f"{key}_global_amax_col"].view(np.float32)[0]
    assert np.float32(row.tensor_scale) == DATA[f"{key}_global_amax_row"].view(np.float32)[0]


def test_where_tes_reference_cast_differs_from_its_kernels():
    """TE's reference casts NaN and -0.0 to code 0 (quantization_ref_nvfp4.py:49-71); its
    kernels' cvt.rn.satfinite.e2m1x2.f32 gives NaN +6 (0x7) and keeps the sign of a zero
    (0x8): lscore follows the kernels, and leaves NaN out of the amaxes as they do."""
    specials = DATA["ref_cast_x"].view(np.float32)  # NaN, -0.0, -NaN, 0.0
    np.testing.assert_array_equal(DATA["ref_cast_codes"], [[0x00, 0x00]])
    assert kernels.e2m1_satfinite(specials).tolist() == [[0x7, 0x8, 0x7, 0x0]]
    x = np.zeros((16, 32), np.float32)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, -0.0, 3.0
    b = fp8.quantize_blocks(x, "te-nvfp4", role="input")
    assert b.tensor_scale == 3.0
    assert b.data[0, 0] & 0xF == 0x7 and b.data[1, 0] >> 4 == 0x8


def generated(seed, shape=(32, 64)):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 6, (shape[0], 1))).astype(BF16)


def test_roles_follow_tes_table_and_equal_the_twin():
    """input: the transform on the columnwise copy; weight: 16x16 tiles (either axis);
    grad: stochastic rounding both ways, the transform on the columnwise copy."""
    x = generated(1)
    x32 = x.astype(np.float32)
    cases = [
        ("input", -1, dict()),
        ("input", 0, dict(axis=0, rht=True)),
        ("weight", -1, dict(tile=True)),
        ("weight", 0, dict(tile=True)),
        ("grad", -1, dict(seed=5, offset=9)),
        ("grad", 0, dict(axis=0, rht=True, seed=5, offset=9)),
    ]
    for role, axis, kw in cases:
        b = fp8.quantize_blocks(x, "te-nvfp4", role=role, axis=axis, seed=5, offset=9)
        s, q = ref.quantize(x32, **kw)
        np.testing.assert_array_equal(b.scales.view(np.uint8), s, err_msg=f"{role} {axis}")
        np.testing.assert_array_equal(b.data, q, err_msg=f"{role} {axis}")
        assert b.tensor_scale == ref.global_amax(x32, rht=kw.get("rht", False))
        got = fp8.dequantize_blocks(b)
        want = ref.decode(s, q, b.tensor_scale, axis=kw.get("axis", -1), tile=b.tiles)
        np.testing.assert_array_equal(got, want)
        for dt in (np.float16, BF16):  # the float32 product rounded once
            np.testing.assert_array_equal(
                fp8.dequantize_blocks(b, dt).view(np.uint16), want.astype(dt).view(np.uint16)
            )


def test_tes_switches_turn_each_option_off():
    x = generated(2)
    plain = fp8.recipe("te-nvfp4", disable_rht=True, disable_stochastic_rounding=True)
    no_2d = fp8.recipe("te-nvfp4", disable_2d_quantization=True)
    assert (plain.hadamard, plain.stochastic_rounding, no_2d.weight_block) == (False, False, None)
    assert no_2d.hadamard and no_2d.stochastic_rounding
    first = fp8.quantize_blocks(x, plain, role="input")
    for role, axis, r in (("grad", -1, plain), ("grad", 0, plain), ("weight", -1, no_2d)):
        b = fp8.quantize_blocks(x, r, role=role, axis=axis)
        w = fp8.quantize_blocks(x, plain, axis=axis) if axis == 0 else first
        np.testing.assert_array_equal(b.data, w.data, err_msg=f"{role} {axis}")
        np.testing.assert_array_equal(b.scales.view(np.uint8), w.scales.view(np.uint8))


def test_stochastic_rounding_replays_from_seed_and_offset():
    """The same seed and offset give the same bytes; another offset or seed others; the
    rowwise and columnwise copies of one call draw apart (bit 63 of the subsequence);
    seed and offset do nothing where the recipe does not round stochastically."""
    x = generated(3)
    a = fp8.quantize_blocks(x, "te-nvfp4", role="grad", seed=11, offset=4)
    same = fp8.quantize_blocks(x, "te-nvfp4", role="grad", seed=11, offset=4)
    np.testing.assert_array_equal(a.data, same.data)
    for seed, offset in ((11, 5), (12, 4)):
        other = fp8.quantize_blocks(x, "te-nvfp4", role="grad", seed=seed, offset=offset)
        assert (other.data != a.data).mean() > 0.2
    inp = fp8.quantize_blocks(x, "te-nvfp4", role="input")
    np.testing.assert_array_equal(
        fp8.quantize_blocks(x, "te-nvfp4", role="input", seed=11, offset=4).data, inp.data
    )
    with pytest.raises(ValueError, match=r"seed= is needed: recipe 'te-nvfp4' rounds"):
        fp8.quantize_blocks(x, "te-nvfp4", role="grad")
    with pytest.raises(ValueError, match=r"offset must be an integer from 0 to 2\*\*64 - 1"):
        fp8.quantize_blocks(x, "te-nvfp4", role="grad", seed=1, offset=-1)


def test_stochastic_rounding_is_unbiased_over_offsets():
    """Averaged over 256 offsets, stochastically rounded values approach the input (E[q] = v
    up to the 8 random bits' resolution), where nearest rounding stays off by the grid."""
    x = np.tile(np.float32([0.3, 1.1, 2.6, 4.9, -0.7, -3.3, 5.2, 0.06] * 2), (16, 1))
    x[:, 0] = 6.0  # every block's amax 6 under the tensor amax 6: the factor 1
    r = fp8.recipe("te-nvfp4", disable_rht=True)
    mean = np.mean(
        [fp8.dequantize_blocks(fp8.quantize_blocks(x, r, role="grad", seed=9, offset=o))
         for o in range(256)], axis=0,
    )  # fmt: skip
    near = fp8.dequantize_blocks(fp8.quantize_blocks(x, r, role="input"))
    assert np.abs(mean - x).mean() < 0.08 < np.abs(near - x).mean()


def test_fields_round_trip_and_are_checked():
    r = fp8.recipe("te-nvfp4")
    assert fp8.BlockRecipe.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert "TransformerEngine v2.18" in r.source and "fc1fc0e787fc" in r.source
    old = r.to_dict()
    for f in ("hadamard", "stochastic_rounding"):
        del old[f]  # a dict written before the fields existed loads with their defaults
    assert not fp8.BlockRecipe.from_dict({**old, "mode": "te-nvfp4"}).hadamard
    assert fp8.recipe("te-nvfp4", fp8_format="E4M3") == r
    bad = [
        (dict(fp8_format="HYBRID"), "fp8_format must be 'E4M3' for te-nvfp4"),
        (dict(disable_rht=True, hadamard=False), "give disable_rht or hadamard, not both"),
        (dict(tensor_scale=False), "tensor_scale must be True and tail 'refuse'"),
        (dict(tail="pad"), "tensor_scale must be True and tail 'refuse'"),
        (dict(element="e4m3fn"), "element must be one of e2m1 under mode 'te-nvfp4'"),
        (dict(weight_block=32), "weight_block must be None or the block 16"),
    ]
    for kw, match in bad:
        with pytest.raises(ValueError, match=match):
            fp8.recipe("te-nvfp4", **kw)
    with pytest.raises(TypeError, match="disable_rht must be a bool, got 'yes'"):
        fp8.recipe("te-nvfp4", disable_rht="yes")
    with pytest.raises(ValueError, match="hadamard must be False under mode 'nvfp4'"):
        fp8.recipe("nvfp4", hadamard=True)
    with pytest.raises(ValueError, match="disable_rht is the te-nvfp4 preset's field"):
        fp8.recipe("nvfp4", disable_rht=True)


def test_shapes_and_inputs_refused_with_the_recipe_named():
    x = generated(4)
    with pytest.raises(ValueError, match="recipe 'te-nvfp4' refuses a partial block"):
        fp8.quantize_blocks(x[:, :40], "te-nvfp4")
    with pytest.raises(ValueError, match="must be bfloat16 for the Hadamard transform"):
        fp8.quantize_blocks(x.astype(np.float32), "te-nvfp4", axis=0)
    with pytest.raises(ValueError, match="multiples of the tile 16"):
        fp8.quantize_blocks(x[:24], "te-nvfp4", role="weight")


def test_out_is_written_in_place():
    x = generated(5)
    first = fp8.quantize_blocks(x, "te-nvfp4", role="grad", axis=0, seed=2)
    y = generated(6)
    got = fp8.quantize_blocks(y, "te-nvfp4", role="grad", axis=0, seed=2, out=first)
    want = fp8.quantize_blocks(y, "te-nvfp4", role="grad", axis=0, seed=2)
    assert got.data is first.data and got.tensor_scale == want.tensor_scale
    np.testing.assert_array_equal(first.data, want.data)
    np.testing.assert_array_equal(first.scales.view(np.uint8), want.scales.view(np.uint8))


def test_stacked_weights_tile_as_te_flattens_them():
    x = np.stack([generated(7), generated(8)])  # (2, 32, 64): TE's rows are 2 * 32
    b = fp8.quantize_blocks(x, "te-nvfp4", role="weight")
    flat = fp8.quantize_blocks(x.reshape(64, 64), "te-nvfp4", role="weight")
    assert b.scales.shape == (2, 2, 4) and b.data.shape == (2, 32, 32)
    np.testing.assert_array_equal(b.data.reshape(64, 32), flat.data)
    np.testing.assert_array_equal(b.scales.view(np.uint8).reshape(4, 4), flat.scales.view(np.uint8))
    np.testing.assert_array_equal(
        fp8.dequantize_blocks(b).reshape(64, 64), fp8.dequantize_blocks(flat)
    )
