"""Whole-step rows of `lscore bench --suite gpu`: an SGD or Adam step without the backward.

A step here is what follows the backward pass: unscale and check the
gradients, advance the loss scale, update the parameters and their slots
(or skip).  lscore's rows run ``lscore.adapters.cupy``'s fused optimizers in
the default (one sync per step), sync-free and CUDA-graph-replayed modes;
torch's rows run its foreach and fused optimizers under ``GradScaler`` on
parameters of the same shapes, in the same run.

Timing: each call is `STEPS_PER_CALL` steps and then one synchronisation,
so a sync-free step is timed by the device's throughput, not by a wait per
step; the default mode and torch's foreach path also sync inside every
step, as they do in training.

The physical floor of a step is the bytes it must move (read the gradients;
read and write the parameters and each slot once) at the device's copy
bandwidth, measured in the same run by copying a 256 MB buffer.

torch's optimizers need gradients of the parameter's dtype, so on the
float16 workload torch's rows get float32 gradients (twice the bytes lscore
reads there); the row's note says so.

Everything is written against ``StepDevice`` so that the tests run these rows
on NumPy arrays with the CPU host harness standing in for the GPU.
"""

from __future__ import annotations

import numpy as np

from lscore.bench._harness import Rows, import_torch, workload_sizes

# (name, array count, sizes: "log" for log-uniform 1e2..1e6 else the size, gradient dtype)
STEP_WORKLOADS = (
    ("300 log-uniform 1e2..1e6, float32 grads", 300, "log", "float32"),
    ("2000 x 4096, float16 grads, float32 masters", 2000, 4096, "float16"),
)
TINY_STEP_WORKLOADS = (
    ("12 log-uniform 1e2..1e4, float32 grads", 12, "log", "float32"),
    ("16 x 256, float16 grads, float32 masters", 16, 256, "float16"),
)
OPTIMIZERS = ("SGD", "Adam")
LSCORE_METHODS = ("lscore default", "lscore sync-free", "lscore sync-free, graph replay")
TORCH_METHODS = ("torch foreach + GradScaler", "torch fused + GradScaler")
FLOOR = "floor: bytes at copy bandwidth"
STEP_METHODS = LSCORE_METHODS + TORCH_METHODS + (FLOOR,)
# the targets: lscore time / torch fused time, at most
REQUIRED = {"lscore default": 1.1, "lscore sync-free": 1.0, "lscore sync-free, graph replay": 1.0}
FLOOR_REQUIRED = 1.3  # Adam's sync-free time / its floor, at most
STEPS_PER_CALL = 10
INIT_SCALE = 2.0**15
LR = {"SGD": 0.01, "Adam": 0.001}
MOMENTUM = 0.9
BANDWIDTH_BYTES = 256 << 20


class StepDevice:
    """What the step rows need from a device.

    xp: the array module; adapter: a module with lscore's SGD, Adam and
    LossScaleOptimizer for xp's arrays; sync(): wait for the device;
    torch_device: where torch's rows run ("cuda", "cpu"), None to skip them;
    capture(step) -> replay: a CUDA-graph capture of `step`, or None with
    `no_capture` saying why.
    """

    def __init__(self, xp, adapter, sync, torch_device, capture=None, no_capture=None):
        self.xp, self.adapter, self.sync = xp, adapter, sync
        self.torch_device = torch_device
        self.capture, self.no_capture = capture, no_capture


def cupy_device() -> StepDevice:
    """The GPU: CuPy arrays, lscore.adapters.cupy, torch on "cuda", CuPy stream capture."""
    import cupy

    from lscore.adapters import cupy as adapter

    def capture(step):
        # capture cannot run on the legacy default stream; one eager step first makes
        # every plan, table and slot, so nothing is allocated or uploaded while capturing
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            step()
            stream.synchronize()
            stream.begin_capture()
            try:
                step()
            finally:
                graph = stream.end_capture()
        return lambda: graph.launch(stream)

    def sync():
        cupy.cuda.Device().synchronize()  # every stream: replays run on their own

    torch = import_torch()
    torch_device = "cuda" if torch is not None and torch.cuda.is_available() else None
    return StepDevice(cupy, adapter, sync, torch_device, capture=capture)


