"""``GradScaler``: a drop-in for ``torch.amp.GradScaler``.

The class keeps torch's surface (methods, call order, errors, state dicts) and
hands the scale to a path picked at the first ``scale()``, from the loss's
device: lscore's compiled core for CPU tensors, torch's own kernels elsewhere.
Its base classes hold torch's private attributes read through the path, the unscale
and clip, and the state dicts and pickles; here are the constructor, ``scale``,
``step``, ``update`` and the queries.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections import abc, defaultdict
from typing import Any

import torch
from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state

from lscore.adapters.torch._config import (
    TORCH_ARGS,
    ScalerConfigError,
    graph_dtypes,
    outside_graph,
    policy_clash,
    resolve_policy,
    torch_policy,
    warn_at_caller,
)
from lscore.adapters.torch._paths import Disabled, SkipCount, Unplaced
from lscore.adapters.torch._scaler_state import StateScaler
from lscore.adapters.torch._scaler_unscale import UnscaleScaler
from lscore.adapters.torch._unscaler import (
    ScalerAssertionError,
    named_grads,
    refuse_optimizer_class,
)
from lscore.distributed import TorchReducer
from lscore.policy import growth_interval
from lscore.state import LossScaleState

__all__ = ["GradScaler", "ScalerConfigError"]


class GradScaler(UnscaleScaler, StateScaler):
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

    # Unplaced, then a placed path (_CorePath, _DevicePath), or Disabled: the calls
    # Disabled lacks run only after the enabled checks
    _path: Any

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
        if not self._enabled:
            self._path = Disabled()
            return
        if growth_factor <= 1.0:
            raise ScalerConfigError("The growth factor must be > 1.0.")
        if backoff_factor >= 1.0:
            raise ScalerConfigError("The backoff factor must be < 1.0.")
        v1 = None
        if policy is None:
            p = torch_policy(
                init_scale,
                growth_factor,
                backoff_factor,
                growth_interval,
                min_scale=min_scale,
                max_scale=max_scale,
                hysteresis=hysteresis,
            )
            raw = (init_scale, growth_factor, backoff_factor, growth_interval)
        else:
            given = dict(
                init_scale=init_scale,
                growth_factor=growth_factor,
                backoff_factor=backoff_factor,
                growth_interval=growth_interval,
                min_scale=min_scale,
                max_scale=max_scale,
                hysteresis=hysteresis,
            )
            clash = {k: v for k, v in given.items() if v != _DEFAULTS[k]}
            if clash:
                raise ValueError(policy_clash(policy, clash))
            p, v1 = resolve_policy(policy)
            raw = (p.init_scale, p.growth_factor, p.backoff_factor, p.growth_interval)
        state = LossScaleState(p)
        if v1 is not None:
            state.load_state_dict(v1)
        self._growth_factor, self._backoff_factor, self._growth_interval = raw[1:]
        # the scale lives in the path; before the first scale() that is Unplaced
        self._path = Unplaced(state, state.scale if v1 is not None else raw[0])
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
            scale = self._path.scale
            if scale is None:
                scale = self._placed_scale(outputs.device)
            return outputs * scale.to(device=outputs.device, non_blocking=True)

        per_device: dict = {}

        def apply_scale(val: Any) -> Any:
            if isinstance(val, torch.Tensor):
                s = per_device.get(val.device)
                if s is None:
                    s = self._placed_scale(val.device).to(
                        device=val.device, non_blocking=True, copy=True
                    )
                    per_device[val.device] = s
                return val * s
            if isinstance(val, abc.Iterable):
                it = map(apply_scale, val)
                if isinstance(val, (list, tuple)):
                    return type(val)(it)
                return it
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    def _decide_auto(self, outputs: Any) -> None:
        """enabled="auto": scale only when float16 tensors feed the loss (decided once)."""
        self._auto = False
        dtypes = graph_dtypes(outputs)
        if torch.float16 in dtypes:
            return
        self._enabled = False
        self._path = Disabled(self._path)
        kinds = ", ".join(sorted(str(d).replace("torch.", "") for d in dtypes)) or "none"
        warn_at_caller(
            f"GradScaler(enabled='auto'): no float16 tensor behind the loss "
            f"(dtypes seen: {kinds}); bfloat16 and float32 training need no loss "
            f"scaling, so this scaler is disabled."
        )

    # ---- step --------------------------------------------------------------------

    def _maybe_opt_step(
        self, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any
    ) -> Any:
        retval = None
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            retval = optimizer.step(*args, **kwargs)
        return retval

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
        self._check_scale_growth_tracker("step")
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
        if path.scale is None:
            self._check_scale_growth_tracker("update")  # raises torch's assertion
        found_infs = path.flags(self._per_optimizer_states)
        if new_scale is not None:
            self._set_new_scale(new_scale)
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

    #: the SkipAwareLR schedules (adapters/torch/schedule.py) that update() advances from
    #: the step's verdict, on the device; each adds itself when built on this scaler
    _schedules: tuple = ()

    # ---- overflow diagnostics (lscore.diagnostics) ---------------------------------

    #: an lscore.diagnostics.OverflowMonitor, or None; set it to get a report that
    #: names the gradients holding NaN/Inf on every skipped step
    overflow_monitor = None
    _steps_seen = 0

    def _observe(self, step: int, skipped: bool, before: Any) -> None:
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

    def _set_new_scale(self, new_scale: Any) -> None:
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
        self._path.set_scale(new_scale)

    # ---- queries -----------------------------------------------------------------

    def _get_scale_async(self) -> Any:
        return self._scale

    @outside_graph
    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled); waits for the device."""
        return self._path.get_scale()

    def _get_growth_tracker(self) -> int:
        return self._path.good_steps()

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
        # (on torch's device path the tensors hold scale and tracker; the host copy
        # keeps the policy for pickling and state dicts)
        self._path.set_policy(policy)

    def is_enabled(self) -> bool:
        """Whether this scaler scales.  With ``enabled="auto"`` it is True until the first
        ``scale()`` has looked at the loss (the scaler is ready to scale until then), and
        False from then on if no float16 tensor was behind that loss."""
        return self._enabled

    def __repr__(self) -> str:
        if not self._enabled:
            return "GradScaler(enabled=False)"
        return (
            f"GradScaler(device={self._device!r}, scale={self.get_scale()!r}, "
            f"policy={self._state.policy.name!r}, skipped_steps={self.skipped_steps})"
        )


# the defaults of the arguments that policy= replaces (passing another value beside it
# is refused)
_DEFAULTS = {
    k: p.default
    for k, p in inspect.signature(GradScaler.__init__).parameters.items()
    if k
    in (
        "init_scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "min_scale",
        "max_scale",
        "hysteresis",
    )
}
