"""CuPy adapter: LossScaleOptimizer, SGD, Adam, all_finite and unscale_ on CuPy arrays.

The same names as ``lscore.adapters.numpy``, for arrays on a CUDA device.
``all_finite``, ``unscale_`` and the one-pass ``unscale_and_norm`` /
``unscale_and_clip_`` (the gradient norm gathered while unscaling, then
torch's clip) run lscore's multi-tensor kernels
(_ext/scan.cu, compiled once per device by NVRTC, see lscore/cuda/):
one launch per dtype covers a whole list of arrays, float16, bfloat16,
float32 and float64, with the CPU core's arithmetic.  The walk over the
arrays is compiled and its plan cached: a training loop that passes the
same arrays every step pays the walk once, and a call is then its launches
on CuPy's current stream (no uploads, no extra kernels) plus one read of
the flag through pinned memory (one host sync per device).

``SGD`` and ``Adam`` update dense float32 variables from float16, bfloat16
or float32 gradients through the fused kernels (_ext/optim.cu): one launch
per gradient dtype reads each gradient once and updates the variable and
its slots, bit for bit as lscore.adapters.numpy; the records and launch
tables are planned once per list of arrays.  Other variable dtypes, and
clipped steps, take the elementwise path (CuPy array expressions).

``LossScaleOptimizer`` has two modes:

- default: the NumPy adapter's behaviour; the check runs on the GPU and the
  step decision is made on the host after one sync per step (as torch's
  GradScaler.step does), then the same fused kernels update;
- ``sync_free=True`` (Keras shape, with this module's SGD or Adam): the scale
  and its counters, and Adam's step counter, live on the device and are
  advanced there (the scale by the CPU core's own state machine,
  _ext/update.cu); the fused kernels read this step's found flag and leave
  variables and slots untouched on overflow (no copies).  Nothing is copied
  to the host unless you read ``loss_scale``, ``dynamic_counter`` or call
  ``sync_state()``.  After one eager step such a step can be captured in a
  CUDA graph (``stream.begin_capture()`` / ``end_capture()``) and replayed;
  CuPy cannot capture cuBLAS calls, so the backward pass stays eager (the
  NumPy and CuPy guide's CUDA-graph recipe).  While the current stream is
  capturing, calls that would synchronise or upload raise RuntimeError.  The state
  lives on the device that was current when the optimizer was made; a step
  taken while another device is current raises RuntimeError before anything
  runs (make one optimizer per device).

Example::

    import cupy as cp
    from lscore.adapters.cupy import LossScaleOptimizer, SGD

    w = cp.ones(3, cp.float32)
    opt = LossScaleOptimizer(SGD(learning_rate=0.1), sync_free=True)
    def loss_and_grads(scale):               # your backward pass, seeded with scale
        return (w * w).sum(), [2 * w * scale]
    opt.minimize(loss_and_grads, [w])

Arrays must be dense (C- or F-contiguous); integer and bool arrays count
as finite in ``all_finite`` and are refused by ``unscale_`` and the
optimizers (they cannot be unscaled).
"""

from __future__ import annotations

from typing import Any, ClassVar

try:
    import cupy
except ImportError as e:  # the extra is missing: name it, not only the module
    raise ImportError(
        f"lscore.adapters.cupy needs CuPy ({e}); install it with "
        'pip install ".[cuda12]" (or ".[cuda13]" for a CUDA 13 driver) '
        "in the checkout of lscore (it is not on the package index yet)"
    ) from e

from lscore import cuda
from lscore.adapters import _device, _device_wrapper, _scale_classes
from lscore.adapters._backend import ArrayBackend
from lscore.adapters._scale_classes import *  # noqa: F403

__all__ = [
    "SGD",
    "Adam",
    "LossScaleOptimizer",
    "all_finite",
    "unscale_",
    "unscale_and_clip_",
    "unscale_and_norm",
    *_scale_classes.__all__,
]


def _capturing() -> bool:
    return cupy.cuda.get_current_stream().is_capturing()


def _current_device() -> int:
    return cupy.cuda.Device().id


def _on_device(a: Any, device: int) -> bool:
    return a.device.id == device


_BACKEND = ArrayBackend(
    cupy,
    cuda.ArrayKernels(cupy, cuda.CupyBackend, array_type=cupy.ndarray),
    current_device=_current_device,
    on_device=_on_device,
    capturing=_capturing,
)

all_finite = _BACKEND.all_finite
unscale_ = _BACKEND.unscale_
unscale_and_norm = _BACKEND.unscale_and_norm
unscale_and_clip_ = _BACKEND.unscale_and_clip_


class SGD(_device.SGD):
    """Gradient descent with momentum on CuPy arrays, bit for bit as
    ``lscore.adapters.numpy.SGD`` (tf-keras's formulas, in the variable's dtype).

    Dense float32 variables with dense float16, bfloat16 or float32 gradients
    (and no clipping) are updated by fused kernels: one launch per gradient
    dtype reads each gradient once, planned once per list of arrays.  Other
    variables, and clipped steps, take CuPy array expressions.
    """

    _backend = _BACKEND


class Adam(_device.Adam):
    """Adam on CuPy arrays, bit for bit as ``lscore.adapters.numpy.Adam`` (tf-keras's
    formulas: "epsilon hat" added to sqrt(v), bias correction in alpha; AdamW with
    ``weight_decay``).

    Dense float32 variables with dense float16, bfloat16 or float32 gradients
    (and no clipping) are updated by fused kernels, as ``SGD``.  Under
    ``LossScaleOptimizer(sync_free=True)`` the step t is counted on the device,
    so a replayed CUDA graph uses each step's own t; that needs betas whose
    bias correction reaches 1 in float32 (beta_2 <= 0.9999), else ValueError.
    """

    _backend = _BACKEND


class LossScaleOptimizer(_device_wrapper.LossScaleOptimizer):
    """Wraps this module's ``SGD`` or ``Adam`` (or any optimizer with
    ``apply_gradients(grads_and_vars)``) with loss scaling, on CuPy arrays.

    ``LossScaleOptimizer(optimizer, loss_scale=None, *, dynamic=True,
    initial_scale=None, dynamic_growth_steps=None, loss_scale_manager=None,
    sync_free=False, reducer=None, allow_fp16_params=False)`` takes the Keras 2,
    TF <= 2.3 or TF1 shape, as ``lscore.adapters.numpy.LossScaleOptimizer``
    does, with the same results.  Gradients come from your own backward pass, seeded with the loss
    scale: ``get_scaled_loss``, ``get_unscaled_gradients`` and
    ``apply_gradients``, or ``minimize(loss_and_grads_fn, var_list)``.

    Default mode: the check runs on the GPU and its flag is read once per step,
    then the step is applied or skipped.  ``sync_free=True`` (Keras shape, this
    module's SGD or Adam): the loss scale lives on the device that was current
    when the optimizer was made, nothing is read back per step, and a step can
    be captured in a CUDA graph; ``apply_gradients`` then returns a 0-d device
    boolean, and ``loss_scale``, ``dynamic_counter`` and ``sync_state()`` copy
    the state back.  Its steps must run with that device current
    (RuntimeError otherwise).  See this module's docstring.
    """

    _backend = _BACKEND
    _optimizer_classes: ClassVar[dict] = {"SGD": SGD, "Adam": Adam}
