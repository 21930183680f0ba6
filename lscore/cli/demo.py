"""``lscore demo``: a language model trained in float16 with and without loss scaling.

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

import concurrent.futures
import itertools
import json
import math
import os
import re
import sysconfig
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

MODES = ("float32", "float16, no scaling", "float16, dynamic scale")

Progress = Callable[[Iterable[int], str], Iterable[int]]

_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+|==|!=|<=|>=|\*\*|//|->|\S")
_U32 = np.uint32


_BLOCK = 1 << 16  # elements per block of _half: its dozen passes stay in the cache
_POOL = concurrent.futures.ThreadPoolExecutor(2)  # NumPy's ufuncs release the GIL


def _half(a: np.ndarray) -> np.ndarray:
    """Round to the nearest float16 value (kept in a float32 array), as ``astype`` does.

    NumPy's own float16 cast takes a slow path for every subnormal, which the
    float16 gradients here mostly are; this one works on the bits, block by block
    (so that its passes stay in the cache) on two threads."""
    x = np.ascontiguousarray(a, np.float32).reshape(-1)
    out = np.empty_like(x)
    starts = range(0, x.size, _BLOCK)
    if x.size <= 4 * _BLOCK:
        for s in starts:
            _half_block(x[s : s + _BLOCK], out[s : s + _BLOCK])
    else:
        list(_POOL.map(lambda s: _half_block(x[s : s + _BLOCK], out[s : s + _BLOCK]), starts))
    return out.reshape(np.shape(a))


def _half_block(x: np.ndarray, out: np.ndarray) -> None:
    """`out` = `x` rounded to float16 values.  Normal numbers round their mantissa to 10
    bits (to nearest, ties to even); below 2**-14 the step is 2**-24, which adding and
    subtracting 0.75 (whose last bit is worth 2**-24) rounds to; beyond 65504 the result
    is infinite."""
    u = x.view(_U32)
    r = out.view(_U32)
    np.right_shift(u, _U32(13), out=r)
    r &= _U32(1)
    r += u
    r += _U32(0x0FFF)
    r &= _U32(0xFFFFE000)
    mag = u & _U32(0x7FFFFFFF)
    big = (r & _U32(0x7FFFFFFF)) >= _U32(0x47800000)  # rounds to 65536 or more
    if big.any():
        r[big] = (u[big] & _U32(0x80000000)) | _U32(0x7F800000)
        nan = mag > _U32(0x7F800000)
        r[nan] = u[nan]
    with np.errstate(invalid="ignore"):  # inf - 0.75 and NaNs: not below 2**-14, not used
        t = x + np.float32(0.75)
        t -= np.float32(0.75)
    np.copyto(r, t.view(_U32), where=mag < _U32(0x38800000))  # below 2**-14


def _keep(a: np.ndarray) -> np.ndarray:
    return a


def tokens() -> tuple[list[str], list[str]]:
    """(training tokens, held-out tokens) of the standard library's top-level modules.

    Every tenth module (in name order) is held out, so the test text is code
    the model never saw."""
    root = sysconfig.get_paths()["stdlib"]
    train: list[str] = []
    test: list[str] = []
    names = sorted(f for f in os.listdir(root) if f.endswith(".py"))
    for i, name in enumerate(names):
        with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
            (test if i % 10 == 9 else train).extend(_TOKEN.findall(f.read()))
    if not test:
        raise RuntimeError(
            f"the demo reads the standard library's source, and {root} holds too few "
            f".py files ({len(names)}); a Python installed without its sources cannot run it"
        )
    return train, test


def windows(ids: np.ndarray, context: int, ahead: int = 1) -> np.ndarray:
    """Rows of `context` token ids followed by the `ahead` ids after them."""
    n = len(ids) - context - ahead + 1
    return np.stack([ids[i : i + n] for i in range(context + ahead)], axis=1)


def _data(cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """(training windows, test windows) over a vocabulary of the most frequent tokens."""
    train, test = tokens()
    vocab = [w for w, _ in Counter(train).most_common(cfg["vocab"] - 1)]
    index = {w: i + 1 for i, w in enumerate(vocab)}  # 0: any other token
    k = cfg["context"]
    a = cfg["ahead"]
    wtr = windows(np.array([index.get(w, 0) for w in train], np.int32), k, a)
    wte = windows(np.array([index.get(w, 0) for w in test], np.int32), k, a)
    pick = np.random.default_rng(cfg["seed"]).permutation(len(wte))[: cfg["test_tokens"]]
    return wtr, wte[np.sort(pick)]


def _softplus_sum(z: np.ndarray) -> float:
    """The sum of log(1 + exp(z)) over `z`, in float32 (float64 sum): max(z, 0) +
    log1p(exp(-|z|)), which neither overflows nor loses the small terms."""
    t = np.abs(z)
    np.negative(t, out=t)
    np.exp(t, out=t)
    np.log1p(t, out=t)
    return float(t.sum(dtype=np.float64) + np.maximum(z, 0).sum(dtype=np.float64))


def target_cells(y: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns) of the logits whose target is 1: each row's words in `y`
    (the next tokens), each once."""
    cells = np.unique(np.arange(len(y))[:, None] * vocab + y)
    return cells // vocab, cells % vocab


