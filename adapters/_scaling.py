"""The loss-scale side of every LossScaleOptimizer wrapper: its three shapes, resolved once.

Every adapter's ``LossScaleOptimizer(optimizer, loss_scale=None, *, dynamic=True,
initial_scale=None, dynamic_growth_steps=None, loss_scale_manager=None)`` has
three shapes, told apart by its arguments:

- ``keras``: no ``loss_scale`` (or a bool, taken as ``dynamic``): tf-keras's
  LossScaleOptimizer (TF >= 2.4).  Dynamic means TF's DynamicLossScale rule
  with multiplier 2; a fixed scale applies every step, NaN or not; a skipped
  step still advances ``iterations``.
- ``experimental``: ``loss_scale`` a number, ``"dynamic"`` or a ``LossScale``
  (TF <= 2.3's ``mixed_precision.experimental.LossScaleOptimizer``), resolved by
  ``lscore.get``; a skipped step does not advance ``iterations``.
- ``tf1``: a ``LossScaleManager`` (``tf.contrib.mixed_precision``), passed
  positionally or as ``loss_scale_manager=``.  The optimizer checks
  finiteness itself, so even a fixed manager skips non-finite steps; a skipped
  step does not advance the step counter.

``resolve_loss_scaling`` turns a wrapper's arguments into a ``LossScaling``: the
current scale, ``update(finite) -> should_apply``, whether a skipped step advances
``iterations``, and the config.  It knows no array type.
"""

from __future__ import annotations

import copy
import numbers
from typing import Any

import numpy as np

from lscore.loss_scale import DynamicLossScale, FixedLossScale, LossScale, get
from lscore.managers import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    LossScaleManager,
)
from lscore.policy import growth_interval, positive_scale
from lscore.presets import ManagerPreset

SHAPES = ("keras", "experimental", "tf1")
KERAS_DEFAULT_INITIAL_SCALE = 2.0**15
KERAS_DEFAULT_GROWTH_STEPS = 2000


def _overrides(obj: Any, base: Any, name: str) -> bool:
    return getattr(type(obj), name) is not getattr(base, name)


