"""Issue 17, "torch drop-in": lscore's GradScaler where torch.amp.GradScaler's callers go.

Each test drives the entry point the way the migrating code does; where that
code is a framework, the calls it makes were read in its sources (cited per test).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from helpers import torch_keys
from lscore.adapters.torch import GradScaler

TorchScaler = torch.amp.GradScaler


def _torch_dict(scale, tracker):
    return {
        "scale": scale,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 2000,
        "_growth_tracker": tracker,
    }


# ---- item 3: what load_state_dict accepts; the deliberate refusals ------------------------


@pytest.mark.parametrize("placed", [False, True], ids=["before-scale", "after-scale"])
def test_load_state_dict_takes_0d_tensors_as_torch_does(placed):
    """torch's load_state_dict fill_()s its tensors with the values, so an older
    checkpoint's 0-d tensor ``scale`` / ``_growth_tracker`` loads; so it does here."""
    sd = _torch_dict(torch.tensor(1024.0), torch.tensor(3, dtype=torch.int32))
    scalers = [TorchScaler("cpu"), GradScaler("cpu")]
    for s in scalers:
        if placed:
            s.scale(torch.ones(()))
        s.load_state_dict(sd)
        s.scale(torch.ones(()))
    t, ls = scalers
    assert ls.get_scale() == float(t.get_scale()) == 1024.0
    assert ls._get_growth_tracker() == t._get_growth_tracker() == 3
    assert torch_keys(ls.state_dict()) == t.state_dict()


def test_load_state_dict_refuses_a_tensor_torch_cannot_fill():
    t, ls = TorchScaler("cpu"), GradScaler("cpu")
    t.scale(torch.ones(()))
    sd = _torch_dict(torch.tensor([1024.0]), 0)
    with pytest.raises(RuntimeError) as expected:
        t.load_state_dict(sd)
    with pytest.raises(RuntimeError) as got:
        ls.load_state_dict(sd)
    assert str(got.value) == str(expected.value)


def _set(name, value):
    def call(cls):
        s = cls("cpu")
        getattr(s, name)(value)

    return call


def _load(key, value):
    def call(cls):
        sd = _torch_dict(4.0, 0)
        sd[key] = value
        cls("cpu").load_state_dict(sd)

    return call


# what torch.amp.GradScaler accepts silently and lscore refuses: the README's table
REFUSED = {
    "init_scale inf": (
        lambda cls: cls("cpu", init_scale=float("inf")),
        "init_scale must be finite and > 0, got inf",
    ),
    "init_scale negative": (
        lambda cls: cls("cpu", init_scale=-1.0),
        "init_scale must be finite and > 0, got -1.0",
    ),
    "init_scale 0": (
        lambda cls: cls("cpu", init_scale=0.0),
        "init_scale must be finite and > 0, got 0.0",
    ),
    "set_growth_factor < 1": (
        _set("set_growth_factor", 0.5),
        "growth_factor must be finite and >= 1, got 0.5",
    ),
    "set_backoff_factor > 1": (
        _set("set_backoff_factor", 1.5),
        "backoff_factor must be in (0, 1], got 1.5",
    ),
    "set_backoff_factor 0": (
        _set("set_backoff_factor", 0.0),
        "backoff_factor must be in (0, 1], got 0.0",
    ),
    "loaded growth_factor < 1": (
        _load("growth_factor", 0.5),
        "growth_factor must be finite and >= 1, got 0.5",
    ),
    "loaded backoff_factor > 1": (
        _load("backoff_factor", 2.0),
        "backoff_factor must be in (0, 1], got 2.0",
    ),
    "loaded negative scale": (_load("scale", -2.0), "scale must be >= 0, 'inf' or 'nan', got -2.0"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_refusals_torch_accepts_share_one_wording(case):
    """torch takes each silently; lscore raises ValueError "<name> must be <rule>, got <v>"."""
    fn, message = REFUSED[case]
    fn(TorchScaler)
    with pytest.raises(ValueError) as got:
        fn(GradScaler)
    assert str(got.value) == message


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(min_scale=2.0**20), "min_scale must be <= init_scale (65536.0), got 1048576.0"),
        (dict(max_scale=1.0), "max_scale must be >= init_scale (65536.0), got 1.0"),
        (dict(init_scale=8.0, min_scale=16.0), "min_scale must be <= init_scale (8.0), got 16.0"),
    ],
)
def test_scale_bounds_must_hold_the_initial_scale(kw, message):
    with pytest.raises(ValueError) as got:
        GradScaler("cpu", **kw)
    assert str(got.value) == message
    GradScaler("cpu", init_scale=8.0, min_scale=8.0, max_scale=8.0)  # the edges are fine


