"""The rate formulas of torch's schedulers, as functions of a tensor of step counts, for
``SkipAwareLR``.

The formulas are torch's ``_get_closed_form_lr`` (and ``get_lr`` for ``LambdaLR`` and
``OneCycleLR``, which are closed forms already), evaluated in float64 where the
device has it.  ``Builder(optimizer, device).rate(scheduler)`` reads a scheduler's
parameters once and returns its ``Rate``; ``supported`` says why a scheduler whose
rate is no function of the count is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim import lr_scheduler as sch
from torch.utils._python_dispatch import TorchDispatchMode

# step counts (an (n, 1) float tensor holding integers) -> the rates, (n, groups)
Rate = Callable[[torch.Tensor], torch.Tensor]

# why each scheduler of torch.optim.lr_scheduler that SkipAwareLR does not take needs the
# synchronous form (its rate is not a closed-form function of the count of applied steps)
_WHY_NOT = {
    "ReduceLROnPlateau": "its rate follows the metric passed to step(), a value on the host",
    "CyclicLR": (
        "it calls its scale_fn, Python code, on host numbers each step and cycles the "
        "momentum, which fused optimizers read as a Python number"
    ),
    "CosineAnnealingWarmRestarts": (
        "its position follows the epoch passed to step() (often fractional, "
        "epoch + i / iters), a value on the host"
    ),
    "ChainedScheduler": (
        "its rate is the running product of its schedulers' steps on the current rate, "
        "not a function of the count"
    ),
    "MultiplicativeLR": "its rate is the running product of lr_lambda's values",
}
_SYNC_FORM = (
    "step it when `not scaler.last_step_skipped` instead (a host synchronisation each step)"
)


class _HostRead(Exception):
    """A tensor was read on the host (``aten._local_scalar_dense``)."""


class _NoHostReads(TorchDispatchMode):
    """Raises _HostRead where an op reads a tensor's value on the host (``.item()``,
    ``bool()``, ``float()``, ``int()``, indexing with a 0-d tensor)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            raise _HostRead
        return func(*args, **(kwargs or {}))


def _pick(rows: list[torch.Tensor], index: torch.Tensor) -> torch.Tensor:
    """For each count n, ``rows[index[n]][n]``: `rows` are (n, groups), `index` (n, 1)."""
    stacked = torch.stack(rows)
    return torch.gather(stacked, 0, index.unsqueeze(0).expand(1, *stacked.shape[1:]))[0]


def supported(s: Any, inner: bool = False) -> type:
    """The type of `s` when SkipAwareLR computes its rate (inside a SequentialLR when
    `inner`), else TypeError saying why not."""
    kind = type(s).__name__
    if inner and type(s) is sch.SequentialLR:
        why = "torch's SequentialLR cannot restart a nested SequentialLR at a milestone"
    elif type(s) in _BUILDERS:
        return type(s)
    else:
        why = _WHY_NOT.get(kind, "its get_lr() is Python code on the current rate")
    raise TypeError(
        f"unsupported scheduler {kind} ({why}); SkipAwareLR takes "
        f"{', '.join(_NAMES)} and SequentialLR of these; {_SYNC_FORM}"
    )


