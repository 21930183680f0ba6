"""`lscore bench`: lscore's scan and unscale against NumPy, torch and the memory bandwidth.

Everything is measured in one run on the same arrays, so the ratios hold even
on a noisy machine: each row is the median of `repeat` timings (min-max shown),
each timing a loop of calls lasting at least `min_time` seconds.  In-place
rows alternate the factor between 0.5 and 2.0 so the values never drift.
torch rows need torch (skipped, with the reason, otherwise).
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

import lscore
from lscore._ext import _scan

SIZES = (10 ** 3, 10 ** 4, 10 ** 5, 10 ** 6, 10 ** 7)
FULL_SIZES = SIZES + (10 ** 8,)
TINY_SIZES = (10 ** 3, 4096)
DTYPES = ("float16", "bfloat16", "float32", "float64")
N_SMALL = 300
TORCH_SKIP = "torch is not installed"


# ---- timing -----------------------------------------------------------------

def _calls_per_timing(fn, min_time: float) -> int:
    """How many calls of fn last about min_time."""
    k, dt = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in itertools.repeat(None, k):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time / 4 or k >= 1 << 22:
            break
        k *= 4
    return max(1, int(k * min_time / max(dt, 1e-9)))


def _timing(fn, k: int) -> float:
    """Seconds per call over k calls."""
    t0 = time.perf_counter()
    for _ in itertools.repeat(None, k):
        fn()
    return (time.perf_counter() - t0) / k


def _alternating(values):
    """A callable giving values[0], values[1], values[0], ... (in-place rows never drift)."""
    return itertools.cycle(values).__next__


class _Rows:
    """The rows of one run, with progress on stderr (tqdm when installed).

    `add` queues a row; `flush` times every queued row, taking their
    `repeat` timings in turns (row 1, row 2, ..., row 1, row 2, ...), so that
    the rows compared with each other see the same machine: on a shared host
    a slow spell then lands on all of them instead of on one.  Callers flush
    before the variables their functions use change.
    """

    def __init__(self, total: int, progress: bool):
        self.rows: list[dict] = []
        self._queued: list[tuple] = []
        self._done = 0
        self._bar = None
        self._total = total
        self._progress = progress
        if progress:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, unit="row", file=sys.stderr, leave=False)
            except ImportError:
                pass

    def add(self, group: str, method: str, fn=None, *, nbytes: int = 0, per: int = 1,
            skip: str | None = None, opts=None, before=None, **extra) -> None:
        """Queue a row timing fn (a skipped row when skip is given or fn is None);
        `before` runs ahead of each of its timings (e.g. to pick an ISA level)."""
        if opts is not None and opts.only and not any(w in group for w in opts.only):
            return
        row = {"group": group, "method": method, "bytes": nbytes, "per": per, **extra}
        self.rows.append(row)
        if skip is not None or fn is None:
            row["skipped"] = skip or "not available"
            self._tick(row)
        else:
            self._queued.append((row, fn, before, opts))

    def flush(self) -> None:
        """Time the queued rows, in turns."""
        queued, self._queued = self._queued, []
        if not queued:
            return
        samples: list[list[float]] = [[] for _ in queued]
        gc.disable()
        try:
            ks = []
            for row, fn, before, opts in queued:
                if before is not None:
                    before()
                ks.append(_calls_per_timing(fn, opts.min_time))
            for _ in range(max(opts.repeat for *_, opts in queued)):
                for i, (row, fn, before, opts) in enumerate(queued):
                    if len(samples[i]) < opts.repeat:
                        if before is not None:
                            before()
                        samples[i].append(_timing(fn, ks[i]))
        finally:
            gc.enable()
        for (row, *_), k, ts in zip(queued, ks, samples):
            row.update({"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
                        "calls": k, "repeats": len(ts)})
            if row["bytes"]:
                row["gbps"] = row["bytes"] / row["median_s"] / 1e9
            self._tick(row)

    def _tick(self, row: dict) -> None:
        self._done += 1
        what = f"{row['group']} {row['method']}"
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(what[:40])
        elif self._progress:
            print(f"\r[{self._done}/{self._total}] {what[:60]:60s}", end="",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        self.flush()
        if self._bar is not None:
            self._bar.close()
        elif self._progress:
            print("\r" + " " * 80 + "\r", end="", file=sys.stderr, flush=True)


# ---- inputs -----------------------------------------------------------------

def _dtype(name: str):
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            return None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _array(rng, dtype, n: int) -> np.ndarray:
    return rng.standard_normal(n, dtype=np.float32).astype(dtype)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _as_tensor(torch, a: np.ndarray):
    """A zero-copy torch view of a NumPy array (bfloat16 through its 16-bit words)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _torch_unscale(torch, tensors):
    """torch's fused CPU kernel on `tensors`, alternating the factor (no .item())."""
    found = torch.zeros(1)
    invs = _alternating([torch.full((1,), 0.5), torch.full((1,), 2.0)])
    op = torch._amp_foreach_non_finite_check_and_unscale_
    return lambda: op(tensors, found, invs())


