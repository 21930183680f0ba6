/* mx.cu: the block-scaled formats of lsc_mx.h on the GPU: MX (an E8M0 scale
 * per block of 32, float8 or E2M1 elements) and NVFP4 (an E4M3 scale per 16,
 * E2M1 elements, an optional float32 per-tensor scale) quantize, and their
 * dequantize.
 *
 * Design: an input is a strided 2-D view (rows x cols, element strides rs
 * and cs, float32 / float16 / bfloat16: CODE) as fp8.cu reads it, blocked
 * along its rows (lsc_mx_rows: `block` neighbours of a row share a scale) or
 * its columns (lsc_mx_cols: `block` neighbours of a column, TE's columnwise
 * orientation).  Every thread narrows a pair of neighbours of one block, the
 * pair the conversion instructions take at once and the two codes of an
 * E2M1 byte, so a byte never mixes two blocks' scales.
 *   rows: a thread per pair, block / 2 consecutive lanes of a warp per block
 *     (16 for MX, 8 for NVFP4), the block amax folded by __shfl_xor_sync in
 *     log2(block / 2) steps so that every lane holds it.  A warp reads 64
 *     neighbours of a row: coalesced whatever the dtype, with no alignment
 *     asked of a strided view (16-byte loads of a thread per block would ask
 *     both, and leave a warp's loads 32 blocks apart).  Rows that are aligned
 *     and of unit stride (a C-contiguous array) take lsc_mx_rows_vec instead:
 *     a thread per 16 bytes, block / 8 (16-bit) or block / 4 (float32) lanes
 *     per block, a warp's loads still neighbours.
 *   cols: a thread per (block, column), its block's rows walked twice (the
 *     amax, then the codes; the second pass reads what the first brought into
 *     the cache): neighbouring threads read neighbouring columns, coalesced,
 *     and no lane waits on another.
 * The block rules are lsc_mx.h's scalar functions; with HW = 1, sm_89 and
 * newer narrow float8 pairs with cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32
 * (lsc_dev_fp8x2, through lsc_fp8_fix to the rule's NaN word), and the
 * sm_100a / sm_101a / sm_120a targets E2M1 pairs with
 * cvt.rn.satfinite.e2m1x2.f32 and TE's scale with
 * cvt.rp.satfinite.ue8m0x2.f32, the instruction TE's float_to_e8m0 runs
 * there; HW = 0 and other devices take the rule itself, so a GPU can check
 * the instructions against it in place.  The arithmetic is the CPU
 * kernels' (the package compiles with --fmad=false and exact division).
 * Outputs are C-contiguous uint8, the kernels layer's layout: rows: scales
 * (rows, cols / block), codes (rows, cols), E2M1 (rows, cols / 2); cols:
 * scales (rows / block, cols), codes (rows, cols), E2M1 (rows / 2, cols),
 * rows 2i and 2i + 1 of a column in one byte, 2i in the low nibble.
 * Elements are read and written by fp8.cu's lsc_fp8_in and lsc_fp8_out.
 * The reference is lscore/_reference_mx.py and lscore.kernels.mx_quantize /
 * nvfp4_quantize.
 */
/* fp8.cu: lsc_fp8_in and lsc_fp8_out (an element widened, a result narrowed),
 * lsc_fp8.h and lsc_half.h */
#ifndef LSCORE_MX_CU_
#define LSCORE_MX_CU_

#include "lsc_codes.h"
#include "fp8.cu"
#include "lsc_mx.h"

/* |f| as bits for lsc_mx_amax's order: a NaN above every number, or under
 * TE's modes 0 (lsc_mx_abs_bits: left out of the amax) */
static __device__ __forceinline__ lsc_u32 lsc_mxk_abs(float f, int mode)
{
    return lsc_mx_abs_bits(f, lsc_mx_is_te(mode));
}

/* the amax whose largest |x| bits are m: the quiet NaN when one was NaN (lsc_mx_amax) */
static __device__ __forceinline__ float lsc_mxk_amax(lsc_u32 m)
{
    return m > LSC_EXP_F32 ? lsc_f32_from_bits(0x7FC00000u) : lsc_f32_from_bits(m);
}

