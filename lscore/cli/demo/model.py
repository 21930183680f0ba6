"""The demo's model, data and records, shared by every backend.

The data is the source code of Python's own standard library split into tokens;
the model reads four tokens and predicts which words occur among the next four
(an embedding, ReLU layers and a sigmoid per word of the vocabulary, binary
cross-entropy averaged over batch x vocabulary).  :class:`LM` is its NumPy form,
whose float16 mode rounds every result to float16 (see the NumPy backend); a
record is the dict of curves and summary one mode's training leaves, the same
for every backend.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import os
import re
import sysconfig
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


def description(doc: str | None) -> str:
    """The line the demo prints before training: the second paragraph of a module's
    docstring, on one line and in plain text (``code`` and *emphasis* lose their reST
    marks, which a console shows as they are)."""
    text = " ".join((doc or "").split("\n\n")[1].split())
    return re.sub(r"(?<![\w*])\*(\w[^*]*?)\*(?![\w*])", r"\1", text.replace("``", ""))


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


def _precision(half: Any) -> tuple[Callable[[np.ndarray], np.ndarray], Any]:
    """(the rounding of every result, the cast of each layer's input and weight or None)
    of `half`: a bool (float16 or float32) or a precision object (round, cast)."""
    if isinstance(half, bool):
        return (_half if half else _keep), None
    return half.round, half.cast


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


def load_data(cfg: dict) -> tuple[np.ndarray, np.ndarray]:
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

    def forward(self, ids: np.ndarray, half: Any) -> tuple[np.ndarray, list]:
        """(the logits, each layer's (input, weight) as its product used them).

        `half`: True for float16, False for float32, or a precision (the FP8 modes:
        its ``round`` rounds every result, its ``cast(i, a, w)`` gives the input and
        weight layer `i` multiplies)."""
        r, cast = _precision(half)
        p = [r(q) for q in self.params]
        a = p[0][ids].reshape(len(ids), -1)
        acts = []
        n = len(p) // 2
        for i in range(n):
            w, b = p[1 + 2 * i], p[2 + 2 * i]
            if cast is not None:
                a, w = cast(i, a, w)
            acts.append((a, w))
            z = r(a @ w + b)
            a = z if i == n - 1 else np.maximum(z, 0)
        return a, acts

    def loss_and_grads(
        self, ids: np.ndarray, y: np.ndarray, scale: float, half: Any
    ) -> tuple[float, list[np.ndarray], np.ndarray]:
        """Mean binary cross-entropy (`y`: each row's next tokens), the gradients of
        loss * scale (float16 values if `half`) and the gradient of loss * scale with
        respect to the logits.

        The embedding's gradient is summed in float32 from the float16 gradients
        of its rows, as under torch.autocast (an embedding runs in float32 there)."""
        r = _precision(half)[0]
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

    def accuracy(self, w: np.ndarray, half: Any) -> float:
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


DEFAULT_STEPS = 40  # a `lscore demo` without --full or --tiny


def config(steps: int | None = None, seed: int = 0, tiny: bool = False, full: bool = False) -> dict:
    """The demo's settings.  By default 40 steps per mode: the scale finds its range and the
    float16 modes part, in a few minutes of training on two CPU cores.  `full`: the 120
    steps of the documentation's figure.  `tiny`: a quick check of the whole run (2**25
    logits a step as in the others, 8 steps, the scale starting near its working range and
    doubling after 2 finite steps, so that it grows, overflows once and the float16 modes
    still learn apart within them)."""
    if tiny and full:
        raise ValueError("tiny and full are exclusive: pick one run size")
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
    if not full:
        cfg["steps"] = DEFAULT_STEPS
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
