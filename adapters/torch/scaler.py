"""``GradScaler``: a drop-in for ``torch.amp.GradScaler``, read as torch's class reads.

One class, read top to bottom as torch's: the constructor, ``scale``, ``unscale_`` (and
lscore's ``unscale_and_clip_``), ``step``, ``update``, the queries and setters, the state
dicts and pickles, then torch's private attributes and hooks.  The scale lives in a
path picked once, when the first ``scale()`` creates it on the loss's device
(``_paths.py``): ``CorePath`` (CPU tensors: lscore's compiled core) or ``DevicePath``
(torch's own kernels).  A disabled scaler has no path, and each method says what it
does then, as torch's does.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
from collections import abc, defaultdict
from typing import Any, NoReturn

import numpy as np
import torch
from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state

from lscore.adapters.torch import _cuda_clip
from lscore.adapters.torch._config import (
    TORCH_ARGS,
    ScalerConfigError,
    fp16_help,
    graph_dtypes,
    is_torch_shape,
    outside_graph,
    starting_state,
    warn_at_caller,
)
from lscore.adapters.torch._paths import CorePath, DevicePath, SkipCount
from lscore.adapters.torch._state_dict import (
    COUNTERS,
    PICKLED,
    PICKLED_PATH,
    lscore_keys,
    read_state_dict,
    replace_state,
    state_dict_with,
)
from lscore.adapters.torch._unscaler import (
    GradUnscaler,
    ScalerAssertionError,
    clip_unscaled,
    named_grads,
    refuse_optimizer_class,
    unscale_with_kernel,
)
from lscore.distributed import TorchReducer, reduce_found_inf
from lscore.policy import boolean, growth_interval, integer, real
from lscore.scan import norm_order
from lscore.state import parse_state, refuse_other_policy

__all__ = ["GradScaler", "ScalerConfigError"]

_FIX = (
    "This may indicate your script did not use scaler.scale(loss or outputs) "
    "earlier in the iteration."
)


class GradScaler(torch.amp.GradScaler):
    """A drop-in for ``torch.amp.GradScaler``: the same methods, errors, state dicts and scales.

    ``scale(loss)`` multiplies the loss by the scale, so that small float16
    gradients do not flush to zero; ``step(optimizer)`` unscales the gradients
    and calls ``optimizer.step()`` unless one is NaN or inf; ``update()``
    multiplies the scale by ``backoff_factor`` after a skipped step and by
    ``growth_factor`` after ``growth_interval`` finite steps in a row.  For the
    same gradients the scales and parameters are bitwise equal to torch's.  On
    CPU tensors lscore's compiled core unscales and checks the gradients in one
    pass; on other devices torch's own kernels do it.

    Parameters
    ----------
    device : str, default "cuda"
        The device type of the loss, as torch's ``device.type``.  ``"cuda"``
        without a CUDA device disables the scaler, with torch's warning.
    init_scale : float, default 2.0**16
        The scale before the first step.
    growth_factor : float, default 2.0
        Factor (> 1) by which ``update()`` grows the scale.
    backoff_factor : float, default 0.5
        Factor (< 1) by which ``update()`` backs off the scale after a step
        with NaN/inf gradients.
    growth_interval : int, default 2000
        Finite steps in a row after which the scale grows: a positive integer
        (torch takes 0 and grows on every step; this refuses it).
    enabled : bool or "auto", default True
        False: ``scale()`` returns the loss unchanged, ``step()`` calls
        ``optimizer.step()`` and the other methods do nothing.  ``"auto"``:
        decided at the first ``scale()``; the scaler stays enabled when a
        float16 tensor feeds the loss (float16 autocast or a float16 model)
        and otherwise disables itself with a warning, since bfloat16 and
        float32 training need no loss scaling.  ``is_enabled()`` is True until
        then.
    min_scale, max_scale : float, optional
        Keyword-only.  A backoff never goes below ``min_scale``; a growth never
        above ``max_scale``.  None (the default): no bound, as torch.
    hysteresis : int, default 1
        Keyword-only.  Overflows in a row that trigger one backoff; 1 backs off
        on every overflow, as torch.  Every finite step refills it, as NeMo's
        GradScaler does.
    policy : str, Policy, dict or LossScaleState, optional
        Keyword-only.  A whole lscore policy instead of the numeric arguments:
        a preset name, a loss scale from ``lscore.preset(name, **peer_args)``,
        a ``Policy``, its ``to_dict()`` config, or an ``"lscore.state/1"``
        state dict.  A preset or a state also sets the scale and counters.
    process_group : torch.distributed ProcessGroup, optional
        Keyword-only.  Makes the NaN/inf verdict the OR over this group, so
        every rank skips the same steps and keeps the same scale (needed when
        ranks hold different gradients: FSDP shards, model parallelism).
    allow_fp16_params : bool, default False
        Keyword-only.  Unscale gradients of float16 parameters.  Without it
        ``unscale_()`` and ``step()`` refuse them, as torch does, with a
        ValueError that says to keep float32 master weights.

    Attributes
    ----------
    last_step_skipped : bool
        Whether the iteration closed by the last ``update()`` skipped the
        optimizer step (on CUDA, reading it synchronises with the device).
    skipped_steps : int
        How many iterations skipped the optimizer step.
    overflow_monitor : lscore.diagnostics.OverflowMonitor or None
        Set it to get a report naming the gradients that held NaN/inf on every
        skipped step.
    torch_kernels : bool
        False by default.  Set it True before the first ``scale()`` to run
        torch's own kernels for CPU tensors too, the path tensors of every
        other device take (as ``torch.amp.GradScaler("cpu")`` does), e.g. to
        compare that path with torch's on a machine without a GPU.

    Raises
    ------
    ScalerConfigError
        ``growth_factor <= 1`` or ``backoff_factor >= 1`` (a ValueError, and
        the AssertionError torch raises).
    ValueError
        ``enabled`` is a string other than ``"auto"``, ``growth_interval`` is not
        a positive integer, or a numeric argument is passed beside ``policy``.

    Notes
    -----
    ``state_dict()`` holds torch's five keys (in torch's meaning), the counts
    under ``"lscore_counters"`` and, when ``min_scale``, ``max_scale``,
    ``hysteresis`` or ``policy`` is in use, ``"lscore"`` (the full state);
    torch's ``load_state_dict`` ignores both keys, and this class loads
    torch's dicts.  A dict whose ``"lscore"`` state comes from another policy
    is refused, naming the difference, unless
    ``load_state_dict(d, adopt_policy=True)``.  Misuse raises torch's errors;
    where torch raises AssertionError this raises ``ScalerAssertionError``, a
    RuntimeError and an AssertionError.  The PyTorch details guide (docs/guides/pytorch-details.md)
    covers the two paths, torch's private attributes, CUDA synchronisation,
    ``torch.compile`` and ``unscale_and_clip_``.

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
    #: the SkipAwareLR schedules (adapters/torch/schedule.py) that update() advances from
    #: the step's verdict, on the device; each adds itself when built on this scaler
    _schedules: tuple = ()
    _steps_seen = 0  # update()s seen by the overflow monitor's count (a state dict has it)
    # (scale, growth tracker) the tensors were created with, or last loaded after that
    _init_values: tuple | None = None
    # the path (CorePath or DevicePath), from the first scale(); None before it and when
    # disabled.  An enabled scaler (or one enabled="auto" turned off) also has _state, its
    # state machine (policy, counters and, but on the device under torch's policy, the
    # scale), _reported (the scale get_scale() reports before the first scale(), as
    # given) and _unscaler (the CPU path's GradUnscaler)
    _path: CorePath | DevicePath | None

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
        self._enabled = True if self._auto else bool(enabled)
        self._allow_fp16 = bool(allow_fp16_params)
        self._monitor_groups: list = []
        self._last_skipped: Any = False
        self._skipped: Any = 0
        if (
            device == "cuda"
            and enabled
            and not (torch.cuda.is_available() or importlib.util.find_spec("torch_xla"))
        ):
            warn_at_caller(
                "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling."
            )
            self._enabled = False
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
        """`outputs` (a tensor, or nested lists, tuples or iterables of them) times the scale.

        The first call creates the scale on the device of `outputs` and decides
        ``enabled="auto"``.  A disabled scaler returns `outputs` itself.
        """
        if self._auto:
            self._decide_auto(outputs)
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            path = self._path or self._placed(outputs.device)
            return outputs * path.scale.to(device=outputs.device, non_blocking=True)

        per_device: dict = {}

        def apply_scale(val: Any) -> Any:
            if isinstance(val, torch.Tensor):
                s = per_device.get(val.device)
                if s is None:
                    path = self._path or self._placed(val.device)
                    s = path.scale.to(device=val.device, non_blocking=True, copy=True)
                    per_device[val.device] = s
                return val * s
            if isinstance(val, abc.Iterable):
                it = map(apply_scale, val)
                if isinstance(val, (list, tuple)):
                    return type(val)(it)
                return it
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    def _placed(self, device: torch.device) -> CorePath | DevicePath:
        """Create the scale on `device` and pick the path, once (torch's lazy init): torch's
        kernels off the CPU or with ``torch_kernels``, lscore's compiled core otherwise."""
        self._init_values = (self._reported, self._state.good_steps)
        if device.type != "cpu" or self.torch_kernels:
            self._path = DevicePath(self._state, device)
        else:
            self._path = CorePath(self._state, device, self._unscaler)
        return self._path

    def _decide_auto(self, outputs: Any) -> None:
        """enabled="auto": scale only when float16 tensors feed the loss (decided once)."""
        self._auto = False
        dtypes = graph_dtypes(outputs)
        if torch.float16 in dtypes:
            return
        self._enabled = False
        if self._path is not None:  # placed by _lazy_init_scale_growth_tracker: keep its scale
            self._reported, self._path = self._path.get_scale(), None
        kinds = ", ".join(sorted(str(d).replace("torch.", "") for d in dtypes)) or "none"
        warn_at_caller(
            f"GradScaler(enabled='auto'): no float16 tensor behind the loss "
            f"(dtypes seen: {kinds}); bfloat16 and float32 training need no loss "
            f"scaling, so this scaler is disabled."
        )

    # ---- unscale -----------------------------------------------------------------

    @outside_graph
    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ("unscale") `optimizer`'s gradients by the scale and check them for NaN/inf.

        Call it before working on the gradients (e.g. clipping them); ``step()``
        calls it otherwise.  Calling it twice in an iteration, or after ``step()``,
        is a RuntimeError; float16 gradients without ``allow_fp16_params`` a
        ValueError.
        """
        self._unscale_with(optimizer)

    def _unscale_with(self, optimizer: Any, stats: list | None = None, unscale: Any = None) -> None:
        """``unscale_``, also appending each array's (sum of squares, largest magnitude) to
        `stats` on the CPU core path, or unscaling with `unscale` (the one-pass CUDA clip's)."""
        refuse_optimizer_class(optimizer, "unscale_")
        if not self._enabled:
            return
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
        state["found_inf_per_device"] = self._agree(found, path)
        if self.overflow_monitor is not None:
            self._monitor_groups.append(optimizer.param_groups)
        state["stage"] = OptState.UNSCALED

    def _agree(self, found: dict, path: CorePath | DevicePath) -> dict:
        """With a process_group: one flag on the scale's device, the OR over every rank
        (lscore.distributed; read on the host, as step() reads it anyway)."""
        if self._reducer is None:
            return found
        local = any(bool(f.item()) for f in found.values())
        flag = reduce_found_inf(self._reducer, local)
        device = path.scale.device
        return {device: torch.full((), float(flag), dtype=torch.float32, device=device)}

    @outside_graph
    def unscale_and_clip_(self, optimizer: Any, max_norm: float, norm_type: float = 2.0) -> Any:
        """``unscale_(optimizer)``, then clip the gradients as ``clip_grad_norm_`` does.

        An lscore extra: for ``norm_type`` 2 or inf the norm is gathered by the
        pass that unscales the gradients (on the CPU core, and by lscore's
        kernels for dense CUDA gradients), so clipping costs one multiply
        instead of two more reads.  When a gradient is NaN/inf the step will be
        skipped, and nothing is clipped.

        Parameters
        ----------
        optimizer : torch.optim.Optimizer
            The optimizer whose gradients to unscale and clip.
        max_norm : float
            The largest total norm the gradients keep (> 0).
        norm_type : float or "inf", default 2.0
            The p of the p-norm, as ``clip_grad_norm_`` takes it.

        Returns
        -------
        torch.Tensor
            The total norm before clipping, in the gradients' dtype.
        """
        refuse_optimizer_class(optimizer, "unscale_and_clip_")
        max_norm = real("max_norm", max_norm)
        if not max_norm > 0:
            raise ValueError(f"max_norm must be > 0, got {max_norm!r}")
        p = norm_order(norm_type)
        if p is None:
            raise ValueError(f"norm_type must be a number or 'inf', got {norm_type!r}")
        params = [q for g in optimizer.param_groups for q in g["params"] if q.grad is not None]
        if not self._enabled:
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        path = self._path
        if path is not None and path.on_device:
            # CUDA gradients, p 2 or inf: lscore's one-pass kernels (adapters/torch/_cuda_clip.py)
            one = _cuda_clip.OnePass.of(params, path.scale, p)
            if one is not None:
                self._unscale_with(optimizer, unscale=one)
                found = self._found_inf_per_device(optimizer)
                return one.clip(max_norm, found, params[0].grad.dtype)
            self.unscale_(optimizer)
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        # the CPU core (unscale_ raises before the first scale()): the pass that unscales
        # gathers the 2-norm's and the inf-norm's parts
        stats: list | None = [] if p in (2.0, math.inf) else None
        if stats is None:
            self.unscale_(optimizer)
        else:
            self._unscale_with(optimizer, stats=stats)
        found = self._found_inf_per_device(optimizer)
        return clip_unscaled(params, max_norm, p, stats, found, self._unscaler)

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

    def _maybe_opt_step(
        self, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any
    ) -> Any:
        retval = None
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            retval = optimizer.step(*args, **kwargs)
        return retval

    def _fused_step(self, optimizer: Any, state: Any, args: Any, kwargs: Any) -> Any:
        """Optimizers that unscale and skip inside their own kernel (torch's contract)."""
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

    def _check_inf_per_device(self, optimizer: Any) -> dict:
        path = self._path
        if path is None:
            self._no_scale("_check_inf_per_device")
        found = self._agree(path.check(optimizer), path)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = found
        return found

    def _found_inf_per_device(self, optimizer: Any) -> dict:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

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
            self._set_new_scale(new_scale, path)
        elif not found_infs:
            raise ScalerAssertionError("No inf checks were recorded prior to update.")
        step = self._steps_seen
        outcome = path.update(
            found_infs,
            new_scale is None,
            (self._growth_factor, self._backoff_factor, self._growth_interval),
        )
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
                self._observe(step, bool(skipped), before)
        for schedule in self._schedules:  # SkipAwareLR: count and rate, on the device
            schedule.advance(skipped)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _set_new_scale(self, new_scale: Any, path: CorePath | DevicePath) -> None:
        if isinstance(new_scale, torch.Tensor):
            reason = (
                "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                "torch.FloatTensor with requires_grad=False."
            )
            if new_scale.device.type != self._device:
                raise ScalerAssertionError(reason)
            if new_scale.numel() != 1:
                raise ScalerAssertionError(reason)
            if new_scale.requires_grad is True:
                raise ScalerAssertionError(reason)
        elif not isinstance(new_scale, (int, float)) or isinstance(new_scale, bool):
            raise TypeError(
                f"new_scale must be a float or a 1-element tensor, got {type(new_scale).__name__}"
            )
        path.set_scale(new_scale)

    def _observe(self, step: int, skipped: bool, before: Any) -> None:
        """Hand the step to the overflow monitor (lscore.diagnostics), if there is one."""
        groups, self._monitor_groups = self._monitor_groups, []
        m = self.overflow_monitor
        if m is None:
            return
        m.observe(
            step,
            not skipped,
            float(before if before is not None else self.get_scale()),
            self.get_scale(),
            lambda: named_grads(m, groups),
        )

    # ---- queries and setters -----------------------------------------------------

    def _get_scale_async(self) -> Any:
        return self._scale

    @outside_graph
    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled); waits for the device."""
        if not self._enabled:
            return 1.0
        return self._reported if self._path is None else self._path.get_scale()

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._state.good_steps if self._path is None else self._path.good_steps()

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
        """Whether this scaler scales.  With ``enabled="auto"`` it is True until the first
        ``scale()`` has looked at the loss (the scaler is ready to scale until then), and
        False from then on if no float16 tensor was behind that loss."""
        return self._enabled

    @property
    def last_step_skipped(self) -> bool:
        """Whether the iteration closed by the last update() skipped an optimizer step.

        Exact; off the CPU (CUDA) the flag is a device tensor, so reading it waits for
        the device: a host synchronisation.  ``SkipAwareLR`` keeps a learning-rate
        schedule in step with the applied steps without one."""
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
        """torch's five keys, ``"lscore_counters"`` (``skipped_steps``, ``last_step_skipped``
        and the overflow monitor's step count), and ``"lscore"`` (the full
        ``"lscore.state/1"`` state) when an lscore-only argument is in use; ``{}`` when
        disabled.

        torch's keys are in torch's meaning, so that ``torch.amp.GradScaler`` can load
        them: with an lscore policy, ``_growth_tracker`` counts toward the policy's next
        growth as torch's tracker counts toward ``growth_interval``.  A policy that never
        grows (a fixed scale) has no such meaning: it warns, since torch's scaler would
        grow and back off the scale it loads.
        """
        if not self._enabled:
            return {}
        d = {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }
        if not is_torch_shape(self._state.policy):
            lscore_keys(d, self._state)
        d[COUNTERS] = {
            "skipped_steps": self.skipped_steps,
            "last_step_skipped": self.last_step_skipped,
            "monitor_steps": self._steps_seen,
        }
        return d

    def load_state_dict(self, state_dict: dict, *, adopt_policy: bool = False) -> None:
        """Load `state_dict`, saved by this class or by ``torch.amp.GradScaler``.

        torch's five keys are taken as torch takes them (the growth and backoff
        factors and the growth interval included).  A dict with an ``"lscore"`` key
        (saved under an lscore-only option) must come from this scaler's policy, its
        initial scale aside, as ``lscore``'s own loss scales require: a state of
        another policy (a DeepSpeed scaler's, say) is a ValueError naming the fields
        that differ, and nothing changes, unless `adopt_policy` is True: then the
        saved policy is taken.  An empty dict (saved from a disabled scaler) is a
        RuntimeError, as in torch, unless this scaler is ``enabled="auto"`` and still
        undecided.
        """
        if not self._enabled:
            return
        if len(state_dict) == 0 and self._auto:
            # enabled="auto", undecided: the scaler that saved this disabled itself (no
            # float16 behind its loss); this one decides again at its first scale()
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler."
            )
        scale, factors, tracker, v1, counters = read_state_dict(state_dict)
        if v1 is not None and not boolean("adopt_policy", adopt_policy):
            refuse_other_policy(
                self._state.policy,
                parse_state(v1)[0],
                "pass load_state_dict(state_dict, adopt_policy=True) to take the saved policy",
            )
        if v1 is not None:
            self._load(v1, None)
            self._init_values = (self.get_scale(), self._get_growth_tracker())
            p = self._state.policy
            factors = (p.growth_factor, p.backoff_factor, p.growth_interval)
        else:
            state = self._state
            gf, bf, gi = factors
            policy = state.policy.replace(growth_factor=gf, backoff_factor=bf, growth_interval=gi)
            # a torch dict has no hysteresis count: start full, as NeMo does
            d = state_dict_with(
                state,
                float(np.float32(scale)),
                policy,
                good_steps=int(tracker),
                hysteresis_left=policy.hysteresis,
            )
            self._load(d, scale)
            self._init_values = (scale, int(tracker))
        self._growth_factor, self._backoff_factor, self._growth_interval = factors
        if counters is not None:  # torch's own dicts have none: the counts stay as they are
            self._skipped, self._last_skipped, self._steps_seen = counters

    def _load(self, d: dict, reported: Any) -> None:
        """Load the state dict `d` into the state machine, and so into the scale's tensors;
        before the first scale(), get_scale() then reports `reported` (None: d's scale)."""
        self._state.load_state_dict(d)
        if self._path is not None:
            self._path.loaded()
        else:
            self._reported = self._state.scale if reported is None else reported

    def __getstate__(self) -> dict:
        """The pickled attributes: those of _state_dict.PICKLED, in that order, then any
        others."""
        if self._enabled and len(self._per_optimizer_states) != 0:
            raise ScalerAssertionError(
                "A GradScaler instance may only be pickled at the beginning of an "
                "iteration, or at the end after scaler.update()."
            )
        state = self.__dict__.copy()
        # a schedule holds its optimizer: it is not the scaler's to pickle (torch's
        # schedulers are saved on their own, and a rebuilt SkipAwareLR attaches itself)
        state.pop("_schedules", None)
        path = state.pop("_path")
        if "_state" in state:  # the scale as the host state holds it, and no tensors
            if path is not None:
                path.pull()
            reported = state.pop("_reported")
            scale = reported if path is None else path.get_scale()
            state.update(_init_scale=scale, _scale=None, _tracker_t=None, _scale_value=None)
        if self._enabled:
            state["_last_skipped"] = self.last_step_skipped
            state["_skipped"] = self.skipped_steps
        return {**{k: state.pop(k) for k in PICKLED if k in state}, **state}

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        held = {k: state.pop(k) for k in PICKLED_PATH if k in state}
        self.__dict__.update(state)
        if "_state" in held:
            self._state, self._reported = held["_state"], held["_init_scale"]
            self._unscaler = held.get("_unscaler") or GradUnscaler()
        # a pickled scaler is unplaced (as after torch's own unpickling: _scale is None)
        self._path = None

    # ---- torch's private attributes and hooks ----------------------------------------

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
            self._load(d, new_scale)
        else:  # torch keeps the attribute only: the tensors hold the scale and tracker
            old = self._init_values or (self.get_scale(), self._get_growth_tracker())
            self._init_values = (
                old[0] if scale is None else scale,
                old[1] if tracker is None else tracker,
            )

    def _lazy_init_scale_growth_tracker(self, dev: Any) -> None:
        """Create the scale (and pick the path) on `dev`, a torch.device or a string, as
        torch's scale() does on its first call; torch's assertion if already created."""
        if self._growth_tracker is not None or self._path is not None:
            raise ScalerAssertionError("_growth_tracker initialized before _scale")
        if not self._enabled:  # enabled="auto" turned it off: no scale to create
            raise AttributeError("'GradScaler' object has no attribute '_scale'")
        self._placed(torch.device(dev))

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
