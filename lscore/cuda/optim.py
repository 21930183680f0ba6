"""The fused optimizer kernels (_ext/optim.cu) over planned records, on one device.

Design: a tensor of the kernels is a *record*, D device addresses
``{grad, param, slots...}`` (float32 parameters and slots; float16, bfloat16
or float32 gradients).  ``FusedLauncher.plan`` writes the records of a list
into device memory and plans launches over the record addresses with
``plan_launches`` (one group, one kernel, per gradient dtype), once per key:
the caller's key holds every address, size and dtype code, so the same
arrays next step cost no upload and any change is a new plan.  A call is
then its launches on the current stream; nothing is read back.

Everything a launch reads that changes between steps without the host
knowing (the inverse scale, the skip flag, Adam's step counter) is read
through a device pointer, so a CUDA graph captured over these launches
replays later steps correctly.  The hyperparameters go by value, or, with
``hyper_ptr``, through a device array that a schedule writes between replays.

``bias_table`` builds Adam's bias-correction tables for the device counter.
"""

from __future__ import annotations

import collections
import struct
import threading
from typing import Any

import numpy as np

from lscore import kernels
from lscore.cuda.launch import plan_launches
from lscore.cuda.loader import TRAITS
from lscore.dtypes import Code

__all__ = ["FLAGS", "GRAD_CODES", "TABLE_LIMIT", "FusedLauncher", "FusedPlan", "bias_table"]

#: the fused optimizer kernels' flag bits (from _ext/lsc_codes.h)
FLAGS = kernels.OPTIM_FLAGS
#: the gradient dtypes the kernels read (float32 master weights and slots)
GRAD_CODES = (Code.F16, Code.BF16, Code.F32)
#: the most steps a bias-correction table may hold: 2**18 float32 pairs (2 MiB) covers
#: beta_2 up to about 0.99993, whose table saturates near 2.4e5 steps
TABLE_LIMIT = 1 << 18


def bias_table(terms: Any, *, limit: int = TABLE_LIMIT) -> tuple[np.ndarray, int]:
    """Adam's bias-correction terms for every step up to saturation: (table, last).

    `terms(step)` returns the float32 pair (sqrt(1 - beta_2**step),
    1 - beta_1**step) exactly as the optimizer computes them on the host.
    ``table[t]`` is the first term of step t and ``table[last + 1 + t]``
    the second, for t = 0 .. last, where `last` is the first step at which
    both are exactly 1 (a power below half an ulp of 1 rounds 1 - x to 1,
    and beta**t only shrinks, so every later step has alpha = lr exactly;
    the kernel caps t at `last`).  ValueError when that step is beyond
    `limit`.
    """
    sq, d = [np.float32(1)], [np.float32(1)]  # index 0: never read (t >= 1)
    one = np.float32(1)
    step = 0
    while True:
        step += 1
        if step > limit:
            raise ValueError(
                f"Adam's bias correction does not reach 1 in float32 within {limit} steps "
                "for these betas (beta_2 too close to 1): the device step counter's table "
                "would be too large; use beta_2 <= 0.9999, or sync_free=False"
            )
        a, b = terms(step)
        sq.append(np.float32(a))
        d.append(np.float32(b))
        if sq[-1] == one and d[-1] == one:
            break
    return np.array(sq + d, np.float32), step


# a per-call parameter as one little-endian 8-byte word, by NumPy kind and width
_WORD = {
    ("f", 4): "f4x",
    ("i", 4): "i4x",
    ("u", 4): "I4x",
    ("f", 8): "d",
    ("i", 8): "q",
    ("u", 8): "Q",
}
_MAX_CALL_WORDS = 16


class FusedPlan:
    """The device records and launch tables of one list (built by ``FusedLauncher.plan``).

    ``groups`` lists (gradient dtype code, [(table address, ntensors,
    nblocks)]); the device buffers, and the packed launches of each kernel
    signature (``packed``), are held here for as long as this lives.
    """

    __slots__ = ("_keep", "groups", "packed")

    def __init__(self, groups: Any, keep: Any) -> None:
        self.groups = groups
        self.packed: dict = {}
        self._keep = keep

    @property
    def launches(self) -> int:
        return sum(len(ls) for _, ls in self.groups)


