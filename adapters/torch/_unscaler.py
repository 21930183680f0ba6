"""How the torch adapter unscales and checks gradients: torch's own kernel per device and
dtype (``unscale_with_kernel``, with the scale's inverse as torch takes it,
``inverse_tensor``), and ``GradUnscaler``, lscore's one pass over every dense CPU gradient
(zero-copy buffers through the DLPack C exchange API of ``torch.Tensor``), which
``clip_unscaled`` then clips as ``clip_grad_norm_`` does (``clip_args`` checks its
arguments); ``observe`` hands a step and its gradients to the overflow monitor."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from lscore import kernels
from lscore.dtypes import Code
from lscore.policy import real
from lscore.scan import clip_coefficient, norm_order, not_float_error

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


def refuse_optimizer_class(optimizer: Any, method: str) -> None:
    """A TypeError for an optimizer class where an instance is needed (torch reads
    ``param_groups`` from it and fails with an AttributeError); a class that has
    ``param_groups`` itself is an optimizer as far as the scaler goes, and passes."""
    if isinstance(optimizer, type) and not hasattr(optimizer, "param_groups"):
        name = optimizer.__qualname__
        raise TypeError(
            f"{method}() needs an optimizer instance, got the class {name}: pass the "
            f"optimizer you built, e.g. opt = {name}(model.parameters(), ...); "
            f"scaler.{method}(opt)"
        )


class GradDtypeError(TypeError, NotImplementedError):
    """An integer or bool gradient, refused before any gradient is unscaled.

    A TypeError, as lscore's contract says, and still the NotImplementedError that
    torch's unscale kernel raises for such a dtype, so code written against torch
    keeps catching it.
    """


def refuse_integer_grad(param_groups: Any, param: Any) -> None:
    """GradDtypeError when the gradient of `param` is an integer or bool tensor (a complex
    one is left to torch's kernel, which raises torch's own error)."""
    dtype = param.grad.dtype
    if dtype.is_floating_point or dtype.is_complex:
        return
    where = next(
        f"the gradient of param_groups[{k}]['params'][{i}]"
        for k, group in enumerate(param_groups)
        for i, p in enumerate(group["params"])
        if p is param
    )
    raise GradDtypeError(str(not_float_error("unscale_", where, dtype)))


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


def inverse_tensor(scale: torch.Tensor) -> torch.Tensor:
    """``lscore.policy.inverse_scale`` of a float32 scale tensor, on its device (no host
    sync), as torch's GradScaler takes it: the float64 reciprocal rounded to float32
    (float32 division can be imprecise), except on MPS, which has no float64."""
    if scale.device.type == "mps":
        return scale.reciprocal()
    return scale.double().reciprocal().float()


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
                if not g.dtype.is_floating_point:
                    refuse_integer_grad(optimizer.param_groups, param)  # complex: torch's error
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
                for param in others:  # all checked before any is unscaled
                    refuse_integer_grad(param_groups, param)
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


def clip_args(max_norm: Any, norm_type: Any) -> tuple[float, float]:
    """unscale_and_clip_'s `max_norm` (> 0) and the order p of its `norm_type`, checked."""
    max_norm = real("max_norm", max_norm)
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm!r}")
    p = norm_order(norm_type)
    if p is None:
        raise ValueError(f"norm_type must be a number or 'inf', got {norm_type!r}")
    return max_norm, p


def clip_unscaled(
    params: list, max_norm: float, p: float, stats: list | None, found: dict, unscaler: Any
) -> torch.Tensor:
    """Scale the gradients of `params`, just unscaled by `unscaler`, down to `max_norm`
    (torch's arithmetic: a coefficient in the norm's dtype, clamped to 1) unless one of the
    `found` flags says the step will be skipped; returns the total p-norm.

    `stats`: the (sum of squares, largest magnitude) pairs that pass gathered, for p 2 or
    inf; None: the norm taken as ``clip_grad_norm_`` takes it.  The multiply is the
    core's one pass where every gradient is bfloat16, torch's ``_foreach_mul_`` otherwise.
    """
    dtype = params[0].grad.dtype if params else torch.float32
    groups: dict = {}
    for q in params:
        groups.setdefault((q.grad.device, q.grad.dtype), []).append(q.grad)
    with torch.no_grad():
        if stats is not None:
            if p == 2.0:
                total = torch.tensor(math.sqrt(math.fsum(sq for sq, _ in stats)), dtype=dtype)
            else:
                total = torch.tensor(max((m for _, m in stats), default=0.0), dtype=dtype)
        elif not params:
            return torch.tensor(0.0)
        else:
            norms = [n for grads in groups.values() for n in torch._foreach_norm(grads, p)]
            total = torch.linalg.vector_norm(torch.stack(norms), p)
        if params and not any(v.item() for v in found.values()):
            coef = clip_coefficient(total, max_norm)
            # bfloat16: the core's pass (1e7 elements: 0.73 ms, torch's 1.34 ms on a
            # Zen 3 core); torch's multiply is the faster one for the other dtypes
            core = coef.dtype == torch.bfloat16
            if not (core and unscaler.multiply(float(coef), coef.dtype)):
                for (device, _), grads in groups.items():
                    torch._foreach_mul_(grads, coef.to(device))
    return total


def _stats(t: torch.Tensor) -> tuple:
    """(sum of squares, largest magnitude) of one tensor, in float64."""
    if t.numel() == 0:
        return 0.0, 0.0
    t = t.detach().to(torch.float64)
    return float(torch.linalg.vector_norm(t)) ** 2, float(t.abs().max())


def observe(monitor: Any, groups: list, step: int, skipped: bool, before: Any, scale: Any) -> None:
    """Hand `step` to the overflow `monitor` (lscore.diagnostics), if there is one: whether
    it was `skipped`, the scale `before` it (None: the current one) and after it (`scale()`),
    and the gradients of the optimizers' param `groups`, named, if it asks for them."""
    if monitor is None:
        return
    monitor.observe(
        step,
        not skipped,
        float(before if before is not None else scale()),
        scale(),
        lambda: named_grads(monitor, groups),
    )


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