@contextlib.contextmanager
def _busy_core():
    """A process spinning beside the benchmark (the other core is busy)."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.05)
        yield
    finally:
        p.kill()
        p.wait()


def _size_label(n: int) -> str:
    e = int(round(math.log10(n)))
    return f"1e{e}" if 10 ** e == n else str(n)


# ---- the sections -------------------------------------------------------------

def _bench_arrays(rows: _Rows, opts, torch, rng) -> None:
    """all_finite and unscale_ per dtype and size, with their baselines."""
    for n in opts.sizes:
        for name in DTYPES:
            dt = _dtype(name)
            sz = _size_label(n)
            g_af, g_un = f"all_finite {name} {sz}", f"unscale_ {name} {sz}"
            if dt is None:
                for g, methods in ((g_af, _AF_METHODS), (g_un, _UN_METHODS)):
                    for m in methods:
                        rows.add(g, m, skip="ml_dtypes is not installed", dtype=name, n=n)
                continue
            a = _array(rng, dt, n)
            nb = a.nbytes
            kw = dict(dtype=name, n=n, opts=opts)
            rows.add(g_af, "lscore", lambda: _scan.all_finite(a), nbytes=nb, **kw)
            rows.add(g_af, "lscore 1 thread", lambda: _scan.all_finite(a, 1), nbytes=nb, **kw)
            rows.add(g_af, "np.isfinite(a).all()", lambda: np.isfinite(a).all(), nbytes=nb, **kw)
            words = a.view(np.uint64)
            rows.add(g_af, "np.sum(a.view(uint64))", lambda: np.sum(words), nbytes=nb, **kw)
            rows.add(g_af, "C read loop", lambda: _scan._bench_read_u64(a), nbytes=nb, **kw)

            inv = _alternating([0.5, 2.0])
            rows.add(g_un, "lscore", lambda: _scan.unscale_(a, inv()), nbytes=2 * nb, **kw)
            rows.add(g_un, "lscore 1 thread", lambda: _scan.unscale_(a, inv(), False, 1),
                     nbytes=2 * nb, **kw)
            rows.add(g_un, "lscore stats=True", lambda: _scan.unscale_(a, inv(), True),
                     nbytes=2 * nb, **kw)

            def numpy_unscale():
                np.multiply(a, inv(), out=a)
                return np.isfinite(a).all()
            rows.add(g_un, "a *= inv; np.isfinite(a).all()", numpy_unscale, nbytes=2 * nb, **kw)
            if torch is None:
                rows.add(g_un, "torch foreach", skip=TORCH_SKIP, **kw)
            else:
                rows.add(g_un, "torch foreach", _torch_unscale(torch, [_as_tensor(torch, a)]),
                         nbytes=2 * nb, **kw)
            dst = np.empty_like(a)
            rows.add(g_un, "np.copyto", lambda: np.copyto(dst, a), nbytes=2 * nb, **kw)
            rows.add(g_un, "C memcpy", lambda: _scan._bench_copy(dst, a), nbytes=2 * nb, **kw)
            rows.flush()
            del a, dst, words


_AF_METHODS = ("lscore", "lscore 1 thread", "np.isfinite(a).all()", "np.sum(a.view(uint64))",
               "C read loop")
_UN_METHODS = ("lscore", "lscore 1 thread", "lscore stats=True",
               "a *= inv; np.isfinite(a).all()", "torch foreach", "np.copyto", "C memcpy")


def _bench_small(rows: _Rows, opts, torch, rng) -> None:
    """300 float32 arrays of 64 elements: the fixed cost per array."""
    arrays = [_array(rng, np.float32, 64) for _ in range(N_SMALL)]
    g, kw = f"{N_SMALL} x 64 float32", dict(dtype="float32", n=64, per=N_SMALL, opts=opts)
    nb = sum(a.nbytes for a in arrays)
    inv = _alternating([0.5, 2.0])
    rows.add(g, "lscore all_finite", lambda: _scan.all_finite(arrays), nbytes=nb, **kw)
    rows.add(g, "lscore unscale_", lambda: _scan.unscale_(arrays, inv()), nbytes=2 * nb, **kw)
    rows.add(g, "numpy loop isfinite().all()",
             lambda: all(np.isfinite(a).all() for a in arrays), nbytes=nb, **kw)

    def numpy_loop():
        f = inv()
        ok = True
        for a in arrays:
            np.multiply(a, f, out=a)
            ok &= bool(np.isfinite(a).all())
        return ok
    rows.add(g, "numpy loop a *= inv; isfinite", numpy_loop, nbytes=2 * nb, **kw)
    if torch is None:
        rows.add(g, "torch foreach", skip=TORCH_SKIP, **kw)
    else:
        rows.add(g, "torch foreach", _torch_unscale(torch, [_as_tensor(torch, a) for a in arrays]),
                 nbytes=2 * nb, **kw)


def _gradscaler_model(torch, sizes):
    params = [torch.nn.Parameter(torch.zeros(int(s))) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape)
    return params, torch.optim.SGD(params, lr=1e-6, foreach=True)


def _bench_gradscaler(rows: _Rows, opts, torch, rng) -> None:
    """Whole GradScaler steps (unscale_, step, update) on 300 float32 parameters."""
    cases = ((f"{N_SMALL} x 64", [64] * N_SMALL),
             (f"{N_SMALL} log-uniform 1e2..1e5",
              np.exp(np.random.default_rng(1234).uniform(math.log(1e2), math.log(opts.gs_max),
                                                         N_SMALL)).astype(int)))
    adapter = None
    try:
        from lscore.adapters.torch import GradScaler as adapter
    except ImportError:
        pass
    for label, sizes in cases:
        g = f"GradScaler step, {label}"
        kw = dict(dtype="float32", n=int(np.sum(sizes)), per=N_SMALL, opts=opts)
        methods = ("torch.amp.GradScaler('cpu')", "lscore core + SGD (numpy views)",
                   "lscore.adapters.torch.GradScaler")
        if torch is None:
            for m in methods:
                rows.add(g, m, skip=TORCH_SKIP, **kw)
            continue
        nb = 2 * 4 * int(np.sum(sizes))
        for m in methods:
            if m.startswith("lscore.adapters") and adapter is None:
                rows.add(g, m, skip="lscore.adapters.torch is not available", **kw)
                continue
            params, opt = _gradscaler_model(torch, sizes)
            rows.add(g, m, _step_fn(torch, m, params, opt, adapter), nbytes=nb, **kw)


def _step_fn(torch, method, params, opt, adapter):
    """One training step's scaler work; the scale alternates 2.0 / 0.5 (grads never drift)."""
    scales = _alternating([2.0, 0.5])
    if method.startswith("lscore core"):
        state = lscore.LossScaleState(lscore.Policy(name="bench", init_scale=2.0))

        def step():
            grads = [p.grad.numpy() for p in params]
            finite = _scan.unscale_(grads, 1.0 / state.scale)
            if state.update(finite):
                opt.step()
            state.set_scale(scales())
        return step
    cls = adapter if method.startswith("lscore.adapters") else torch.amp.GradScaler
    scaler = cls("cpu", init_scale=2.0, growth_interval=1 << 30)
    scaler.scale(torch.ones(()))

    def step():
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update(scales())
    return step