class LM:
    """Embedding, ReLU layers, a sigmoid per word of the vocabulary (is it among the next
    tokens?), binary cross-entropy averaged over batch x vocabulary.

    ``params`` is ``[embedding, W1, b1, ..., Wn, bn]`` (weights stored (in, out))."""

    def __init__(self, cfg: dict, rng: np.random.Generator) -> None:
        k, e, h, v = cfg["context"], cfg["embed"], cfg["hidden"], cfg["vocab"]
        self.context = k
        self.params = [rng.standard_normal((v, e)).astype(np.float32)]  # as torch.nn.Embedding
        dims = [k * e] + [h] * cfg["layers"] + [v]
        for n_in, n_out in itertools.pairwise(dims):
            bound = np.float32(1 / math.sqrt(n_in))  # as torch.nn.Linear
            self.params += [
                rng.uniform(-bound, bound, (n_in, n_out)).astype(np.float32),
                rng.uniform(-bound, bound, n_out).astype(np.float32),
            ]

    def copy(self) -> LM:
        other = LM.__new__(LM)
        other.context = self.context
        other.params = [p.copy() for p in self.params]
        return other

    def forward(self, ids: np.ndarray, half: bool) -> tuple[np.ndarray, list]:
        r = _half if half else _keep
        p = [r(q) for q in self.params]
        a = p[0][ids].reshape(len(ids), -1)
        acts = []
        n = len(p) // 2
        for i in range(n):
            w, b = p[1 + 2 * i], p[2 + 2 * i]
            acts.append((a, w))
            z = r(a @ w + b)
            a = z if i == n - 1 else np.maximum(z, 0)
        return a, acts

    def loss_and_grads(
        self, ids: np.ndarray, y: np.ndarray, scale: float, half: bool
    ) -> tuple[float, list[np.ndarray], np.ndarray]:
        """Mean binary cross-entropy (`y`: each row's next tokens), the gradients of
        loss * scale (float16 values if `half`) and the gradient of loss * scale with
        respect to the logits.

        The embedding's gradient is summed in float32 from the float16 gradients
        of its rows, as under torch.autocast (an embedding runs in float32 there)."""
        r = _half if half else _keep
        logits, acts = self.forward(ids, half)
        n, v = logits.shape
        rows, cols = target_cells(y, v)
        loss = float((_softplus_sum(logits) - logits[rows, cols].sum()) / (n * v))
        grads: list[Any] = [None] * len(self.params)
        with np.errstate(over="ignore", invalid="ignore"):
            p = np.negative(logits)
            np.exp(p, out=p)
            p += 1
            np.reciprocal(p, out=p)  # sigmoid
            p[rows, cols] -= 1
            p *= np.float32(scale / (n * v))  # seeded with the scale
            d = dlogits = r(p)
            for i in range(len(acts) - 1, -1, -1):
                a, w = acts[i]
                grads[1 + 2 * i] = r(a.T @ d)
                grads[2 + 2 * i] = r(d.sum(axis=0))
                d = r(d @ w.T)
                if i:
                    d *= a > 0
            emb = np.zeros_like(self.params[0])
            np.add.at(emb, ids.ravel(), d.reshape(-1, emb.shape[1]))
        grads[0] = emb
        return loss, grads, dlogits

    def accuracy(self, w: np.ndarray, half: bool) -> float:
        """Share of windows `w` whose top-scored word is among their next tokens."""
        hits = 0
        k = self.context
        for s in range(0, len(w), 8192):
            logits, _ = self.forward(w[s : s + 8192, :k], half)
            top = np.argmax(logits, axis=1)
            hits += int(np.sum((w[s : s + 8192, k:] == top[:, None]).any(axis=1)))
        return hits / len(w)


def layer_names(n_params: int) -> list[str]:
    """What :func:`flushed` counts: the logits' gradient, then each weight's."""
    n = n_params // 2
    return ["logits", "embedding"] + [f"layer {i + 1}" for i in range(n - 1)] + ["output"]


def flushed(dlogits16, grads16: Sequence, dlogits32, grads32: Sequence) -> np.ndarray:
    """Per array (the logits' gradient, the embedding's, then each layer's weight
    matrix's): (elements nonzero in float32 but zero in float16, elements nonzero in
    float32)."""
    pairs = [(dlogits16, dlogits32), (grads16[0], grads32[0])]
    pairs += list(zip(grads16[1::2], grads32[1::2], strict=True))
    out = np.zeros((len(pairs), 2), np.int64)
    for k, (g16, g32) in enumerate(pairs):
        nz = g32 != 0
        out[k] = int((nz & (g16 == 0)).sum()), int(nz.sum())
    return out


def _optimizer(mode: str, cfg: dict, adapter: Any) -> Any:
    adam = adapter.Adam(cfg["learning_rate"], epsilon=cfg["epsilon"])
    if mode == MODES[2]:
        return adapter.LossScaleOptimizer(
            adam, initial_scale=cfg["initial_scale"], dynamic_growth_steps=cfg["growth_steps"]
        )
    return adam


