"""Assertions on the records that every rank wrote (scenarios.py), for any transport.

Expected values come from the inputs each rank recorded and from
lscore._reference (the scale sequence of the global decisions).
"""
from __future__ import annotations

import math

import numpy as np

import lscore
from lscore import Policy
from lscore import _reference as ref

from helpers.dist import scenarios


def same(a, b) -> bool:
    """Equality where NaN equals NaN (bit-identical floats across ranks)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def _fold(rows, keys):
    """Sums added in rank order and maxima maxed (NaN wins): the rule the reducers promise."""
    out = []
    for i, key in enumerate(keys):
        column = [row[i] for row in rows]
        if key.startswith("sum"):
            out.append(sum(column))
        else:
            out.append(math.nan if any(map(math.isnan, column)) else max(column))
    return out


def expected_basic(world: int) -> dict:
    """What every rank must get for each scenarios.BASIC_CASES case."""
    exp = {}
    for name, flag, stats in scenarios.BASIC_CASES:
        found = any(flag(r) for r in range(world))
        if stats is None:
            exp[name] = (found, None, "NoneType")
            continue
        inputs = [stats(r) for r in range(world)]
        if isinstance(inputs[0], dict):
            keys = list(inputs[0])
            exp[name] = (found, dict(zip(keys, _fold([[d[k] for k in keys] for d in inputs],
                                                        keys))), "dict")
        else:
            exp[name] = (found, _fold(inputs, ["sum", "max"]), "tuple")
    return exp


def check_reduce_basic(recs: list[dict]) -> None:
    world = len(recs)
    for name, (found, stats, kind) in expected_basic(world).items():
        for rank, rec in enumerate(recs):
            got = rec["reduce_basic"][name]
            assert got["found"] is found, (name, rank, got)
            assert got["stats_type"] == kind, (name, rank, got)
            assert same(got["stats"], stats), (name, rank, got["stats"], stats)
            assert got["collectives"] == 1, (name, rank, got)


class _Agreed:
    """A reducer that answers the maxima `agreed` (the group's, computed from the records)."""

    def __init__(self, agreed):
        self.agreed = agreed

    def reduce(self, found_inf, stats=None):
        return found_inf, {k: float(v) for k, v in zip(stats, self.agreed)}


def check_fp8_delayed(recs: list[dict]) -> None:
    """One collective per step for all three states, and on every rank the scales and history
    of states updated alone with the elementwise MAX of all ranks' amaxes (NaN wins)."""
    from lscore.fp8 import DelayedScaling, recipe

    r = recipe("te-delayed", amax_history_len=3, amax_nan="propagate")
    twins = [DelayedScaling(r, n) for n in scenarios.FP8_TENSORS]
    nan_seen = False
    for step in range(scenarios.FP8_STEPS):
        rows = [rec["fp8_delayed"]["steps"][step] for rec in recs]
        for k, twin in enumerate(twins):
            mine = [np.frombuffer(bytes.fromhex(row["amaxes"][k]), np.float32) for row in rows]
            twin.record(mine[0])
            agreed = np.max(mine, axis=0)  # NaN wins, as the reducers fold a maximum
            nan_seen |= bool(np.isnan(agreed).any())
            twin.update(_Agreed(agreed))
        for rank, row in enumerate(rows):
            assert row["collectives"] == 1, (rank, step, row["collectives"])
            assert row["scale"] == [scenarios.hexs(t.scale) for t in twins], (rank, step)
            assert row["history"] == [scenarios.hexs(t.amax_history) for t in twins], (rank, step)
    assert nan_seen and any((t.scale != 1).all() for t in twins)


def core_policy() -> Policy:
    return Policy(**scenarios.POLICY)


def keras_policy() -> Policy:
    """The policy of the NumPy adapter's Keras-shaped optimizer with the scenarios' numbers."""
    return lscore.DynamicLossScale(scenarios.POLICY["init_scale"],
                                   scenarios.POLICY["growth_interval"], 2.0).state.policy


def check_nan_one_rank(recs: list[dict], key: str, policy: Policy) -> None:
    """Every rank skips exactly the faulty steps of any rank, and holds the reference scale."""
    bad = set().union(*scenarios.NAN_STEPS.values())
    state = ref.RefState.initial(policy)
    for step in range(scenarios.N_NAN_STEPS):
        state, applied = ref.update(state, step not in bad)
        for rank, rec in enumerate(recs):
            s = rec[key]["steps"][step]
            assert s["found"] == (step in scenarios.NAN_STEPS.get(rank, ())), (rank, step, s)
            assert s.get("global", step in bad) == (step in bad), (rank, step, s)
            assert s["applied"] == bool(applied) == (step not in bad), (rank, step, s)
            assert s["scale"] == state.scale, (rank, step, s, state.scale)
            assert s.get("collectives", 1) == 1, (rank, step, s)
    for rec in recs[1:]:
        assert rec[key]["counters"] == recs[0][key]["counters"]
        assert rec[key]["w"] != recs[0][key]["w"]     # each rank had its own gradient


def check_control_diverges(recs: list[dict]) -> None:
    """Without the reducer the same runs drift apart: the scenarios can see a bug."""
    scales = [[s["scale"] for s in r["nan_one_rank_control"]["steps"]] for r in recs]
    assert any(sc != scales[0] for sc in scales[1:])
    assert any(r["replicated_control"]["w"] != recs[0]["replicated_control"]["w"]
               for r in recs[1:])
    assert any(r["sharded_control"]["scale"] != recs[0]["sharded_control"]["scale"]
               for r in recs[1:])


def check_random_faults(recs: list[dict], key: str) -> None:
    """50 steps, random rank-local faults: identical parameters and state on every rank.

    Sharded runs also check that one collective per step brought the verdict
    and the global statistics.
    """
    runs = [r[key] for r in recs]
    first = runs[0]
    for run in runs[1:]:
        assert run["w"] == first["w"]
        assert run["scale"] == first["scale"]
        assert run["counters"] == first["counters"]
    n_one = n_bad = 0
    for step in range(scenarios.N_STEPS):
        steps = [run["steps"][step] for run in runs]
        found = any(s["found"] for s in steps)
        n_one += sum(s["found"] for s in steps) == 1
        n_bad += found
        if "local" in steps[0]:
            exp = dict(zip(("sumsq", "max_abs"),
                           _fold([[s["local"]["sumsq"], s["local"]["max_abs"]] for s in steps],
                                 ["sum", "max"])))
        for s in steps:
            assert s["applied"] == (not found), (step, s)
            assert s.get("global", found) == found, (step, s)
            assert s.get("collectives", 1) == 1, (step, s)
            if "local" in s:
                assert same(s["stats"], exp), (step, s["stats"], exp)
    for run in runs:
        assert all(run["steps"][s]["found"] for s in run["faults"])
    # a real test: some step had a fault on one rank only, and some steps applied
    assert n_one > 0 and 0 < n_bad < scenarios.N_STEPS
    assert all(np.isfinite(run["loss"]) for run in runs)


def _nan(key, policy):
    return lambda recs: check_nan_one_rank(recs, key, policy())


def _faults(key):
    return lambda recs: check_random_faults(recs, key)


CORE = {
    "or_and_stats_in_one_collective": check_reduce_basic,
    "fp8_amaxes_of_all_states_in_one_collective": check_fp8_delayed,
    "core_nan_on_one_rank_all_skip_same_scale": _nan("nan_one_rank", core_policy),
    "core_50_steps_random_faults_identical_params": _faults("replicated"),
    "core_sharded_one_collective_decides": _faults("sharded"),
    "core_without_reducer_ranks_diverge": check_control_diverges,
}
# the policy each adapter's stepper runs with the scenarios' numbers
ADAPTER_POLICIES = {"numpy": keras_policy, "torch": core_policy,
                    "torch_optimizer": keras_policy}


def cases(adapters=("numpy",)) -> dict:
    """test id -> check, for the core and the given adapters' records."""
    out = dict(CORE)
    for name in adapters:
        out[f"{name}_adapter_nan_on_one_rank_all_skip_same_scale"] = _nan(
            f"{name}_nan_one_rank", ADAPTER_POLICIES[name])
        out[f"{name}_adapter_50_steps_random_faults_identical_params"] = _faults(
            f"{name}_replicated")
        out[f"{name}_adapter_sharded"] = _faults(f"{name}_sharded")
    return out
