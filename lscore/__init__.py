"""lscore: loss scaling for mixed-precision training.

One compiled state machine covers every peer's loss-scale policy; a compiled
scan finds NaN/Inf in many arrays at memory speed.  The TF2 (`LossScale`),
TF1 (`LossScaleManager`) and, in ``lscore.adapters``, Keras- and torch-shaped
APIs sit on top.  ``import lscore`` needs only NumPy.
"""

try:
    from lscore._ext import _codes, _grads, _scan, _state, _walk
except ImportError as e:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "lscore's compiled core (lscore._ext) is not built or does not load "
        f"({e}); from a source checkout run `pip install -e .` "
        "(needs a C compiler, Cython >= 3 and numpy)"
    ) from e

import typing as _typing

from lscore.loss_scale import DynamicLossScale, FixedLossScale, LossScale, get
from lscore.managers import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    LossScaleManager,
)
from lscore.policy import Policy
from lscore.presets import preset
from lscore.scan import all_finite, unscale_
from lscore.state import LossScaleFloorError, LossScaleState

if _typing.TYPE_CHECKING:  # loaded on first use at run time (__getattr__ below)
    import types

    from lscore import migrate

__version__ = "0.1.0"

__all__ = [
    "DynamicLossScale",
    "ExponentialUpdateLossScaleManager",
    "FixedLossScale",
    "FixedLossScaleManager",
    "LossScale",
    "LossScaleFloorError",
    "LossScaleManager",
    "LossScaleState",
    "Policy",
    "all_finite",
    "get",
    "migrate",
    "preset",
    "unscale_",
]

# dir(lscore) shows the API and the submodules, not the names this file works with
del _codes, _grads, _scan, _state, _walk, _typing


def __getattr__(name: str) -> "types.ModuleType":
    # lscore.migrate (sixteen peers' readers) loads on first use: `import lscore` stays fast
    if name == "migrate":
        import importlib

        return importlib.import_module("lscore.migrate")
    raise AttributeError(f"module 'lscore' has no attribute {name!r}")
