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
 * with LSC_FP8_AMAX_NAN), the block folds those, and one atomicMax a block
 * puts the result on the word (|x| as bits orders like |x|), so several
 * casts into the same word take the max of all their inputs; lsc_fp8_amax
 * reads the word.  The arithmetic is the CPU core's: the widening is exact,
 * the multiply one float32 rounding (no contraction: the package compiles
 * with --fmad=false).  The reference is lscore/_reference.py.
 */
#if defined(__CUDACC_RTC__)
/* lsc_half.h's float64 widenings serve the scan kernels; unused here */
#pragma nv_diag_suppress 177
#endif
#ifndef LSCORE_FP8_CU_
#define LSCORE_FP8_CU_

#include "lsc_codes.h"
#include "lsc_half.h"
#include "lsc_fp8.h"
#include "lsc_warp.h"

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

/* Fold each thread's amax bits m into *word: the block's max first (a shuffle tree in each
 * warp, then warp 0 over the warps' results), then one atomicMax from thread 0.  One atomic a
 * thread on the same word serialises: with 4096 blocks of 256 threads that was about 1 ms a
 * launch on an H200, whatever the size.  Every thread of the block must call it; a lane takes
 * only partners that exist (lsc_warp_live).  A max of 0 changes nothing and is not sent. */
static __device__ __forceinline__ void lsc_fp8_block_max(unsigned int *word, lsc_u32 m)
{
    __shared__ lsc_u32 shm[32];
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    unsigned nwarps = (blockDim.x + 31u) >> 5, mask;
    unsigned live = lsc_warp_live(&mask);
    for (unsigned off = 16; off > 0; off >>= 1) {
        lsc_u32 o = __shfl_down_sync(mask, m, off);
        if (lane + off < live)
            m = o > m ? o : m;
    }
    if (lane == 0)
        shm[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < nwarps ? shm[lane] : 0u;
        for (unsigned off = 16; off > 0; off >>= 1) {
            lsc_u32 o = __shfl_down_sync(mask, m, off);
            if (lane + off < live)
                m = o > m ? o : m;
        }
        if (lane == 0 && m != 0u)
            atomicMax(word, m);
    }
}

/* ---- the contiguous per-tensor case: 16-byte loads --------------------------
 * A whole tensor read in order (one row, unit stride: a C-contiguous array)
 * from a 16-byte aligned address takes 16 bytes a thread a turn (8 elements
 * of 16 bits, 4 of float32), their codes in one 8- or 4-byte store when the
 * codes' address is aligned to it, and the elements after the last whole
 * vector one at a time.  An element at a time costs the 2-D view's index
 * arithmetic and a 2- or 4-byte access per element: about 13 sm_90
 * instructions per byte moved for bfloat16, where a kernel stops being
 * memory-bound near 10. */
struct alignas(16) lsc_fp8_v16 {
    lsc_u32 x, y, z, w;
};
struct alignas(8) lsc_fp8_v8 {
    lsc_u32 lo, hi;
};

/* Whether a kernel takes the 16-byte path: one row of unit stride, x 16-byte aligned, q (if
 * any) aligned to the store of one vector's codes. */
template <int CODE>
static __device__ __forceinline__ int lsc_fp8_vec_ok(const void *x, long long rows, long long cs,
                                                     const unsigned char *q)
{
    const unsigned long long store = CODE == LSC_CODE_F32 ? 4u : 8u;
    return rows == 1 && cs == 1 && ((unsigned long long)x & 15u) == 0
           && ((unsigned long long)q & (store - 1u)) == 0;
}

/* The 16-bit element in the low (high = 0) or high half of word w, widened: in memory the
 * low half comes first */
template <int CODE>
static __device__ __forceinline__ float lsc_fp8_half(lsc_u32 w, int high)
{
    lsc_u16 h = (lsc_u16)(high ? w >> 16 : w & 0xFFFFu);
    return CODE == LSC_CODE_F16 ? lsc_dev_f16_to_f32(h) : lsc_dev_bf16_to_f32(h);
}

/* The codes of neighbours a, b as the 16-bit word that stores them in order (a's in the low
 * byte), their amax bits folded into *m; with STORE 0 only the amax (the word is 0) */
template <int FMT, int HW, int STORE>
static __device__ __forceinline__ lsc_u32 lsc_fp8_pair(float a, float b, float s, int flags,
                                                       lsc_u32 *m)
{
    lsc_u32 ma = lsc_fp8_amax_bits(a, flags), mb = lsc_fp8_amax_bits(b, flags);
    *m = ma > *m ? ma : *m;
    *m = mb > *m ? mb : *m;
    if (!STORE)
        return 0u;
    lsc_u32 d = lsc_dev_fp8x2(a * s, b * s, FMT, flags, HW);
    return ((d >> 8) & 0xFFu) | ((d & 0xFFu) << 8);
}

