"""GradScaler.unscale_and_clip_ on the device path: lscore's one-pass kernels vs torch.

adapters/torch/_cuda_clip.py is written against a kernel binding: on a GPU
``CUDA`` (CUDA tensors, the CUDA driver), in CI the same code bound to CPU
tensors and the host harness (``harness`` below), with the scaler forced onto
its device path.  Both are checked against ``torch.amp.GradScaler``'s
``unscale_`` + ``clip_grad_norm_``: the norm within torch's float32 rounding
(rtol 1e-5; inf-norm exact), the clipped gradients bit for bit torch's
``_foreach_mul_`` by the coefficient torch computes from that norm, the
scale's update and a non-finite step exactly torch's.  torch's CUDA unscale kernel
refuses bfloat16 gradients (NotImplementedError), where lscore's takes them: for
bfloat16 on a GPU, torch's reference runs its CPU kernels on the same gradients,
moved to the CPU after the backward pass.
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
        return torch.device("cuda"), _cuda_clip.CUDA
    from helpers import cuda_host

    kernels = _cuda_clip.Kernels("cpu", lambda dev: cuda_host.HostBackend())
    monkeypatch.setattr(_cuda_clip, "CUDA", kernels)
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
        s.torch_kernels = True  # the device path, on CPU tensors
    return s


def _backward(cls, device, seed, dtype, bad=None):
    """A model's scaled backward pass, NaN/Inf put in its last gradient if `bad`.

    For torch's GradScaler where its device kernel refuses the dtype (bfloat16 on
    CUDA), the model then moves to the CPU with a CPU scaler: the gradients are the
    device's, the unscale torch's CPU kernel."""
    model, x = _model(seed, device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = _scaler(cls, device)
    scaler.scale(model(x).float().pow(2).sum()).backward()
    if bad is not None:
        list(model.parameters())[-1].grad.view(-1)[-1] = bad
    if cls is torch.amp.GradScaler and device.type == "cuda" and dtype == torch.bfloat16:
        model.cpu()  # the parameters keep their identity; their gradients move with them
        scaler = _scaler(cls, torch.device("cpu"))
        scaler.scale(torch.zeros(()))  # makes the scale tensor (on the CPU)
    return model, opt, scaler


def _step(cls, device, seed, max_norm, norm_type, dtype=torch.float32, bad=None, fused=True):
    """One step; (norm, clipped gradients, scale after the update), on `device`."""
    model, opt, scaler = _backward(cls, device, seed, dtype, bad)
    params = list(model.parameters())
    if fused:
        norm = scaler.unscale_and_clip_(opt, max_norm, norm_type)
    else:  # torch's two calls
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    grads = [p.grad.to(device, copy=True) for p in params]
    scaler.step(opt)
    scaler.update()
    return norm.to(device), grads, scaler.get_scale()


def _torch_unscaled(device, seed, dtype, bad=None):
    model, opt, scaler = _backward(torch.amp.GradScaler, device, seed, dtype, bad)
    scaler.unscale_(opt)
    return [p.grad.to(device) for p in model.parameters()]


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


def test_the_compiled_walk_declines_what_the_kernels_cannot_take():
    """Kernels.plan reads the gradients through the compiled walk (the tensors' DLPack C
    exchange API): a dense floating gradient is planned by its address and size, and the
    same gradients again reuse the plan; another device type, a transposed, a sparse or a
    complex gradient, or a Tensor subclass, send the step to torch's path (None)."""
    cpu = _cuda_clip.Kernels("cpu", None)
    dense = torch.nn.Parameter(torch.zeros(3))
    dense.grad = torch.ones(3)
    plan = cpu.plan([dense])
    assert [(d, c, p.tolist(), n.tolist()) for d, c, p, n in plan.groups] == [
        (0, int(Code.F32), [dense.grad.data_ptr()], [3])
    ]
    assert cpu.plan([dense]) is plan and cpu.table.hits == 1
    assert _cuda_clip.Kernels("cuda", None).plan([dense]) is None
    for grad in (
        torch.ones(4, 3).t(),
        torch.ones(3).to_sparse(),
        torch.ones(3, dtype=torch.complex64),
        torch.nn.Parameter(torch.ones(3)),
    ):
        other = torch.nn.Parameter(torch.zeros(grad.shape, dtype=grad.dtype))
        other.grad = grad
        assert cpu.plan([dense, other]) is None, grad


