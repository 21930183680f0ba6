"""Command line: ``lscore demo``, ``lscore bench`` (also ``python -m lscore``)."""
from __future__ import annotations

import argparse
import sys


def _demo(args) -> int:
    """A short real run of the core: a linear model whose float16 gradients underflow."""
    import numpy as np

    import lscore

    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((512, 32)).astype(np.float32)
    w_true = rng.standard_normal(32).astype(np.float32) * 1e-3
    y = x @ w_true
    print("linear regression, float16 gradients, targets ~1e-3 (so gradients ~1e-7)")
    for name, ls in (("no scaling", lscore.FixedLossScale(1)),
                     ("dynamic", lscore.DynamicLossScale(2 ** 15, 50))):
        w = np.zeros(32, np.float32)
        skipped = 0
        for _ in range(args.steps):
            scale = ls()
            err = (x @ w - y) / len(y)
            g16 = (x.T.astype(np.float16) @ (err * scale).astype(np.float16)) \
                .astype(np.float16)                       # the scaled float16 backward pass
            g = g16.astype(np.float32) / scale
            _, ok = ls.update(g)
            if ok:
                w -= 0.5 * g
            else:
                skipped += 1
        loss = float(np.mean((x @ w - y) ** 2))
        print(f"  {name:11s} loss {loss:.3e}  final scale {ls():g}  skipped {skipped}")
    return 0


def _bench(args) -> int:
    """The benchmark table against NumPy, torch and the memory bandwidth."""
    from lscore import bench

    return bench.main(args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lscore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small model in float16 with and without loss scaling")
    demo.add_argument("--steps", type=int, default=300)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default=".")
    demo.set_defaults(func=_demo)
    bench = sub.add_parser("bench", help="time lscore against NumPy, torch and the memory "
                                         "bandwidth, in one run")
    bench.add_argument("--full", action="store_true", help="add 1e8-element arrays")
    bench.add_argument("--tiny", action="store_true", help="tiny sizes and few repeats (a smoke test)")
    bench.add_argument("--json", metavar="PATH", help="also write every row as JSON")
    bench.add_argument("--repeat", type=int, default=None, help="timings per row (default 9)")
    bench.add_argument("--min-time", type=float, default=None,
                       help="seconds per timing (default 0.02)")
    bench.add_argument("--no-torch", action="store_true", help="skip the torch rows")
    bench.add_argument("--sizes", help="comma-separated element counts, e.g. 1e6,1e8")
    bench.add_argument("--only", action="append", metavar="TEXT",
                       help="time only the groups whose name contains TEXT (repeatable)")
    bench.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    bench.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
