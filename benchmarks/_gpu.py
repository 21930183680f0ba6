"""`lscore bench --suite gpu-host` and `--suite gpu`: the CuPy path's host cost, and the GPU rows.

gpu-host (no GPU needed): the public ``unscale_`` / ``all_finite`` of the CuPy
adapter's code (``lscore.cuda.ArrayKernels``: the compiled walk, the plan
cache, the packed launches, the read of the flag) on arrays shaped like CuPy's
(``StandInArray``: ``data.ptr``, ``data.device_id``, ``size``, ``dtype``,
``flags``), with only the device replaced: memory is host memory and a
launch or a synchronisation does nothing (``NullBackend``).  What is timed
is therefore what a GPU call costs the host besides the kernels' own time
and the one synchronisation.

gpu: the same calls on CuPy arrays against torch's foreach kernel (plus its
``found_inf.item()``) and a plain CuPy loop, on the same memory in the same
run, then whole optimizer steps (_gpu_step.py); every row is skipped, with
the reason, without a CUDA device.
"""

from __future__ import annotations

import gc
import statistics
import time
import types
import weakref
from typing import Any

import numpy as np

from lscore import cuda, kernels
from lscore.bench import _gpu_step
from lscore.bench._harness import Rows, alternating, import_torch, workload_sizes

# (name, array count, sizes: "log" for log-uniform 1e2..1e6 else the size, dtype)
WORKLOADS = (
    ("300 log-uniform 1e2..1e6 float32", 300, "log", "float32"),
    ("300 x 64 float32", 300, 64, "float32"),
    ("2000 x 4096 float16", 2000, 4096, "float16"),
)
TINY_WORKLOADS = (
    ("30 log-uniform 1e2..1e4 float32", 30, "log", "float32"),
    ("30 x 64 float32", 30, 64, "float32"),
    ("200 x 256 float16", 200, 256, "float16"),
)
BIG = (
    ("1 x 1e8 float32", 1, 10**8, "float32"),
    ("1 x 2e8 float16", 1, 2 * 10**8, "float16"),
    ("1 x 2e8 bfloat16", 1, 2 * 10**8, "bfloat16"),
)
# the host-cost targets, in microseconds
CACHED_PER_ARRAY_US = 0.2
CACHED_PER_CALL_US = 15.0
FIRST_PER_ARRAY_US = 2.0
# a call over arrays at addresses never seen before: host cost, with no upload and no
# synchronisation besides the call's own read of its result
NEW_ADDRESSES_PER_ARRAY_US = 1.0


class _MemoryPointer:
    """The fields of cupy.cuda.MemoryPointer that lscore reads."""

    __slots__ = ("device_id", "mem", "ptr")

    def __init__(self, ptr: int, device_id: int, mem):
        self.ptr, self.device_id, self.mem = ptr, device_id, mem


class _Flags:
    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, c: bool, f: bool):
        self.c_contiguous, self.f_contiguous, self.owndata = c, f, False


class StandInArray:
    """A cupy.ndarray-shaped view of host memory (for timing the host side without a GPU).

    ``data.ptr``, ``data.device_id``, ``size``, ``dtype``, ``_c_contiguous``
    and ``_f_contiguous`` are plain slots, as CuPy's are readonly C fields;
    ``flags`` builds an object on every read, as CuPy's does.  ``host`` is the
    NumPy array behind it.
    """

    __slots__ = (
        "__weakref__",
        "_c_contiguous",
        "_f_contiguous",
        "data",
        "dtype",
        "host",
        "shape",
        "size",
        "strides",
    )

    def __init__(self, host: np.ndarray, device: int = 0):
        self.host = host
        self.data = _MemoryPointer(host.ctypes.data, device, host)
        self.size, self.dtype, self.shape, self.strides = (
            host.size,
            host.dtype,
            host.shape,
            host.strides,
        )
        self._c_contiguous = host.flags.c_contiguous
        self._f_contiguous = host.flags.f_contiguous

    @property
    def flags(self) -> _Flags:
        return _Flags(self._c_contiguous, self._f_contiguous)


STANDIN_XP = types.SimpleNamespace(__name__="cupy", ndarray=StandInArray)


