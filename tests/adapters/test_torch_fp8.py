"""FP8 training emulated for torch: converted layers against torchao 0.18's ``Float8Linear``
(emulate=True) bit for bit, the quantized bytes against torchao's casts, the delayed recipe's
scales against ``lscore.fp8.DelayedScaling`` over steps, resume, ``GradScaler`` together with FP8,
and bad input. The reference vectors come from tests/adapters/data/record_torchao_float8.py."""

import copy
import io
import json
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lscore.fp8
from helpers.torch_bits import bits as _bits
from helpers.torch_bits import from_bits
from lscore.adapters.torch import GradScaler
from lscore.adapters.torch.fp8 import (
    DelayedFloat8Linear,
    Float8Linear,
    convert_to_float8,
    fp8_update,
)
from lscore.adapters.torch.quantize import dequantize, quantize, quantize_current

DATA = np.load(pathlib.Path(__file__).parent / "data" / "torchao_float8.npz")
META = json.loads(str(DATA["meta"]))
HP = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _tensor(key, dtype):
    """The recorded bits under ``key`` as a tensor of ``dtype`` (float32 or bfloat16)."""
    return from_bits(DATA[key], dtype)


def _two_layers(dtype=torch.float32):
    return torch.nn.Sequential(
        torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 16)
    ).to(dtype)


@pytest.mark.parametrize(
    "case", META["linear"], ids=lambda c: f"{c['recipe']}-{c['dtype']}-{len(c['shape'])}d"
)
def test_converted_model_equals_torchao_float8linear(case):
    key, dtype = case["key"], case["dtype"]
    model = _two_layers(HP[dtype])
    model.load_state_dict({p: _tensor(f"{key}/param/{p}", dtype) for p in case["params"]})
    convert_to_float8(model, "torchao-" + case["recipe"])
    assert isinstance(model[0], Float8Linear) and isinstance(model[2], Float8Linear)
    x = _tensor(f"{key}/x", dtype).requires_grad_(True)
    y = model(x)
    y.backward(_tensor(f"{key}/grad_out", dtype))
    _same_product(y, DATA[f"{key}/y"], "y")
    _same_product(x.grad, DATA[f"{key}/grad_x"], "grad_x")
    for name, p in model.named_parameters():
        _same_product(p.grad, DATA[f"{key}/grad/{name}"], name)


def _same_product(got, want_bits, what):
    """Equal bits where this CPU's float32 matrix products sum as the recording machine's
    did; otherwise (MKL picks its summation order by the CPU: seen on an AVX-512 Xeon, where
    the float32 products of the tensorwise models differ in the last bits) within float32
    rounding of a short product, 2**-20 of the output's magnitude.  The operands' float8
    bytes and scales are compared bit for bit on every machine
    (test_quantize_equals_torchao_cast), and the product's formula against torch's own ops
    (test_current_scaling_multiplies_the_dequantized_operands)."""
    bits = _bits(got)
    if np.array_equal(bits, want_bits):
        return
    assert got.dtype == torch.float32, f"{what}: {got.dtype} differs from the recording"
    have, want = bits.view(np.float32), want_bits.view(np.float32)
    np.testing.assert_allclose(
        have, want, rtol=0, atol=float(np.abs(want).max()) * 2.0**-20, err_msg=what
    )


def _same_float8(got, want_bytes, fmt):
    """Equal float8 data, NaN compared by value (torch writes 0x7F or 0xFF by the NaN's sign)."""
    got_f = got.contiguous().view(FP8[fmt]).float().numpy()
    want_f = torch.from_numpy(want_bytes.copy()).view(FP8[fmt]).float().numpy()
    np.testing.assert_array_equal(np.isnan(got_f), np.isnan(want_f))
    ok = ~np.isnan(want_f)
    np.testing.assert_array_equal(_bits(got).reshape(want_bytes.shape)[ok], want_bytes[ok])


