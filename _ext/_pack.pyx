# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: the multi-tensor launches of lscore.cuda, split and packed in C.
# - plan_launches: tensors (address, element count) -> launches of chunks.
# - pack_launches: every launch of a call's dtype groups written as the kernels'
#   argument structs (lsc_meta / lsc_opt_meta, passed by value), then the chunk.
# - launch_params: the void*[] cuLaunchKernel takes for each packed launch.
# The walk that groups the arrays (DeviceTable) is _walk.pyx; lscore.cuda.launch and
# lscore.cuda.optim call these through lscore.kernels.
cimport numpy as cnp
from libc.string cimport memcpy
from libc.stdint cimport int32_t, int64_t, uint16_t, uint64_t, uintptr_t

import numpy as np

cnp.import_array()


def plan_launches(ptrs, sizes, int64_t chunk, int64_t max_tensors, int64_t max_blocks):
    """Split tensors (device addresses, element counts) into launches of chunks.

    Each block of a launch handles one chunk of one tensor; a launch holds
    at most `max_tensors` tensors and `max_blocks` blocks, and a tensor
    that does not fit is continued in the next launch (as apex's
    multi_tensor_apply does).  Empty tensors get no block.  Returns
    (table, launches): the uint64 tables of every launch back to back, in
    the layout of _ext/scan.cu ([ptrs][sizes][tensor | chunk << 32 per
    block]), and (offset in words, ntensors, nblocks) per launch.
    """
    if chunk < 1 or max_tensors < 1 or max_blocks < 1:
        raise ValueError(f"chunk, max_tensors and max_blocks must be >= 1, got "
                         f"{chunk}, {max_tensors}, {max_blocks}")
    cdef cnp.ndarray pa = np.ascontiguousarray(ptrs, np.uint64)
    cdef cnp.ndarray sa = np.ascontiguousarray(sizes, np.int64)
    if pa.ndim != 1 or sa.ndim != 1 or pa.shape[0] != sa.shape[0]:
        raise ValueError("ptrs and sizes must be 1-D and of one length")
    cdef Py_ssize_t nt_all = pa.shape[0], t
    cdef uint64_t *P = <uint64_t *>cnp.PyArray_DATA(pa)
    cdef int64_t *S = <int64_t *>cnp.PyArray_DATA(sa)
    cdef int64_t blocks = 0, nch, c, take, n
    for t in range(nt_all):
        if S[t] < 0:
            raise ValueError(f"negative size {S[t]}")
        nch = (S[t] + chunk - 1) // chunk
        if nch >= (<int64_t>1 << 32):
            raise ValueError(f"a tensor of {S[t]} elements needs more than 2**32 chunks "
                             f"of {chunk}")
        blocks += nch
    # each launch adds at most one continued tensor: words <= 2 * (tensors + blocks) + blocks
    cdef cnp.ndarray out = np.empty(2 * (nt_all + blocks) + blocks, np.uint64)
    cdef uint64_t *T = <uint64_t *>cnp.PyArray_DATA(out)
    cdef int64_t cap_t = min(max_tensors, nt_all), cap_b = min(max_blocks, blocks)
    cdef cnp.ndarray cp = np.empty(max(cap_t, 1), np.uint64)
    cdef cnp.ndarray cs = np.empty(max(cap_t, 1), np.uint64)
    cdef cnp.ndarray cb = np.empty(max(cap_b, 1), np.uint64)
    cdef uint64_t *CP = <uint64_t *>cnp.PyArray_DATA(cp)
    cdef uint64_t *CS = <uint64_t *>cnp.PyArray_DATA(cs)
    cdef uint64_t *CB = <uint64_t *>cnp.PyArray_DATA(cb)
    cdef int64_t ncur = 0, nblk = 0, offset = 0, k
    launches = []
    for t in range(nt_all):
        n = S[t]
        nch = (n + chunk - 1) // chunk
        c = 0
        while c < nch:
            if ncur == max_tensors or nblk == max_blocks:
                offset = _flush(T, offset, CP, CS, CB, ncur, nblk, launches)
                ncur = nblk = 0
            take = min(nch - c, max_blocks - nblk)
            CP[ncur] = P[t]
            CS[ncur] = <uint64_t>n
            for k in range(take):
                CB[nblk + k] = <uint64_t>ncur | (<uint64_t>(c + k) << 32)
            ncur += 1
            nblk += take
            c += take
    if nblk:
        offset = _flush(T, offset, CP, CS, CB, ncur, nblk, launches)
    return out[:offset].copy(), launches


cdef int64_t _flush(uint64_t *T, int64_t offset, uint64_t *CP, uint64_t *CS, uint64_t *CB,
                    int64_t nt, int64_t nb, list launches) except -1:
    memcpy(T + offset, CP, nt * sizeof(uint64_t))
    memcpy(T + offset + nt, CS, nt * sizeof(uint64_t))
    memcpy(T + offset + 2 * nt, CB, nb * sizeof(uint64_t))
    launches.append((offset, nt, nb))
    return offset + 2 * nt + nb


