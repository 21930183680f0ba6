# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: the walk of _walker.pxd applied to device arrays, read without
# knowing the framework.
# - DeviceTable: nested device arrays grouped by (device, dtype code) in one
#   pass, for lscore.cuda's multi-tensor launches, and kept as a plan that
#   the next call with the same arrays reuses.  An array is read through
#   NumPy's C API (READ_NUMPY: the host harness's stand-ins) or through the
#   few attributes a CuPy array has (READ_CUDA_ARRAY: data.ptr,
#   data.device_id, size, dtype, and flags on first sight only); the
#   adapter names its array type and maps its dtype objects to codes.
#   A cached plan is checked array by array (the same object, through a
#   weak reference, with the same address, size and dtype) and rebuilt on
#   any difference; a CuPy array's attributes (a tensor's dtype) are read
#   through their descriptors, resolved once per type (lsc_attr.h).
# The CPU scan's own visitor of the same walk, for NumPy arrays, is in _scan.pyx;
# the gradients of torch-style parameter groups are read by _grads.pyx.
cimport numpy as cnp
from cpython.exc cimport PyErr_Clear
from cpython.long cimport PyLong_AsSsize_t, PyLong_AsUnsignedLongLong
from cpython.object cimport PyObject_GetAttr
from cpython.ref cimport PyObject, PyTypeObject, Py_TYPE, Py_INCREF, Py_XDECREF
from cpython.dict cimport PyDict_GetItem
from cpython.weakref cimport PyWeakref_NewRef, PyWeakref_GET_OBJECT
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.string cimport memcmp, memcpy
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int8_t, int32_t, int64_t, uint16_t, intptr_t, uint64_t, uintptr_t

from _dtypes cimport *
from _dlpack cimport *
from _walker cimport visitor, walk

import numpy as np

cnp.import_array()


# the readers, as C constants for the walk (a module global is a dict lookup per use)
cdef enum:
    R_NUMPY = 1         # numpy.ndarray, through NumPy's C API
    R_CUDA_ARRAY = 2    # CuPy's attributes: data.ptr, data.device_id, size, dtype, flags
    R_DLPACK = 3        # the type's DLPack C exchange API (exactly that type), and .dtype
READ_NUMPY = R_NUMPY
READ_CUDA_ARRAY = R_CUDA_ARRAY
READ_DLPACK = R_DLPACK
# DLPack's device types of the devices READ_DLPACK reads, by torch's device type names
DLPACK_DEVICES = {"cpu": LSC_DL_CPU, "cuda": LSC_DL_CUDA}

# attribute names read per array, interned once
cdef object _A_DATA = "data", _A_PTR = "ptr", _A_SIZE = "size", _A_DTYPE = "dtype"
cdef object _A_DEVICE = "device_id", _A_FLAGS = "flags", _A_SHAPE = "shape"
# CuPy's own contiguity fields (readonly C fields of its ndarray since v1): read
# without building the Flags object that ``flags`` makes on every read
cdef object _A_C_CONTIGUOUS = "_c_contiguous", _A_F_CONTIGUOUS = "_f_contiguous"

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
cdef PyObject *_ARRAY_ATTRS[N_ARRAY_ATTRS]
_ARRAY_ATTRS[:] = [<PyObject *>_A_DATA, <PyObject *>_A_SIZE, <PyObject *>_A_DTYPE,
                   <PyObject *>_A_C_CONTIGUOUS, <PyObject *>_A_F_CONTIGUOUS]
cdef PyObject *_DATA_ATTRS[N_DATA_ATTRS]
_DATA_ATTRS[:] = [<PyObject *>_A_PTR, <PyObject *>_A_DEVICE]

cdef extern from "lsc_layout.h":
    int lsc_may_overlap(int ndim, const intptr_t *shape, const intptr_t *strides,
                        intptr_t itemsize)
    ctypedef struct lsc_order:
        int up, down
    void lsc_order_init(lsc_order *o)
    void lsc_order_add(lsc_order *o, size_t lo, size_t hi, int owns)

DEF MAX_GROUPS = 256

