"""`lscore bench`: lscore's scan and unscale against NumPy, torch and the memory bandwidth.

The suites live in the checkout's ``benchmarks/`` folder, beside the library's source,
and install as ``lscore.bench`` so that the command runs from an install.  The
command line (``lscore.cli``) imports this package when it builds its parser: the
modules of the GPU and FP8 suites are imported when their suite runs.

Everything is measured in one run on the same arrays, so the ratios hold even
on a noisy machine: each row is the median of `repeat` timings (min-max shown),
each timing a loop of calls lasting at least `min_time` seconds.  In-place
rows alternate the factor between 0.5 and 2.0 so the values never drift.
torch rows need torch (skipped, with the reason, otherwise).

``--suite gpu-host`` times the host side of the CuPy path with the device
replaced (no GPU needed) and ``--suite gpu`` the GPU rows (skipped, with
the reason, without a CUDA device); see _gpu_host.py and _gpu.py.  ``--suite gpu-tune`` times
a grid of launch configurations on a GPU (_tune.py); ``--suite gpu-static``
reads the kernels' sm_90 machine code on the CPU (_static.py).  ``--suite
fp8`` times float8 quantize, per tensor and block-scaled (MXFP8, NVFP4, blockwise FP8,
TransformerEngine's NVFP4 recipe), against torch and the byte floor (_fp8.py, _mx.py,
_blockwise.py, _nvfp4.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from lscore import kernels
from lscore.bench import _scaler
from lscore.bench._gradscaler import GRAD_HARNESS
from lscore.bench._harness import DTYPES, FULL_SIZES, SIZES, TINY_SIZES, Rows, import_torch
from lscore.bench._report import add_ratios, format_table, machine, targets
from lscore.bench._sections import AF_METHODS, SECTIONS, UN_METHODS

__all__ = ["GRAD_HARNESS", "SUITES", "Options", "format_table", "main", "run"]

SUITES = ("cpu", "gpu", "gpu-host", "gpu-tune", "gpu-static", "fp8")
REPEAT, TINY_REPEAT = 9, 2  # timings per row
MIN_TIME, TINY_MIN_TIME = 0.02, 1e-4  # seconds per timing
FIRST_SIGHT_LISTS = 40  # gpu-host: lists at new addresses, each timed once


class Options:
    """Run settings; `tiny` is for tests (tiny sizes, few repeats)."""

    def __init__(
        self,
        *,
        full=False,
        tiny=False,
        repeat=None,
        min_time=None,
        use_torch=True,
        progress=True,
        sizes=None,
        only=(),
        suite="cpu",
    ):
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; expected one of: {', '.join(SUITES)}")
        self.suite = suite
        self.tiny = tiny
        self.first_lists = 4 if tiny else FIRST_SIGHT_LISTS
        self.sizes_given = bool(sizes)
        self.sizes = (
            tuple(sizes) if sizes else (TINY_SIZES if tiny else (FULL_SIZES if full else SIZES))
        )
        self.only = tuple(only)
        self.repeat = repeat or (TINY_REPEAT if tiny else REPEAT)
        self.min_time = min_time if min_time is not None else (TINY_MIN_TIME if tiny else MIN_TIME)
        self.use_torch = use_torch
        self.progress = progress
        self.gs_max = 1e3 if tiny else 1e5
        self.import_repeat = 2 if tiny else 7
        big = [n for n in self.sizes if n >= 10**6]
        self.contention_sizes = tuple(big) if big else self.sizes[-1:]
        self.isa_sizes = (4096,) if tiny else (10**4, 10**5, 10**6)


def run(opts: Options) -> dict:
    """Every row of the benchmark, with ratios and the target check."""
    if opts.suite == "gpu-static":
        from lscore.bench import _static

        return _static.run_static()
    if opts.suite == "fp8":
        return _run_fp8(opts)
    if opts.suite != "cpu":
        return _run_gpu_suite(opts)
    torch = import_torch() if opts.use_torch else None
    rng = np.random.default_rng(0)
    n_rows = (
        len(opts.sizes) * len(DTYPES) * (len(AF_METHODS) + len(UN_METHODS))
        + 5
        + 6
        + 6
        + 4
        + 2 * len(_scaler.COUNTS) * (len(_scaler.CALLS) + 1) * len(_scaler.METHODS)
        + 3 * len(opts.contention_sizes)
        + 2 * len(opts.isa_sizes) * (len(kernels.isa_levels()) + 1)
    )

    def fill(rows: Rows) -> None:
        for section in SECTIONS:
            section(rows, opts, torch, rng)
            rows.flush()

    rows, _ = _timed(opts, n_rows, fill)
    found = _only_measured(targets(rows.rows, opts), opts)
    return {
        "machine": machine(torch),
        "settings": {"sizes": list(opts.sizes), "repeat": opts.repeat, "min_time_s": opts.min_time},
        "rows": rows.rows,
        "targets": found,
    }


class NoRowError(ValueError):
    """--only named no row of the run."""


def _check_only(rows: Rows, opts: Options) -> None:
    """NoRowError, naming the groups there are, when --only kept no row."""
    if opts.only and not rows.rows:
        raise NoRowError(
            f"argument --only: {', '.join(map(repr, opts.only))} matches no row of this "
            f"run; its groups are: {'; '.join(sorted(rows.groups))}"
        )


def _timed(opts: Options, n_rows: int, fill) -> tuple[Rows, Any]:
    """The rows that `fill(rows)` times, with their ratios, and what `fill` returned;
    NoRowError when --only kept no row."""
    rows = Rows(n_rows, opts.progress, opts.only)
    try:
        out = fill(rows)
    finally:
        rows.close()
    _check_only(rows, opts)
    add_ratios(rows.rows)
    return rows, out


def _only_measured(found: list[dict], opts: Options) -> list[dict]:
    """With --only, only the targets whose rows it selected (and ran)."""
    return [t for t in found if t["measured"] is not None] if opts.only else found


def _run_fp8(opts: Options) -> dict:
    """--suite fp8: float8 quantize on the CPU, and on a CUDA device where there is one."""
    from lscore.bench import _blockwise, _fp8, _mx, _nvfp4

    torch = import_torch() if opts.use_torch else None
    rng = np.random.default_rng(0)
    parts = (_fp8, _mx, _blockwise, _nvfp4)

    def fill(rows: Rows) -> None:
        for part in [m.run_cpu for m in parts] + [m.run_gpu for m in parts]:
            part(opts, rows, rng)

    rows, _ = _timed(opts, 0, fill)
    return {
        "suite": opts.suite,
        "machine": machine(torch),
        "settings": {"repeat": opts.repeat, "min_time_s": opts.min_time, "tiny": opts.tiny},
        "rows": rows.rows,
        "targets": _only_measured([t for m in parts for t in m.targets(rows.rows, opts)], opts),
    }


def _run_gpu_suite(opts: Options) -> dict:
    """--suite gpu-host (the CuPy path's host cost, no GPU), --suite gpu or gpu-tune (need one)."""
    from lscore.bench import _gpu, _gpu_host, _tune

    rng = np.random.default_rng(0)

    def fill(rows: Rows) -> tuple[list[dict], dict]:
        """The suite's targets, and what its result adds (gpu-tune: the summary)."""
        if opts.suite == "gpu-tune":
            found, tune = _tune.run_tune(opts, rows, rng)
            return found, {"tune": tune}
        fn = _gpu_host.run_host if opts.suite == "gpu-host" else _gpu.run_gpu
        return fn(opts, rows, rng), {}

    rows, (found, extra) = _timed(opts, 0, fill)
    return {
        "suite": opts.suite,
        "machine": machine(None),
        "settings": {
            "repeat": opts.repeat,
            "min_time_s": opts.min_time,
            "first_sight_lists": opts.first_lists,
            "tiny": opts.tiny,
        },
        "rows": rows.rows,
        "targets": found,
        **extra,
    }


def main(args) -> int:
    """Entry point of `lscore bench` (argparse namespace from lscore.cli)."""
    opts = Options(
        full=args.full,
        tiny=args.tiny,
        repeat=args.repeat,
        min_time=args.min_time,
        use_torch=not args.no_torch,
        progress=not args.no_progress,
        sizes=args.sizes,
        only=args.only or (),
        suite=getattr(args, "suite", "cpu"),
    )
    try:
        result = run(opts)
    except NoRowError as e:
        print(f"lscore bench: error: {e}", file=sys.stderr)
        return 2
    if opts.suite == "gpu-static":
        from lscore.bench._static import format_static

        print(format_static(result))
    else:
        print(format_table(result))
    if "tune" in result:
        from lscore.bench._tune import format_summary

        print(format_summary(result["tune"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0