/* The rule's E2M1 code of f where the instruction's d is not the rule's: a
 * NaN, whose code the instruction leaves to the format. */
static __device__ __forceinline__ lsc_u32 lsc_mxk_e2m1_fix(lsc_u32 d, float f)
{
    return f != f ? lsc_e2m1_from_f32(f) : d & 0xFu;
}

/* E2M1 codes of a (low nibble) and b (high nibble): with hw, the
 * instruction where the device has it (.satfinite rounds to nearest even
 * and saturates to +-6 as the rule does) through lsc_mxk_e2m1_fix; else
 * lsc_e2m1_from_f32.  The host harness runs the instruction as documented,
 * with a NaN code of its own (0x7). */
static __device__ __forceinline__ lsc_u32 lsc_mxk_e2m1x2(float a, float b, int hw)
{
    lsc_u32 d;
    if (hw) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM101_ALL) || \
    defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL)
        asm("{\n\t.reg .b8 t;\n\t"
            "cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n\t"
            "mov.b32 %0, {t, t, t, t};\n\t}"
            : "=r"(d)
            : "f"(b), "f"(a));
#elif defined(LSC_DEVICE_EMULATION)
        d = ((b != b ? 7u : lsc_e2m1_from_f32(b)) << 4) | (a != a ? 7u : lsc_e2m1_from_f32(a));
#else
        d = (lsc_e2m1_from_f32(b) << 4) | lsc_e2m1_from_f32(a);
#endif
        return lsc_mxk_e2m1_fix(d, a) | (lsc_mxk_e2m1_fix(d >> 4, b) << 4);
    }
    return lsc_e2m1_from_f32(a) | (lsc_e2m1_from_f32(b) << 4);
}

/* TE's E8M0 code of a descale (lsc_mx_te_e8m0): cvt.rp.satfinite.ue8m0x2.f32
 * where the device has it and hw is set.  The instruction rounds up to a
 * power of two, saturates Inf to 0xFE and gives NaN 0xFF; TE's software
 * path (the rule) is what it computes on other devices. */
static __device__ __forceinline__ lsc_u32 lsc_mxk_te_e8m0(float d, int hw)
{
#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM101_ALL) || \
    defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL)
    if (hw) {
        unsigned short h;
        asm("cvt.rp.satfinite.ue8m0x2.f32 %0, %1, %2;" : "=h"(h) : "f"(0.0f), "f"(d));
        return h & 0xFFu;
    }
#endif
    (void)hw;
    return lsc_mx_te_e8m0(d);
}

/* One block's scale code and the float32 factor its elements are scaled by. */
struct lsc_mxk_block {
    lsc_u32 s;
    float amax, r;
};

/* The scale of a block whose amax is `amax`, by MX rule `mode` for element
 * `elem`, or NVFP4's (mode < 0; pts: the per-tensor scale or null). */
static __device__ __forceinline__ lsc_mxk_block lsc_mxk_scale(float amax, int elem, int mode,
                                                               const float *pts, int hw)
{
    lsc_mxk_block b;
    b.amax = amax;
    b.r = 1.0f;
    if (mode < 0) {
        /* lsc_nvfp4_block's scale, and its reciprocal */
        float bs = amax / 6.0f;
        if (pts)
            bs = bs / *pts;
        b.s = lsc_fp8_from_f32(lsc_mx_clamp(bs, 0x1p-6f, 448.0f), LSC_CODE_E4M3FN,
                               LSC_FP8_SAT | LSC_FP8_NAN_SIGN);
        b.r = pts ? (1.0f / *pts) / lsc_fp8_to_f32(b.s, LSC_CODE_E4M3FN)
                  : 1.0f / lsc_fp8_to_f32(b.s, LSC_CODE_E4M3FN);
    } else if (lsc_mx_is_te(mode)) {
        b.s = lsc_mxk_te_e8m0(amax * (float)(1.0 / (double)lsc_mx_max(elem)), hw);
    } else {
        b.s = lsc_mx_scale(amax, elem, mode);
    }
    return b;
}

