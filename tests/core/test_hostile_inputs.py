"""Hostile inputs across the public API: a clear error naming the problem, and nothing changed.

Every bad call below runs against one "world" of live objects (loss scales,
managers, a bare state machine, arrays) that have some history; after the
error the world must be bit-for-bit what it was.  tests/core/test_params.py holds
the foundation's validation table; the cases here are the ones it does not
cover.  Valid but unusual inputs (read-only, unaligned, byte-swapped and
more-than-2**31-element arrays) must give the reference's answer.
"""

import collections
import json
from fractions import Fraction

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import lscore
from helpers import FLOAT8_DTYPES, FLOAT_DTYPES
from helpers.gen import make_array, nonfinite_values
from lscore import LossScaleState, Policy
from lscore import _reference as ref

NAN, INF = float("nan"), float("inf")


class World:
    """Objects with history, and arrays, that a failed call must leave untouched."""

    def __init__(self):
        rng = np.random.default_rng(7)
        self.dyn = lscore.DynamicLossScale(1024, 3, 2)
        self.mgr = lscore.ExponentialUpdateLossScaleManager(512, 2, 2)
        self.state = LossScaleState(Policy(name="torch", init_scale=4096.0, growth_interval=2))
        self.fixed = lscore.FixedLossScale(64)
        for finite in (True, False, True, True, False):
            self.dyn.update([np.ones(2)] if finite else [np.array([NAN])])
            self.mgr.update_loss_scale(finite)
            self.state.update(finite)
        self.a = rng.standard_normal(8).astype(np.float32)
        self.b = rng.standard_normal((3, 4)).astype(np.float16)
        self.c = rng.standard_normal(5)
        self.ro = rng.standard_normal(4).astype(np.float32)
        self.ro.flags.writeable = False
        self.arrays = [self.a, self.b, self.c, self.ro]

    def snapshot(self):
        states = [
            self.dyn.state_dict(),
            self.mgr.state_dict(),
            self.state.state_dict(),
            self.fixed.get_config(),
            self.dyn.get_config(),
        ]
        return (
            json.dumps(states, allow_nan=False),
            [(a.tobytes(), a.dtype.str, a.shape, a.flags.writeable) for a in self.arrays],
        )


def _state_with(mutate):
    """A v1 state dict of DynamicLossScale (from a fresh World) after `mutate`."""
    d = json.loads(json.dumps(World().dyn.state_dict()))
    mutate(d)
    return d


def _set(path, value):
    def mutate(d):
        *keys, last = path.split(".")
        for k in keys:
            d = d[k]
        d[last] = value

    return mutate


ml = pytest.importorskip("ml_dtypes")