def inner_optimizer(adapter, name: str):
    if name == "SGD":
        return adapter.SGD(LR["SGD"], momentum=MOMENTUM)
    return adapter.Adam(LR["Adam"])


def lscore_optimizer(dev: StepDevice, name: str, sync_free: bool):
    """lscore's LossScaleOptimizer over optimizer `name`, as every step row configures it."""
    return dev.adapter.LossScaleOptimizer(
        inner_optimizer(dev.adapter, name), initial_scale=INIT_SCALE, sync_free=sync_free
    )


def lscore_step(dev: StepDevice, name: str, grads, params0, sync_free: bool):
    """(step, parameters): minimize over fresh copies of the parameters with the given
    (scaled) gradients, which the fused kernels read once."""
    xp = dev.xp
    params = [xp.array(p, copy=True) for p in params0]
    opt = lscore_optimizer(dev, name, sync_free)
    return (lambda: opt.minimize(lambda scale: (0.0, grads), params)), params


def _torch_step(torch, dev: StepDevice, name: str, grads_host, params_host, how: str):
    """torch's step: GradScaler.step (unscale, check, update or skip) then update()."""
    device = dev.torch_device
    params = [torch.from_numpy(p.copy()).to(device) for p in params_host]
    for p, g in zip(params, grads_host, strict=True):
        p.grad = torch.from_numpy(g.astype(np.float32)).to(device)
    kw = {how: True}
    if name == "SGD":
        opt = torch.optim.SGD(params, lr=LR["SGD"], momentum=MOMENTUM, **kw)
    else:
        opt = torch.optim.Adam(params, lr=LR["Adam"], **kw)
    scaler = torch.amp.GradScaler(device, init_scale=INIT_SCALE, growth_interval=2000)
    scaler.scale(torch.ones((), device=device))  # makes the scale tensor, as a step would

    def step():
        scaler.step(opt)
        scaler.update()

    return step


def _timed(dev: StepDevice, step):
    def call():
        for _ in range(STEPS_PER_CALL):
            step()
        dev.sync()

    call()  # the first step makes slots, plans and tables: not what is timed
    return call


def copy_bandwidth(dev: StepDevice, opts) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    import time

    n = BANDWIDTH_BYTES // 4 if not opts.tiny else 1 << 16
    src, dst = dev.xp.ones(n, np.float32), dev.xp.empty(n, np.float32)
    dst[...] = src
    dev.sync()
    best = float("inf")
    for _ in range(max(3, opts.repeat)):
        t0 = time.perf_counter()
        for _ in range(5):
            dst[...] = src
        dev.sync()
        best = min(best, (time.perf_counter() - t0) / 5)
    return 2 * 4 * n / best


def _floor_bytes(name: str, grads) -> int:
    """Read the gradients; read and write the parameters and each float32 slot."""
    elems = sum(g.size for g in grads)
    slots = 2 if name == "Adam" else 1
    return sum(g.nbytes for g in grads) + 2 * 4 * elems * (1 + slots)


def skipped_rows(rows: Rows, opts, reason: str) -> list[dict]:
    workloads = TINY_STEP_WORKLOADS if opts.tiny else STEP_WORKLOADS
    for wname, *_ in workloads:
        for name in OPTIMIZERS:
            for m in STEP_METHODS:
                rows.add(f"gpu step {name} {wname}", m, skip=reason, opts=opts)
    return [
        {
            "target": f"gpu step {name} {wname}: {m} vs torch fused + GradScaler",
            "measured": None,
            "required": need,
            "met": None,
            "skipped": reason,
        }
        for wname, *_ in workloads
        for name in OPTIMIZERS
        for m, need in REQUIRED.items()
    ]


