"""Training under TransformerEngine v2.18's NVFP4 recipe (``te-nvfp4``) emulated in torch: the
three GEMMs of a converted layer take the operands TE's NVFP4BlockScaling gives them (1x16
rows, 16x16 weight tiles, the weight gradient's operands as Hadamard-transformed columnwise
copies, gradients stochastically rounded), the layer's random stream advances once per backward,
and a run resumed from a state dict continues bitwise."""

import copy
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

import lscore.fp8
from lscore.adapters.torch.fp8 import convert_to_float8
from lscore.adapters.torch.mx import MXLinear, StochasticMXLinear
from lscore.adapters.torch.quantize import dequantize_blocks, quantize_blocks

BF16 = torch.bfloat16


def _bits(t):
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _dq(t, r, role, **kw):
    return dequantize_blocks(quantize_blocks(t, r, role=role, **kw), t.dtype)


def _model(width=32, hidden=64):
    return torch.nn.Sequential(
        torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, width)
    )


def test_layer_gemms_take_te_nvfp4_operands():
    """Forward, input gradient and weight gradient are bf16 GEMMs of the operands
    quantize_blocks gives under te-nvfp4 for each role and orientation, the two copies of the
    output gradient rounded with the layer's (seed, offset)."""
    torch.manual_seed(3)
    linear = torch.nn.Linear(64, 32).to(BF16)
    layer = StochasticMXLinear.from_linear(linear, "te-nvfp4", seed=7)
    r = layer.recipe
    x = (torch.randn(48, 64) * 2).to(BF16).requires_grad_(True)
    g = (torch.randn(48, 32) * 1e-3).to(BF16)
    y = layer(x)
    y.backward(g)
    w, xd = linear.weight.detach(), x.detach()
    stream = dict(seed=7, offset=0)
    want_y = torch.mm(_dq(xd, r, "input"), _dq(w, r, "weight").t()) + linear.bias.detach()
    want_gx = torch.mm(_dq(g, r, "grad", **stream), _dq(w.t().contiguous(), r, "weight").t())
    g0 = _dq(g, r, "grad", axis=0, **stream)
    want_gw = torch.mm(g0.t(), _dq(xd, r, "input", axis=0))
    np.testing.assert_array_equal(_bits(y), _bits(want_y))
    np.testing.assert_array_equal(_bits(x.grad), _bits(want_gx))
    np.testing.assert_array_equal(_bits(linear.weight.grad), _bits(want_gw))
    assert layer.offset == 1


def test_hadamard_transform_cancels_in_the_weight_gradient():
    """Both operands of the weight-gradient GEMM are transformed along the rows, so the product
    approximates the exact one about as well as NVFP4 without the transform does."""
    torch.manual_seed(4)
    x = torch.randn(256, 64).to(BF16).requires_grad_(False)
    g = (torch.randn(256, 32) * 1e-3).to(BF16)
    exact = g.float().t() @ x.float()
    errors = {}
    for rht in (True, False):
        r = lscore.fp8.recipe("te-nvfp4", disable_rht=not rht)
        layer = MXLinear(64, 32, bias=False, recipe=r, seed=1).to(BF16)
        layer(x).backward(g)
        gw = layer.weight.grad.float()
        errors[rht] = float((gw - exact).norm() / exact.norm())
    assert errors[True] < 0.25 and errors[False] < 0.25, errors


def test_stream_advances_once_per_backward_and_follows_the_seed():
    torch.manual_seed(5)
    x = torch.randn(32, 32).to(BF16)
    g = (torch.randn(32, 16) * 1e-2).to(BF16)

    def grads(layer, times):
        out = []
        for _ in range(times):
            layer.weight.grad = None
            layer(x).backward(g)
            out.append(layer.weight.grad.clone())
        return out

    base = torch.nn.Linear(32, 16).to(BF16)
    a = grads(StochasticMXLinear.from_linear(base, seed=11), 2)
    b = grads(StochasticMXLinear.from_linear(base, seed=11), 2)
    c = grads(StochasticMXLinear.from_linear(base, seed=12), 1)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(_bits(u), _bits(v))
    # a new offset, a new rounding; another seed, another rounding
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a[0], c[0])


def test_layers_build_by_recipe_and_keep_their_stream_in_the_state_dict():
    torch.manual_seed(6)
    model = convert_to_float8(_model(), "te-nvfp4")
    assert all(isinstance(model[i], StochasticMXLinear) for i in (0, 2))
    assert model[0].seed != model[2].seed
    assert "seed=" in repr(model)
    keys = set(model.state_dict())
    assert keys == set(_model().state_dict()) | {"0._extra_state", "2._extra_state"}
    assert model.state_dict()["0._extra_state"] == {"seed": model[0].seed, "offset": 0}
    # the same seeds again under the same torch seed
    torch.manual_seed(6)
    again = convert_to_float8(_model(), "te-nvfp4")
    assert [again[i].seed for i in (0, 2)] == [model[i].seed for i in (0, 2)]
    # rounding to nearest: a plain MXLinear, nn.Linear's state dict
    nearest = convert_to_float8(
        _model(), lscore.fp8.recipe("te-nvfp4", disable_stochastic_rounding=True)
    )
    assert type(nearest[0]) is MXLinear
    assert set(nearest.state_dict()) == set(_model().state_dict())


