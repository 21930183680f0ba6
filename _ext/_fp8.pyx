# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: this module hands NumPy arrays to the float8 conversion of
# lsc_fp8.h: the scaled cast of a float32 / float16 / bfloat16 array into
# float8 codes, which also returns the input's amax, and the widening of
# codes back.  An input may be strided and N-d: it is read in place, one
# line along its last axis at a time (a contiguous array is one line), and
# the output is a C-contiguous array of the same shape.  It checks only
# what keeps memory safe (dtypes, shapes, a writable output); the
# parameters' meaning is lsc_fp8.h's, and the slow twin of both functions
# is lscore/_reference_fp8.py (fp8_cast, fp8_decode).
cimport numpy as cnp
from libc.stdint cimport int64_t, uint32_t

from _dtypes cimport *

import os

cnp.import_array()

cdef extern from "numpy/ndarraytypes.h":
    enum:
        NPY_HALF
        NPY_USERDEF

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
    uint32_t lsc_fp8_cast_run(const char *x, lsc_fp8_n n, lsc_fp8_n stride, int code,
                              unsigned char *q, float scale, int fmt, int flags)
    uint32_t lsc_fp8_amax_run(const char *x, lsc_fp8_n n, lsc_fp8_n stride, int code, int flags)
    void lsc_fp8_decode_run(const unsigned char *q, lsc_fp8_n n, lsc_fp8_n stride, int fmt,
                            char *out, int code, float scale)
    float lsc_fp8_amax(uint32_t m)

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


cdef inline void _lines(cnp.ndarray a, bint rows, lsc_fp8_n *n, lsc_fp8_n *stride,
                        lsc_fp8_n *lines) noexcept:
    """How `a` is read: `lines` runs of `n` elements `stride` bytes apart; with `rows`
    one run per row (along the last axis), else a C-contiguous array is one run."""
    cdef int nd = cnp.PyArray_NDIM(a), k
    if nd == 0 or (cnp.PyArray_IS_C_CONTIGUOUS(a) and not rows):
        n[0] = cnp.PyArray_SIZE(a)
        stride[0] = cnp.PyArray_ITEMSIZE(a)
        lines[0] = 1
    else:
        n[0] = cnp.PyArray_DIMS(a)[nd - 1]
        stride[0] = cnp.PyArray_STRIDES(a)[nd - 1]
        lines[0] = 1
        for k in range(nd - 1):
            lines[0] *= cnp.PyArray_DIMS(a)[k]


cdef inline const char *_line_start(cnp.ndarray a, bint rows, lsc_fp8_n line) noexcept:
    """The first element of line `line` (C order over every axis but the last)."""
    cdef int nd = cnp.PyArray_NDIM(a), k
    cdef const char *p = <const char *>cnp.PyArray_DATA(a)
    cdef cnp.npy_intp *shape = cnp.PyArray_DIMS(a)
    cdef cnp.npy_intp *strides = cnp.PyArray_STRIDES(a)
    if nd == 0 or (cnp.PyArray_IS_C_CONTIGUOUS(a) and not rows):
        return p
    for k in range(nd - 2, -1, -1):
        p += (line % shape[k]) * strides[k]
        line //= shape[k]
    return p


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
         bint nan_sign=True, bint amax_nan=False):
    """Write fp8(float32(x) * scale) into `out` (uint8 codes); return the amax of `x`.

    `scale` is rounded to float32 and the product rounded to float32 before
    it narrows.  saturate: overflow and +-Inf give +-the largest finite
    value (else e5m2 gives +-Inf, e4m3fn NaN); nan_sign: a NaN keeps its
    sign (0xFF), else it is always 0x7F; amax_nan: a NaN input makes the
    amax NaN, else NaN elements do not enter it.
    """
    cdef int f = _fmt_code(fmt), code = _float_code(x, "x")
    cdef int flags = _flags(saturate, nan_sign, amax_nan)
    cdef lsc_fp8_n n, stride, lines, i
    cdef unsigned char *q = <unsigned char *>cnp.PyArray_DATA(out)
    cdef const char *p
    cdef uint32_t m = 0, r
    _check_codes(out, f, "out")
    _check_out(x, out)
    _lines(x, False, &n, &stride, &lines)
    for i in range(lines):
        p = _line_start(x, False, i)
        with nogil:
            r = lsc_fp8_cast_run(p, n, stride, code, q + i * n, scale, f, flags)
        m = r if r > m else m
    return lsc_fp8_amax(m)


