"""Per-step cost of lscore's torch GradScaler against torch.amp.GradScaler("cpu").

Two cases from the torch adapter's issue: 300 float32 gradients with sizes
log-uniform in 1e2..1e5 (memory-bound; shown next to a plain copy of the same
bytes) and 300 gradients of 64 elements (overhead-bound).  For each, the two
scalers time ``unscale_ + update`` and ``unscale_ + step + update`` on the same
parameters, interleaved repetition by repetition so machine noise hits both
alike; the figure is the median over repetitions.  ``rows()`` returns the
table for ``lscore bench``; ``python -m lscore._torch_bench`` prints it.
torch is imported when called.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

# scale = 1 + 2**-23: the multiply by inv_scale happens (inv != 1) but the
# gradients shrink by only 1.2e-7 per step, so no run drifts into subnormals
_SCALE = 1.0 + 2.0 ** -23


def _sizes(case: str, rng: np.random.Generator) -> np.ndarray:
    if case == "log-uniform":
        return np.exp(rng.uniform(np.log(1e2), np.log(1e5), 300)).astype(np.int64)
    return np.full(300, 64, np.int64)


def _per_step(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def rows(repeats: int = 15, seed: int = 0, cases=("log-uniform", "64"),
         threads: int | None = None) -> list[dict]:
    """One row per (case, implementation, operation): microseconds per step.

    Columns: case, impl ("torch", "lscore" or "copy"), op, n_tensors, mbytes,
    us (median per step), us_min, ratio (median of the per-repetition ratios
    to torch, same case and op: robust to load that drifts between
    repetitions), threads (torch's intra-op threads; `threads` sets them for
    the run and restores them after).
    """
    import torch

    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _rows(torch, repeats, seed, cases)
    finally:
        torch.set_num_threads(old_threads)


def _rows(torch, repeats, seed, cases) -> list[dict]:
    from lscore.adapters.torch import GradScaler

    rng = np.random.default_rng(seed)
    out = []
    for case in cases:
        sizes = _sizes(case, rng)
        params = []
        for n in sizes:
            p = torch.nn.Parameter(torch.zeros(int(n)))
            p.grad = torch.randn(int(n))
            params.append(p)
        opt = torch.optim.SGD(params, lr=0.0)
        nbytes = int(sizes.sum()) * 4
        scalers = {"torch": torch.amp.GradScaler("cpu", init_scale=_SCALE,
                                                 growth_interval=2 ** 30),
                   "lscore": GradScaler("cpu", init_scale=_SCALE, growth_interval=2 ** 30)}
        for s in scalers.values():
            s.scale(torch.ones(()))
        ops = {
            "unscale_+update": lambda s: (s.unscale_(opt), s.update()),
            "unscale_+step+update": lambda s: (s.unscale_(opt), s.step(opt), s.update()),
        }
        iters = 3 if case == "log-uniform" else 20
        src = np.ones(nbytes // 4, np.float32)
        dst = np.empty_like(src)
        times: dict = {}
        for _ in range(repeats):
            for op, body in ops.items():
                for impl, s in scalers.items():
                    times.setdefault((impl, op), []).append(
                        _per_step(lambda: body(s), iters))
            times.setdefault(("copy", "copy same bytes"), []).append(
                _per_step(lambda: np.copyto(dst, src), iters))
        med = {k: statistics.median(v) for k, v in times.items()}
        for (impl, op), v in times.items():
            t_ref = times.get(("torch", op))
            ratio = (None if t_ref is None or impl == "copy"
                     else statistics.median(a / b for a, b in zip(v, t_ref)))
            out.append({
                "case": case, "impl": impl, "op": op, "n_tensors": len(sizes),
                "mbytes": round(nbytes / 1e6, 2), "us": round(med[(impl, op)] * 1e6, 1),
                "us_min": round(min(v) * 1e6, 1),
                "ratio": None if ratio is None else round(ratio, 3),
                "threads": torch.get_num_threads(),
            })
    return out


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    rs = rows(repeats=a.repeats, threads=a.threads)
    print(f"torch threads: {rs[0]['threads']}")
    print(f"{'case':<12} {'impl':<7} {'op':<22} {'MB':>6} {'us/step':>10} {'min':>10} "
          f"{'vs torch':>9}")
    for r in rs:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}"
        print(f"{r['case']:<12} {r['impl']:<7} {r['op']:<22} {r['mbytes']:>6} "
              f"{r['us']:>10.1f} {r['us_min']:>10.1f} {ratio:>9}")


if __name__ == "__main__":
    main()
