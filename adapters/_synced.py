"""``Synced``: the default mode of the CuPy adapter's LossScaleOptimizer.

The NumPy adapter's behaviour: the finiteness check runs on the device and its flag
is read once per step (as torch's GradScaler.step), then the host's state machine
decides and the step is applied or skipped.  ``minimize`` on this adapter's SGD or
Adam is two fused launches, the check and the update, both fed the scaled gradients
and the inverse scale; everything else is the NumPy adapter's code
(``_optim.LossScaleOptimizerBase``) on device arrays.
"""

from __future__ import annotations

from typing import Any

from lscore.adapters._backend import ArrayBackend
from lscore.adapters._fused import Fused
from lscore.adapters._grads import loss_and_grads, without_none
from lscore.adapters._optim import LossScaleOptimizerBase
from lscore.adapters._scaling import LossScaling
from lscore.adapters._wrapper import run_step
from lscore.cuda.optim import FLAGS, FusedPlan
from lscore.distributed import reduce_found_inf
from lscore.policy import inverse_scale


class Synced:
    """``sync_free=False``: the check on the device, its flag read once per step, the state
    machine on the host.

    `backend` is the wrapper's ``ArrayBackend``, `scaling` its ``LossScaling``,
    `optimizer` the optimizer it wraps and `reducer` its ``lscore.distributed`` reducer
    (or None).  A step method gets the wrapper `w` (the NumPy adapter's code
    runs on it) and its `finisher` (TF1's step arguments checked; the result recorded).
    """

    def __init__(
        self, backend: ArrayBackend, scaling: LossScaling, optimizer: Any, reducer: Any
    ) -> None:
        self._backend, self._scaling = backend, scaling
        self._optimizer, self._reducer = optimizer, reducer

    def _refuse_in_capture(self) -> None:
        self._backend.refuse_in_capture(
            "a step of sync_free=False (it reads the found flag)",
            "capture a LossScaleOptimizer(..., sync_free=True)",
        )

    # -- the scale lives on the host: nothing to copy ---------------------------------
    def read_state(self) -> None:
        """Nothing: the host's state is current."""

    def sync_state(self) -> None:
        """Nothing: the host's state is current."""

    def after_load(self) -> None:
        """Nothing: the steps read the host's state."""

    def backward(self, loss_and_grads_fn: Any) -> Any:
        """The function the NumPy adapter's ``compute_gradients`` calls: this one."""
        return loss_and_grads_fn

    def get_scaled_loss(self, w: LossScaleOptimizerBase, loss: Any) -> Any:
        return LossScaleOptimizerBase.get_scaled_loss(w, loss)

    def get_unscaled_gradients(self, w: LossScaleOptimizerBase, grads: Any) -> list:
        return LossScaleOptimizerBase.get_unscaled_gradients(w, grads)

    # -- the step -------------------------------------------------------------------
    def minimize(
        self,
        w: LossScaleOptimizerBase,
        finisher: Any,
        loss_and_grads_fn: Any,
        var_list: Any,
        global_step: Any,
        name: Any,
    ) -> Any:
        finish = finisher(global_step, name)  # refuse before the backward
        self._refuse_in_capture()
        s = self._scaling
        if not s.predictable or w.overflow_monitor is not None:
            return LossScaleOptimizerBase.minimize(
                w, loss_and_grads_fn, var_list, global_step=global_step, name=name
            )
        loss, grads, var_list = loss_and_grads(
            loss_and_grads_fn, var_list, s.scale, self._backend.xp
        )
        opt = self._optimizer
        gs, vs = without_none(grads, var_list, warn=s.shape != "tf1")
        plan = opt.fused_plan(gs, vs) if isinstance(opt, Fused) else None
        if plan is None:
            unscaled = w.get_unscaled_gradients(grads)
            w.apply_gradients(
                zip(unscaled, var_list, strict=True), global_step=global_step, name=name
            )
        else:
            finish(self._fused(w, opt, plan, inverse_scale(s.scale)))
        return loss

    def _fused(self, w: LossScaleOptimizerBase, opt: Fused, plan: FusedPlan, inv: float) -> bool:
        """A step on the fused kernels: check (one sync), decide on the host, update;
        returns whether it was applied."""
        runner = plan.launcher.runner
        mark = runner.next_mark()
        flags = FLAGS["INV_AS_GRAD"]
        opt.fused_check(plan, flags=flags, inv=inv, gate_ptr=runner.flag_ptr, skip_if=mark)
        finite = not reduce_found_inf(self._reducer, runner.found(mark))

        def apply() -> None:
            opt.fused_update(plan, flags=flags, inv=inv)

        def count(applied: bool) -> None:  # an applied step, or (Keras) a skipped one
            opt.iterations += 1

        applied, _ = run_step(w, finite, apply=apply, count=count, grads=None, named_arrays=None)
        return applied

    def apply_gradients(
        self,
        w: LossScaleOptimizerBase,
        finisher: Any,
        grads_and_vars: Any,
        global_step: Any,
        name: Any,
    ) -> Any:
        self._refuse_in_capture()
        return LossScaleOptimizerBase.apply_gradients(w, grads_and_vars, global_step, name)
