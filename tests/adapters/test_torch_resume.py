"""A torch run checkpointed and resumed into new objects counts on as the uninterrupted run
(skipped_steps, last_step_skipped, the overflow monitor's step numbers), and the scaler's
state dict loads into ``torch.amp.GradScaler`` with torch's meaning of its keys."""

import io
import warnings

import pytest

torch = pytest.importorskip("torch")

import lscore
from lscore.adapters.torch import GradScaler, LossScaleOptimizer
from lscore.diagnostics import OverflowMonitor

BAD = {3, 4, 9, 10, 30, 31}  # two overflows in a row: DeepSpeed's delayed_shift=2 backs off


def _deepspeed():
    return lscore.preset("deepspeed", init_scale=2.0**16, scale_window=20, delayed_shift=2)


SCALERS = {
    "deepspeed": lambda: GradScaler("cpu", policy=_deepspeed()),
    "torch": lambda: GradScaler("cpu", init_scale=2.0**16, growth_interval=20),
}


def _make(kind):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = SCALERS[kind]()
    scaler.overflow_monitor = OverflowMonitor()
    return model, opt, scaler


def _step(model, opt, scaler, i, bad=BAD):
    opt.zero_grad()
    loss = model(torch.ones(3, 4)).pow(2).mean() * (float("inf") if i in bad else 1.0)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    m = scaler.overflow_monitor
    return (
        scaler.get_scale(),
        scaler.skipped_steps,
        scaler.last_step_skipped,
        m.last_report if scaler.last_step_skipped else None,
        [p.detach().clone() for p in model.parameters()],
    )


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.load(io.BytesIO(buf.getvalue()), weights_only=True)


@pytest.mark.parametrize("kind", SCALERS)
def test_a_resumed_scaler_counts_on(kind):
    """Checkpoint at step 25, resume into new objects: every count reads as uninterrupted."""
    full = _make(kind)
    expected = [_step(*full, i) for i in range(40)]
    head = _make(kind)
    for i in range(25):
        _step(*head, i)
    ckpt = _roundtrip({"model": head[0].state_dict(), "opt": head[1].state_dict(),
                       "scaler": head[2].state_dict()})  # fmt: skip
    resumed = _make(kind)
    for obj, key in zip(resumed, ("model", "opt", "scaler"), strict=True):
        obj.load_state_dict(ckpt[key])
    got = [_step(*resumed, i) for i in range(25, 40)]
    for (gs, gk, gl, gr, gp), (es, ek, el, er, ep) in zip(got, expected[25:], strict=True):
        assert (gs, gk, gl, gr) == (es, ek, el, er)
        assert all(torch.equal(a, b) for a, b in zip(gp, ep, strict=True))
    assert got[-1][1] == len(BAD)
    assert str(got[6][3]).startswith("step 31 skipped")  # the run's step number, not the 7th


def test_a_torch_state_dict_leaves_the_counts_as_they_are():
    """torch's own dicts have no counts: loading one keeps this scaler's."""
    model, opt, scaler = _make("torch")
    for i in range(12):
        _step(model, opt, scaler, i)
    t = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.load_state_dict(t.state_dict())
    assert scaler.get_scale() == 8.0 and scaler.skipped_steps == 4


def test_bad_counts_are_refused_before_anything_changes():
    model, opt, scaler = _make("deepspeed")
    for i in range(12):
        _step(model, opt, scaler, i)
    before = scaler.state_dict()
    for bad in ({"skipped_steps": -1, "last_step_skipped": False, "monitor_steps": 3},
                {"skipped_steps": 1, "last_step_skipped": 0, "monitor_steps": 3},
                {"skipped_steps": 1}):  # fmt: skip
        d = _deepspeed_state(scale=2.0)
        d["lscore_counters"] = bad
        with pytest.raises((TypeError, ValueError)):
            scaler.load_state_dict(d)
        assert scaler.state_dict() == before


def _deepspeed_state(scale):
    s = GradScaler("cpu", policy=lscore.preset("deepspeed", init_scale=scale))
    return s.state_dict()


@pytest.mark.parametrize("steps", [0, 1, 5, 25, 33])
def test_torch_grows_a_loaded_preset_state_when_the_policy_would(steps):
    """torch.amp.GradScaler, given the dict of a DeepSpeed-policy scaler, grows the scale
    again, on the steps where the policy grows it (the tracker in torch's meaning)."""
    model, opt, scaler = _make("deepspeed")
    for i in range(steps):
        _step(model, opt, scaler, i)
    sd = _roundtrip(scaler.state_dict())
    theirs = torch.amp.GradScaler("cpu")
    theirs.load_state_dict(sd)
    mine = GradScaler("cpu", policy=_deepspeed())
    mine.load_state_dict(sd)
    tm, to = torch.nn.Linear(4, 2), None
    to = torch.optim.SGD(tm.parameters(), lr=0.0)
    mm = torch.nn.Linear(4, 2)
    mo = torch.optim.SGD(mm.parameters(), lr=0.0)
    ours, torchs = [], []
    for _ in range(100):
        for s, m, o, out in ((theirs, tm, to, torchs), (mine, mm, mo, ours)):
            o.zero_grad()
            s.scale(m(torch.ones(3, 4)).pow(2).mean()).backward()
            s.step(o)
            s.update()
            out.append(s.get_scale())
    assert torchs == ours
    assert torchs[-1] >= 2.0**4 * sd["scale"]


