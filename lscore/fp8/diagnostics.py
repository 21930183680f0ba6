"""FP8 diagnostics: what a scaled float8 cast does to each tensor, step by step.

On request (never in the hot path) :func:`tensor_stats` reads one tensor and the
scale its cast uses and counts what the cast ``fp8(float32(x) * scale)``
produces: the input's amax, the elements clamped to the format's largest value
(saturated), the non-zero elements that become zero (flushed), and the NaN and
Inf elements.  The counts follow the cast's rounding (to nearest, ties to even)
from the float32 product, so they need no float8 array: an element saturates when
``|x * scale|`` rounds above the format's largest finite value (above 464 for
e4m3fn, whose 448 wins the tie at 464; from 61440 for e5m2, whose tie rounds to
Inf), and flushes when it rounds to zero (at most half the smallest subnormal:
2**-10 for e4m3fn, 2**-17 for e5m2).

:class:`Float8Monitor` keeps those statistics per tensor and step, prints them
as a table and draws the amax and scale history (matplotlib, imported when
called), as :class:`lscore.diagnostics.OverflowMonitor` does for float16's
skipped steps::

    monitor = Float8Monitor()
    for step in range(n):
        ...
        if step % 100 == 0:
            monitor.observe(step, {"fc1.input": (x, x_scale), "fc1.weight": (w, w_scale)})
    print(monitor.table())
    monitor.plot("fp8_history.png")

:func:`block_stats` does the same for a block-scaled recipe (MXFP8, MXFP4,
NVFP4): one quantize pass, then what its output holds: the histogram of the
block scales' exponents, the saturated and flushed elements, the NaN scales.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from lscore import kernels
from lscore.diagnostics import count_nonfinite, format_table
from lscore.fp8.blocks import quantize_blocks
from lscore.fp8.checks import float_input, format_name, nan_rule

__all__ = [
    "FLUSH_BELOW",
    "SATURATE_FROM",
    "BlockStats",
    "Float8Monitor",
    "Float8Stats",
    "block_stats",
    "tensor_stats",
]

#: per float8 format, the smallest float32 magnitude of ``x * scale`` that the cast
#: clamps (its round-to-nearest-even result would lie above the largest finite value)
SATURATE_FROM = {
    "e4m3fn": float(np.nextafter(np.float32(464), np.float32(np.inf))),
    "e5m2": 61440.0,
}
#: per float8 format, the largest magnitude of ``x * scale`` that rounds to zero
#: (half the smallest subnormal; the tie rounds to the even code, zero)
FLUSH_BELOW = {"e4m3fn": 2.0**-10, "e5m2": 2.0**-17}

_CHUNK = 1 << 20  # elements per pass: bounds the float32 temporaries on huge tensors


class _Fractions:
    """The saturated and flushed fractions of a statistics record's counts."""

    size: int
    saturated: int
    flushed: int
    nonzero: int

    @property
    def saturated_fraction(self) -> float:
        """Saturated elements over all elements (0 for an empty tensor)."""
        return self.saturated / self.size if self.size else 0.0

    @property
    def flushed_fraction(self) -> float:
        """Flushed elements over the non-zero finite ones (0 when there are none)."""
        return self.flushed / self.nonzero if self.nonzero else 0.0


@dataclasses.dataclass(frozen=True)
class Float8Stats(_Fractions):
    """What the cast of one tensor at one step produces.

    ``amax`` is the input's largest magnitude (NaN elements left out, or NaN when
    any is and ``amax_nan="propagate"``); ``saturated`` counts the finite elements
    the cast clamps to the format's largest value (an overflow to Inf in a
    non-saturating e5m2 cast), ``flushed`` the non-zero finite elements that
    become zero, ``nonzero`` the non-zero finite elements, ``nan``, ``posinf`` and
    ``neginf`` the input's non-finite elements.
    """

    name: str
    step: int
    fmt: str
    amax: float
    scale: float
    size: int
    saturated: int
    flushed: int
    nonzero: int
    nan: int
    posinf: int
    neginf: int


def _format(fmt: Any) -> str:
    """The short name ("e4m3fn" / "e5m2") of a format name or float8 dtype."""
    return format_name(fmt).removeprefix("float8_")


