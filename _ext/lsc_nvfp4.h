/* lsc_nvfp4.h: TransformerEngine v2.18's NVFP4 training recipe
 * (NVFP4BlockScaling) as scalar rules: the two-level scale, the E2M1
 * conversion of its kernels, stochastic rounding, the counter-based random
 * bits, and the 16-point random Hadamard transform; then the CPU passes.
 *
 * Design: plain C99 that also compiles as CUDA (LSC_FN), beside lsc_mx.h
 * (torchao's NVFP4, whose E2M1 narrowing is reused).  The rules and where
 * they come from (NVIDIA/TransformerEngine tag v2.18, commit 27486e03cfc1,
 * transformer_engine/common/ unless said; IEEE float32, round to nearest
 * even, no fast math):
 *   S_enc  = 2688 / A, at most FLT_MAX; 1 where A is 0 or S_enc is 0 (A
 *            Inf); A NaN gives FLT_MAX (cast/nvfp4/core_nvfp4.cuh
 *            compute_global_encode_scaling_factor_FP4).  A is the global
 *            amax of the tensor as quantized, NaN elements left out.
 *   S_dec  = 1 / S_enc (quantize_transpose_nvfp4.cuh:354-364, a double
 *            1.0 / S_enc rounded to float: the float32 reciprocal).
 *   sf     = e4m3(amax_b * (S_enc * (1 / 6)))  with 1 / 6 rounded to
 *            float32 first; the cast saturates (Inf -> 448), amax_b the
 *            block's amax, NaN left out (core_nvfp4.cuh
 *            compute_decoding_scaling_factor).
 *   enc    = min(1 / (float(sf) * S_dec), FLT_MAX) (quantize_transpose_
 *            nvfp4.cuh:482-484, 668-671).
 *   q      = e2m1(float(x) * enc): cvt.rn.satfinite.e2m1x2.f32, to nearest
 *            even on the E2M1 grid, beyond 6 (and Inf) +-6, zeros keep
 *            their sign, NaN +6 (code 0x7: "NaN becomes positive
 *            MAX_NORM", util/ptx.cuh at TE commit fc1fc0e787fc); or
 *   q      = stochastic: TE's software rounding of #3281 (util/ptx.cuh
 *            stochastic_round_fp4_e2m1 at fc1fc0e787fc), from 8 random bits
 *            r: u = r / 256, a = |v|, step(a) = 0.5 below 2, 1 below 4,
 *            else 2; t = a + u * step(a) (fma; u * step is exact), q =
 *            min(floor(t / step(t)) * step(t), 6) with v's sign, NaN +6.
 *   decode = q * ((float(sf) * A) * (1 / 2688))  (cast/nvfp4/
 *            dequantize_nvfp4.cuh:65-77).
 *   random bits: Philox4x32 with 10 rounds (common.h
 *            NVTE_BUILD_NUM_PHILOX_ROUNDS) as util/curanddx.hpp defines it:
 *            key = the 64-bit seed (low word first), counter words (x, y,
 *            z, w) = (offset low, offset high, subsequence low, high), the
 *            state TE's philox4x32_native_state::init(seed, subsequence,
 *            offset) sets; a round maps (x, y, z, w) to (hi(M1 * z) ^ y ^
 *            k0, lo(M1 * z), hi(M0 * x) ^ w ^ k1, lo(M0 * x)) with M0 =
 *            0xD2511F53, M1 = 0xCD9E8D57, the key growing by (0x9E3779B9,
 *            0xBB67AE85) between rounds.  lscore's own map of draws to
 *            elements (TE's differs by kernel): element i of the quantized
 *            orientation in row-major order (the columnwise copy: of the
 *            transpose) takes byte i % 16 (byte j % 4 of word j / 4) of the
 *            draw with subsequence i / 16, bit 63 set for the columnwise
 *            copy, at the call's offset.
 *   Hadamard transform: 16 elements x (bfloat16) to x * diag(s) * H16 / 4,
 *            H16 Sylvester's ((-1)**popcount(r & c)), s the fixed signs of
 *            pytorch/tensor/nvfp4_tensor.py get_wgrad_sign_vector (bit i
 *            set where s_i = -1: 0xD7E8); TE multiplies bfloat16 by +-0.25
 *            (exact) and sums in float32 on tensor cores, then rounds to
 *            bfloat16 (hadamard_transform/hadamard_transform_utils.cuh).
 *            Here: x * 0.25 * s_i (exact), then four butterfly stages
 *            (pairs h = 1, 2, 4, 8 apart: a + b, a - b in float32), then
 *            bfloat16 to nearest even, NaN 0x7FFF (cvt.rn.bf16.f32's).
 *            Every partial sum is exact, and so the result is the exact
 *            sum rounded once whatever the order of the additions, when the
 *            16 inputs' nonzero magnitudes lie within 2**12 of each other
 *            (their sums are multiples of the smallest one's last bit and
 *            below 2**24 of them); beyond that the order can matter.
 * The reference for every result is lscore/_reference_nvfp4.py.
 */