def test_constructor_factors_keep_torchs_assertion():
    """Where torch itself refuses (its constructor's asserts) its message stays."""
    for kw in (dict(growth_factor=1.0), dict(backoff_factor=1.0)):
        with pytest.raises(AssertionError) as expected:
            TorchScaler("cpu", **kw)
        with pytest.raises(AssertionError) as got:
            GradScaler("cpu", **kw)
        assert str(got.value) == str(expected.value)
        assert isinstance(got.value, ValueError)


# ---- item 6: torch-named arguments with policy=; a stray lscore folder -------------------


def _suggested_call(message: str) -> str:
    call = message.split("use GradScaler(policy=", 1)[1]
    assert call.endswith(")")
    return call[:-1]


@pytest.mark.parametrize(
    "kw, call",
    [
        (dict(init_scale=1024.0), "lscore.preset('deepspeed', init_scale=1024.0)"),
        (
            dict(init_scale=1024.0, growth_interval=100, min_scale=2.0, hysteresis=3),
            "lscore.preset('deepspeed', init_scale=1024.0, scale_window=100, min_scale=2.0, "
            "delayed_shift=3)",
        ),
    ],
)
def test_policy_preset_with_torch_names_shows_the_preset_call(kw, call):
    """GradScaler(policy="deepspeed", init_scale=...) is refused: the preset takes
    DeepSpeed's own argument names, and the message shows that call, which works."""
    import lscore

    with pytest.raises(ValueError) as got:
        GradScaler("cpu", policy="deepspeed", **kw)
    message = str(got.value)
    assert message.startswith(f"{', '.join(kw)} cannot be passed with policy=")
    assert _suggested_call(message) == call
    s = GradScaler("cpu", policy=eval(call, {"lscore": lscore}))
    assert s.get_scale() == 1024.0
    assert s.state_dict()["lscore"]["policy"]["growth_interval"] == (
        100 if "growth_interval" in kw else 1000
    )


def test_every_preset_suggests_a_call_that_builds():
    """For every preset and every torch name it has a counterpart for, the suggested
    call builds; a torch name without one names the preset's own arguments."""
    import lscore
    from lscore.presets import table

    torch_names = dict(
        init_scale=256.0,
        growth_factor=4.0,
        backoff_factor=0.25,
        growth_interval=10,
        min_scale=1.0,
        max_scale=2.0**20,
        hysteresis=2,
    )
    for name, spec in table.TABLE.items():
        for k, v in torch_names.items():
            with pytest.raises(ValueError) as got:
                GradScaler("cpu", policy=name, **{k: v})
            message = str(got.value)
            if "use GradScaler(policy=" in message:
                call = _suggested_call(message)
                required = [a for a, d in spec.args.items() if d is table.REQUIRED]
                if required:  # shown as name=..., for the user to fill in
                    assert all(f"{a}=" in call for a in required), call
                    continue
                GradScaler("cpu", policy=eval(call, {"lscore": lscore}))
            else:
                assert f"has no argument for {k}: its arguments are " in message, message
                assert ", ".join(spec.args) in message


def test_policy_object_with_torch_names_shows_replace():
    import lscore

    with pytest.raises(
        ValueError,
        match=r"use GradScaler\(policy=policy.replace\("
        r"init_scale=8.0\)\)$",
    ):
        GradScaler("cpu", policy=lscore.Policy(), init_scale=8.0)


