"""lscore's GradScaler side by side with torch.amp.GradScaler("cpu") on generated runs.

Each seed builds one small model and optimizer setup, then drives two copies
through the same events (NaN/+Inf/-Inf injected into inputs or gradients,
gradient accumulation, clipping after unscale_, several optimizers, state
dicts swapped between the two classes mid-run, update(new_scale)); after every
iteration the scales, growth trackers, step return values and skip flags must
be equal and the parameters (and explicitly unscaled gradients) bitwise equal.
"""

from __future__ import annotations

import copy
import random

import pytest

torch = pytest.importorskip("torch")
from helpers import torch_keys
from lscore.adapters.torch import GradScaler

N_SCENARIOS = 104
NONFINITE = (float("nan"), float("inf"), float("-inf"))


class _ReturningSGD(torch.optim.SGD):
    """SGD whose step returns a value, to check that step() passes it through."""

    def step(self, closure=None):
        super().step(closure)
        return 1.5


OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, foreach=False),
    "sgd_momentum_foreach": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=True),
    "sgd_returning": lambda ps: _ReturningSGD(ps, lr=0.05),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-2),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1, foreach=False),
}
SPARSE_OK = ("sgd", "adagrad")


class Net(torch.nn.Module):
    def __init__(self, rng: random.Random, dtype, sparse: bool, transposed: bool):
        super().__init__()
        d, h = rng.choice([3, 5, 8]), rng.choice([4, 7, 16])
        self.fc1 = torch.nn.Linear(d, h).to(dtype)
        self.fc2 = torch.nn.Linear(h, 2).to(dtype)
        if transposed:  # a non-contiguous (permuted) parameter gets gradients of its layout
            w = self.fc1.weight.detach()
            self.fc1.weight = torch.nn.Parameter(w.t().contiguous().t())
        self.emb = torch.nn.Embedding(6, h, sparse=True).to(dtype) if sparse else None
        self.d = d

    def forward(self, x, idx):
        z = torch.tanh(self.fc1(x))
        if self.emb is not None:
            z = z + self.emb(idx)
        return self.fc2(z)


def make_scenario(seed: int) -> dict:
    rng = random.Random(seed)
    opt = rng.choice(list(OPTIMIZERS))
    kw = {}
    if rng.random() < 0.7:
        kw["init_scale"] = rng.choice([2.0**16, 1024.0, 3.3, 1.0, 2.0**125, 0.75])
    if rng.random() < 0.6:
        kw["growth_factor"] = rng.choice([2.0, 1.5, 3.0, 1.0001, 4.0])
    if rng.random() < 0.6:
        kw["backoff_factor"] = rng.choice([0.5, 0.25, 0.9, 1 / 3, 0.01])
    kw["growth_interval"] = rng.choice([1, 2, 3, 4, 7, 2000])
    return {
        "seed": seed,
        "optimizer": opt,
        "kwargs": kw,
        "dtype": rng.choice([torch.float32] * 5 + [torch.float64, torch.bfloat16]),
        "sparse": opt in SPARSE_OK and rng.random() < 0.4,
        "transposed": rng.random() < 0.3,
        "two_optimizers": rng.random() < 0.25,
        "p_bad": rng.choice([0.0, 0.1, 0.3, 0.6]),
        "steps": rng.randint(6, 14),
    }


def _row_major(shape):
    """Element strides of a C-ordered array of `shape` (for flat -> N-d indices)."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw words of `t`, for bitwise comparison.

    For 16-bit floats every NaN compares equal: torch's own CPU kernels write
    a different NaN word from their SIMD body (0xFFFF) than from their scalar
    tail (0x7FC0 / 0x7E00), so which one it writes depends on the element's
    position and the machine's vector width.
    """
    t = t.detach()
    if t.is_sparse:
        t = t.coalesce().to_dense()
    width = {
        torch.float32: torch.int32,
        torch.float64: torch.int64,
        torch.bfloat16: torch.int16,
        torch.float16: torch.int16,
    }[t.dtype]
    w = t.contiguous().view(width).clone()
    if width is torch.int16:
        w[torch.isnan(t.contiguous())] = -1
    return w


def assert_same_tensors(a, b, what, ctx):
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x is None or y is None:
            assert x is None and y is None, f"{what} {i}: {ctx}"
            continue
        assert torch.equal(bits(x), bits(y)), f"{what} {i} differs: {ctx}"


class Side:
    """One model + optimizers + scaler."""

    def __init__(self, scaler, model, sc):
        self.scaler, self.model = scaler, model
        params = list(model.parameters())
        make = OPTIMIZERS[sc["optimizer"]]
        if sc["two_optimizers"]:
            k = len(params) // 2
            self.opts = [make(params[:k]), make(params[k:])]
        else:
            self.opts = [make(params)]

    def params(self):
        return list(self.model.parameters())

    def grads(self):
        return [p.grad for p in self.model.parameters()]


