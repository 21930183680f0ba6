"""The CPU sections of `lscore bench`: each queues and times a group of rows."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
from collections.abc import Callable

import numpy as np

import lscore
from lscore import kernels
from lscore.bench._harness import (
    DTYPES,
    N_SMALL,
    TORCH_SKIP,
    Rows,
    alternating,
    as_tensor,
    busy_core,
    dtype_of,
    log_uniform_sizes,
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


def log_list(opts) -> tuple[str, list[int]]:
    """The many-array workload of the list rows and the clipped-step rows: (label, sizes)."""
    hi = int(opts.gs_max)
    return f"{N_SMALL} log-uniform 1e2..{size_label(hi)}", log_uniform_sizes(hi)


def _numpy_loop(arrays, inv):
    def numpy_loop():
        f = inv()
        ok = True
        for a in arrays:
            np.multiply(a, f, out=a)
            ok &= bool(np.isfinite(a).all())
        return ok

    return numpy_loop


def _gradscaler_model(torch, sizes):
    params = [torch.nn.Parameter(torch.zeros(int(s))) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape)
    return params, torch.optim.SGD(params, lr=1e-6, foreach=True)


def _bench_gradscaler(rows: Rows, opts, torch, rng) -> None:
    """Whole GradScaler steps (unscale_, step, update) on 300 float32 parameters."""
    cases = (
        (f"{N_SMALL} x 64", [64] * N_SMALL),
        (f"{N_SMALL} log-uniform 1e2..1e5", log_uniform_sizes(opts.gs_max)),
    )
    adapter: type | None = None
    with contextlib.suppress(ImportError):
        from lscore.adapters.torch import GradScaler as adapter
    for label, sizes in cases:
        g = f"GradScaler step, {label}"
        kw = dict(dtype="float32", n=int(np.sum(sizes)), per=N_SMALL, opts=opts)
        methods = (
            "torch.amp.GradScaler('cpu')",
            "lscore core + SGD (numpy views)",
            "lscore.adapters.torch.GradScaler",
        )
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
    scales = alternating([2.0, 0.5])
    if method.startswith("lscore core"):
        state = lscore.LossScaleState(lscore.Policy(name="bench", init_scale=2.0))

        def core_step():
            grads = [p.grad.numpy() for p in params]
            finite = kernels.unscale_(grads, 1.0 / state.scale)
            if state.update(finite):
                opt.step()
            state.set_scale(scales())

        return core_step
    cls = adapter if method.startswith("lscore.adapters") else torch.amp.GradScaler
    scaler = cls("cpu", init_scale=2.0, growth_interval=1 << 30)
    scaler.scale(torch.ones(()))

    def step():
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update(scales())

    return step


def _bench_torch_small(rows: Rows, opts, torch, rng) -> None:
    """GradScaler.unscale_ + update on 300 parameters of 64 elements, and on
    one: the fixed cost per torch tensor of the whole path (.grad, dtype,
    device, strides, data pointer), with fresh gradient tensors every step as
    after torch's default zero_grad(set_to_none=True).  The 1-tensor rows give
    the per-step part, so the targets can take the per-tensor part alone."""
    methods = (GRAD_HARNESS, "torch.amp.GradScaler('cpu')", "lscore.adapters.torch.GradScaler")
    adapter: type | None
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
            rows.add(
                g,
                m,
                _torch_small_step(torch, m, grads, adapter),
                nbytes=0 if m == GRAD_HARNESS else 2 * 4 * 64 * count,
                **kw,
            )
        rows.flush()


def _torch_small_step(torch, method, grads, adapter):
    """One step of `method` on its own parameters, given new .grad tensors first."""
    params = [torch.nn.Parameter(torch.zeros(64)) for _ in grads[0]]
    opt = torch.optim.SGD(params, lr=1e-6)
    turn = alternating([0, 1])

    def new_grads():
        for p, g in zip(params, grads[turn()], strict=True):  # new .grad objects each step
            p.grad = g

    if method == GRAD_HARNESS:
        return new_grads
    scaler = (adapter if method.startswith("lscore") else torch.amp.GradScaler)(
        "cpu", init_scale=1.0, growth_interval=1 << 30
    )
    scaler.scale(torch.ones(()))

    def step():
        new_grads()
        scaler.unscale_(opt)
        scaler.update()

    return step


# the part of a step that stands for backward(): the scalers' rows include it
GRAD_HARNESS = "assigning new .grad tensors (in every row)"


CLIP_METHODS = (
    "lscore.adapters.torch.GradScaler.unscale_and_clip_",
    "torch GradScaler.unscale_ + clip_grad_norm_(foreach=True)",
)
CLIP_DTYPES = ("float16", "bfloat16", "float32")


def _bench_clip(rows: Rows, opts, torch, rng) -> None:
    """A clipped step's scaler work: lscore's one pass against torch's unscale_ and
    clip_grad_norm_(params, 1.0, foreach=True) on the same CPU tensors, then update()
    in both, for one big tensor (the sizes from 1e7 up) and the 300-tensor list."""
    big = [n for n in opts.sizes if n >= 10**7] or list(opts.sizes[-1:])
    cases = [*((size_label(n), [n]) for n in big), log_list(opts)]
    adapter: type | None
    try:
        from lscore.adapters.torch import GradScaler as adapter
    except ImportError:
        adapter = None
    for label, sizes in cases:
        for name in CLIP_DTYPES:
            g = f"unscale_and_clip_ {name} {label}"
            kw = dict(dtype=name, n=int(np.sum(sizes)), per=len(sizes), opts=opts)
            if not wanted(opts, g):
                continue
            if torch is None or adapter is None:
                why = TORCH_SKIP if torch is None else "lscore.adapters.torch is not available"
                for m in CLIP_METHODS:
                    rows.add(g, m, skip=why, **kw)
                continue
            dt = getattr(torch, name)
            nb = 2 * 2 * dt.itemsize * int(np.sum(sizes))  # unscale and clip: two passes in torch
            for m in CLIP_METHODS:
                step, note = _clip_step(torch, m, sizes, dt, adapter)
                rows.add(g, m, step, nbytes=nb, **({"note": note} if note else {}), **kw)
            rows.flush()


def _clip_step(torch, method, sizes, dt, adapter):
    """One clipped step of `method` on its own parameters (scale alternating 2.0 / 0.5)."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(int(s), dtype=dt)) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(dt)
    opt = torch.optim.SGD(params, lr=1e-6)
    scales = alternating([2.0, 0.5])
    fp16 = dt == torch.float16
    if method == CLIP_METHODS[0]:
        scaler = adapter("cpu", init_scale=2.0, growth_interval=1 << 30, allow_fp16_params=fp16)
        scaler.scale(torch.ones(()))

        def step():
            scaler.unscale_and_clip_(opt, 1.0)
            scaler.update(scales())

        return step, None
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0, growth_interval=1 << 30)
    scaler.scale(torch.ones(()))
    if not fp16:

        def step():
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            scaler.update(scales())

        return step, None
    # torch's GradScaler refuses float16 gradients; run the kernel its unscale_ runs
    grads = [p.grad for p in params]
    found = torch.zeros(1)

    def step_fp16():
        inv = torch.full((1,), 1.0 / scaler.get_scale())
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        found.item()
        scaler.update(scales())

    return step_fp16, "float16: GradScaler refuses it, so its foreach kernel is called directly"


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
    _bench_clip,
    _bench_gradscaler,
    _bench_torch_small,
    bench_scaler_calls,
    _bench_latency,
    _bench_contention,
    _bench_isa,
)
