"""lscore.adapters.torch.GradScaler: torch's API and errors, lscore's options, CPU layouts.

Expected values come from torch.amp.GradScaler run on the same inputs, or
from lscore._reference for the lscore-only options.
"""

from __future__ import annotations

import copy
import pickle
import warnings
from typing import ClassVar

import pytest

torch = pytest.importorskip("torch")
import lscore
from helpers import torch_keys
from lscore import _reference as ref
from lscore.adapters.torch import (
    GradScaler,
    ScalerAssertionError,
    ScalerConfigError,
    torch_policy,
)

TorchScaler = torch.amp.GradScaler
BOTH = pytest.mark.parametrize("cls", [TorchScaler, GradScaler], ids=["torch", "lscore"])


def make(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(
        dtype
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def iteration(scaler, model, opt, finite=True, x=None):
    opt.zero_grad()
    x = torch.randn(3, 4, dtype=next(model.parameters()).dtype) if x is None else x
    loss = model(x).float().pow(2).mean()
    if not finite:
        loss = loss * float("inf")
    scaler.scale(loss).backward()
    ret = scaler.step(opt)
    scaler.update()
    return ret


def raised(fn):
    try:
        fn()
    except Exception as e:
        return e
    raise AssertionError("nothing raised")


# ---- misuse: torch's exception types and messages ----------------------------------


def _unscale_twice(s, m, o):
    s.scale(m(torch.randn(2, 4)).sum()).backward()
    s.unscale_(o)
    s.unscale_(o)


def _unscale_after_step(s, m, o):
    s.scale(m(torch.randn(2, 4)).sum()).backward()
    s.step(o)
    s.unscale_(o)


def _step_twice(s, m, o):
    s.scale(m(torch.randn(2, 4)).sum()).backward()
    s.step(o)
    s.step(o)


def _closure(s, m, o):
    s.scale(m(torch.randn(2, 4)).sum()).backward()
    s.step(o, closure=lambda: 0.0)


def _update_without_step(s, m, o):
    s.scale(m(torch.randn(2, 4)).sum())
    s.update()


def _step_without_grads(s, m, o):
    s.scale(m(torch.randn(2, 4)).sum())
    s.step(o)


def _update_with(make_new_scale):
    def fn(s, m, o):
        s.scale(m(torch.randn(2, 4)).sum()).backward()
        s.step(o)
        s.update(make_new_scale())

    return fn


def _pickle_mid_iteration(s, m, o):
    s.scale(m(torch.randn(2, 4)).sum()).backward()
    s.unscale_(o)
    pickle.dumps(s)


def _fp16_grads(s, m, o):
    m.half()
    s.scale(m(torch.randn(2, 4, dtype=torch.float16)).float().sum()).backward()
    s.step(o)


MISUSE = {
    "unscale_ twice": (_unscale_twice, RuntimeError),
    "unscale_ after step": (_unscale_after_step, RuntimeError),
    "step twice": (_step_twice, RuntimeError),
    "closure": (_closure, RuntimeError),
    "unscale_ before scale": (lambda s, m, o: s.unscale_(o), AssertionError),
    "step before scale": (lambda s, m, o: s.step(o), AssertionError),
    "update before scale": (lambda s, m, o: s.update(), AssertionError),
    "update without step": (_update_without_step, AssertionError),
    "step without grads": (_step_without_grads, AssertionError),
    "bad new_scale": (_update_with(lambda: torch.ones(2)), AssertionError),
    "new_scale requires grad": (
        _update_with(lambda: torch.ones((), requires_grad=True)),
        AssertionError,
    ),
    "pickle mid-iteration": (_pickle_mid_iteration, AssertionError),
    "fp16 gradients": (_fp16_grads, ValueError),
    "empty state dict": (lambda s, m, o: s.load_state_dict({}), RuntimeError),
}


@pytest.mark.parametrize("case", list(MISUSE), ids=list(MISUSE))
def test_misuse_raises_torchs_error(case):
    fn, torch_type = MISUSE[case]
    m, o = make()
    expected = raised(lambda: fn(TorchScaler("cpu"), m, o))
    m, o = make()
    got = raised(lambda: fn(GradScaler("cpu"), m, o))
    assert type(expected) is torch_type
    assert isinstance(got, torch_type)
    if case == "fp16 gradients":  # torch's sentence, then what to do about it
        assert str(got).startswith(str(expected) + " ") and "allow_fp16_params=True" in str(got)
    else:
        assert str(got) == str(expected)
    if torch_type is AssertionError:
        # lscore's contract: call-order misuse is a RuntimeError
        assert isinstance(got, RuntimeError) and isinstance(got, ScalerAssertionError)


def test_non_tensor_param_message():
    class Duck:
        param_groups: ClassVar[list[dict]] = [{"params": [1.0]}]

    for cls in (TorchScaler, GradScaler):
        s = cls("cpu")
        s.scale(torch.ones(()))
        e = raised(lambda s=s: s.unscale_(Duck()))
        assert isinstance(e, AssertionError)
        assert str(e) == "expected param to be torch.Tensor, got float"


def test_parameter_subclass_that_redefines_grad_is_read_like_torch():
    """`.grad` is read through torch's C getter only where attribute lookup
    would end there; a subclass's own `grad` is honoured, as torch does."""

    class ShadowGrad(torch.nn.Parameter):
        @property
        def grad(self):
            return self.shadow

    plain = [torch.nn.Parameter(torch.zeros(4)) for _ in range(2)]
    shadow = ShadowGrad(torch.zeros(4))
    for cls in (TorchScaler, GradScaler):
        for p in plain:
            p.grad = torch.full((4,), 8.0)
        shadow.shadow = torch.full((4,), 8.0)
        opt = torch.optim.SGD([plain[0], shadow, plain[1]], lr=0.1)  # the type alternates
        s = cls("cpu", init_scale=2.0)
        s.scale(torch.ones(()))
        s.unscale_(opt)
        for t in (plain[0].grad, shadow.shadow, plain[1].grad):
            assert torch.equal(t, torch.full((4,), 4.0)), cls

    # `grad` redefined on the class after the scaler has read it once
    class Later(torch.nn.Parameter):
        pass

    p = Later(torch.zeros(4))
    p.grad = torch.full((4,), 8.0)
    opt = torch.optim.SGD([p], lr=0.1)
    s = GradScaler("cpu", init_scale=2.0, growth_interval=1 << 20)
    s.scale(torch.ones(()))
    s.unscale_(opt)
    s.update()
    assert torch.equal(p.grad, torch.full((4,), 4.0))
    Later.grad = property(lambda self: self.shadow)
    p.shadow = torch.full((4,), 8.0)
    s.unscale_(opt)
    assert torch.equal(p.shadow, torch.full((4,), 4.0))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"growth_factor": 1.0},
        {"growth_factor": 0.5},
        {"backoff_factor": 1.0},
        {"backoff_factor": 2.0},
    ],
)
def test_bad_factors_raise_torchs_message(kwargs):
    expected = raised(lambda: TorchScaler("cpu", **kwargs))
    got = raised(lambda: GradScaler("cpu", **kwargs))
    assert str(got) == str(expected)
    assert isinstance(got, ValueError) and isinstance(got, AssertionError)
    assert isinstance(got, ScalerConfigError)


