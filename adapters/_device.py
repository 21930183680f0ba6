"""The CuPy adapter's SGD and Adam, written against one backend object.

Design: an ``ArrayBackend`` (``_backend``) holds what these classes need of a
framework (its array module, lscore's kernels over its arrays, the current device,
where an array lives, whether a CUDA graph is being captured).
``lscore.adapters.cupy`` subclasses ``SGD``, ``Adam`` and the ``LossScaleOptimizer``
of ``_device_wrapper`` with cupy's backend; the tests and ``lscore bench --suite
gpu-host`` bind the very same classes to NumPy and a stand-in device
(``lscore.adapters.device.bind``), so the gathering of arrays, the launches, the
gating of SGD/Adam and the sync-free bookkeeping all run in CI without a GPU.

``SGD`` and ``Adam`` are ``_sgd_adam``'s formulas on the fused kernels (``_fused``:
dense float32 variables, also unscaled, checked and skipped on the device for a
LossScaleOptimizer), and on the elementwise path elsewhere, where a device boolean
(``_gated``) makes a skipped step restore copies, so it changes nothing without a
host sync.  Here: each one's kernel, slots, hyperparameters and flags.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lscore.adapters import _sgd_adam
from lscore.adapters._backend import ONE_STEP, refuse_in_capture
from lscore.adapters._fused import Fused
from lscore.cuda.optim import FLAGS, FusedLauncher, bias_table


class SGD(Fused, _sgd_adam.SGD):
    """``_sgd_adam.SGD`` on device arrays; momentum and nesterov in optim.cu's lsc_mt_sgd."""

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

    def _fused_args(self, launcher: FusedLauncher, values: np.ndarray, count_ptr: int) -> Any:
        return tuple(values), ()


class Adam(Fused, _sgd_adam.Adam):
    """``_sgd_adam.Adam`` on device arrays (optim.cu's lsc_mt_adam).

    Bias correction: by value from ``iterations``, or, under a sync-free
    LossScaleOptimizer, from that wrapper's device step counter and a table
    of the host's own float32 terms (``lscore.cuda.optim.bias_table``, uploaded
    once per (beta_1, beta_2)), so a replayed CUDA graph uses each step's
    own t.  The table ends where both terms are exactly 1; betas that do
    not get there within ``lscore.cuda.optim.TABLE_LIMIT`` steps
    (beta_2 above about 0.99993) are refused there with a ValueError.
    """

    _kind = "adam"
    _bias: tuple | None = None  # (betas, device table, last, its address)

    def _slot_names(self) -> tuple:
        return ("m", "v", "vhat") if self.amsgrad else ("m", "v")

    def _bias_table(self, launcher: FusedLauncher) -> Any:
        """(betas, device table, last, its address) of this launcher's device, uploaded
        once per (beta_1, beta_2)."""
        betas = (self.beta_1, self.beta_2)
        if self._bias is None or self._bias[0] != betas:
            refuse_in_capture(
                self._backend.capturing(), "uploading Adam's bias-correction table", ONE_STEP
            )
            table, last = bias_table(lambda step: self._bias_terms(np.float32, step))
            dev = launcher.backend.to_device(table)
            self._bias = (betas, dev, last, launcher.backend.ptr(dev))
        return self._bias

    def _fused_flags(self) -> int:
        return FLAGS["AMSGRAD"] if self.amsgrad else 0

    @property
    def uses_step_counter(self) -> bool:
        return True

    def _fused_args(self, launcher: FusedLauncher, values: np.ndarray, count_ptr: int) -> Any:
        t = np.float32
        tail = (np.uint64(0), np.uint64(0), np.int64(0))
        alpha = t(0)  # with the device counter the kernel takes alpha from the table
        if count_ptr:
            _, _, last, table_ptr = self._bias_table(launcher)
            tail = (np.uint64(table_ptr), np.uint64(count_ptr), np.int64(last))
        else:
            alpha = t(self._alpha(t))
        lr, c1, c2, eps, wd, _ = values
        return (alpha, c1, c2, eps, lr, wd), tail

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
