"""The compiled state machine against lscore._reference.update on generated policies and events."""

import math

import numpy as np
import pytest

from helpers.gen import event_sequence, random_policy
from lscore import LossScaleFloorError, LossScaleState, Policy
from lscore import _reference as ref

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given
from hypothesis import strategies as st


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (
        a == b and math.copysign(1, a) == math.copysign(1, b)
    )


def run_both(policy: Policy, events, label=""):
    st_ = LossScaleState(policy)
    r = ref.RefState.initial(policy)
    for i, finite in enumerate(events):
        r, code = ref.update(r, finite)
        try:
            got = st_.update(finite)
            got_code = 1 if got else 0
        except LossScaleFloorError:
            got_code = -1
        c = st_.counters()
        ctx = f"{label} step {i} events {events[: i + 1]} policy {policy}"
        assert got_code == code, ctx
        assert same(st_.scale, r.scale), (st_.scale, r.scale, ctx)
        if policy.apply_next:
            assert same(st_._cy.next_scale, r.next_scale), ctx
        assert c == {k: getattr(r, k) for k in c}, (c, r, ctx)


def test_generated_sequences_match_reference():
    """1,000 seeded policies, each driven by a generated event sequence."""
    rng = np.random.default_rng(20261122)
    for case in range(1000):
        policy = random_policy(rng)
        events = event_sequence(rng, int(rng.integers(1, 120)))
        run_both(policy, events, label=f"seed 20261122 case {case}")


@given(seed=st.integers(0, 2**32 - 1), events=st.lists(st.booleans(), min_size=1, max_size=80))
def test_hypothesis_sequences_match_reference(seed, events):
    run_both(random_policy(np.random.default_rng(seed)), events, label=f"seed {seed}")


def test_floor_error_leaves_state_untouched():
    p = Policy(
        name="ds",
        init_scale=2.0,
        min_scale=1.0,
        min_action="raise_at",
        backoff_mode="divide",
        precision="float64",
        growth_interval=1000,
    )
    s = LossScaleState(p)
    assert not s.update(False)
    assert s.scale == 1.0
    before = s.state_dict()
    with pytest.raises(LossScaleFloorError):
        s.update(False)
    assert s.state_dict() == before
