"""The torch GradScaler's device path against ``torch.amp.GradScaler``: the host time of
each call of a step.

Both scalers run torch's kernels (``_amp_foreach_non_finite_check_and_unscale_``,
``_amp_update_scale_``) over the same parameters: on the CPU through torch's CPU
implementations, lscore's scaler set to ``torch_kernels = True`` (its CPU tensors
otherwise go through lscore's compiled core), and on CUDA when a device is there.
Each iteration times ``scale``, ``unscale_``, ``step`` and ``update`` apart with
``time.perf_counter`` (no device synchronisation inside: on CUDA this is the host's
time, the queue drained after each iteration, outside the timings).  The optimizer's
own step does nothing, so ``step`` is the scaler's part alone.  The scalers take turns
at every iteration, so a slow spell on a shared host lands on both; a row's median,
minimum and maximum are over its iterations.
"""

from __future__ import annotations

import gc
import math
import statistics
import time

from lscore.bench._harness import TORCH_SKIP, Rows

COUNTS = (300, 2000)
ELEMENTS = 64  # per tensor: small, so the host's work is what the rows show
CALLS = ("scale", "unscale_", "step", "update")
STEP = "whole step"
TORCH_METHOD = "torch.amp.GradScaler"
LSCORE_METHOD = "lscore.adapters.torch.GradScaler"
METHODS = (TORCH_METHOD, LSCORE_METHOD)
GROUP = "GradScaler device path"


def group(device: str, count: int, call: str) -> str:
    """The row group of one call of the step, on `device` ("cpu" or "cuda")."""
    return f"{GROUP} {device}, {count} x {ELEMENTS} float32: {call}"


def bench_scaler_calls(rows: Rows, opts, torch, rng) -> None:
    """The host time of each call of a GradScaler step on the device path, lscore's
    against torch's, on the CPU and on CUDA (skipped, with the reason, without one)."""
    adapter: type | None = None
    if torch is not None:
        try:
            from lscore.adapters.torch import GradScaler as adapter
        except ImportError:
            adapter = None
    for device in ("cpu", "cuda"):
        skip = None
        if torch is None:
            skip = TORCH_SKIP
        elif adapter is None:
            skip = "lscore.adapters.torch is not available"
        elif device == "cuda" and not torch.cuda.is_available():
            skip = "no CUDA device"
        for count in COUNTS:
            names = [group(device, count, c) for c in (*CALLS, STEP)]
            if opts.only and not any(w in g for g in names for w in opts.only):
                continue
            if skip is not None:
                for g in names:
                    for m in METHODS:
                        rows.add(g, m, skip=skip, dtype="float32", n=ELEMENTS * count, opts=opts)
                continue
            steps = [_stepper(torch, cls, device, count) for cls in (torch.amp.GradScaler, adapter)]
            sync = torch.cuda.synchronize if device == "cuda" else None
            for m, samples in zip(METHODS, _time_in_turns(steps, sync, opts), strict=True):
                for call, ts in samples.items():
                    rows.append(
                        {
                            "group": group(device, count, call),
                            "method": m,
                            "bytes": 0,
                            "per": count,
                            "per_unit": "tensor",
                            "dtype": "float32",
                            "n": ELEMENTS * count,
                            "median_s": statistics.median(ts),
                            "min_s": min(ts),
                            "max_s": max(ts),
                            "calls": 1,
                            "repeats": len(ts),
                        }
                    )


def _stepper(torch, cls, device: str, count: int):
    """One step's scaler calls on `count` parameters of `device`, each call timed: a
    function returning their four host times.  The scale stays 1.0 (growth interval 2**30)
    and the gradients finite, so nothing drifts from step to step."""

    class Idle(torch.optim.SGD):
        """SGD whose step does nothing: the rows time the scaler, not the optimizer."""

        def step(self, closure=None):
            return None

    gen = torch.Generator().manual_seed(count)
    params = [torch.nn.Parameter(torch.zeros(ELEMENTS, device=device)) for _ in range(count)]
    for p in params:
        p.grad = torch.randn(ELEMENTS, generator=gen).to(device)
    opt = Idle(params, lr=0.0)
    scaler = cls(device, init_scale=1.0, growth_interval=1 << 30)
    if cls is not torch.amp.GradScaler:
        scaler.torch_kernels = True  # torch's kernels on CPU tensors too (CUDA takes them)
    loss = torch.ones((), device=device)
    clock = time.perf_counter

    def step():
        t0 = clock()
        scaler.scale(loss)
        t1 = clock()
        scaler.unscale_(opt)
        t2 = clock()
        scaler.step(opt)
        t3 = clock()
        scaler.update()
        t4 = clock()
        return t1 - t0, t2 - t1, t3 - t2, t4 - t3

    step()  # places the scale
    return step


def _time_in_turns(steps, sync, opts) -> list[dict]:
    """{call: [seconds, one per iteration]} for each stepper: `repeat` times as many
    iterations as last about `min_time` seconds (3 at least), the steppers taking turns at each
    iteration, so that a slow spell of a shared host lands on all of them alike."""
    per = []
    for step in steps:
        t0 = time.perf_counter()
        step()
        if sync is not None:
            sync()
        per.append(time.perf_counter() - t0)
    # at least three per repeat: one slow spell must not spoil a row's best
    iterations = opts.repeat * max(3, math.ceil(opts.min_time / max(sum(per), 1e-9)))
    samples: list[dict[str, list[float]]] = [{c: [] for c in (*CALLS, STEP)} for _ in steps]
    gc.disable()
    try:
        for _ in range(iterations):
            for step, out in zip(steps, samples, strict=True):
                times = step()
                if sync is not None:
                    sync()  # the queue drained outside the timings
                for c, t in zip(CALLS, times, strict=True):
                    out[c].append(t)
                out[STEP].append(sum(times))
    finally:
        gc.enable()
    return samples


def targets(ratio) -> None:
    """The target of the issue: lscore's whole step no slower than torch's, on the CPU, at
    each tensor count (`ratio`, from _report.targets, records it)."""
    for count in COUNTS:
        ratio(
            f"GradScaler device path, CPU, {count} tensors: lscore step host time / torch's",
            group("cpu", count, STEP),
            LSCORE_METHOD,
            TORCH_METHOD,
            1.0,
            lower_is_better=True,
        )
