"""What a GradScaler saves and loads: its state dict (torch's five keys in torch's meaning,
the counters under ``"lscore_counters"``, the full lscore state under ``"lscore"``), the
checks a loaded dict passes before anything changes, the layout of its pickles, and the
edits of the state machine's own state dict that loading and the setters make.
``GradScaler``'s ``state_dict``, ``load_state_dict``, ``__getstate__`` and
``__setstate__`` call ``state_dict_of``, ``load_into``, ``pickled`` and ``unpickled``."""

from __future__ import annotations

from typing import Any

import numpy as np

from lscore.adapters.torch._config import is_torch_shape, warn_at_caller, zero_d
from lscore.adapters.torch._unscaler import GradUnscaler, ScalerAssertionError
from lscore.policy import Policy, boolean, integer, json_float, real
from lscore.state import LossScaleState, parse_state, refuse_other_policy

__all__ = [
    "COUNTERS",
    "PICKLED",
    "PICKLED_PATH",
    "StateKeyError",
    "load_into",
    "lscore_keys",
    "pickled",
    "read_state_dict",
    "replace_state",
    "state_dict_of",
    "state_dict_with",
    "unpickled",
]

# torch's keys, which every enabled scaler's state dict holds
TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")

# the state dict's key for what the scaler counts beside torch's state (torch ignores it),
# and the counts it holds
COUNTERS = "lscore_counters"
COUNTER_KEYS = ("skipped_steps", "last_step_skipped", "monitor_steps")

# the keys of a pickled GradScaler, in this order (then any others): the single-module
# adapter's, so pickles load across versions; "_scale", "_tracker_t" and "_scale_value"
# are always None (an unpickled scaler creates its scale again at its next scale())
PICKLED = (
    "_device",
    "_auto",
    "_enabled",
    "_allow_fp16",
    "_monitor_groups",
    "_last_skipped",
    "_skipped",
    "_state",
    "_init_scale",
    "_growth_factor",
    "_backoff_factor",
    "_growth_interval",
    "_scale",
    "_tracker_t",
    "_scale_value",
    "_unscaler",
    "_per_optimizer_states",
    "_reducer",
)
# those a pickle holds for the scale: __setstate__ gives the scaler the state machine, the
# reported scale and the CPU unscaler of these, and no tensors
PICKLED_PATH = ("_state", "_init_scale", "_scale", "_tracker_t", "_scale_value", "_unscaler")


class StateKeyError(ValueError, KeyError):
    """A GradScaler state dict without torch's keys: a ValueError that names them, and a
    KeyError too, as torch's own load_state_dict raises (code written against torch keeps
    catching it)."""

    __str__ = ValueError.__str__  # the message as written, not KeyError's repr of it


def state_dict_of(
    state: LossScaleState, scale: float, factors: tuple, tracker: int, counts: tuple
) -> dict:
    """A scaler's state dict: torch's five keys (`scale`, torch's three `factors` and the
    growth `tracker`), the full `state` under ``"lscore"`` when its policy is not torch's,
    and `counts` (skipped_steps, last_step_skipped, monitor_steps) under COUNTERS."""
    d = dict(zip(TORCH_KEYS, (scale, *factors, tracker), strict=True))
    if not is_torch_shape(state.policy):
        lscore_keys(d, state)
    d[COUNTERS] = dict(zip(COUNTER_KEYS, counts, strict=True))
    return d


def load_into(state: LossScaleState, state_dict: dict, adopt_policy: bool) -> tuple:
    """Check `state_dict` (saved by GradScaler or torch's), then load it into the state
    machine `state`: (the scale to report before the first scale(), None for the state's;
    torch's _init_scale and _init_growth_tracker, None for those loaded; torch's growth
    factor, backoff factor and growth interval; the counts or None).

    A dict with an ``"lscore"`` state must come from `state`'s policy unless
    `adopt_policy`; torch's keys alone load as torch loads them, with a full hysteresis
    count (torch's dicts have none), as NeMo starts."""
    if len(state_dict) == 0:
        raise RuntimeError(
            "The source state dict is empty, possibly because it was saved "
            "from a disabled instance of GradScaler."
        )
    scale, factors, tracker, v1, counters = read_state_dict(state_dict)
    if v1 is not None and not boolean("adopt_policy", adopt_policy):
        refuse_other_policy(
            state.policy,
            parse_state(v1)[0],
            "pass load_state_dict(state_dict, adopt_policy=True) to take the saved policy",
        )
    if v1 is not None:
        state.load_state_dict(v1)
        p = state.policy
        return None, None, (p.growth_factor, p.backoff_factor, p.growth_interval), counters
    gf, bf, gi = factors
    policy = state.policy.replace(growth_factor=gf, backoff_factor=bf, growth_interval=gi)
    d = state_dict_with(
        state,
        float(np.float32(scale)),
        policy,
        good_steps=int(tracker),
        hysteresis_left=policy.hysteresis,
    )
    state.load_state_dict(d)
    return scale, (scale, int(tracker)), factors, counters


