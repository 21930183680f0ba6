# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: this module hands NumPy arrays to the block-scaled formats' rules
# of lsc_mx.h: E8M0 and E2M1 codes elementwise, block scale codes of amaxes,
# and the MX and NVFP4 quantization of blocks along the last axis or the
# first (a 2-D input), by the header's fused block passes over the input
# read in place (float32, float16, bfloat16; any strides), the GIL released.
# It checks what keeps memory safe and names the formats and modes; the
# rules are lsc_mx.h's and the slow twin is lscore/_reference_mx.py.
include "_array_kernels.pxi"

import numpy as np

cdef extern from "lsc_mx.h" nogil:
    ctypedef struct lsc_mx_rule:
        int elem
        int mode
        int has_pts
        float pts
        int64_t block
        int pow2
        double eps
        float inf_value
        int swidth
    ctypedef struct lsc_mx_isa:
        const char *name
    enum:
        LSC_MX_NVFP4
        LSC_MX_CHUNK
        LSC_NISAS
    int lsc_isa_supported(int level)
    const char *lsc_isa_names[]
    int lsc_mx_isa_select(const char *name)
    const lsc_mx_isa *lsc_mx_isa_get()
    void lsc_mx_job_run(const char *x, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                        int code, int axis, const lsc_mx_rule *k, unsigned char *s,
                        unsigned char *q, lsc_for_fn for_fn, int threads)
    void lsc_mx_tile_run(const char *x, int64_t rows, int64_t cols, int64_t rs, int code,
                         const lsc_mx_rule *k, unsigned char *s, unsigned char *q,
                         lsc_for_fn for_fn, int threads)
    enum:
        LSC_MX_FLOOR
        LSC_MX_CEIL
        LSC_MX_EVEN
        LSC_MX_RCEIL
        LSC_MX_TE
        LSC_MX_OCP
        LSC_MX_TE32
        LSC_MX_AO32
        LSC_MX_NEXT
        LSC_MX_E2M1
    float lsc_e8m0_to_f32(uint32_t c)
    uint32_t lsc_e8m0_from_f32(float f)
    uint32_t lsc_e2m1_from_f32(float f)
    float lsc_e2m1_to_f32(uint32_t c)
    uint32_t lsc_mx_scale(float amax, int elem, int mode)
    uint32_t lsc_mx_block(const float *x, long n, int elem, int mode, unsigned char *q)
    float lsc_nvfp4_tensor_scale(float amax)
    uint32_t lsc_nvfp4_block(const float *x, long n, int has_pts, float pts, unsigned char *q)
    int lsc_mx_wide(int mode)
    float lsc_bw_scale(float amax, int elem, int mode, int pow2, double eps, float inf_value)
    float lsc_bw_inf_value(int code)

#: block scale rule name -> its code (lsc_mx.h): the rules of TE v2.18, torchao v0.18.0 and
#: OCP, and the next revisions where a library changed one (NVIDIA/TransformerEngine#3262:
#: "te-3262"; pytorch/ao#4725: "floor-4725" ... "rceil-4725")
MODES = {"floor": LSC_MX_FLOOR, "ceil": LSC_MX_CEIL, "even": LSC_MX_EVEN,
         "rceil": LSC_MX_RCEIL, "te": LSC_MX_TE, "ocp": LSC_MX_OCP,
         "te-3262": LSC_MX_TE | LSC_MX_NEXT, "floor-4725": LSC_MX_FLOOR | LSC_MX_NEXT,
         "ceil-4725": LSC_MX_CEIL | LSC_MX_NEXT, "even-4725": LSC_MX_EVEN | LSC_MX_NEXT,
         "rceil-4725": LSC_MX_RCEIL | LSC_MX_NEXT}
