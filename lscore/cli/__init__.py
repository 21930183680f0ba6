"""lscore: loss scaling for mixed-precision training.

'lscore COMMAND --help' shows a command's options; 'python -m lscore' is the
same program.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import textwrap
from typing import NoReturn

from lscore import __version__

_DEMO_NEEDS = ("threadpoolctl", "matplotlib", "tqdm")


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line ("lscore bench: error: ...")
    and exit with status 2, as every other user error of the command line does."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _binary(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1024
    raise AssertionError  # the loop returns at PiB


def counts(text: str) -> tuple[int, ...]:
    """--sizes: comma-separated element counts, each a whole number >= 1 (1e6 allowed) whose
    float64 array fits in this machine's memory."""
    out = []
    for part in text.split(","):
        try:
            n = float(part)
        except ValueError:
            n = math.nan
        if not (math.isfinite(n) and n.is_integer() and n >= 1):
            raise argparse.ArgumentTypeError(
                f"must be comma-separated element counts >= 1 (e.g. 1e6,1e8), got {text!r}"
            )
        need, have = 8 * n, _memory_bytes()  # the widest rows time float64 arrays
        if need > have:
            raise argparse.ArgumentTypeError(
                f"{part} elements do not fit in memory: a float64 array of them takes "
                f"{_binary(need)}, and this machine has {_binary(have)}"
            )
        out.append(int(n))
    return tuple(out)


