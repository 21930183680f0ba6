"""The CPU sections of `lscore bench`: each queues and times a group of rows.

The kernels' rows are here (all_finite and unscale_ against NumPy, torch and the
memory bandwidth, many arrays, early exit, import time, a busy core, the ISA levels);
the GradScaler rows in _gradscaler.py and _scaler.py.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Callable

import numpy as np

import lscore
from lscore import kernels
from lscore.bench._gradscaler import bench_clip, bench_gradscaler, bench_torch_small
from lscore.bench._harness import (
    DTYPES,
    N_SMALL,
    TORCH_SKIP,
    Rows,
    alternating,
    as_tensor,
    busy_core,
    dtype_of,
    log_list,
    random_array,
    size_label,
    torch_unscale,
    wanted,
)
from lscore.bench._scaler import bench_scaler_calls


def _bench_arrays(rows: Rows, opts, torch, rng) -> None:
    """all_finite and unscale_ per dtype and size, with their baselines."""
    for n in opts.sizes:
        for name in DTYPES:
            dt = dtype_of(name)
            sz = size_label(n)
            g_af, g_un = f"all_finite {name} {sz}", f"unscale_ {name} {sz}"
            if dt is None:
                for g, methods in ((g_af, AF_METHODS), (g_un, UN_METHODS)):
                    for m in methods:
                        rows.add(g, m, skip="ml_dtypes is not installed", dtype=name, n=n)
                continue
            a = random_array(rng, dt, n)
            nb = a.nbytes
            kw = dict(dtype=name, n=n, opts=opts)
            rows.add(g_af, "lscore", lambda a=a: kernels.all_finite(a), nbytes=nb, **kw)
            rows.add(g_af, "lscore 1 thread", lambda a=a: kernels.all_finite(a, 1), nbytes=nb, **kw)
            rows.add(
                g_af, "np.isfinite(a).all()", lambda a=a: np.isfinite(a).all(), nbytes=nb, **kw
            )
            words = a.view(np.uint64)
            rows.add(g_af, "np.sum(a.view(uint64))", lambda w=words: np.sum(w), nbytes=nb, **kw)
            rows.add(g_af, "C read loop", lambda a=a: kernels.read_bandwidth(a), nbytes=nb, **kw)

            inv = alternating([0.5, 2.0])
            rows.add(
                g_un, "lscore", lambda a=a, inv=inv: kernels.unscale_(a, inv()), nbytes=2 * nb, **kw
            )
            rows.add(
                g_un,
                "lscore 1 thread",
                lambda a=a, inv=inv: kernels.unscale_(a, inv(), False, 1),
                nbytes=2 * nb,
                **kw,
            )
            rows.add(
                g_un,
                "lscore stats=True",
                lambda a=a, inv=inv: kernels.unscale_(a, inv(), True),
                nbytes=2 * nb,
                **kw,
            )

            def numpy_unscale(a=a, inv=inv):
                np.multiply(a, inv(), out=a)
                return np.isfinite(a).all()

            rows.add(g_un, "a *= inv; np.isfinite(a).all()", numpy_unscale, nbytes=2 * nb, **kw)
            if torch is None:
                rows.add(g_un, "torch foreach", skip=TORCH_SKIP, **kw)
            else:
                rows.add(
                    g_un,
                    "torch foreach",
                    torch_unscale(torch, [as_tensor(torch, a)]),
                    nbytes=2 * nb,
                    **kw,
                )
            dst = np.empty_like(a)
            rows.add(g_un, "np.copyto", lambda dst=dst, a=a: np.copyto(dst, a), nbytes=2 * nb, **kw)
            rows.add(
                g_un,
                "C memcpy",
                lambda dst=dst, a=a: kernels.copy_bandwidth(dst, a),
                nbytes=2 * nb,
                **kw,
            )
            rows.flush()
            del a, dst, words


AF_METHODS = (
    "lscore",
    "lscore 1 thread",
    "np.isfinite(a).all()",
    "np.sum(a.view(uint64))",
    "C read loop",
)
UN_METHODS = (
    "lscore",
    "lscore 1 thread",
    "lscore stats=True",
    "a *= inv; np.isfinite(a).all()",
    "torch foreach",
    "np.copyto",
    "C memcpy",
)


def _bench_small(rows: Rows, opts, torch, rng) -> None:
    """300 arrays of 64 elements (the fixed cost per array), and 300 of log-uniform
    sizes 1e2..1e5 (a model's gradients), per dtype."""
    for name in DTYPES:
        dt = dtype_of(name)
        for label, sizes in (("x 64", [64] * N_SMALL), log_list(opts)):
            g = f"{N_SMALL} {label} {name}" if label == "x 64" else f"unscale_ {name} {label}"
            kw = dict(dtype=name, n=int(np.sum(sizes)), per=N_SMALL, opts=opts)
            if not wanted(opts, g):
                continue
            if dt is None:
                rows.add(g, "lscore unscale_", skip="ml_dtypes is not installed", **kw)
                continue
            _list_rows(rows, g, [random_array(rng, dt, int(n)) for n in sizes], torch, kw)
            rows.flush()


def _list_rows(rows: Rows, g: str, arrays: list, torch, kw: dict) -> None:
    """The rows of one many-array group (queued; the caller flushes)."""
    nb = sum(a.nbytes for a in arrays)
    inv = alternating([0.5, 2.0])
    small = " x 64 " in g
    if small:
        rows.add(g, "lscore all_finite", lambda: kernels.all_finite(arrays), nbytes=nb, **kw)
    rows.add(g, "lscore unscale_", lambda: kernels.unscale_(arrays, inv()), nbytes=2 * nb, **kw)
    if not small:
        rows.add(
            g,
            "lscore stats=True",
            lambda: kernels.unscale_(arrays, inv(), True),
            nbytes=2 * nb,
            **kw,
        )
    if small and kw["dtype"] == "float32":
        rows.add(
            g,
            "numpy loop isfinite().all()",
            lambda: all(np.isfinite(a).all() for a in arrays),
            nbytes=nb,
            **kw,
        )
        rows.add(g, "numpy loop a *= inv; isfinite", _numpy_loop(arrays, inv), nbytes=2 * nb, **kw)
    if torch is None:
        rows.add(g, "torch foreach", skip=TORCH_SKIP, **kw)
    else:
        tensors = [as_tensor(torch, a) for a in arrays]
        rows.add(g, "torch foreach", torch_unscale(torch, tensors), nbytes=2 * nb, **kw)


def _numpy_loop(arrays, inv):
    def numpy_loop():
        f = inv()
        ok = True
        for a in arrays:
            np.multiply(a, f, out=a)
            ok &= bool(np.isfinite(a).all())
        return ok

    return numpy_loop


def _bench_latency(rows: Rows, opts, torch, rng) -> None:
    """Early exit, the per-step update and the import time."""
    n = max(opts.sizes)
    a = np.ones(n, np.float32)
    a[0] = np.nan
    g = f"NaN at index 0 of {size_label(n)} float32"
    rows.add(
        g, "lscore all_finite", lambda a=a: kernels.all_finite(a), dtype="float32", n=n, opts=opts
    )
    rows.add(
        g, "np.isfinite(a).all()", lambda a=a: np.isfinite(a).all(), dtype="float32", n=n, opts=opts
    )
    rows.flush()
    del a
    ls = lscore.DynamicLossScale()
    grads = [np.ones(1, np.float32)]
    rows.add(
        "DynamicLossScale.update([1 element])",
        "lscore",
        lambda: ls.update(grads),
        dtype="float32",
        n=1,
        opts=opts,
    )
    if not opts.only or any(w in "import lscore" for w in opts.only):
        row = _import_time(opts)
        rows.append(row)


def _import_time(opts) -> dict:
    """`import lscore` after `import numpy`, in fresh interpreters, bytecode cached as
    after a pip install (one warm-up run writes it where PYTHONDONTWRITEBYTECODE said not to)."""
    code = (
        "import time; t0 = time.perf_counter(); import numpy; t1 = time.perf_counter(); "
        "import lscore; t2 = time.perf_counter(); print(t1 - t0, t2 - t1)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    deltas = []
    for k in range(opts.import_repeat + 1):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        ).stdout.split()
        if k:
            deltas.append(float(out[1]))
    return {
        "group": "import lscore (after numpy)",
        "method": "subprocess",
        "bytes": 0,
        "per": 1,
        "median_s": statistics.median(deltas),
        "min_s": min(deltas),
        "max_s": max(deltas),
        "calls": 1,
        "repeats": len(deltas),
    }


def _bench_contention(rows: Rows, opts, torch, rng) -> None:
    """unscale_ threaded vs serial while another process keeps a core busy."""
    with busy_core():
        for n in opts.contention_sizes:
            a = random_array(rng, np.float32, n)
            inv = alternating([0.5, 2.0])
            g = f"unscale_ float32 {size_label(n)}, other core busy"
            kw = dict(dtype="float32", n=n, opts=opts)
            rows.add(
                g,
                "lscore",
                lambda a=a, inv=inv: kernels.unscale_(a, inv()),
                nbytes=2 * a.nbytes,
                **kw,
            )
            rows.add(
                g,
                "lscore 1 thread",
                lambda a=a, inv=inv: kernels.unscale_(a, inv(), False, 1),
                nbytes=2 * a.nbytes,
                **kw,
            )
            rows.add(
                g,
                "lscore 2 threads",
                lambda a=a, inv=inv: kernels.unscale_(a, inv(), False, 2),
                nbytes=2 * a.nbytes,
                **kw,
            )
            rows.flush()
            del a


def _bench_isa(rows: Rows, opts, torch, rng) -> None:
    """The kernels at each ISA level this CPU runs (serial, in-cache sizes)."""
    levels = kernels.isa_levels()
    auto = kernels.isa()
    for n in opts.isa_sizes:
        a = random_array(rng, np.float32, n)
        inv = alternating([0.5, 2.0])
        for what in ("all_finite", "unscale_"):
            g = f"ISA levels, {what} float32 {size_label(n)}"

            def check(a=a):
                return kernels.all_finite(a, 1)

            def unscale(a=a, inv=inv):
                return kernels.unscale_(a, inv(), False, 1)

            fn: Callable[[], object] = check if what == "all_finite" else unscale
            for level in [*levels, "auto"]:
                rows.add(
                    g,
                    f"{level} ({auto})" if level == "auto" else level,
                    fn,
                    nbytes=a.nbytes * (1 if what == "all_finite" else 2),
                    dtype="float32",
                    n=n,
                    opts=opts,
                    isa=level,
                    before=lambda name=(auto if level == "auto" else level): kernels.set_isa(name),
                )
            try:
                rows.flush()
            finally:
                kernels.set_isa(auto)


SECTIONS = (
    _bench_arrays,
    _bench_small,
    bench_clip,
    bench_gradscaler,
    bench_torch_small,
    bench_scaler_calls,
    _bench_latency,
    _bench_contention,
    _bench_isa,
)
