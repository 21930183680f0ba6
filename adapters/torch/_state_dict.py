"""What a GradScaler saves and loads: its state dict (torch's five keys in torch's meaning,
the counters under ``"lscore_counters"``, the full lscore state under ``"lscore"``), the
checks a loaded dict passes before anything changes, the layout of its pickles, and the
edits of the state machine's own state dict that loading and the setters make."""

from __future__ import annotations

from typing import Any

from lscore.adapters.torch._config import warn_at_caller, zero_d
from lscore.policy import Policy, integer, json_float, real
from lscore.state import LossScaleState

__all__ = [
    "COUNTERS",
    "PICKLED",
    "PICKLED_PATH",
    "StateKeyError",
    "lscore_keys",
    "read_state_dict",
    "replace_state",
    "state_dict_with",
]

# torch's keys, which every enabled scaler's state dict holds
TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")

# the state dict's key for what the scaler counts beside torch's state (torch ignores it)
COUNTERS = "lscore_counters"

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
    keys = {"skipped_steps", "last_step_skipped", "monitor_steps"}
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
