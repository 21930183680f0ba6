"""Parameters of the loss-scale state machine, and the public home of every range check.

All configuration validation goes through here: the classes that imitate TF, Keras or
torch translate their own argument names and call the range checks (defined in
``lscore._checks``, re-exported here), then build a ``Policy``; the compiled core
trusts a ``Policy`` and checks nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

# the checks' bounds (float32's largest finite value and overflow threshold, int64's largest)
from lscore._checks import F32_MAX as F32_MAX
from lscore._checks import F32_OVERFLOW as F32_OVERFLOW
from lscore._checks import I64_MAX as I64_MAX
from lscore._checks import (
    boolean,
    choice,
    factor_above_one,
    factor_at_least_one,
    fixed_scale,
    fraction,
    growth_interval,
    integer,
    overflows_f32,
    positive_scale,
    real,
    scale_bounds,
    scale_value,
)
from lscore._ext import _codes

__all__ = [
    "JSON_NONFINITE",
    "Policy",
    "boolean",
    "choice",
    "factor_above_one",
    "factor_at_least_one",
    "fixed_scale",
    "fraction",
    "growth_interval",
    "integer",
    "inverse_scale",
    "json_float",
    "overflows_f32",
    "positive_scale",
    "real",
    "scale_bounds",
    "scale_value",
    "unjson_float",
    "unjson_number",
]

# the names of the state machine's enum fields and flag bits; their numbers
# come from _ext/lsc_codes.h through _codes
PRECISIONS = tuple(_codes.PRECISION)
GROWTH_MODES = tuple(_codes.GROWTH_MODE)
BACKOFF_MODES = tuple(_codes.BACKOFF_MODE)
MIN_ACTIONS = tuple(_codes.MIN_ACTION)
REFILLS = ("finite", "growth", "backoff")
_FLAG = _codes.FLAGS


#: the strings that stand for the non-finite floats in lscore's JSON (JSON has no literal)
JSON_NONFINITE = ("inf", "-inf", "nan")


def json_float(x: float) -> float | str:
    """`x` for JSON: non-finite values as the strings "inf", "-inf", "nan"."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def unjson_float(x: Any) -> Any:
    """The inverse of `json_float`: one of the strings "inf", "-inf", "nan" as its float;
    any other value unchanged (the caller validates it)."""
    return float(x) if isinstance(x, str) and x in JSON_NONFINITE else x


def unjson_number(name: str, x: Any, *, wrong_type: type[Exception] = TypeError) -> float:
    """`x` read back from JSON as a float: a number, or one of the strings `json_float` writes.
    Any other string is a ValueError, any other value (a bool too) a `wrong_type` error."""
    x = unjson_float(x)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        if isinstance(x, str) or wrong_type is ValueError:
            named = ", ".join(map(repr, JSON_NONFINITE))
            raise ValueError(f"{name} must be a number or one of {named}, got {x!r}")
        raise wrong_type(f"{name} must be a number, got {x!r}")
    return float(x)


