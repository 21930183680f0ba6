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
# the gradients of torch-style parameter groups are read by _grads.pyx; the launches
# over a walked plan are split and packed by _pack.pyx.
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
from _devwalk cimport *

import numpy as np

cnp.import_array()


# the readers by name, for lscore.kernels (the walk reads the C constants of _walk.pxd)
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

cdef PyObject *_ARRAY_ATTRS[N_ARRAY_ATTRS]
_ARRAY_ATTRS[:] = [<PyObject *>_A_DATA, <PyObject *>_A_SIZE, <PyObject *>_A_DTYPE,
                   <PyObject *>_A_C_CONTIGUOUS, <PyObject *>_A_F_CONTIGUOUS]
cdef PyObject *_DATA_ATTRS[N_DATA_ATTRS]
_DATA_ATTRS[:] = [<PyObject *>_A_PTR, <PyObject *>_A_DEVICE]

DEF MAX_GROUPS = 256

cdef int _NP_KEEP = (cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_F_CONTIGUOUS
                     | cnp.NPY_ARRAY_WRITEABLE)

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
                raise ValueError(dense_message(x, i, self._hint))
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


cdef int _collect_leaf(void *ctx, object x) except -1:
    cdef DeviceTable t = <DeviceTable>ctx
    if t._attr is not None:
        x = PyObject_GetAttr(x, t._attr)
        if x is None:
            return 0
    return t._push(x)


cdef int _collect_reserve(void *ctx, Py_ssize_t n) except -1:
    return 0
