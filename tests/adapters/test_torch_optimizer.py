"""lscore.adapters.torch.LossScaleOptimizer: the three constructor shapes on torch optimizers.

Expected scales come from lscore's LossScale / LossScaleManager classes stepped
by hand with the same events; expected parameters from a plain torch loop that
scales, unscales and steps by hand.  What every adapter's wrapper shares (a
fixed scale applies non-finite steps, wrapping twice, the dtype casts) is in
test_backends.py, run on torch and every other backend.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import lscore
from lscore.adapters.torch import LossScaleOptimizer

EVENTS = [True, True, False, True, True, True, False, False, True, True]


def make(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)).to(
        dtype
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def loss_of(model, x, finite):
    loss = model(x).float().pow(2).mean()
    return loss if finite else loss * float("inf")


def run(opt, model, events, seed=1):
    torch.manual_seed(seed)
    scales, applied = [], []
    for finite in events:
        opt.zero_grad()
        opt.get_scaled_loss(loss_of(model, torch.randn(5, 4), finite)).backward()
        opt.step()
        applied.append(not opt.last_step_skipped)
        scales.append(float(opt.loss_scaling.scale))
    return scales, applied


def expected_scales(ls, events):
    """Step an lscore LossScale (TF2 API) or LossScaleManager (TF1 API) by hand."""
    out = []
    for finite in events:
        if isinstance(ls, lscore.LossScaleManager):
            ls.update_loss_scale(finite)
            out.append(float(ls.get_loss_scale()))
        else:
            ls.update([np.float32(1.0 if finite else np.inf)])
            out.append(float(ls()))
    return out


SHAPES = {
    "keras_dynamic": (
        dict(dynamic_growth_steps=2, initial_scale=64.0),
        lambda: lscore.DynamicLossScale(64.0, 2, 2.0),
        "keras",
    ),
    "keras_default": ({}, lambda: lscore.DynamicLossScale(2.0**15, 2000, 2.0), "keras"),
    "experimental_dynamic": (
        dict(loss_scale=lscore.DynamicLossScale(256.0, 3)),
        lambda: lscore.DynamicLossScale(256.0, 3),
        "experimental",
    ),
    "experimental_fixed": (
        dict(loss_scale=128),
        lambda: lscore.FixedLossScale(128),
        "experimental",
    ),
    "tf1_exponential": (
        dict(
            loss_scale_manager=lscore.ExponentialUpdateLossScaleManager(
                512.0, 2, decr_every_n_nan_or_inf=1
            )
        ),
        lambda: lscore.ExponentialUpdateLossScaleManager(512.0, 2, decr_every_n_nan_or_inf=1),
        "tf1",
    ),
    "tf1_fixed": (
        dict(loss_scale_manager=lscore.FixedLossScaleManager(32.0)),
        lambda: lscore.FixedLossScaleManager(32.0),
        "tf1",
    ),
}


@pytest.mark.parametrize("name", list(SHAPES), ids=list(SHAPES))
def test_shapes_follow_lscores_loss_scales(name):
    kwargs, reference, shape = SHAPES[name]
    model, inner = make()
    opt = LossScaleOptimizer(inner, **copy.deepcopy(kwargs))
    assert opt.loss_scaling.shape == shape
    scales, applied = run(opt, model, EVENTS)
    assert scales == expected_scales(reference(), EVENTS)
    # TF's FixedLossScale applies every step; every other shape skips non-finite ones
    assert applied == ([True] * len(EVENTS) if name == "experimental_fixed" else EVENTS)
    # Keras counts skipped steps in iterations; TF <= 2.3 and TF1 do not
    assert opt.iterations == (len(EVENTS) if shape == "keras" else sum(applied))


def test_parameters_bitwise_equal_a_hand_written_loop():
    model_a, inner_a = make()
    model_b = copy.deepcopy(model_a)
    inner_b = torch.optim.SGD(model_b.parameters(), lr=0.05)
    opt = LossScaleOptimizer(inner_a, initial_scale=3.0, dynamic_growth_steps=2)
    ls = lscore.DynamicLossScale(3.0, 2, 2.0)
    torch.manual_seed(5)
    xs = [torch.randn(5, 4) for _ in EVENTS]
    for x, finite in zip(xs, EVENTS, strict=True):
        opt.zero_grad()
        opt.get_scaled_loss(loss_of(model_a, x, finite)).backward()
        opt.step()
        # by hand: TF's arithmetic (scale and reciprocal in float32)
        inner_b.zero_grad()
        scale = float(ls())
        (loss_of(model_b, x, finite) * torch.tensor(scale)).backward()
        inv = float(np.float32(1.0) / np.float32(scale))
        grads = [p.grad * torch.tensor(inv) for p in model_b.parameters()]
        ok = all(torch.isfinite(g).all() for g in grads)
        for p, g in zip(model_b.parameters(), grads, strict=True):
            p.grad = g
        if ok:
            inner_b.step()
        ls.update([np.float32(1.0 if ok else np.inf)])
        for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_is_a_torch_optimizer_and_shares_groups_and_state():
    model, inner = make()
    inner = torch.optim.Adam(model.parameters(), lr=0.01)
    opt = LossScaleOptimizer(inner)
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups is inner.param_groups and opt.state is inner.state
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()"
        for _ in range(3):
            run(opt, model, [True])
            sched.step()
    assert inner.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**3)
    assert len(inner.state) == len(list(model.parameters()))


def test_unscale_then_clip_then_step():
    model, inner = make()
    opt = LossScaleOptimizer(inner, initial_scale=1024.0)
    opt.zero_grad()
    opt.get_scaled_loss(loss_of(model, torch.randn(5, 4), True)).backward()
    scaled = [p.grad.clone() for p in model.parameters()]
    opt.unscale_()
    inv = np.float32(1.0) / np.float32(1024.0)
    for s, p in zip(scaled, model.parameters(), strict=True):
        assert torch.equal(p.grad, s * torch.tensor(float(inv)))
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        opt.unscale_()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert opt.last_step_skipped is False


def test_step_returns_the_inner_value_and_none_when_skipped():
    class Returning(torch.optim.SGD):
        def step(self, closure=None):
            super().step()
            return "stepped"

    model = make()[0]
    opt = LossScaleOptimizer(Returning(model.parameters(), lr=0.1))
    for finite, expected in ((True, "stepped"), (False, None)):
        opt.zero_grad()
        opt.get_scaled_loss(loss_of(model, torch.randn(5, 4), finite)).backward()
        assert opt.step() == expected


def test_step_with_closure_returns_the_loss_and_none_when_skipped():
    model, inner = make()
    opt = LossScaleOptimizer(inner)
    x = torch.randn(5, 4)

    def closure(finite=True):
        opt.zero_grad()
        loss = loss_of(model, x, finite)
        opt.get_scaled_loss(loss).backward()
        return loss

    assert torch.is_tensor(opt.step(closure))
    assert opt.step(lambda: closure(False)) is None and opt.last_step_skipped


def test_state_dict_round_trip_and_plain_torch_dicts():
    model, inner = make()
    opt = LossScaleOptimizer(inner, initial_scale=16.0, dynamic_growth_steps=2)
    run(opt, model, EVENTS[:5])
    sd = opt.state_dict()
    assert set(sd) == {"state", "param_groups", "loss_scale"}
    model2, inner2 = make(seed=3)
    fresh = LossScaleOptimizer(inner2, initial_scale=16.0, dynamic_growth_steps=2)
    fresh.load_state_dict(copy.deepcopy(sd))
    assert fresh.loss_scale == opt.loss_scale and fresh.iterations == opt.iterations
    assert fresh.dynamic_counter == opt.dynamic_counter
    assert run(fresh, model2, EVENTS[5:]) == run(opt, model, EVENTS[5:])
    # a torch optimizer's own dict loads (scale untouched); a wrapper's dict loads into torch
    plain = torch.optim.SGD(make()[0].parameters(), lr=0.05)
    before = fresh.loss_scale
    fresh.load_state_dict(plain.state_dict())
    assert fresh.loss_scale == before
    plain.load_state_dict(opt.state_dict())
    other = LossScaleOptimizer(torch.optim.SGD(make()[0].parameters(), lr=0.05), "dynamic")
    with pytest.raises(ValueError, match="shape"):
        other.load_state_dict(sd)
    clone = pickle.loads(pickle.dumps(opt))
    assert clone.loss_scale == opt.loss_scale and clone.iterations == opt.iterations
    assert clone.state_dict()["loss_scale"] == opt.state_dict()["loss_scale"]


class OneRank:
    """A reducer over one rank (the verdict as it is), at module level so that it pickles."""

    def reduce(self, found_inf, stats=None):
        return found_inf, stats


def test_a_pickled_optimizer_restores_and_steps_as_the_original():
    """Pickling keeps everything a step reads (the reducer too, None or not): the restored
    copy takes the same steps, scales and skips as the original from where it was."""
    for reducer in (None, OneRank()):
        model, inner = make()
        opt = LossScaleOptimizer(inner, initial_scale=16.0, dynamic_growth_steps=2, reducer=reducer)
        run(opt, model, EVENTS[:3])
        model2, clone = pickle.loads(pickle.dumps((model, opt)))
        assert clone.iterations == opt.iterations and clone.loss_scale == opt.loss_scale
        assert run(clone, model2, EVENTS[3:]) == run(opt, model, EVENTS[3:])
        for a, b in zip(model2.parameters(), model.parameters(), strict=True):
            assert torch.equal(a, b)


def test_constructor_errors():
    _model, inner = make()
    with pytest.raises(TypeError, match=r"must be an instance of torch.optim.Optimizer"):
        LossScaleOptimizer(object())
    with pytest.raises(TypeError, match="Keras"):
        LossScaleOptimizer(inner, "dynamic", initial_scale=4.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_autocast_cpu(dtype):
    model, inner = make()
    opt = LossScaleOptimizer(inner, initial_scale=2.0**10, dynamic_growth_steps=2)
    for finite in (True, False, True, True):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = loss_of(model, torch.randn(5, 4), finite)
        opt.get_scaled_loss(loss).backward()
        opt.step()
    assert (
        opt.loss_scale
        == expected_scales(lscore.DynamicLossScale(2.0**10, 2, 2.0), [True, False, True, True])[-1]
    )
    assert all(torch.isfinite(p).all() for p in model.parameters())
