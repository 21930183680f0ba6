"""Training scenarios every worker runs, whatever carries its collectives.

A worker (tests/distributed/dist_workers/torch_worker.py, mpi_worker.py) wraps its transport in a `Group`:
``rank``, ``size``, ``allreduce_sum(a)``, ``allgather(a) -> (size, n)``,
``reducer`` (the lscore reducer under test) and ``collectives`` (how many
collectives the reducer has issued so far).  A *stepper* is the code under
test that takes one scaled gradient and a variable: ``CoreStepper`` (lscore's
core driven by hand, with the reducer) or ``NumpyAdapterStepper`` (the NumPy
adapter's LossScaleOptimizer with ``reducer=``).  Each scenario returns a
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


class CoreStepper:
    """lscore's core by hand: unscale and check, reduce (with statistics), update, apply.

    With ``clip`` the update is clipped by the global norm that came with the
    verdict in the same collective (FSDP's clip_grad_norm_ needs it).
    """

    def __init__(self, group, reducer=True, clip=False):
        self.group, self.reducer, self.clip = group, reducer, clip
        self.state = LossScaleState(Policy(**POLICY))

    @property
    def scale(self) -> float:
        return self.state.scale

    def step(self, g: np.ndarray, w: np.ndarray) -> dict:
        found = not lscore.unscale_(g, 1.0 / self.state.scale)
        with np.errstate(invalid="ignore", over="ignore"):
            stats = {"sumsq": float(np.sum(g.astype(np.float64) ** 2)),
                     "max_abs": float(np.max(np.abs(g)))}
        g_found, g_stats, n = _decide(self.group, found, stats if self.clip else None,
                                      self.reducer)
        applied = self.state.update(not g_found)
        if applied:
            coef = 1.0
            if self.clip:
                coef = min(1.0, MAX_NORM / (np.sqrt(g_stats["sumsq"]) + 1e-6))
            w -= np.float32(LR * coef) * g
        rec = {"found": found, "global": g_found, "applied": applied, "collectives": n}
        if self.clip:
            rec.update(local=stats, stats=g_stats)
        return rec

    def final(self) -> dict:
        return {"scale": self.state.scale, "counters": self.state.counters()}


class NumpyAdapterStepper:
    """lscore.adapters.numpy.LossScaleOptimizer(SGD, reducer=...), Keras 2 shape."""

    def __init__(self, group, reducer=True):
        from lscore.adapters.numpy import SGD, LossScaleOptimizer
        self.opt = LossScaleOptimizer(SGD(LR), initial_scale=POLICY["init_scale"],
                                      dynamic_growth_steps=POLICY["growth_interval"],
                                      reducer=group.reducer if reducer else None)

    @property
    def scale(self) -> float:
        return self.opt.loss_scale

    def step(self, g: np.ndarray, w: np.ndarray) -> dict:
        (g,) = self.opt.get_unscaled_gradients([g])
        found = not lscore.all_finite(g)
        applied = self.opt.apply_gradients([(g, w)])
        return {"found": found, "applied": applied}

    def final(self) -> dict:
        return {"scale": self.opt.loss_scale, "counters": {
            "iterations": self.opt.iterations, "dynamic_counter": self.opt.dynamic_counter}}


def _fault(rng: np.random.Generator, a: np.ndarray) -> None:
    a[rng.integers(a.size)] = rng.choice([np.nan, np.inf, -np.inf])


def nan_one_rank(group, stepper) -> dict:
    """A NaN/Inf on one rank at fixed steps; every step's decision and scale."""
    grad0 = np.linspace(-1, 1, 16, dtype=np.float32) * (group.rank + 1)
    w = np.zeros_like(grad0)
    steps = []
    for step in range(N_NAN_STEPS):
        g = (grad0 * np.float32(stepper.scale)).astype(np.float32)
        if step in NAN_STEPS.get(group.rank, ()):
            g[3] = np.nan if group.rank else np.inf
        rec = stepper.step(g, w)
        rec["scale"] = stepper.scale
        steps.append(rec)
    return {"steps": steps, "w": hexs(w), **stepper.final()}


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


def random_faults(group, stepper, sharded: bool) -> dict:
    """N_STEPS steps on averaged gradients with random rank-local faults.

    Replicated (DDP-style): every rank holds all of ``w`` and a fault hits its
    own copy of the averaged gradient.  Sharded (FSDP-style): each rank holds
    the reduce-scatter result for its own shard, checks and updates only that
    shard, and the shards are all-gathered back into ``w``.
    """
    x, y = _data(group.rank)
    rng = np.random.default_rng((2000 if sharded else 1000) + group.rank)
    w = np.zeros(DIM, np.float32)
    n = DIM // group.size if sharded else DIM
    lo = group.rank * n if sharded else 0
    faults, steps = [], []
    for step in range(N_STEPS):
        g = group.allreduce_sum(_local_grad(x, y, w, stepper.scale)) / np.float32(group.size)
        g = g[lo:lo + n].copy()
        if rng.random() < FAULT_P:
            _fault(rng, g)
            faults.append(step)
        mine = w[lo:lo + n].copy()
        steps.append(stepper.step(g, mine))
        w = group.allgather(mine).reshape(-1) if sharded else mine
    return {"w": hexs(w), "faults": faults, "steps": steps,
            "loss": float(np.mean((x @ w - y) ** 2)), **stepper.final()}


FP8_TENSORS = (3, 3, 2)   # three delayed-scaling states, as three FP8 layers keep them
FP8_STEPS = 5


def fp8_delayed(group) -> dict:
    """Three DelayedScaling states updated together each step (update_all with the reducer):
    this rank's amaxes (some 0: a tensor that did not run here; a NaN once, which under
    amax_nan="propagate" reaches the reducer and wins everywhere), the collectives
    per step, and the scales and history each step ends with (hex bytes)."""
    from lscore.fp8 import DelayedScaling, recipe

    r = recipe("te-delayed", amax_history_len=3, amax_nan="propagate")
    states = [DelayedScaling(r, n) for n in FP8_TENSORS]
    rng = np.random.default_rng(100 + group.rank)
    steps = []
    for step in range(FP8_STEPS):
        amaxes = [rng.choice([0.0, 0.25, 3.0, 50.0], size=n).astype(np.float32)
                  for n in FP8_TENSORS]
        if step == 2 and group.rank == 1:
            amaxes[1][0] = np.nan
        for st, a in zip(states, amaxes):
            st.record(a)
        before = group.collectives
        DelayedScaling.update_all(states, group.reducer)
        steps.append({"amaxes": [hexs(a) for a in amaxes],
                      "collectives": group.collectives - before,
                      "scale": [hexs(st.scale) for st in states],
                      "history": [hexs(st.amax_history) for st in states]})
    return {"steps": steps}


ADAPTERS = {"numpy": NumpyAdapterStepper}


def run_all(group, adapters=None) -> dict:
    """Every scenario: on the core with and (as a control) without the reducer, then
    on each adapter's stepper (name -> stepper class taking the group)."""
    out = {
        "rank": group.rank, "size": group.size,
        "reduce_basic": reduce_basic(group),
        "fp8_delayed": fp8_delayed(group),
        "nan_one_rank": nan_one_rank(group, CoreStepper(group)),
        "nan_one_rank_control": nan_one_rank(group, CoreStepper(group, reducer=False)),
        "replicated": random_faults(group, CoreStepper(group), sharded=False),
        "replicated_control": random_faults(group, CoreStepper(group, reducer=False),
                                            sharded=False),
        "sharded": random_faults(group, CoreStepper(group, clip=True), sharded=True),
        "sharded_control": random_faults(group, CoreStepper(group, reducer=False, clip=True),
                                         sharded=True),
    }
    for name, stepper in (adapters or ADAPTERS).items():
        out[f"{name}_nan_one_rank"] = nan_one_rank(group, stepper(group))
        out[f"{name}_replicated"] = random_faults(group, stepper(group), sharded=False)
        out[f"{name}_sharded"] = random_faults(group, stepper(group), sharded=True)
    return out