# (id, call on the world, exception, regex the message must match)
BAD = [
    # zero, negative, NaN and Inf scales
    (
        "set_scale zero",
        lambda w: w.state.set_scale(0),
        ValueError,
        r"new_scale must be finite and > 0, got 0",
    ),
    ("set_scale negative", lambda w: w.state.set_scale(-8), ValueError, r"new_scale .* got -8"),
    ("set_scale nan", lambda w: w.state.set_scale(NAN), ValueError, r"new_scale .* got nan"),
    ("set_scale inf", lambda w: w.state.set_scale(INF), ValueError, r"new_scale .* got inf"),
    (
        "set_scale beyond float32",
        lambda w: w.state.set_scale(1e39),
        ValueError,
        "new_scale must be finite in float32",
    ),
    (
        "Policy init_scale numpy nan",
        lambda w: Policy(init_scale=np.float64(NAN)),
        ValueError,
        "init_scale must be finite and > 0",
    ),
    (
        "Policy init_scale zero",
        lambda w: Policy(init_scale=0.0),
        ValueError,
        "init_scale must be finite and > 0",
    ),
    (
        "Policy max_scale nan",
        lambda w: Policy(max_scale=NAN),
        ValueError,
        "max_scale must be a finite number >= 0",
    ),
    (
        "Policy min_scale inf",
        lambda w: Policy(min_scale=INF),
        ValueError,
        "min_scale must be a finite number >= 0",
    ),
    (
        "Policy min_scale negative",
        lambda w: Policy(min_scale=-1),
        ValueError,
        "min_scale must be a finite number >= 0",
    ),
    (
        "unscale_ inv_scale beyond float32",
        lambda w: lscore.unscale_([w.a, w.b], 1e39),
        ValueError,
        "inv_scale must be finite in float32",
    ),
    (
        "unscale_ inv_scale -inf",
        lambda w: lscore.unscale_([w.a], -INF),
        ValueError,
        "inv_scale must be finite and > 0",
    ),
    # non-numbers where numbers are expected
    (
        "Policy growth_factor str",
        lambda w: Policy(growth_factor="2"),
        TypeError,
        "growth_factor must be a real number, got '2'",
    ),
    (
        "Policy init_scale None",
        lambda w: Policy(init_scale=None),
        TypeError,
        "init_scale must be a real number, got None",
    ),
    (
        "Policy min_scale str",
        lambda w: Policy(min_scale="1"),
        TypeError,
        "min_scale must be a real number",
    ),
    (
        "set_scale str",
        lambda w: w.state.set_scale("big"),
        TypeError,
        "new_scale must be a real number, got 'big'",
    ),
    (
        "FixedLossScale 0-d array",
        lambda w: lscore.FixedLossScale(np.array(2.0)),
        TypeError,
        r"loss_scale_value must be a real number, got array\(2\.\) \(ndarray\)",
    ),
    (
        "DynamicLossScale multiplier array",
        lambda w: lscore.DynamicLossScale(2, 2, np.array([2.0])),
        TypeError,
        "multiplier must be a real number",
    ),
    (
        "unscale_ inv_scale 0-d array",
        lambda w: lscore.unscale_(w.a, np.array(0.5)),
        TypeError,
        "inv_scale must be a real number",
    ),
    (
        "Policy guard_finite str",
        lambda w: Policy(guard_finite="yes"),
        TypeError,
        "guard_finite must be a bool",
    ),
    # intervals that are not integers (lscore's own API) or do not fit the core
    (
        "Policy growth_interval 2.5",
        lambda w: Policy(growth_interval=2.5),
        ValueError,
        "growth_interval must be a positive integer .*, got 2.5",
    ),
    (
        "Policy growth_interval '3'",
        lambda w: Policy(growth_interval="3"),
        TypeError,
        "growth_interval must be a positive integer .*, got '3'",
    ),
    (
        "Policy hysteresis True",
        lambda w: Policy(hysteresis=True),
        TypeError,
        "hysteresis must be an integer, got True",
    ),
    (
        "Policy growth_interval 10**30",
        lambda w: Policy(growth_interval=10**30),
        ValueError,
        "growth_interval must fit in a signed 64-bit integer",
    ),
    (
        "Policy growth_offset -1",
        lambda w: Policy(growth_offset=-1),
        ValueError,
        "growth_offset must be >= 0, got -1",
    ),
    (
        "Policy modulo interval 0",
        lambda w: Policy(growth_mode="modulo", growth_interval=0),
        ValueError,
        "growth_interval must be a positive integer .*, got 0",
    ),
    (
        "DynamicLossScale increment_period inf",
        lambda w: lscore.DynamicLossScale(2, INF),
        ValueError,
        "increment_period must be a positive integer .*, got inf",
    ),
    (
        "DynamicLossScale increment_period nan",
        lambda w: lscore.DynamicLossScale(2, NAN),
        ValueError,
        "increment_period must be a positive integer .*, got nan",
    ),
    (
        "DynamicLossScale increment_period 10**30",
        lambda w: lscore.DynamicLossScale(2, 10**30),
        ValueError,
        "increment_period must fit in a signed 64-bit",
    ),
    (
        "Manager decr_every 2**70",
        lambda w: lscore.ExponentialUpdateLossScaleManager(2, 2, 2**70),
        ValueError,
        "decr_every_n_nan_or_inf must fit",
    ),
    # growth or backoff factors on the wrong side of 1
    (
        "Policy growth_factor negative",
        lambda w: Policy(growth_factor=-2),
        ValueError,
        "growth_factor must be finite and >= 1, got -2",
    ),
    (
        "Policy growth_factor nan",
        lambda w: Policy(growth_factor=NAN),
        ValueError,
        "growth_factor must be finite and >= 1, got nan",
    ),
    (
        "Policy backoff_factor 0",
        lambda w: Policy(backoff_factor=0),
        ValueError,
        r"backoff_factor must be in \(0, 1\], got 0",
    ),
    (
        "Policy backoff_factor negative",
        lambda w: Policy(backoff_factor=-0.5),
        ValueError,
        r"backoff_factor must be in \(0, 1\], got -0.5",
    ),
    (
        "Manager incr_ratio 0.999",
        lambda w: lscore.ExponentialUpdateLossScaleManager(2, 2, incr_ratio=0.999),
        ValueError,
        "incr_ratio must be finite and >= 1",
    ),
    # unknown names
    (
        "get 'Dynamic'",
        lambda w: lscore.get("Dynamic"),
        ValueError,
        "Could not interpret loss scale identifier: Dynamic",
    ),
    (
        "get list",
        lambda w: lscore.get([2]),
        ValueError,
        r"Could not interpret loss scale identifier: \[2\]",
    ),
    (
        "get unknown class",
        lambda w: lscore.get({"class_name": "Foo", "config": {}}),
        ValueError,
        "Could not interpret",
    ),
    (
        "get bad config",
        lambda w: lscore.get({"class_name": "FixedLossScale", "config": {"loss_scale_value": 0.5}}),
        ValueError,
        "at least 1",
    ),
    (
        "from_config unknown key",
        lambda w: lscore.DynamicLossScale.from_config({"initial_loss_scale": 2, "bogus": 1}),
        TypeError,
        "bogus",
    ),
    (
        "from_config not a dict",
        lambda w: lscore.DynamicLossScale.from_config([2]),
        TypeError,
        "config must be a dict, got list",
    ),
    (
        "Policy precision",
        lambda w: Policy(precision="bfloat16"),
        ValueError,
        "unknown precision 'bfloat16'",
    ),
    (
        "Policy growth_mode",
        lambda w: Policy(growth_mode="sometimes"),
        ValueError,
        "unknown growth_mode 'sometimes'",
    ),
    (
        "Policy backoff_mode",
        lambda w: Policy(backoff_mode="subtract"),
        ValueError,
        "unknown backoff_mode 'subtract'",
    ),
    (
        "Policy min_action",
        lambda w: Policy(min_action="ignore"),
        ValueError,
        "unknown min_action 'ignore'",
    ),
    (
        "Policy refill",
        lambda w: Policy(refill=("sometimes",)),
        ValueError,
        "unknown refill 'sometimes'",
    ),
    ("Policy empty name", lambda w: Policy(name=""), TypeError, "name must be a non-empty string"),
    (
        "LossScaleState from a str",
        lambda w: LossScaleState("torch"),
        TypeError,
        "policy must be an lscore Policy, got str",
    ),
    # misuse of update(): not a bool, or gradients that are not arrays
    (
        "state update 'False'",
        lambda w: w.state.update("False"),
        TypeError,
        "finite must be a bool, got 'False'",
    ),
    (
        "state update None",
        lambda w: w.state.update(None),
        TypeError,
        "finite must be a bool, got None",
    ),
    (
        "state update 1",
        lambda w: w.state.update(1),
        TypeError,
        r"finite must be a bool, got 1 \(int\)",
    ),
    (
        "state update 2-element array",
        lambda w: w.state.update(np.array([True, True])),
        TypeError,
        "finite must be a bool",
    ),
    (
        "manager update 'True'",
        lambda w: w.mgr.update_loss_scale("True"),
        TypeError,
        "finite_grads must be a bool",
    ),
    (
        "manager update None",
        lambda w: w.mgr.update_loss_scale(None),
        TypeError,
        "finite_grads must be a bool",
    ),
    (
        "manager update float",
        lambda w: w.mgr.update_loss_scale(1.0),
        TypeError,
        "finite_grads must be a bool",
    ),
    (
        "dynamic update str",
        lambda w: w.dyn.update("abc"),
        TypeError,
        "unsupported array type builtins.str",
    ),
    (
        "dynamic update object",
        lambda w: w.dyn.update([np.ones(2), object()]),
        TypeError,
        "unsupported array type builtins.object",
    ),
    (
        "dynamic update complex",
        lambda w: w.dyn.update({"w": np.ones(2, complex)}),
        TypeError,
        "unsupported dtype complex128",
    ),
    (
        "dynamic update set",
        lambda w: w.dyn.update([np.ones(2), {1.0}]),
        TypeError,
        "unsupported array type builtins.set",
    ),
    # unsupported inputs of the scan
    (
        "all_finite generator",
        lambda w: lscore.all_finite(x for x in [w.a]),
        TypeError,
        "unsupported array type builtins.generator",
    ),
    (
        "all_finite bytearray",
        lambda w: lscore.all_finite(bytearray(b"ab")),
        TypeError,
        "unsupported array type builtins.bytearray",
    ),
    (
        "all_finite memoryview",
        lambda w: lscore.all_finite(memoryview(b"ab")),
        TypeError,
        "unsupported array type builtins.memoryview",
    ),
    (
        "all_finite Python complex",
        lambda w: lscore.all_finite([1.0, 2j]),
        TypeError,
        "unsupported array type builtins.complex",
    ),
    (
        "all_finite Fraction",
        lambda w: lscore.all_finite(Fraction(1, 2)),
        TypeError,
        "unsupported array type fractions.Fraction",
    ),
    (
        "all_finite numpy str scalar",
        lambda w: lscore.all_finite(np.str_("a")),
        TypeError,
        "unsupported array type numpy.str_",
    ),
    (
        "all_finite complex64 scalar",
        lambda w: lscore.all_finite(np.complex64(1)),
        TypeError,
        "unsupported dtype complex64",
    ),
    (
        "all_finite structured",
        lambda w: lscore.all_finite(np.zeros(2, [("x", "f4")])),
        TypeError,
        r"unsupported dtype \[\('x', '<f4'\)\]",
    ),
    (
        "all_finite datetime64",
        lambda w: lscore.all_finite(np.zeros(2, "M8[s]")),
        TypeError,
        r"unsupported dtype datetime64\[s\]",
    ),
    (
        "all_finite timedelta64",
        lambda w: lscore.all_finite(np.zeros(2, "m8[s]")),
        TypeError,
        r"unsupported dtype timedelta64\[s\]",
    ),
    (
        "all_finite unicode",
        lambda w: lscore.all_finite(np.array(["abc"])),
        TypeError,
        "unsupported dtype <U3",
    ),
    (
        "all_finite void",
        lambda w: lscore.all_finite(np.zeros(2, "V4")),
        TypeError,
        r"unsupported dtype \|V4",
    ),
    (
        "all_finite nested 70 deep",
        lambda w: lscore.all_finite(_nest(w.a, 70)),
        ValueError,
        "nested deeper than 64 levels",
    ),
    # unscale_ must write in place, once, to arrays it can write
    (
        "unscale_ same array twice",
        lambda w: lscore.unscale_([w.a, w.a], 0.5),
        ValueError,
        "arrays 0 and 1 .* overlap, so some elements would be multiplied twice",
    ),
    (
        "unscale_ overlapping views",
        lambda w: lscore.unscale_([w.c, {"k": w.c[1:]}], 0.5),
        ValueError,
        "do not share memory; arrays 0 and 1",
    ),
    (
        "unscale_ reversed view of the same",
        lambda w: lscore.unscale_([w.b, w.a, w.a[::-1]], 0.5),
        ValueError,
        "arrays 1 and 2",
    ),
    (
        "unscale_ float8 among others",
        lambda w: lscore.unscale_([w.a, np.zeros(3, ml.float8_e5m2)], 0.5),
        TypeError,
        "unscale_ does not support float8_e5m2",
    ),
    (
        "unscale_ datetime among others",
        lambda w: lscore.unscale_([w.a, w.b, np.zeros(2, "M8[s]")], 0.5),
        TypeError,
        "unsupported dtype datetime64",
    ),
    (
        "unscale_ Python int",
        lambda w: lscore.unscale_([w.a, 3], 0.5),
        TypeError,
        "cannot write to a Python int",
    ),
    (
        "unscale_ bytes",
        lambda w: lscore.unscale_([w.a, b"xy"], 0.5),
        TypeError,
        "unsupported array type builtins.bytes",
    ),
    (
        "unscale_ read-only last",
        lambda w: lscore.unscale_(w.arrays, 0.5),
        ValueError,
        "array 3 .* is read-only",
    ),
    (
        "unscale_ zero-stride after writable",
        lambda w: lscore.unscale_([w.a, as_strided(w.c, (3,), (0,), writeable=True)], 0.5),
        ValueError,
        "do not overlap",
    ),
    # state dicts with missing or wrongly typed keys, unknown keys, out-of-range values
    (
        "state not a dict",
        lambda w: w.dyn.load_state_dict(json.dumps(w.dyn.state_dict())),
        TypeError,
        "state must be a dict, got str",
    ),
    (
        "state None",
        lambda w: LossScaleState.from_state_dict(None),
        TypeError,
        "state must be a dict, got NoneType",
    ),
    (
        "state missing format",
        lambda w: w.dyn.load_state_dict(_state_with(lambda d: d.pop("format"))),
        ValueError,
        "unknown state format None",
    ),
    (
        "state missing policy",
        lambda w: w.dyn.load_state_dict(_state_with(lambda d: d.pop("policy"))),
        ValueError,
        "missing the key 'policy'",
    ),
    (
        "state missing scale",
        lambda w: w.dyn.load_state_dict(_state_with(lambda d: d.pop("scale"))),
        ValueError,
        "missing the key 'scale'",
    ),
    (
        "state scale negative",
        lambda w: w.dyn.load_state_dict(_state_with(_set("scale", -5.0))),
        ValueError,
        r"scale must be >= 0, 'inf' or 'nan', got -5.0",
    ),
    (
        "state scale '-inf'",
        lambda w: w.state.load_state_dict(_state_with(_set("scale", "-inf"))),
        ValueError,
        "scale must be >= 0",
    ),
    (
        "state scale bool",
        lambda w: w.dyn.load_state_dict(_state_with(_set("scale", True))),
        TypeError,
        "scale must be a number, got True",
    ),
    (
        "state scale None",
        lambda w: w.dyn.load_state_dict(_state_with(_set("scale", None))),
        TypeError,
        "scale must be a number, got None",
    ),
    (
        "state next_scale negative",
        lambda w: w.dyn.load_state_dict(_state_with(_set("next_scale", -1.0))),
        ValueError,
        "next_scale must be >= 0",
    ),
    (
        "state counters None",
        lambda w: w.dyn.load_state_dict(_state_with(_set("counters", None))),
        TypeError,
        "counters must be a dict, got NoneType",
    ),
    (
        "state counter float",
        lambda w: w.dyn.load_state_dict(_state_with(_set("counters.steps", 3.0))),
        TypeError,
        "counter steps must be an int, got 3.0",
    ),
    (
        "state counter bool",
        lambda w: w.dyn.load_state_dict(_state_with(_set("counters.skipped", False))),
        TypeError,
        "counter skipped must be an int, got False",
    ),
    (
        "state counter negative",
        lambda w: w.dyn.load_state_dict(_state_with(_set("counters.good_steps", -1))),
        ValueError,
        "must be >= 0",
    ),
    (
        "state counter 2**70",
        lambda w: w.dyn.load_state_dict(_state_with(_set("counters.steps", 2**70))),
        ValueError,
        r"counter steps must be at most 2\*\*62",
    ),
    (
        "state hysteresis_left -2**63",
        lambda w: w.state.load_state_dict(_state_with(_set("counters.hysteresis_left", -(2**63)))),
        ValueError,
        "counter hysteresis_left must be at most",
    ),
    (
        "state policy list",
        lambda w: w.dyn.load_state_dict(_state_with(_set("policy", [1]))),
        TypeError,
        "policy must be a dict, got list",
    ),
    (
        "state policy refill str",
        lambda w: w.dyn.load_state_dict(_state_with(_set("policy.refill", "backoff"))),
        TypeError,
        "refill must be a list, got 'backoff'",
    ),
    (
        "state policy factor str",
        lambda w: w.dyn.load_state_dict(_state_with(_set("policy.growth_factor", "2"))),
        TypeError,
        "growth_factor must be a real number",
    ),
    (
        "state policy interval 2**70",
        lambda w: w.dyn.load_state_dict(_state_with(_set("policy.growth_interval", 2**70))),
        ValueError,
        "growth_interval must fit",
    ),
    (
        "state policy name int",
        lambda w: w.dyn.load_state_dict(_state_with(_set("policy.name", 5))),
        TypeError,
        "name must be a non-empty string, got 5",
    ),
    (
        "state of another policy",
        lambda w: w.dyn.load_state_dict(w.mgr.state_dict()),
        ValueError,
        "saved by a different policy",
    ),
    (
        "manager given a TF2 state",
        lambda w: w.mgr.load_state_dict(w.dyn.state_dict()),
        ValueError,
        "saved by a different policy",
    ),
]


