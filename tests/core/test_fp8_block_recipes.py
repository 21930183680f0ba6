"""The block recipes' fields: weight tiles, float32 scale rules, the source each preset
reproduces, roles, and dicts written before a field existed."""

import json

import pytest

import lscore.fp8 as fp8
from lscore.fp8 import block_recipes

NEW_FIELDS = ("weight_block", "power_2_scales", "amax_epsilon", "source")


@pytest.mark.parametrize("name", block_recipes.BLOCK_RECIPES)
def test_every_preset_names_its_library_and_version(name):
    r = fp8.recipe(name)
    assert r.source and any(ch.isdigit() for ch in r.source)
    assert fp8.BlockRecipe.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    # a dict written before the new fields existed loads, with their defaults
    old = {k: v for k, v in r.to_dict().items() if k not in NEW_FIELDS}
    back = fp8.BlockRecipe.from_dict(old)
    assert (back.weight_block, back.power_2_scales, back.amax_epsilon, back.source) == (
        None,
        False,
        0.0,
        "",
    )


def test_blockwise_presets():
    te = fp8.recipe("te-blockwise")
    assert (te.block, te.weight_block, te.scale_format, te.mode, te.behaviour) == (
        128,
        128,
        "float32",
        "te-fp32",
        "te",
    )
    assert (te.element, te.grad_element, te.power_2_scales, te.amax_epsilon, te.tail) == (
        "e4m3fn",
        "e4m3fn",
        True,
        0.0,
        "pad",
    )
    assert te.source == "NVIDIA/TransformerEngine v2.18"
    hybrid = fp8.recipe("te-blockwise", fp8_format="HYBRID")
    assert (hybrid.element, hybrid.grad_element) == ("e4m3fn", "e5m2")
    assert fp8.recipe("te-blockwise", power_2_scales=False).power_2_scales is False
    ao = fp8.recipe("torchao-blockwise")
    assert (ao.power_2_scales, ao.amax_epsilon, ao.tail, ao.weight_block) == (
        False,
        1e-12,
        "refuse",
        128,
    )
    assert ao.source == "pytorch/ao v0.18.0"


def test_mx_weight_tiles_name_their_version():
    assert fp8.recipe("torchao-mx-rceil", weight_block=32).source == "pytorch/ao v0.18.0"
    te2d = fp8.recipe("te-mxfp8", weight_block=32)
    assert te2d.weight_block == 32 and "d8815c4c30b5" in te2d.source
    assert "after v2.18" in te2d.source
    assert fp8.recipe("te-mxfp8", weight_block=32, source="mine").source == "mine"
    assert fp8.recipe("te-mxfp8").source == "NVIDIA/TransformerEngine v2.18"


def test_roles_pick_the_element():
    r = fp8.recipe("te-blockwise", fp8_format="HYBRID")
    assert [r.role_element(x) for x in (None, "input", "weight", "grad")] == [
        "e4m3fn",
        "e4m3fn",
        "e4m3fn",
        "e5m2",
    ]
    with pytest.raises(ValueError, match="unknown role 'bias'; expected one of: None, input"):
        r.role_element("bias")


@pytest.mark.parametrize(
    "name, overrides, err, message",
    [
        ("torchao-mx-floor", {"weight_block": 16}, ValueError, "weight_block must be None or"),
        ("te-blockwise", {"weight_block": 32}, ValueError, "the block 128"),
        ("te-blockwise", {"weight_block": "a"}, TypeError, "weight_block must be an integer"),
        ("torchao-mx-floor", {"power_2_scales": True}, ValueError, "power_2_scales must be"),
        ("torchao-blockwise", {"power_2_scales": True}, ValueError, "mode 'te-fp32'"),
        ("te-blockwise", {"power_2_scales": 1}, TypeError, "power_2_scales must be a bool"),
        ("ocp-mx", {"amax_epsilon": 1e-3}, ValueError, "amax_epsilon must be 0 under mode"),
        ("te-blockwise", {"amax_epsilon": -1.0}, ValueError, "finite and >= 0"),
        ("te-blockwise", {"amax_epsilon": float("inf")}, ValueError, "finite and >= 0"),
        ("te-blockwise", {"amax_epsilon": "x"}, TypeError, "amax_epsilon must be a real"),
        ("te-blockwise", {"fp8_format": "E5M2"}, ValueError, "pure E5M2 training"),
        ("te-blockwise", {"element": "e5m2"}, ValueError, "element must be 'e4m3fn' under"),
        ("te-blockwise", {"element": "e2m1"}, ValueError, "e4m3fn, e5m2 under mode 'te-fp32'"),
        ("torchao-blockwise", {"grad_element": "e5m2"}, ValueError, "one of e4m3fn under"),
        ("torchao-blockwise", {"fp8_format": "E4M3"}, ValueError, "is not TE's"),
        ("te-blockwise", {"scale_format": "e8m0"}, ValueError, "scale_format must be 'float32'"),
        ("te-blockwise", {"block": 32}, ValueError, "block must be 128 under mode 'te-fp32'"),
        ("nvfp4", {"source": 3}, TypeError, "source must be a string"),
    ],
)
def test_bad_new_fields(name, overrides, err, message):
    with pytest.raises(err, match=message):
        fp8.recipe(name, **overrides)


def test_from_dict_still_refuses_unknown_and_missing_fields():
    d = fp8.recipe("te-mxfp8").to_dict()
    with pytest.raises(ValueError, match=r"unknown: \['hadamard_size'\], missing: \[\]"):
        fp8.BlockRecipe.from_dict({**d, "hadamard_size": 16})
    del d["mode"]
    with pytest.raises(ValueError, match=r"missing: \['mode'\]"):
        fp8.BlockRecipe.from_dict(d)


def test_a_float32_rule_takes_its_fields():
    fields = dict(fp8.recipe("te-blockwise").to_dict(), name="mine", source="")
    assert fp8.BlockRecipe(**dict(fields, weight_block=None)).weight_block is None
    ao = fp8.recipe("torchao-blockwise", amax_epsilon=0.0)
    assert ao.amax_epsilon == 0.0
    with pytest.raises(ValueError, match="power_2_scales must be False under mode 'torchao-fp32'"):
        fp8.BlockRecipe(**dict(ao.to_dict(), power_2_scales=True))
