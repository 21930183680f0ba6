"""Ratios, the speed targets and the table of `lscore bench`."""

from __future__ import annotations

import math
import os
import platform

import numpy as np

import lscore
from lscore import kernels
from lscore.bench import _scaler
from lscore.bench._gradscaler import CLIP_DTYPES, CLIP_METHODS, GRAD_HARNESS
from lscore.bench._harness import DTYPES, N_SMALL, log_list, size_label

BASELINES = {
    "unscale_and_clip_": {"torch": CLIP_METHODS[1]},
    "all_finite": {
        "numpy": "np.isfinite(a).all()",
        "np.sum": "np.sum(a.view(uint64))",
        "C read": "C read loop",
    },
    "unscale_": {
        "numpy": "a *= inv; np.isfinite(a).all()",
        "torch": "torch foreach",
        "memcpy": "C memcpy",
    },
    f"{N_SMALL} x 64": {"numpy": "numpy loop a *= inv; isfinite", "torch": "torch foreach"},
    _scaler.GROUP: {"torch": _scaler.TORCH_METHOD},  # before "GradScaler", its prefix
    "GradScaler": {"torch": "torch.amp.GradScaler('cpu')"},
    "NaN at": {"numpy": "np.isfinite(a).all()"},
    "unscale_ float32": {"serial": "lscore 1 thread"},
    "ISA levels": {"v3": "v3"},
    "fp8 ": {"torch": "torch eager", "compile": "torch.compile", "floor": "byte floor"},
    "gpu step": {
        "torch fused": "torch fused + GradScaler",
        "torch foreach": "torch foreach + GradScaler",
    },
    "gpu ": {
        "torch": "torch foreach + found_inf.item()",
        "cupy loop": "cupy loop g *= inv; isfinite().all()",
    },
}


