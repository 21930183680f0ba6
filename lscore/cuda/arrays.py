"""Multi-tensor kernels over nested device arrays of one array module (the adapters' front).

all_finite, unscale_, and the one-pass unscale_and_norm / unscale_and_clip_.

Framework-neutral: an array module (``xp``), an array type and how to read
it, and a kernel backend per device.  ``lscore.adapters.cupy`` binds it to
cupy and ``CupyBackend``; the tests bind it to NumPy and the host harness;
``lscore bench --suite gpu-host`` to CuPy-shaped stand-ins and a backend
whose launches do nothing, to time the host side alone.
"""

from __future__ import annotations

import math
from typing import Any

from lscore import kernels
from lscore.cuda.config import LaunchConfig
from lscore.cuda.launch import MultiTensor
from lscore.cuda.sources import TRAITS
from lscore.dtypes import BY_NAME, Code
from lscore.policy import real
from lscore.scan import clip_coefficient, norm_order, refuse_integers

__all__ = ["ArrayKernels", "clip_coefficient", "norm_kind"]


_INT = int(Code.INT)


def _classify(dtype: Any) -> Any:
    """The dtype code the GPU kernels take for `dtype` (integer/bool: Code.INT), else None."""
    code = BY_NAME.get(str(dtype))
    if code is None or (code != Code.INT and code not in TRAITS):
        return None
    return int(code)


def _inverse(inv_scale: Any) -> float:
    inv = inv_scale if type(inv_scale) is float else real("inv_scale", inv_scale)
    if not (inv > 0 and math.isfinite(inv)):
        raise ValueError(f"inv_scale must be finite and > 0, got {inv_scale!r}")
    return inv


def norm_kind(norm_type: Any) -> bool:
    """True for the inf-norm, False for the 2-norm: the two the one-pass kernels gather.

    `norm_type` as ``torch.nn.utils.clip_grad_norm_`` takes it (a number, or
    ``"inf"``); any other p is refused rather than computed in another pass.
    """
    p = norm_order(norm_type)
    if p not in (2.0, math.inf):
        raise ValueError(
            f"norm_type must be 2 or inf (the norms the one-pass kernels gather), got {norm_type!r}"
        )
    return p == math.inf


