# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: this module owns the walk from Python objects to raw buffers.  It
# flattens a (nested) list/tuple/dict of NumPy arrays into a table of
# (pointer, count, stride, format code, byte order) through NumPy's C API,
# validates the whole input first (a failed call writes nothing), then runs
# the kernels of lsc_scan.h, releasing the GIL for large inputs.  It knows
# NumPy arrays and raw pointers only; frameworks reach it through adapters,
# which hand over pointers (all_finite_raw / unscale_raw).  The slow twin of
# every function here is lscore/_reference.py.
cimport numpy as cnp
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.stdint cimport int64_t, uint64_t
from libc.math cimport isfinite

from _dtypes cimport *

import numpy as np

cnp.import_array()

cdef extern from "numpy/ndarraytypes.h":
    enum:
        NPY_HALF
        NPY_USERDEF

cdef extern from "lsc_scan.h" nogil:
    ctypedef int64_t lsc_n
    int lsc_scan_run(int code, int swapped, const char *p, lsc_n n, lsc_n stride)
    int lsc_unscale_run(int code, int swapped, char *p, lsc_n n, lsc_n stride, double inv)
    int lsc_walk_nd(int code, int swapped, char *data, int ndim, const lsc_n *shape,
                    const lsc_n *strides, int write, double inv)

# Inputs with more bytes than this release the GIL while scanning.
DEF NOGIL_BYTES = 262144
DEF MAX_DEPTH = 64
DEF INLINE_ENTRIES = 32

ctypedef struct entry_t:
    PyObject *obj          # the array (borrowed from the caller's containers, or owned)
    char *data
    lsc_n n
    lsc_n stride           # for ndim == 1
    int ndim               # 1: one run; > 1: walk the array's own shape/strides
    int code
    int swapped
    int owned
    Py_ssize_t index       # position among the leaves, in flattened order (for errors)

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


cdef bint _may_overlap(cnp.ndarray a):
    """True when two elements of a may share memory (zero or tiny strides)."""
    cdef int nd = cnp.PyArray_NDIM(a), k, j, best
    cdef lsc_n span = cnp.PyArray_ITEMSIZE(a), s, sizes[64], strides[64]
    cdef int m = 0
    cdef cnp.npy_intp *shape = cnp.PyArray_DIMS(a)
    cdef cnp.npy_intp *st = cnp.PyArray_STRIDES(a)
    if cnp.PyArray_SIZE(a) == 0:
        return False
    for k in range(nd):
        if shape[k] > 1:
            sizes[m] = shape[k]
            strides[m] = st[k] if st[k] >= 0 else -st[k]
            m += 1
    # visit dims by increasing |stride|; each must step past all smaller ones
    for k in range(m):
        best = k
        for j in range(k + 1, m):
            if strides[j] < strides[best]:
                best = j
        s = strides[best]; strides[best] = strides[k]; strides[k] = s
        s = sizes[best]; sizes[best] = sizes[k]; sizes[k] = s
        if strides[k] < span:
            return True
        span += strides[k] * (sizes[k] - 1)
    return False


