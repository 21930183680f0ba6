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
``set_scale``, ``load`` and ``pickled``.  torch's policy, as an lscore Policy, is
here too: it decides whether torch's update kernel can run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from lscore import kernels
from lscore.dtypes import Code
from lscore.policy import Policy, scale_bounds
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


def clip_coefficient(max_norm: float, total: torch.Tensor) -> torch.Tensor:
    """torch's ``clip_grad_norm_`` coefficient: ``max_norm / (total + 1e-6)``, at most 1."""
    return torch.clamp(max_norm / (total + 1e-6), max=1.0)


# the parameters that make a Policy torch's, besides the four torch exposes
_TORCH_SHAPE: dict[str, Any] = dict(
    precision="float32_float64",
    growth_mode="eq",
    growth_offset=0,
    backoff_mode="multiply",
    min_action="clamp",
    guard_finite=True,
    refill=("finite",),
    hysteresis_saturate=False,
    apply_nonfinite=False,
    flush_subnormal=False,
    apply_next=False,
)


class ScalerAssertionError(RuntimeError, AssertionError):
    """Raised where torch's GradScaler raises AssertionError for call-order misuse.

    A RuntimeError, as lscore's contract says, and still an AssertionError so
    code written against torch keeps catching it.
    """


def torch_policy(
    init_scale: Any = 2.0**16,
    growth_factor: Any = 2.0,
    backoff_factor: Any = 0.5,
    growth_interval: Any = 2000,
    *,
    min_scale: Any = None,
    max_scale: Any = None,
    hysteresis: Any = 1,
) -> Policy:
    """The Policy of ``torch.amp.GradScaler``, plus lscore's clamps and hysteresis.

    ``hysteresis`` overflows in a row are needed for one backoff; every finite
    step refills the count (NeMo's rule); 1 is torch's behaviour.  A
    ``min_scale`` above or a ``max_scale`` below ``init_scale`` is refused.
    """
    p = Policy(
        name="torch",
        init_scale=init_scale,
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
        growth_interval=growth_interval,
        hysteresis=hysteresis,
        min_scale=min_scale,
        max_scale=max_scale,
        **_TORCH_SHAPE,
    )
    scale_bounds(p.init_scale, p.min_scale, p.max_scale)
    return p


def is_torch_shape(p: Policy) -> bool:
    """True when `p` behaves exactly as torch.amp.GradScaler with p's four numbers."""
    return p.replace(name="torch") == torch_policy(
        p.init_scale, p.growth_factor, p.backoff_factor, p.growth_interval
    )


def _reciprocal(scale: float) -> float:
    """torch's inv_scale: the float64 reciprocal of the float32 scale, rounded to float32."""
    if scale == 0.0:
        return math.copysign(math.inf, scale)
    return float(np.float32(1.0 / scale))


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
    torch's kernel per group; {device: found-inf tensor}."""
    groups: dict = {}
    with torch.no_grad():
        for group in optimizer.param_groups:
            for param in group["params"]:
                if not isinstance(param, torch.Tensor):
                    raise ScalerAssertionError(
                        f"expected param to be torch.Tensor, got {type(param).__name__}"
                    )
                if param.grad is None:
                    continue
                if not allow_fp16 and param.grad.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                _group(groups, _sparse_values(param))
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

    def get_scale(self) -> float:
        raise NotImplementedError

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
        self.reported = self.state.scale if reported is None else reported

    def place(self, device: torch.device, torch_kernels: bool) -> _Placed:
        """The path for a scale on `device` (torch's kernels off the CPU, or when asked)."""
        if device.type != "cpu" or torch_kernels:
            return _DevicePath(self.state, device, self.unscaler)
        return _CorePath(self.state, device, self.unscaler)


class Disabled:
    """A disabled scaler: the scale is 1.0 and nothing is unscaled or updated.

    One that ``enabled="auto"`` disabled keeps the path it had (its policy can
    still be set, and pickles carry it, as before).
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
            optimizer.param_groups, _reciprocal(self.state.scale), allow_fp16, stats
        )

    def check(self, optimizer: Any) -> dict:
        return self.unscaler(optimizer.param_groups, 1.0, True)

    def flags(self, found_infs: list) -> list:
        return found_infs

    def update(self, found_infs: list, advance: bool, factors: Any) -> tuple:
        """(skipped, how many skipped, scale before); `advance`: step the state machine."""
        # torch backs off when the sum of the flags (each 0 or 1) is nonzero
        skipped = any(f.item() for f in found_infs)
        before = self.state.scale
        if advance:
            self.state.update(not skipped)
            self._write()
        return skipped, skipped, before


class _DevicePath(_Placed):
    """Off the CPU: torch's kernels unscale, check and, under torch's policy, update the
    scale and tracker tensors on the device; otherwise the host state machine does."""

    on_device = True
    observes_always = False  # reading the flag on the host is a sync
    tracker: torch.Tensor

    def __init__(self, state: Any, device: Any, unscaler: Any) -> None:
        super().__init__(state, device, unscaler, tracked=True)

    @property
    def _kernel(self) -> bool:
        """True when torch's _amp_update_scale_ runs: the tensors hold the scale."""
        return is_torch_shape(self.state.policy)

    def get_scale(self) -> float:
        return self.scale.item() if self._kernel else self.state.scale

    def good_steps(self) -> int:
        return int(self.tracker.item()) if self._kernel else super().good_steps()

    def set_scale(self, new_scale: Any) -> None:
        if not self._kernel:
            super().set_scale(new_scale)
        elif isinstance(new_scale, torch.Tensor):
            self.scale.copy_(new_scale)
        else:
            self.scale.fill_(new_scale)

    def pull(self) -> None:
        if self._kernel:
            replace_state(self.state, self.scale.item(), int(self.tracker.item()))
            self.written = self.state.scale

    def unscale(self, optimizer: Any, allow_fp16: bool, stats: list | None = None) -> dict:
        scale = self.scale
        # FP32 division can be imprecise; torch takes the reciprocal in FP64
        inv = (
            scale.double().reciprocal().float()
            if scale.device != torch.device("mps:0")
            else scale.reciprocal()
        )
        found = torch.full((), 0.0, dtype=torch.float32, device=scale.device)
        return unscale_with_kernel(optimizer, inv, found, allow_fp16)

    def check(self, optimizer: Any) -> dict:
        one = torch.full((), 1.0, dtype=torch.float32, device=self.scale.device)
        found = torch.full((), 0.0, dtype=torch.float32, device=self.scale.device)
        return unscale_with_kernel(optimizer, one, found, True)

    def flags(self, found_infs: list) -> list:
        return [f.to(device=self.scale.device, non_blocking=True) for f in found_infs]

    def update(self, found_infs: list, advance: bool, factors: Any) -> tuple | None:
        """(skipped, how many skipped, scale before) as device tensors and the last value
        written from the host; None when nothing was recorded.  `factors`: torch's
        growth factor, backoff factor and interval as the scaler was given them."""
        if not found_infs:
            return None
        combined = found_infs[0]
        for f in found_infs[1:]:
            combined = combined + f
        if advance:
            if self._kernel:
                torch._amp_update_scale_(self.scale, self.tracker, combined, *factors)
            else:
                self.state.update(not combined.item())
                self._write()
        skipped = combined > 0
        # "before" is what the host last wrote, as it always was here: under torch's
        # kernel that is older than the scale the kernel just replaced
        return skipped, skipped.to(torch.int64), self.written