def test_copies_and_pickles_carry_the_stream():
    model = convert_to_float8(_model(), "te-nvfp4")
    model[0].offset = 41
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    for other in (copy.deepcopy(model), torch.load(buf, weights_only=False)):
        assert isinstance(other[0], StochasticMXLinear)
        assert (other[0].seed, other[0].offset) == (model[0].seed, 41)


def _train(model, opt, x, target, steps):
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=BF16):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), target)
        loss.backward()
        opt.step()
    return loss.item()


def test_resumed_run_continues_bitwise():
    """Three steps, a checkpoint (model and optimizer state dicts), three more: a fresh model
    (other seeds) loaded from the checkpoint takes the same three steps bitwise; without the
    layers' streams it does not."""
    torch.manual_seed(8)
    x, target = torch.randn(64, 32), torch.randn(64, 32)
    model = convert_to_float8(_model(), "te-nvfp4")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _train(model, opt, x, target, 3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    _train(model, opt, x, target, 3)
    assert model[0].offset == 6

    def resumed(keep_stream):
        buf.seek(0)
        ckpt = torch.load(buf)
        torch.manual_seed(99)
        fresh = convert_to_float8(_model(), "te-nvfp4")
        state = ckpt["model"]
        if not keep_stream:
            state = {k: v for k, v in state.items() if not k.endswith("_extra_state")}
        fresh.load_state_dict(state, strict=keep_stream)
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        fresh_opt.load_state_dict(ckpt["opt"])
        _train(fresh, fresh_opt, x, target, 3)
        return fresh

    again = resumed(True)
    assert again[0].offset == 6
    for want, got in zip(model.parameters(), again.parameters(), strict=True):
        np.testing.assert_array_equal(_bits(got), _bits(want))
    other = resumed(False)
    assert not all(
        torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters(), strict=True)
    )


def test_te_nvfp4_trains_under_bf16_autocast():
    torch.manual_seed(9)
    teacher = torch.randn(32, 32) / 6
    x = torch.randn(64, 32)
    target = x @ teacher
    model = convert_to_float8(_model(), "te-nvfp4")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = _train(model, opt, x, target, 1)
    last = _train(model, opt, x, target, 40)
    assert np.isfinite(last) and last < 0.3 * first, (first, last)


def test_bad_inputs_and_states_error():
    layer = MXLinear(32, 16, recipe="te-nvfp4", seed=1)
    # the Hadamard transform takes bfloat16: refused before anything runs
    with pytest.raises(TypeError, match="bfloat16"):
        layer(torch.randn(16, 32))
    assert layer.offset == 0
    with torch.no_grad():  # no weight gradient, no transform
        layer(torch.randn(16, 32))
    with pytest.raises(ValueError, match="seed"):
        StochasticMXLinear(32, 16, seed=-1)
    with pytest.raises(ValueError, match="seed"):
        StochasticMXLinear(32, 16, seed=2**64)
    with pytest.raises(ValueError, match="stochastically"):
        StochasticMXLinear(32, 16, recipe="te-mxfp8")
    with pytest.raises(ValueError, match="'seed' and 'offset'"):
        layer.set_extra_state({"seed": 1})
    with pytest.raises(ValueError, match="offset"):
        layer.set_extra_state({"seed": 1, "offset": -3})


@pytest.mark.gpu
def test_a_cuda_run_equals_the_cpu_run():
    """The same steps on a CUDA device: the stream and the codes are the CPU's, so the
    parameters after each step match the CPU run's to the GEMMs' rounding."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(10)
    x, target = torch.randn(64, 32), torch.randn(64, 32)
    cpu = convert_to_float8(_model(), "te-nvfp4")
    gpu = copy.deepcopy(cpu).cuda()
    opts = [torch.optim.SGD(m.parameters(), lr=1e-2) for m in (cpu, gpu)]
    _train(cpu, opts[0], x, target, 2)
    with torch.autocast("cuda", dtype=BF16):
        for _ in range(2):
            opts[1].zero_grad()
            loss = torch.nn.functional.mse_loss(gpu(x.cuda()).float(), target.cuda())
            loss.backward()
            opts[1].step()
    assert gpu[0].offset == cpu[0].offset == 2
    for a, b in zip(cpu.parameters(), gpu.parameters(), strict=True):
        torch.testing.assert_close(b.cpu(), a, rtol=2e-2, atol=1e-4)