def run_scenario(sc: dict) -> None:
    rng = random.Random(1000 + sc["seed"])
    torch.manual_seed(sc["seed"])
    model = Net(random.Random(sc["seed"]), sc["dtype"], sc["sparse"], sc["transposed"])
    t = Side(torch.amp.GradScaler("cpu", **sc["kwargs"]), copy.deepcopy(model), sc)
    ours = Side(GradScaler("cpu", **sc["kwargs"]), copy.deepcopy(model), sc)
    assert t.scaler.get_scale() == ours.scaler.get_scale()
    for step in range(sc["steps"]):
        ctx = f"scenario {sc}, step {step}"
        n_micro = rng.choice([1, 1, 1, 2, 3])
        micro = []
        for _ in range(n_micro):
            x = torch.randn(4, model.d, dtype=sc["dtype"])
            idx = torch.randint(0, 6, (4,))
            bad = None
            if rng.random() < sc["p_bad"]:
                bad = (
                    rng.choice(["input", "grad", "loss"]),
                    rng.choice(NONFINITE),
                    rng.randrange(4 * model.d),
                    rng.randrange(1000),
                )
                if bad[0] == "input":
                    x.view(-1)[bad[2]] = bad[1]
            micro.append((x, idx, bad))
        set_to_none = rng.random() < 0.7
        explicit_unscale = rng.random() < 0.4
        clip = rng.choice([None, 0.5, 10.0]) if explicit_unscale and not sc["sparse"] else None
        new_scale = None
        if rng.random() < 0.06:
            new_scale = rng.choice([1024.0, 3.7, 0.5, 2.0**20])
            if rng.random() < 0.5:
                new_scale = torch.tensor(new_scale)
        swap = rng.random() < 0.08

        results = []
        for side in (t, ours):
            for o in side.opts:
                o.zero_grad(set_to_none=set_to_none)
            for x, idx, bad in micro:
                loss = side.model(x, idx).float().pow(2).mean()
                if bad is not None and bad[0] == "loss":
                    loss = loss * bad[1]
                side.scaler.scale(loss).backward()
                if bad is not None and bad[0] == "grad":
                    ps = [p for p in side.params() if p.grad is not None and not p.grad.is_sparse]
                    g = ps[bad[3] % len(ps)].grad
                    k = bad[2] % g.numel()
                    g[
                        tuple(k // s % n for n, s in zip(g.shape, _row_major(g.shape), strict=True))
                    ] = bad[1]
            unscaled = None
            if explicit_unscale:
                side.scaler.unscale_(side.opts[0])
                unscaled = [None if g is None else g.clone() for g in side.grads()]
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(side.opts[0].param_groups[0]["params"], clip)
            rets = [side.scaler.step(o) for o in side.opts]
            skipped = any(
                f.item()
                for st in side.scaler._per_optimizer_states.values()
                for f in st["found_inf_per_device"].values()
            )
            side.scaler.update(new_scale)
            results.append((rets, skipped, unscaled))
        (t_rets, t_skipped, t_unscaled), (o_rets, _, o_unscaled) = results
        assert o_rets == t_rets, ctx
        assert ours.scaler.last_step_skipped == t_skipped, ctx
        assert ours.scaler.get_scale() == t.scaler.get_scale(), ctx
        assert ours.scaler._get_growth_tracker() == t.scaler._get_growth_tracker(), ctx
        if explicit_unscale:
            assert_same_tensors(t_unscaled, o_unscaled, "unscaled grad", ctx)
        assert_same_tensors(t.params(), ours.params(), "parameter", ctx)
        if swap:
            # each class resumes from the other's checkpoint
            sd_t, sd_o = t.scaler.state_dict(), ours.scaler.state_dict()
            assert torch_keys(sd_o) == sd_t, ctx
            t.scaler = torch.amp.GradScaler("cpu")
            t.scaler.load_state_dict(sd_o)
            ours.scaler = GradScaler("cpu")
            ours.scaler.load_state_dict(sd_t)
            assert ours.scaler.get_scale() == t.scaler.get_scale(), ctx
    assert torch_keys(ours.scaler.state_dict()) == t.scaler.state_dict()
    assert ours.scaler.skipped_steps >= 0


@pytest.mark.parametrize("seed", range(N_SCENARIOS))
def test_parity_with_torch(seed):
    run_scenario(make_scenario(seed))


def test_scenarios_cover_the_events():
    """The generated set covers what the parity claim is about."""
    scs = [make_scenario(s) for s in range(N_SCENARIOS)]
    assert {sc["optimizer"] for sc in scs} == set(OPTIMIZERS)
    assert sum(sc["sparse"] for sc in scs) >= 5
    assert sum(sc["transposed"] for sc in scs) >= 10
    assert sum(sc["two_optimizers"] for sc in scs) >= 10
    assert {sc["dtype"] for sc in scs} == {torch.float32, torch.float64, torch.bfloat16}
    assert sum(sc["p_bad"] > 0 for sc in scs) >= 60
    assert sum("growth_factor" in sc["kwargs"] for sc in scs) >= 30
