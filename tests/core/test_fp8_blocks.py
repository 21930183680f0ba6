"""lscore.fp8's block-scaled recipes, quantize_blocks and dequantize_blocks.

The torchao presets against torchao 0.18.0's own outputs on the CPU (scale bytes, element
bytes and the values its to_dtype / NVFP4Tensor.dequantize read back), recorded by
tests/core/data/record_torchao_mx.py; the OCP and TransformerEngine presets against the
NumPy twin on generated blocks; tails, overrides and bad input.
"""

import dataclasses
import json
import pathlib

import numpy as np
import pytest

import lscore.fp8 as fp8
from lscore import _reference_mx as ref
from lscore import kernels
from lscore.fp8 import block_table, blocks

ml_dtypes = pytest.importorskip("ml_dtypes")

DATA = np.load(pathlib.Path(__file__).parent / "data" / "torchao_mx.npz")
ELEMS = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1"}
TAO_MODES = ("floor", "ceil", "even", "rceil")
TARGETS = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}


def inputs(dtype, kind):
    x = DATA[f"{dtype}_{kind}_x"]
    return x.view(np.float32) if dtype == "f32" else x.view(ml_dtypes.bfloat16)


def same_values(got, bits, target):
    """got (a float array of `target`) equals the recorded bits, a NaN matching any NaN."""
    want = bits.view(TARGETS[target])
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    keep = ~np.isnan(w)
    np.testing.assert_array_equal(got.view(bits.dtype)[keep], bits[keep])


# ---- the torchao presets, bit for bit --------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("elem", list(ELEMS))
@pytest.mark.parametrize("mode", TAO_MODES)
def test_torchao_mx_presets_equal_torchao(dtype, elem, mode):
    x = inputs(dtype, "mx")
    r = fp8.recipe(f"torchao-mx-{mode}")
    b = fp8.quantize_blocks(x, r, element=elem)
    assert (b.recipe, b.element, b.axis, b.shape, b.tensor_scale) == (r, elem, -1, x.shape, None)
    assert b.scales.dtype == ml_dtypes.float8_e8m0fnu and b.scales.shape == (len(x), 1)
    assert b.data.dtype == (
        np.uint8 if elem == "e2m1" else np.dtype(getattr(ml_dtypes, ELEMS[elem]))
    )
    np.testing.assert_array_equal(b.scales.view(np.uint8), DATA[f"{dtype}_{elem}_{mode}_scale"])
    np.testing.assert_array_equal(b.data.view(np.uint8), DATA[f"{dtype}_{elem}_{mode}_data"])
    for target, t in TARGETS.items():
        got = fp8.dequantize_blocks(b, t)
        same_values(got, DATA[f"{dtype}_{elem}_{mode}_deq_{target}"], target)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_nvfp4_preset_equals_torchao(dtype):
    x = inputs(dtype, "nv")
    pts = DATA[f"{dtype}_nvfp4_pts"].view(np.float32)
    for g, p in enumerate(pts):  # each group of 8 blocks is one tensor with its own scale
        rows = slice(g * 8, (g + 1) * 8)
        b = fp8.quantize_blocks(x[rows], "nvfp4")
        assert b.scales.dtype == ml_dtypes.float8_e4m3fn and b.data.dtype == np.uint8
        np.testing.assert_array_equal(np.float32(b.tensor_scale), p)
        np.testing.assert_array_equal(
            b.scales.view(np.uint8), DATA[f"{dtype}_nvfp4_pts_scale"][rows]
        )
        np.testing.assert_array_equal(b.data, DATA[f"{dtype}_nvfp4_pts_data"][rows])
        for target in ("f32", "bf16"):
            got = fp8.dequantize_blocks(b, TARGETS[target])
            same_values(got, DATA[f"{dtype}_nvfp4_pts_deq_{target}"][rows], target)
    b = fp8.quantize_blocks(x, fp8.recipe("nvfp4", tensor_scale=False))
    assert b.tensor_scale is None
    np.testing.assert_array_equal(b.scales.view(np.uint8), DATA[f"{dtype}_nvfp4_scale"])
    np.testing.assert_array_equal(b.data, DATA[f"{dtype}_nvfp4_data"])
    for target in ("f32", "bf16"):
        same_values(
            fp8.dequantize_blocks(b, TARGETS[target]), DATA[f"{dtype}_nvfp4_deq_{target}"], target
        )