cdef int _NP_KEEP = (cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_F_CONTIGUOUS
                     | cnp.NPY_ARRAY_WRITEABLE)

ctypedef struct leaf_t:
    PyObject *ref        # weak reference to the array (owned)
    PyObject *dtype      # borrowed: DevicePlan._keep holds it
    uint64_t ptr
    int64_t n
    int flags            # READ_NUMPY: the flags a plan depends on


cdef class DevicePlan:
    """The grouped tables of one list of device arrays (built by DeviceTable.plan).

    groups: [(device, dtype code, uint64 addresses, int64 counts)] of the
    floating, non-empty arrays, in first-seen order; devices: the devices
    in that order; codes: the dtype codes of every array, empty ones
    included, each once in first-seen order; leaf_addresses, leaf_counts,
    leaf_codes, leaf_devices, leaf_c_contiguous, leaf_writable: every array's,
    in flattened order (for callers that pair arrays, such as the fused
    optimizers' gradients and variables); leaf_type: the type every array
    has, or None when they have several; write_error: why ``unscale_`` must
    refuse these arrays (read-only, sharing memory), or None; payload: a
    dict the launcher keeps its device tables in, freed with the plan.
    """
    cdef leaf_t *leaves
    cdef int _kind              # the table's reader: how same_shapes reads a shape
    cdef readonly Py_ssize_t narrays
    cdef readonly list groups
    cdef readonly tuple devices
    cdef readonly tuple codes
    cdef readonly object leaf_addresses, leaf_counts, leaf_codes, leaf_devices
    cdef readonly object leaf_c_contiguous, leaf_writable
    cdef readonly object leaf_type
    cdef readonly object write_error
    cdef public dict payload
    cdef list _keep

    def __cinit__(self):
        self.leaves = NULL
        self.narrays = 0
        self.groups = []
        self.devices = ()
        self.codes = ()
        self.leaf_type = None
        self.write_error = None
        self.payload = {}
        self._keep = []
        self._kind = 0

    def same_shapes(self, DevicePlan other):
        """Whether each array of this plan has the shape of the array at its place in
        `other` (``a.shape == b.shape`` for every pair; False for lists of different
        lengths), read from the arrays now; None when it cannot tell: a plan that
        keeps no arrays (one took no weak reference) or an array gone since.

        The fused optimizers' pairing of gradients with variables, without a
        Python loop over the pairs.
        """
        cdef Py_ssize_t i
        cdef PyObject *a
        cdef PyObject *b
        cdef int nd
        cdef Py_ssize_t n = len(self.leaf_codes) if self.leaf_codes is not None else 0
        if n != (len(other.leaf_codes) if other.leaf_codes is not None else 0):
            return False
        if n == 0:
            return True
        if self.leaves == NULL or other.leaves == NULL:
            return None
        cdef object shape
        for i in range(n):
            a = PyWeakref_GET_OBJECT(<object>self.leaves[i].ref)
            if a == <PyObject *>None:
                return None
            if self._kind == R_NUMPY and other._kind == R_NUMPY:
                b = PyWeakref_GET_OBJECT(<object>other.leaves[i].ref)
                if b == <PyObject *>None:
                    return None
                nd = cnp.PyArray_NDIM(<cnp.ndarray>a)
                if nd != cnp.PyArray_NDIM(<cnp.ndarray>b) or (nd and memcmp(
                        cnp.PyArray_DIMS(<cnp.ndarray>a), cnp.PyArray_DIMS(<cnp.ndarray>b),
                        nd * sizeof(cnp.npy_intp)) != 0):
                    return False
                continue
            # an attribute read may run Python code: each array is taken when it is read
            shape = PyObject_GetAttr(<object>a, _A_SHAPE)
            b = PyWeakref_GET_OBJECT(<object>other.leaves[i].ref)
            if b == <PyObject *>None:
                return None
            if PyObject_GetAttr(<object>b, _A_SHAPE) != shape:
                return False
        return True

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.leaves != NULL:
            for i in range(self.narrays):
                Py_XDECREF(self.leaves[i].ref)
            PyMem_Free(self.leaves)


