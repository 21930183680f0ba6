# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: this module hands NumPy arrays to the float8 conversion of
# lsc_fp8.h: the scaled cast of a float32 / float16 / bfloat16 array into
# float8 codes, which also returns the input's amax, and the widening of
# codes back.  An input may be strided and N-d: it is read in place, one
# line along its last axis at a time (a contiguous array is one line), and
# the output is a C-contiguous array of the same shape.  A call is one job
# of lsc_fp8.h, cut in chunks and run on the package's one thread pool
# (the scan's, reached through _pool_for.pxd) when it is large enough; the
# bytes and amaxes are the same with any number of threads.  It checks only
# what keeps memory safe (dtypes, shapes, a writable output); the
# parameters' meaning is lsc_fp8.h's, and the slow twin of both functions
# is lscore/_reference_fp8.py (fp8_cast, fp8_decode).
include "_array_kernels.pxi"

import os

cdef extern from "lsc_fp8.h" nogil:
    enum:
        LSC_FP8_SAT
        LSC_FP8_NAN_SIGN
        LSC_FP8_AMAX_NAN
    ctypedef int64_t lsc_fp8_n
    ctypedef struct lsc_fp8_isa:
        const char *name
    enum:
        LSC_NISAS
    int lsc_isa_supported(int level)
    const char *lsc_isa_names[]
    int lsc_fp8_isa_select(const char *name)
    const lsc_fp8_isa *lsc_fp8_isa_get()
    float lsc_fp8_amax(uint32_t m)
    enum:
        LSC_JOB_CHUNK_ELEMS
        LSC_FP8_JOB_CAST
        LSC_FP8_JOB_AMAX
        LSC_FP8_JOB_DECODE
    ctypedef struct lsc_fp8_job:
        int kind
        const char *src
        int outer
        const cnp.npy_intp *shape
        const cnp.npy_intp *strides
        lsc_fp8_n n, stride, lines
        char *dst
        int code, fmt, flags
        float scale
        const float *scales
        float *amaxes
    int lsc_fp8_job_run(lsc_fp8_job *j, lsc_for_fn for_fn, int threads, uint32_t *amax)

# elements per chunk of a job (for tests: where the chunk edges lie)
_CHUNK_ELEMS = LSC_JOB_CHUNK_ELEMS

#: float8 format name -> its dtype code (lsc_codes.h)
FORMATS = {"float8_e4m3fn": LSC_CODE_E4M3FN, "float8_e5m2": LSC_CODE_E5M2}
#: the flag bits of the device kernels' `flags` argument (fp8.cu): the rules of lsc_fp8.h
SAT = LSC_FP8_SAT
NAN_SIGN = LSC_FP8_NAN_SIGN
AMAX_NAN = LSC_FP8_AMAX_NAN


cdef int _fmt_code(str fmt) except -1:
    code = FORMATS.get(fmt)
    if code is None:
        raise ValueError(f"unknown float8 format {fmt!r}; expected one of: "
                         + ", ".join(FORMATS))
    return code


# dtype -> name of the user-defined dtypes seen (ml_dtypes'): NumPy computes
# dtype.name in Python, microseconds on every call
_names = {}


cdef bint _is_named(cnp.ndarray a, str name) except -1:
    dt = a.dtype
    got = _names.get(dt)
    if got is None:
        got = _names[dt] = dt.name
    return got == name


cdef int _float_code(cnp.ndarray a, str what) except -1:
    cdef int t = cnp.PyArray_TYPE(a)
    if cnp.PyArray_ISBYTESWAPPED(a):
        raise ValueError(f"{what} must be in native byte order, got {a.dtype.str}")
    if t == cnp.NPY_FLOAT:
        return LSC_CODE_F32
    if t == NPY_HALF:
        return LSC_CODE_F16
    if t >= NPY_USERDEF and _is_named(a, "bfloat16"):
        return LSC_CODE_BF16
    raise TypeError(f"{what} must be float32, float16 or bfloat16, got {a.dtype}")


cdef int _check_codes(cnp.ndarray q, int fmt, str what) except -1:
    if cnp.PyArray_TYPE(q) == cnp.NPY_UINT8:
        return 0
    if cnp.PyArray_TYPE(q) < NPY_USERDEF or FORMATS.get(_names.get(q.dtype) or q.dtype.name) != fmt:
        raise TypeError(f"{what} must be uint8 or the format's float8 dtype, got {q.dtype}")
    return 0


cdef int _check_out(cnp.ndarray src, cnp.ndarray out) except -1:
    if not cnp.PyArray_IS_C_CONTIGUOUS(out) or not cnp.PyArray_ISWRITEABLE(out):
        raise ValueError("out must be a writable C-contiguous array")
    cdef tuple want = (<object>src).shape, got = (<object>out).shape
    if got != want:
        raise ValueError(f"out must have the input's shape {want}, got {got}")
    return 0


