"""lscore's PyTorch adapter: ``GradScaler`` (a drop-in for ``torch.amp.GradScaler``),
``LossScaleOptimizer`` (TF/Keras-shaped loss scaling as a torch optimizer),
``SkipAwareLR`` (a learning-rate schedule that advances only on applied steps) and FP8 training
emulated on any machine (``convert_to_float8``, ``Float8Linear``, ``DelayedFloat8Linear``,
``MXLinear``, ``StochasticMXLinear``, ``fp8_update``)."""

try:
    import torch as _torch  # noqa: F401 - only whether torch imports matters here
except ImportError as e:  # the extra is missing: name it, not only the module
    raise ImportError(
        f"lscore.adapters.torch needs PyTorch ({e}); install it with "
        f'pip install ".[torch]" in the checkout of lscore (it is not on the package index yet)'
    ) from e

from lscore.adapters.torch._config import torch_policy
from lscore.adapters.torch._unscaler import GradUnscaler, ScalerAssertionError
from lscore.adapters.torch.fp8 import (
    DelayedFloat8Linear,
    Float8Linear,
    convert_to_float8,
    fp8_update,
)
from lscore.adapters.torch.mx import MXLinear, StochasticMXLinear
from lscore.adapters.torch.optimizer import LossScaleOptimizer
from lscore.adapters.torch.scaler import GradScaler, ScalerConfigError
from lscore.adapters.torch.schedule import SkipAwareLR

__all__ = [
    "DelayedFloat8Linear",
    "Float8Linear",
    "GradScaler",
    "LossScaleOptimizer",
    "MXLinear",
    "ScalerAssertionError",
    "ScalerConfigError",
    "SkipAwareLR",
    "StochasticMXLinear",
    "convert_to_float8",
    "fp8_update",
    "torch_policy",
]

# Pickles, reprs and tracebacks name these objects by this public module, not by the private
# modules that define them, so a pickle does not depend on how the package is laid out; a
# GradScaler's pickle also names its GradUnscaler here.
for _obj in (
    DelayedFloat8Linear,
    Float8Linear,
    GradScaler,
    LossScaleOptimizer,
    MXLinear,
    ScalerAssertionError,
    ScalerConfigError,
    SkipAwareLR,
    StochasticMXLinear,
    convert_to_float8,
    fp8_update,
    GradUnscaler,
    torch_policy,
):
    _obj.__module__ = __name__
del _obj
# a pickled GradScaler may name its GradUnscaler lscore.adapters.torch._GradUnscaler
_GradUnscaler = GradUnscaler
