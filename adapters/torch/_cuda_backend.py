"""The lscore.cuda backend of CUDA devices holding torch tensors (``TorchCudaBackend``)."""

from __future__ import annotations

import numpy as np
import torch

from lscore.cuda import CupyBackend

__all__ = ["TorchCudaBackend"]

# NumPy host tables -> torch: the unsigned words travel as their signed twins
_SIGNED = {np.dtype(np.uint64): np.int64, np.dtype(np.uint32): np.int32}


class TorchCudaBackend(CupyBackend):
    """lscore.cuda backend for one CUDA device holding torch tensors.

    The kernels are CuPy's (NVRTC's cubin of _ext/scan.cu, loaded once per
    device into the primary context that torch uses too, see
    lscore.cuda.cupy_backend); memory is torch tensors and the launches go to
    torch's current stream of the device.
    """

    def ptr(self, a: torch.Tensor) -> int:
        return a.data_ptr()

    def get(self, a: torch.Tensor) -> np.ndarray:
        return a.cpu().numpy()

    def to_device(self, host: np.ndarray) -> torch.Tensor:
        """A device copy of `host` for the launches on torch's current stream.

        The launcher's only device buffers (its flag, the norm's buffer: the
        tensors of a call travel in the kernel arguments) start as zeros: they are
        allocated and cleared on the current stream, which orders them before the
        launches, with no synchronisation.  Other contents are copied by torch
        (a blocking copy, complete on return).
        """
        signed = _SIGNED.get(host.dtype)
        flat = host.view(signed) if signed else host
        if not host.any():
            dtype = torch.from_numpy(flat[:0]).dtype
            return torch.zeros(host.shape, dtype=dtype, device=f"cuda:{self.device}")
        return torch.from_numpy(flat).to(f"cuda:{self.device}")

    def stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def read_word(self, a: torch.Tensor) -> int:
        return int(a[0].item()) & 0xFFFFFFFF
