"""``GradScaler``'s state: its state dict (torch's five keys, the counters, the full lscore
state under an lscore policy), its pickles and the skip counts they carry."""

from __future__ import annotations

from typing import Any

import numpy as np

from lscore.adapters.torch._config import warn_at_caller, zero_d
from lscore.adapters.torch._paths import Disabled, Unplaced, state_dict_with
from lscore.adapters.torch._scaler_path import PathScaler
from lscore.adapters.torch._unscaler import ScalerAssertionError
from lscore.policy import boolean, integer, real
from lscore.state import parse_state, refuse_other_policy

__all__ = ["StateScaler"]

# the keys of a pickled GradScaler, in this order: __getstate__ writes the path's part
# (_PICKLED_PATH: the state machine, the scale and the CPU unscaler) beside the scaler's
# own, and __setstate__ rebuilds an unplaced path from it
_PICKLED = (
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
_PICKLED_PATH = ("_state", "_init_scale", "_scale", "_tracker_t", "_scale_value", "_unscaler")


# torch's keys, which every enabled scaler's state dict holds
_TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


class StateKeyError(ValueError, KeyError):
    """A GradScaler state dict without torch's keys: a ValueError that names them, and a
    KeyError too, as torch's own load_state_dict raises (code written against torch keeps
    catching it)."""

    __str__ = ValueError.__str__  # the message as written, not KeyError's repr of it


# the state dict's key for what the scaler counts beside torch's state (torch ignores it)
_COUNTERS = "lscore_counters"


def _read_counters(d: Any) -> tuple[int, bool, int] | None:
    """(skipped_steps, last_step_skipped, monitor_steps) of a state dict's counters, checked."""
    if d is None:
        return None
    keys = {"skipped_steps", "last_step_skipped", "monitor_steps"}
    if not isinstance(d, dict) or set(d) != keys:
        raise ValueError(f"{_COUNTERS} must be a dict with the keys {sorted(keys)}, got {d!r}")
    last = d["last_step_skipped"]
    if not isinstance(last, bool):
        raise TypeError(f"{_COUNTERS}['last_step_skipped'] must be a bool, got {last!r}")
    return (
        integer("skipped_steps", d["skipped_steps"], minimum=0),
        last,
        integer("monitor_steps", d["monitor_steps"], minimum=0),
    )


class StateScaler(PathScaler):
    """What a GradScaler saves and restores: state dicts, pickles, skip counts."""

    @property
    def last_step_skipped(self) -> bool:
        """Whether the iteration closed by the last update() skipped an optimizer step.

        Exact; off the CPU (CUDA) the flag is a device tensor, so reading it waits for
        the device: a host synchronisation.  ``SkipAwareLR`` keeps a learning-rate
        schedule in step with the applied steps without one."""
        return bool(self._last_skipped)

    @property
    def skipped_steps(self) -> int:
        """How many iterations, closed by update(), skipped an optimizer step."""
        return int(self._skipped)

    def _uses_lscore_options(self) -> bool:
        return not self._path.torch_shape

    def state_dict(self) -> dict:
        """torch's five keys, ``"lscore_counters"`` (``skipped_steps``, ``last_step_skipped``
        and the overflow monitor's step count), and ``"lscore"`` (the full
        ``"lscore.state/1"`` state) when an lscore-only argument is in use; ``{}`` when
        disabled.

        torch's keys are in torch's meaning, so that ``torch.amp.GradScaler`` can load
        them: with an lscore policy, ``_growth_tracker`` counts toward the policy's next
        growth as torch's tracker counts toward ``growth_interval``.  A policy that never
        grows (a fixed scale) has no such meaning: it warns, since torch's scaler would
        grow and back off the scale it loads.
        """
        if not self._enabled:
            return {}
        d = {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }
        if self._uses_lscore_options():
            state = self._state
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
        d[_COUNTERS] = {
            "skipped_steps": self.skipped_steps,
            "last_step_skipped": self.last_step_skipped,
            "monitor_steps": self._steps_seen,
        }
        return d

    def load_state_dict(self, state_dict: dict, *, adopt_policy: bool = False) -> None:
        """Load `state_dict`, saved by this class or by ``torch.amp.GradScaler``.

        torch's five keys are taken as torch takes them (the growth and backoff
        factors and the growth interval included).  A dict with an ``"lscore"`` key
        (saved under an lscore-only option) must come from this scaler's policy, its
        initial scale aside, as ``lscore``'s own loss scales require: a state of
        another policy (a DeepSpeed scaler's, say) is a ValueError naming the fields
        that differ, and nothing changes.  ``adopt_policy=True`` takes the saved
        policy instead.  An empty dict (saved from a disabled scaler) is a
        RuntimeError, as in torch, unless this scaler is ``enabled="auto"`` and still
        undecided.
        """
        if not self._enabled:
            return
        if len(state_dict) == 0 and self._auto:
            # enabled="auto", undecided: the scaler that saved this disabled itself (no
            # float16 behind its loss); this one decides again at its first scale()
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler."
            )
        missing = [k for k in _TORCH_KEYS if k not in state_dict]
        if missing:
            raise StateKeyError(
                f"the state dict lacks {', '.join(map(repr, missing))}: a GradScaler state "
                f"dict has torch's keys {', '.join(map(repr, _TORCH_KEYS))} "
                f"(got {', '.join(map(repr, state_dict))})"
            )
        counters = _read_counters(state_dict.get(_COUNTERS))  # checked before any change
        # torch fill_()s its tensors with these: 0-d tensors (older checkpoints) work too
        scale = zero_d(state_dict["scale"])
        gf, bf = state_dict["growth_factor"], state_dict["backoff_factor"]
        gi, tracker = state_dict["growth_interval"], zero_d(state_dict["_growth_tracker"])
        # torch's fill_() would refuse these too; fail before anything changes
        real("scale", scale)
        v1 = state_dict.get("lscore")
        # with "lscore" the tracker is only torch's reading of the policy's (it may be < 0)
        integer("_growth_tracker", tracker, minimum=0 if v1 is None else None)
        if v1 is not None and not boolean("adopt_policy", adopt_policy):
            refuse_other_policy(
                self._state.policy,
                parse_state(v1)[0],
                "pass load_state_dict(state_dict, adopt_policy=True) to take the saved policy",
            )
        if v1 is not None:
            self._path.load(v1, None)
            self._init_values = (self._path.get_scale(), self._path.good_steps())
            p = self._state.policy
            self._growth_factor, self._backoff_factor = p.growth_factor, p.backoff_factor
            self._growth_interval = p.growth_interval
        else:
            state = self._state
            policy = state.policy.replace(growth_factor=gf, backoff_factor=bf, growth_interval=gi)
            # a torch dict has no hysteresis count: start full, as NeMo does
            d = state_dict_with(
                state,
                float(np.float32(scale)),
                policy,
                good_steps=int(tracker),
                hysteresis_left=policy.hysteresis,
            )
            self._path.load(d, scale)
            self._init_values = (scale, int(tracker))
            self._growth_factor, self._backoff_factor, self._growth_interval = gf, bf, gi
        if counters is not None:  # torch's own dicts have none: the counts stay as they are
            self._skipped, self._last_skipped, self._steps_seen = counters

    def __getstate__(self) -> dict:
        """The pickled attributes: those of _PICKLED, in that order, then any others."""
        if self._enabled and len(self._per_optimizer_states) != 0:
            raise ScalerAssertionError(
                "A GradScaler instance may only be pickled at the beginning of an "
                "iteration, or at the end after scaler.update()."
            )
        state = self.__dict__.copy()
        # a schedule holds its optimizer: it is not the scaler's to pickle (torch's
        # schedulers are saved on their own, and a rebuilt SkipAwareLR attaches itself)
        state.pop("_schedules", None)
        state.update(state.pop("_path").pickled())
        if self._enabled:
            state["_last_skipped"] = self.last_step_skipped
            state["_skipped"] = self.skipped_steps
        return {**{k: state.pop(k) for k in _PICKLED if k in state}, **state}

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        held = {k: state.pop(k) for k in _PICKLED_PATH if k in state}
        self.__dict__.update(state)
        # a pickled scaler is unplaced (as after torch's own unpickling: _scale is None)
        path = (
            Unplaced(held["_state"], held["_init_scale"], held.get("_unscaler"))
            if "_state" in held
            else None
        )
        self._path = path if self._enabled else Disabled(path)
