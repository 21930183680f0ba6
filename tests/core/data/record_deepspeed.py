"""Record DeepSpeed DynamicLossScaler scale sequences into tests/core/data/deepspeed.json.

Run in a throwaway virtualenv (DeepSpeed is never a dependency of lscore):
    python3 -m venv /tmp/peers
    /tmp/peers/bin/pip install -c constraints.txt torch==2.13.0 setuptools wheel
    DS_BUILD_OPS=0 /tmp/peers/bin/pip install --no-build-isolation deepspeed
    /tmp/peers/bin/python tests/core/data/record_deepspeed.py
``update_scale(overflow)`` is DeepSpeed's own; only its rank lookup (used for
logging) is answered with 0 because no process group is started.  A raise
at the minimum is recorded as "raise".  "resume" cases save the scaler's
attributes mid-run, as its checkpoints do, and record how it continues.
"""

import json
import logging
import pathlib

import deepspeed
import numpy as np
from deepspeed.runtime.fp16 import loss_scaler

OUT = pathlib.Path(__file__).with_name("deepspeed.json")
ARGS = [
    {
        "init_scale": 8.0,
        "scale_window": 3,
        "min_scale": 1.0,
        "delayed_shift": 2,
        "consecutive_hysteresis": False,
        "raise_error_at_min_scale": True,
    },
    {
        "init_scale": 8.0,
        "scale_window": 2,
        "min_scale": 1.0,
        "delayed_shift": 3,
        "consecutive_hysteresis": True,
        "raise_error_at_min_scale": True,
    },
    {
        "init_scale": 4.0,
        "scale_window": 2,
        "min_scale": 0.5,
        "delayed_shift": 1,
        "consecutive_hysteresis": False,
        "raise_error_at_min_scale": False,
    },
    {
        "init_scale": 2.0,
        "scale_window": 1,
        "min_scale": 1.0,
        "delayed_shift": 1,
        "consecutive_hysteresis": False,
        "raise_error_at_min_scale": True,
    },
    {
        "init_scale": 2.0**16,
        "scale_window": 5,
        "min_scale": 1.0,
        "delayed_shift": 2,
        "consecutive_hysteresis": False,
        "raise_error_at_min_scale": True,
    },
]
SAVED = (
    "cur_scale",
    "cur_iter",
    "last_overflow_iter",
    "cur_hysteresis",
    "scale_factor",
    "scale_window",
)


def events(rng, n):
    p = rng.choice([0.05, 0.2, 0.5, 0.8])
    return [bool(x) for x in rng.random(n) > p]


def step(scaler, finite):
    try:
        scaler.update_scale(not finite)
    except Exception as e:  # DeepSpeed raises a bare Exception at the minimum
        if "minimum" not in str(e):
            raise
        return "raise"
    return scaler.cur_scale


def main():
    loss_scaler.dist.get_rank = lambda *a, **k: 0
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    rng = np.random.default_rng(2029)
    cases, resume = [], []
    for args in ARGS:
        for _ in range(4):
            ev = events(rng, 60)
            s = loss_scaler.DynamicLossScaler(**args)
            cases.append({"args": args, "events": ev, "scales": [step(s, e) for e in ev]})
        ev = events(rng, 100)
        cut = int(rng.integers(10, 80))
        s = loss_scaler.DynamicLossScaler(**args)
        for e in ev[:cut]:
            step(s, e)
        state = {k: getattr(s, k) for k in SAVED}
        resume.append(
            {
                "args": args,
                "state": state,
                "events": ev[cut:],
                "scales": [step(s, e) for e in ev[cut:]],
            }
        )
    OUT.write_text(
        json.dumps(
            {
                "preset": "deepspeed",
                "peer": f"deepspeed {deepspeed.__version__}",
                "cases": cases,
                "resume": resume,
            }
        )
        + "\n"
    )
    print(f"wrote {OUT}: {len(cases)} cases, {len(resume)} resume cases")


if __name__ == "__main__":
    main()