def test_failed_unscale_writes_nothing():
    """fp16 is found before any gradient is touched, as in torch."""
    m = torch.nn.Linear(3, 2)
    h = torch.nn.Linear(3, 2).half()
    opt = torch.optim.SGD(list(m.parameters()) + list(h.parameters()), lr=0.1)
    s = GradScaler("cpu")
    s.scale(m(torch.randn(2, 3)).sum() + h(torch.randn(2, 3).half()).float().sum()).backward()
    before = [p.grad.clone() for p in m.parameters()]
    with pytest.raises(ValueError, match=r"Attempting to unscale FP16 gradients\."):
        s.unscale_(opt)
    assert all(torch.equal(a, p.grad) for a, p in zip(before, m.parameters(), strict=True))


# ---- enabled=False and the CUDA default without CUDA ---------------------------------


def test_disabled_scaler_is_a_pass_through():
    m, o = make()
    s = GradScaler("cpu", enabled=False)
    loss = m(torch.randn(2, 4)).sum()
    assert s.scale(loss) is loss
    loss.backward()
    before = [p.detach().clone() for p in m.parameters()]
    s.unscale_(o)
    assert s.step(o) is None
    s.update()
    assert not all(torch.equal(a, p) for a, p in zip(before, m.parameters(), strict=True))
    assert s.get_scale() == 1.0 and s.state_dict() == {} and not s.is_enabled()
    s.load_state_dict({})
    assert s.last_step_skipped is False and s.skipped_steps == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_default_without_cuda_warns_and_disables():
    with warnings.catch_warnings(record=True) as w_t:
        warnings.simplefilter("always")
        t = TorchScaler()
    with warnings.catch_warnings(record=True) as w_o:
        warnings.simplefilter("always")
        o = GradScaler()
    assert [str(w.message) for w in w_o] == [str(w.message) for w in w_t]
    assert not o.is_enabled() and not t.is_enabled()