@dataclasses.dataclass(frozen=True)
class Policy:
    """Every parameter of the core state machine (the compiled core's ``lsc_state``).

    Names follow torch's GradScaler; the TF, Keras and peer-specific names are
    mapped onto these by the classes that imitate those APIs.
    """

    name: str = "custom"
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    hysteresis: int = 1
    min_scale: float | None = None
    max_scale: float | None = None
    precision: str = "float32_float64"
    growth_mode: str = "eq"
    growth_offset: int = 0
    backoff_mode: str = "multiply"
    min_action: str = "clamp"
    guard_finite: bool = True
    refill: tuple = ("backoff",)
    hysteresis_saturate: bool = False
    apply_nonfinite: bool = False
    flush_subnormal: bool = False
    apply_next: bool = False
    tolerance: float = 0.0
    floor_scale: float | None = None
    growth_factor_after_overflow: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty string, got {self.name!r}")
        choice("precision", self.precision, PRECISIONS)
        choice("growth_mode", self.growth_mode, GROWTH_MODES)
        choice("backoff_mode", self.backoff_mode, BACKOFF_MODES)
        choice("min_action", self.min_action, MIN_ACTIONS)
        refill = tuple(self.refill)
        for r in refill:
            choice("refill", r, REFILLS)
        object.__setattr__(self, "refill", tuple(sorted(set(refill), key=REFILLS.index)))
        object.__setattr__(
            self,
            "init_scale",
            positive_scale("init_scale", self.init_scale, precision=self.precision),
        )
        object.__setattr__(
            self, "growth_factor", factor_at_least_one("growth_factor", self.growth_factor)
        )
        object.__setattr__(self, "backoff_factor", fraction("backoff_factor", self.backoff_factor))
        object.__setattr__(
            self, "growth_interval", growth_interval("growth_interval", self.growth_interval)
        )
        object.__setattr__(
            self, "growth_offset", integer("growth_offset", self.growth_offset, minimum=0)
        )
        object.__setattr__(self, "hysteresis", integer("hysteresis", self.hysteresis, minimum=1))
        for key in ("min_scale", "max_scale"):
            v = getattr(self, key)
            if v is not None:
                v = real(key, v)
                if math.isnan(v) or v < 0 or (key == "min_scale" and math.isinf(v)):
                    raise ValueError(f"{key} must be a finite number >= 0 or None, got {v!r}")
                object.__setattr__(self, key, v)
        if (
            self.min_scale is not None
            and self.max_scale is not None
            and self.min_scale > self.max_scale
        ):
            raise ValueError(
                f"min_scale must be <= max_scale, got {self.min_scale!r} > {self.max_scale!r}"
            )
        tol = real("tolerance", self.tolerance)
        if not math.isfinite(tol) or tol < 0:
            raise ValueError(f"tolerance must be finite and >= 0, got {self.tolerance!r}")
        object.__setattr__(self, "tolerance", tol)
        if self.floor_scale is not None:
            v = real("floor_scale", self.floor_scale)
            if not math.isfinite(v) or v < 0:
                raise ValueError(
                    f"floor_scale must be a finite number >= 0 or None, got {self.floor_scale!r}"
                )
            object.__setattr__(self, "floor_scale", v)
        if self.min_action != "clamp" and self.min_scale is None and self.floor_scale is None:
            raise ValueError(f"min_action {self.min_action!r} needs a floor_scale or a min_scale")
        if self.growth_factor_after_overflow is not None:
            object.__setattr__(
                self,
                "growth_factor_after_overflow",
                factor_at_least_one(
                    "growth_factor_after_overflow", self.growth_factor_after_overflow
                ),
            )
        for key in (
            "guard_finite",
            "hysteresis_saturate",
            "apply_nonfinite",
            "flush_subnormal",
            "apply_next",
        ):
            object.__setattr__(self, key, boolean(key, getattr(self, key)))

    def replace(self, **changes: Any) -> Policy:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Every field, JSON-safe (an infinite max_scale is written as "inf")."""
        d = dataclasses.asdict(self)
        d["refill"] = list(self.refill)
        if d["max_scale"] is not None:
            d["max_scale"] = json_float(d["max_scale"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Policy:
        if not isinstance(d, dict):
            raise TypeError(f"policy must be a dict, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown policy keys: {', '.join(map(repr, unknown))}")
        d = dict(d)
        if "refill" in d:
            if not isinstance(d["refill"], (list, tuple)):
                raise TypeError(f"refill must be a list, got {d['refill']!r}")
            d["refill"] = tuple(d["refill"])
        if "max_scale" in d:
            d["max_scale"] = unjson_float(d["max_scale"])
        return cls(**d)

    def c_params(self) -> dict:
        """The parameter block of lsc_state (see _ext/lsc_state.h)."""
        flags = 0
        if self.guard_finite:
            flags |= _FLAG["GUARD_FINITE"]
        if self.min_scale is not None:
            flags |= _FLAG["HAS_MIN"]
        if self.max_scale is not None:
            flags |= _FLAG["HAS_MAX"]
        for r in self.refill:
            flags |= _FLAG["REFILL_" + r.upper()]
        if self.hysteresis_saturate:
            flags |= _FLAG["HYST_SATURATE"]
        if self.apply_nonfinite:
            flags |= _FLAG["APPLY_NONFINITE"]
        if self.flush_subnormal:
            flags |= _FLAG["FTZ"]
        if self.apply_next:
            flags |= _FLAG["APPLY_NEXT"]
        if self.growth_factor_after_overflow is not None:
            flags |= _FLAG["HAS_LATE_GROWTH"]
        floor = self.floor_scale if self.floor_scale is not None else self.min_scale
        return {
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "min_scale": 0.0 if self.min_scale is None else self.min_scale,
            "max_scale": math.inf if self.max_scale is None else self.max_scale,
            "growth_interval": self.growth_interval,
            "growth_offset": self.growth_offset,
            "hysteresis": self.hysteresis,
            "precision": _codes.PRECISION[self.precision],
            "growth_mode": _codes.GROWTH_MODE[self.growth_mode],
            "backoff_mode": _codes.BACKOFF_MODE[self.backoff_mode],
            "min_action": _codes.MIN_ACTION[self.min_action],
            "flags": flags,
            "tolerance": self.tolerance,
            "floor_scale": 0.0 if floor is None else floor,
            "growth_factor_after_overflow": (
                self.growth_factor
                if self.growth_factor_after_overflow is None
                else self.growth_factor_after_overflow
            ),
        }

    @property
    def give_up_scale(self) -> float | None:
        """The scale at which min_action gives up (floor_scale, else min_scale)."""
        return self.floor_scale if self.floor_scale is not None else self.min_scale

    def round_scale(self, v: float) -> float:
        """A scale value as the policy stores it (float32 unless float64)."""
        return v if self.precision == "float64" else float(np.float32(v))


def inverse_scale(scale: float, precision: str = "float32") -> float:
    """The factor that unscales gradients: ``1 / scale``, taken in float64 and rounded to
    float32 unless `precision` is "float64" (lsc_device_update's rule in _ext/update.cu).

    That is torch's inv_scale and TF's and Keras's ``float32(1) / float32(scale)`` alike:
    for a float32 scale, the float64 quotient rounded to float32 is the correctly
    rounded float32 quotient (53 >= 2 * 24 + 2 bits, so the double rounding is
    innocuous).  A zero scale gives an infinity of its sign, NaN gives NaN.
    """
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if precision == "float64":
            return float(np.float64(1.0) / np.float64(scale))
        return float(np.float32(np.float64(1.0) / np.float64(np.float32(scale))))
