"""Record torch.amp.GradScaler("cpu") scale sequences into tests/core/data/torch.json.

Run in a throwaway virtualenv that has torch (never a dependency of lscore):
    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install -c constraints.txt torch==2.13.0
    /tmp/peers/bin/python tests/core/data/record_torch.py
Each step goes through the real path: scale() a loss, give the parameter a
finite or an infinite gradient, step() and update().  "resume" cases also save
the scaler's state_dict mid-run and record how the scaler continues.
"""

import json
import pathlib

import numpy as np
import torch

OUT = pathlib.Path(__file__).with_name("torch.json")
F32_MAX = float(np.finfo(np.float32).max)
ARGS = [
    {"init_scale": 8.0, "growth_interval": 3},
    {"init_scale": 3.0, "growth_factor": 1.1, "backoff_factor": 0.3, "growth_interval": 1},
    {"init_scale": F32_MAX / 2, "growth_interval": 1},
    {"init_scale": 1e-38, "growth_interval": 5},
    {"init_scale": 65536.0, "growth_factor": 3.0, "backoff_factor": 0.7, "growth_interval": 2},
]


def events(rng, n):
    p = rng.choice([0.05, 0.2, 0.5, 0.8])
    return [bool(x) for x in rng.random(n) > p]


class Run:
    def __init__(self, args):
        self.param = torch.nn.Parameter(torch.zeros(1))
        self.opt = torch.optim.SGD([self.param], lr=0.0)
        self.scaler = torch.amp.GradScaler("cpu", **args)

    def step(self, finite):
        self.scaler.scale(torch.ones(()))  # creates the scale lazily, as training does
        self.param.grad = torch.tensor([0.0 if finite else float("inf")])
        self.scaler.step(self.opt)
        self.scaler.update()
        return self.scaler.get_scale()


def main():
    rng = np.random.default_rng(2026)
    cases, resume = [], []
    for args in ARGS:
        for _ in range(4):
            ev = events(rng, 80)
            run = Run(args)
            cases.append({"args": args, "events": ev, "scales": [run.step(e) for e in ev]})
        ev = events(rng, 120)
        cut = int(rng.integers(20, 100))
        run = Run(args)
        for e in ev[:cut]:
            run.step(e)
        state = {
            k: (v.item() if hasattr(v, "item") else v) for k, v in run.scaler.state_dict().items()
        }
        resume.append(
            {
                "args": args,
                "state": state,
                "events": ev[cut:],
                "scales": [run.step(e) for e in ev[cut:]],
            }
        )
    OUT.write_text(
        json.dumps(
            {
                "preset": "torch",
                "peer": f"torch {torch.__version__}",
                "cases": cases,
                "resume": resume,
            },
            indent=None,
        )
        + "\n"
    )
    print(f"wrote {OUT}: {len(cases)} cases, {len(resume)} resume cases")


if __name__ == "__main__":
    main()
