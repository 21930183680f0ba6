"""`lscore bench --suite gpu`: the CuPy path's whole calls on a GPU.

The calls of ``--suite gpu-host`` (_gpu_host.py) on CuPy arrays against torch's
foreach kernel (plus its ``found_inf.item()``) and a plain CuPy loop, on the same
memory in the same run, then whole optimizer steps (_gpu_step.py); every row is
skipped, with the reason, without a CUDA device.
"""

from __future__ import annotations

from lscore import cuda
from lscore.bench import _gpu_step
from lscore.bench._harness import (
    BIG,
    TINY_WORKLOADS,
    WORKLOADS,
    Rows,
    alternating,
    import_torch,
    workload_sizes,
)

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
