"""The torch GradScaler's device path costs what torch's GradScaler costs: one torch policy,
decided when the scaler is placed or its policy changes, and the same tensor ops per call.

The device path (torch's kernels, what runs for CUDA tensors) is forced onto CPU tensors,
where torch's CPU kernels of ``_amp_foreach_non_finite_check_and_unscale_`` and
``_amp_update_scale_`` run, and every op torch dispatches is recorded.
"""

import pickle

import pytest

import lscore
import lscore.policy
from lscore.adapters.torch import GradScaler, torch_policy

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode


class Ops(TorchDispatchMode):
    """Records the name of every tensor op dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def device_path(**kw):
    s = GradScaler("cpu", **kw)
    s.torch_kernels = True  # torch's kernel path, as for CUDA tensors
    return s


def models(count):
    torch.manual_seed(0)
    ms = [torch.nn.Linear(3, 2) for _ in range(count)]
    return ms, [torch.optim.SGD(m.parameters(), lr=0.1) for m in ms]


def recorded_steps(scaler, count, events):
    """The ops of each call of every iteration: {call: [ops of iteration 0, 1, ...]}."""
    ms, opts = models(count)
    calls = {"scale": [], "unscale_": [], "step": [], "update": [], "get_scale": []}

    def record(name, fn):
        with Ops() as r:
            out = fn()
        calls[name].append(r.ops)
        return out

    for finite in events:
        for o in opts:
            o.zero_grad()
        loss = record("scale", lambda: scaler.scale(sum(m(torch.ones(1, 3)).sum() for m in ms)))
        loss.backward()
        if not finite:
            ms[0].weight.grad[0, 0] = float("inf")
        record("unscale_", lambda: [scaler.unscale_(o) for o in opts])
        record("step", lambda: [scaler.step(o) for o in opts])
        record("update", scaler.update)
        record("get_scale", scaler.get_scale)
    return calls


@pytest.mark.parametrize("count", [1, 2], ids=["one optimizer", "two optimizers"])
@pytest.mark.parametrize("policy", [None, "torch"], ids=["arguments", "policy='torch'"])
def test_each_call_issues_torchs_ops(count, policy):
    """update() launches nothing torch's does not: the skipped count stays on the device,
    unread (the found-inf sums torch adds in place); scale, unscale_, step, get_scale too."""
    events = [True, False, True, True]
    kw = dict(init_scale=8.0, growth_interval=2)
    theirs = recorded_steps(torch.amp.GradScaler("cpu", **kw), count, events)
    mine = device_path(**kw) if policy is None else device_path(policy=lscore.preset("torch", **kw))
    ours = recorded_steps(mine, count, events)
    assert ours == theirs
    assert all(ops[-1] == "_amp_update_scale_" for ops in ours["update"])
    assert mine.skipped_steps == 1 and mine.last_step_skipped is False


def test_update_and_get_scale_build_no_policy(monkeypatch):
    """Whether torch's kernel runs is decided when the scaler is placed and when its policy
    changes, not per call: no Policy is built in update() or get_scale()."""
    built = []
    init = lscore.policy.Policy.__post_init__

    def counting(self):
        built.append(self.name)
        init(self)

    ms, opts = models(1)
    scalers = [GradScaler("cpu", growth_interval=3), device_path(growth_interval=3)]
    for s in scalers:
        s.scale(torch.ones(()))
    monkeypatch.setattr(lscore.policy.Policy, "__post_init__", counting)
    for k in range(50):
        for s in scalers:
            opts[0].zero_grad()
            s.scale(ms[0](torch.ones(1, 3)).sum()).backward()
            if k % 7 == 0:
                ms[0].bias.grad[0] = float("nan")
            s.step(opts[0])
            s.update()
            s.get_scale()
    assert built == []
    assert [s.skipped_steps for s in scalers] == [8, 8]
    assert scalers[1]._on_device and not scalers[0]._on_device


def test_policy_torch_is_torchs_policy():
    """lscore.preset("torch") and the GradScaler's torch policy are one definition: a
    GradScaler given it runs torch's update kernel and writes torch's five keys, in torch's
    order, and the counts a resume restores (no "lscore" state)."""
    assert lscore.preset("torch").policy == torch_policy()
    assert lscore.preset("torch", growth_interval=7).policy == torch_policy(growth_interval=7)
    for policy in ("torch", lscore.preset("torch"), torch_policy(), torch_policy().to_dict()):
        s = device_path(policy=policy)
        s.scale(torch.ones(()))
        assert s._path.torch_shape
        assert list(s.state_dict()) == [
            "scale",
            "growth_factor",
            "backoff_factor",
            "growth_interval",
            "_growth_tracker",
            "lscore_counters",
        ]
    assert "lscore" in device_path(hysteresis=2).state_dict()


def test_policy_changes_decide_again():
    """load_state_dict and the setters decide the path's update once, when they run."""
    s = device_path(init_scale=16.0, growth_interval=2)
    s.scale(torch.ones(()))
    hysteresis = GradScaler("cpu", init_scale=4.0, growth_interval=1, hysteresis=2).state_dict()
    # an lscore-only option (another policy, adopted): the host state machine updates
    s.load_state_dict(hysteresis, adopt_policy=True)
    assert not s._path.torch_shape and s.get_scale() == 4.0
    s.load_state_dict(GradScaler("cpu", init_scale=32.0).state_dict())  # torch's five keys
    assert not s._path.torch_shape and s.get_scale() == 32.0  # the hysteresis stays
    with Ops() as r:
        s.update(8.0)
    assert "_amp_update_scale_" not in r.ops
    state = lscore.LossScaleState(torch_policy(init_scale=2.0, growth_interval=5))
    s.load_state_dict(
        {**GradScaler("cpu").state_dict(), "lscore": state.state_dict()}, adopt_policy=True
    )
    assert s._path.torch_shape and s.get_scale() == 2.0
    ms, opts = models(1)
    s.scale(ms[0](torch.ones(1, 3)).sum()).backward()
    s.step(opts[0])
    with Ops() as r:
        s.update()
    assert r.ops == ["_amp_update_scale_"]
    s.set_growth_factor(3.0)
    s.set_growth_interval(1)
    assert s._path.torch_shape and s.state_dict()["growth_factor"] == 3.0
    clone = pickle.loads(pickle.dumps(s))
    assert clone.state_dict() == s.state_dict() and "lscore" not in s.state_dict()


def test_skipped_count_folds_on_the_device(monkeypatch):
    """The device verdicts are counted in one reduction when read, or every FOLD steps."""
    from lscore.adapters.torch._paths import SkipCount

    monkeypatch.setattr(SkipCount, "FOLD", 3)
    events = [True, False, False, True, False, True, True, False, True, False, False]
    ms, opts = models(1)
    s = device_path(init_scale=8.0, growth_interval=2)
    for k, finite in enumerate(events):
        opts[0].zero_grad()
        s.scale(ms[0](torch.ones(1, 3)).sum()).backward()
        if not finite:
            ms[0].weight.grad[1, 1] = float("-inf")
        s.step(opts[0])
        s.update()
        assert len(s._skipped.pending) < 3
        assert s.last_step_skipped is (not finite)
        if k == 5:
            assert s.skipped_steps == events[:6].count(False)
    assert s.skipped_steps == events.count(False)
    assert pickle.loads(pickle.dumps(s)).skipped_steps == events.count(False)