/* x scaled by block b's rule, before the narrowing: lsc_mx_elem's value
 * (the instruction then narrows it as lsc_fp8_from_f32 would). */
static __device__ __forceinline__ float lsc_mxk_scaled(float x, lsc_mxk_block b, int elem,
                                                       int mode)
{
    const float top = lsc_mx_max(elem);
    lsc_u32 s = b.s;
    if (mode == LSC_MX_RCEIL) {
        float r = s == 0xFFu ? b.amax / top : s == 0xFEu ? 0x1p-127f : s == 0u
                  ? 1.0f : lsc_f32_from_bits((254u - s) << 23);
        return lsc_mx_clamp(lsc_mx_mul(x, r), -top, top);
    }
    if (lsc_mx_is_te(mode))
        /* x * NaN is the NaN 0x7FFFFFFF whatever x is on the GPU; so here too */
        return s == 0xFFu ? lsc_mx_te_rcp(s) : x * lsc_mx_te_rcp(s);
    if (mode & LSC_MX_NEXT)   /* torchao after #4725: its E8M0 reciprocal, a NaN one winning */
        return lsc_mx_clamp(lsc_mx_mul(x, lsc_mx_e8m0_rcp(s)), -top, top);
    if (mode == LSC_MX_OCP)
        return s == 0xFFu ? lsc_f32_from_bits(0x7FC00000u)
                          : lsc_mx_clamp(x * lsc_f32_from_bits((254u - s) << 23), -top, top);
    float d = lsc_f32_from_bits(s << 23);
    d = d < 0x1p-126f ? 0x1p-126f : d;
    return elem == LSC_MX_E2M1 ? x / d : lsc_mx_clamp(x / d, -top, top);
}

/* The codes of neighbours a, b of block bl: float8, a's in bits 15:8 and
 * b's in 7:0; E2M1, one byte with a in the low nibble. */
static __device__ __forceinline__ lsc_u32 lsc_mxk_pair(float a, float b, lsc_mxk_block bl,
                                                       int elem, int mode, int hw)
{
    if (mode < 0)
        return lsc_mxk_e2m1x2(lsc_mx_clamp(lsc_mx_mul(a, bl.r), -6.0f, 6.0f),
                              lsc_mx_clamp(lsc_mx_mul(b, bl.r), -6.0f, 6.0f), hw);
    if (!hw)
        return elem == LSC_MX_E2M1
                   ? lsc_mx_elem(a, bl.s, bl.amax, elem, mode)
                         | (lsc_mx_elem(b, bl.s, bl.amax, elem, mode) << 4)
                   : (lsc_mx_elem(a, bl.s, bl.amax, elem, mode) << 8)
                         | lsc_mx_elem(b, bl.s, bl.amax, elem, mode);
    if (elem == LSC_MX_E2M1)
        return lsc_mxk_e2m1x2(lsc_mxk_scaled(a, bl, elem, mode),
                              lsc_mxk_scaled(b, bl, elem, mode), hw);
    return lsc_dev_fp8x2(lsc_mxk_scaled(a, bl, elem, mode), lsc_mxk_scaled(b, bl, elem, mode),
                         elem, lsc_mx_flags(mode), 1);
}

/* Store the codes d of the pair at (r, c), (r, c + 1) (rows) or (r, c), (r + 1, c)
 * (cols) into q, laid out as the header comment says. */
static __device__ __forceinline__ void lsc_mxk_store(unsigned char *q, long long at,
                                                     long long next, int e2m1, lsc_u32 d)
{
    if (e2m1) {
        q[at] = (unsigned char)d;
    } else {
        q[at] = (unsigned char)(d >> 8);
        q[next] = (unsigned char)d;
    }
}

/* Work item v of per_row to a row: its row *r and place *j in the row (both 0
 * where v is past the end, !live), by a 32-bit division where the items'
 * count allows (narrow: a 64-bit one is a long routine). */