def _nest(x, depth):
    for _ in range(depth):
        x = [x]
    return x


def test_at_least_thirty_hostile_inputs():
    assert len(BAD) >= 30 and len({b[0] for b in BAD}) == len(BAD)


@pytest.mark.parametrize("call,exc,msg", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_and_changes_nothing(call, exc, msg):
    w = World()
    before = w.snapshot()
    with pytest.raises(exc, match=msg):
        call(w)
    assert w.snapshot() == before
    # the objects still work after the error, and as before it
    assert w.state.update(True) is True and w.dyn.update([w.a])[1] is True


# ---- valid but unusual inputs: the right answer, not an error ---------------


def _variants(dtype, rng):
    """Read-only, unaligned and byte-swapped versions of one array, some combined."""
    for bad in ([], [(0, None)], [(16, None)], [(32, None)]):
        for v in nonfinite_values(dtype)[: 1 if not bad else 3]:
            marks = [(i, v) for i, _ in bad]
            for layout in ("unaligned", "byteswapped", "strided", "reversed"):
                a = make_array(rng, dtype, 33, layout, marks)
                a.flags.writeable = False
                yield layout, a
            sw = make_array(rng, dtype, 33, "byteswapped", marks)
            raw = np.zeros(sw.nbytes + 1, np.uint8)
            both = raw[1:].view(sw.dtype)  # unaligned AND byte-swapped
            both[...] = sw
            both.flags.writeable = False
            yield "unaligned+byteswapped", both


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + FLOAT8_DTYPES, ids=str)
def test_readonly_unaligned_byteswapped_match_reference(dtype):
    rng = np.random.default_rng(11)
    answers = []
    for layout, a in _variants(dtype, rng):
        assert not a.flags.writeable
        want = ref.all_finite(a)
        assert lscore.all_finite(a) == want, (dtype, layout, a)
        assert lscore.all_finite([None, {"x": a}]) == want
        answers.append(want)
    assert True in answers and False in answers