def _bench_torch_small(rows: _Rows, opts, torch, rng) -> None:
    """GradScaler.unscale_ + update on 300 parameters of 64 elements, and on
    one: the fixed cost per torch tensor of the whole path (.grad, dtype,
    device, strides, data pointer), with fresh gradient tensors every step as
    after torch's default zero_grad(set_to_none=True).  The 1-tensor rows give
    the per-step part, so the targets can take the per-tensor part alone."""
    methods = (GRAD_HARNESS, "torch.amp.GradScaler('cpu')", "lscore.adapters.torch.GradScaler")
    try:
        from lscore.adapters.torch import GradScaler as adapter
    except ImportError:
        adapter = None
    for count in (N_SMALL, 1):
        g = f"GradScaler.unscale_ + update, {count} x 64"
        kw = dict(dtype="float32", n=64 * count, per=count, opts=opts)
        if torch is None:
            for m in methods:
                rows.add(g, m, skip=TORCH_SKIP, **kw)
            continue
        grads = [[torch.randn(64) for _ in range(count)] for _ in range(2)]
        for m in methods:
            if m.startswith("lscore") and adapter is None:
                rows.add(g, m, skip="lscore.adapters.torch is not available", **kw)
                continue
            rows.add(g, m, _torch_small_step(torch, m, grads, adapter),
                     nbytes=0 if m == GRAD_HARNESS else 2 * 4 * 64 * count, **kw)
        rows.flush()


