"""lscore.fp8.DelayedScaling: TE's worked values, the compiled state machine against the NumPy
twin on generated amaxes, micro-batches, the state format, validation and the reducer."""

import json
import math

import numpy as np
import pytest

from lscore import _reference_fp8 as ref
from lscore.distributed import MPIReducer, reduce_max
from lscore.fp8 import DelayedScaling, recipe

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given
from hypothesis import strategies as st

F32_MAX = float(np.finfo(np.float32).max)


def f32(*v):
    return np.array(v, np.float32)


def same(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (
        a.shape == b.shape
        and np.array_equal(np.isnan(a), np.isnan(b))
        and np.array_equal(a[~np.isnan(a)].view(np.uint32), b[~np.isnan(b)].view(np.uint32))
    )


def step(s, *amaxes, reducer=None):
    for a in amaxes:
        s.record(a)
    s.update(reducer)


# ---- TE's rules on the worked values (TE v2.18 delayed_scaling.cu:162-253) -------------------


def test_worked_scales_margin_and_overflow():
    s = DelayedScaling("te-delayed", 3)
    step(s, [3.0, 1e-39, 448.0])
    assert s.scale.view(np.uint32)[0] == 0x43155555  # 448 / 3 = 149.33333
    assert s.scale[1:].tolist() == [F32_MAX, 1.0]  # 448 / 1e-39 overflows: FLT_MAX
    inv = [float(np.float32(1) / s.scale[0]), float(1 / np.float32(F32_MAX)), 1.0]
    assert s.scale_inv.tolist() == inv
    m = DelayedScaling(recipe("te-delayed", margin=1), 1)
    step(m, [3.0])
    assert m.scale.tolist() == [float(np.float32(74.666664))]
    e5 = DelayedScaling("te-delayed", 2, formats="e5m2")
    step(e5, [1.0, 3.0])
    assert e5.scale.tolist() == [57344.0, float(np.float32(57344 / 3))]


def test_history_of_four_rolls_as_te_and_takes_the_max_before_the_roll():
    """Rows [a, h1, h2, h3] -> amax max(a, h1, h2, h3), rows [0, h2, h3, a]."""
    s = DelayedScaling(recipe("te-delayed", amax_history_len=4), 1)
    for a in (8.0, 2.0, 4.0):  # h3 = 8 after three steps... rolled up as TE rolls
        step(s, [a])
    assert s.amax_history[:, 0].tolist() == [0.0, 8.0, 2.0, 4.0]
    step(s, [1.0])  # h1 = 8 still counts, then drops out
    assert s.amax_history[:, 0].tolist() == [0.0, 2.0, 4.0, 1.0]
    assert s.scale[0] == 448.0 / 8.0
    step(s, [1.0])
    assert s.amax_history[:, 0].tolist() == [0.0, 4.0, 1.0, 1.0]
    assert s.scale[0] == float(np.float32(448.0 / 4.0))
    recent = DelayedScaling(
        recipe("te-delayed", amax_history_len=4, amax_compute_algo="most_recent"), 1
    )
    step(recent, [8.0])
    step(recent, [2.0])
    assert recent.scale[0] == 224.0


def test_zero_amax_keeps_rows_and_scale():
    s = DelayedScaling(recipe("te-delayed", amax_history_len=3), 2)
    step(s, [2.0, 4.0])
    rows, scale = s.amax_history, s.scale
    step(s, [0.0, 1.0])  # tensor 0 did not run: no roll, no change; tensor 1 rolls
    h = s.amax_history
    assert h[:, 0].tolist() == rows[:, 0].tolist() and s.scale[0] == scale[0] == 224.0
    assert h[:, 1].tolist() == [0.0, 4.0, 1.0]
    assert s.scale[1] == 112.0  # max(4, 1) over the history


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_non_finite_amax_keeps_the_scale(bad):
    s = DelayedScaling(
        recipe(
            "te-delayed", amax_history_len=2, amax_compute_algo="most_recent", amax_nan="propagate"
        ),
        1,
    )
    step(s, [2.0])
    step(s, [bad])
    assert s.scale[0] == 224.0 and same(s.amax_history[-1], f32(bad))


def test_max_skips_nan_in_the_history_as_fmaxf_does():
    s = DelayedScaling(recipe("te-delayed", amax_history_len=3, amax_nan="propagate"), 1)
    step(s, [2.0])
    step(s, [math.nan])  # the amax is max(NaN, 0, 2) with NaN skipped
    assert s.scale[0] == 224.0 and math.isnan(s.amax_history[-1, 0])
    step(s, [7.0])
    assert s.scale[0] == 64.0


def test_micro_batches_accumulate_by_max():
    s = DelayedScaling("te-delayed", 3)
    s.record([1.0, 8.0, 0.0])
    s.record([4.0, 2.0, 0.0])
    s.record([math.nan, 1.0, 0.0])  # NaN ignored under the TE recipe
    assert s.amax_history[0].tolist() == [4.0, 8.0, 0.0]
    s.update()
    assert s.amax_history[0].tolist() == [0.0, 0.0, 0.0]
    assert s.amax_history[-1].tolist() == [4.0, 8.0, 0.0]
    assert s.scale.tolist() == [112.0, 56.0, 1.0]
    p = DelayedScaling(recipe("te-delayed", amax_nan="propagate"), 1)
    p.record([math.nan])
    p.record([5.0])
    assert math.isnan(p.amax_history[0, 0])


# ---- the compiled state machine against the twin -----------------------------------------

AMAX = st.one_of(
    st.sampled_from(
        [
            0.0,
            -0.0,
            math.nan,
            math.inf,
            1e-39,
            1e-45,
            F32_MAX,
            3.0,
            448.0,
            2.0**-126,
            float(np.nextafter(np.float32(2.0**-126), np.float32(0))),
        ]
    ),
    st.floats(0, F32_MAX, width=32),
    st.integers(0, 0x7F800000).map(lambda b: float(np.uint32(b).view(np.float32))),
)


@given(
    data=st.data(),
    n=st.integers(1, 5),
    length=st.sampled_from([1, 2, 3, 4, 16]),
    algo=st.sampled_from(["max", "most_recent"]),
    margin=st.sampled_from([0, 1, 3, 9, 30]),
    nan=st.sampled_from(["ignore", "propagate"]),
)
def test_compiled_state_equals_the_twin(data, n, length, algo, margin, nan):
    r = recipe(
        "te-delayed", amax_history_len=length, amax_compute_algo=algo, margin=margin, amax_nan=nan
    )
    formats = data.draw(st.lists(st.sampled_from(["e4m3fn", "e5m2"]), min_size=n, max_size=n))
    s = DelayedScaling(r, n, formats)
    scaled = np.array(
        [ref.fp8_scaled_max({"e4m3fn": 448.0, "e5m2": 57344.0}[f], margin) for f in formats],
        np.float32,
    )
    h, scale = s.amax_history, s.scale
    for _ in range(data.draw(st.integers(1, 12))):
        for _ in range(data.draw(st.integers(0, 3))):
            a = np.array(data.draw(st.lists(AMAX, min_size=n, max_size=n)), np.float32)
            s.record(a)
            h = ref.fp8_delayed_record(h, a, nan == "propagate")
            assert same(s.amax_history, h)
        s.update()
        h, scale, inv = ref.fp8_delayed_update(h, scale, scaled, algo)
        assert same(s.amax_history, h), (s.amax_history, h)
        assert same(s.scale, scale) and same(s.scale_inv, inv), (s.scale, scale)


# ---- the state format ---------------------------------------------------------------------


def _stepped():
    s = DelayedScaling(
        recipe("te-delayed", amax_history_len=3, amax_nan="propagate"), 2, ["e4m3fn", "e5m2"]
    )
    step(s, [3.0, math.inf])
    step(s, [1e-39, 0.0])
    s.record([math.nan, 2.5])
    return s


def test_state_dict_round_trips_through_json_exactly():
    s = _stepped()
    d = json.loads(json.dumps(s.state_dict()))
    assert d["format"] == "lscore.fp8/1" and d["formats"] == ["e4m3fn", "e5m2"]
    t = DelayedScaling.from_state_dict(d)
    assert same(t.amax_history, s.amax_history) and same(t.scale, s.scale)
    assert same(t.scale_inv, s.scale_inv)
    step(s, [2.0, 2.0])
    step(t, [2.0, 2.0])
    assert same(t.amax_history, s.amax_history) and same(t.scale, s.scale)


def test_the_smallest_scale_a_margin_allows_saves_and_loads():
    """margin 30 and amax FLT_MAX: a subnormal scale (> 0) whose inverse is +Inf."""
    s = DelayedScaling(recipe("te-delayed", margin=30), 1)
    step(s, [F32_MAX])
    assert 0 < s.scale[0] < 2.0**-126 and s.scale_inv[0] == math.inf
    t = DelayedScaling.from_state_dict(json.loads(json.dumps(s.state_dict())))
    assert same(t.scale, s.scale) and same(t.scale_inv, s.scale_inv)


def _edit(d, **kw):
    d = json.loads(json.dumps(d))
    for k, v in kw.items():
        d[k] = v
    return d


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(format="lscore.state/1"), "the state's format must be 'lscore.fp8/1'"),
        (
            dict(recipe=recipe("te-delayed", amax_history_len=3).to_dict()),
            "the state was saved by a different recipe (amax_nan: 'ignore' != 'propagate')",
        ),
        (dict(n=3), "the state is of 3 tensors"),
        (dict(formats=["e4m3fn", "e4m3fn"]), "with formats ['e4m3fn', 'e4m3fn']"),
        (dict(scale=[1.0, "inf"]), "scale[1] must be finite and > 0 in float32, got inf"),
        (dict(scale=[1.0, "nan"]), "scale[1] must be finite and > 0 in float32, got nan"),
        (dict(scale=[0.0, 1.0]), "scale[0] must be finite and > 0 in float32, got 0.0"),
        (dict(scale=[-2.0, 1.0]), "scale[0] must be finite and > 0 in float32, got -2.0"),
        (dict(scale=[1e-50, 1.0]), "scale[0] must be finite and > 0 in float32, got 1e-50"),
        (dict(scale_inv=[1.0, "nan"]), "scale_inv[1] must be > 0 (finite or +Inf) in float32"),
        (dict(scale=[1.0]), "scale must be a list of 2 numbers"),
        (dict(scale=["x", 1.0]), "scale[0] must be a number or one of 'inf', '-inf', 'nan'"),
        (dict(amax_history=[[0.0, 0.0]]), "amax_history must be a list of 3 rows"),
        (
            dict(amax_history=[[0.0, 0.0], [0.0, -1.0], [0.0, 0.0]]),
            "amax_history[1] must be >= 0 (an amax), got np.float32(-1.0) at index 1",
        ),
        (
            dict(amax_history=[[0.0, 0.0], [0.0], [0.0, 0.0]]),
            "amax_history[1] must have shape (2,), got (1,)",
        ),
    ],
)
def test_a_bad_state_is_refused_before_anything_is_written(change, message):
    s = _stepped()
    before = s.state_dict()
    with pytest.raises(ValueError) as info:
        s.load_state_dict(_edit(before, **change))
    assert message in str(info.value)
    assert s.state_dict() == before


