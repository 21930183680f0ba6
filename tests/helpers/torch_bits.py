"""Torch tensors to and from their bit patterns, for tests that compare with recorded vectors
bit for bit (float32 as uint32, bfloat16 as uint16, float8 as uint8)."""

from __future__ import annotations

import numpy as np
import torch

# dtype -> (torch's signed view, NumPy's signed and unsigned integer of the same width)
_VIEWS = {
    torch.float32: (torch.int32, np.int32, np.uint32),
    torch.bfloat16: (torch.int16, np.int16, np.uint16),
}


def bits(t: torch.Tensor) -> np.ndarray:
    """``t``'s bit pattern as an unsigned NumPy array (float8 and other bytes as uint8)."""
    t = t.detach().contiguous()
    if t.dtype in _VIEWS:
        view, _, unsigned = _VIEWS[t.dtype]
        return t.view(view).numpy().view(unsigned)
    return t.view(torch.uint8).numpy()


def from_bits(a: np.ndarray, dtype: str) -> torch.Tensor:
    """The recorded bit pattern ``a`` as a tensor of ``dtype`` ("float32" or "bfloat16")."""
    t = getattr(torch, dtype)
    return torch.from_numpy(a.view(_VIEWS[t][1]).copy()).view(t)
