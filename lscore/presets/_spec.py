"""The parts of a preset row: the Spec record and the validators of peers' arguments."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from lscore.policy import fraction, growth_interval, integer, positive_scale, real

REQUIRED = type("Required", (), {"__repr__": lambda self: "<required>"})()


@dataclasses.dataclass(frozen=True)
class Spec:
    peer: str  # the class (or function) the preset imitates
    args: dict  # peer argument -> peer default (REQUIRED: none)
    checks: dict  # peer argument -> validator(name, value) -> value
    rename: dict  # peer argument -> Policy field, taken as is
    fixed: dict  # Policy fields the peer does not let users choose
    derive: Callable | None  # (checked args) -> more Policy fields
    doc: str
    counters: Callable | None = None  # (checked args) -> initial counters
    invert: Callable | None = None  # (Policy) -> peer arguments not in `rename`


def f32(name: Any, v: Any) -> Any:
    return positive_scale(name, v)


def f64(name: Any, v: Any) -> Any:
    return positive_scale(name, v, precision="float64")


def interval(name: Any, v: Any) -> Any:
    """A growth interval under the peer's name (``lscore.policy.growth_interval``)."""
    return growth_interval(name, v)


def int_ge1(name: Any, v: Any) -> Any:
    return integer(name, v, minimum=1)


def int_ge0(name: Any, v: Any) -> Any:
    return integer(name, v, minimum=0)


def open_fraction(name: Any, v: Any) -> Any:
    return fraction(name, v, closed=False)


def non_negative(name: Any, v: Any) -> Any:
    x = real(name, v)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    return x


def optional(check: Any) -> Any:
    def run(name: Any, v: Any) -> Any:
        return None if v is None else check(name, v)

    return run


def optional_truthy(check: Any) -> Any:
    """ColossalAI and apex test min/max scales for truthiness: None and 0 disable them."""

    def run(name: Any, v: Any) -> Any:
        return None if v is None or v == 0 else check(name, v)

    return run


def cap(name: Any, v: Any) -> Any:
    """A maximum scale: > 0, +inf allowed (no cap)."""
    x = real(name, v)
    if math.isnan(x) or x <= 0:
        raise ValueError(f"{name} must be > 0, got {v!r}")
    return x


def string(name: Any, v: Any) -> Any:
    if not isinstance(v, str):
        raise TypeError(f"{name} must be a string, got {v!r}")
    return v


def zero_or_scale(name: Any, v: Any) -> Any:
    """DeepSpeed's fp16.loss_scale: 0 (dynamic scaling) or a static scale, finite and > 0."""
    if isinstance(v, bool):  # DeepSpeedFP16Config refuses a bool here too
        raise TypeError(f"{name} must be a real number, got {v!r} (bool)")
    x = real(name, v)
    if x == 0:
        return 0.0
    if not math.isfinite(x) or x < 0:
        raise ValueError(
            f"{name} must be 0 (dynamic scaling) or a finite number > 0 (a static scale), got {v!r}"
        )
    return x


def dynamic_or_number(name: Any, v: Any) -> Any:
    if isinstance(v, str):
        if v != "dynamic":
            raise ValueError(f"{name} must be 'dynamic' or a number, got {v!r}")
        return v
    return f64(name, v)
