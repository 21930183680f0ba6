# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: this module turns NumPy arrays into raw buffers and scans them.
# Its visitor of the one walk (_walker.pxd) reads each array of a (nested)
# list/tuple/dict through NumPy's C API into a table of
# (pointer, count, stride, format code, byte order);
# validates the whole input first (a failed call writes nothing), then runs
# the table through lsc_pool.h (the kernels of lsc_scan.h, on helper threads
# too for large inputs), releasing the GIL for large inputs.  It knows
# NumPy arrays and raw pointers only; frameworks reach it through adapters,
# which hand over pointers (all_finite_raw / unscale_raw).  The slow twin of
# every function here is lscore/_reference.py.
cimport numpy as cnp
from cpython.ref cimport PyObject, PyTypeObject, Py_INCREF, Py_DECREF, Py_TYPE
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.stdint cimport int64_t, uint64_t
from libc.math cimport isfinite, sqrt
from libc.string cimport memcpy, memset
from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM
from cpython.pycapsule cimport PyCapsule_New

from _dtypes cimport *
from _lsc_pool cimport *
from _walker cimport visitor, walk
from _scantable cimport *

import os

import numpy as np

cnp.import_array()

# Inputs with more bytes than this release the GIL while scanning.
DEF NOGIL_BYTES = 262144

SUPPORTED = ("float16, bfloat16, float32, float64, float8_e4m3fn, float8_e5m2 "
             "(integer and bool arrays count as finite)")

_NAMED_CODES = {
    "bfloat16": LSC_CODE_BF16,
    "float8_e4m3fn": LSC_CODE_E4M3FN,
    "float8_e5m2": LSC_CODE_E5M2,
    "int4": LSC_CODE_INT, "uint4": LSC_CODE_INT,
    "int2": LSC_CODE_INT, "uint2": LSC_CODE_INT,
}
cdef dict _user_codes = {}


cdef int _user_dtype_code(cnp.dtype d) except -1:
    code = _user_codes.get(d)
    if code is None:
        code = _NAMED_CODES.get(d.name)
        if code is None:
            raise TypeError(f"unsupported dtype {d.name}; expected {SUPPORTED}")
        _user_codes[d] = code
    return code


cdef inline int _dtype_code(cnp.ndarray a) except -1:
    cdef int t = cnp.PyArray_TYPE(a)
    if t == cnp.NPY_FLOAT:
        return LSC_CODE_F32
    if t == NPY_HALF:
        return LSC_CODE_F16
    if t == cnp.NPY_DOUBLE:
        return LSC_CODE_F64
    if t <= cnp.NPY_ULONGLONG:          # bool and every integer type
        return LSC_CODE_INT
    if t >= NPY_USERDEF:
        return _user_dtype_code(<cnp.dtype><object>cnp.PyArray_DESCR(a))
    raise TypeError(f"unsupported dtype {a.dtype}; expected {SUPPORTED}")