def _scale(scale: Any) -> np.float32:
    s = np.asarray(scale)
    if s.ndim or s.dtype.kind not in "iuf":
        raise ValueError(f"scale must be one number per tensor, got {scale!r}")
    with np.errstate(over="ignore"):  # a scale beyond float32's range: refused below
        f = np.float32(s)
    if not (np.isfinite(f) and f > 0):
        raise ValueError(f"scale must be a positive finite float32, got {scale!r}")
    return f


def tensor_stats(
    x: Any,
    scale: Any,
    fmt: str = "e4m3fn",
    *,
    name: str = "",
    step: int = 0,
    amax_nan: str = "ignore",
) -> Float8Stats:
    """The statistics of casting `x` (a float32, float16 or bfloat16 NumPy array, as
    ``quantize`` takes it) to
    `fmt` with `scale` (one positive finite number): see :class:`Float8Stats`.

    `amax_nan` is the recipe's rule for NaN elements in the amax: "ignore"
    (TransformerEngine) or "propagate" (torch.max, torchao).  One pass over `x`
    in blocks; nothing is written to it.
    """
    form = _format(fmt)
    s = _scale(scale)
    nan_rule(amax_nan, "amax_nan")
    a = float_input(x)
    nan, posinf, neginf = count_nonfinite(a)
    flat = a.reshape(-1)
    top = np.float32(0)
    saturated = flushed = nonzero = 0
    sat_from = np.float32(SATURATE_FROM[form])
    flush_below = np.float32(FLUSH_BELOW[form])
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(0, flat.size, _CHUNK):
            v = np.abs(flat[i : i + _CHUNK].astype(np.float32))
            finite = np.isfinite(v)
            if v.size:
                top = max(top, np.max(v, where=~np.isnan(v), initial=np.float32(0)))
            y = v * s  # the cast's float32 product (the sign does not change a count)
            saturated += int(np.count_nonzero(finite & (y >= sat_from)))
            live = finite & (v != 0)
            nonzero += int(np.count_nonzero(live))
            flushed += int(np.count_nonzero(live & (y <= flush_below)))
    amax = math.nan if nan and amax_nan == "propagate" else float(top)
    return Float8Stats(
        name, int(step), form, amax, float(s), int(a.size), saturated, flushed, nonzero, nan,
        posinf, neginf,
    )  # fmt: skip


class Float8Monitor:
    """Float8 statistics per tensor and step, their table and their history's figure.

    Parameters
    ----------
    fmt : str
        The format of a tensor given without one: "e4m3fn" (default) or "e5m2".
    amax_nan : str
        The recipe's rule for NaN in the amax: "ignore" (default) or "propagate".

    ``records`` is every :class:`Float8Stats` observed, in order.
    """

    def __init__(self, fmt: str = "e4m3fn", *, amax_nan: str = "ignore") -> None:
        self.fmt = _format(fmt)
        nan_rule(amax_nan, "amax_nan")
        self.amax_nan = amax_nan
        self.records: list[Float8Stats] = []

    def observe(self, step: int, tensors: Mapping[str, Any]) -> list[Float8Stats]:
        """Read each tensor of `tensors` (name -> ``(array, scale)`` or ``(array, scale,
        fmt)``) at `step`; returns their statistics, also kept in ``records``."""
        if not isinstance(tensors, Mapping):
            raise ValueError(
                f"tensors must map names to (array, scale[, fmt]), got {type(tensors).__name__}"
            )
        out = []
        for name, entry in tensors.items():
            if not isinstance(entry, tuple) or len(entry) not in (2, 3):
                raise ValueError(f"tensors[{name!r}] must be (array, scale[, fmt]), got {entry!r}")
            fmt = entry[2] if len(entry) == 3 else self.fmt
            out.append(
                tensor_stats(
                    entry[0], entry[1], fmt, name=str(name), step=step, amax_nan=self.amax_nan
                )
            )
        self.records += out
        return out

    def history(self, name: str) -> dict[str, np.ndarray]:
        """One tensor's statistics over the steps observed: arrays ``step``, ``amax``,
        ``scale``, ``saturated_fraction`` and ``flushed_fraction``."""
        rows = [r for r in self.records if r.name == name]
        if not rows:
            raise ValueError(
                f"name must be a tensor observed ({', '.join(self.names)}), got {name!r}"
            )
        return {
            "step": np.array([r.step for r in rows], np.int64),
            "amax": np.array([r.amax for r in rows]),
            "scale": np.array([r.scale for r in rows]),
            "saturated_fraction": np.array([r.saturated_fraction for r in rows]),
            "flushed_fraction": np.array([r.flushed_fraction for r in rows]),
        }

    @property
    def names(self) -> list[str]:
        """The tensors observed, in the order first seen."""
        return list(dict.fromkeys(r.name for r in self.records))

    def table(self, step: int | None = None) -> str:
        """The statistics of `step` (default: the last one observed), a row per tensor."""
        if step is None and self.records:
            step = self.records[-1].step
        rows = [r for r in self.records if r.step == step]
        head = ("tensor", "format", "amax", "scale", "saturated", "flushed", "NaN", "Inf")
        return format_table(
            head,
            (
                (
                    r.name,
                    r.fmt,
                    f"{r.amax:.4g}",
                    f"{r.scale:.4g}",
                    f"{100 * r.saturated_fraction:.2f}%",
                    f"{100 * r.flushed_fraction:.2f}%",
                    str(r.nan),
                    str(r.posinf + r.neginf),
                )
                for r in rows
            ),
        )

    def plot(self, path: str | None = None) -> Any:
        """A figure of each tensor's amax and scale over the steps (matplotlib, the demo
        extra); saved to `path` when given.  Returns the matplotlib Figure."""
        import matplotlib

        if path is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
        for name in self.names:
            h = self.history(name)
            top.plot(h["step"], h["amax"], lw=1.4, label=name)
            bottom.plot(h["step"], h["scale"], lw=1.4, label=name)
        top.set(ylabel="amax", title="Input amax per tensor", yscale="log")
        bottom.set(xlabel="step", ylabel="scale", title="Scale per tensor")
        bottom.set_yscale("log", base=2)
        top.legend(fontsize=8, loc="best")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=100)
            plt.close(fig)
        return fig


