"""The CuPy adapter's ``LossScaleOptimizer`` on device arrays, one class per mode.

``LossScaleOptimizer`` is the NumPy adapter's wrapper (``_optim``) with a
``sync_free`` argument that picks the class of the instance: ``Synced`` (the
NumPy adapter's behaviour, one read of the found flag per step) or
``SyncFree`` (the state machine on the device, nothing read per step), each a
subclass of the adapter's ``LossScaleOptimizer``, made once per adapter and
named as it.  A mode reaches the inner optimizer's fused kernels through
``Gated``'s public ``fused_plan``, ``fused_check``, ``fused_update`` and
``gated``.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, ClassVar

import numpy as np

from lscore.adapters import _optim, _wrapper
from lscore.adapters._device import ONE_STEP, ArrayBackend, Gated
from lscore.cuda.device_state import FLOOR, DeviceState
from lscore.cuda.optim import FLAGS, FusedPlan
from lscore.distributed import reduce_found_inf
from lscore.policy import boolean, inverse_scale
from lscore.state import LossScaleFloorError


def _mode_class(cls: type, mode: type) -> type:
    """The class of a `mode` instance of `cls` (the adapter's ``LossScaleOptimizer``, or a
    mode class made from it): a subclass of `mode` and of the adapter's class, made once
    per adapter class and named as it (``isinstance`` and ``repr`` see the adapter's)."""
    adapter = cls.__dict__.get("_adapter_class", cls)
    made = adapter.__dict__.get("_mode_classes")
    if made is None:
        made = {}
        adapter._mode_classes = made
    sub = made.get(mode)
    if sub is None:
        attrs = {
            "__module__": adapter.__module__,
            "__qualname__": adapter.__qualname__,
            "__doc__": adapter.__doc__,
            "_adapter_class": adapter,
            "_mode": mode,
        }
        sub = made[mode] = type(adapter.__name__, (mode, adapter), attrs)
    return sub


def _remake(adapter: type, mode: type) -> Any:
    """An empty `mode` instance of the adapter's class `adapter` (pickle fills it)."""
    return object.__new__(_mode_class(adapter, mode))


class LossScaleOptimizer(_optim.LossScaleOptimizerBase):
    """LossScaleOptimizer on device arrays, in one of two modes.

    Default (``sync_free=False``): exactly the NumPy adapter's behaviour; the
    finiteness check runs on the device and its flag is read once per step
    (as torch's GradScaler.step), then the host state machine decides and
    the step is applied (this adapter's SGD/Adam: the fused kernels) or
    skipped.  ``minimize`` hands the fused kernels the *scaled* gradients
    and the inverse scale: they unscale in registers, for the check as for
    the update, so no unscaled copy is written.

    ``sync_free=True`` (Keras shape only, with this adapter's SGD or Adam):
    the state machine runs on the device (lscore.cuda's update kernel, the
    CPU core's code) and the host reads nothing per step.  With dense
    float32 variables and float16/bfloat16/float32 gradients a step is: the
    fused check (it marks the device state's found flag), the fused update
    gated by that flag (a skipped step touches nothing: no copies), then the
    update kernel advances the scale, Adam's device step counter and writes
    the step's result (it rewrites the inverse for the next step, hence the
    gate is this step's found flag, read before, not the update's apply
    flag): three launches with one gradient dtype.
    ``minimize`` passes the scaled gradients and the device inverse scale
    (read through a pointer).  Other variables take the elementwise path,
    whose skipped steps restore copies.  ``apply_gradients`` returns a 0-d
    device boolean (True: applied; a new one per eager step, one buffer that
    every replay rewrites for a captured step); ``get_scaled_loss``,
    ``get_unscaled_gradients`` and ``minimize`` use the device scale (the
    scale ``minimize`` passes to ``loss_and_grads_fn`` is one float32 device
    scalar, which the update kernel rewrites).  The scale reaches the host
    only when asked: ``loss_scale`` and ``dynamic_counter`` copy the device state back (one
    sync) and raise LossScaleFloorError if the policy gave up on the device;
    ``sync_state()`` also reads Adam's device step counter into
    ``iterations`` (needed after replaying a CUDA graph, which the host
    does not see).  As in tf-keras, a skipped step advances ``iterations``
    (the device counter too), exactly as the NumPy adapter's.

    CUDA graphs: after one eager step, a whole ``minimize`` (or scaled loss,
    ``apply_gradients``) on the fused path can be captured and replayed;
    every buffer it touches is allocated by then, and everything that
    changes per step is read on the device.  While the current stream is
    capturing, whatever would synchronise or upload (reading the scale,
    the default mode, ``all_finite``/``unscale_``, a list of arrays not seen
    before, the elementwise path) raises RuntimeError instead.
    """

    _backend: ClassVar[ArrayBackend]  # set by the adapter's subclass
    _sync_free: ClassVar[bool] = False

    def __new__(cls, *args: Any, sync_free: Any = False, **kwargs: Any) -> Any:
        mode = SyncFree if isinstance(sync_free, (bool, np.bool_)) and sync_free else Synced
        return super().__new__(_mode_class(cls, mode))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled by the adapter's class and the mode (the class itself is made)."""
        cls = type(self)
        made = cls.__dict__["_adapter_class"], cls.__dict__["_mode"]
        return _remake, made, self.__getstate__()

    @property
    def _xp(self) -> Any:
        backend = getattr(self, "_backend", None)
        return None if backend is None else backend.xp

    def _all_finite(self, grads: Any) -> bool:
        return self._backend.all_finite(grads)

    def __init__(
        self,
        optimizer: Any,
        loss_scale: Any = None,
        *,
        dynamic: Any = True,
        initial_scale: Any = None,
        dynamic_growth_steps: Any = None,
        loss_scale_manager: Any = None,
        sync_free: Any = False,
        reducer: Any = None,
        allow_fp16_params: Any = False,
    ) -> None:
        if boolean("sync_free", sync_free) and reducer is not None:
            raise ValueError(
                "sync_free=True cannot take a reducer: a reducer agrees on the "
                "found-inf flag on the host, and sync_free keeps it on the device"
            )
        super().__init__(
            optimizer,
            loss_scale,
            dynamic=dynamic,
            initial_scale=initial_scale,
            dynamic_growth_steps=dynamic_growth_steps,
            loss_scale_manager=loss_scale_manager,
            reducer=reducer,
            allow_fp16_params=allow_fp16_params,
        )
        self._start()

    def _start(self) -> None:
        """Check what the mode needs and make its state."""

    @property
    def sync_free(self) -> bool:
        return self._sync_free

    def sync_state(self) -> None:
        """Copy the device state (and Adam's device step counter) to the host; raises on a
        floor error.  Sync-free mode: one sync, two with Adam's counter; default mode:
        the state is the host's, nothing to copy."""

    def _before_checkpoint(self) -> None:
        self.sync_state()

    def _kept(self, grads: list, var_list: list) -> tuple[list, list]:
        """(gradients, variables) without the pairs whose gradient is None (Keras's rule)."""
        if not any(map(operator.is_, grads, itertools.repeat(None))):
            return grads, var_list  # the common step: nothing to drop, no pairs built
        pairs = list(zip(grads, var_list, strict=True))
        return _optim.unzip(_optim.drop_none_gradients(pairs, warn=self._scaling.shape != "tf1"))

    def minimize(
        self, loss_and_grads_fn: Any, var_list: Any, *, global_step: Any = None, name: Any = None
    ) -> Any:
        """``compute_gradients`` then ``apply_gradients`` (which takes ``global_step`` and
        ``name``); returns the loss the function gave.

        On the fused path the gradients are read once: the kernels take the
        scaled gradients and the inverse scale (the device's, in sync-free
        mode) and unscale in registers, rounding as the NumPy adapter's
        ``get_unscaled_gradients`` (the inverse cast to the gradient's dtype).
        """
        raise NotImplementedError  # the mode's

    def apply_gradients(
        self, grads_and_vars: Any, global_step: Any = None, name: Any = None
    ) -> Any:
        """Default mode: as the NumPy adapter (returns a bool).  Sync-free: returns a device
        bool, which is also added to ``global_step`` on the device."""
        raise NotImplementedError  # the mode's


class Synced(LossScaleOptimizer):
    """The default mode: the check on the device, its flag read once per step, the state
    machine on the host."""

    def _refuse_in_capture(self) -> None:
        self._backend.refuse_in_capture(
            "a step of sync_free=False (it reads the found flag)",
            "capture a LossScaleOptimizer(..., sync_free=True)",
        )

    def minimize(
        self, loss_and_grads_fn: Any, var_list: Any, *, global_step: Any = None, name: Any = None
    ) -> Any:
        advance = self._tf1_step_arguments(global_step, name)  # refuse before the backward
        self._refuse_in_capture()
        s = self._scaling
        if not s.predictable or self.overflow_monitor is not None:
            return _optim.LossScaleOptimizerBase.minimize(
                self, loss_and_grads_fn, var_list, global_step=global_step, name=name
            )
        loss, grads, var_list = self._loss_and_grads(loss_and_grads_fn, var_list, s.scale)
        opt = self._optimizer
        gs, vs = self._kept(grads, var_list)
        plan = opt.fused_plan(gs, vs) if isinstance(opt, Gated) else None
        if plan is None:
            unscaled = self.get_unscaled_gradients(grads)
            self.apply_gradients(
                zip(unscaled, var_list, strict=True), global_step=global_step, name=name
            )
        else:
            self._fused(opt, plan, advance, inverse_scale(s.scale))
        return loss

    def _fused(self, opt: Gated, plan: FusedPlan, advance: Any, inv: float) -> bool:
        """A step on the fused kernels: check (one sync), decide on the host, update."""
        runner = plan.launcher.runner
        mark = runner.next_mark()
        flags = FLAGS["INV_AS_GRAD"]
        opt.fused_check(plan, flags=flags, inv=inv, gate_ptr=runner.flag_ptr, skip_if=mark)
        finite = not reduce_found_inf(self._reducer, runner.found(mark))

        def apply() -> None:
            opt.fused_update(plan, flags=flags, inv=inv)
            opt.iterations += 1

        applied, _ = _wrapper.run_step(
            self, finite, apply=apply, count=self._count_step, grads=None, named_arrays=None
        )
        self._last_applied = applied
        advance(applied)
        return applied

    def apply_gradients(
        self, grads_and_vars: Any, global_step: Any = None, name: Any = None
    ) -> Any:
        self._refuse_in_capture()
        return _optim.LossScaleOptimizerBase.apply_gradients(
            self, grads_and_vars, global_step, name
        )


class SyncFree(LossScaleOptimizer):
    """``sync_free=True``: the state machine, the found flag, the step's result and Adam's
    step counter on the device, nothing read per step (see ``LossScaleOptimizer``)."""

    _sync_free = True
    _optimizer: Gated

    def _start(self) -> None:
        if self._scaling.shape != "keras":
            raise ValueError(
                "sync_free=True needs the Keras shape (loss_scale None or a bool): "
                "the TF <= 2.3 and TF1 shapes do not advance iterations on a "
                "skipped step, which the host cannot know without a sync"
            )
        if not isinstance(self._optimizer, Gated):
            raise TypeError(
                "sync_free=True needs this adapter's SGD or Adam (they skip a step "
                f"on the device), got {type(self._optimizer).__qualname__}"
            )
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

    def _read_state(self) -> None:
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
        self._read_state()
        if self._count is not None:
            backend = self._optimizer.fused_launcher().backend
            self._count_host = int(backend.get(self._count)[0])
            self._optimizer.iterations = self._count_host

    def _after_load(self) -> None:
        if self._dev is not None:
            self._dev.put(self._host_state().to_bytes())
        self._count_host = None  # Adam's device step counter is set from iterations

    @property
    def loss_scale(self) -> Any:
        self._read_state()
        return super().loss_scale

    @property
    def dynamic_counter(self) -> Any:
        self._read_state()
        return super().dynamic_counter

    def _device_value(self, which: str, dtype: Any) -> Any:
        """The scale (`which` "scale") or its inverse as a 0-d device array of `dtype`."""
        if self._dev is None:  # a fixed scale: a host constant is exact and costs nothing
            s = self._scaling.scale
            value = s if which == "scale" else inverse_scale(s)
            return self._backend.xp.asarray(value, dtype=dtype)
        arr = self._dev.scale if which == "scale" else self._dev.inv_scale
        return arr.reshape(()).astype(dtype)

    def get_scaled_loss(self, loss: Any) -> Any:
        if callable(loss):
            return lambda: self.get_scaled_loss(loss())
        self._check_device()
        return loss * self._device_value("scale", getattr(loss, "dtype", np.float32))

    def get_unscaled_gradients(self, grads: Any) -> list:
        self._check_device()
        grads = list(grads)
        _optim.check_gradient_dtypes(grads)
        return [None if g is None else g * self._device_value("inv", g.dtype) for g in grads]

    def _scaled_gradients(self, loss_and_grads_fn: Any, var_list: Any) -> Any:
        if not callable(loss_and_grads_fn):
            return super()._scaled_gradients(loss_and_grads_fn, var_list)  # refuses it
        self._check_device()
        scale = self._scale_arg
        return super()._scaled_gradients(lambda _host: loss_and_grads_fn(scale), var_list)

    def minimize(
        self, loss_and_grads_fn: Any, var_list: Any, *, global_step: Any = None, name: Any = None
    ) -> Any:
        advance = self._tf1_step_arguments(global_step, name)  # refuse before the backward
        self._check_device()
        loss, grads, var_list = self._loss_and_grads(loss_and_grads_fn, var_list, self._scale_arg)
        plan = self._optimizer.fused_plan(*self._kept(grads, var_list))
        if plan is None:
            unscaled = self.get_unscaled_gradients(grads)
            self.apply_gradients(
                zip(unscaled, var_list, strict=True), global_step=global_step, name=name
            )
        else:
            self._fused(plan, advance, scaled=True)
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

    def _fused(self, plan: FusedPlan, advance: Any, *, scaled: bool) -> Any:
        """One step on the fused kernels, nothing read, nothing uploaded once planned: with a
        dynamic scale the check, the update gated by its flag, and the update kernel, which
        advances the scale and the step counter and writes the step's result."""
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
        self._last_applied = applied
        advance(applied)
        return applied

    def apply_gradients(
        self, grads_and_vars: Any, global_step: Any = None, name: Any = None
    ) -> Any:
        advance = self._tf1_step_arguments(global_step, name)
        self._check_device()
        pairs = _optim.drop_none_gradients(_optim.grad_var_pairs(grads_and_vars), warn=True)
        _optim.check_gradient_dtypes([g for g, _ in pairs])
        plan = self._optimizer.fused_plan(*_optim.unzip(pairs))
        if plan is not None:
            return self._fused(plan, advance, scaled=False)
        return self._elementwise(pairs, advance)

    def _elementwise(self, pairs: list, advance: Any) -> Any:
        """A step on the elementwise path: the inner step gated by the found flag (a skipped
        step restores copies); refused while capturing."""
        _optim.check_variable_dtypes([v for _, v in pairs], self._allow_fp16)
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
        applied = self._backend.xp.asarray(True) if gate is None else gate
        self._last_applied = applied
        advance(applied)
        return applied