class LossScaling:
    """The loss-scale side of one LossScaleOptimizer, whatever its shape.

    Built by ``resolve_loss_scaling``.  ``update(finite)`` advances the scale and
    returns whether the step's gradients are applied; when ``predictable`` is
    True the answer is known beforehand from ``should_apply(finite)`` alone, so
    a wrapper can run the inner optimizer first and update the scale only once
    that has succeeded (a failed call then changes nothing).
    """

    __slots__ = (
        "_dynamic_ls",
        "_fixed_scale",
        "_growth_steps",
        "_initial",
        "_loss_scale",
        "_manager",
        "shape",
    )

    def __init__(
        self,
        shape: Any,
        *,
        dynamic_ls: Any = None,
        fixed_scale: Any = None,
        loss_scale: Any = None,
        manager: Any = None,
        initial: Any = None,
        growth_steps: Any = None,
    ) -> None:
        self.shape = shape
        self._dynamic_ls = dynamic_ls  # an lscore DynamicLossScale driven by finite flags
        self._fixed_scale = fixed_scale  # Keras fixed: float32 value, never changes
        self._loss_scale = loss_scale  # experimental shape: the LossScale object
        self._manager = manager  # tf1 shape: the LossScaleManager
        self._initial = initial
        self._growth_steps = growth_steps

    # -- what the wrappers read --------------------------------------------------
    @property
    def scale(self) -> float:
        """The current loss scale (a Python float holding a float32 value)."""
        if self._dynamic_ls is not None:
            return self._dynamic_ls()
        if self._fixed_scale is not None:
            return self._fixed_scale
        if self._manager is not None:
            return float(self._manager.get_loss_scale())
        return float(self._loss_scale())

    @property
    def dynamic_loss_scale(self) -> Any:
        """The Keras shape's DynamicLossScale, driven by finite flags; None otherwise."""
        return self._dynamic_ls

    @property
    def skip_advances_iterations(self) -> bool:
        """Keras 2 counts a skipped step in ``iterations``; TF <= 2.3 and TF1 do not."""
        return self.shape == "keras"

    @property
    def dynamic(self) -> bool:
        if self.shape == "keras":
            return self._dynamic_ls is not None
        obj = self._manager if self.shape == "tf1" else self._loss_scale
        return not isinstance(obj, (FixedLossScale, FixedLossScaleManager))

    @property
    def dynamic_counter(self) -> Any:
        """Consecutive finite steps counted toward the next growth; None when not known."""
        if self._dynamic_ls is not None:
            return self._dynamic_ls.good_steps
        obj = self._manager if self.shape == "tf1" else self._loss_scale
        if isinstance(obj, (DynamicLossScale, ExponentialUpdateLossScaleManager)):
            return obj.good_steps
        return None

    @property
    def initial_scale(self) -> Any:
        return self._initial

    @property
    def dynamic_growth_steps(self) -> Any:
        return self._growth_steps

    @property
    def loss_scale_object(self) -> Any:
        """The user's LossScale (experimental shape) or LossScaleManager (tf1), else None."""
        return self._manager if self.shape == "tf1" else self._loss_scale

    # -- the transition ----------------------------------------------------------
    @property
    def predictable(self) -> bool:
        """True when should_apply(finite) is known without running the update."""
        if self.shape != "experimental":
            return True  # Keras: finite (dynamic) or always (fixed); tf1: finite
        ls = self._loss_scale
        return (
            isinstance(ls, DynamicLossScale) and not _overrides(ls, DynamicLossScale, "update")
        ) or (isinstance(ls, FixedLossScale) and not _overrides(ls, FixedLossScale, "update"))

    def should_apply(self, finite: bool) -> bool:
        """Whether a step with this finiteness is applied (only when ``predictable``)."""
        if self._fixed_scale is not None or isinstance(self._loss_scale, FixedLossScale):
            return True  # TF's fixed LossScale applies every step, NaN included
        return bool(finite)

    def update(self, finite: bool, grads: Any = None) -> bool:
        """Advance the scale for one step; returns should_apply.

        `grads` (the unscaled gradients) reach only a user-defined LossScale,
        whose ``update(grads)`` decides by itself.
        """
        finite = bool(finite)
        if self._dynamic_ls is not None:
            return self._dynamic_ls.state.update(finite)
        if self._fixed_scale is not None:
            return True
        if self.shape == "tf1":
            self._manager.update_loss_scale(finite)
            return finite
        ls = self._loss_scale
        if self.predictable:
            if isinstance(ls, DynamicLossScale):
                return ls.state.update(finite)
            return True
        if grads is None:
            raise ValueError(
                f"{type(ls).__name__} is a user-defined LossScale; its "
                "update(grads) needs the gradients"
            )
        _, should_apply = ls.update(grads)
        return bool(should_apply)

    def checkpoint(self) -> Any:
        """A function that puts the scale state back as it is now.

        For the update-before-apply shapes (a user-defined LossScale): the
        wrappers restore it when the inner optimizer raises.  The object's own
        state_dict/load_state_dict is used when it has them, else a deep copy
        of its attributes.
        """
        obj = self._loss_scale if self.shape == "experimental" else self._manager
        if obj is None:
            return lambda: None
        save, load = getattr(obj, "state_dict", None), getattr(obj, "load_state_dict", None)
        if callable(save) and callable(load):
            saved = save()
            return lambda: load(saved)
        if hasattr(obj, "__dict__"):
            saved = copy.deepcopy(vars(obj))

            def restore() -> None:
                vars(obj).clear()
                vars(obj).update(saved)

            return restore
        return lambda: None

    # -- configuration -----------------------------------------------------------
    def get_config(self) -> dict:
        """The loss-scale part of the LossScaleOptimizer config (TF's keys)."""
        if self.shape == "keras":
            return {
                "dynamic": self.dynamic,
                "initial_scale": self._initial,
                "dynamic_growth_steps": self._growth_steps,
            }
        if self.shape == "experimental":
            ls = self._loss_scale
            return {"loss_scale": {"class_name": type(ls).__name__, "config": ls.get_config()}}
        m = self._manager
        if type(m) is FixedLossScaleManager:
            cfg = {"loss_scale": m.get_loss_scale()}
        elif type(m) is ExponentialUpdateLossScaleManager or isinstance(m, ManagerPreset):
            p = m.state.policy
            cfg = {
                "init_loss_scale": p.init_scale,
                "incr_every_n_steps": p.growth_interval,
                "decr_every_n_nan_or_inf": p.hysteresis,
                "incr_ratio": p.growth_factor,
                "decr_ratio": p.backoff_factor,
            }
        else:
            raise TypeError(
                f"{type(m).__name__} has no config: only lscore's "
                "FixedLossScaleManager and ExponentialUpdateLossScaleManager "
                "can be serialised"
            )
        # the "tf1" preset is ExponentialUpdateLossScaleManager's policy and arguments
        name = (
            "ExponentialUpdateLossScaleManager"
            if isinstance(m, ManagerPreset)
            else type(m).__name__
        )
        return {"loss_scale_manager": {"class_name": name, "config": cfg}}

    def __repr__(self) -> str:
        return f"LossScaling(shape={self.shape!r}, scale={self.scale!r}, dynamic={self.dynamic})"


_MANAGERS = {c.__name__: c for c in (FixedLossScaleManager, ExponentialUpdateLossScaleManager)}


def scaling_kwargs_from_config(config: dict) -> dict:
    """The LossScaleOptimizer keyword arguments that rebuild a ``LossScaling.get_config``.

    Takes the keys of any of the three shapes; returns what to pass next to
    the optimizer.  Other keys are left to the caller.
    """
    if "loss_scale_manager" in config:
        spec = config["loss_scale_manager"]
        if not isinstance(spec, dict) or set(spec) != {"class_name", "config"}:
            raise ValueError(
                f"loss_scale_manager must be a {{'class_name', 'config'}} dict, got {spec!r}"
            )
        cls = _MANAGERS.get(spec["class_name"])
        if cls is None:
            raise ValueError(
                f"unknown loss scale manager {spec['class_name']!r}; expected one "
                f"of: {', '.join(_MANAGERS)}"
            )
        return {"loss_scale_manager": cls(**spec["config"])}
    if "loss_scale" in config:
        return {"loss_scale": get(config["loss_scale"])}
    return {
        k: config[k] for k in ("dynamic", "initial_scale", "dynamic_growth_steps") if k in config
    }


