# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: GradTable holds the gradients of an optimizer's parameter groups as raw runs
# (pointer, count, byte stride, code) for _scan.unscale_raw/all_finite_raw.
# A tensor's memory is read through the DLPack C exchange API that its type
# publishes (lsc_dlpack.h: one C call per tensor, no allocation) or, where
# a type has none, through duck-typed attributes (`.layout`, `.is_cpu`,
# `.is_contiguous()`, `.data_ptr()`, `.numel()`); the caller passes in the
# framework's objects to compare against (the tensor type, the dtype ->
# code map, the strided layout).  Dense CPU gradients of a float format
# become runs, strided ones included (one run per innermost line);
# anything else (sparse, another device, an unknown dtype, a subclass,
# overlapping memory) is handed back to the caller.  The table is reused
# from step to step; the caller keeps the tensors alive while it is in use.
# The multi-tensor kernels of the CPU core (_scan.pyx) then run the table.
cimport numpy as cnp
from cpython.exc cimport PyErr_Clear
from cpython.ref cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t

from _dtypes cimport *
from _dlpack cimport *

import numpy as np

cnp.import_array()


# `.grad` read through its descriptor, resolved once per parameter type (lsc_attr.h)
cdef extern from "lsc_attr.h":
    ctypedef struct lsc_attrs:
        pass
    object lsc_attr_get(lsc_attrs *c, PyObject **names, int n, PyObject *x, int i)

cdef object _A_GRAD = "grad"
cdef PyObject *_GRAD_ATTRS[1]
_GRAD_ATTRS[0] = <PyObject *>_A_GRAD


DEF MAX_DIMS = 64

FP16_MESSAGE = "Attempting to unscale FP16 gradients."