def test_torchao_tiny_blocks_read_back_at_half_their_value():
    # torchao divides a tiny block by 2**-126 but reads scale byte 0 back as 2**-127
    x = np.full((1, 32), 2.0**-130, np.float32)
    tao = fp8.dequantize_blocks(fp8.quantize_blocks(x, "torchao-mx-floor"))
    np.testing.assert_array_equal(tao, x / 2)


# ---- the OCP and TransformerEngine presets against the twin ---------------------------


def generated(rng, k=32):
    """Blocks whose maxima are the cases where the rules differ (as the recorded ones), plus
    random ones; float32."""
    x = np.concatenate([inputs("f32", "mx"), inputs("bf16", "mx").astype(np.float32)])
    tops = [2.0**e for e in (-127, -126, -1, 0, 1, 126, 127)]
    near = [np.nextafter(np.float32(t), np.float32(s)) for t in tops for s in (0, np.inf)]
    rows = []
    for m in [*tops, *near, 448 * 2.0**20, 57344.0, 6.0, 1e-45, 1e-40]:
        v = (rng.uniform(-1, 1, k) * np.float32(m)).astype(np.float32)
        v[rng.integers(k)] = m
        rows.append(v)
    rows.append(rng.standard_normal(k).astype(np.float32) * 1e30)
    return np.concatenate([x[:, :k], np.stack(rows)])


def twin(x32, r, elem):
    if r.mode == "nvfp4":
        return ref.nvfp4_quantize(x32)
    return ref.mx_quantize(x32, ELEMS[elem], r.kernel_mode, r.block)


def rule_values(b):
    """The rule's reading: float32(element) * 2**(c - 127) (0xFF NaN), computed in float64;
    TE v2.18's (ptx::exp2f, common/util/ptx.cuh:382-384) reads code 0 as +0.0, 0xFF as +Inf."""
    elems = b.data.astype(np.float64) if b.element != "e2m1" else None
    if elems is None:
        codes = b.data.view(np.uint8)
        pairs = np.stack([codes & 15, codes >> 4], -1).reshape(*codes.shape[:-1], -1)
        elems = ref.e2m1_decode(pairs).astype(np.float64)
    c = b.scales.view(np.uint8).astype(np.float64)
    s = np.where(c == 255, np.nan, 2.0 ** (c - 127))
    if b.recipe.kernel_mode == "te":
        s = np.where(c == 255, np.inf, np.where(c == 0, 0.0, s))
    with np.errstate(invalid="ignore"):
        return elems * np.repeat(s, b.recipe.block, axis=-1)


RULE_PRESETS = ["ocp-mx", "te-mxfp8", "te-mxfp8@4ff5fdfed0c1"]


