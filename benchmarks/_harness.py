"""Timing and inputs of `lscore bench`: rows timed in turns, seeded arrays, torch views."""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import statistics
import subprocess
import sys
import time

import numpy as np

SIZES = (10**3, 10**4, 10**5, 10**6, 10**7)
FULL_SIZES = (*SIZES, 10**8)
TINY_SIZES = (10**3, 4096)
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


def alternating(values):
    """A callable giving values[0], values[1], values[0], ... (in-place rows never drift)."""
    return itertools.cycle(values).__next__


class Rows:
    """The rows of one run, with progress on stderr (tqdm when installed).

    `add` queues a row; `flush` times every queued row, taking their
    `repeat` timings in turns (row 1, row 2, ..., row 1, row 2, ...), so that
    the rows compared with each other see the same machine: on a shared host
    a slow spell then lands on all of them instead of on one.  Callers flush
    before the variables their functions use change.
    """

    def __init__(self, total: int, progress: bool, only: tuple[str, ...] = ()):
        self.rows: list[dict] = []
        self.groups: set[str] = set()  # every group offered, kept or not (for --only's error)
        self._only = only  # --only: keep the rows whose group contains one of these
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

    def wanted(self, *groups: str, opts=None) -> bool:
        """Whether --only keeps a row of any of these groups (all, without --only): a
        caller skips the set-up of groups that no row will time."""
        only = self._only or (opts.only if opts is not None else ())
        self.groups.update(groups)
        return not only or any(w in g for g in groups for w in only)

    def add(
        self,
        group: str,
        method: str,
        fn=None,
        *,
        nbytes: int = 0,
        per: int = 1,
        skip: str | None = None,
        opts=None,
        before=None,
        **extra,
    ) -> None:
        """Queue a row timing fn (a skipped row when skip is given or fn is None);
        `before` runs ahead of each of its timings (e.g. to pick an ISA level).
        With --only, a row of a group it does not name is dropped, skipped rows too."""
        if not self.wanted(group, opts=opts):
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
            for _row, fn, before, opts in queued:
                if before is not None:
                    before()
                ks.append(_calls_per_timing(fn, opts.min_time))
            for _ in range(max(opts.repeat for *_, opts in queued)):
                for i, (_row, fn, before, opts) in enumerate(queued):
                    if len(samples[i]) < opts.repeat:
                        if before is not None:
                            before()
                        samples[i].append(_timing(fn, ks[i]))
        finally:
            gc.enable()
        for (row, *_), k, ts in zip(queued, ks, samples, strict=True):
            row.update(
                {
                    "median_s": statistics.median(ts),
                    "min_s": min(ts),
                    "max_s": max(ts),
                    "calls": k,
                    "repeats": len(ts),
                }
            )
            if row["bytes"]:
                row["gbps"] = row["bytes"] / row["median_s"] / 1e9
            self._tick(row)

    def append(self, row: dict) -> None:
        """Add a row measured elsewhere (e.g. in a subprocess)."""
        self.groups.add(row["group"])
        if self._only and not any(w in row["group"] for w in self._only):
            return
        self.rows.append(row)
        self._tick(row)

    def _tick(self, row: dict) -> None:
        self._done += 1
        what = f"{row['group']} {row['method']}"
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(what[:40])
        elif self._progress:
            print(
                f"\r[{self._done}/{self._total}] {what[:60]:60s}",
                end="",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        self.flush()
        if self._bar is not None:
            self._bar.close()
        elif self._progress:
            print("\r" + " " * 80 + "\r", end="", file=sys.stderr, flush=True)


def wanted(opts, group: str) -> bool:
    """Whether --only lets `group` through (so that its inputs are worth building)."""
    return not opts.only or any(w in group for w in opts.only)


# ---- inputs -----------------------------------------------------------------


def dtype_of(name: str):
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            return None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# the many-array workloads of the CuPy path's suites (gpu-host, gpu, gpu-tune):
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


def workload_sizes(rng, count: int, size, tiny: bool = False) -> list[int]:
    """Array sizes of a many-array workload: `count` log-uniform in 1e2..1e6 (1e2..1e4 when
    `tiny`) for size "log", else `count` times `size`."""
    if size == "log":
        hi = 4 if tiny else 6
        return [int(x) for x in np.exp(rng.uniform(np.log(1e2), np.log(10.0**hi), count))]
    return [int(size)] * count


def log_uniform_sizes(hi: float) -> list[int]:
    """The sizes of the many-array rows: N_SMALL log-uniform in 1e2..hi (seed 1234)."""
    rng = np.random.default_rng(1234)
    return [int(x) for x in np.exp(rng.uniform(math.log(1e2), math.log(hi), N_SMALL))]


def log_list(opts) -> tuple[str, list[int]]:
    """The many-array workload of the list rows and the clipped-step rows: (label, sizes)."""
    hi = int(opts.gs_max)
    return f"{N_SMALL} log-uniform 1e2..{size_label(hi)}", log_uniform_sizes(hi)


def random_array(rng, dtype, n: int) -> np.ndarray:
    return rng.standard_normal(n, dtype=np.float32).astype(dtype)


def import_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def as_tensor(torch, a: np.ndarray):
    """A zero-copy torch view of a NumPy array (bfloat16 through its 16-bit words)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def torch_unscale(torch, tensors):
    """torch's fused CPU kernel on `tensors`, alternating the factor (no .item())."""
    found = torch.zeros(1)
    invs = alternating([torch.full((1,), 0.5), torch.full((1,), 2.0)])
    op = torch._amp_foreach_non_finite_check_and_unscale_
    return lambda: op(tensors, found, invs())


@contextlib.contextmanager
def busy_core():
    """A process spinning beside the benchmark (the other core is busy)."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.05)
        yield
    finally:
        p.kill()
        p.wait()


def size_label(n: int) -> str:
    e = round(math.log10(n))
    return f"1e{e}" if 10**e == n else str(n)
