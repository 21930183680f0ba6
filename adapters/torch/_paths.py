"""The GradScaler's paths (how the gradients are unscaled and checked: _unscaler.py).

A GradScaler picks one path once, when the device becomes known (its first
``scale()``), and the path holds the scale:

- ``_CorePath`` (CPU): lscore's compiled core.  Dense CPU gradients are read as
  zero-copy buffers (through the DLPack C exchange API of ``torch.Tensor``),
  unscaled and checked in one pass; the scale is the ``LossScaleState``'s (a
  float32 tensor mirrors it for ``scale()``).
- ``_DevicePath`` (other devices): torch's own kernels
  (``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``), so no
  host synchronisation; the scale and growth tracker are device tensors.  With
  an lscore-only option the host state machine updates them instead (one sync).
- ``Unplaced`` (before the first ``scale()``) and ``Disabled``.

Each answers the same calls: ``unscale`` / ``check`` (an optimizer's gradients ->
{device: found-inf tensor}), ``update``, ``get_scale`` / ``good_steps``,
``set_scale``, ``load`` and ``pickled``.  Whether the policy is torch's
(``_config.is_torch_shape``) decides whether torch's update kernel can run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lscore.adapters.torch._config import is_torch_shape
from lscore.adapters.torch._unscaler import GradUnscaler, unscale_with_kernel

# named here too for the torch LossScaleOptimizer
from lscore.adapters.torch._unscaler import named_grads as named_grads
from lscore.policy import Policy, inverse_scale, json_float
from lscore.state import LossScaleState


def inverse_tensor(scale: torch.Tensor) -> torch.Tensor:
    """``lscore.policy.inverse_scale`` of a float32 scale tensor, on its device (no host
    sync), as torch's GradScaler takes it: the float64 reciprocal rounded to float32
    (float32 division can be imprecise), except on MPS, which has no float64."""
    if scale.device.type == "mps":
        return scale.reciprocal()
    return scale.double().reciprocal().float()


def state_dict_with(
    state: Any, scale: float, policy: Policy | None = None, **counters: Any
) -> dict:
    """`state`'s state dict with another scale, policy and counters."""
    d = state.state_dict()
    d["policy"] = (policy or state.policy).to_dict()
    d["scale"] = json_float(scale)
    d["counters"].update(counters)
    return d


def replace_state(state: Any, scale: float, good_steps: int, policy: Policy | None = None) -> None:
    """Replace `state`'s scale, growth tracker and (optionally) policy."""
    state.load_state_dict(state_dict_with(state, scale, policy, good_steps=int(good_steps)))


class _Path:
    """An enabled scaler's path: the host state machine, and the CPU unscaler (reused
    from step to step; a pickle names it)."""

    on_device = False  # torch's kernels unscale (and, under torch's policy, update)
    scale: torch.Tensor | None = None  # the float32 scale tensor, once placed
    tracker: torch.Tensor | None = None  # torch's growth tracker tensor (the device path only)

    def __init__(self, state: LossScaleState, unscaler: GradUnscaler | None = None):
        self.state = state
        self.unscaler = GradUnscaler() if unscaler is None else unscaler
        # whether the policy is torch's (decided here and when the policy changes, never
        # per call): then torch's update kernel runs on a device and the state dict is
        # torch's five keys
        self.torch_shape = is_torch_shape(state.policy)

    def get_scale(self) -> float:
        raise NotImplementedError

    def set_policy(self, policy: Policy) -> None:
        """Give the state machine `policy`, keeping the scale and growth tracker."""
        if self.torch_shape and not is_torch_shape(policy):
            self.pull()  # the host state machine takes over from torch's kernel
        state = self.state
        replace_state(state, state.scale, state.counters()["good_steps"], policy)
        self.torch_shape = is_torch_shape(policy)

    def good_steps(self) -> int:
        return self.state.counters()["good_steps"]

    def growth_tracker(self) -> torch.Tensor | None:
        return self.tracker

    def pull(self) -> None:
        """Bring the device's scale and tracker into the host state (the device path)."""

    def pickled(self) -> dict:
        """The scale's part of a pickled GradScaler, in the single-module adapter's keys."""
        self.pull()
        return {
            "_state": self.state,
            "_init_scale": self.get_scale(),
            "_scale": None,
            "_tracker_t": None,
            "_scale_value": None,
            "_unscaler": self.unscaler,
        }


