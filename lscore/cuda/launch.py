"""Multi-tensor launches: grouped device buffers -> chunked launches with packed arguments.

Framework-neutral: a *backend* gives device memory (``to_device``, ``ptr``),
kernel handles (``function``), a packed launch (``launch_packed``: the
kernel parameters as one ``void*[]``, the way ``cuLaunchKernel`` takes
them), the device and stream to launch on (``enter``/``leave``,
``stream``) and the read of one word with one synchronisation
(``read_word``).  ``CupyBackend`` is the GPU's; the tests use NumPy and a
host harness that runs the kernels' C++ text on the CPU.

A call costs its launches and one read, nothing else: a launch's tensors
travel in its kernel argument (``prepare`` packs them, with every other
argument, once into host memory that lives with the plan; nothing is
uploaded, so arrays at new addresses cost only that packing), and what a call changes
(the inverse scale, the flag's address, the call's mark) is written into
one shared argument block before the launches.  The one-pass norm
(``launch_norm`` / ``launch_clip``) packs its launches and allocates its
one buffer per device on its first use (a partial per block of the largest
launch, the call's state and an arrival ticket), then costs the same.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from lscore import kernels
from lscore.cuda._lru import LRU
from lscore.cuda.backend import Backend
from lscore.cuda.call_block import (
    CALL_SIZES,
    CALL_SLOTS,
    NORM_FIRST,
    NORM_INF,
    NORM_LAST,
    NORM_PART,
    CallBlock,
    pack_norm,
)

# the defaults and the variable are named here too (lscore.cuda.launch.CHUNK, .ENV, ...)
from lscore.cuda.config import BLOCK as BLOCK
from lscore.cuda.config import CHUNK as CHUNK
from lscore.cuda.config import ENV as ENV
from lscore.cuda.config import MAX_BLOCKS as MAX_BLOCKS
from lscore.cuda.config import MAX_TENSORS as MAX_TENSORS
from lscore.cuda.config import OPT_BLOCK as OPT_BLOCK
from lscore.cuda.config import VECTOR, LaunchConfig, launch_config

# the plans' names are named here too (lscore.cuda.launch.scan_threads, .plan_launches, ...)
from lscore.cuda.plans import MIN_THREADS as MIN_THREADS
from lscore.cuda.plans import THREAD_BYTES as THREAD_BYTES
from lscore.cuda.plans import (
    Launches,
    argument_widths,
    kernel_code,
    launch_entries,
    meta_dtype,
    scan_threads,
)
from lscore.cuda.plans import Plan as Plan
from lscore.cuda.plans import plan_launches as plan_launches
from lscore.cuda.sources import METAS, OPS, kernel_name
from lscore.dtypes import Code

MARK_LIMIT = 0xFFFFFFFF


class MultiTensor:
    """Runs the scan kernels over grouped arrays on one device (one backend).

    ``prepare`` turns groups ``[(code, addresses, counts)]`` into
    ``Launches`` (packed kernel arguments, nothing uploaded); ``launch`` enqueues one op over them
    on the current stream and returns the call's mark; ``found(mark)``
    reads the flag back with one synchronisation.  ``run`` does all three
    for raw tables, with its own plan cache (tests, tools).  Chunk, blocks and
    launch limits come from `config` (default: ``launch_config()``); a `block` given
    without `opt_block` sets both.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        config: LaunchConfig | None = None,
        chunk: int | None = None,
        block: int | None = None,
        opt_block: int | None = None,
        max_tensors: int | None = None,
        max_blocks: int | None = None,
        cache_size: int = 16,
    ) -> None:
        # `config` is checked for a GPU; the single limits override it with only the
        # kernels' own checks, so the host harness can run tiny chunks and blocks
        cfg = config if config is not None else launch_config()
        chunk = cfg.chunk if chunk is None else chunk
        if opt_block is None:
            opt_block = cfg.opt_block if block is None else block
        block = cfg.block if block is None else block
        max_tensors = cfg.max_tensors if max_tensors is None else max_tensors
        max_blocks = cfg.max_blocks if max_blocks is None else max_blocks
        if min(block, opt_block) < 1 or chunk % VECTOR:
            raise ValueError(
                f"blocks must be >= 1 and chunk a multiple of 8, got {block}, {opt_block}, {chunk}"
            )
        self.backend = backend
        # 32 KB kernel arguments where the backend says the driver and device take them
        self.meta = METAS[1] if getattr(backend, "large_kernel_params", False) else METAS[0]
        self.chunk, self.block, self.opt_block = chunk, block, opt_block
        self.max_tensors, self.max_blocks = max_tensors, max_blocks
        self._cache = LRU(cache_size)
        self._fn: dict = {}
        self._by_code: dict = {}
        # the word the kernels mark when they see NaN/Inf (never cleared: see scan.cu)
        self.flag = backend.to_device(np.zeros(2, np.uint32))[:1]
        self.flag_ptr = backend.ptr(self.flag)
        self._mark = 0
        self._wrapped = False
        self.call = CallBlock()  # the per-call parameters, shared by every launch
        self._norm_dev = None
        # the byte widths of each scan op's parameters: its struct, the chunk, the call's
        size = meta_dtype(self.meta).itemsize
        self._widths = {op: argument_widths(size, CALL_SIZES[op]) for op in OPS}

    def kernel(self, name: str) -> Any:
        """The backend's handle of kernel `name` on this device, looked up once."""
        return self._function(name)

    def _function(self, name: str) -> Any:
        fn = self._fn.get(name)
        if fn is None:
            fn = self._fn[name] = self.backend.function(name)
        return fn

    def prepare(self, groups: Any) -> Launches:
        """Pack the launches of `groups` ([(dtype code, addresses, counts)]): each launch's
        tensors travel in its kernel argument (scan.cu's lsc_meta), so nothing is uploaded."""
        out = Launches()
        nt_max, nb_max = kernels.META[self.meta]
        size = meta_dtype(self.meta).itemsize
        groups = [
            (kernel_code(c), np.asarray(p, np.uint64), np.asarray(n, np.int64))
            for c, p, n in groups
        ]
        codes = np.concatenate([np.zeros(0, np.int64)] + [np.full(len(n), c) for c, _, n in groups])
        counts = np.concatenate([np.zeros(0, np.int64)] + [n for _, _, n in groups])
        ptrs = np.concatenate([np.zeros(0, np.uint64)] + [p for _, p, _ in groups])
        largest: dict[int, int] = {}
        for c, _, n in groups:
            largest[c] = max(largest.get(c, 0), int(n.max()) if len(n) else 0)
        threads = {c: scan_threads(self.block, self.chunk, m, c) for c, m in largest.items()}
        # every launch's argument block (the lsc_meta, then the chunk) is a row of `args`
        args, specs = kernels.pack_launches(
            codes,
            counts,
            ptrs,
            self.chunk,
            self.max_tensors,
            self.max_blocks,
            1,
            nt_max,
            nb_max,
            size,
        )
        out._keep.append(args)
        for op in OPS:
            # each launch's void*[] is a row of `params`: its struct, its chunk, then the
            # op's words of the shared call block (consecutive slots)
            slots = CALL_SLOTS[op]
            rows = kernels.launch_params(args, size, self.call.arg(slots[0], 0)[0], len(slots))
            params = rows[0]
            out._keep += [params, self._widths[op]]
            out.ops[op] = launch_entries(
                rows,
                specs,
                functools.partial(self._scan_kernel, op),
                threads.__getitem__,
                self._widths[op],
            )
        # (code, address of its struct, blocks, threads) per launch: the first column of
        # any op's rows
        structs = params[:, 0].tolist()
        out.specs = [(code, structs[k], nb, threads[code]) for k, (code, nb) in enumerate(specs)]
        out.count = len(specs)
        return out

    def _scan_kernel(self, op: str, code: int) -> Any:
        """The handle of scan kernel `op` for dtype code `code` with this runner's struct."""
        fn = self._by_code.get((op, code))
        if fn is None:
            fn = self._by_code[op, code] = self._function(kernel_name(op, code, self.meta))
        return fn

    def next_mark(self) -> int:
        """A fresh mark for a call on this device's flag (1 .. 2**32 - 1)."""
        self._mark = self._mark % MARK_LIMIT + 1
        if self._mark == 1 and self._wrapped:
            self.flag[...] = 0  # once per 2**32 calls: no stale mark survives
        self._wrapped = True
        return self._mark

    def launch(
        self,
        op: str,
        prepared: Launches,
        *,
        inv: float = 1.0,
        inv_ptr: int = 0,
        found_ptr: int | None = None,
        mark: int | None = None,
        stream: Any = None,
    ) -> int:
        """Enqueue `op` over prepared launches; returns the mark the kernels store on NaN/Inf.

        `found_ptr` (default: this runner's flag) is the uint32 the kernels
        mark; `inv_ptr`, when not 0, the device float64 read instead of
        `inv`.  Nothing is uploaded and nothing is read back.
        """
        mark = self._set_call(inv, inv_ptr, found_ptr, mark)
        self.enqueue(prepared.ops[op], stream)
        return mark

    def _set_call(self, inv: float, inv_ptr: int, found_ptr: int | None, mark: int | None) -> int:
        """Write the scan's per-call parameters into the shared block; returns the mark."""
        if mark is None:
            mark = self.next_mark()
        self.call.set_scan(inv, inv_ptr, self.flag_ptr if found_ptr is None else found_ptr, mark)
        return mark

    def enqueue(self, entries: Any, stream: Any = None) -> None:
        """Launch packed `entries` (kernel, grid, block, void*[], widths, count) on `stream`
        (None: the backend's current stream of this device)."""
        b = self.backend
        prev = b.enter()
        try:
            s = b.stream() if stream is None else stream
            for fn, grid, block, params, widths, n in entries:
                b.launch_packed(fn, grid, block, params, widths, n, s)
        finally:
            b.leave(prev)

    def pack(self, keep: list, name: str, grid: int, block: int, struct: int, call: Any) -> tuple:
        """One packed launch of `name` (the entry ``enqueue`` launches) over the argument
        struct at `struct` (this runner's, the chunk right after it); `call` are (address,
        byte width) of its per-call parameters.  The arrays packed are appended to `keep`."""
        size = meta_dtype(self.meta).itemsize
        # the row kernels.launch_params writes for a launch whose call words are these
        params = np.array([struct, struct + size, *(a for a, _ in call)], np.uint64)
        widths = argument_widths(size, [w for _, w in call])
        keep += [params, widths]
        return (
            self._function(name),
            grid,
            block,
            params.ctypes.data,
            widths.ctypes.data,
            len(widths),
        )

    def _norm_buffer(self) -> Any:
        """The device buffer of the one-pass norm, allocated on first use: the call's state
        (running total, then norm, coefficient, found, total), the arrival ticket, and one
        partial per block of the largest launch (``max_blocks``): its size is fixed by the
        launch limits, whatever the model or the number of plans."""
        if self._norm_dev is None:
            dev = self.backend.to_device(np.zeros(NORM_PART + self.max_blocks, np.float64))
            self.call.set_norm_buffer(self.backend.ptr(dev))
            self._norm_dev = dev
        return self._norm_dev

    def launch_norm(
        self,
        prepared: Launches,
        *,
        inv: float = 1.0,
        inv_ptr: int = 0,
        inf_norm: bool = False,
        max_norm: float = 0.0,
        mark: int | None = None,
        stream: Any = None,
    ) -> int:
        """Enqueue the one-pass unscale + check + norm over `prepared`; returns the mark.

        Every element is multiplied by `inv` (or the float64 at `inv_ptr`) as
        ``launch("unscale")`` does, and the same pass gathers per-thread
        partials of the values written: their sum of squares, or with
        `inf_norm` their largest magnitude.  Fixed-order block folds, finished by
        the last block of each launch, leave
        ``prepared.norm.result`` = [norm, clip coefficient for `max_norm`
        (1.0 when `max_norm` is 0), 1.0 if NaN/Inf was seen else 0.0, total].
        The first norm on a device allocates its one buffer; later calls upload nothing.
        """
        if prepared.norm is None:
            prepared.norm = pack_norm(self, prepared, self._norm_buffer())
        mark = self._set_call(inv, inv_ptr, None, mark)
        nflags = prepared.norm.keep[1]
        nflags[:] = NORM_INF if inf_norm else 0
        if len(nflags):
            nflags[0] |= NORM_FIRST
            nflags[-1] |= NORM_LAST
        self.call.max_norm[0] = max_norm
        self.enqueue(prepared.norm.unscale, stream)
        return mark

    def launch_clip(
        self,
        prepared: Launches,
        *,
        coef: float | None = None,
        coef_ptr: int = 0,
        stream: Any = None,
    ) -> None:
        """Enqueue the clip: every element times `coef`, or the float64 at `coef_ptr`, or
        (neither given) the coefficient the last ``launch_norm`` on `prepared` left on
        the device; a coefficient of 1 costs the launches only."""
        if prepared.norm is None:
            raise RuntimeError("launch_clip() needs a launch_norm() on the same plan first")
        if coef is None and not coef_ptr:
            coef_ptr = prepared.norm.coef_ptr
        self.call.set_clip(coef, coef_ptr)
        self.enqueue(prepared.norm.clip, stream)

    def found(self, mark: int) -> bool:
        """Whether the call that used `mark` saw NaN/Inf (reads the flag: one synchronisation)."""
        return self.backend.read_word(self.flag) == mark

    def prepared(self, groups: Any) -> Launches:
        """``prepare(groups)``, cached by the groups' (code, addresses, counts) (LRU)."""
        groups = [(int(c), np.asarray(p, np.uint64), np.asarray(n, np.int64)) for c, p, n in groups]
        key = tuple((c, p.tobytes(), n.tobytes()) for c, p, n in groups)
        hit = self._cache.get(key)
        if hit is None:
            hit = self.prepare(groups)
            self._cache.put(key, hit)
        return hit

    def run(
        self,
        op: str,
        ptrs: Any,
        sizes: Any,
        codes: Any,
        found_ptr: int,
        inv_ptr: int = 0,
        stream: Any = None,
        *,
        inv: float = 1.0,
        mark: int = 1,
    ) -> int:
        """Launch `op` ("unscale" or "all_finite") over raw tables; returns launches made.

        `found_ptr` is the device address of a uint32 the kernels set to
        `mark` on a non-finite element; the inverse is `inv`, or the float64
        at `inv_ptr` when that is not 0.  Integer entries (code 0) are skipped.
        """
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; expected one of: {', '.join(OPS)}")
        groups: dict = {}
        for p, n, c in zip(ptrs, sizes, codes, strict=True):
            if int(c) == Code.INT:
                continue
            g = groups.setdefault(kernel_code(c), ([], []))
            g[0].append(int(p))
            g[1].append(int(n))
        count = 0
        for c, (gp, gs) in groups.items():
            prepared = self.prepared([(c, gp, gs)])
            self.launch(
                op,
                prepared,
                inv=inv,
                inv_ptr=inv_ptr,
                found_ptr=found_ptr,
                mark=mark,
                stream=stream,
            )
            count += prepared.count
        return count
