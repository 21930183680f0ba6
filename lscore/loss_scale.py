"""TF2-shaped loss scales: LossScale, FixedLossScale, DynamicLossScale and get().

Behaviour follows ``tf.mixed_precision.experimental`` (TF 2.0-2.3, still in
TF 2.x as ``tf.compat.v1.mixed_precision``): float32 arithmetic, a growth that
would overflow float32 is refused, decreases divide by the multiplier and
never go below 1.  Unlike TF, nonsense arguments (NaN or negative scales,
non-numbers) are rejected when the object is built.
"""

from __future__ import annotations

import abc
from typing import Any, SupportsFloat, TypeVar, overload

import numpy as np

from lscore import kernels
from lscore.policy import (
    Policy,
    factor_at_least_one,
    fixed_scale,
    growth_interval,
    positive_scale,
)
from lscore.state import LossScaleState

__all__ = ["DynamicLossScale", "FixedLossScale", "LossScale", "get"]


_LS = TypeVar("_LS", bound="LossScale")


class LossScale(abc.ABC):
    """A loss scale: ``ls()`` is the current scale, ``ls.update(grads)`` advances it.

    ``update(grads)`` takes the *unscaled* gradients (any nested list, tuple
    or dict of arrays; None entries ignored) and returns
    ``(None, should_apply)``, where should_apply is a Python bool.
    """

    @abc.abstractmethod
    def __call__(self) -> float:
        """The current loss scale."""

    @abc.abstractmethod
    def update(self, grads: Any) -> tuple[None, bool]:
        """Advance the scale given this step's gradients; returns (None, should_apply)."""

    @abc.abstractmethod
    def get_config(self) -> dict:
        """The constructor arguments, as TF returns them."""

    @classmethod
    def from_config(cls: type[_LS], config: dict) -> _LS:
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        return cls(**config)


class FixedLossScale(LossScale):
    """A loss scale that never changes; ``update`` always says apply (TF's behaviour)."""

    def __init__(self, loss_scale_value: SupportsFloat) -> None:
        self._value = fixed_scale(
            "loss_scale_value", loss_scale_value, "loss_scale_value must be at least 1."
        )
        self._scale32 = float(np.float32(self._value))
        self._state = LossScaleState(
            Policy(name="fixed", init_scale=self._value, growth_mode="never", apply_nonfinite=True)
        )

    def __call__(self) -> float:
        return self._scale32

    def update(self, grads: Any) -> tuple[None, bool]:
        del grads  # TF ignores them: a fixed scale applies every step
        self._state.update(True)
        return None, True

    def get_config(self) -> dict:
        return {"loss_scale_value": self._value}

    def counters(self) -> dict:
        """The state machine's counters (``steps``, ``skipped``, ...)."""
        return self._state.counters()

    def state_dict(self) -> dict:
        """The v1 state: the scale and the number of updates."""
        return self._state.state_dict(config=self.get_config())

    def load_state_dict(self, d: dict) -> None:
        self._state.load_state_dict(d, same_policy=True)
        self._scale32 = self._state.scale

    def __repr__(self) -> str:
        return f"FixedLossScale({self._value})"


class DynamicLossScale(LossScale):
    """A loss scale that grows after a run of finite steps and shrinks on overflow.

    Exactly TF's ``DynamicLossScale`` (float32 arithmetic throughout)::

        if all grads are finite:
            if good_steps + 1 >= increment_period:
                new = scale * multiplier
                if new is finite: scale = new     # never grow to inf
                good_steps = 0
            else:
                good_steps += 1
        else:
            good_steps = 0
            scale = max(scale / multiplier, 1)    # a scale below 1 is pushed up to 1
        should_apply = all grads are finite

    Example::

        ls = lscore.DynamicLossScale(initial_loss_scale=1024, increment_period=1000)
        grads = backprop(loss * ls())            # your own backward pass
        grads = [g / ls() for g in grads]        # unscaled
        _, should_apply = ls.update(grads)
        if should_apply:
            optimizer.apply(grads)
    """

    def __init__(
        self,
        initial_loss_scale: float = 2**15,
        increment_period: int = 2000,
        multiplier: float = 2.0,
    ) -> None:
        self._initial = positive_scale("initial_loss_scale", initial_loss_scale)
        self._period = growth_interval("increment_period", increment_period)
        self._multiplier = factor_at_least_one("multiplier", multiplier)
        self._state = LossScaleState(
            Policy(
                name="tf2",
                init_scale=self._initial,
                growth_factor=self._multiplier,
                backoff_factor=1.0 / self._multiplier,
                growth_interval=self._period,
                precision="float32",
                growth_mode="ge",
                backoff_mode="divide",
                min_scale=1.0,
                guard_finite=True,
                refill=("backoff",),
            )
        )

    @property
    def initial_loss_scale(self) -> float:
        return self._initial

    @property
    def increment_period(self) -> int:
        return self._period

    @property
    def multiplier(self) -> float:
        return self._multiplier

    @property
    def good_steps(self) -> int:
        """Consecutive finite steps since the last change (TF's ``good_steps`` variable)."""
        return self._state.good_steps

    @property
    def state(self) -> LossScaleState:
        return self._state

    def __call__(self) -> float:
        return self._state.scale

    def update(self, grads: Any) -> tuple[None, bool]:
        return None, self._state.update(kernels.all_finite(grads))

    def counters(self) -> dict:
        """The state machine's counters: ``steps`` (updates taken), ``skipped`` (those
        with NaN/Inf), ``good_steps`` and the rest of ``LossScaleState.counters()``."""
        return self._state.counters()

    def get_config(self) -> dict:
        return {
            "initial_loss_scale": self._initial,
            "increment_period": self._period,
            "multiplier": self._multiplier,
        }

    def state_dict(self) -> dict:
        """The v1 state (JSON-safe): policy, scale, counters and this object's config."""
        return self._state.state_dict(config=self.get_config())

    def load_state_dict(self, d: dict) -> None:
        """Take a v1 state saved by the same policy (works before the first update)."""
        self._state.load_state_dict(d, same_policy=True)

    def __repr__(self) -> str:
        return (
            f"DynamicLossScale(current_loss_scale={self()}, num_good_steps="
            f"{self.good_steps}, initial_loss_scale={self._initial}, increment_period="
            f"{self._period}, multiplier={self._multiplier})"
        )


@overload
def get(identifier: None) -> None: ...
@overload
def get(identifier: LossScale | SupportsFloat | str | dict) -> LossScale: ...
def get(identifier: Any) -> LossScale | None:
    """A LossScale from an identifier, as TF's ``get``.

    A number gives ``FixedLossScale(number)`` (True gives 1.0); ``"dynamic"``
    gives ``DynamicLossScale()``; a LossScale is returned as is; None gives
    None; a ``{"class_name", "config"}`` dict (the TF <= 2.3 Keras
    serialisation) is deserialised.  NumPy real scalars count as numbers.
    """
    if isinstance(identifier, (int, float, np.integer, np.floating, np.bool_)):
        return FixedLossScale(identifier)
    if isinstance(identifier, str) and identifier == "dynamic":
        return DynamicLossScale()
    if isinstance(identifier, LossScale):
        return identifier
    if identifier is None:
        return None
    if isinstance(identifier, dict) and set(identifier) == {"class_name", "config"}:
        classes: dict[str, type[LossScale]] = {
            "FixedLossScale": FixedLossScale,
            "DynamicLossScale": DynamicLossScale,
        }
        cls = classes.get(identifier["class_name"])
        if cls is not None:
            return cls.from_config(identifier["config"])
    raise ValueError(f"Could not interpret loss scale identifier: {identifier}")