class ArrayKernels:
    """The multi-tensor kernels over nested arrays of one array module.

    `make_backend(device)` builds the kernel backend of a device.  Arrays
    are of `array_type` (default ``xp.ndarray``), read as `kind` says
    (``kernels.READ_CUDA_ARRAY``: CuPy's attributes; ``kernels.READ_NUMPY``:
    NumPy arrays standing in for device memory on `device`); `config` (a
    ``LaunchConfig``; default: the process's, ``LSCORE_CUDA_LAUNCH``) goes to
    every launcher, and `limits` (chunk, block, opt_block, max_tensors, max_blocks)
    override it with only the kernels' own checks, for the host harness's tiny
    launches.  The walk,
    the grouping by device and dtype and the plan cache are compiled
    (``kernels.DeviceTable``); a call with the same arrays as an earlier one
    reuses that call's packed launches (a new one packs its own: nothing is uploaded).
    """

    def __init__(
        self,
        xp: Any,
        make_backend: Any,
        *,
        array_type: Any = None,
        kind: Any = kernels.READ_CUDA_ARRAY,
        device: int = 0,
        config: LaunchConfig | None = None,
        limits: dict | None = None,
    ) -> None:
        self.xp = xp
        self.kind = kind  # how arrays are read (kernels.READ_*)
        self._make_backend = make_backend
        self._limits = dict(limits or {}, config=config)
        self._devices: dict = {}
        self._table = kernels.DeviceTable(
            array_type if array_type is not None else xp.ndarray,
            kind,
            _classify,
            f"{xp.__name__}.ndarray or nested lists, tuples and dicts of them",
            hint=xp.__name__,
            device=device,
        )

    @property
    def table(self) -> Any:
        """The compiled walker and its plan cache (``kernels.DeviceTable``)."""
        return self._table

    def device(self, dev: int) -> MultiTensor:
        """The launcher of device `dev`, built once."""
        runner = self._devices.get(dev)
        if runner is None:
            runner = self._devices[dev] = MultiTensor(self._make_backend(dev), **self._limits)
        return runner

    def _launches(self, plan: Any, dev: int, runner: Any) -> Any:
        """The packed launches of `plan` on `dev`: kept with the plan, and shared by plans of
        the same addresses and sizes (new arrays where the memory pool put the last ones
        reuse the packing)."""
        prepared = plan.payload.get(dev)
        if prepared is None:
            prepared = plan.payload[dev] = runner.prepared(
                [(code, ptrs, sizes) for d, code, ptrs, sizes in plan.groups if d == dev]
            )
        return prepared

    def check_async(self, arrays: Any, found_ptr: int, device: int) -> None:
        """Launch the read-only check: the uint32 at `found_ptr` on `device` turns 1 on NaN/Inf."""
        plan = self._table.plan(arrays)
        for dev in plan.devices:
            if dev != device:
                raise ValueError(
                    f"arrays on device {dev}, but the loss scale lives on device {device}"
                )
        for dev in plan.devices:
            runner = self.device(dev)
            runner.launch(
                "all_finite", self._launches(plan, dev, runner), found_ptr=found_ptr, mark=1
            )

    def _writable_plan(self, arrays: Any) -> Any:
        """The plan of arrays to unscale in place: refused before any launch when one is
        read-only, or of integers or bools (which cannot be unscaled)."""
        plan = self._table.plan(arrays)
        if plan.write_error is not None:
            raise ValueError(plan.write_error)
        if _INT in plan.codes:
            refuse_integers("unscale_", arrays)
        return plan

    def _run(self, op: str, arrays: Any, inv: float) -> bool:
        plan = self._writable_plan(arrays) if op == "unscale" else self._table.plan(arrays)
        devices = plan.devices
        if len(devices) == 1:  # the common call
            dev = devices[0]
            runner = self.device(dev)
            mark = runner.launch(op, self._launches(plan, dev, runner), inv=inv)
            return not runner.found(mark)
        calls = []
        for dev in devices:  # enqueue on every device, then read each
            runner = self.device(dev)
            calls.append((runner, runner.launch(op, self._launches(plan, dev, runner), inv=inv)))
        # a list, not a generator: every device is read (each read waits for its launch)
        return not any([runner.found(mark) for runner, mark in calls])  # noqa: C419

    def all_finite(self, arrays: Any) -> bool:
        """True when no floating element of `arrays` is NaN or +/-Inf (one sync per device).

        `arrays`: an array or nested lists, tuples and dicts of them; None is
        ignored, integer and bool arrays are finite, empty input is finite.
        """
        return self._run("all_finite", arrays, 1.0)

    def unscale_(self, arrays: Any, inv_scale: Any) -> bool:
        """Multiply every floating array in place by `inv_scale`; True when all inputs were finite.

        The arithmetic of ``lscore.unscale_``: the check is on the inputs;
        float16/bfloat16 are widened to float32, multiplied by
        float32(inv_scale) and rounded back to nearest even; float32 uses
        float32(inv_scale), float64 the double.  One fused pass per dtype,
        enqueued on the current stream, and one host sync per device.
        Refused before anything is written: arrays of another type, integer and
        bool arrays, dtypes without a kernel, non-dense or self-overlapping
        arrays, read-only arrays and arrays that share memory.
        """
        return self._run("unscale", arrays, _inverse(inv_scale))

    def unscale_and_norm(
        self, arrays: Any, inv_scale: Any, norm_type: Any = 2.0
    ) -> tuple[bool, float]:
        """``unscale_``, and the norm of the values it wrote, gathered in the same pass.

        Returns (all inputs finite, norm): the 2-norm (``norm_type=2``) or the
        largest magnitude (``norm_type=inf``) over every floating array, as a
        float64; other p-norms are refused.  The unscaled values are
        ``unscale_``'s bit for bit.  Each value is widened to float64 exactly and
        squared and summed in float64, per thread in a fixed order and then in
        fixed-order folds, so the same arrays give the same bits on every call
        (the order depends on the sizes, the launch limits and each array's
        address modulo 16, never on scheduling).  The inf-norm is exact; the
        2-norm differs from an exactly rounded float64 sum only by float64
        rounding (relative error below 1e-12 for any realistic size).  NaN/Inf in
        the input makes the norm NaN or Inf and ``finite`` False.  One host sync
        per device.
        """
        return self._norm(arrays, _inverse(inv_scale), norm_kind(norm_type), 0.0)

    def unscale_and_clip_(
        self, arrays: Any, inv_scale: Any, max_norm: Any, norm_type: Any = 2.0
    ) -> tuple[bool, float]:
        """``unscale_and_norm``, then clip in place as ``torch.nn.utils.clip_grad_norm_`` does.

        Every floating array is multiplied by max_norm / (norm + 1e-6) clamped
        to 1 (taken in float64, applied with ``unscale_``'s rounding), unless
        an input was NaN/Inf: then nothing is clipped, since the step will be
        skipped.  The coefficient is computed on the device, so the arrays are
        read once to unscale, check and measure, and once more only when the
        coefficient is below 1.  Returns (all inputs finite, norm before clipping).
        """
        inv = _inverse(inv_scale)
        inf_norm = norm_kind(norm_type)
        limit = real("max_norm", max_norm)
        if not (limit > 0 and math.isfinite(limit)):
            raise ValueError(f"max_norm must be finite and > 0, got {max_norm!r}")
        return self._norm(arrays, inv, inf_norm, limit)

    def _norm(self, arrays: Any, inv: float, inf_norm: bool, max_norm: float) -> tuple[bool, float]:
        plan = self._writable_plan(arrays)
        devices = plan.devices
        # on one device the coefficient never leaves it; across devices it needs every norm
        fold_on_device = max_norm if len(devices) == 1 else 0.0
        calls = []
        for dev in devices:
            runner = self.device(dev)
            prepared = self._launches(plan, dev, runner)
            runner.launch_norm(prepared, inv=inv, inf_norm=inf_norm, max_norm=fold_on_device)
            if fold_on_device:
                runner.launch_clip(prepared)
            calls.append((runner, prepared))
        results = [runner.backend.get(prepared.norm.result) for runner, prepared in calls]
        if not results:
            return True, 0.0
        found = any(r[2] for r in results)
        if len(results) == 1:
            return not found, float(results[0][0])
        totals = [float(r[3]) for r in results]
        if inf_norm:
            norm = math.nan if any(map(math.isnan, totals)) else max(totals)
        else:
            norm = math.sqrt(math.fsum(totals))
        if max_norm:
            coef = clip_coefficient(norm, max_norm, found)
            for runner, prepared in calls:
                runner.launch_clip(prepared, coef=coef)
        return not found, norm
