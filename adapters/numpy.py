"""NumPy adapter: a Keras/TF1-shaped LossScaleOptimizer, SGD and Adam on NumPy arrays.

One import serves a NumPy training loop: the optimizer wrapper, two
optimizers that update arrays in place (0-d included), the scan
(``all_finite``, ``unscale_``) and the loss-scale and manager classes.

NumPy has no autodiff, so gradients come from your own backward pass, seeded
with the loss scale::

    import numpy as np
    from lscore.adapters.numpy import LossScaleOptimizer, SGD

    w = np.ones(3, np.float32)
    x = np.array([1e-4, 2e-4, 3e-4], np.float16)

    def loss_and_grads(scale):              # loss = sum(w * x) in float16
        loss = np.sum(w.astype(np.float16) * x)
        g16 = np.float16(scale) * x         # backprop seeded with the scale
        return loss, [g16.astype(np.float32)]

    opt = LossScaleOptimizer(SGD(learning_rate=0.1))   # Keras 2 shape, dynamic
    opt.minimize(loss_and_grads, [w])

``LossScaleOptimizer`` takes three constructor shapes (Keras 2, TF <= 2.3 with a
``LossScale``, TF1 with a ``LossScaleManager``: see its docstring).  TF1 loops keep
``apply_gradients(grads_and_vars, global_step=global_step)`` with a 0-d integer
array as ``global_step`` (advanced in place when the step is applied); where TF1
passes a loss tensor to ``compute_gradients`` or ``minimize``, pass the function.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from lscore.adapters import _optim, _scale_classes, _sgd_adam
from lscore.adapters._scale_classes import *  # noqa: F403
from lscore.scan import all_finite, unscale_

__all__ = ["SGD", "Adam", "LossScaleOptimizer", "all_finite", "unscale_", *_scale_classes.__all__]


class SGD(_sgd_adam.SGD):
    __doc__ = _sgd_adam.SGD.__doc__
    _xp = np


class Adam(_sgd_adam.Adam):
    __doc__ = _sgd_adam.Adam.__doc__
    _xp = np


class LossScaleOptimizer(_optim.LossScaleOptimizerBase):
    __doc__ = _optim.LossScaleOptimizerBase.__doc__
    _xp = np
    _all_finite = staticmethod(all_finite)
    _optimizer_classes: ClassVar[dict[str, type]] = {"SGD": SGD, "Adam": Adam}