def test_a_fixed_policy_warns_that_torch_cannot_keep_it():
    s = GradScaler("cpu", policy=lscore.preset("keras2", dynamic=False, initial_scale=128.0))
    with pytest.warns(UserWarning, match="keeps its scale fixed; torch.amp.GradScaler cannot"):
        s.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GradScaler("cpu", policy=_deepspeed()).state_dict()
        GradScaler("cpu").state_dict()


def _lso_step(model, opt, i):
    opt.zero_grad()
    loss = model(torch.ones(3, 4)).pow(2).mean() * (float("inf") if i in BAD else 1.0)
    opt.get_scaled_loss(loss).backward()
    opt.step()
    m = opt.overflow_monitor
    return (opt.loss_scale, opt.iterations, opt.last_step_skipped,
            m.last_report if opt.last_step_skipped else None)  # fmt: skip


def _lso():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = LossScaleOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), initial_scale=2.0**10,
        dynamic_growth_steps=5,
    )  # fmt: skip
    opt.overflow_monitor = OverflowMonitor()
    return model, opt


def test_a_resumed_loss_scale_optimizer_counts_on():
    full = _lso()
    expected = [_lso_step(*full, i) for i in range(40)]
    model, opt = _lso()
    for i in range(31):  # stops on a skipped step: last_step_skipped is True
        _lso_step(model, opt, i)
    ckpt = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
    model, opt = _lso()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    assert opt.last_step_skipped is True
    assert [_lso_step(model, opt, i) for i in range(31, 40)] == expected[31:]


def test_a_loss_scale_optimizer_state_without_the_counts_loads():
    """A dict saved before the counts were written: they stay as they are."""
    model, opt = _lso()
    for i in range(6):
        _lso_step(model, opt, i)
    d = opt.state_dict()
    del d["loss_scale"]["monitor_steps"], d["loss_scale"]["last_step_skipped"]
    model, fresh = _lso()
    fresh.load_state_dict(d)
    assert fresh.iterations == 6 and fresh.loss_scale == opt.loss_scale


def test_a_loss_scale_optimizer_state_of_another_policy_changes_nothing():
    """The scale's policy is checked before the inner optimizer takes its state."""
    _, opt = _lso()
    other = LossScaleOptimizer(
        torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.5), dynamic_growth_steps=7
    )
    with pytest.raises(ValueError, match="saved by a different policy"):
        opt.load_state_dict(other.state_dict())
    assert opt.param_groups[0]["lr"] == 0.01 and opt.loss_scale == 2.0**10


def test_a_gradscaler_state_of_another_policy_is_refused_unless_adopted():
    """The rule of lscore's own loss scales: a state saved by another policy (its "lscore"
    key) is a ValueError naming the fields that differ, and changes nothing;
    adopt_policy=True takes it.  torch's five keys alone load as torch loads them."""
    ds = GradScaler("cpu", policy=lscore.preset("deepspeed", init_scale=2.0**8))
    saved = ds.state_dict()
    mine = GradScaler("cpu", init_scale=2.0**12, growth_interval=2000)
    with pytest.raises(ValueError, match=r"different policy \(.*name: 'deepspeed' != 'torch'"):
        mine.load_state_dict(saved)
    with pytest.raises(ValueError, match=r"adopt_policy=True"):
        mine.load_state_dict(saved)
    assert mine.get_scale() == 2.0**12 and mine._state.policy.name == "torch"
    assert "lscore" not in mine.state_dict()
    mine.load_state_dict(saved, adopt_policy=True)
    assert mine.get_scale() == 2.0**8 and mine._state.policy.name == "deepspeed"
    # the same lscore policy loads as before; torch's keys alone still set torch's numbers
    bounded = GradScaler("cpu", init_scale=4.0, min_scale=1.0)
    bounded.load_state_dict(GradScaler("cpu", init_scale=64.0, min_scale=1.0).state_dict())
    assert bounded.get_scale() == 64.0
    with pytest.raises(ValueError, match=r"min_scale: 1.0 != 2.0"):
        GradScaler("cpu", min_scale=2.0).load_state_dict(bounded.state_dict())
    plain = GradScaler("cpu")
    plain.load_state_dict({**torch.amp.GradScaler("cpu", growth_interval=7).state_dict()})
    assert plain.get_growth_interval() == 7


def test_an_optimizer_class_and_a_partial_state_are_refused_clearly():
    """scaler.step(torch.optim.SGD) (the class) ended in AttributeError 'param_groups';
    load_state_dict({'scale': 'x'}) in KeyError 'growth_factor'."""
    s = GradScaler("cpu", init_scale=4.0)
    for call in (s.step, s.unscale_, lambda o: s.unscale_and_clip_(o, 1.0)):
        with pytest.raises(TypeError, match=r"needs an optimizer instance, got the class SGD"):
            call(torch.optim.SGD)
    with pytest.raises(ValueError, match=r"lacks 'growth_factor', .*'_growth_tracker'") as e:
        s.load_state_dict({"scale": "x"})
    assert isinstance(e.value, KeyError)  # what torch raises, for code that catches it
    assert s.get_scale() == 4.0
