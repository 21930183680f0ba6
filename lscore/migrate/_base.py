"""The parts every peer reader shares: reading values, dicts and keys, and the peer base."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from lscore.policy import integer, real
from lscore.presets import PresetLossScale

MISSING = object()
BF16_NEEDS_NO_SCALING = (
    "bfloat16 has float32's exponent range, so its gradients do not "
    "underflow as float16 ones do: bf16 needs no loss scaling (train "
    "without a loss scale, or use one only for an fp16 run)"
)


class MigrationNote(UserWarning):
    """A value lscore chose where the peer's input left it open (see ``Migration.notes``)."""


@dataclasses.dataclass(frozen=True)
class Migration:
    """What ``convert`` made of a peer's config and state.

    ``loss_scale`` is the preset object; ``notes`` the choices lscore made
    (each a sentence); ``state_at`` and ``config_at`` where in a whole
    checkpoint the scaler state and the config were found (e.g.
    ``"checkpoint['optimizer']['grad_scaler']"``), None when given directly;
    ``defaults`` the preset arguments that neither the config nor the state
    gave, each with the peer's default that the preset took.
    """

    loss_scale: PresetLossScale
    notes: tuple = ()
    state_at: str | None = None
    config_at: str | None = None
    defaults: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Loaded:
    """A peer state read into lscore terms; None/empty: keep the preset's initial value."""

    scale: float | None = None
    counters: dict = dataclasses.field(default_factory=dict)
    next_scale: float | None = None


def read_value(name: str, v: Any) -> Any:
    """A Python number from a float, int, 0-d/1-element tensor or array, or [x]."""
    if isinstance(v, (list, tuple)) and len(v) == 1:
        v = v[0]
    if hasattr(v, "item") and not isinstance(v, (bool, int, float)):
        try:
            v = v.item()
        except (TypeError, ValueError):
            raise TypeError(f"{name} must hold one number, got {v!r}") from None
    return v


def read_scale(name: Any, v: Any) -> float:
    x = real(name, read_value(name, v))
    if math.isnan(x) or x < 0:
        raise ValueError(f"{name} must be a number >= 0, got {v!r}")
    return x


def read_count(name: Any, v: Any, minimum: Any = 0) -> int:
    return integer(name, read_value(name, v), minimum=minimum)


def as_dict(x: Any) -> Any:
    """A dict's items, or an object's attributes (argparse.Namespace, a pickled scaler)."""
    if isinstance(x, dict):
        return x
    if hasattr(x, "__dict__") and not isinstance(x, type):
        return vars(x)
    return None


def check_keys(what: str, d: Any, allowed: Any, required: Any = ()) -> Any:
    found = as_dict(d)
    if found is None:
        raise TypeError(f"{what} must be a dict, got {type(d).__name__}")
    unknown = sorted(set(found) - set(allowed), key=str)
    if unknown:
        raise ValueError(
            f"unknown keys in {what}: {', '.join(map(repr, unknown))}; "
            f"expected: {', '.join(allowed)}"
        )
    missing = [k for k in required if k not in found]
    if missing:
        raise ValueError(f"{what} is missing: {', '.join(map(repr, missing))}")
    return found


def path_text(path: Any) -> str:
    return "checkpoint" + "".join(f"[{k!r}]" for k in path)


def walk_path(d: Any, path: Any) -> Any:
    """The value at key path `path` in nested dicts/objects, or MISSING."""
    for key in path:
        d = as_dict(d)
        if d is None or key not in d:
            return MISSING
        d = d[key]
    return d


def top_keys(d: Any) -> str:
    keys = sorted(map(str, d))
    return ", ".join(map(repr, keys[:20])) + (", ..." if len(keys) > 20 else "")


def is_auto(v: Any) -> bool:
    return isinstance(v, str) and v == "auto"


class PeerBase:
    """How one peer's config and state map onto an lscore preset.

    ``state_keys`` mark the peer's scaler state: a dict sharing one of them is
    read as that state (and checked strictly); any other dict is taken as a
    whole checkpoint and searched at ``places`` (key paths), and at
    ``config_places`` for the peer's config when none was given.
    """

    preset = ""
    what = ""  # how errors name the peer's scaler state
    config_keys: tuple = ()
    ignored_config_keys: tuple = ()  # peer keys that carry no loss-scale information
    state_keys: tuple = ()
    places: tuple = ()
    config_places: tuple = ()

    def args(self, config: Any, notes: list) -> dict:
        config = check_keys(
            f"{self.preset} config", config, self.config_keys + self.ignored_config_keys
        )
        return {k: v for k, v in config.items() if k in self.config_keys}

    def is_state(self, d: dict) -> bool:
        return not d or bool(set(d) & set(self.state_keys))

    def locate(self, checkpoint: Any) -> Any:
        """(the scaler state, its key path or None) in `checkpoint`."""
        d = as_dict(checkpoint)
        if d is None or self.is_state(d):
            return checkpoint, None
        for path in self.places:
            found = walk_path(d, path)
            if found is not MISSING:
                return found, path
        raise ValueError(self.not_found(d))

    def not_found(self, d: Any) -> str:
        looked = [f"the {self.what} itself (keys {', '.join(self.state_keys)})"]
        looked += [path_text(p) for p in self.places]
        return (
            f"found no {self.what} in this checkpoint; looked for: {'; '.join(looked)}; "
            f"its top-level keys are: {top_keys(d)}"
        )

    def load(self, state: Any, args: dict, notes: list) -> Loaded:
        """The state in lscore terms; may update `args` from what the state holds."""
        raise NotImplementedError

    def dump(self, ls: PresetLossScale, args: dict) -> dict:
        raise NotImplementedError

    def config(self, args: dict) -> dict:
        return {k: args[k] for k in self.config_keys if k in args}


# Where training tools keep a torch GradScaler's state_dict() in their checkpoints:
# torchvision's references (and most scripts) "scaler"; timm's NativeScaler "amp_scaler";
# Lightning the precision plugin's class name (trainer/connectors/checkpoint_connector.py:
# checkpoint[prec_plugin.__class__.__qualname__]; 2.x MixedPrecision and FSDPPrecision,
# 1.9-2.1 MixedPrecisionPlugin / FSDPMixedPrecisionPlugin / FSDPPrecisionPlugin, 1.5-1.9
# NativeMixedPrecisionPlugin and its sharded subclasses) or, before 1.6,
# "native_amp_scaling_state".  accelerate's save_state writes the state_dict alone to
# scaler.pt (accelerate/checkpointing.py), which is the state itself.


def iteration_counters(st: Any) -> Loaded:
    """cur_scale, cur_iter and last_overflow_iter (apex fp16_utils, DeepSpeed) in lscore terms.

    Both grow when the steps since the last overflow reach a multiple of the window,
    so the clean steps counted so far are cur_iter - last_overflow_iter - 1.
    """
    it = read_count("cur_iter", st["cur_iter"])
    last = read_count("last_overflow_iter", st["last_overflow_iter"], -1)
    if last >= it:
        raise ValueError(f"last_overflow_iter must be < cur_iter, got {last} >= {it}")
    return Loaded(
        read_scale("cur_scale", st["cur_scale"]), {"good_steps": it - last - 1, "steps": it}
    )


def same_value(a: Any, b: Any) -> bool:
    da, db = as_dict(a), as_dict(b)
    if da is None or db is None or set(da) != set(db):
        return False
    return all(read_value(k, da[k]) == read_value(k, db[k]) for k in da)
