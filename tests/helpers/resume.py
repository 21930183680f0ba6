"""The resume scenarios of tests/core/test_resume.py, importable by the test and by the
new process that resumes the checkpoints (``python -m helpers.resume MANIFEST``).

Each scenario: ``make() -> obj``, ``step(obj, i, finite) -> record`` and, per
format, ``save(obj, fmt) -> bytes`` and ``load(data, fmt) -> obj``.
"""

import hashlib
import io
import json
import pickle
import sys

import numpy as np

import lscore
from lscore import LossScaleFloorError

FIRST, REST = 17, 23  # steps before the checkpoint, steps after it


def events(seed: int, n: int = FIRST + REST) -> list:
    rng = np.random.default_rng(seed)
    return [bool(x) for x in rng.random(n) > 0.3]


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


# ---- scenarios: make() -> obj, step(obj, i, finite) -> record, save/load per format ----

# small intervals so that a 40-step run grows and backs off several times
PRESET_ARGS = {
    "jmp": {"loss_scale": 2.0**10, "period": 3},
    "tf1": {"init_loss_scale": 2.0**10, "incr_every_n_steps": 3},
    "torch": {"growth_interval": 3},
    "tf2": {"increment_period": 3},
}


class PresetScenario:
    formats = ("json", "pickle", "torch")

    def __init__(self, name):
        self.name = name

    def make(self):
        return lscore.preset(self.name, **PRESET_ARGS.get(self.name, {}))

    def step(self, obj, i, finite):
        try:
            applied = obj.state.update(finite)
        except LossScaleFloorError:
            applied = "floor"
        return [applied, obj().hex(), obj.counters()]

    def save(self, obj, fmt):
        return _dump(obj.state_dict() if fmt != "pickle" else obj, fmt)

    def load(self, data, fmt):
        got = _load(data, fmt)
        return got if fmt == "pickle" else lscore.presets.PresetLossScale.from_state_dict(got)


class TFScenario(PresetScenario):
    """DynamicLossScale (TF2) or ExponentialUpdateLossScaleManager (TF1)."""

    def make(self):
        if self.name == "tf2-class":
            return lscore.DynamicLossScale(2.0**10, 3, 2)
        return lscore.ExponentialUpdateLossScaleManager(2.0**10, 3, 2, 2, 0.5)

    def step(self, obj, i, finite):
        if self.name == "tf2-class":
            applied = obj.update([np.ones(2) if finite else np.array([np.nan])])[1]
            return [applied, obj().hex(), obj.state.counters()]
        obj.update_loss_scale(finite)
        return [obj.get_loss_scale().hex(), obj.state.counters()]

    def load(self, data, fmt):
        got = _load(data, fmt)
        if fmt == "pickle":
            return got
        obj = self.make()
        obj.load_state_dict(got)
        return obj


class NumpyScenario:
    """The NumPy adapter: Keras-shaped LossScaleOptimizer around Adam, variables in place."""

    formats = ("pickle", "state")
    name = "numpy-adam"

    def make(self):
        from lscore.adapters.numpy import Adam, LossScaleOptimizer

        vs = [np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.zeros(4, np.float32)]
        return {
            "opt": LossScaleOptimizer(Adam(0.01), initial_scale=2.0**8, dynamic_growth_steps=3),
            "vars": vs,
        }

    def step(self, obj, i, finite):
        opt, vs = obj["opt"], obj["vars"]

        def loss_and_grads(scale):
            g = [np.float32(scale) * (np.sin(v + i) + 0.1).astype(np.float32) for v in vs]
            if not finite:
                g[1][i % 4] = np.inf
            return 0.0, g

        opt.minimize(loss_and_grads, vs)
        return [opt.loss_scale.hex(), opt.iterations, opt.last_step_skipped, _digest(*vs)]

    def save(self, obj, fmt):
        if fmt == "state":  # the optimizer's state_dict and the variables
            return pickle.dumps({"opt": obj["opt"].state_dict(), "vars": obj["vars"]})
        return pickle.dumps(obj)

    def load(self, data, fmt):
        if fmt == "state":
            saved, obj = pickle.loads(data), self.make()
            obj["opt"].load_state_dict(saved["opt"])
            return {"opt": obj["opt"], "vars": saved["vars"]}
        return pickle.loads(data)