@pytest.mark.parametrize("name", RULE_PRESETS)
@pytest.mark.parametrize("elem", ["e4m3fn", "e5m2", "e2m1"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_rule_presets_equal_twin(name, elem, dtype):
    name, _, revision = name.partition("@")
    r = fp8.recipe(name, revision=revision)
    if elem not in block_table.MODES[r.mode]["elements"]:
        with pytest.raises(ValueError, match="element must be one of e4m3fn, e5m2 under mode 'te'"):
            fp8.quantize_blocks(np.zeros(32, np.float32), r, element=elem)
        return
    with np.errstate(over="ignore"):
        x = generated(np.random.default_rng(35)).astype(dtype)
    x32 = x.astype(np.float32)
    b = fp8.quantize_blocks(x, r, element=elem)
    s, q = twin(x32, r, elem)
    np.testing.assert_array_equal(b.scales.view(np.uint8), s)
    np.testing.assert_array_equal(b.data.view(np.uint8), q)
    exact = rule_values(b)
    with np.errstate(over="ignore"):
        for t in (np.float32, ml_dtypes.bfloat16, np.float16):
            got = fp8.dequantize_blocks(b, t)
            want = exact.astype(np.float32).astype(t)
            np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    # columnwise, from the same high-precision input: the rows' blocks of the transpose
    c = fp8.quantize_blocks(np.ascontiguousarray(x[:64].T), r, axis=0, element=elem)
    s, q = twin(x32[:64], r, elem)
    assert c.axis == 0 and c.scales.shape == (1, 64)
    np.testing.assert_array_equal(c.scales.view(np.uint8), s.T)
    np.testing.assert_array_equal(c.data.view(np.uint8), q.T)
    np.testing.assert_array_equal(
        fp8.dequantize_blocks(c), np.ascontiguousarray(fp8.dequantize_blocks(b)[:64].T)
    )


def test_half_precision_input_read_as_float32():
    x = generated(np.random.default_rng(1))
    for dtype in (ml_dtypes.bfloat16, np.float16):
        with np.errstate(over="ignore"):
            h = x.astype(dtype)
        # NVFP4's per-tensor amax of a NaN depends on the dtype (the next test): without it
        for r in ("te-mxfp8", "torchao-mx-rceil", fp8.recipe("nvfp4", tensor_scale=False)):
            a = fp8.quantize_blocks(h[:, :32], r)
            w = fp8.quantize_blocks(h[:, :32].astype(np.float32), r)
            np.testing.assert_array_equal(a.data.view(np.uint8), w.data.view(np.uint8))
            np.testing.assert_array_equal(a.scales.view(np.uint8), w.scales.view(np.uint8))


@pytest.mark.parametrize(
    "dtype, word",
    [(np.float32, 0xFFFFFFFF), (np.float16, 0xFFC00000), ("bfloat16", 0x7FC00000)],
)
def test_nvfp4_nan_amax_is_torch_max_of_abs(dtype, word):
    """torchao's NVFP4 takes its tensor amax as torch.max(torch.abs(x)), whose NaN on the
    CPU is the word of x's dtype (float32: all ones, the sign set), whatever NaN x holds;
    the per-tensor scale is that NaN / 2688 and the blocks are quantized with it."""
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    x = generated(np.random.default_rng(4))[:8, :32].copy()
    x[~np.isfinite(x)] = 1.0
    x[2, 5] = np.float32(np.nan) * np.float32(-1)
    h = x.astype(dt)
    b = fp8.quantize_blocks(h, "nvfp4")
    assert np.float32(b.tensor_scale).view(np.uint32) == word
    s, d = kernels.nvfp4_quantize(h.astype(np.float32), np.uint32(word).view(np.float32))
    np.testing.assert_array_equal(b.scales.view(np.uint8), s)
    np.testing.assert_array_equal(b.data, d)
    one = fp8.quantize_blocks(np.full(1, -np.nan, np.float32), fp8.recipe("nvfp4", tail="pad"))
    assert np.float32(one.tensor_scale).view(np.uint32) == 0x7FC00000  # |x| of one element


def test_strided_input_read_in_place():
    x = generated(np.random.default_rng(2))
    wide = np.zeros((x.shape[0], 64), np.float32)
    wide[:, ::2] = x
    a = fp8.quantize_blocks(wide[:, ::2], "te-mxfp8")
    w = fp8.quantize_blocks(x, "te-mxfp8")
    np.testing.assert_array_equal(a.data.view(np.uint8), w.data.view(np.uint8))


# ---- tails -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["torchao-mx-floor", "torchao-mx-rceil", "nvfp4"])
def test_torchao_presets_refuse_a_partial_block(name):
    r = fp8.recipe(name)
    assert r.tail == "refuse"
    with pytest.raises(ValueError, match=f"multiple of the block {r.block}.*got {r.block + 3}"):
        fp8.quantize_blocks(np.ones((2, r.block + 3), np.float32), r)
    with pytest.raises(ValueError, match="along axis 0 must be a multiple"):
        fp8.quantize_blocks(np.ones((r.block + 3, 2), np.float32), r, axis=0)


@pytest.mark.parametrize("name", RULE_PRESETS)
@pytest.mark.parametrize("elem", ["e4m3fn", "e2m1"])
@pytest.mark.parametrize("n", [1, 33, 45, 63])
def test_rule_presets_pad_a_partial_block(name, elem, n):
    name, _, revision = name.partition("@")
    r = fp8.recipe(name, revision=revision)
    if elem == "e2m1" and r.mode == "te":
        return
    assert r.tail == "pad"
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((3, n)) * 2.0 ** rng.integers(-20, 20, (3, 1))).astype(np.float32)
    padded = np.zeros((3, -(-n // 32) * 32), np.float32)
    padded[:, :n] = x
    b = fp8.quantize_blocks(x, r, element=elem)
    s, q = twin(padded, r, elem)
    width = (n + 1) // 2 if elem == "e2m1" else n
    assert b.scales.shape == s.shape and b.data.shape == (3, width)
    np.testing.assert_array_equal(b.scales.view(np.uint8), s)
    np.testing.assert_array_equal(b.data.view(np.uint8), q[:, :width])
    y = fp8.dequantize_blocks(b)
    assert y.shape == x.shape
    full = fp8.dequantize_blocks(fp8.quantize_blocks(padded, r, element=elem))
    np.testing.assert_array_equal(y, full[:, :n])
    c = fp8.quantize_blocks(np.ascontiguousarray(x.T), r, axis=0, element=elem)
    np.testing.assert_array_equal(c.scales.view(np.uint8), s.T)
    np.testing.assert_array_equal(fp8.dequantize_blocks(c), y.T)


# ---- recipes, overrides ------------------------------------------------------------


def test_presets_and_round_trip():
    assert fp8.BLOCK_RECIPES == (
        "ocp-mx",
        "te-mxfp8",
        "torchao-mx-floor",
        "torchao-mx-ceil",
        "torchao-mx-even",
        "torchao-mx-rceil",
        "nvfp4",
        "te-blockwise",
        "torchao-blockwise",
        "te-nvfp4",
    )
    for name in fp8.BLOCK_RECIPES:
        r = fp8.recipe(name)
        assert isinstance(r, fp8.BlockRecipe) and r.name == name
        d = json.loads(json.dumps(r.to_dict()))
        assert fp8.BlockRecipe.from_dict(d) == r
    assert isinstance(fp8.recipe("te-current"), fp8.Recipe)
    hybrid = fp8.recipe("te-mxfp8", fp8_format="HYBRID")
    assert (hybrid.element, hybrid.grad_element) == ("e4m3fn", "e5m2")
    mxfp4 = fp8.recipe("ocp-mx", element="e2m1", grad_element="e2m1")
    assert mxfp4.element == "e2m1"


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("nvfp4", {"block": 32}, "block must be 16 under mode 'nvfp4', got 32"),
        ("ocp-mx", {"block": 16}, "block must be 32 under mode 'ocp', got 16"),
        ("te-mxfp8", {"element": "e2m1"}, "element must be one of e4m3fn, e5m2 under mode 'te'"),
        ("te-mxfp8", {"grad_element": "e2m1"}, "grad_element must be one of e4m3fn, e5m2"),
        ("te-mxfp8", {"element": "e5m2"}, "element must be 'e4m3fn' under mode 'te'"),
        ("te-mxfp8", {"fp8_format": "E5M2"}, "pure E5M2 training is not supported"),
        ("torchao-mx-floor", {"fp8_format": "E4M3"}, "fp8_format is a TE recipe's field"),
        ("nvfp4", {"element": "e4m3fn"}, "element must be one of e2m1 under mode 'nvfp4'"),
        ("nvfp4", {"scale_format": "e8m0"}, "scale_format must be 'e4m3fn' under mode 'nvfp4'"),
        ("torchao-mx-floor", {"tensor_scale": True}, "tensor_scale must be False"),
        ("torchao-mx-floor", {"behaviour": "rule"}, "behaviour must be 'torchao'"),
        ("ocp-mx", {"mode": "round"}, "unknown mode 'round'; expected one of: ocp, te, floor"),
        ("ocp-mx", {"tail": "drop"}, "unknown tail 'drop'; expected one of: refuse, pad"),
        ("ocp-mx", {"margin": 1}, "unknown recipe field .margin."),
    ],
)
def test_bad_overrides(name, overrides, message):
    with pytest.raises(ValueError, match=message):
        fp8.recipe(name, **overrides)


def test_unknown_names_list_every_preset():
    with pytest.raises(
        ValueError, match=r"expected one of: te-delayed, .*torchao-rowwise, ocp-mx, "
    ):
        fp8.recipe("mxfp8")
    with pytest.raises(ValueError, match="a recipe dict must have exactly the fields"):
        fp8.BlockRecipe.from_dict({"name": "x"})
    with pytest.raises(ValueError, match="must be a per-tensor recipe, got the block recipe"):
        fp8.DelayedScaling("te-mxfp8", 1)


# ---- bad input ---------------------------------------------------------------------


def test_bad_input():
    x = np.ones((4, 32), np.float32)
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16, got int32"):
        fp8.quantize_blocks(np.ones(32, np.int32), "ocp-mx")
    with pytest.raises(TypeError, match="x must be a NumPy array, got list"):
        fp8.quantize_blocks([1.0] * 32, "te-mxfp8")
    with pytest.raises(TypeError, match=r"recipe must be an lscore.fp8.BlockRecipe"):
        fp8.quantize_blocks(x, fp8.recipe("te-current"))
    with pytest.raises(ValueError, match=r"axis must be -1 .* or 0 .* got 1"):
        fp8.quantize_blocks(np.ones((2, 32, 32), np.float32), "te-mxfp8", axis=1)
    with pytest.raises(ValueError, match="array of 3 dimensions, got 0"):
        fp8.quantize_blocks(np.ones((32, 2, 32), np.float32), "te-mxfp8", axis=0)
    with pytest.raises(ValueError, match="array of 0 dimensions"):
        fp8.quantize_blocks(np.array(1.0, np.float32), "te-mxfp8")
    with pytest.raises(ValueError, match="element must be one of e4m3fn, e5m2, e2m1 under mode"):
        fp8.quantize_blocks(x, "torchao-mx-floor", element="e3m2")
    with pytest.raises(ValueError, match="native byte order"):
        fp8.quantize_blocks(x.astype(">f4"), "te-mxfp8")
    b = fp8.quantize_blocks(x, "te-mxfp8")
    with pytest.raises(TypeError, match="dtype must be float32, float16 or bfloat16"):
        fp8.dequantize_blocks(b, np.float64)
    with pytest.raises(TypeError, match=r"b must be an lscore.fp8.BlockScaled"):
        fp8.dequantize_blocks(b.data)
    with pytest.raises(
        ValueError, match=r"b.scales must be float8_e8m0fnu or uint8 of shape \(4, 1\)"
    ):
        fp8.dequantize_blocks(
            blocks.BlockScaled(b.data, b.scales[:2], None, b.recipe, "e4m3fn", -1, b.shape)
        )
    with pytest.raises(ValueError, match=r"b.tensor_scale must be a float32 under recipe 'nvfp4'"):
        nv = fp8.quantize_blocks(x, "nvfp4")
        fp8.dequantize_blocks(
            blocks.BlockScaled(nv.data, nv.scales, None, nv.recipe, "e2m1", -1, x.shape)
        )


@pytest.mark.parametrize("name", ["te-mxfp8", "torchao-mx-floor", "nvfp4"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_out_is_written_in_place(name, axis):
    """out= writes an earlier result's arrays in place, with the bytes of a new call, and
    takes this call's tensor scale."""
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal((64, 96)).astype(np.float32) for _ in range(2))
    out = fp8.quantize_blocks(x, name, axis=axis)
    scales, data = out.scales, out.data
    got = fp8.quantize_blocks(y, name, axis=axis, out=out)
    want = fp8.quantize_blocks(y, name, axis=axis)
    assert got.scales is scales and got.data is data
    np.testing.assert_array_equal(got.scales.view(np.uint8), want.scales.view(np.uint8))
    np.testing.assert_array_equal(got.data.view(np.uint8), want.data.view(np.uint8))
    assert got.tensor_scale == want.tensor_scale
    if name == "nvfp4":
        assert got.tensor_scale != out.tensor_scale


def test_out_refused_before_writing():
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    out = fp8.quantize_blocks(x, "te-mxfp8")
    before = out.data.view(np.uint8).copy()
    bad = [
        (dict(recipe="torchao-mx-floor"), ValueError, "same recipe, element, axis, role and shape"),
        (dict(x=np.ones((4, 96), np.float32)), ValueError, r"shape \(4, 64\); this call"),
        (dict(element="e5m2"), ValueError, "'e4m3fn', axis -1"),
        (dict(out=out.data), TypeError, "out must be an lscore.fp8.BlockScaled"),
        (
            dict(out=dataclasses.replace(out, data=out.data[:, ::1].T.copy().T)),
            ValueError,
            "out.data must be a writable C-contiguous",
        ),
    ]
    for kw, err, message in bad:
        args = dict(x=-x, recipe="te-mxfp8", out=out) | kw
        with pytest.raises(err, match=message):
            fp8.quantize_blocks(args.pop("x"), args.pop("recipe"), **args)
        np.testing.assert_array_equal(out.data.view(np.uint8), before)
    part = fp8.quantize_blocks(np.ones((4, 40), np.float32), "ocp-mx")
    with pytest.raises(ValueError, match="out= needs whole blocks of 32 along axis -1, got 40"):
        fp8.quantize_blocks(np.ones((4, 40), np.float32), "ocp-mx", out=part)


def test_empty_input():
    b = fp8.quantize_blocks(np.ones((0, 64), np.float32), "te-mxfp8")
    assert b.scales.shape == (0, 2) and b.data.shape == (0, 64)
    assert fp8.dequantize_blocks(b).shape == (0, 64)
