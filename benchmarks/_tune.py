"""`lscore bench --suite gpu-tune`: the scan kernels' launch configuration chosen by measurement.

For each workload of ``--suite gpu`` (many small arrays, and one big tensor
in float32, float16 and bfloat16) and each configuration of a grid of chunk
and block sizes (``LaunchConfig``), the whole ``unscale_`` call is timed,
the configurations of a workload in turns on the same arrays.  Before its
timings every configuration unscales generated values (Inf in the last
element) and the result must equal the CPU core's ``lscore.unscale_`` bit
for bit.  The summary gives the best configuration of each workload and
the one configuration whose times, divided by each workload's best, have
the smallest geometric mean, with what it gains over the default and the
``LSCORE_CUDA_LAUNCH`` value that selects it.

The device is an abstraction (``ArrayDevice``): on a GPU, CuPy memory read
through the CuPy adapter's code (``TypedArray`` gives CuPy memory the
bfloat16 dtype CuPy lacks); in the tests, NumPy arrays and the host harness,
so CI runs the grid (tiny) and proves every configuration correct.  Without
a GPU the suite is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

import lscore
from lscore import cuda, kernels
from lscore.bench._gpu import gpu_skip_reason
from lscore.bench._harness import BIG, TINY_WORKLOADS, WORKLOADS, alternating, workload_sizes
from lscore.bench._standin import STANDIN_XP, StandInArray
from lscore.cuda.config import ENV, LaunchConfig
from lscore.fp8.checks import fp8_dtype

CHUNKS = (4096, 16384, 65536)
BLOCKS = (128, 256, 512, 1024)
# --tiny: sizes a CPU harness runs in moments, with chunk edges inside the arrays
TINY_CHUNKS = (512, 4096)
TINY_BLOCKS = (32, 128)
TINY_BIG = (
    ("1 x 1e5 float32", 1, 10**5, "float32"),
    ("1 x 2e5 float16", 1, 2 * 10**5, "float16"),
    ("1 x 2e5 bfloat16", 1, 2 * 10**5, "bfloat16"),
)
# the big tensor's unscale_ against a copy of the same bytes (read + write each)
COPY_RATIO = 0.95
COPY_METHOD = "device copy of the same bytes"
# the inverse of the correctness check: not a power of two, so every product is rounded
CHECK_INV = 1 / 3


def grid(tiny: bool = False) -> list[LaunchConfig]:
    """The configurations measured: chunk x block, the default first."""
    default = LaunchConfig()
    chunks, blocks = (TINY_CHUNKS, TINY_BLOCKS) if tiny else (CHUNKS, BLOCKS)
    out = [default]
    for chunk in chunks:
        for block in blocks:
            cfg = dataclasses.replace(default, chunk=chunk, block=block)
            if cfg != default:
                out.append(cfg)
    return out


def label(cfg: LaunchConfig) -> str:
    """`cfg` as ``LSCORE_CUDA_LAUNCH`` takes it: chunk and block, and any other setting
    that is not the default."""
    default = LaunchConfig()
    return ",".join(
        f"{f.name}={getattr(cfg, f.name)}"
        for f in dataclasses.fields(cfg)
        if f.name in ("chunk", "block") or getattr(cfg, f.name) != getattr(default, f.name)
    )


def workloads(tiny: bool = False) -> tuple:
    return (TINY_WORKLOADS + TINY_BIG) if tiny else (WORKLOADS + BIG)


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":  # ml_dtypes gives NumPy (and so lscore's CPU core) a bfloat16
        return fp8_dtype(name)
    return np.dtype(name)


class TypedArray(StandInArray):
    """CuPy memory (`mem`, a 1-d CuPy array of same-width words) read as `dtype`, in the
    shape the CuPy adapter reads: CuPy has no bfloat16 array."""

    __slots__ = ()

    def __init__(self, mem, dtype: np.dtype):
        self.host: Any = mem  # a CuPy array
        self.data = mem.data
        self.size, self.shape, self.strides = mem.size, mem.shape, mem.strides
        self.dtype = dtype
        self._c_contiguous = self._f_contiguous = True


class ArrayDevice:
    """What the tuner needs of a device: arrays, their values, and ``ArrayKernels``.

    This base is NumPy memory standing in for the device, with kernels launched
    by `make_backend(device)` (the host harness's ``HostBackend`` in the tests).
    """

    name = "host (NumPy memory)"

    def __init__(self, make_backend):
        self._make_backend = make_backend

    def kernels(self, config: LaunchConfig) -> cuda.ArrayKernels:
        return cuda.ArrayKernels(np, self._make_backend, kind=kernels.READ_NUMPY, config=config)

    def upload(self, host: np.ndarray):
        return host.copy()

    def write(self, a, host: np.ndarray) -> None:
        a[...] = host

    def read(self, a) -> np.ndarray:
        return np.array(a)

    def copy(self, dst, src) -> None:
        np.copyto(dst, src)


class CupyDevice(ArrayDevice):
    """The current CUDA device through CuPy and ``cuda.CupyBackend``."""

    def __init__(self):
        import cupy

        super().__init__(cuda.CupyBackend)
        self.cp = cupy
        self.name = f"cuda:{cupy.cuda.Device().id}"
        self._xp = STANDIN_XP

    def kernels(self, config: LaunchConfig) -> cuda.ArrayKernels:
        return cuda.ArrayKernels(
            self._xp,
            self._make_backend,
            array_type=TypedArray,
            kind=kernels.READ_CUDA_ARRAY,
            config=config,
        )

    def upload(self, host: np.ndarray) -> TypedArray:
        return TypedArray(self.cp.asarray(_words(host)), host.dtype)

    def write(self, a: TypedArray, host: np.ndarray) -> None:
        a.host.set(_words(host))

    def read(self, a: TypedArray) -> np.ndarray:
        return a.host.get().view(a.dtype)

    def copy(self, dst: TypedArray, src: TypedArray) -> None:
        dst.host[...] = src.host
        self.cp.cuda.get_current_stream().synchronize()  # as unscale_'s one read does


def _words(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}")


def default_device():
    """(device, None) on a GPU, else (None, why not)."""
    reason = gpu_skip_reason()
    return (CupyDevice(), None) if reason is None else (None, reason)


def check_values(rng, sizes, dt: np.dtype) -> list[np.ndarray]:
    """Values in [0.5, 2) (exact under x0.5 / x2), +Inf in the last element of the last array."""
    out = [rng.uniform(0.5, 2.0, n).astype(dt) for n in sizes]
    if out and out[-1].size:
        out[-1][-1] = np.inf
    return out


def expected(values) -> tuple[list[np.ndarray], bool]:
    """The CPU core's ``unscale_`` of copies of `values` by CHECK_INV: (arrays, finite)."""
    want = [v.copy() for v in values]
    return want, lscore.unscale_(want, CHECK_INV)


def mismatch(device: ArrayDevice, kern, arrays, values, want=None) -> str | None:
    """Unscale `values` (written into `arrays`) by CHECK_INV on the device; None when the
    answer and every element's bits agree with the CPU core's (`want`: ``expected(values)``,
    computed when not given), else what differs."""
    for a, v in zip(arrays, values, strict=True):
        device.write(a, v)
    finite = kern.unscale_(arrays, CHECK_INV)
    want, want_finite = want if want is not None else expected(values)
    if finite != want_finite:
        return f"finite {finite}, the CPU core says {want_finite}"
    for i, (a, w) in enumerate(zip(arrays, want, strict=True)):
        got = device.read(a)
        bad = np.flatnonzero(_words(got) != _words(w))
        # NaN payloads may differ between devices; NaN against NaN is equal here
        bad = bad[~(np.isnan(got[bad].astype(np.float32)) & np.isnan(w[bad].astype(np.float32)))]
        if bad.size:
            k = int(bad[0])
            return (
                f"array {i} element {k}: {got[k]!r}, the CPU core gives {w[k]!r} "
                f"({bad.size} of {w.size} elements differ)"
            )
    return None


def summarize(times: dict, default: LaunchConfig) -> dict:
    """Best configuration per workload, and the one with the smallest geometric mean of
    time / that workload's best; `times` is {workload: {label(config): seconds}}."""
    if not times:
        return {"per_workload": {}, "chosen": None}
    per: dict[str, dict] = {}
    logs: dict[str, list[float]] = {}
    base = label(default)
    for name, ts in times.items():
        best = min(ts, key=ts.get)
        per[name] = {
            "best": best,
            "best_s": ts[best],
            "default_s": ts[base],
            "default_over_best": ts[base] / ts[best],
        }
        for cfg, t in ts.items():
            logs.setdefault(cfg, []).append(math.log(t / ts[best]))
    # only configurations measured on every workload can be compared this way
    geo = {cfg: math.exp(sum(v) / len(v)) for cfg, v in logs.items() if len(v) == len(times)}
    chosen = min(geo, key=geo.__getitem__)
    for name, ts in times.items():
        per[name]["chosen_s"] = ts[chosen]
        per[name]["default_over_chosen"] = ts[base] / ts[chosen]
    changed = LaunchConfig.parse(chosen)
    env = ",".join(
        f"{f.name}={getattr(changed, f.name)}"
        for f in dataclasses.fields(changed)
        if getattr(changed, f.name) != getattr(default, f.name)
    )
    return {
        "per_workload": per,
        "geomean_over_best": geo,
        "chosen": chosen,
        "chosen_geomean": geo[chosen],
        "default_geomean": geo[base],
        "gain_over_default": geo[base] / geo[chosen],
        "env": f"{ENV}={env}" if env else None,
    }


def format_summary(tune: dict) -> str:
    """The tuning's verdict under the table."""
    if tune.get("skipped"):
        return f"gpu-tune: skipped: {tune['skipped']}"
    lines = [f"gpu-tune on {tune['device']}: best configuration per workload"]
    for name, p in tune["per_workload"].items():
        lines.append(f"  {name}: {p['best']} (default {p['default_over_best']:.2f}x its time)")
    if tune["chosen"] is not None:
        lines.append(
            f"chosen (smallest geometric mean of time / best): {tune['chosen']}, "
            f"{tune['chosen_geomean']:.3f} vs the default's {tune['default_geomean']:.3f}"
            f" ({tune['gain_over_default']:.2f}x)"
        )
        lines.append(
            f"use it with: {tune['env']}" if tune["env"] else "the default is the best choice"
        )
    bad = [f"{w} {c}: {m}" for w, cs in tune["mismatches"].items() for c, m in cs.items()]
    lines += [f"NOT EQUAL TO THE CPU CORE: {b}" for b in bad]
    return "\n".join(lines)


def _measure(device: ArrayDevice, configs, rows, group: str, values, kw: dict) -> dict:
    """Check, then time, every configuration on arrays of the sizes and dtype of `values`
    (a workload; with one array, also a device copy of it); returns {label: mismatch}."""
    want = expected(values)
    ones = [np.ones_like(v) for v in values]
    arrays = [device.upload(v) for v in ones]
    kw = dict(kw, nbytes=2 * sum(v.nbytes for v in ones))
    inv = alternating([0.5, 2.0])
    bad = {}
    for cfg in configs:
        kern = device.kernels(cfg)
        why = mismatch(device, kern, arrays, values, want)
        for a, v in zip(arrays, ones, strict=True):
            device.write(a, v)
        if why is not None:
            bad[label(cfg)] = why
        rows.add(
            group,
            label(cfg),
            lambda kern=kern: kern.unscale_(arrays, inv()),
            config=dataclasses.asdict(cfg),
            bitwise_equal=why is None,
            **kw,
        )
    if len(arrays) == 1:
        dst = device.upload(ones[0])
        rows.add(group, COPY_METHOD, lambda: device.copy(dst, arrays[0]), **kw)
    rows.flush()
    return bad


def run_tune(opts, rows, rng, device: ArrayDevice | None = None) -> tuple[list, dict]:
    """Time every configuration of the grid on every workload; returns (targets, summary)."""
    reason = None
    if device is None:
        device, reason = default_device()
    configs, loads = grid(opts.tiny), workloads(opts.tiny)
    tune: dict[str, Any] = {
        "grid": [label(c) for c in configs],
        "default": label(LaunchConfig()),
        "workloads": [name for name, *_ in loads],
    }
    if reason is not None:
        for name, *_ in loads:
            rows.add(f"gpu-tune {name}", "every configuration", skip=reason, opts=opts)
        return (
            [
                {
                    "target": f"gpu-tune {name}: unscale_ (chosen configuration) vs a copy of "
                    "the same bytes",
                    "measured": None,
                    "required": COPY_RATIO,
                    "met": None,
                    "skipped": reason,
                }
                for name, count, *_ in loads
                if count == 1
            ],
            {**tune, "skipped": reason},
        )
    times, mismatches, targets, big = {}, {}, [], []
    for name, count, size, dtname in loads:
        g = f"gpu-tune {name}"
        try:
            dt = _dtype(dtname)
        except ImportError:
            rows.add(g, "every configuration", skip="bfloat16 needs ml_dtypes", opts=opts)
            continue
        sizes = workload_sizes(rng, count, size, opts.tiny)
        bad = _measure(
            device,
            configs,
            rows,
            g,
            check_values(rng, sizes, dt),
            dict(dtype=dtname, n=count, per=count, opts=opts),
        )
        if bad:
            mismatches[name] = bad
        got = {r["method"]: r["median_s"] for r in rows.rows if r["group"] == g and "median_s" in r}
        ts = {label(c): got[label(c)] for c in configs if label(c) in got}
        if tune["default"] in ts:  # not when --only left the group out
            times[name] = ts
        if COPY_METHOD in got:
            big.append((name, got[COPY_METHOD]))
    tune.update(summarize(times, LaunchConfig()), device=device.name, mismatches=mismatches)
    for name, ts in times.items():
        best = min(ts.values())
        for r in rows.rows:
            if r["group"] == f"gpu-tune {name}" and r["method"] in ts:
                r["ratios"] = {
                    "default": ts[tune["default"]] / r["median_s"],
                    "best": best / r["median_s"],
                }
    for name, copy_s in big:
        x = copy_s / times[name][tune["chosen"]]
        targets.append(
            {
                "target": f"gpu-tune {name}: unscale_ (chosen configuration) vs a copy "
                "of the same bytes",
                "measured": x,
                "required": COPY_RATIO,
                "met": x >= COPY_RATIO,
            }
        )
    checked = sum(len(ts) for ts in times.values())
    if checked:
        equal = 1 - sum(map(len, mismatches.values())) / checked
        targets.append(
            {
                "target": "gpu-tune: share of (workload, configuration) whose unscale_ "
                "equals the CPU core bit for bit",
                "measured": equal,
                "required": 1.0,
                "met": equal == 1.0,
            }
        )
    return targets, tune
