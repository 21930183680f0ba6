"""`lscore bench --suite gpu-host`: the CuPy path's host cost, no GPU needed.

The public ``unscale_`` / ``all_finite`` of the CuPy adapter's code
(``lscore.cuda.ArrayKernels``: the compiled walk, the plan cache, the packed
launches, the read of the flag), then whole fused optimizer steps, on the
stand-in device of _standin.py: memory is host memory and a launch or a
synchronisation does nothing.  What is timed is therefore what a GPU call costs
the host besides the kernels' own time and the one synchronisation.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import numpy as np

from lscore import cuda, kernels
from lscore.bench import _gpu_step
from lscore.bench._harness import TINY_WORKLOADS, WORKLOADS, Rows, alternating, workload_sizes
from lscore.bench._standin import HostLists, NullBackend, null_adapter, standin_kernels

# the host-cost targets, in microseconds
CACHED_PER_ARRAY_US = 0.2
CACHED_PER_CALL_US = 15.0
FIRST_PER_ARRAY_US = 2.0
# a call over arrays at addresses never seen before: host cost, with no upload and no
# synchronisation besides the call's own read of its result
NEW_ADDRESSES_PER_ARRAY_US = 1.0


def _first_sight(fn, lists, backend, reads: int) -> tuple[list[float], int, int]:
    """Seconds of fn(list) for each list, each list seen once (the first one is not timed
    by the caller's warm-up: every list here is new to `fn`); and the uploads the calls
    made and their synchronisations beyond `reads` a call, counted by `backend`."""
    ups, syncs = backend.uploads, backend.syncs
    out = []
    gc.disable()
    try:
        for a in lists:
            t0 = time.perf_counter()
            fn(a)
            out.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return out, backend.uploads - ups, backend.syncs - syncs - reads * len(lists)


def _new_address_target(
    target: str, workload: str, op: str, first: float, uploads: int, syncs: int
) -> dict:
    """The target of calls over arrays at new addresses: `first` us per array at most, no
    upload and no synchronisation beyond the call's own."""
    return {
        "target": target,
        "workload": workload,
        "op": op,
        "unit": "us_per_array",
        "case": "new_addresses",
        "cached": False,
        "measured": first,
        "uploads": uploads,
        "syncs": syncs,
        "required": NEW_ADDRESSES_PER_ARRAY_US,
        "met": first <= NEW_ADDRESSES_PER_ARRAY_US and uploads == 0 and syncs == 0,
    }


def _first_sight_row(group: str, method: str, ts: list[float], count: int, dtype) -> dict:
    """The row of calls each timed once (`ts`, seconds), over `count` arrays each."""
    return {
        "group": group,
        "method": method,
        "bytes": 0,
        "per": count,
        "dtype": dtype,
        "n": count,
        "median_s": statistics.median(ts),
        "min_s": min(ts),
        "max_s": max(ts),
        "calls": 1,
        "repeats": len(ts),
    }


def run_host(opts, rows: Rows, rng) -> list[dict]:
    """The gpu-host rows (unscale_ and all_finite, then whole fused steps); returns the
    targets (the issue's host-cost targets are for the unscale_/all_finite calls)."""
    kern = standin_kernels()
    targets = []
    workloads = TINY_WORKLOADS if opts.tiny else WORKLOADS
    for name, count, size, dtype in workloads:
        sizes = workload_sizes(rng, count, size, opts.tiny)
        host = HostLists(sizes, dtype, opts.first_lists)
        arrays = host.make(0)
        one = arrays[:1]
        inv = alternating([0.5, 2.0])
        kw = dict(dtype=dtype, n=count, opts=opts)
        g = f"gpu-host {name}"
        if opts.only and not any(w in g for w in opts.only):
            continue
        rows.add(
            g,
            "unscale_ cached",
            lambda arrays=arrays, inv=inv: kern.unscale_(arrays, inv()),
            per=count,
            **kw,
        )
        rows.add(
            g, "all_finite cached", lambda arrays=arrays: kern.all_finite(arrays), per=count, **kw
        )
        rows.add(
            g,
            "unscale_ cached, first array alone",
            lambda one=one, inv=inv: kern.unscale_(one, inv()),
            **kw,
        )
        rows.add(
            g, "all_finite cached, first array alone", lambda one=one: kern.all_finite(one), **kw
        )
        rows.flush()
        backend: Any = kern.device(0).backend  # NullBackend, which counts
        new_addresses = {}
        for op in ("unscale_", "all_finite"):
            call = (lambda a: kern.unscale_(a, 0.5)) if op == "unscale_" else kern.all_finite
            lists = [host.make(shift + 1) for shift in range(opts.first_lists)]
            # beyond each call's one read of its result
            ts, uploads, syncs = _first_sight(call, lists, backend, 1)
            new_addresses[op] = (uploads, syncs)
            del lists
            rows.append(_first_sight_row(g, f"{op} first sight", ts, count, dtype))
        by = {r["method"]: r for r in rows.rows if r["group"] == g and "median_s" in r}
        for op in ("unscale_", "all_finite"):
            many, single = (
                by[f"{op} cached"]["median_s"],
                by[f"{op} cached, first array alone"]["median_s"],
            )
            per_array = max(many - single, 0.0) / max(count - 1, 1) * 1e6
            first = by[f"{op} first sight"]["median_s"] / count * 1e6
            uploads, syncs = new_addresses[op]
            targets.append(
                _new_address_target(
                    f"{name}: {op} over arrays at new addresses, host cost per array "
                    "(no upload, no synchronisation besides the result's read)",
                    name,
                    op,
                    first,
                    uploads,
                    syncs,
                )
            )
            for unit, cached, x, need, how in (
                (
                    "us_per_array",
                    True,
                    per_array,
                    CACHED_PER_ARRAY_US,
                    "(whole call - call with its first array alone) / (arrays - 1)",
                ),
                (
                    "us_per_call",
                    True,
                    single * 1e6,
                    CACHED_PER_CALL_US,
                    "a cached call with one array",
                ),
                (
                    "us_per_array",
                    False,
                    first,
                    FIRST_PER_ARRAY_US,
                    "whole first-sight call / arrays",
                ),
            ):
                targets.append(
                    {
                        "target": f"{name}: {op} host cost, "
                        f"{'cached' if cached else 'first sight'}, {how}",
                        "workload": name,
                        "op": op,
                        "unit": unit,
                        "cached": cached,
                        "measured": x,
                        "required": need,
                        "met": x <= need,
                    }
                )
    return targets + run_host_steps(opts, rows, rng)


def run_host_steps(opts, rows: Rows, rng) -> list[dict]:
    """gpu-host rows of whole fused optimizer steps: the host's time per step, cached and
    over gradients at addresses not seen before (as ``zero_grad(set_to_none=True)`` makes
    them); returns the new-address targets."""
    kern = cuda.ArrayKernels(np, NullBackend, kind=kernels.READ_NUMPY)
    backend: Any = kern.device(0).backend  # NullBackend, which counts
    dev = _gpu_step.StepDevice(np, null_adapter(kern), lambda: None, None)
    workloads = TINY_WORKLOADS if opts.tiny else WORKLOADS
    targets = []
    for wname, count, size, dtype in workloads:
        sizes = workload_sizes(rng, count, size, opts.tiny)
        params = [np.ones(n, np.float32) for n in sizes]
        host = HostLists(sizes, dtype, opts.first_lists)
        grads = host.make(0, np.asarray)
        for name in _gpu_step.OPTIMIZERS:
            g = f"gpu-host step {name} {wname}"
            for sync_free, method in (
                (False, _gpu_step.LSCORE_METHODS[0]),
                (True, _gpu_step.LSCORE_METHODS[1]),
            ):
                step, ps = _gpu_step.lscore_step(dev, name, grads, params, sync_free)
                step()  # plans and slots: first sight
                rows.add(
                    g, f"{method} step, cached", step, dtype=dtype, n=count, per=count, opts=opts
                )
                # the reads a cached step makes (the default mode's one read of the flag)
                syncs = backend.syncs
                step()
                reads = backend.syncs - syncs
                lists = [host.make(shift + 1, np.asarray) for shift in range(opts.first_lists)]
                opt = _gpu_step.lscore_optimizer(dev, name, sync_free)

                def new_grads(gs, opt=opt, ps=ps):
                    opt.minimize(lambda s, gs=gs: (0.0, gs), ps)

                new_grads(grads)  # the optimizer's own first step: its slots and state

                ts, uploads, extra = _first_sight(new_grads, lists, backend, reads)
                first = statistics.median(ts) / count * 1e6
                rows.append(
                    _first_sight_row(
                        g, f"{method} step, gradients at new addresses", ts, count, dtype
                    )
                )
                targets.append(
                    _new_address_target(
                        f"{wname}: {method} {name} step over gradients at new "
                        "addresses, host cost per array (no upload, no synchronisation "
                        "besides the mode's own reads)",
                        wname,
                        f"{method} {name} step",
                        first,
                        uploads,
                        extra,
                    )
                )
                del lists
            rows.flush()
    return targets
