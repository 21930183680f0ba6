"""``lscore demo --backend torch``: the demo's four modes with PyTorch and lscore's adapter.

The same MLP (the same initial weights as the NumPy demo), data and batches,
trained with ``torch.optim.SGD``: float32; float16 through
``torch.autocast("cpu", dtype=torch.float16)`` with float32 master weights and
no loss scaling; the same with lscore's ``GradScaler`` (dynamic scale, torch's
policy); the same with lscore's ``LossScaleOptimizer`` around a TF1
``FixedLossScaleManager`` (fixed scale, overflowing steps skipped).  Under
autocast the matrix products and their gradients run in real float16, so small
activation gradients flush to zero without loss scaling.  torch is imported
inside the functions, so ``import lscore`` never pulls it in.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import numpy as np

from lscore.managers import FixedLossScaleManager

if TYPE_CHECKING:  # torch is imported inside the functions at run time
    import torch

DESCRIPTION = (
    "The data is scikit-learn's bundled digits set (1797 8x8 images, no "
    "download); the model a ReLU perceptron.  PyTorch backend: float16 through "
    "torch.autocast on the CPU (real float16 "
    "matrix products, float32 master weights), lscore.adapters.torch.GradScaler "
    "for the dynamic scale and LossScaleOptimizer with a FixedLossScaleManager "
    "for the fixed one."
)


def _model(model0) -> torch.nn.Sequential:
    """A torch copy of the NumPy demo's MLP (weights stored as (in, out))."""
    import torch

    layers: list[torch.nn.Module] = []
    n = len(model0.params) // 2
    for i in range(n):
        w, b = model0.params[2 * i], model0.params[2 * i + 1]
        lin = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.T.copy()))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if i < n - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _cast(half: bool):
    import torch

    return torch.autocast("cpu", dtype=torch.float16) if half else contextlib.nullcontext()


def _loss(model, x, y, half):
    import torch

    with _cast(half):
        logits = model(x)
    return torch.nn.functional.cross_entropy(logits.float(), y)


def _weight_grads(model) -> list:
    return [m.weight.grad.detach().numpy().copy() for m in model if hasattr(m, "weight")]


def _underflow(model, model32, x, y, g16) -> tuple[int, int]:
    """(weight-gradient elements nonzero in float32 but zero in the float16 run, nonzero)."""
    model32.load_state_dict(model.state_dict())
    model32.zero_grad()
    _loss(model32, x, y, False).backward()
    lost = total = 0
    for a, b in zip(g16, _weight_grads(model32), strict=True):
        nz = b != 0
        total += int(nz.sum())
        lost += int((nz & (a == 0)).sum())
    return lost, total


def _accuracy(model, x, y, half) -> float:
    import torch

    with torch.no_grad(), _cast(half):
        return float((model(x).argmax(dim=1) == y).float().mean())


def train_mode(mode, model0, data, cfg, progress, modes) -> dict:
    """Train one of `modes` (the NumPy demo's MODES); returns its record (same keys)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the matrices are small: more threads only add overhead
    try:
        return _train(torch, mode, model0, data, cfg, progress, modes)
    finally:
        torch.set_num_threads(threads)


def _train(torch, mode, model0, data, cfg, progress, modes) -> dict:
    from lscore.adapters.torch import GradScaler, LossScaleOptimizer

    xtr, xte, ytr, yte = (torch.from_numpy(np.asarray(a)) for a in data)
    ytr, yte = ytr.long(), yte.long()
    model = _model(model0)
    model32 = _model(model0)
    half = mode != modes[0]
    sgd = torch.optim.SGD(model.parameters(), lr=cfg["learning_rate"], momentum=cfg["momentum"])
    scaler = opt = None
    if mode == modes[2]:
        scaler = GradScaler(
            "cpu", init_scale=cfg["initial_scale"], growth_interval=cfg["growth_steps"]
        )
    elif mode == modes[3]:
        opt = LossScaleOptimizer(sgd, loss_scale_manager=FixedLossScaleManager(cfg["fixed_scale"]))
    rng = np.random.default_rng(cfg["seed"] + 1)  # same batches in every mode
    rec = {"mode": mode, "loss": [], "scale": [], "skipped_at": [], "underflow": []}
    lost = total = skipped = 0
    t0 = time.perf_counter()
    for step in progress(range(cfg["steps"]), desc=f"{mode:24s}"):
        idx = torch.from_numpy(rng.integers(0, len(ytr), cfg["batch_size"]))
        x, y = xtr[idx], ytr[idx]
        sgd.zero_grad()
        loss = _loss(model, x, y, half)
        if scaler is not None:
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
        elif opt is not None:
            scale = opt.loss_scale
            opt.get_scaled_loss(loss).backward()
        else:
            scale = 1.0
            loss.backward()
        if half and step % cfg["measure_every"] == 0:
            n_lost, n_total = _underflow(model, model32, x, y, _weight_grads(model))
            lost, total = lost + n_lost, total + n_total
            rec["underflow"].append((step, n_lost / max(n_total, 1)))
        if scaler is not None:
            scaler.step(sgd)
            scaler.update()
            applied = not scaler.last_step_skipped
        elif opt is not None:
            opt.step()
            applied = not opt.last_step_skipped
        else:
            sgd.step()
            applied = True
        skipped += not applied
        if not applied:
            rec["skipped_at"].append(step)
        rec["loss"].append(loss.item())
        rec["scale"].append(float(scale))
    final = scaler.get_scale() if scaler is not None else (opt.loss_scale if opt else None)
    rec.update(
        test_accuracy=_accuracy(model, xte, yte, half),
        train_accuracy=_accuracy(model, xtr, ytr, half),
        skipped=skipped,
        final_scale=final,
        underflow_fraction=(lost / total) if half and total else None,
        wall_time=time.perf_counter() - t0,
    )
    return rec