cdef int _add_array(table_t *t, cnp.ndarray a) except -1:
    cdef int code = _dtype_code(a)
    cdef int flags = cnp.PyArray_FLAGS(a)
    cdef int nd = cnp.PyArray_NDIM(a), k, big = 0, bigk = 0
    cdef cnp.npy_intp *shape = cnp.PyArray_DIMS(a)
    cdef cnp.npy_intp *st
    cdef lsc_n n = 1
    cdef lsc_run *e
    cdef size_t lo, hi
    cdef bint one_segment = (flags & (cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_F_CONTIGUOUS)) != 0
    for k in range(nd):
        n *= shape[k]
    if t.write and code != LSC_CODE_INT:
        if not (flags & cnp.NPY_ARRAY_WRITEABLE):
            raise ValueError(f"unscale_ needs writable arrays; array {t.count} "
                             "(in flattened order) is read-only")
        if code == LSC_CODE_E4M3FN or code == LSC_CODE_E5M2:
            raise TypeError(f"unscale_ does not support {a.dtype}; expected float16, "
                            "bfloat16, float32 or float64 (all_finite takes float8)")
        if not one_segment and lsc_may_overlap(nd, shape, cnp.PyArray_STRIDES(a),
                                                 cnp.PyArray_ITEMSIZE(a)):
            raise ValueError(f"unscale_ needs arrays whose elements do not overlap; array "
                             f"{t.count} (in flattened order) has strides "
                             f"{(<object>a).strides} for shape {(<object>a).shape}")
    t.count += 1
    if n == 0 or code == LSC_CODE_INT:
        return 0
    if t.size == t.cap:
        table_grow(t, 1)
    e = push_run(t, a, n, code, cnp.PyArray_ISBYTESWAPPED(a))
    if t.write:
        _extent(a, &lo, &hi)
        lsc_order_add(&t.order, lo, hi, (flags & cnp.NPY_ARRAY_OWNDATA) != 0)
    if one_segment:
        return 0
    st = cnp.PyArray_STRIDES(a)
    for k in range(nd):
        if shape[k] > 1:
            big += 1
            bigk = k
    if big <= 1:
        e.stride = st[bigk]
    else:
        # the array holds these for as long as t holds the array
        e.ndim = nd
        e.shape = <const lsc_n *>shape
        e.strides = <const lsc_n *>st
    return 0


cdef inline int _plain(PyObject *x, bint write, lsc_n *n) noexcept:
    """The code of x when it is a plain array: an exact ndarray in one
    segment, in native byte order, of float16/32/64 (writable when
    writing), with its element count in n; LSC_CODE_INT for None, integer
    and bool arrays and empty arrays (nothing to do); -1 otherwise."""
    cdef cnp.PyArrayObject *a = <cnp.PyArrayObject *>x
    cdef int flags, tn, code, k
    cdef cnp.npy_intp *shape
    if x == <PyObject *>None:
        return LSC_CODE_INT
    if Py_TYPE(<object>x) is not &PyArray_Type:
        return -1
    flags = P_FLAGS(a)
    if not (flags & (cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_F_CONTIGUOUS)):
        return -1
    tn = P_TYPE(a)
    if tn == cnp.NPY_FLOAT:
        code = LSC_CODE_F32
    elif tn == NPY_HALF:
        code = LSC_CODE_F16
    elif tn == cnp.NPY_DOUBLE:
        code = LSC_CODE_F64
    elif tn <= cnp.NPY_ULONGLONG:
        return LSC_CODE_INT
    else:
        return -1
    if P_ISBYTESWAPPED(a) or (write and not (flags & cnp.NPY_ARRAY_WRITEABLE)):
        return -1
    shape = P_DIMS(a)
    n[0] = 1
    for k in range(P_NDIM(a)):
        n[0] *= shape[k]
    return code if n[0] else LSC_CODE_INT


cdef inline bint _push_plain(table_t *t, object x) noexcept:
    """Add x when it is a plain array (see _plain).  False means "not
    handled": _add_array then does the general work (other dtypes, strides,
    byte order) and raises what needs raising."""
    cdef lsc_n n = 0
    cdef int code
    cdef lsc_run *e
    if x is None:
        return True
    if t.size == t.cap:
        return False
    code = _plain(<PyObject *>x, t.write, &n)
    if code < 0:
        return False
    t.count += 1
    if code == LSC_CODE_INT:
        return True
    e = push_run(t, <cnp.ndarray>x, n, code, 0)
    if t.write:
        lsc_order_add(&t.order, <size_t>e.data, <size_t>e.data + <size_t>(n * e.stride),
                      (cnp.PyArray_FLAGS(<cnp.ndarray>x) & cnp.NPY_ARRAY_OWNDATA) != 0)
    return True


cdef int _scan_reserve(void *ctx, Py_ssize_t n) except -1:
    """Room for a list's items before the walk visits them (so _push_plain has it)."""
    return table_grow(<table_t *>ctx, n)


