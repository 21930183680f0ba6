"""The loss-scale state machine resident on a device (the update kernel's buffers)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lscore import kernels
from lscore.cuda.backend import Backend
from lscore.cuda.sources import UPDATE_KERNEL

# slots of the flags (uint32) and values (float64) that follow the struct (lsc_codes.h)
FOUND, FLOOR, APPLY = (kernels.DEVICE_FLAGS[k] for k in ("found", "floor", "apply"))
INV_SCALE, SCALE = (kernels.DEVICE_VALS[k] for k in ("inv_scale", "scale"))
FLAGS_BYTES = 4 * kernels.NDEVICE_FLAGS
VALS_BYTES = 8 * kernels.NDEVICE_VALS
# the float32 scale after the values, in a word of its own (8 bytes keep the buffer's size a
# multiple of 8)
SCALE32_BYTES = 8


class DeviceState:
    """A device copy of one lsc_state struct plus the flags and values the kernels share.

    One device buffer holds ``[lsc_state][flags: uint32][vals: float64][scale32]``
    (see _ext/update.cu; the slots are FOUND, FLOOR, APPLY and INV_SCALE,
    SCALE of lsc_codes.h; ``scale32`` is the scale rounded to float32, a 0-d
    array that every launch of the update kernel rewrites).  The struct's bytes come from
    ``LossScaleState.to_bytes()`` and go back through ``from_bytes()``; this
    class never reads its fields.
    """

    def __init__(self, backend: Backend, nbytes: int) -> None:
        if nbytes % 8:
            raise ValueError(f"lsc_state size must be a multiple of 8, got {nbytes}")
        self.backend = backend
        self.nbytes = nbytes
        end = nbytes + FLAGS_BYTES
        last = end + VALS_BYTES
        self.buf = backend.to_device(np.zeros(last + SCALE32_BYTES, np.uint8))
        self.flags = self.buf[nbytes:end].view(np.uint32)
        self.vals = self.buf[end:last].view(np.float64)
        self.scale32 = self.buf[last : last + 4].view(np.float32).reshape(())
        base = backend.ptr(self.buf)
        self.state_ptr, self.flags_ptr, self.vals_ptr = base, base + nbytes, base + end
        self.scale32_ptr = base + last
        self.found_ptr = self.flags_ptr + 4 * FOUND
        self.inv_ptr = self.vals_ptr + 8 * INV_SCALE

    @property
    def found(self) -> Any:
        """The device found flag (uint32, one element)."""
        return self.flags[FOUND : FOUND + 1]

    @property
    def apply(self) -> Any:
        """The device decision of the last step (uint32, 1 apply / 0 skip)."""
        return self.flags[APPLY : APPLY + 1]

    @property
    def inv_scale(self) -> Any:
        return self.vals[INV_SCALE : INV_SCALE + 1]

    @property
    def scale(self) -> Any:
        return self.vals[SCALE : SCALE + 1]

    def _launch(self, advance: int, applied_ptr: int = 0, count_ptr: int = 0) -> None:
        self.backend.launch(
            UPDATE_KERNEL,
            1,
            1,
            (
                np.uint64(self.state_ptr),
                np.uint64(self.flags_ptr),
                np.uint64(self.vals_ptr),
                np.uint64(self.scale32_ptr),
                np.uint64(applied_ptr),
                np.uint64(count_ptr),
                np.int32(advance),
            ),
        )

    def put(self, raw: bytes) -> None:
        """Write a struct (CyState.to_bytes()); clears floor and apply, refreshes vals."""
        if len(raw) != self.nbytes:
            raise ValueError(f"an lsc_state is {self.nbytes} bytes, got {len(raw)}")
        self.buf[: self.nbytes] = self.backend.to_device(np.frombuffer(raw, np.uint8))
        self.flags[FLOOR] = self.flags[APPLY] = 0
        self._launch(0)

    def step(self, *, applied_ptr: int = 0, count_ptr: int = 0) -> None:
        """Advance the state on the device with this step's found flag (no sync).

        `applied_ptr`, when not 0, is a device byte set to whether the step's gradients
        were finite; `count_ptr`, when not 0, a device int64 step counter advanced by one
        (Adam's): both written by the same launch."""
        self._launch(1, applied_ptr, count_ptr)

    def read(self) -> tuple[bytes, np.ndarray, np.ndarray]:
        """(struct bytes, flags, vals) copied to the host in one transfer (one sync)."""
        host = self.backend.get(self.buf)
        n, end = self.nbytes, self.nbytes + FLAGS_BYTES
        return (
            host[:n].tobytes(),
            host[n:end].view(np.uint32).copy(),
            host[end : end + VALS_BYTES].view(np.float64).copy(),
        )

    def clear_floor(self) -> None:
        self.flags[FLOOR] = 0
