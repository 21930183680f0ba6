/* nvfp4.cu: TransformerEngine v2.18's NVFP4 recipe of lsc_nvfp4.h on the GPU:
 * the quantize of one orientation (blocks of 16 along the rows, down the
 * columns with the Hadamard transform or not, 16 x 16 tiles), the transform's
 * amax (and its bfloat16 output), and the decode.
 *
 * Design: an input is a strided 2-D view (rows x cols, element strides rs
 * and cs, float32 / float16 / bfloat16: CODE) as fp8.cu reads it.  A thread
 * owns one block (16 elements of a row, 16 of a column, or a 16 x 16 tile)
 * and runs the scalar rules of lsc_nvfp4.h over it, grid-stride: its amax,
 * scale, draw and codes, so the bytes are the CPU passes' whatever the
 * launch shape.  The global amax comes as a float (the caller's).  With HW
 * = 1 the sm_100a / sm_101a / sm_120a targets round to nearest with TE's
 * own instruction, cvt.rn.satfinite.e2m1x2.f32; HW = 0 and other devices
 * take the rule (NaN +6, as the instruction).  Stochastic rounding is
 * #3281's software rule everywhere (TE v2.18's cvt.rs takes its random bits
 * in an order not traced here).  Outputs are C-contiguous uint8 in
 * lsc_nvfp4_cpu.h's layouts.  The reference is lscore/_reference_nvfp4.py
 * and lscore.kernels.nvfp4_te_quantize.
 */
/* mx.cu: fp8.cu's element access (lsc_fp8_in, lsc_fp8_out, lsc_fp8_block_max) and lsc_mx.h;
 * one chain of includes, so that the host harness takes every kernel file through this one */
#include "lsc_codes.h"
#include "mx.cu"
#include "lsc_nvfp4.h"

/* E2M1 codes of a (low nibble) and b by round to nearest: TE's instruction
 * where the device has it and hw is set, else lsc_nv4_rn. */
static __device__ __forceinline__ lsc_u32 lsc_nv4k_rn2(float a, float b, int hw)
{
#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM101_ALL) || \
    defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL)
    if (hw) {
        lsc_u32 d;
        asm("{\n\t.reg .b8 t;\n\t"
            "cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n\t"
            "mov.b32 %0, {t, t, t, t};\n\t}"
            : "=r"(d)
            : "f"(b), "f"(a));
        return d & 0xFFu;
    }
#endif
    (void)hw;
    return lsc_nv4_rn(a) | (lsc_nv4_rn(b) << 4);
}

/* The codes of a pair: stochastic with the random bytes ra, rb when sr. */
static __device__ __forceinline__ lsc_u32 lsc_nv4k_pair(float a, float b, int sr, lsc_u32 ra,
                                                        lsc_u32 rb, int hw)
{
    return sr ? lsc_nv4_sr(a, ra) | (lsc_nv4_sr(b, rb) << 4) : lsc_nv4k_rn2(a, b, hw);
}

/* |v| as bits for a NaN-free amax */
static __device__ __forceinline__ lsc_u32 lsc_nv4k_abs(float v)
{
    const lsc_u32 a = lsc_f32_bits(v) & 0x7FFFFFFFu;
    return a <= LSC_EXP_F32 ? a : 0u;
}

/* Byte i (0..15) of a draw. */
static __device__ __forceinline__ lsc_u32 lsc_nv4k_byte(const lsc_u32 w[4], int i)
{
    return (w[i >> 2] >> (8 * (i & 3))) & 0xFFu;
}

/* A block's scale code and factor: amax bits m under the global amax's sdec, mult. */
static __device__ __forceinline__ lsc_u32 lsc_nv4k_scale(lsc_u32 m, float sdec, float mult,
                                                         float *enc)
{
    const lsc_u32 sf = lsc_nv4_sf(lsc_f32_from_bits(m), mult);
    *enc = lsc_nv4_enc(sf, sdec);
    return sf;
}

/* The 16 elements down column c of band `band`, with the Hadamard transform
 * (bfloat16 results) when rht. */
