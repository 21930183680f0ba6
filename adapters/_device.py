"""Device-array parts of the CuPy adapter, written against an array module and a kernel backend.

Design: ``lscore.adapters.cupy`` binds these classes to ``cupy`` and
``lscore.cuda.CupyBackend``; the tests bind the very same classes to
``numpy`` and the CPU host harness (tests/helpers/cuda_host), so the gathering of
arrays, the pointer tables, the launches, the gating of SGD/Adam and the
sync-free bookkeeping all run in CI without a GPU.

- ``ArrayKernels`` (``lscore.cuda.ArrayKernels``, framework-neutral, so
  ``lscore bench --suite gpu-host`` binds it too): ``all_finite`` and
  ``unscale_`` over nested device arrays, walked, checked and grouped by
  device and dtype in compiled code (``lscore.kernels.DeviceTable``, which
  caches the plan of a list), then launched with packed arguments
  (``lscore.cuda.MultiTensor``); one host sync per device reads the flag;
  ``check_async`` leaves the flag on the device.
- ``Gated``: a mixin for the array optimizers: while ``_gate`` holds a device
  boolean, a step commits to the variable and its slots only where the gate
  is true, so a skipped step changes nothing and needs no host sync.
- ``DeviceLossScaleOptimizer``: the LossScaleOptimizer of adapters/_optim
  with a ``sync_free`` mode that keeps the state machine on the device.
"""
from __future__ import annotations

import numpy as np

from lscore import cuda
from lscore.adapters import _optim
from lscore.state import LossScaleFloorError


ArrayKernels = cuda.ArrayKernels


class Gated:
    """Mixin for ``_arrays.SGD``/``_arrays.Adam``: a device gate decides whether a step commits.

    With ``_gate`` None a step is the parent's.  With ``_gate`` a 0-d device
    boolean, the parent's step runs, then the variable and its slots are
    restored from copies where the gate is false; no host sync either way.
    """

    _gate = None

    def _update_step(self, g, v) -> None:
        gate = self._gate
        if gate is None:
            return super()._update_step(g, v)
        xp = self._xp
        entry = self._slots.get(id(v))
        before = {k: s.copy() for k, s in entry[1].items()} if entry and entry[0] is v else {}
        old = v.copy()
        super()._update_step(g, v)
        keep = xp.logical_not(gate)
        xp.copyto(v, old, where=keep)
        for k, s in self._slots.get(id(v), (None, {}))[1].items():
            xp.copyto(s, before[k] if k in before else xp.zeros_like(s), where=keep)
        return None


