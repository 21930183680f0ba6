"""``lscore demo --fp8``: the demo's model in bfloat16, and with FP8 linear layers.

The same language model, data and batches as the float16 demo, trained with
Adam on float32 master weights in three modes: bfloat16 (every result rounded
to bfloat16); and the same with FP8 linear layers, whose input and weight are
cast to float8_e4m3fn with a per-tensor scale (lscore.fp8.casting) and
widened back (dequantize) before a float32 product, under TransformerEngine's
delayed scaling (te-delayed: the scale comes from the amax history of the steps
before) and torchao's current scaling (torchao-tensorwise: the scale comes from
the tensor's own amax).  Every few steps lscore.fp8.Float8Monitor reads what
each cast did: the amax, the scale, the elements saturated and flushed to zero.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lscore.cli.demo.model import LM, Progress, description, new_record
from lscore.diagnostics import format_table

FP8_MODES = ("bfloat16", "fp8, delayed scaling", "fp8, current scaling")
RECIPES = {FP8_MODES[1]: "te-delayed", FP8_MODES[2]: "torchao-tensorwise"}
OUTPUTS = ("lscore_demo_fp8.png", "lscore_demo_fp8.json")

DESCRIPTION = description(__doc__)

_U32 = np.uint32


def bfloat16(a: np.ndarray) -> np.ndarray:
    """Round to the nearest bfloat16 value (ties to even), kept in a float32 array; NaN
    stays NaN."""
    x = np.ascontiguousarray(a, np.float32)
    u = x.view(_U32)
    r = (u >> _U32(16)) & _U32(1)
    r += u
    r += _U32(0x7FFF)
    r &= _U32(0xFFFF0000)
    out = r.view(np.float32)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = x[nan]
    return out


class Float8Layers:
    """The precision of an FP8 mode for :meth:`LM.forward`: bfloat16 results, and each
    linear layer's input and weight cast to e4m3fn with `recipe`'s scales.

    Under delayed scaling the scales are a ``DelayedScaling`` state of all the
    casts: each training step's amaxes are recorded and the scales updated after
    it (``update``), as TransformerEngine does once per step."""

    def __init__(self, name: str, n_layers: int) -> None:
        from lscore import fp8

        recipe = fp8.recipe(name)
        assert isinstance(recipe, fp8.Recipe), f"{name} is a per-tensor recipe"
        self.recipe = recipe
        self.names = [f"layer {i + 1} {t}" for i in range(n_layers) for t in ("input", "weight")]
        self.delayed = (
            fp8.DelayedScaling(self.recipe, len(self.names))
            if self.recipe.scaling == "delayed"
            else None
        )
        self.amaxes = np.zeros(len(self.names), np.float32)
        self.seen: dict[str, tuple[np.ndarray, float]] = {}  # name -> (tensor, its scale)

    round = staticmethod(bfloat16)

    def cast(self, i: int, a: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from lscore.fp8.casting import dequantize, quantize, quantize_current

        r = self.recipe
        out = []
        for k, x in ((2 * i, a), (2 * i + 1, w)):
            if self.delayed is not None:
                scale = self.delayed.scale[k]
                q, amax = quantize(
                    x,
                    scale,
                    r.forward_format,
                    saturate=r.saturate,
                    nan_sign=r.nan_sign,
                    amax_nan=r.amax_nan,
                )
            else:
                f = quantize_current(x, r, r.forward_format)
                q, scale, amax = f.data, f.scale, f.amax
            self.amaxes[k] = max(self.amaxes[k], amax)
            self.seen[self.names[k]] = (x, float(scale))
            out.append(dequantize(q, scale))
        return out[0], out[1]

    def start_step(self) -> None:
        self.amaxes[:] = 0
        self.seen.clear()

    def end_step(self) -> None:
        """After a training step: the delayed scales take its amaxes."""
        if self.delayed is not None:
            self.delayed.record(self.amaxes)
            self.delayed.update()


def train(mode: str, model0: LM, data: tuple, cfg: dict, progress: Progress) -> dict:
    """Train one of :data:`FP8_MODES` with lscore's NumPy Adam; returns its record: the
    NumPy backend's keys, and for the FP8 modes the casts' statistics every
    ``measure_every`` steps (``fp8``: tensor -> step, amax, scale, saturated and flushed
    fractions) and their means over the run."""
    from lscore.adapters import numpy as adapter
    from lscore.fp8 import Float8Monitor

    wtr, wte = data
    model = model0.copy()
    n_layers = len(model.params) // 2
    layers = Float8Layers(RECIPES[mode], n_layers) if mode in RECIPES else None
    half: Any = layers if layers is not None else _BFLOAT16
    monitor = Float8Monitor(amax_nan=layers.recipe.amax_nan) if layers is not None else None
    opt = adapter.Adam(cfg["learning_rate"], epsilon=cfg["epsilon"])
    rng = np.random.default_rng(cfg["seed"] + 1)  # same batches in every mode
    probe = wte[: cfg["curve_tokens"]]
    rec = new_record(mode)
    t0 = time.perf_counter()
    for step in progress(range(cfg["steps"]), f"{mode:24s}"):
        batch = wtr[rng.integers(0, len(wtr), cfg["batch_size"])]
        ids, y = batch[:, : cfg["context"]], batch[:, cfg["context"] :]
        if layers is not None:
            layers.start_step()
        loss, grads, _ = model.loss_and_grads(ids, y, 1.0, half)
        if monitor is not None and layers is not None:
            if step % cfg["measure_every"] == 0 or step + 1 == cfg["steps"]:
                monitor.observe(step, dict(layers.seen))
            layers.end_step()
        opt.apply_gradients(list(zip(grads, model.params, strict=True)))
        rec["loss"].append(loss)
        if (step + 1) % cfg["curve_every"] == 0 or step + 1 == cfg["steps"]:
            rec["curve"].append((step + 1, model.accuracy(probe, half)))
    rec.update(test_accuracy=model.accuracy(wte, half), recipe=RECIPES.get(mode))
    if monitor is not None:
        rec["fp8"] = {
            n: {k: v.tolist() for k, v in monitor.history(n).items()} for n in monitor.names
        }
        rec["saturated_fraction"] = float(np.mean([r.saturated_fraction for r in monitor.records]))
        rec["flushed_fraction"] = float(np.mean([r.flushed_fraction for r in monitor.records]))
        rec["last_table"] = monitor.table()
    rec["wall_time"] = time.perf_counter() - t0
    return rec


class _BFloat16:
    """The bfloat16 mode's precision: every result rounded, the layers' products in
    float32 on those values."""

    round = staticmethod(bfloat16)
    cast = None


_BFLOAT16 = _BFloat16()


def table(records: list[dict]) -> str:
    head = ("mode", "recipe", "test acc", "saturated", "flushed", "time (s)")
    rows = []
    for r in records:
        sat, fl = r.get("saturated_fraction"), r.get("flushed_fraction")
        rows.append(
            (
                r["mode"],
                r["recipe"] or "-",
                f"{100 * r['test_accuracy']:.1f}%",
                "-" if sat is None else f"{100 * sat:.3f}%",
                "-" if fl is None else f"{100 * fl:.3f}%",
                f"{r['wall_time']:.1f}",
            )
        )
    return format_table(head, rows)


COLORS = dict(zip(FP8_MODES, ("black", "tab:red", "tab:blue"), strict=True))


def plot(records: list[dict], path: str, cfg: dict) -> None:
    """Loss, accuracy, and per FP8 mode the amax and scale history of every cast and the
    share of elements saturated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((ax0, ax1), (ax2, ax3)) = plt.subplots(2, 2, figsize=(12, 8.4))
    k = max(1, cfg["curve_every"])
    for rec in records:
        loss = np.asarray(rec["loss"])
        smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
        ax0.plot(np.arange(len(smooth)) + k, smooth, color=COLORS[rec["mode"]], lw=1.4)
        steps, acc = zip(*rec["curve"], strict=True)
        label = f"{rec['mode']} (test {100 * rec['test_accuracy']:.1f}%)"
        ax1.plot(steps, 100 * np.asarray(acc), color=COLORS[rec["mode"]], label=label, lw=1.6)
    ax0.set(xlabel="step", ylabel=f"training loss ({k}-step mean)", title="Training loss")
    ax1.set(xlabel="step", ylabel="held-out accuracy (%)", title="Top word among the next tokens")
    ax1.legend(fontsize=9)
    styles = ("-", "--", ":", "-.")
    for rec in records[1:]:
        for j, (name, h) in enumerate(rec["fp8"].items()):
            kw = dict(color=COLORS[rec["mode"]], ls=styles[j % len(styles)], lw=1.2)
            ax2.plot(h["step"], h["amax"], label=f"{rec['recipe']}: {name}", **kw)
            ax3.plot(h["step"], h["scale"], **kw)
    ax2.set(xlabel="step", ylabel="amax", title="Amax of each cast", yscale="log")
    ax2.legend(fontsize=7, ncol=2)
    ax3.set(xlabel="step", ylabel="scale", title="Scale of each cast (e4m3fn)")
    ax3.set_yscale("log", base=2)
    fig.suptitle(
        f"lscore demo --fp8: bfloat16 and FP8 linear layers ({cfg['steps']} steps per mode)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
