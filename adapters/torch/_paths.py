"""The GradScaler's two paths: what holds the scale, and what unscales and updates it.

A GradScaler picks one, once, when its first ``scale()`` creates the scale tensor
on the loss's device (torch's lazy init):

- ``CorePath`` (CPU): lscore's compiled core unscales and checks every dense CPU
  gradient in one pass (``_unscaler.GradUnscaler``); the host state machine
  (``lscore.LossScaleState``) holds the scale and updates it, and a float32 tensor
  mirrors it for ``scale()``.
- ``DevicePath`` (other devices, or ``GradScaler.torch_kernels``): torch's own
  kernels (``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``)
  on the scale and growth-tracker tensors, so no host synchronisation.  Under a
  policy that is not torch's (``_config.is_torch_shape``) the host state machine
  updates instead and writes the tensors (one sync per step).

Both answer the same calls: ``unscale`` / ``check`` (an optimizer's gradients ->
{device: found-inf tensor}), ``clip`` (``unscale_and_clip_``), ``flags``, ``update``,
``get_scale`` / ``good_steps`` / ``growth_tracker``, ``set_scale``, ``set_policy``,
``loaded`` and ``pull``.  Beside them: ``agree`` (the found-inf flags of every rank of a
process group) and ``check_new_scale`` (torch's checks of ``update(new_scale)``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from lscore.adapters.torch import _cuda_clip
from lscore.adapters.torch._config import is_torch_shape
from lscore.adapters.torch._state_dict import replace_state
from lscore.adapters.torch._unscaler import (
    GradUnscaler,
    ScalerAssertionError,
    clip_unscaled,
    inverse_tensor,
    unscale_with_kernel,
)

# named here too for the torch LossScaleOptimizer
from lscore.adapters.torch._unscaler import named_grads as named_grads
from lscore.distributed import reduce_found_inf
from lscore.policy import Policy, inverse_scale
from lscore.state import LossScaleState

__all__ = ["CorePath", "DevicePath", "SkipCount", "agree", "check_new_scale"]


class _ScaleTensor:
    """A float32 scale tensor on the loss's device that mirrors the host state's scale
    (what the two paths share); the growth tracker's tensor too when `tracked`."""

    tracker: torch.Tensor | None = None  # torch's growth tracker tensor (the device path)

    def __init__(self, state: LossScaleState, device: torch.device, tracked: bool) -> None:
        self.state = state
        s = state.scale
        self.scale = torch.full((), s, dtype=torch.float32, device=device)
        self.written: float | None = s  # what the host last wrote into self.scale
        if tracked:
            self.tracker = torch.full((), state.good_steps, dtype=torch.int32, device=device)

    def write(self) -> None:
        """Copy the host state into the tensors (the scale only when it changed)."""
        s = self.state.scale
        if s != self.written:
            self.scale.fill_(s)
            self.written = s
        if self.tracker is not None:
            self.tracker.fill_(self.state.good_steps)

    def loaded(self) -> None:
        """The host state was replaced (a state dict, an assigned init value): write it."""
        self.written = None  # write the scale even when unchanged
        self.write()

    def set_host_scale(self, new_scale: Any) -> None:
        """update(new_scale) on the host state: a float or a checked one-element tensor."""
        if isinstance(new_scale, torch.Tensor):
            new_scale = new_scale.reshape(()).item()
        self.state.set_scale(float(np.float32(float(new_scale))))
        self.write()


