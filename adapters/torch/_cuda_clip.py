"""GradScaler.unscale_and_clip_ on CUDA gradients: unscale, check and norm in one pass.

Design: off the CPU the GradScaler's path unscales with torch's kernel and
``clip_grad_norm_`` then reads every gradient again for the norm.  Here
lscore's one-pass kernels (_ext/scan.cu, launched through
``lscore.cuda.launch.MultiTensor`` on torch's current stream) unscale, check and
gather the norm in the same read, fold it in a fixed order on the device (the
same bits every call), and the clip multiplies with a coefficient that never
leaves the device, so a clipped step reads the gradients once before the
clip's own read-modify-write and adds no host synchronisation: the
gradients' addresses travel in the kernel arguments, so gradients at new
addresses (``zero_grad(set_to_none=True)``, new shapes) cost no upload either.
The gradients are read by the compiled walk (``lscore.kernels.DeviceTable``
through the tensors' DLPack C exchange API, one C call each), whose plan,
with the packed launches kept in it, serves the same gradients next step.

What torch computes is kept wherever the result can depend on it: the inverse
scale is torch's (float64 reciprocal of the float32 scale, rounded to
float32), the unscale multiply rounds as ``_amp_foreach_non_finite_check_and_unscale_``,
the total norm is returned in the gradients' dtype and the coefficient is
``clamp(max_norm / (total + 1e-6), max=1)`` computed by torch on that tensor,
and lsc_mt_clip multiplies as ``_foreach_mul_`` does.  Only the norm's sum
differs: lscore sums squares in float64 where torch sums per tensor in
float32, so the norm is torch's within torch's own float32 rounding (and
exact for ``norm_type=inf``).  When a gradient is NaN/Inf nothing is clipped.

``CUDA`` is the one binding (CUDA tensors, ``TorchCudaBackend``: the
kernels are loaded and launched through CuPy, so this path needs CuPy
installed, the ``cuda12`` or ``cuda13`` extra; without it torch's
path is taken); the tests rebind it to CPU tensors and the host harness
(tests/helpers/cuda_host), so everything but the launches runs without a GPU.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import torch

from lscore import kernels
from lscore.adapters.torch._cuda_backend import TorchCudaBackend
from lscore.adapters.torch._unscaler import TORCH_CODES, inverse_tensor
from lscore.cuda.launch import MultiTensor
from lscore.dtypes import Code
from lscore.scan import clip_coefficient

__all__ = ["CUDA", "Kernels", "OnePass", "TorchCudaBackend"]


class Kernels:
    """The one-pass launchers for gradients on devices of one type, one per device, and the
    compiled walk that reads the gradients (``lscore.kernels.DeviceTable`` through the
    tensors' DLPack C exchange API) with its plan cache."""

    def __init__(self, device_type: str, make_backend: Any, available: Any = lambda: True) -> None:
        self.device_type = device_type
        self._make_backend = make_backend
        self._runners: dict = {}
        self.available = available
        self.table = kernels.DeviceTable(
            torch.Tensor,
            kernels.READ_DLPACK,
            TORCH_CODES.get,
            "torch.Tensor",
            hint="torch",
            dl_device=kernels.DLPACK_DEVICES[device_type],
        )

    def runner(self, index: int) -> MultiTensor:
        r = self._runners.get(index)
        if r is None:
            r = self._runners[index] = MultiTensor(self._make_backend(index))
        return r

    def plan(self, params: Any) -> Any:
        """The walked plan of the gradients of `params` (``kernels.DevicePlan``), or None
        when one of them is not a dense C-contiguous floating tensor of exactly
        ``torch.Tensor`` on this device type: torch's path then."""
        try:
            return self.table.plan(params, attr="grad")
        except (TypeError, ValueError):
            return None


# the kernels load through CuPy: without it, torch's own path (two reads) is taken
CUDA = Kernels(
    "cuda", TorchCudaBackend, available=lambda: importlib.util.find_spec("cupy") is not None
)


class OnePass:
    """One clipped step through the one-pass kernels.

    ``of`` walks the gradients (None when this path does not apply); the
    object is then ``GradScaler.unscale_``'s unscale (its ``_unscale`` hook:
    unscale, check and gather the norm, {device: found-inf tensor}), and
    ``clip`` scales the gradients down with torch's coefficient.
    """

    def __init__(self, kernels: Kernels, plan: Any, scale: torch.Tensor, inf_norm: bool):
        self.scale, self.inf_norm = scale, inf_norm
        self.codes = plan.codes  # every gradient's, empty ones included
        self.calls = []
        for index in plan.devices:
            runner = kernels.runner(index)
            # packed once per walked plan: the same gradients next step reuse the packing
            prepared = plan.payload.get(index)
            if prepared is None:
                prepared = plan.payload[index] = runner.prepared(
                    [(code, ptrs, sizes) for d, code, ptrs, sizes in plan.groups if d == index]
                )
            self.calls.append((torch.device(kernels.device_type, index), runner, prepared))

    @classmethod
    def of(
        cls, params: list, scale: torch.Tensor, p: float, kernels: Kernels | None = None
    ) -> OnePass | None:
        """The pass over the gradients of `params`, or None, touching nothing, when a
        gradient is sparse, strided, not floating or not on the kernels' device type
        (or there is none, or `p` is neither 2 nor inf, or CuPy, which loads the kernels,
        is not installed): torch's path then."""
        kernels = CUDA if kernels is None else kernels
        if not kernels.available() or not params or p not in (2.0, math.inf):
            return None
        plan = kernels.plan(params)
        if plan is None or not plan.groups:
            return None
        return cls(kernels, plan, scale, p == math.inf)

    def __call__(self, optimizer: Any, allow_fp16: bool, stats: Any = None) -> dict:
        if not allow_fp16 and Code.F16 in self.codes:
            raise ValueError("Attempting to unscale FP16 gradients.")
        inv = inverse_tensor(self.scale).double()
        found = {}
        for device, runner, prepared in self.calls:
            here = inv.to(device, copy=True)
            runner.launch_norm(prepared, inv_ptr=here.data_ptr(), inf_norm=self.inf_norm)
            found[device] = torch.as_tensor(prepared.norm.result)[2].to(torch.float32, copy=True)
        return found

    def norm(self) -> torch.Tensor:
        """The float64 norm over every device, on the scale's device (no host sync)."""
        results = [torch.as_tensor(p.norm.result).to(self.scale.device) for _, _, p in self.calls]
        if len(results) == 1:
            return results[0][0].clone()
        totals = torch.stack([r[3] for r in results])
        return totals.max() if self.inf_norm else totals.sum().sqrt()

    def clip(self, max_norm: float, found: dict, dtype: torch.dtype) -> torch.Tensor:
        """Clip as ``clip_grad_norm_`` does, unless a `found` flag is set; returns the
        total norm as a 0-d tensor of `dtype` (the first gradient's, as torch's)."""
        with torch.no_grad():
            total = self.norm().to(dtype)
            coef = clip_coefficient(total, max_norm)
            flags = [f.to(total.device) for f in found.values()]
            if flags:
                # the step will be skipped: leave its gradients as they are
                coef = torch.where(torch.stack(flags).sum() > 0, torch.ones_like(coef), coef)
            # lsc_mt_clip rounds as _foreach_mul_ by this tensor does; 1 reads nothing
            coef = coef.double()
            for device, runner, prepared in self.calls:
                here = coef.to(device, copy=True)
                runner.launch_clip(prepared, coef_ptr=here.data_ptr())
        return total
