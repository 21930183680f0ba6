"""The NumPy and CuPy adapters' LossScaleOptimizer: ``LossScaleOptimizerBase``.

Its methods work through an ``xp`` namespace bound by the adapter (``numpy`` or
``cupy``).  ``_wrapper.TFShaped``, the base every adapter's wrapper shares (torch's
too), takes the constructor's arguments and resolves their shape (``_scaling``);
the gradient lists are checked by ``_grads``; SGD and Adam are in ``_sgd_adam``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from lscore.adapters._grads import (
    check_gradient_dtypes,
    check_variable_dtypes,
    drop_none_gradients,
    grad_var_pairs,
    loss_and_grads,
)
from lscore.adapters._scaling import scaling_kwargs_from_config
from lscore.adapters._wrapper import TFShaped, inner_attribute, load_checked, run_step, type_name
from lscore.distributed import reduce_found_inf
from lscore.policy import boolean, integer, inverse_scale

OPTIMIZER_FORMAT = "lscore.optimizer/1"
_OPTIMIZER_KEYS = (
    "format",
    "shape",
    "iterations",
    "last_step_skipped",
    "monitor_steps",
    "loss_scale",
    "optimizer",
)


def quiet() -> Any:
    """Overflow to inf when a scale is cast to float16 is intended (TF does the same)."""
    return np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore")


def _times(x: Any, factor: float) -> Any:
    """`x * factor` with the factor cast to x's dtype first, as TF casts the scale."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return x * factor
    with quiet():
        return x * np.dtype(dtype).type(factor)


def _host(a: Any) -> Any:
    """A NumPy view or copy of an array of any array module (CuPy: copied to the host)."""
    get = getattr(a, "get", None)
    return get() if callable(get) and not isinstance(a, np.ndarray) else np.asarray(a)


