"""Block-scaled training emulated for torch: converted layers against torchao 0.18's
``MXFP8Linear`` (emulated on the CPU) bit for bit, TransformerEngine's MXFP8 and NVFP4 layers
against GEMMs of operands the NumPy twin quantized, a few training steps, copies and bad input.
The reference vectors come from tests/adapters/data/record_torchao_mx_linear.py."""

import copy
import io
import json
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lscore._reference_mx as ref
import lscore.fp8
from helpers.torch_bits import bits as _bits
from helpers.torch_bits import from_bits
from lscore._reference_fp8 import fp8_decode
from lscore.adapters.torch import Float8Linear, MXLinear, convert_to_float8

DATA = np.load(pathlib.Path(__file__).parent / "data" / "torchao_mx_linear.npz")
META = json.loads(str(DATA["meta"]))
HP = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# the twin's names of the recipes' element formats
ELEM = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1"}


def _tensor(key, dtype):
    return from_bits(DATA[key], dtype)


def _two_layers(dtype=torch.float32, hidden=32, width=32):
    return torch.nn.Sequential(
        torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, width)
    ).to(dtype)


def _torchao_recipe(case):
    """The torchao preset of the case's mode, with the case's element formats."""
    r = lscore.fp8.recipe("torchao-mx-" + case["mode"])
    changed = {k: case[k] for k in ("element", "grad_element") if case[k] != getattr(r, k)}
    return lscore.fp8.recipe(r.name, **changed) if changed else r


@pytest.mark.parametrize(
    "case",
    META["linear"],
    ids=lambda c: f"{c['mode']}-{c['element']}-{c['grad_element']}-{c['dtype']}-{len(c['shape'])}d",
)
def test_converted_model_equals_torchao_mx_training(case):
    group, dtype = f"group/{case['group']}", case["dtype"]
    model = _two_layers(HP[dtype])
    model.load_state_dict({p: _tensor(f"{group}/param/{p}", dtype) for p in case["params"]})
    convert_to_float8(model, _torchao_recipe(case))
    assert isinstance(model[0], MXLinear) and isinstance(model[2], MXLinear)
    x = _tensor(f"{group}/x", dtype).requires_grad_(True)
    y = model(x)
    y.backward(_tensor(f"{group}/grad_out", dtype))
    key = case["key"]
    np.testing.assert_array_equal(_bits(y), DATA[f"{key}/y"])
    np.testing.assert_array_equal(_bits(x.grad), DATA[f"{key}/grad_x"])
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(_bits(p.grad), DATA[f"{key}/grad/{name}"], err_msg=name)


def _unpack(codes):
    return np.stack((codes & 0xF, codes >> 4), axis=-1).reshape(codes.shape[0], -1)


def _twin_operand(t, recipe, element):
    """The 2-D tensor ``t`` quantized by the NumPy twin in blocks along its last axis and
    dequantized (float32: the element times its block scale, times NVFP4's tensor scale)."""
    a = t.detach().to(torch.float32).numpy()
    rows, k = a.shape
    if recipe.mode == "nvfp4":
        pts = ref.nvfp4_tensor_scale(float(np.max(np.abs(a)))) if recipe.tensor_scale else None
        scales, codes = ref.nvfp4_quantize(a, pts)
        scale = fp8_decode(scales, "float8_e4m3fn").astype(np.float32)
        if pts is not None:
            scale = np.float32(pts) * scale
        values = ref.e2m1_decode(_unpack(codes)).reshape(rows, -1, 16)
        return torch.from_numpy((values * scale[..., None]).reshape(rows, k))
    scales, codes = ref.mx_quantize(a, ELEM[element], recipe.mode, recipe.block)
    if element == "e2m1":
        values = ref.e2m1_decode(_unpack(codes))
    else:
        values = fp8_decode(codes, ELEM[element]).astype(np.float32)
    out = values.reshape(-1, recipe.block) * ref.e8m0_decode(scales).reshape(-1, 1)
    return torch.from_numpy(out.reshape(rows, k))