static __device__ __forceinline__ void lsc_mxk_split(long long v, long long per_row, int live,
                                                     int narrow, long long *r, long long *j)
{
    if (narrow) {
        unsigned vu = live ? (unsigned)v : 0u, pu = (unsigned)per_row, ru = vu / pu;
        *r = ru;
        *j = vu - ru * pu;
    } else {
        *r = live ? v / per_row : 0;
        *j = live ? v - *r * per_row : 0;
    }
}

/* log2 of a power of two g (a block's lanes: a place in the row to its block by a shift) */
static __device__ __forceinline__ int lsc_mxk_log2(int g)
{
    int sh = 0;
    while ((1 << sh) < g)
        ++sh;
    return sh;
}

/* The rows of 16-byte aligned input with unit stride along them, and blocks
 * of at least E elements (8 of 16 bits, 4 of float32): a thread per E
 * neighbours, read in one 16-byte load, block / E consecutive lanes per block
 * (their amax folded by __shfl_xor_sync), its codes in one store of E bytes
 * (float8) or E / 2 (E2M1), which lsc_mx_rows_vec_ok asks to be aligned.  A
 * thread per pair with 2- or 4-byte accesses, as below, cost about 65 sm_90
 * instructions per 16 bytes read. */
template <int CODE>
static __device__ __forceinline__ int lsc_mx_rows_vec_ok(const void *x, long long rs, long long cs,
                                                         int block, int e2m1,
                                                         const unsigned char *q)
{
    const int E = CODE == LSC_CODE_F32 ? 4 : 8, W = CODE == LSC_CODE_F32 ? 4 : 2;
    const unsigned long long store = e2m1 ? E / 2 : E;
    return cs == 1 && block % E == 0 && ((unsigned long long)x & 15u) == 0 && (rs * W) % 16 == 0
           && ((unsigned long long)q & (store - 1u)) == 0;
}

template <int CODE, int HW>
static __device__ __forceinline__ void lsc_mx_rows_vec(const void *x, long long rows,
                                                       long long cols, long long rs, int block,
                                                       int elem, int mode, const float *pts,
                                                       unsigned char *scales, unsigned char *q)
{
    const int E = CODE == LSC_CODE_F32 ? 4 : 8, W = CODE == LSC_CODE_F32 ? 4 : 2;
    const int lanes = block / E, e2m1 = elem == LSC_MX_E2M1 || mode < 0;
    const long long per_row = cols / E, n = rows * per_row, nb = cols / block;
    const long long step = (long long)gridDim.x * blockDim.x, lane = threadIdx.x & 31u;
    const int narrow = n <= 0xFFFFFFFFLL, sh = lsc_mxk_log2(lanes);
    /* every lane of a warp runs the same turns (its shuffles), past the end too */
    for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v - lane < n; v += step) {
        const int live = v < n;
        long long r, j;
        lsc_mxk_split(v, per_row, live, narrow, &r, &j);
        lsc_fp8_v16 u = {0u, 0u, 0u, 0u};
        if (live)
            u = *reinterpret_cast<const lsc_fp8_v16 *>(static_cast<const char *>(x)
                                                        + (r * rs * W + j * 16));
        const lsc_u32 w[4] = {u.x, u.y, u.z, u.w};
        float f[8];
        for (int k = 0; k < E; ++k)
            f[k] = CODE == LSC_CODE_F32 ? lsc_f32_from_bits(w[k])
                                        : lsc_fp8_half<CODE>(w[k / 2], k & 1);
        lsc_u32 m = 0;
        for (int k = 0; k < E; ++k) {
            lsc_u32 a = lsc_mxk_abs(f[k], mode);
            m = a > m ? a : m;
        }
        for (int off = lanes / 2; off > 0; off >>= 1) {
            lsc_u32 o = __shfl_xor_sync(0xFFFFFFFFu, m, off);
            m = o > m ? o : m;
        }
        lsc_mxk_block bl = lsc_mxk_scale(lsc_mxk_amax(m), elem, mode, pts, HW);
        if (!live)
            continue;
        if ((j & (lanes - 1)) == 0)
            scales[r * nb + (j >> sh)] = (unsigned char)bl.s;
        lsc_u32 c[4];
        for (int k = 0; k < E / 2; ++k) {
            lsc_u32 d = lsc_mxk_pair(f[2 * k], f[2 * k + 1], bl, elem, mode, HW);
            c[k] = e2m1 ? d & 0xFFu : ((d >> 8) & 0xFFu) | ((d & 0xFFu) << 8);
        }
        if (e2m1) {
            unsigned char *o = q + r * (cols / 2) + j * (E / 2);
            if (E == 8)
                *reinterpret_cast<lsc_u32 *>(o) =
                    c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24);
            else
                *reinterpret_cast<lsc_u16 *>(o) = (lsc_u16)(c[0] | (c[1] << 8));
        } else {
            unsigned char *o = q + r * cols + j * E;
            if (E == 8) {
                lsc_fp8_v8 v8;
                v8.lo = c[0] | (c[1] << 16);
                v8.hi = c[2] | (c[3] << 16);
                *reinterpret_cast<lsc_fp8_v8 *>(o) = v8;
            } else {
                *reinterpret_cast<lsc_u32 *>(o) = c[0] | (c[1] << 16);
            }
        }
    }
}

