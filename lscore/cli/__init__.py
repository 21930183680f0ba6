"""lscore: loss scaling for mixed-precision training.

commands:
  demo      train a small model in float16 with and without loss scaling
  bench     time lscore against NumPy, torch and the memory bandwidth
  migrate   convert a peer's loss-scale config or checkpoint to lscore's, or back

'lscore COMMAND --help' shows a command's options; 'python -m lscore' is the
same program.
"""

from __future__ import annotations

import argparse
import sys

from lscore import __version__

_DEMO_NEEDS = ("threadpoolctl", "matplotlib", "tqdm")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written; each option's default after its help, unless it has none.

    argparse's ArgumentDefaultsHelpFormatter also prints "(default: None)" for an
    option that is unset by default and "(default: False)" for a flag; those say
    nothing, so they are left out.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _demo(args: argparse.Namespace) -> int:
    """Train a small language model in float16 with and without loss scaling (cli/demo.py)."""
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
    if args.steps is not None and args.steps < 1:
        print(f"--steps must be >= 1, got {args.steps}", file=sys.stderr)
        return 2
    from lscore.cli import demo

    return demo.run(
        steps=args.steps, seed=args.seed, out=args.out, backend=args.backend, tiny=args.tiny
    )


def _bench(args: argparse.Namespace) -> int:
    """The benchmark table against NumPy, torch and the memory bandwidth."""
    from lscore.cli import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    """The `lscore` command line: its options and the demo, bench and migrate commands."""
    parser = argparse.ArgumentParser(
        prog="lscore", description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="train a small model in float16 with and without loss scaling",
        description="Train a small model in float32, in float16 without loss scaling and "
        "in float16 with lscore's dynamic loss scale; write a figure and a JSON summary.",
        formatter_class=HelpFormatter,
    )
    demo.add_argument(
        "--backend",
        choices=("numpy", "torch", "cupy"),
        default="numpy",
        help="array backend (torch: PyTorch with lscore.adapters.torch; cupy: "
        "real float16 on a GPU with lscore.adapters.cupy's fused sync-free "
        "optimizer, or the CPU demo when there is no GPU)",
    )
    demo.add_argument(
        "--steps", type=int, default=None, help="training steps per mode (300; 40 with --tiny)"
    )
    demo.add_argument(
        "--tiny", action="store_true", help="a small vocabulary and batch (a quick check)"
    )
    demo.add_argument(
        "--seed", type=int, default=0, help="random seed (data split and initial weights)"
    )
    demo.add_argument("--out", default=".", help="folder for lscore_demo.png and .json")
    demo.set_defaults(func=_demo)
    bench = sub.add_parser(
        "bench",
        help="time lscore against NumPy, torch and the memory bandwidth, in one run",
        description="Time lscore's scan and unscale against NumPy, torch and the memory "
        "bandwidth, on the same arrays in one run, and check the speed targets.",
        formatter_class=HelpFormatter,
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
        help="cpu: the CPU core; gpu: the CuPy path against torch's "
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

    add_migrate(sub, HelpFormatter)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line on `argv` (sys.argv[1:] when None); the exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.func(args)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