# ---- block-scaled formats ----------------------------------------------------------------------

# element format -> (code of the largest magnitude, mask of a code's magnitude, smallest
# |x / scale| that rounds above the largest value: e4m3fn's 448 wins the tie at 464, e5m2's
# tie at 61440 rounds to Inf, E2M1's 6 loses the tie at 7 to the even 8)
_BLOCK_ELEMENTS = {
    "e4m3fn": (0x7E, 0x7F, SATURATE_FROM["e4m3fn"]),
    "e5m2": (0x7B, 0x7F, SATURATE_FROM["e5m2"]),
    "e2m1": (0x7, 0x7, 7.0),
}


@dataclasses.dataclass(frozen=True)
class BlockStats(_Fractions):
    """What a block-scaled quantize of one tensor produces.

    ``recipe`` names the recipe, ``element`` its element format ("e4m3fn", "e5m2",
    "e2m1"), ``scale_format`` its block scales' ("e8m0", or "e4m3fn" for NVFP4),
    ``block`` the elements per block and ``axis`` the axis the blocks run along.
    ``size`` is the input's number of elements, ``nan``, ``posinf`` and ``neginf`` its
    non-finite ones.  ``blocks`` is the number of blocks; ``exponents`` maps each block
    scale's exponent (the unbiased E8M0 exponent; for NVFP4 the exponent of the E4M3
    scale, floor(log2(scale))) to the number of blocks that have it, NaN scales left out
    and counted in ``nan_scales``; ``tensor_scale`` is NVFP4's float32 per-tensor scale
    (None without one), by which each block's E4M3 scale is multiplied.  ``saturated``
    counts the finite elements clamped to the element format's largest value (written as
    that value, and ``|x| / scale`` rounds above it), ``flushed`` the non-zero finite
    elements written as zero, ``nonzero`` the non-zero finite elements, all three in
    blocks with a finite scale (a NaN scale loses its whole block).
    """

    recipe: str
    element: str
    scale_format: str
    block: int
    axis: int
    size: int
    nan: int
    posinf: int
    neginf: int
    blocks: int
    exponents: dict[int, int]
    nan_scales: int
    tensor_scale: float | None
    saturated: int
    flushed: int
    nonzero: int

    def table(self) -> str:
        """A summary line, then the histogram of the scale exponents, a row per exponent."""
        pts = "" if self.tensor_scale is None else f", tensor scale {self.tensor_scale:.4g}"
        head = (
            f"{self.recipe}: {self.blocks} blocks of {self.block} {self.element}, "
            f"{self.scale_format} scales{pts}\n"
            f"saturated {100 * self.saturated_fraction:.2f}% ({self.saturated}), "
            f"flushed {100 * self.flushed_fraction:.2f}% ({self.flushed}), "
            f"NaN {self.nan}, Inf {self.posinf + self.neginf}, NaN scales {self.nan_scales}"
        )
        share = self.blocks or 1
        rows = (
            (str(e), str(n), f"{100 * n / share:.2f}%") for e, n in sorted(self.exponents.items())
        )
        return head + "\n" + format_table(("exponent", "blocks", "share"), rows)