def cast_rows(cnp.ndarray x, cnp.ndarray out, cnp.ndarray scales, cnp.ndarray amaxes, str fmt,
              bint saturate=True, bint nan_sign=True, bint amax_nan=False):
    """The scaled cast of each row (along the last axis) with its own float32 scale.

    Row r of `x` (in C order over the other axes) is cast with `scales[r]`
    into the same row of `out` (uint8 codes, C-contiguous) and its amax is
    written to `amaxes[r]`; `scales` and `amaxes` are C-contiguous float32
    with one value per row.  The flags are `cast`'s.
    """
    cdef int f = _fmt_code(fmt), code = _float_code(x, "x")
    cdef int flags = _flags(saturate, nan_sign, amax_nan)
    cdef lsc_fp8_n n, stride, lines, i
    cdef unsigned char *q = <unsigned char *>cnp.PyArray_DATA(out)
    cdef const float *sc = <const float *>cnp.PyArray_DATA(scales)
    cdef float *am = <float *>cnp.PyArray_DATA(amaxes)
    cdef const char *p
    _check_codes(out, f, "out")
    _check_out(x, out)
    _check_rows(x, scales, "scales", False)
    _check_rows(x, amaxes, "amaxes", True)
    _lines(x, True, &n, &stride, &lines)
    for i in range(lines):
        p = _line_start(x, True, i)
        with nogil:
            am[i] = lsc_fp8_amax(lsc_fp8_cast_run(p, n, stride, code, q + i * n, sc[i], f, flags))


def amax(cnp.ndarray x, bint amax_nan=False):
    """``max |x|`` of a float32 / float16 / bfloat16 array as a float (0 when empty); NaN
    elements do not enter it, or, amax_nan, make it NaN."""
    cdef int code = _float_code(x, "x"), flags = LSC_FP8_AMAX_NAN if amax_nan else 0
    cdef lsc_fp8_n n, stride, lines, i
    cdef uint32_t m = 0, r
    cdef const char *p
    _lines(x, False, &n, &stride, &lines)
    for i in range(lines):
        p = _line_start(x, False, i)
        with nogil:
            r = lsc_fp8_amax_run(p, n, stride, code, flags)
        m = r if r > m else m
    return lsc_fp8_amax(m)


def amax_rows(cnp.ndarray x, cnp.ndarray amaxes, bint amax_nan=False):
    """The amax of each row (along the last axis) into `amaxes` (C-contiguous float32,
    one per row in C order); NaN as `amax`."""
    cdef int code = _float_code(x, "x"), flags = LSC_FP8_AMAX_NAN if amax_nan else 0
    cdef lsc_fp8_n n, stride, lines, i
    cdef float *am = <float *>cnp.PyArray_DATA(amaxes)
    cdef const char *p
    _check_rows(x, amaxes, "amaxes", True)
    _lines(x, True, &n, &stride, &lines)
    for i in range(lines):
        p = _line_start(x, True, i)
        with nogil:
            am[i] = lsc_fp8_amax(lsc_fp8_amax_run(p, n, stride, code, flags))


def decode(cnp.ndarray q, cnp.ndarray out, str fmt, float scale=1.0):
    """Widen the float8 codes `q` (uint8 or the format's dtype) into `out`, divided by `scale`.

    Each code widens to float32 exactly, is divided by float32 `scale` in
    float32 and rounds once to `out`'s dtype (float32, float16 or bfloat16).
    With scale 1 the values are exact and a NaN code gives float32
    0x7FF00000 (e4m3fn) or the float16 word code << 8, quieted (e5m2), with
    its sign; float16 0x7E00 with the sign, bfloat16 0x7FC0.
    """
    cdef int f = _fmt_code(fmt), code = _float_code(out, "out")
    cdef lsc_fp8_n n, stride, lines, i
    cdef char *o = <char *>cnp.PyArray_DATA(out)
    cdef int width = 4 if code == LSC_CODE_F32 else 2
    _check_codes(q, f, "q")
    _check_out(q, out)
    _lines(q, False, &n, &stride, &lines)
    cdef const unsigned char *p
    for i in range(lines):
        p = <const unsigned char *>_line_start(q, False, i)
        with nogil:
            lsc_fp8_decode_run(p, n, stride, f, o + i * n * width, code, scale)


def decode_rows(cnp.ndarray q, cnp.ndarray out, cnp.ndarray scales, str fmt):
    """`decode` with one float32 scale per row (along the last axis; `scales`
    C-contiguous float32, one per row in C order)."""
    cdef int f = _fmt_code(fmt), code = _float_code(out, "out")
    cdef lsc_fp8_n n, stride, lines, i
    cdef char *o = <char *>cnp.PyArray_DATA(out)
    cdef const float *sc = <const float *>cnp.PyArray_DATA(scales)
    cdef int width = 4 if code == LSC_CODE_F32 else 2
    cdef const unsigned char *p
    _check_codes(q, f, "q")
    _check_out(q, out)
    _check_rows(q, scales, "scales", False)
    _lines(q, True, &n, &stride, &lines)
    for i in range(lines):
        p = <const unsigned char *>_line_start(q, True, i)
        with nogil:
            lsc_fp8_decode_run(p, n, stride, f, o + i * n * width, code, sc[i])


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
