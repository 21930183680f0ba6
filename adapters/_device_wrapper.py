"""The CuPy adapter's ``LossScaleOptimizer`` on device arrays, in one of two modes.

``LossScaleOptimizer`` is the NumPy adapter's wrapper (``_optim``) with a
``sync_free`` argument that picks, once, where the loss scale lives and how a step
is decided: ``Synced`` (``_synced``: the NumPy adapter's behaviour, one read of the
found flag per step) or ``SyncFree`` (``_sync_free``: the state machine on the
device, nothing read per step).  The wrapper hands its steps, its scale and its
state copies to that mode; a step method gets the wrapper itself and its
``_finisher`` (TF1's step arguments checked, the step's result recorded), so that a
mode keeps no reference to the wrapper.  A mode reaches the inner optimizer's fused
kernels through ``Fused``'s public ``fused_plan``, ``fused_check``, ``fused_update`` and
``gated``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from lscore.adapters import _optim
from lscore.adapters._backend import ArrayBackend
from lscore.adapters._sync_free import SyncFree
from lscore.adapters._synced import Synced
from lscore.policy import boolean


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
    # rebuilt by __setstate__: a pickle holds the wrapper's state and the mode's flag
    _transient = ("_mode",)
    _mode: Synced | SyncFree

    @property
    def _xp(self) -> Any:
        backend = getattr(self, "_backend", None)
        return None if backend is None else backend.xp

    def _all_finite(self, grads: Any) -> bool:
        return self._backend.all_finite(grads)

    def _configure(
        self,
        *,
        sync_free: Any = False,
        reducer: Any = None,
        allow_fp16_params: Any = False,
    ) -> None:
        if boolean("sync_free", sync_free) and reducer is not None:
            raise ValueError(
                "sync_free=True cannot take a reducer: a reducer agrees on the "
                "found-inf flag on the host, and sync_free keeps it on the device"
            )
        super()._configure(reducer=reducer, allow_fp16_params=allow_fp16_params)
        self._sync_free = bool(sync_free)

    def _start(self) -> None:
        super()._start()
        self._mode = self._new_mode()

    def _new_mode(self) -> Synced | SyncFree:
        """The mode ``sync_free`` picked (SyncFree checks what it needs and makes its state)."""
        if self._sync_free:
            return SyncFree(self._backend, self._scaling, self._optimizer, self._allow_fp16)
        return Synced(self._backend, self._scaling, self._optimizer, self._reducer)

    def __getstate__(self) -> dict:
        if self._sync_free:  # its device state holds addresses, which a copy cannot take
            raise TypeError(
                "a LossScaleOptimizer(sync_free=True) cannot be pickled or copied: its "
                "state lives on the device; save its state_dict() and load it into a new one"
            )
        return super().__getstate__()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._mode = self._new_mode()

    @property
    def sync_free(self) -> bool:
        return self._sync_free

    # -- the scale, wherever the mode keeps it ------------------------------------
    def sync_state(self) -> None:
        """Copy the device state (and Adam's device step counter) to the host; raises on a
        floor error.  Sync-free mode: one sync, two with Adam's counter; default mode:
        the state is the host's, nothing to copy."""
        self._mode.sync_state()

    def _before_checkpoint(self) -> None:
        self._mode.sync_state()

    def _after_load(self) -> None:
        self._mode.after_load()

    @property
    def loss_scale(self) -> Any:
        self._mode.read_state()
        return super().loss_scale

    @property
    def dynamic_counter(self) -> Any:
        self._mode.read_state()
        return super().dynamic_counter

    def get_scaled_loss(self, loss: Any) -> Any:
        return self._mode.get_scaled_loss(self, loss)

    def get_unscaled_gradients(self, grads: Any) -> list:
        return self._mode.get_unscaled_gradients(self, grads)

    def _scaled_gradients(self, loss_and_grads_fn: Any, var_list: Any) -> Any:
        return super()._scaled_gradients(self._mode.backward(loss_and_grads_fn), var_list)

    # -- the step -------------------------------------------------------------------
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
        return self._mode.minimize(
            self, self._finisher, loss_and_grads_fn, var_list, global_step, name
        )

    def apply_gradients(
        self, grads_and_vars: Any, global_step: Any = None, name: Any = None
    ) -> Any:
        """Default mode: as the NumPy adapter (returns a bool).  Sync-free: returns a device
        bool, which is also added to ``global_step`` on the device."""
        return self._mode.apply_gradients(self, self._finisher, grads_and_vars, global_step, name)
