"""lscore's PyTorch adapter: ``GradScaler`` (a drop-in for ``torch.amp.GradScaler``)
and ``LossScaleOptimizer`` (TF/Keras-shaped loss scaling as a torch optimizer)."""

from lscore.adapters.torch._paths import GradUnscaler, ScalerAssertionError, torch_policy
from lscore.adapters.torch.optimizer import LossScaleOptimizer
from lscore.adapters.torch.scaler import GradScaler, ScalerConfigError

__all__ = [
    "GradScaler",
    "LossScaleOptimizer",
    "ScalerAssertionError",
    "ScalerConfigError",
    "torch_policy",
]

# Pickles, reprs and tracebacks name these objects here, as they did when the adapter was
# one module; a GradScaler's pickle also names its GradUnscaler here.
for _obj in (
    GradScaler,
    LossScaleOptimizer,
    ScalerAssertionError,
    ScalerConfigError,
    GradUnscaler,
    torch_policy,
):
    _obj.__module__ = __name__
del _obj
# pickles written before the adapter became a package name it _GradUnscaler
_GradUnscaler = GradUnscaler