def _torch_small_step(torch, method, grads, adapter):
    """One step of `method` on its own parameters, given new .grad tensors first."""
    params = [torch.nn.Parameter(torch.zeros(64)) for _ in grads[0]]
    opt = torch.optim.SGD(params, lr=1e-6)
    turn = _alternating([0, 1])

    def new_grads():
        for p, g in zip(params, grads[turn()]):   # new .grad objects each step
            p.grad = g
    if method == GRAD_HARNESS:
        return new_grads
    scaler = (adapter if method.startswith("lscore") else torch.amp.GradScaler)(
        "cpu", init_scale=1.0, growth_interval=1 << 30)
    scaler.scale(torch.ones(()))

    def step():
        new_grads()
        scaler.unscale_(opt)
        scaler.update()
    return step


# the part of a step that stands for backward(): the scalers' rows include it
GRAD_HARNESS = "assigning new .grad tensors (in every row)"


def _bench_latency(rows: _Rows, opts, torch, rng) -> None:
    """Early exit, the per-step update and the import time."""
    n = max(opts.sizes)
    a = np.ones(n, np.float32)
    a[0] = np.nan
    g = f"NaN at index 0 of {_size_label(n)} float32"
    rows.add(g, "lscore all_finite", lambda: _scan.all_finite(a), dtype="float32", n=n, opts=opts)
    rows.add(g, "np.isfinite(a).all()", lambda: np.isfinite(a).all(), dtype="float32", n=n,
             opts=opts)
    rows.flush()
    del a
    ls = lscore.DynamicLossScale()
    grads = [np.ones(1, np.float32)]
    rows.add("DynamicLossScale.update([1 element])", "lscore", lambda: ls.update(grads),
             dtype="float32", n=1, opts=opts)
    if not opts.only or any(w in "import lscore" for w in opts.only):
        row = _import_time(opts)
        rows.rows.append(row)
        rows._tick(row)


def _import_time(opts) -> dict:
    """`import lscore` after `import numpy`, in fresh interpreters, bytecode cached as
    after a pip install (one warm-up run writes it where PYTHONDONTWRITEBYTECODE said not to)."""
    code = ("import time; t0 = time.perf_counter(); import numpy; t1 = time.perf_counter(); "
            "import lscore; t2 = time.perf_counter(); print(t1 - t0, t2 - t1)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    deltas = []
    for k in range(opts.import_repeat + 1):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env=env).stdout.split()
        if k:
            deltas.append(float(out[1]))
    return {"group": "import lscore (after numpy)", "method": "subprocess", "bytes": 0, "per": 1,
            "median_s": statistics.median(deltas), "min_s": min(deltas), "max_s": max(deltas),
            "calls": 1, "repeats": len(deltas)}


