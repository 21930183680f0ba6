"""TF2 LossScale and TF1 LossScaleManager: the projects' own test vectors and edge cases.

Vectors are from tf_semantics.md §7 (TF loss_scale_test.py, contrib
loss_scale_manager_test.py); each runs through the public class and, for the
dynamic rules, through lscore._reference as well.
"""

import contextlib
import json

import numpy as np
import pytest

import lscore
from lscore import _reference as ref

F32_MAX = float(np.finfo(np.float32).max)
T, F = True, False
GOOD = [np.array([1.0, 2.0], np.float32)]
BAD = [np.array([1.0, np.nan], np.float32)]


def run_dynamic(events, **kw):
    ls = lscore.DynamicLossScale(**kw)
    out = []
    for e in events:
        _, apply = ls.update(GOOD if e else BAD)
        assert apply is e
        out.append(ls())
    # the same events through the reference twin
    r = ref.RefState.initial(ls.state.policy)
    want = []
    for e in events:
        r, _ = ref.update(r, e)
        want.append(r.scale)
    assert out == want
    return out


TF_VECTORS = [
    (
        "increase",
        dict(initial_loss_scale=1, increment_period=2, multiplier=2),
        [T] * 6,
        [1, 2, 2, 4, 4, 8],
    ),
    (
        "keep_increasing_until_capped",
        dict(initial_loss_scale=F32_MAX / 4, increment_period=2, multiplier=2),
        [T] * 6,
        [F32_MAX / 4, F32_MAX / 2, F32_MAX / 2, F32_MAX, F32_MAX, F32_MAX],
    ),
    (
        "decrease_every_step",
        dict(initial_loss_scale=1024, increment_period=2, multiplier=2),
        [F] * 6,
        [512, 256, 128, 64, 32, 16],
    ),
    (
        "keep_decreasing_until_one",
        dict(initial_loss_scale=16, increment_period=2, multiplier=2),
        [F] * 6,
        [8, 4, 2, 1, 1, 1],
    ),
    (
        "nan_clear_good_step",
        dict(initial_loss_scale=1, increment_period=2, multiplier=2),
        [T, T, T, F, T],
        [1, 2, 2, 1, 1],
    ),
    (
        "trigger_each_step",
        dict(initial_loss_scale=1, increment_period=1, multiplier=2),
        [T, T, T, F, T, T],
        [2, 4, 8, 4, 8, 16],
    ),
    (
        "alternating_each_step",
        dict(initial_loss_scale=1, increment_period=1, multiplier=2),
        [T, F] * 4 + [T],
        [2, 1, 2, 1, 2, 1, 2, 1, 2],
    ),
    (
        "alternating_every_other_step",
        dict(initial_loss_scale=32, increment_period=2, multiplier=2),
        [T, F] * 3 + [T],
        [32, 16, 16, 8, 8, 4, 4],
    ),
    (
        "nondefault_multiplier",
        dict(initial_loss_scale=4, increment_period=2, multiplier=3),
        [T, T, F, T, T],
        [4, 12, 4, 4, 12],
    ),
    (
        "random_mix",
        dict(initial_loss_scale=4, increment_period=2, multiplier=2),
        [F, T, T, T, F, T, F, T, T, T, F],
        [2, 2, 4, 4, 2, 2, 1, 1, 2, 2, 1],
    ),
]


@pytest.mark.parametrize("name,kw,events,want", TF_VECTORS, ids=[v[0] for v in TF_VECTORS])
def test_tf_dynamic_vectors(name, kw, events, want):
    assert run_dynamic(events, **kw) == [float(np.float32(w)) for w in want]


def test_single_tensor_none_and_empty_grads():
    ls = lscore.DynamicLossScale(1, 2, 2)
    assert ls.update(np.float32(4.0)) == (None, True)
    assert ls.update(4.0) == (None, True)
    assert ls.update([None]) == (None, True)
    assert ls.update([]) == (None, True)
    assert ls.update({"a": None, "b": [np.zeros((0, 3), np.float32)]}) == (None, True)
    assert ls.update(float("inf")) == (None, False)


def test_float16_and_nested_grads():
    ls = lscore.DynamicLossScale(8, 2, 2)
    grads = {"w": [np.ones(3, np.float16)], "b": (np.ones(2, np.float64), None)}
    assert ls.update(grads)[1] is True
    grads["w"][0][1] = np.float16("inf")
    assert ls.update(grads)[1] is False
    assert ls() == 4.0


def test_integer_grads_count_as_finite():
    ls = lscore.DynamicLossScale(8, 2, 2)
    assert ls.update([np.arange(3), np.array([True])])[1] is True