def _same_float32(got, want_bits):
    """Equal float32 values, bit for bit, NaN compared by value (torchao's NaN scale is
    0xFFFFFFFF, a quiet NaN with the sign and every payload bit set)."""
    want = want_bits.view(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got.view(np.uint32)[ok], want_bits[ok])


@pytest.mark.parametrize(
    "case",
    META["quant"],
    ids=lambda c: "-".join(
        str(c[k]) for k in ("key", "dtype", "fmt", "kind", "granularity", "axis", "power_2_scales")
    ),
)
def test_quantize_equals_torchao_cast(case):
    key, fmt = case["key"], case["fmt"]
    x = _tensor(f"{key}/x", case["dtype"]).reshape(8, 24)
    want_scale = DATA[f"{key}/scale"].reshape(-1)
    if case["given_scale"]:
        scale = float(want_scale.view(np.float32)[0])
        q, _ = quantize(x, scale, fmt, saturate=True, nan_sign=True)
        _same_float8(q, DATA[f"{key}/q"], fmt)
        return
    name = "torchao-tensorwise" if case["granularity"] == "tensor" else "torchao-rowwise"
    recipe = lscore.fp8.recipe(name, power_2_scales=case["power_2_scales"])
    # torchao's axiswise dim 0 scales each column: the rows of the transpose
    q = quantize_current(x.t() if case["axis"] == 0 else x, recipe, fmt)
    data = q.data.t() if case["axis"] == 0 else q.data
    got_scale = torch.as_tensor(q.scale).reshape(-1).numpy()
    _same_float32(got_scale, want_scale)
    _same_float8(data, DATA[f"{key}/q"], fmt)


