"""Array-module-generic SGD and Adam: tf-keras's formulas on arrays updated in place.

An adapter subclasses them and sets ``_xp`` (the array module: numpy, cupy); the
CuPy adapter's fused kernels (``_device``) compute the same formulas, bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lscore.adapters._arrays import ArrayOptimizer
from lscore.policy import boolean, real


class SGD(ArrayOptimizer):
    """Gradient descent with momentum, tf-keras's formulas, in the variable's dtype::

        w -= w * weight_decay * lr            (if weight_decay, before the step)
        m = -g * lr + m * momentum            (m starts at 0)
        w += -g * lr + m * momentum           if nesterov
        w += m                                otherwise

    With ``momentum=0`` no slot is kept and the step is ``w += -g * lr``.
    """

    def __init__(
        self,
        learning_rate: Any = 0.01,
        momentum: Any = 0.0,
        nesterov: Any = False,
        *,
        weight_decay: Any = None,
        clipnorm: Any = None,
        clipvalue: Any = None,
        global_clipnorm: Any = None,
        name: Any = "SGD",
    ) -> None:
        m = real("momentum", momentum)
        if not 0 <= m <= 1:
            raise ValueError(f"momentum must be in [0, 1], got {momentum!r}")
        nesterov = boolean("nesterov", nesterov)
        super().__init__(
            learning_rate,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            name=name,
        )
        self.momentum, self.nesterov = m, nesterov

    def _update_step(self, g: Any, v: Any) -> None:
        self._decay(v)
        t = v.dtype.type
        step = -g * t(self._learning_rate)
        if self.momentum == 0:
            v += step
            return
        m = self._slot(v, "momentum")
        mom = t(self.momentum)
        m[...] = step + m * mom
        v += (step + m * mom) if self.nesterov else m

    def get_config(self) -> dict:
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov}


class Adam(ArrayOptimizer):
    """Adam, tf-keras's formulas ("epsilon hat": added to sqrt(v), bias correction in alpha)::

        t = iterations + 1
        alpha = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)
        m += (g - m) * (1 - beta_1)
        v += (g*g - v) * (1 - beta_2)
        vhat = max(vhat, v); v = vhat         (amsgrad only; vhat starts at 0)
        w -= m * alpha / (sqrt(v) + epsilon)

    computed in the variable's dtype, after ``w -= w * weight_decay * lr``
    when ``weight_decay`` is set (tf-keras's decoupled decay: AdamW).  Under a
    Keras-shaped LossScaleOptimizer a skipped step still advances
    ``iterations``, hence ``t``, as in tf-keras.
    """

    def __init__(
        self,
        learning_rate: Any = 0.001,
        beta_1: Any = 0.9,
        beta_2: Any = 0.999,
        epsilon: Any = 1e-7,
        amsgrad: Any = False,
        *,
        weight_decay: Any = None,
        clipnorm: Any = None,
        clipvalue: Any = None,
        global_clipnorm: Any = None,
        name: Any = "Adam",
    ) -> None:
        betas = {}
        for key, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            b = real(key, value)
            if not 0 <= b < 1:
                raise ValueError(f"{key} must be in [0, 1), got {value!r}")
            betas[key] = b
        eps = real("epsilon", epsilon)
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
        amsgrad = boolean("amsgrad", amsgrad)
        super().__init__(
            learning_rate,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            name=name,
        )
        self.beta_1, self.beta_2, self.epsilon = betas["beta_1"], betas["beta_2"], eps
        self.amsgrad = amsgrad

    def _bias_terms(self, t: Any, step: int) -> Any:
        """(sqrt(1 - beta_2**step), 1 - beta_1**step) in scalar type `t` (the fused
        CuPy Adam tabulates these for its device step counter)."""
        one, s = t(1), t(step)
        return np.sqrt(one - t(self.beta_2) ** s), one - t(self.beta_1) ** s

    def _alpha(self, t: Any) -> Any:
        sq, d = self._bias_terms(t, self.iterations + 1)
        return t(self._learning_rate) * sq / d

    def _update_step(self, g: Any, v: Any) -> None:
        self._decay(v)
        t = v.dtype.type
        alpha = self._alpha(t)
        m, vv = self._slot(v, "m"), self._slot(v, "v")
        m += (g - m) * t(1 - self.beta_1)
        vv += (g * g - vv) * t(1 - self.beta_2)
        if self.amsgrad:
            vhat = self._slot(v, "vhat")
            self._xp.maximum(vhat, vv, out=vhat)
            vv = vhat
        v -= (m * alpha) / (self._xp.sqrt(vv) + t(self.epsilon))

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
            "amsgrad": self.amsgrad,
        }
