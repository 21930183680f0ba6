# The run table of one call of _scan.pyx (its arrays as lsc_run records, with a strong
# reference to each), and the NumPy and Python C accessors the scan reads arrays with.
cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject, PyTypeObject

from _lsc_pool cimport *

cdef extern from "numpy/ndarraytypes.h":
    enum:
        NPY_HALF
        NPY_USERDEF

# The array accessors on a borrowed PyArrayObject * (an ndarray variable
# would take a reference to each array), for _plain_list
cdef extern from "numpy/arrayobject.h":
    int P_FLAGS "PyArray_FLAGS"(cnp.PyArrayObject *a) nogil
    int P_TYPE "PyArray_TYPE"(cnp.PyArrayObject *a) nogil
    int P_NDIM "PyArray_NDIM"(cnp.PyArrayObject *a) nogil
    cnp.npy_intp *P_DIMS "PyArray_DIMS"(cnp.PyArrayObject *a) nogil
    char *P_DATA "PyArray_BYTES"(cnp.PyArrayObject *a) nogil
    bint P_ISBYTESWAPPED "PyArray_ISBYTESWAPPED"(cnp.PyArrayObject *a) nogil
    PyTypeObject PyArray_Type

cdef extern from "Python.h":
    ctypedef struct PyListObject:
        PyObject **ob_item

# runs (and references) a table holds before it allocates
cdef enum:
    INLINE_RUNS = 16

# The table of one call: one lsc_run per non-empty floating array, and a
# strong reference to each array so that nothing is freed while the kernels
# run (also without the GIL).  Lives on the C stack; table_free releases it.
ctypedef struct table_t:
    lsc_run *runs
    PyObject **objs
    Py_ssize_t size
    Py_ssize_t cap
    lsc_n total_bytes
    bint write
    bint py_nonfinite       # a Python float seen by all_finite was NaN/Inf
    Py_ssize_t count        # leaves seen so far, for error messages
    lsc_run inline_runs[INLINE_RUNS]
    PyObject *inline_objs[INLINE_RUNS]
    Py_ssize_t *idxs        # each run's position among the leaves, in flattened order
    Py_ssize_t inline_idxs[INLINE_RUNS]
    lsc_order order         # unscale_'s cheap disjointness proofs (lsc_layout.h)


cdef inline void table_init(table_t *t, bint write) noexcept:
    t.runs = t.inline_runs
    t.objs = t.inline_objs
    t.idxs = t.inline_idxs
    t.size = 0
    t.cap = INLINE_RUNS
    t.total_bytes = 0
    t.write = write
    t.py_nonfinite = False
    t.count = 0
    lsc_order_init(&t.order)


cdef inline void table_free(table_t *t) noexcept:
    cdef Py_ssize_t i
    for i in range(t.size):
        Py_DECREF(<object>t.objs[i])
    t.size = 0
    if t.runs != t.inline_runs:
        PyMem_Free(t.runs)
        PyMem_Free(t.objs)
        PyMem_Free(t.idxs)
        t.runs = t.inline_runs
        t.objs = t.inline_objs
        t.idxs = t.inline_idxs


cdef inline int table_grow(table_t *t, Py_ssize_t need) except -1:
    """Room for `need` more runs."""
    cdef Py_ssize_t cap = t.cap, i
    if t.size + need <= t.cap:
        return 0
    while cap < t.size + need:
        cap *= 4
    cdef lsc_run *runs = <lsc_run *>PyMem_Malloc(cap * sizeof(lsc_run))
    cdef PyObject **objs = <PyObject **>PyMem_Malloc(cap * sizeof(PyObject *))
    cdef Py_ssize_t *idxs = <Py_ssize_t *>PyMem_Malloc(cap * sizeof(Py_ssize_t))
    if runs == NULL or objs == NULL or idxs == NULL:
        PyMem_Free(runs)
        PyMem_Free(objs)
        PyMem_Free(idxs)
        raise MemoryError()
    for i in range(t.size):
        runs[i] = t.runs[i]
        objs[i] = t.objs[i]
        idxs[i] = t.idxs[i]
    if t.runs != t.inline_runs:
        PyMem_Free(t.runs)
        PyMem_Free(t.objs)
        PyMem_Free(t.idxs)
    t.runs = runs
    t.objs = objs
    t.idxs = idxs
    t.cap = cap
    return 0


cdef inline lsc_run *push_run(table_t *t, cnp.ndarray a, lsc_n n, int code,
                              int swapped) noexcept:
    """Append `a` as one contiguous run (the caller made room and may then
    turn it into a strided or N-d run); the table holds a reference."""
    cdef lsc_run *e = &t.runs[t.size]
    Py_INCREF(a)
    t.objs[t.size] = <PyObject *>a
    t.idxs[t.size] = t.count - 1
    t.size += 1
    e.data = <char *>cnp.PyArray_DATA(a)
    e.n = n
    e.code = code
    e.swapped = swapped
    e.ndim = 1
    e.stride = cnp.PyArray_ITEMSIZE(a)
    e.shape = NULL
    e.strides = NULL
    t.total_bytes += n * e.stride
    return e