class CorePath(_ScaleTensor):
    """CPU: lscore's compiled core unscales and checks; the host state machine updates."""

    on_device = False
    observes_always = True  # the found-inf flags are on the host already

    def __init__(self, state: LossScaleState, device: torch.device, unscaler: GradUnscaler):
        super().__init__(state, device, tracked=False)
        self.unscaler = unscaler

    def get_scale(self) -> float:
        return self.state.scale

    def good_steps(self) -> int:
        return self.state.good_steps

    def growth_tracker(self) -> torch.Tensor:
        return torch.full((), self.state.good_steps, dtype=torch.int32)  # a copy, as torch's

    def set_scale(self, new_scale: Any) -> None:
        self.set_host_scale(new_scale)

    def set_policy(self, policy: Policy) -> None:
        """Give the state machine `policy`, keeping the scale and growth tracker."""
        replace_state(self.state, policy=policy)

    def pull(self) -> None:
        """The host state is current already (the device path's copies it from the tensors)."""

    def unscale(self, optimizer: Any, allow_fp16: bool, stats: list | None = None) -> dict:
        inv = inverse_scale(self.state.scale)
        return self.unscaler(optimizer.param_groups, inv, allow_fp16, stats)

    def check(self, optimizer: Any) -> dict:
        return self.unscaler(optimizer.param_groups, 1.0, True)

    def clip(self, unscale: Any, optimizer: Any, params: list, args: tuple) -> torch.Tensor:
        """``unscale_and_clip_``: `unscale` (the scaler's) `optimizer`'s gradients, then clip
        `params` (`args`: max_norm, p and norm_type as given); for p 2 or inf the pass that
        unscales gathers the norm's parts (``clip_unscaled``)."""
        max_norm, p, _ = args
        stats: list | None = [] if p in (2.0, math.inf) else None
        found = unscale(optimizer, stats=stats)
        return clip_unscaled(params, max_norm, p, stats, found, self.unscaler)

    def flags(self, states: Any) -> list:
        """The found-inf flags of every optimizer's `states` (torch's per-optimizer dicts)."""
        return [f for st in states.values() for f in st["found_inf_per_device"].values()]

    def update(self, found_infs: list, advance: bool, factors: Any) -> tuple:
        """(skipped, scale before); `advance`: step the state machine."""
        # torch backs off when the sum of the flags (each 0 or 1) is nonzero
        skipped = any(f.item() for f in found_infs)
        before = self.state.scale
        if advance:
            self.state.update(not skipped)
            self.write()
        return skipped, before


class DevicePath(_ScaleTensor):
    """Off the CPU: torch's kernels unscale, check and, under torch's policy, update the
    scale and tracker tensors on the device; otherwise the host state machine does.
    Under torch's policy each call issues the tensor ops torch's GradScaler issues."""

    on_device = True
    observes_always = False  # reading the flag on the host is a sync
    tracker: torch.Tensor

    def __init__(self, state: LossScaleState, device: torch.device) -> None:
        super().__init__(state, device, tracked=True)
        # whether the policy is torch's, decided here and when the policy changes (never
        # per call): then torch's update kernel runs and the tensors hold the truth
        self.torch_shape = is_torch_shape(state.policy)

    def get_scale(self) -> float:
        return self.scale.item() if self.torch_shape else self.state.scale

    def good_steps(self) -> int:
        return int(self.tracker.item()) if self.torch_shape else self.state.good_steps

    def growth_tracker(self) -> torch.Tensor:
        return self.tracker

    def set_scale(self, new_scale: Any) -> None:
        if not self.torch_shape:
            self.set_host_scale(new_scale)
        elif isinstance(new_scale, torch.Tensor):
            self.scale.copy_(new_scale)
        else:
            self.scale.fill_(new_scale)

    def set_policy(self, policy: Policy) -> None:
        """Give the state machine `policy`, keeping the scale and growth tracker."""
        if self.torch_shape and not is_torch_shape(policy):
            self.pull()  # the host state machine takes over from torch's kernel
        replace_state(self.state, policy=policy)
        self.torch_shape = is_torch_shape(policy)

    def loaded(self) -> None:
        self.torch_shape = is_torch_shape(self.state.policy)
        super().loaded()

    def pull(self) -> None:
        """Bring the tensors' scale and tracker into the host state (torch's policy)."""
        if self.torch_shape:
            replace_state(self.state, self.scale.item(), int(self.tracker.item()))
            self.written = self.state.scale

    def unscale(self, optimizer: Any, allow_fp16: bool, stats: list | None = None) -> dict:
        inv = inverse_tensor(self.scale)  # first, as torch issues its ops
        found = torch.full((), 0.0, dtype=torch.float32, device=self.scale.device)
        return unscale_with_kernel(optimizer, inv, found, allow_fp16)

    def check(self, optimizer: Any) -> dict:
        one = torch.full((), 1.0, dtype=torch.float32, device=self.scale.device)
        found = torch.full((), 0.0, dtype=torch.float32, device=self.scale.device)
        return unscale_with_kernel(optimizer, one, found, True)

    def clip(self, unscale: Any, optimizer: Any, params: list, args: tuple) -> torch.Tensor:
        """``unscale_and_clip_``: dense CUDA gradients and p 2 or inf take lscore's one-pass
        kernels (adapters/torch/_cuda_clip.py); others `unscale` (the scaler's), then
        torch's ``clip_grad_norm_``.  `args`: max_norm, p and norm_type as given."""
        max_norm, p, norm_type = args
        one = _cuda_clip.OnePass.of(params, self.scale, p)
        if one is None:
            unscale(optimizer)
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        found = unscale(optimizer, unscale=one)
        return one.clip(max_norm, found, params[0].grad.dtype)

    def flags(self, states: Any) -> list:
        device = self.scale.device
        return [
            f.to(device=device, non_blocking=True)
            for st in states.values()
            for f in st["found_inf_per_device"].values()
        ]

    def update(self, found_infs: list, advance: bool, factors: Any) -> tuple | None:
        """(skipped, scale before): skipped is the sum of the found-inf flags, a device
        tensor (above 0: skipped), and "before" the scale the host last wrote; None when
        nothing was recorded.  `factors`: torch's growth factor, backoff factor and
        interval as the scaler was given them."""
        if not found_infs:
            return None
        combined = found_infs[0]
        for f in found_infs[1:]:
            combined += f  # in place, as torch sums them (each flag is 0 or 1)
        if advance:
            if self.torch_shape:
                torch._amp_update_scale_(self.scale, self.tracker, combined, *factors)
            else:
                self.state.update(not combined.item())
                self.write()
        # "before" is what the host last wrote: under torch's kernel that is older
        # than the scale the kernel just replaced
        return combined, self.written


