"""``lscore demo`` on NumPy: a language model trained in float16 with and without loss scaling.

The data is the source code of Python's own standard library (the top-level
modules of the running interpreter, nothing to download), split into tokens:
names, numbers and punctuation; every tenth module is held out for the test.
The model reads four tokens and predicts which words occur among the next
four: an embedding, a ReLU layer (initialised as ``torch.nn.Embedding`` and
``torch.nn.Linear`` initialise them) and a sigmoid per word of the
vocabulary, trained with binary cross-entropy averaged over batch x
vocabulary (the default reduction of Keras's ``BinaryCrossentropy`` and
torch's ``BCEWithLogitsLoss``).  The optimizer is Adam with float32 master
weights.  In the float16 modes the forward and backward passes compute in
float16: float16 is *emulated*, every operation running in float32 and its
result rounded to float16 (matrix products accumulate in float32 and round
their output, as tensor cores do), which reproduces float16's range and
precision exactly, including gradients that flush to zero below 2**-25.
Each element of the logits' gradient is (sigmoid - target) / (batch x
vocabulary): with 4096 windows and 8192 words that is at most 2**-25, so
without loss scaling every one flushes, the right words' included.

Three modes train from the same initial weights on the same batches: float32;
float16 without loss scaling; float16 with dynamic loss scaling (the Keras 2
``LossScaleOptimizer``: it doubles the scale after a run of finite steps and
halves it, skipping the step, when a gradient overflows).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lscore.cli.demo.model import (
    LM,
    MODES,
    Progress,
    description,
    finish_record,
    flushed,
    new_record,
)

DESCRIPTION = description(__doc__)


def _optimizer(mode: str, cfg: dict, adapter: Any) -> Any:
    adam = adapter.Adam(cfg["learning_rate"], epsilon=cfg["epsilon"])
    if mode == MODES[2]:
        return adapter.LossScaleOptimizer(
            adam, initial_scale=cfg["initial_scale"], dynamic_growth_steps=cfg["growth_steps"]
        )
    return adam


def train(mode: str, model0: LM, data: tuple, cfg: dict, progress: Progress) -> dict:
    """Train one of :data:`MODES` with lscore's NumPy adapter; returns its record (curves
    and summary)."""
    from lscore.adapters import numpy as adapter

    wtr, wte = data
    model = model0.copy()
    half = mode != MODES[0]
    opt = _optimizer(mode, cfg, adapter)
    scaled = isinstance(opt, adapter.LossScaleOptimizer)
    rng = np.random.default_rng(cfg["seed"] + 1)  # same batches in every mode
    probe = wte[: cfg["curve_tokens"]]
    rec = new_record(mode)
    counts = np.zeros((len(model.params) // 2 + 2, 2), np.int64) if half else None
    t0 = time.perf_counter()
    for step in progress(range(cfg["steps"]), f"{mode:24s}"):
        batch = wtr[rng.integers(0, len(wtr), cfg["batch_size"])]
        ids, y = batch[:, : cfg["context"]], batch[:, cfg["context"] :]
        scale = float(opt.loss_scale) if scaled else 1.0
        loss, grads, dlogits = model.loss_and_grads(ids, y, scale, half)
        if counts is not None and step % cfg["measure_every"] == 0:
            _, g32, d32 = model.loss_and_grads(ids, y, scale, False)
            counts += flushed(dlogits, grads, d32, g32)
        pairs = list(zip(grads, model.params, strict=True))
        if scaled:
            pairs = list(zip(opt.get_unscaled_gradients(grads), model.params, strict=True))
        applied = opt.apply_gradients(pairs)
        if scaled and not applied:
            rec["skipped_at"].append(step)
        rec["loss"].append(loss)
        rec["scale"].append(scale)
        if (step + 1) % cfg["curve_every"] == 0 or step + 1 == cfg["steps"]:
            rec["curve"].append((step + 1, model.accuracy(probe, half)))
    final = float(opt.loss_scale) if scaled else None
    return finish_record(rec, counts, len(model.params), model.accuracy(wte, half), final, t0)