def _keras_scaling(dynamic: Any, initial_scale: Any, dynamic_growth_steps: Any) -> LossScaling:
    """tf-keras's checks, in its order, plus lscore's range rules."""
    if not isinstance(dynamic, bool):
        raise TypeError(
            '"dynamic" argument to LossScaleOptimizer.__init__ must be a bool, '
            f"but got: {dynamic!r}"
        )
    if dynamic:
        initial = KERAS_DEFAULT_INITIAL_SCALE if initial_scale is None else initial_scale
        steps = KERAS_DEFAULT_GROWTH_STEPS if dynamic_growth_steps is None else dynamic_growth_steps
        initial = positive_scale("initial_scale", initial)
        # stricter than tf-keras, where 0 or a negative count doubles the scale every
        # step and 2.5 is truncated: a count of steps is an integer >= 1
        steps = growth_interval("dynamic_growth_steps", steps)
        return LossScaling(
            "keras",
            dynamic_ls=DynamicLossScale(initial, steps, 2.0),
            initial=initial,
            growth_steps=steps,
        )
    if initial_scale is None:
        raise ValueError('"initial_scale" must be specified if "dynamic" is False')
    initial = positive_scale("initial_scale", initial_scale)
    if dynamic_growth_steps is not None:
        raise ValueError(
            '"dynamic_growth_steps" must be None if "dynamic" is False, '
            f"but got: {dynamic_growth_steps}"
        )
    return LossScaling("keras", fixed_scale=float(np.float32(initial)), initial=initial)


def _tf1_scaling(manager: LossScaleManager) -> LossScaling:
    initial = float(manager.get_loss_scale())
    steps = None
    if isinstance(manager, (ExponentialUpdateLossScaleManager, ManagerPreset)):
        initial = manager.state.policy.init_scale
        steps = manager.state.policy.growth_interval
    return LossScaling("tf1", manager=manager, initial=initial, growth_steps=steps)


def _experimental_scaling(ls: LossScale) -> LossScaling:
    if isinstance(ls, DynamicLossScale):
        initial, steps = ls.initial_loss_scale, ls.increment_period
    else:
        initial, steps = float(ls()), None
    return LossScaling("experimental", loss_scale=ls, initial=initial, growth_steps=steps)


def resolve_loss_scaling(
    loss_scale: Any = None,
    *,
    dynamic: Any = True,
    initial_scale: Any = None,
    dynamic_growth_steps: Any = None,
    loss_scale_manager: Any = None,
) -> LossScaling:
    """Tell the three constructor shapes apart and validate them; see the module docstring.

    Raises TypeError or ValueError (tf-keras's messages for the Keras shape)
    before anything is built.
    """
    keras_defaults = dynamic is True and initial_scale is None and dynamic_growth_steps is None
    if isinstance(loss_scale, LossScaleManager) or loss_scale_manager is not None:
        if loss_scale_manager is not None and loss_scale is not None:
            raise TypeError(
                "pass the LossScaleManager once: as the second argument or as "
                "loss_scale_manager=, not both"
            )
        manager = loss_scale if loss_scale_manager is None else loss_scale_manager
        if not isinstance(manager, LossScaleManager):
            raise TypeError(
                "loss_scale_manager must be an lscore LossScaleManager, got "
                f"{type(manager).__module__}.{type(manager).__qualname__}"
            )
        if not keras_defaults:
            raise TypeError(
                "dynamic, initial_scale and dynamic_growth_steps belong to the "
                "Keras shape; with a LossScaleManager the manager sets the policy"
            )
        return _tf1_scaling(manager)
    if loss_scale is None or isinstance(loss_scale, (bool, np.bool_)):
        if loss_scale is not None:
            if dynamic is not True:
                raise TypeError(
                    "dynamic was given twice: as the second argument "
                    f"({loss_scale!r}) and as dynamic={dynamic!r}"
                )
            dynamic = loss_scale
        return _keras_scaling(dynamic, initial_scale, dynamic_growth_steps)
    if not keras_defaults:
        raise TypeError(
            "dynamic, initial_scale and dynamic_growth_steps belong to the Keras "
            "shape; with a loss_scale argument (TF <= 2.3 shape) the LossScale "
            "sets the policy"
        )
    if not isinstance(loss_scale, (str, numbers.Real, LossScale, dict)):
        raise TypeError(
            "loss_scale must be a number, 'dynamic', a LossScale or a "
            "LossScaleManager (or None or a bool for the Keras shape), got "
            f"{type(loss_scale).__module__}.{type(loss_scale).__qualname__}"
        )
    return _experimental_scaling(get(loss_scale))
