# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: this module hands NumPy arrays to lsc_fp8_scale.h: the two
# current-scaling rules over a float32 array of amaxes, and Fp8Delayed, which
# owns one lsc_fp8_delayed struct and the arrays it points to (history,
# scale, scale_inv, the per-tensor scaled maxima, the update's scratch).  It
# checks only what keeps memory safe (dtypes, shapes, contiguity); the
# parameters' meaning and their validation are lscore/fp8/recipes.py's and
# lscore/fp8/delayed.py's, and the slow twin is lscore/_reference_fp8.py.
cimport numpy as cnp
from libc.stdint cimport int64_t

import numpy as np

cnp.import_array()

cdef extern from "lsc_fp8_scale.h" nogil:
    enum:
        LSC_FP8_AMAX_MAX
        LSC_FP8_AMAX_MOST_RECENT
    ctypedef struct lsc_fp8_delayed:
        int64_t n
        int64_t len
        int algo
        int amax_nan
        float *history
        float *scale
        float *scale_inv
        const float *scaled_max
        float *work
    float lsc_fp8_scale_te(float amax, float fp8_max, int pow2, float eps)
    float lsc_fp8_scale_torchao(float amax, double fp8_max, int pow2, double eps)
    float lsc_fp8_scaled_max(float fp8_max, int margin)
    void lsc_fp8_delayed_record(lsc_fp8_delayed *s, const float *amax)
    void lsc_fp8_delayed_update(lsc_fp8_delayed *s)

#: amax selection name -> its code (lsc_fp8_scale.h)
AMAX_ALGOS = {"max": LSC_FP8_AMAX_MAX, "most_recent": LSC_FP8_AMAX_MOST_RECENT}