#: the float32 scale rules (blockwise FP8: float32 scales, float8 elements) -> their codes
WIDE_MODES = {"te-fp32": LSC_MX_TE32, "torchao-fp32": LSC_MX_AO32}
_ALL_MODES = {**MODES, **WIDE_MODES}
# input dtype name -> its code (TE's scale for an Inf quotient is its largest value)
_DTYPE_CODES = {"float32": LSC_CODE_F32, "float16": LSC_CODE_F16, "bfloat16": LSC_CODE_BF16}
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
    if mode in WIDE_MODES:
        raise ValueError(f"mode {mode!r} has float32 scales: see blockwise_scale")
    cdef int e = _code(ELEMS, "elem", elem), m = _code(MODES, "mode", mode)
    cdef const float[::1] v = _f32(amax).ravel()
    out = np.empty(v.shape[0], np.uint8)
    cdef unsigned char[::1] o = out
    cdef Py_ssize_t i
    for i in range(v.shape[0]):
        o[i] = lsc_mx_scale(v[i], e, m)
    return out.reshape(np.shape(amax))




def blockwise_scale(amax, str elem, str mode, bint pow2=False, double eps=0.0,
                    str dtype="float32"):
    """The float32 block scale of each float32 amax by float32 rule `mode` ("te-fp32",
    "torchao-fp32") for float8 element `elem`, an input of `dtype` (TE's Inf quotient)."""
    cdef int e = _code(ELEMS, "elem", elem), m = _code(_ALL_MODES, "mode", mode)
    if not lsc_mx_wide(m) or e == LSC_MX_E2M1:
        raise ValueError(f"mode must be one of {', '.join(WIDE_MODES)} with a float8 element, "
                         f"got {mode!r}, {elem!r}")
    cdef float inf_value = lsc_bw_inf_value(_code(_DTYPE_CODES, "dtype", dtype))
    cdef const float[::1] v = _f32(amax).ravel()
    out = np.empty(v.shape[0], np.float32)
    cdef float[::1] o = out
    cdef Py_ssize_t i
    for i in range(v.shape[0]):
        o[i] = lsc_bw_scale(v[i], e, m, pow2, eps, inf_value)
    return out.reshape(np.shape(amax))


cdef int _input_code(cnp.ndarray a):
    """The dtype code of an input read in place, or -1 (read as a float32 copy)."""
    cdef int t = cnp.PyArray_TYPE(a)
    if cnp.PyArray_ISBYTESWAPPED(a):
        return -1
    if t == cnp.NPY_FLOAT:
        return LSC_CODE_F32
    if t == NPY_HALF:
        return LSC_CODE_F16
    if t >= NPY_USERDEF and a.dtype.name == "bfloat16":
        return LSC_CODE_BF16
    return -1


cdef cnp.ndarray _read_input(x, int threads, int *code):
    """`x` as the passes read it (float32, float16, bfloat16 in place; else a float32 copy),
    its dtype code into *code."""
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    cdef cnp.ndarray a = np.asarray(x)
    code[0] = _input_code(a)
    if code[0] < 0:
        a = np.asarray(a, np.float32)
        code[0] = LSC_CODE_F32
    return a


cdef object _out_array(object given, tuple shape, str what, bint wide=False):
    """`given` checked (a writable C-contiguous array of 1-byte codes, any 1-byte dtype:
    uint8 or an ml_dtypes view; `wide`: float32) as a uint8 (float32) view, or a new one."""
    if given is None:
        return np.empty(shape, np.float32 if wide else np.uint8)
    if not isinstance(given, np.ndarray) or (
            cnp.PyArray_TYPE(<cnp.ndarray>given) != cnp.NPY_FLOAT if wide
            else cnp.PyArray_ITEMSIZE(<cnp.ndarray>given) != 1):
        kind = "float32 scales" if wide else "1-byte codes"
        raise ValueError(f"out {what} must be a NumPy array of {kind}, got {given!r:.60}")
    if not given.flags.c_contiguous or not given.flags.writeable:
        raise ValueError(f"out {what} must be a writable C-contiguous array")
    if given.shape != shape:
        raise ValueError(f"out {what} must have shape {shape}, got {given.shape}")
    return given if wide else given.view(np.uint8)


