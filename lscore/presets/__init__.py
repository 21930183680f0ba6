"""Every peer's loss-scale policy as an exact preset: ``lscore.preset(name, **kwargs)``.

Each preset takes its peer's own constructor arguments and defaults and
reproduces the peer's scale sequence (off-by-ones, counters, floor and cap,
arithmetic precision); the table behind it is ``lscore/presets/table.py``.
"""

from __future__ import annotations

import inspect
from typing import Any

from lscore import kernels
from lscore.loss_scale import LossScale
from lscore.managers import LossScaleManager
from lscore.policy import Policy, json_float, unjson_float
from lscore.presets import table
from lscore.state import LossScaleState, as_finite, parse_state

__all__ = ["NAMES", "PresetLossScale", "preset"]

#: every preset name, sorted
NAMES = table.NAMES


def json_config(config: dict) -> dict:
    """A preset config with non-finite floats as the strings "inf", "-inf", "nan" (valid
    JSON), as ``lscore.policy.json_float`` writes them."""
    return {k: json_float(v) if isinstance(v, float) else v for k, v in config.items()}


def unjson_config(config: dict) -> dict:
    """The inverse of `json_config`."""
    return {k: unjson_float(v) for k, v in config.items()}


class PresetLossScale(LossScale):
    """A dynamic loss scale that follows one peer's rule exactly (see ``lscore.preset``).

    ``ls()`` is the current scale; ``ls.update(grads)`` checks the gradients
    (any nested list/tuple/dict of arrays; None ignored) and returns
    ``(None, should_apply)``.  A peer's give-up raises
    ``lscore.LossScaleFloorError`` at the same step, with the state the peer
    leaves.  ``ls.state.update(finite)`` takes a finiteness flag computed
    elsewhere (a gradient norm, an all-reduced flag).
    """

    preset_name: str | None = None

    def __init__(self, preset: str | None = None, **kwargs: Any) -> None:
        own = type(self).preset_name
        name = own if preset is None else preset
        if own is not None and name != own:
            raise ValueError(f"{type(self).__name__} is preset {own!r}, got preset={preset!r}")
        _, args = table.resolve(name, kwargs)
        assert isinstance(name, str)  # resolve refused anything else
        self._name = name
        self._args = args
        self._state = LossScaleState(table.policy(name, args))
        counters = table.initial_counters(name, args)
        if counters:
            self._state.set_counters(**counters)

    @property
    def name(self) -> str:
        return self._name

    @property
    def args(self) -> dict:
        """The peer's constructor arguments, checked, defaults filled in."""
        return dict(self._args)

    @property
    def state(self) -> LossScaleState:
        return self._state

    @property
    def policy(self) -> Policy:
        return self._state.policy

    def counters(self) -> dict:
        return self._state.counters()

    def __call__(self) -> float:
        return self._state.scale

    def update(self, grads: Any) -> tuple[None, bool]:
        return None, self._state.update(kernels.all_finite(grads))

    def get_config(self) -> dict:
        """``{"preset": name, **the peer's arguments}`` (defaults filled in)."""
        return {"preset": self._name, **self._args}

    def state_dict(self) -> dict:
        """The v1 state (JSON-safe), with this preset's config."""
        return self._state.state_dict(config=json_config(self.get_config()))

    def load_state_dict(self, d: dict) -> None:
        """Take a v1 state saved by the same policy (works before the first update)."""
        self._state.load_state_dict(d, same_policy=True)

    @classmethod
    def from_state_dict(cls, d: dict) -> PresetLossScale:
        """The preset object a v1 state was saved from (its "config" names the preset)."""
        config = parse_state(d)[2]
        if not config or "preset" not in config:
            raise ValueError(
                "this state has no preset config; rebuild the object with "
                "lscore.preset(...) and call load_state_dict"
            )
        obj = preset(**unjson_config(config))
        obj.load_state_dict(d)
        return obj

    def __reduce__(self) -> tuple:
        return PresetLossScale.from_state_dict, (self.state_dict(),)

    def __repr__(self) -> str:
        c = self.counters()
        return (
            f"{type(self).__name__}(scale={self()!r}, "
            + ", ".join(f"{k}={v}" for k, v in c.items())
            + ")"
        )


class ManagerPreset(PresetLossScale, LossScaleManager):
    """A preset that is also a TF1 ``LossScaleManager`` (the "tf1" preset), so TF1 code
    and the adapters' ``loss_scale_manager=`` take it as they take
    ``ExponentialUpdateLossScaleManager``."""

    def get_loss_scale(self) -> float:
        return self()

    def update_loss_scale(self, finite_grads: Any) -> None:
        self._state.update(as_finite(finite_grads, "finite_grads"))


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Preset"


def _make_class(name: str) -> type[PresetLossScale]:
    spec = table.TABLE[name]
    args = ", ".join(f"{k}" if v is table.REQUIRED else f"{k}={v!r}" for k, v in spec.args.items())
    doc = (
        f"Preset {name!r}: {spec.peer}.\n\n"
        + inspect.cleandoc(spec.doc)
        + f"\n\nArguments (the peer's own): {args}."
    )
    base = ManagerPreset if name == "tf1" else PresetLossScale
    return type(
        _camel(name), (base,), {"__doc__": doc, "preset_name": name, "__module__": __name__}
    )


CLASSES = {name: _make_class(name) for name in NAMES}
globals().update({cls.__name__: cls for cls in CLASSES.values()})


def preset(preset: str, **kwargs: Any) -> PresetLossScale:
    """A loss scale that reproduces peer `preset`'s update rule exactly.

    `preset` is one of: apex, apex_fp16_utils, chainer, colossalai,
    deepspeed, fairseq, jmp, keras2, keras3, megatron, mxnet, nemo, paddle,
    tf1, tf2, torch.  Keyword arguments are the peer's own constructor
    arguments, with the peer's defaults.  An unknown name is a ValueError, an
    argument the peer does not have a TypeError.  ``type(ls).from_config(
    ls.get_config())`` and ``lscore.preset(**ls.get_config())`` rebuild it.

    Example::

        ls = lscore.preset("deepspeed", init_scale=2**16, scale_window=1000, delayed_shift=2)
        _, should_apply = ls.update(grads)
    """
    if not isinstance(preset, str) or preset not in CLASSES:
        raise ValueError(f"unknown preset {preset!r}; expected one of: {', '.join(NAMES)}")
    return CLASSES[preset](**kwargs)