class NullBackend:
    """lscore.cuda backend whose device is host memory and whose launches do nothing.

    Everything up to the launch runs as on a GPU; ``launches`` counts the
    launches, ``syncs`` the reads of the flag (the one synchronisation) and
    ``uploads`` the host-to-device copies (each a synchronisation on a GPU).
    `large_kernel_params`: the launches carry 32 KB of arguments, as on a CUDA
    12.1+ driver with an sm_70+ device (``CupyBackend``'s test), or 4 KB.
    """

    xp = np

    def __init__(self, device: int = 0, *, large_kernel_params: bool = True):
        self.large_kernel_params = large_kernel_params
        self.device = device
        self.launches = 0
        self.syncs = 0
        self.uploads = 0
        self._ptrs: dict = {}

    def ptr(self, a) -> int:
        """`a`'s address.  CuPy reads it as a field (``a.data.ptr``, tens of ns); NumPy builds
        a ctypes object for it (about 2 us), so each array's address is remembered (by id,
        checked through a weak reference) to time what a GPU backend costs."""
        hit = self._ptrs.get(id(a))
        if hit is not None and hit[0]() is a:
            return hit[1]
        if len(self._ptrs) > 4096:
            self._ptrs.clear()
        addr = a.ctypes.data
        self._ptrs[id(a)] = (weakref.ref(a), addr)
        return addr

    def get(self, a) -> np.ndarray:
        return np.array(a)

    def to_device(self, host: np.ndarray) -> np.ndarray:
        self.uploads += 1
        return np.array(host, copy=True)

    def function(self, name: str) -> str:
        return name

    def enter(self) -> int:
        return self.device

    def leave(self, prev: int) -> None:
        pass

    def stream(self) -> int:
        return 0

    def launch_packed(self, fn, grid, block, params, widths, nparams, stream) -> None:
        self.launches += 1

    def read_word(self, a) -> int:
        self.syncs += 1
        return int(a[0])

    def launch(self, name: str, grid: int, block: int, args: tuple, stream=None) -> None:
        self.launches += 1


def standin_kernels(make_backend=NullBackend) -> cuda.ArrayKernels:
    """The CuPy adapter's ArrayKernels bound to StandInArray and `make_backend(device)`."""
    return cuda.ArrayKernels(
        STANDIN_XP, make_backend, array_type=StandInArray, kind=kernels.READ_CUDA_ARRAY
    )


