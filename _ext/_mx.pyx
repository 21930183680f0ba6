# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: this module hands NumPy arrays to the block-scaled formats' scalar
# rules of lsc_mx.h: E8M0 and E2M1 codes elementwise, block scale codes of
# amaxes, and the MX and NVFP4 quantization of whole blocks along the last
# axis, one block at a time through the header's scalar block functions
# (not yet a vectorised pass).  It checks only what keeps memory safe and
# names the formats and modes; the rules are lsc_mx.h's and the slow twin
# is lscore/_reference_mx.py (mx_*, nvfp4_*).
cimport numpy as cnp
from libc.stdint cimport uint32_t

import numpy as np

from _dtypes cimport *

cnp.import_array()

cdef extern from "lsc_mx.h" nogil:
    enum:
        LSC_MX_FLOOR
        LSC_MX_CEIL
        LSC_MX_EVEN
        LSC_MX_RCEIL
        LSC_MX_TE
        LSC_MX_OCP
        LSC_MX_E2M1
    float lsc_e8m0_to_f32(uint32_t c)
    uint32_t lsc_e8m0_from_f32(float f)
    uint32_t lsc_e2m1_from_f32(float f)
    float lsc_e2m1_to_f32(uint32_t c)
    uint32_t lsc_mx_scale(float amax, int elem, int mode)
    uint32_t lsc_mx_block(const float *x, long n, int elem, int mode, unsigned char *q)
    float lsc_nvfp4_tensor_scale(float amax)
    uint32_t lsc_nvfp4_block(const float *x, long n, int has_pts, float pts, unsigned char *q)

#: block scale rule name -> its code (lsc_mx.h)
MODES = {"floor": LSC_MX_FLOOR, "ceil": LSC_MX_CEIL, "even": LSC_MX_EVEN,
         "rceil": LSC_MX_RCEIL, "te": LSC_MX_TE, "ocp": LSC_MX_OCP}
#: MX element format name -> its code (lsc_mx.h)
ELEMS = {"float8_e4m3fn": LSC_CODE_E4M3FN, "float8_e5m2": LSC_CODE_E5M2,
         "float4_e2m1": LSC_MX_E2M1}


cdef int _code(dict table, str what, str name) except? -99:
    code = table.get(name)
    if code is None:
        raise ValueError(f"{what} must be one of: {', '.join(table)}; got {name!r}")
    return code


def _f32(x):
    """`x` as a C-contiguous float32 array (float16 and bfloat16 widen exactly)."""
    return np.ascontiguousarray(x, dtype=np.float32)


def _u8(q):
    return np.ascontiguousarray(np.asarray(q).view(np.uint8))


cdef object _decode(q, bint e2m1):
    """The float32 value of each code (E2M1: of each byte's low nibble)."""
    cdef const unsigned char[::1] c = _u8(q).ravel()
    out = np.empty(c.shape[0], np.float32)
    cdef float[::1] o = out
    cdef Py_ssize_t i
    for i in range(c.shape[0]):
        o[i] = lsc_e2m1_to_f32(c[i]) if e2m1 else lsc_e8m0_to_f32(c[i])
    return out.reshape(np.shape(q))


cdef object _encode(x, bint e2m1):
    """The code of each float32 value, one per byte."""
    cdef const float[::1] v = _f32(x).ravel()
    out = np.empty(v.shape[0], np.uint8)
    cdef unsigned char[::1] o = out
    cdef Py_ssize_t i
    for i in range(v.shape[0]):
        o[i] = lsc_e2m1_from_f32(v[i]) if e2m1 else lsc_e8m0_from_f32(v[i])
    return out.reshape(np.shape(x))


def e8m0_decode(q):
    """The float32 value of each E8M0 code."""
    return _decode(q, False)


def e8m0_encode(x):
    """The E8M0 code of each float32 power of two (0xFF for anything else)."""
    return _encode(x, False)


def e2m1_encode(x):
    """The E2M1 code of each float32 value, one code per byte (low nibble)."""
    return _encode(x, True)


def e2m1_decode(q):
    """The float32 value of each E2M1 code (low nibble of each byte)."""
    return _decode(q, True)


def scale(amax, str elem, str mode):
    """The E8M0 block scale code of each float32 amax, by rule `mode` for element `elem`."""
    cdef int e = _code(ELEMS, "elem", elem), m = _code(MODES, "mode", mode)
    cdef const float[::1] v = _f32(amax).ravel()
    out = np.empty(v.shape[0], np.uint8)
    cdef unsigned char[::1] o = out
    cdef Py_ssize_t i
    for i in range(v.shape[0]):
        o[i] = lsc_mx_scale(v[i], e, m)
    return out.reshape(np.shape(amax))


cdef tuple _blocks(x, long block):
    a = _f32(x)
    shape = tuple(a.shape)
    if not shape or shape[len(shape) - 1] % block:
        raise ValueError(f"the last axis must be a multiple of {block}, got shape {shape}")
    return a, shape[:len(shape) - 1] + (shape[len(shape) - 1] // block,)


def quantize(x, str elem, str mode, long block=32):
    """MX quantization of `x` along its last axis, in blocks of `block`: (scale codes,
    element codes); E2M1 elements are packed two per byte, the first in the low nibble."""
    cdef int e = _code(ELEMS, "elem", elem), m = _code(MODES, "mode", mode)
    if block < 2 or block % 2:
        raise ValueError(f"block must be an even integer >= 2, got {block}")
    a, sshape = _blocks(x, block)
    cdef long width = block // 2 if e == LSC_MX_E2M1 else block
    cdef const float[::1] v = a.ravel()
    cdef long nb = v.shape[0] // block, i
    scales = np.empty(nb, np.uint8)
    q = np.empty(nb * width, np.uint8)
    cdef unsigned char[::1] s = scales
    cdef unsigned char[::1] qv = q
    if nb:
        with nogil:
            for i in range(nb):
                s[i] = lsc_mx_block(&v[i * block], block, e, m, &qv[i * width])
    return scales.reshape(sshape), q.reshape(sshape[:len(sshape) - 1] + (sshape[len(sshape) - 1] * width,))


def nvfp4_tensor_scale(float amax):
    """NVFP4's per-tensor scale of a tensor amax: amax / (448 * 6) in float32."""
    return lsc_nvfp4_tensor_scale(amax)


def nvfp4_quantize(x, pts=None):
    """NVFP4 quantization of `x` along its last axis in blocks of 16, with the per-tensor
    scale `pts` (float32) or none: (E4M3 block scale codes, packed E2M1 codes)."""
    a, sshape = _blocks(x, 16)
    cdef const float[::1] v = a.ravel()
    cdef long nb = v.shape[0] // 16, i
    cdef int has = pts is not None
    cdef float p = pts if has else 1.0
    scales = np.empty(nb, np.uint8)
    q = np.empty(nb * 8, np.uint8)
    cdef unsigned char[::1] s = scales
    cdef unsigned char[::1] qv = q
    if nb:
        with nogil:
            for i in range(nb):
                s[i] = lsc_nvfp4_block(&v[i * 16], 16, has, p, &qv[i * 8])
    return scales.reshape(sshape), q.reshape(sshape[:len(sshape) - 1] + (sshape[len(sshape) - 1] * 8,))
