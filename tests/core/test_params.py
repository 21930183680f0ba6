"""Validation: the foundation issue's table, error wording, failed calls change nothing,
JSON state."""

import json
import math
import re
from fractions import Fraction

import numpy as np
import pytest

import lscore
from lscore import LossScaleState, Policy

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "value,want",
    [
        (1, 1.0),
        (2.5, 2.5),
        (True, 1.0),
        (np.float32(4), 4.0),
        (np.float64(8), 8.0),
        (Fraction(3, 2), 1.5),
    ],
)
def test_fixed_accepts(value, want):
    assert lscore.FixedLossScale(value).get_config() == {"loss_scale_value": want}
    assert lscore.FixedLossScaleManager(value).get_loss_scale() == want


@pytest.mark.parametrize(
    "value,exc,msg",
    [
        (0.5, ValueError, "^loss_scale_value must be at least 1.$"),
        (0, ValueError, "^loss_scale_value must be at least 1.$"),
        (False, ValueError, "^loss_scale_value must be at least 1.$"),
        (-3, ValueError, "^loss_scale_value must be at least 1.$"),
        (NAN, ValueError, "loss_scale_value must be finite, got nan"),
        (INF, ValueError, "loss_scale_value must be finite, got inf"),
        (1e39, ValueError, "finite in float32"),
        ("8", TypeError, "loss_scale_value must be a real number, got '8'"),
        (None, TypeError, "must be a real number"),
        (1 + 2j, TypeError, "must be a real number"),
    ],
)
def test_fixed_rejects(value, exc, msg):
    with pytest.raises(exc, match=msg):
        lscore.FixedLossScale(value)


@pytest.mark.parametrize("value", [0.25, 1e-3, 2**15, 3])
def test_dynamic_initial_accepts(value):
    assert lscore.DynamicLossScale(value)() == float(np.float32(value))
    assert lscore.ExponentialUpdateLossScaleManager(value, 2).get_loss_scale() == float(
        np.float32(value)
    )


@pytest.mark.parametrize(
    "value,exc",
    [
        (NAN, ValueError),
        (INF, ValueError),
        (-INF, ValueError),
        (0, ValueError),
        (-1, ValueError),
        ("1", TypeError),
        (None, TypeError),
        ([2], TypeError),
    ],
)
def test_dynamic_initial_rejects(value, exc):
    with pytest.raises(exc, match="initial_loss_scale"):
        lscore.DynamicLossScale(value)
    with pytest.raises(exc, match="init_loss_scale"):
        lscore.ExponentialUpdateLossScaleManager(value, 2)


@pytest.mark.parametrize("value,want", [(3, 3), (3.0, 3), (np.int32(4), 4)])
def test_period_conversion(value, want):
    assert lscore.DynamicLossScale(2, value).increment_period == want
    assert lscore.ExponentialUpdateLossScaleManager(2, value).state.policy.growth_interval == want


@pytest.mark.parametrize(
    "value,exc",
    [("x", TypeError), (None, TypeError), ([1], TypeError), (2.7, ValueError), (0, ValueError)],
)
def test_period_rejects(value, exc):
    with pytest.raises(exc, match="increment_period"):
        lscore.DynamicLossScale(2, value)
    with pytest.raises(exc, match="incr_every_n_steps"):
        lscore.ExponentialUpdateLossScaleManager(2, value)


@pytest.mark.parametrize(
    "value,exc",
    [(0.5, ValueError), (0, ValueError), (NAN, ValueError), (INF, ValueError), ("2", TypeError)],
)
def test_multiplier_rejects(value, exc):
    with pytest.raises(exc, match="multiplier"):
        lscore.DynamicLossScale(2, 2, value)
    with pytest.raises(exc, match="incr_ratio"):
        lscore.ExponentialUpdateLossScaleManager(2, 2, incr_ratio=value)


def test_multiplier_one_never_grows():
    ls = lscore.DynamicLossScale(4, 1, 1)
    for _ in range(3):
        ls.update([np.ones(2)])
    assert ls() == 4.0


@pytest.mark.parametrize("value", [0, -0.5, 1.5, NAN, INF])
def test_decr_ratio_rejects(value):
    with pytest.raises(ValueError, match=r"decr_ratio must be in \(0, 1\]"):
        lscore.ExponentialUpdateLossScaleManager(2, 2, decr_ratio=value)


@pytest.mark.parametrize(
    "value,exc", [(0, ValueError), (-1, ValueError), (1.5, TypeError), ("2", TypeError)]
)
def test_decr_every_rejects(value, exc):
    with pytest.raises(exc, match="decr_every_n_nan_or_inf"):
        lscore.ExponentialUpdateLossScaleManager(2, 2, decr_every_n_nan_or_inf=value)