cdef class GradTable:
    """A growable table of raw 1-D runs, filled from parameter groups or run by run.

    Parameters
    ----------
    fast_type : type
        Gradients of exactly this type take the fast path; subclasses (which
        may redefine what their memory means) are handed back.
    codes : dict
        dtype object -> lscore dtype code (the float16 entry drives the
        float16 check of gradients that are handed back).
    strided : object
        The dense layout object, for types without the DLPack exchange API.
    tensor_type : type
        What every parameter must be an instance of.
    assert_error : type
        The exception raised when a parameter is not.
    """
    cdef cnp.ndarray _ptrs, _counts, _strides, _codes
    cdef uint64_t *ptrs
    cdef int64_t *counts
    cdef int64_t *strides
    cdef int32_t *codes
    cdef readonly Py_ssize_t size
    cdef Py_ssize_t cap
    cdef dict _codes_by_dtype
    cdef object _fast_type, _strided, _tensor_type, _assert_error, _fp16
    cdef object _param_type       # the last parameter type seen to pass the isinstance check
    cdef lsc_attrs _grad_attrs    # how `.grad` is read on a parameter type
    cdef lsc_dl_from_pyobject _dl

    def __cinit__(self, fast_type, dict codes, strided, tensor_type,
                  assert_error=AssertionError, Py_ssize_t capacity=64):
        self.cap = 0
        self.size = 0
        self._fast_type = fast_type
        self._codes_by_dtype = dict(codes)
        self._fp16 = next((k for k, v in codes.items() if v == LSC_CODE_F16), None)
        self._strided = strided
        self._tensor_type = tensor_type
        self._assert_error = assert_error
        self._param_type = None
        self._dl = _exchange_api(fast_type)
        self._grow(capacity if capacity > 0 else 64)

    @property
    def uses_dlpack(self):
        """Whether gradients are read through the DLPack C exchange API."""
        return self._dl != NULL

    cdef int _grow(self, Py_ssize_t cap) except -1:
        ptrs = np.zeros(cap, np.uint64)
        counts = np.zeros(cap, np.int64)
        strides = np.zeros(cap, np.int64)
        codes = np.zeros(cap, np.int32)
        if self.size:
            ptrs[:self.size] = self._ptrs[:self.size]
            counts[:self.size] = self._counts[:self.size]
            strides[:self.size] = self._strides[:self.size]
            codes[:self.size] = self._codes[:self.size]
        self._ptrs, self._counts, self._strides, self._codes = ptrs, counts, strides, codes
        self.ptrs = <uint64_t *>cnp.PyArray_DATA(ptrs)
        self.counts = <int64_t *>cnp.PyArray_DATA(counts)
        self.strides = <int64_t *>cnp.PyArray_DATA(strides)
        self.codes = <int32_t *>cnp.PyArray_DATA(codes)
        self.cap = cap
        return 0

    cdef inline int _push(self, uint64_t p, int64_t n, int64_t stride, int code) except -1:
        if self.size == self.cap:
            self._grow(2 * self.cap)
        self.ptrs[self.size] = p
        self.counts[self.size] = n
        self.strides[self.size] = stride
        self.codes[self.size] = code
        self.size += 1
        return 0

    def clear(self):
        self.size = 0

    def add(self, uint64_t ptr, int64_t count, int64_t stride, int code):
        """Append one run of `count` elements, `stride` bytes apart."""
        if code < 0 or code >= LSC_NCODES:
            raise ValueError(f"unknown dtype code {code}")
        if count > 0:
            self._push(ptr, count, stride, code)

    cdef int _add_strided(self, char *data, int ndim, const int64_t *shape,
                          const int64_t *strides, int code) except -1:
        """Runs covering an N-d strided buffer; 0 when its elements overlap
        (or it has negative strides), which the caller must handle itself."""
        cdef int64_t sizes[MAX_DIMS]
        cdef int64_t st[MAX_DIMS]
        cdef int64_t idx[MAX_DIMS]
        cdef int64_t n = 1, span = 1, s, w = lsc_code_width(code)
        cdef int m = 0, k, j
        cdef char *p
        if ndim == 1 and (strides == NULL or strides[0] == 1 or shape[0] <= 1):
            if shape[0] > 0:                     # the common gradient: a dense vector
                self._push(<uint64_t><uintptr_t>data, shape[0], w, code)
            return 1
        if ndim > MAX_DIMS:
            return 0
        for k in range(ndim):
            if shape[k] == 0:
                return 1                         # empty: nothing to do
            if shape[k] > 1:
                if strides == NULL:              # C-contiguous (DLPack < 1.2)
                    self._push(<uint64_t><uintptr_t>data, _numel(ndim, shape), w, code)
                    return 1
                if strides[k] < 0:
                    return 0
                sizes[m] = shape[k]
                st[m] = strides[k]
                n *= shape[k]
                m += 1
        # sort dims by increasing stride; each must step past all smaller ones
        for k in range(m):
            j = k
            while j > 0 and st[j] < st[j - 1]:
                s = st[j]; st[j] = st[j - 1]; st[j - 1] = s
                s = sizes[j]; sizes[j] = sizes[j - 1]; sizes[j - 1] = s
                j -= 1
        for k in range(m):
            if st[k] < span:
                return 0
            span += st[k] * (sizes[k] - 1)
        if m == 0 or span == n:
            # dense (contiguous or a permutation of it): one run over the block
            self._push(<uint64_t><uintptr_t>data, n, w, code)
            return 1
        # one run along the innermost dim for every index of the others
        for k in range(m):
            idx[k] = 0
        while True:
            p = data
            for k in range(1, m):
                p += idx[k] * st[k] * w
            self._push(<uint64_t><uintptr_t>p, sizes[0], st[0] * w, code)
            k = 1
            while k < m:
                idx[k] += 1
                if idx[k] < sizes[k]:
                    break
                idx[k] = 0
                k += 1
            if k >= m:
                return 1

    def collect_grads(self, param_groups, bint allow_fp16, list written, list others):
        """Append the `.grad` of every parameter in `param_groups`, in order.

        A dense CPU gradient of a float format becomes runs and is appended to
        `written`; every other parameter with a gradient goes to `others`.
        Raises, with torch's messages, for a parameter that is not a tensor
        and (unless `allow_fp16`) for a float16 gradient; nothing has been
        written to any gradient at that point.
        """
        cdef object p, g, c
        cdef int code
        cdef lsc_dl_tensor t
        cdef lsc_dl_from_pyobject dl = self._dl
        cdef object fast_type = self._fast_type, tensor_type = self._tensor_type
        for group in param_groups:
            for p in group["params"]:
                # isinstance through a metaclass costs more than the rest of the loop;
                # for these C-level tensor types it depends on type(p) alone
                if type(p) is not self._param_type:
                    if not isinstance(p, tensor_type):
                        raise self._assert_error(
                            f"expected param to be torch.Tensor, got {type(p).__name__}")
                    self._param_type = type(p)
                # `p.grad`, through the getter torch's C type defines for it
                g = lsc_attr_get(&self._grad_attrs, _GRAD_ATTRS, 1, <PyObject *>p, 0)
                if g is None:
                    continue
                if dl != NULL and type(g) is fast_type:
                    if dl(<void *>g, &t) == 0:
                        code = _dl_code(t.dtype)
                        if code == LSC_CODE_F16 and not allow_fp16:
                            raise ValueError(FP16_MESSAGE)
                        if (code >= 0 and t.device.device_type == LSC_DL_CPU
                                and self._add_strided(<char *>t.data + t.byte_offset, t.ndim,
                                                      t.shape, t.strides, code)):
                            written.append(g)
                        else:
                            others.append(p)
                        continue
                    PyErr_Clear()                # e.g. sparse: the caller handles it
                c = self._codes_by_dtype.get(g.dtype)
                code = -1 if c is None else <int>c
                if code == LSC_CODE_F16 and not allow_fp16:
                    raise ValueError(FP16_MESSAGE)
                if (dl == NULL and type(g) is fast_type and LSC_CODE_F16 <= code <= LSC_CODE_F64
                        and g.layout is self._strided and g.is_cpu and g.is_contiguous()):
                    self._push(<uint64_t>g.data_ptr(), g.numel(), lsc_code_width(code), code)
                    written.append(g)
                else:
                    others.append(p)

    def add_tensor(self, obj, int code):
        """Append runs covering a dense CPU tensor of the fast type read through
        DLPack; False (nothing appended) when that is not possible."""
        cdef lsc_dl_tensor t
        if self._dl == NULL or type(obj) is not self._fast_type:
            return False
        if self._dl(<void *>obj, &t) != 0:
            PyErr_Clear()
            return False
        if _dl_code(t.dtype) != code or t.device.device_type != LSC_DL_CPU:
            return False
        return bool(self._add_strided(<char *>t.data + t.byte_offset, t.ndim, t.shape,
                                      t.strides, code))

    def views(self):
        """(ptrs, counts, strides, codes) of the runs added so far."""
        n = self.size
        return self._ptrs[:n], self._counts[:n], self._strides[:n], self._codes[:n]