cdef int _scan_leaf(void *ctx, object obj) except -1:
    """The CPU scan's visitor of the walk (_walker.pxd): one leaf into the table."""
    cdef table_t *t = <table_t *>ctx
    if _push_plain(t, obj):
        return 0
    if cnp.PyArray_Check(obj):
        return _add_array(t, <cnp.ndarray>obj)
    if isinstance(obj, (float, int)):
        if t.write:
            raise TypeError(f"unscale_ cannot write to a Python {type(obj).__name__}; "
                            "pass numpy arrays")
        if isinstance(obj, float) and not isfinite(<double>obj):
            t.py_nonfinite = True
        t.count += 1
        return 0
    if isinstance(obj, np.generic) and isinstance(obj, (np.number, np.bool_)) \
            or (isinstance(obj, np.generic) and obj.dtype.num >= NPY_USERDEF):
        if t.write:
            raise TypeError(f"unscale_ cannot write to a numpy scalar "
                            f"({type(obj).__name__}); pass numpy arrays")
        return _add_array(t, np.asarray(obj))
    ty = type(obj)
    raise TypeError(f"unsupported array type {ty.__module__}.{ty.__qualname__}; expected "
                    "numpy.ndarray, a Python number or None, nested in lists, tuples "
                    "or dicts (torch and cupy arrays go through lscore.adapters)")


cdef int _collect(table_t *t, object obj) except -1:
    """Every leaf of `obj` into the table, through the one walk of _walker.pxd."""
    cdef visitor v
    v.leaf = _scan_leaf
    v.reserve = _scan_reserve
    v.ctx = <void *>t
    return walk(obj, &v)


cdef inline void _extent(cnp.ndarray a, size_t *lo, size_t *hi) noexcept:
    """Byte range [lo, hi) that the elements of `a` occupy."""
    lsc_extent(<const char *>cnp.PyArray_DATA(a), cnp.PyArray_NDIM(a), cnp.PyArray_DIMS(a),
               cnp.PyArray_STRIDES(a), cnp.PyArray_ITEMSIZE(a), lo, hi)


cdef int _check_disjoint(table_t *t) except -1:
    """unscale_ must not multiply an element twice: refuse arrays that share memory.

    The cheap proofs of lsc_order come first, gathered while the table filled.
    Otherwise: byte ranges
    [lo, hi) are pairwise disjoint exactly when, with the lo's and the hi's
    sorted separately, every sorted lo[i + 1] >= sorted hi[i]: two sorts and
    one sweep.  Only when that fails are pairs examined, and np.shares_memory
    has the last word (interleaved views such as a[::2] and a[1::2] are fine).
    """
    cdef Py_ssize_t i, j, m = t.size
    cdef size_t[::1] lov, hiv
    if m < 2 or lsc_disjoint(&t.order, <void **>t.objs, m, <void *>None):
        return 0
    lo, hi = np.empty(m, np.uintp), np.empty(m, np.uintp)
    lov, hiv = lo, hi
    for i in range(m):
        _extent(<cnp.ndarray>t.objs[i], &lov[i], &hiv[i])
    los, his = np.sort(lo), np.sort(hi)
    lov, hiv = los, his
    for i in range(1, m):
        if lov[i] < hiv[i - 1]:
            break
    else:
        return 0
    lov, hiv = lo, hi
    for i in range(m):
        for j in range(i + 1, m):
            if lov[i] < hiv[j] and lov[j] < hiv[i]:
                a, b = <object>t.objs[i], <object>t.objs[j]
                if np.shares_memory(a, b):
                    p, q = sorted((t.idxs[i], t.idxs[j]))
                    raise ValueError(
                        f"unscale_ needs arrays that do not share memory; arrays {p} and {q} "
                        "(in flattened order) overlap, so some elements would be "
                        "multiplied twice (the same array passed twice?)")
    return 0