cdef inline void _job_init(lsc_fp8_job *j, int kind, cnp.ndarray a, bint rows, char *dst,
                           int code, int fmt, int flags) noexcept:
    """A job over `a`, read as lines of `n` elements `stride` bytes apart: with `rows` one
    line per row (along the last axis, the other axes in C order), else a C-contiguous array
    is one line."""
    cdef int nd = cnp.PyArray_NDIM(a), k
    j.kind = kind
    j.src = <const char *>cnp.PyArray_DATA(a)
    j.dst = dst
    j.code = code
    j.fmt = fmt
    j.flags = flags
    j.scale = 1.0
    j.scales = NULL
    j.amaxes = NULL
    j.shape = cnp.PyArray_DIMS(a)
    j.strides = cnp.PyArray_STRIDES(a)
    if nd == 0 or (cnp.PyArray_IS_C_CONTIGUOUS(a) and not rows):
        j.outer = 0
        j.n = cnp.PyArray_SIZE(a)
        j.stride = cnp.PyArray_ITEMSIZE(a)
        j.lines = 1
    else:
        j.outer = nd - 1
        j.n = cnp.PyArray_DIMS(a)[nd - 1]
        j.stride = cnp.PyArray_STRIDES(a)[nd - 1]
        j.lines = 1
        for k in range(nd - 1):
            j.lines *= cnp.PyArray_DIMS(a)[k]


cdef uint32_t _run(lsc_fp8_job *j, int threads) except? 0xFFFFFFFF:
    """Run the job on at most `threads` threads (0: by its size); its amax bits."""
    cdef uint32_t m = 0
    cdef int rc
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    with nogil:
        rc = lsc_fp8_job_run(j, pool_for, threads, &m)
    if rc != 0:
        raise MemoryError()
    return m


cdef inline int _flags(bint saturate, bint nan_sign, bint amax_nan) noexcept:
    return ((LSC_FP8_SAT if saturate else 0) | (LSC_FP8_NAN_SIGN if nan_sign else 0)
            | (LSC_FP8_AMAX_NAN if amax_nan else 0))


cdef lsc_fp8_n _check_rows(cnp.ndarray x, cnp.ndarray v, str what, bint write) except -1:
    """v must be a C-contiguous float32 vector of one value per row of x."""
    cdef int nd = cnp.PyArray_NDIM(x), k
    cdef lsc_fp8_n rows = 1
    if nd == 0:
        raise ValueError("a row-wise call needs an array of at least one dimension, got a scalar")
    for k in range(nd - 1):
        rows *= cnp.PyArray_DIMS(x)[k]
    if cnp.PyArray_TYPE(v) != cnp.NPY_FLOAT or not cnp.PyArray_IS_C_CONTIGUOUS(v):
        raise TypeError(f"{what} must be a C-contiguous float32 array, got {v.dtype}")
    if cnp.PyArray_SIZE(v) != rows:
        raise ValueError(f"{what} must hold one value per row ({rows}), got {v.size}")
    if write and not cnp.PyArray_ISWRITEABLE(v):
        raise ValueError(f"{what} must be writable")
    return rows


def cast(cnp.ndarray x, cnp.ndarray out, float scale, str fmt, bint saturate=True,
         bint nan_sign=True, bint amax_nan=False, int threads=0):
    """Write fp8(float32(x) * scale) into `out` (uint8 codes); return the amax of `x`.

    `scale` is rounded to float32 and the product rounded to float32 before
    it narrows.  saturate: overflow and +-Inf give +-the largest finite
    value (else e5m2 gives +-Inf, e4m3fn NaN); nan_sign: a NaN keeps its
    sign (0xFF), else it is always 0x7F; amax_nan: a NaN input makes the
    amax NaN, else NaN elements do not enter it.  threads: 0 picks by the
    size, 1 is serial, k uses at most k threads (the same bits with any).
    """
    cdef int f = _fmt_code(fmt), code = _float_code(x, "x")
    cdef lsc_fp8_job j
    _check_codes(out, f, "out")
    _check_out(x, out)
    _job_init(&j, LSC_FP8_JOB_CAST, x, False, <char *>cnp.PyArray_DATA(out), code, f,
              _flags(saturate, nan_sign, amax_nan))
    j.scale = scale
    return lsc_fp8_amax(_run(&j, threads))