class DeviceLossScaleOptimizer(_optim.LossScaleOptimizerBase):
    """LossScaleOptimizer on device arrays, in one of two modes.

    Default (``sync_free=False``): exactly the NumPy adapter's behaviour; the
    finiteness check runs on the device and its flag is read once per step,
    then the host state machine decides and the step is applied or skipped.

    ``sync_free=True`` (Keras shape only, with this adapter's SGD or Adam):
    the state machine runs on the device (lscore.cuda's update kernel, the
    CPU core's code), the check's flag never leaves the device, and the inner
    optimizer's step is gated by it, so a skipped step leaves variables and
    slots unchanged without a host sync.  ``apply_gradients`` then returns a
    0-d device boolean (True: applied); ``get_scaled_loss``,
    ``get_unscaled_gradients`` and ``minimize`` use the device scale.  The
    scale reaches the host only when asked: ``loss_scale``,
    ``dynamic_counter`` and ``sync_state()`` copy the device state back (one
    sync) and raise LossScaleFloorError if the policy gave up on the device.
    """

    _kernels: ArrayKernels = None
    _current_device = staticmethod(lambda: 0)

    def __init__(self, optimizer, loss_scale=None, *, dynamic=True, initial_scale=None,
                 dynamic_growth_steps=None, loss_scale_manager=None, sync_free=False,
                 reducer=None):
        if not isinstance(sync_free, (bool, np.bool_)):
            raise TypeError(f"sync_free must be a bool, got {sync_free!r}")
        if sync_free and reducer is not None:
            raise ValueError("sync_free=True cannot take a reducer: a reducer agrees on the "
                             "found-inf flag on the host, and sync_free keeps it on the device")
        super().__init__(optimizer, loss_scale, dynamic=dynamic, initial_scale=initial_scale,
                         dynamic_growth_steps=dynamic_growth_steps,
                         loss_scale_manager=loss_scale_manager, reducer=reducer)
        self._dev = None
        self._device_id = None
        self._sync_free = bool(sync_free)
        if not sync_free:
            return
        if self._scaling.shape != "keras":
            raise ValueError("sync_free=True needs the Keras shape (loss_scale None or a bool): "
                             "the TF <= 2.3 and TF1 shapes do not advance iterations on a "
                             "skipped step, which the host cannot know without a sync")
        if not isinstance(optimizer, Gated):
            raise TypeError("sync_free=True needs this adapter's SGD or Adam (they skip a step "
                            f"on the device), got {type(optimizer).__qualname__}")
        self._device_id = type(self)._current_device()
        if self._scaling.dynamic:
            state = self._host_state()
            runner = self._kernels.device(self._device_id)
            self._dev = cuda.DeviceState(runner.backend, state.nbytes)
            self._dev.put(state.to_bytes())

    @property
    def sync_free(self) -> bool:
        return self._sync_free

    def _host_state(self):
        return self._scaling.dynamic_loss_scale.state

    def sync_state(self) -> None:
        """Copy the device state to the host (sync-free mode; one sync); raises on a floor error."""
        if self._dev is None:
            return
        raw, flags, _ = self._dev.read()
        state = self._host_state()
        state.from_bytes(raw)
        if flags[cuda.device_state.FLOOR]:
            self._dev.clear_floor()
            raise LossScaleFloorError(
                f"loss scale cannot go below its minimum {state.policy.min_scale!r} "
                f"(policy {state.policy.name!r}); the loss is probably diverging")

    @property
    def loss_scale(self):
        self.sync_state()
        return super().loss_scale

    @property
    def dynamic_counter(self):
        self.sync_state()
        return super().dynamic_counter

    def _device_value(self, which: str, dtype):
        if self._dev is None:    # a fixed scale: a host constant is exact and costs nothing
            s = self._scaling.scale
            with _optim.quiet():
                v = s if which == "scale" else float(np.float32(1.0) / np.float32(s))
            return self._kernels.xp.asarray(v, dtype=dtype)
        arr = self._dev.scale if which == "scale" else self._dev.inv_scale
        return arr.reshape(()).astype(dtype)

    def get_scaled_loss(self, loss):
        if not self._sync_free:
            return super().get_scaled_loss(loss)
        if callable(loss):
            return lambda: self.get_scaled_loss(loss())
        return loss * self._device_value("scale", getattr(loss, "dtype", np.float32))

    def get_unscaled_gradients(self, grads) -> list:
        if not self._sync_free:
            return super().get_unscaled_gradients(grads)
        return [None if g is None else g * self._device_value("inv", g.dtype) for g in grads]

    def _scaled_gradients(self, loss_and_grads_fn, var_list):
        if self._sync_free and callable(loss_and_grads_fn):
            scale = self._device_value("scale", np.float32)
            return super()._scaled_gradients(lambda _host: loss_and_grads_fn(scale), var_list)
        return super()._scaled_gradients(loss_and_grads_fn, var_list)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Default mode: as the NumPy adapter (returns a bool).  Sync-free: returns a device
        bool, which is also added to ``global_step`` on the device."""
        if not self._sync_free:
            return super().apply_gradients(grads_and_vars, global_step, name)
        advance = self._tf1_step_arguments(global_step, name)
        pairs = _optim.drop_none_gradients(_optim.grad_var_pairs(grads_and_vars), warn=True)
        opt, xp = self._optimizer, self._kernels.xp
        if self._dev is None:
            gate = None                     # Keras fixed scale: every step applies
        else:
            self._kernels.check_async([g for g, _ in pairs], self._dev.found_ptr,
                                      self._device_id)
            gate = (self._dev.found == 0).reshape(())
        opt._gate = gate
        try:
            opt.apply_gradients(pairs)      # validates everything before any write
        except BaseException:
            if self._dev is not None:
                self._dev.found[...] = 0    # a failed call leaves no flag behind
            raise
        finally:
            opt._gate = None
        if self._dev is not None:
            self._dev.step()                # advance only once the step went through
        self._last_applied = xp.asarray(True) if gate is None else gate
        advance(self._last_applied)
        return self._last_applied