def test_policy_errors_name_parameter_value_and_rule():
    with pytest.raises(ValueError, match=r"^growth_factor must be finite and >= 1, got 0.5$"):
        Policy(growth_factor=0.5)
    with pytest.raises(ValueError, match=r"^backoff_factor must be in \(0, 1\], got 2$"):
        Policy(backoff_factor=2)
    with pytest.raises(
        ValueError,
        match="unknown precision 'float16'; expected one of: float32, float32_float64, float64",
    ):
        Policy(precision="float16")
    with pytest.raises(ValueError, match="hysteresis must be >= 1, got 0"):
        Policy(hysteresis=0)
    with pytest.raises(ValueError, match="min_scale must be <= max_scale"):
        Policy(min_scale=4, max_scale=2)
    with pytest.raises(ValueError, match="needs a floor_scale or a min_scale"):
        Policy(min_action="raise_at")
    with pytest.raises(TypeError, match="guard_finite must be a bool"):
        Policy(guard_finite=1)


@pytest.mark.parametrize(
    "inv,exc",
    [
        (0, ValueError),
        (-1, ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        ("0.5", TypeError),
        (None, TypeError),
    ],
)
def test_unscale_inv_scale_rejects(inv, exc):
    a = np.ones(3, np.float32)
    with pytest.raises(exc, match="inv_scale"):
        lscore.unscale_(a, inv)
    assert np.all(a == 1)


def test_unscale_read_only_anywhere_modifies_nothing():
    a = np.ones(4, np.float32)
    b = np.ones(4, np.float16)
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(
        ValueError, match=r"unscale_ needs writable arrays; array 2 .* is read-only"
    ):
        lscore.unscale_([a, {"b": b}, ro], 0.5)
    assert np.all(a == 1) and np.all(b == 1)


def test_unscale_rejects_numbers_and_overlap():
    with pytest.raises(TypeError, match="cannot write to a Python float"):
        lscore.unscale_([np.ones(2), 3.0], 0.5)
    with pytest.raises(TypeError, match="numpy scalar"):
        lscore.unscale_(np.float32(3), 0.5)
    base = np.ones(4, np.float32)
    overlapping = np.lib.stride_tricks.as_strided(
        base, shape=(4, 3), strides=(4, 0), writeable=True
    )
    with pytest.raises(ValueError, match="do not overlap"):
        lscore.unscale_([base[:2], overlapping], 0.5)
    assert np.all(base == 1)
    half_step = np.lib.stride_tricks.as_strided(
        base.view(np.uint8)[:], shape=(5,), strides=(2,), writeable=True
    ).view(np.uint8)
    with pytest.raises(TypeError, match="is uint8"):  # integers cannot be unscaled
        lscore.unscale_(half_step, 0.5)


def test_unsupported_types_name_the_type():
    with pytest.raises(TypeError, match=r"unsupported array type builtins.str"):
        lscore.all_finite(["abc"])
    with pytest.raises(TypeError, match=r"unsupported array type builtins.bytes"):
        lscore.all_finite(b"abc")
    with pytest.raises(TypeError, match="unsupported dtype complex128"):
        lscore.all_finite(np.ones(2, complex))
    with pytest.raises(TypeError, match="unsupported dtype object"):
        lscore.all_finite(np.array([1.0, None]))
    with pytest.raises(TypeError, match=r"unsupported dtype float128|unsupported dtype longdouble"):
        lscore.all_finite(np.ones(2, np.longdouble))


def test_fnuz_float8_rejected():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for name in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz"):
        if hasattr(ml_dtypes, name):
            with pytest.raises(TypeError, match=f"unsupported dtype {name}"):
                lscore.all_finite(np.zeros(2, getattr(ml_dtypes, name)))


def test_cycle_in_containers_is_an_error():
    a = []
    a.append(a)
    with pytest.raises(ValueError, match="nested deeper"):
        lscore.all_finite(a)


def test_state_dict_is_json_and_round_trips_nonfinite_scale():
    s = LossScaleState(
        Policy(
            name="k3",
            precision="float32",
            guard_finite=False,
            growth_interval=1,
            init_scale=2.0**127,
        )
    )
    s.update(True)
    assert s.scale == INF
    d = s.state_dict()
    text = json.dumps(d, allow_nan=False)
    assert d["scale"] == "inf"
    t = LossScaleState.from_state_dict(json.loads(text))
    assert t.scale == INF and t.counters() == s.counters() and t.policy == s.policy


@pytest.mark.parametrize(
    "mutate,exc,msg",
    [
        (lambda d: d.update(format="lscore.state/9"), ValueError, "understands: lscore.state/1"),
        (lambda d: d.update(extra=1), ValueError, "unknown keys .*'extra'"),
        (lambda d: d.pop("counters"), ValueError, "missing the key 'counters'"),
        (lambda d: d["counters"].update(bogus=1), ValueError, "unknown counters: 'bogus'"),
        (lambda d: d["counters"].pop("steps"), ValueError, "missing counters: steps"),
        (lambda d: d["counters"].update(steps="3"), TypeError, "counter steps must be an int"),
        (lambda d: d.update(scale="big"), ValueError, "scale must be a number or one of"),
        (lambda d: d["policy"].update(colour="red"), ValueError, "unknown policy keys: 'colour'"),
        (lambda d: d["policy"].update(growth_factor=0.1), ValueError, "growth_factor"),
    ],
)
def test_bad_state_dicts_change_nothing(mutate, exc, msg):
    ls = lscore.DynamicLossScale(8, 3, 2)
    ls.update([np.ones(1)])
    before = ls.state_dict()
    bad = json.loads(json.dumps(before))
    mutate(bad)
    with pytest.raises(exc, match=msg):
        ls.load_state_dict(bad)
    assert ls.state_dict() == before


def test_load_before_first_use():
    a = lscore.ExponentialUpdateLossScaleManager(64, 3, 2)
    for e in (True, False, True, True):
        a.update_loss_scale(e)
    b = lscore.ExponentialUpdateLossScaleManager(64, 3, 2)
    b.load_state_dict(a.state_dict())
    assert (b.get_loss_scale(), b.good_steps, b.bad_steps) == (
        a.get_loss_scale(),
        a.good_steps,
        a.bad_steps,
    )


def test_pickle_round_trip():
    import pickle

    s = LossScaleState(Policy(init_scale=8.0))
    s.update(False)
    t = pickle.loads(pickle.dumps(s))
    assert t.state_dict() == s.state_dict()
    assert math.isclose(t.scale, 4.0)


def test_inverse_scale_is_tf_float32_division_and_the_float64_reciprocal_rounded():
    """One rule serves TF/Keras (float32 division) and torch and the device update (float64
    reciprocal rounded to float32): over float32 bit patterns the two agree bit for bit."""
    from lscore.policy import inverse_scale

    rng = np.random.default_rng(36)
    bits = rng.integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0.0, -0.0, INF, -INF, NAN, 1e-45, 3.4e38, 1.0, 3.0], np.float32)
    scales = np.concatenate([bits.view(np.float32), specials])
    with np.errstate(all="ignore"):
        tf = np.float32(1.0) / scales
    got = np.array([inverse_scale(float(s)) for s in scales], np.float32)
    nan = np.isnan(tf)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), tf[~nan].view(np.uint32))
    assert math.copysign(1.0, inverse_scale(-0.0)) == -1.0 and inverse_scale(0.0) == INF
    # float64 precision keeps the float64 quotient
    assert inverse_scale(3.0, "float64") == 1.0 / 3.0
    assert inverse_scale(3.0, "float32_float64") == float(np.float32(1.0 / 3.0))