class TorchScenario:
    """torch: a model, SGD with momentum, and GradScaler or the torch LossScaleOptimizer."""

    formats = ("torch", "pickle", "json-scaler")

    def __init__(self, kind):
        self.kind = kind
        self.name = f"torch-{kind}"
        if kind == "lso":
            self.formats = ("torch", "pickle")

    def make(self):
        import torch

        from lscore.adapters.torch import GradScaler, LossScaleOptimizer

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if self.kind == "lso":
            return {
                "model": model,
                "opt": LossScaleOptimizer(opt, initial_scale=2.0**10, dynamic_growth_steps=3),
            }
        if self.kind == "scaler-preset":  # hysteresis 2: two overflows in a row back off
            preset = lscore.preset("deepspeed", init_scale=2.0**10, scale_window=3)
            return {"model": model, "opt": opt, "scaler": GradScaler("cpu", policy=preset)}
        extra = {"hysteresis": 2, "min_scale": 4.0} if self.kind == "scaler-options" else {}
        scaler = GradScaler("cpu", init_scale=2.0**10, growth_interval=3, **extra)
        return {"model": model, "opt": opt, "scaler": scaler}

    def step(self, obj, i, finite):
        import torch

        g = torch.Generator().manual_seed(i)
        x = torch.randn(6, 4, generator=g)
        model, opt = obj["model"], obj["opt"]
        opt.zero_grad()
        loss = model(x).pow(2).mean() * (1.0 if finite else float("inf"))
        if self.kind == "lso":
            opt.get_scaled_loss(loss).backward()
            opt.step()
            scale, counts = opt.loss_scale, [opt.iterations, opt.last_step_skipped]
        else:
            s = obj["scaler"]
            s.scale(loss).backward()
            s.step(opt)
            s.update()
            scale, counts = s.get_scale(), [s.skipped_steps, s.last_step_skipped]
        digest = _digest(*[p.detach().numpy() for p in model.parameters()])
        return [float(scale).hex(), digest, *counts]

    def save(self, obj, fmt):
        import torch

        d = {k: v.state_dict() for k, v in obj.items()}
        if fmt == "json-scaler":
            buf = io.BytesIO()
            torch.save({"model": d["model"], "opt": d["opt"]}, buf)
            return pickle.dumps((buf.getvalue(), json.dumps(d["scaler"], allow_nan=False)))
        if fmt == "pickle":
            return pickle.dumps(d)
        buf = io.BytesIO()
        torch.save(d, buf)
        return buf.getvalue()

    def load(self, data, fmt):
        import torch

        if fmt == "json-scaler":
            raw, text = pickle.loads(data)
            d = torch.load(io.BytesIO(raw), weights_only=True)
            d["scaler"] = json.loads(text)
        elif fmt == "pickle":
            d = pickle.loads(data)
        else:
            d = torch.load(io.BytesIO(data), weights_only=True)
        obj = self.make()  # a fresh model, optimizer and scaler, then their states
        for k, v in obj.items():
            v.load_state_dict(d[k])
        return obj


def _dump(obj, fmt):
    if fmt == "json":
        return json.dumps(obj, allow_nan=False).encode()
    if fmt == "pickle":
        return pickle.dumps(obj)
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _load(data, fmt):
    if fmt == "json":
        return json.loads(data)
    if fmt == "pickle":
        return pickle.loads(data)
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def have_torch() -> bool:
    try:
        import torch  # noqa: F401 - only whether torch imports matters here
    except ImportError:
        return False
    return True


def scenarios():
    """Every scenario; without torch, no torch scenario and no torch.save format."""
    out = [PresetScenario(n) for n in lscore.presets.NAMES]
    out += [TFScenario("tf2-class"), TFScenario("tf1-class"), NumpyScenario()]
    if have_torch():
        out += [TorchScenario(k) for k in ("scaler", "scaler-options", "scaler-preset", "lso")]
    else:
        for sc in out:
            sc.formats = tuple(f for f in sc.formats if f != "torch")
    return out


def run(sc, obj, evs, start):
    return [sc.step(obj, start + k, e) for k, e in enumerate(evs)]


def resume_all(manifest_path):
    """Run in the new process: load every checkpoint and continue; print the records."""
    with open(manifest_path) as f:
        manifest = json.load(f)
    by_name = {sc.name: sc for sc in scenarios()}
    out = {}
    for key, entry in manifest.items():
        sc = by_name[entry["scenario"]]
        with open(entry["path"], "rb") as f:
            obj = sc.load(f.read(), entry["format"])
        out[key] = run(sc, obj, entry["events"], FIRST)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    resume_all(sys.argv[1])
