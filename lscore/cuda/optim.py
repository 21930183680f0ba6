"""The fused optimizer kernels (_ext/optim.cu) over lists of records, on one device.

Design: a tensor of the kernels is a *record*, D device addresses
``{grad, param, slots...}`` (float32 parameters and slots; float16, bfloat16
or float32 gradients).  ``FusedLauncher.plan`` packs the records of a list
into the kernels' argument structs (optim.cu's lsc_opt_meta, 4 KB or 32 KB
of kernel parameters, as torch's multi-tensor apply passes its tensor
lists), one group of launches per gradient dtype, splitting long lists over
launches: nothing is uploaded, so a list never seen before costs host work
only, and no device table has to outlive a captured graph.  Plans are cached
by the caller's key (every address, size and dtype code).  A call is then
its launches on the current stream; nothing is read back.

Everything a launch reads that changes between steps without the host
knowing (the inverse scale, the skip flag, Adam's step counter) is read
through a device pointer, so a CUDA graph captured over these launches
replays later steps correctly.  The hyperparameters go by value, or, with
``hyper_ptr``, through a device array that a schedule writes between replays.

``bias_table`` builds Adam's bias-correction tables for the device counter.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import numpy as np

from lscore import kernels
from lscore.cuda._lru import LRU
from lscore.cuda.launch import argument_widths, launch_entries
from lscore.cuda.loader import METAS, OPT_GRADS, OPT_METAS, optim_kernel_name
from lscore.dtypes import Code

__all__ = ["FLAGS", "GRAD_CODES", "TABLE_LIMIT", "FusedLauncher", "FusedPlan", "bias_table"]

#: the fused optimizer kernels' flag bits (from _ext/lsc_codes.h)
FLAGS = kernels.OPTIM_FLAGS
#: the gradient dtypes the kernels read (float32 master weights and slots)
GRAD_CODES = OPT_GRADS
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
# whether a dtype code is one the kernels read as gradients, by code (clipped lookups:
# anything outside is refused)
_GRAD_OK = np.zeros(256, bool)
_GRAD_OK[[int(c) for c in GRAD_CODES]] = True
_GRAD_OK[-1] = False


class FusedPlan:
    """The packed kernel arguments of one list (built by ``FusedLauncher.plan``).

    `kind` is the optimizer ("sgd" or "adam") whose argument struct `meta`
    the records were packed into, `launcher` the ``FusedLauncher`` that packed
    them and launches them; ``specs`` lists (gradient dtype code,
    blocks) per launch and ``arguments`` holds each launch's argument bytes
    (its struct, then the chunk) as one row.  The packed launches of each
    kernel and signature (``packed``) are kept here for as long as this lives.
    """

    __slots__ = ("arguments", "kind", "launcher", "meta", "packed", "params", "specs")

    def __init__(
        self,
        launcher: FusedLauncher,
        kind: str,
        meta: str,
        specs: list,
        arguments: np.ndarray,
        params: tuple,
    ) -> None:
        self.launcher = launcher
        self.kind, self.meta, self.specs, self.arguments = kind, meta, specs, arguments
        # every launch's void*[] (its struct, its chunk, then every call word: a signature
        # of k per-call parameters reads the first 2 + k), and the first one's address
        self.params = params
        self.packed: dict = {}

    @property
    def launches(self) -> int:
        return len(self.specs)


class FusedLauncher:
    """Launches lsc_mt_sgd / lsc_mt_adam (and their check) over packed records on one device.

    Built on that device's ``MultiTensor`` `runner`: its backend, its launch
    limits and argument size, and its flag for checks whose answer the host
    reads (``runner.next_mark()``, ``runner.found(mark)``).  The plans of
    the last `cache_size` keys are kept.
    """

    def __init__(self, runner: Any, *, cache_size: int = 8) -> None:
        self.runner = runner
        self.backend = runner.backend
        self._cache = LRU(cache_size)
        # the argument structs this runner's kernels take: 4 KB, or 32 KB of parameters
        self._size = 1 if runner.meta == METAS[1] else 0
        # the per-call parameters (optim.cu's, after `chunk`), one 8-byte word each,
        # shared by every packed launch and written before each call's launches
        self._call = np.zeros(_MAX_CALL_WORDS, np.uint64)
        self._call_addr = self._call.ctypes.data
        # launch signatures and kernel handles, shared by every plan
        self._signatures: dict = {}
        self._kernels: dict = {}

    def cached(self, key: Any) -> FusedPlan | None:
        """The plan of `key` if it is still cached."""
        return self._cache.get(key)

    def plan(self, key: Any, kind: str, codes: Any, counts: Any, records: Any) -> FusedPlan:
        """The plan of `key` for optimizer `kind`, packed on a miss.

        Per tensor: its gradient dtype code (`codes`), element count (`counts`) and
        record of addresses (`records`, one row each, at most the kernel's depth:
        SGD 3, Adam 5; missing slots are 0).  Nothing is uploaded.
        """
        hit = self.cached(key)
        if hit is not None:
            return hit
        meta = OPT_METAS[kind][self._size]
        depth, max_tensors, max_blocks = kernels.OPT_META[meta]
        codes = np.asarray(codes, np.int64).reshape(-1)
        counts = np.asarray(counts, np.int64).reshape(-1)
        given = np.asarray(records, np.uint64).reshape(len(codes), -1)
        if given.shape[1] > depth:
            raise ValueError(
                f"a {kind} record holds at most {depth} addresses, got {given.shape[1]}"
            )
        bad = codes[~_GRAD_OK.take(codes, mode="clip")]
        if bad.size:
            raise TypeError(
                f"the fused optimizers read float16, bfloat16 or float32 "
                f"gradients, not {Code(int(bad[0])).name}"
            )
        r = self.runner
        size = _opt_meta_dtype(meta).itemsize
        # every launch's argument block (the struct, then the chunk) is a row of `arguments`
        arguments, specs = kernels.pack_launches(
            codes,
            counts,
            given,
            r.chunk,
            r.max_tensors,
            r.max_blocks,
            depth,
            max_tensors,
            max_blocks,
            size,
        )
        params = kernels.launch_params(arguments, size, self._call_addr, _MAX_CALL_WORDS)
        hit = FusedPlan(self, kind, meta, specs, arguments, params)
        self._cache.put(key, hit)
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
        (SGD: lr, momentum, damp, wd; Adam: lr, c1, c2, eps, wd, alpha).  With
        ``FLAGS["CHECK"]`` in `flags` the launches are the check's (lsc_mt_opt_check:
        only `flags`, the inverse, the gate and `skip_if` matter).  The launches are
        packed once per plan, kernel and signature; a call writes its parameters into
        the shared block and launches (cuLaunchKernel copies them, so a captured graph
        keeps this call's values).
        """
        if kind != plan.kind:
            raise ValueError(f"a plan packed for {plan.kind} cannot launch {kind}")
        check = bool(flags & FLAGS["CHECK"])
        call = (
            np.int32(flags),
            np.float64(inv),
            np.uint64(inv_ptr),
            np.uint64(gate_ptr),
            np.uint32(skip_if),
        )
        args = call if check else (*head, *call, *tail, np.uint64(hyper_ptr))
        name = "check" if check else kind
        # the scalars' types give the signature: packed once per plan, kernel, flags and types
        key = (name, flags, tuple(map(type, args)))
        packed = plan.packed.get(key)
        if packed is None:
            packed = plan.packed[key] = self._pack(name, flags, plan, args)
        # numpy declares ndarray.__buffer__ for Python >= 3.12 only
        struct.pack_into(packed[1], self._call, 0, *args)  # type: ignore[arg-type]
        self.runner.enqueue(packed[0])
        return len(packed[0])

    def _pack(self, name: str, flags: int, plan: FusedPlan, args: tuple) -> Any:
        """([(kernel handle, grid, block, void*[] address, widths address, count)], the
        struct format of `args` in the call block): the entries ``MultiTensor.enqueue``
        launches, over the plan's void*[] rows; the widths and the format are the
        signature's, shared by every plan."""
        r = self.runner
        fmt, widths = self._signature(args, _opt_meta_dtype(plan.meta).itemsize)

        def kernel(code: int) -> Any:
            fn = self._kernels.get((name, code, plan.meta, flags))
            if fn is None:
                fn = self._kernels[name, code, plan.meta, flags] = r.kernel(
                    optim_kernel_name(name, code, plan.meta, flags)
                )
            return fn

        out = launch_entries(plan.params, plan.specs, kernel, lambda code: r.opt_block, widths)
        return out, fmt

    def _signature(self, args: tuple, size: int) -> tuple:
        """(struct format, int64 byte widths) of a launch whose struct is `size` bytes and
        whose per-call scalars are `args`."""
        key = (size, tuple(map(type, args)))
        sig = self._signatures.get(key)
        if sig is None:
            if len(args) > _MAX_CALL_WORDS:
                raise ValueError(f"at most {_MAX_CALL_WORDS} per-call parameters, got {len(args)}")
            fmt = "<" + "".join(_WORD[a.dtype.kind, a.itemsize] for a in args)
            sig = self._signatures[key] = (fmt, argument_widths(size, [a.itemsize for a in args]))
        return sig


@functools.cache
def _opt_meta_dtype(meta: str) -> np.dtype:
    """NumPy's layout of optim.cu's lsc_opt_meta `meta` (as C lays it out: no padding)."""
    depth, nt, nb = kernels.OPT_META[meta]
    return np.dtype(
        [
            ("ptr", "<u8", (depth, nt)),
            ("size", "<i8", (nt,)),
            ("chunk_of", "<i4", (nb,)),
            ("tensor_of", "<u2", (nb,)),
        ]
    )
