"""``GradScaler``: a drop-in for ``torch.amp.GradScaler``, read top to bottom as torch's class.

The scale lives in a path picked once, when the first ``scale()`` creates it on the loss's
device (``_paths.py``): ``CorePath`` (CPU tensors: lscore's compiled core) or ``DevicePath``
(torch's own kernels); a disabled scaler has none.  torch's private attributes and hooks
are the base class's (``_torch_private.py``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state

from lscore.adapters.torch._config import (
    TORCH_ARGS,
    ScalerConfigError,
    cuda_missing,
    fp16_help,
    no_fp16_warning,
    outside_graph,
    scale_nested,
    starting_state,
    warn_at_caller,
)
from lscore.adapters.torch._paths import SkipCount, agree, check_new_scale
from lscore.adapters.torch._state_dict import (
    load_into,
    pickled,
    replace_state,
    state_dict_of,
    unpickled,
)
from lscore.adapters.torch._torch_private import TorchPrivate
from lscore.adapters.torch._unscaler import (
    GradUnscaler,
    ScalerAssertionError,
    clip_args,
    observe,
    refuse_optimizer_class,
)
from lscore.distributed import TorchReducer
from lscore.policy import growth_interval

__all__ = ["GradScaler", "ScalerConfigError"]


class GradScaler(TorchPrivate):
    """A drop-in for ``torch.amp.GradScaler``: the same methods, errors, state dicts and scales.

    For the same gradients the scales and parameters are bitwise torch's; CPU gradients
    are unscaled and checked in one pass of lscore's compiled core.  lscore adds the
    options below, ``enabled="auto"``, ``unscale_and_clip_``, ``last_step_skipped``,
    ``skipped_steps``, ``overflow_monitor`` and ``load_state_dict(..., adopt_policy=True)``
    (how each works: the PyTorch details guide, docs/guides/pytorch-details.md).

    Parameters
    ----------
    device, init_scale, growth_factor, backoff_factor, growth_interval : torch's arguments
        As torch takes them, but ``growth_interval`` must be a positive integer
        (torch also takes 0), and a bad factor raises ``ScalerConfigError``.
    enabled : bool or "auto", default True
        ``"auto"``: at the first ``scale()``, stay enabled only if a float16 tensor
        feeds the loss; otherwise disable with a warning.
    min_scale, max_scale, hysteresis, policy, process_group, allow_fp16_params : lscore's options
        Keyword-only: bounds for the scale, the overflows in a row that trigger one
        backoff (default 1), a whole lscore policy (a preset name, ...) in place of
        the numbers, a ``torch.distributed`` group whose ranks share one NaN/inf
        verdict, and float16 parameters allowed (refused by default, as in torch).

    Examples
    --------
    >>> import torch
    >>> from lscore.adapters.torch import GradScaler
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Linear(4, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.01)
    >>> scaler = GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    >>> for _ in range(3):
    ...     opt.zero_grad()
    ...     with torch.autocast("cpu", dtype=torch.float16):
    ...         loss = model(torch.ones(8, 4)).float().pow(2).mean()
    ...     scaler.scale(loss).backward()
    ...     scaler.step(opt)
    ...     scaler.update()
    >>> scaler.get_scale(), scaler.skipped_steps
    (2048.0, 0)
    """

    #: True: torch's own kernels check, unscale and update even for CPU tensors (the path
    #: every other device takes); set it before the first ``scale()``
    torch_kernels = False
    #: an lscore.diagnostics.OverflowMonitor, or None; set it to get a report that
    #: names the gradients holding NaN/Inf on every skipped step
    overflow_monitor = None
    _schedules: tuple = ()  # the SkipAwareLRs built on this scaler: update() advances them
    _steps_seen = 0  # update()s seen by the overflow monitor's count (a state dict has it)
    # _path, the path picked by the first scale(), and the state it reads: TorchPrivate's

    def __init__(
        self,
        device: str = TORCH_ARGS["device"],
        init_scale: float = TORCH_ARGS["init_scale"],
        growth_factor: float = TORCH_ARGS["growth_factor"],
        backoff_factor: float = TORCH_ARGS["backoff_factor"],
        growth_interval: int = TORCH_ARGS["growth_interval"],
        enabled: bool | str = TORCH_ARGS["enabled"],
        *,
        min_scale: float | None = None,
        max_scale: float | None = None,
        hysteresis: int = 1,
        policy: Any = None,
        process_group: Any = None,
        allow_fp16_params: bool = False,
    ) -> None:
        self._device = device
        self._auto = isinstance(enabled, str) and enabled == "auto"
        if isinstance(enabled, str) and not self._auto:
            raise ValueError(f"enabled must be a bool or 'auto', got {enabled!r}")
        # "auto" starts enabled; a "cuda" scaler without CUDA warns and disables itself
        self._enabled = bool(enabled) and not cuda_missing(device, enabled)
        self._allow_fp16 = bool(allow_fp16_params)
        self._monitor_groups: list = []
        self._last_skipped: Any = False
        self._skipped: Any = 0
        self._path = None
        if not self._enabled:
            return
        self._state, self._reported, factors = starting_state(
            policy,
            (init_scale, growth_factor, backoff_factor, growth_interval),
            (min_scale, max_scale, hysteresis),
        )
        self._growth_factor, self._backoff_factor, self._growth_interval = factors
        self._unscaler = GradUnscaler()
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        self._reducer = None if process_group is None else TorchReducer(process_group)

    # ---- scale -------------------------------------------------------------------
    @outside_graph
    def scale(self, outputs: Any) -> Any:
        """`outputs` (a tensor, or nested lists, tuples or iterables of them) times the scale
        (created on their device by the first call, which also decides ``enabled="auto"``);
        a disabled scaler returns `outputs` itself."""
        if self._auto:
            self._decide_auto(outputs)
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            path = self._path or self._placed(outputs.device)
            return outputs * path.scale.to(device=outputs.device, non_blocking=True)
        return scale_nested(outputs, lambda device: (self._path or self._placed(device)).scale)

    def _decide_auto(self, outputs: Any) -> None:
        """enabled="auto": scale only when float16 tensors feed the loss (decided once)."""
        self._auto = False
        warning = no_fp16_warning(outputs)
        if warning is not None:
            self._enabled = False
            if self._path is not None:  # placed by _lazy_init_scale_growth_tracker: keep it
                self._reported, self._path = self._path.get_scale(), None
            warn_at_caller(warning)

    # ---- unscale -----------------------------------------------------------------
    @outside_graph
    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ("unscale") `optimizer`'s gradients by the scale and check them for NaN/inf.

        Call it before working on the gradients (e.g. clipping them); ``step()`` calls it
        otherwise.  Twice in an iteration, or after ``step()``, is a RuntimeError; float16
        gradients without ``allow_fp16_params`` a ValueError."""
        self._unscale_with(optimizer)

    def _unscale_with(self, optimizer: Any, stats: list | None = None, unscale: Any = None) -> Any:
        """``unscale_``, also appending each array's (sum of squares, largest magnitude) to
        `stats` on the CPU core path, or unscaling with `unscale` (the one-pass CUDA clip's);
        the found-inf flags ({device: tensor}), None when disabled."""
        refuse_optimizer_class(optimizer, "unscale_")
        if not self._enabled:
            return None
        path = self._path
        if path is None:
            self._no_scale("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        try:
            found = (unscale or path.unscale)(optimizer, self._allow_fp16, stats)
        except ValueError as e:
            if str(e) == "Attempting to unscale FP16 gradients.":
                raise fp16_help(e) from None
            raise
        found = state["found_inf_per_device"] = agree(self._reducer, found, path.scale.device)
        if self.overflow_monitor is not None:
            self._monitor_groups.append(optimizer.param_groups)
        state["stage"] = OptState.UNSCALED
        return found

    @outside_graph
    def unscale_and_clip_(self, optimizer: Any, max_norm: float, norm_type: float = 2.0) -> Any:
        """``unscale_(optimizer)``, then ``clip_grad_norm_(params, max_norm, norm_type)`` of
        its gradients; returns the total norm before clipping (in their dtype).

        An lscore extra: for `norm_type` 2 or inf the pass that unscales `optimizer`'s
        gradients gathers their norm (the CPU core; lscore's kernels for dense CUDA ones),
        so clipping costs one multiply.  A NaN/inf gradient: nothing clipped; `max_norm` > 0.
        """
        refuse_optimizer_class(optimizer, "unscale_and_clip_")
        max_norm, p = clip_args(max_norm, norm_type)
        params = [q for g in optimizer.param_groups for q in g["params"] if q.grad is not None]
        if not self._enabled:
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        if self._path is None:
            self._no_scale("unscale_")
        return self._path.clip(self._unscale_with, optimizer, params, (max_norm, p, norm_type))

    # ---- step --------------------------------------------------------------------
    @outside_graph
    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale `optimizer`'s gradients (unless ``unscale_`` did), then call
        ``optimizer.step(*args, **kwargs)`` unless one is NaN/inf; returns what it returns,
        or None when the step is skipped.  A ``closure`` is refused, as in torch."""
        refuse_optimizer_class(optimizer, "step")
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        if self._path is None:
            self._no_scale("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._fused_step(optimizer, state, args, kwargs)
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(state["found_inf_per_device"]) == 0:
            raise ScalerAssertionError("No inf checks were recorded for this optimizer.")
        retval = self._maybe_opt_step(optimizer, state, *args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    # ---- update ------------------------------------------------------------------
    @outside_graph
    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Grow or back off the scale from this iteration's NaN/inf checks, or set it to
        `new_scale` (a float, or a one-element tensor on the scaler's device)."""
        if not self._enabled:
            for schedule in self._schedules:  # a disabled scaler applies every step
                schedule.advance(False)
            return
        path = self._path
        if path is None:
            self._no_scale("update")
        found_infs = path.flags(self._per_optimizer_states)
        if new_scale is not None:
            check_new_scale(new_scale, self._device)
            path.set_scale(new_scale)
        elif not found_infs:
            raise ScalerAssertionError("No inf checks were recorded prior to update.")
        step = self._steps_seen
        factors = (self._growth_factor, self._backoff_factor, self._growth_interval)
        outcome = path.update(found_infs, new_scale is None, factors)
        if outcome is None:  # the device path, new_scale and no inf checks
            skipped = self._last_skipped = False
        else:
            skipped, before = outcome  # skipped: a bool, or a device tensor (above 0)
            self._last_skipped = skipped
            skips = self._skipped
            if type(skips) is not SkipCount:  # an int (a new, loaded or unpickled scaler)
                skips = self._skipped = SkipCount(int(skips))
            skips.add(skipped)
            self._steps_seen = step + 1  # on every path: a state dict carries it
            if path.observes_always or self.overflow_monitor is not None:
                groups, self._monitor_groups = self._monitor_groups, []
                observe(self.overflow_monitor, groups, step, bool(skipped), before, self.get_scale)
        for schedule in self._schedules:  # SkipAwareLR: count and rate, on the device
            schedule.advance(skipped)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    # ---- queries and setters -----------------------------------------------------
    @outside_graph
    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled); waits for the device."""
        if not self._enabled:
            return 1.0
        return self._reported if self._path is None else self._path.get_scale()

    def get_growth_factor(self) -> float:
        """The factor by which ``update()`` grows the scale."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Make `new_factor` the factor by which ``update()`` grows the scale."""
        self._set_policy(growth_factor=new_factor)
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        """The factor by which ``update()`` backs off the scale."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Make `new_factor` the factor by which ``update()`` backs off the scale."""
        self._set_policy(backoff_factor=new_factor)
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        """The number of finite steps in a row after which the scale grows."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Make the scale grow after `new_interval` finite steps in a row."""
        interval = growth_interval("new_interval", new_interval)
        self._set_policy(growth_interval=interval)
        self._growth_interval = interval

    def _set_policy(self, **changes: Any) -> None:
        policy = self._state.policy.replace(**changes)  # validates
        if self._path is None:
            replace_state(self._state, policy=policy)
        else:  # the device path's tensors may hold the scale: it decides again
            self._path.set_policy(policy)

    def is_enabled(self) -> bool:
        """Whether this scaler scales.  With ``enabled="auto"``: True until the first
        ``scale()``, then False if no float16 tensor was behind that loss."""
        return self._enabled

    @property
    def last_step_skipped(self) -> bool:
        """Whether the iteration closed by the last update() skipped an optimizer step (off
        the CPU reading it waits for the device; ``SkipAwareLR`` needs no such wait)."""
        return bool(self._last_skipped)

    @property
    def skipped_steps(self) -> int:
        """How many iterations, closed by update(), skipped an optimizer step."""
        return int(self._skipped)

    def __repr__(self) -> str:
        if not self._enabled:
            return "GradScaler(enabled=False)"
        return (
            f"GradScaler(device={self._device!r}, scale={self.get_scale()!r}, "
            f"policy={self._state.policy.name!r}, skipped_steps={self.skipped_steps})"
        )

    # ---- state dicts and pickles -------------------------------------------------
    def state_dict(self) -> dict:
        """torch's five keys (which ``torch.amp.GradScaler`` loads), ``"lscore_counters"``
        (``skipped_steps``, ``last_step_skipped``, the overflow monitor's step count) and,
        under an lscore-only argument, ``"lscore"`` (the full state); ``{}`` when disabled.
        A policy that never grows warns: torch's scaler would grow the scale it loads."""
        if not self._enabled:
            return {}
        return state_dict_of(
            self._state,
            self.get_scale(),
            (self._growth_factor, self._backoff_factor, self._growth_interval),
            self._get_growth_tracker(),
            (self.skipped_steps, self.last_step_skipped, self._steps_seen),
        )

    def load_state_dict(self, state_dict: dict, *, adopt_policy: bool = False) -> None:
        """Load `state_dict`, saved by this class or by ``torch.amp.GradScaler``.

        torch's five keys are taken as torch takes them.  A dict with an ``"lscore"`` key
        must come from this scaler's policy (its initial scale aside), unless
        `adopt_policy`: else a ValueError names the fields that differ, and nothing
        changes.  An empty dict (from a disabled scaler) is a RuntimeError, as in torch,
        unless this scaler is ``enabled="auto"`` and still undecided (it decides again)."""
        if not self._enabled or (len(state_dict) == 0 and self._auto):
            return
        reported, init, factors, counts = load_into(self._state, state_dict, adopt_policy)
        self._after_load(reported)
        self._init_values = init or (self.get_scale(), self._get_growth_tracker())
        self._growth_factor, self._backoff_factor, self._growth_interval = factors
        if counts is not None:  # torch's own dicts have none: the counts stay as they are
            self._skipped, self._last_skipped, self._steps_seen = counts

    def __getstate__(self) -> dict:
        """The pickled attributes (_state_dict.PICKLED's layout): the scale as the host
        state holds it, and no tensors; torch's assertion in the middle of an iteration."""
        return pickled(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        # a pickled scaler is unplaced (as after torch's own unpickling: _scale is None)
        self.__dict__.update(unpickled(state))