# where pack_launches writes in a row: the struct, then the chunk
ctypedef struct lsc_pack_shape:
    Py_ssize_t width, depth_tensors      # addresses per record; the struct's tensor slots
    Py_ssize_t size_at, chunk_at, tensor_at, meta_size, row   # byte offsets, row size


def pack_launches(codes, counts, records, int64_t chunk, int64_t max_tensors,
                  int64_t max_blocks, int depth, int64_t meta_tensors, int64_t meta_blocks,
                  Py_ssize_t meta_size):
    """Pack tensors into the kernel arguments of chunked launches (multi-tensor apply).

    Tensor i has dtype code ``codes[i]``, ``counts[i]`` elements and the record
    ``records[i]`` of up to `depth` device addresses (a 1-D `records` is one
    address per tensor).  The tensors are grouped by code in first-seen order
    and each group split into launches as ``plan_launches`` splits it (a block
    per chunk of `chunk` elements, at most `max_tensors` tensors and
    `max_blocks` blocks per launch, a tensor continued in the next launch).
    Each launch's argument block is written as the kernels take it by value:
    the struct ``{u64 ptr[depth][meta_tensors]; i64 size[meta_tensors];
    i32 chunk_of[meta_blocks]; u16 tensor_of[meta_blocks]}`` (`meta_size`
    bytes: scan.cu's lsc_meta for depth 1, optim.cu's lsc_opt_meta), then the
    chunk as an int64.  Empty tensors get no block.

    Returns (arguments, specs): uint8 of shape (launches, meta_size + 8), one
    launch's block per row (unused slots zero), and [(code, blocks)] per launch.
    """
    cdef cnp.ndarray ca = np.ascontiguousarray(codes, np.int64)
    cdef cnp.ndarray na = np.ascontiguousarray(counts, np.int64)
    cdef cnp.ndarray ra = np.ascontiguousarray(records, np.uint64)
    if ca.ndim != 1 or na.ndim != 1 or ca.shape[0] != na.shape[0]:
        raise ValueError("codes and counts must be 1-D and of one length")
    cdef Py_ssize_t nt_all = ca.shape[0], width
    if ra.ndim == 1:
        width = 1
    elif ra.ndim == 2:
        width = ra.shape[1]
    else:
        raise ValueError("records must be 1-D or 2-D")
    if ra.shape[0] != nt_all:
        raise ValueError(f"{ra.shape[0]} records for {nt_all} tensors")
    if width > depth:
        raise ValueError(f"a record holds at most {depth} addresses, got {width}")
    if (chunk < 1 or max_tensors < 1 or max_blocks < 1 or depth < 1 or meta_tensors < 1
            or meta_blocks < 1):
        raise ValueError(f"chunk, max_tensors, max_blocks, depth, meta_tensors and "
                         f"meta_blocks must be >= 1, got {chunk}, {max_tensors}, "
                         f"{max_blocks}, {depth}, {meta_tensors}, {meta_blocks}")
    max_tensors = min(max_tensors, meta_tensors)
    max_blocks = min(max_blocks, meta_blocks)
    if meta_tensors > (1 << 16):
        raise ValueError(f"tensor_of is 16 bits: at most 65536 tensors per launch, got {meta_tensors}")
    if meta_size < (depth + 1) * 8 * meta_tensors + 6 * meta_blocks:
        raise ValueError(f"an argument struct of {meta_size} bytes cannot hold "
                         f"{meta_tensors} tensors and {meta_blocks} blocks")
    cdef int64_t *C = <int64_t *>cnp.PyArray_DATA(ca)
    cdef int64_t *N = <int64_t *>cnp.PyArray_DATA(na)
    cdef uint64_t *R = <uint64_t *>cnp.PyArray_DATA(ra)
    cdef Py_ssize_t t, g, ng = 0
    cdef int64_t n
    cdef int64_t gcode[64]
    # the groups, in first-seen order, and the checks
    for t in range(nt_all):
        n = N[t]
        if n < 0:
            raise ValueError(f"negative size {n}")
        if n and (n - 1) // chunk + 1 >= (<int64_t>1 << 31):
            raise ValueError(f"a tensor of {n} elements needs more than 2**31 chunks of {chunk}")
        g = 0
        while g < ng and gcode[g] != C[t]:
            g += 1
        if g == ng:
            if ng == 64:
                raise ValueError("more than 64 dtype codes in one list")
            gcode[ng] = C[t]
            ng += 1
    cdef lsc_pack_shape sh
    sh.width, sh.depth_tensors = width, meta_tensors
    sh.size_at = depth * 8 * meta_tensors
    sh.chunk_at = sh.size_at + 8 * meta_tensors
    sh.tensor_at = sh.chunk_at + 4 * meta_blocks
    sh.meta_size, sh.row = meta_size, meta_size + 8
    # one split, run twice: to count the launches, then to write them
    cdef Py_ssize_t nl = 0
    for g in range(ng):
        nl += _split_group(gcode[g], C, N, R, nt_all, chunk, max_tensors, max_blocks, &sh,
                           NULL, None)
    cdef cnp.ndarray out = np.zeros((nl, sh.row), np.uint8)
    cdef char *cur = <char *>cnp.PyArray_DATA(out)
    specs = []
    for g in range(ng):
        cur += sh.row * _split_group(gcode[g], C, N, R, nt_all, chunk, max_tensors,
                                     max_blocks, &sh, cur, specs)
    return out, specs