template <int CODE>
static __device__ __forceinline__ void lsc_nv4k_column(const void *x, long long band, long long c,
                                                       long long rs, long long cs, int rht,
                                                       float v[16])
{
    for (int i = 0; i < 16; ++i)
        v[i] = lsc_fp8_in<CODE>(x, (16 * band + i) * rs + c * cs) * (rht ? lsc_nv4_sign(i) : 1.0f);
    if (!rht)
        return;
    lsc_nv4_butterflies(v);
    for (int i = 0; i < 16; ++i)
        v[i] = lsc_nv4_widen(lsc_nv4_bf16(v[i]));
}

/* Blocks of 16 along the rows (cols a multiple of 16): scales (rows, cols /
 * 16), codes (rows, cols / 2); sr: the draw of subsequence t for block t. */
template <int CODE, int HW>
__global__ void lsc_nv4_rows(const void *x, long long rows, long long cols, long long rs,
                             long long cs, float amax, int sr, unsigned seed_lo, unsigned seed_hi,
                             unsigned ofs_lo, unsigned ofs_hi, unsigned char *scales,
                             unsigned char *q)
{
    const float senc = lsc_nv4_senc(amax), sdec = 1.0f / senc, mult = lsc_nv4_mult(senc);
    const long long per = cols / 16, n = rows * per, step = (long long)gridDim.x * blockDim.x;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {
        const long long r = t / per, b = t - r * per;
        float v[16], enc;
        lsc_u32 m = 0, w[4] = {0u, 0u, 0u, 0u};
        for (int j = 0; j < 16; ++j) {
            v[j] = lsc_fp8_in<CODE>(x, r * rs + (16 * b + j) * cs);
            const lsc_u32 a = lsc_nv4k_abs(v[j]);
            m = a > m ? a : m;
        }
        scales[t] = (unsigned char)lsc_nv4k_scale(m, sdec, mult, &enc);
        if (sr)
            lsc_nv4_draw((lsc_u64)t, ofs_lo, ofs_hi, seed_lo, seed_hi, w);
        for (int p = 0; p < 8; ++p)
            q[r * (cols / 2) + 8 * b + p] = (unsigned char)lsc_nv4k_pair(
                v[2 * p] * enc, v[2 * p + 1] * enc, sr, lsc_nv4k_byte(w, 2 * p),
                lsc_nv4k_byte(w, 2 * p + 1), HW);
    }
}

/* Blocks of 16 down the columns (rows a multiple of 16; TE's columnwise
 * copy), the Hadamard transform first when rht (CODE bfloat16): scales (rows
 * / 16, cols), codes (rows / 2, cols); sr: column c's block in the transpose,
 * subsequence c * rows / 16 + band with bit 63 set. */
template <int CODE, int HW>
__global__ void lsc_nv4_cols(const void *x, long long rows, long long cols, long long rs,
                             long long cs, float amax, int rht, int sr, unsigned seed_lo,
                             unsigned seed_hi, unsigned ofs_lo, unsigned ofs_hi,
                             unsigned char *scales, unsigned char *q)
{
    const float senc = lsc_nv4_senc(amax), sdec = 1.0f / senc, mult = lsc_nv4_mult(senc);
    const long long n = rows / 16 * cols, step = (long long)gridDim.x * blockDim.x;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {
        const long long band = t / cols, c = t - band * cols;
        float v[16], enc;
        lsc_u32 m = 0, w[4] = {0u, 0u, 0u, 0u};
        lsc_nv4k_column<CODE>(x, band, c, rs, cs, rht, v);
        for (int i = 0; i < 16; ++i) {
            const lsc_u32 a = lsc_nv4k_abs(v[i]);
            m = a > m ? a : m;
        }
        scales[t] = (unsigned char)lsc_nv4k_scale(m, sdec, mult, &enc);
        if (sr)
            lsc_nv4_draw((lsc_u64)(c * (rows / 16) + band) | LSC_NV4_COLS_BIT, ofs_lo, ofs_hi,
                         seed_lo, seed_hi, w);
        for (int p = 0; p < 8; ++p)
            q[(8 * band + p) * cols + c] = (unsigned char)lsc_nv4k_pair(
                v[2 * p] * enc, v[2 * p + 1] * enc, sr, lsc_nv4k_byte(w, 2 * p),
                lsc_nv4k_byte(w, 2 * p + 1), HW);
    }
}

