"""Record jmp.DynamicLossScale scale sequences into tests/core/data/jmp.json.

Run in a throwaway virtualenv (jmp is never a dependency of lscore):
    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install jmp "jax[cpu]"
    /tmp/peers/bin/python tests/core/data/record_jmp.py
Each step calls the real ``adjust(grads_finite)`` eagerly on the CPU.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import jmp
import numpy as np

OUT = pathlib.Path(__file__).with_name("jmp.json")
ARGS = [
    {"loss_scale": 8.0, "period": 3},
    {"loss_scale": 4.0, "period": 1, "factor": 3, "min_loss_scale": 0.5},
    {"loss_scale": 100.0, "period": 2, "factor": 3, "min_loss_scale": 1e-3},
    {"loss_scale": 8.0, "counter": 2, "period": 3},
    {"loss_scale": 2.0**127, "period": 1},
    {"loss_scale": 2.0**-120, "period": 4, "min_loss_scale": 2.0**-149},
]


def events(rng, n):
    p = rng.choice([0.05, 0.2, 0.5, 0.8])
    return [bool(x) for x in rng.random(n) > p]


def build(args):
    kw = dict(args)
    kw["loss_scale"] = jnp.asarray(kw["loss_scale"], jnp.float32)
    if "min_loss_scale" in kw:
        kw["min_loss_scale"] = jnp.asarray(kw["min_loss_scale"], jnp.float32)
    if "counter" in kw:
        kw["counter"] = jnp.asarray(kw["counter"], jnp.int32)
    return jmp.DynamicLossScale(**kw)


def main():
    rng = np.random.default_rng(2027)
    cases = []
    for args in ARGS:
        for _ in range(4):
            ev = events(rng, 60)
            ls, scales = build(args), []
            for e in ev:
                ls = ls.adjust(jnp.asarray(e))
                scales.append(float(ls.loss_scale))
            cases.append({"args": args, "events": ev, "scales": scales})
    OUT.write_text(
        json.dumps(
            {
                "preset": "jmp",
                "peer": f"jmp {jmp.__version__}, jax {jax.__version__}",
                "cases": cases,
            }
        )
        + "\n"
    )
    print(f"wrote {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