# ---- growth intervals: one rule in every scaler, manager and preset ------------------------

# (name of the argument, a call that builds the object with the interval given)
_INTERVALS = (
    [
        ("increment_period", lambda v: lscore.DynamicLossScale(increment_period=v)),
        ("incr_every_n_steps", lambda v: lscore.ExponentialUpdateLossScaleManager(2.0**15, v)),
        ("growth_interval", lambda v: Policy(growth_interval=v)),
        ("growth_interval", lambda v: Policy(growth_interval=v, growth_mode="never")),
    ]
    + [
        (
            arg,
            lambda v, name=name, arg=arg: lscore.preset(
                name, **{**_REQUIRED.get(name, {}), arg: v}
            ),
        )
        for name, spec in __import__("lscore.presets.table", fromlist=["TABLE"]).TABLE.items()
        for arg, field in spec.rename.items()
        if field == "growth_interval"
    ]
    + [("dynamic_growth_steps", lambda v: lscore.preset("keras2", dynamic_growth_steps=v))]
)
_REQUIRED = {"tf1": {"init_loss_scale": 1024.0}, "jmp": {"loss_scale": 1024.0}}


@pytest.mark.parametrize(
    "value, exc",
    [
        (0, ValueError),
        (-5, ValueError),
        (2.5, ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        (True, TypeError),
        ("3", TypeError),
        (None, TypeError),
    ],
    ids=["0", "-5", "2.5", "nan", "inf", "True", "str", "None"],
)
def test_growth_intervals_are_positive_integers_everywhere(value, exc):
    """0 (torch's GradScaler doubled every step), -5 and 2.5 were taken by some and refused
    by others: every one refuses them, naming its argument, the value and what is allowed."""
    for arg, make in _INTERVALS:
        if value is None and arg == "dynamic_growth_steps":
            continue  # Keras's None: its default, 2000
        allowed = r"must be a positive integer \(1, 2, 3, \.\.\.\), got "
        with pytest.raises(exc, match=f"^{arg} {allowed}{re.escape(repr(value))}$"):
            make(value)


def test_growth_intervals_take_integral_numbers():
    for _, make in _INTERVALS:
        make(7)
        make(np.int64(7))
        make(7.0)  # a JSON config's 2000.0
    assert lscore.DynamicLossScale(increment_period=7.0).increment_period == 7


def test_every_preset_checks_its_growth_interval_with_the_one_rule():
    from lscore.presets import _spec, table

    for name, spec in table.TABLE.items():
        for arg, field in spec.rename.items():
            if field == "growth_interval":
                assert spec.checks[arg] is _spec.interval, name
    assert len(_INTERVALS) == 4 + 14 + 1  # 14 presets have a growth interval


def test_torch_scaler_growth_intervals():
    pytest.importorskip("torch")
    from lscore.adapters.torch import GradScaler

    for v in (0, -5, 2.5):
        with pytest.raises(ValueError, match=rf"growth_interval must be a positive integer.*{v}"):
            GradScaler("cpu", growth_interval=v)
    s = GradScaler("cpu", growth_interval=10)
    with pytest.raises(ValueError, match=r"new_interval must be a positive integer.*got 0$"):
        s.set_growth_interval(0)
    with pytest.raises(TypeError, match=r"new_interval must be a positive integer.*got True$"):
        s.set_growth_interval(True)
    assert s.get_growth_interval() == 10
    with pytest.raises(ValueError, match="growth_interval must be a positive integer"):
        s.load_state_dict({**s.state_dict(), "growth_interval": 0})
    assert s.get_growth_interval() == 10


# ---- overflows_f32: a plain comparison, exact at float32's rounding boundary ---------------


def test_overflows_f32_is_numpys_float32_rounding_at_the_boundary():
    """float32(v) is inf exactly from the midpoint of float32's max and 2**128 up (ties go to
    the even 2**128); NumPy's conversion is the oracle on both sides of every edge."""
    from lscore.policy import F32_MAX, overflows_f32

    edges = [2.0**128 * (1 - 2.0**-25), F32_MAX, 2.0**128, 2.0**127, 1.0, 2.0**-149, 0.0, INF]
    values = [NAN]
    for e in edges:
        x = e
        for _ in range(4):  # the edge and its 3 neighbours on each side
            values += [x, -x]
            x = np.nextafter(x, INF)
        x = e
        for _ in range(4):
            values += [x, -x]
            x = np.nextafter(x, 0.0)
    rng = np.random.default_rng(0)
    values += list(rng.uniform(0.99, 1.01, 2000) * F32_MAX)
    with np.errstate(over="ignore"):
        for v in values:
            assert overflows_f32(float(v)) is bool(np.isinf(np.float32(v))), repr(v)


def test_unscale_builds_no_numpy_scalar_and_enters_no_errstate(monkeypatch):
    """The hot path of unscale_ (one float32 array): no np.errstate entered and no NumPy
    scalar built per call (they cost more than the multiply of 64 elements)."""
    from lscore import policy

    a = np.ones(64, np.float32)
    lscore.unscale_(a, 0.5)  # warm

    class Counting:
        errstates = 0

        def __init__(self, **kw):
            Counting.errstates += 1
            self._inner = real_errstate(**kw)

        def __enter__(self):
            return self._inner.__enter__()

        def __exit__(self, *exc):
            return self._inner.__exit__(*exc)

    real_errstate = np.errstate
    monkeypatch.setattr(np, "errstate", Counting)
    built = []
    monkeypatch.setattr(policy, "np", _Watch(np, built))
    for _ in range(3):
        assert lscore.unscale_(a, 0.5)
        assert lscore.unscale_([a], 2.0)
    assert Counting.errstates == 0 and built == []


class _Watch:
    """A stand-in for the numpy module that records each scalar type or ufunc read through
    it (isinstance checks against np.bool_ and the like are free and not recorded)."""

    def __init__(self, module, seen):
        self._module, self._seen = module, seen

    def __getattr__(self, name):
        got = getattr(self._module, name)
        if isinstance(got, np.ufunc) or name in ("float16", "float32", "float64", "errstate"):
            self._seen.append(name)
        return got