@pytest.mark.slow
def test_stray_lscore_folder_is_named(tmp_path):
    """A folder named lscore without __init__.py in the working directory becomes a
    namespace package that hides the installed lscore's own names; say so."""
    import subprocess
    import sys

    (tmp_path / "lscore").mkdir()
    code = "from lscore.adapters.torch import GradScaler\nGradScaler('cpu', policy='deepspeed')\n"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    # a regular package installed in site-packages comes before a namespace folder on the
    # path (the folder shadows only an editable install's finder), and then the call succeeds
    last = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    if "does not define" not in last and "is the folder" not in last:
        pytest.skip(f"the stray folder does not shadow lscore here: {last}")
    assert last.startswith(
        "ImportError: policy='deepspeed' needs lscore.preset, but the "
        f"module lscore is the folder {tmp_path / 'lscore'}"
    )
    assert "shadows it; rename that folder" in last
    assert "does not have preset" not in r.stderr


# ---- item 4: LossScaleOptimizer.step(closure) with closure optimizers ---------------------


def _lbfgs_pair(scale):
    from lscore.adapters.torch import LossScaleOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ref.load_state_dict(model.state_dict())
    opt = LossScaleOptimizer(
        torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=6), initial_scale=scale
    )
    plain = torch.optim.LBFGS(ref.parameters(), lr=0.5, max_iter=6)
    return model, opt, ref, plain


def test_lbfgs_step_closure_matches_plain_lbfgs():
    """LBFGS calls its closure several times per step; the wrapper unscales every
    evaluation's gradients, so with a power-of-two scale the run is plain LBFGS's, bit
    for bit, and step(closure) returns the closure's (unscaled) loss."""
    model, opt, ref, plain = _lbfgs_pair(2.0**10)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.get_scaled_loss(loss).backward()
        return loss

    def plain_closure():
        plain.zero_grad()
        loss = torch.nn.functional.mse_loss(ref(x), y)
        loss.backward()
        return loss

    for _ in range(4):
        got, expected = opt.step(closure), plain.step(plain_closure)
        assert torch.is_tensor(got) and torch.equal(got, expected)
        assert not opt.last_step_skipped
    assert len(calls) > 4  # LBFGS re-evaluated the closure within its steps
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
    assert opt.iterations == 4


def test_closure_step_skips_on_overflow_and_calls_the_closure_once_for_sgd():
    from lscore.adapters.torch import LossScaleOptimizer

    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    opt = LossScaleOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), initial_scale=8.0, dynamic_growth_steps=100
    )
    x = torch.randn(8, 4)
    calls = []

    def closure(bad=False):
        calls.append(1)
        opt.zero_grad()
        loss = model(x).pow(2).mean() * (float("inf") if bad else 1.0)
        opt.get_scaled_loss(loss).backward()
        return loss

    before = [p.detach().clone() for p in model.parameters()]
    assert opt.step(lambda: closure(True)) is None and opt.last_step_skipped
    assert opt.loss_scale == 4.0 and len(calls) == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    loss = opt.step(closure)
    assert torch.is_tensor(loss) and not opt.last_step_skipped
    assert len(calls) == 2  # SGD's own closure call got the first evaluation
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


# ---- item 2: enabled="auto" and a resume ---------------------------------------------------


def _auto_steps(scaler, dtype, steps=3, seed=0):
    import warnings

    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype):
                loss = model(torch.randn(8, 4)).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return [str(w.message) for w in caught]


def _lightning_save(scaler) -> dict:
    """What Lightning writes: ``MixedPrecision.state_dict()`` is ``scaler.state_dict()``
    and the checkpoint connector stores it only ``if prec_plugin_state_dict``
    (Lightning-AI/pytorch-lightning, src/lightning/pytorch/plugins/precision/amp.py and
    src/lightning/pytorch/trainer/connectors/checkpoint_connector.py)."""
    checkpoint = {}
    sd = scaler.state_dict()
    if sd:
        checkpoint["MixedPrecision"] = sd
    return checkpoint


def _lightning_restore(scaler, checkpoint: dict) -> None:
    """``restore_precision_plugin_state``: load when the key is there."""
    if "MixedPrecision" in checkpoint:
        scaler.load_state_dict(checkpoint["MixedPrecision"])


