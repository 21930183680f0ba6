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

``lscore.fp8.block_diagnostics.block_stats`` does the same for a block-scaled
recipe.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from lscore.diagnostics import count_nonfinite, format_table
from lscore.fp8.checks import float_input, format_name, nan_rule

__all__ = [
    "FLUSH_BELOW",
    "SATURATE_FROM",
    "Float8Monitor",
    "Float8Stats",
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


class Fractions:
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
class Float8Stats(Fractions):
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