@pytest.mark.parametrize("name", ["te-current", "torchao-tensorwise", "torchao-rowwise"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_current_scaling_multiplies_the_dequantized_operands(name, dtype):
    """The forward is the float32 product of the dequantized input and weight, rounded to the
    input's dtype, then the bias: for every current recipe, TransformerEngine's too."""
    torch.manual_seed(3)
    linear = torch.nn.Linear(24, 8).to(dtype)
    layer = Float8Linear.from_linear(linear, name)
    x = (torch.randn(5, 24) * 40).to(dtype)
    recipe = lscore.fp8.recipe(name)

    def deq(t):
        q = quantize_current(t, recipe, recipe.forward_format)
        return dequantize(
            q.data, q.scale, torch.float32, axis=-1 if recipe.granularity == "row" else None
        )

    want = torch.mm(deq(x), deq(linear.weight.detach()).t()).to(dtype) + linear.bias.detach()
    np.testing.assert_array_equal(_bits(layer(x)), _bits(want))
    # the product is not the unquantized one: the operands went through float8
    assert not torch.equal(layer(x), linear(x))


def _amax(t):
    return np.float32(t.detach().abs().max().float())


def test_delayed_scales_follow_delayed_scaling_over_steps():
    """Each layer's state is a DelayedScaling fed the step's amaxes (input, weight,
    grad_output) and updated once per step: a twin fed the same amaxes holds the same bits."""
    torch.manual_seed(5)
    model = convert_to_float8(_two_layers(), "te-delayed")
    recipe = lscore.fp8.recipe("te-delayed")
    layers = [model[0], model[2]]
    formats = (recipe.forward_format, recipe.forward_format, recipe.backward_format)
    twins = [lscore.fp8.DelayedScaling(recipe, 3, formats) for _ in layers]
    seen = {}
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__((i, "x"), _amax(a[0])))
        layer.register_full_backward_hook(
            lambda m, gi, go, i=i: seen.__setitem__((i, "g"), _amax(go[0]))
        )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scales = []
    for step in range(6):
        x = (torch.randn(4, 32) * (1 + step)).requires_grad_(True)
        weights = [_amax(layer.weight) for layer in layers]
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        for i, twin in enumerate(twins):
            twin.record(np.array([seen[i, "x"], weights[i], seen[i, "g"]], np.float32))
            twin.update()
        fp8_update(model)
        for layer, twin in zip(layers, twins, strict=True):
            np.testing.assert_array_equal(layer.fp8_state.scale, twin.scale)
            np.testing.assert_array_equal(layer.fp8_state.scale_inv, twin.scale_inv)
            np.testing.assert_array_equal(layer.fp8_state.amax_history, twin.amax_history)
        scales.append(model[0].fp8_state.scale.copy())
    # the scales moved off their initial 1 and with the growing inputs
    assert (scales[0] != 1).all() and scales[0][0] != scales[-1][0]


def test_delayed_casts_between_updates_accumulate_by_max_and_keep_the_scale():
    torch.manual_seed(6)
    layer = convert_to_float8(torch.nn.Linear(16, 16), "te-delayed")
    assert isinstance(layer, DelayedFloat8Linear)
    small, large = torch.randn(3, 16), torch.randn(3, 16) * 50
    with torch.no_grad():
        y1 = layer(small)
        layer(large)
        layer(small)
        # no update yet: the same scale, so the same output for the same input
        np.testing.assert_array_equal(_bits(layer(small)), _bits(y1))
    np.testing.assert_array_equal(layer.fp8_state.scale, np.ones(3, np.float32))
    assert layer.fp8_state.amax_history[0, 0] == _amax(large)
    layer.update_scales()
    assert layer.fp8_state.scale[0] == np.float32(448) / _amax(large)
    with torch.no_grad():
        assert not torch.equal(layer(small), y1)


class _OtherRankDoubles:
    """A reducer whose other rank saw twice each amax: the MAX it agrees on is 2 * amax."""

    def __init__(self):
        self.calls = 0

    def reduce(self, found_inf, stats=None):
        self.calls += 1
        return found_inf, {k: 2 * v for k, v in stats.items()}


def test_fp8_update_reduces_the_step_amaxes_through_a_reducer():
    torch.manual_seed(11)
    model = convert_to_float8(_two_layers(), "te-delayed")
    x = torch.randn(4, 32, requires_grad=True)
    model(x).sum().backward()
    current = [m.fp8_state.amax_history[0].copy() for m in (model[0], model[2])]
    reducer = _OtherRankDoubles()
    fp8_update(model, reducer)
    assert reducer.calls == 1  # one agreement for the step: both layers, all three tensors
    for m, amax in zip((model[0], model[2]), current, strict=True):
        want = np.float32(448) / (2 * amax[:2])
        np.testing.assert_array_equal(m.fp8_state.scale[:2], want)
        assert m.fp8_state.scale[2] == np.float32(57344) / (2 * amax[2])


class _OtherRank:
    """A reducer whose other rank saw the amaxes `theirs`, handed out in call order: a call
    with k statistics takes the next k of them and returns the elementwise MAX (NaN wins)."""

    def __init__(self, theirs):
        self.theirs, self.calls = list(theirs), 0

    def reduce(self, found_inf, stats=None):
        self.calls += 1
        out = {}
        for key, mine in stats.items():
            other = self.theirs.pop(0)
            out[key] = np.nan if np.isnan(mine) or np.isnan(other) else max(mine, other)
        return found_inf, out


def _three_layers():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 24), torch.nn.Linear(24, 8)
    )