def test_the_walk_reads_each_parameters_grad_itself():
    """plan(params, attr="grad") is the plan of [p.grad for p in params] (read in the
    compiled walk, None skipped), cached by the gradients, not the parameters."""
    table = _cuda_clip.Kernels("cpu", None).table
    ps = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 5, 2)]
    for p in ps[::2]:
        p.grad = torch.ones(p.shape)
    plan = table.plan(ps, attr="grad")
    assert plan.narrays == 2
    assert plan.leaf_addresses.tolist() == [ps[0].grad.data_ptr(), ps[2].grad.data_ptr()]
    assert table.plan([p.grad for p in ps]) is plan  # the same gradients: the cached plan
    ps[0].grad = torch.ones(3)  # a new gradient: a new plan
    assert table.plan(ps, attr="grad") is not plan
    # nested, every gradient None: the empty plan
    assert table.plan([[ps[1]], {"k": ps[1]}], attr="grad") is table.plan([])
    with pytest.raises(TypeError, match="attr must be a str"):
        table.plan(ps, attr=1)
    with pytest.raises(AttributeError):
        table.plan(ps, attr="no_such_attribute")
    assert table.plan([p.grad for p in ps[::2]]).narrays == 2  # the walk is whole again


@needs_gxx
def test_gradients_at_new_addresses_cost_a_walk_not_an_upload_or_a_read(monkeypatch):
    """Each step's model has new gradient tensors (as zero_grad(set_to_none=True) gives):
    the compiled walk plans them again and the launches carry their addresses, so no step
    after the first uploads anything or reads anything back."""
    from helpers import cuda_host

    class Counting(cuda_host.HostBackend):
        uploads = reads = 0

        def to_device(self, host):
            Counting.uploads += 1
            return super().to_device(host)

        def read_word(self, a):
            Counting.reads += 1
            return super().read_word(a)

    kernels = _cuda_clip.Kernels("cpu", lambda dev: Counting())
    monkeypatch.setattr(_cuda_clip, "CUDA", kernels)
    device = torch.device("cpu")
    _step(GradScaler, device, 6, 0.5, 2.0)  # the launcher's own flag and norm buffer
    uploads, misses = Counting.uploads, kernels.table.misses
    for seed in (7, 8):
        n1, _, _ = _step(GradScaler, device, seed, 0.5, 2.0)
        n2, _, _ = _step(torch.amp.GradScaler, device, seed, 0.5, 2.0, fused=False)
        torch.testing.assert_close(n1, n2, rtol=1e-5, atol=0)
    assert (Counting.uploads, Counting.reads) == (uploads, 0)
    assert kernels.table.misses == misses + 2


@pytest.mark.gpu
def test_launches_on_torchs_current_stream():
    device = torch.device("cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        n1, g1, _ = _step(GradScaler, device, 5, 0.5, 2.0)
    side.synchronize()
    n2, g2, _ = _step(GradScaler, device, 5, 0.5, 2.0)
    assert torch.equal(n1, n2) and all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))


def test_the_torch_cuda_backend_takes_the_backend_protocols_parameters():
    import inspect

    from lscore.cuda import Backend

    for name, want in vars(Backend).items():
        if callable(want) and not name.startswith("_"):
            ours = getattr(_cuda_clip.TorchCudaBackend, name)
            assert (
                inspect.signature(ours).parameters.keys()
                == inspect.signature(want).parameters.keys()
            ), name