def add_ratios(rows: list[dict]) -> None:
    """ratio = baseline time / row time, best against best (above 1: the row is faster),
    within each group: on a shared host a neighbour's load lands on medians, not on the
    best of the repeats."""
    groups: dict[str, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault(r["group"], {})[r["method"]] = r
    for g, members in groups.items():
        base = next((b for prefix, b in BASELINES.items() if g.startswith(prefix)), {})
        for r in members.values():
            if "median_s" not in r or r["method"] == GRAD_HARNESS:
                continue
            ratios = {}
            for label, method in base.items():
                b = members.get(method)
                if b is not None and b is not r and "min_s" in b:
                    ratios[label] = b["min_s"] / r["min_s"]
            if ratios:
                r["ratios"] = ratios


def find(rows, group, method):
    for r in rows:
        if r["group"] == group and r["method"] == method and "median_s" in r:
            return r
    return None


def targets(rows: list[dict], opts) -> list[dict]:
    """The speed targets of the issue, each as (measured, required); ratios of best times."""
    out = []

    def ratio(name, group, method, base, need, *, lower_is_better=False):
        r, b = find(rows, group, method), find(rows, group, base)
        if r is None or b is None:
            out.append({"target": name, "measured": None, "required": need, "met": None})
            return
        x = r["min_s"] / b["min_s"] if lower_is_better else b["min_s"] / r["min_s"]
        out.append(
            {
                "target": name,
                "measured": x,
                "required": need,
                "met": x <= need if lower_is_better else x >= need,
            }
        )

    def seconds(group, method, minus=None):
        """The row's median, less the `minus` row's of the same group; None if missing."""
        r = find(rows, group, method)
        b = find(rows, group, minus) if minus else None
        if r is None or (minus and b is None):
            return None
        return r["median_s"] - (b["median_s"] if b else 0.0)

    def at_most(name, x, limit_s):
        out.append(
            {
                "target": name,
                "measured": x,
                "required": limit_s,
                "met": None if x is None else x <= limit_s,
                "unit": "s",
            }
        )

    def absolute(name, group, method, limit_s, per=1, minus=None):
        x = seconds(group, method, minus)
        at_most(name, None if x is None else x / per, limit_s)

    def per_tensor(name, method, limit_s):
        """(step of N_SMALL tensors - step of 1) / (N_SMALL - 1), harness subtracted."""
        many, one = (
            seconds(f"GradScaler.unscale_ + update, {count} x 64", method, GRAD_HARNESS)
            for count in (N_SMALL, 1)
        )
        at_most(
            name, None if many is None or one is None else (many - one) / (N_SMALL - 1), limit_s
        )

    big = size_label(max(opts.sizes))
    ratio(
        f"all_finite f32 {big} vs np.sum(a.view(uint64)) (speed)",
        f"all_finite float32 {big}",
        "lscore",
        "np.sum(a.view(uint64))",
        0.95,
    )
    ratio(
        "all_finite f16 1e7 vs np.isfinite(a).all()",
        "all_finite float16 1e7",
        "lscore",
        "np.isfinite(a).all()",
        25.0,
    )
    # unscale_ in every regime: each dtype from cache-sized (1e5) to memory-sized (1e8)
    # arrays and the lists; stats=True next to plain; the clipped step against torch's
    lists = [f"{N_SMALL} x 64", log_list(opts)[0]]
    for name in DTYPES:
        groups = [(size_label(n), f"unscale_ {name} {size_label(n)}", "lscore") for n in opts.sizes]
        groups = [x for x in groups if x[0] in ("1e5", "1e6", "1e7", "1e8")]
        groups += [
            (lists[0], f"{lists[0]} {name}", "lscore unscale_"),
            (lists[1], f"unscale_ {name} {lists[1]}", "lscore unscale_"),
        ]
        for label, g, method in groups:
            ratio(f"unscale_ {name} {label} vs torch foreach", g, method, "torch foreach", 1.0)
            if label != lists[0]:
                ratio(
                    f"unscale_ {name} {label}: plain time / stats=True time",
                    g,
                    "lscore stats=True",
                    method,
                    0.9,
                )
        if name in CLIP_DTYPES:
            for label in [size_label(n) for n in opts.sizes if n >= 10**7] + lists[1:]:
                ratio(
                    f"unscale_and_clip_ {name} {label} vs torch unscale_ + clip_grad_norm_",
                    f"unscale_and_clip_ {name} {label}",
                    CLIP_METHODS[0],
                    CLIP_METHODS[1],
                    1.3,
                )
    for sz in ("1e7", "1e8"):
        ratio(
            f"unscale_ f32 {sz} vs numpy",
            f"unscale_ float32 {sz}",
            "lscore",
            "a *= inv; np.isfinite(a).all()",
            3.0,
        )
    for n in opts.contention_sizes:
        ratio(
            f"unscale_ f32 {size_label(n)} other core busy: threaded time / serial time",
            f"unscale_ float32 {size_label(n)}, other core busy",
            "lscore",
            "lscore 1 thread",
            1.10,
            lower_is_better=True,
        )
    for n in opts.isa_sizes:
        for what in ("all_finite", "unscale_"):
            g = f"ISA levels, {what} float32 {size_label(n)}"
            auto = next(
                (r["method"] for r in rows if r["group"] == g and r.get("isa") == "auto"), None
            )
            if auto is not None and find(rows, g, "v3") is not None:
                ratio(
                    f"{what} f32 {size_label(n)}: dispatched time / v3 time",
                    g,
                    auto,
                    "v3",
                    1.3,
                    lower_is_better=True,
                )
    absolute(
        "300 x 64 float32 unscale_: per array",
        f"{N_SMALL} x 64 float32",
        "lscore unscale_",
        30e-9,
        N_SMALL,
    )
    absolute(
        "300 x 64 float32 all_finite: per array",
        f"{N_SMALL} x 64 float32",
        "lscore all_finite",
        30e-9,
        N_SMALL,
    )
    per_tensor(
        "300 x 64 torch tensors: GradScaler.unscale_ + update, fixed cost per tensor "
        "(300-tensor step minus 1-tensor step, .grad assignments taken out, / 299)",
        "lscore.adapters.torch.GradScaler",
        250e-9,
    )
    absolute(
        "300 x 64 torch tensors: GradScaler.unscale_ + update, whole step per tensor "
        "(.grad assignments taken out)",
        f"GradScaler.unscale_ + update, {N_SMALL} x 64",
        "lscore.adapters.torch.GradScaler",
        250e-9,
        N_SMALL,
        minus=GRAD_HARNESS,
    )
    _scaler.targets(ratio)
    absolute(
        f"NaN at index 0 of {big}", f"NaN at index 0 of {big} float32", "lscore all_finite", 5e-6
    )
    absolute(
        "DynamicLossScale.update([1 element])",
        "DynamicLossScale.update([1 element])",
        "lscore",
        1e-6,
    )
    absolute("import lscore beyond numpy", "import lscore (after numpy)", "subprocess", 50e-3)
    return out


def fmt_time(s: float) -> str:
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


# target units given in seconds or microseconds, and the factor to microseconds
_MICROSECONDS = {"s": 1e6, "us_per_array": 1.0, "us_per_call": 1.0}


def _number(x: float) -> str:
    """x with three significant digits and no exponent (0.0312, 5.00, 50,000)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{digits}f}"


def format_table(result: dict) -> str:
    """The rows as a Markdown table, then the targets."""
    lines = [
        "| group | method | median | min-max | GB/s | ratios (baseline time / this time) |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "median_s" not in r:
            lines.append(f"| {r['group']} | {r['method']} | skipped: {r['skipped']} | | | |")
            continue
        per = r.get("per", 1)
        med = fmt_time(r["median_s"]) + (
            f" ({fmt_time(r['median_s'] / per)}/{r.get('per_unit', 'array')})" if per > 1 else ""
        )
        ratios = ", ".join(f"{k} {v:.2f}x" for k, v in r.get("ratios", {}).items())
        gbps = f"{r['gbps']:.1f}" if "gbps" in r else ""
        method = r["method"] + (f" ({r['note']})" if r.get("note") else "")
        lines.append(
            f"| {r['group']} | {method} | {med} | {fmt_time(r['min_s'])}-"
            f"{fmt_time(r['max_s'])} | {gbps} | {ratios} |"
        )
    times = [t for t in result["targets"] if t.get("unit") in _MICROSECONDS]
    others = [t for t in result["targets"] if t.get("unit") not in _MICROSECONDS]
    # one unit per column: times in microseconds, ratios as plain numbers
    for title, unit, group in (("time target", "us", times), ("ratio target", "ratio", others)):
        if not group:
            continue
        lines += [
            "",
            f"| {title} | measured ({unit}) | required ({unit}) | met |",
            "|---|---|---|---|",
        ]
        for t in group:
            to = _MICROSECONDS.get(t.get("unit"), 1.0)
            required = _number(t["required"] * to)
            if t["measured"] is None:
                lines.append(f"| {t['target']} | not measured | {required} | |")
                continue
            lines.append(
                f"| {t['target']} | {_number(t['measured'] * to)} | {required} | "
                f"{'yes' if t['met'] else 'NO'} |"
            )
    return "\n".join(lines)


def machine(torch) -> dict:
    info = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "lscore": lscore.__version__,
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "isa": kernels.isa(),
        "isa_levels": kernels.isa_levels(),
        "lscore_threads": kernels.pool_size(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info
