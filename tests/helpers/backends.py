"""The backends behind conftest's ``backend`` fixtures: one behaviour test, every framework.

A backend answers the few questions a shared adapter test asks in its own
framework's terms: how to put a NumPy array on it (``asarray``, ``scalar``)
and read it back (``to_numpy``), how to make variables and an inner optimizer
for them, and how to run one ``LossScaleOptimizer`` step with given gradients
(``apply``).  Everything else (the wrapper's arguments, attributes, errors)
is the same API on every adapter, which is what the shared tests check.

    numpy      lscore.adapters.numpy
    cuda_host  lscore.adapters.cupy's classes on NumPy + the host harness (helpers.cuda_host)
    cupy       lscore.adapters.cupy on a CUDA device
    torch      lscore.adapters.torch (LossScaleOptimizer around torch.optim)

``make(name)`` skips the calling test when the backend cannot run here.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from helpers import FLOAT_DTYPES

NAMES = ("numpy", "cuda_host", "cupy", "torch")
ARRAY_NAMES = ("numpy", "cuda_host", "cupy")  # those with all_finite / unscale_ on arrays
DEVICE_NAMES = ("cuda_host", "cupy")  # lscore.adapters.cupy's code


class Backend:
    name: str
    #: the adapter module (numpy, cupy) or None (torch)
    module = None
    LossScaleOptimizer = None
    #: the float dtypes its arrays can hold
    float_dtypes = tuple(FLOAT_DTYPES)
    #: unscale_ leaves a NaN's payload bits as the CPU core does
    nan_payload_exact = True
    #: the CUDA kernels' unscale_: a float16/bfloat16 NaN it writes is the conversion
    #: instruction's canonical 0x7FFF (helpers.cuda_host.device_words)
    device_nan = False

    def __repr__(self):
        return f"<backend {self.name}>"

    def asarray(self, host: np.ndarray):
        """A copy of `host` on this backend."""
        raise NotImplementedError

    def scalar(self, value, dtype):
        """A 0-d value of `dtype`, as a loss or gradient comes in this framework."""
        return self.asarray(np.array(value, dtype))

    def to_numpy(self, a) -> np.ndarray:
        raise NotImplementedError

    def tree(self, nested):
        """`nested` (dicts, lists, tuples, None, NumPy leaves) with each leaf on this backend."""
        if isinstance(nested, dict):
            return {k: self.tree(v) for k, v in nested.items()}
        if isinstance(nested, (list, tuple)):
            return type(nested)(self.tree(v) for v in nested)
        return None if nested is None else self.asarray(nested)

    def variables(self, hosts: list) -> list:
        """Trainable variables holding copies of the NumPy arrays `hosts`."""
        return [self.asarray(h) for h in hosts]

    def sgd(self, variables: list, learning_rate: float = 0.01, **kwargs):
        return self.module.SGD(learning_rate, **kwargs)

    def adam(self, variables: list, learning_rate: float = 0.001, **kwargs):
        return self.module.Adam(learning_rate, **kwargs)

    def failing_sgd(self, variables: list, exc: type, learning_rate: float = 0.1):
        """An SGD whose step raises `exc`."""

        def apply_gradients(self, grads_and_vars):
            raise exc("inner optimizer failed")

        return type("Failing", (self.module.SGD,), {"apply_gradients": apply_gradients})(
            learning_rate
        )

    def apply(self, opt, variables: list, grads: list) -> bool:
        """One step of the wrapper `opt` with the (unscaled) NumPy gradients `grads`;
        returns what says the step was applied (the NumPy adapter's own return value)."""
        return opt.apply_gradients(
            list(zip([self.asarray(g) for g in grads], variables, strict=True))
        )


class NumpyBackend(Backend):
    name = "numpy"

    def __init__(self):
        from lscore.adapters import numpy as lnp

        self.module = lnp
        self.xp = np
        self.LossScaleOptimizer = lnp.LossScaleOptimizer
        self.all_finite, self.unscale_ = lnp.all_finite, lnp.unscale_

    def asarray(self, host):
        return np.array(host, copy=True)

    def scalar(self, value, dtype):
        return np.dtype(dtype).type(value)

    def to_numpy(self, a):
        return np.asarray(a)


class CudaHostBackend(NumpyBackend):
    """The CuPy adapter's code with NumPy arrays and the kernels run by the host harness."""

    name = "cuda_host"
    device_nan = True

    def __init__(self):
        if shutil.which("g++") is None:
            pytest.skip("g++ is missing: the CUDA host harness cannot be built")
        from helpers.cuda_host import adapter

        self.module = adapter
        self.xp = np
        self.LossScaleOptimizer = adapter.LossScaleOptimizer
        self.all_finite, self.unscale_ = adapter.all_finite, adapter.unscale_


class CupyBackend(Backend):
    name = "cupy"
    float_dtypes = tuple(d for d in FLOAT_DTYPES if d.name != "bfloat16")
    #: a GPU may return another NaN than the CPU core's for NaN * inv_scale
    nan_payload_exact = False

    def __init__(self):
        cp = pytest.importorskip("cupy")
        if not cp.cuda.is_available():
            pytest.skip("no CUDA device for cupy")
        from lscore.adapters import cupy as lcp

        self.module = lcp
        self.xp = cp
        self.LossScaleOptimizer = lcp.LossScaleOptimizer
        self.all_finite, self.unscale_ = lcp.all_finite, lcp.unscale_

    def asarray(self, host):
        return self.xp.array(host, copy=True)

    def to_numpy(self, a):
        return self.xp.asnumpy(a)


class TorchBackend(Backend):
    """lscore.adapters.torch.LossScaleOptimizer around torch.optim, on CPU tensors.

    A step is torch's: ``zero_grad()``, ``get_scaled_loss(loss).backward()``,
    ``step()``, with a loss whose gradient is the given one (``sum(p * g)``).
    The torch adapter has no all_finite/unscale_ on nested arrays.
    """

    name = "torch"
    all_finite = unscale_ = None

    def __init__(self):
        self.torch = pytest.importorskip("torch")
        from lscore.adapters import torch as lt

        self.LossScaleOptimizer = lt.LossScaleOptimizer

    def asarray(self, host):
        return self.torch.from_numpy(np.array(host, copy=True))

    def to_numpy(self, a):
        return a.detach().numpy()

    def variables(self, hosts):
        return [self.torch.nn.Parameter(self.asarray(h)) for h in hosts]

    def sgd(self, variables, learning_rate=0.01, **kwargs):
        return self.torch.optim.SGD(variables, lr=learning_rate, **kwargs)

    def adam(self, variables, learning_rate=0.001, **kwargs):
        return self.torch.optim.Adam(variables, lr=learning_rate, **kwargs)

    def failing_sgd(self, variables, exc, learning_rate=0.1):
        def step(self, closure=None):
            raise exc("inner optimizer failed")

        return type("Failing", (self.torch.optim.SGD,), {"step": step})(variables, lr=learning_rate)

    def apply(self, opt, variables, grads):
        opt.zero_grad()
        loss = sum((p * self.asarray(g)).sum() for p, g in zip(variables, grads, strict=True))
        opt.get_scaled_loss(loss).backward()
        opt.step()
        return opt.last_step_skipped is False


_CLASSES = {
    "numpy": NumpyBackend,
    "cuda_host": CudaHostBackend,
    "cupy": CupyBackend,
    "torch": TorchBackend,
}


def make(name: str) -> Backend:
    """The backend `name`; skips the calling test where it cannot run."""
    return _CLASSES[name]()
