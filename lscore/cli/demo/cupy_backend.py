"""``lscore demo --backend cupy``: the demo's three modes on a GPU, in real float16.

The same language model (the same initial weights as the NumPy demo), data
and batches, on CuPy arrays: float32 master weights, and in the float16 modes
a forward and backward pass whose matrix products, activations and gradients
are float16 arrays on the GPU (the embedding's gradient is summed in float32,
as under torch.autocast).  The optimizer is lscore.adapters.cupy's Adam
(fused kernels: float16 gradients are unscaled, checked and applied to the
float32 masters in one pass).  The dynamic mode is the sync-free
``LossScaleOptimizer``: the scale, its counters and the skip decision stay on
the device and the loop reads nothing back and uploads nothing but the
batch's token ids (the backward pass writes its gradients into fixed buffers,
so the optimizer's plan of them is made once); losses, scales and the
flushed-gradient counts are gathered into device arrays and read once at the
end.

The code is written against an array module and an adapter module, so the
tests run it on NumPy with the CPU host harness standing in for the GPU.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lscore import cuda
from lscore.cli.demo.model import LM, MODES, Progress, finish_record, new_record

DESCRIPTION = (
    "The data is the Python standard library's source code, split into tokens; the model "
    "a language model (embedding, a ReLU layer, a sigmoid per word: is it among the next "
    "tokens?).  CuPy backend: real "
    "float16 matrix products and gradients on the GPU, float32 master weights, "
    "lscore.adapters.cupy's fused Adam; the dynamic scale is the sync-free "
    "LossScaleOptimizer (no host sync per step)."
)


# why the CuPy demo cannot run here, or None
gpu_missing = cuda.device_missing


class DeviceLM:
    """The NumPy demo's language model on `xp` arrays: float32 masters, float16 compute
    when `half`."""

    def __init__(self, xp: Any, model0: LM) -> None:
        self.xp = xp
        self.params = [xp.asarray(p) for p in model0.params]
        self._grads: dict = {}  # dtype -> the gradient buffers, written in place every step
        if xp.__name__ == "cupy":
            import cupyx

            self._scatter_add = cupyx.scatter_add
        else:
            self._scatter_add = np.add.at

    def _buffers(self, dt: Any) -> list:
        """Fixed gradient arrays: the fused optimizer packs a list of arrays once (a new
        array at a new address costs that host work again).  The embedding's is float32."""
        bufs = self._grads.get(dt)
        if bufs is None:
            xp = self.xp
            bufs = [xp.empty(self.params[0].shape, xp.float32)]
            bufs += [xp.empty(p.shape, dt) for p in self.params[1:]]
            self._grads[dt] = bufs
        return bufs

    def forward(self, ids: Any, half: bool) -> tuple[Any, list]:
        xp = self.xp
        dt = xp.float16 if half else xp.float32
        a = self.params[0].astype(dt)[ids].reshape(len(ids), -1)
        acts = []
        n = len(self.params) // 2
        for i in range(n):
            w, b = self.params[1 + 2 * i].astype(dt), self.params[2 + 2 * i].astype(dt)
            acts.append((a, w))
            z = a @ w + b
            a = z if i == n - 1 else xp.maximum(z, 0)
        return a, acts

    def loss_and_grads(self, ids: Any, y: Any, scale: Any, half: bool) -> tuple[Any, list, Any]:
        """Mean binary cross-entropy over batch x vocabulary (a device scalar; `y`: each
        row's next tokens, the words whose target is 1), the gradients of loss * scale
        and the logits' gradient.

        `scale` may be a device scalar (the sync-free optimizer's own), so
        nothing here reads the device."""
        xp = self.xp
        logits, acts = self.forward(ids, half)
        z = logits.astype(xp.float32)  # the loss and the sigmoid in float32
        target = xp.zeros(z.shape, xp.float32)
        target[xp.arange(len(y))[:, None], y] = 1  # a word twice among the next: still 1
        softplus = xp.maximum(z, 0) + xp.log1p(xp.exp(-xp.abs(z)))
        loss = (softplus - z * target).mean()
        p = 1 / (1 + xp.exp(-z)) - target
        p *= xp.asarray(scale, xp.float32) / z.size
        d = dlogits = p.astype(acts[0][0].dtype)
        grads = self._buffers(d.dtype)
        for i in range(len(acts) - 1, -1, -1):
            a, w = acts[i]
            xp.matmul(a.T, d, out=grads[1 + 2 * i])
            d.sum(axis=0, out=grads[2 + 2 * i])
            d = d @ w.T
            if i:
                d = d * (a > 0)
        grads[0][...] = 0
        self._scatter_add(
            grads[0], ids.ravel(), d.reshape(-1, grads[0].shape[1]).astype(xp.float32)
        )
        return loss, grads, dlogits

    def accuracy(self, w: Any, k: int, half: bool) -> Any:
        """Share of windows `w` (`k` tokens read, then the next ones) whose top-scored
        word is among their next tokens, a device scalar (read it with float())."""
        logits, _ = self.forward(w[:, :k], half)
        return (w[:, k:] == logits.argmax(axis=1)[:, None]).any(axis=1).mean()


