# Declarations of the device walk (_walk.pyx's DeviceTable): the readers, the C helpers
# it calls (lsc_attr.h, lsc_layout.h), a plan's leaf record, and the wording of a
# refused layout.
cimport numpy as cnp
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t, intptr_t, uint64_t


# the readers, as C constants for the walk (a module global is a dict lookup per use)
cdef enum:
    R_NUMPY = 1         # numpy.ndarray, through NumPy's C API
    R_CUDA_ARRAY = 2    # CuPy's attributes: data.ptr, data.device_id, size, dtype, flags
    R_DLPACK = 3        # the type's DLPack C exchange API (exactly that type), and .dtype

cdef extern from "lsc_attr.h":
    ctypedef struct lsc_attrs:
        pass
    object lsc_attr_get(lsc_attrs *c, PyObject **names, int n, PyObject *x, int i)

# the attributes read through lsc_attr.h (DeviceTable._field): an array's, then its data's
cdef enum:
    AT_DATA = 0
    AT_SIZE = 1
    AT_DTYPE = 2
    AT_C_CONTIGUOUS = 3
    AT_F_CONTIGUOUS = 4
    N_ARRAY_ATTRS = 5
    AT_PTR = 0
    AT_DEVICE = 1
    N_DATA_ATTRS = 2

cdef extern from "lsc_layout.h":
    int lsc_may_overlap(int ndim, const intptr_t *shape, const intptr_t *strides,
                        intptr_t itemsize)
    ctypedef struct lsc_order:
        int up, down
    void lsc_order_init(lsc_order *o)
    void lsc_order_add(lsc_order *o, size_t lo, size_t hi, int owns)

ctypedef struct leaf_t:
    PyObject *ref        # weak reference to the array (owned)
    PyObject *dtype      # borrowed: DevicePlan._keep holds it
    uint64_t ptr
    int64_t n
    int flags            # READ_NUMPY: the flags a plan depends on


cdef inline str dense_message(x, Py_ssize_t i, str hint):
    shape, strides = getattr(x, "shape", None), getattr(x, "strides", None)
    if self_overlapping(shape, strides, x):
        return (f"the GPU kernels need arrays whose elements do not overlap; array {i} (in "
                f"flattened order) has shape {shape} strides {strides}")
    return (f"the GPU kernels need dense arrays (C- or F-contiguous); array {i} (in flattened "
            f"order) has shape {shape} strides {strides}; pass {hint}.ascontiguousarray(a)")


cdef inline bint self_overlapping(shape, strides, x) except -1:
    cdef intptr_t sh[64]
    cdef intptr_t st[64]
    cdef int k, nd
    if shape is None or strides is None or len(shape) != len(strides) or len(shape) > 64:
        return False
    nd = len(shape)
    for k in range(nd):
        sh[k] = shape[k]
        st[k] = strides[k]
    return lsc_may_overlap(nd, sh, st, x.dtype.itemsize) != 0
