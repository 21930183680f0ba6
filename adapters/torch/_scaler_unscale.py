"""``GradScaler``'s unscale: ``unscale_``, the fused ``unscale_and_clip_`` and the found-inf
flags each optimizer's step reads (agreed over the process group when there is one)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

from lscore.adapters.torch import _cuda_clip
from lscore.adapters.torch._config import fp16_help, outside_graph
from lscore.adapters.torch._scaler_path import PathScaler
from lscore.adapters.torch._unscaler import refuse_optimizer_class
from lscore.distributed import reduce_found_inf
from lscore.policy import real
from lscore.scan import clip_coefficient, norm_order

__all__ = ["UnscaleScaler"]


class UnscaleScaler(PathScaler):
    """Unscale and check an optimizer's gradients (and clip them, on request)."""

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
        if self._enabled and self._path.on_device:
            # CUDA gradients, p 2 or inf: lscore's one-pass kernels (adapters/torch/_cuda_clip.py)
            one = _cuda_clip.OnePass.of(params, self._path.scale, p)
            if one is not None:
                self._unscale_with(optimizer, unscale=one)
                return one.clip(
                    max_norm, self._found_inf_per_device(optimizer), params[0].grad.dtype
                )
        if not self._enabled or self._path.on_device or p not in (2.0, math.inf):
            if self._enabled:
                self.unscale_(optimizer)
            if p in (2.0, math.inf) or not self._enabled or self._path.on_device:
                return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
            return self._clip(optimizer, params, max_norm, None, p)
        stats: list = []
        self._unscale_with(optimizer, stats=stats)
        if p == 2.0:
            total = math.sqrt(math.fsum(sq for sq, _ in stats))
        else:
            total = max((m for _, m in stats), default=0.0)
        return self._clip(optimizer, params, max_norm, total, p)

    def _clip(
        self, optimizer: Any, params: Any, max_norm: float, total: Any, p: float
    ) -> torch.Tensor:
        """Scale the unscaled gradients down to `max_norm` (torch's arithmetic: a
        coefficient in the norm's dtype, clamped to 1) unless this step will be skipped;
        returns the norm.  `total` None: the p-norm taken as clip_grad_norm_ takes it.
        Only after the CPU core unscaled the gradients (its table is then theirs): the
        multiply is its one pass where every gradient is bfloat16, torch's
        ``_foreach_mul_`` otherwise."""
        dtype = params[0].grad.dtype if params else torch.float32
        groups: dict = {}
        for q in params:
            groups.setdefault((q.grad.device, q.grad.dtype), []).append(q.grad)
        with torch.no_grad():
            if total is None:
                if not params:
                    return torch.tensor(0.0)
                norms = [n for grads in groups.values() for n in torch._foreach_norm(grads, p)]
                total = torch.linalg.vector_norm(torch.stack(norms), p)
            else:
                total = torch.tensor(total, dtype=dtype)
            found = self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
            if params and not any(v.item() for v in found.values()):
                coef = clip_coefficient(total, max_norm)
                # bfloat16: the core's pass (1e7 elements: 0.73 ms, torch's 1.34 ms on a
                # Zen 3 core); torch's multiply is the faster one for the other dtypes
                core = coef.dtype == torch.bfloat16
                if not (core and self._path.unscaler.multiply(float(coef), coef.dtype)):
                    for (device, _), grads in groups.items():
                        torch._foreach_mul_(grads, coef.to(device))
        return total

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
        self._check_scale_growth_tracker("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        try:
            found = (unscale or self._path.unscale)(optimizer, self._allow_fp16, stats)
        except ValueError as e:
            if str(e) == "Attempting to unscale FP16 gradients.":
                raise fp16_help(e) from None
            raise
        state["found_inf_per_device"] = self._agree(found)
        if self.overflow_monitor is not None:
            self._monitor_groups.append(optimizer.param_groups)
        state["stage"] = OptState.UNSCALED

    def _check_inf_per_device(self, optimizer: Any) -> dict:
        self._check_scale_growth_tracker("_check_inf_per_device")
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = self._agree(
            self._path.check(optimizer)
        )
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _agree(self, found: dict) -> dict:
        """With a process_group: one flag on the scale's device, the OR over every rank
        (lscore.distributed; read on the host, as step() reads it anyway)."""
        if self._reducer is None:
            return found
        local = any(bool(f.item()) for f in found.values())
        flag = reduce_found_inf(self._reducer, local)
        device = self._path.scale.device  # placed: the flags came from its unscale or check
        return {device: torch.full((), float(flag), dtype=torch.float32, device=device)}

    def _found_inf_per_device(self, optimizer: Any) -> dict:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
