# The DLPack C exchange API as lscore reads it (lsc_dlpack.h), inline so that every
# compiled module that cimports it gets it without a runtime import: _grads.pyx reads
# CPU gradients through it, _walk.pyx's DeviceTable device tensors (READ_DLPACK).
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int64_t, uint64_t

from _dtypes cimport *

cdef extern from "lsc_dlpack.h":
    enum:
        LSC_DL_CPU
        LSC_DL_CUDA
        LSC_DL_FLOAT
        LSC_DL_BFLOAT
    ctypedef struct lsc_dl_version:
        unsigned int major
    ctypedef struct lsc_dl_device:
        int device_type
        int device_id
    ctypedef struct lsc_dl_dtype:
        unsigned char code
        unsigned char bits
        unsigned short lanes
    ctypedef struct lsc_dl_tensor:
        void *data
        lsc_dl_device device
        int ndim
        lsc_dl_dtype dtype
        int64_t *shape
        int64_t *strides
        uint64_t byte_offset
    ctypedef int (*lsc_dl_from_pyobject)(void *py_object, lsc_dl_tensor *out)
    ctypedef struct lsc_dl_api_header:
        lsc_dl_version version
    ctypedef struct lsc_dl_exchange_api:
        lsc_dl_api_header header
        lsc_dl_from_pyobject dltensor_from_py_object_no_sync


cdef inline int _dl_code(lsc_dl_dtype t) noexcept:
    """lscore code of a DLPack dtype that unscale_ writes, else -1."""
    if t.lanes != 1:
        return -1
    if t.code == LSC_DL_FLOAT:
        if t.bits == 16:
            return LSC_CODE_F16
        if t.bits == 32:
            return LSC_CODE_F32
        if t.bits == 64:
            return LSC_CODE_F64
    elif t.code == LSC_DL_BFLOAT and t.bits == 16:
        return LSC_CODE_BF16
    return -1


cdef inline int64_t _numel(int ndim, const int64_t *shape) noexcept:
    cdef int64_t n = 1
    for k in range(ndim):
        n *= shape[k]
    return n


cdef inline lsc_dl_from_pyobject _exchange_api(tp) except? NULL:
    """The DLPack `dltensor_from_py_object_no_sync` of a tensor type, or NULL."""
    cdef lsc_dl_exchange_api *api
    cap = getattr(tp, "__dlpack_c_exchange_api__", None)
    if cap is None or not PyCapsule_IsValid(cap, b"dlpack_exchange_api"):
        return NULL
    api = <lsc_dl_exchange_api *>PyCapsule_GetPointer(cap, b"dlpack_exchange_api")
    if api == NULL or api.header.version.major != 1:
        return NULL
    return api.dltensor_from_py_object_no_sync
