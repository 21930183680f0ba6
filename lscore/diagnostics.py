"""Overflow diagnostics: which tensors held NaN/Inf on a skipped step, rate-limited logging.

Opt-in and framework-neutral.  An adapter (or your own loop) calls
``OverflowMonitor.observe`` once per step with whether the step was applied
and the scale before and after; only on a *skipped* step does the monitor
look at the gradients, through named NumPy views or a callable that produces
them, so a finite step costs one Python call and no pass over the data.

Logging goes to the stdlib logger ``"lscore"``, one summary line per burst
of skipped steps (never one per overflow) and at most one line per
``min_interval`` steps, for example::

    first 12 steps skipped while the scale fell from 65536 to 16
    3 steps skipped in steps 2000-2950 while the scale fell from 65536 to 32768; last overflow: layer1.weight (2 NaN, 1 +Inf)

Example::

    monitor = OverflowMonitor()
    for step in range(n):
        before = ls()
        _, applied = ls.update(grads)
        monitor.observe(step, applied, before, ls(), lambda: {"w": gw, "b": gb})
"""  # noqa: E501 - the example log line is shown whole

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from lscore._nonfinite import count_nonfinite, named_arrays
from lscore.policy import json_float, real, unjson_float

__all__ = [
    "OverflowMonitor",
    "OverflowReport",
    "TensorReport",
    "count_nonfinite",
    "format_table",
    "named_arrays",
]


