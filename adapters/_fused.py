"""``Fused``: the CuPy adapter's SGD and Adam on lscore.cuda's fused kernels.

When every variable is a dense float32 array and every gradient a dense float16,
bfloat16 or float32 array (no clipping configured), a step is the fused kernels
(_ext/optim.cu): one launch per gradient dtype reads each gradient once, casts it
to float32 and updates the variable and its slots, bit for bit as the NumPy
adapter; the records travel in the kernels' arguments, packed once per list of
arrays (re-packed when an address, size or dtype changes; nothing is uploaded).
Other variables (float16, float64) and clipped steps take the elementwise path of
``_arrays`` (``_gated``'s, under a sync-free LossScaleOptimizer).

A LossScaleOptimizer drives the fused kernels itself (``fused_plan``,
``fused_check``, ``fused_update``) to unscale, check and skip on the device.
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from lscore import kernels
from lscore.adapters._backend import ONE_STEP, anywhere, refuse_in_capture
from lscore.adapters._gated import Gated
from lscore.adapters._grads import drop_none_gradients, grad_var_pairs, unzip
from lscore.cuda.optim import FLAGS, GRAD_CODES, FusedLauncher, FusedPlan

_shape = operator.attrgetter("shape")
# what a schedule may set between replays of a captured sync-free step (Adam's betas are not
# live: their bias-correction table is captured with the step)
_LIVE = frozenset({"learning_rate", "momentum", "epsilon", "weight_decay"})


class Fused(Gated):
    """Base of SGD and Adam on device arrays: the fused kernels where they apply, the
    gated elementwise step elsewhere.  A subclass names its kernel (``_kind``), its
    slots and the kernel's hyperparameters and flags."""

    _kind = ""  # "sgd" or "adam": the fused kernel
    # the sync-free step's device hyperparameters: device -> [float32 array, its bytes, address]
    _hyper: dict[int, list] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        """Setting a live hyperparameter (``_LIVE``) also writes the device copies, so a
        replayed CUDA graph reads it; refused while capturing (the write would be captured)."""
        if name in _LIVE and self._hyper:
            self._backend.refuse_in_capture(
                f"setting {name} (a host-to-device write)",
                "set it between replays, outside the capture",
            )
            super().__setattr__(name, value)
            for device in self._hyper:
                self._put_hyper(device)
            return
        super().__setattr__(name, value)

    def fused_launcher(self) -> FusedLauncher:
        """The fused kernels' launcher of the current device (shares the adapter's backend)."""
        return self._backend.fused_launcher(self._backend.current_device())

    @property
    def uses_step_counter(self) -> bool:
        """Whether a sync-free step hands the fused update a device step counter (Adam's
        bias correction reads it; SGD reads none)."""
        return False

    def fused_plan(self, grads: list, variables: list) -> FusedPlan | None:
        """The fused kernels' plan of `grads` for `variables` (one list each, None dropped),
        or None: the elementwise path (a clipped step, arrays the kernels do not take, or
        inside ``gated``).  The plan holds its launcher (``plan.launcher``).

        The gradients and the variables are walked apart by the adapter's compiled
        ``lscore.kernels.DeviceTable`` (which checks each array's identity, address, size
        and dtype against its cached plan): the variables' checks and record columns
        (parameter and slot addresses) are kept with the variables' plan, so gradients
        at new addresses (``zero_grad(set_to_none=True)``) cost a walk, a few vectorised
        checks and the packing of the kernels' arguments (nothing uploaded); the same
        gradients again cost the walks and a lookup.
        """
        gs, vs = grads, variables
        if self._gate is not None:
            return None
        if not gs or self._clipnorm or self._global_clipnorm or self._clipvalue:
            return None
        table = self._backend.kernels.table
        try:
            gplan, vplan = table.plan(gs), table.plan(vs)
        except (TypeError, ValueError):
            return None  # not this module's arrays, a dtype without a kernel, not dense
        # the optimizer's own entry: optimizers sharing a gradient list keep theirs apart
        key = ("fused", self._kind, self._slot_names(), self._backend.current_device(), id(self))
        hit = gplan.payload.get(key)
        if hit is not None and hit[0]() is self and hit[1] is vplan:
            return hit[2]
        launcher = self.fused_launcher()
        columns = self._variable_columns(vs, vplan, key, launcher)
        plan = None
        if columns is not None and self._fusable_grads(gs, gplan, vplan, columns[1]):
            codes, counts = gplan.leaf_codes, vplan.leaf_counts
            records = np.empty((len(gs), 1 + columns[0].shape[1]), np.uint64)
            records[:, 0] = gplan.leaf_addresses
            records[:, 1:] = columns[0]
            plan = launcher.plan(
                (codes.tobytes(), counts.tobytes(), records.tobytes()),
                self._kind,
                codes,
                counts,
                records,
            )
        gplan.payload[key] = (weakref.ref(self), vplan, plan)
        return plan

    def _variable_columns(self, vs: list, vplan: Any, key: tuple, launcher: FusedLauncher) -> Any:
        """(uint64 matrix of each variable's {param, slots...} addresses, their shapes), or
        None when the fused kernels cannot update these variables; kept with `vplan`.
        Slots are created here (refused while capturing: ``ONE_STEP``)."""
        hit = vplan.payload.get(key)
        if hit is not None and hit[0]() is self:
            return hit[1]
        columns = None
        ptr = launcher.backend.ptr
        if self._fusable_variables(vs, vplan, ptr):
            self._bind(vs)  # a loaded state's slots, checked before any is bound
            names = self._slot_names()
            capturing = self._backend.capturing()
            rows = []
            for v in vs:
                entry = self._slots.get(id(v))
                slots = entry[1] if entry is not None and entry[0] is v else {}
                if capturing and any(n not in slots for n in names):
                    refuse_in_capture(True, "creating an optimizer slot", ONE_STEP)
                rows.append((ptr(v), *[ptr(self._slot(v, n)) for n in names]))
            matrix = np.array(rows, np.uint64).reshape(len(vs), 1 + len(names))
            columns = (matrix, [v.shape for v in vs])
        vplan.payload[key] = (weakref.ref(self), columns)
        return columns

    def _fusable_variables(self, vs: list, vplan: Any, ptr: Callable[[Any], int]) -> bool:
        """Whether the fused kernels can update these variables: dense, writable float32
        arrays of the module's own type on the current device, none twice, none
        overlapping another (the kernels update them all at once)."""
        arr, on = self._xp.ndarray, self._backend.on_device
        dev = self._backend.current_device()
        if len(vplan.leaf_codes) != len(vs) or len({id(v) for v in vs}) != len(vs):
            return False
        if not all(
            type(v) is arr
            and v.dtype == np.float32
            and v.flags.c_contiguous
            and getattr(v.flags, "writeable", True)
            and on(v, dev)
            for v in vs
        ):
            return False
        spans = sorted((ptr(v), ptr(v) + v.nbytes) for v in vs if v.size)
        return all(a[1] <= b[0] for a, b in itertools.pairwise(spans))

    def _fusable_grads(self, gs: list, gplan: Any, vplan: Any, shapes: list) -> bool:
        """Whether the fused kernels can read these gradients for these variables: of the
        module's own type, float16, bfloat16 or float32, C-contiguous, of the variables'
        shapes, on the current device; read from the walked plans, vectorised."""
        dev = self._backend.current_device()
        if len(gplan.leaf_codes) != len(gs) or gplan.leaf_type is not self._xp.ndarray:
            return False
        if not (
            all(c in GRAD_CODES for c in gplan.codes)  # each dtype code once
            and gplan.leaf_c_contiguous.all()
            and (gplan.leaf_counts == vplan.leaf_counts).all()  # one length: len(gs) each
        ):
            return False
        same = gplan.same_shapes(vplan)  # compiled; None: a plan that keeps no arrays
        if not (same if same is not None else list(map(_shape, gs)) == shapes):
            return False
        if self._backend.kernels.kind == kernels.READ_CUDA_ARRAY:  # the walk read each device
            return bool((gplan.leaf_devices == dev).all())
        on = self._backend.on_device
        return on is anywhere or all(on(g, dev) for g in gs)

    def _slot_names(self) -> tuple:
        raise NotImplementedError

    def fused_check(
        self,
        plan: FusedPlan,
        *,
        gate_ptr: int,
        skip_if: int,
        flags: int = 0,
        inv: float = 1.0,
        inv_ptr: int = 0,
    ) -> int:
        """Launch the fused check over `plan`'s gradients: it stores `skip_if` at the device
        uint32 `gate_ptr` when one is NaN/Inf once unscaled by `inv` (or the device float64
        at `inv_ptr`), writing nothing else.  `flags`: ``FLAGS["INV_AS_GRAD"]`` rounds the
        inverse to each gradient's dtype first.  Returns the launches made."""
        return plan.launcher.launch(
            self._kind,
            plan,
            (),
            flags=flags | self._fused_flags() | FLAGS["CHECK"],
            inv=inv,
            inv_ptr=inv_ptr,
            gate_ptr=gate_ptr,
            skip_if=skip_if,
        )

    def fused_update(
        self,
        plan: FusedPlan,
        *,
        flags: int = 0,
        inv: float = 1.0,
        inv_ptr: int = 0,
        gate_ptr: int = 0,
        skip_if: int = 0,
        count_ptr: int = 0,
        live: bool = False,
    ) -> int:
        """Launch the fused update over `plan`: every variable and its slots take one step
        from its gradient times `inv` (or the device float64 at `inv_ptr`), unless the
        device uint32 at `gate_ptr` (when not 0) holds `skip_if`.  `count_ptr`: Adam's
        device step counter (the bias correction of step ``*count + 1``, from a table);
        `live`: the kernels read the hyperparameters from this optimizer's device copy, so
        a replayed CUDA graph sees values set between replays.  ``iterations`` is left to
        the caller.  Returns the launches made."""
        launcher = plan.launcher
        values = self._hyper_values()
        head, tail = self._fused_args(launcher, values, count_ptr)
        return launcher.launch(
            self._kind,
            plan,
            head,
            flags=flags | self._fused_flags(),
            inv=inv,
            inv_ptr=inv_ptr,
            gate_ptr=gate_ptr,
            skip_if=skip_if,
            tail=tail,
            hyper_ptr=self._hyper_ptr(launcher, values) if live else 0,
        )

    def _fused_args(
        self, launcher: FusedLauncher, values: np.ndarray, count_ptr: int
    ) -> tuple[tuple, tuple]:
        """(the kernel's scalars between ``chunk`` and ``flags``, Adam's tail):
        ``FusedLauncher.launch``'s `head` and `tail`, from the hyperparameters `values`."""
        raise NotImplementedError

    def _fused_flags(self) -> int:
        """The flag bits that pick this optimizer's kernel variant."""
        raise NotImplementedError

    def _hyper_values(self) -> np.ndarray:
        """The float32 hyperparameters in optim.cu's ``hyper`` order."""
        raise NotImplementedError

    def _hyper_ptr(self, launcher: FusedLauncher, values: np.ndarray) -> int:
        """The address of the launcher's device copy of the hyperparameters `values`,
        uploaded on first use (never while capturing) and rewritten when they changed."""
        device = self._backend.current_device()
        if self._hyper is None:
            self._hyper = {}
        entry = self._hyper.get(device)
        if entry is None:
            refuse_in_capture(
                self._backend.capturing(), "uploading the optimizer's hyperparameters", ONE_STEP
            )
            backend = launcher.backend
            arr = backend.to_device(values)
            entry = self._hyper[device] = [arr, values.tobytes(), backend.ptr(arr)]
        else:
            self._put_hyper(device, values)
        return int(entry[2])

    def _put_hyper(self, device: int, values: np.ndarray | None = None) -> None:
        """Write the hyperparameters (`values`, by default this optimizer's) into `device`'s
        array if they changed: a copy ordered on that device's current stream (where a
        captured graph is replayed)."""
        assert self._hyper is not None  # only called once an array exists
        entry = self._hyper[device]
        if values is None:
            values = self._hyper_values()
        if entry[1] == values.tobytes():
            return
        self._backend.refuse_in_capture(
            "writing changed hyperparameters (a host-to-device copy)",
            "set them between replays, outside the capture",
        )
        backend, xp = self._backend.fused_launcher(device).backend, self._xp
        prev = backend.enter()
        try:
            xp.copyto(entry[0], xp.asarray(values))
        finally:
            backend.leave(prev)
        entry[1] = values.tobytes()

    def apply_gradients(self, grads_and_vars: Any) -> int:
        """Update every variable in place; returns ``iterations``."""
        pairs = grad_var_pairs(grads_and_vars)
        if pairs:
            pairs = drop_none_gradients(pairs, warn=True)
            plan = self.fused_plan(*unzip(pairs))
            if plan is not None:
                self.fused_update(plan)
                self.iterations += 1
                return self.iterations
        return super().apply_gradients(pairs)
