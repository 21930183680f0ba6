"""The GradScaler's paths, and how the torch adapter unscales and checks gradients.

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

from collections import defaultdict
from typing import Any

import numpy as np
import torch

from lscore import kernels
from lscore.adapters.torch._config import is_torch_shape
from lscore.dtypes import Code
from lscore.policy import Policy, inverse_scale
from lscore.state import LossScaleState
from lscore.state import json_float as _json_scale

_CPU = torch.device("cpu")
# torch dtype -> the core's dtype code, for every dtype the kernels read
TORCH_CODES = {
    torch.float16: int(Code.F16),
    torch.bfloat16: int(Code.BF16),
    torch.float32: int(Code.F32),
    torch.float64: int(Code.F64),
}


class ScalerAssertionError(RuntimeError, AssertionError):
    """Raised where torch's GradScaler raises AssertionError for call-order misuse.

    A RuntimeError, as lscore's contract says, and still an AssertionError so
    code written against torch keeps catching it.
    """


def inverse_tensor(scale: torch.Tensor) -> torch.Tensor:
    """``lscore.policy.inverse_scale`` of a float32 scale tensor, on its device (no host
    sync), as torch's GradScaler takes it: the float64 reciprocal rounded to float32
    (float32 division can be imprecise), except on MPS, which has no float64."""
    if scale.device.type == "mps":
        return scale.reciprocal()
    return scale.double().reciprocal().float()


def _kernel_unscale(groups: Any, inv_scale: Any, found_inf: Any, found_per_device: Any) -> None:
    """torch's own check-and-unscale over {device: {dtype: [tensors]}}."""
    for device, per_dtype in groups.items():
        found = found_per_device.get(device)
        if found is None:
            found = found_inf.to(device=device, non_blocking=True, copy=True)
            found_per_device[device] = found
        inv = inv_scale.to(device=device, non_blocking=True, copy=True)
        for grads in per_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)


def _group(groups: Any, t: Any) -> None:
    groups.setdefault(t.device, {}).setdefault(t.dtype, []).append(t)


def _sparse_values(param: Any) -> torch.Tensor:
    """What torch unscales for `param`: its grad, or a sparse grad's values
    (a float16 sparse grad is coalesced first, replacing ``.grad``)."""
    g = param.grad
    if not g.is_sparse:
        return g
    if g.dtype is torch.float16:
        param.grad = g = g.coalesce()
    return g._values()


def unscale_with_kernel(optimizer: Any, inv_scale: Any, found_inf: Any, allow_fp16: Any) -> dict:
    """torch's algorithm (``GradScaler._unscale_grads_``): group by device and dtype, run
    torch's kernel per group; {device: found-inf tensor}.  The loop is torch's, inline (a
    helper call per gradient would cost more than torch's whole loop body)."""
    groups: defaultdict = defaultdict(lambda: defaultdict(list))
    with torch.no_grad():
        for group in optimizer.param_groups:
            for param in group["params"]:
                if not isinstance(param, torch.Tensor):
                    raise ScalerAssertionError(
                        f"expected param to be torch.Tensor, got {type(param).__name__}"
                    )
                g = param.grad
                if g is None:
                    continue
                if not allow_fp16 and g.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                if g.is_sparse:
                    g = _sparse_values(param)
                groups[g.device][g.dtype].append(g)
        found: dict = {}
        _kernel_unscale(groups, inv_scale, found_inf, found)
    return found