class Builder:
    """Builds the Rate of a torch scheduler: its parameters read once, its constants
    placed on the device the rates are written on."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.groups = optimizer.param_groups
        self.device = device
        # float64 where the device has it (MPS does not)
        self.dtype = torch.float32 if device.type == "mps" else torch.float64

    def tensor(self, values: Sequence[Any]) -> torch.Tensor:
        return torch.tensor([float(v) for v in values], dtype=self.dtype, device=self.device)

    def rate(self, s: Any, inner: bool = False, base: torch.Tensor | None = None) -> Rate:
        """The Rate of `s` (a scheduler inside a SequentialLR when `inner`), from `base`
        (default: its ``base_lrs``) where its formula scales a base rate."""
        build = _BUILDERS[supported(s, inner)]
        if base is None and hasattr(s, "base_lrs"):
            base = self.tensor(s.base_lrs)
        return build(self, s, base)


def _lambda(b: Builder, s: sch.LambdaLR, base: Any) -> Rate:
    probe = torch.arange(3, dtype=b.dtype, device=b.device)
    fns: list[Any] = list(s.lr_lambdas)  # called with a tensor, where torch passes an int
    constants: list[torch.Tensor | None] = []  # the value of a lambda that returns a number
    for i, fn in enumerate(fns):
        try:  # one count first: a host read of several would fail before it reads
            with _NoHostReads():
                fn(probe[0])
                out = fn(probe)
        except _HostRead:
            raise ValueError(
                f"LambdaLR's lr_lambda[{i}] must be written in elementwise torch ops on a "
                f"{str(b.dtype).replace('torch.', '')} tensor of step counts (torch.where, "
                f"torch.clamp, **), got {fn!r}, which reads it on the host (if, min, float, "
                f"math)"
            ) from None
        if not isinstance(out, torch.Tensor):  # a number: it cannot depend on the count
            constants.append(torch.full((), float(out), dtype=b.dtype, device=b.device))
            continue
        # the rates are tabulated: the function must give, for a tensor of counts, what it
        # gives for each count alone (within float64 rounding: vector kernels may differ)
        each = [fn(c) for c in probe]
        if not (
            out.device == b.device
            and out.shape in ((), probe.shape)
            and all(isinstance(v, torch.Tensor) and v.numel() == 1 for v in each)
            and torch.allclose(
                out.to(b.dtype).expand(probe.shape),
                torch.stack([v.to(b.dtype).reshape(()) for v in each]),
                rtol=1e-12,
                atol=0.0,
            )
        ):
            raise ValueError(
                f"LambdaLR's lr_lambda[{i}] must work elementwise on a tensor of step counts "
                f"on {b.device} (one rate per count), got {fn!r}, which gave {out!r} for "
                f"the counts {probe!r}"
            )
        constants.append(None)

    def rate(e: torch.Tensor) -> torch.Tensor:
        counts = e[:, 0]
        values = [
            (fn(counts) if c is None else c).to(b.dtype).expand(counts.shape)
            for fn, c in zip(fns, constants, strict=True)
        ]
        return base * torch.stack(values, dim=1)

    return rate


def _step(b: Builder, s: sch.StepLR, base: Any) -> Rate:
    gamma, size = float(s.gamma), s.step_size
    return lambda e: base * gamma ** torch.div(e, size, rounding_mode="floor")


def _multistep(b: Builder, s: sch.MultiStepLR, base: Any) -> Rate:
    gamma = float(s.gamma)
    milestones = b.tensor(sorted(s.milestones.elements()))
    # torch's bisect_right(milestones, epoch): how many milestones are <= the epoch
    return lambda e: base * gamma ** (milestones <= e).sum(dim=1, keepdim=True, dtype=b.dtype)


def _constant(b: Builder, s: sch.ConstantLR, base: Any) -> Rate:
    factor, total = float(s.factor), s.total_iters
    return lambda e: base * (factor + (e >= total).to(b.dtype) * (1 - factor))


def _linear(b: Builder, s: sch.LinearLR, base: Any) -> Rate:
    start, end, total = float(s.start_factor), float(s.end_factor), s.total_iters
    return lambda e: base * (start + (end - start) * torch.clamp(e, max=total) / total)


def _exponential(b: Builder, s: sch.ExponentialLR, base: Any) -> Rate:
    gamma = float(s.gamma)
    return lambda e: base * gamma**e


def _polynomial(b: Builder, s: sch.PolynomialLR, base: Any) -> Rate:
    total, power = s.total_iters, float(s.power)
    return lambda e: base * (1.0 - torch.clamp(e, max=total) / total) ** power


def _cosine(b: Builder, s: sch.CosineAnnealingLR, base: Any) -> Rate:
    eta_min, t_max = float(s.eta_min), s.T_max
    return lambda e: eta_min + (base - eta_min) * (1 + torch.cos(math.pi * e / t_max)) / 2


def _one_cycle(b: Builder, s: sch.OneCycleLR, base: Any) -> Rate:
    if s.cycle_momentum:
        raise ValueError(
            "OneCycleLR's cycle_momentum must be False for SkipAwareLR (it sets each group's "
            "momentum or betas[0] every step, which fused optimizers read as a Python "
            f"number); build it with cycle_momentum=False, or {_SYNC_FORM}, got True"
        )
    phases = s._schedule_phases
    cosine = s._anneal_func_type == "cos"
    starts = [b.tensor([g[p["start_lr"]] for g in b.groups]) for p in phases]
    ends = [b.tensor([g[p["end_lr"]] for g in b.groups]) for p in phases]
    bounds = [float(p["end_step"]) for p in phases]
    # a step is in the first phase whose end_step it does not pass, else in the last one
    last = b.tensor([*bounds[:-1], math.inf])
    total = s.total_steps

    def rate(e: torch.Tensor) -> torch.Tensor:
        # torch raises past total_steps; the device cannot, and holds the last rate
        e = torch.clamp(e, max=total)
        rows, start = [], 0.0
        for lo, hi, end in zip(starts, ends, bounds, strict=True):
            pct = (e - start) / (end - start)
            if cosine:  # OneCycleLR._annealing_cos
                rows.append(hi + (lo - hi) / 2.0 * (torch.cos(math.pi * pct) + 1))
            else:  # OneCycleLR._annealing_linear
                rows.append((hi - lo) * pct + lo)
            start = end
        return _pick(rows, torch.argmax((e <= last).to(torch.uint8), dim=1, keepdim=True))

    return rate


def _sequential(b: Builder, s: sch.SequentialLR, base: Any) -> Rate:
    # torch resets the rates to the groups' initial_lr and starts the first scheduler there:
    # its recursive get_lr (all but LambdaLR's and OneCycleLR's) scales that rate, not its
    # base_lrs (the two differ when a OneCycleLR built after it rewrote initial_lr)
    first, *rest = s._schedulers
    start = None
    if type(first) not in (sch.LambdaLR, sch.OneCycleLR):
        start = b.tensor([g["initial_lr"] for g in b.groups])
    parts = [b.rate(first, True, start)] + [b.rate(inner, True) for inner in rest]
    starts = [0, *s._milestones]
    milestones = b.tensor(s._milestones)

    def rate(e: torch.Tensor) -> torch.Tensor:
        # the scheduler after milestone m restarts there, as torch's _update_lr(0) does
        rows = [part(torch.clamp(e - at, min=0)) for part, at in zip(parts, starts, strict=True)]
        return _pick(rows, (milestones <= e).sum(dim=1, keepdim=True))

    return rate


_BUILDERS: dict[type, Callable[[Builder, Any, Any], Rate]] = {
    sch.LambdaLR: _lambda,
    sch.StepLR: _step,
    sch.MultiStepLR: _multistep,
    sch.ConstantLR: _constant,
    sch.LinearLR: _linear,
    sch.ExponentialLR: _exponential,
    sch.PolynomialLR: _polynomial,
    sch.CosineAnnealingLR: _cosine,
    sch.OneCycleLR: _one_cycle,
    sch.SequentialLR: _sequential,
}
_NAMES = [t.__name__ for t in _BUILDERS if t is not sch.SequentialLR]
