"""lscore's PyTorch adapter: ``GradScaler`` (a drop-in for ``torch.amp.GradScaler``),
``LossScaleOptimizer`` (TF/Keras-shaped loss scaling as a torch optimizer) and
``SkipAwareLR`` (a learning-rate schedule that advances only on applied steps)."""

from lscore.adapters.torch._paths import GradUnscaler, ScalerAssertionError, torch_policy
from lscore.adapters.torch.optimizer import LossScaleOptimizer
from lscore.adapters.torch.scaler import GradScaler, ScalerConfigError
from lscore.adapters.torch.schedule import SkipAwareLR

__all__ = [
    "GradScaler",
    "LossScaleOptimizer",
    "ScalerAssertionError",
    "ScalerConfigError",
    "SkipAwareLR",
    "torch_policy",
]

# Pickles, reprs and tracebacks name these objects by this public module, not by the private
# modules that define them, so a pickle does not depend on how the package is laid out; a
# GradScaler's pickle also names its GradUnscaler here.
for _obj in (
    GradScaler,
    LossScaleOptimizer,
    ScalerAssertionError,
    ScalerConfigError,
    SkipAwareLR,
    GradUnscaler,
    torch_policy,
):
    _obj.__module__ = __name__
del _obj
# the name lscore 0.1's pickles of a GradScaler give its GradUnscaler
_GradUnscaler = GradUnscaler
