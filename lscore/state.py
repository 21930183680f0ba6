"""LossScaleState: a Policy plus the compiled state machine, and the v1 state format."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from lscore._ext import _codes
from lscore._ext._state import CyState
from lscore.policy import Policy, json_float, positive_scale, unjson_number

FORMAT = "lscore.state/1"
FORMATS = (FORMAT,)
COUNTERS = CyState.COUNTERS
KEYS = ("format", "policy", "scale", "counters", "next_scale", "config")
_APPLY, _FLOOR_ERROR = _codes.APPLY, _codes.FLOOR_ERROR
# a loaded counter must leave the core room to count in int64 without overflow
COUNTER_LIMIT = 2**62
# other names a v1 state may give a counter ("overflows": overflows_since_backoff)
_LEGACY_COUNTERS = {"overflows": "overflows_since_backoff"}


class LossScaleFloorError(FloatingPointError):
    """The policy gives up: the scale cannot go lower (DeepSpeed, fairseq)."""


def refuse_other_policy(mine: Policy, theirs: Policy, adopt: str) -> None:
    """The one rule for loading a state saved by another policy: a ValueError naming each
    field that differs (the initial scale aside: a state carries its own scale) as
    ``saved != this object's``, then `adopt`, how to take the saved policy instead."""
    a, b = mine.to_dict(), theirs.to_dict()
    a.pop("init_scale"), b.pop("init_scale")
    diff = sorted(k for k in a if a[k] != b[k])
    if diff:
        raise ValueError(
            "the state was saved by a different policy ("
            + ", ".join(f"{k}: {b[k]!r} != {a[k]!r}" for k in diff)
            + f"); {adopt}"
        )


class LossScaleState:
    """One loss-scale state machine: a validated Policy driving the compiled core.

    ``update(finite)`` is the single transition; it returns whether the step's
    gradients should be applied.  Updates on one object are serialised, so
    counters stay exact when several threads share it: a transition is one
    call into the compiled core, which runs under the GIL (the extension
    does not declare free-threading support, so the GIL stays on); the
    writers set_scale and load_state_dict also take a lock among themselves.
    """

    __slots__ = ("_cy", "_lock", "_policy")

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

    @property
    def good_steps(self) -> int:
        """Finite steps counted toward the next growth."""
        return self._cy.good_steps

    @property
    def hysteresis_left(self) -> int:
        """Overflows left before the next backoff (DeepSpeed/Megatron hysteresis)."""
        return self._cy.hysteresis_left

    def steps_to_growth(self) -> int | None:
        """How many finite steps in a row from now the policy next grows the scale; None
        when it never grows (a fixed scale, or a count already past an exact interval)."""
        p, good = self._policy, self._cy.good_steps
        interval = p.growth_interval
        if p.growth_mode == "never":
            return None
        if p.growth_mode == "modulo":  # grows when good - offset is a positive multiple
            k = good - p.growth_offset
            return interval - k % interval if k >= 0 else interval - k
        if p.growth_mode == "ge":
            return max(interval - good, 1)
        return interval - good if good < interval else None

    def counters(self) -> dict:
        """The counters, by name, as one snapshot:

        - ``good_steps``: the growth counter, in the policy's meaning (finite steps
          since the last growth or overflow; DeepSpeed's and fairseq's count
          since the last overflow only);
        - ``hysteresis_left``: overflows still absorbed before the next backoff;
        - ``steps``: updates taken; ``skipped``: those whose step was skipped;
        - ``overflows_since_backoff``: non-finite steps since the last backoff
          (what fairseq's ``tolerance`` compares with ``since_rescale``), not a
          count of all overflows: that is ``skipped`` where non-finite steps skip;
        - ``since_rescale``: steps since the last growth or backoff;
        - ``overflow_seen``: 1 once any non-finite step was seen, else 0.
        """
        cy = self._cy.copy()  # one snapshot, whatever other threads do meanwhile
        return {k: getattr(cy, k) for k in COUNTERS}

    def update(self, finite: bool) -> bool:
        if finite is not True and finite is not False:
            finite = as_finite(finite)
        # no lock here: the per-step path stays one C call, atomic under the
        # GIL (a threading.Lock costs more than the transition itself)
        r = self._cy.update(finite)
        if r == _FLOOR_ERROR:
            raise LossScaleFloorError(
                f"loss scale cannot go below its minimum {self._policy.min_scale!r} "
                f"(policy {self._policy.name!r}); the loss is probably diverging"
            )
        return r == _APPLY

    def set_scale(self, value: float) -> None:
        """Overwrite the scale (torch's ``update(new_scale)``); counters unchanged."""
        v = self._policy.round_scale(
            positive_scale("new_scale", value, precision=self._policy.precision)
        )
        with self._lock:
            cy = self._cy
            # next_scale first: an update landing between the two writes then
            # acts as if it came after both
            if self._policy.apply_next:
                cy.next_scale = v
            cy.scale = v

    def state_dict(self, config: dict | None = None) -> dict:
        """The v1 state: JSON-safe, exact; `config` (the owner's get_config()) is kept as is."""
        with self._lock:
            # copy() is one C call: a consistent snapshot even while another
            # thread runs update(), which takes no lock
            cy, policy = self._cy.copy(), self._policy
        d = {
            "format": FORMAT,
            "policy": policy.to_dict(),
            "scale": json_float(cy.scale),
            "counters": {k: getattr(cy, k) for k in COUNTERS},
        }
        if policy.apply_next:
            d["next_scale"] = json_float(cy.next_scale)
        if config is not None:
            d["config"] = config
        return d

    def set_counters(self, **counters: int) -> None:
        """Overwrite some counters (the names of ``counters()``), e.g. a peer's initial ones."""
        d = self.state_dict()
        unknown = sorted(set(counters) - set(COUNTERS))
        if unknown:
            raise ValueError(f"unknown counters: {', '.join(map(repr, unknown))}")
        d["counters"].update(counters)
        self.load_state_dict(d)

    def load_state_dict(self, d: dict, *, same_policy: bool = False) -> None:
        """Take a v1 state dict; the policy in it replaces this object's policy.

        With ``same_policy=True`` the state must come from this object's
        policy (its init_scale aside), as the TF-shaped classes and the
        presets require: a state of another policy is a ValueError.
        """
        policy, cy, _ = parse_state(d)
        if same_policy:
            refuse_other_policy(
                self._policy,
                policy,
                "build the object from that state with lscore.LossScaleState.from_state_dict",
            )
        with self._lock:
            self._policy = policy
            self._cy = cy

    @property
    def nbytes(self) -> int:
        """The size of the raw state (``to_bytes``)."""
        return self._cy.nbytes()

    def to_bytes(self) -> bytes:
        """The compiled state as raw bytes, for a device copy
        (``lscore.cuda.device_state.DeviceState``)."""
        return self._cy.to_bytes()

    def from_bytes(self, raw: bytes) -> None:
        """Take raw bytes from ``to_bytes`` (or a device copy that advanced them)."""
        with self._lock:
            self._cy.from_bytes(raw)

    @classmethod
    def from_state_dict(cls, d: dict) -> LossScaleState:
        policy, cy, _ = parse_state(d)
        obj = cls.__new__(cls)
        obj._policy, obj._cy, obj._lock = policy, cy, threading.Lock()
        return obj

    def __getstate__(self) -> dict:
        return self.state_dict()

    def __setstate__(self, d: Any) -> None:
        policy, cy, _ = parse_state(d)
        self._policy, self._cy, self._lock = policy, cy, threading.Lock()

    def __repr__(self) -> str:
        c = self.counters()
        return (
            f"LossScaleState(policy={self._policy.name!r}, scale={self.scale!r}, "
            + ", ".join(f"{k}={v}" for k, v in c.items())
            + ")"
        )


