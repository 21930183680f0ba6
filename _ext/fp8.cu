/* fp8.cu: the float8 casts of lsc_fp8.h on the GPU, element by element.
 *
 * Design: lsc_fp8_cast<CODE, FMT, HW> writes q[i] = fp8(float32(x[i]) *
 * scale) for a float16 / bfloat16 / float32 input (CODE, lsc_codes.h) into
 * float8 format FMT, by the rules of `flags` (lsc_fp8.h: LSC_FP8_SAT,
 * LSC_FP8_NAN_SIGN); lsc_fp8_decode<CODE, FMT> widens codes back.  A thread
 * takes two neighbouring elements a turn (grid-stride), the pair the
 * conversion instruction narrows at once: with HW = 1 sm_89 and newer use
 * cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32, older devices and HW = 0 the
 * scalar rule of the CPU core, so a GPU can check the instruction against
 * the rule in place.  The cast also takes the amax of its inputs (before the
 * scale) as the CPU kernels do: each thread keeps the largest
 * lsc_fp8_amax_bits of its elements (a NaN dropped, or above every number
 * with LSC_FP8_AMAX_NAN) and folds it into *amax_bits with one atomicMax on
 * the word (|x| as bits orders like |x|), so several casts into the same
 * word take the max of all their inputs; lsc_fp8_amax reads the word.  The arithmetic is the CPU core's: the widening is
 * exact, the multiply one float32 rounding (no contraction: the package
 * compiles with --fmad=false).  The reference is lscore/_reference.py.
 */
#if defined(__CUDACC_RTC__)
/* lsc_half.h's float64 widenings serve the scan kernels; unused here */
#pragma nv_diag_suppress 177
#endif
#include "lsc_codes.h"
#include "lsc_half.h"
#include "lsc_fp8.h"

/* element i of an input of dtype code CODE, widened to float32 */
template <int CODE>
static __device__ __forceinline__ float lsc_fp8_in(const void *x, long long i)
{
    if (CODE == LSC_CODE_F32)
        return static_cast<const float *>(x)[i];
    lsc_u16 h = static_cast<const lsc_u16 *>(x)[i];
    return CODE == LSC_CODE_F16 ? lsc_dev_f16_to_f32(h) : lsc_dev_bf16_to_f32(h);
}

/* out[i] = f rounded once to dtype code CODE */
template <int CODE>
static __device__ __forceinline__ void lsc_fp8_out(void *out, long long i, float f)
{
    if (CODE == LSC_CODE_F32)
        static_cast<float *>(out)[i] = f;
    else if (CODE == LSC_CODE_F16)
        static_cast<lsc_u16 *>(out)[i] = lsc_dev_f32_to_f16(f);
    else
        static_cast<lsc_u16 *>(out)[i] = lsc_dev_f32_to_bf16(f);
}

template <int CODE, int FMT, int HW>
__global__ void lsc_fp8_cast(const void *x, long long n, float scale, unsigned char *q, int flags,
                             unsigned int *amax_bits)
{
    long long step = 2LL * gridDim.x * blockDim.x;
    lsc_u32 m = 0;
    for (long long i = 2LL * (blockIdx.x * (long long)blockDim.x + threadIdx.x); i < n; i += step) {
        float xa = lsc_fp8_in<CODE>(x, i);
        float xb = i + 1 < n ? lsc_fp8_in<CODE>(x, i + 1) : 0.0f;
        lsc_u32 d = lsc_dev_fp8x2(xa * scale, xb * scale, FMT, flags, HW);
        lsc_u32 ma = lsc_fp8_amax_bits(xa, flags), mb = lsc_fp8_amax_bits(xb, flags);
        m = ma > m ? ma : m;
        m = mb > m ? mb : m;
        q[i] = (unsigned char)(d >> 8);
        if (i + 1 < n)
            q[i + 1] = (unsigned char)d;
    }
    atomicMax(amax_bits, m);
}

template <int CODE, int FMT>
__global__ void lsc_fp8_decode(const unsigned char *q, long long n, void *out)
{
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        lsc_fp8_out<CODE>(out, i, lsc_fp8_to_f32(q[i], FMT));
    }
}