def test_from_state_dict_needs_the_recipe_n_and_formats():
    d = _stepped().state_dict()
    del d["formats"]
    with pytest.raises(ValueError, match="must hold the recipe, n and formats"):
        DelayedScaling.from_state_dict(d)


def test_another_recipe_or_n_is_refused():
    d = _stepped().state_dict()
    with pytest.raises(ValueError, match="different recipe"):
        DelayedScaling("te-delayed", 2, ["e4m3fn", "e5m2"]).load_state_dict(d)
    other = DelayedScaling(recipe("te-delayed", amax_history_len=3, amax_nan="propagate"), 3)
    with pytest.raises(ValueError, match="the state is of 2 tensors"):
        other.load_state_dict(d)


@pytest.mark.parametrize(
    "args, exc, message",
    [
        (
            ("te-current", 2),
            ValueError,
            "recipe must be a delayed-scaling recipe, got 'te-current' with scaling='current'",
        ),
        (("te-delayed", 0), ValueError, "n must be >= 1, got 0"),
        (("te-delayed", 2, ["e4m3fn"]), ValueError, "formats must name 2 formats, got 1"),
        (("te-delayed", 1, "e4m3"), ValueError, "unknown formats[i] 'e4m3'"),
        ((3, 1), TypeError, "recipe must be a Recipe or a recipe name, got int"),
    ],
)
def test_bad_construction_is_refused(args, exc, message):
    with pytest.raises(exc) as info:
        DelayedScaling(*args)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "amaxes, exc, message",
    [
        ([1.0], ValueError, "amaxes must have shape (2,), got (1,)"),
        ([1.0, -2.0], ValueError, "amaxes must be >= 0 (an amax), got np.float32(-2.0) at index 1"),
        ([1.0, -math.inf], ValueError, "amaxes must be >= 0"),
        (["a", "b"], TypeError, "amaxes must be real numbers, got dtype <U1"),
    ],
)
def test_bad_amaxes_are_refused_before_anything_is_written(amaxes, exc, message):
    s = DelayedScaling("te-delayed", 2)
    s.record([1.0, 1.0])
    with pytest.raises(exc) as info:
        s.record(amaxes)
    assert message in str(info.value)
    assert s.amax_history[0].tolist() == [1.0, 1.0]


