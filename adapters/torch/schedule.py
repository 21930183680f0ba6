"""``SkipAwareLR``: a torch learning-rate schedule that advances only on applied
optimizer steps, computed on the device, so that the training step waits for nothing.

A torch scheduler runs on the host, so a loop that steps it only after applied
steps must first ask ``scaler.last_step_skipped``, and the answer waits for the
device.  For the schedulers whose rate is a closed-form function of the step
count the host needs no answer: ``GradScaler.update()`` adds ``found_inf == 0``
to a count kept on the device, and the rate at that count is copied, there, into
each parameter group's tensor ``lr`` (which torch's fused and capturable
optimizers read on the device).  The formulas are torch's ``_get_closed_form_lr``
(and ``get_lr`` for ``LambdaLR`` and ``OneCycleLR``, which are closed forms
already), evaluated in float64 and rounded once into the learning-rate tensor.

The rates are tabulated ahead of the count: the host knows no count, but it knows
the most it can be (one more per ``update()``), and keeps the table longer than
that, doubling it when needed.  A step then costs the same few device operations
for every schedule (advance, look up, copy), where evaluating the formula would
cost up to some thirty small ones (a OneCycleLR's phases, a SequentialLR's parts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim import lr_scheduler as sch
from torch.utils._python_dispatch import TorchDispatchMode

from lscore.adapters.torch.scaler import GradScaler
from lscore.policy import integer

__all__ = ["SkipAwareLR"]

# step counts (an (n, 1) float tensor holding integers) -> the rates, (n, groups)
Rate = Callable[[torch.Tensor], torch.Tensor]
# the rows of the first table; it doubles when the count may reach its end
FIRST_ROWS = 1024

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


def _supported(s: Any, inner: bool = False) -> type:
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


class _Builder:
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
        build = _BUILDERS[_supported(s, inner)]
        if base is None and hasattr(s, "base_lrs"):
            base = self.tensor(s.base_lrs)
        return build(self, s, base)


def _lambda(b: _Builder, s: sch.LambdaLR, base: Any) -> Rate:
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


def _step(b: _Builder, s: sch.StepLR, base: Any) -> Rate:
    gamma, size = float(s.gamma), s.step_size
    return lambda e: base * gamma ** torch.div(e, size, rounding_mode="floor")


def _multistep(b: _Builder, s: sch.MultiStepLR, base: Any) -> Rate:
    gamma = float(s.gamma)
    milestones = b.tensor(sorted(s.milestones.elements()))
    # torch's bisect_right(milestones, epoch): how many milestones are <= the epoch
    return lambda e: base * gamma ** (milestones <= e).sum(dim=1, keepdim=True, dtype=b.dtype)


def _constant(b: _Builder, s: sch.ConstantLR, base: Any) -> Rate:
    factor, total = float(s.factor), s.total_iters
    return lambda e: base * (factor + (e >= total).to(b.dtype) * (1 - factor))


def _linear(b: _Builder, s: sch.LinearLR, base: Any) -> Rate:
    start, end, total = float(s.start_factor), float(s.end_factor), s.total_iters
    return lambda e: base * (start + (end - start) * torch.clamp(e, max=total) / total)


def _exponential(b: _Builder, s: sch.ExponentialLR, base: Any) -> Rate:
    gamma = float(s.gamma)
    return lambda e: base * gamma**e


def _polynomial(b: _Builder, s: sch.PolynomialLR, base: Any) -> Rate:
    total, power = s.total_iters, float(s.power)
    return lambda e: base * (1.0 - torch.clamp(e, max=total) / total) ** power


def _cosine(b: _Builder, s: sch.CosineAnnealingLR, base: Any) -> Rate:
    eta_min, t_max = float(s.eta_min), s.T_max
    return lambda e: eta_min + (base - eta_min) * (1 + torch.cos(math.pi * e / t_max)) / 2


def _one_cycle(b: _Builder, s: sch.OneCycleLR, base: Any) -> Rate:
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


def _sequential(b: _Builder, s: sch.SequentialLR, base: Any) -> Rate:
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


_BUILDERS: dict[type, Callable[[_Builder, Any, Any], Rate]] = {
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


class SkipAwareLR(sch.LRScheduler):
    """A torch learning-rate scheduler that advances only on applied optimizer steps,
    with no host synchronisation.

    ``SkipAwareLR(scheduler, scaler)`` reads the parameters of `scheduler` once
    and from then on sets the learning rate itself: every ``scaler.update()``
    adds one to a step count kept on the device unless the step was skipped
    (NaN/Inf gradients), and writes the schedule's rate at that count into each
    parameter group's tensor ``lr``, with device operations only.  The rates are
    those of a loop that calls ``scheduler.step()`` when ``not
    scaler.last_step_skipped``, within float32 rounding (the formula is evaluated
    in float64 and rounded once).

    Parameters
    ----------
    scheduler : torch.optim.lr_scheduler.LRScheduler
        ``LambdaLR``, ``StepLR``, ``MultiStepLR``, ``ConstantLR``, ``LinearLR``,
        ``ExponentialLR``, ``PolynomialLR``, ``CosineAnnealingLR``,
        ``OneCycleLR`` (with ``cycle_momentum=False``), or a ``SequentialLR`` of
        these; its optimizer's learning rates must be tensors
        (``lr=torch.tensor(1e-3)``, on the training device).  A ``LambdaLR``'s
        functions get a float64 tensor of step counts and must be written in
        elementwise torch ops (``torch.where``, ``torch.clamp``, ``**``), not
        ``if`` or ``min``.  Step the scheduler no more: this object sets the
        rates.
    scaler : lscore.adapters.torch.GradScaler
        The scaler whose ``update()`` advances the schedule.  A disabled scaler
        applies every step, and so advances the schedule every step.

    Raises
    ------
    TypeError
        For another scheduler (whose rate is not a closed form of the count:
        step it when ``not scaler.last_step_skipped``), a learning rate that is
        not a tensor, or a scaler that is not lscore's ``GradScaler``.
    ValueError
        For a ``LambdaLR`` function that reads the count on the host or does not
        work elementwise, or a ``OneCycleLR`` that cycles the momentum.

    Notes
    -----
    ``step()`` does nothing (``update()`` has set the rates), so a loop written
    for torch's scheduler runs unchanged; ``get_last_lr()`` returns copies of the
    rate tensors.  ``state_dict()`` holds the count (read from the device); load
    it into a ``SkipAwareLR`` built on the same kind of scheduler.  The rates
    are tabulated on the device ahead of the count, so that a step costs the
    same few device operations for every schedule: the table holds 8 bytes per
    parameter group for each ``update()`` since the schedule was built or
    loaded (at least 1024), and doubles when the count may reach its end.  The
    schedules guide (docs/guides/schedules.md) covers which optimizers take a
    tensor learning rate and why the other schedulers need the synchronous form.
    """

    def __init__(self, scheduler: sch.LRScheduler, scaler: GradScaler) -> None:
        if not isinstance(scaler, GradScaler):
            raise TypeError(
                f"scaler must be an lscore.adapters.torch.GradScaler, got "
                f"{type(scaler).__module__}.{type(scaler).__qualname__}"
            )
        _supported(scheduler)
        optimizer = scheduler.optimizer
        for i, group in enumerate(optimizer.param_groups):
            lr = group["lr"]
            if not isinstance(lr, torch.Tensor) or lr.numel() != 1:
                raise TypeError(
                    f"param_groups[{i}]['lr'] must be a one-element tensor for SkipAwareLR "
                    f"(build the optimizer with lr=torch.tensor(...); fused and capturable "
                    f"optimizers take one), got {lr!r}"
                )
        device = optimizer.param_groups[0]["lr"].device
        builder = _Builder(optimizer, device)
        self._rate = builder.rate(scheduler)
        self._dtype = builder.dtype
        self._device = device
        self._kind = type(scheduler).__name__
        self.optimizer = optimizer
        self.base_lrs = [float(lr) for lr in getattr(scheduler, "base_lrs", [])]
        self._start_at(scheduler.last_epoch)
        scaler._schedules = (*scaler._schedules, self)

    def _start_at(self, count: int) -> None:
        """Count from `count` (known on the host), tabulating the rates from there."""
        self._start = count
        # on the device: the applied steps since; on the host: the most it can be
        self._index = torch.zeros((), dtype=torch.int64, device=self._device)
        self._reach = 0
        self._table = self._rates(0, FIRST_ROWS)
        self._write()

    def _rates(self, lo: int, hi: int) -> torch.Tensor:
        """The rates at the counts start + lo ... start + hi - 1, one row each."""
        start = self._start
        counts = torch.arange(start + lo, start + hi, dtype=self._dtype, device=self._device)
        return self._rate(counts.unsqueeze(1))

    def advance(self, skipped: bool | torch.Tensor) -> None:
        """Count the iteration ``GradScaler.update()`` closes as applied unless `skipped`
        (its verdict: a bool, or a device tensor above 0 when skipped), and set the rates."""
        index = self._index
        if isinstance(skipped, torch.Tensor):
            index.add_(skipped.to(index.device, non_blocking=True).eq(0))
        elif not skipped:
            index.add_(1)
        self._reach += 1
        rows = len(self._table)
        if self._reach >= rows:
            self._table = torch.cat([self._table, self._rates(rows, 2 * rows)])
        self._write()

    def _write(self) -> None:
        rates = torch.index_select(self._table, 0, self._index.reshape(1))[0]
        for group, rate in zip(self.optimizer.param_groups, rates.unbind(0), strict=True):
            group["lr"].copy_(rate)

    def step(self, epoch: int | None = None) -> None:
        """Nothing, as ``scaler.update()`` has set the rates; with `epoch`, move the
        schedule to that count (torch's deprecated form)."""
        if epoch is not None:
            self.last_epoch = epoch

    def get_last_lr(self) -> list[float | torch.Tensor]:
        """Copies of the parameter groups' learning-rate tensors (reading one waits for
        the device)."""
        return [group["lr"].clone() for group in self.optimizer.param_groups]

    @property  # torch's attribute: here the count lives on the device
    def last_epoch(self) -> int:
        """The step count: applied steps plus the scheduler's ``last_epoch`` when it was
        wrapped.  Reading it waits for the device."""
        return self._start + int(self._index)

    @last_epoch.setter
    def last_epoch(self, value: int) -> None:
        self._start_at(integer("last_epoch", value, minimum=0))

    def state_dict(self) -> dict[str, Any]:
        """``{"scheduler": the wrapped scheduler's class name, "last_epoch": the count}``
        (the count is read from the device)."""
        return {"scheduler": self._kind, "last_epoch": self.last_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the count saved by ``state_dict()`` and set the rates from it."""
        keys = sorted(state_dict)
        if keys != ["last_epoch", "scheduler"]:
            raise ValueError(
                f"state_dict must have the keys 'last_epoch' and 'scheduler', got {keys!r}"
            )
        if state_dict["scheduler"] != self._kind:
            raise ValueError(
                f"state_dict['scheduler'] must be {self._kind!r} (the scheduler this "
                f"SkipAwareLR follows), got {state_dict['scheduler']!r}"
            )
        self.last_epoch = state_dict["last_epoch"]
