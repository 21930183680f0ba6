"""``lscore demo --backend cupy``: the demo's four modes on a GPU, in real float16.

The same MLP (the same initial weights as the NumPy demo), data and batches,
on CuPy arrays: float32 master weights, and in the float16 modes a forward
and backward pass whose matrix products, activations and gradients are
float16 arrays on the GPU.  The optimizer is lscore.adapters.cupy's SGD
(fused kernels: float16 gradients are unscaled, checked and applied to the
float32 masters in one pass).  The dynamic mode is the sync-free
``LossScaleOptimizer``: the scale, its counters and the skip decision stay on
the device and the loop reads nothing back and uploads nothing
(the backward pass writes its gradients into fixed buffers, so the
optimizer's plan of them is made once); losses, scales and the
flushed-gradient counts are gathered into device arrays and read once at
the end.  The fixed mode is TF1's ``FixedLossScaleManager`` (a step
whose gradients overflow is skipped), which syncs once per step to decide.

The code is written against an array module and an adapter module, so the
tests run it on NumPy with the CPU host harness standing in for the GPU.
"""

from __future__ import annotations

import time

import numpy as np

from lscore import cuda
from lscore.managers import FixedLossScaleManager

DESCRIPTION = (
    "The data is scikit-learn's bundled digits set (1797 8x8 images, no download); "
    "the model a ReLU perceptron.  CuPy backend: real float16 matrix products and "
    "gradients on the GPU, float32 master weights, lscore.adapters.cupy's fused SGD; "
    "the dynamic scale is the sync-free LossScaleOptimizer (no host sync per step), "
    "the fixed one TF1's FixedLossScaleManager."
)


# why the CuPy demo cannot run here, or None
gpu_missing = cuda.device_missing


class DeviceMLP:
    """The NumPy demo's MLP on `xp` arrays: float32 masters, float16 compute when `half`."""

    def __init__(self, xp, model0):
        self.xp = xp
        self.params = [xp.asarray(p) for p in model0.params]
        self._grads = {}  # dtype -> the gradient buffers, written in place every step

    def _buffers(self, dt) -> list:
        """Fixed gradient arrays: the fused optimizer plans a list of arrays once (a new
        array at a new address costs an upload, which waits for the GPU)."""
        bufs = self._grads.get(dt)
        if bufs is None:
            bufs = self._grads[dt] = [self.xp.empty(p.shape, dt) for p in self.params]
        return bufs

    def forward(self, x, half: bool):
        xp = self.xp
        dt = xp.float16 if half else xp.float32
        a, acts = x.astype(dt), []
        n = len(self.params) // 2
        for i in range(n):
            w, b = self.params[2 * i].astype(dt), self.params[2 * i + 1].astype(dt)
            acts.append((a, w))
            z = a @ w + b
            a = z if i == n - 1 else xp.maximum(z, 0)
        return a, acts

    def loss_and_grads(self, x, y, scale, half: bool):
        """Mean cross-entropy (a device scalar) and the gradients of loss * scale.

        `scale` may be a device scalar (the sync-free optimizer's own), so
        nothing here reads the device."""
        xp = self.xp
        logits, acts = self.forward(x, half)
        z = logits.astype(xp.float32)
        z = z - z.max(axis=1, keepdims=True)  # the loss itself in float32
        p = xp.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        rows = xp.arange(len(y))
        loss = -xp.log(p[rows, y] + 1e-30).mean()
        p[rows, y] -= 1
        d = (p * (xp.asarray(scale, xp.float32) / len(y))).astype(acts[0][0].dtype)
        grads = self._buffers(d.dtype)
        for i in range(len(acts) - 1, -1, -1):
            a, w = acts[i]
            xp.matmul(a.T, d, out=grads[2 * i])
            d.sum(axis=0, out=grads[2 * i + 1])
            if i:
                d = (d @ w.T) * (a > 0)
        return loss, grads

    def accuracy(self, x, y, half: bool) -> float:
        logits, _ = self.forward(x, half)
        return float((logits.argmax(axis=1) == y).mean())


def _optimizer(mode, cfg, adapter, modes):
    sgd = adapter.SGD(cfg["learning_rate"], momentum=cfg["momentum"])
    if mode == modes[2]:
        return adapter.LossScaleOptimizer(
            sgd,
            initial_scale=cfg["initial_scale"],
            dynamic_growth_steps=cfg["growth_steps"],
            sync_free=True,
        )
    if mode == modes[3]:
        return adapter.LossScaleOptimizer(
            sgd, loss_scale_manager=FixedLossScaleManager(cfg["fixed_scale"])
        )
    return sgd


def train_mode(mode, model0, data, cfg, xp, adapter, progress, modes):
    """Train one mode on the device; returns its record (the NumPy demo's shape)."""
    xtr, xte, ytr, yte = (xp.asarray(a) for a in data)
    model = DeviceMLP(xp, model0)
    half = mode != modes[0]
    opt = _optimizer(mode, cfg, adapter, modes)
    scaled = isinstance(opt, adapter.LossScaleOptimizer)
    rng = np.random.default_rng(cfg["seed"] + 1)  # same batches in every mode
    steps, every = cfg["steps"], cfg["measure_every"]
    losses = xp.zeros(steps, xp.float32)
    scales = xp.ones(steps, xp.float32)
    skipped = xp.zeros(steps, bool)
    flushed = xp.zeros((-(-steps // every), 2), xp.int64)  # (lost, nonzero) per measurement
    t0 = time.perf_counter()
    # float16 overflow is what loss scaling handles: NumPy need not warn about it
    with np.errstate(over="ignore", invalid="ignore"):
        for step in progress(range(steps), desc=f"{mode:24s}"):
            idx = xp.asarray(rng.integers(0, len(ytr), cfg["batch_size"]))
            x, y = xtr[idx], ytr[idx]
            seen: dict = {}

            def loss_and_grads(scale, x=x, y=y, seen=seen):
                seen["scale"] = scale
                loss, grads = model.loss_and_grads(x, y, scale, half)
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
                _, g32 = model.loss_and_grads(x, y, 1.0, False)
                for g16, g in zip(seen["grads"][::2], g32[::2], strict=True):  # weight matrices
                    nz = g != 0
                    flushed[step // every, 0] += (nz & (g16 == 0)).sum()
                    flushed[step // every, 1] += nz.sum()
    skipped_at = np.flatnonzero(_host(xp, skipped)).tolist()
    counts = _host(xp, flushed)
    lost, total = int(counts[:, 0].sum()), int(counts[:, 1].sum())
    return {
        "mode": mode,
        "loss": [float(v) for v in _host(xp, losses)],
        "scale": [float(v) for v in _host(xp, scales)],
        "skipped_at": skipped_at,
        "underflow": [(k * every, int(a) / max(int(b), 1)) for k, (a, b) in enumerate(counts)]
        if half
        else [],
        "test_accuracy": model.accuracy(xte, yte, half),
        "train_accuracy": model.accuracy(xtr, ytr, half),
        "skipped": len(skipped_at),
        "final_scale": float(opt.loss_scale) if scaled else None,
        "underflow_fraction": (lost / total) if half and total else None,
        "wall_time": time.perf_counter() - t0,
    }


def _host(xp, a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def train_all(model0, data, cfg, progress, modes, xp=None, adapter=None):
    """The four modes on the GPU (or on `xp` with `adapter`, for tests)."""
    if xp is None:
        import cupy

        from lscore.adapters import cupy as adapter

        xp = cupy
    return [train_mode(m, model0, data, cfg, xp, adapter, progress, modes) for m in modes]
