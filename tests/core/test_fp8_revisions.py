"""The library revision each preset reproduces: ``source`` on every recipe, and a block
recipe's ``revision`` selecting the next revision where its library changed a rule
(NVIDIA/TransformerEngine#3262, pytorch/ao#4725), through quantize_blocks and
dequantize_blocks.

TE's MXFP8 dequantize multiplies each element by ptx::exp2f(scale code) in float32 and
rounds once (common/cast/mxfp8/dequantize_mxfp8.cuh:175-195 at v2.18); exp2f is the bits
code << 23 at v2.18 (common/util/ptx.cuh:382-384), and from 4ff5fdfed0c1 (#3262,
ptx.cuh:382-388) code 255 is the NaN 0x7FFFFFFF and code 0 the subnormal 2**-127 (TE's
own test of it, tests/pytorch/mxfp8/test_mxfp8_dequantize_extreme_scales.py, plants
element 56, i.e. e4m3fn 1.0, under codes 0 and 255).
"""

import json
import pathlib

import numpy as np
import pytest

import lscore.fp8 as fp8

ml_dtypes = pytest.importorskip("ml_dtypes")

DATA = np.load(pathlib.Path(__file__).parent / "data" / "torchao_mx_4725.npz")
PINNED = {"te": "v2.18", "torchao": "v0.18.0", "rule": "v1.0"}
TE_NEXT, AO_NEXT = "4ff5fdfed0c1", "5d73a0c10b02"


@pytest.mark.parametrize("name", fp8.BLOCK_RECIPES)
def test_block_presets_reproduce_the_pinned_release(name):
    r = fp8.recipe(name)
    assert r.revision == PINNED[r.behaviour]
    assert r.source.startswith(fp8.REVISIONS[r.behaviour][r.revision])  # te-nvfp4 adds its SR rule
    assert r.kernel_mode == r.mode
    assert fp8.BlockRecipe.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    old = {k: v for k, v in r.to_dict().items() if k != "revision"}  # written before it
    assert fp8.BlockRecipe.from_dict(old) == r


@pytest.mark.parametrize("name", ["torchao-mx-floor", "torchao-mx-ceil", "torchao-mx-even"])
def test_torchao_next_revision_names_its_commit(name):
    r = fp8.recipe(name, revision=AO_NEXT)
    assert r.source == "pytorch/ao main at 5d73a0c10b02 (#4725)"
    assert r.kernel_mode == f"{r.mode}-4725"
    assert fp8.BlockRecipe.from_dict(r.to_dict()) == r
    assert fp8.recipe(name, revision=AO_NEXT, weight_block=32).source == r.source


def test_te_next_revision_names_its_commit():
    r = fp8.recipe("te-mxfp8", revision=TE_NEXT, fp8_format="HYBRID")
    assert r.source == "NVIDIA/TransformerEngine main at 4ff5fdfed0c1 (#3262)"
    assert (r.kernel_mode, r.grad_element) == ("te-3262", "e5m2")
    tiles = fp8.recipe("te-mxfp8", revision=TE_NEXT, weight_block=32)
    assert tiles.source.startswith(r.source) and "d8815c4c30b5 (#2634" in tiles.source
    assert fp8.recipe("te-mxfp8", revision=TE_NEXT, source="mine").source == "mine"


@pytest.mark.parametrize(
    "name, revision, err, message",
    [
        ("te-mxfp8", "v0.18.0", ValueError, "revision must be one of v2.18, 4ff5fdfed0c1 under"),
        ("torchao-mx-rceil", "main", ValueError, "one of v0.18.0, 5d73a0c10b02 under behaviour"),
        ("nvfp4", AO_NEXT, ValueError, "must be 'v0.18.0' under mode 'nvfp4' .*changed no rule"),
        ("ocp-mx", TE_NEXT, ValueError, "revision must be one of v1.0 under behaviour 'rule'"),
        ("te-mxfp8", 2.18, TypeError, "revision must be a string, got 2.18"),
    ],
)
def test_bad_revisions(name, revision, err, message):
    with pytest.raises(err, match=message):
        fp8.recipe(name, revision=revision)