cdef int _plain_list(list arrays, bint write, int op, double inv, int threads) noexcept:
    """The common call, a flat list of plain arrays (see _plain) of at most
    NOGIL_BYTES in all and too little work for threads (or threads == 1),
    straight to the kernels: no table, no references.
    The first pass checks every item, so that nothing is written unless all
    of them qualify (and, for unscale_, are disjoint); no Python code runs
    in between.  Returns 1 when some element was non-finite, 0 when none
    was, and -1 when the list is not of that kind (the general path then
    decides, and raises what needs raising)."""
    cdef Py_ssize_t i, m = PyList_GET_SIZE(arrays)
    cdef PyObject *x
    cdef int code, found = 0
    cdef lsc_n n = 0, total = 0, nbytes, work = 0
    cdef size_t lo
    cdef lsc_order order
    lsc_order_init(&order)
    for i in range(m):
        x = PyList_GET_ITEM(arrays, i)
        code = _plain(x, write, &n)
        if code < 0:
            return -1
        if code == LSC_CODE_INT:
            continue
        nbytes = n * lsc_formats[code].width
        total += nbytes
        if op != LSC_OP_SCAN:
            work += n * lsc_elem_ps(code, op)
        lo = <size_t>P_DATA(<cnp.PyArrayObject *>x)
        lsc_order_add(&order, lo, lo + <size_t>nbytes,
                      (P_FLAGS(<cnp.PyArrayObject *>x) & cnp.NPY_ARRAY_OWNDATA) != 0)
    if total > NOGIL_BYTES or (threads != 1 and lsc_work_threaded(work)):
        return -1
    if write and m > 1 and not lsc_disjoint(&order, <void **>(<PyListObject *>arrays).ob_item,
                                           m, <void *>None):
        return -1
    for i in range(m):
        x = PyList_GET_ITEM(arrays, i)
        code = _plain(x, write, &n)
        if code == LSC_CODE_INT:
            continue
        if lsc_contig(op, code, P_DATA(<cnp.PyArrayObject *>x), n, inv):
            if op == LSC_OP_SCAN:
                return 1
            found = 1
    return found


cdef inline lsc_result _run(const lsc_run *runs, size_t nruns, lsc_n total_bytes, int op,
                            double inv, int threads) noexcept:
    cdef lsc_result r
    if total_bytes > NOGIL_BYTES:
        with nogil:
            r = lsc_exec(runs, nruns, total_bytes, op, inv, threads)
    else:
        r = lsc_exec(runs, nruns, total_bytes, op, inv, threads)
    return r


cdef inline int _write_op(double inv, bint stats) noexcept:
    # x * 1 == x for every value: check only, write nothing (torch skips the multiply too)
    return (LSC_OP_WRITE if inv != 1.0 else LSC_OP_SCAN) | (LSC_OP_STATS if stats else 0)


cdef inline object _unscale_result(lsc_result r, bint stats):
    if stats:
        return (not r.found, sqrt(r.sumsq), r.maxabs)
    return not r.found


def all_finite(arrays, int threads=0):
    """True when no element of any floating array in `arrays` is NaN or +/-Inf.

    threads: 0 picks by input size, 1 is serial, k uses at most k threads.
    """
    cdef table_t t
    cdef lsc_result r
    cdef int found
    if type(arrays) is list:
        found = _plain_list(arrays, False, LSC_OP_SCAN, 1.0, threads)
        if found >= 0:
            return not found
    table_init(&t, False)
    try:
        if cnp.PyArray_Check(arrays):
            _add_array(&t, <cnp.ndarray>arrays)
        else:
            _collect(&t, arrays)
        if t.py_nonfinite:
            return False
        r = _run(t.runs, t.size, t.total_bytes, LSC_OP_SCAN, 1.0, threads)
    finally:
        table_free(&t)
    return not r.found