cdef class DeviceTable:
    """Walks nested device arrays into cached, grouped plans.

    Parameters
    ----------
    array_type : type
        The arrays accepted (subclasses too); anything else is refused.
    kind : int
        READ_NUMPY or READ_CUDA_ARRAY: how an array's memory is read.
    classify : callable
        dtype -> lscore dtype code the kernels take (or the integer code),
        or None for a dtype they do not; remembered per dtype object.
    expected : str
        What the TypeError for any other leaf says is expected.
    hint : str
        The module named in the advice for a non-dense array.
    device : int
        The device of READ_NUMPY arrays.
    cache_size : int
        Plans kept, the least recently used dropped first (keyed by the first and
        last array of a list and the number of arrays).
    dl_device : int
        READ_DLPACK: the DLPack device type of the arrays (``DLPACK_DEVICES``);
        an array elsewhere is refused (TypeError), as is one DLPack cannot
        describe (sparse) or a subclass of `array_type`.  Only C-contiguous
        arrays are dense here.
    """
    cdef object _type
    cdef int _kind
    cdef lsc_dl_from_pyobject _dl
    cdef int _dl_device
    cdef object _classify
    cdef dict _codes
    cdef str _expected, _hint
    cdef int _device
    cdef Py_ssize_t _cache_size
    cdef dict _plans
    cdef DevicePlan _empty
    cdef PyObject **_buf
    cdef Py_ssize_t _n, _cap
    cdef object _attr           # plan(attr=...): the attribute read from each leaf
    cdef lsc_attrs _arrays, _datas  # an array's data, size, dtype; its data's ptr
    cdef readonly Py_ssize_t hits, misses

    def __cinit__(self):
        self._buf = NULL
        self._n = self._cap = 0

    def __init__(self, array_type, int kind, classify, str expected, str hint="numpy",
                 int device=0, Py_ssize_t cache_size=8, int dl_device=LSC_DL_CPU):
        if kind != READ_NUMPY and kind != READ_CUDA_ARRAY and kind != READ_DLPACK:
            raise ValueError(f"unknown reader kind {kind}")
        self._dl = NULL
        self._dl_device = dl_device
        if kind == READ_DLPACK:
            self._dl = _exchange_api(array_type)
            if self._dl == NULL:
                raise TypeError(f"{array_type.__qualname__} has no DLPack C exchange API")
        self._type = array_type
        self._kind = kind
        self._classify = classify
        self._codes = {}
        self._expected = expected
        self._hint = hint
        self._device = device
        self._cache_size = max(cache_size, 0)
        self._plans = {}
        self._empty = DevicePlan()
        self.hits = self.misses = 0

    def __dealloc__(self):
        PyMem_Free(self._buf)

    def __len__(self):
        return len(self._plans)

    def clear(self):
        """Forget every cached plan."""
        self._plans.clear()

    def plan(self, arrays, attr=None):
        """The DevicePlan of `arrays` (nested lists, tuples and dicts; None skipped).

        Reused when the same arrays come again in the same order, each with
        the address, size and dtype it had; built anew (and cached)
        otherwise.  Raises TypeError for a leaf that is not an array of the
        type, or of a dtype without a kernel, and ValueError for a non-dense
        array, before anything is launched.  With `attr` (a str), the arrays
        are that attribute of each leaf, read in the walk, and a leaf whose
        attribute is None is skipped (``attr="grad"``: the gradients of
        parameters).
        """
        cdef visitor v
        cdef Py_ssize_t i
        cdef DevicePlan p
        v.leaf = _collect_leaf
        v.reserve = _collect_reserve
        v.ctx = <void *>self
        self._n = 0
        if attr is not None and not isinstance(attr, str):
            raise TypeError(f"attr must be a str or None, got {type(attr).__name__}")
        self._attr = attr
        try:
            walk(arrays, &v)
            if self._n == 0:
                return self._empty
            # first and last leaf: lists that share their first arrays (an optimizer's
            # gradients then its variables, two optimizers over the same gradients)
            # keep their own plans
            key = (<Py_ssize_t>self._buf[0], <Py_ssize_t>self._buf[self._n - 1], self._n)
            cand = self._plans.get(key)
            if cand is not None and self._matches(<DevicePlan>cand):
                self.hits += 1
                # least recently used goes first: a list used every call (an optimizer's
                # variables) outlives lists seen once (gradients at new addresses)
                del self._plans[key]
                self._plans[key] = cand
                return cand
            self.misses += 1
            p = self._build()
            if p.leaves != NULL and self._cache_size:
                if cand is None and len(self._plans) >= self._cache_size:
                    del self._plans[next(iter(self._plans))]
                self._plans[key] = p
            return p
        finally:
            self._attr = None
            for i in range(self._n):
                Py_XDECREF(self._buf[i])
            self._n = 0

    cdef int _push(self, object x) except -1:
        cdef PyObject **buf
        cdef Py_ssize_t cap
        if self._n == self._cap:
            cap = 2 * self._cap if self._cap else 64
            buf = <PyObject **>PyMem_Realloc(self._buf, cap * sizeof(PyObject *))
            if buf == NULL:
                raise MemoryError()
            self._buf, self._cap = buf, cap
        Py_INCREF(x)
        self._buf[self._n] = <PyObject *>x
        self._n += 1
        return 0

    cdef bint _matches(self, DevicePlan p) except -1:
        """Whether the collected leaves are the plan's arrays, unchanged (one loop per
        reader kind: the per-array check is the whole cost of a cached call's walk)."""
        cdef Py_ssize_t i
        cdef leaf_t *e
        cdef PyObject *x
        cdef lsc_dl_tensor t
        cdef object data, dt
        if p.narrays != self._n:
            return False
        if self._kind == R_NUMPY:
            for i in range(self._n):
                x = self._buf[i]
                e = &p.leaves[i]
                if (PyWeakref_GET_OBJECT(<object>e.ref) != x
                        or <uint64_t><uintptr_t>cnp.PyArray_DATA(<cnp.ndarray>x) != e.ptr
                        or cnp.PyArray_SIZE(<cnp.ndarray>x) != e.n
                        or <PyObject *>cnp.PyArray_DESCR(<cnp.ndarray>x) != e.dtype
                        or (cnp.PyArray_FLAGS(<cnp.ndarray>x) & _NP_KEEP) != e.flags):
                    return False
        elif self._kind == R_DLPACK:
            for i in range(self._n):
                x = self._buf[i]
                e = &p.leaves[i]
                if PyWeakref_GET_OBJECT(<object>e.ref) != x:
                    return False
                if self._dl(<void *>x, &t) != 0:
                    PyErr_Clear()
                    return False
                if (<uint64_t><uintptr_t>t.data + t.byte_offset != e.ptr
                        or _numel(t.ndim, t.shape) != e.n):
                    return False
                dt = self._field(x, AT_DTYPE)
                if <PyObject *>dt != e.dtype:
                    return False
        else:
            for i in range(self._n):
                x = self._buf[i]
                e = &p.leaves[i]
                if PyWeakref_GET_OBJECT(<object>e.ref) != x:
                    return False
                if self._cuda_ptr(x) != e.ptr:
                    return False
                if PyLong_AsSsize_t(self._field(x, AT_SIZE)) != e.n:
                    return False
                dt = self._field(x, AT_DTYPE)
                if <PyObject *>dt != e.dtype:
                    return False
        return True

    cdef inline object _field(self, PyObject *x, int i):
        """Attribute `i` (AT_*) of array `x`, as getattr reads it (lsc_attr.h)."""
        return lsc_attr_get(&self._arrays, _ARRAY_ATTRS, N_ARRAY_ATTRS, x, i)

    cdef inline object _data_attr(self, object data, int i):
        """Attribute `i` (AT_PTR, AT_DEVICE) of an array's ``data``."""
        return lsc_attr_get(&self._datas, _DATA_ATTRS, N_DATA_ATTRS, <PyObject *>data, i)

    cdef uint64_t _cuda_ptr(self, PyObject *x) except? 0xFFFFFFFFFFFFFFFF:
        """``x.data.ptr`` of a CuPy-style array."""
        return PyLong_AsUnsignedLongLong(self._data_attr(self._field(x, AT_DATA), AT_PTR))

    cdef int _contiguity(self, x, bint *c_contiguous, bint *dense) except -1:
        """*c_contiguous, *dense (C- or F-contiguous) of a CuPy-style array: from its
        ``_c_contiguous`` and ``_f_contiguous`` fields where it has them, else its
        ``flags``."""
        try:
            c_contiguous[0] = self._field(<PyObject *>x, AT_C_CONTIGUOUS)
            dense[0] = c_contiguous[0] or self._field(<PyObject *>x, AT_F_CONTIGUOUS)
        except AttributeError:
            fl = PyObject_GetAttr(x, _A_FLAGS)
            c_contiguous[0] = fl.c_contiguous
            dense[0] = c_contiguous[0] or fl.f_contiguous
        return 0

    cdef tuple _read_dlpack(self, x, Py_ssize_t i, bint *dense):
        """(address, count, device index) of tensor `x` (leaf `i`) through DLPack;
        *dense: whether it is C-contiguous."""
        cdef lsc_dl_tensor t
        cdef int64_t expect = 1, n
        cdef int k
        if type(x) is not self._type:
            ty = type(x)
            raise TypeError(f"unsupported array type {ty.__module__}.{ty.__qualname__}; "
                            f"expected exactly {self._expected}")
        if self._dl(<void *>x, &t) != 0:
            PyErr_Clear()
            raise TypeError(f"array {i} (in flattened order) has no dense memory to read "
                            "(a sparse or other layout)")
        if t.device.device_type != self._dl_device:
            raise TypeError(f"array {i} (in flattened order) is on another device type")
        n = _numel(t.ndim, t.shape)
        dense[0] = True
        k = t.ndim
        while t.strides != NULL and n > 1 and k > 0:  # innermost dimension first
            k -= 1
            if t.shape[k] != 1 and t.strides[k] != expect:
                dense[0] = False
                break
            expect *= t.shape[k]
        return <uint64_t><uintptr_t>t.data + t.byte_offset, n, t.device.device_id

    cdef int _code(self, dt) except -2:
        cdef PyObject *c = PyDict_GetItem(self._codes, dt)
        if c != NULL:
            return <int><object>c
        code = self._classify(dt)
        self._codes[dt] = -1 if code is None else int(code)
        return self._codes[dt]

    cdef DevicePlan _build(self):
        cdef DevicePlan p = DevicePlan()
        cdef Py_ssize_t i, m = self._n, j
        cdef leaf_t *e
        cdef object x, data, dt, last_dt = None
        cdef int code, flags, last_code = -1, ng = 0
        cdef int64_t dev
        cdef bint dense, writable
        cdef uint64_t ptr
        cdef int64_t n
        cdef int64_t gdev[MAX_GROUPS]
        cdef int gcode[MAX_GROUPS]
        cdef lsc_order order
        cdef unsigned long long seen = 0
        cdef list codes = []
        cdef cnp.ndarray ptrs = np.empty(m, np.uint64), sizes = np.empty(m, np.int64)
        cdef cnp.ndarray gids = np.empty(m, np.int32)
        cdef uint64_t *P = <uint64_t *>cnp.PyArray_DATA(ptrs)
        cdef int64_t *S = <int64_t *>cnp.PyArray_DATA(sizes)
        cdef int32_t *G = <int32_t *>cnp.PyArray_DATA(gids)
        cdef cnp.ndarray lcodes = np.empty(m, np.int8), ldevs = np.empty(m, np.int64)
        cdef cnp.ndarray lc = np.empty(m, np.bool_), lw = np.empty(m, np.bool_)
        cdef int8_t *LC = <int8_t *>cnp.PyArray_DATA(lcodes)
        cdef int64_t *LD = <int64_t *>cnp.PyArray_DATA(ldevs)
        cdef cnp.npy_bool *LCC = <cnp.npy_bool *>cnp.PyArray_DATA(lc)
        cdef cnp.npy_bool *LW = <cnp.npy_bool *>cnp.PyArray_DATA(lw)
        cdef bint c_contiguous, one_type = True
        cdef PyTypeObject *first_type = NULL
        lsc_order_init(&order)
        p.leaves = <leaf_t *>PyMem_Malloc(m * sizeof(leaf_t))
        if p.leaves == NULL:
            raise MemoryError()
        p.narrays = 0
        for i in range(m):
            x = <object>self._buf[i]
            if i == 0:
                first_type = Py_TYPE(x)
            elif Py_TYPE(x) != first_type:
                one_type = False
            if not isinstance(x, self._type):
                ty = type(x)
                raise TypeError(f"unsupported array type {ty.__module__}.{ty.__qualname__}; "
                                f"expected {self._expected}")
            if self._kind == R_NUMPY:
                if not cnp.PyArray_Check(x):
                    raise TypeError(f"DeviceTable(READ_NUMPY) needs numpy arrays, got {type(x)}")
                ptr = <uint64_t><uintptr_t>cnp.PyArray_DATA(<cnp.ndarray>x)
                n = cnp.PyArray_SIZE(<cnp.ndarray>x)
                dt = <object><PyObject *>cnp.PyArray_DESCR(<cnp.ndarray>x)
                flags = cnp.PyArray_FLAGS(<cnp.ndarray>x) & _NP_KEEP
                dense = (flags & (cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_F_CONTIGUOUS)) != 0
                c_contiguous = (flags & cnp.NPY_ARRAY_C_CONTIGUOUS) != 0
                writable = (flags & cnp.NPY_ARRAY_WRITEABLE) != 0
                dev = self._device
            elif self._kind == R_DLPACK:
                ptr, n, dev = self._read_dlpack(x, i, &dense)
                c_contiguous = dense
                dt = self._field(<PyObject *>x, AT_DTYPE)
                flags = 0
                writable = True
            else:
                data = self._field(<PyObject *>x, AT_DATA)
                ptr = PyLong_AsUnsignedLongLong(self._data_attr(data, AT_PTR))
                dev = self._data_attr(data, AT_DEVICE)
                n = PyLong_AsSsize_t(self._field(<PyObject *>x, AT_SIZE))
                dt = self._field(<PyObject *>x, AT_DTYPE)
                flags = 0
                dense = c_contiguous = True
                if n > 1:
                    self._contiguity(x, &c_contiguous, &dense)
                writable = True
            if dt is not last_dt:
                last_code = self._code(dt)
                last_dt = dt
            code = last_code
            if code < 0:
                raise TypeError(f"unsupported dtype {dt}; supported: float16, bfloat16, "
                                "float32, float64 and integer/bool arrays")
            if not dense and self._kind == R_DLPACK:
                raise ValueError(f"the GPU kernels need C-contiguous tensors; array {i} (in "
                                 "flattened order) is not: pass .contiguous()")
            if not dense:
                raise ValueError(_dense_message(x, i, self._hint))
            e = &p.leaves[i]
            e.ref = NULL
            e.dtype = <PyObject *>dt
            e.ptr, e.n, e.flags = ptr, n, flags
            try:
                ref = PyWeakref_NewRef(x, None)
            except TypeError:        # cannot be cached: checked afresh every call
                ref = None
            if ref is not None:
                Py_INCREF(ref)
                e.ref = <PyObject *>ref
            p.narrays += 1
            if i == 0 or <PyObject *>dt != p.leaves[i - 1].dtype:
                p._keep.append(dt)
            P[i], S[i], G[i] = ptr, n, -1
            LC[i], LD[i], LCC[i], LW[i] = code, dev, c_contiguous, writable
            if not (seen >> code) & 1:
                seen |= 1ull << code
                codes.append(code)
            if code == LSC_CODE_INT or n == 0:
                continue
            if not writable and p.write_error is None:
                p.write_error = (f"unscale_ needs writable arrays; array {i} (in flattened "
                                 "order) is read-only")
            # the (device, code) group: most lists have one, so try the last one first
            j = ng - 1
            if j < 0 or gdev[j] != dev or gcode[j] != code:
                j = 0
                while j < ng and (gdev[j] != dev or gcode[j] != code):
                    j += 1
                if j == ng:
                    if ng == MAX_GROUPS:
                        raise ValueError(f"more than {MAX_GROUPS} (device, dtype) groups")
                    gdev[j], gcode[j] = dev, code
                    ng += 1
            G[i] = j
            lsc_order_add(&order, <size_t>ptr, <size_t>(ptr + <uint64_t>(n * lsc_code_width(code))), 0)
        if p.write_error is None and not (order.up or order.down):
            p.write_error = _shared_memory(ptrs, sizes, gids, [gcode[j] for j in range(ng)])
        if ng == 1 and m == p.narrays and (gids >= 0).all():
            p.groups = [(gdev[0], gcode[0], ptrs, sizes)]
        else:
            p.groups = [(gdev[j], gcode[j], ptrs[gids == j], sizes[gids == j])
                        for j in range(ng)]
        p.devices = tuple(dict.fromkeys(gdev[j] for j in range(ng)))
        p.codes = tuple(codes)
        p.leaf_addresses, p.leaf_counts, p.leaf_codes = ptrs, sizes, lcodes
        p.leaf_devices, p.leaf_c_contiguous, p.leaf_writable = ldevs, lc, lw
        p.leaf_type = <object>first_type if one_type and m else None
        p._kind = self._kind
        for i in range(m):
            if p.leaves[i].ref == NULL:       # one uncacheable array: the plan is not kept
                for j in range(m):
                    Py_XDECREF(p.leaves[j].ref)
                PyMem_Free(p.leaves)
                p.leaves = NULL
                p.narrays = 0
                break
        return p