class LossScaleOptimizerBase(TFShaped):
    """Wraps an optimizer with loss scaling; the adapters bind it to an array module.

    ``LossScaleOptimizer(optimizer, loss_scale=None, *, dynamic=True,
    initial_scale=None, dynamic_growth_steps=None, loss_scale_manager=None,
    reducer=None, allow_fp16_params=False)`` takes one of three shapes: Keras 2
    (no ``loss_scale``, or a bool taken as ``dynamic``: tf-keras's LossScaleOptimizer,
    where a skipped step still advances ``iterations``), TF <= 2.3 (``loss_scale`` a
    number, ``"dynamic"`` or a ``LossScale``) or TF1 (a ``LossScaleManager``, passed
    positionally or as ``loss_scale_manager=``; a skipped step does not count).

    The wrapped optimizer needs one method, ``apply_gradients(grads_and_vars)``,
    that updates the variables in place; if it has an ``iterations`` attribute
    the wrapper reads and advances it (a skipped step counts in the Keras
    shape), otherwise the wrapper keeps its own count.  Gradients come from
    your own backward pass, seeded with the loss scale:

    - by hand: ``get_scaled_loss(loss)`` (or seed your backprop with
      ``loss_scale``), ``get_unscaled_gradients(grads)``, then
      ``apply_gradients(zip(grads, vars))``, which checks the gradients for
      NaN/Inf, updates the scale and applies or skips the step;
    - or ``minimize(loss_and_grads_fn, var_list)``: ``loss_and_grads_fn(scale)``
      returns ``(loss, grads)``, where ``grads`` are the gradients of
      ``loss * scale`` with respect to ``var_list`` (your backprop, seeded with
      ``scale`` cast to the loss dtype instead of 1).

    float16 variables are refused with advice (keep float32 master weights), as
    the torch ``GradScaler`` refuses float16 parameters, unless
    ``allow_fp16_params=True``.

    ``reducer`` (an ``lscore.distributed`` reducer, or any object with
    ``reduce(found_inf, stats=None) -> (found_inf, stats)``) makes the
    non-finite verdict the OR over all workers, so every worker skips the
    same steps; each worker must then call ``apply_gradients`` once per step.
    """

    _xp: Any = None  # the array module, set by the adapter
    _all_finite: Any = None  # the adapter's all_finite, set as a staticmethod
    _optimizer_classes: ClassVar[dict[str, type]] = {}

    def _configure(self, *, reducer: Any = None, allow_fp16_params: Any = False) -> None:
        self._allow_fp16 = boolean("allow_fp16_params", allow_fp16_params)

    def _start(self) -> None:
        self._own_iterations = 0

    @property
    def iterations(self) -> int:
        if hasattr(self._optimizer, "iterations"):
            return self._optimizer.iterations
        return self._own_iterations

    @iterations.setter
    def iterations(self, value: Any) -> None:
        if hasattr(self._optimizer, "iterations"):
            self._optimizer.iterations = value
        else:
            self._own_iterations = value

    def _advance_iterations(self) -> None:
        if hasattr(self._optimizer, "iterations"):
            self._optimizer.iterations += 1
        else:
            self._own_iterations += 1

    learning_rate = inner_attribute("learning_rate")
    clipnorm = inner_attribute("clipnorm")
    clipvalue = inner_attribute("clipvalue")
    global_clipnorm = inner_attribute("global_clipnorm")

    # -- scaling ------------------------------------------------------------------
    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * scale``, the scale cast to the loss dtype (a float16 loss can become inf).

        A callable loss gives a callable that scales its result when called.
        """
        if callable(loss):
            return lambda: self.get_scaled_loss(loss())
        return _times(loss, self._scaling.scale)

    def get_unscaled_gradients(self, grads: Any) -> list:
        """Each gradient times the float32 reciprocal of the scale (in its dtype); None kept."""
        grads = list(grads)
        check_gradient_dtypes(grads)
        inv = inverse_scale(self._scaling.scale)
        return [None if g is None else _times(g, inv) for g in grads]

    # -- the step -----------------------------------------------------------------
    def _in_place_counter(self, global_step: Any) -> Any:
        """In-place ``add(delta)`` for a 0-d integer array of this adapter's array module."""
        if not isinstance(global_step, self._xp.ndarray):
            return None
        if global_step.ndim != 0 or global_step.dtype.kind not in "iu":
            # tf.train.get_global_step refuses a global_step that is not an integer scalar
            raise TypeError(
                f"global_step must be a 0-d integer array, got shape "
                f"{global_step.shape} and dtype {global_step.dtype}"
            )
        if not getattr(global_step.flags, "writeable", True):
            raise ValueError("global_step is read-only; it is incremented in place")

        def add(delta: Any) -> None:
            global_step[...] += delta

        return add

    def _counter_description(self) -> str:
        return f"a 0-d integer {self._xp.__name__}.ndarray"

    def apply_gradients(
        self, grads_and_vars: Any, global_step: Any = None, name: Any = None
    ) -> bool:
        """Check the (unscaled) gradients, update the scale, then apply or skip the step.

        Returns True when the step was applied (TF1 returns the op that applies
        it).  None gradients are dropped (with a warning, except in the TF1
        shape); all None is a ValueError.  ``global_step``, as in TF1, is
        advanced by one when the step is applied and left alone when it is
        skipped: a 0-d integer array of this adapter's array module
        (incremented in place) or any object with ``assign_add``; a Python int
        is refused, it cannot change in place.  ``name`` (TF1's name for the
        returned op) must be a str or None and has no other effect.
        """
        finish = self._finisher(global_step, name)
        pairs = grad_var_pairs(grads_and_vars)
        if pairs:
            pairs = drop_none_gradients(pairs, warn=self._scaling.shape != "tf1")
        check_variable_dtypes([v for _, v in pairs], self._allow_fp16)
        grads = [g for g, _ in pairs]
        check_gradient_dtypes(grads)
        finite = not reduce_found_inf(self._reducer, not self._all_finite(grads))
        applied, _ = run_step(
            self,
            finite,
            apply=lambda: self._optimizer.apply_gradients(pairs),
            count=self._count_step,
            grads=lambda: grads,
            named_arrays=lambda m: [
                (m.name_of(v, f"var{i}"), _host(g)) for i, (g, v) in enumerate(pairs)
            ],
        )
        return finish(applied)

    _last_applied = True

    def _finisher(self, global_step: Any, name: Any) -> Any:
        """Check ``apply_gradients``'s TF1 arguments; returns ``finish(applied)``, which
        records the step's result (``last_step_skipped``), advances ``global_step`` when
        the step was applied and returns `applied`."""
        advance = self._tf1_step_arguments(global_step, name)

        def finish(applied: Any) -> Any:
            self._last_applied = applied
            advance(applied)
            return applied

        return finish

    @property
    def last_step_skipped(self) -> Any:
        """Whether the last ``apply_gradients`` (or ``minimize``) skipped its step.

        A bool; in the CuPy adapter's sync-free mode a 0-d device bool, so
        that recording it costs no sync (reading it on the host is one).
        """
        applied = self._last_applied
        if isinstance(applied, (bool, np.bool_)):
            return not applied
        return self._xp.logical_not(applied)

    def _count_step(self, applied: bool) -> None:
        """An inner optimizer with ``iterations`` counted an applied step itself."""
        if not applied or not hasattr(self._optimizer, "iterations"):
            self._advance_iterations()

    def _scaled_gradients(self, loss_and_grads_fn: Any, var_list: Any) -> Any:
        loss, grads, var_list = loss_and_grads(
            loss_and_grads_fn, var_list, self._scaling.scale, self._xp
        )
        return loss, list(zip(self.get_unscaled_gradients(grads), var_list, strict=True))

    def compute_gradients(self, loss_and_grads_fn: Any, var_list: Any) -> list:
        """Unscaled (gradient, variable) pairs from ``loss_and_grads_fn(scale) -> (loss, grads)``.

        ``grads`` must be the gradients of ``loss * scale``: run your backward
        pass seeded with ``scale`` (cast to the loss dtype) instead of 1.
        """
        return self._scaled_gradients(loss_and_grads_fn, var_list)[1]

    def minimize(
        self, loss_and_grads_fn: Any, var_list: Any, *, global_step: Any = None, name: Any = None
    ) -> Any:
        """``compute_gradients`` then ``apply_gradients`` (which takes ``global_step`` and
        ``name``); returns the loss the function gave."""
        self._tf1_step_arguments(global_step, name)  # refuse before the backward pass
        loss, pairs = self._scaled_gradients(loss_and_grads_fn, var_list)
        self.apply_gradients(pairs, global_step=global_step, name=name)
        return loss

    # -- checkpoints --------------------------------------------------------------
    def _before_checkpoint(self) -> None:
        """Bring state kept elsewhere (a device) to the host before state_dict()."""

    def _after_load(self) -> None:
        """Send the loaded host state where the steps read it (a device)."""

    def state_dict(self) -> dict:
        """The optimizer's state, ``"lscore.optimizer/1"``: JSON-safe scalars, the inner
        optimizer's slots as arrays.

        Keys: ``format``, ``shape`` (keras, experimental or tf1), ``iterations``,
        ``last_step_skipped``, ``monitor_steps`` (the overflow monitor's step count),
        ``loss_scale`` (the scale's v1 state, None for a fixed Keras scale) and
        ``optimizer`` (the inner optimizer's ``state_dict()``, None when it has none).
        Save it with pickle or ``numpy.savez``-style tools; ``load_state_dict`` on a
        LossScaleOptimizer built the same way resumes the run exactly.
        """
        self._before_checkpoint()
        holder = self._scale_holder()
        inner = self._optimizer
        last = self.last_step_skipped
        return {
            "format": OPTIMIZER_FORMAT,
            "shape": self._scaling.shape,
            "iterations": int(self.iterations),
            "last_step_skipped": bool(last),
            "monitor_steps": self._monitor_steps,
            "loss_scale": None if holder is None else holder.state_dict(),
            "optimizer": (
                inner.state_dict() if callable(getattr(inner, "state_dict", None)) else None
            ),
        }

    def load_state_dict(self, state_dict: Any) -> None:
        """Take a ``state_dict()`` of a LossScaleOptimizer of the same shape around the same
        kind of optimizer; everything is checked before anything changes.  The inner
        optimizer's slots are bound to the variables in the order of the saving run's
        first step (see the inner optimizer's ``load_state_dict``)."""
        d = state_dict
        if not isinstance(d, dict):
            raise TypeError(f"state_dict must be a dict, got {type_name(d)}")
        fmt = d.get("format")
        if fmt != OPTIMIZER_FORMAT:
            hint = ""
            if fmt == "lscore.state/1":
                hint = ": that is a loss scale's state (load it into the LossScale or manager)"
            elif "param_groups" in d:
                hint = ": that is a torch optimizer's state dict"
            raise ValueError(
                f"unknown optimizer state format {fmt!r}; this LossScaleOptimizer "
                f"understands {OPTIMIZER_FORMAT!r}{hint}"
            )
        unknown = sorted(set(d) - set(_OPTIMIZER_KEYS))
        missing = [k for k in _OPTIMIZER_KEYS if k not in d]
        if unknown or missing:
            raise ValueError(
                f"a {OPTIMIZER_FORMAT} state has the keys {list(_OPTIMIZER_KEYS)}; "
                f"got unknown {unknown} and missing {missing}"
            )
        if d["shape"] != self._scaling.shape:
            raise ValueError(
                f"the state's loss scaling has the {d['shape']!r} shape; this optimizer "
                f"has {self._scaling.shape!r}"
            )
        holder, inner = self._scale_holder(), self._optimizer
        if (d["loss_scale"] is None) != (holder is None):
            raise ValueError(
                "the state's loss scale and this optimizer's differ in kind (fixed vs dynamic)"
            )
        load_inner = getattr(inner, "load_state_dict", None)
        if d["optimizer"] is not None and not callable(load_inner):
            raise TypeError(
                f"the state holds an optimizer state, but the inner optimizer "
                f"{type_name(inner)} has no load_state_dict()"
            )
        iterations = integer("iterations", d["iterations"], minimum=0)
        monitor_steps = integer("monitor_steps", d["monitor_steps"], minimum=0)
        last = d["last_step_skipped"]
        if not isinstance(last, bool):
            raise TypeError(f"last_step_skipped must be a bool, got {last!r}")
        spec = d["optimizer"]
        name = spec.get("class_name") if isinstance(spec, dict) else None
        if name is not None and name != type(inner).__name__:
            raise ValueError(
                f"the state was saved around {name!r}; this LossScaleOptimizer wraps "
                f"{type(inner).__name__!r}"
            )
        load_checked(holder, d["loss_scale"], lambda: spec is None or inner.load_state_dict(spec))
        self.iterations = iterations
        self._monitor_steps = monitor_steps
        self._last_applied = not last
        self._after_load()

    # -- configuration ------------------------------------------------------------
    def get_config(self) -> dict:
        """tf-keras's keys in the Keras shape; TF <= 2.3's (and TF1's) otherwise."""
        inner = self._optimizer
        if not callable(getattr(inner, "get_config", None)):
            raise TypeError(f"the inner optimizer {type_name(inner)} has no get_config()")
        spec = {"class_name": type(inner).__name__, "config": inner.get_config()}
        key = "inner_optimizer" if self._scaling.shape == "keras" else "optimizer"
        return {key: spec, **self._scaling.get_config()}

    @classmethod
    def from_config(cls, config: dict, custom_objects: Any = None) -> Any:
        """Rebuild from ``get_config()``; ``custom_objects`` maps class names to your optimizers."""
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        key = "inner_optimizer" if "inner_optimizer" in config else "optimizer"
        allowed = {
            key,
            "dynamic",
            "initial_scale",
            "dynamic_growth_steps",
            "loss_scale",
            "loss_scale_manager",
        }
        unknown = sorted(set(config) - allowed)
        if unknown or key not in config:
            raise ValueError(
                f"not a LossScaleOptimizer config: unknown keys {unknown}"
                if unknown
                else "config has no 'inner_optimizer' or 'optimizer'"
            )
        spec = config[key]
        classes = {**cls._optimizer_classes, **(custom_objects or {})}
        if not isinstance(spec, dict) or spec.get("class_name") not in classes:
            raise ValueError(
                f"cannot deserialise the optimizer {spec!r}; known classes: "
                f"{', '.join(classes)} (pass others in custom_objects)"
            )
        opt_cls = classes[spec["class_name"]]
        make = getattr(opt_cls, "from_config", None)
        inner = make(dict(spec["config"])) if make else opt_cls(**spec["config"])
        return cls(inner, **scaling_kwargs_from_config(config))