/* Blocks along the rows: block (a power of two, 2 .. 64) divides cols, and
 * blockDim.x is a multiple of 32.  mode: an MX rule of lsc_mx.h, or < 0 for NVFP4's
 * (E2M1 elements, E4M3 scales, pts the per-tensor scale or null; elem unused). */
template <int CODE, int HW>
__global__ void lsc_mx_rows(const void *x, long long rows, long long cols, long long rs,
                            long long cs, int block, int elem, int mode, const float *pts,
                            unsigned char *scales, unsigned char *q)
{
    const int g = block / 2, e2m1 = elem == LSC_MX_E2M1 || mode < 0;
    if (lsc_mx_rows_vec_ok<CODE>(x, rs, cs, block, e2m1, q)) {
        lsc_mx_rows_vec<CODE, HW>(x, rows, cols, rs, block, elem, mode, pts, scales, q);
        return;
    }
    const long long half = cols / 2, n = rows * half, nb = cols / block;
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long lane = threadIdx.x & 31u;
    const int narrow = n <= 0xFFFFFFFFLL, sh = lsc_mxk_log2(g);
    /* every lane of a warp runs the same turns (its shuffles), past the end too */
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p - lane < n; p += step) {
        const int live = p < n;
        long long r, j;
        lsc_mxk_split(p, half, live, narrow, &r, &j);
        const long long c = 2 * j;
        float a = live ? lsc_fp8_in<CODE>(x, r * rs + c * cs) : 0.0f;
        float b = live ? lsc_fp8_in<CODE>(x, r * rs + (c + 1) * cs) : 0.0f;
        lsc_u32 m = lsc_mxk_abs(a, mode), mb = lsc_mxk_abs(b, mode);
        m = mb > m ? mb : m;
        for (int off = g / 2; off > 0; off >>= 1) {
            lsc_u32 o = __shfl_xor_sync(0xFFFFFFFFu, m, off);
            m = o > m ? o : m;
        }
        lsc_mxk_block bl = lsc_mxk_scale(lsc_mxk_amax(m), elem, mode, pts, HW);
        if (!live)
            continue;
        if ((j & (g - 1)) == 0)
            scales[r * nb + (j >> sh)] = (unsigned char)bl.s;
        lsc_mxk_store(q, e2m1 ? r * half + j : r * cols + c, r * cols + c + 1, e2m1,
                      lsc_mxk_pair(a, b, bl, elem, mode, HW));
    }
}