/* Over the n elements of a lsc_fp8_vec_ok tensor, this thread's share: q[i] = fp8(float32(x[i])
 * * s), and the amax bits returned; with STORE 0 the amax alone (the amax pass: s and q
 * unused) */
template <int CODE, int FMT, int HW, int STORE>
static __device__ __forceinline__ lsc_u32 lsc_fp8_cast_vec(const void *x, long long n, float s,
                                                           unsigned char *q, int flags)
{
    const int E = CODE == LSC_CODE_F32 ? 4 : 8;
    const long long nv = n / E, step = (long long)gridDim.x * blockDim.x;
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const lsc_fp8_v16 *xv = static_cast<const lsc_fp8_v16 *>(x);
    lsc_u32 m = 0;
    for (long long k = t; k < nv; k += step) {
        lsc_fp8_v16 u = xv[k];
        if (CODE == LSC_CODE_F32) {
            lsc_u32 lo = lsc_fp8_pair<FMT, HW, STORE>(lsc_f32_from_bits(u.x),
                                                      lsc_f32_from_bits(u.y), s, flags, &m);
            lsc_u32 hi = lsc_fp8_pair<FMT, HW, STORE>(lsc_f32_from_bits(u.z),
                                                      lsc_f32_from_bits(u.w), s, flags, &m);
            if (STORE)
                reinterpret_cast<lsc_u32 *>(q)[k] = lo | (hi << 16);
        } else {
            lsc_fp8_v8 o;
            o.lo = lsc_fp8_pair<FMT, HW, STORE>(lsc_fp8_half<CODE>(u.x, 0),
                                                lsc_fp8_half<CODE>(u.x, 1), s, flags, &m);
            o.lo |= lsc_fp8_pair<FMT, HW, STORE>(lsc_fp8_half<CODE>(u.y, 0),
                                                 lsc_fp8_half<CODE>(u.y, 1), s, flags, &m)
                    << 16;
            o.hi = lsc_fp8_pair<FMT, HW, STORE>(lsc_fp8_half<CODE>(u.z, 0),
                                                lsc_fp8_half<CODE>(u.z, 1), s, flags, &m);
            o.hi |= lsc_fp8_pair<FMT, HW, STORE>(lsc_fp8_half<CODE>(u.w, 0),
                                                 lsc_fp8_half<CODE>(u.w, 1), s, flags, &m)
                    << 16;
            if (STORE)
                reinterpret_cast<lsc_fp8_v8 *>(q)[k] = o;
        }
    }
    for (long long i = nv * E + t; i < n; i += step) { /* fewer than E elements */
        lsc_u32 c = lsc_fp8_pair<FMT, HW, STORE>(lsc_fp8_in<CODE>(x, i), 0.0f, s, flags, &m);
        if (STORE)
            q[i] = (unsigned char)c;
    }
    return m;
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
    lsc_fp8_block_max(amax_bits, m);
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
 * that row's word with atomicMax when it moves to another row; per tensor,
 * the block's max goes on the one word (lsc_fp8_block_max). */

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

/* The end of a pass: the running max m of row cur into its word; per tensor (every thread on
 * word 0) through the block's max.  per_row is the same in every thread of a launch. */
static __device__ __forceinline__ void lsc_fp8_fold_end(unsigned int *amax_bits, int per_row,
                                                        long long cur, lsc_u32 m)
{
    if (!per_row)
        lsc_fp8_block_max(amax_bits, m);
    else if (cur >= 0)
        atomicMax(amax_bits + cur, m);
}

template <int CODE>
__global__ void lsc_fp8_amax2d(const void *x, long long rows, long long cols, long long rs,
                               long long cs, int flags, int per_row, unsigned int *amax_bits)
{
    long long n = rows * cols, step = (long long)gridDim.x * blockDim.x, cur = -1, r, c;
    lsc_u32 m = 0;
    if (!per_row && lsc_fp8_vec_ok<CODE>(x, rows, cs, nullptr)) {
        m = lsc_fp8_cast_vec<CODE, LSC_CODE_E4M3FN, 0, 0>(x, n, 1.0f, nullptr, flags);
        lsc_fp8_block_max(amax_bits, m);
        return;
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        lsc_fp8_rc(i, rows, cols, &r, &c);
        lsc_fp8_fold(amax_bits, per_row ? r : 0, &cur, &m,
                     lsc_fp8_amax_bits(lsc_fp8_in<CODE>(x, r * rs + c * cs), flags));
    }
    lsc_fp8_fold_end(amax_bits, per_row, cur, m);
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
    if (!per_row && lsc_fp8_vec_ok<CODE>(x, rows, cs, q)) {
        float s = scales ? scales[0] : scale;
        lsc_fp8_block_max(amax_bits, lsc_fp8_cast_vec<CODE, FMT, HW, 1>(x, n, s, q, flags));
        return;
    }
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
    lsc_fp8_fold_end(amax_bits, per_row, cur, m);
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

#endif /* LSCORE_FP8_CU_ */
