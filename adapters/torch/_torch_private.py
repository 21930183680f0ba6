"""torch's private attributes and hooks, as ``GradScaler`` keeps them for code written
against ``torch.amp.GradScaler`` (frameworks call its hooks, torch's own tests assign
``_init_scale``): ``_scale`` and ``_growth_tracker``, the assignable ``_init_scale`` and
``_init_growth_tracker``, the lazy init that creates the scale (and picks the path), the
per-device found-inf checks, the fused optimizers' step, and torch's assertion for a
method called before the first ``scale()``.

The base of ``scaler.GradScaler``, whose constructor sets the attributes these read; the
scale lives in the path (``_paths.py``), so these read it from there.
"""

from __future__ import annotations

import inspect
from typing import Any, NoReturn

import numpy as np
import torch
from torch.amp.grad_scaler import OptState

from lscore.adapters.torch._config import warn_at_caller
from lscore.adapters.torch._paths import CorePath, DevicePath, agree
from lscore.adapters.torch._state_dict import state_dict_with
from lscore.adapters.torch._unscaler import (
    GradUnscaler,
    ScalerAssertionError,
    unscale_with_kernel,
)
from lscore.policy import integer, real
from lscore.state import LossScaleState

__all__ = ["TorchPrivate"]

_FIX = (
    "This may indicate your script did not use scaler.scale(loss or outputs) "
    "earlier in the iteration."
)