# ---- API results equal torch's --------------------------------------------------------


@pytest.mark.parametrize("outputs", ["tensor", "list", "tuple", "nested", "generator"])
def test_scale_outputs_like_torch(outputs):
    def build():
        a, b = torch.tensor([1.5, -2.0]), torch.tensor([3.0], dtype=torch.float64)
        return {
            "tensor": a,
            "list": [a, b],
            "tuple": (a, b),
            "nested": [a, (b, [a])],
            "generator": (x for x in (a, b)),
        }[outputs]

    def flat(x):
        if isinstance(x, torch.Tensor):
            return [x]
        return [y for v in x for y in flat(v)]

    got = GradScaler("cpu", init_scale=3.3).scale(build())
    expected = TorchScaler("cpu", init_scale=3.3).scale(build())
    if outputs in ("list", "tuple", "nested"):
        assert type(got) is type(expected)
    g, e = flat(got), flat(expected)
    assert len(g) == len(e)
    assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(g, e, strict=True))
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
        GradScaler("cpu").scale([torch.ones(1), 3])


def test_getters_setters_and_state_dict_like_torch():
    kw = dict(init_scale=3.3, growth_factor=3.0, backoff_factor=0.25, growth_interval=3)
    t, o = TorchScaler("cpu", **kw), GradScaler("cpu", **kw)
    assert o.get_scale() == t.get_scale() == 3.3  # before scale(): the raw value
    assert torch_keys(o.state_dict()) == t.state_dict()
    for s in (t, o):
        s.set_growth_factor(1.5)
        s.set_backoff_factor(0.75)
        s.set_growth_interval(2)
    m1, o1 = make(seed=1)
    m2 = copy.deepcopy(m1)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.1)
    for finite in (True, True, False, True, True, True, False):
        x = torch.randn(3, 4)
        iteration(t, m1, o1, finite, x)
        iteration(o, m2, o2, finite, x)
        assert o.get_scale() == t.get_scale()
        assert torch_keys(o.state_dict()) == t.state_dict()
    assert (o.get_growth_factor(), o.get_backoff_factor(), o.get_growth_interval()) == (
        t.get_growth_factor(),
        t.get_backoff_factor(),
        t.get_growth_interval(),
    )
    assert o.is_enabled() is True


def test_step_returns_inner_value_or_none_and_skip_status():
    class Returning(torch.optim.SGD):
        def step(self, closure=None):
            super().step()
            return "stepped"

    m = torch.nn.Linear(4, 2)
    opt = Returning(m.parameters(), lr=0.1)
    s = GradScaler("cpu", growth_interval=2)
    assert iteration(s, m, opt, True) == "stepped" and s.last_step_skipped is False
    assert iteration(s, m, opt, False) is None and s.last_step_skipped is True
    assert iteration(s, m, opt, False) is None
    assert iteration(s, m, opt, True) == "stepped" and s.last_step_skipped is False
    assert s.skipped_steps == 2


def test_new_scale_float_and_tensor():
    for value in (1000.1, torch.tensor(1000.1, dtype=torch.float64), 7):
        scalers = (TorchScaler("cpu"), GradScaler("cpu"))
        for s in scalers:
            m, o = make()
            s.scale(m(torch.randn(2, 4)).sum()).backward()
            s.step(o)
            if isinstance(value, int) and s is scalers[0]:
                s.update(float(value))  # torch takes only floats and tensors
            else:
                s.update(value)
        assert scalers[1].get_scale() == scalers[0].get_scale()
        assert torch_keys(scalers[1].state_dict()) == scalers[0].state_dict()


def test_state_dicts_cross_load_and_pickle():
    t, o = (
        TorchScaler("cpu", init_scale=512.0, growth_interval=3),
        GradScaler("cpu", init_scale=512.0, growth_interval=3),
    )
    m1, o1 = make()
    m2 = copy.deepcopy(m1)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.1)
    for finite in (True, True, False, True):
        x = torch.randn(3, 4)
        iteration(t, m1, o1, finite, x)
        iteration(o, m2, o2, finite, x)
    sd = t.state_dict()
    assert torch_keys(o.state_dict()) == sd
    assert o.state_dict()["lscore_counters"]["skipped_steps"] == 1
    fresh = GradScaler("cpu")
    fresh.load_state_dict(sd)
    assert torch_keys(fresh.state_dict()) == sd and fresh.get_scale() == t.get_scale()
    back = TorchScaler("cpu")
    back.load_state_dict(o.state_dict())
    assert back.state_dict() == sd
    clone = pickle.loads(pickle.dumps(o))
    assert clone.state_dict() == o.state_dict() and clone.skipped_steps == o.skipped_steps
    iteration(clone, m2, o2, True)
    iteration(t, m1, o1, True, None)
    assert clone.get_scale() == t.get_scale()