def test_readonly_int_arrays_are_refused_by_unscale_as_integers():
    ints = np.arange(4, dtype=np.int32)
    ints.flags.writeable = False
    a = np.full(3, 4.0, np.float32)
    with pytest.raises(TypeError, match=r"array 1 .* is int32"):
        lscore.unscale_([a, ints], 0.5)
    assert np.all(a == 4) and np.all(ints == np.arange(4))


class _Sub(np.ndarray):
    pass


def test_container_subclasses_and_numpy_subclasses():
    bad = np.array([1.0, NAN])
    assert lscore.all_finite(collections.OrderedDict(a=np.ones(2))) is True
    assert lscore.all_finite(collections.defaultdict(list, a=[bad])) is False
    assert lscore.all_finite(np.array([[1.0, INF]]).view(_Sub)) is False
    # a masked NaN is still a NaN in the data the optimizer would apply
    assert lscore.all_finite(np.ma.masked_array(bad, mask=[0, 1])) is False
    assert lscore.all_finite([np.float16(INF)]) is False and lscore.all_finite([NAN]) is False


def test_more_than_2_31_elements_through_zero_stride_views():
    # 2**32 logical elements over 256 KiB: row 0 repeated 2**15 times, then row 1
    cols = 2**16
    base = np.ones((2, cols), np.float16)
    view = as_strided(base, shape=(2, 2**15, cols), strides=(base.strides[0], 0, 2))
    assert view.size == 2**32
    assert lscore.all_finite(view) is True
    base[1, 5] = np.nan  # first seen at flat index 2**31 + 5
    assert lscore.all_finite(view) is False
    assert lscore.all_finite(view[:1]) is True  # 2**31 elements, all finite
    base[1, 5] = -np.inf
    assert lscore.all_finite([np.ones(3), view]) is False
    one = as_strided(np.array([np.inf], np.float32), shape=(2**31 + 9,), strides=(0,))
    assert lscore.all_finite(one) is False