def unscale_(arrays, double inv_scale, bint stats=False, int threads=0):
    """Multiply every floating array in place by inv_scale; True when every input element was finite.

    With stats, returns (all_finite, l2_norm, max_abs) of the values after the multiply.
    """
    cdef table_t t
    cdef lsc_result r
    cdef int found
    if type(arrays) is list and not stats:
        found = _plain_list(arrays, True, _write_op(inv_scale, False), inv_scale, threads)
        if found >= 0:
            return not found
    table_init(&t, True)
    try:
        if cnp.PyArray_Check(arrays):
            _add_array(&t, <cnp.ndarray>arrays)
        else:
            _collect(&t, arrays)
        _check_disjoint(&t)
        r = _run(t.runs, t.size, t.total_bytes, _write_op(inv_scale, stats), inv_scale, threads)
    finally:
        table_free(&t)
    return _unscale_result(r, stats)


def all_finite_raw(const uint64_t[::1] ptrs, const int64_t[::1] counts,
                   const int64_t[::1] strides, const int[::1] codes, int threads=0):
    """all_finite over a table of raw buffers (pointer, count, byte stride, code).

    For adapters handing over framework memory; the caller keeps it alive.
    """
    return not _raw(ptrs, counts, strides, codes, LSC_OP_SCAN, 1.0, threads).found


def unscale_raw(const uint64_t[::1] ptrs, const int64_t[::1] counts,
                const int64_t[::1] strides, const int[::1] codes, double inv_scale,
                bint stats=False, int threads=0):
    """``unscale_`` over a table of raw buffers; True when every input element was finite.

    With stats, returns (all_finite, l2_norm, max_abs) as ``unscale_`` does.
    """
    r = _raw(ptrs, counts, strides, codes, _write_op(inv_scale, stats), inv_scale, threads)
    return _unscale_result(r, stats)


cdef bint _raw_small(const uint64_t[::1] ptrs, const int64_t[::1] counts,
                     const int64_t[::1] strides, const int[::1] codes, int op, double inv,
                     int threads, lsc_result *r) noexcept:
    """A table of contiguous buffers of at most NOGIL_BYTES in all, without
    statistics and with too little work for threads (or threads == 1):
    straight to the kernels, in table order (so aliased buffers are
    multiplied one after another, as the serial path does); False, having
    done nothing, for any other table."""
    cdef Py_ssize_t i, m = ptrs.shape[0]
    cdef lsc_n total = 0, work = 0
    if op & LSC_OP_STATS:
        return False
    for i in range(m):
        if codes[i] == LSC_CODE_INT or counts[i] <= 0:
            continue
        if strides[i] != lsc_formats[codes[i]].width:
            return False
        total += counts[i] * strides[i]
        if total > NOGIL_BYTES:
            return False
        if op != LSC_OP_SCAN:
            work += counts[i] * lsc_elem_ps(codes[i], op)
    if threads != 1 and lsc_work_threaded(work):
        return False
    r.found = 0
    r.sumsq = r.maxabs = 0.0
    for i in range(m):
        if codes[i] == LSC_CODE_INT or counts[i] <= 0:
            continue
        if lsc_contig(op, codes[i], <char *>ptrs[i], counts[i], inv):
            r.found = 1
            if op == LSC_OP_SCAN:
                break
    return True


cdef lsc_result _raw(const uint64_t[::1] ptrs, const int64_t[::1] counts,
                     const int64_t[::1] strides, const int[::1] codes, int op, double inv,
                     int threads) except *:
    cdef Py_ssize_t i, m = ptrs.shape[0], k = 0
    cdef lsc_n total = 0
    cdef lsc_run inline_runs[INLINE_RUNS]
    cdef lsc_run *runs = inline_runs
    cdef lsc_result r
    if counts.shape[0] != m or strides.shape[0] != m or codes.shape[0] != m:
        raise ValueError("ptrs, counts, strides and codes must have the same length")
    for i in range(m):
        if codes[i] < 0 or codes[i] >= LSC_NCODES:
            raise ValueError(f"unknown dtype code {codes[i]}")
        if ((op & (LSC_OP_WRITE | LSC_OP_STATS))
                and (codes[i] == LSC_CODE_E4M3FN or codes[i] == LSC_CODE_E5M2)):
            raise TypeError("unscale_ does not support float8 buffers")
    if _raw_small(ptrs, counts, strides, codes, op, inv, threads, &r):
        return r
    if m > INLINE_RUNS:
        runs = <lsc_run *>PyMem_Malloc(m * sizeof(lsc_run))
        if runs == NULL:
            raise MemoryError()
    try:
        for i in range(m):
            if codes[i] == LSC_CODE_INT or counts[i] <= 0:
                continue
            runs[k].data = <char *>ptrs[i]
            runs[k].n = counts[i]
            runs[k].stride = strides[i]
            runs[k].shape = NULL
            runs[k].strides = NULL
            runs[k].ndim = 1
            runs[k].code = codes[i]
            runs[k].swapped = 0
            total += counts[i] * (strides[i] if strides[i] >= 0 else -strides[i])
            k += 1
        with nogil:
            r = lsc_exec(runs, k, total, op, inv, threads)
    finally:
        if runs != inline_runs:
            PyMem_Free(runs)
    return r


