"""The base of ``GradScaler``: torch.amp.GradScaler's private attributes (``_scale``,
``_growth_tracker``, ``_init_scale``, ...) read through the scaler's path (see _paths.py),
and the attributes ``GradScaler.__init__`` sets, declared for its other parts."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lscore.adapters.torch._paths import Unplaced, state_dict_with
from lscore.adapters.torch._unscaler import ScalerAssertionError, unscale_with_kernel
from lscore.policy import integer, real
from lscore.state import LossScaleState

__all__ = ["PathScaler"]

_FIX = (
    "This may indicate your script did not use scaler.scale(loss or outputs) "
    "earlier in the iteration."
)


class PathScaler(torch.amp.GradScaler):
    """torch's scale, growth tracker and their initial values, held by the path."""

    # set by GradScaler.__init__ (the path: _paths.Unplaced, a placed path, or Disabled)
    _device: str
    _auto: bool
    _enabled: bool
    _allow_fp16: bool
    _path: Any
    _reducer: Any
    _monitor_groups: list
    _last_skipped: Any
    _skipped: Any
    _growth_factor: Any
    _backoff_factor: Any
    _growth_interval: Any
    _steps_seen: int
    _schedules: tuple
    overflow_monitor: Any

    #: True: torch's own kernels check, unscale and update even for CPU tensors (the path
    #: every other device takes); set it before the first ``scale()``
    torch_kernels = False

    def _path_has(self, name: str) -> None:
        """A scaler disabled from the start has no state, scale or tracker (torch's neither)."""
        if self._path.state is None:
            raise AttributeError(f"'GradScaler' object has no attribute {name!r}")

    def _held(self, attr: str, name: str) -> Any:
        """The path's `attr`; when it is None, AttributeError `name` if the scaler has no state."""
        value = getattr(self._path, attr)
        if value is None:
            self._path_has(name)
        return value

    @property
    def _state(self) -> LossScaleState:
        """The host state machine (policy and counters; the scale on the CPU path)."""
        state: LossScaleState = self._held("state", "_state")
        return state

    @property  # torch's attribute, read-only here: the path owns the tensor
    def _scale(self) -> torch.Tensor | None:  # type: ignore[override]
        """torch's scale tensor, None before scale()."""
        scale: torch.Tensor | None = self._held("scale", "_scale")
        return scale

    @property  # torch's attribute, read-only here: the path owns the tensor
    def _growth_tracker(self) -> torch.Tensor | None:  # type: ignore[override]
        """torch's growth-tracker tensor (a copy on the CPU path), None before scale()."""
        self._path_has("_growth_tracker")
        return self._path.growth_tracker()

    @property
    def _on_device(self) -> bool:
        """True when torch's kernels do the work (the scale lives off the CPU)."""
        return self._path.on_device

    # (scale, growth tracker) the tensors were created with, or last loaded after that
    _init_values: tuple | None = None

    @property  # torch's attribute, read-only here: the path owns the value
    def _init_scale(self) -> float:
        """torch's: the value the scale tensor is (or was) created with, or the scale last
        loaded by load_state_dict.  Assigned before the first scale(), it is the scale the
        tensor will be created with, as in torch."""
        self._path_has("_init_scale")
        if self._path.scale is None or self._init_values is None:
            return self._path.get_scale()
        return self._init_values[0]

    @_init_scale.setter
    def _init_scale(self, value: float) -> None:
        self._set_init(real("_init_scale", value), None)

    @property
    def _init_growth_tracker(self) -> int:
        """torch's: the value the growth tracker is (or was) created with, or last loaded.
        Assigned before the first scale(), it is the count the tracker will start from,
        as in torch (whose load_state_dict overwrites it, as here)."""
        self._path_has("_init_growth_tracker")
        if self._path.scale is None or self._init_values is None:
            return self._path.good_steps()
        return self._init_values[1]

    @_init_growth_tracker.setter
    def _init_growth_tracker(self, value: int) -> None:
        self._set_init(None, integer("_init_growth_tracker", value, minimum=0))

    def _set_init(self, scale: float | None, tracker: int | None) -> None:
        """Assign torch's _init_scale or _init_growth_tracker (None: keep the other)."""
        self._path_has("_init_scale" if tracker is None else "_init_growth_tracker")
        path = self._path
        if isinstance(path, Unplaced):  # the tensors do not exist yet: they start from these
            state = path.state
            new_scale = path.get_scale() if scale is None else scale
            new_tracker = path.good_steps() if tracker is None else tracker
            d = state_dict_with(state, float(np.float32(new_scale)), good_steps=new_tracker)
            path.load(d, new_scale)
        else:  # torch keeps the attribute only: the tensors hold the scale and tracker
            old = self._init_values or (path.get_scale(), path.good_steps())
            self._init_values = (
                old[0] if scale is None else scale,
                old[1] if tracker is None else tracker,
            )

    def _lazy_init_scale_growth_tracker(self, dev: Any) -> None:
        """Create the scale (and pick the path) on `dev`, a torch.device or a string, as
        torch's scale() does on its first call; torch's assertion if already created."""
        if self._growth_tracker is not None or self._path.scale is not None:
            raise ScalerAssertionError("_growth_tracker initialized before _scale")
        self._placed_scale(torch.device(dev))

    def _unscale_grads_(
        self, optimizer: Any, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool
    ) -> dict:
        """torch's hook: multiply `optimizer`'s gradients by `inv_scale` with torch's kernel,
        per device and dtype; {device: found-inf tensor} (as ShardedGradScaler uses it)."""
        return unscale_with_kernel(optimizer, inv_scale, found_inf, allow_fp16)

    def _check_scale_growth_tracker(self, funcname: str) -> Any:
        """(scale tensor, tracker tensor or None on the CPU path); raises before scale()."""
        scale = self._scale
        if scale is None:
            raise ScalerAssertionError(f"Attempted {funcname} but _scale is None.  " + _FIX)
        return scale, self._path.tracker

    def _placed_scale(self, device: torch.device) -> torch.Tensor:
        """The scale tensor; the first call picks the path from `device` (torch's lazy init)."""
        if self._path.scale is None:
            self._init_values = (self._path.get_scale(), self._path.good_steps())
            self._path = self._path.place(device, self.torch_kernels)
        return self._path.scale
