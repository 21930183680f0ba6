"""``LossScaleOptimizer``: TF/Keras-shaped loss scaling as a ``torch.optim.Optimizer``."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from lscore.adapters import _wrapper
from lscore.adapters.torch import _tf1
from lscore.adapters.torch._paths import GradUnscaler, named_grads
from lscore.adapters.torch._unscaler import GradDtypeError
from lscore.distributed import reduce_found_inf
from lscore.policy import integer, inverse_scale
from lscore.scan import not_float_error

# the keys of state_dict()["loss_scale"]
_LOSS_SCALE_KEYS = ("shape", "iterations", "last_step_skipped", "monitor_steps", "state")

_HOOK_DICTS = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


def _times(x: torch.Tensor, factor: float) -> torch.Tensor:
    """`x * factor` with the factor cast to x's dtype first, as TF casts the scale
    (a float16 loss times a scale above 65504 becomes inf, as in TF)."""
    return x * torch.tensor(factor, dtype=x.dtype, device=x.device)


class LossScaleOptimizer(_wrapper.TFShaped, torch.optim.Optimizer):
    """Loss scaling in the shape of TF/Keras's ``LossScaleOptimizer``, as a torch optimizer.

    ``LossScaleOptimizer(optimizer, loss_scale=None, *, dynamic=True,
    initial_scale=None, dynamic_growth_steps=None, loss_scale_manager=None)``
    wraps a ``torch.optim.Optimizer`` and shares its ``param_groups``, ``state``
    and ``defaults`` (LR schedulers, ``isinstance`` checks and checkpoint code
    see an optimizer).  The arguments take one of three shapes, as in every
    lscore adapter's ``LossScaleOptimizer``: Keras 2 (the default: dynamic,
    starting at 2**15, growing every 2000 finite steps; a skipped step still
    counts in ``iterations``), TF <= 2.3 (``loss_scale`` a number,
    ``"dynamic"`` or a ``LossScale``) or TF1 (a ``LossScaleManager``).

    A step::

        opt.zero_grad()
        opt.get_scaled_loss(loss).backward()
        opt.step()          # unscale, check, update the scale, apply or skip

    ``unscale_()`` may come first (to clip unscaled gradients); ``step()``
    returns what the inner step returns (the closure's loss when one is given),
    None when the step is skipped; ``last_step_skipped`` says which.

    TF1 training loops run unchanged on it: ``compute_gradients(loss,
    var_list)`` gives unscaled ``(gradient, variable)`` pairs without touching
    ``.grad``, ``apply_gradients(grads_and_vars, global_step=None, name=None)``
    checks them and applies or skips the step, advancing ``global_step`` only
    when the step is applied, and ``minimize(loss, global_step=None,
    var_list=None, ...)`` is the two in turn.

    ``reducer`` (``lscore.distributed.TorchReducer(process_group)`` or any
    object with ``reduce(found_inf, stats=None) -> (found_inf, stats)``) makes
    the found-inf verdict of ``unscale_`` the OR over all ranks.
    """

    # tf.compat.v1.train.Optimizer's values, which TF1 code passes as gate_gradients
    GATE_NONE, GATE_OP, GATE_GRAPH = _tf1.GATE_NONE, _tf1.GATE_OP, _tf1.GATE_GRAPH
    _expected_optimizer = "torch.optim.Optimizer"
    _in_place_counter = staticmethod(_tf1.tensor_counter)
    # rebuilt by __setstate__: the hooks, the unscaler and a pending unscale_()'s verdict
    _transient = (*_HOOK_DICTS, "_zero_grad_profile_name", "_unscaler", "_found")

    def _start(self) -> None:
        # not Optimizer.__init__: it would copy the groups instead of sharing them
        self._rebuild()
        self._iterations = 0
        self._last_step_skipped = False

    @staticmethod
    def _is_optimizer(optimizer: Any) -> bool:
        return isinstance(optimizer, torch.optim.Optimizer)

    def _counter_description(self) -> str:
        return "a 0-d integer torch.Tensor"

    def _rebuild(self) -> None:
        """The attributes a pickle leaves out (``_transient``)."""
        for name in _HOOK_DICTS:
            setattr(self, name, OrderedDict())
        self._unscaler = GradUnscaler()
        self._found: bool | None = None  # set by unscale_ until the step
        self._patch_step_function()

    # -- what torch code reads: the inner optimizer's groups, state and defaults --
    param_groups = _wrapper.inner_attribute("param_groups", "shared")
    state = _wrapper.inner_attribute("state", "shared")
    defaults = _wrapper.inner_attribute("defaults", "shared")

    def add_param_group(self, param_group: dict) -> None:
        self._optimizer.add_param_group(param_group)

    @property
    def iterations(self) -> int:
        """Steps taken (in the Keras shape skipped steps count too, as in tf-keras)."""
        return self._iterations

    @property
    def last_step_skipped(self) -> bool:
        return self._last_step_skipped

    # -- scaling ------------------------------------------------------------------
    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * scale``, the scale cast to the loss dtype; a callable gives a callable."""
        if callable(loss):
            return lambda: self.get_scaled_loss(loss())
        return _times(loss, self._scaling.scale)

    def _inv_scale(self) -> float:
        return inverse_scale(self._scaling.scale)

    def get_unscaled_gradients(self, grads: Any) -> list:
        """Each gradient times the float32 reciprocal of the scale (in its dtype); None kept.

        An integer or bool gradient is a TypeError (it cannot be unscaled)."""
        grads = list(grads)
        for i, g in enumerate(grads):
            if g is not None and not (g.dtype.is_floating_point or g.dtype.is_complex):
                raise GradDtypeError(
                    str(not_float_error("get_unscaled_gradients", f"gradient {i}", g.dtype))
                )
        inv = self._inv_scale()
        return [None if g is None else _times(g, inv) for g in grads]

    def unscale_(self) -> None:
        """Unscale the gradients in place and check them, before ``step()`` (e.g. to clip).

        The reciprocal is taken in float32 as TF does; float16/bfloat16
        gradients are multiplied in float32 and rounded once.
        """
        if self._found is not None:
            raise RuntimeError("unscale_() has already been called since the last step().")
        found = self._unscaler(self._optimizer.param_groups, self._inv_scale(), True)
        self._found = reduce_found_inf(self._reducer, any(v.item() for v in found.values()))

    def step(self, closure: Any = None) -> Any:
        """Unscale (unless done), check for NaN/Inf, update the scale, then run or skip the
        inner step; returns what the inner step returns, None when it is skipped.

        With a closure (as ``LBFGS`` needs one): the closure backpropagates the
        scaled loss (``opt.get_scaled_loss(loss).backward()``) and returns the
        loss.  The wrapper calls it once, unscales and checks the gradients and
        decides from them, as for any step; the inner step then gets a closure
        whose first call returns that loss (the gradients are already there and
        unscaled) and whose later calls (LBFGS's re-evaluations) run the closure
        again and unscale its gradients with the same scale, so the inner
        optimizer sees the loss and gradients in the same, unscaled units.
        ``step(closure)`` returns the closure's loss (None when skipped).
        """
        if closure is not None:
            loss, closure = self._closure_step(closure)
        if self._found is None:
            self.unscale_()
        apply = self._optimizer.step if closure is None else lambda: self._optimizer.step(closure)
        applied, ret = _wrapper.run_step(
            self,
            not self._found,
            apply=apply,
            count=self._count_step,
            grads=lambda: [
                p.grad for g in self.param_groups for p in g["params"] if p.grad is not None
            ],
            named_arrays=lambda m: named_grads(m, [self.param_groups]),
        )
        self._found = None
        self._last_step_skipped = not applied
        if not applied:
            return None
        return loss if closure is not None else ret

    def _closure_step(self, closure: Any) -> Any:
        """(the loss of a first call of `closure`, with its gradients unscaled and checked;
        the closure for the inner step, whose first call returns that loss)."""
        with torch.enable_grad():
            loss = closure()
        self._found = None  # the closure computed new gradients
        self.unscale_()
        first = [loss]

        def inner_closure() -> Any:
            if first:
                return first.pop()
            with torch.enable_grad():
                again = closure()
            self._unscaler(self._optimizer.param_groups, self._inv_scale(), True)
            return again

        return loss, inner_closure

    # -- TF1's training-loop methods ------------------------------------------------
    def compute_gradients(
        self,
        loss: Any,
        var_list: Any = None,
        gate_gradients: Any = GATE_OP,
        aggregation_method: Any = None,
        colocate_gradients_with_ops: Any = False,
        grad_loss: Any = None,
    ) -> list:
        """TF1's ``compute_gradients``: the unscaled ``[(gradient, variable)]`` of `loss`.

        The loss (a tensor, or a callable returning one) is multiplied by the
        scale cast to its dtype, differentiated with ``torch.autograd.grad``
        (seeded with `grad_loss`, else ones, as TF sums a non-scalar loss) and
        each gradient is multiplied by the float32 reciprocal of the scale, as
        TF1's contrib optimizer does.  ``.grad`` is left alone; a variable the
        loss does not reach gets None, kept in its pair as in TF1.  `var_list`
        defaults to every parameter of the wrapped optimizer that requires
        grad.  ``gate_gradients`` and ``colocate_gradients_with_ops`` are
        checked and have no effect (eager autograd already computes every
        gradient before any is applied, each on its tensor's device);
        ``aggregation_method`` must be None.
        """
        _tf1.check_graph_options(gate_gradients, aggregation_method, colocate_gradients_with_ops)
        var_list = _tf1.trainable(self.param_groups, var_list)
        if callable(loss):
            with torch.enable_grad():
                loss = loss()
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                f"loss must be a tensor or a callable returning one, got {_wrapper.type_name(loss)}"
            )
        scaled = _times(loss, self._scaling.scale)
        seed = torch.ones_like(scaled) if grad_loss is None else grad_loss
        grads = torch.autograd.grad(scaled, var_list, grad_outputs=seed, allow_unused=True)
        return list(zip(self.get_unscaled_gradients(grads), var_list, strict=True))

    def apply_gradients(
        self, grads_and_vars: Any, global_step: Any = None, name: Any = None
    ) -> bool:
        """TF1's ``apply_gradients``: check the (unscaled) gradients, update the scale, then
        run or skip the inner step for these variables only.

        The gradients stand in ``.grad`` during the step (the other parameters'
        are None, so they do not move), then every ``.grad`` is put back as it
        was.  Iterations, ``last_step_skipped``, hooks and LR schedulers see an
        ordinary ``step()``.  ``global_step`` (a 0-d integer tensor, incremented
        in place, or any object with ``assign_add``) advances by one only when
        the step is applied, as in TF1; a Python int is refused.  ``name`` (TF1's
        name for the returned op) must be a str or None and has no other effect.
        Returns True when the step was applied (TF1 returns the op that applies it).
        """
        advance = self._tf1_step_arguments(global_step, name)
        pairs = _tf1.step_pairs(
            grads_and_vars, self.param_groups, warn=self._scaling.shape != "tf1"
        )
        if self._found is not None:
            raise RuntimeError(
                "apply_gradients() takes its own gradients, but unscale_() has "
                "been called since the last step()"
            )
        saved = [(p, p.grad) for g in self.param_groups for p in g["params"]]
        try:
            for p, _ in saved:
                p.grad = None
            for g, v in pairs:
                v.grad = g.detach()
            found = self._unscaler([{"params": [v for _, v in pairs]}], 1.0, True)
            self._found = reduce_found_inf(self._reducer, any(f.item() for f in found.values()))
            self.step()
        finally:
            self._found = None
            for p, g in saved:
                p.grad = g
        applied = not self._last_step_skipped
        advance(applied)
        return applied

    def minimize(
        self,
        loss: Any,
        global_step: Any = None,
        var_list: Any = None,
        gate_gradients: Any = GATE_OP,
        aggregation_method: Any = None,
        colocate_gradients_with_ops: Any = False,
        name: Any = None,
        grad_loss: Any = None,
    ) -> bool:
        """TF1's ``minimize``: ``compute_gradients`` then ``apply_gradients``; returns whether
        the step was applied."""
        self._tf1_step_arguments(global_step, name)  # refuse before the backward pass
        pairs = self.compute_gradients(
            loss,
            var_list,
            gate_gradients,
            aggregation_method,
            colocate_gradients_with_ops,
            grad_loss,
        )
        return self.apply_gradients(pairs, global_step=global_step, name=name)

    def _count_step(self, applied: bool) -> None:
        """A torch optimizer keeps no step count: the wrapper counts."""
        self._iterations += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)
        self._found = None

    # -- checkpoints --------------------------------------------------------------
    def state_dict(self) -> dict:
        """The inner optimizer's state dict plus ``"loss_scale"``: the shape, the
        iteration count, ``last_step_skipped``, the overflow monitor's step count
        (``monitor_steps``) and the v1 scale state (None for a fixed scale)."""
        d = self._optimizer.state_dict()
        holder = self._scale_holder()
        d["loss_scale"] = {
            "shape": self._scaling.shape,
            "iterations": self._iterations,
            "last_step_skipped": self._last_step_skipped,
            "monitor_steps": self._monitor_steps,
            "state": None if holder is None else holder.state_dict(),
        }
        return d

    def load_state_dict(self, state_dict: dict) -> None:
        """Take a dict from ``state_dict()``, or a plain torch optimizer state dict
        (the loss-scale state is then left as it is)."""
        d = dict(state_dict)
        ls = d.pop("loss_scale", None)
        holder = self._scale_holder()
        if ls is not None:
            # the two counts are optional: a dict without them keeps this optimizer's
            keys = set(ls) if isinstance(ls, dict) else set()
            if not {"shape", "iterations", "state"} <= keys <= set(_LOSS_SCALE_KEYS):
                raise ValueError(
                    "loss_scale must be a dict with keys 'shape', 'iterations' "
                    f"and 'state' (and 'last_step_skipped', 'monitor_steps'), got {ls!r}"
                )
            iterations = integer("iterations", ls["iterations"], minimum=0)
            monitor_steps = integer(
                "monitor_steps", ls.get("monitor_steps", self._monitor_steps), minimum=0
            )
            last = ls.get("last_step_skipped", self._last_step_skipped)
            if not isinstance(last, bool):
                raise TypeError(f"last_step_skipped must be a bool, got {last!r}")
            if ls["shape"] != self._scaling.shape:
                raise ValueError(
                    f"the checkpoint's loss scaling has the {ls['shape']!r} shape; "
                    f"this optimizer has {self._scaling.shape!r}"
                )
            if (ls["state"] is None) != (holder is None):
                raise ValueError(
                    "the checkpoint's loss scale and this optimizer's differ in "
                    "kind (fixed vs dynamic)"
                )
        if ls is None:
            self._optimizer.load_state_dict(d)
        else:
            _wrapper.load_checked(holder, ls["state"], lambda: self._optimizer.load_state_dict(d))
            self._iterations, self._monitor_steps = iterations, monitor_steps
            self._last_step_skipped = last
        self._found = None

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({"_reducer": None, **state})  # a state without one has none
        self._rebuild()