def test_auto_disabled_checkpoint_resumes_into_a_fresh_auto_scaler(tmp_path):
    """bfloat16 training: the auto scaler disables itself at its first scale(); its
    state dict is {} (torch's disabled shape).  A resume that hands that {} to a fresh
    enabled="auto" scaler (accelerate and plain scripts ``torch.save`` the dict and load
    it back whatever it holds) works, and the fresh scaler decides again."""
    first = GradScaler("cpu", enabled="auto")
    assert first.is_enabled()  # undecided: documented as True
    messages = _auto_steps(first, torch.bfloat16)
    assert not first.is_enabled() and len(messages) == 1 and "disabled" in messages[0]
    assert first.state_dict() == {}
    torch.save(first.state_dict(), tmp_path / "scaler.pt")
    fresh = GradScaler("cpu", enabled="auto")
    fresh.load_state_dict(torch.load(tmp_path / "scaler.pt", weights_only=True))
    assert fresh.is_enabled()
    _auto_steps(fresh, torch.bfloat16)
    assert not fresh.is_enabled() and fresh.get_scale() == 1.0
    # Lightning's own path: nothing saved, nothing loaded
    lightning_fresh = GradScaler("cpu", enabled="auto")
    _lightning_restore(lightning_fresh, _lightning_save(first))
    assert lightning_fresh.is_enabled()


def test_auto_enabled_checkpoint_resumes_with_its_scale():
    first = GradScaler("cpu", enabled="auto", init_scale=2.0**10)
    assert _auto_steps(first, torch.float16) == [] and first.is_enabled()
    fresh = GradScaler("cpu", enabled="auto")
    _lightning_restore(fresh, _lightning_save(first))
    assert fresh.state_dict() == first.state_dict()
    _auto_steps(fresh, torch.float16)
    assert fresh.is_enabled()


def test_an_enabled_scaler_still_refuses_an_empty_dict_with_torchs_error():
    with pytest.raises(RuntimeError) as expected:
        TorchScaler("cpu").load_state_dict({})
    with pytest.raises(RuntimeError) as got:
        GradScaler("cpu").load_state_dict({})
    assert str(got.value) == str(expected.value)
    decided = GradScaler("cpu", enabled="auto")
    _auto_steps(decided, torch.float16, steps=1)
    with pytest.raises(RuntimeError, match="The source state dict is empty"):
        decided.load_state_dict({})


# ---- item 1: a torch.amp.GradScaler ----------------------------------------------------------


