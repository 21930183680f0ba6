"""``SyncFree``: the sync-free mode of the CuPy adapter's LossScaleOptimizer.

The loss scale's state machine, the found flag, the step's result and Adam's step
counter live on the device (``lscore.cuda.DeviceState``; the update kernel is the
CPU core's code), and the host reads nothing per step.  On the fused path a step is
three launches: the fused check (it marks the found flag), the fused update gated
by that flag, and the update kernel; other variables take the elementwise path,
gated by the flag (``Gated.gated``).  After one eager step a step can be captured
in a CUDA graph and replayed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lscore.adapters._backend import ONE_STEP, ArrayBackend
from lscore.adapters._fused import Fused
from lscore.adapters._grads import (
    check_gradient_dtypes,
    check_variable_dtypes,
    drop_none_gradients,
    grad_var_pairs,
    loss_and_grads,
    unzip,
    without_none,
)
from lscore.adapters._scaling import LossScaling
from lscore.cuda.device_state import FLOOR, DeviceState
from lscore.cuda.optim import FLAGS, FusedPlan
from lscore.policy import inverse_scale
from lscore.state import LossScaleFloorError


class SyncFree:
    """``sync_free=True``: the state machine, the found flag, the step's result and Adam's
    step counter on the device, nothing read per step (see ``LossScaleOptimizer``).

    `backend` is the wrapper's ``ArrayBackend``, `scaling` its ``LossScaling``,
    `optimizer` the optimizer it wraps and `allow_fp16` its ``allow_fp16_params``.  The
    state lives on the device current when the mode is made.  The step methods get
    the wrapper `w` (unused: the state is here) and its `finisher` (TF1's step
    arguments checked; the result recorded), as ``Synced``'s do.
    """

    def __init__(
        self, backend: ArrayBackend, scaling: LossScaling, optimizer: Any, allow_fp16: bool
    ) -> None:
        self._backend, self._scaling, self._allow_fp16 = backend, scaling, allow_fp16
        if self._scaling.shape != "keras":
            raise ValueError(
                "sync_free=True needs the Keras shape (loss_scale None or a bool): "
                "the TF <= 2.3 and TF1 shapes do not advance iterations on a "
                "skipped step, which the host cannot know without a sync"
            )
        if not isinstance(optimizer, Fused):
            raise TypeError(
                "sync_free=True needs this adapter's SGD or Adam (they skip a step "
                f"on the device), got {type(optimizer).__qualname__}"
            )
        self._optimizer: Fused = optimizer
        self._device_id = self._backend.current_device()
        xp = self._backend.xp
        self._dev: DeviceState | None = None
        # preallocated: a captured step may not allocate; with a fixed scale the step
        # always applies and nothing rewrites it
        self._applied = xp.ones((), dtype=bool)
        self._scale_arg = xp.asarray(self._scaling.scale, dtype=np.float32)
        if self._scaling.dynamic:
            state = self._host_state()
            runner = self._backend.kernels.device(self._device_id)
            self._dev = DeviceState(runner.backend, state.nbytes)
            self._dev.put(state.to_bytes())
            self._scale_arg = self._dev.scale32  # rewritten by every update launch
        self._count: Any = None  # Adam's device step counter
        self._count_host: int | None = None  # the value the host last gave it

    def _host_state(self) -> Any:
        return self._scaling.dynamic_loss_scale.state

    def _check_device(self) -> None:
        """RuntimeError, before anything is launched, unless the device the state lives on
        is current (its kernels would read that device's memory from another, on another
        device's stream)."""
        current = self._backend.current_device()
        if current != self._device_id:
            d = self._device_id
            raise RuntimeError(
                f"this LossScaleOptimizer(sync_free=True) keeps its loss scale on device "
                f"{d}, but device {current} is current; run its steps with "
                f"device {d} current (cupy.cuda.Device({d}).use() "
                f"or a `with cupy.cuda.Device({d}):` block), or make one "
                f"LossScaleOptimizer per device"
            )

    def read_state(self) -> None:
        """Copy the device state to the host's (one sync); raises on a floor error."""
        if self._dev is None:
            return
        self._backend.refuse_in_capture(
            "reading the loss scale (a device-to-host copy)", "read it after end_capture()"
        )
        raw, flags, _ = self._dev.read()
        state = self._host_state()
        state.from_bytes(raw)
        if flags[FLOOR]:
            self._dev.clear_floor()
            raise LossScaleFloorError(
                f"loss scale cannot go below its minimum {state.policy.min_scale!r} "
                f"(policy {state.policy.name!r}); the loss is probably diverging"
            )

    def sync_state(self) -> None:
        """``read_state``, and Adam's device step counter into ``iterations``."""
        self.read_state()
        if self._count is not None:
            backend = self._optimizer.fused_launcher().backend
            self._count_host = int(backend.get(self._count)[0])
            self._optimizer.iterations = self._count_host

    def after_load(self) -> None:
        """Send the loaded host state to the device."""
        if self._dev is not None:
            self._dev.put(self._host_state().to_bytes())
        self._count_host = None  # Adam's device step counter is set from iterations

    def _device_value(self, which: str, dtype: Any) -> Any:
        """The scale (`which` "scale") or its inverse as a 0-d device array of `dtype`."""
        if self._dev is None:  # a fixed scale: a host constant is exact and costs nothing
            s = self._scaling.scale
            value = s if which == "scale" else inverse_scale(s)
            return self._backend.xp.asarray(value, dtype=dtype)
        arr = self._dev.scale if which == "scale" else self._dev.inv_scale
        return arr.reshape(()).astype(dtype)

    def get_scaled_loss(self, w: Any, loss: Any) -> Any:
        if callable(loss):
            return lambda: self.get_scaled_loss(w, loss())
        self._check_device()
        return loss * self._device_value("scale", getattr(loss, "dtype", np.float32))

    def get_unscaled_gradients(self, w: Any, grads: Any) -> list:
        self._check_device()
        grads = list(grads)
        check_gradient_dtypes(grads)
        return [None if g is None else g * self._device_value("inv", g.dtype) for g in grads]

    def backward(self, loss_and_grads_fn: Any) -> Any:
        """The function the NumPy adapter's ``compute_gradients`` calls: `loss_and_grads_fn`
        given the device scale (a value instead of a function is left to be refused)."""
        if not callable(loss_and_grads_fn):
            return loss_and_grads_fn
        self._check_device()
        scale = self._scale_arg
        return lambda _host: loss_and_grads_fn(scale)

    def minimize(
        self,
        w: Any,
        finisher: Any,
        loss_and_grads_fn: Any,
        var_list: Any,
        global_step: Any,
        name: Any,
    ) -> Any:
        finish = finisher(global_step, name)  # refuse before the backward
        self._check_device()
        loss, grads, var_list = loss_and_grads(
            loss_and_grads_fn, var_list, self._scale_arg, self._backend.xp
        )
        plan = self._optimizer.fused_plan(*without_none(grads, var_list, warn=True))
        if plan is None:
            unscaled = self.get_unscaled_gradients(w, grads)
            self.apply_gradients(
                w, finisher, zip(unscaled, var_list, strict=True), global_step, name
            )
        else:
            finish(self._fused(plan, scaled=True))
        return loss

    def _counter(self, plan: FusedPlan) -> int:
        """Adam's device step counter (its address), given the host's iterations when they
        changed behind it; 0 for SGD."""
        opt = self._optimizer
        if not opt.uses_step_counter:
            return 0
        backend = plan.launcher.backend
        if self._count is None:
            self._backend.refuse_in_capture(
                "creating Adam's device step counter (an upload)", ONE_STEP
            )
            self._count = backend.to_device(np.array([opt.iterations], np.int64))
        elif self._count_host != opt.iterations:
            self._backend.refuse_in_capture(
                "setting the device step counter from iterations",
                "do not set iterations between the eager step and the capture",
            )
            self._count[...] = opt.iterations  # a fill on the device, no transfer
        self._count_host = opt.iterations
        return int(backend.ptr(self._count))

    def _fused(self, plan: FusedPlan, *, scaled: bool) -> Any:
        """One step on the fused kernels, nothing read, nothing uploaded once planned: with a
        dynamic scale the check, the update gated by its flag, and the update kernel, which
        advances the scale and the step counter and writes the step's result (returned)."""
        opt, dev = self._optimizer, self._dev
        inv, inv_ptr, flags = 1.0, 0, 0
        if scaled:
            flags = FLAGS["INV_AS_GRAD"]
            if dev is None:
                inv = inverse_scale(self._scaling.scale)
            else:
                inv_ptr = dev.inv_ptr
        count_ptr = self._counter(plan)
        if dev is None:  # Keras's fixed scale applies every step, NaN or not
            opt.fused_update(plan, flags=flags, inv=inv, count_ptr=count_ptr, live=True)
            if count_ptr:
                self._backend.xp.add(self._count, 1, out=self._count)
            applied = self._applied  # always True, never rewritten
        else:
            gate = dict(gate_ptr=dev.found_ptr, skip_if=1)
            opt.fused_check(plan, flags=flags, inv_ptr=inv_ptr, **gate)
            opt.fused_update(
                plan, flags=flags, inv_ptr=inv_ptr, count_ptr=count_ptr, live=True, **gate
            )
            # a captured step may not allocate: it hands out the buffer the next step
            # rewrites; an eager one a new byte (an allocation, no launch)
            xp = self._backend.xp
            applied = self._applied if self._backend.capturing() else xp.empty((), dtype=bool)
            dev.step(applied_ptr=plan.launcher.backend.ptr(applied), count_ptr=count_ptr)
        if count_ptr:
            assert self._count_host is not None  # set when the counter was uploaded
            self._count_host += 1
        opt.iterations += 1
        return applied

    def apply_gradients(
        self, w: Any, finisher: Any, grads_and_vars: Any, global_step: Any, name: Any
    ) -> Any:
        finish = finisher(global_step, name)
        self._check_device()
        pairs = drop_none_gradients(grad_var_pairs(grads_and_vars), warn=True)
        check_gradient_dtypes([g for g, _ in pairs])
        plan = self._optimizer.fused_plan(*unzip(pairs))
        if plan is not None:
            return finish(self._fused(plan, scaled=False))
        return finish(self._elementwise(pairs))

    def _elementwise(self, pairs: list) -> Any:
        """A step on the elementwise path: the inner step gated by the found flag (a skipped
        step restores copies); refused while capturing.  Returns the step's result."""
        check_variable_dtypes([v for _, v in pairs], self._allow_fp16)
        self._backend.refuse_in_capture(
            "a step on the elementwise path (it copies the variables)",
            "capture only dense float32 variables with float16, bfloat16 "
            "or float32 gradients and no clipping (the fused kernels)",
        )
        dev = self._dev
        if dev is None:
            gate = None  # Keras fixed scale: every step applies
        else:
            assert self._device_id is not None
            self._backend.kernels.check_async([g for g, _ in pairs], dev.found_ptr, self._device_id)
            gate = (dev.found == 0).reshape(())
        try:
            with self._optimizer.gated(gate):
                self._optimizer.apply_gradients(pairs)  # validates everything before any write
        except BaseException:
            if dev is not None:
                dev.found[...] = 0  # a failed call leaves no flag behind
            raise
        if dev is not None:
            dev.step()  # advance only once the step went through
        return self._backend.xp.asarray(True) if gate is None else gate
