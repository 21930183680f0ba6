"""``lscore demo``: a small MLP trained in float16 with and without loss scaling.

The data is scikit-learn's bundled digits set (1797 8x8 images, no download).
The model is a hand-written multilayer perceptron with float32 master weights
and a float16 forward and backward pass.  float16 is *emulated*: every
operation runs in float32 and its result is rounded to float16 (matrix
products accumulate in float32 and round their output, as tensor cores do).
The rounding reproduces float16's range and precision exactly, including
gradients that flush to zero below 2**-24, which is what loss scaling fixes.

Four modes train from the same initial weights on the same batches:
float32; float16 without loss scaling; float16 with dynamic loss scaling
(the Keras 2 LossScaleOptimizer); float16 with a fixed scale (TF1's
FixedLossScaleManager, which skips steps whose gradients overflow).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time

import numpy as np

MODES = ("float32", "float16, no scaling", "float16, dynamic scale", "float16, fixed scale")


def _half(a):
    """Round to the nearest float16 value (kept in a float32 array)."""
    with np.errstate(over="ignore"):
        return a.astype(np.float16).astype(np.float32)


def _keep(a):
    return a


class MLP:
    """A ReLU perceptron with softmax cross-entropy averaged over the batch."""

    def __init__(self, sizes, rng):
        self.params = []
        for n_in, n_out in itertools.pairwise(sizes):
            w = rng.standard_normal((n_in, n_out)).astype(np.float32) * np.float32(
                math.sqrt(2.0 / n_in)
            )  # He initialisation
            self.params += [w, np.zeros(n_out, np.float32)]

    def copy(self):
        other = MLP.__new__(MLP)
        other.params = [p.copy() for p in self.params]
        return other

    def forward(self, x, half: bool):
        r = _half if half else _keep
        a, acts = r(x), []
        n = len(self.params) // 2
        for i in range(n):
            w, b = r(self.params[2 * i]), r(self.params[2 * i + 1])
            acts.append((a, w))
            z = r(r(a @ w) + b)
            a = z if i == n - 1 else np.maximum(z, 0)
        return a, acts

    def loss_and_grads(self, x, y, scale: float, half: bool):
        """Mean cross-entropy and the gradients of loss * scale (float16 if `half`)."""
        r = _half if half else _keep
        logits, acts = self.forward(x, half)
        z = logits - logits.max(axis=1, keepdims=True)  # the loss itself in float32
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.mean(np.log(p[np.arange(len(y)), y] + 1e-30)))
        d = p
        d[np.arange(len(y)), y] -= 1
        with np.errstate(over="ignore", invalid="ignore"):
            d = r(d * np.float32(scale / len(y)))  # seeded with the scale
            grads = [None] * len(self.params)
            for i in range(len(acts) - 1, -1, -1):
                a, w = acts[i]
                grads[2 * i] = r(a.T @ d)
                grads[2 * i + 1] = r(d.sum(axis=0))
                if i:
                    d = r(d @ w.T) * (a > 0)
        return loss, grads

    def accuracy(self, x, y, half: bool) -> float:
        logits, _ = self.forward(x, half)
        return float(np.mean(np.argmax(logits, axis=1) == y))


def _data(seed: int):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def _underflow(grads16, grads32):
    """(elements nonzero in float32 but zero in float16, elements nonzero in float32)."""
    lost = total = 0
    for g16, g32 in zip(grads16[::2], grads32[::2], strict=True):  # weight matrices
        nz = g32 != 0
        total += int(nz.sum())
        lost += int((nz & (g16 == 0)).sum())
    return lost, total


def _optimizer(mode, cfg, adapter):
    sgd = adapter.SGD(cfg["learning_rate"], momentum=cfg["momentum"])
    if mode == MODES[2]:
        return adapter.LossScaleOptimizer(
            sgd, initial_scale=cfg["initial_scale"], dynamic_growth_steps=cfg["growth_steps"]
        )
    if mode == MODES[3]:
        return adapter.LossScaleOptimizer(
            sgd, loss_scale_manager=adapter.FixedLossScaleManager(cfg["fixed_scale"])
        )
    return sgd


def train_mode(mode, model0, data, cfg, adapter, progress):
    """Train one mode; returns its record (curves and summary)."""
    xtr, xte, ytr, yte = data
    model = model0.copy()
    half = mode != MODES[0]
    opt = _optimizer(mode, cfg, adapter)
    scaled = isinstance(opt, adapter.LossScaleOptimizer)
    rng = np.random.default_rng(cfg["seed"] + 1)  # same batches in every mode
    rec = {"mode": mode, "loss": [], "scale": [], "skipped_at": [], "underflow": []}
    lost = total = skipped = 0
    t0 = time.perf_counter()
    for step in progress(range(cfg["steps"]), desc=f"{mode:24s}"):
        idx = rng.integers(0, len(ytr), cfg["batch_size"])
        x, y = xtr[idx], ytr[idx]
        scale = opt.loss_scaling.scale if scaled else 1.0
        loss, grads = model.loss_and_grads(x, y, scale, half)
        pairs = list(zip(grads, model.params, strict=True))
        if scaled:
            pairs = list(zip(opt.get_unscaled_gradients(grads), model.params, strict=True))
            applied = opt.apply_gradients(pairs)
        else:
            opt.apply_gradients(pairs)
            applied = True
        if half and step % cfg["measure_every"] == 0:
            _, g32 = model.loss_and_grads(x, y, 1.0, False)
            n_lost, n_total = _underflow([g for g, _ in pairs], g32)
            lost, total = lost + n_lost, total + n_total
            rec["underflow"].append((step, n_lost / max(n_total, 1)))
        skipped += not applied
        if not applied:
            rec["skipped_at"].append(step)
        rec["loss"].append(loss)
        rec["scale"].append(scale)
    rec.update(
        test_accuracy=model.accuracy(xte, yte, half),
        train_accuracy=model.accuracy(xtr, ytr, half),
        skipped=skipped,
        final_scale=opt.loss_scaling.scale if scaled else None,
        underflow_fraction=(lost / total) if half and total else None,
        wall_time=time.perf_counter() - t0,
    )
    return rec


def _plot(records, path, cfg):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.6))
    colors = dict(zip(MODES, ("black", "tab:red", "tab:blue", "tab:green"), strict=True))
    k = max(1, cfg["steps"] // 100)  # moving average window
    for rec in records:
        loss = np.asarray(rec["loss"])
        smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
        ax1.plot(
            np.arange(len(smooth)) + k - 1,
            smooth,
            color=colors[rec["mode"]],
            label=f"{rec['mode']} (test acc {rec['test_accuracy']:.3f})",
            lw=1.4,
        )
    ax1.set(
        yscale="log", xlabel="step", ylabel=f"training loss ({k}-step mean)", title="Training loss"
    )
    ax1.legend(fontsize=8)
    for rec in records[2:]:
        ax2.plot(rec["scale"], color=colors[rec["mode"]], label=rec["mode"], lw=1.4)
        if rec["skipped_at"]:
            s = np.asarray(rec["skipped_at"])
            ax2.plot(
                s,
                np.asarray(rec["scale"])[s],
                "x",
                color=colors[rec["mode"]],
                ms=5,
                label=f"skipped step ({rec['mode'].split(', ')[1]})",
            )
    ax2.set(yscale="log", xlabel="step", ylabel="loss scale", title="Loss scale (base 2 log axis)")
    ax2.set_yscale("log", base=2)
    ax2.legend(fontsize=8)
    for rec in records[1:]:
        if rec["underflow"]:
            st, fr = zip(*rec["underflow"], strict=True)
            ax3.plot(st, 100 * np.asarray(fr), color=colors[rec["mode"]], label=rec["mode"], lw=1.2)
    ax3.set(
        xlabel="step",
        ylabel="% of weight-gradient elements",
        title="float16 gradients flushed to zero\n(nonzero in float32, zero in float16)",
    )
    ax3.legend(fontsize=8)
    fig.suptitle(
        f"lscore demo: MLP {'-'.join(map(str, cfg['sizes']))} on scikit-learn digits, "
        f"float16 {_HOW_HALF.get(cfg.get('backend'), 'emulated')}, "
        f"{cfg['steps']} steps per mode",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


_HOW_HALF = {"torch": "via torch.autocast", "cupy": "on the GPU (CuPy)"}


def _table(records) -> str:
    head = ("mode", "test acc", "skipped", "final scale", "fp16 grads -> 0", "time (s)")
    rows = []
    for r in records:
        uf = r["underflow_fraction"]
        rows.append(
            (
                r["mode"],
                f"{r['test_accuracy']:.4f}",
                str(r["skipped"]),
                "-" if r["final_scale"] is None else f"{r['final_scale']:g}",
                "-" if uf is None else f"{100 * uf:.2f}%",
                f"{r['wall_time']:.1f}",
            )
        )
    widths = [max(len(x[i]) for x in [*rows, head]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)

    def fmt(row):
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    return "\n".join([fmt(head), line] + [fmt(r) for r in rows])


def _summary(records, cfg) -> str:
    """What the numbers say, worded from the numbers (never canned)."""
    f32, raw, dyn = records[0], records[1], records[2]
    lines = [
        f"\nWithout loss scaling, {100 * raw['underflow_fraction']:.1f}% of the float16 "
        "weight-gradient elements that are nonzero in float32 flushed to zero (checked every "
        f"{cfg['measure_every']} steps); with dynamic loss scaling "
        f"{100 * dyn['underflow_fraction']:.2f}%.",
        f"Test accuracy: float32 {f32['test_accuracy']:.4f}, float16 without scaling "
        f"{raw['test_accuracy']:.4f}, float16 with dynamic scaling {dyn['test_accuracy']:.4f}.",
    ]
    gap = dyn["test_accuracy"] - raw["test_accuracy"]
    if abs(gap) < 0.01:
        lines.append(
            "On this small, easy problem the lost gradients cost little accuracy: the "
            "underflow is real, its effect on the result here is small."
        )
    return "\n".join(lines)


def config(steps: int, seed: int) -> dict:
    return {
        "steps": steps,
        "seed": seed,
        "sizes": [64, 128, 128, 128, 10],
        "batch_size": 64,
        "learning_rate": 0.05,
        "momentum": 0.9,
        "initial_scale": 2.0**15,
        "growth_steps": 200,
        "fixed_scale": 2.0**10,
        "measure_every": 10,
    }


def run(steps: int = 1000, seed: int = 0, out: str = ".", backend: str = "numpy") -> int:
    """Train the four modes, print the table, write the PNG and the JSON; returns an exit code."""
    if backend not in ("numpy", "torch", "cupy"):
        raise ValueError(f"unknown backend {backend!r}; expected numpy, torch or cupy")
    from threadpoolctl import threadpool_limits  # installed with scikit-learn
    from tqdm import tqdm

    from lscore.adapters import numpy as adapter

    threadpool_limits(1)  # the matrices are small: BLAS threads only add overhead

    cfg = config(steps, seed)
    data = _data(seed)
    model0 = MLP(cfg["sizes"], np.random.default_rng(seed))
    progress = lambda it, desc: tqdm(it, desc=desc, leave=True, mininterval=0.3)  # noqa: E731 - a one-line local helper
    if backend == "cupy":
        from lscore.cli import demo_cupy

        missing = demo_cupy.gpu_missing()
        if missing is not None:
            print(
                f"lscore demo --backend cupy needs a CUDA GPU: {missing}; "
                "running the CPU demo instead.\n"
            )
            backend = "numpy"
    if backend == "cupy":
        print(demo_cupy.DESCRIPTION + "\n")
        cfg["backend"] = "cupy"
        records = demo_cupy.train_all(model0, data, cfg, progress, MODES)
    elif backend == "torch":
        from lscore.cli import demo_torch

        print(demo_torch.DESCRIPTION + "\n")
        cfg["backend"] = "torch"
        records = [demo_torch.train_mode(m, model0, data, cfg, progress, MODES) for m in MODES]
    else:
        print(__doc__.split("\n\n")[1].replace("\n", " ") + "\n")
        records = [train_mode(m, model0, data, cfg, adapter, progress) for m in MODES]
    print()
    print(_table(records))
    print(_summary(records, cfg))
    os.makedirs(out, exist_ok=True)
    png = os.path.join(out, "lscore_demo.png")
    js = os.path.join(out, "lscore_demo.json")
    _plot(records, png, cfg)
    with open(js, "w") as f:
        json.dump(
            {
                "config": cfg,
                "results": [
                    {k: v for k, v in r.items() if k not in ("loss", "scale", "underflow")}
                    for r in records
                ],
            },
            f,
            indent=1,
        )
    print(f"\nplot: {os.path.abspath(png)}\nresults: {os.path.abspath(js)}")
    return 0