# ---- ISA level and pool, for tests and `lscore bench` ----------------------

def isa():
    """The ISA level the contiguous kernels run at ("v2", "v3", "v4" or "baseline")."""
    return lsc_isa_get().name.decode()


def isa_levels():
    """The ISA levels this CPU can run, slowest first."""
    return [lsc_isa_names[k].decode() for k in range(LSC_NISAS) if lsc_isa_supported(k)]


def set_isa(name):
    """Run the kernels at ISA level `name` ("" = the best this CPU runs); returns the old level."""
    old = isa()
    if lsc_isa_select(name.encode()) != 0:
        raise ValueError(f"ISA level {name!r} is not available here; expected one of: "
                         + ", ".join(isa_levels()))
    return old


def pool_size():
    """Threads a large call may use (the caller included)."""
    return lsc_pool_size()


def _chunk_elems(int code, bint stats, bint write=True):
    """Elements per pool chunk of a contiguous run of `code` under unscale_ (for tests)."""
    cdef lsc_run run
    run.ndim = 1
    run.code = code
    run.n = 1
    return lsc_chunk_elems(&run, (LSC_OP_WRITE if write else 0) | (LSC_OP_STATS if stats else 0))


# The pool's parallel-for for the other extensions (_pool_for.pxd), as NumPy exports its C
# API (a capsule, numpy.core.multiarray._ARRAY_API): one set of helper threads per process.
_pool_for = PyCapsule_New(<void *>lsc_pool_for, b"lscore._ext._scan._pool_for", NULL)


def _helper_chunks():
    """Chunks the pool's helper threads have done since the start (for tests)."""
    return lsc_pool_helper_chunks()


def bench_read_u64(cnp.ndarray a):
    """Sum of a contiguous array read as uint64 words: a single-thread streaming read."""
    if not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise ValueError("needs a contiguous array")
    cdef const char *p = <const char *>cnp.PyArray_DATA(a)
    cdef lsc_n n = cnp.PyArray_NBYTES(a) // 8
    cdef uint64_t s
    with nogil:
        s = lsc_sum_u64(p, n)
    return s


def bench_copy(cnp.ndarray dst, cnp.ndarray src):
    """memcpy of one contiguous array into another of the same size."""
    if not (cnp.PyArray_IS_C_CONTIGUOUS(dst) and cnp.PyArray_IS_C_CONTIGUOUS(src)) \
            or cnp.PyArray_NBYTES(dst) != cnp.PyArray_NBYTES(src) \
            or not cnp.PyArray_ISWRITEABLE(dst):
        raise ValueError("needs two contiguous arrays of the same size, dst writable")
    cdef char *d = <char *>cnp.PyArray_DATA(dst)
    cdef const char *p = <const char *>cnp.PyArray_DATA(src)
    cdef size_t nb = cnp.PyArray_NBYTES(src)
    with nogil:
        memcpy(d, p, nb)


_env_isa = os.environ.get("LSCORE_ISA", "")
if _env_isa:
    try:
        set_isa(_env_isa)
    except ValueError:
        pass   # an unknown level in the environment leaves the automatic choice