class TorchPrivate(torch.amp.GradScaler):
    """torch's private attributes and hooks over ``GradScaler``'s path (its base class)."""

    # set by GradScaler: _path, the path (CorePath or DevicePath) the first scale() picks
    # (_placed), None before it and when disabled.  An enabled scaler (or one enabled="auto"
    # turned off) also has _state, its state machine (policy, counters and, but on the
    # device under torch's policy, the scale), _reported (the scale get_scale() reports
    # before the first scale(), as given), _unscaler (the CPU path's GradUnscaler) and
    # _reducer (process_group's, or None)
    _path: CorePath | DevicePath | None
    _state: LossScaleState
    _reported: float
    _unscaler: GradUnscaler
    _reducer: Any
    torch_kernels: bool
    # (scale, growth tracker) the tensors were created with, or last loaded after that
    _init_values: tuple | None = None

    def _has_state(self, name: str) -> None:
        """A scaler disabled from the start has no state, scale or tracker (torch's neither)."""
        if "_state" not in self.__dict__:
            raise AttributeError(f"'GradScaler' object has no attribute {name!r}")

    @property  # torch's attribute, read-only here: the path owns the tensor
    def _scale(self) -> torch.Tensor | None:  # type: ignore[override]
        """torch's scale tensor, None before scale()."""
        if self._path is None:
            self._has_state("_scale")
            return None
        return self._path.scale

    @property  # torch's attribute, read-only here: the path owns the tensor
    def _growth_tracker(self) -> torch.Tensor | None:  # type: ignore[override]
        """torch's growth-tracker tensor (a copy on the CPU path), None before scale()."""
        if self._path is None:
            self._has_state("_growth_tracker")
            return None
        return self._path.growth_tracker()

    @property
    def _on_device(self) -> bool:
        """True when torch's kernels do the work (the scale lives off the CPU)."""
        return self._path is not None and self._path.on_device

    def _get_scale_async(self) -> Any:
        return self._scale

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._state.good_steps if self._path is None else self._path.good_steps()

    @property  # torch's attribute, read-only here: the path owns the value
    def _init_scale(self) -> float:
        """torch's: the value the scale tensor is (or was) created with, or the scale last
        loaded by load_state_dict.  Assigned before the first scale(), it is the scale the
        tensor will be created with, as in torch."""
        self._has_state("_init_scale")
        if self._path is None or self._init_values is None:
            return self.get_scale()
        return self._init_values[0]

    @_init_scale.setter
    def _init_scale(self, value: float) -> None:
        self._set_init(real("_init_scale", value), None)

    @property
    def _init_growth_tracker(self) -> int:
        """torch's: the value the growth tracker is (or was) created with, or last loaded.
        Assigned before the first scale(), it is the count the tracker will start from,
        as in torch (whose load_state_dict overwrites it, as here)."""
        self._has_state("_init_growth_tracker")
        if self._path is None or self._init_values is None:
            return self._get_growth_tracker()
        return self._init_values[1]

    @_init_growth_tracker.setter
    def _init_growth_tracker(self, value: int) -> None:
        self._set_init(None, integer("_init_growth_tracker", value, minimum=0))

    def _set_init(self, scale: float | None, tracker: int | None) -> None:
        """Assign torch's _init_scale or _init_growth_tracker (None: keep the other)."""
        self._has_state("_init_scale" if tracker is None else "_init_growth_tracker")
        if self._enabled and self._path is None:  # no tensors yet: they start from these
            new_scale = self._reported if scale is None else scale
            new_tracker = self._state.good_steps if tracker is None else tracker
            d = state_dict_with(self._state, float(np.float32(new_scale)), good_steps=new_tracker)
            self._state.load_state_dict(d)
            self._after_load(new_scale)
        else:  # torch keeps the attribute only: the tensors hold the scale and tracker
            old = self._init_values or (self.get_scale(), self._get_growth_tracker())
            self._init_values = (
                old[0] if scale is None else scale,
                old[1] if tracker is None else tracker,
            )

    def _after_load(self, reported: Any) -> None:
        """The state machine was loaded: write it into the scale's tensors, or, before the
        first scale(), have get_scale() report `reported` (None: the state's scale)."""
        if self._path is not None:
            self._path.loaded()
        else:
            self._reported = self._state.scale if reported is None else reported

    def _lazy_init_scale_growth_tracker(self, dev: Any) -> None:
        """Create the scale (and pick the path) on `dev`, a torch.device or a string, as
        torch's scale() does on its first call; torch's assertion if already created."""
        if self._growth_tracker is not None or self._path is not None:
            raise ScalerAssertionError("_growth_tracker initialized before _scale")
        if not self._enabled:  # enabled="auto" turned it off: no scale to create
            raise AttributeError("'GradScaler' object has no attribute '_scale'")
        self._placed(torch.device(dev))

    def _placed(self, device: torch.device) -> CorePath | DevicePath:
        """Create the scale on `device` and pick the path, once (torch's lazy init): torch's
        kernels off the CPU or with ``torch_kernels``, lscore's compiled core otherwise."""
        self._init_values = (self._reported, self._state.good_steps)
        if device.type != "cpu" or self.torch_kernels:
            self._path = DevicePath(self._state, device)
        else:
            self._path = CorePath(self._state, device, self._unscaler)
        return self._path

    def _check_scale_growth_tracker(self, funcname: str) -> Any:
        """(scale tensor, tracker tensor or None on the CPU path); raises before scale()."""
        path = self._path
        if path is None:
            self._no_scale(funcname)
        return path.scale, path.tracker

    def _no_scale(self, funcname: str) -> NoReturn:
        """torch's assertion for `funcname` called before the first scale() (torch's
        AttributeError for a scaler disabled from the start)."""
        self._has_state("_scale")
        raise ScalerAssertionError(f"Attempted {funcname} but _scale is None.  " + _FIX)

    def _unscale_grads_(
        self, optimizer: Any, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool
    ) -> dict:
        """torch's hook: multiply `optimizer`'s gradients by `inv_scale` with torch's kernel,
        per device and dtype; {device: found-inf tensor} (as ShardedGradScaler uses it)."""
        return unscale_with_kernel(optimizer, inv_scale, found_inf, allow_fp16)

    def _check_inf_per_device(self, optimizer: Any) -> dict:
        path = self._path
        if path is None:
            self._no_scale("_check_inf_per_device")
        found = agree(self._reducer, path.check(optimizer), path.scale.device)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = found
        return found

    def _found_inf_per_device(self, optimizer: Any) -> dict:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _maybe_opt_step(
        self, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any
    ) -> Any:
        retval = None
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            retval = optimizer.step(*args, **kwargs)
        return retval

    def _fused_step(self, optimizer: Any, state: Any, args: Any, kwargs: Any) -> Any:
        """step() of an optimizer that unscales and skips inside its own kernel (torch's
        contract: ``_step_supports_amp_scaling``)."""
        has_kwarg = "grad_scaler" in inspect.signature(optimizer.step).parameters
        if has_kwarg:
            warn_at_caller(
                "GradScaler is going to stop passing itself as a keyword argument to the "
                "passed optimizer. In the near future GradScaler registers `grad_scale: "
                "Tensor` and `found_inf: Tensor` to the passed optimizer and let the "
                "optimizer use them directly.",
                FutureWarning,
            )
            kwargs.update({"grad_scaler": self})
        else:
            if state["stage"] is OptState.READY:
                self._check_inf_per_device(optimizer)
            scale = self._get_scale_async()
            found_inf = sum(
                t.to(scale.device, non_blocking=True)
                for t in state["found_inf_per_device"].values()
            )
            optimizer.grad_scale = (
                getattr(optimizer, "grad_scale", None)
                if state["stage"] == OptState.UNSCALED
                else scale * getattr(optimizer, "grad_scale", 1)
            )
            optimizer.found_inf = found_inf
        retval = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        if not has_kwarg:
            del optimizer.grad_scale
            del optimizer.found_inf
        return retval