def planted(revision):
    """A te-mxfp8 BlockScaled of two rows of two blocks, the elements 1.0 (e4m3fn 0x38) but
    for one 0; the scale codes 0 and 127 (the first row), 127 and 0xFF (the second)."""
    r = fp8.recipe("te-mxfp8", revision=revision)
    b = fp8.quantize_blocks(np.ones((2, 64), np.float32), r)
    data, scales = b.data.view(np.uint8), b.scales.view(np.uint8)
    data[:] = 0x38
    data[1, 33] = 0
    scales[0, 0], scales[1, 1] = 0, 255
    scales[0, 1] = scales[1, 0] = 127  # 2**0
    return b


def test_te_dequantize_reads_extreme_codes_as_its_revision():
    for dtype in (np.float32, ml_dtypes.bfloat16, np.float16):
        old = fp8.dequantize_blocks(planted("v2.18"), dtype).astype(np.float32)
        assert np.all(old[0, :32] == 0) and not np.signbit(old[0, :32]).any()  # 1.0 * +0.0
        assert np.all(old[1, 32:33] == np.inf) and np.isnan(old[1, 33])  # 0 * Inf
        new = fp8.dequantize_blocks(planted(TE_NEXT), dtype).astype(np.float32)
        want = np.float32(2.0**-127).astype(dtype).astype(np.float32)  # 0 in the 16-bit types
        assert np.all(new[0, :32] == want) and np.all(np.isnan(new[1, 32:]))
        for y in (old, new):  # the other blocks: 1.0 * 2**(127 - 127)
            assert np.all(y[0, 32:] == 1.0) and np.all(y[1, :32] == 1.0)


@pytest.mark.parametrize("mode", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("elem", ["e4m3fn", "e5m2", "e2m1"])
def test_torchao_next_revision_quantizes_as_recorded(mode, elem):
    """quantize_blocks at revision 5d73a0c10b02 gives to_mx's bytes recorded from that
    commit; dequantize_blocks reads them back by to_dtype, which #4725 left alone."""
    r = fp8.recipe(f"torchao-mx-{mode}", revision=AO_NEXT)
    for dtype, view in (("f32", np.float32), ("bf16", ml_dtypes.bfloat16)):
        x = DATA[f"{dtype}_x"].view(view)
        b = fp8.quantize_blocks(x, r, element=elem)
        np.testing.assert_array_equal(
            b.scales.view(np.uint8)[:, 0], DATA[f"{dtype}_{elem}_{mode}_scale"]
        )
        np.testing.assert_array_equal(b.data.view(np.uint8), DATA[f"{dtype}_{elem}_{mode}_data"])
        pinned = fp8.quantize_blocks(x, fp8.recipe(f"torchao-mx-{mode}"), element=elem)
        back = fp8.dequantize_blocks(b)
        same = np.all(b.scales.view(np.uint8) == pinned.scales.view(np.uint8), axis=-1)
        same &= np.all(b.data.view(np.uint8) == pinned.data.view(np.uint8), axis=-1)
        np.testing.assert_array_equal(back[same], fp8.dequantize_blocks(pinned)[same])


@pytest.mark.parametrize("name", fp8.RECIPES)
def test_per_tensor_presets_name_their_version(name):
    r = fp8.recipe(name)
    want = "NVIDIA/TransformerEngine v2.18" if r.rule == "te" else "pytorch/ao v0.18.0"
    assert r.source == want == fp8.REVISIONS[r.rule][PINNED[r.rule]]
    assert fp8.Recipe.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    old = {k: v for k, v in r.to_dict().items() if k != "source"}  # written before it
    assert fp8.Recipe.from_dict(old).source == ""
    assert fp8.recipe(name, source="mine").source == "mine"
    with pytest.raises(TypeError, match="source must be a string, got 1"):
        fp8.recipe(name, source=1)


def test_a_state_saved_before_source_existed_resumes():
    """source describes a recipe and is not compared: a DelayedScaling state whose recipe
    dict has no source (written before the field) loads into the preset's."""
    s = fp8.DelayedScaling("te-delayed", 2)
    s.record(np.float32([3.0, 5.0]))
    s.update()
    d = json.loads(json.dumps(s.state_dict()))
    del d["recipe"]["source"]
    again = fp8.DelayedScaling("te-delayed", 2)
    again.load_state_dict(d)
    np.testing.assert_array_equal(again.scale, s.scale)
    assert fp8.DelayedScaling.from_state_dict(d).scale.tolist() == s.scale.tolist()
    other = json.loads(json.dumps(s.state_dict()))
    other["recipe"]["margin"] = 1
    with pytest.raises(ValueError, match=r"saved by a different recipe .*margin: 1 != 0"):
        again.load_state_dict(other)
