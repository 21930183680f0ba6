"""Device-array parts of the CuPy adapter, written against one backend object.

Design: an ``ArrayBackend`` holds what these classes need of a framework (its
array module, lscore's kernels over its arrays, the current device, where an
array lives, whether a CUDA graph is being captured).  ``lscore.adapters.cupy``
subclasses ``SGD``, ``Adam`` and ``LossScaleOptimizer`` with cupy's backend;
the tests and ``lscore bench --suite gpu-host`` bind the very same classes to
NumPy and a stand-in device (``lscore.adapters.device.bind``), so the
gathering of arrays, the launches, the gating of SGD/Adam and the sync-free
bookkeeping all run in CI without a GPU.

- ``ArrayBackend``: the backend, and ``all_finite`` / ``unscale_`` /
  ``unscale_and_norm`` / ``unscale_and_clip_`` over nested device arrays
  (``lscore.cuda.ArrayKernels``), refused while a graph is being captured.
- ``Gated``, with ``SGD`` and ``Adam``: dense float32 variables are updated by
  the fused kernels (``lscore.cuda.optim.FusedLauncher`` over _ext/optim.cu), which
  also unscale, check and skip on the device for a LossScaleOptimizer; other
  variables take the elementwise path, where a device boolean ``_gate`` makes
  a skipped step restore copies, so it changes nothing without a host sync.
- ``LossScaleOptimizer``: the LossScaleOptimizer of adapters/_optim with a
  ``sync_free`` mode that keeps the state machine on the device, the guards
  that keep a CUDA-graph capture from synchronising, and the one that keeps
  its steps on the device its state lives on.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from lscore import kernels
from lscore.adapters import _arrays, _optim
from lscore.cuda.arrays import ArrayKernels
from lscore.cuda.device_state import FLOOR, DeviceState
from lscore.cuda.optim import FLAGS, GRAD_CODES, FusedLauncher, bias_table
from lscore.distributed import reduce_found_inf
from lscore.state import LossScaleFloorError


def refuse_in_capture(capturing: bool, what: str, instead: str) -> None:
    """RuntimeError instead of an operation that would break a CUDA stream capture."""
    if capturing:
        raise RuntimeError(
            f"{what} while the current stream is capturing a CUDA graph "
            f"would break the capture; {instead}"
        )


def _device_zero() -> int:
    return 0


def _anywhere(a: Any, device: int) -> bool:
    return True


def _never() -> bool:
    return False


@dataclasses.dataclass(frozen=True, eq=False)
class ArrayBackend:
    """What the device-array classes need of a framework, in one object.

    `xp` is the array module, `kernels` lscore's kernels over its arrays (an
    ``ArrayKernels``), `current_device()` the device now current,
    `on_device(a, device)` whether array `a` lives on `device`, and
    `capturing()` whether the current stream is capturing a CUDA graph.  The
    four reading calls below refuse (RuntimeError) while capturing: they read
    a flag or a norm back, which would break the capture.
    """

    xp: Any
    kernels: ArrayKernels
    current_device: Callable[[], int] = _device_zero
    on_device: Callable[[Any, int], bool] = _anywhere
    capturing: Callable[[], bool] = _never
    _launchers: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

    def refuse_in_capture(self, what: str, instead: str) -> None:
        refuse_in_capture(self.capturing(), what, instead)

    def fused_launcher(self, device: int) -> FusedLauncher:
        """The fused kernels' launcher of `device` (on that device's ``MultiTensor``)."""
        runner = self.kernels.device(device)
        hit = self._launchers.get(device)
        if hit is None or hit.runner is not runner:
            hit = self._launchers[device] = FusedLauncher(runner)
        return hit

    def all_finite(self, arrays: Any) -> bool:
        self.refuse_in_capture(
            "all_finite (it reads a flag back)",
            "check inside a capture with LossScaleOptimizer(sync_free=True)",
        )
        return self.kernels.all_finite(arrays)

    def unscale_(self, arrays: Any, inv_scale: float) -> bool:
        self.refuse_in_capture(
            "unscale_ (it reads a flag back)",
            "unscale inside a capture with LossScaleOptimizer(sync_free=True)",
        )
        return self.kernels.unscale_(arrays, inv_scale)

    def unscale_and_norm(
        self, arrays: Any, inv_scale: float, norm_type: Any = 2.0
    ) -> tuple[bool, float]:
        self.refuse_in_capture(
            "unscale_and_norm (it reads the norm back)", "take the norm outside the captured step"
        )
        return self.kernels.unscale_and_norm(arrays, inv_scale, norm_type)

    def unscale_and_clip_(
        self, arrays: Any, inv_scale: float, max_norm: float, norm_type: Any = 2.0
    ) -> tuple[bool, float]:
        self.refuse_in_capture(
            "unscale_and_clip_ (it reads the norm back)", "clip outside the captured step"
        )
        return self.kernels.unscale_and_clip_(arrays, inv_scale, max_norm, norm_type)

    all_finite.__doc__ = ArrayKernels.all_finite.__doc__
    unscale_.__doc__ = ArrayKernels.unscale_.__doc__
    unscale_and_norm.__doc__ = ArrayKernels.unscale_and_norm.__doc__
    unscale_and_clip_.__doc__ = ArrayKernels.unscale_and_clip_.__doc__


_ONE_STEP = (
    "run one eager step with these very arrays before begin_capture(), so that "
    "everything is planned and allocated"
)


class Gated(_arrays.ArrayOptimizer):
    """Base of SGD and Adam on device arrays (``_backend``): the fused kernels, gated steps.

    When every variable is a dense float32 array and every gradient a dense
    float16, bfloat16 or float32 array (no clipping configured), a step is
    lscore.cuda's fused kernels (_ext/optim.cu): one launch per gradient
    dtype reads each gradient once, casts it to float32 and updates the
    variable and its slots, bit for bit as the NumPy adapter; the records
    travel in the kernels' arguments, packed once per list of arrays
    (re-packed when an address, size or dtype changes; nothing is
    uploaded).  Other variables (float16, float64) and clipped steps take
    the elementwise path of ``_arrays``.

    A LossScaleOptimizer drives the fused kernels itself (``_fused_plan``,
    ``_fused_launch``) to unscale, check and skip on the device.  On the
    elementwise path only, with ``_gate`` a 0-d device boolean, the
    parent's step runs, then the variable and its slots are restored from
    copies where the gate is false; no host sync either way.
    """

    _gate = None
    _backend: ClassVar[ArrayBackend]  # set by the adapter's subclass
    _kind = ""  # "sgd" or "adam": the fused kernel
    # the sync-free step's device hyperparameters: device -> [float32 array, its bytes]
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

    @property
    def _xp(self) -> Any:
        backend = getattr(self, "_backend", None)
        return None if backend is None else backend.xp

    def _update_step(self, g: Any, v: Any) -> None:
        gate = self._gate
        if gate is None:
            return super()._update_step(g, v)
        xp = self._xp
        entry = self._slots.get(id(v))
        before = {k: s.copy() for k, s in entry[1].items()} if entry and entry[0] is v else {}
        old = v.copy()
        super()._update_step(g, v)
        keep = xp.logical_not(gate)
        xp.copyto(v, old, where=keep)
        for k, s in self._slots.get(id(v), (None, {}))[1].items():
            xp.copyto(s, before[k] if k in before else xp.zeros_like(s), where=keep)
        return None

    # -- the fused path --------------------------------------------------------------
    def fused_launcher(self) -> FusedLauncher:
        """The fused kernels' launcher of the current device (shares the adapter's backend)."""
        return self._backend.fused_launcher(self._backend.current_device())

    def _fused_plan(self, gs: list, vs: list) -> Any:
        """The fused kernels' plan of this step's gradients `gs` for the variables `vs` (one
        list each, None dropped), or None: the elementwise path.

        The gradients and the variables are walked apart by the adapter's compiled
        ``lscore.kernels.DeviceTable`` (which checks each array's identity, address, size
        and dtype against its cached plan): the variables' checks and record columns
        (parameter and slot addresses) are kept with the variables' plan, so gradients
        at new addresses (``zero_grad(set_to_none=True)``) cost a walk, a few vectorised
        checks and the packing of the kernels' arguments (nothing uploaded); the same
        gradients again cost the walks and a lookup.
        """
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
        columns = self._variable_columns(vs, vplan, key)
        plan = None
        if columns is not None and self._fusable_grads(gs, gplan, vplan, columns[1]):
            codes, counts = gplan.leaf_codes, vplan.leaf_counts
            records = np.empty((len(gs), 1 + columns[0].shape[1]), np.uint64)
            records[:, 0] = gplan.leaf_addresses
            records[:, 1:] = columns[0]
            plan = self.fused_launcher().plan(
                (codes.tobytes(), counts.tobytes(), records.tobytes()),
                self._kind,
                codes,
                counts,
                records,
            )
        gplan.payload[key] = (weakref.ref(self), vplan, plan)
        return plan

    def _variable_columns(self, vs: list, vplan: Any, key: tuple) -> Any:
        """(uint64 matrix of each variable's {param, slots...} addresses, their shapes), or
        None when the fused kernels cannot update these variables; kept with `vplan`.
        Slots are created here (refused while capturing: ``_ONE_STEP``)."""
        hit = vplan.payload.get(key)
        if hit is not None and hit[0]() is self:
            return hit[1]
        columns = None
        if self._fusable_variables(vs, vplan):
            self._bind(vs)  # a loaded state's slots, checked before any is bound
            ptr = self.fused_launcher().backend.ptr
            names = self._slot_names()
            capturing = self._backend.capturing()
            rows = []
            for v in vs:
                entry = self._slots.get(id(v))
                slots = entry[1] if entry is not None and entry[0] is v else {}
                if capturing and any(n not in slots for n in names):
                    refuse_in_capture(True, "creating an optimizer slot", _ONE_STEP)
                rows.append((ptr(v), *[ptr(self._slot(v, n)) for n in names]))
            matrix = np.array(rows, np.uint64).reshape(len(vs), 1 + len(names))
            columns = (matrix, [v.shape for v in vs])
        vplan.payload[key] = (weakref.ref(self), columns)
        return columns

    def _fusable_variables(self, vs: list, vplan: Any) -> bool:
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
        ptr = self.fused_launcher().backend.ptr
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
        return on is _anywhere or all(on(g, dev) for g in gs)

    def _slot_names(self) -> tuple:
        raise NotImplementedError

    def _fused_launch(
        self,
        plan: Any,
        *,
        check: bool,
        flags: int = 0,
        inv: float = 1.0,
        inv_ptr: int = 0,
        gate_ptr: int = 0,
        skip_if: int = 0,
        count_ptr: int = 0,
        live: bool = False,
    ) -> int:
        """Launch the fused kernels; `live`: they read the hyperparameters from this
        optimizer's device array (``_hyper_ptr``) instead of by value."""
        if check:  # the check reads no hyperparameter
            head, tail, own = (), (), self._fused_flags()
        else:
            head, tail, own = self._fused_args(count_ptr)
        flags |= own | (FLAGS["CHECK"] if check else 0)
        return self.fused_launcher().launch(
            self._kind,
            plan,
            head,
            flags=flags,
            inv=inv,
            inv_ptr=inv_ptr,
            gate_ptr=gate_ptr,
            skip_if=skip_if,
            tail=tail,
            hyper_ptr=self._hyper_ptr() if live else 0,
        )

    def _fused_args(self, count_ptr: int) -> tuple[tuple, tuple, int]:
        """(the kernel's scalars between ``chunk`` and ``flags``, Adam's tail, this
        optimizer's variant flags): ``FusedLauncher.launch``'s `head`, `tail` and flags."""
        raise NotImplementedError

    def _fused_flags(self) -> int:
        """The flag bits that pick this optimizer's kernel variant."""
        raise NotImplementedError

    def _hyper_values(self) -> np.ndarray:
        """The float32 hyperparameters in optim.cu's ``hyper`` order."""
        raise NotImplementedError

    def _hyper_ptr(self) -> int:
        """The address of the current device's hyperparameter array, uploaded on first use
        (never while capturing) and rewritten when a value changed since."""
        device = self._backend.current_device()
        if self._hyper is None:
            self._hyper = {}
        entry = self._hyper.get(device)
        backend = self.fused_launcher().backend
        if entry is None:
            refuse_in_capture(
                self._backend.capturing(), "uploading the optimizer's hyperparameters", _ONE_STEP
            )
            values = self._hyper_values()
            arr = backend.to_device(values)
            entry = self._hyper[device] = [arr, values.tobytes(), backend.ptr(arr)]
        else:
            self._put_hyper(device)
        return entry[2]

    def _put_hyper(self, device: int) -> None:
        """Write the hyperparameters into `device`'s array if they changed: a copy ordered
        on that device's current stream (where a captured graph is replayed)."""
        assert self._hyper is not None  # only called once an array exists
        entry, values = self._hyper[device], self._hyper_values()
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
        pairs = _optim.grad_var_pairs(grads_and_vars)
        if pairs:
            pairs = _optim.drop_none_gradients(pairs, warn=True)
            plan = self._fused_plan(*_optim.unzip(pairs)) if self._gate is None else None
            if plan is not None:
                self._fused_launch(plan, check=False)
                self.iterations += 1
                return self.iterations
        return super().apply_gradients(pairs)


_shape = operator.attrgetter("shape")
# what a schedule may set between replays of a captured sync-free step (Adam's betas are not
# live: their bias-correction table is captured with the step)
_LIVE = frozenset({"learning_rate", "momentum", "epsilon", "weight_decay"})


class SGD(Gated, _arrays.SGD):
    """``_arrays.SGD`` on device arrays; momentum and nesterov in optim.cu's lsc_mt_sgd."""

    _kind = "sgd"

    def _slot_names(self) -> tuple:
        return ("momentum",) if self.momentum != 0 else ()

    def _hyper_values(self) -> np.ndarray:
        # damp 1: tf-keras's SGD exactly (dampening is torch's, not a tf-keras argument)
        return np.array(
            [self._learning_rate, self.momentum, 1.0, self.weight_decay or 0.0], np.float32
        )

    def _fused_flags(self) -> int:
        return (FLAGS["SLOT"] if self.momentum != 0 else 0) | (
            FLAGS["NESTEROV"] if self.nesterov else 0
        )

    def _fused_args(self, count_ptr: int) -> Any:
        return tuple(self._hyper_values()), (), self._fused_flags()


class Adam(Gated, _arrays.Adam):
    """``_arrays.Adam`` on device arrays (optim.cu's lsc_mt_adam).

    Bias correction: by value from ``iterations``, or, under a sync-free
    LossScaleOptimizer, from that wrapper's device step counter and a table
    of the host's own float32 terms (``lscore.cuda.optim.bias_table``, uploaded
    once per (beta_1, beta_2)), so a replayed CUDA graph uses each step's
    own t.  The table ends where both terms are exactly 1; betas that do
    not get there within ``lscore.cuda.optim.TABLE_LIMIT`` steps
    (beta_2 above about 0.99993) are refused there with a ValueError.
    """

    _kind = "adam"
    _bias: tuple | None = None  # (betas, device table, last)

    def _slot_names(self) -> tuple:
        return ("m", "v", "vhat") if self.amsgrad else ("m", "v")

    def _bias_table(self) -> Any:
        betas = (self.beta_1, self.beta_2)
        if self._bias is None or self._bias[0] != betas:
            refuse_in_capture(
                self._backend.capturing(), "uploading Adam's bias-correction table", _ONE_STEP
            )
            table, last = bias_table(lambda step: self._bias_terms(np.float32, step))
            self._bias = (betas, self.fused_launcher().backend.to_device(table), last)
        return self._bias

    def _fused_flags(self) -> int:
        return FLAGS["AMSGRAD"] if self.amsgrad else 0

    def _fused_args(self, count_ptr: int) -> Any:
        t = np.float32
        tail = (np.uint64(0), np.uint64(0), np.int64(0))
        alpha = t(0)  # with the device counter the kernel takes alpha from the table
        if count_ptr:
            _, table, last = self._bias_table()
            tail = (
                np.uint64(self.fused_launcher().backend.ptr(table)),
                np.uint64(count_ptr),
                np.int64(last),
            )
        else:
            alpha = t(self._alpha(t))
        lr, c1, c2, eps, wd, _ = self._hyper_values()
        return (alpha, c1, c2, eps, lr, wd), tail, self._fused_flags()

    def _hyper_values(self) -> np.ndarray:
        # alpha 0: the live (sync-free) step passes the device step counter, and the kernel
        # computes alpha from this lr and the bias-correction table
        return np.array(
            [
                self._learning_rate,
                1 - self.beta_1,
                1 - self.beta_2,
                self.epsilon,
                self.weight_decay or 0.0,
                0.0,
            ],
            np.float32,
        )


class LossScaleOptimizer(_optim.LossScaleOptimizerBase):
    """LossScaleOptimizer on device arrays, in one of two modes.

    Default (``sync_free=False``): exactly the NumPy adapter's behaviour; the
    finiteness check runs on the device and its flag is read once per step
    (as torch's GradScaler.step), then the host state machine decides and
    the step is applied (this adapter's SGD/Adam: the fused kernels) or
    skipped.  ``minimize`` hands the fused kernels the *scaled* gradients
    and the inverse scale: they unscale in registers, for the check as for
    the update, so no unscaled copy is written.

    ``sync_free=True`` (Keras shape only, with this adapter's SGD or Adam):
    the state machine runs on the device (lscore.cuda's update kernel, the
    CPU core's code) and the host reads nothing per step.  With dense
    float32 variables and float16/bfloat16/float32 gradients a step is: the
    fused check (it marks the device state's found flag), the fused update
    gated by that flag (a skipped step touches nothing: no copies), Adam's
    device step counter advanced, then the update kernel advances the scale
    (it rewrites the inverse for the next step, hence the gate is this
    step's found flag, read before, not the update's apply flag).
    ``minimize`` passes the scaled gradients and the device inverse scale
    (read through a pointer).  Other variables take the elementwise path,
    whose skipped steps restore copies.  ``apply_gradients`` returns a 0-d
    device boolean (True: applied); ``get_scaled_loss``,
    ``get_unscaled_gradients`` and ``minimize`` use the device scale (the
    scale ``minimize`` passes to ``loss_and_grads_fn`` is one preallocated
    float32 device scalar).  The scale reaches the host only when asked:
    ``loss_scale`` and ``dynamic_counter`` copy the device state back (one
    sync) and raise LossScaleFloorError if the policy gave up on the device;
    ``sync_state()`` also reads Adam's device step counter into
    ``iterations`` (needed after replaying a CUDA graph, which the host
    does not see).  As in tf-keras, a skipped step advances ``iterations``
    (the device counter too), exactly as the NumPy adapter's.

    CUDA graphs: after one eager step, a whole ``minimize`` (or scaled loss,
    ``apply_gradients``) on the fused path can be captured and replayed;
    every buffer it touches is allocated by then, and everything that
    changes per step is read on the device.  While the current stream is
    capturing, whatever would synchronise or upload (reading the scale,
    the default mode, ``all_finite``/``unscale_``, a list of arrays not seen
    before, the elementwise path) raises RuntimeError instead.
    """

    _backend: ClassVar[ArrayBackend]  # set by the adapter's subclass

    @property
    def _xp(self) -> Any:
        backend = getattr(self, "_backend", None)
        return None if backend is None else backend.xp

    def _all_finite(self, grads: Any) -> bool:
        return self._backend.all_finite(grads)

    def __init__(
        self,
        optimizer: Any,
        loss_scale: Any = None,
        *,
        dynamic: Any = True,
        initial_scale: Any = None,
        dynamic_growth_steps: Any = None,
        loss_scale_manager: Any = None,
        sync_free: Any = False,
        reducer: Any = None,
        allow_fp16_params: Any = False,
    ) -> None:
        if not isinstance(sync_free, (bool, np.bool_)):
            raise TypeError(f"sync_free must be a bool, got {sync_free!r}")
        if sync_free and reducer is not None:
            raise ValueError(
                "sync_free=True cannot take a reducer: a reducer agrees on the "
                "found-inf flag on the host, and sync_free keeps it on the device"
            )
        super().__init__(
            optimizer,
            loss_scale,
            dynamic=dynamic,
            initial_scale=initial_scale,
            dynamic_growth_steps=dynamic_growth_steps,
            loss_scale_manager=loss_scale_manager,
            reducer=reducer,
            allow_fp16_params=allow_fp16_params,
        )
        self._dev = None
        self._device_id: int | None = None
        self._sync_free = bool(sync_free)
        self._count = None  # Adam's device step counter (sync-free)
        self._count_host: int | None = None  # the value the host last gave it
        if not sync_free:
            return
        if self._scaling.shape != "keras":
            raise ValueError(
                "sync_free=True needs the Keras shape (loss_scale None or a bool): "
                "the TF <= 2.3 and TF1 shapes do not advance iterations on a "
                "skipped step, which the host cannot know without a sync"
            )
        if not isinstance(optimizer, Gated):
            raise TypeError(
                "sync_free=True needs this adapter's SGD or Adam (they skip a step "
                f"on the device), got {type(optimizer).__qualname__}"
            )
        self._device_id = self._backend.current_device()
        xp = self._backend.xp
        if self._scaling.dynamic:
            state = self._host_state()
            runner = self._backend.kernels.device(self._device_id)
            self._dev = DeviceState(runner.backend, state.nbytes)
            self._dev.put(state.to_bytes())
        # preallocated: a captured step may not allocate
        self._applied = xp.ones((), dtype=bool)
        self._scale_arg = xp.asarray(self._fixed_value("scale"), dtype=np.float32)

    @property
    def sync_free(self) -> bool:
        return self._sync_free

    def _host_state(self) -> Any:
        return self._scaling.dynamic_loss_scale.state

    def _check_device(self) -> None:
        """Sync-free mode: RuntimeError, before anything is launched, unless the device the
        state lives on is current (its kernels would read that device's memory from another,
        on another device's stream)."""
        current = self._backend.current_device()
        if current != self._device_id:
            raise RuntimeError(
                f"this LossScaleOptimizer(sync_free=True) keeps its loss scale on device "
                f"{self._device_id}, but device {current} is current; run its steps with "
                f"device {self._device_id} current (cupy.cuda.Device({self._device_id}).use() "
                f"or a `with cupy.cuda.Device({self._device_id}):` block), or make one "
                f"LossScaleOptimizer per device"
            )

    def _refuse_in_capture(self, what: str, instead: str) -> None:
        self._backend.refuse_in_capture(what, instead)

    def _read_state(self) -> None:
        if self._dev is None:
            return
        self._refuse_in_capture(
            "reading the loss scale (a device-to-host copy)", "read it after end_capture()"
        )
        raw, flags, _ = self._dev.read()
        state = self._host_state()
        state.from_bytes(raw)
        if flags[FLOOR]:
            self._dev.clear_floor()
            raise LossScaleFloorError(
                f"loss scale cannot go below its minimum {state.policy.min_scale!r} "
                f"(policy {state.policy.name!r}); the loss is probably diverging"
            )

    def sync_state(self) -> None:
        """Copy the device state (and Adam's device step counter) to the host; raises on a
        floor error.  Sync-free mode: one sync, two with Adam's counter."""
        self._read_state()
        if self._count is not None:
            backend = self._optimizer.fused_launcher().backend
            self._count_host = int(backend.get(self._count)[0])
            self._optimizer.iterations = self._count_host

    def _before_checkpoint(self) -> None:
        if self._sync_free:
            self.sync_state()

    def _after_load(self) -> None:
        if self._dev is not None:
            self._dev.put(self._host_state().to_bytes())
        self._count_host = None  # Adam's device step counter is set from iterations

    @property
    def loss_scale(self) -> Any:
        self._read_state()
        return super().loss_scale

    @property
    def dynamic_counter(self) -> Any:
        self._read_state()
        return super().dynamic_counter

    def _fixed_value(self, which: str) -> float:
        s = self._scaling.scale
        return s if which == "scale" else _optim.inverse_scale(s)

    def _device_value(self, which: str, dtype: Any) -> Any:
        if self._dev is None:  # a fixed scale: a host constant is exact and costs nothing
            return self._backend.xp.asarray(self._fixed_value(which), dtype=dtype)
        arr = self._dev.scale if which == "scale" else self._dev.inv_scale
        return arr.reshape(()).astype(dtype)

    def get_scaled_loss(self, loss: Any) -> Any:
        if not self._sync_free:
            return super().get_scaled_loss(loss)
        if callable(loss):
            return lambda: self.get_scaled_loss(loss())
        self._check_device()
        return loss * self._device_value("scale", getattr(loss, "dtype", np.float32))

    def get_unscaled_gradients(self, grads: Any) -> list:
        if not self._sync_free:
            return super().get_unscaled_gradients(grads)
        self._check_device()
        return [None if g is None else g * self._device_value("inv", g.dtype) for g in grads]

    def _scale_for_fn(self) -> Any:
        if self._dev is not None:  # refreshed in place (float64 -> float32, a kernel)
            self._backend.xp.copyto(
                self._scale_arg, self._dev.scale.reshape(()), casting="same_kind"
            )
        return self._scale_arg

    def _scaled_gradients(self, loss_and_grads_fn: Any, var_list: Any) -> Any:
        if self._sync_free and callable(loss_and_grads_fn):
            self._check_device()
            scale = self._scale_for_fn()
            return super()._scaled_gradients(lambda _host: loss_and_grads_fn(scale), var_list)
        return super()._scaled_gradients(loss_and_grads_fn, var_list)

    def _fused_plan(self, gs: list, vs: list) -> Any:
        """The inner optimizer's fused plan of these gradients and variables, or None (the
        elementwise path)."""
        opt = self._optimizer
        if not isinstance(opt, Gated) or opt._gate is not None:
            return None
        return opt._fused_plan(gs, vs)

    def minimize(
        self, loss_and_grads_fn: Any, var_list: Any, *, global_step: Any = None, name: Any = None
    ) -> Any:
        """``compute_gradients`` then ``apply_gradients`` (which takes ``global_step`` and
        ``name``); returns the loss the function gave.

        On the fused path the gradients are read once: the kernels take the
        scaled gradients and the inverse scale (the device's, in sync-free
        mode) and unscale in registers, rounding as the NumPy adapter's
        ``get_unscaled_gradients`` (the inverse cast to the gradient's dtype).
        """
        step = dict(global_step=global_step, name=name)
        advance = self._tf1_step_arguments(global_step, name)  # refuse before the backward pass
        if not self._sync_free:
            self._refuse_default_in_capture()
            s = self._scaling
            if not s.predictable or self.overflow_monitor is not None:
                return super().minimize(loss_and_grads_fn, var_list, **step)
            scale = s.scale
        else:
            self._check_device()  # before the backward pass
            scale = self._scale_for_fn()
        loss, grads, var_list = self._loss_and_grads(loss_and_grads_fn, var_list, scale)
        plan = self._fused_plan(*self._kept(grads, var_list))
        if plan is None:
            self.apply_gradients(
                zip(self.get_unscaled_gradients(grads), var_list, strict=True), **step
            )
        elif self._sync_free:
            self._sync_free_fused(plan, advance, scaled=True)
        else:
            self._default_fused(plan, advance, self._fixed_value("inv"))
        return loss

    def _kept(self, grads: list, var_list: list) -> tuple[list, list]:
        """(gradients, variables) without the pairs whose gradient is None (Keras's rule)."""
        if not any(map(operator.is_, grads, itertools.repeat(None))):
            return grads, var_list  # the common step: nothing to drop, no pairs built
        pairs = list(zip(grads, var_list, strict=True))
        return _optim.unzip(_optim.drop_none_gradients(pairs, warn=self._scaling.shape != "tf1"))

    def _refuse_default_in_capture(self) -> None:
        self._refuse_in_capture(
            "a step of sync_free=False (it reads the found flag)",
            "capture a LossScaleOptimizer(..., sync_free=True)",
        )

    def _default_fused(self, plan: Any, advance: Any, inv: float) -> bool:
        """Default mode on the fused kernels: check (one sync), decide on the host, update."""
        opt = self._optimizer
        runner = opt.fused_launcher().runner
        mark = runner.next_mark()
        flags = FLAGS["INV_AS_GRAD"]
        opt._fused_launch(
            plan, check=True, flags=flags, inv=inv, gate_ptr=runner.flag_ptr, skip_if=mark
        )
        finite = not reduce_found_inf(self._reducer, runner.found(mark))

        def apply() -> None:
            opt._fused_launch(plan, check=False, flags=flags, inv=inv)
            opt.iterations += 1

        applied, _ = _optim.run_step(
            self, finite, apply=apply, count=self._count_step, grads=None, named_arrays=None
        )
        self._last_applied = applied
        advance(applied)
        return applied

    def _device_counter(self) -> int:
        """Adam's device step counter (its address), given the host's iterations when they
        changed behind it; 0 for SGD."""
        opt = self._optimizer
        if not isinstance(opt, Adam):
            return 0
        backend = opt.fused_launcher().backend
        if self._count is None:
            self._refuse_in_capture("creating Adam's device step counter (an upload)", _ONE_STEP)
            self._count = backend.to_device(np.array([opt.iterations], np.int64))
        elif self._count_host != opt.iterations:
            self._refuse_in_capture(
                "setting the device step counter from iterations",
                "do not set iterations between the eager step and the capture",
            )
            self._count[...] = opt.iterations  # a fill on the device, no transfer
        self._count_host = opt.iterations
        return backend.ptr(self._count)

    def _sync_free_fused(self, plan: Any, advance: Any, *, scaled: bool) -> Any:
        """One sync-free step on the fused kernels: nothing read, nothing uploaded once planned."""
        opt, dev, xp = self._optimizer, self._dev, self._backend.xp
        inv, inv_ptr, flags = 1.0, 0, 0
        if scaled:
            flags = FLAGS["INV_AS_GRAD"]
            if dev is None:
                inv = self._fixed_value("inv")
            else:
                inv_ptr = dev.inv_ptr
        count_ptr = self._device_counter()
        gate_ptr = 0
        if dev is not None:  # Keras's fixed scale applies every step, NaN or not
            gate_ptr = dev.found_ptr
            opt._fused_launch(
                plan,
                check=True,
                flags=flags,
                inv=inv,
                inv_ptr=inv_ptr,
                gate_ptr=gate_ptr,
                skip_if=1,
            )
            xp.equal(dev.found.reshape(()), 0, out=self._applied)
        opt._fused_launch(
            plan,
            check=False,
            flags=flags,
            inv=inv,
            inv_ptr=inv_ptr,
            gate_ptr=gate_ptr,
            skip_if=1,
            count_ptr=count_ptr,
            live=True,
        )
        if count_ptr:
            xp.add(self._count, 1, out=self._count)
            assert self._count_host is not None  # set when the counter was uploaded
            self._count_host += 1
        opt.iterations += 1
        if dev is not None:
            dev.step()
        # a captured step may not allocate: it hands out the buffer the next step rewrites
        self._last_applied = self._applied if self._backend.capturing() else self._applied.copy()
        advance(self._last_applied)
        return self._last_applied

    def apply_gradients(
        self, grads_and_vars: Any, global_step: Any = None, name: Any = None
    ) -> Any:
        """Default mode: as the NumPy adapter (returns a bool).  Sync-free: returns a device
        bool, which is also added to ``global_step`` on the device."""
        if not self._sync_free:
            self._refuse_default_in_capture()
            return super().apply_gradients(grads_and_vars, global_step, name)
        advance = self._tf1_step_arguments(global_step, name)
        self._check_device()
        pairs = _optim.drop_none_gradients(_optim.grad_var_pairs(grads_and_vars), warn=True)
        opt, xp = self._optimizer, self._backend.xp
        plan = self._fused_plan(*_optim.unzip(pairs))
        if plan is not None:
            return self._sync_free_fused(plan, advance, scaled=False)
        _optim.check_variable_dtypes([v for _, v in pairs], self._allow_fp16)
        self._refuse_in_capture(
            "a step on the elementwise path (it copies the variables)",
            "capture only dense float32 variables with float16, bfloat16 "
            "or float32 gradients and no clipping (the fused kernels)",
        )
        if self._dev is None:
            gate = None  # Keras fixed scale: every step applies
        else:
            assert self._device_id is not None  # set with self._dev
            self._backend.kernels.check_async(
                [g for g, _ in pairs], self._dev.found_ptr, self._device_id
            )
            gate = (self._dev.found == 0).reshape(())
        opt._gate = gate
        try:
            opt.apply_gradients(pairs)  # validates everything before any write
        except BaseException:
            if self._dev is not None:
                self._dev.found[...] = 0  # a failed call leaves no flag behind
            raise
        finally:
            opt._gate = None
        if self._dev is not None:
            self._dev.step()  # advance only once the step went through
        self._last_applied = xp.asarray(True) if gate is None else gate
        advance(self._last_applied)
        return self._last_applied
