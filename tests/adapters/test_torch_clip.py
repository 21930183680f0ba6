"""GradScaler.unscale_and_clip_: one pass, the same result as unscale_ + clip_grad_norm_."""

import math

import pytest

torch = pytest.importorskip("torch")
from lscore.adapters.torch import GradScaler


def make(seed, bad=None):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(64, 16, generator=g)
    return model, x


def one_step(scaler_cls, seed, max_norm, bad, fused, norm_type=2.0):
    model, x = make(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = scaler_cls("cpu", init_scale=2.0**10)
    scaler.scale(model(x).pow(2).sum()).backward()
    if bad is not None:
        next(model.parameters()).grad.view(-1)[3] = bad
    if fused:
        norm = scaler.unscale_and_clip_(opt, max_norm, norm_type)
        assert not scaler._on_device  # lscore's CPU core path unscaled them
    else:
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_norm, norm_type)
    grads = [p.grad.clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    return norm, grads, [p.detach().clone() for p in model.parameters()], scaler.get_scale()


@pytest.mark.parametrize("max_norm", [0.5, 10.0, 1e9])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_unscale_then_clip(seed, max_norm):
    n1, g1, p1, s1 = one_step(GradScaler, seed, max_norm, None, True)
    n2, g2, p2, s2 = one_step(torch.amp.GradScaler, seed, max_norm, None, False)
    assert n1.dtype == n2.dtype and math.isclose(float(n1), float(n2), rel_tol=1e-5)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    for a, b in zip(p1, p2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert s1 == s2


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_step_is_skipped_not_clipped(bad):
    n1, _, p1, s1 = one_step(GradScaler, 3, 0.5, bad, True)
    _, _, p2, s2 = one_step(torch.amp.GradScaler, 3, 0.5, bad, False)
    assert not math.isfinite(float(n1))
    assert s1 == s2 == 2.0**9
    for a, b in zip(p1, p2, strict=True):
        assert torch.equal(a, b)


def test_call_order_and_arguments():
    model, x = make(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu")
    scaler.scale(model(x).sum()).backward()
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        scaler.unscale_and_clip_(opt, 0)
    scaler.unscale_and_clip_(opt, 1.0)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_and_clip_(opt, 1.0)


@pytest.mark.parametrize("max_norm", [0.5, 1e9])
@pytest.mark.parametrize("norm_type", [float("inf"), "inf", 1.0, 3.5, 0.5])
def test_any_norm_type_is_torchs_bitwise(norm_type, max_norm):
    """norm_type inf (the largest magnitude, from the unscaling pass itself) and any
    other p (torch's own norm after that pass) give clip_grad_norm_'s norm and clipped
    gradients exactly."""
    n1, g1, p1, s1 = one_step(GradScaler, 4, max_norm, None, True, norm_type)
    n2, g2, p2, s2 = one_step(torch.amp.GradScaler, 4, max_norm, None, False, norm_type)
    assert n1.dtype == n2.dtype and torch.equal(n1, n2)
    for a, b in zip(g1 + p1, g2 + p2, strict=True):
        assert torch.equal(a, b)
    assert s1 == s2


@pytest.mark.parametrize("norm_type", [2, 2.0])
def test_norm_type_2_is_the_default(norm_type):
    n1, g1, _, _ = one_step(GradScaler, 5, 0.5, None, True, norm_type)
    n2, g2, _, _ = one_step(GradScaler, 5, 0.5, None, True)
    assert torch.equal(n1, n2)
    for a, b in zip(g1, g2, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("norm_type", [float("inf"), 3.0])
def test_nonfinite_step_is_skipped_not_clipped_any_norm(norm_type):
    n1, _, p1, s1 = one_step(GradScaler, 3, 0.5, float("inf"), True, norm_type)
    _, _, p2, s2 = one_step(torch.amp.GradScaler, 3, 0.5, float("inf"), False, norm_type)
    assert float(n1) == float("inf")
    assert s1 == s2 == 2.0**9
    for a, b in zip(p1, p2, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad", ["two", float("nan"), None])
def test_norm_type_must_be_a_number(bad):
    model, x = make(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu")
    scaler.scale(model(x).sum()).backward()
    with pytest.raises(ValueError) as got:
        scaler.unscale_and_clip_(opt, 1.0, bad)
    assert str(got.value) == f"norm_type must be a number or 'inf', got {bad!r}"


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st

from lscore.adapters.torch._paths import GradUnscaler

CLIP_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def grads_of(dtype, sizes, seed):
    """Gradients spanning the dtype's range: normal values, subnormals, zeros, the largest."""
    g = torch.Generator().manual_seed(seed)
    info = torch.finfo(dtype)
    out = []
    for n in sizes:
        t = (torch.randn(n, generator=g, dtype=torch.float64) * 10).to(dtype)
        if n > 4:
            t[0], t[1], t[2], t[3] = info.smallest_normal / 3, -0.0, info.max, -info.tiny
        out.append(t)
    return out


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(CLIP_DTYPES),
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=6),
    coef=st.floats(1e-30, 1.0),
    seed=st.integers(0, 2**16),
)
def test_the_clip_multiply_is_foreach_muls_bitwise(dtype, sizes, coef, seed):
    """The CPU core's clip multiply equals torch._foreach_mul_ by the coefficient as a
    0-dim tensor of the gradients' dtype, bit for bit (float16/bfloat16 rounded once)."""
    params = [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in sizes]
    want = grads_of(dtype, sizes, seed)
    for q, g in zip(params, want, strict=True):
        q.grad = g.clone()
    unscaler = GradUnscaler()
    unscaler([{"params": params}], 1.0, True)
    c = torch.tensor(coef, dtype=dtype)
    torch._foreach_mul_(want, c)
    assert unscaler.multiply(float(c), dtype)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    for q, w in zip(params, want, strict=True):
        assert torch.equal(q.grad.view(bits), w.view(bits))


def test_the_clip_multiply_refuses_what_its_table_does_not_hold():
    """Mixed dtypes, a dtype other than the coefficient's, or a gradient the table did
    not take: nothing is multiplied (the scaler then uses torch's _foreach_mul_)."""
    a = torch.nn.Parameter(torch.zeros(8))
    b = torch.nn.Parameter(torch.zeros(8, dtype=torch.float64))
    a.grad, b.grad = torch.ones(8), torch.ones(8, dtype=torch.float64)
    unscaler = GradUnscaler()
    unscaler([{"params": [a, b]}], 1.0, True)
    assert not unscaler.multiply(0.5, torch.float32)
    unscaler([{"params": [a]}], 1.0, True)
    assert not unscaler.multiply(0.5, torch.float64)
    s = torch.nn.Parameter(torch.zeros(4))
    s.grad = torch.ones(4).to_sparse()
    unscaler([{"params": [a, s]}], 1.0, True)
    assert not unscaler.multiply(0.5, torch.float32)
    assert torch.equal(a.grad, torch.ones(8))
    assert torch.equal(b.grad, torch.ones(8, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clipped_gradients_are_the_coefficient_times_the_unscaled(dtype, norm_type):
    """Every dtype: the clipped gradients are lscore's unscaled ones times torch's
    coefficient of the returned norm, as _foreach_mul_ rounds them."""

    def run(clip):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in (1000, 37, 4096)]
        for q in params:
            q.grad = (torch.randn(q.shape, dtype=torch.float64) * 300).to(dtype)
        opt = torch.optim.SGD(params, lr=0.1)
        scaler = GradScaler("cpu", init_scale=2.0**4, allow_fp16_params=dtype == torch.float16)
        scaler.scale(torch.ones(()))
        if clip:
            norm = scaler.unscale_and_clip_(opt, 1.0, norm_type)
            return norm, [q.grad for q in params]
        scaler.unscale_(opt)
        return None, [q.grad for q in params]

    norm, clipped = run(True)
    _, unscaled = run(False)
    assert norm.dtype == dtype and float(norm) > 1.0
    coef = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
    torch._foreach_mul_(unscaled, coef)
    for a, b in zip(clipped, unscaled, strict=True):
        assert torch.equal(a, b)