cdef int _check_f32(cnp.ndarray a, str what) except -1:
    if cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT or cnp.PyArray_ISBYTESWAPPED(a):
        raise TypeError(f"{what} must be native float32, got {a.dtype}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise ValueError(f"{what} must be C-contiguous")
    return 0


cdef int _check_pair(cnp.ndarray amax, cnp.ndarray out) except -1:
    _check_f32(amax, "amax")
    _check_f32(out, "out")
    if not cnp.PyArray_ISWRITEABLE(out):
        raise ValueError("out must be writable")
    if cnp.PyArray_SIZE(out) != cnp.PyArray_SIZE(amax):
        raise ValueError(f"out must have {cnp.PyArray_SIZE(amax)} elements, "
                         f"got {cnp.PyArray_SIZE(out)}")
    return 0


cdef int _scales(cnp.ndarray amax, cnp.ndarray out, bint torchao, double fp8_max, bint pow2,
                 double eps) except -1:
    _check_pair(amax, out)
    cdef const float *a = <const float *>cnp.PyArray_DATA(amax)
    cdef float *o = <float *>cnp.PyArray_DATA(out)
    cdef Py_ssize_t i, n = cnp.PyArray_SIZE(amax)
    cdef float fmax = <float>fp8_max, feps = <float>eps
    with nogil:
        for i in range(n):
            o[i] = (lsc_fp8_scale_torchao(a[i], fp8_max, pow2, eps) if torchao
                    else lsc_fp8_scale_te(a[i], fmax, pow2, feps))
    return 0


def scale_te(cnp.ndarray amax, cnp.ndarray out, double fp8_max, bint pow2, double eps):
    """out[i] = TransformerEngine's current-scaling scale of amax[i] (float32, C-contiguous);
    fp8_max and eps are taken as float32, as TransformerEngine's rule takes them."""
    _scales(amax, out, False, fp8_max, pow2, eps)


def scale_torchao(cnp.ndarray amax, cnp.ndarray out, double fp8_max, bint pow2, double eps):
    """out[i] = torchao's amax_to_scale of amax[i] (float32, C-contiguous); fp8_max and eps
    are float64, as torchao divides."""
    _scales(amax, out, True, fp8_max, pow2, eps)


def scaled_max(float fp8_max, int margin):
    """TransformerEngine's fp8_max * 2^-margin, in float32."""
    return lsc_fp8_scaled_max(fp8_max, margin)


cdef class Fp8Delayed:
    """TransformerEngine's delayed-scaling state of n tensors in one C struct, and the arrays
    it owns: history [length, n] (row 0 the current amaxes), scale and scale_inv [n]."""
    cdef lsc_fp8_delayed s
    cdef cnp.ndarray _history, _scale, _scale_inv, _scaled_max, _work

    def __init__(self, Py_ssize_t n, Py_ssize_t length, str algo, bint amax_nan,
                 cnp.ndarray scaled_max):
        if n < 1 or length < 1:
            raise ValueError(f"n and length must be >= 1, got {n} and {length}")
        _check_f32(scaled_max, "scaled_max")
        if cnp.PyArray_SIZE(scaled_max) != n:
            raise ValueError(f"scaled_max must have {n} elements, got {scaled_max.size}")
        self._history = np.zeros((length, n), np.float32)
        self._scale = np.ones(n, np.float32)
        self._scale_inv = np.ones(n, np.float32)
        self._scaled_max = scaled_max.copy()
        self._work = np.zeros(2 * n, np.float32)
        self.s.n = n
        self.s.len = length
        self.s.algo = AMAX_ALGOS[algo]
        self.s.amax_nan = amax_nan
        self.s.history = <float *>cnp.PyArray_DATA(self._history)
        self.s.scale = <float *>cnp.PyArray_DATA(self._scale)
        self.s.scale_inv = <float *>cnp.PyArray_DATA(self._scale_inv)
        self.s.scaled_max = <const float *>cnp.PyArray_DATA(self._scaled_max)
        self.s.work = <float *>cnp.PyArray_DATA(self._work)

    def record(self, cnp.ndarray amax):
        """Max-accumulate amax (float32 [n]) into the current history row."""
        _check_f32(amax, "amax")
        if cnp.PyArray_SIZE(amax) != self.s.n:
            raise ValueError(f"amax must have {self.s.n} elements, got {amax.size}")
        cdef const float *a = <const float *>cnp.PyArray_DATA(amax)
        with nogil:
            lsc_fp8_delayed_record(&self.s, a)

    def update(self):
        """One update of every tensor: the roll, the amax selection, scale and scale_inv."""
        with nogil:
            lsc_fp8_delayed_update(&self.s)

    def set_current(self, cnp.ndarray amax):
        """Replace the current history row by amax (float32 [n]): the reduced amaxes."""
        _check_f32(amax, "amax")
        if cnp.PyArray_SIZE(amax) != self.s.n:
            raise ValueError(f"amax must have {self.s.n} elements, got {amax.size}")
        self._history[0, :] = amax

    def load(self, cnp.ndarray history, cnp.ndarray scale, cnp.ndarray scale_inv):
        """Take a whole state (float32 [length, n], [n], [n]), all or nothing."""
        _check_f32(history, "history")
        _check_f32(scale, "scale")
        _check_f32(scale_inv, "scale_inv")
        if ((<object>history).shape != (<object>self._history).shape
                or scale.size != self.s.n or scale_inv.size != self.s.n):
            raise ValueError("history, scale and scale_inv must match the state's shapes")
        self._history[...] = history
        self._scale[...] = scale
        self._scale_inv[...] = scale_inv

    @property
    def history(self):
        """A copy of the history, float32 [length, n]."""
        return self._history.copy()

    @property
    def current(self):
        """A copy of the current row, float32 [n]."""
        return self._history[0].copy()

    @property
    def scale(self):
        """A copy of the scales, float32 [n]."""
        return self._scale.copy()

    @property
    def scale_inv(self):
        """A copy of the scales' inverses, float32 [n]."""
        return self._scale_inv.copy()

    def __reduce__(self):
        raise TypeError("Fp8Delayed is not picklable; pickle the lscore object that owns it")
