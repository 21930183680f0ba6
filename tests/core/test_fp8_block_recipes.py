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


def test_mx_weight_tiles_name_their_version():
    assert fp8.recipe("torchao-mx-rceil", weight_block=32).source == "pytorch/ao v0.18.0"
    te2d = fp8.recipe("te-mxfp8", weight_block=32)
    assert te2d.weight_block == 32 and "d8815c4c30b5" in te2d.source
    assert "after v2.18" in te2d.source
    assert fp8.recipe("te-mxfp8", weight_block=32, source="mine").source == "mine"
    assert fp8.recipe("te-mxfp8").source == "NVIDIA/TransformerEngine v2.18"


def test_roles_pick_the_element():
    r = fp8.recipe("te-mxfp8", fp8_format="HYBRID")
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
        ("torchao-mx-floor", {"power_2_scales": True}, ValueError, "power_2_scales must be"),
        ("ocp-mx", {"amax_epsilon": 1e-3}, ValueError, "amax_epsilon must be 0 under mode"),
        ("nvfp4", {"source": 3}, TypeError, "source must be a string"),
    ],
)
def test_bad_new_fields(name, overrides, err, message):
    with pytest.raises(err, match=message):
        fp8.recipe(name, **overrides)


def test_from_dict_still_refuses_unknown_and_missing_fields():
    d = fp8.recipe("te-mxfp8").to_dict()
    with pytest.raises(ValueError, match=r"unknown: \['hadamard'\], missing: \[\]"):
        fp8.BlockRecipe.from_dict({**d, "hadamard": True})
    del d["mode"]
    with pytest.raises(ValueError, match=r"missing: \['mode'\]"):
        fp8.BlockRecipe.from_dict(d)


def test_a_float32_rule_takes_its_fields():
    fields = dict(fp8.recipe("te-mxfp8").to_dict(), block=128, scale_format="float32")
    r = fp8.BlockRecipe(**dict(fields, mode="te-fp32", power_2_scales=True, weight_block=128))
    assert (r.power_2_scales, r.weight_block) == (True, 128)
    ao = dict(fields, mode="torchao-fp32", behaviour="torchao", amax_epsilon=1e-12, revision="")
    assert fp8.BlockRecipe(**ao).amax_epsilon == 1e-12
    with pytest.raises(ValueError, match="power_2_scales must be False under mode 'torchao-fp32'"):
        fp8.BlockRecipe(**dict(ao, power_2_scales=True))
    with pytest.raises(ValueError, match="element must be 'e4m3fn' under mode 'te-fp32'"):
        fp8.BlockRecipe(**dict(fields, mode="te-fp32", element="e5m2"))
    with pytest.raises(ValueError, match="amax_epsilon must be finite and >= 0"):
        fp8.BlockRecipe(**dict(fields, mode="te-fp32", amax_epsilon=-1.0))
