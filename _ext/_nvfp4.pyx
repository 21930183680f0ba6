# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: this module hands NumPy arrays to TransformerEngine v2.18's NVFP4
# recipe as lsc_nvfp4.h writes it: the quantize of one orientation (blocks
# of 16 along the rows or down the columns, or 16 x 16 tiles; the random
# Hadamard transform down the columns; stochastic rounding), the transform
# alone and its amax, and the scalar rules elementwise (for tests).  An
# input is read in place when its rows are evenly spaced with contiguous
# elements, else copied so; the GIL is released over the passes, which run
# on the package's thread pool.  It checks what keeps memory safe and names
# the arguments; the rules are lsc_nvfp4.h's and the slow twin is
# lscore/_reference_nvfp4.py.
include "_array_kernels.pxi"

from libc.stdint cimport uint64_t

import numpy as np


cdef extern from "lsc_nvfp4.h" nogil:
    ctypedef unsigned long long lsc_u64
    ctypedef unsigned short lsc_u16
    ctypedef struct lsc_nv4_rule:
        float amax, senc, sdec, mult
        int axis, tile, rht, sr
        uint32_t key[2]
        uint32_t ofs[2]
        int64_t rows, cols
    ctypedef struct lsc_nv4_isa:
        const char *name
    enum:
        LSC_NISAS
        LSC_NV4_JOB_ROWS
        LSC_NV4_JOB_BANDS
        LSC_NV4_JOB_RHT
    int lsc_isa_supported(int level)
    const char *lsc_isa_names[]
    int lsc_nv4_isa_select(const char *name)
    const lsc_nv4_isa *lsc_nv4_isa_get()
    void lsc_nv4_prepare(lsc_nv4_rule *k)
    uint32_t lsc_nv4_job_run(int kind, const char *x, int64_t rows, int64_t cols, int64_t rs,
                             int code, const lsc_nv4_rule *k, unsigned char *s,
                             unsigned char *q, lsc_u16 *out, lsc_for_fn for_fn, int threads)
    void lsc_nv4_draw(lsc_u64 sub, uint32_t o0, uint32_t o1, uint32_t k0, uint32_t k1,
                      uint32_t out[4])
    void lsc_philox10(const uint32_t c[4], uint32_t k0, uint32_t k1, uint32_t out[4])
    uint32_t lsc_nv4_rn(float v)
    uint32_t lsc_nv4_sr(float v, uint32_t r)
    float lsc_nv4_senc(float amax)
    float lsc_nv4_mult(float senc)
    uint32_t lsc_nv4_sf(float amax_b, float mult)
    float lsc_nv4_enc(uint32_t sf, float sdec)
    float lsc_nv4_dec(uint32_t sf, float amax)
    float lsc_f32_from_bits(uint32_t w)
    uint32_t lsc_f32_bits(float f)

_U64 = 2**64


cdef int _code(cnp.ndarray a) except -1:
    """The dtype code of a float32 / float16 / bfloat16 input (TypeError otherwise)."""
    if a.dtype.isnative:
        if a.dtype == np.float32:
            return LSC_CODE_F32
        if a.dtype == np.float16:
            return LSC_CODE_F16
        if a.dtype.name == "bfloat16":
            return LSC_CODE_BF16
    raise TypeError(f"x must be float32, float16 or bfloat16 in native byte order, got {a.dtype}")


cdef cnp.ndarray _rows_view(cnp.ndarray a, int64_t cols):
    """a as rows of `cols` contiguous elements evenly spaced: a view when it is one, else a
    C-contiguous copy."""
    if a.ndim >= 1 and a.strides[a.ndim - 1] == a.itemsize:
        try:
            v = a.reshape(-1, cols)
            if not v.flags.owndata:
                return v
        except ValueError:
            pass
    return np.ascontiguousarray(a).reshape(-1, cols)