cdef tuple _run(x, lsc_mx_rule *k, int axis, out, int threads):
    """The fused block pass of rule `k` over `x` along `axis`: (scales, codes), into `out`
    when given (returned as given), on at most `threads` threads (0: by the size)."""
    cdef int code
    cdef cnp.ndarray a = _read_input(x, threads, &code)
    shape = tuple((<object>a).shape)
    cdef int64_t block = k.block, rows, cols, rs, cs
    cdef bint e2 = k.elem == LSC_MX_E2M1
    sshape, qshape = block_shapes(shape, block, axis, e2)
    cols = shape[1] if axis == 0 else shape[len(shape) - 1]
    if out is None:
        out = (None, None)
    elif not isinstance(out, tuple) or len(out) != 2:
        raise ValueError(f"out must be a tuple (scales, data), got {type(out).__name__}")
    cdef cnp.ndarray s = _out_array(out[0], sshape, "scales", k.swidth == 4)
    cdef cnp.ndarray q = _out_array(out[1], qshape, "data")
    if a.size == 0:
        return (out[0] if out[0] is not None else s, out[1] if out[1] is not None else q)
    cdef unsigned char *sp = <unsigned char *>cnp.PyArray_DATA(s)
    cdef unsigned char *qp = <unsigned char *>cnp.PyArray_DATA(q)
    cdef const char *xp
    k.inf_value = lsc_bw_inf_value(code)
    if axis == 0:
        rows, rs, cs = shape[0], (<object>a).strides[0], (<object>a).strides[1]
    elif a.ndim == 1:
        rows, rs, cs = 1, 0, (<object>a).strides[0]
    else:
        v = a.reshape(-1, cols)
        if v.flags.owndata:  # not a view: one pass per row of the leading indices
            qw = qshape[len(qshape) - 1]
            for i, idx in enumerate(np.ndindex(*shape[:len(shape) - 1])):
                _run_one(a[idx], k, code, sp + i * (cols // block) * k.swidth, qp + i * qw,
                         threads)
            return (out[0] if out[0] is not None else s, out[1] if out[1] is not None else q)
        a = v
        rows, rs, cs = a.shape[0], (<object>a).strides[0], (<object>a).strides[1]
    xp = <const char *>cnp.PyArray_DATA(a)
    with nogil:
        lsc_mx_job_run(xp, rows, cols, rs, cs, code, axis, k, sp, qp, pool_for, threads)
    return (out[0] if out[0] is not None else s, out[1] if out[1] is not None else q)


cdef void _run_one(cnp.ndarray row, lsc_mx_rule *k, int code, unsigned char *sp,
                   unsigned char *qp, int threads) noexcept:
    cdef const char *xp = <const char *>cnp.PyArray_DATA(row)
    cdef int64_t cols = row.shape[0], cs = (<object>row).strides[0]
    with nogil:
        lsc_mx_job_run(xp, 1, cols, 0, cs, code, -1, k, sp, qp, pool_for, threads)


cdef tuple _run_tiles(x, lsc_mx_rule *k, out, int threads):
    """The tile pass of rule `k` (tiles of side k.block) over a 2-D `x`: (scales, codes)."""
    cdef int code
    cdef cnp.ndarray a = _read_input(x, threads, &code)
    if a.ndim != 2:
        raise ValueError(f"tiles need a 2-D input, got shape {(<object>a).shape}")
    if (<object>a).strides[1] != a.itemsize:  # the tile pass reads rows of contiguous elements
        a = np.ascontiguousarray(a)
    cdef int64_t t = k.block, rows = a.shape[0], cols = a.shape[1]
    sshape = (int((rows + t - 1) // t), int((cols + t - 1) // t))
    if out is None:
        out = (None, None)
    elif not isinstance(out, tuple) or len(out) != 2:
        raise ValueError(f"out must be a tuple (scales, data), got {type(out).__name__}")
    cdef cnp.ndarray s = _out_array(out[0], sshape, "scales", k.swidth == 4)
    cdef cnp.ndarray q = _out_array(out[1], (int(rows), int(cols)), "data")
    cdef unsigned char *sp = <unsigned char *>cnp.PyArray_DATA(s)
    cdef unsigned char *qp = <unsigned char *>cnp.PyArray_DATA(q)
    cdef const char *xp = <const char *>cnp.PyArray_DATA(a)
    cdef int64_t rs = (<object>a).strides[0]
    k.inf_value = lsc_bw_inf_value(code)
    if a.size:
        with nogil:
            lsc_mx_tile_run(xp, rows, cols, rs, code, k, sp, qp, pool_for, threads)
    return (out[0] if out[0] is not None else s, out[1] if out[1] is not None else q)


def quantize(x, str elem, str mode, long block=32, *, int axis=-1, out=None, int threads=0,
             bint tile=False, bint pow2=False, double eps=0.0):
    """Block quantization of `x` (float32, float16 or bfloat16, read in place; other dtypes
    as float32) by rule `mode` in blocks of `block` along its last axis (axis -1) or the
    first axis of a 2-D `x` (axis 0), or (tile) in square tiles of side `block` of a 2-D
    `x` (partial tiles at its edges; float8 elements): (scales, element codes), into
    ``out=(scales, data)`` when given.  Scales are uint8 codes, or float32 inverse scales
    under a float32 rule ("te-fp32", "torchao-fp32": `pow2` TE's power-of-two scales, `eps`
    the amax floor).  E2M1 codes are packed two per byte, the first in the low nibble
    (axis 0: two rows).  threads: 0 picks by the size, 1 is serial, k uses at most k (the
    same bytes with any)."""
    cdef lsc_mx_rule k
    k.elem = _code(ELEMS, "elem", elem)
    k.mode = _code(_ALL_MODES, "mode", mode)
    if block < 2 or block % 2 or block > LSC_MX_CHUNK:
        raise ValueError(f"block must be an even integer from 2 to {LSC_MX_CHUNK}, got {block}")
    wide = lsc_mx_wide(k.mode)
    if (wide or tile) and k.elem == LSC_MX_E2M1:
        what = "tiles" if tile else f"mode {mode!r}"
        raise ValueError(f"elem must be float8_e4m3fn or float8_e5m2 for {what}, got {elem!r}")
    if not wide and (pow2 or eps != 0):
        raise ValueError(f"pow2 and eps are the float32 rules' ({', '.join(WIDE_MODES)}), "
                         f"not mode {mode!r}'s")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    k.block = block
    k.has_pts = 0
    k.pts = 1.0
    k.pow2 = pow2
    k.eps = eps
    k.inf_value = lsc_bw_inf_value(LSC_CODE_F32)
    k.swidth = 4 if wide else 1
    if tile:
        return _run_tiles(x, &k, out, threads)
    return _run(x, &k, axis, out, threads)


def nvfp4_tensor_scale(float amax):
    """NVFP4's per-tensor scale of a tensor amax: amax / (448 * 6) in float32."""
    return lsc_nvfp4_tensor_scale(amax)


def nvfp4_quantize(x, pts=None, *, int axis=-1, out=None, int threads=0):
    """NVFP4 quantization of `x` (as `quantize` reads it) in blocks of 16 along `axis`, with
    the per-tensor scale `pts` (float32) or none: (E4M3 block scale codes, packed E2M1
    codes), into ``out=(scales, data)`` when given; threads as `quantize`'s."""
    cdef lsc_mx_rule k
    k.elem = LSC_MX_E2M1
    k.mode = LSC_MX_NVFP4
    k.block = 16
    k.has_pts = pts is not None
    k.pts = pts if k.has_pts else 1.0
    k.pow2 = 0
    k.eps = 0.0
    k.inf_value = lsc_bw_inf_value(LSC_CODE_F32)
    k.swidth = 1
    return _run(x, &k, axis, out, threads)


# ---- ISA level, for tests and `lscore bench` --------------------------------

def isa():
    """The ISA level the block passes run at ("v2", "v3", "v4" or "baseline")."""
    return lsc_mx_isa_get().name.decode()


def set_isa(name):
    """Run the block passes at ISA level `name` ("" = the best this CPU runs); returns the
    old level."""
    old = isa()
    if lsc_mx_isa_select(name.encode()) != 0:
        levels = [lsc_isa_names[j].decode() for j in range(LSC_NISAS) if lsc_isa_supported(j)]
        raise ValueError(f"ISA level {name!r} is not available here; expected one of: "
                         + ", ".join(levels))
    return old