# ---- adapters and presets ---------------------------------------------------------------

PRESET_BAD = [
    (
        "preset unknown name",
        lambda: lscore.preset("bogus"),
        ValueError,
        "unknown preset 'bogus'; expected one of: apex",
    ),
    ("preset name not a str", lambda: lscore.preset(5), ValueError, "unknown preset 5"),
    (
        "preset unknown argument",
        lambda: lscore.preset("deepspeed", bogus=1),
        TypeError,
        "got an unexpected argument 'bogus'",
    ),
    (
        "preset missing argument",
        lambda: lscore.preset("jmp"),
        TypeError,
        "missing the required argument 'loss_scale'",
    ),
    (
        "preset interval 2.5",
        lambda: lscore.preset("torch", growth_interval=2.5),
        ValueError,
        "growth_interval must be a positive integer",
    ),
    (
        "preset init_scale nan",
        lambda: lscore.preset("torch", init_scale=NAN),
        ValueError,
        "init_scale must be finite and > 0",
    ),
    (
        "preset hysteresis 0",
        lambda: lscore.preset("megatron", hysteresis=0),
        ValueError,
        "hysteresis must be >= 1",
    ),
    (
        "migrate unknown peer",
        lambda: lscore.migrate.from_peer("bogus", {}),
        ValueError,
        "unknown peer 'bogus'",
    ),
    (
        "migrate unknown config key",
        lambda: lscore.migrate.from_peer("torch", {"scale": 2.0}),
        ValueError,
        "unknown keys in torch config: 'scale'",
    ),
    (
        "migrate to unknown peer",
        lambda: lscore.migrate.to_peer("bogus", lscore.preset("torch")),
        ValueError,
        "unknown peer 'bogus'",
    ),
]