# ---- lscore's options -------------------------------------------------------------


def reference_scales(policy, events):
    st = ref.RefState.initial(policy)
    out = []
    for finite in events:
        st, _ = ref.update(st, finite)
        out.append(st.scale)
    return out


@pytest.mark.parametrize(
    "opts",
    [
        dict(hysteresis=2),
        dict(hysteresis=3, growth_interval=2),
        dict(min_scale=64.0),
        dict(max_scale=1024.0, growth_interval=1),
        dict(min_scale=100.0, max_scale=300.0, hysteresis=2, growth_interval=1),
    ],
    ids=["hyst2", "hyst3", "min", "max", "all"],
)
def test_lscore_options_follow_the_reference(opts):
    events = [
        False,
        True,
        False,
        False,
        True,
        True,
        False,
        False,
        False,
        True,
        True,
        True,
        False,
        True,
        False,
        False,
        False,
        False,
        False,
        True,
    ]
    kw = dict(init_scale=256.0, growth_interval=opts.pop("growth_interval", 3))
    s = GradScaler("cpu", **kw, **opts)
    m, o = make()
    got = []
    for finite in events:
        iteration(s, m, o, finite)
        got.append(s.get_scale())
    assert got == reference_scales(torch_policy(**kw, **opts), events)
    assert s.skipped_steps == events.count(False)
    sd = s.state_dict()
    assert sd["lscore"]["format"] == "lscore.state/1"
    # torch ignores the extra key; lscore resumes every counter from it
    t = TorchScaler("cpu")
    t.load_state_dict(sd)
    assert t.get_scale() == s.get_scale()
    again = GradScaler("cpu")
    with pytest.raises(ValueError, match="different policy"):
        again.load_state_dict(sd)  # another policy: taken only when asked
    again.load_state_dict(sd, adopt_policy=True)
    assert again.state_dict() == sd


def test_hysteresis_one_is_torch_and_has_no_extra_key():
    s = GradScaler("cpu", hysteresis=1)
    assert set(torch_keys(s.state_dict())) == {
        "scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "_growth_tracker",
    }


def test_policy_argument_forms():
    p = torch_policy(init_scale=128.0, growth_interval=2, hysteresis=2)
    a = GradScaler("cpu", policy=p)
    b = GradScaler("cpu", policy=p.to_dict())
    st = lscore.LossScaleState(p)
    st.update(True)
    st.update(False)
    c = GradScaler("cpu", policy=st.state_dict())
    d = GradScaler("cpu", policy=st)
    assert a.get_scale() == b.get_scale() == 128.0
    assert c.get_scale() == d.get_scale() == st.scale
    assert c.state_dict()["lscore"]["counters"] == st.counters()
    assert a.get_growth_interval() == 2
    with pytest.raises(ValueError, match="policy= sets every parameter"):
        GradScaler("cpu", init_scale=8.0, policy=p)
    with pytest.raises(TypeError, match="policy must be"):
        GradScaler("cpu", policy=3)
    if not hasattr(lscore, "preset"):
        with pytest.raises(ImportError, match=r"needs lscore.preset"):
            GradScaler("cpu", policy="deepspeed")


@pytest.mark.skipif(not hasattr(lscore, "preset"), reason="needs lscore.preset")
@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("deepspeed", {}),
        ("megatron", {}),
        ("deepspeed", dict(init_scale=2.0**8, scale_window=2, delayed_shift=2)),
    ],
    ids=["deepspeed", "megatron", "deepspeed_args"],
)
def test_policy_presets_follow_lscore_preset(name, kwargs):
    events = [True, False, False, True, True, True, False, True, True, True, True]
    s = (
        GradScaler("cpu", policy=lscore.preset(name, **kwargs))
        if kwargs
        else GradScaler("cpu", policy=name)
    )
    ls = lscore.preset(name, **kwargs)
    m, o = make()
    for finite in events:
        iteration(s, m, o, finite)
        ls.state.update(finite)
        assert s.get_scale() == ls.state.scale
    assert s.state_dict()["lscore"]["counters"] == ls.state.counters()