# ---- one reducer call per update --------------------------------------------------------


class TwoRankComm:
    """An MPI communicator of two ranks whose other rank reports the amaxes `theirs`:
    Allgather fills rank 1's row as that rank's reducer would have packed it."""

    def __init__(self, theirs):
        self.theirs, self.calls = theirs, 0

    def Get_size(self):
        return 2

    def Allgather(self, mine, rows):
        self.calls += 1
        rows[0] = mine
        rows[1] = [0.0, *self.theirs]

    def Allreduce(self, *args, **kwargs):
        raise AssertionError("the amaxes travel in one all-gather")


def test_update_agrees_on_the_amaxes_through_one_reducer_call():
    pytest.importorskip("mpi4py")  # MPIReducer reads MPI's op names (make test installs it)
    comm = TwoRankComm([4.0, 0.0, 1.0, math.nan])
    s = DelayedScaling(recipe("te-delayed", amax_history_len=2, amax_nan="propagate"), 4)
    s.record([1.0, 0.0, 8.0, 1.0])
    s.update(MPIReducer(comm))
    assert comm.calls == 1
    # the other rank's larger amax wins; a tensor that ran nowhere keeps its scale; NaN wins
    assert s.amax_history[-1, :3].tolist() == [4.0, 0.0, 8.0]
    assert math.isnan(s.amax_history[-1, 3])
    assert s.scale[:3].tolist() == [112.0, 1.0, 56.0] and s.scale[3] == 1.0


