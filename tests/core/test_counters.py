"""What the counters count, under the names they are read by, and how far the next growth is."""

import contextlib

import numpy as np
import pytest

import lscore
from helpers.gen import event_sequence, random_policy
from lscore import LossScaleFloorError, LossScaleState


def test_overflows_since_backoff_is_not_a_total():
    """Three overflows, each backed off at once (torch): skipped counts them, the counter
    named for fairseq's tolerance is emptied by every backoff."""
    ls = lscore.preset("torch", growth_interval=2000)
    for finite in (False, True, False, False):
        ls.state.update(finite)
    c = ls.counters()
    assert "overflows" not in c
    assert (c["skipped"], c["steps"], c["overflows_since_backoff"]) == (3, 4, 0)
    tolerant = lscore.preset("fairseq", tolerance=0.5, scale_window=100)
    for finite in (True, True, True, False):  # 1 overflow in 4 steps: below the tolerance
        tolerant.state.update(finite)
    assert tolerant.counters()["overflows_since_backoff"] == 1
    assert tolerant() == tolerant.state.policy.init_scale


def test_a_state_saved_with_the_old_counter_name_loads():
    """lscore 0.1's v1 states named overflows_since_backoff "overflows"."""
    ls = lscore.preset("fairseq", tolerance=0.5, scale_window=100)
    for finite in (True, True, True, False):
        ls.state.update(finite)
    d = ls.state_dict()
    d["counters"]["overflows"] = d["counters"].pop("overflows_since_backoff")
    back = LossScaleState.from_state_dict(d)
    assert back.counters() == ls.counters()
    d["counters"]["overflows_since_backoff"] = 1
    with pytest.raises(ValueError, match="'overflows' and its new name"):
        LossScaleState.from_state_dict(d)


def _grows(state: LossScaleState) -> bool:
    """One finite update; whether it was a growth (a growth restarts since_rescale)."""
    state.update(True)
    return state.counters()["since_rescale"] == 0


@pytest.mark.parametrize("seed", range(300))
def test_steps_to_growth_is_when_the_policy_grows(seed):
    """After any history, the policy grows after exactly steps_to_growth() finite steps in a
    row; None: not within many steps."""
    rng = np.random.default_rng(seed)
    policy = random_policy(rng)
    state = LossScaleState(policy)
    for finite in event_sequence(rng, int(rng.integers(0, 30))):
        with contextlib.suppress(LossScaleFloorError):
            state.update(finite)
    n = state.steps_to_growth()
    if n is None:
        if policy.growth_mode != "never":  # never counts since_rescale: nothing to watch
            assert policy.growth_mode == "eq", policy
            assert not any(_grows(state) for _ in range(50)), policy
        return
    assert n >= 1
    assert [_grows(state) for _ in range(n)] == [False] * (n - 1) + [True], (n, policy)
