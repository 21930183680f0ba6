"""lscore's loss-scale and manager classes, which ``lscore.adapters.numpy`` and
``lscore.adapters.cupy`` both export beside their own optimizers: one import serves
a training loop, whichever array module it runs on."""

from __future__ import annotations

from lscore.loss_scale import DynamicLossScale, FixedLossScale, LossScale, get
from lscore.managers import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    LossScaleManager,
)

__all__ = [
    "DynamicLossScale",
    "ExponentialUpdateLossScaleManager",
    "FixedLossScale",
    "FixedLossScaleManager",
    "LossScale",
    "LossScaleManager",
    "get",
]
