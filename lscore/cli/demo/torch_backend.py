"""``lscore demo --backend torch``: the demo's three modes with PyTorch and lscore's adapter.

The same language model (the same initial weights as the NumPy demo), data and
batches, trained with ``torch.optim.Adam``: float32; float16 through
``torch.autocast("cpu", dtype=torch.float16)`` with float32 master weights and
no loss scaling; the same with lscore's ``GradScaler`` (dynamic scale, torch's
policy).  Under autocast the matrix products and their gradients run in real
float16 (the embedding and the loss stay in float32, as autocast keeps them),
so small gradients flush to zero without loss scaling.  float16 matrix products
are slow on most CPUs, so this backend takes several times longer than the
NumPy one.  torch is imported inside the functions, so ``import lscore`` never
pulls it in.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np

from lscore.cli.demo.model import LM, MODES, Progress, finish_record, flushed, new_record

DESCRIPTION = (
    "The data is the Python standard library's source code, split into tokens; the model "
    "a language model (embedding, a ReLU layer, a sigmoid per word: is it among the next "
    "tokens?).  PyTorch backend: "
    "float16 through torch.autocast on the CPU (real float16 matrix products, float32 "
    "master weights), torch.optim.Adam, lscore.adapters.torch.GradScaler for the dynamic "
    "scale."
)


def _model(model0: LM) -> Any:
    """A torch copy of the NumPy demo's model (its weights are stored (in, out))."""
    import torch

    emb = torch.nn.Embedding(*model0.params[0].shape)
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(model0.params[0]))
    layers: list[Any] = [emb, torch.nn.Flatten()]
    n = len(model0.params) // 2
    for i in range(n):
        w, b = model0.params[1 + 2 * i], model0.params[2 + 2 * i]
        lin = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.T.copy()))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if i < n - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _cast(half: bool) -> Any:
    import torch

    return torch.autocast("cpu", dtype=torch.float16) if half else contextlib.nullcontext()


def _loss(model: Any, ids: Any, y: Any, half: bool) -> tuple[Any, Any]:
    """(binary cross-entropy averaged over batch x vocabulary, in float32 as under
    autocast; the logits, whose gradient is kept).  `y`: each row's next tokens, the
    words whose target is 1."""
    import torch

    with _cast(half):
        logits = model(ids)
    logits.retain_grad()
    target = torch.zeros(logits.shape, dtype=torch.float32).scatter_(1, y, 1.0)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), target), logits


def _grads(model: Any, logits: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    """(the logits' gradient, the parameters' gradients in the NumPy model's order)."""
    import torch

    def host(t: Any) -> np.ndarray:
        return t.detach().float().numpy().copy()

    grads = [host(model[0].weight.grad)]
    for m in model:
        if isinstance(m, torch.nn.Linear):
            grads += [host(m.weight.grad).T.copy(), host(m.bias.grad)]
    return host(logits.grad), grads


def _accuracy(model: Any, w: Any, k: int, half: bool) -> float:
    """Share of windows `w` whose top-scored word is among their next tokens."""
    import torch

    with torch.no_grad(), _cast(half):
        top = model(w[:, :k]).argmax(dim=1)
    return float((w[:, k:] == top[:, None]).any(dim=1).float().mean())


def train(mode: str, model0: LM, data: tuple, cfg: dict, progress: Progress) -> dict:
    """Train one of :data:`MODES` with torch; returns its record (the NumPy backend's keys)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the matrices are small: more threads only add overhead
    try:
        return _train(torch, mode, model0, data, cfg, progress)
    finally:
        torch.set_num_threads(threads)


def _train(torch: Any, mode: str, model0: LM, data: tuple, cfg: dict, progress: Progress) -> dict:
    from lscore.adapters.torch import GradScaler

    wtr, wte = (torch.from_numpy(a.astype(np.int64)) for a in data)
    k = cfg["context"]
    probe = wte[: cfg["curve_tokens"]]
    model = _model(model0)
    model32 = _model(model0)
    half = mode != MODES[0]
    adam = torch.optim.Adam(model.parameters(), lr=cfg["learning_rate"], eps=cfg["epsilon"])
    scaler = None
    if mode == MODES[2]:
        scaler = GradScaler(
            "cpu", init_scale=cfg["initial_scale"], growth_interval=cfg["growth_steps"]
        )
    rng = np.random.default_rng(cfg["seed"] + 1)  # same batches in every mode
    rec = new_record(mode)
    counts = np.zeros((len(model0.params) // 2 + 2, 2), np.int64) if half else None
    t0 = time.perf_counter()
    for step in progress(range(cfg["steps"]), f"{mode:24s}"):
        batch = wtr[torch.from_numpy(rng.integers(0, len(wtr), cfg["batch_size"]))]
        ids, y = batch[:, :k], batch[:, k:]
        adam.zero_grad()
        loss, logits = _loss(model, ids, y, half)
        scale = float(scaler.get_scale()) if scaler is not None else 1.0
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if counts is not None and step % cfg["measure_every"] == 0:
            model32.load_state_dict(model.state_dict())
            model32.zero_grad()
            loss32, logits32 = _loss(model32, ids, y, False)
            (loss32 * scale).backward()
            counts += flushed(*_grads(model, logits), *_grads(model32, logits32))
        if scaler is not None:
            scaler.step(adam)
            scaler.update()
            if scaler.last_step_skipped:
                rec["skipped_at"].append(step)
        else:
            adam.step()
        rec["loss"].append(loss.item())
        rec["scale"].append(scale)
        if (step + 1) % cfg["curve_every"] == 0 or step + 1 == cfg["steps"]:
            rec["curve"].append((step + 1, _accuracy(model, probe, k, half)))
    final = float(scaler.get_scale()) if scaler is not None else None
    return finish_record(rec, counts, len(model0.params), _accuracy(model, wte, k, half), final, t0)