def _optimizer(mode: str, cfg: dict, adapter: Any) -> Any:
    adam = adapter.Adam(cfg["learning_rate"], epsilon=cfg["epsilon"])
    if mode == MODES[2]:
        return adapter.LossScaleOptimizer(
            adam,
            initial_scale=cfg["initial_scale"],
            dynamic_growth_steps=cfg["growth_steps"],
            sync_free=True,
        )
    return adam


def train(mode: str, model0: LM, data: tuple, cfg: dict, progress: Progress) -> dict:
    """Train one of :data:`MODES` on the GPU; returns its record (the NumPy backend's keys)."""
    import cupy

    from lscore.adapters import cupy as cupy_adapter

    return train_on(cupy, cupy_adapter, mode, model0, data, cfg, progress)


def train_on(
    xp: Any, adapter: Any, mode: str, model0: LM, data: tuple, cfg: dict, progress: Progress
) -> dict:
    """:func:`train` on `xp`'s arrays with `adapter`'s optimizers (the tests run it on NumPy
    with the CPU host harness standing in for the GPU)."""
    wtr, wte = (xp.asarray(a) for a in data)
    ctx = cfg["context"]
    probe = wte[: cfg["curve_tokens"]]
    model = DeviceLM(xp, model0)
    half = mode != MODES[0]
    opt = _optimizer(mode, cfg, adapter)
    scaled = isinstance(opt, adapter.LossScaleOptimizer)
    rng = np.random.default_rng(cfg["seed"] + 1)  # same batches in every mode
    steps, every = cfg["steps"], cfg["measure_every"]
    losses = xp.zeros(steps, xp.float32)
    scales = xp.ones(steps, xp.float32)
    skipped = xp.zeros(steps, bool)
    n_arrays = len(model.params) // 2 + 2  # the logits' gradient, the embedding, the layers
    counts = xp.zeros((n_arrays, 2), xp.int64)  # (flushed, nonzero in float32) per array
    curve = []
    t0 = time.perf_counter()
    # float16 overflow is what loss scaling handles: NumPy need not warn about it
    with np.errstate(over="ignore", invalid="ignore"):
        for step in progress(range(steps), f"{mode:24s}"):
            batch = wtr[xp.asarray(rng.integers(0, len(wtr), cfg["batch_size"]))]
            ids, y = batch[:, :ctx], batch[:, ctx:]
            seen: dict = {}

            def loss_and_grads(scale: Any, ids: Any = ids, y: Any = y, seen: dict = seen) -> Any:
                seen["scale"] = scale
                loss, grads, seen["dlogits"] = model.loss_and_grads(ids, y, scale, half)
                seen["grads"] = grads
                return loss, grads

            if scaled:
                loss = opt.minimize(loss_and_grads, model.params)
                skipped[step] = opt.last_step_skipped  # sync-free: a device bool, no sync
            else:
                loss, grads = loss_and_grads(1.0)
                opt.apply_gradients(list(zip(grads, model.params, strict=True)))
            losses[step] = loss
            scales[step] = seen["scale"]
            if half and step % every == 0:
                _, g32, d32 = model.loss_and_grads(ids, y, seen["scale"], False)
                g16 = seen["grads"]
                pairs = [(seen["dlogits"], d32), (g16[0], g32[0])]
                for k, (a, b) in enumerate(pairs + list(zip(g16[1::2], g32[1::2], strict=True))):
                    nz = b != 0
                    counts[k, 0] += (nz & (a == 0)).sum()
                    counts[k, 1] += nz.sum()
            if (step + 1) % cfg["curve_every"] == 0 or step + 1 == steps:
                curve.append((step + 1, model.accuracy(probe, ctx, half)))
    rec = new_record(mode)
    rec["loss"] = [float(v) for v in _host(xp, losses)]
    rec["scale"] = [float(v) for v in _host(xp, scales)]
    rec["skipped_at"] = np.flatnonzero(_host(xp, skipped)).tolist()
    rec["curve"] = [(s, float(a)) for s, a in curve]
    final = float(opt.loss_scale) if scaled else None
    return finish_record(
        rec,
        _host(xp, counts) if half else None,
        len(model.params),
        float(model.accuracy(wte, ctx, half)),
        final,
        t0,
    )


def _host(xp: Any, a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)
