"""TF1-shaped loss-scale managers (``tf.contrib.mixed_precision``).

Code written against ``LossScaleManager.get_loss_scale()`` and
``update_loss_scale(finite_grads)`` keeps working after its import lines are
switched to lscore.  Scales are Python floats holding float32 values.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from lscore.policy import (
    Policy,
    factor_at_least_one,
    fixed_scale,
    fraction,
    growth_interval,
    integer,
    positive_scale,
)
from lscore.state import LossScaleState, as_finite

__all__ = ["ExponentialUpdateLossScaleManager", "FixedLossScaleManager", "LossScaleManager"]


class LossScaleManager(abc.ABC):
    """Abstract TF1 loss-scale manager."""

    @abc.abstractmethod
    def get_loss_scale(self) -> float:
        """The loss scale to use for this step."""

    @abc.abstractmethod
    def update_loss_scale(self, finite_grads: Any) -> None:
        """Tell the manager whether this step's gradients were all finite."""


class FixedLossScaleManager(LossScaleManager):
    """A constant loss scale.  The TF1 LossScaleOptimizer still skips non-finite steps."""

    def __init__(self, loss_scale: float) -> None:
        self._value = fixed_scale("loss_scale", loss_scale, "loss scale must be at least 1.")
        self._scale32 = float(np.float32(self._value))
        # the TF1 LossScaleOptimizer skips a non-finite step even with a fixed scale
        self._state = LossScaleState(
            Policy(name="tf1_fixed", init_scale=self._value, growth_mode="never")
        )

    def get_loss_scale(self) -> float:
        return self._scale32

    def update_loss_scale(self, finite_grads: Any) -> None:
        self._state.update(as_finite(finite_grads, "finite_grads"))

    def state_dict(self) -> dict:
        """The v1 state: the scale, the number of updates and of skipped ones."""
        return self._state.state_dict(config={"loss_scale": self._value})

    def load_state_dict(self, d: dict) -> None:
        self._state.load_state_dict(d, same_policy=True)
        self._scale32 = self._state.scale

    def __repr__(self) -> str:
        return f"FixedLossScaleManager({self._value})"


class ExponentialUpdateLossScaleManager(LossScaleManager):
    """TF1's exponential policy: grow after a run of good steps, shrink after bad ones.

    In float32, as TF1 computes it::

        if finite:
            if good_steps + 1 >= incr_every_n_steps:
                new = scale * incr_ratio
                if new is finite: scale = new
                good_steps = bad_steps = 0
            else:
                good_steps += 1                   # bad_steps is NOT reset
        else:
            if bad_steps + 1 >= decr_every_n_nan_or_inf:
                scale = max(1, scale * decr_ratio)
                good_steps = bad_steps = 0
            else:
                bad_steps += 1; good_steps = 0

    Bad steps accumulate (they need not be consecutive) until the scale changes.
    """

    def __init__(
        self,
        init_loss_scale: float,
        incr_every_n_steps: int,
        decr_every_n_nan_or_inf: int = 2,
        incr_ratio: float = 2,
        decr_ratio: float = 0.8,
    ) -> None:
        self._init = positive_scale("init_loss_scale", init_loss_scale)
        self._incr_n = growth_interval("incr_every_n_steps", incr_every_n_steps)
        self._decr_n = integer("decr_every_n_nan_or_inf", decr_every_n_nan_or_inf, minimum=1)
        self._incr_ratio = factor_at_least_one("incr_ratio", incr_ratio)
        self._decr_ratio = fraction("decr_ratio", decr_ratio)
        self._state = LossScaleState(
            Policy(
                name="tf1",
                init_scale=self._init,
                growth_factor=self._incr_ratio,
                backoff_factor=self._decr_ratio,
                growth_interval=self._incr_n,
                hysteresis=self._decr_n,
                precision="float32",
                growth_mode="ge",
                backoff_mode="multiply",
                min_scale=1.0,
                guard_finite=True,
                refill=("growth", "backoff"),
            )
        )

    def get_loss_scale(self) -> float:
        return self._state.scale

    def update_loss_scale(self, finite_grads: Any) -> None:
        self._state.update(as_finite(finite_grads, "finite_grads"))

    @property
    def good_steps(self) -> int:
        return self._state.good_steps

    @property
    def bad_steps(self) -> int:
        return self._decr_n - self._state.hysteresis_left

    @property
    def state(self) -> LossScaleState:
        return self._state

    def counters(self) -> dict:
        """The state machine's counters (``steps``, ``skipped``, ...)."""
        return self._state.counters()

    def state_dict(self) -> dict:
        """The v1 state (JSON-safe); bad_steps is hysteresis - hysteresis_left."""
        return self._state.state_dict(
            config={
                "init_loss_scale": self._init,
                "incr_every_n_steps": self._incr_n,
                "decr_every_n_nan_or_inf": self._decr_n,
                "incr_ratio": self._incr_ratio,
                "decr_ratio": self._decr_ratio,
            }
        )

    def load_state_dict(self, d: dict) -> None:
        """Take a v1 state saved by the same policy (works before the first update)."""
        self._state.load_state_dict(d, same_policy=True)

    def __repr__(self) -> str:
        return (
            f"ExponentialUpdateLossScaleManager(loss_scale={self.get_loss_scale()}, "
            f"good_steps={self.good_steps}, bad_steps={self.bad_steps})"
        )