/* 16 x 16 tiles (rows and cols multiples of 16): scales (rows / 16, cols /
 * 16); codes along the rows (cols_out 0: (rows, cols / 2)) or down the
 * columns (cols_out 1: (rows / 2, cols)). */
template <int CODE, int HW>
__global__ void lsc_nv4_tiles(const void *x, long long rows, long long cols, long long rs,
                              long long cs, float amax, int cols_out, unsigned char *scales,
                              unsigned char *q)
{
    const float senc = lsc_nv4_senc(amax), sdec = 1.0f / senc, mult = lsc_nv4_mult(senc);
    const long long per = cols / 16, n = rows / 16 * per, step = (long long)gridDim.x * blockDim.x;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {
        const long long r0 = t / per * 16, c0 = (t - t / per * per) * 16;
        lsc_u32 m = 0;
        float enc;
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 16; ++j) {
                const lsc_u32 a = lsc_nv4k_abs(lsc_fp8_in<CODE>(x, (r0 + i) * rs + (c0 + j) * cs));
                m = a > m ? a : m;
            }
        scales[t] = (unsigned char)lsc_nv4k_scale(m, sdec, mult, &enc);
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 16; j += 2) {
                /* the pair along the codes' axis: (i, j), (i, j + 1) or (j, i), (j + 1, i) */
                const long long ra = cols_out ? r0 + j : r0 + i, ca = cols_out ? c0 + i : c0 + j;
                const float a = lsc_fp8_in<CODE>(x, ra * rs + ca * cs) * enc;
                const float b = lsc_fp8_in<CODE>(x, (ra + cols_out) * rs + (ca + !cols_out) * cs)
                                * enc;
                const long long at = cols_out ? (ra / 2) * cols + ca : ra * (cols / 2) + ca / 2;
                q[at] = (unsigned char)lsc_nv4k_rn2(a, b, HW);
            }
    }
}

/* The Hadamard transform of a bfloat16 view down its columns (rows a multiple
 * of 16): its bfloat16 words into out (rows x cols, C order) when out is not
 * null, and the amax of the results (NaN left out) folded into *amax_bits. */
__global__ void lsc_nv4_rht(const void *x, long long rows, long long cols, long long rs,
                            long long cs, lsc_u16 *out, unsigned *amax_bits)
{
    const long long n = rows / 16 * cols, step = (long long)gridDim.x * blockDim.x;
    lsc_u32 m = 0;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {
        const long long band = t / cols, c = t - band * cols;
        float v[16];
        lsc_nv4k_column<LSC_CODE_BF16>(x, band, c, rs, cs, 1, v);
        for (int i = 0; i < 16; ++i) {
            const lsc_u32 a = lsc_nv4k_abs(v[i]);
            m = a > m ? a : m;
            if (out)
                out[(16 * band + i) * cols + c] = (lsc_u16)(lsc_f32_bits(v[i]) >> 16);
        }
    }
    lsc_fp8_block_max(amax_bits, m);
}

/* The decode: out (rows x cols, C order, CODE) = e2m1 * ((float(sf) * amax) *
 * float32(1 / 2688)), rounded once to CODE, from the codes of `layout` (0:
 * rows, 1: columns, 2: tiles along the rows, 3: tiles down the columns). */
template <int CODE>
__global__ void lsc_nv4_dequant(const unsigned char *scales, const unsigned char *q,
                                long long rows, long long cols, int layout, float amax, void *out)
{
    const long long n = rows * cols, step = (long long)gridDim.x * blockDim.x;
    const int down = layout & 1;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        const long long r = i / cols, c = i - r * cols;
        const lsc_u32 s = layout >= 2   ? scales[r / 16 * (cols / 16) + c / 16]
                          : layout == 1 ? scales[r / 16 * cols + c]
                                        : scales[r * (cols / 16) + c / 16];
        const lsc_u32 byte = down ? q[r / 2 * cols + c] : q[r * (cols / 2) + c / 2];
        const lsc_u32 code = ((down ? r : c) & 1) ? byte >> 4 : byte & 0xFu;
        lsc_fp8_out<CODE>(out, i, lsc_e2m1_to_f32(code) * lsc_nv4_dec(s, amax));
    }
}