def _number(kind: type, minimum: float, strict: bool = False) -> argparse._ActionType:
    """An argparse type: a `kind` (int or float) >= `minimum` (> with `strict`), finite."""
    rule = f"{'an integer' if kind is int else 'a number'} {'>' if strict else '>='} {minimum:g}"

    def parse(text: str) -> float:
        try:
            v = kind(text)
        except ValueError:
            v = math.nan
        if not math.isfinite(v) or v < minimum or (strict and v == minimum):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def json_path(path: str) -> str:
    """--json PATH: a file that can be written, checked before the run (not created)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path} is a folder; expected a file name")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{path}: folder {folder} does not exist")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(
            f"{path}: cannot write in {folder}: {e.strerror or e}"
        ) from None
    return path


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions filled paragraph by paragraph; each option's default after its help,
    unless it has none.

    argparse's own formatter fills a description as one paragraph; and its
    ArgumentDefaultsHelpFormatter also prints "(default: None)" for an option that is
    unset by default and "(default: False)" for a flag, which say nothing, so they are
    left out.
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = (" ".join(p.split()) for p in text.strip().split("\n\n"))
        return "\n\n".join(
            textwrap.fill(p, width, initial_indent=indent, subsequent_indent=indent)
            for p in paragraphs
        )

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _demo(args: argparse.Namespace) -> int:
    """Train a small language model in float16 with and without loss scaling (lscore.cli.demo)."""
    import importlib.util

    missing = [m for m in _DEMO_NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"lscore demo needs {', '.join(missing)}: install the demo extra with "
            '`pip install ".[demo]"` '
            "in the checkout of lscore (it is not on the package index yet)",
            file=sys.stderr,
        )
        return 2
    if args.backend == "torch" and importlib.util.find_spec("torch") is None:
        print(
            "lscore demo --backend torch needs torch: install it with "
            '`pip install ".[torch]"` '
            "in the checkout of lscore (it is not on the package index yet)",
            file=sys.stderr,
        )
        return 2
    if args.fp8 and args.backend != "numpy":
        print(
            "lscore demo: error: argument --fp8: runs on the numpy backend, got "
            f"--backend {args.backend}",
            file=sys.stderr,
        )
        return 2
    if args.fp8 and importlib.util.find_spec("ml_dtypes") is None:
        print(
            "lscore demo --fp8 needs ml_dtypes (NumPy's float8 types), a dependency of "
            "lscore that is not installed here: install it with `pip install ml_dtypes`",
            file=sys.stderr,
        )
        return 2
    from lscore.cli import demo

    try:
        demo.check_out(args.out, demo.FP8_OUTPUTS if args.fp8 else demo.OUTPUTS)
    except ValueError as e:
        print(f"lscore demo: error: argument --out: {e}", file=sys.stderr)
        return 2
    return demo.run(
        steps=args.steps,
        seed=args.seed,
        out=args.out,
        backend=args.backend,
        tiny=args.tiny,
        fp8=args.fp8,
        full=args.full,
    )


def _bench(args: argparse.Namespace) -> int:
    """The benchmark table against NumPy, torch and the memory bandwidth."""
    from lscore import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    """The `lscore` command line: its options and the demo, bench and migrate commands."""
    from lscore import bench as bench_cmd
    from lscore.cli.demo import config

    parser = Parser(prog="lscore", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    default, full, tiny = config(), config(full=True), config(tiny=True)
    demo = sub.add_parser(
        "demo",
        help="train a small model in float16 with and without loss scaling",
        description="Train a small language model in float32, in float16 without loss "
        "scaling and in float16 with lscore's dynamic loss scale (vocabulary "
        f"{full['vocab']}, {full['batch_size']} windows a batch); print a table and "
        "write a figure and a JSON summary.",
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
        "--steps",
        type=_number(int, 1),
        default=None,
        help=f"training steps per mode (default {default['steps']}; {full['steps']} with --full, "
        f"{tiny['steps']} with --tiny)",
    )
    size = demo.add_mutually_exclusive_group()
    size.add_argument(
        "--full",
        action="store_true",
        help=f"the long run of the documentation's figure: {full['steps']} steps per mode",
    )
    size.add_argument(
        "--tiny",
        action="store_true",
        help=f"a quick check: {tiny['steps']} steps per mode at the same vocabulary and "
        f"batch, the dynamic scale starting at 2**{math.log2(tiny['initial_scale']):g} and "
        f"doubling after {tiny['growth_steps']} finite steps (the others: "
        f"2**{math.log2(full['initial_scale']):g} and {full['growth_steps']})",
    )
    demo.add_argument(
        "--seed",
        type=_number(int, 0),
        default=0,
        help="random seed (data split and initial weights)",
    )
    demo.add_argument(
        "--out",
        default=".",
        help="folder for lscore_demo.png and lscore_demo.json (made if missing)",
    )
    demo.add_argument(
        "--fp8",
        action="store_true",
        help="train in bfloat16 and with FP8 linear layers under delayed (te-delayed) and "
        "current (torchao-tensorwise) scaling instead of the float16 modes, and show the "
        "casts' amax, scale and saturated elements (lscore_demo_fp8.png and .json; numpy "
        "backend)",
    )
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
    bench.add_argument(
        "--json", metavar="PATH", type=json_path, help="also write every row as JSON"
    )
    bench.add_argument(
        "--repeat",
        type=_number(int, 1),
        default=None,
        help=f"timings per row (default {bench_cmd.REPEAT}; {bench_cmd.TINY_REPEAT} with --tiny)",
    )
    bench.add_argument(
        "--min-time",
        type=_number(float, 0, strict=True),
        default=None,
        help=f"seconds per timing (default {bench_cmd.MIN_TIME:g}; "
        f"{bench_cmd.TINY_MIN_TIME:g} with --tiny)",
    )
    bench.add_argument("--no-torch", action="store_true", help="skip the torch rows")
    bench.add_argument("--sizes", type=counts, help="comma-separated element counts, e.g. 1e6,1e8")
    bench.add_argument(
        "--only",
        action="append",
        metavar="TEXT",
        help="time only the groups whose name contains TEXT (repeatable)",
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    bench.add_argument(
        "--suite",
        choices=bench_cmd.SUITES,
        default="cpu",
        help="cpu: the CPU core; gpu: the CuPy path against torch's "
        "foreach kernel on a CUDA device (skipped without one); gpu-host: "
        "the CuPy path's host cost per call and per array, with the "
        "device replaced (no GPU needed); gpu-tune: unscale_ under a grid "
        "of chunk and block sizes on a CUDA device, and the one to set "
        "with LSCORE_CUDA_LAUNCH (skipped without one); gpu-static: the "
        "kernels' sm_90 machine code read on the CPU (NVRTC, cuobjdump): "
        "instructions per byte of each hottest loop; fp8: float8 quantize "
        "(delayed and current scaling) against torch eager, torch.compile "
        "and the byte floor, on the CPU and a CUDA device (where there is one)",
    )
    bench.set_defaults(func=_bench)
    from lscore.cli.migrate_cmd import add_parser as add_migrate

    add_migrate(sub, HelpFormatter)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line on `argv` (sys.argv[1:] when None); the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse's top parser would say "lscore: error:"; the command's own parser speaks
        # for its arguments, as the CLI reference shows ("lscore demo: error: ...")
        commands = next(
            a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
        ).choices
        commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        status: int = args.func(args)
    except KeyboardInterrupt:
        print(f"lscore {args.command}: interrupted", file=sys.stderr)
        return 130
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