class FusedLauncher:
    """Launches lsc_mt_sgd / lsc_mt_adam over planned records on one device.

    Built on that device's ``MultiTensor`` `runner`: its backend, its launch
    limits, and its flag for checks whose answer the host reads
    (``runner.next_mark()``, ``runner.found(mark)``).  The plans of the
    last `cache_size` keys are kept.
    """

    def __init__(self, runner: Any, *, cache_size: int = 8) -> None:
        self.runner = runner
        self.backend = runner.backend
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        # the per-call parameters (optim.cu's, after `chunk`), one 8-byte word each,
        # shared by every packed launch and written before each call's launches
        self._call = np.zeros(_MAX_CALL_WORDS, np.uint64)

    def cached(self, key: Any) -> FusedPlan | None:
        """The plan of `key` if it is still cached (nothing is uploaded)."""
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def plan(self, key: Any, tensors: Any) -> FusedPlan:
        """The plan of `key`, built from `tensors` on a miss (two uploads).

        `tensors`: [(gradient dtype code, element count, record addresses)],
        every record of the same length D.
        """
        hit = self.cached(key)
        if hit is not None:
            return hit
        by_code: dict = {}
        for i, (code, _, _) in enumerate(tensors):
            if Code(code) not in GRAD_CODES:
                raise TypeError(
                    f"the fused optimizers read float16, bfloat16 or float32 "
                    f"gradients, not {Code(code).name}"
                )
            by_code.setdefault(int(code), []).append(i)
        b, r = self.backend, self.runner
        d = len(tensors[0][2]) if tensors else 0
        records = b.to_device(np.array([r for _, _, r in tensors], np.uint64).reshape(-1))
        base = b.ptr(records)
        tables, planned, start = [], [], 0
        for code, idx in by_code.items():
            p = plan_launches(
                [base + 8 * d * i for i in idx],
                [tensors[i][1] for i in idx],
                chunk=r.chunk,
                max_tensors=r.max_tensors,
                max_blocks=r.max_blocks,
            )
            if p.launches:
                planned.append((code, start, p.launches))
                tables.append(p.table)
                start += p.table.size
        keep = [records]
        groups = []
        if tables:
            table = b.to_device(np.concatenate(tables))
            keep.append(table)
            tbase = b.ptr(table)
            for code, start, launches in planned:
                groups.append(
                    (code, [(tbase + 8 * (start + off), nt, nb) for off, nt, nb in launches])
                )
        hit = FusedPlan(groups, keep)
        with self._lock:
            self._cache[key] = hit
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return hit

    def launch(
        self,
        kind: str,
        plan: FusedPlan,
        head: tuple,
        *,
        flags: int,
        inv: float = 1.0,
        inv_ptr: int = 0,
        gate_ptr: int = 0,
        skip_if: int = 0,
        tail: tuple = (),
        hyper_ptr: int = 0,
    ) -> int:
        """Enqueue `kind` ("sgd" or "adam") over `plan`; returns the launches made.

        `head`: the kernel's NumPy scalars between ``chunk`` and ``flags``
        (optim.cu's signatures); `tail`: Adam's (bias, count, last); `hyper_ptr`, when
        not 0, the device float32 hyperparameters the kernels read instead of `head`'s
        (SGD: lr, momentum, damp, wd; Adam: lr, c1, c2, eps, wd, alpha).  The
        launches are packed once per plan and signature; a call writes its
        parameters into the shared block and launches (cuLaunchKernel copies
        them, so a captured graph keeps this call's values).
        """
        args = (
            *head,
            np.int32(flags),
            np.float64(inv),
            np.uint64(inv_ptr),
            np.uint64(gate_ptr),
            np.uint32(skip_if),
            *tail,
            np.uint64(hyper_ptr),
        )
        fmt = "<" + "".join(_WORD[a.dtype.kind, a.itemsize] for a in args)
        packed = plan.packed.get((kind, fmt))
        if packed is None:
            packed = plan.packed[(kind, fmt)] = self._pack(kind, plan, args)
        # numpy declares ndarray.__buffer__ for Python >= 3.12 only
        struct.pack_into(fmt, self._call, 0, *args)  # type: ignore[arg-type]
        self.runner.enqueue(packed[0])
        return len(packed[0])

    def _pack(self, kind: str, plan: FusedPlan, args: tuple) -> Any:
        """([(kernel handle, grid, block, void*[] address, widths address, count)], arrays
        kept): the entries ``MultiTensor.enqueue`` launches."""
        r, call = self.runner, self._call.ctypes.data
        out: list[tuple] = []
        keep: list[np.ndarray] = []
        for code, launches in plan.groups:
            name = f"lsc_mt_{kind}<{TRAITS[Code(code)]}>"
            for table, nt, nb in launches:
                own = np.array([table, nt, r.chunk], np.uint64)  # the record table, its count
                keep.append(own)
                base = own.ctypes.data
                params = [(base, 8), (base + 8, 4), (base + 16, 8)]
                params += [(call + 8 * k, a.itemsize) for k, a in enumerate(args)]
                out.append(r.pack(keep, name, nb, r.block, params))
        return out, keep