cdef class _Table:
    cdef entry_t *entries
    cdef entry_t inline_entries[INLINE_ENTRIES]
    cdef Py_ssize_t size, cap
    cdef lsc_n total_bytes
    cdef bint write
    cdef bint py_nonfinite       # a Python float seen by all_finite was NaN/Inf
    cdef Py_ssize_t _count       # leaves seen so far, for error messages

    def __cinit__(self):
        self.entries = self.inline_entries
        self.cap = INLINE_ENTRIES

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.size):
            if self.entries[i].owned:
                Py_DECREF(<object>self.entries[i].obj)
        if self.entries != self.inline_entries:
            PyMem_Free(self.entries)

    cdef entry_t *_push(self) except NULL:
        cdef entry_t *grown
        if self.size == self.cap:
            if self.entries == self.inline_entries:
                grown = <entry_t *>PyMem_Malloc(2 * self.cap * sizeof(entry_t))
                if grown != NULL:
                    for i in range(self.size):
                        grown[i] = self.inline_entries[i]
            else:
                grown = <entry_t *>PyMem_Realloc(self.entries, 2 * self.cap * sizeof(entry_t))
            if grown == NULL:
                raise MemoryError()
            self.entries = grown
            self.cap *= 2
        self.size += 1
        return &self.entries[self.size - 1]

    cdef int add_array(self, cnp.ndarray a, bint owned) except -1:
        cdef int code = _dtype_code(a)
        cdef int nd = cnp.PyArray_NDIM(a), k, big = 0, bigk = 0
        cdef lsc_n n = cnp.PyArray_SIZE(a)
        cdef cnp.npy_intp *shape
        cdef cnp.npy_intp *st
        cdef entry_t *e
        if self.write and code != LSC_CODE_INT:
            if not cnp.PyArray_ISWRITEABLE(a):
                raise ValueError(f"unscale_ needs writable arrays; array {self._index()} "
                                 "(in flattened order) is read-only")
            if code == LSC_CODE_E4M3FN or code == LSC_CODE_E5M2:
                raise TypeError(f"unscale_ does not support {a.dtype}; expected float16, "
                                "bfloat16, float32 or float64 (all_finite takes float8)")
            if not cnp.PyArray_ISONESEGMENT(a) and _may_overlap(a):
                raise ValueError(f"unscale_ needs arrays whose elements do not overlap; array "
                                 f"{self._index()} (in flattened order) has strides "
                                 f"{(<object>a).strides} for shape {(<object>a).shape}")
        if n == 0 or code == LSC_CODE_INT:
            self._count += 1
            return 0
        e = self._push()
        e.index = self._count
        e.obj = <PyObject *>a
        e.owned = owned
        if owned:
            Py_INCREF(a)
        e.data = <char *>cnp.PyArray_DATA(a)
        e.n = n
        e.code = code
        e.swapped = cnp.PyArray_ISBYTESWAPPED(a)
        e.ndim = 1
        e.stride = cnp.PyArray_ITEMSIZE(a)
        self.total_bytes += n * e.stride
        self._count += 1
        if cnp.PyArray_ISONESEGMENT(a):
            return 0
        shape = cnp.PyArray_DIMS(a)
        st = cnp.PyArray_STRIDES(a)
        for k in range(nd):
            if shape[k] > 1:
                big += 1
                bigk = k
        if big <= 1:
            e.stride = st[bigk]
        else:
            e.ndim = nd
        return 0

    cdef Py_ssize_t _index(self):
        return self._count

    cdef int collect(self, object obj, int depth) except -1:
        if depth > MAX_DEPTH:
            raise ValueError(f"arrays are nested deeper than {MAX_DEPTH} levels "
                             "(is a container inside itself?)")
        if obj is None:
            return 0
        if cnp.PyArray_Check(obj):
            return self.add_array(<cnp.ndarray>obj, False)
        if isinstance(obj, (list, tuple)):
            for x in obj:
                self.collect(x, depth + 1)
            return 0
        if isinstance(obj, dict):
            for x in (<dict>obj).values() if type(obj) is dict else obj.values():
                self.collect(x, depth + 1)
            return 0
        if isinstance(obj, (float, int)):
            if self.write:
                raise TypeError(f"unscale_ cannot write to a Python {type(obj).__name__}; "
                                "pass numpy arrays")
            if isinstance(obj, float) and not isfinite(<double>obj):
                self.py_nonfinite = True
            self._count += 1
            return 0
        if isinstance(obj, np.generic) and isinstance(obj, (np.number, np.bool_)) \
                or (isinstance(obj, np.generic) and obj.dtype.num >= NPY_USERDEF):
            if self.write:
                raise TypeError(f"unscale_ cannot write to a numpy scalar "
                                f"({type(obj).__name__}); pass numpy arrays")
            return self.add_array(np.asarray(obj), True)
        t = type(obj)
        raise TypeError(f"unsupported array type {t.__module__}.{t.__qualname__}; expected "
                        "numpy.ndarray, a Python number or None, nested in lists, tuples "
                        "or dicts (torch and cupy arrays go through lscore.adapters)")

    cdef int run(self, bint write, double inv) except -1:
        cdef Py_ssize_t i
        cdef int found = 0
        cdef entry_t *e
        cdef bint nogil_ = self.total_bytes > NOGIL_BYTES
        cdef object guard
        if nogil_:
            # hold every array alive while the GIL is released
            guard = [<object>self.entries[i].obj for i in range(self.size)]
            with nogil:
                found = _run_entries(self.entries, self.size, write, inv)
        else:
            found = _run_entries(self.entries, self.size, write, inv)
        return found


cdef int _run_entries(entry_t *entries, Py_ssize_t size, bint write, double inv) noexcept nogil:
    cdef Py_ssize_t i
    cdef int found = 0
    cdef entry_t *e
    for i in range(size):
        e = &entries[i]
        if e.ndim == 1:
            if write:
                found |= lsc_unscale_run(e.code, e.swapped, e.data, e.n, e.stride, inv)
            elif lsc_scan_run(e.code, e.swapped, e.data, e.n, e.stride):
                return 1
        else:
            if lsc_walk_nd(e.code, e.swapped, e.data, cnp.PyArray_NDIM(<cnp.ndarray>e.obj),
                           <lsc_n *>cnp.PyArray_DIMS(<cnp.ndarray>e.obj),
                           <lsc_n *>cnp.PyArray_STRIDES(<cnp.ndarray>e.obj), write, inv):
                if not write:
                    return 1
                found = 1
    return found