cdef Py_ssize_t _split_group(int64_t code, const int64_t *C, const int64_t *N,
                             const uint64_t *R, Py_ssize_t nt_all, int64_t chunk,
                             int64_t max_tensors, int64_t max_blocks,
                             const lsc_pack_shape *sh, char *cur, list specs) except -1:
    """Split the tensors of dtype `code` into launches (plan_launches' rule); returns how
    many.  With `cur` (the first of as many zeroed rows), each launch's struct and chunk
    are written into its row and (code, blocks) appended to `specs`; NULL only counts."""
    cdef Py_ssize_t t, d, nl = 0
    cdef int64_t n, nch, c, take, k, ncur = 0, nblk = 0
    cdef int32_t ci
    cdef uint16_t ti
    for t in range(nt_all):
        if C[t] != code:
            continue
        n = N[t]
        nch = (n - 1) // chunk + 1 if n else 0
        c = 0
        while c < nch:
            if ncur == max_tensors or nblk == max_blocks:
                _close_launch(code, nblk, chunk, sh, cur, specs)
                if cur != NULL:
                    cur += sh.row
                nl += 1
                ncur = nblk = 0
            take = min(nch - c, max_blocks - nblk)
            if cur != NULL:
                for d in range(sh.width):
                    memcpy(cur + 8 * (d * sh.depth_tensors + ncur), &R[t * sh.width + d], 8)
                memcpy(cur + sh.size_at + 8 * ncur, &n, 8)
                ti = <uint16_t>ncur
                for k in range(take):
                    ci = <int32_t>(c + k)
                    memcpy(cur + sh.chunk_at + 4 * (nblk + k), &ci, 4)
                    memcpy(cur + sh.tensor_at + 2 * (nblk + k), &ti, 2)
            ncur += 1
            nblk += take
            c += take
    if nblk:
        _close_launch(code, nblk, chunk, sh, cur, specs)
        nl += 1
    return nl


cdef int _close_launch(int64_t code, int64_t nblk, int64_t chunk, const lsc_pack_shape *sh,
                       char *cur, list specs) except -1:
    """A launch is full or its group ends: its chunk after the struct, and its spec."""
    if cur != NULL:
        memcpy(cur + sh.meta_size, &chunk, 8)
        specs.append((code, nblk))
    return 0


def launch_params(cnp.ndarray arguments, Py_ssize_t meta_size, uint64_t words,
                  Py_ssize_t nwords):
    """The ``void*[]`` of every launch ``pack_launches`` packed, as cuLaunchKernel takes it.

    Row k of the result (uint64, one row per row of `arguments`): the address
    of launch k's struct, of its chunk (`meta_size` bytes on), then `nwords`
    consecutive 8-byte words from address `words` (the per-call parameters
    every launch shares).  Returns (rows, address of the first row).
    """
    if arguments.ndim != 2 or arguments.dtype != np.uint8 or not arguments.flags.c_contiguous:
        raise ValueError("arguments must be pack_launches' uint8 matrix")
    if nwords < 0 or meta_size < 0 or meta_size + 8 > arguments.shape[1]:
        raise ValueError(f"bad meta_size {meta_size} or nwords {nwords}")
    cdef Py_ssize_t nl = arguments.shape[0], row = arguments.shape[1], k, j
    cdef Py_ssize_t width = 2 + nwords
    cdef cnp.ndarray out = np.empty((nl, width), np.uint64)
    cdef uint64_t *O = <uint64_t *>cnp.PyArray_DATA(out)
    cdef uint64_t base = <uint64_t><uintptr_t>cnp.PyArray_DATA(arguments)
    for k in range(nl):
        O[k * width] = base + <uint64_t>(k * row)
        O[k * width + 1] = base + <uint64_t>(k * row + meta_size)
        for j in range(nwords):
            O[k * width + 2 + j] = words + <uint64_t>(8 * j)
    return out, <uint64_t><uintptr_t>cnp.PyArray_DATA(out)