def as_finite(finite: Any, name: str = "finite") -> bool:
    """`finite` as a Python bool: a bool, a NumPy bool, or a one-element bool array or tensor
    of any framework (torch, CuPy: read with ``.item()``, which waits for the device).

    Anything else is a TypeError naming `name`: a truthy "False" string is a mistake.
    """
    if finite is True or finite is False:
        return finite
    if isinstance(finite, np.bool_):
        return bool(finite)
    dtype = getattr(finite, "dtype", None)
    if dtype is not None and str(dtype) in ("bool", "torch.bool"):
        size = getattr(finite, "size", None)
        n = size if isinstance(size, int) else getattr(finite, "numel", lambda: None)()
        if n == 1:
            return bool(finite.item())
    raise TypeError(f"{name} must be a bool, got {finite!r} ({type(finite).__name__})")


def _scale_value(name: str, x: Any) -> float:
    # NaN stays loadable: an extreme policy can produce it (0 * a factor that is
    # inf in float32), and every state the core produces must round-trip
    v = unjson_number(name, x)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, 'inf' or 'nan', got {x!r}")
    return v


def parse_state(d: Any) -> tuple[Policy, CyState, dict | None]:
    """Validate a whole v1 dict before anything is changed: (policy, core, config or None)."""
    if not isinstance(d, dict):
        raise TypeError(f"state must be a dict, got {type(d).__name__}")
    fmt = d.get("format")
    if fmt not in FORMATS:
        raise ValueError(
            f"unknown state format {fmt!r}; this lscore understands: {', '.join(FORMATS)}"
        )
    unknown = sorted(set(d) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown keys in {FORMAT} state: {', '.join(map(repr, unknown))}")
    for key in ("policy", "scale", "counters"):
        if key not in d:
            raise ValueError(f"{FORMAT} state is missing the key {key!r}")
    policy = Policy.from_dict(d["policy"])
    scale = _scale_value("scale", d["scale"])
    counters = d["counters"]
    if not isinstance(counters, dict):
        raise TypeError(f"counters must be a dict, got {type(counters).__name__}")
    for old, new in _LEGACY_COUNTERS.items():
        if old in counters:
            if new in counters:
                raise ValueError(f"counters holds {old!r} and its new name {new!r}; keep one")
            counters = {new if k == old else k: v for k, v in counters.items()}
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
    negative = [k for k in COUNTERS if k != "hysteresis_left" and counters[k] < 0]
    if negative:
        raise ValueError(
            "counters must be >= 0 (except hysteresis_left), got "
            + ", ".join(f"{k}={counters[k]}" for k in negative)
        )
    for k in COUNTERS:
        if abs(counters[k]) > COUNTER_LIMIT:
            raise ValueError(f"counter {k} must be at most 2**62 in size, got {counters[k]!r}")
    if counters["overflow_seen"] not in (0, 1):
        raise ValueError(f"counter overflow_seen must be 0 or 1, got {counters['overflow_seen']}")
    config = d.get("config")
    if config is not None and not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    nxt = _scale_value("next_scale", d.get("next_scale", scale))
    # the policy's own precision, as the peer's variable would hold it (TF and torch
    # keep float32 scales: a float64 value restored into them is rounded)
    with np.errstate(over="ignore"):
        scale, nxt = policy.round_scale(scale), policy.round_scale(nxt)
    cy = CyState()
    cy.set_params(policy.c_params())
    cy.scale = scale
    cy.next_scale = nxt
    for k in COUNTERS:
        setattr(cy, k, counters[k])
    return policy, cy, config
