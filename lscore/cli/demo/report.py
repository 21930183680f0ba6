"""What ``lscore demo`` shows of its records: the table, the summary in words and the figure."""

from __future__ import annotations

import numpy as np

from lscore.cli.demo.model import MODES
from lscore.diagnostics import format_table

COLORS = dict(zip(MODES, ("black", "tab:red", "tab:blue"), strict=True))


def plot(records: list[dict], path: str, cfg: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((ax0, ax1), (ax2, ax3)) = plt.subplots(2, 2, figsize=(12, 8.4))
    k = max(1, cfg["curve_every"])  # moving-average window of the loss
    for rec in records:
        loss = np.asarray(rec["loss"])
        smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
        ax0.plot(np.arange(len(smooth)) + k, smooth, color=COLORS[rec["mode"]], lw=1.4)
    ax0.set(xlabel="step", ylabel=f"training loss ({k}-step mean)", title="Training loss")
    for rec in records:
        steps, acc = zip(*rec["curve"], strict=True)
        ax1.plot(
            steps,
            100 * np.asarray(acc),
            color=COLORS[rec["mode"]],
            label=f"{rec['mode']} (test {100 * rec['test_accuracy']:.1f}%)",
            lw=1.6,
        )
    ax1.set(
        xlabel="step",
        ylabel=f"accuracy on {cfg['curve_tokens']} held-out windows (%)",
        title="Top word among the next tokens",
    )
    ax1.legend(fontsize=9)
    dyn = records[2]
    scale = np.asarray(dyn["scale"])
    ax2.plot(scale, color=COLORS[dyn["mode"]], lw=1.4, label=dyn["mode"])
    if dyn["skipped_at"]:
        s = np.asarray(dyn["skipped_at"])
        ax2.plot(s, scale[s], "x", color="tab:orange", ms=8, mew=2, label="overflow: step skipped")
    ax2.set(xlabel="step", ylabel="loss scale", title="Dynamic loss scale")
    ax2.set_yscale("log", base=2)
    ax2.legend(fontsize=9, loc="best")
    names = list(records[1]["underflow_by_layer"])
    x = np.arange(len(names))
    for off, rec in ((-0.2, records[1]), (0.2, records[2])):
        frac = [100 * rec["underflow_by_layer"][n] for n in names]
        bars = ax3.bar(x + off, frac, 0.4, color=COLORS[rec["mode"]], label=rec["mode"])
        ax3.bar_label(bars, [f"{f:.1f}" for f in frac], fontsize=8, padding=2)
    ax3.set_xticks(x, names)
    # the legend sits above the tallest bars (100%), in the band the axis adds for it
    ax3.set_ylim(0, 128)
    ax3.set_yticks(range(0, 101, 20))
    ax3.set(
        ylabel="% of gradient elements",
        title="float16 gradients flushed to zero (nonzero in float32, zero in float16)",
    )
    ax3.title.set_fontsize(10)
    ax3.legend(fontsize=9, ncol=2, loc="upper center")
    fig.suptitle(
        f"lscore demo: which words come next in the Python standard library's code\n"
        f"(sigmoid per word, vocabulary {cfg['vocab']}, {cfg['batch_size']} windows a batch, "
        "BCE averaged over batch x vocabulary;\n"
        f"float16 {_HOW_HALF.get(cfg.get('backend', ''), 'emulated')}, "
        f"{cfg['steps']} steps per mode)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


_HOW_HALF = {"torch": "via torch.autocast", "cupy": "on the GPU (CuPy)"}


def table(records: list[dict]) -> str:
    head = ("mode", "test acc", "skipped", "final scale", "fp16 grads -> 0", "time (s)")
    rows = []
    for r in records:
        uf = r["underflow_fraction"]
        rows.append(
            (
                r["mode"],
                f"{100 * r['test_accuracy']:.1f}%",
                str(r["skipped"]),
                "-" if r["final_scale"] is None else f"{r['final_scale']:g}",
                "-" if uf is None else f"{100 * uf:.1f}%",
                f"{r['wall_time']:.1f}",
            )
        )
    return format_table(head, rows)


def summary(records: list[dict]) -> str:
    """What the numbers say, worded from the numbers (never canned)."""
    f32, raw, dyn = records[0], records[1], records[2]
    layers = raw["underflow_by_layer"]
    weights = {k: v for k, v in layers.items() if k != "logits"}
    worst = max(weights, key=lambda k: weights[k])
    lines = [
        f"\nWithout loss scaling, {100 * layers['logits']:.1f}% of the elements of the "
        "logits' gradient that are nonzero in float32 flushed to zero in float16, and "
        f"{100 * raw['underflow_fraction']:.1f}% of the weights' gradient elements "
        f"({100 * weights[worst]:.1f}% in the {worst}); with dynamic loss scaling "
        f"{100 * dyn['underflow_by_layer']['logits']:.2f}% and "
        f"{100 * dyn['underflow_fraction']:.2f}%.",
        "Test accuracy (the top-scored word among the next tokens): float32 "
        f"{100 * f32['test_accuracy']:.1f}%, float16 "
        f"without scaling {100 * raw['test_accuracy']:.1f}%, float16 with dynamic scaling "
        f"{100 * dyn['test_accuracy']:.1f}%.",
    ]
    scale = dyn["scale"]
    if dyn["skipped_at"]:
        s = dyn["skipped_at"]
        lines.append(
            f"The dynamic scale went from {scale[0]:g} (lowest {min(scale):g}, "
            f"peak {max(scale):g}); "
            f"{len(s)} step(s) overflowed and were skipped, each halving the scale "
            f"(first at step {s[0]}); it ended at {dyn['final_scale']:g}."
        )
    else:
        lines.append(
            f"The dynamic scale went from {scale[0]:g} to {dyn['final_scale']:g} "
            "without an overflow."
        )
    return "\n".join(lines)