def _scale_values(codes: np.ndarray, scale_format: str) -> np.ndarray:
    """The float32 value of each block scale code (NaN for a NaN code)."""
    if scale_format == "e8m0":
        return np.asarray(kernels.e8m0_decode(codes), np.float32)
    out = np.empty(codes.shape, np.float32)
    kernels.fp8_decode(codes, out, "float8_e4m3fn")
    return out


def block_stats(x: Any, recipe: Any, *, axis: int = -1, element: str | None = None) -> BlockStats:
    """The statistics of quantizing `x` (a float32, float16 or bfloat16 NumPy array) with
    the block recipe `recipe` (a ``BlockRecipe`` or a preset name), blocks along `axis` (-1,
    or 0 for a 2-D `x`), to `element` (default the recipe's): see :class:`BlockStats`.

    One ``quantize_blocks`` pass; the counts are read from its output (the scale codes and
    the element codes) beside the input, in chunks of whole blocks.  What the recipe refuses
    (a partial block, an element it does not allow) is refused here.
    """
    a = float_input(x)  # a NumPy array: the counts read it beside the codes
    b = quantize_blocks(a, recipe, axis=axis, element=element)
    r = b.recipe
    scales = b.scales.view(np.uint8)
    q = b.data.view(np.uint8)
    if b.axis == 0:  # blocks along the first axis: along the last of the transposes
        a, scales, q = a.T, scales.T, q.T
    top_code, mag, sat_from = _BLOCK_ELEMENTS[b.element]
    values = _scale_values(np.ascontiguousarray(scales), r.scale_format).astype(np.float64)
    nan_blocks = np.isnan(values)
    exps = np.frexp(values[~nan_blocks & (values != 0)])[1] - 1
    found = np.unique(exps, return_counts=True) if exps.size else ((), ())
    if b.tensor_scale is not None:
        values = values * np.float64(b.tensor_scale)  # exact: 4-bit by 24-bit significands
    n = a.shape[-1] if a.ndim else 0
    a2 = a.reshape(-1, n) if n else a.reshape(0, 0)
    q2, s2 = q.reshape(a2.shape[0], -1), values.reshape(a2.shape[0], -1)
    cols = max(_CHUNK // r.block, 1) * r.block
    rows = max(_CHUNK // max(min(n, cols), 1), 1)
    saturated = flushed = nonzero = 0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for i in range(0, a2.shape[0], rows):
            for c in range(0, n, cols):
                v = np.abs(a2[i : i + rows, c : c + cols].astype(np.float64))
                w = v.shape[1]
                if b.element == "e2m1":  # two codes a byte, the first in the low nibble
                    byte = q2[i : i + rows, c // 2 : (c + w + 1) // 2]
                    codes = np.stack([byte & 0xF, byte >> 4], axis=-1).reshape(len(v), -1)
                else:
                    codes = q2[i : i + rows, c : c + w]
                codes = codes[:, :w] & mag
                blk = s2[i : i + rows, c // r.block : -(-(c + w) // r.block)]
                sc = np.repeat(blk, r.block, axis=1)[:, :w]
                ok = np.isfinite(v) & ~np.isnan(sc)
                saturated += int(np.count_nonzero(ok & (codes == top_code) & (v / sc >= sat_from)))
                live = ok & (v != 0)
                nonzero += int(np.count_nonzero(live))
                flushed += int(np.count_nonzero(live & (codes == 0)))
    nan, posinf, neginf = count_nonfinite(a)
    pts = b.tensor_scale
    return BlockStats(
        r.name, b.element, r.scale_format, r.block, b.axis, int(a.size), nan, posinf, neginf,
        int(scales.size), {int(e): int(k) for e, k in zip(*found, strict=True)},
        int(np.count_nonzero(nan_blocks)), None if pts is None else float(pts), saturated,
        flushed, nonzero,
    )  # fmt: skip
