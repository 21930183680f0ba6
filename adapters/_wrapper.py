"""What every adapter's TF-shaped ``LossScaleOptimizer`` shares, NumPy's, CuPy's and torch's.

``TFShaped`` is their base: the one constructor (its checks and the resolution of
the three argument shapes), tf-keras's properties, TF1's ``global_step``
and ``name`` arguments, the holder of the scale state and pickling.  ``run_step``
is the one step loop (check -> update the scale -> apply or skip -> count) every
wrapper runs.  Nothing here knows an array type.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, ClassVar

import numpy as np

from lscore.adapters._scaling import LossScaling, resolve_loss_scaling
from lscore.distributed import check_reducer


def type_name(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


def check_inner_optimizer(
    optimizer: Any, wrapper_cls: Any, *, expected: str, is_optimizer: Any
) -> None:
    """tf-keras's checks on the wrapped optimizer, in its order.

    `is_optimizer(optimizer)` says whether the framework's protocol is met;
    `expected` describes that protocol in the TypeError.  A class is refused
    first: its ``apply_gradients`` is a function, so it would pass the
    protocol check, and marking it as wrapped would mark every instance.
    """
    if isinstance(optimizer, type):
        name = optimizer.__qualname__
        raise TypeError(
            f"optimizer must be an optimizer instance, got the class {name}: "
            f"pass an instance, e.g. LossScaleOptimizer({name}(...), ...)"
        )
    if not is_optimizer(optimizer):
        raise TypeError(
            f'"inner_optimizer" must be an instance of {expected}, but got: {optimizer}.'
        )
    if isinstance(optimizer, wrapper_cls):
        raise TypeError(
            f"LossScaleOptimizer cannot wrap another LossScaleOptimizer, but got: {optimizer}"
        )
    if getattr(optimizer, "_is_wrapped_by_loss_scale_optimizer", False):
        raise ValueError(
            '"inner_optimizer" is already wrapped by a LossScaleOptimizer. An '
            "optimizer can only be wrapped by a single LossScaleOptimizer"
        )


def run_step(
    wrapper: Any, finite: bool, *, apply: Any, count: Any, grads: Any, named_arrays: Any
) -> Any:
    """One step of any adapter's LossScaleOptimizer, once its gradients are checked.

    `wrapper` has ``_scaling`` (a LossScaling), ``overflow_monitor`` and
    ``_monitor_steps``.  The scale is updated from `finite` and the step is
    applied (``apply()``, the inner optimizer's step; its result is returned) or
    skipped; ``count(applied)`` advances the iterations right after an applied
    step, and after a skipped one in the Keras shape.  When the answer is
    ``predictable`` the inner step runs before the scale is updated, so a step
    that raises leaves the scale as it was; otherwise (a user-defined LossScale,
    whose ``update(grads())`` decides) the scale is restored when it raises.  The
    overflow monitor, if any, sees the step; ``named_arrays(monitor)`` gives its
    report the gradients of a skipped step.  Returns (applied, apply()'s result or None).
    """
    s = wrapper._scaling
    m = wrapper.overflow_monitor
    before = s.scale if m is not None else None
    if s.predictable:
        applied = s.should_apply(finite)
        result = _apply_or_skip(s, applied, apply, count)
        s.update(finite)
    else:
        restore = s.checkpoint()
        applied = s.update(finite, grads())
        try:
            result = _apply_or_skip(s, applied, apply, count)
        except BaseException:
            restore()  # the inner optimizer failed: the step leaves the scale unchanged
            raise
    if m is not None:
        m.observe(wrapper._monitor_steps, applied, before, s.scale, lambda: named_arrays(m))
        wrapper._monitor_steps += 1
    return applied, result


def _apply_or_skip(s: LossScaling, applied: bool, apply: Any, count: Any) -> Any:
    if applied:
        result = apply()
        count(True)
        return result
    if s.skip_advances_iterations:
        count(False)
    return None


def load_checked(holder: Any, scale_state: Any, load_rest: Any) -> None:
    """Load `scale_state` into `holder` (the loss scale, or None), then ``load_rest()``
    (the inner optimizer's state); if that raises, the scale state is put back, so a
    refused state changes neither.  The scale goes first: its load checks the policy."""
    before = None if holder is None else holder.state_dict()
    if holder is not None:
        holder.load_state_dict(scale_state)
    try:
        load_rest()
    except BaseException:
        if holder is not None:
            holder.load_state_dict(before)
        raise


def check_op_name(name: Any) -> None:
    """TF1's ``name`` names the op that ``apply_gradients`` returns; nothing here is
    an op, so the name is only checked."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {type_name(name)}")


def _no_advance(applied: Any) -> None:
    return None


def global_step_advancer(global_step: Any, in_place: Any, expected: str) -> Any:
    """Check TF1's ``global_step`` before a step; returns ``advance(applied)`` for after it.

    TF1's optimizers increment ``global_step`` inside the update they apply,
    so a skipped step leaves it as it was.  A counter is None, any object
    with ``assign_add`` (a TF-like variable), or what ``in_place(global_step)``
    recognises: it returns an in-place ``add(delta)``, or None for a type the
    adapter does not take.  `expected` names the adapter's counter in the
    TypeError.  ``applied`` is a bool, or a 0-d device boolean (sync-free
    CuPy), which is added as it is so that nothing waits for the device.
    """
    if global_step is None:
        return _no_advance
    assign_add = getattr(global_step, "assign_add", None)
    add = assign_add if callable(assign_add) else in_place(global_step)
    if add is None:
        if isinstance(global_step, (int, np.integer)):
            # TF1's global_step is a variable; a Python or NumPy integer is a copy
            raise TypeError(
                f"global_step must be a counter that can be incremented in place, "
                f"got the integer {global_step!r}: pass {expected} or an "
                "object with an assign_add method"
            )
        raise TypeError(
            f"unsupported global_step type {type_name(global_step)}; expected "
            f"{expected} or an object with an assign_add method"
        )

    def advance(applied: Any) -> None:
        if not isinstance(applied, (bool, np.bool_)):
            add(applied)
        elif applied:
            add(1)

    return advance


def inner_attribute(name: str, how: str = "get and set") -> property:
    """A property that reads and writes ``self._optimizer.<name>``: the
    wrapped optimizer's attribute, seen through the wrapper."""

    def fget(self: Any) -> Any:
        return getattr(self._optimizer, name)

    def fset(self: Any, value: Any) -> None:
        setattr(self._optimizer, name, value)

    return property(fget, fset, doc=f"The inner optimizer's ``{name}`` ({how}).")


def _constructor_signature(cls: type[TFShaped]) -> inspect.Signature:
    """``TFShaped.__init__``'s parameters up to `reducer`'s place, then ``cls._configure``'s:
    the signature a reader (help(), the API reference) sees for ``cls(...)``."""
    params = list(inspect.signature(TFShaped.__init__, eval_str=True).parameters.values())
    own = list(inspect.signature(cls._configure, eval_str=True).parameters.values())
    head = params[1 : [p.name for p in params].index("reducer")]
    return inspect.Signature([*head, *own[1:]])


class TFShaped:
    """The base of every adapter's TF-shaped ``LossScaleOptimizer``.

    A subclass names what it wraps (``_expected_optimizer``, ``_is_optimizer``), its own
    constructor keywords (``_configure``), what it sets up once built (``_start``) and its
    TF1 step counter (``_in_place_counter``, ``_counter_description()``).  ``_transient`` lists the
    attributes that a pickle leaves out because ``__setstate__`` rebuilds them.
    """

    _optimizer: Any
    _scaling: LossScaling
    _reducer: Any
    __signature__: ClassVar[inspect.Signature]
    _expected_optimizer: ClassVar[str] = (
        "an optimizer with an apply_gradients(grads_and_vars) method that updates arrays in place"
    )
    _transient: ClassVar[tuple[str, ...]] = ()

    #: an lscore.diagnostics.OverflowMonitor, or None: names the gradients that held
    #: NaN/Inf on every skipped step (the arrays are read only then)
    overflow_monitor = None
    _monitor_steps = 0

    @staticmethod
    def _is_optimizer(optimizer: Any) -> bool:
        return callable(getattr(optimizer, "apply_gradients", None))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = _constructor_signature(cls)

    def __init__(
        self,
        optimizer: Any,
        loss_scale: Any = None,
        *,
        dynamic: Any = True,
        initial_scale: Any = None,
        dynamic_growth_steps: Any = None,
        loss_scale_manager: Any = None,
        reducer: Any = None,
        **options: Any,
    ) -> None:
        """The one constructor of every adapter's wrapper: the adapter's own keywords
        (`options`, taken by ``_configure``) are checked first, then `optimizer` as tf-keras
        checks it; the arguments' shape is resolved into ``_scaling``, `reducer`
        (``lscore.distributed``: one verdict for all ranks) is kept, and ``_start()`` runs."""
        for key in options:
            if key not in type(self).__signature__.parameters:
                raise TypeError(
                    f"{type(self).__name__}() got an unexpected keyword argument {key!r}"
                )
        self._configure(reducer=reducer, **options)
        check_inner_optimizer(
            optimizer,
            TFShaped,
            expected=self._expected_optimizer,
            is_optimizer=self._is_optimizer,
        )
        self._scaling = resolve_loss_scaling(
            loss_scale,
            dynamic=dynamic,
            initial_scale=initial_scale,
            dynamic_growth_steps=dynamic_growth_steps,
            loss_scale_manager=loss_scale_manager,
        )
        self._reducer = check_reducer(reducer)
        self._optimizer = optimizer
        with contextlib.suppress(AttributeError):  # an optimizer with __slots__
            optimizer._is_wrapped_by_loss_scale_optimizer = True
        self._start()

    def _configure(self, *, reducer: Any = None) -> None:
        """Check and keep the adapter's own constructor keywords (none here).  Its
        parameters, `reducer` among them, follow ``loss_scale_manager`` in the class's
        signature."""

    def _start(self) -> None:
        """Set up what the adapter keeps beside the scaling, once the arguments passed."""

    # -- properties (tf-keras names) -------------------------------------------------
    @property
    def inner_optimizer(self) -> Any:
        return self._optimizer

    @property
    def loss_scaling(self) -> LossScaling:
        """The loss-scale side: shape, scale, update rule (a ``LossScaling``)."""
        return self._scaling

    @property
    def loss_scale(self) -> Any:
        """The current scale as a float; in the TF <= 2.3 shape the LossScale object, as TF."""
        if self._scaling.shape == "experimental":
            return self._scaling.loss_scale_object
        return self._scaling.scale

    @property
    def dynamic(self) -> bool:
        return self._scaling.dynamic

    @property
    def dynamic_counter(self) -> Any:
        return self._scaling.dynamic_counter

    @property
    def initial_scale(self) -> Any:
        return self._scaling.initial_scale

    @property
    def dynamic_growth_steps(self) -> Any:
        return self._scaling.dynamic_growth_steps

    # -- TF1's step arguments ---------------------------------------------------------
    def _in_place_counter(self, global_step: Any) -> Any:
        """In-place ``add(delta)`` for a ``global_step`` of the adapter's own type, or None."""
        return None

    def _counter_description(self) -> str:
        """The adapter's ``global_step`` type, as a TypeError names it."""
        raise NotImplementedError

    def _tf1_step_arguments(self, global_step: Any, name: Any) -> Any:
        """Check ``apply_gradients``'s TF1 arguments; returns ``advance(applied)``."""
        check_op_name(name)
        return global_step_advancer(
            global_step, self._in_place_counter, self._counter_description()
        )

    # -- checkpoints and pickles --------------------------------------------------------
    def _scale_holder(self) -> Any:
        """The object whose state_dict() holds the scale state, or None (Keras's fixed
        scale, or a user-defined LossScale without state_dict)."""
        s = self._scaling
        obj = s.dynamic_loss_scale if s.shape == "keras" else s.loss_scale_object
        return obj if callable(getattr(obj, "state_dict", None)) else None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._transient}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self._optimizer!r}, shape={self._scaling.shape!r}, "
            f"loss_scale={self._scaling.scale!r}, dynamic={self.dynamic})"
        )