def _bench_contention(rows: _Rows, opts, torch, rng) -> None:
    """unscale_ threaded vs serial while another process keeps a core busy."""
    with _busy_core():
        for n in opts.contention_sizes:
            a = _array(rng, np.float32, n)
            inv = _alternating([0.5, 2.0])
            g = f"unscale_ float32 {_size_label(n)}, other core busy"
            kw = dict(dtype="float32", n=n, opts=opts)
            rows.add(g, "lscore", lambda: _scan.unscale_(a, inv()), nbytes=2 * a.nbytes, **kw)
            rows.add(g, "lscore 1 thread", lambda: _scan.unscale_(a, inv(), False, 1),
                     nbytes=2 * a.nbytes, **kw)
            rows.add(g, "lscore 2 threads", lambda: _scan.unscale_(a, inv(), False, 2),
                     nbytes=2 * a.nbytes, **kw)
            rows.flush()
            del a


def _bench_isa(rows: _Rows, opts, torch, rng) -> None:
    """The kernels at each ISA level this CPU runs (serial, in-cache sizes)."""
    levels = _scan.isa_levels()
    auto = _scan.isa()
    for n in opts.isa_sizes:
        a = _array(rng, np.float32, n)
        inv = _alternating([0.5, 2.0])
        for what in ("all_finite", "unscale_"):
            g = f"ISA levels, {what} float32 {_size_label(n)}"
            fn = ((lambda: _scan.all_finite(a, 1)) if what == "all_finite"
                  else (lambda: _scan.unscale_(a, inv(), False, 1)))
            for level in levels + ["auto"]:
                rows.add(g, f"{level} ({auto})" if level == "auto" else level, fn,
                         nbytes=a.nbytes * (1 if what == "all_finite" else 2),
                         dtype="float32", n=n, opts=opts, isa=level,
                         before=lambda name=(auto if level == "auto" else level):
                         _scan.set_isa(name))
            try:
                rows.flush()
            finally:
                _scan.set_isa(auto)


SECTIONS = (_bench_arrays, _bench_small, _bench_gradscaler, _bench_torch_small, _bench_latency,
            _bench_contention, _bench_isa)


# ---- ratios, targets, output ---------------------------------------------------

_BASELINES = {
    "all_finite": {"numpy": "np.isfinite(a).all()", "np.sum": "np.sum(a.view(uint64))",
                   "C read": "C read loop"},
    "unscale_": {"numpy": "a *= inv; np.isfinite(a).all()", "torch": "torch foreach",
                 "memcpy": "C memcpy"},
    f"{N_SMALL} x 64": {"numpy": "numpy loop a *= inv; isfinite", "torch": "torch foreach"},
    "GradScaler": {"torch": "torch.amp.GradScaler('cpu')"},
    "NaN at": {"numpy": "np.isfinite(a).all()"},
    "unscale_ float32": {"serial": "lscore 1 thread"},
    "ISA levels": {"v3": "v3"},
}


