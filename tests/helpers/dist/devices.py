"""The backend and device of one local rank: a GPU of its own, or the CPU.

The rule of README.md's torchrun examples, for the test workers.  NCCL runs
on cuda:LOCAL_RANK only when the host has a GPU for every local rank: NCCL
refuses two ranks on one GPU, and a rank past the last GPU fails with
"invalid device ordinal".  Otherwise every rank runs gloo on the CPU.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def pick(local_rank: int, local_world: int) -> tuple[str, torch.device]:
    """(backend, device) for local rank `local_rank` of `local_world` ranks on this host."""
    if dist.is_nccl_available() and torch.cuda.device_count() >= local_world:
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")
