"""Command line: ``lscore demo`` (also ``python -m lscore``)."""
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lscore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small model in float16 with and without loss scaling")
    demo.add_argument("--steps", type=int, default=300)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default=".")
    demo.set_defaults(func=_demo)
    from lscore.migrate import add_parser as _add_migrate
    _add_migrate(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