def new_record(mode: str) -> dict:
    return {"mode": mode, "loss": [], "scale": [], "skipped_at": [], "curve": []}


def finish_record(
    rec: dict, counts: np.ndarray | None, n_params: int, accuracy: float, final_scale, t0: float
) -> dict:
    """Add the summary (accuracy, skips, flushed fractions) to a record."""
    by_layer = None
    fraction = None
    if counts is not None:
        by_layer = {
            name: (int(c[0]) / int(c[1]) if c[1] else 0.0)
            for name, c in zip(layer_names(n_params), counts, strict=True)
        }
        weights = counts[1:]  # the weights' gradients: what the optimizer sees
        fraction = int(weights[:, 0].sum()) / max(int(weights[:, 1].sum()), 1)
    rec.update(
        test_accuracy=accuracy,
        skipped=len(rec["skipped_at"]),
        final_scale=final_scale,
        underflow_fraction=fraction,
        underflow_by_layer=by_layer,
        wall_time=time.perf_counter() - t0,
    )
    return rec


def train_mode(
    mode: str, model0: LM, data: tuple, cfg: dict, adapter: Any, progress: Progress
) -> dict:
    """Train one mode; returns its record (curves and summary)."""
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


COLORS = dict(zip(MODES, ("black", "tab:red", "tab:blue"), strict=True))


def _plot(records: list[dict], path: str, cfg: dict) -> None:
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


def _table(records: list[dict]) -> str:
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
    widths = [max(len(x[i]) for x in [*rows, head]) for i in range(len(head))]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def _summary(records: list[dict]) -> str:
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


def config(steps: int | None = None, seed: int = 0, tiny: bool = False) -> dict:
    """The demo's settings; `tiny`: a quick check of the whole run (2**25 logits a step
    as in the full run, 8 steps, the scale starting near its working range and doubling
    after 2 finite steps, so that it grows, overflows once and the float16 modes still
    learn apart within them)."""
    cfg = {
        "steps": 120,
        "seed": seed,
        "vocab": 8192,
        "context": 4,
        "ahead": 4,
        "embed": 32,
        "hidden": 64,
        "layers": 1,
        "batch_size": 4096,
        "learning_rate": 0.03,
        "epsilon": 1e-8,
        "initial_scale": 2.0**32,
        "growth_steps": 10,
        "measure_every": 20,
        "curve_every": 10,
        "curve_tokens": 2048,
        "test_tokens": 8192,
    }
    if tiny:
        cfg.update(
            steps=8,
            initial_scale=2.0**22,
            growth_steps=2,
            measure_every=3,
            curve_every=3,
            curve_tokens=500,
            test_tokens=1000,
        )
    if steps is not None:
        cfg["steps"] = steps
    return cfg


def check_out(out: str) -> None:
    """Make folder `out` if missing and check that the demo's files can be written there,
    before any training; ValueError saying why not."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"{out} is a file; expected a folder")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot make folder {out}: {e.strerror or e}") from None
    for name in OUTPUTS:
        if os.path.isdir(os.path.join(out, name)):
            raise ValueError(f"{os.path.join(out, name)} is a folder; the demo writes a file there")
    try:
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise ValueError(f"cannot write in {out}: {e.strerror or e}") from None


OUTPUTS = ("lscore_demo.png", "lscore_demo.json")


def run(
    steps: int | None = None,
    seed: int = 0,
    out: str = ".",
    backend: str = "numpy",
    tiny: bool = False,
) -> int:
    """Train the three modes, print the table, write the PNG and the JSON; returns an exit code."""
    if backend not in ("numpy", "torch", "cupy"):
        raise ValueError(f"unknown backend {backend!r}; expected numpy, torch or cupy")
    check_out(out)
    from threadpoolctl import threadpool_limits
    from tqdm import tqdm

    from lscore.adapters import numpy as adapter

    threadpool_limits(1)  # more BLAS threads than this small model needs only add overhead

    cfg = config(steps, seed, tiny)
    data = _data(cfg)
    model0 = LM(cfg, np.random.default_rng(seed))

    def progress(it: Iterable[int], desc: str) -> Iterable[int]:
        return tqdm(it, desc=desc, leave=True, mininterval=0.3)

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
        print(" ".join((__doc__ or "").split("\n\n")[1].split()) + "\n")
        records = [train_mode(m, model0, data, cfg, adapter, progress) for m in MODES]
    print()
    print(_table(records))
    print(_summary(records))
    png, js = (os.path.join(out, name) for name in OUTPUTS)
    _plot(records, png, cfg)
    with open(js, "w") as f:
        json.dump(
            {
                "config": cfg,
                "results": [
                    {k: v for k, v in r.items() if k not in ("loss", "scale")} for r in records
                ],
            },
            f,
            indent=1,
        )
    print(f"\nplot: {os.path.abspath(png)}\nresults: {os.path.abspath(js)}")
    return 0