@pytest.mark.parametrize("name", ["te-mxfp8", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_layer_multiplies_the_twins_operands(name, dtype):
    """Forward and backward are GEMMs, in the input's dtype, of operands the NumPy twin
    quantized along each GEMM's reduction dimension from the high-precision tensors."""
    torch.manual_seed(5)
    linear = torch.nn.Linear(64, 32).to(dtype)
    layer = MXLinear.from_linear(linear, name)
    r = layer.recipe
    x = (torch.randn(32, 64) * 3).to(dtype).requires_grad_(True)
    g = (torch.randn(32, 32) * 1e-2).to(dtype)
    y = layer(x)
    y.backward(g)
    w, xd = linear.weight.detach(), x.detach()

    def q(t, elem):
        return _twin_operand(t.contiguous(), r, elem).to(dtype)

    want_y = torch.mm(q(xd, r.element), q(w, r.element).t()) + linear.bias.detach()
    want_gx = torch.mm(q(g, r.grad_element), q(w.t(), r.element).t())
    want_gw = torch.mm(q(g.t(), r.grad_element), q(xd.t(), r.element).t())
    np.testing.assert_array_equal(_bits(y), _bits(want_y))
    np.testing.assert_array_equal(_bits(x.grad), _bits(want_gx))
    np.testing.assert_array_equal(_bits(linear.weight.grad), _bits(want_gw))
    # the operands went through the block formats: not the unquantized product
    assert not torch.equal(y, linear(xd))


@pytest.mark.parametrize("name", ["te-mxfp8", "nvfp4"])
def test_block_recipes_train_on_the_cpu(name):
    """A converted model fits a small regression: the loss falls over a few steps."""
    torch.manual_seed(11)
    teacher = torch.randn(32, 32) / 6
    x = torch.randn(64, 32)
    target = x @ teacher
    model = convert_to_float8(_two_layers(hidden=64), name)
    assert all(isinstance(model[i], MXLinear) for i in (0, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.3 * losses[0], losses


@pytest.mark.parametrize("name", sorted(lscore.fp8.BLOCK_RECIPES))
def test_convert_swaps_in_mx_layers_by_name_and_by_recipe(name):
    r = lscore.fp8.recipe(name)
    n = max(32, r.block)  # whole blocks for the recipes that refuse a partial one
    for recipe in (name, r):
        model = _two_layers(hidden=n, width=n)
        weight = model[0].weight
        assert convert_to_float8(model, recipe) is model
        assert isinstance(model[0], MXLinear) and isinstance(model[2], MXLinear)
        assert model[0].weight is weight and model[0].recipe == r
        assert f"recipe={name!r}" in repr(model)
        # converting again leaves the block layers alone
        first = model[0]
        convert_to_float8(model, "torchao-tensorwise")
        assert model[0] is first


def test_block_layers_copy_pickle_and_keep_nn_linear_state_dicts():
    torch.manual_seed(2)
    model = convert_to_float8(_two_layers(), "te-mxfp8")
    x = torch.randn(32, 32)
    want = model(x)
    assert set(model.state_dict()) == set(_two_layers().state_dict())
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    for other in (copy.deepcopy(model), torch.load(buf, weights_only=False)):
        assert isinstance(other[0], MXLinear) and other[0].recipe == model[0].recipe
        np.testing.assert_array_equal(_bits(other(x)), _bits(want))
    fresh = convert_to_float8(_two_layers(), "te-mxfp8")
    fresh.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(_bits(fresh(x)), _bits(want))


def test_partial_blocks_are_refused_before_anything_runs():
    """A recipe that refuses partial blocks: feature sizes at conversion (no layer swapped),
    the input's rows before the forward quantizes anything."""
    refusing = [n for n in lscore.fp8.BLOCK_RECIPES if lscore.fp8.recipe(n).tail == "refuse"]
    assert "te-mxfp8" in refusing or "torchao-mx-floor" in refusing
    name = refusing[0]
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 40))
    with pytest.raises(ValueError, match="out_features must be a multiple of the block size"):
        convert_to_float8(model, name)
    assert type(model[0]) is torch.nn.Linear and type(model[1]) is torch.nn.Linear
    with pytest.raises(ValueError, match="in_features must be a multiple of the block size"):
        MXLinear(20, 32, recipe=name)
    layer = MXLinear(32, 32, recipe=name)
    x = torch.randn(3, 32, requires_grad=True)
    with pytest.raises(ValueError, match="input rows must be a multiple of the block size"):
        layer(x)
    assert x.grad is None


@pytest.mark.parametrize(
    "name",
    [
        n
        for n in sorted(lscore.fp8.BLOCK_RECIPES)
        if lscore.fp8.recipe(n).tail == "pad" and lscore.fp8.recipe(n).weight_block is None
    ],
)
def test_padding_recipes_scale_a_last_partial_block_from_its_own_elements(name):
    torch.manual_seed(4)
    r = lscore.fp8.recipe(name)
    linear = torch.nn.Linear(r.block + 8, 16)
    layer = MXLinear.from_linear(linear, r)
    x = torch.randn(5, r.block + 8)
    padded = torch.nn.functional.pad(x, (0, r.block - 8))
    w = torch.nn.functional.pad(linear.weight.detach(), (0, r.block - 8))
    xq = _twin_operand(padded, r, r.element)[:, : r.block + 8]
    wq = _twin_operand(w, r, r.element)[:, : r.block + 8]
    want = torch.mm(xq.contiguous(), wq.contiguous().t()) + linear.bias.detach()
    np.testing.assert_array_equal(_bits(layer(x)), _bits(want))


def test_bad_recipes_and_inputs_error():
    with pytest.raises(ValueError, match="Float8Linear takes a per-tensor recipe, got the block"):
        Float8Linear(32, 32, recipe="te-mxfp8")
    with pytest.raises(TypeError, match=r"block recipe name or an lscore\.fp8\.BlockRecipe"):
        MXLinear(32, 32, recipe=lscore.fp8.recipe("torchao-tensorwise"))
    with pytest.raises(ValueError, match=r"unknown|one of"):
        convert_to_float8(_two_layers(), "mxfp8-nonesuch")
    layer = MXLinear(32, 32, recipe="te-mxfp8")
    with pytest.raises(TypeError, match="input must be float32, bfloat16 or float16"):
        layer(torch.zeros(32, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="last dimension must be in_features=32"):
        layer(torch.zeros(32, 16))


def test_autocast_multiplies_in_the_autocast_dtype():
    """Under CPU autocast the operands are quantized from bfloat16 and multiplied there; the
    float32 parameters get float32 gradients."""
    torch.manual_seed(6)
    layer = MXLinear(32, 32, recipe="te-mxfp8")
    x = torch.randn(32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    want = MXLinear.from_linear(copy.deepcopy(layer).to(torch.bfloat16), "te-mxfp8")
    np.testing.assert_array_equal(_bits(y), _bits(want(x.to(torch.bfloat16))))
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and layer.bias.grad.dtype == torch.float32
