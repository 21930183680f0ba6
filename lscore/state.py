"""LossScaleState: a Policy plus the compiled state machine, and the v1 state format."""
from __future__ import annotations

import math
import threading

from lscore._ext._state import CyState
from lscore._params import Policy

FORMAT = "lscore.state/1"
FORMATS = (FORMAT,)
COUNTERS = ("good_steps", "hysteresis_left", "steps", "skipped")


class LossScaleFloorError(FloatingPointError):
    """The policy gives up: the scale cannot go lower (DeepSpeed, fairseq)."""


def _json_float(x: float):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _from_json_float(name: str, x) -> float:
    if isinstance(x, str):
        if x in ("nan", "inf", "-inf"):
            return float(x)
        raise ValueError(f"{name} must be a number or one of 'inf', '-inf', 'nan', got {x!r}")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name} must be a number, got {x!r}")
    return float(x)


class LossScaleState:
    """One loss-scale state machine: a validated Policy driving the compiled core.

    ``update(finite)`` is the single transition; it returns whether the step's
    gradients should be applied.  Updates on one object are serialised, so
    counters stay exact when several threads share it: a transition is one
    call into the compiled core, which runs under the GIL (the extension
    does not declare free-threading support, so the GIL stays on); the
    writers set_scale and load_state_dict also take a lock among themselves.
    """

    __slots__ = ("_policy", "_cy", "_lock")

    def __init__(self, policy: Policy):
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be an lscore Policy, got {type(policy).__name__}")
        self._policy = policy
        self._lock = threading.Lock()
        cy = CyState()
        cy.set_params(policy.c_params())
        cy.scale = cy.next_scale = policy.round_scale(policy.init_scale)
        cy.hysteresis_left = policy.hysteresis
        self._cy = cy

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def scale(self) -> float:
        return self._cy.scale

    def counters(self) -> dict:
        cy = self._cy
        return {k: getattr(cy, k) for k in COUNTERS}

    def update(self, finite: bool) -> bool:
        # no lock here: the per-step path stays one C call (a threading.Lock
        # costs more than the transition itself)
        r = self._cy.update(finite)
        if r < 0:
            raise LossScaleFloorError(
                f"loss scale cannot go below its minimum {self._policy.min_scale!r} "
                f"(policy {self._policy.name!r}); the loss is probably diverging")
        return r == 1

    def set_scale(self, value: float) -> None:
        """Overwrite the scale (torch's ``update(new_scale)``); counters unchanged."""
        v = float(value)
        with self._lock:
            cy = self._cy
            # next_scale first: an update landing between the two writes then
            # acts as if it came after both
            if self._policy.apply_next:
                cy.next_scale = v
            cy.scale = v

    def state_dict(self) -> dict:
        cy = self._cy
        d = {"format": FORMAT, "policy": self._policy.to_dict(), "scale": _json_float(cy.scale),
             "counters": self.counters()}
        if self._policy.apply_next:
            d["next_scale"] = _json_float(cy.next_scale)
        return d

    def load_state_dict(self, d: dict) -> None:
        """Take a v1 state dict; the policy in it replaces this object's policy."""
        policy, cy = _parse_state(d)
        with self._lock:
            self._policy = policy
            self._cy = cy

    @classmethod
    def from_state_dict(cls, d: dict) -> "LossScaleState":
        policy, cy = _parse_state(d)
        obj = cls.__new__(cls)
        obj._policy, obj._cy, obj._lock = policy, cy, threading.Lock()
        return obj

    def __getstate__(self):
        return self.state_dict()

    def __setstate__(self, d):
        policy, cy = _parse_state(d)
        self._policy, self._cy, self._lock = policy, cy, threading.Lock()

    def __repr__(self):
        c = self.counters()
        return (f"LossScaleState(policy={self._policy.name!r}, scale={self.scale!r}, "
                + ", ".join(f"{k}={v}" for k, v in c.items()) + ")")


def _parse_state(d) -> tuple[Policy, CyState]:
    """Validate a whole v1 dict before anything is changed."""
    if not isinstance(d, dict):
        raise TypeError(f"state must be a dict, got {type(d).__name__}")
    fmt = d.get("format")
    if fmt not in FORMATS:
        raise ValueError(f"unknown state format {fmt!r}; this lscore understands: "
                         f"{', '.join(FORMATS)}")
    allowed = {"format", "policy", "scale", "counters", "next_scale"}
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ValueError(f"unknown keys in {FORMAT} state: {', '.join(map(repr, unknown))}")
    for key in ("policy", "scale", "counters"):
        if key not in d:
            raise ValueError(f"{FORMAT} state is missing the key {key!r}")
    policy = Policy.from_dict(d["policy"])
    scale = _from_json_float("scale", d["scale"])
    counters = d["counters"]
    if not isinstance(counters, dict):
        raise TypeError(f"counters must be a dict, got {type(counters).__name__}")
    unknown = sorted(set(counters) - set(COUNTERS))
    if unknown:
        raise ValueError(f"unknown counters: {', '.join(map(repr, unknown))}")
    missing = [k for k in COUNTERS if k not in counters]
    if missing:
        raise ValueError(f"{FORMAT} state is missing counters: {', '.join(missing)}")
    for k in COUNTERS:
        v = counters[k]
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"counter {k} must be an int, got {v!r}")
    if counters["steps"] < 0 or counters["skipped"] < 0 or counters["good_steps"] < 0:
        raise ValueError("counters steps, skipped and good_steps must be >= 0")
    nxt = _from_json_float("next_scale", d.get("next_scale", scale))
    cy = CyState()
    cy.set_params(policy.c_params())
    cy.scale = scale
    cy.next_scale = nxt
    for k in COUNTERS:
        setattr(cy, k, counters[k])
    return policy, cy
