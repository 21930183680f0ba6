"""Record Megatron-core DynamicGradScaler scale sequences into tests/core/data/megatron.json.

Run in a throwaway virtualenv (megatron-core is never a dependency of lscore):
    python3 -m venv /tmp/peers
    /tmp/peers/bin/pip install -c constraints.txt torch==2.13.0
    /tmp/peers/bin/pip install --no-deps megatron-core
    /tmp/peers/bin/python tests/core/data/record_megatron.py
The scaler's module is loaded on its own (the package imports CUDA-only
parts) and its tensors are made on the CPU instead of 'cuda'; the update
rule and the float32 tensor arithmetic are Megatron's own.  "resume" cases
save ``state_dict()`` mid-run and record how the scaler continues.
"""

import importlib.util
import json
import pathlib
import types

import numpy as np
import torch

OUT = pathlib.Path(__file__).with_name("megatron.json")
ARGS = [
    {
        "initial_scale": 16.0,
        "min_scale": 1.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 3,
        "hysteresis": 2,
    },
    {
        "initial_scale": 3.0,
        "min_scale": 1e-4,
        "growth_factor": 1.1,
        "backoff_factor": 0.3,
        "growth_interval": 1,
        "hysteresis": 1,
    },
    {
        "initial_scale": 2.0**127,
        "min_scale": 1.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 1,
        "hysteresis": 3,
    },
    {
        "initial_scale": 2.0**32,
        "min_scale": 1.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 4,
        "hysteresis": 2,
    },
]


def load_grad_scaler():
    spec = importlib.util.find_spec("megatron.core")
    path = pathlib.Path(spec.submodule_search_locations[0]) / "optimizer" / "grad_scaler.py"
    cpu_torch = types.SimpleNamespace(
        **{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")}
    )
    cpu_torch.tensor = lambda data, dtype=None, device=None: torch.tensor(data, dtype=dtype)
    mod_spec = importlib.util.spec_from_file_location("megatron_grad_scaler", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    mod.torch = cpu_torch
    return mod


def events(rng, n):
    p = rng.choice([0.05, 0.2, 0.5, 0.8])
    return [bool(x) for x in rng.random(n) > p]


def main():
    gs = load_grad_scaler()
    rng = np.random.default_rng(2028)
    cases, resume = [], []
    for args in ARGS:
        for _ in range(4):
            ev = events(rng, 60)
            s, scales = gs.DynamicGradScaler(**args), []
            for e in ev:
                s.update(not e)
                scales.append(s.scale.item())
            cases.append({"args": args, "events": ev, "scales": scales})
        ev = events(rng, 100)
        cut = int(rng.integers(10, 80))
        s = gs.DynamicGradScaler(**args)
        for e in ev[:cut]:
            s.update(not e)
        st = s.state_dict()
        state = {
            "scale": st["scale"].item(),
            "growth_tracker": st["growth_tracker"],
            "hysteresis_tracker": st["hysteresis_tracker"],
        }
        scales = []
        for e in ev[cut:]:
            s.update(not e)
            scales.append(s.scale.item())
        resume.append({"args": args, "state": state, "events": ev[cut:], "scales": scales})
    import megatron.core

    OUT.write_text(
        json.dumps(
            {
                "preset": "megatron",
                "peer": f"megatron-core {megatron.core.__version__}",
                "cases": cases,
                "resume": resume,
            }
        )
        + "\n"
    )
    print(f"wrote {OUT}: {len(cases)} cases, {len(resume)} resume cases")


if __name__ == "__main__":
    main()