/* Blocks along the columns: block (even) divides rows. */
template <int CODE, int HW>
__global__ void lsc_mx_cols(const void *x, long long rows, long long cols, long long rs,
                            long long cs, int block, int elem, int mode, const float *pts,
                            unsigned char *scales, unsigned char *q)
{
    const int e2m1 = elem == LSC_MX_E2M1 || mode < 0;
    const long long n = rows / block * cols, step = (long long)gridDim.x * blockDim.x;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {
        long long br = t / cols, c = t - br * cols, r0 = br * block;
        const void *col = static_cast<const char *>(x)
                          + (CODE == LSC_CODE_F32 ? 4 : 2) * c * cs;
        lsc_u32 m = 0;
        for (long long r = r0; r < r0 + block; ++r) {
            lsc_u32 a = lsc_mxk_abs(lsc_fp8_in<CODE>(col, r * rs), mode);
            m = a > m ? a : m;
        }
        lsc_mxk_block bl = lsc_mxk_scale(lsc_mxk_amax(m), elem, mode, pts, HW);
        scales[t] = (unsigned char)bl.s;
        for (long long r = r0; r < r0 + block; r += 2) {
            lsc_u32 d = lsc_mxk_pair(lsc_fp8_in<CODE>(col, r * rs),
                                     lsc_fp8_in<CODE>(col, (r + 1) * rs), bl, elem, mode, HW);
            lsc_mxk_store(q, e2m1 ? r / 2 * cols + c : r * cols + c, (r + 1) * cols + c, e2m1,
                          d);
        }
    }
}

/* Dequantize: out (rows x cols, C order, dtype CODE) = float32(element code)
 * * float32(its block's scale), rounded once to CODE: the values
 * lscore.fp8.dequantize_blocks gives.  scales and q are laid out as the
 * quantize kernels write them for `cols_blocks` (0: rows, 1: cols); elem is
 * a float8 code or LSC_MX_E2M1.  mode < 0 (NVFP4) reads E4M3 scales, times
 * the per-tensor scale *pts first when pts is not null; any other mode
 * E8M0 ones, which torchao's modes (FLOOR, CEIL, EVEN, RCEIL, either
 * revision) round to float16 first for a float16 result, as its to_dtype
 * multiplies in the target dtype, and TE's read as its ptx::exp2f of the
 * mode's revision does (lsc_mx_te_exp2f). */
template <int CODE>
__global__ void lsc_mx_dequant(const unsigned char *scales, const unsigned char *q,
                               long long rows, long long cols, int block, int cols_blocks,
                               int elem, int mode, const float *pts, void *out)
{
    const long long n = rows * cols, step = (long long)gridDim.x * blockDim.x;
    const int e2m1 = elem == LSC_MX_E2M1 || mode < 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        long long r = i / cols, c = i - r * cols;
        lsc_u32 s = cols_blocks ? scales[r / block * cols + c]
                                : scales[r * (cols / block) + c / block];
        lsc_u32 code;
        float v, sc, f;
        if (e2m1) {
            lsc_u32 byte = cols_blocks ? q[r / 2 * cols + c] : q[r * (cols / 2) + c / 2];
            code = ((cols_blocks ? r : c) & 1) ? byte >> 4 : byte & 0xFu;
            v = lsc_e2m1_to_f32(code);
        } else {
            v = lsc_fp8_to_f32(q[i], elem);
        }
        if (mode < 0) {
            /* torchao's NVFP4 dequantize: the per-tensor times the block scale first */
            sc = lsc_fp8_to_f32(s, LSC_CODE_E4M3FN);
            sc = pts ? *pts * sc : sc;
        } else if (lsc_mx_is_te(mode)) {
            /* TE's ptx::exp2f: v2.18 reads 0 as +0.0 and 0xFF as +Inf, #3262 as the format */
            sc = lsc_mx_te_exp2f(s, mode & LSC_MX_NEXT);
        } else {
            sc = lsc_e8m0_to_f32(s);
            /* torchao's modes (both revisions): its to_dtype casts the scale to float16 first */
            if (CODE == LSC_CODE_F16 && (mode & ~LSC_MX_NEXT) <= LSC_MX_RCEIL)
                sc = lsc_dev_f16_to_f32(lsc_dev_f32_to_f16(sc));
        }
        f = v * sc;
        lsc_fp8_out<CODE>(out, i, f);
    }
}

#endif /* LSCORE_MX_CU_ */
