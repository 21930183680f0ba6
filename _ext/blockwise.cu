/* blockwise.cu: blockwise FP8 (float32 scales: TransformerEngine v2.18's
 * Float8BlockScaling rule and torchao 0.18.0's, lsc_mx.h's lsc_bw_*) and the
 * square tiles of a weight (every rule of lsc_mx.h: 128x128 blockwise FP8,
 * 32x32 MXFP8) on the GPU, quantize and dequantize.
 *
 * Design: an input is a strided 2-D view (rows x cols, element strides rs and
 * cs, float32 / float16 / bfloat16: CODE) as fp8.cu reads it.  The rules are
 * lsc_mx.h's scalar functions, the very ones the CPU passes run, so the
 * bytes are the CPU kernels' (lscore.kernels.mx_quantize): float8 codes are
 * narrowed by lsc_fp8_from_f32, a NaN's sign and torchao's Inf * 0 as
 * lsc_bw_code writes them.
 *   lsc_bw_rows: a warp per block along a row (lane l reads elements l,
 *     l + 32, ... of it: a warp's loads are neighbours), the block amax
 *     folded by __shfl_xor_sync, lane 0 writing the float32 inverse scale.
 *   lsc_bw_cols: a thread per (block, column) walking its block's rows twice
 *     (the amax, then the codes): neighbouring threads read neighbouring
 *     columns.
 *   lsc_bw_tiles: a thread block per t x t tile (a partial tile at the
 *     bottom and right edges has the elements it has), its warps over the
 *     tile's rows and its lanes along them, the amax folded across the warps
 *     in shared memory; the scale an E8M0 byte (MX rules) or a float32
 *     inverse scale.
 *   lsc_bw_dequant: element code times its scale in float32, rounded once to
 *     CODE, for float32 scales in any layout and E8M0 tiles (torchao's modes
 *     round the scale to float16 first for a float16 result, as mx.cu's).
 * Outputs are C-contiguous: codes (rows, cols) uint8; scales (rows, cols /
 * block), (rows / block, cols) or (ceil(rows / t), ceil(cols / t)), float32
 * (as uint32 bits) or uint8.  The reference is lscore/_reference_blockwise.py
 * and lscore.kernels.mx_quantize.
 */
/* mx.cu: fp8.cu's lsc_fp8_in / lsc_fp8_out, lsc_mx.h and lsc_mxk_amax */
#include "lsc_codes.h"
#include "mx.cu"

/* A block's scale from its amax bits m: under a float32 rule the factor *r
 * and its inverse's bits as the stored *s; under an MX rule the E8M0 code *s,
 * and *r the amax the element rule takes. */
static __device__ __forceinline__ void lsc_bwk_scale(lsc_u32 m, int elem, int mode, int pow2,
                                                     double eps, float inf_value, lsc_u32 *s,
                                                     float *r)
{
    const float amax = lsc_mxk_amax(m);
    if (lsc_mx_wide(mode)) {
        *r = lsc_bw_scale(amax, elem, mode, pow2, eps, inf_value);
        *s = lsc_bw_inv_bits(*r);
    } else {
        *s = lsc_mx_scale(amax, elem, mode);
        *r = amax;
    }
}

/* Element x of a block with scale s, r (lsc_bwk_scale), narrowed. */
static __device__ __forceinline__ lsc_u32 lsc_bwk_code(float x, lsc_u32 s, float r, int elem,
                                                       int mode)
{
    return lsc_mx_wide(mode) ? lsc_bw_code(x, r, elem, mode) : lsc_mx_elem(x, s, r, elem, mode);
}

/* scale i (float32 bits or an E8M0 byte) stored */
static __device__ __forceinline__ void lsc_bwk_put(void *scales, long long i, lsc_u32 s,
                                                   int wide)
{
    if (wide)
        static_cast<lsc_u32 *>(scales)[i] = s;
    else
        static_cast<unsigned char *>(scales)[i] = (unsigned char)s;
}

/* Float32-rule blocks of `block` along the rows (block divides cols); blockDim.x a
 * multiple of 32. */
template <int CODE>
__global__ void lsc_bw_rows(const void *x, long long rows, long long cols, long long rs,
                            long long cs, int block, int elem, int mode, int pow2, double eps,
                            lsc_u32 *scales, unsigned char *q)
{
    const long long nb = cols / block, n = rows * nb;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    const int lane = threadIdx.x & 31, skip = lsc_mx_skips_nan_mode(mode);
    /* a warp's lanes take the same block: the loop and the shuffles are warp-uniform */
    for (long long b = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; b < n;
         b += warps) {
        const long long r = b / nb, c0 = (b - r * nb) * block;
        lsc_u32 m = 0;
        for (int j = lane; j < block; j += 32) {
            const lsc_u32 a = lsc_mx_abs_bits(lsc_fp8_in<CODE>(x, r * rs + (c0 + j) * cs), skip);
            m = a > m ? a : m;
        }
        for (int off = 16; off > 0; off >>= 1) {
            const lsc_u32 o = __shfl_xor_sync(0xFFFFFFFFu, m, off);
            m = o > m ? o : m;
        }
        lsc_u32 s;
        float f;
        lsc_bwk_scale(m, elem, mode, pow2, eps, lsc_bw_inf_value(CODE), &s, &f);
        if (lane == 0)
            scales[b] = s;
        for (int j = lane; j < block; j += 32)
            q[r * cols + c0 + j] = (unsigned char)lsc_bw_code(
                lsc_fp8_in<CODE>(x, r * rs + (c0 + j) * cs), f, elem, mode);
    }
}