class GradUnscaler:
    """lscore's path for the gradients of some parameter groups: every dense CPU
    gradient in one zero-copy table (reused from call to call) and one fused
    unscale-and-check pass in the compiled core; the rest through torch's kernel."""

    __slots__ = ("_table", "_whole")

    def __init__(self) -> None:
        self._table: kernels.GradTable | None = None
        self._whole = False  # the last call's table held every gradient

    def __reduce__(self) -> tuple:
        return (GradUnscaler, ())

    def __call__(
        self, param_groups: Any, inv: float, allow_fp16: bool, stats: list | None = None
    ) -> dict:
        """Multiply every gradient by `inv` in place; {device: found_inf tensor} (1.0 where a
        gradient held NaN/Inf before the multiply), for the devices that had gradients.

        With a list `stats`, appends (sum of squares, largest magnitude) pairs of the
        unscaled gradients (gathered in the same memory pass for the tabled ones)."""
        table = self._table
        if table is None:
            table = self._table = kernels.GradTable(
                torch.Tensor, TORCH_CODES, torch.strided, torch.Tensor, ScalerAssertionError, 256
            )
        table.clear()
        self._whole = False
        written: list = []
        others: list = []
        table.collect_grads(param_groups, allow_fp16, written, others)
        self._whole = not others
        found: dict = {}
        if others:
            groups: dict = {}
            with torch.no_grad():
                for param in others:
                    t = _sparse_values(param)
                    code = TORCH_CODES.get(t.dtype)
                    if code is not None and table.add_tensor(t, code):
                        written.append(t)
                    else:
                        _group(groups, t)
                if groups:
                    _kernel_unscale(
                        groups,
                        torch.full((), inv, dtype=torch.float32),
                        torch.zeros((), dtype=torch.float32),
                        found,
                    )
                    if stats is not None:
                        stats.extend(
                            _stats(t)
                            for per_dtype in groups.values()
                            for ts in per_dtype.values()
                            for t in ts
                        )
        if written:
            # like torch's kernel, this leaves the autograd version counters alone
            if stats is None:
                finite = kernels.unscale_raw(*table.views(), inv)
            else:
                finite, norm, maxabs = kernels.unscale_raw(*table.views(), inv, True)
                stats.append((norm * norm, maxabs))
            cpu = found.get(_CPU)
            if cpu is None:
                found[_CPU] = torch.full((), 0.0 if finite else 1.0, dtype=torch.float32)
            elif not finite:
                cpu.fill_(1.0)
        return found

    def multiply(self, factor: float, dtype: torch.dtype) -> bool:
        """Multiply the gradients of the last call by `factor` in place, in one pass of
        the compiled core, as ``torch._foreach_mul_`` by a 0-dim tensor of `dtype`
        holding `factor` does (float16 and bfloat16 widened, times float32(factor),
        rounded to nearest even); False, touching nothing, unless the last call's
        table held every gradient and all of `dtype`.  Call it right after that call,
        while its gradients are still the parameters' ``.grad``."""
        code = TORCH_CODES.get(dtype)
        table = self._table
        if table is None or not self._whole or code is None:
            return False
        ptrs, counts, strides, codes = table.views()
        if not (codes == code).all():
            return False
        if len(codes):
            kernels.unscale_raw(ptrs, counts, strides, codes, factor)
        return True


def _stats(t: torch.Tensor) -> tuple:
    """(sum of squares, largest magnitude) of one tensor, in float64."""
    if t.numel() == 0:
        return 0.0, 0.0
    t = t.detach().to(torch.float64)
    return float(torch.linalg.vector_norm(t)) ** 2, float(t.abs().max())


def named_grads(monitor: Any, groups: Any) -> list:
    """(name, NumPy view) of every gradient, for the overflow report (skipped steps only)."""
    out = []
    for gi, param_groups in enumerate(groups):
        for k, group in enumerate(param_groups):
            for i, p in enumerate(group["params"]):
                g = getattr(p, "grad", None)
                if g is None:
                    continue
                g = g.detach()
                g = (g.coalesce()._values() if g.is_sparse else g).cpu()
                fmt = None
                if g.dtype is torch.bfloat16:
                    g, fmt = g.view(torch.int16), "bfloat16"
                name = monitor.name_of(p, f"optimizer{gi}.param_groups[{k}][{i}]")
                out.append((name, (g.numpy(), fmt) if fmt else g.numpy()))
    return out


def state_dict_with(
    state: Any, scale: float, policy: Policy | None = None, **counters: Any
) -> dict:
    """`state`'s state dict with another scale, policy and counters."""
    d = state.state_dict()
    d["policy"] = (policy or state.policy).to_dict()
    d["scale"] = _json_scale(scale)
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
