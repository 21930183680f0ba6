"""Command line: ``lscore demo``, ``lscore bench`` (also ``python -m lscore``)."""

from __future__ import annotations

import argparse
import sys

_DEMO_NEEDS = ("sklearn", "matplotlib", "tqdm")


def _demo(args) -> int:
    """Train a small MLP in float16 with and without loss scaling (lscore/cli/demo.py)."""
    import importlib.util

    missing = [m for m in _DEMO_NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"lscore demo needs {', '.join(missing)}: install the demo extra with "
            "`pip install 'lscore[demo]'` (from a checkout: `pip install -e '.[demo]'`)",
            file=sys.stderr,
        )
        return 2
    if args.backend == "torch" and importlib.util.find_spec("torch") is None:
        print(
            "lscore demo --backend torch needs torch: install it with "
            "`pip install 'lscore[torch]'`",
            file=sys.stderr,
        )
        return 2
    if args.steps < 1:
        print(f"--steps must be >= 1, got {args.steps}", file=sys.stderr)
        return 2
    from lscore.cli import demo

    return demo.run(steps=args.steps, seed=args.seed, out=args.out, backend=args.backend)


def _bench(args) -> int:
    """The benchmark table against NumPy, torch and the memory bandwidth."""
    from lscore.cli import bench

    return bench.main(args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lscore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="train a small model in float16 with and without loss scaling"
    )
    demo.add_argument(
        "--backend",
        choices=("numpy", "torch", "cupy"),
        default="numpy",
        help="array backend (torch: PyTorch with lscore.adapters.torch; cupy: "
        "real float16 on a GPU with lscore.adapters.cupy's fused sync-free "
        "optimizer, or the CPU demo when there is no GPU)",
    )
    demo.add_argument("--steps", type=int, default=1000, help="training steps per mode")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default=".", help="folder for lscore_demo.png and .json")
    demo.set_defaults(func=_demo)
    bench = sub.add_parser(
        "bench", help="time lscore against NumPy, torch and the memory bandwidth, in one run"
    )
    bench.add_argument("--full", action="store_true", help="add 1e8-element arrays")
    bench.add_argument(
        "--tiny", action="store_true", help="tiny sizes and few repeats (a smoke test)"
    )
    bench.add_argument("--json", metavar="PATH", help="also write every row as JSON")
    bench.add_argument("--repeat", type=int, default=None, help="timings per row (default 9)")
    bench.add_argument(
        "--min-time", type=float, default=None, help="seconds per timing (default 0.02)"
    )
    bench.add_argument("--no-torch", action="store_true", help="skip the torch rows")
    bench.add_argument("--sizes", help="comma-separated element counts, e.g. 1e6,1e8")
    bench.add_argument(
        "--only",
        action="append",
        metavar="TEXT",
        help="time only the groups whose name contains TEXT (repeatable)",
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    bench.add_argument(
        "--suite",
        choices=("cpu", "gpu", "gpu-host", "gpu-tune", "gpu-static"),
        default="cpu",
        help="cpu (default): the CPU core; gpu: the CuPy path against torch's "
        "foreach kernel on a CUDA device (skipped without one); gpu-host: "
        "the CuPy path's host cost per call and per array, with the "
        "device replaced (no GPU needed); gpu-tune: unscale_ under a grid "
        "of chunk and block sizes on a CUDA device, and the one to set "
        "with LSCORE_CUDA_LAUNCH (skipped without one); gpu-static: the "
        "kernels' sm_90 machine code read on the CPU (NVRTC, cuobjdump): "
        "instructions per byte of each hottest loop",
    )
    bench.set_defaults(func=_bench)
    from lscore.cli.migrate_cmd import add_parser as add_migrate

    add_migrate(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