cdef void _extent(cnp.ndarray a, size_t *lo, size_t *hi) noexcept:
    """Byte range [lo, hi) that the elements of `a` occupy."""
    cdef int k
    cdef cnp.npy_intp span
    lo[0] = hi[0] = <size_t>cnp.PyArray_DATA(a)
    for k in range(cnp.PyArray_NDIM(a)):
        span = (cnp.PyArray_DIMS(a)[k] - 1) * cnp.PyArray_STRIDES(a)[k]
        if span < 0:
            lo[0] -= <size_t>(-span)
        else:
            hi[0] += <size_t>span
    hi[0] += cnp.PyArray_ITEMSIZE(a)


cdef int _check_disjoint(_Table t) except -1:
    """unscale_ must not multiply an element twice: refuse arrays that share memory.

    Byte ranges [lo, hi) are pairwise disjoint exactly when, with the lo's and
    the hi's sorted separately, every sorted lo[i + 1] >= sorted hi[i]: two
    sorts and one sweep (np.sort; a struct sort with a callback costs several
    times more).  Only when that fails are pairs examined, and np.shares_memory
    has the last word (interleaved views such as a[::2] and a[1::2] are fine).
    """
    cdef Py_ssize_t i, j, m = t.size
    cdef size_t[::1] lov, hiv
    if m < 2:
        return 0
    lo, hi = np.empty(m, np.uintp), np.empty(m, np.uintp)
    lov, hiv = lo, hi
    for i in range(m):
        _extent(<cnp.ndarray>t.entries[i].obj, &lov[i], &hiv[i])
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
                _raise_if_shared(t, i, j)
    return 0


cdef int _raise_if_shared(_Table t, Py_ssize_t i, Py_ssize_t j) except -1:
    a, b = <object>t.entries[i].obj, <object>t.entries[j].obj
    if np.shares_memory(a, b):
        i, j = sorted((t.entries[i].index, t.entries[j].index))
        raise ValueError(f"unscale_ needs arrays that do not share memory; arrays {i} and {j} "
                         "(in flattened order) overlap, so some elements would be "
                         "multiplied twice (the same array passed twice?)")
    return 0


def all_finite(arrays):
    """True when no element of any floating array in `arrays` is NaN or +/-Inf."""
    cdef _Table t
    if cnp.PyArray_Check(arrays):
        t = _Table()
        t.add_array(<cnp.ndarray>arrays, False)
    else:
        t = _Table()
        t.collect(arrays, 0)
    if t.py_nonfinite:
        return False
    return not t.run(False, 1.0)


def unscale_(arrays, double inv_scale):
    """Multiply every floating array in place by inv_scale; True when every input element was finite."""
    cdef _Table t = _Table()
    t.write = True
    if cnp.PyArray_Check(arrays):
        t.add_array(<cnp.ndarray>arrays, False)
    else:
        t.collect(arrays, 0)
    _check_disjoint(t)
    if inv_scale == 1.0:
        # x * 1 == x for every value: check only (torch skips the multiply too)
        return not t.run(False, 1.0)
    return not t.run(True, inv_scale)


def all_finite_raw(const uint64_t[::1] ptrs, const int64_t[::1] counts,
                   const int64_t[::1] strides, const int[::1] codes):
    """all_finite over a table of raw buffers (pointer, count, byte stride, code).

    For adapters handing over framework memory; the caller keeps it alive.
    """
    return not _raw(ptrs, counts, strides, codes, False, 1.0)


def unscale_raw(const uint64_t[::1] ptrs, const int64_t[::1] counts,
                const int64_t[::1] strides, const int[::1] codes, double inv_scale):
    """unscale_ over a table of raw buffers; True when every input element was finite."""
    if inv_scale == 1.0:
        return not _raw(ptrs, counts, strides, codes, False, 1.0)
    return not _raw(ptrs, counts, strides, codes, True, inv_scale)


cdef int _raw(const uint64_t[::1] ptrs, const int64_t[::1] counts, const int64_t[::1] strides,
              const int[::1] codes, bint write, double inv) except -1:
    cdef Py_ssize_t i, m = ptrs.shape[0]
    cdef int found = 0
    if counts.shape[0] != m or strides.shape[0] != m or codes.shape[0] != m:
        raise ValueError("ptrs, counts, strides and codes must have the same length")
    for i in range(m):
        if codes[i] < 0 or codes[i] >= LSC_NCODES:
            raise ValueError(f"unknown dtype code {codes[i]}")
        if write and (codes[i] == LSC_CODE_E4M3FN or codes[i] == LSC_CODE_E5M2):
            raise TypeError("unscale_ does not support float8 buffers")
    with nogil:
        for i in range(m):
            if write:
                found |= lsc_unscale_run(codes[i], 0, <char *>ptrs[i], counts[i], strides[i], inv)
            elif lsc_scan_run(codes[i], 0, <const char *>ptrs[i], counts[i], strides[i]):
                found = 1
                break
    return found