class SkipCount:
    """How many steps were skipped, counted without a host sync.

    A step of the device path leaves its verdict on the device (the sum of its
    found-inf flags, skipped when above 0): those are kept and counted in one
    reduction when the count is read, or on the device every `FOLD` steps so that
    at most that many are held.
    """

    FOLD = 1024
    __slots__ = ("counted", "folded", "pending")

    def __init__(self, counted: int = 0) -> None:
        self.counted = counted  # steps counted on the host
        self.folded: torch.Tensor | None = None  # a device count of earlier verdicts
        self.pending: list = []  # verdicts not yet counted

    def add(self, skipped: Any) -> None:
        """Count one step: `skipped` a bool, or a device verdict (counted later)."""
        if isinstance(skipped, torch.Tensor):
            pending = self.pending
            pending.append(skipped)
            if len(pending) >= self.FOLD:
                self._fold()
        elif skipped:
            self.counted += 1

    def _fold(self) -> None:
        n = torch.stack(self.pending).gt(0).sum()
        self.folded = n if self.folded is None else self.folded + n
        self.pending = []

    def __int__(self) -> int:
        """The count (waits for the device when verdicts are pending there)."""
        if self.pending:
            self._fold()
        if self.folded is not None:
            self.counted += int(self.folded.item())
            self.folded = None
        return self.counted


def agree(reducer: Any, found: dict, device: torch.device) -> dict:
    """`found` ({device: found-inf tensor}), or with a process group's `reducer` one flag
    on `device` (the scale's), the OR over every rank (lscore.distributed; read on the
    host, as step() reads it anyway)."""
    if reducer is None:
        return found
    local = any(bool(f.item()) for f in found.values())
    flag = reduce_found_inf(reducer, local)
    return {device: torch.full((), float(flag), dtype=torch.float32, device=device)}


def check_new_scale(new_scale: Any, device_type: str) -> None:
    """torch's checks of ``update(new_scale)``: a float, or a one-element tensor on the
    scaler's device type that does not require grad."""
    if isinstance(new_scale, torch.Tensor):
        reason = (
            "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
            "torch.FloatTensor with requires_grad=False."
        )
        if new_scale.device.type != device_type:
            raise ScalerAssertionError(reason)
        if new_scale.numel() != 1:
            raise ScalerAssertionError(reason)
        if new_scale.requires_grad is True:
            raise ScalerAssertionError(reason)
    elif not isinstance(new_scale, (int, float)) or isinstance(new_scale, bool):
        raise TypeError(
            f"new_scale must be a float or a 1-element tensor, got {type(new_scale).__name__}"
        )