@pytest.mark.parametrize(
    "call,exc,msg", [b[1:] for b in PRESET_BAD], ids=[b[0] for b in PRESET_BAD]
)
def test_bad_preset_and_migrate_inputs(call, exc, msg):
    w = World()
    before = w.snapshot()
    with pytest.raises(exc, match=msg):
        call()
    assert w.snapshot() == before


def _torch_world():
    torch = pytest.importorskip("torch")
    from lscore.adapters.torch import GradScaler

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = GradScaler("cpu", init_scale=2.0**8, growth_interval=2, hysteresis=2)
    for i in range(3):  # some history, then a scaled backward pass awaiting step()
        opt.zero_grad()
        s.scale(model(torch.ones(1, 3)).sum() * (float("inf") if i == 1 else 1)).backward()
        s.step(opt)
        s.update()
    opt.zero_grad()
    s.scale(model(torch.ones(1, 3)).sum()).backward()
    return torch, model, opt, s


def _torch_snapshot(model, s):
    return (
        json.dumps(s.state_dict()),
        json.dumps(s._state.state_dict()),
        [p.detach().clone().numpy().tobytes() for p in model.parameters()],
        [p.grad.clone().numpy().tobytes() for p in model.parameters()],
    )


_TSD = {
    "scale": 2.0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 5,
    "_growth_tracker": 0,
}