def test_update_all_agrees_on_every_state_through_one_reducer_call():
    """Two states (4 and 2 tensors) in one MPI all-gather; each ends bitwise as when updated
    alone with the other rank's amaxes of its own tensors."""
    pytest.importorskip("mpi4py")
    theirs = [4.0, 0.0, 1.0, math.nan, 3.0, 0.5]
    comm = TwoRankComm(theirs)
    r = recipe("te-delayed", amax_history_len=2, amax_nan="propagate")
    a, b = DelayedScaling(r, 4), DelayedScaling(r, 2, "e5m2")
    a.record([1.0, 0.0, 8.0, 1.0])
    b.record([2.0, 7.0])
    DelayedScaling.update_all([a, b], MPIReducer(comm))
    assert comm.calls == 1
    for s, mine, other in ((a, [1.0, 0.0, 8.0, 1.0], theirs[:4]), (b, [2.0, 7.0], theirs[4:])):
        alone = DelayedScaling(r, s.n, s.formats)
        alone.record(mine)
        alone.update(MPIReducer(TwoRankComm(other)))
        assert same(s.scale, alone.scale) and same(s.scale_inv, alone.scale_inv)
        assert same(s.amax_history, alone.amax_history)
    assert b.scale.tolist() == [np.float32(57344) / np.float32(3), 8192.0]


class Failing:
    def reduce(self, found_inf, stats=None):
        raise RuntimeError("a peer died")


def test_update_all_checks_first_and_changes_nothing_when_the_reducer_fails():
    a, b = DelayedScaling("te-delayed", 2), DelayedScaling("te-delayed", 1)
    a.record([3.0, 1.0])
    b.record([2.0])
    with pytest.raises(RuntimeError, match="a peer died"):
        DelayedScaling.update_all([a, b], Failing())
    with pytest.raises(ValueError, match="states must hold each state once"):
        DelayedScaling.update_all([a, b, a])
    with pytest.raises(TypeError, match=r"states\[1\] must be a DelayedScaling, got str"):
        DelayedScaling.update_all([a, "b"])
    with pytest.raises(TypeError, match="reducer must have a method reduce"):
        DelayedScaling.update_all([a], object())
    assert a.amax_history[0].tolist() == [3.0, 1.0] and b.amax_history[0].tolist() == [2.0]
    assert a.scale.tolist() == [1.0, 1.0] and b.scale.tolist() == [1.0]
    DelayedScaling.update_all([a, b])
    assert a.scale.tolist() == [np.float32(448) / np.float32(3), 448.0]
    assert b.scale.tolist() == [224.0]
    DelayedScaling.update_all([], Failing())  # nothing to agree on: no call


def test_reduce_max_keeps_dtype_and_shape():
    class Max:
        def reduce(self, found_inf, stats=None):
            return found_inf, {k: max(v, 2.0) for k, v in stats.items()}

    got = reduce_max(Max(), f32(1.0, 3.0))
    assert got.dtype == np.float32 and got.tolist() == [2.0, 3.0]
    assert reduce_max(None, f32(1.0)).tolist() == [1.0]
    with pytest.raises(TypeError, match="reducer must have a method reduce"):
        DelayedScaling("te-delayed", 1).update(object())