def run_steps(dev: StepDevice, opts, rows: Rows, rng) -> list[dict]:
    """The whole-step rows on `dev`; returns the targets."""
    torch = import_torch() if dev.torch_device is not None else None
    bandwidth = copy_bandwidth(dev, opts)
    targets = []
    workloads = TINY_STEP_WORKLOADS if opts.tiny else STEP_WORKLOADS
    for wname, count, size, gdtype in workloads:
        sizes = workload_sizes(rng, count, size, opts.tiny)
        params_host = [rng.standard_normal(n, dtype=np.float32) for n in sizes]
        # scaled gradients: about 1e-3 before scaling, finite in float16 at 2**15
        grads_host = [
            (rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3 * INIT_SCALE)).astype(
                gdtype
            )
            for n in sizes
        ]
        grads = [dev.xp.asarray(g) for g in grads_host]
        for name in OPTIMIZERS:
            g = f"gpu step {name} {wname}"
            kw = dict(dtype=gdtype, n=count, per=STEPS_PER_CALL, per_unit="step", opts=opts)
            for sync_free, method in ((False, LSCORE_METHODS[0]), (True, LSCORE_METHODS[1])):
                step, _ = lscore_step(dev, name, grads, params_host, sync_free)
                rows.add(g, method, _timed(dev, step), **kw)
            if dev.capture is None:
                rows.add(g, LSCORE_METHODS[2], skip=dev.no_capture, opts=opts)
            else:
                replay = dev.capture(lscore_step(dev, name, grads, params_host, True)[0])
                rows.add(g, LSCORE_METHODS[2], _timed(dev, replay), **kw)
            for how, method in zip(("foreach", "fused"), TORCH_METHODS, strict=True):
                if torch is None:
                    rows.add(g, method, skip="torch is not installed", opts=opts)
                    continue
                note = (
                    "float32 gradients: torch's optimizers need the parameter's dtype"
                    if gdtype != "float32"
                    else None
                )
                step = _torch_step(torch, dev, name, grads_host, params_host, how)
                rows.add(g, method, _timed(dev, step), note=note, **kw)
            rows.flush()
            floor_s = _floor_bytes(name, grads) / bandwidth * STEPS_PER_CALL
            rows.append(
                {
                    "group": g,
                    "method": FLOOR,
                    "bytes": _floor_bytes(name, grads),
                    "per": STEPS_PER_CALL,
                    "per_unit": "step",
                    "median_s": floor_s,
                    "min_s": floor_s,
                    "max_s": floor_s,
                    "calls": 0,
                    "repeats": 0,
                    "copy_bandwidth_gbps": bandwidth / 1e9,
                }
            )
            targets += _targets(rows, g, name)
    return targets


def _targets(rows: Rows, group: str, name: str) -> list[dict]:
    by = {r["method"]: r for r in rows.rows if r["group"] == group and "median_s" in r}
    out = []
    base = by.get(TORCH_METHODS[1])
    for m, need in REQUIRED.items():
        x = by[m]["median_s"] / base["median_s"] if m in by and base else None
        out.append(
            {
                "target": f"{group}: {m} vs {TORCH_METHODS[1]}",
                "measured": x,
                "required": need,
                "met": None if x is None else x <= need,
                "unit": "time ratio",
            }
        )
    if name == "Adam" and LSCORE_METHODS[1] in by:
        x = by[LSCORE_METHODS[1]]["median_s"] / by[FLOOR]["median_s"]
        out.append(
            {
                "target": f"{group}: {LSCORE_METHODS[1]} vs its physical floor",
                "measured": x,
                "required": FLOOR_REQUIRED,
                "met": x <= FLOOR_REQUIRED,
                "unit": "time ratio",
            }
        )
    return out