class Unplaced(_Path):
    """Enabled, before the first ``scale()``: the device, hence the path, is unknown.

    Until then ``get_scale()`` reports the scale as given, unrounded, as torch does;
    the state machine already holds it in float32.
    """

    def __init__(self, state: LossScaleState, reported: float, unscaler: Any = None) -> None:
        super().__init__(state, unscaler)
        self.reported = reported

    def get_scale(self) -> float:
        return self.reported

    def load(self, d: dict, reported: float | None) -> None:
        self.state.load_state_dict(d)
        self.torch_shape = is_torch_shape(self.state.policy)
        self.reported = self.state.scale if reported is None else reported

    def place(self, device: torch.device, torch_kernels: bool) -> _Placed:
        """The path for a scale on `device` (torch's kernels off the CPU, or when asked)."""
        if device.type != "cpu" or torch_kernels:
            return _DevicePath(self.state, device, self.unscaler)
        return _CorePath(self.state, device, self.unscaler)


class Disabled:
    """A disabled scaler: the scale is 1.0 and nothing is unscaled or updated.

    One that ``enabled="auto"`` disabled keeps the path it had: its policy can
    still be set, and pickles carry it.
    """

    on_device = False
    scale = tracker = None

    def __init__(self, held: Unplaced | None = None):
        self.held = held

    @property
    def state(self) -> LossScaleState | None:
        return None if self.held is None else self.held.state

    def get_scale(self) -> float:
        return 1.0

    def good_steps(self) -> int:
        return 0

    def growth_tracker(self) -> None:
        return None

    def pickled(self) -> dict:
        return {} if self.held is None else self.held.pickled()

    def set_policy(self, policy: Policy) -> None:
        if self.held is not None:  # enabled="auto" disabled it: the held path keeps it
            self.held.set_policy(policy)


class _Placed(_Path):
    """A path whose scale tensor exists (created on the first ``scale()``'s device)."""

    scale: torch.Tensor
    written: float | None

    def __init__(
        self, state: LossScaleState, device: torch.device, unscaler: Any, tracked: bool
    ) -> None:
        super().__init__(state, unscaler)
        s = state.scale
        self.scale = torch.full((), s, dtype=torch.float32, device=device)
        self.written = s  # what the host last wrote into self.scale
        if tracked:
            self.tracker = torch.full(
                (), state.counters()["good_steps"], dtype=torch.int32, device=device
            )

    def _write(self) -> None:
        """Copy the host state into the tensors (the scale only when it changed)."""
        s = self.state.scale
        if s != self.written:
            self.scale.fill_(s)
            self.written = s
        if self.tracker is not None:
            self.tracker.fill_(self.state.counters()["good_steps"])

    def get_scale(self) -> float:
        return self.state.scale

    def set_scale(self, new_scale: Any) -> None:
        """update(new_scale): a float or a checked one-element tensor."""
        if isinstance(new_scale, torch.Tensor):
            new_scale = new_scale.reshape(()).item()
        self.state.set_scale(float(np.float32(float(new_scale))))
        self._write()

    def load(self, d: dict, reported: float | None) -> None:
        self.state.load_state_dict(d)
        self.torch_shape = is_torch_shape(self.state.policy)
        self.written = None  # write the scale even when unchanged
        self._write()


class _CorePath(_Placed):
    """CPU: lscore's compiled core unscales and checks; the host state machine updates."""

    observes_always = True  # the found-inf flags are on the host already

    def __init__(self, state: Any, device: Any, unscaler: Any) -> None:
        super().__init__(state, device, unscaler, tracked=False)

    def growth_tracker(self) -> torch.Tensor:
        return torch.full((), self.good_steps(), dtype=torch.int32)  # a copy, as torch's

    def unscale(self, optimizer: Any, allow_fp16: bool, stats: list | None = None) -> dict:
        return self.unscaler(
            optimizer.param_groups, inverse_scale(self.state.scale), allow_fp16, stats
        )

    def check(self, optimizer: Any) -> dict:
        return self.unscaler(optimizer.param_groups, 1.0, True)

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
            self._write()
        return skipped, before


class _DevicePath(_Placed):
    """Off the CPU: torch's kernels unscale, check and, under torch's policy, update the
    scale and tracker tensors on the device; otherwise the host state machine does.
    Under torch's policy each call issues the tensor ops torch's GradScaler issues."""

    on_device = True
    observes_always = False  # reading the flag on the host is a sync
    tracker: torch.Tensor

    def __init__(self, state: Any, device: Any, unscaler: Any) -> None:
        super().__init__(state, device, unscaler, tracked=True)

    def get_scale(self) -> float:
        return self.scale.item() if self.torch_shape else self.state.scale

    def good_steps(self) -> int:
        return int(self.tracker.item()) if self.torch_shape else super().good_steps()

    def set_scale(self, new_scale: Any) -> None:
        if not self.torch_shape:
            super().set_scale(new_scale)
        elif isinstance(new_scale, torch.Tensor):
            self.scale.copy_(new_scale)
        else:
            self.scale.fill_(new_scale)

    def pull(self) -> None:
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
                self._write()
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
