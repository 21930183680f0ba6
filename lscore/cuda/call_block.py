"""The per-call parameters every launch of a ``MultiTensor`` shares, and the one-pass norm's
packed launches over them.

A scan launch reads its per-call parameters (the inverse scale, the flag's
address, the call's mark; the one-pass norm's bound, clip coefficient and
buffer addresses) from one block of uint64 words, a ``CallBlock``, written
once per call; ``pack_norm`` packs the norm's unscale and clip launches of a
runner's ``Launches`` over it.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from lscore import kernels
from lscore.cuda.sources import kernel_name

__all__ = ["CALL_SIZES", "CALL_SLOTS", "CallBlock", "Norm", "pack_norm"]

#: byte widths of the scan kernels' per-call parameters (_ext/scan.cu), after the argument
#: struct and the chunk: unscale's inv, inv_dev, found, mark; all_finite's found, mark
CALL_SIZES = {"unscale": (8, 8, 8, 4), "all_finite": (8, 4)}
#: which words of the call block those per-call parameters are
CALL_SLOTS = {"unscale": (0, 1, 2, 3), "all_finite": (2, 3)}
# consecutive, so that a launch's void*[] points at them as one run (kernels.launch_params)
assert all(s == tuple(range(s[0], s[0] + len(s))) for s in CALL_SLOTS.values())
# the words: inv, inv_dev, found, mark, then the norm's max_norm, coef, coef_dev and the
# addresses in its buffer (the call's state, the arrival ticket, the block partials)
INV, INV_DEV, FOUND, MARK, MAX_NORM, COEF, COEF_DEV, STATE, TICKET, PART = range(10)
# the norm buffer (float64 words): state[0 .. 5), the ticket's word, then the partials
NORM_TICKET, NORM_PART = 5, 6
# lsc_mt_unscale_norm's flags (scan.cu): inf-norm, the call's first and last launch
NORM_INF, NORM_FIRST, NORM_LAST = (kernels.NORM_FLAGS[k] for k in ("INF", "FIRST", "LAST"))

#: the one-pass norm of one ``Launches``: its unscale and clip launches, the device result
#: [norm, clip coefficient, found, total], the coefficient's address, what they hold alive
Norm = collections.namedtuple("Norm", "unscale clip result coef_ptr keep")


class CallBlock:
    """The shared per-call parameters: uint64 ``words`` at ``addr``, with float64 views
    ``inv``, ``max_norm`` and ``coef`` of their words."""

    def __init__(self) -> None:
        self.words = np.zeros(10, np.uint64)
        self.inv = self.words[INV : INV + 1].view(np.float64)
        self.max_norm = self.words[MAX_NORM : MAX_NORM + 1].view(np.float64)
        self.coef = self.words[COEF : COEF + 1].view(np.float64)
        self.addr = self.words.ctypes.data

    def arg(self, slot: int, width: int) -> tuple:
        """(address, byte width) of the per-call parameter in word `slot`."""
        return self.addr + 8 * slot, width

    def set_scan(self, inv: float, inv_ptr: int, found_ptr: int, mark: int) -> None:
        """A scan call's parameters: the inverse scale (or the float64 at inv_ptr), the
        flag's address and the call's mark."""
        self.inv[0] = inv
        self.words[INV_DEV] = inv_ptr
        self.words[FOUND] = found_ptr
        self.words[MARK] = mark

    def set_norm_buffer(self, base: int) -> None:
        """The addresses in the one-pass norm's device buffer at `base`."""
        self.words[STATE] = base
        self.words[TICKET] = base + 8 * NORM_TICKET
        self.words[PART] = base + 8 * NORM_PART

    def set_clip(self, coef: float | None, coef_ptr: int) -> None:
        """The clip's coefficient: `coef`, or (None) the float64 at coef_ptr."""
        self.coef[0] = 1.0 if coef is None else coef
        self.words[COEF_DEV] = 0 if coef is not None else coef_ptr


def pack_norm(runner: Any, prepared: Any, buf: Any) -> Norm:
    """The one-pass norm's launches over `prepared` (a ``Launches`` of `runner`, a
    ``MultiTensor`` whose norm buffer is `buf`), arguments packed."""
    keep: list = []
    arg = runner.call.arg
    unscale, clip = [], []
    nflags = np.zeros(len(prepared.specs), np.uint64)  # each launch's, set per call
    keep.append(nflags)
    norm_args = (arg(MAX_NORM, 8), arg(PART, 8), arg(STATE, 8), arg(TICKET, 8))
    scan_args = (arg(INV, 8), arg(INV_DEV, 8), arg(FOUND, 8), arg(MARK, 4))
    for k, (code, own, nb, nthreads) in enumerate(prepared.specs):
        flags = (nflags.ctypes.data + 8 * k, 4)
        name = kernel_name("unscale_norm", code, runner.meta)
        unscale.append(runner.pack(keep, name, nb, nthreads, own, (*scan_args, flags, *norm_args)))
        name = kernel_name("clip", code, runner.meta)
        clip.append(runner.pack(keep, name, nb, nthreads, own, (arg(COEF, 8), arg(COEF_DEV, 8))))
    if not unscale:  # nothing to measure: the empty norm's constant result
        empty = runner.backend.to_device(np.array([0.0, 1.0, 0.0, 0.0]))
        return Norm(unscale, clip, empty, runner.backend.ptr(empty) + 8, (keep, nflags))
    state = int(runner.call.words[STATE])
    return Norm(unscale, clip, buf[1:5], state + 8 * 2, (keep, nflags))