def test_fp8_update_is_one_reducer_call_with_the_per_layer_scales():
    """Three converted layers: fp8_update agrees on all nine amaxes of a step in one reducer
    call, and every layer's scales and history are bitwise those of a copy whose layers each
    called update_scales with their own reducer call."""
    torch.manual_seed(12)
    model = convert_to_float8(_three_layers(), "te-delayed")
    twin = copy.deepcopy(model)
    layers = [m for m in model.modules() if isinstance(m, DelayedFloat8Linear)]
    twin_layers = [m for m in twin.modules() if isinstance(m, DelayedFloat8Linear)]
    assert len(layers) == 3
    rng = np.random.default_rng(12)
    for step in range(4):
        x = torch.randn(5, 16) * (1 + step)
        for m in (model, twin):
            m(x).pow(2).mean().backward()
        # the other rank's amaxes: larger, smaller, zero (did not run) or NaN, per tensor
        theirs = rng.choice([0.0, 0.5, 4.0, 40.0, np.nan], size=9, p=[0.2, 0.3, 0.2, 0.2, 0.1])
        one = _OtherRank(theirs)
        fp8_update(model, one)
        assert one.calls == 1 and not one.theirs
        each = _OtherRank(theirs)
        for layer in twin_layers:
            layer.update_scales(each)
        assert each.calls == 3 and not each.theirs
        for a, b in zip(layers, twin_layers, strict=True):
            for name in ("scale", "scale_inv", "amax_history"):
                mine, alone = getattr(a.fp8_state, name), getattr(b.fp8_state, name)
                np.testing.assert_array_equal(mine.view(np.uint32), alone.view(np.uint32))
    # the other rank's amaxes reached the scales: not all layers kept their first scale
    assert any((m.fp8_state.scale != 1).any() for m in layers)


def test_fp8_update_without_delayed_layers_calls_no_reducer():
    model = convert_to_float8(_three_layers(), "torchao-tensorwise")
    reducer = _OtherRank([])
    fp8_update(model, reducer)
    assert reducer.calls == 0


def _train_delayed(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, 32, generator=g) * 3
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        fp8_update(model)


def test_resume_takes_the_same_next_step_bitwise():
    torch.manual_seed(7)
    model = convert_to_float8(_two_layers(), "te-delayed")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train_delayed(model, opt, 3, seed=1)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)  # the delayed state is plain data

    resumed = convert_to_float8(_two_layers(), "te-delayed")
    resumed.load_state_dict(ckpt["model"])
    ropt = torch.optim.Adam(resumed.parameters(), lr=1e-2)
    ropt.load_state_dict(ckpt["opt"])
    for a, b in ((model, opt), (resumed, ropt)):
        _train_delayed(a, b, 2, seed=2)
    for (name, p), q in zip(model.named_parameters(), resumed.parameters(), strict=True):
        np.testing.assert_array_equal(_bits(p), _bits(q), err_msg=name)
    for a, b in ((model[0], resumed[0]), (model[2], resumed[2])):
        np.testing.assert_array_equal(a.fp8_state.scale, b.fp8_state.scale)
        np.testing.assert_array_equal(a.fp8_state.amax_history, b.fp8_state.amax_history)
    # a fresh model that was not loaded takes another step: the state dict carried something
    fresh = convert_to_float8(_two_layers(), "te-delayed")
    fresh.load_state_dict(
        {k: v for k, v in ckpt["model"].items() if "extra" not in k}, strict=False
    )
    assert not np.array_equal(fresh[0].fp8_state.scale, model[0].fp8_state.scale)


def test_delayed_layers_copy_and_pickle_with_their_state():
    torch.manual_seed(10)
    model = convert_to_float8(_two_layers(), "te-delayed")
    _train_delayed(model, torch.optim.SGD(model.parameters(), lr=0.01), 2, seed=3)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    others = (copy.deepcopy(model), torch.load(buf, weights_only=False))
    for other in others:
        for a, b in ((model[0], other[0]), (model[2], other[2])):
            assert type(b) is DelayedFloat8Linear and b.fp8_state is not a.fp8_state
            assert b.fp8_state.state_dict() == a.fp8_state.state_dict()
    x = torch.randn(3, 32)
    for other in others:
        np.testing.assert_array_equal(_bits(other(x)), _bits(model(x)))


def test_state_of_another_recipe_is_refused():
    model = convert_to_float8(_two_layers(), "te-delayed")
    other = convert_to_float8(_two_layers(), lscore.fp8.recipe("te-delayed", margin=2))
    before = copy.deepcopy(other[0].fp8_state.state_dict())
    with pytest.raises(ValueError):
        other.load_state_dict(model.state_dict())
    assert other[0].fp8_state.state_dict() == before