/* ---- quantize: the amax pass, and the cast and dequantize of a 2-D view -----
 *
 * An input is read as a 2-D view of rows x cols elements whose element
 * strides are rs (between rows) and cs (within a row), in elements, so any
 * layout whose leading axes merge into one stride is read in place; element
 * i of the logical C order is (i / cols, i % cols).  per_row = 0: one amax
 * word (amax_bits[0]) and one scale; per_row = 1: amax_bits[r] and the scale
 * of row r.  A scale comes from `scales` (a device array: a scale computed on
 * the device needs no round trip) when it is not null, else from `scale`.
 * Each thread keeps its running max for the row it is in and folds it into
 * that row's word with atomicMax when it moves to another row. */

/* (row, col) of logical element i */
static __device__ __forceinline__ void lsc_fp8_rc(long long i, long long rows, long long cols,
                                                  long long *r, long long *c)
{
    *r = rows == 1 ? 0 : i / cols;
    *c = i - *r * cols;
}

/* Fold amax bits a of an element of row `row` into the thread's running max m of row *cur. */
static __device__ __forceinline__ void lsc_fp8_fold(unsigned int *amax_bits, long long row,
                                                    long long *cur, lsc_u32 *m, lsc_u32 a)
{
    if (row != *cur) {
        if (*cur >= 0)
            atomicMax(amax_bits + *cur, *m);
        *cur = row;
        *m = 0;
    }
    *m = a > *m ? a : *m;
}

template <int CODE>
__global__ void lsc_fp8_amax2d(const void *x, long long rows, long long cols, long long rs,
                               long long cs, int flags, int per_row, unsigned int *amax_bits)
{
    long long n = rows * cols, step = (long long)gridDim.x * blockDim.x, cur = -1, r, c;
    lsc_u32 m = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        lsc_fp8_rc(i, rows, cols, &r, &c);
        lsc_fp8_fold(amax_bits, per_row ? r : 0, &cur, &m,
                     lsc_fp8_amax_bits(lsc_fp8_in<CODE>(x, r * rs + c * cs), flags));
    }
    if (cur >= 0)
        atomicMax(amax_bits + cur, m);
}

/* q[i] = fp8(float32(x[i]) * the scale of its row), q contiguous (C order), and the amax
 * of the inputs before the scale; two neighbouring elements a turn as lsc_fp8_cast does */
template <int CODE, int FMT, int HW>
__global__ void lsc_fp8_cast2d(const void *x, long long rows, long long cols, long long rs,
                               long long cs, float scale, const float *scales, int per_row,
                               unsigned char *q, int flags, unsigned int *amax_bits)
{
    long long n = rows * cols, step = 2LL * gridDim.x * blockDim.x, cur = -1, ra, ca, rb, cb;
    lsc_u32 m = 0;
    for (long long i = 2LL * (blockIdx.x * (long long)blockDim.x + threadIdx.x); i < n; i += step) {
        int two = i + 1 < n;
        lsc_fp8_rc(i, rows, cols, &ra, &ca);
        rb = ca + 1 < cols ? ra : ra + 1;
        cb = ca + 1 < cols ? ca + 1 : 0;
        float xa = lsc_fp8_in<CODE>(x, ra * rs + ca * cs);
        float xb = two ? lsc_fp8_in<CODE>(x, rb * rs + cb * cs) : 0.0f;
        float sa = scales ? scales[per_row ? ra : 0] : scale;
        float sb = scales ? (two ? scales[per_row ? rb : 0] : 0.0f) : scale;
        lsc_u32 d = lsc_dev_fp8x2(xa * sa, xb * sb, FMT, flags, HW);
        lsc_fp8_fold(amax_bits, per_row ? ra : 0, &cur, &m, lsc_fp8_amax_bits(xa, flags));
        if (two)
            lsc_fp8_fold(amax_bits, per_row ? rb : 0, &cur, &m, lsc_fp8_amax_bits(xb, flags));
        q[i] = (unsigned char)(d >> 8);
        if (two)
            q[i + 1] = (unsigned char)d;
    }
    if (cur >= 0)
        atomicMax(amax_bits + cur, m);
}

/* out[i] = float32(code at (r, c)) / the scale of row r, rounded once to CODE; out contiguous */
template <int CODE, int FMT>
__global__ void lsc_fp8_dequant2d(const unsigned char *q, long long rows, long long cols,
                                  long long rs, long long cs, float scale, const float *scales,
                                  int per_row, void *out)
{
    long long n = rows * cols, step = (long long)gridDim.x * blockDim.x, r, c;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        lsc_fp8_rc(i, rows, cols, &r, &c);
        float s = scales ? scales[per_row ? r : 0] : scale;
        lsc_fp8_out<CODE>(out, i, lsc_fp8_to_f32(q[r * rs + c * cs], FMT) / s);
    }
}