def test_unsupported_grads_raise_and_change_nothing():
    ls = lscore.DynamicLossScale(8, 2, 2)
    ls.update(GOOD)
    before = ls.state_dict()
    for bad in (["a string"], [object()], [np.array([1 + 2j])], [np.array(["x"])]):
        with pytest.raises(TypeError):
            ls.update(bad)
    assert ls.state_dict() == before


def test_serialization_round_trip():
    ls = lscore.DynamicLossScale(1, 2, 3)
    cfg = ls.get_config()
    assert cfg == {"initial_loss_scale": 1.0, "increment_period": 2, "multiplier": 3.0}
    ls2 = lscore.DynamicLossScale.from_config(cfg)
    assert ls2() == 1.0 and ls2.increment_period == 2 and ls2.multiplier == 3.0


def test_get():
    d = lscore.get("dynamic")
    assert isinstance(d, lscore.DynamicLossScale)
    assert (d(), d.increment_period, d.multiplier) == (2.0**15, 2000, 2.0)
    f = lscore.get(123)
    assert isinstance(f, lscore.FixedLossScale)
    assert lscore.FixedLossScale.from_config(f.get_config())() == 123.0
    assert lscore.get(True)() == 1.0
    assert lscore.get(d) is d and lscore.get(None) is None
    assert lscore.get({"class_name": "FixedLossScale", "config": {"loss_scale_value": 8}})() == 8
    for bad in ("Dynamic", {}, [1]):
        with pytest.raises(ValueError, match="Could not interpret loss scale identifier"):
            lscore.get(bad)
    with pytest.raises(ValueError, match=r"loss_scale_value must be at least 1\."):
        lscore.get(0.5)


def test_fixed_loss_scale():
    ls = lscore.FixedLossScale(1000)
    for g in (GOOD, BAD, [None], []):
        op, apply = ls.update(g)
        assert op is None and apply is True and isinstance(apply, bool)
        assert ls() == 1000.0
    assert repr(ls) == "FixedLossScale(1000.0)"
    assert lscore.FixedLossScale(1000.1)() == float(np.float32(1000.1))


def test_defaults():
    ls = lscore.DynamicLossScale()
    assert (ls(), ls.initial_loss_scale, ls.increment_period, ls.multiplier) == (
        32768.0,
        32768.0,
        2000,
        2.0,
    )


def test_period_one_grows_every_step():
    assert run_dynamic([T, T, T], initial_loss_scale=1, increment_period=1, multiplier=2) == [
        2,
        4,
        8,
    ]


def test_period_is_a_positive_integer_not_converted_like_tf():
    """TF takes 0 or -3 (growing every step) and truncates 2.7 and "3"; lscore refuses
    them as every growth interval that is not a positive integer (policy.growth_interval)."""
    for period, exc in ((0, ValueError), (-3, ValueError), (2.7, ValueError), ("3", TypeError)):
        with pytest.raises(exc, match="increment_period must be a positive integer"):
            lscore.DynamicLossScale(1, period)
    assert lscore.DynamicLossScale(1, 3.0).increment_period == 3


def test_initial_scale_below_one_is_pushed_up_to_one():
    assert run_dynamic([F], initial_loss_scale=0.5, increment_period=2, multiplier=2) == [1.0]
    assert run_dynamic([F], initial_loss_scale=1.5, increment_period=2, multiplier=2) == [1.0]
    assert run_dynamic([F], initial_loss_scale=3, increment_period=2, multiplier=3.5) == [1.0]


def test_growth_guard_at_float32_max():
    # init = float32 max with period 1: finite -> max, nan -> max/2, finite -> max
    out = run_dynamic([T, F, T], initial_loss_scale=F32_MAX, increment_period=1, multiplier=2)
    assert out == [F32_MAX, float(np.float32(F32_MAX) / np.float32(2)), F32_MAX]