def test_setter_validation_changes_nothing():
    s = GradScaler("cpu", hysteresis=2)
    before = s.state_dict()
    with pytest.raises(ValueError, match="backoff_factor"):
        s.set_backoff_factor(-1.0)
    assert s.state_dict() == before


# ---- scale edge cases, compared with torch ------------------------------------------


@pytest.mark.parametrize("case", ["collapse_to_zero", "growth_at_float32_max"])
def test_scale_edges_like_torch(case):
    if case == "collapse_to_zero":
        kw, events = dict(init_scale=1.0, backoff_factor=0.01), [False] * 25 + [True] * 3
    else:
        kw, events = dict(init_scale=2.0**126, growth_interval=1), [True] * 4
    t, o = TorchScaler("cpu", **kw), GradScaler("cpu", **kw)
    m1, o1 = make()
    m2 = copy.deepcopy(m1)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.1)
    for finite in events:
        x = torch.randn(3, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            iteration(t, m1, o1, finite, x)
            iteration(o, m2, o2, finite, x)
        assert o.get_scale() == t.get_scale()
        assert torch_keys(o.state_dict()) == t.state_dict()
        for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))


# ---- CPU gradient layouts and dtypes ---------------------------------------------------


def _layout_grad(kind, dtype, gen):
    base = torch.randn(6, 10, generator=gen, dtype=torch.float64).to(dtype) * 100
    if kind == "contiguous":
        return base
    if kind == "transposed":
        return base.t()
    if kind == "sliced":
        return base[:, ::3]
    if kind == "offset":
        return base[2:, 1:]
    if kind == "permuted3d":
        return base.reshape(2, 3, 10).permute(2, 0, 1)[1:]
    if kind == "zero_d":
        return base[0, 0].clone()
    if kind == "empty":
        return base[:0]
    raise ValueError(kind)


LAYOUTS = ["contiguous", "transposed", "sliced", "offset", "permuted3d", "zero_d", "empty"]


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["f32", "f64", "bf16"]
)
@pytest.mark.parametrize("bad", [None, "nan", "inf", "-inf"])
def test_unscale_layouts_bitwise_like_torch(dtype, bad):
    results = []
    for cls in (TorchScaler, GradScaler):
        gen = torch.Generator().manual_seed(7)
        params = []
        for kind in LAYOUTS:
            g = _layout_grad(kind, dtype, gen)
            p = torch.nn.Parameter(torch.zeros(g.shape, dtype=dtype))
            p.grad = g
            params.append(p)
        if bad is not None:
            params[2].grad[1, 1] = float(bad)
        opt = torch.optim.SGD(params, lr=0.1)
        s = cls("cpu", init_scale=3.0)
        s.scale(torch.ones(()))
        s.unscale_(opt)
        found = sum(v.item() for v in s._found_inf_per_device(opt).values())
        results.append((found, [p.grad.clone() for p in params], [p.grad.stride() for p in params]))
    (f_t, g_t, st_t), (f_o, g_o, st_o) = results
    assert f_o == f_t and st_o == st_t
    for a, b in zip(g_t, g_o, strict=True):
        w = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16}[
            dtype
        ]
        nan = torch.isnan(a)
        assert torch.equal(nan, torch.isnan(b))
        assert torch.equal(a.contiguous().view(w)[~nan], b.contiguous().view(w)[~nan])


