"""Exact resume and atomic steps.

A checkpoint taken mid-training (through JSON, pickle and torch.save) is
loaded in a NEW Python process, which continues training; every scale,
counter and parameter of the continuation must be bit-identical to an
uninterrupted run.  An exception from the inner optimizer must leave the
loss-scale state as it was before the step.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import lscore
from helpers import TESTS
from helpers.resume import FIRST, events, have_torch, run, scenarios


@pytest.mark.slow
def test_checkpoint_resumes_bit_identically_in_a_new_process(tmp_path):
    expected, manifest = {}, {}
    for n, sc in enumerate(scenarios()):
        evs = events(n)
        full = run(sc, sc.make(), evs, 0)
        for fmt in sc.formats:
            obj = sc.make()
            head = run(sc, obj, evs[:FIRST], 0)
            assert json.dumps(head) == json.dumps(full[:FIRST])
            key = f"{sc.name}/{fmt}"
            path = tmp_path / key.replace("/", "_")
            path.write_bytes(sc.save(obj, fmt))
            manifest[key] = {
                "scenario": sc.name,
                "format": fmt,
                "path": str(path),
                "events": evs[FIRST:],
            }
            expected[key] = full[FIRST:]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    # -P: nothing from the working directory shadows the installed lscore
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "helpers.resume", str(tmp_path / "manifest.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert set(got) == set(expected)
    wrong = [k for k in expected if json.dumps(got[k]) != json.dumps(expected[k])]
    assert not wrong, {k: (got[k][:3], expected[k][:3]) for k in wrong[:3]}
    assert len(expected) >= 16 * (3 if have_torch() else 2)


# ---- atomic steps: an exception from the inner optimizer changes no loss-scale state ----


class Boom(RuntimeError):
    pass


class UserLossScale(lscore.LossScale):
    """A user-defined LossScale (update-before-apply shape) with plain attributes."""

    def __init__(self):
        self.scale, self.good = 1024.0, 0

    def __call__(self):
        return self.scale

    def update(self, grads):
        finite = lscore.all_finite(_as_numpy(grads))
        self.good = self.good + 1 if finite else 0
        self.scale = self.scale * 2 if finite else self.scale / 2
        return None, finite

    def get_config(self):
        return {}


def _scaling_args():
    return {
        "keras": {},
        "experimental": {"loss_scale": lscore.DynamicLossScale(64.0, 1)},
        "tf1": {"loss_scale_manager": lscore.ExponentialUpdateLossScaleManager(64.0, 1)},
        "user": {"loss_scale": UserLossScale()},
        "user-tf2-subclass": {
            "loss_scale": type(
                "Sub",
                (lscore.DynamicLossScale,),
                {"update": lambda self, g: lscore.DynamicLossScale.update(self, _as_numpy(g))},
            )(64.0, 1)
        },
    }


def _as_numpy(grads):
    """User LossScales see the adapter's own tensors; these two read them through NumPy."""
    return [
        g.get()
        if hasattr(g, "get") and not isinstance(g, np.ndarray)  # cupy
        else np.asarray(g.detach() if hasattr(g, "detach") else g)
        for g in grads
    ]


def _scale_state(opt):
    s = opt.loss_scaling
    obj = s.loss_scale_object if s.shape != "keras" else s._dynamic_ls
    return (
        s.scale,
        opt.iterations,
        json.dumps(obj.state_dict()) if hasattr(obj, "state_dict") else repr(vars(obj)),
    )


@pytest.mark.parametrize("shape", list(_scaling_args()))
def test_inner_optimizer_failure_leaves_scale_state(backend, shape):
    """Every adapter's LossScaleOptimizer (NumPy, CuPy, torch): the failed step changes
    no loss-scale state and no variable; a skipped step never calls the inner optimizer."""
    (v,) = backend.variables([np.ones(3, np.float32)])
    opt = backend.LossScaleOptimizer(backend.failing_sgd([v], Boom), **_scaling_args()[shape])
    before = _scale_state(opt)
    with pytest.raises(Boom):
        backend.apply(opt, [v], [np.ones(3, np.float32)])
    assert _scale_state(opt) == before and np.all(backend.to_numpy(v) == 1)
    # a skipped step never calls the inner optimizer, so it goes through
    backend.apply(opt, [v], [np.array([np.inf, 0, 0], np.float32)])
    assert _scale_state(opt) != before


@pytest.mark.parametrize(
    "options", [{}, {"hysteresis": 2, "min_scale": 2.0}], ids=["torch", "lscore-options"]
)
def test_gradscaler_inner_optimizer_failure_leaves_scale_state(options):
    torch = pytest.importorskip("torch")
    from lscore.adapters.torch import GradScaler

    class Failing(torch.optim.SGD):
        def step(self, closure=None):
            raise Boom("inner optimizer failed")

    p = torch.nn.Parameter(torch.ones(3))
    opt = Failing([p], lr=0.1)
    s = GradScaler("cpu", init_scale=64.0, growth_interval=1, **options)
    s.scale(p.sum()).backward()
    before = (s.get_scale(), s._state.state_dict(), s.state_dict())
    with pytest.raises(Boom):
        s.step(opt)
    assert (s.get_scale(), s._state.state_dict(), s.state_dict()) == before
    assert torch.equal(p.detach(), torch.ones(3))


def test_every_state_the_core_produces_round_trips():
    # found by tests/fuzz/fuzz_state.py: a float32 policy whose growth factor is inf
    # in float32 turns a flushed-to-zero scale into NaN (0 * inf); the state must load
    p = lscore.Policy(
        init_scale=2.0**-149,
        growth_factor=1e308,
        growth_interval=1,
        precision="float32",
        flush_subnormal=True,
        backoff_mode="divide",
        guard_finite=False,
        apply_next=True,
    )
    st = lscore.LossScaleState(p)
    for finite in (False, True, True, True):
        st.update(finite)
    d = json.loads(json.dumps(st.state_dict(), allow_nan=False))
    assert "nan" in (d["scale"], d.get("next_scale"))
    again = lscore.LossScaleState.from_state_dict(d)
    assert json.dumps(again.state_dict()) == json.dumps(d)