class _HostLists:
    """Lists of StandInArrays of the given sizes over one host buffer, 64-byte aligned;
    ``make(shift)`` starts `shift` slots in, so each shift gives every array a new address."""

    def __init__(self, sizes, dtype, shifts: int):
        self.dt = np.dtype(dtype)
        self.pad = 64 // self.dt.itemsize
        self.sizes = sizes
        self.starts = np.cumsum([0] + [-(-n // self.pad) * self.pad + self.pad for n in sizes])
        self.buf = np.ones(int(self.starts[-1]) + self.pad * (shifts + 1), self.dt)

    def make(self, shift: int = 0, wrap: Any = StandInArray) -> list:
        off = self.pad * shift
        return [
            wrap(self.buf[off + s : off + s + n])
            for s, n in zip(self.starts[:-1].tolist(), self.sizes, strict=True)
        ]


def _first_sight(fn, lists) -> list[float]:
    """Seconds of fn(list) for each list, each list seen once (the first one is not timed
    by the caller's warm-up: every list here is new to `fn`)."""
    out = []
    gc.disable()
    try:
        for a in lists:
            t0 = time.perf_counter()
            fn(a)
            out.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return out


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
        host = _HostLists(sizes, dtype, opts.first_lists)
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
            ups, syncs = backend.uploads, backend.syncs
            ts = _first_sight(call, lists)
            # beyond each call's one read of its result
            new_addresses[op] = (backend.uploads - ups, backend.syncs - syncs - len(lists))
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
                {
                    "target": f"{name}: {op} over arrays at new addresses, host cost per array "
                    "(no upload, no synchronisation besides the result's read)",
                    "workload": name,
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


def null_adapter(kern: cuda.ArrayKernels | None = None):
    """lscore.adapters.cupy's optimizer classes bound to NumPy arrays and NullBackend
    (through `kern`, by default a new ``ArrayKernels`` of NullBackends).

    The fused step's host side as on a GPU (the walk and plan lookup, the
    packed launches of the check, the update and the scale update, the
    sync-free bookkeeping), with the launches and the one read of the
    default mode done by NullBackend.  CuPy's own per-step array operations
    (casting the device scale for ``minimize``) are NumPy's here, cheaper
    than a CuPy launch.
    """
    from lscore.adapters import device

    if kern is None:
        kern = cuda.ArrayKernels(np, NullBackend, kind=kernels.READ_NUMPY)
    return device.bind(np, kern)


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
        host = _HostLists(sizes, dtype, opts.first_lists)
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

                ups, syncs = backend.uploads, backend.syncs
                ts = _first_sight(new_grads, lists)
                uploads = backend.uploads - ups
                extra = backend.syncs - syncs - reads * len(lists)
                first = statistics.median(ts) / count * 1e6
                rows.append(
                    _first_sight_row(
                        g, f"{method} step, gradients at new addresses", ts, count, dtype
                    )
                )
                targets.append(
                    {
                        "target": f"{wname}: {method} {name} step over gradients at new "
                        "addresses, host cost per array (no upload, no synchronisation "
                        "besides the mode's own reads)",
                        "workload": wname,
                        "op": f"{method} {name} step",
                        "unit": "us_per_array",
                        "case": "new_addresses",
                        "cached": False,
                        "measured": first,
                        "uploads": uploads,
                        "syncs": extra,
                        "required": NEW_ADDRESSES_PER_ARRAY_US,
                        "met": first <= NEW_ADDRESSES_PER_ARRAY_US and uploads == 0 and extra == 0,
                    }
                )
                del lists
            rows.flush()
    return targets


# ---- --suite gpu --------------------------------------------------------------

# why the GPU rows cannot run here, or None
gpu_skip_reason = cuda.device_missing


GPU_METHODS = (
    "lscore unscale_",
    "lscore all_finite",
    "torch foreach + found_inf.item()",
    "cupy loop g *= inv; isfinite().all()",
)


def run_gpu(opts, rows: Rows, rng) -> list[dict]:
    """Whole-call rows on a GPU against torch foreach and a CuPy loop; returns the targets."""
    reason = gpu_skip_reason()
    workloads = (TINY_WORKLOADS if opts.tiny else WORKLOADS) + (() if opts.tiny else BIG)
    if reason is not None:
        for name, *_ in workloads:
            for m in GPU_METHODS:
                rows.add(f"gpu {name}", m, skip=reason, opts=opts)
        return [
            {
                "target": f"gpu {name}: lscore unscale_ vs torch foreach",
                "measured": None,
                "required": 1.0,
                "met": None,
                "skipped": reason,
            }
            for name, *_ in workloads
        ] + _gpu_step.skipped_rows(rows, opts, reason)
    import cupy

    from lscore.adapters import cupy as lcp

    torch = import_torch()
    torch_cuda = torch is not None and torch.cuda.is_available()
    targets = []
    for name, count, size, dtype in workloads:
        g = f"gpu {name}"
        if dtype == "bfloat16":
            for m in GPU_METHODS:
                rows.add(
                    g,
                    m,
                    skip="cupy has no bfloat16 arrays (and torch's foreach kernel "
                    "refuses bfloat16)",
                    opts=opts,
                )
            continue
        sizes = workload_sizes(rng, count, size, opts.tiny)
        arrays = [cupy.ones(n, dtype) for n in sizes]
        nb = sum(a.nbytes for a in arrays)
        inv = alternating([0.5, 2.0])
        kw = dict(dtype=dtype, n=count, per=count, opts=opts)
        rows.add(
            g,
            GPU_METHODS[0],
            lambda arrays=arrays, inv=inv: lcp.unscale_(arrays, inv()),
            nbytes=2 * nb,
            **kw,
        )
        rows.add(g, GPU_METHODS[1], lambda arrays=arrays: lcp.all_finite(arrays), nbytes=nb, **kw)
        if torch_cuda:
            tensors = [torch.as_tensor(a, device="cuda") for a in arrays]
            found = torch.zeros(1, device="cuda")
            tinvs = alternating([torch.full((1,), v, device="cuda") for v in (0.5, 2.0)])
            op = torch._amp_foreach_non_finite_check_and_unscale_

            def torch_call(op=op, tensors=tensors, found=found, tinvs=tinvs):
                op(tensors, found, tinvs())
                return found.item()

            rows.add(g, GPU_METHODS[2], torch_call, nbytes=2 * nb, **kw)
        else:
            rows.add(g, GPU_METHODS[2], skip="torch with CUDA is not installed", opts=opts)

        def cupy_loop(arrays=arrays, inv=inv):
            v = inv()
            finite = cupy.ones((), bool)
            for a in arrays:
                a *= v
                finite &= cupy.isfinite(a).all()
            return bool(finite)

        rows.add(g, GPU_METHODS[3], cupy_loop, nbytes=2 * nb, **kw)
        rows.flush()
        by = {r["method"]: r for r in rows.rows if r["group"] == g and "median_s" in r}
        for base in GPU_METHODS[2:]:
            if GPU_METHODS[0] in by and base in by:
                x = by[base]["median_s"] / by[GPU_METHODS[0]]["median_s"]
                targets.append(
                    {
                        "target": f"{g}: lscore unscale_ vs {base}",
                        "measured": x,
                        "required": 1.0,
                        "met": x >= 1.0,
                    }
                )
    return targets + _gpu_step.run_steps(_gpu_step.cupy_device(), opts, rows, rng)