def _model(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _train(scaler, steps=6, seed=0, bad_at=(2,), init=None):
    model, opt = _model(seed)
    if init is not None:
        init(scaler)
    x = torch.randn(8, 4)
    for i in range(steps):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        scaler.scale(loss * (float("inf") if i in bad_at else 1.0)).backward()
        scaler.step(opt)
        scaler.update()
    return model, opt


@pytest.mark.parametrize(
    "kw", [{}, dict(enabled=False), dict(enabled="auto")], ids=["enabled", "disabled", "auto"]
)
def test_isinstance_torch_grad_scaler(kw):
    """Lightning's ``MixedPrecision(precision, device, scaler: torch.amp.GradScaler)``
    (Lightning-AI/pytorch-lightning, src/lightning/pytorch/plugins/precision/amp.py)
    takes the scaler by that type and calls scale / unscale_ / step / update /
    state_dict / load_state_dict on it; torch's ShardedGradScaler subclasses
    torch.amp.GradScaler the same way (pytorch/pytorch PR #116054)."""
    s = GradScaler("cpu", **kw)
    assert isinstance(s, torch.amp.GradScaler)


def test_every_method_of_torchs_class_is_overridden():
    # defined by GradScaler itself (or a class between it and torch's in its MRO)
    ours = {n for k in GradScaler.__mro__[: GradScaler.__mro__.index(TorchScaler)] for n in vars(k)}
    missing = [
        n for n, v in vars(TorchScaler).items() if callable(v) and n != "__init__" and n not in ours
    ]
    assert missing == []


def test_lazy_init_with_a_string_device_like_torch():
    """``scaler._lazy_init_scale_growth_tracker(device)`` before any scale(), as code
    found with the search tool calls it (``torch.device('cpu')``, ``self.device``;
    torch's own test_pickle_gradscaler lazy-inits on CPU; the string ``"cpu"`` form
    is the one issue 17 reports from accelerate's FSDP2 path, not found in the
    searchable accelerate sources); afterwards the run is torch's, and a second call
    raises torch's error."""
    init = lambda s: s._lazy_init_scale_growth_tracker("cpu")  # noqa: E731 - a one-line local helper
    m1, _ = _train(TorchScaler("cpu", init_scale=2.0**8, growth_interval=2), init=init)
    ours = GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    m2, _ = _train(ours, init=init)
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(a, b)
    t = TorchScaler("cpu")
    t._lazy_init_scale_growth_tracker(torch.device("cpu"))
    with pytest.raises(AssertionError) as expected:
        t._lazy_init_scale_growth_tracker("cpu")
    s = GradScaler("cpu")
    s._lazy_init_scale_growth_tracker(torch.device("cpu"))
    with pytest.raises(AssertionError) as got:
        s._lazy_init_scale_growth_tracker("cpu")
    assert str(got.value) == str(expected.value)


def test_unscale_grads_hook_is_torchs():
    """``_unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)``: torch's
    ShardedGradScaler calls it from its unscale_; same gradients, same flags."""
    results = []
    for cls in (TorchScaler, GradScaler):
        model, opt = _model(3)
        model(torch.randn(8, 4)).sum().mul(1024.0).backward()
        next(model.parameters()).grad[0, 0] = float("inf")
        found = cls("cpu")._unscale_grads_(opt, torch.full((), 1 / 1024.0), torch.zeros(()), False)
        results.append(
            ([p.grad.clone() for p in model.parameters()], {d: float(f) for d, f in found.items()})
        )
    (g1, f1), (g2, f2) = results
    assert f1 == f2 == {torch.device("cpu"): 1.0}
    for a, b in zip(g1, g2, strict=True):
        assert torch.equal(a, b)


def test_torchs_attributes_mean_what_they_mean_in_torch():
    """What code around the scaler reads: the same values as torch's after the same run,
    before the first scale(), after a load and after a pickle round trip."""
    import pickle

    names = (
        "_init_scale",
        "_init_growth_tracker",
        "_growth_factor",
        "_backoff_factor",
        "_growth_interval",
        "_enabled",
        "_device",
    )
    t, s = TorchScaler("cpu", init_scale=2.0**8, growth_interval=3), None
    s = GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
    for scaler in (t, s):
        assert scaler._scale is None and scaler._growth_tracker is None
    assert {n: getattr(s, n) for n in names} == {n: getattr(t, n) for n in names}
    _train(t, steps=5)
    _train(s, steps=5)
    assert {n: getattr(s, n) for n in names} == {n: getattr(t, n) for n in names}
    assert torch.equal(s._scale, t._scale) and s._scale.dtype == t._scale.dtype
    assert torch.equal(s._growth_tracker, t._growth_tracker)
    assert s._growth_tracker.dtype == t._growth_tracker.dtype
    assert dict(s._per_optimizer_states) == dict(t._per_optimizer_states) == {}
    sd = t.state_dict()
    for scaler in (t, s):
        scaler.load_state_dict(sd)
    assert {n: getattr(s, n) for n in names} == {n: getattr(t, n) for n in names}
    t2, s2 = pickle.loads(pickle.dumps(t)), pickle.loads(pickle.dumps(s))
    assert isinstance(s2, GradScaler) and isinstance(s2, TorchScaler)
    assert {n: getattr(s2, n) for n in names} == {n: getattr(t2, n) for n in names}
    assert s2._scale is None and t2._scale is None
    m1, _ = _train(t2, seed=4)
    m2, _ = _train(s2, seed=4)
    assert torch_keys(s2.state_dict()) == t2.state_dict()
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(a, b)
    d = GradScaler("cpu", enabled=False)
    for n in ("_scale", "_growth_tracker", "_init_scale"):
        with pytest.raises(AttributeError):
            getattr(TorchScaler("cpu", enabled=False), n)
        with pytest.raises(AttributeError):
            getattr(d, n)
