"""Training scenarios every worker runs, whatever carries its collectives.

A worker (torch_worker.py, mpi_worker.py) wraps its transport in a `Group`:
``rank``, ``size``, ``allreduce_sum(a)``, ``allgather(a) -> (size, n)``,
``reducer`` (the lscore reducer under test) and ``collectives`` (how many
collectives the reducer has issued so far).  Each scenario returns a
JSON-able record; the tests compare the records of all ranks.

The faults are rank-local on purpose: gradients are already averaged when a
rank's own copy (or its own shard) turns non-finite, so only the reducer can
make the other ranks skip too.
"""
from __future__ import annotations

import numpy as np

import lscore
from lscore import LossScaleState, Policy

POLICY = dict(init_scale=2.0 ** 10, growth_interval=3)   # torch rules, fast growth
NAN_STEPS = {0: (7,), 1: (1, 5)}                          # rank -> steps with a fault
N_NAN_STEPS = 10
N_STEPS, DIM, LR, FAULT_P, MAX_NORM = 50, 8, 0.05, 0.15, 5.0
BASIC_CASES = [
    ("rank1_inf", lambda r: r == 1, None),
    ("rank0_inf", lambda r: r == 0, None),
    ("none_inf", lambda r: False, None),
    ("all_inf", lambda r: True, None),
    ("dict", lambda r: r == 1, lambda r: {"sumsq": 1.5 + r, "max_abs": 4.0 - r,
                                          "max_step": float(r), "sum_n": 3.0}),
    ("tuple", lambda r: False, lambda r: (0.1 * (r + 1), 2.0 ** r)),
    ("tuple_nan", lambda r: False, lambda r: (1.0, float("nan") if r else 1.0)),
]


def hexs(a: np.ndarray) -> str:
    """The exact bytes of an array, to compare ranks bit for bit."""
    return np.ascontiguousarray(a).tobytes().hex()


def _decide(group, found, stats=None, reducer=True):
    """(global found, global stats, collectives issued) for one step."""
    if not reducer:
        return found, stats, 0
    before = group.collectives
    g_found, g_stats = group.reducer.reduce(found, stats)
    return g_found, g_stats, group.collectives - before


def reduce_basic(group) -> dict:
    """Each reducer case with this rank's inputs and the reduced outputs."""
    out = {}
    for name, flag, stats in BASIC_CASES:
        s = None if stats is None else stats(group.rank)
        found, g_stats, n = _decide(group, flag(group.rank), s)
        out[name] = {"found": found, "stats": g_stats, "collectives": n,
                     "stats_type": type(g_stats).__name__}
    return out


def _fault(rng: np.random.Generator, a: np.ndarray) -> None:
    a[rng.integers(a.size)] = rng.choice([np.nan, np.inf, -np.inf])


def nan_one_rank(group, reducer=True) -> dict:
    """A NaN/Inf on one rank at fixed steps; every step's decision and scale."""
    state = LossScaleState(Policy(**POLICY))
    grad0 = np.linspace(-1, 1, 16, dtype=np.float32) * (group.rank + 1)
    steps = []
    for step in range(N_NAN_STEPS):
        g = (grad0 * np.float32(state.scale)).astype(np.float32)
        if step in NAN_STEPS.get(group.rank, ()):
            g[3] = np.nan if group.rank else np.inf
        found = not lscore.unscale_(g, 1.0 / state.scale)
        g_found, _, n = _decide(group, found, reducer=reducer)
        applied = state.update(not g_found)
        steps.append({"found": found, "global": g_found, "applied": applied,
                      "scale": state.scale, "collectives": n})
    return {"steps": steps, "counters": state.counters()}


def _data(rank: int):
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal((32, DIM)).astype(np.float32)
    return x, (x @ np.arange(1, DIM + 1, dtype=np.float32) * np.float32(0.1)).astype(np.float32)