def cast_rows(cnp.ndarray x, cnp.ndarray out, cnp.ndarray scales, cnp.ndarray amaxes, str fmt,
              bint saturate=True, bint nan_sign=True, bint amax_nan=False, int threads=0):
    """The scaled cast of each row (along the last axis) with its own float32 scale.

    Row r of `x` (in C order over the other axes) is cast with `scales[r]`
    into the same row of `out` (uint8 codes, C-contiguous) and its amax is
    written to `amaxes[r]`; `scales` and `amaxes` are C-contiguous float32
    with one value per row.  The flags and threads are `cast`'s.
    """
    cdef int f = _fmt_code(fmt), code = _float_code(x, "x")
    cdef lsc_fp8_job j
    _check_codes(out, f, "out")
    _check_out(x, out)
    _check_rows(x, scales, "scales", False)
    _check_rows(x, amaxes, "amaxes", True)
    _job_init(&j, LSC_FP8_JOB_CAST, x, True, <char *>cnp.PyArray_DATA(out), code, f,
              _flags(saturate, nan_sign, amax_nan))
    j.scales = <const float *>cnp.PyArray_DATA(scales)
    j.amaxes = <float *>cnp.PyArray_DATA(amaxes)
    _run(&j, threads)


def amax(cnp.ndarray x, bint amax_nan=False, int threads=0):
    """``max |x|`` of a float32 / float16 / bfloat16 array as a float (0 when empty); NaN
    elements do not enter it, or, amax_nan, make it NaN.  threads: `cast`'s."""
    cdef lsc_fp8_job j
    _job_init(&j, LSC_FP8_JOB_AMAX, x, False, NULL, _float_code(x, "x"), 0,
              LSC_FP8_AMAX_NAN if amax_nan else 0)
    return lsc_fp8_amax(_run(&j, threads))


def amax_rows(cnp.ndarray x, cnp.ndarray amaxes, bint amax_nan=False, int threads=0):
    """The amax of each row (along the last axis) into `amaxes` (C-contiguous float32,
    one per row in C order); NaN and threads as `amax`."""
    cdef lsc_fp8_job j
    cdef int code = _float_code(x, "x")
    _check_rows(x, amaxes, "amaxes", True)
    _job_init(&j, LSC_FP8_JOB_AMAX, x, True, NULL, code, 0, LSC_FP8_AMAX_NAN if amax_nan else 0)
    j.amaxes = <float *>cnp.PyArray_DATA(amaxes)
    _run(&j, threads)


def decode(cnp.ndarray q, cnp.ndarray out, str fmt, float scale=1.0, int threads=0):
    """Widen the float8 codes `q` (uint8 or the format's dtype) into `out`, divided by `scale`.

    Each code widens to float32 exactly, is divided by float32 `scale` in
    float32 and rounds once to `out`'s dtype (float32, float16 or bfloat16).
    With scale 1 the values are exact and a NaN code gives float32
    0x7FF00000 (e4m3fn) or the float16 word code << 8, quieted (e5m2), with
    its sign; float16 0x7E00 with the sign, bfloat16 0x7FC0.  threads:
    `cast`'s.
    """
    cdef int f = _fmt_code(fmt), code = _float_code(out, "out")
    cdef lsc_fp8_job j
    _check_codes(q, f, "q")
    _check_out(q, out)
    _job_init(&j, LSC_FP8_JOB_DECODE, q, False, <char *>cnp.PyArray_DATA(out), code, f, 0)
    j.scale = scale
    _run(&j, threads)


def decode_rows(cnp.ndarray q, cnp.ndarray out, cnp.ndarray scales, str fmt, int threads=0):
    """`decode` with one float32 scale per row (along the last axis; `scales`
    C-contiguous float32, one per row in C order)."""
    cdef int f = _fmt_code(fmt), code = _float_code(out, "out")
    cdef lsc_fp8_job j
    _check_codes(q, f, "q")
    _check_out(q, out)
    _check_rows(q, scales, "scales", False)
    _job_init(&j, LSC_FP8_JOB_DECODE, q, True, <char *>cnp.PyArray_DATA(out), code, f, 0)
    j.scales = <const float *>cnp.PyArray_DATA(scales)
    _run(&j, threads)


# ---- ISA level, for tests and `lscore bench` --------------------------------

def isa():
    """The ISA level the contiguous kernels run at ("v2", "v3", "v4" or "baseline")."""
    return lsc_fp8_isa_get().name.decode()


def isa_levels():
    """The ISA levels this CPU can run, slowest first."""
    return [lsc_isa_names[k].decode() for k in range(LSC_NISAS) if lsc_isa_supported(k)]


def set_isa(name):
    """Run the kernels at ISA level `name` ("" = the best this CPU runs); returns the old level."""
    old = isa()
    if lsc_fp8_isa_select(name.encode()) != 0:
        raise ValueError(f"ISA level {name!r} is not available here; expected one of: "
                         + ", ".join(isa_levels()))
    return old


_env_isa = os.environ.get("LSCORE_ISA", "")
if _env_isa:
    try:
        set_isa(_env_isa)
    except ValueError:
        pass   # an unknown level in the environment leaves the automatic choice