def test_float32_division_with_multiplier_1_1():
    """TF divides by the multiplier in float32; multiplying by 1/m differs near 1000."""
    m32 = np.float32(1.1)
    inv32 = np.float32(1) / m32
    starts = np.arange(np.float32(900), np.float32(1100), np.float32(0.0625), dtype=np.float32)
    divided = starts / m32
    multiplied = starts * inv32
    differ = starts[divided != multiplied]
    assert differ.size > 100  # the two really differ in hundreds of cases
    for s in differ[:: max(1, differ.size // 60)]:
        ls = lscore.DynamicLossScale(float(s), 2, 1.1)
        ls.update(BAD)
        assert ls() == float(np.float32(s) / m32)
        assert ls() != float(np.float32(s) * inv32)


def test_growth_with_multiplier_1_1_is_float32():
    ls = lscore.DynamicLossScale(3.0, 1, 1.1)
    ls.update(GOOD)
    assert ls() == float(np.float32(3.0) * np.float32(1.1))  # 3.3000001907...


def test_initial_scale_is_rounded_to_float32():
    ls = lscore.DynamicLossScale(F32_MAX / 4 + 10, 2, 2)
    assert ls() == float(np.float32(F32_MAX / 4))
    assert ls.initial_loss_scale == F32_MAX / 4 + 10


def test_repr_names_state():
    ls = lscore.DynamicLossScale(2, 3, 2)
    ls.update(GOOD)
    assert repr(ls) == (
        "DynamicLossScale(current_loss_scale=2.0, num_good_steps=1, "
        "initial_loss_scale=2.0, increment_period=3, multiplier=2.0)"
    )


def test_dynamic_state_dict_resumes_exactly():
    rng = np.random.default_rng(3)
    events = [bool(x) for x in rng.random(200) > 0.3]
    a = lscore.DynamicLossScale(2**10, 3, 2)
    for e in events[:97]:
        a.update(GOOD if e else BAD)
    saved = json.loads(json.dumps(a.state_dict(), allow_nan=False))
    b = lscore.DynamicLossScale(2**10, 3, 2)
    b.load_state_dict(saved)
    for e in events[97:]:
        assert a.update(GOOD if e else BAD) == b.update(GOOD if e else BAD)
        assert a() == b() and a.good_steps == b.good_steps


def test_state_dict_from_other_policy_is_rejected():
    a = lscore.DynamicLossScale(8, 3, 2)
    b = lscore.DynamicLossScale(8, 3, 4)
    before = b.state_dict()
    with pytest.raises(ValueError, match="growth_factor"):
        b.load_state_dict(a.state_dict())
    assert b.state_dict() == before


# ---- TF1 managers ------------------------------------------------------------

CONTRIB = [
    ("increase", 1, 2, 2, [T] * 6, [1, 2, 2, 4, 4, 8]),
    (
        "capped",
        F32_MAX / 4 + 10,
        2,
        2,
        [T] * 6,
        [F32_MAX / 4, F32_MAX / 2, F32_MAX / 2, F32_MAX, F32_MAX, F32_MAX],
    ),
    ("decrease", 1024, 2, 2, [F] * 6, [1024, 512, 512, 256, 256, 128]),
    ("until_one", 16, 2, 2, [F] * 10, [16, 8, 8, 4, 4, 2, 2, 1, 1, 1]),
    ("bad_clears_good", 1, 2, 2, [T, T, T, F, T], [1, 2, 2, 2, 2]),
    ("good_does_not_clear_bad", 1, 2, 2, [T, T, T, F, T, F], [1, 2, 2, 2, 2, 1]),
    ("each_step", 1, 1, 1, [T, T, T, F, T, T], [2, 4, 8, 4, 8, 16]),
    ("alternating", 1, 1, 1, [T, F] * 4 + [T], [2, 1, 2, 1, 2, 1, 2, 1, 2]),
    ("every_other", 32, 2, 1, [T, F] * 3 + [T], [32, 16, 16, 8, 8, 4, 4]),
    (
        "random_mix",
        4,
        2,
        2,
        [F, F, T, T, T, F, T, F, T, T, T, F],
        [4, 2, 2, 4, 4, 4, 4, 2, 2, 4, 4, 4],
    ),
]


@pytest.mark.parametrize("name,init,incr,decr,events,want", CONTRIB, ids=[c[0] for c in CONTRIB])
def test_contrib_manager_vectors(name, init, incr, decr, events, want):
    m = lscore.ExponentialUpdateLossScaleManager(init, incr, decr, incr_ratio=2, decr_ratio=0.5)
    got = []
    for e in events:
        m.update_loss_scale(e)
        got.append(m.get_loss_scale())
    assert got == [float(np.float32(w)) for w in want]


def test_contrib_counters_and_clamp_to_one():
    m = lscore.ExponentialUpdateLossScaleManager(4, 3, 3, 2, 0.5)
    m.update_loss_scale(True)
    m.update_loss_scale(False)
    m.update_loss_scale(True)
    assert (m.good_steps, m.bad_steps) == (1, 1)  # finite steps do not clear bad steps
    m.update_loss_scale(False)
    assert (m.good_steps, m.bad_steps) == (0, 2)
    m.update_loss_scale(False)
    assert (m.get_loss_scale(), m.good_steps, m.bad_steps) == (2.0, 0, 0)
    c = lscore.ExponentialUpdateLossScaleManager(1.5, 10, 1, 2, 0.5)
    c.update_loss_scale(False)
    assert c.get_loss_scale() == 1.0  # clamped to 1, not skipped
    d = lscore.ExponentialUpdateLossScaleManager(0.25, 10, 1)
    d.update_loss_scale(np.array(False))
    assert d.get_loss_scale() == 1.0


def test_contrib_defaults_and_float32_ratio():
    m = lscore.ExponentialUpdateLossScaleManager(1000, 5)
    m.update_loss_scale(False)
    m.update_loss_scale(False)
    assert m.get_loss_scale() == float(np.float32(1000) * np.float32(0.8))


def test_fixed_manager():
    m = lscore.FixedLossScaleManager(1000)
    for e in [True] * 5 + [False] * 5:
        m.update_loss_scale(e)
        assert m.get_loss_scale() == 1000.0
    with pytest.raises(ValueError, match=r"^loss scale must be at least 1\.$"):
        lscore.FixedLossScaleManager(0.5)
    with pytest.raises(TypeError, match="finite_grads must be a bool"):
        m.update_loss_scale("yes")


def test_custom_manager_subclass():
    class Custom(lscore.LossScaleManager):
        def __init__(self):
            self.s = 8.0

        def get_loss_scale(self):
            return self.s

        def update_loss_scale(self, finite_grads):
            self.s += 1 if finite_grads else -1

    m = Custom()
    out = []
    for e in (False, False, True):
        m.update_loss_scale(e)
        out.append(m.get_loss_scale())
    assert out == [7, 6, 7]
    with pytest.raises(TypeError):
        lscore.LossScaleManager()
    with pytest.raises(TypeError):
        lscore.LossScale()


# ---- issue 17, items 14 and 15: what TF1 code hands the managers, and restored scales ----


@pytest.mark.parametrize(
    "make",
    [
        lambda: lscore.ExponentialUpdateLossScaleManager(2.0**10, 2),
        lambda: lscore.preset("tf1", init_loss_scale=2.0**10, incr_every_n_steps=2),
    ],
    ids=["manager", "tf1 preset"],
)
def test_managers_take_numpy_and_framework_bools(make):
    """A TF1 loop hands update_loss_scale whatever its all-finite reduction returns:
    a Python bool, numpy.bool_, a 0-d or 1-element bool array, or a 0-d torch bool tensor."""
    flags = [False, np.bool_(True), np.array(False), np.array([True]), np.array(True)]
    torch = None
    with contextlib.suppress(ImportError):
        import torch
    if torch is not None:
        flags += [torch.tensor(False), torch.tensor([True])]
    m, plain = make(), make()
    for f in flags:
        m.update_loss_scale(f)
        plain.update_loss_scale(bool(f.item()) if hasattr(f, "item") else bool(f))
        assert m.get_loss_scale() == plain.get_loss_scale()
    assert m.state.counters() == plain.state.counters()
    for bad in ("False", 1, np.array([True, False]), np.array(1.0), None):
        with pytest.raises(TypeError, match="finite_grads must be a bool"):
            m.update_loss_scale(bad)
    assert m.state.counters() == plain.state.counters()


def test_the_tf1_preset_is_a_loss_scale_manager_with_the_same_sequence():
    p = lscore.preset(
        "tf1",
        init_loss_scale=2.0**12,
        incr_every_n_steps=3,
        decr_every_n_nan_or_inf=2,
        incr_ratio=2.0,
        decr_ratio=0.5,
    )
    m = lscore.ExponentialUpdateLossScaleManager(2.0**12, 3, 2, 2.0, 0.5)
    assert isinstance(p, lscore.LossScaleManager)
    rng = np.random.default_rng(3)
    for finite in rng.random(200) > 0.2:
        p.update_loss_scale(bool(finite))
        m.update_loss_scale(bool(finite))
        assert p.get_loss_scale() == m.get_loss_scale()


@pytest.mark.parametrize(
    "make",
    [
        lscore.DynamicLossScale,
        lambda: lscore.ExponentialUpdateLossScaleManager(2.0**15, 4),
        lambda: lscore.preset("torch"),
    ],
    ids=["tf2", "tf1", "torch"],
)
def test_a_restored_scale_is_rounded_to_the_policys_float32(make):
    """TF's and torch's scales are float32 variables: a float64 scale restored into them
    holds its float32 value, and the run continues from that value."""
    obj = make()
    d = obj.state_dict() if hasattr(obj, "state_dict") else obj.state.state_dict()
    d["scale"] = 1000.1
    obj.load_state_dict(d)
    state = obj.state
    assert state.scale == float(np.float32(1000.1)) != 1000.1
    twin = make()
    d["scale"] = float(np.float32(1000.1))
    twin.load_state_dict(d)
    for finite in [True] * 5 + [False, True, False, False] + [True] * 6:
        state.update(finite)
        twin.state.update(finite)
        assert state.scale == twin.state.scale
    # a float64 policy keeps the double
    ds = lscore.preset("deepspeed")
    e = ds.state_dict()
    e["scale"] = 1000.1
    ds.load_state_dict(e)
    assert ds.state.scale == 1000.1
