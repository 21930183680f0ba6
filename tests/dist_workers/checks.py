"""Assertions on the records that every rank wrote (scenarios.py), for any transport.

Expected values come from the inputs each rank recorded and from
lscore._reference (the scale sequence of the global decisions).
"""
from __future__ import annotations

import math

import scenarios
from lscore import Policy
from lscore import _reference as ref


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
    """Sums added and maxima maxed in rank order: the rule the reducers promise.

    (With two ranks, a + b is the one correctly rounded sum, whatever the order.)
    """
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


def check_nan_one_rank(recs: list[dict]) -> None:
    """Every rank skips exactly the faulty steps of any rank, and holds the reference scale."""
    bad = set().union(*scenarios.NAN_STEPS.values())
    state = ref.RefState.initial(Policy(**scenarios.POLICY))
    for step in range(scenarios.N_NAN_STEPS):
        state, applied = ref.update(state, step not in bad)
        for rank, rec in enumerate(recs):
            s = rec["nan_one_rank"]["steps"][step]
            assert s["found"] == (step in scenarios.NAN_STEPS.get(rank, ())), (rank, step, s)
            assert s["global"] == (step in bad), (rank, step, s)
            assert s["applied"] == bool(applied) == (step not in bad), (rank, step, s)
            assert s["scale"] == state.scale, (rank, step, s, state.scale)
            assert s["collectives"] == 1, (rank, step, s)
    assert all(same(r["nan_one_rank"]["counters"], recs[0]["nan_one_rank"]["counters"])
               for r in recs)


def check_control_diverges(recs: list[dict]) -> None:
    """Without the reducer the same runs drift apart: the scenarios can see a bug."""
    scales = [[s["scale"] for s in r["nan_one_rank_control"]["steps"]] for r in recs]
    assert any(sc != scales[0] for sc in scales[1:])
    assert any(r["replicated_control"]["w"] != recs[0]["replicated_control"]["w"]
               for r in recs[1:])
    assert any(r["sharded_control"]["scale"] != recs[0]["sharded_control"]["scale"]
               for r in recs[1:])


def check_replicated(recs: list[dict]) -> None:
    """50 steps, random rank-local faults: identical parameters and state on every rank."""
    runs = [r["replicated"] for r in recs]
    first = runs[0]
    for run in runs[1:]:
        assert run["w"] == first["w"]
        assert run["scale"] == first["scale"]
        assert run["counters"] == first["counters"]
    any_found = [any(run["found"][s] for run in runs) for s in range(scenarios.N_STEPS)]
    for run in runs:
        assert run["decisions"] == any_found
        assert all(run["found"][s] for s in run["faults"])
    assert first["counters"]["skipped"] == sum(any_found)
    # the run is a real test: some step had a fault on one rank only, and some steps applied
    assert any(sum(run["found"][s] for run in runs) == 1 for s in range(scenarios.N_STEPS))
    assert 0 < sum(any_found) < scenarios.N_STEPS


def check_sharded(recs: list[dict]) -> None:
    """FSDP-style: each rank checks its shard, one collective decides and brings the norm."""
    runs = [r["sharded"] for r in recs]
    for run in runs[1:]:
        assert run["w"] == runs[0]["w"]
        assert run["scale"] == runs[0]["scale"]
        assert run["counters"] == runs[0]["counters"]
    n_one = 0
    for step in range(scenarios.N_STEPS):
        steps = [run["steps"][step] for run in runs]
        found = any(s["found"] for s in steps)
        n_one += sum(s["found"] for s in steps) == 1
        exp = dict(zip(("sumsq", "max_abs"),
                       _fold([[s["local"]["sumsq"], s["local"]["max_abs"]] for s in steps],
                             ["sum", "max"])))
        for s in steps:
            assert s["global"] == found and s["applied"] == (not found), (step, s)
            assert s["collectives"] == 1, (step, s)
            assert same(s["stats"], exp), (step, s["stats"], exp)
    assert n_one > 0