TORCH_BAD = [
    (
        "GradScaler load missing key",
        lambda t, m, o, s: s.load_state_dict({"growth_factor": 2.0}),
        ValueError,
        "the state dict lacks 'scale', 'backoff_factor'",
    ),
    (
        "GradScaler load lscore not a dict",
        lambda t, m, o, s: s.load_state_dict({**_TSD, "lscore": "x"}),
        TypeError,
        "state must be a dict, got str",
    ),
    (
        "GradScaler load factor str",
        lambda t, m, o, s: s.load_state_dict({**_TSD, "growth_factor": "2"}),
        TypeError,
        "growth_factor must be a real number",
    ),
    (
        "GradScaler load scale str",
        lambda t, m, o, s: s.load_state_dict({**_TSD, "scale": "2"}),
        TypeError,
        "scale must be a real number",
    ),
    (
        "GradScaler load tracker str",
        lambda t, m, o, s: s.load_state_dict({**_TSD, "_growth_tracker": "3"}),
        TypeError,
        "_growth_tracker must be an integer",
    ),
    (
        "GradScaler load tracker negative",
        lambda t, m, o, s: s.load_state_dict({**_TSD, "_growth_tracker": -1}),
        ValueError,
        "_growth_tracker must be >= 0",
    ),
    (
        "GradScaler load scale negative",
        lambda t, m, o, s: s.load_state_dict({**_TSD, "scale": -2.0}),
        ValueError,
        "scale must be >= 0",
    ),
    (
        "GradScaler new_scale on another device",
        lambda t, m, o, s: s.update(t.ones((), device="meta")),
        AssertionError,
        "new_scale should be a float or a 1-element",
    ),
    (
        "GradScaler new_scale nan",
        lambda t, m, o, s: s.update(NAN),
        ValueError,
        "new_scale must be finite and > 0, got nan",
    ),
    (
        "GradScaler new_scale negative",
        lambda t, m, o, s: s.update(-1.0),
        ValueError,
        "new_scale must be finite and > 0",
    ),
    (
        "GradScaler new_scale str",
        lambda t, m, o, s: s.update("2"),
        TypeError,
        "new_scale must be a float or a 1-element tensor, got str",
    ),
    (
        "core scan of a torch tensor",
        lambda t, m, o, s: lscore.all_finite([t.ones(2)]),
        TypeError,
        "unsupported array type torch.Tensor",
    ),
    (
        "GradScaler step with a closure",
        lambda t, m, o, s: s.step(o, closure=lambda: 0),
        RuntimeError,
        "Closure use is not currently supported",
    ),
]