#ifndef LSC_NVFP4_H
#define LSC_NVFP4_H

#include "lsc_mx.h"

#define LSC_NV4_FLT_MAX 0x1.fffffep127f
#define LSC_NV4_SIGNS 0xD7E8u   /* bit i: sign s_i of the Hadamard transform is -1 */

/* ---- Philox4x32-10 -------------------------------------------------------- */

/* One draw: the four words of Philox4x32-10 at counter c with key (k0, k1). */
LSC_FN void lsc_philox10(const lsc_u32 c[4], lsc_u32 k0, lsc_u32 k1, lsc_u32 out[4])
{
    lsc_u32 x = c[0], y = c[1], z = c[2], w = c[3];
    for (int r = 0; r < 10; r++) {
        const lsc_u64 p0 = (lsc_u64)0xD2511F53u * x, p1 = (lsc_u64)0xCD9E8D57u * z;
        const lsc_u32 nx = (lsc_u32)(p1 >> 32) ^ y ^ k0, ny = (lsc_u32)p1;
        const lsc_u32 nz = (lsc_u32)(p0 >> 32) ^ w ^ k1, nw = (lsc_u32)p0;
        x = nx;
        y = ny;
        z = nz;
        w = nw;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = x;
    out[1] = y;
    out[2] = z;
    out[3] = w;
}

/* The draw of subsequence `sub` at offset (o0, o1) with seed (k0, k1). */
LSC_FN void lsc_nv4_draw(lsc_u64 sub, lsc_u32 o0, lsc_u32 o1, lsc_u32 k0, lsc_u32 k1,
                         lsc_u32 out[4])
{
    const lsc_u32 c[4] = {o0, o1, (lsc_u32)sub, (lsc_u32)(sub >> 32)};
    lsc_philox10(c, k0, k1, out);
}

/* the subsequence bit of the columnwise copy */
#define LSC_NV4_COLS_BIT 0x8000000000000000ull

/* ---- the two-level scale ---------------------------------------------------- */

/* S_enc of a global amax A. */
LSC_FN float lsc_nv4_senc(float amax)
{
    float s = 2688.0f / amax;
    s = s < LSC_NV4_FLT_MAX ? s : LSC_NV4_FLT_MAX;   /* fminf: a NaN gives FLT_MAX */
    return amax == 0.0f || s == 0.0f ? 1.0f : s;
}

/* The factor a block amax is scaled by before its E4M3 cast: S_enc * float32(1 / 6). */
LSC_FN float lsc_nv4_mult(float senc) { return senc * (1.0f / 6.0f); }

/* The E4M3 code of a block of amax amax_b (lsc_nv4_mult's mult). */
LSC_FN lsc_u32 lsc_nv4_sf(float amax_b, float mult)
{
    return lsc_fp8_from_f32(amax_b * mult, LSC_CODE_E4M3FN, LSC_FP8_SAT);
}

/* The factor each element of a block with scale code sf is multiplied by. */
LSC_FN float lsc_nv4_enc(lsc_u32 sf, float sdec)
{
    const float e = 1.0f / (lsc_fp8_to_f32(sf, LSC_CODE_E4M3FN) * sdec);
    return e < LSC_NV4_FLT_MAX ? e : LSC_NV4_FLT_MAX;
}

/* The decode scale of a block: (float(sf) * A) * float32(1 / 2688). */
LSC_FN float lsc_nv4_dec(lsc_u32 sf, float amax)
{
    return lsc_fp8_to_f32(sf, LSC_CODE_E4M3FN) * amax * (1.0f / 2688.0f);
}

/* ---- the element rounding ------------------------------------------------ */

/* E2M1 code of v by cvt.rn.satfinite.e2m1x2.f32: to nearest even on the
 * grid, beyond 6 (and Inf) +-6, the sign kept (zeros too), a NaN +6 (0x7).
 * Written as integer selects on the float bits, which vectorise: |v| capped at
 * 8 (a NaN and Inf too); in its region g = 0, 1, 2 (below 2, below 4, else)
 * the grid step is 2**(g - 1), so k = |v| * 2**(1 - g) rounded to an integer,
 * to nearest even by adding 2**23, is the grid point, and its code is
 * min(k + 2 * g, 7) (codes 0..4 are 0..2 in steps of 0.5, 5 and 6 are 3
 * and 4, 7 is 6).  A rounding up to the region's top lands on the next
 * region's first code, which is the same value. */
LSC_FN lsc_u32 lsc_nv4_rn(float v)
{
    const lsc_u32 bits = lsc_f32_bits(v), ab = bits & 0x7FFFFFFFu;
    const lsc_u32 c = ab < 0x41000000u ? ab : 0x41000000u;
    const lsc_u32 g = (c >= 0x40000000u) + (c >= 0x40800000u);
    const float y = lsc_f32_from_bits(c) * lsc_f32_from_bits(0x40000000u - (g << 23));
    const lsc_u32 k = lsc_f32_bits(y + 0x1p23f) - 0x4B000000u, code = k + 2u * g;
    return (code < 7u ? code : 7u) | ((bits >> 28) & 8u & -(lsc_u32)(ab <= 0x7F800000u));
}

/* E2M1 code of v stochastically rounded with the random byte r (#3281's rule).
 * Written as integer compares and selects on the float bits, which vectorise:
 * t = |v| + u * step(|v|) in float32 as the rule's fma (u * step is exact),
 * clamped to 8 (a NaN to 8 too), which leaves the result (6 for any t >= 6)
 * unchanged; then with the region g = 0, 1, 2 of t (below 2, below 4, else)
 * the rule's floor(t / step(t)) is k = (int)(t * 2**(1 - g)), and the code of
 * k * step(t) is min(k + 2 * g, 7) (codes 0..3 are 0..1.5 in steps of 0.5, 4
 * and 5 are 2 and 3, 6 and 7 are 4 and 6). */
LSC_FN lsc_u32 lsc_nv4_sr(float v, lsc_u32 r)
{
    const lsc_u32 bits = lsc_f32_bits(v), ab = bits & 0x7FFFFFFFu;
    /* step(a) = 0.5, 1, 2: the exponent of 0.5 raised by a >= 2 and a >= 4 */
    const lsc_u32 ga = (ab >= 0x40000000u) + (ab >= 0x40800000u);
    const float u = (float)(r & 0xFFu) * 0x1p-8f;
    const float t = lsc_f32_from_bits(ab) + u * lsc_f32_from_bits(0x3F000000u + (ga << 23));
    const lsc_u32 tb0 = lsc_f32_bits(t), tb = tb0 < 0x41000000u ? tb0 : 0x41000000u;
    const lsc_u32 g = (tb >= 0x40000000u) + (tb >= 0x40800000u);
    const lsc_u32 k = (lsc_u32)(lsc_i32)(lsc_f32_from_bits(tb) * lsc_f32_from_bits(0x40000000u - (g << 23)));
    const lsc_u32 c = k + 2u * g, code = c < 7u ? c : 7u;
    const lsc_u32 keep = -(lsc_u32)(ab <= 0x7F800000u);   /* a NaN rounds to +6 */
    return code | ((bits >> 28) & 8u & keep);
}

/* ---- the Hadamard transform ---------------------------------------------- */

/* float -> bfloat16 to nearest even, a NaN 0x7FFF (the GPU's cvt.rn.bf16.f32). */
LSC_FN lsc_u16 lsc_nv4_bf16(float f)
{
    const lsc_u32 x = lsc_f32_bits(f), r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    const lsc_u32 nan = -(lsc_u32)((x & 0x7FFFFFFFu) > 0x7F800000u);
    return (lsc_u16)((r & ~nan) | (0x7FFFu & nan));
}

/* A bfloat16 word widened to float32 (exact). */
LSC_FN float lsc_nv4_widen(lsc_u16 w) { return lsc_f32_from_bits((lsc_u32)w << 16); }

/* The signed factor 0.25 * s_i of input i. */
LSC_FN float lsc_nv4_sign(int i)
{
    return (LSC_NV4_SIGNS >> i) & 1u ? -0.25f : 0.25f;
}

/* The butterflies of the transform over v[0..15] in place (inputs already
 * times lsc_nv4_sign), stage by stage. */
LSC_FN void lsc_nv4_butterflies(float v[16])
{
    for (int h = 1; h < 16; h *= 2)
        for (int i = 0; i < 16; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

/* The transform of 16 float32 values (bfloat16 widened) into bfloat16 words. */
LSC_FN void lsc_nv4_rht16(const float x[16], lsc_u16 out[16])
{
    float v[16];
    for (int i = 0; i < 16; i++)
        v[i] = x[i] * lsc_nv4_sign(i);
    lsc_nv4_butterflies(v);
    for (int i = 0; i < 16; i++)
        out[i] = lsc_nv4_bf16(v[i]);
}

#if !defined(__CUDACC__) && !defined(LSC_DEVICE_EMULATION)
#include "lsc_nvfp4_cpu.h"
#endif

#endif /* LSC_NVFP4_H */