cdef object _shared_memory(cnp.ndarray ptrs, cnp.ndarray sizes, cnp.ndarray gids, list codes):
    """unscale_'s message when two of the floating arrays share memory, else None
    (byte ranges sorted by start: one overlaps an earlier one exactly when it
    starts before the furthest end so far)."""
    keep = gids >= 0
    idx = np.flatnonzero(keep)
    widths = np.array([lsc_code_width(c) for c in codes], np.uint64)[gids[keep]]
    lo = ptrs[keep]
    hi = lo + sizes[keep].astype(np.uint64) * widths
    order = np.argsort(lo, kind="stable")
    lo, hi, idx = lo[order], hi[order], idx[order]
    reach = np.maximum.accumulate(hi)
    clash = np.flatnonzero(lo[1:] < reach[: reach.size - 1])
    if clash.size:
        b = int(clash[0]) + 1
        a = int(np.flatnonzero(hi[:b] > lo[b])[0])
        i, j = sorted((int(idx[a]), int(idx[b])))
        return (f"unscale_ needs arrays that do not share memory; arrays {i} and {j} "
                "(in flattened order) overlap, so some elements would be multiplied "
                "twice (the same array passed twice?)")
    return None


cdef str _dense_message(x, Py_ssize_t i, str hint):
    shape, strides = getattr(x, "shape", None), getattr(x, "strides", None)
    if _self_overlapping(shape, strides, x):
        return (f"the GPU kernels need arrays whose elements do not overlap; array {i} (in "
                f"flattened order) has shape {shape} strides {strides}")
    return (f"the GPU kernels need dense arrays (C- or F-contiguous); array {i} (in flattened "
            f"order) has shape {shape} strides {strides}; pass {hint}.ascontiguousarray(a)")


cdef bint _self_overlapping(shape, strides, x) except -1:
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


cdef int _collect_leaf(void *ctx, object x) except -1:
    cdef DeviceTable t = <DeviceTable>ctx
    if t._attr is not None:
        x = PyObject_GetAttr(x, t._attr)
        if x is None:
            return 0
    return t._push(x)


cdef int _collect_reserve(void *ctx, Py_ssize_t n) except -1:
    return 0


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