def test_current_scaling_layers_keep_nn_linear_state_dicts():
    torch.manual_seed(8)
    plain = _two_layers()
    model = convert_to_float8(copy.deepcopy(plain), "torchao-rowwise")
    assert list(model.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(model.state_dict())  # strict, both ways
    model.load_state_dict(plain.state_dict())


@pytest.mark.parametrize("name", ["te-delayed", "torchao-tensorwise"])
def test_grad_scaler_and_fp8_train_together(name):
    """float16 autocast with lscore's GradScaler and FP8 layers: an overflowing step is
    skipped (parameters untouched, scale backed off) and the other steps train."""
    torch.manual_seed(9)
    model = convert_to_float8(_two_layers(), name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = GradScaler("cpu", init_scale=2.0**8, growth_interval=1000)
    x = torch.randn(16, 32)
    target = torch.randn(16, 16)
    losses = []
    for step in range(8):
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            y = model(x)
        assert y.dtype == torch.float16
        loss = (y.float() - target).pow(2).mean()
        losses.append(loss.item())
        bad = float("inf") if step == 3 else 1.0
        scaler.scale(loss * bad).backward()
        scaler.step(opt)
        scaler.update()
        fp8_update(model)
        moved = [not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)]
        assert scaler.last_step_skipped == (step == 3)
        assert not any(moved) if step == 3 else all(moved)
        assert all(torch.isfinite(p).all() for p in model.parameters())
    assert scaler.get_scale() == 2.0**7
    assert losses[-1] < losses[0]
    if name == "te-delayed":
        # the grad_output scale saw the loss scale: a scaled gradient has a scaled amax
        assert (model[2].fp8_state.scale != 1).all()


def test_convert_swaps_nn_linear_layers_in_place():
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.Sequential(torch.nn.Linear(8, 4)), torch.nn.ReLU()
    )
    weight = model[0].weight
    out = convert_to_float8(model, module_filter=lambda m, fqn: fqn != "1.0")
    assert out is model
    assert type(model[0]) is Float8Linear and model[0].weight is weight
    assert type(model[1][0]) is torch.nn.Linear
    assert model[0].recipe == lscore.fp8.recipe("torchao-tensorwise")
    # converting again changes nothing; a root nn.Linear is returned converted, not changed
    assert convert_to_float8(model)[0] is model[0]
    root = torch.nn.Linear(8, 8)
    swapped = convert_to_float8(root, "te-delayed")
    assert type(root) is torch.nn.Linear and type(swapped) is DelayedFloat8Linear
    assert swapped.weight is root.weight and swapped.bias is root.bias


def test_bad_input_errors():
    layer = Float8Linear(16, 8)
    with pytest.raises(
        ValueError, match=r"last dimension must be in_features=16, got shape \(3, 15\)"
    ):
        layer(torch.randn(3, 15))
    with pytest.raises(ValueError, match=r"at least one element .* got shape \(0, 16\)"):
        layer(torch.randn(0, 16))
    with pytest.raises(TypeError, match=r"must be float32, bfloat16 or float16, got torch\.int64"):
        layer(torch.ones(2, 16, dtype=torch.int64))
    with pytest.raises(ValueError, match="unknown"):
        convert_to_float8(_two_layers(), "torchao-columnwise")
    with pytest.raises(TypeError, match=r"recipe must be a recipe name or an lscore\.fp8\.Recipe"):
        convert_to_float8(_two_layers(), 3)
    with pytest.raises(ValueError, match="Float8Linear takes a current-scaling recipe"):
        Float8Linear(16, 8, recipe="te-delayed")
    with pytest.raises(ValueError, match="DelayedFloat8Linear takes a per-tensor delayed"):
        DelayedFloat8Linear(16, 8, recipe="torchao-rowwise")
    with pytest.raises(ValueError, match=r"root nn\.Linear with children"):
        root = torch.nn.Linear(4, 4)
        root.extra = torch.nn.ReLU()
        convert_to_float8(root)