def format_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A plain-text table: the header, a rule, then the rows; the first column aligned
    left, the others right, each as wide as its widest cell."""
    rows = [tuple(r) for r in rows]
    widths = [max(len(r[i]) for r in [*rows, tuple(head)]) for i in range(len(head))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    return "\n".join([line(head), "  ".join("-" * w for w in widths), *map(line, rows)])


@dataclasses.dataclass(frozen=True)
class TensorReport:
    """One tensor that held non-finite values on a skipped step."""

    name: str
    nan: int
    posinf: int
    neginf: int
    size: int

    def __str__(self) -> str:
        parts = [
            f"{n} {label}"
            for n, label in ((self.nan, "NaN"), (self.posinf, "+Inf"), (self.neginf, "-Inf"))
            if n
        ]
        return f"{self.name} ({', '.join(parts)} of {self.size})"


@dataclasses.dataclass(frozen=True)
class OverflowReport:
    """What one skipped step saw: the step, the scales, the offending tensors."""

    step: int
    scale_before: float
    scale_after: float
    tensors: tuple

    def to_dict(self) -> dict:
        """JSON-safe: the scales as ``json_float`` writes them, each tensor a dict."""
        return {
            "step": self.step,
            "scale_before": json_float(self.scale_before),
            "scale_after": json_float(self.scale_after),
            "tensors": [dataclasses.asdict(t) for t in self.tensors],
        }

    @classmethod
    def from_dict(cls, d: Any) -> OverflowReport:
        """The inverse of `to_dict`; a ValueError naming what is missing or wrong."""
        keys = {"step", "scale_before", "scale_after", "tensors"}
        if not isinstance(d, dict) or set(d) != keys:
            raise ValueError(f"last_report must be None or a dict with the keys {sorted(keys)}")
        counts = {"nan", "posinf", "neginf", "size"}
        tensors = d["tensors"]
        if not isinstance(tensors, list) or not all(
            isinstance(t, dict)
            and set(t) == counts | {"name"}
            and isinstance(t["name"], str)
            and all(_count(t[k]) for k in counts)
            for t in tensors
        ):
            raise ValueError(
                "last_report['tensors'] must be a list of dicts with the keys "
                f"{sorted(counts | {'name'})} (counts are ints >= 0), got {tensors!r}"
            )
        if not _count(d["step"]):
            raise ValueError(f"last_report['step'] must be an int >= 0, got {d['step']!r}")
        return cls(
            d["step"],
            real("last_report['scale_before']", unjson_float(d["scale_before"])),
            real("last_report['scale_after']", unjson_float(d["scale_after"])),
            tuple(TensorReport(**t) for t in tensors),
        )

    def __str__(self) -> str:
        where = ", ".join(map(str, self.tensors)) if self.tensors else "no named tensor"
        return (
            f"step {self.step} skipped (scale {_fmt(self.scale_before)} -> "
            f"{_fmt(self.scale_after)}): {where}"
        )


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _fmt(x: float) -> str:
    return f"{x:.8g}"


class OverflowMonitor:
    """Counts skipped steps, names the tensors that overflowed, logs a summary line per burst.

    Parameters
    ----------
    report : bool
        Build an :class:`OverflowReport` on every skipped step (a second pass
        over that step's gradients; finite steps never pay for it).
    logger : str or logging.Logger
        Where the summary lines go (default: the ``"lscore"`` logger).
    level : int
        Their logging level (default WARNING).
    min_interval : int
        At most one line per this many steps; bursts in between are merged
        into the next line.
    max_tensors : int
        How many tensors a line names (the report keeps all of them).

    names : iterable of (str, object), optional
        Names of the objects an adapter hands over (``model.named_parameters()``);
        kept by identity, see :meth:`name_of`.

    Counters: ``total_skipped``, ``consecutive_skipped``, ``last_skipped_step``
    (None before the first), ``last_report``.  Methods are thread-safe.
    """

    def __init__(
        self,
        *,
        report: bool = True,
        logger: Any = "lscore",
        level: int = logging.WARNING,
        min_interval: int = 1000,
        max_tensors: int = 5,
        names: Any = None,
    ) -> None:
        if isinstance(min_interval, bool) or not isinstance(min_interval, int) or min_interval < 0:
            raise ValueError(f"min_interval must be an int >= 0, got {min_interval!r}")
        if isinstance(max_tensors, bool) or not isinstance(max_tensors, int) or max_tensors < 0:
            raise ValueError(f"max_tensors must be an int >= 0, got {max_tensors!r}")
        self.report = bool(report)
        self.logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self.level = level
        self.min_interval = min_interval
        self.max_tensors = max_tensors
        # parameter object -> name (by identity), for adapters that see only the objects
        self._names = {id(obj): str(name) for name, obj in (names or ())}
        self._lock = threading.Lock()
        self.total_skipped = 0
        self.consecutive_skipped = 0
        self.last_skipped_step: int | None = None
        self.last_report: OverflowReport | None = None
        self._first_step: int | None = None
        self._pending: dict | None = None  # the burst(s) not logged yet
        self._last_logged: int | None = None

    def observe(
        self, step: int, applied: bool, scale_before: float, scale_after: float, arrays: Any = None
    ) -> OverflowReport | None:
        """Record one step; on a skipped step, report which arrays held NaN/Inf.

        `arrays` is anything :func:`named_arrays` takes, or a callable
        returning it; it is called and read only when the step was skipped.
        Returns the report of a skipped step (None otherwise, or with
        ``report=False``).
        """
        rep = None
        if not applied and self.report:
            rep = self._build_report(step, scale_before, scale_after, arrays)
        with self._lock:
            if self._first_step is None:
                self._first_step = step
            if applied:
                self.consecutive_skipped = 0
                line = self._flush_if_due(step)
            else:
                self.total_skipped += 1
                self.consecutive_skipped += 1
                self.last_skipped_step = step
                if rep is not None:
                    self.last_report = rep
                p = self._pending
                if p is None:
                    p = self._pending = {
                        "first": step,
                        "count": 0,
                        "from": scale_before,
                        "starts_run": step == self._first_step,
                    }
                p["count"] += 1
                p["last"], p["to"], p["report"] = step, scale_after, rep
                line = None
                # a burst that never ends (divergence) still reports, at the interval
                if step - p["first"] >= self.min_interval and self._due(step):
                    line = self._take_line()
                    self._last_logged = step
        if line:
            self.logger.log(self.level, line)
        return rep

    def name_of(self, obj: Any, default: str) -> str:
        """The name given for `obj` in ``names=`` (``model.named_parameters()``), else `default`."""
        return self._names.get(id(obj), default)

    def flush(self) -> None:
        """Log what is pending now (at the end of training, for instance)."""
        with self._lock:
            line = self._take_line()
        if line:
            self.logger.log(self.level, line)

    def state_dict(self) -> dict:
        """The monitor's own counts (``total_skipped``, ``consecutive_skipped``,
        ``last_skipped_step``) and ``last_report`` (``OverflowReport.to_dict()``, or
        None), JSON-safe; the step numbers it is given come from the adapter, whose state
        dict carries them."""
        with self._lock:
            rep = self.last_report
            return {
                "total_skipped": self.total_skipped,
                "consecutive_skipped": self.consecutive_skipped,
                "last_skipped_step": self.last_skipped_step,
                "last_report": None if rep is None else rep.to_dict(),
            }

    def load_state_dict(self, d: dict) -> None:
        """Take a ``state_dict()``; checked before anything changes.  A state saved
        before ``last_report`` was kept (without the key) leaves it None."""
        keys = {"total_skipped", "consecutive_skipped", "last_skipped_step"}
        if not isinstance(d, dict) or not keys <= set(d) <= keys | {"last_report"}:
            raise ValueError(
                f"an OverflowMonitor state has the keys {sorted(keys | {'last_report'})}, got {d!r}"
            )
        for k in keys:
            v = d[k]
            if k == "last_skipped_step" and v is None:
                continue
            if not _count(v):
                raise ValueError(f"{k} must be an int >= 0, got {v!r}")
        saved = d.get("last_report")
        rep = None if saved is None else OverflowReport.from_dict(saved)
        with self._lock:
            self.total_skipped = d["total_skipped"]
            self.consecutive_skipped = d["consecutive_skipped"]
            self.last_skipped_step = d["last_skipped_step"]
            self.last_report = rep

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        del d["_lock"]
        d["logger"] = self.logger.name  # loggers are looked up again by name
        return d

    def __setstate__(self, d: Any) -> None:
        self.__dict__.update(d)
        self.logger = logging.getLogger(d["logger"])
        self._lock = threading.Lock()

    # ---- internals ------------------------------------------------------------

    def _build_report(self, step: Any, before: Any, after: Any, arrays: Any) -> OverflowReport:
        if callable(arrays):
            arrays = arrays()
        bad = []
        for name, a in named_arrays(arrays):
            # (raw words, format name): a tensor NumPy has no dtype for (bfloat16 in torch)
            a, fmt = a if isinstance(a, tuple) else (a, None)
            nan, pos, neg = count_nonfinite(a, fmt)
            if nan or pos or neg:
                bad.append(TensorReport(name, nan, pos, neg, int(np.size(a))))
        return OverflowReport(step, float(before), float(after), tuple(bad))

    def _due(self, step: int) -> bool:
        return self._last_logged is None or step - self._last_logged >= self.min_interval

    def _flush_if_due(self, step: int) -> str | None:
        if self._pending is None or not self._due(step):
            return None
        self._last_logged = step
        return self._take_line()

    def _take_line(self) -> str | None:
        p, self._pending = self._pending, None
        if p is None:
            return None
        n = p["count"]
        steps = "step" if n == 1 else "steps"
        fell = (
            f"the scale fell from {_fmt(p['from'])} to {_fmt(p['to'])}"
            if p["to"] < p["from"]
            else f"the scale stayed at {_fmt(p['to'])}"
            if p["to"] == p["from"]
            else f"the scale went from {_fmt(p['from'])} to {_fmt(p['to'])}"
        )
        if p["starts_run"] and p["last"] - p["first"] + 1 == n:
            head = f"first {n} {steps} skipped while {fell}"
        elif n == 1:
            head = f"step {p['first']} skipped; {fell}"
        else:
            head = f"{n} {steps} skipped in steps {p['first']}-{p['last']} while {fell}"
        rep = p["report"]
        if rep is not None and rep.tensors and self.max_tensors:
            shown = ", ".join(map(str, rep.tensors[: self.max_tensors]))
            more = len(rep.tensors) - self.max_tensors
            head += f"; last overflow: {shown}" + (f" and {more} more" if more > 0 else "")
        return head

    def __repr__(self) -> str:
        return (
            f"OverflowMonitor(total_skipped={self.total_skipped}, consecutive_skipped="
            f"{self.consecutive_skipped}, last_skipped_step={self.last_skipped_step})"
        )