def test_unscale_leaves_the_version_counter_as_torch():
    versions = []
    for cls in (TorchScaler, GradScaler):
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.ones(4)
        v0 = p.grad._version
        s = cls("cpu")
        s.scale(torch.ones(()))
        s.unscale_(torch.optim.SGD([p], lr=0.1))
        versions.append(p.grad._version - v0)
    assert versions[1] == versions[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_sparse_grads_like_torch(dtype):
    """Values of sparse grads are checked; a float16 one is coalesced first (duplicates
    summed can overflow), on the path that allows float16 (fused optimizers)."""
    out = []
    for cls in (TorchScaler, GradScaler):
        idx = torch.tensor([[0, 0, 2]])
        vals = torch.tensor([60000.0, 60000.0, 1.0]).to(dtype)
        p = torch.nn.Parameter(torch.zeros(4, dtype=dtype))
        p.grad = torch.sparse_coo_tensor(idx, vals, (4,))
        s = cls("cpu", init_scale=2.0)
        s.scale(torch.ones(()))
        opt = torch.optim.SGD([p], lr=0.1)
        if dtype is torch.float16:
            found = s._check_inf_per_device(opt)
        else:
            s.unscale_(opt)
            found = s._found_inf_per_device(opt)
        out.append(
            (
                sum(v.item() for v in found.values()),
                p.grad.is_coalesced(),
                p.grad.coalesce().to_dense(),
            )
        )
    assert out[0][:2] == out[1][:2]
    assert torch.equal(out[0][2].float(), out[1][2].float())


@pytest.mark.parametrize("grad", ["expanded", "complex"])
def test_unsupported_grads_raise_torchs_error(grad):
    errors = []
    for cls in (TorchScaler, GradScaler):
        if grad == "expanded":
            p = torch.nn.Parameter(torch.zeros(4))
            p.grad = torch.ones(1).expand(4)
        else:
            p = torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))
            p.grad = torch.ones(3, dtype=torch.complex64)
        s = cls("cpu")
        s.scale(torch.ones(()))
        errors.append(raised(lambda s=s, p=p: s.unscale_(torch.optim.SGD([p], lr=0.1))))
    assert type(errors[1]) is type(errors[0]) and str(errors[1]) == str(errors[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_autocast_cpu_like_torch(dtype):
    params = []
    for cls in (TorchScaler, GradScaler):
        m, o = make(seed=3)
        s = cls("cpu", init_scale=2.0**10, growth_interval=2)
        torch.manual_seed(11)
        scales = []
        for i in range(6):
            o.zero_grad()
            with torch.autocast("cpu", dtype=dtype):
                out = m(torch.randn(5, 4))
                loss = out.float().pow(2).mean() * (float("inf") if i == 2 else 1.0)
            s.scale(loss).backward()
            s.step(o)
            s.update()
            scales.append(s.get_scale())
        params.append((scales, [p.detach().clone() for p in m.parameters()]))
    assert params[0][0] == params[1][0]
    assert all(torch.equal(a, b) for a, b in zip(params[0][1], params[1][1], strict=True))


# ---- torch's kernel path (what runs for CUDA tensors), exercised on the CPU -------------


@pytest.mark.parametrize(
    "opts", [{}, {"hysteresis": 2, "min_scale": 1.0}], ids=["torch", "options"]
)
def test_torch_kernel_path_matches(opts):
    events = [True, False, True, True, True, False, False, True, True]
    kw = dict(init_scale=64.0, growth_interval=2)
    reference = GradScaler("cpu", **kw, **opts)
    forced = GradScaler("cpu", **kw, **opts)
    forced.torch_kernels = True
    m1, o1 = make()
    m2 = copy.deepcopy(m1)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.1)
    for finite in events:
        x = torch.randn(3, 4)
        iteration(reference, m1, o1, finite, x)
        iteration(forced, m2, o2, finite, x)
        assert forced._on_device
        assert forced.get_scale() == reference.get_scale()
        assert forced.state_dict() == reference.state_dict()
        assert forced.last_step_skipped == reference.last_step_skipped
    assert forced.skipped_steps == reference.skipped_steps == events.count(False)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters(), strict=True))
    for s in (forced, reference):
        s.set_growth_factor(3.0)
        s.set_growth_interval(1)
    x = torch.randn(3, 4)
    iteration(reference, m1, o1, True, x)
    iteration(forced, m2, o2, True, x)
    assert forced.state_dict() == reference.state_dict()
    clone = pickle.loads(pickle.dumps(forced))
    assert clone.state_dict() == reference.state_dict()
    forced.load_state_dict(reference.state_dict())
    assert forced.get_scale() == reference.get_scale()


@pytest.mark.gpu
def test_cuda_matches_torch():
    t, o = TorchScaler("cuda", growth_interval=2), GradScaler("cuda", growth_interval=2)
    m1, o1 = make()
    m1 = m1.cuda()
    o1 = torch.optim.SGD(m1.parameters(), lr=0.1)
    m2 = copy.deepcopy(m1)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.1)
    for finite in (True, False, True, True, True):
        x = torch.randn(3, 4, device="cuda")
        iteration(t, m1, o1, finite, x)
        iteration(o, m2, o2, finite, x)
        assert o.get_scale() == t.get_scale()
    assert torch_keys(o.state_dict()) == t.state_dict()
    assert o.state_dict()["lscore_counters"]["skipped_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters(), strict=True))
    assert o.skipped_steps == 1
