"""GradScaler.unscale_and_clip_ on the device path: lscore's one-pass kernels vs torch.

adapters/torch/_cuda_clip.py is written against a kernel binding: on a GPU
``KERNELS`` (CUDA tensors, the CUDA driver), in CI the same code bound to CPU
tensors and the host harness (``harness`` below), with the scaler forced onto
its device path.  Both are checked against ``torch.amp.GradScaler``'s
``unscale_`` + ``clip_grad_norm_``: the norm within torch's float32 rounding
(rtol 1e-5; inf-norm exact), the clipped gradients bit for bit torch's
``_foreach_mul_`` by the coefficient torch computes from that norm, the
scale's update and a non-finite step exactly torch's.
"""

import math
import shutil

import pytest

torch = pytest.importorskip("torch")
from lscore.adapters.torch import GradScaler, _cuda_clip
from lscore.dtypes import Code

needs_gxx = pytest.mark.skipif(
    shutil.which("g++") is None, reason="g++ is missing: the CUDA host harness cannot be built"
)
DEVICES = [pytest.param("harness", marks=needs_gxx), pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def where(request, monkeypatch):
    """(torch device, kernels the scaler's hook uses)."""
    if request.param == "cuda":
        return torch.device("cuda"), _cuda_clip.KERNELS
    from helpers import cuda_host

    kernels = _cuda_clip.Kernels("cpu", lambda dev: cuda_host.HostBackend())
    monkeypatch.setattr(_cuda_clip, "KERNELS", kernels)
    return torch.device("cpu"), kernels


def _model(seed, device, dtype):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 300), torch.nn.ReLU(), torch.nn.Linear(300, 4)
    ).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(64, 16, generator=g).to(dtype)
    return model.to(device), x.to(device)


def _scaler(cls, device):
    s = cls(device.type, init_scale=2.0**10)
    if cls is GradScaler and device.type == "cpu":
        s._force_torch_kernels = True  # the device path, on CPU tensors
    return s


def _backward(cls, device, seed, dtype, bad=None):
    """A model's scaled backward pass, NaN/Inf put in its last gradient if `bad`."""
    model, x = _model(seed, device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = _scaler(cls, device)
    scaler.scale(model(x).float().pow(2).sum()).backward()
    if bad is not None:
        list(model.parameters())[-1].grad.view(-1)[-1] = bad
    return model, opt, scaler


def _step(cls, device, seed, max_norm, norm_type, dtype=torch.float32, bad=None, fused=True):
    """One step; (norm, clipped gradients, scale after the update)."""
    model, opt, scaler = _backward(cls, device, seed, dtype, bad)
    params = list(model.parameters())
    if fused:
        norm = scaler.unscale_and_clip_(opt, max_norm, norm_type)
    else:  # torch's two calls
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    grads = [p.grad.clone() for p in params]
    scaler.step(opt)
    scaler.update()
    return norm, grads, scaler.get_scale()


def _torch_unscaled(device, seed, dtype, bad=None):
    model, opt, scaler = _backward(torch.amp.GradScaler, device, seed, dtype, bad)
    scaler.unscale_(opt)
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("norm_type", [2.0, "inf"], ids=["l2", "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e9])
def test_matches_torch_unscale_then_clip(where, dtype, norm_type, max_norm):
    device, kernels = where
    n1, g1, s1 = _step(GradScaler, device, 0, max_norm, norm_type, dtype)
    n2, _g2, s2 = _step(torch.amp.GradScaler, device, 0, max_norm, norm_type, dtype, fused=False)
    assert kernels._runners, "the one-pass kernels did not run"
    assert n1.dtype == n2.dtype == dtype and n1.device == n2.device
    if norm_type == "inf":
        assert torch.equal(n1, n2)
    else:
        torch.testing.assert_close(n1, n2, rtol=1e-5 if dtype != torch.bfloat16 else 1e-2, atol=0)
    # bit for bit torch's unscale_, then torch's multiply by torch's coefficient of our norm
    want = _torch_unscaled(device, 0, dtype)
    coef = torch.clamp(max_norm / (n1 + 1e-6), max=1.0)
    torch._foreach_mul_(want, coef)
    for a, b in zip(g1, want, strict=True):
        assert torch.equal(a, b)
    assert s1 == s2


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_step_is_skipped_and_not_clipped(where, bad):
    device, _ = where
    n1, g1, s1 = _step(GradScaler, device, 1, 1e-3, 2.0, bad=bad)
    assert not math.isfinite(float(n1)) and math.isnan(float(n1)) == math.isnan(bad)
    assert s1 == 2.0**9
    for a, b in zip(g1, _torch_unscaled(device, 1, torch.float32, bad), strict=True):
        assert torch.equal(a.nan_to_num(0.0, 1.0, -1.0), b.nan_to_num(0.0, 1.0, -1.0))


def test_same_bits_every_time(where):
    device, _ = where
    runs = [_step(GradScaler, device, 2, 0.5, 2.0) for _ in range(3)]
    for n, g, _ in runs[1:]:
        assert torch.equal(n, runs[0][0]) and all(
            torch.equal(a, b) for a, b in zip(g, runs[0][1], strict=True)
        )


def test_other_layouts_and_norms_take_torchs_path(where):
    device, kernels = where
    kernels._runners.clear()
    n1, g1, _ = _step(GradScaler, device, 3, 0.5, 3.0)
    n2, g2, _ = _step(torch.amp.GradScaler, device, 3, 0.5, 3.0, fused=False)
    assert not kernels._runners
    assert torch.equal(n1, n2) and all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))


def test_fp16_gradients_are_refused_as_torch_refuses_them(where):
    device, _ = where
    model, opt, scaler = _backward(GradScaler, device, 4, torch.float16)
    before = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_and_clip_(opt, 1.0)
    # bit for bit (the float16 loss overflows, so some gradients are NaN/Inf)
    assert all(
        torch.equal(a.view(torch.int16), p.grad.view(torch.int16))
        for a, p in zip(before, model.parameters(), strict=True)
    )


def test_gather_declines_what_the_kernels_cannot_take():
    dense = torch.nn.Parameter(torch.zeros(3))
    dense.grad = torch.ones(3)
    strided = torch.nn.Parameter(torch.zeros(3, 4))
    strided.grad = torch.ones(4, 3).t()
    assert _cuda_clip._gather([dense], "cpu") == {
        torch.device("cpu"): {int(Code.F32): ([dense.grad.data_ptr()], [3])}
    }
    assert _cuda_clip._gather([dense], "cuda") is None
    assert _cuda_clip._gather([dense, strided], "cpu") is None


@pytest.mark.gpu
def test_launches_on_torchs_current_stream():
    device = torch.device("cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        n1, g1, _ = _step(GradScaler, device, 5, 0.5, 2.0)
    side.synchronize()
    n2, g2, _ = _step(GradScaler, device, 5, 0.5, 2.0)
    assert torch.equal(n1, n2) and all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))