/* Float32-rule blocks of `block` down the columns (block divides rows). */
template <int CODE>
__global__ void lsc_bw_cols(const void *x, long long rows, long long cols, long long rs,
                            long long cs, int block, int elem, int mode, int pow2, double eps,
                            lsc_u32 *scales, unsigned char *q)
{
    const long long n = rows / block * cols, step = (long long)gridDim.x * blockDim.x;
    const int skip = lsc_mx_skips_nan_mode(mode);
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {
        const long long br = t / cols, c = t - br * cols, r0 = br * block;
        lsc_u32 m = 0;
        for (long long r = r0; r < r0 + block; ++r) {
            const lsc_u32 a = lsc_mx_abs_bits(lsc_fp8_in<CODE>(x, r * rs + c * cs), skip);
            m = a > m ? a : m;
        }
        lsc_u32 s;
        float f;
        lsc_bwk_scale(m, elem, mode, pow2, eps, lsc_bw_inf_value(CODE), &s, &f);
        scales[t] = s;
        for (long long r = r0; r < r0 + block; ++r)
            q[r * cols + c] = (unsigned char)lsc_bw_code(lsc_fp8_in<CODE>(x, r * rs + c * cs), f,
                                                         elem, mode);
    }
}

/* Square tiles of side `tile` (float8 elements; any rule: `scales` float32 bits under a
 * float32 rule, else E8M0 bytes); a thread block per tile, blockDim.x a multiple of 32. */
template <int CODE>
__global__ void lsc_bw_tiles(const void *x, long long rows, long long cols, long long rs,
                             long long cs, int tile, int elem, int mode, int pow2, double eps,
                             void *scales, unsigned char *q)
{
    __shared__ lsc_u32 part[32];
    const long long tr = (rows + tile - 1) / tile, tc = (cols + tile - 1) / tile, nt = tr * tc;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int skip = lsc_mx_skips_nan_mode(mode), wide = lsc_mx_wide(mode);
    /* a block's threads take the same tile: the loop and the barriers are block-uniform */
    for (long long t = blockIdx.x; t < nt; t += gridDim.x) {
        const long long r0 = t / tc * tile, c0 = (t - t / tc * tc) * tile;
        const long long h = rows - r0 < tile ? rows - r0 : tile;
        const long long w = cols - c0 < tile ? cols - c0 : tile;
        lsc_u32 m = 0;
        for (long long i = warp; i < h; i += nwarps)
            for (long long j = lane; j < w; j += 32) {
                const lsc_u32 a =
                    lsc_mx_abs_bits(lsc_fp8_in<CODE>(x, (r0 + i) * rs + (c0 + j) * cs), skip);
                m = a > m ? a : m;
            }
        for (int off = 16; off > 0; off >>= 1) {
            const lsc_u32 o = __shfl_xor_sync(0xFFFFFFFFu, m, off);
            m = o > m ? o : m;
        }
        if (lane == 0)
            part[warp] = m;
        __syncthreads();
        m = 0;
        for (int k = 0; k < nwarps; ++k)
            m = part[k] > m ? part[k] : m;
        __syncthreads(); /* every thread has read part before the next tile writes it */
        lsc_u32 s;
        float f;
        lsc_bwk_scale(m, elem, mode, pow2, eps, lsc_bw_inf_value(CODE), &s, &f);
        if (threadIdx.x == 0)
            lsc_bwk_put(scales, t, s, wide);
        for (long long i = warp; i < h; i += nwarps)
            for (long long j = lane; j < w; j += 32)
                q[(r0 + i) * cols + c0 + j] = (unsigned char)lsc_bwk_code(
                    lsc_fp8_in<CODE>(x, (r0 + i) * rs + (c0 + j) * cs), s, f, elem, mode);
    }
}

/* Dequantize: out (rows x cols, C order, dtype CODE) = float32(element code) *
 * float32(its block's scale), rounded once to CODE.  layout 0: blocks of `block` along
 * the rows (block divides cols); 1: down the columns; 2: square tiles of side `block`.
 * Scales are float32 bits under a float32 rule, else E8M0 bytes, which torchao's modes
 * round to float16 first for a float16 result. */
template <int CODE>
__global__ void lsc_bw_dequant(const void *scales, const unsigned char *q, long long rows,
                               long long cols, int block, int layout, int elem, int mode,
                               void *out)
{
    const long long n = rows * cols, step = (long long)gridDim.x * blockDim.x;
    const long long tc = (cols + block - 1) / block;
    const int wide = lsc_mx_wide(mode);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        const long long r = i / cols, c = i - r * cols;
        const long long k = layout == 0   ? r * (cols / block) + c / block
                            : layout == 1 ? r / block * cols + c
                                          : r / block * tc + c / block;
        float sc;
        if (wide) {
            sc = lsc_f32_from_bits(static_cast<const lsc_u32 *>(scales)[k]);
        } else {
            sc = lsc_e8m0_to_f32(static_cast<const unsigned char *>(scales)[k]);
            if (CODE == LSC_CODE_F16 && (mode == LSC_MX_FLOOR || mode == LSC_MX_CEIL
                                         || mode == LSC_MX_EVEN || mode == LSC_MX_RCEIL))
                sc = lsc_dev_f16_to_f32(lsc_dev_f32_to_f16(sc));
        }
        lsc_fp8_out<CODE>(out, i, lsc_fp8_to_f32(q[i], elem) * sc);
    }
}