cdef uint64_t _word64(object v, str what) except? 0:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < _U64:
        raise ValueError(f"{what} must be an integer from 0 to 2**64 - 1, got {v!r}")
    return <uint64_t>int(v)


def shapes(tuple shape, int axis=-1, bint tile=False, bint rht=False, bint sr=False,
           str dtype="float32"):
    """(scales' shape, codes' shape) of an input of `shape` (and `dtype`, a name) quantized
    with these options: blocks of 16 as ``block_shapes`` gives them, or 16 x 16 tiles
    of a 2-D input (scales (rows / 16, cols / 16)).  ValueError naming what does not fit:
    the Hadamard transform takes bfloat16 down the columns, tiles no stochastic rounding."""
    s, q = block_shapes(shape, 16, axis, True)
    if rht and (axis != 0 or tile or dtype != "bfloat16"):
        raise ValueError("the Hadamard transform runs down the columns (axis 0, no tiles) of "
                         f"bfloat16 input, got axis {axis}, tile {tile}, {dtype}")
    if sr and tile:
        raise ValueError("stochastic rounding is not one of the 16 x 16 tiles' (weights')")
    if not tile:
        return s, q
    if len(shape) != 2 or shape[0] % 16 or shape[1] % 16:
        raise ValueError(f"16 x 16 tiles need a 2-D input whose axes are multiples of 16, "
                         f"got shape {shape}")
    return (shape[0] // 16, shape[1] // 16), q


cdef cnp.ndarray _into(object given, tuple shape, str what):
    """A new uint8 array of `shape`, or `given` checked (writable, C-contiguous, 1-byte
    codes of that shape) as a uint8 view."""
    if given is None:
        return np.empty(shape, np.uint8)
    if not (isinstance(given, np.ndarray) and given.dtype.itemsize == 1 and given.shape == shape
            and given.flags.c_contiguous and given.flags.writeable):
        raise ValueError(f"out {what} must be a writable C-contiguous array of 1-byte codes of "
                         f"shape {shape}, got {given!r:.80}")
    return given.view(np.uint8)


def quantize(x, float amax, *, int axis=-1, bint tile=False, bint rht=False, seed=None,
             offset=0, out=None, int threads=0):
    """TE v2.18's NVFP4 quantize of `x` in one orientation with the global amax `amax`:
    (E4M3 scale codes, packed E2M1 codes), uint8, shaped as ``shapes`` says.

    axis -1: blocks of 16 along the last axis (x's leading axes as rows); axis 0: down the
    columns of a 2-D x (TE's columnwise copy); tile: 16 x 16 tiles of a 2-D x, codes as the
    axis's; rht (axis 0, bfloat16 x): the Hadamard transform down the columns first; seed
    (0 .. 2**64 - 1, or None: round to nearest) and offset: stochastic rounding with
    lsc_nvfp4.h's draws; out: (scales, data) to write and return.  threads: 0 by the size,
    1 serial, k at most k (the same bytes)."""
    cdef cnp.ndarray a = np.asarray(x)
    cdef int code = _code(a)
    shape = tuple((<object>a).shape)
    sshape, qshape = shapes(shape, axis, tile, rht, seed is not None, a.dtype.name)
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    cdef int64_t cols = shape[len(shape) - 1]
    cdef cnp.ndarray v = _rows_view(a, cols)
    cdef int64_t rows = v.shape[0], rs = v.strides[0]
    cdef lsc_nv4_rule k
    k.amax = amax
    k.axis, k.tile, k.rht, k.sr = axis, tile, rht, seed is not None
    cdef uint64_t sd = _word64(seed if seed is not None else 0, "seed")
    cdef uint64_t of = _word64(offset, "offset")
    k.key[0], k.key[1] = <uint32_t>sd, <uint32_t>(sd >> 32)
    k.ofs[0], k.ofs[1] = <uint32_t>of, <uint32_t>(of >> 32)
    k.rows, k.cols = rows, cols
    lsc_nv4_prepare(&k)
    if out is not None and not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError(f"out must be a tuple (scales, data), got {type(out).__name__}")
    s = _into(out[0] if out else None, sshape, "scales")
    q = _into(out[1] if out else None, qshape, "data")
    cdef unsigned char *sp = <unsigned char *>cnp.PyArray_DATA(s)
    cdef unsigned char *qp = <unsigned char *>cnp.PyArray_DATA(q)
    cdef const char *xp = <const char *>cnp.PyArray_DATA(v)
    cdef int kind = LSC_NV4_JOB_BANDS if axis == 0 or tile else LSC_NV4_JOB_ROWS
    with nogil:
        lsc_nv4_job_run(kind, xp, rows, cols, rs, code, &k, sp, qp, NULL, pool_for, threads)
    return out if out is not None else (s, q)


cdef cnp.ndarray _bf16_2d(x):
    cdef cnp.ndarray a = np.asarray(x)
    if a.ndim != 2 or _code(a) != LSC_CODE_BF16:
        raise ValueError(f"x must be a 2-D bfloat16 array, got {a.dtype} of shape {np.shape(a)}")
    if a.shape[0] % 16:
        raise ValueError(f"the first axis must be a multiple of 16, got shape {np.shape(a)}")
    return _rows_view(a, a.shape[1])


def hadamard16(x, int threads=0):
    """The random Hadamard transform of a 2-D bfloat16 `x` down its columns (16 rows at a
    time): its bfloat16 words (uint16, x's shape)."""
    cdef cnp.ndarray v = _bf16_2d(x)
    out = np.empty((v.shape[0], v.shape[1]), np.uint16)
    cdef lsc_u16 *op = <lsc_u16 *>cnp.PyArray_DATA(out)
    cdef const char *xp = <const char *>cnp.PyArray_DATA(v)
    cdef int64_t rows = v.shape[0], cols = v.shape[1], rs = v.strides[0]
    with nogil:
        lsc_nv4_job_run(LSC_NV4_JOB_RHT, xp, rows, cols, rs, LSC_CODE_BF16, NULL, NULL, NULL,
                        op, pool_for, threads)
    return out


def hadamard16_amax(x, int threads=0):
    """The amax of ``hadamard16(x)``'s values, NaN left out (TE's columnwise amax)."""
    cdef cnp.ndarray v = _bf16_2d(x)
    cdef const char *xp = <const char *>cnp.PyArray_DATA(v)
    cdef int64_t rows = v.shape[0], cols = v.shape[1], rs = v.strides[0]
    cdef uint32_t m
    with nogil:
        m = lsc_nv4_job_run(LSC_NV4_JOB_RHT, xp, rows, cols, rs, LSC_CODE_BF16, NULL, NULL,
                            NULL, NULL, pool_for, threads)
    return lsc_f32_from_bits(m)


# ---- the scalar rules, elementwise (tests, the bench, the decode) ---------------------

def philox4x32_10(counters, key):
    """Philox4x32-10 of each counter (uint32, shape (..., 4)) under `key` (two uint32 words,
    low first): uint32 of the same shape."""
    cdef const uint32_t[:, ::1] c = np.ascontiguousarray(counters, np.uint32).reshape(-1, 4)
    kw = np.asarray(key, np.uint32).reshape(2)
    out = np.empty((c.shape[0], 4), np.uint32)
    cdef uint32_t[:, ::1] o = out
    cdef Py_ssize_t i
    for i in range(c.shape[0]):
        lsc_philox10(&c[i, 0], kw[0], kw[1], &o[i, 0])
    return out.reshape(np.shape(counters))


def draws(subsequences, seed, offset):
    """The four words of the draw of each subsequence (uint64) at `offset` with `seed`:
    uint32, shape (n, 4)."""
    cdef const uint64_t[::1] sub = np.ascontiguousarray(subsequences, np.uint64).ravel()
    cdef uint64_t sd = _word64(seed, "seed"), of = _word64(offset, "offset")
    out = np.empty((sub.shape[0], 4), np.uint32)
    cdef uint32_t[:, ::1] o = out
    cdef Py_ssize_t i
    for i in range(sub.shape[0]):
        lsc_nv4_draw(sub[i], <uint32_t>of, <uint32_t>(of >> 32), <uint32_t>sd,
                     <uint32_t>(sd >> 32), &o[i, 0])
    return out


def e2m1_satfinite(v):
    """The E2M1 code of each float32 (one per byte): TE's cvt.rn.satfinite, NaN +6."""
    cdef const float[::1] f = np.ascontiguousarray(v, np.float32).ravel()
    out = np.empty(f.shape[0], np.uint8)
    cdef unsigned char[::1] o = out
    cdef Py_ssize_t i
    for i in range(f.shape[0]):
        o[i] = lsc_nv4_rn(f[i])
    return out.reshape(np.shape(v))


def e2m1_stochastic(v, r):
    """The E2M1 code of each float32 stochastically rounded with its random byte r."""
    cdef const float[::1] f = np.ascontiguousarray(v, np.float32).ravel()
    cdef const unsigned char[::1] b = np.ascontiguousarray(
        np.broadcast_to(np.asarray(r, np.uint8), np.shape(v))).ravel()
    out = np.empty(f.shape[0], np.uint8)
    cdef unsigned char[::1] o = out
    cdef Py_ssize_t i
    for i in range(f.shape[0]):
        o[i] = lsc_nv4_sr(f[i], b[i])
    return out.reshape(np.shape(v))


def scales(float amax):
    """(S_enc, S_dec, mult) of a global amax, float32 values as floats."""
    cdef float senc = lsc_nv4_senc(amax)
    return senc, <float>(1.0 / senc), lsc_nv4_mult(senc)


def block_scale(amax_b, float amax):
    """(E4M3 code, element factor) of each block amax (float32) under the global amax."""
    cdef const float[::1] m = np.ascontiguousarray(amax_b, np.float32).ravel()
    cdef float senc = lsc_nv4_senc(amax)
    cdef float mult = lsc_nv4_mult(senc), sdec = 1.0 / senc
    sf = np.empty(m.shape[0], np.uint8)
    enc = np.empty(m.shape[0], np.float32)
    cdef unsigned char[::1] s = sf
    cdef float[::1] e = enc
    cdef Py_ssize_t i
    for i in range(m.shape[0]):
        s[i] = lsc_nv4_sf(m[i], mult)
        e[i] = lsc_nv4_enc(s[i], sdec)
    return sf.reshape(np.shape(amax_b)), enc.reshape(np.shape(amax_b))


def decode_scale(sf, float amax):
    """The decode scale of each E4M3 code: (float(sf) * amax) * float32(1 / 2688)."""
    cdef const unsigned char[::1] c = np.ascontiguousarray(np.asarray(sf).view(np.uint8)).ravel()
    out = np.empty(c.shape[0], np.float32)
    cdef float[::1] o = out
    cdef Py_ssize_t i
    for i in range(c.shape[0]):
        o[i] = lsc_nv4_dec(c[i], amax)
    return out.reshape(np.shape(sf))


# ---- ISA level, for tests and `lscore bench` --------------------------------

def isa():
    """The ISA level the passes run at ("v2", "v3", "v4" or "baseline")."""
    return lsc_nv4_isa_get().name.decode()


def set_isa(name):
    """Run the passes at ISA level `name` ("" = the best this CPU runs); returns the old."""
    old = isa()
    if lsc_nv4_isa_select(name.encode()) != 0:
        levels = [lsc_isa_names[j].decode() for j in range(LSC_NISAS) if lsc_isa_supported(j)]
        raise ValueError(f"ISA level {name!r} is not available here; expected one of: "
                         + ", ".join(levels))
    return old