def _add_ratios(rows: list[dict]) -> None:
    """ratio = baseline time / row time (above 1: the row is faster), within each group."""
    groups: dict[str, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault(r["group"], {})[r["method"]] = r
    for g, members in groups.items():
        base = next((b for prefix, b in _BASELINES.items() if g.startswith(prefix)), {})
        for r in members.values():
            if "median_s" not in r or r["method"] == GRAD_HARNESS:
                continue
            ratios = {}
            for label, method in base.items():
                b = members.get(method)
                if b is not None and b is not r and "median_s" in b:
                    ratios[label] = b["median_s"] / r["median_s"]
            if ratios:
                r["ratios"] = ratios


def _find(rows, group, method):
    for r in rows:
        if r["group"] == group and r["method"] == method and "median_s" in r:
            return r
    return None


def _targets(rows: list[dict], opts) -> list[dict]:
    """The speed targets of the issue, each as (measured, required)."""
    out = []

    def ratio(name, group, method, base, need, *, lower_is_better=False):
        r, b = _find(rows, group, method), _find(rows, group, base)
        if r is None or b is None:
            out.append({"target": name, "measured": None, "required": need, "met": None})
            return
        x = r["median_s"] / b["median_s"] if lower_is_better else b["median_s"] / r["median_s"]
        out.append({"target": name, "measured": x, "required": need,
                    "met": x <= need if lower_is_better else x >= need})

    def seconds(group, method, minus=None):
        """The row's median, less the `minus` row's of the same group; None if missing."""
        r = _find(rows, group, method)
        b = _find(rows, group, minus) if minus else None
        if r is None or (minus and b is None):
            return None
        return r["median_s"] - (b["median_s"] if b else 0.0)

    def at_most(name, x, limit_s):
        out.append({"target": name, "measured": x, "required": limit_s,
                    "met": None if x is None else x <= limit_s, "unit": "s"})

    def absolute(name, group, method, limit_s, per=1, minus=None):
        x = seconds(group, method, minus)
        at_most(name, None if x is None else x / per, limit_s)

    def per_tensor(name, method, limit_s):
        """(step of N_SMALL tensors - step of 1) / (N_SMALL - 1), harness subtracted."""
        many, one = (seconds(f"GradScaler.unscale_ + update, {count} x 64", method, GRAD_HARNESS)
                     for count in (N_SMALL, 1))
        at_most(name, None if many is None or one is None else (many - one) / (N_SMALL - 1),
                limit_s)

    big = _size_label(max(opts.sizes))
    ratio(f"all_finite f32 {big} vs np.sum(a.view(uint64)) (speed)",
          f"all_finite float32 {big}", "lscore", "np.sum(a.view(uint64))", 0.95)
    ratio("all_finite f16 1e7 vs np.isfinite(a).all()", "all_finite float16 1e7", "lscore",
          "np.isfinite(a).all()", 25.0)
    for sz in ("1e7", "1e8"):
        ratio(f"unscale_ f32 {sz} vs torch foreach", f"unscale_ float32 {sz}", "lscore",
              "torch foreach", 0.95)
        ratio(f"unscale_ f32 {sz} vs numpy", f"unscale_ float32 {sz}", "lscore",
              "a *= inv; np.isfinite(a).all()", 3.0)
    for n in opts.contention_sizes:
        ratio(f"unscale_ f32 {_size_label(n)} other core busy: threaded time / serial time",
              f"unscale_ float32 {_size_label(n)}, other core busy", "lscore", "lscore 1 thread",
              1.10, lower_is_better=True)
    for n in opts.isa_sizes:
        for what in ("all_finite", "unscale_"):
            g = f"ISA levels, {what} float32 {_size_label(n)}"
            auto = next((r["method"] for r in rows if r["group"] == g and r.get("isa") == "auto"),
                        None)
            if auto is not None and _find(rows, g, "v3") is not None:
                ratio(f"{what} f32 {_size_label(n)}: dispatched time / v3 time", g, auto, "v3",
                      1.3, lower_is_better=True)
    absolute("300 x 64 float32 unscale_: per array", f"{N_SMALL} x 64 float32",
             "lscore unscale_", 30e-9, N_SMALL)
    absolute("300 x 64 float32 all_finite: per array", f"{N_SMALL} x 64 float32",
             "lscore all_finite", 30e-9, N_SMALL)
    per_tensor("300 x 64 torch tensors: GradScaler.unscale_ + update, fixed cost per tensor "
               "(300-tensor step minus 1-tensor step, .grad assignments taken out, / 299)",
               "lscore.adapters.torch.GradScaler", 250e-9)
    absolute("300 x 64 torch tensors: GradScaler.unscale_ + update, whole step per tensor "
             "(.grad assignments taken out)", f"GradScaler.unscale_ + update, {N_SMALL} x 64",
             "lscore.adapters.torch.GradScaler", 250e-9, N_SMALL, minus=GRAD_HARNESS)
    absolute(f"NaN at index 0 of {big}", f"NaN at index 0 of {big} float32", "lscore all_finite",
             5e-6)
    absolute("DynamicLossScale.update([1 element])", "DynamicLossScale.update([1 element])",
             "lscore", 1e-6)
    absolute("import lscore beyond numpy", "import lscore (after numpy)", "subprocess", 50e-3)
    return out


def _fmt_time(s: float) -> str:
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def format_table(result: dict) -> str:
    """The rows as a Markdown table, then the targets."""
    lines = ["| group | method | median | min-max | GB/s | ratios (baseline time / this time) |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "median_s" not in r:
            lines.append(f"| {r['group']} | {r['method']} | skipped: {r['skipped']} | | | |")
            continue
        per = r.get("per", 1)
        med = _fmt_time(r["median_s"]) + (f" ({_fmt_time(r['median_s'] / per)}/array)"
                                         if per > 1 else "")
        ratios = ", ".join(f"{k} {v:.2f}x" for k, v in r.get("ratios", {}).items())
        gbps = f"{r['gbps']:.1f}" if "gbps" in r else ""
        lines.append(f"| {r['group']} | {r['method']} | {med} | {_fmt_time(r['min_s'])}-"
                     f"{_fmt_time(r['max_s'])} | {gbps} | {ratios} |")
    lines += ["", "| target | measured | required | met |", "|---|---|---|---|"]
    for t in result["targets"]:
        if t["measured"] is None:
            lines.append(f"| {t['target']} | not measured | {t['required']} | |")
            continue
        fmt = _fmt_time if t.get("unit") == "s" else (lambda x: f"{x:.2f}")
        lines.append(f"| {t['target']} | {fmt(t['measured'])} | {fmt(t['required'])} | "
                     f"{'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines)


def _machine(torch) -> dict:
    info = {"python": platform.python_version(), "numpy": np.__version__,
            "lscore": lscore.__version__, "platform": platform.platform(),
            "processor": platform.processor(), "cpus": os.cpu_count(),
            "isa": _scan.isa(), "isa_levels": _scan.isa_levels(),
            "lscore_threads": _scan.pool_size(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info


class Options:
    """Run settings; `tiny` is for tests (tiny sizes, few repeats)."""

    def __init__(self, *, full=False, tiny=False, repeat=None, min_time=None, use_torch=True,
                 progress=True, sizes=None, only=()):
        self.sizes = tuple(sizes) if sizes else (
            TINY_SIZES if tiny else (FULL_SIZES if full else SIZES))
        self.only = tuple(only)
        self.repeat = repeat or (2 if tiny else 9)
        self.min_time = min_time if min_time is not None else (1e-4 if tiny else 0.02)
        self.use_torch = use_torch
        self.progress = progress
        self.gs_max = 1e3 if tiny else 1e5
        self.import_repeat = 2 if tiny else 7
        big = [n for n in self.sizes if n >= 10 ** 6]
        self.contention_sizes = tuple(big) if big else self.sizes[-1:]
        self.isa_sizes = (4096,) if tiny else (10 ** 4, 10 ** 5, 10 ** 6)


def run(opts: Options) -> dict:
    """Every row of the benchmark, with ratios and the target check."""
    torch = _torch() if opts.use_torch else None
    rng = np.random.default_rng(0)
    n_rows = (len(opts.sizes) * len(DTYPES) * (len(_AF_METHODS) + len(_UN_METHODS))
              + 5 + 6 + 6 + 4 + 3 * len(opts.contention_sizes)
              + 2 * len(opts.isa_sizes) * (len(_scan.isa_levels()) + 1))
    rows = _Rows(n_rows, opts.progress)
    try:
        for section in SECTIONS:
            section(rows, opts, torch, rng)
            rows.flush()
    finally:
        rows.close()
    _add_ratios(rows.rows)
    return {"machine": _machine(torch),
            "settings": {"sizes": list(opts.sizes), "repeat": opts.repeat,
                         "min_time_s": opts.min_time},
            "rows": rows.rows, "targets": _targets(rows.rows, opts)}


def main(args) -> int:
    """Entry point of `lscore bench` (argparse namespace from lscore._cli)."""
    sizes = [int(float(x)) for x in args.sizes.split(",")] if args.sizes else None
    opts = Options(full=args.full, tiny=args.tiny, repeat=args.repeat, min_time=args.min_time,
                   use_torch=not args.no_torch, progress=not args.no_progress, sizes=sizes,
                   only=args.only or ())
    result = run(opts)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0