def _local_grad(x, y, w, scale: float) -> np.ndarray:
    """The scaled gradient of this rank's mean squared error, backward pass in float16."""
    err = ((x @ w - y) / np.float32(len(y))).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        g16 = x.T.astype(np.float16) @ (err * np.float32(scale)).astype(np.float16)
    return g16.astype(np.float32)


def replicated_random_faults(group, reducer=True) -> dict:
    """DDP-style: averaged gradients, then random rank-local faults, N_STEPS steps."""
    state = LossScaleState(Policy(**POLICY))
    x, y = _data(group.rank)
    rng = np.random.default_rng(1000 + group.rank)
    w = np.zeros(DIM, np.float32)
    faults, found_steps, decisions = [], [], []
    for step in range(N_STEPS):
        g = group.allreduce_sum(_local_grad(x, y, w, state.scale)) / np.float32(group.size)
        if rng.random() < FAULT_P:
            _fault(rng, g)
            faults.append(step)
        found = not lscore.unscale_(g, 1.0 / state.scale)
        g_found, _, _ = _decide(group, found, reducer=reducer)
        if state.update(not g_found):
            w -= np.float32(LR) * g
        found_steps.append(found)
        decisions.append(g_found)
    return {"w": hexs(w), "scale": state.scale, "counters": state.counters(),
            "faults": faults, "found": found_steps, "decisions": decisions,
            "loss": float(np.mean((x @ w - y) ** 2))}


def sharded_random_faults(group, reducer=True) -> dict:
    """FSDP-style: each rank checks and updates its own shard; one collective decides.

    The same collective brings the global sum of squares and maximum for
    clipping by the global norm, as FSDP's clip_grad_norm_ needs.
    """
    state = LossScaleState(Policy(**POLICY))
    x, y = _data(group.rank)
    rng = np.random.default_rng(2000 + group.rank)
    w = np.zeros(DIM, np.float32)
    n = DIM // group.size
    lo = group.rank * n
    faults, steps = [], []
    for step in range(N_STEPS):
        full = group.allreduce_sum(_local_grad(x, y, w, state.scale)) / np.float32(group.size)
        shard = full[lo:lo + n].copy()           # the reduce-scatter result of this rank
        if rng.random() < FAULT_P:
            _fault(rng, shard)
            faults.append(step)
        found = not lscore.unscale_(shard, 1.0 / state.scale)
        with np.errstate(invalid="ignore", over="ignore"):
            stats = {"sumsq": float(np.sum(shard.astype(np.float64) ** 2)),
                     "max_abs": float(np.max(np.abs(shard)))}
        g_found, g_stats, ncoll = _decide(group, found, stats, reducer=reducer)
        applied = state.update(not g_found)
        if applied:
            norm = np.sqrt(g_stats["sumsq"])
            coef = np.float32(min(1.0, MAX_NORM / (norm + 1e-6)))
            mine = w[lo:lo + n] - np.float32(LR) * coef * shard
        else:
            mine = w[lo:lo + n]
        w = group.allgather(np.ascontiguousarray(mine, dtype=np.float32)).reshape(-1)
        steps.append({"found": found, "global": g_found, "applied": applied,
                      "local": stats, "stats": g_stats, "collectives": ncoll})
    return {"w": hexs(w), "scale": state.scale, "counters": state.counters(),
            "faults": faults, "steps": steps}


def run_all(group) -> dict:
    """Every scenario, with the reducer and (as a control) without it."""
    return {
        "rank": group.rank, "size": group.size,
        "reduce_basic": reduce_basic(group),
        "nan_one_rank": nan_one_rank(group),
        "nan_one_rank_control": nan_one_rank(group, reducer=False),
        "replicated": replicated_random_faults(group),
        "replicated_control": replicated_random_faults(group, reducer=False),
        "sharded": sharded_random_faults(group),
        "sharded_control": sharded_random_faults(group, reducer=False),
    }