@pytest.mark.parametrize("call,exc,msg", [b[1:] for b in TORCH_BAD], ids=[b[0] for b in TORCH_BAD])
def test_bad_torch_inputs_change_nothing(call, exc, msg):
    torch, model, opt, s = _torch_world()
    before = _torch_snapshot(model, s)
    with pytest.raises(exc, match=msg):
        call(torch, model, opt, s)
    assert _torch_snapshot(model, s) == before


def test_torch_call_order_misuse_changes_nothing():
    _torch, model, opt, s = _torch_world()
    s.unscale_(opt)
    before = _torch_snapshot(model, s)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        s.unscale_(opt)  # unscale_ twice: the grads are not divided again
    assert _torch_snapshot(model, s) == before
    s.step(opt)
    after_step = _torch_snapshot(model, s)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        s.step(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) is being called after step\\(\\)"):
        s.unscale_(opt)
    assert _torch_snapshot(model, s) == after_step
    from lscore.adapters.torch import GradScaler

    fresh = GradScaler("cpu")
    with pytest.raises(RuntimeError, match="Attempted step but _scale is None"):
        fresh.step(opt)  # step before scale
    with pytest.raises(RuntimeError, match="Attempted update but _scale is None"):
        fresh.update()
    assert fresh.get_scale() == 2.0**16


def test_float16_master_weights_error_says_what_to_do():
    torch = pytest.importorskip("torch")
    from lscore.adapters.torch import GradScaler

    m32, m16 = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2).half()
    opt = torch.optim.SGD(list(m32.parameters()) + list(m16.parameters()), lr=0.1)
    s = GradScaler("cpu")
    s.scale(m32(torch.ones(1, 3)).sum() + m16(torch.ones(1, 3).half()).float().sum()).backward()
    grads = [p.grad.clone() for p in opt.param_groups[0]["params"]]
    with pytest.raises(ValueError, match=r"^Attempting to unscale FP16 gradients\.") as e:
        s.step(opt)
    assert "keep float32 master weights" in str(e.value)  # the message itself says what to do
    assert "allow_fp16_params=True" in str(e.value)
    assert all(
        torch.equal(a, p.grad) for a, p in zip(grads, opt.param_groups[0]["params"], strict=True)
    )
    assert s.get_scale() == 2.0**16
    # the explicit opt-in unscales them (torch's own fused optimizers do the same)
    s = GradScaler("cpu", init_scale=16.0, allow_fp16_params=True)
    o16 = torch.optim.SGD(m16.parameters(), lr=0.1)
    o16.zero_grad()
    s.scale(m16(torch.ones(1, 3).half()).float().sum()).backward()
    s.step(o16)
    s.update()
    assert not s.last_step_skipped and s.get_scale() == 16.0


@pytest.mark.parametrize(
    "dtype,enabled", [("float16", True), ("bfloat16", False), ("float32", False)]
)
def test_enabled_auto(dtype, enabled):
    torch = pytest.importorskip("torch")
    import warnings

    from lscore.adapters.torch import GradScaler

    m = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    s = GradScaler("cpu", enabled="auto", init_scale=8.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=getattr(torch, dtype), enabled=dtype != "float32"):
                loss = m(torch.ones(2, 3)).float().sum()
            out = s.scale(loss)
            out.backward()
            s.step(opt)
            s.update()
    notices = [w for w in caught if "enabled='auto'" in str(w.message)]
    assert s.is_enabled() is enabled
    assert len(notices) == (0 if enabled else 1)
    assert s.get_scale() == (8.0 if enabled else 1.0)
    with pytest.raises(ValueError, match="enabled must be a bool or 'auto', got 'yes'"):
        GradScaler("cpu", enabled="yes")
