"""``SkipAwareLR``: a torch learning-rate schedule that advances only on applied
optimizer steps, computed on the device, so that the training step waits for nothing.

A torch scheduler runs on the host, so a loop that steps it only after applied
steps must first ask ``scaler.last_step_skipped``, and the answer waits for the
device.  For the schedulers whose rate is a closed-form function of the step
count the host needs no answer: ``GradScaler.update()`` adds ``found_inf == 0``
to a count kept on the device, and the rate at that count is copied, there, into
each parameter group's tensor ``lr`` (which torch's fused and capturable
optimizers read on the device).  The formulas (``_rates``) are torch's, evaluated
in float64 and rounded once into the learning-rate tensor.

The rates are tabulated ahead of the count: the host knows no count, but it knows
the most it can be (one more per ``update()``), and keeps the table longer than
that, doubling it when needed.  A step then costs the same few device operations
for every schedule (advance, look up, copy), where evaluating the formula would
cost up to some thirty small ones (a OneCycleLR's phases, a SequentialLR's parts).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import lr_scheduler as sch

from lscore.adapters.torch._rates import Builder, supported
from lscore.adapters.torch.scaler import GradScaler
from lscore.policy import integer

__all__ = ["SkipAwareLR"]

# the rows of the first table; it doubles when the count may reach its end
FIRST_ROWS = 1024


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
        supported(scheduler)
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
        builder = Builder(optimizer, device)
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