def pickled(attrs: dict) -> dict:
    """The pickle of a scaler whose ``__dict__`` is `attrs`: the attributes of PICKLED, in
    that order, then any others; the scale as the host state holds it, no tensors, and
    the skip counts as plain values.  torch's assertion unless between iterations."""
    if attrs["_enabled"] and len(attrs["_per_optimizer_states"]) != 0:
        raise ScalerAssertionError(
            "A GradScaler instance may only be pickled at the beginning of an "
            "iteration, or at the end after scaler.update()."
        )
    state = dict(attrs)
    # a schedule holds its optimizer: it is not the scaler's to pickle (torch's
    # schedulers are saved on their own, and a rebuilt SkipAwareLR attaches itself)
    state.pop("_schedules", None)
    path = state.pop("_path")
    if "_state" in state:
        if path is not None:
            path.pull()
        reported = state.pop("_reported")
        scale = reported if path is None else path.get_scale()
        state.update(_init_scale=scale, _scale=None, _tracker_t=None, _scale_value=None)
    if state["_enabled"]:  # last_step_skipped and skipped_steps (device values are read)
        state["_last_skipped"], state["_skipped"] = (
            bool(state["_last_skipped"]),
            int(state["_skipped"]),
        )
    return {**{k: state.pop(k) for k in PICKLED if k in state}, **state}


def unpickled(state: dict) -> dict:
    """The ``__dict__`` of a scaler unpickled from `state`: the state machine, the reported
    scale and the CPU unscaler of PICKLED_PATH, and no path (as after torch's own
    unpickling, whose _scale is None: the next scale() creates it again)."""
    state = dict(state)
    held = {k: state.pop(k) for k in PICKLED_PATH if k in state}
    if "_state" in held:
        state["_state"], state["_reported"] = held["_state"], held["_init_scale"]
        state["_unscaler"] = held.get("_unscaler") or GradUnscaler()
    state["_path"] = None
    return state


def lscore_keys(d: dict, state: LossScaleState) -> None:
    """Under an lscore policy: `d`'s torch keys in torch's meaning, and the full state
    under ``"lscore"``.

    With an lscore policy, ``_growth_tracker`` counts toward the policy's next growth as
    torch's tracker counts toward ``growth_interval``; a policy that never grows warns,
    since torch's scaler would grow and back off the scale it loads.
    """
    p = state.policy
    if p.backoff_mode == "divide":
        d["backoff_factor"] = 1.0 / p.growth_factor
    n = state.steps_to_growth()
    if n is None:
        warn_at_caller(
            f"the {p.name!r} policy keeps its scale fixed; torch.amp.GradScaler "
            "cannot, so loaded into it this state grows and backs off the scale "
            "(lscore's GradScaler loads the whole policy from the 'lscore' key)"
        )
    else:
        # torch grows when its tracker, counting up, reaches growth_interval; it is
        # negative where the policy waits longer (DeepSpeed's offset after an overflow)
        d["_growth_tracker"] = p.growth_interval - n
    d["lscore"] = state.state_dict()


def read_state_dict(state_dict: dict) -> tuple:
    """(scale, (growth factor, backoff factor, growth interval), growth tracker, the
    ``"lscore"`` state or None, the counters or None) of a non-empty state dict, checked
    as torch's ``fill_()`` and lscore's counters require, before anything changes."""
    missing = [k for k in TORCH_KEYS if k not in state_dict]
    if missing:
        raise StateKeyError(
            f"the state dict lacks {', '.join(map(repr, missing))}: a GradScaler state "
            f"dict has torch's keys {', '.join(map(repr, TORCH_KEYS))} "
            f"(got {', '.join(map(repr, state_dict))})"
        )
    counters = _read_counters(state_dict.get(COUNTERS))
    # torch fill_()s its tensors with these: 0-d tensors (older checkpoints) work too
    scale = zero_d(state_dict["scale"])
    factors = tuple(state_dict[k] for k in TORCH_KEYS[1:4])
    tracker = zero_d(state_dict["_growth_tracker"])
    # torch's fill_() would refuse these too
    real("scale", scale)
    v1 = state_dict.get("lscore")
    # with "lscore" the tracker is only torch's reading of the policy's (it may be < 0)
    integer("_growth_tracker", tracker, minimum=0 if v1 is None else None)
    return scale, factors, tracker, v1, counters


def state_dict_with(
    state: LossScaleState, scale: float, policy: Policy | None = None, **counters: Any
) -> dict:
    """`state`'s state dict with another scale, policy and counters."""
    d = state.state_dict()
    d["policy"] = (policy or state.policy).to_dict()
    d["scale"] = json_float(scale)
    d["counters"].update(counters)
    return d


def replace_state(
    state: LossScaleState,
    scale: float | None = None,
    good_steps: int | None = None,
    policy: Policy | None = None,
) -> None:
    """Replace `state`'s scale, growth tracker and policy (None: keep it)."""
    scale = state.scale if scale is None else scale
    good = state.good_steps if good_steps is None else good_steps
    state.load_state_dict(state_dict_with(state, scale, policy, good_steps=int(good)))


def _read_counters(d: Any) -> tuple[int, bool, int] | None:
    """(skipped_steps, last_step_skipped, monitor_steps) of a state dict's counters, checked."""
    if d is None:
        return None
    keys = set(COUNTER_KEYS)
    if not isinstance(d, dict) or set(d) != keys:
        raise ValueError(f"{COUNTERS} must be a dict with the keys {sorted(keys)}, got {d!r}")
    last = d["last_step_skipped"]
    if not isinstance(last, bool):
        raise TypeError(f"{COUNTERS}['last_step_skipped'] must be a bool, got {last!r}")
    return (
        integer("skipped_steps", d["skipped_steps"], minimum=0),
        last,
        integer("monitor_steps", d["monitor_steps"], minimum=0),
    )
