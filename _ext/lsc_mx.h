/* lsc_mx.h: the block-scaled formats' scalar rules: the E8M0 scale format,
 * the E2M1 element format, the block scale exponent of each rule, and one
 * block quantized by MX (block 32) and NVFP4 (block 16).
 *
 * Design: plain C99 that also compiles as CUDA (LSC_FN), like lsc_fp8.h,
 * whose float8 narrowing the elements use.  The rules and their sources:
 *   E8M0      bias 127, code 0xFF NaN, no zero and no Inf: code c is
 *             2**(c - 127) (OCP Microscaling Formats v1.0, section 5.4;
 *             pytorch/ao v0.18.0 torchao/prototype/mx_formats/mx_tensor.py
 *             "E8M0").
 *   E2M1      +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no NaN and no Inf; narrowing
 *             rounds to nearest even and saturates to +-6, by torchao's bit
 *             arithmetic (ao torchao/prototype/custom_fp_utils.py,
 *             _f32_to_floatx_unpacked), NaN included: a NaN gives the code
 *             that arithmetic makes of its bits.  Two codes per byte, the
 *             first in the low nibble (ao mx_formats/kernels.py pack_uint4).
 *   block scale exponent of a block amax, for element format emax / max:
 *   LSC_MX_FLOOR  floor(log2(amax)) - emax (OCP's reference
 *                 microsoft/microxcaling mx/mx_ops.py _shared_exponents;
 *                 torchao's default): the float32 exponent field of amax
 *                 minus emax, clamped to [-127, 128]; NaN amax -> 0xFF
 *                 (ao mx_tensor.py to_mx).  An Inf amax is not NaN there:
 *                 it gives 128 - emax + 127 (247 for E4M3).
 *   LSC_MX_CEIL   the same, +1 where amax's mantissa is non-zero.
 *   LSC_MX_EVEN   FLOOR of amax first rounded to the element's mantissa
 *                 bits (add half an element ulp, clear the float32 mantissa).
 *   LSC_MX_RCEIL  torchao's RCEIL (ao mx_tensor.py _to_mx_rceil, the eager
 *                 path): descale = amax / max in float32; NaN -> 0xFF,
 *                 Inf -> 0xFE, else clamp(ceil(log2(descale)), -127, 127)
 *                 + 127 with log2 rounded to float32 first, so a descale
 *                 just above 2**k (within half a float32 ulp of k in the
 *                 logarithm) gets k, one below the exact rule.
 *   LSC_MX_TE     TransformerEngine's RCEIL, exact: descale = amax *
 *                 float32(1 / max), then its biased exponent rounded up
 *                 when the mantissa is non-zero, except at 0xFE (satfinite)
 *                 and for descales <= 2**-127; NaN -> 0xFF, Inf -> 0xFE,
 *                 0 -> 0x00 (NVIDIA/TransformerEngine v2.18
 *                 transformer_engine/common/util/ptx.cuh float_to_e8m0, the
 *                 software path of cvt.rp.satfinite.ue8m0x2.f32).
 *   LSC_MX_OCP    the OCP rule, exact (the exponent of the spec authors'
 *                 reference microsoft/microxcaling mx/mx_ops.py
 *                 _shared_exponents): floor(log2(amax)) - emax, an all-zero
 *                 block taking float32's smallest normal in the logarithm,
 *                 e < -127 -> -127, e > 127 (an Inf or NaN amax) -> the
 *                 NaN scale 0xFF.  The floor is exact (the exponent of
 *                 amax); microxcaling's torch.log2 rounds to float32 first,
 *                 so there a maximum within a float32 ulp of the logarithm
 *                 below 2**k takes k; elements round to nearest even, where
 *                 microxcaling's default round="nearest" (mx/elemwise_ops.py
 *                 _round_mantissa) rounds ties away from zero.
 * Elements: FLOOR, CEIL and EVEN divide by the scale read as float32 bits
 * code << 23, clamped below to 2**-126 (so a tiny block dequantizes, with
 * code 0 read as 2**-127, to half its value), clamp to +-max and narrow;
 * OCP divides by the exact 2**e (the product with 2**-e, the same real
 * number rounded once; code 0 is 2**-127, no clamp) and clamps to +-max,
 * and every element of a NaN-scale block is the narrowing of float32's
 * NaN 0x7FC00000 (microxcaling's whole block dequantizes to NaN);
 * RCEIL multiplies by torchao's reciprocal (0xFF: the NaN descale, 0xFE:
 * 2**-127, 0: 1, else 2**(127 - c)), TE by its exp2f_rcp of v2.18 (0xFF:
 * NaN, 0xFE: 2**-127, else the float32 bits (254 - c) << 23, 2**127 for 0).
 * float8 elements narrow with lsc_fp8.h's saturating cast, a NaN's sign
 * kept as torch writes it (TE: without); on x86-64-v4, bfloat16 blocks
 * whose factor is a power of two narrow in 16-bit lanes, to the same codes
 * (lsc_mx_bf16x32).
 * NVFP4 (ao torchao/prototype/mx_formats/nvfp4_tensor.py nvfp4_quantize):
 * block scale amax / 6 (divided by the per-tensor scale when there is
 * one), clamped to [2**-6, 448] and narrowed to E4M3; elements times
 * 1 / that scale (with a per-tensor scale pts: (1 / pts) / scale), clamped
 * to +-6, narrowed to E2M1.  The per-tensor scale is amax / (448 * 6)
 * (ao nvfp4_tensor.py per_tensor_amax_to_scale).  The amax of a block is
 * NaN when an element is, the positive quiet NaN 0x7FC00000 (torch.amax).
 * The reference for every result is lscore/_reference_mx.py (mx_*).
 */
#ifndef LSC_MX_H
#define LSC_MX_H

#include "lsc_fp8.h"

enum { LSC_MX_FLOOR = 0, LSC_MX_CEIL = 1, LSC_MX_EVEN = 2, LSC_MX_RCEIL = 3, LSC_MX_TE = 4,
       LSC_MX_OCP = 5 };
/* element formats: the float8 dtype codes of lsc_codes.h, and E2M1 */
enum { LSC_MX_E2M1 = -1 };

/* E8M0 code -> float32: 2**(c - 127) (code 0: the subnormal 2**-127), 0xFF NaN. */
LSC_FN float lsc_e8m0_to_f32(lsc_u32 c)
{
    c &= 0xFFu;
    if (c == 0xFFu)
        return lsc_f32_from_bits(0x7FC00000u);
    return lsc_f32_from_bits(c ? c << 23 : 0x00400000u);
}

/* float32 -> E8M0 code, for a power of two 2**-127 .. 2**127; 0xFF (NaN)
 * for anything else (0, Inf, NaN, negative, not a power of two). */
LSC_FN lsc_u32 lsc_e8m0_from_f32(float f)
{
    lsc_u32 x = lsc_f32_bits(f);
    if (x == 0x00400000u)
        return 0u;
    if (x >= 0x00800000u && x < 0x7F800000u && (x & 0x7FFFFFu) == 0u)
        return x >> 23;
    return 0xFFu;
}

/* float32 -> E2M1 code (low nibble): torchao's _f32_to_floatx_unpacked.
 * Written as masks, as lsc_fp8.h's narrowing, so that the element loops
 * vectorise (a branch on the magnitude mispredicts on every other element
 * of a block spread over [0, 6]). */
LSC_FN lsc_u32 lsc_e2m1_from_f32(float f)
{
    lsc_u32 x = lsc_f32_bits(f);
    lsc_u32 sign = (x >> 28) & 8u;
    lsc_u32 a = x & 0x7FFFFFFFu;
    float af = lsc_f32_from_bits(a);
    /* |f| < 1: adding 2**22 rounds to a multiple of 0.5 (RNE); the steps are the code */
    lsc_u32 small = (lsc_f32_bits(af + 0x1p22f) - (149u << 23)) & 0xFFu;
    /* 1 <= |f| < 6, and NaN as in torchao (its comparisons are false):
       round the float32 to one mantissa bit, rebias */
    lsc_u32 normal = ((a - (126u << 23) + 0x1FFFFFu + ((a >> 22) & 1u)) >> 22) & 0xFFu;
    lsc_u32 is_big = -(lsc_u32)(af >= 6.0f), is_small = -(lsc_u32)(af < 1.0f);
    lsc_u32 code = (7u & is_big) | (small & is_small) | (normal & ~(is_big | is_small));
    return (code | sign) & 0xFFu;
}

/* E2M1 code (low nibble) -> float32, exact. */
LSC_FN float lsc_e2m1_to_f32(lsc_u32 c)
{
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[c & 7u];
    return (c & 8u) ? -v : v;
}

/* emax (the exponent of the largest power of two) and the largest value of
 * an element format (ao mx_formats/constants.py). */
LSC_FN int lsc_mx_emax(int elem)
{
    return elem == LSC_CODE_E4M3FN ? 8 : elem == LSC_CODE_E5M2 ? 15 : 2;
}

LSC_FN float lsc_mx_max(int elem)
{
    return elem == LSC_CODE_E4M3FN ? 448.0f : elem == LSC_CODE_E5M2 ? 57344.0f : 6.0f;
}

LSC_FN int lsc_mx_mbits(int elem)
{
    return elem == LSC_CODE_E4M3FN ? 3 : elem == LSC_CODE_E5M2 ? 2 : 1;
}

/* TE's float_to_e8m0 of a descale. */
LSC_FN lsc_u32 lsc_mx_te_e8m0(float val)
{
    const lsc_u32 x = lsc_f32_bits(val);
    const lsc_u32 e = (x >> 23) & 0xFFu, m = x & 0x7FFFFFu;
    /* the biased exponent (a sign, if any, falls off in the byte), rounded up */
    const lsc_u32 up = (m > 0u) & (e != 0xFEu) & !((e == 0u) & (m <= 0x400000u));
    const lsc_u32 code = ((x >> 23) + up) & 0xFFu;
    /* selects, so that a loop over blocks vectorises */
    return val != val ? 0xFFu : e == 0xFFu ? 0xFEu : code; /* +-0: code is 0 */
}

/* torchao's RCEIL code of a block amax, clamp(ceil(float32(log2(d))), -127,
 * 127) + 127 of d = amax / max (NaN -> 0xFF, Inf -> 0xFE), from the bits of
 * d, with no logarithm (so the GPU, whose math library rounds log2 otherwise
 * than the CPU's, gives the same codes).  For d = 2**k * (1 + m * 2**-23)
 * (m > 0, k != 0), float32(log2(d)) is k exactly when log2(1 + m * 2**-23)
 * is below half the float32 spacing beside k toward k + 1, 2**-e, that is
 * m <= floor((2**(2**-e) - 1) * 2**23) = 22 >> (e - 18) for e = 18 .. 25
 * (never a tie, the logarithm being irrational), and rounds above k
 * otherwise, so its ceiling is k + 1.  Equal to the logarithm's rule for
 * every float32 amax (the slow test of tests/kernels/test_mx_cuda.py). */
LSC_FN lsc_u32 lsc_mx_rceil(float amax, int elem)
{
    const float d = amax / lsc_mx_max(elem);
    const lsc_u32 x = lsc_f32_bits(d);
    /* a subnormal d >= 2**-127 is 2**-127 * (1 + mant * 2**-23) */
    const int sub = x < LSC_EXP_LSB_F32;
    const lsc_i32 k = sub ? -127 : (lsc_i32)(x >> 23) - 127;
    const lsc_u32 mant = sub ? (x - 0x00400000u) << 1 : x & 0x7FFFFFu;
    const lsc_i32 a = k < 0 ? -k : k;
    /* floor(log2(a)) of 1 <= a <= 127; the spacing above k (k > 0) or below
       |k| (k < 0): half a power of two less there */
    const lsc_i32 j = (a >= 2) + (a >= 4) + (a >= 8) + (a >= 16) + (a >= 32) + (a >= 64);
    const lsc_i32 e = 24 - j + ((k < 0) & (a == (1 << j)));
    const lsc_i32 c = mant == 0u ? k : k == 0 ? 1 : mant <= (22u >> (e - 18)) ? k : k + 1;
    const lsc_u32 code = (lsc_u32)((c > 127 ? 127 : c) + 127);
    /* selects, not returns, so that a loop over blocks vectorises: NaN ->
       0xFF, Inf -> 0xFE, below 2**-127 (the ceiling -127 or less) -> 0 */
    return d != d ? 0xFFu : x >= LSC_EXP_F32 ? 0xFEu : x < 0x00400000u ? 0u : code;
}

/* The E8M0 scale code of a block whose amax (>= 0 or NaN) is `amax`. */
LSC_FN lsc_u32 lsc_mx_scale(float amax, int elem, int mode)
{
    lsc_u32 x = lsc_f32_bits(amax);
    lsc_i32 e;
    if (mode == LSC_MX_TE)
        return lsc_mx_te_e8m0(amax * (float)(1.0 / (double)lsc_mx_max(elem)));
    if (mode == LSC_MX_RCEIL)
        return lsc_mx_rceil(amax, elem);
    if (amax != amax)
        return 0xFFu;
    if (mode == LSC_MX_OCP) {
        /* zero and subnormal amaxes: floor(log2) <= -126, so e <= -128 -> -127 */
        if (x >= 0x7F800000u)
            return 0xFFu;
        e = (lsc_i32)(x >> 23) - 127 - lsc_mx_emax(elem);
        return (lsc_u32)((e < -127 ? -127 : e) + 127);
    }
    if (mode == LSC_MX_EVEN)
        x = (x + (1u << (23 - lsc_mx_mbits(elem) - 1))) & 0xFF800000u;
    e = (lsc_i32)((x >> 23) & 0xFFu) - 127 - lsc_mx_emax(elem);
    if (mode == LSC_MX_CEIL)
        e += (x & 0x7FFFFFu) != 0u;
    e = e < -127 ? -127 : e > 128 ? 128 : e;
    return (lsc_u32)(e + 127);
}

/* x * r where a NaN r wins over a NaN x, as torch's CPU multiplication of
 * the elements by a per-block factor gives it (the float product of two
 * NaNs is either operand's, by the compiler's operand order). */
LSC_FN float lsc_mx_mul(float x, float r)
{
    return r != r ? r : x * r;
}

LSC_FN float lsc_mx_clamp(float v, float lo, float hi)
{
    return v < lo ? lo : v > hi ? hi : v;  /* a NaN passes, as torch.clamp */
}

/* The factor each element of a block with scale code s and amax `amax` is
 * multiplied by, by the rule of `mode`; a NaN factor makes every element
 * that NaN.  FLOOR, CEIL and EVEN divide by d = max(2**(s - 127), 2**-126)
 * (0xFF: Inf): x / d is x * (1 / d), the same real number rounded once,
 * since 1 / d is a power of two 2**-127 .. 2**126 held exactly (and 0 for
 * Inf: x / Inf = x * 0, NaN for an Inf x either way); OCP divides by 2**e,
 * s <= 252 when finite (amax < 2**128, emax >= 2), so 2**(127 - s) is
 * normal. */
/* TransformerEngine v2.18's exp2f_rcp<float> (transformer_engine/common/util/
 * ptx.cuh): 2**(127 - c) as the float32 bits (254 - c) << 23, so code 0 is
 * 2**127; code 0xFE (unbiased 127) is the subnormal 2**-127 and 0xFF NaN
 * 0x7FFFFFFF. */
LSC_FN float lsc_mx_te_rcp(lsc_u32 s)
{
    return s == 0xFFu ? lsc_f32_from_bits(0x7FFFFFFFu)
         : s == 0xFEu ? 0x1p-127f : lsc_f32_from_bits((254u - s) << 23);
}

LSC_FN float lsc_mx_factor(lsc_u32 s, float amax, int elem, int mode)
{
    if (mode == LSC_MX_RCEIL)
        return s == 0xFFu ? amax / lsc_mx_max(elem) : s == 0xFEu ? 0x1p-127f : s == 0u
               ? 1.0f : lsc_f32_from_bits((254u - s) << 23);
    if (mode == LSC_MX_TE)
        return lsc_mx_te_rcp(s);
    if (mode == LSC_MX_OCP)
        return s == 0xFFu ? lsc_f32_from_bits(0x7FC00000u) : lsc_f32_from_bits((254u - s) << 23);
    {
        float d = lsc_f32_from_bits(s << 23);
        return 1.0f / (d < 0x1p-126f ? 0x1p-126f : d);
    }
}

/* The narrowing flags of an element under `mode`: saturating, a NaN's sign
 * kept as torch writes it (TE: without). */
LSC_FN int lsc_mx_flags(int mode)
{
    return LSC_FP8_SAT | (mode == LSC_MX_TE ? 0 : LSC_FP8_NAN_SIGN);
}

/* y narrowed to the element format: its float8 or E2M1 code. */
LSC_FN lsc_u32 lsc_mx_narrow(float y, int elem, int flags)
{
    return elem == LSC_MX_E2M1 ? lsc_e2m1_from_f32(y) : lsc_fp8_from_f32(y, elem, flags);
}

/* One element x times the block factor r (a NaN r wins), clamped to +-max
 * and narrowed: its float8 or E2M1 code.  The clamp changes nothing that
 * the saturating narrowing would not (E2M1 saturates to +-6 itself), so
 * every mode clamps. */
LSC_FN lsc_u32 lsc_mx_code(float x, float r, int elem, int flags)
{
    /* lsc_mx_clamp(lsc_mx_mul(x, r), -top, top) as masks, which vectorise */
    const float top = lsc_mx_max(elem);
    float p = x * r;
    lsc_u32 rnan = -(lsc_u32)(r != r);
    lsc_u32 lo = -(lsc_u32)(p < -top), hi = -(lsc_u32)(p > top);
    lsc_u32 w = (lsc_f32_bits(p) & ~(rnan | lo | hi)) | (lsc_f32_bits(r) & rnan)
                | (lsc_f32_bits(-top) & lo) | (lsc_f32_bits(top) & hi);
    return lsc_mx_narrow(lsc_f32_from_bits(w), elem, flags);
}

/* One element x (float32) of a block with scale code s and amax `amax`,
 * scaled and narrowed by the rule of `mode`: its float8 or E2M1 code. */
LSC_FN lsc_u32 lsc_mx_elem(float x, lsc_u32 s, float amax, int elem, int mode)
{
    return lsc_mx_code(x, lsc_mx_factor(s, amax, elem, mode), elem, lsc_mx_flags(mode));
}

/* The amax of n float32 values: NaN when one is NaN (torch.amax). */
LSC_FN float lsc_mx_amax(const float *x, long n)
{
    lsc_u32 m = 0u;
    long i;
    for (i = 0; i < n; ++i) {
        lsc_u32 a = lsc_f32_bits(x[i]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    return m > 0x7F800000u ? lsc_f32_from_bits(0x7FC00000u) : lsc_f32_from_bits(m);
}

/* One MX block of n (32) float32 values: its scale code, and its n element
 * codes into q (E2M1: n / 2 bytes, low nibble first). */
LSC_FN lsc_u32 lsc_mx_block(const float *x, long n, int elem, int mode, unsigned char *q)
{
    float amax = lsc_mx_amax(x, n);
    lsc_u32 s = lsc_mx_scale(amax, elem, mode);
    long i;
    if (elem == LSC_MX_E2M1) {
        for (i = 0; i + 1 < n; i += 2)
            q[i / 2] = (unsigned char)(lsc_mx_elem(x[i], s, amax, elem, mode)
                                       | (lsc_mx_elem(x[i + 1], s, amax, elem, mode) << 4));
    } else {
        for (i = 0; i < n; ++i)
            q[i] = (unsigned char)lsc_mx_elem(x[i], s, amax, elem, mode);
    }
    return s;
}

/* NVFP4's per-tensor scale of a tensor amax: amax / (448 * 6) in float32. */
LSC_FN float lsc_nvfp4_tensor_scale(float amax) { return amax / 2688.0f; }

/* NVFP4's E4M3 block scale code of a block amax, with the per-tensor scale
 * pts when has_pts; its factor r for the elements (1 / scale, or
 * (1 / pts) / scale).  Without a per-tensor scale both divide by 1, which
 * changes no bits: a select of the divisor rather than a branch around a
 * division, so that a loop over blocks vectorises (a division that may
 * trap is not run speculatively). */
LSC_FN lsc_u32 lsc_nvfp4_scale(float amax, int has_pts, float pts)
{
    float bs = (amax / 6.0f) / (has_pts ? pts : 1.0f);
    return lsc_fp8_from_f32(lsc_mx_clamp(bs, 0x1p-6f, 448.0f), LSC_CODE_E4M3FN,
                            LSC_FP8_SAT | LSC_FP8_NAN_SIGN);
}

LSC_FN float lsc_nvfp4_factor(lsc_u32 s, int has_pts, float pts)
{
    return (1.0f / (has_pts ? pts : 1.0f)) / lsc_fp8_to_f32(s, LSC_CODE_E4M3FN);
}

/* One NVFP4 block of n (16) float32 values: its E4M3 scale code, and the
 * n / 2 packed E2M1 bytes into q; has_pts: divide by the per-tensor scale pts. */
LSC_FN lsc_u32 lsc_nvfp4_block(const float *x, long n, int has_pts, float pts, unsigned char *q)
{
    lsc_u32 s = lsc_nvfp4_scale(lsc_mx_amax(x, n), has_pts, pts);
    float r = lsc_nvfp4_factor(s, has_pts, pts);
    long i;
    for (i = 0; i + 1 < n; i += 2)
        q[i / 2] = (unsigned char)(lsc_mx_code(x[i], r, LSC_MX_E2M1, 0)
                                   | (lsc_mx_code(x[i + 1], r, LSC_MX_E2M1, 0) << 4));
    return s;
}


/* ---- the CPU block passes ----------------------------------------------- */
#if !defined(__CUDACC__) && !defined(LSC_DEVICE_EMULATION)

/* One fused pass per orientation over a 2-D float32 / float16 / bfloat16
 * view read in place (any strides): each block's amax and its codes come
 * from the same read of the input (the elements of a chunk of blocks, or a
 * tile of block rows, stay in L1 between the two steps).  Rows (axis -1):
 * blocks run along a row, LSC_MX_GROUP blocks at a time: each block's
 * amax, then the scales and factors of the group (the scalar functions
 * above, in loops across the blocks, which vectorise), then each block's
 * codes.  Columns (axis 0, TransformerEngine's
 * columnwise): a tile of `block` rows by up to LSC_MX_TILE columns, the
 * column amaxes accumulated row by row (sequential reads along each row),
 * then the tile read again for the codes; E2M1 codes pack the two rows of
 * a pair into one byte, the first in the low nibble.  The per-element
 * loops are compiled once per x86-64 level like lsc_fp8.h's casts (the
 * levels of lsc_isa.h) and a strided run calls the same bodies, so every
 * level and stride gives the bits of lsc_mx_block / lsc_nvfp4_block. */

#include <stdatomic.h>
#include <stdint.h>
#ifdef LSC_X86_DISPATCH
#include <immintrin.h>
#endif

/* a block pass's rule: element format index (0 e4m3fn, 1 e5m2, 2 e2m1), the
 * MX mode or LSC_MX_NVFP4, NVFP4's per-tensor scale, the block length */
enum { LSC_MX_NVFP4 = 16 };
typedef struct {
    int elem;
    int mode;
    int has_pts;
    float pts;
    int64_t block;
} lsc_mx_rule;

#define LSC_MX_CHUNK 1024   /* elements of a rows chunk; the largest block */
#define LSC_MX_TILE 256     /* columns of a columns tile */
#define LSC_MX_GROUP 16     /* blocks of a row whose scales are taken together */
#define LSC_MX_INL static inline __attribute__((always_inline))

/* The amax of a block whose amax bits are m (a NaN: the quiet NaN). */
LSC_MX_INL float lsc_mx_amax_of(lsc_u32 m)
{
    return m > 0x7F800000u ? lsc_f32_from_bits(0x7FC00000u) : lsc_f32_from_bits(m);
}

/* The scale code of a block whose amax bits are m. */
LSC_MX_INL lsc_u32 lsc_mx_pick_scale(lsc_u32 m, const lsc_mx_rule *k, int elem, int mode)
{
    if (mode == LSC_MX_NVFP4)
        return lsc_nvfp4_scale(lsc_mx_amax_of(m), k->has_pts, k->pts);
    return lsc_mx_scale(lsc_mx_amax_of(m), elem, mode);
}

/* The factor of a block with scale code s and amax bits m. */
LSC_MX_INL float lsc_mx_pick_factor(lsc_u32 s, lsc_u32 m, const lsc_mx_rule *k, int elem,
                                    int mode)
{
    if (mode == LSC_MX_NVFP4)
        return lsc_nvfp4_factor(s, k->has_pts, k->pts);
    return lsc_mx_factor(s, lsc_mx_amax_of(m), elem, mode);
}

/* The scale codes (into sc) and factors (into r) of nb blocks whose amax bits
 * are m: the scales, then the factors, each a loop across the blocks, which
 * vectorises the scale rule (NVFP4's divisions and E4M3 narrowing, MX's
 * exponent arithmetic); one loop of both leaves control flow that stops the
 * vectoriser (the code's range known to the decoding). */
LSC_MX_INL void lsc_mx_group_scales(const lsc_u32 *m, int64_t nb, const lsc_mx_rule *k, int elem,
                                    int mode, lsc_u32 *sc, float *r)
{
    for (int64_t b = 0; b < nb; b++)
        sc[b] = lsc_mx_pick_scale(m[b], k, elem, mode);
    for (int64_t b = 0; b < nb; b++)
        r[b] = lsc_mx_pick_factor(sc[b], m[b], k, elem, mode);
}

/* CALL (a statement that names the mode M) with M a constant for FLOOR,
 * RCEIL, TE, OCP and NVFP4 and k->mode for the others (CEIL, EVEN): inlined
 * into each case, the rule of a constant mode has no branch on the mode, and
 * its loops across blocks vectorise.  The one list of constant modes for
 * every body that makes its mode one. */
#define LSC_MX_BY_MODE(k, CALL)                                                             \
    switch ((k)->mode) {                                                                    \
    case LSC_MX_FLOOR: { const int M = LSC_MX_FLOOR; CALL; break; }                        \
    case LSC_MX_RCEIL: { const int M = LSC_MX_RCEIL; CALL; break; }                        \
    case LSC_MX_TE: { const int M = LSC_MX_TE; CALL; break; }                              \
    case LSC_MX_OCP: { const int M = LSC_MX_OCP; CALL; break; }                            \
    case LSC_MX_NVFP4: { const int M = LSC_MX_NVFP4; CALL; break; }                        \
    default: { const int M = (k)->mode; CALL; }                                            \
    }

/* lsc_mx_group_scales for a mode known only at run time (the columns bodies,
 * a tile's blocks at a time), made a constant by LSC_MX_BY_MODE. */
LSC_MX_INL void lsc_mx_scales_any(const lsc_u32 *m, int64_t nb, const lsc_mx_rule *k, int elem,
                                  lsc_u32 *sc, float *r)
{
    LSC_MX_BY_MODE(k, lsc_mx_group_scales(m, nb, k, elem, M, sc, r));
}

/* The scale code of a block whose amax bits are m, and its factor into *r. */
LSC_MX_INL lsc_u32 lsc_mx_pick(lsc_u32 m, const lsc_mx_rule *k, int elem, int mode, float *r)
{
    lsc_u32 s = lsc_mx_pick_scale(m, k, elem, mode);
    *r = lsc_mx_pick_factor(s, m, k, elem, mode);
    return s;
}

LSC_MX_INL float lsc_mx_load(const char *x, int64_t i, int64_t stride, int code)
{
    return lsc_fp8_load(x, i, stride, code);
}

LSC_MX_INL lsc_u32 lsc_mx_absmax(const float *w, int64_t n)
{
    lsc_u32 m = 0;
    for (int64_t j = 0; j < n; j++) {
        lsc_u32 a = lsc_f32_bits(w[j]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    return m;
}

/* The codes of one block of `block` elements `stride` bytes apart, whose
 * factor is r, into q: lsc_mx_code's codes.  A NaN r makes every element
 * r's code; otherwise the product is narrowed without lsc_mx_code's clamp
 * to +-max, which changes no code: the float8 narrowing saturates (the MX
 * flags have LSC_FP8_SAT) and E2M1's does itself.  Called with a constant
 * block (32, 16) the loop vectorises whole. */
LSC_MX_INL void lsc_mx_row_codes(const char *x, int64_t block, int64_t stride, int code,
                                 int elem, float r, int flags, unsigned char *q)
{
    if (r != r) {
        lsc_u32 c = lsc_mx_narrow(r, elem, flags);
        memset(q, (int)(elem == LSC_MX_E2M1 ? c | (c << 4) : c),
               (size_t)(elem == LSC_MX_E2M1 ? block / 2 : block));
    } else if (elem == LSC_MX_E2M1) {
        /* one code per element first, then the pairs packed: each loop
           vectorises at the full width (reading pairs of elements does not) */
        unsigned char t[LSC_MX_CHUNK];
        for (int64_t j = 0; j < block; j++)
            t[j] = (unsigned char)lsc_e2m1_from_f32(lsc_mx_load(x, j, stride, code) * r);
        for (int64_t j = 0; j < block / 2; j++)
            q[j] = (unsigned char)(t[2 * j] | (t[2 * j + 1] << 4));
    } else {
        for (int64_t j = 0; j < block; j++)
            q[j] = (unsigned char)lsc_fp8_from_f32(lsc_mx_load(x, j, stride, code) * r, elem,
                                                   flags);
    }
}

/* A group of nb (<= LSC_MX_GROUP) consecutive blocks: the amaxes of all,
 * then their scale codes (into s) and factors (lsc_mx_group_scales: the
 * rule vectorised across the blocks instead of run once per block between
 * the vector loops); then the codes, each block read again (from L1). */
LSC_MX_INL void lsc_mx_row_group(const char *x, int64_t nb, int64_t block, int64_t stride,
                                 int code, int elem, int mode, const lsc_mx_rule *k, int flags,
                                 unsigned char *s, unsigned char *q)
{
    const int64_t width = elem == LSC_MX_E2M1 ? block / 2 : block;
    lsc_u32 m[LSC_MX_GROUP];
    lsc_u32 sc[LSC_MX_GROUP];
    float r[LSC_MX_GROUP];
    for (int64_t b = 0; b < nb; b++) {
        const char *xb = x + b * block * stride;
        lsc_u32 mb = 0;
        for (int64_t j = 0; j < block; j++) {
            lsc_u32 a = lsc_f32_bits(lsc_mx_load(xb, j, stride, code)) & 0x7FFFFFFFu;
            mb = a > mb ? a : mb;
        }
        m[b] = mb;
    }
    lsc_mx_group_scales(m, nb, k, elem, mode, sc, r);
    for (int64_t b = 0; b < nb; b++)
        s[b] = (unsigned char)sc[b];
    if (elem != LSC_MX_E2M1 && block <= 32) {
        /* float8 codes of short blocks: one loop over the whole group with
           the factors spread per element, at the full vector width (a loop
           per block of 32 runs at half of it), then the NaN-factor blocks
           rewritten as lsc_mx_row_codes writes them */
        float fr[LSC_MX_GROUP * 32];
        for (int64_t b = 0; b < nb; b++)
            for (int64_t j = 0; j < block; j++)
                fr[b * block + j] = r[b];
        for (int64_t i = 0; i < nb * block; i++)
            q[i] = (unsigned char)lsc_fp8_from_f32(lsc_mx_load(x, i, stride, code) * fr[i],
                                                   elem, flags);
        for (int64_t b = 0; b < nb; b++)
            if (r[b] != r[b])
                lsc_mx_row_codes(x + b * block * stride, block, stride, code, elem, r[b],
                                 flags, q + b * width);
        return;
    }
    for (int64_t b = 0; b < nb; b++)
        lsc_mx_row_codes(x + b * block * stride, block, stride, code, elem, r[b], flags,
                         q + b * width);
}

/* The blocks of one row with the mode constant (the scale rule inlined). */
LSC_MX_INL void lsc_mx_row_mode(const char *x, int64_t n, int64_t stride, int code, int elem,
                                int mode, const lsc_mx_rule *k, unsigned char *s,
                                unsigned char *q)
{
    const int64_t block = k->block, width = elem == LSC_MX_E2M1 ? block / 2 : block;
    const int flags = mode == LSC_MX_NVFP4 ? 0 : lsc_mx_flags(mode);
    const int64_t nb = n / block, G = LSC_MX_GROUP;
    /* the common blocks with a constant length, which unrolls; whole groups
       with a constant count, then the rest */
#define LSC_MX_ROW_BLOCKS(B)                                                                \
    do {                                                                                    \
        int64_t b = 0;                                                                      \
        for (; b + G <= nb; b += G)                                                         \
            lsc_mx_row_group(x + b * (B) * stride, G, (B), stride, code, elem, mode, k,     \
                             flags, s + b, q + b * width);                                  \
        if (b < nb)                                                                         \
            lsc_mx_row_group(x + b * (B) * stride, nb - b, (B), stride, code, elem, mode,   \
                             k, flags, s + b, q + b * width);                               \
    } while (0)
    if (block == 32)
        LSC_MX_ROW_BLOCKS(32);
    else if (block == 16)
        LSC_MX_ROW_BLOCKS(16);
    else
        LSC_MX_ROW_BLOCKS(block);
#undef LSC_MX_ROW_BLOCKS
}

/* One row of n elements (a multiple of the block) `stride` bytes apart:
 * n / block scale codes into s, the codes into q (E2M1: n / 2 bytes). */
LSC_MX_INL void lsc_mx_row_body(const char *x, int64_t n, int64_t stride, int code, int elem,
                                const lsc_mx_rule *k, unsigned char *s, unsigned char *q)
{
    LSC_MX_BY_MODE(k, lsc_mx_row_mode(x, n, stride, code, elem, M, k, s, q));
}

/* The codes of a columns tile: `block` rows of w columns from xt (row
 * stride rs, column stride cs bytes), column j times its factor fac[j],
 * into q (row stride `cols`; E2M1 packs rows 2i and 2i + 1 into one byte,
 * the first in the low nibble).  As lsc_mx_row_group's codes: the product
 * narrowed without lsc_mx_code's clamp (the float8 narrowing saturates,
 * E2M1's does itself), then the columns whose factor is NaN rewritten
 * with that NaN's code.  flags is a constant at each call (from
 * lsc_mx_cols_codes), so the narrowing has no branch on it and the loops
 * vectorise. */
LSC_MX_INL void lsc_mx_cols_narrow(const char *xt, int64_t block, int64_t w, int64_t rs,
                                   int64_t cs, int64_t cols, int code, int elem, int flags,
                                   const float *fac, unsigned char *q)
{
    int any_nan = 0;
    if (elem == LSC_MX_E2M1) {
        for (int64_t i = 0; i < block; i += 2) {
            unsigned char *qr = q + (i / 2) * cols;
            const char *xa = xt + i * rs, *xb = xt + (i + 1) * rs;
            for (int64_t j = 0; j < w; j++)
                qr[j] = (unsigned char)(lsc_e2m1_from_f32(lsc_mx_load(xa, j, cs, code) * fac[j])
                                        | (lsc_e2m1_from_f32(lsc_mx_load(xb, j, cs, code) * fac[j])
                                           << 4));
        }
    } else {
        for (int64_t i = 0; i < block; i++) {
            unsigned char *qr = q + i * cols;
            const char *xr = xt + i * rs;
            for (int64_t j = 0; j < w; j++)
                qr[j] = (unsigned char)lsc_fp8_from_f32(lsc_mx_load(xr, j, cs, code) * fac[j],
                                                        elem, flags);
        }
    }
    for (int64_t j = 0; j < w; j++)
        any_nan |= fac[j] != fac[j];
    if (!any_nan)
        return;
    for (int64_t j = 0; j < w; j++) {
        if (fac[j] == fac[j])
            continue;
        const lsc_u32 c = lsc_mx_narrow(fac[j], elem, flags);
        if (elem == LSC_MX_E2M1)
            for (int64_t i = 0; i < block; i += 2)
                q[(i / 2) * cols + j] = (unsigned char)(c | (c << 4));
        else
            for (int64_t i = 0; i < block; i++)
                q[i * cols + j] = (unsigned char)c;
    }
}

/* lsc_mx_cols_narrow with the narrowing flags of `mode` as a constant. */
LSC_MX_INL void lsc_mx_cols_codes(const char *xt, int64_t block, int64_t w, int64_t rs,
                                  int64_t cs, int64_t cols, int code, int elem, int mode,
                                  const float *fac, unsigned char *q)
{
    if (lsc_mx_flags(mode) & LSC_FP8_NAN_SIGN)
        lsc_mx_cols_narrow(xt, block, w, rs, cs, cols, code, elem,
                           LSC_FP8_SAT | LSC_FP8_NAN_SIGN, fac, q);
    else   /* TE's */
        lsc_mx_cols_narrow(xt, block, w, rs, cs, cols, code, elem, LSC_FP8_SAT, fac, q);
}

/* A 2-D view of rows x cols (a multiple of the block), strides in bytes,
 * blocks along the first axis: (rows / block) x cols scale codes into s,
 * the codes into q (rows x cols; E2M1 (rows / 2) x cols).  Per tile of
 * `block` rows by up to LSC_MX_TILE columns: the column amaxes, row by row;
 * the scales and factors (lsc_mx_scales_any, loops across the columns);
 * then the codes (lsc_mx_cols_codes), the tile read again from L1. */
LSC_MX_INL void lsc_mx_cols_body(const char *x, int64_t rows, int64_t cols, int64_t rs,
                                 int64_t cs, int code, int elem, const lsc_mx_rule *k,
                                 unsigned char *s, unsigned char *q)
{
    lsc_u32 m[LSC_MX_TILE], sc[LSC_MX_TILE];
    float fac[LSC_MX_TILE];
    const int64_t block = k->block;
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
        for (int64_t c0 = 0; c0 < cols; c0 += LSC_MX_TILE) {
            const int64_t w = cols - c0 < LSC_MX_TILE ? cols - c0 : LSC_MX_TILE;
            const char *xt = x + r0 * rs + c0 * cs;
            unsigned char *qt = q + (elem == LSC_MX_E2M1 ? r0 / 2 : r0) * cols + c0;
            for (int64_t j = 0; j < w; j++)
                m[j] = 0;
            for (int64_t i = 0; i < block; i++) {
                for (int64_t j = 0; j < w; j++) {
                    lsc_u32 a = lsc_f32_bits(lsc_mx_load(xt + i * rs, j, cs, code)) & 0x7FFFFFFFu;
                    m[j] = a > m[j] ? a : m[j];
                }
            }
            lsc_mx_scales_any(m, w, k, elem, sc, fac);
            for (int64_t j = 0; j < w; j++)
                s[(r0 / block) * cols + c0 + j] = (unsigned char)sc[j];
            lsc_mx_cols_codes(xt, block, w, rs, cs, cols, code, elem, k->mode, fac, qt);
        }
    }
}

typedef void (*lsc_mx_row_fn)(const char *x, int64_t n, const lsc_mx_rule *k, unsigned char *s,
                              unsigned char *q);
typedef void (*lsc_mx_cols_fn)(const char *x, int64_t rows, int64_t cols, int64_t rs,
                               const lsc_mx_rule *k, unsigned char *s, unsigned char *q);

/* One ISA level's passes over contiguous rows: [element index][input code]. */
typedef struct {
    const char *name;
    lsc_mx_row_fn row[3][LSC_NCODES];
    lsc_mx_cols_fn cols[3][LSC_NCODES];
} lsc_mx_isa;

#define LSC_MX_WIDTH(CODE) ((CODE) == LSC_CODE_F32 ? 4 : 2)
#define LSC_MX_FNS(SFX, ROW, COLS, NAME, CODE, ELEM)                                        \
    __attribute__((flatten)) static void lsc_mx_r_##NAME##_##SFX(                         \
        const char *x, int64_t n, const lsc_mx_rule *k, unsigned char *s, unsigned char *q) \
    {                                                                                       \
        ROW(x, n, LSC_MX_WIDTH(CODE), (CODE), (ELEM), k, s, q);                             \
    }                                                                                       \
    __attribute__((flatten)) static void lsc_mx_c_##NAME##_##SFX(                         \
        const char *x, int64_t rows, int64_t cols, int64_t rs, const lsc_mx_rule *k,        \
        unsigned char *s, unsigned char *q)                                                 \
    {                                                                                       \
        COLS(x, rows, cols, rs, LSC_MX_WIDTH(CODE), (CODE), (ELEM), k, s, q);               \
    }
#define LSC_MX_ELEM_FNS(SFX, ROW, COLS, E, ELEM)                                            \
    LSC_MX_FNS(SFX, ROW, COLS, E##_f32, LSC_CODE_F32, ELEM)                                 \
    LSC_MX_FNS(SFX, ROW, COLS, E##_f16, LSC_CODE_F16, ELEM)                                 \
    LSC_MX_FNS(SFX, ROW, COLS, E##_bf16, LSC_CODE_BF16, ELEM)
#define LSC_MX_ROW(SFX, E)                                                                  \
    {0, lsc_mx_r_##E##_f16_##SFX, lsc_mx_r_##E##_bf16_##SFX, lsc_mx_r_##E##_f32_##SFX, 0, 0, 0}
#define LSC_MX_COL(SFX, E)                                                                  \
    {0, lsc_mx_c_##E##_f16_##SFX, lsc_mx_c_##E##_bf16_##SFX, lsc_mx_c_##E##_f32_##SFX, 0, 0, 0}
/* a level's passes; ROW, COLS: its rows and columns bodies (lsc_mx_row_body's and
   lsc_mx_cols_body's arguments) */
#define LSC_MX_LEVEL(SFX, ROW, COLS)                                                        \
    LSC_MX_ELEM_FNS(SFX, ROW, COLS, e4, LSC_CODE_E4M3FN)                                    \
    LSC_MX_ELEM_FNS(SFX, ROW, COLS, e5, LSC_CODE_E5M2)                                      \
    LSC_MX_ELEM_FNS(SFX, ROW, COLS, e2, LSC_MX_E2M1)                                        \
    static const lsc_mx_isa lsc_mx_isa_##SFX = {                                            \
        #SFX,                                                                               \
        {LSC_MX_ROW(SFX, e4), LSC_MX_ROW(SFX, e5), LSC_MX_ROW(SFX, e2)},                    \
        {LSC_MX_COL(SFX, e4), LSC_MX_COL(SFX, e5), LSC_MX_COL(SFX, e2)},                    \
    };

#ifdef LSC_X86_DISPATCH
LSC_MX_LEVEL(v2, lsc_mx_row_body, lsc_mx_cols_body)
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
LSC_MX_LEVEL(v3, lsc_mx_row_body, lsc_mx_cols_body)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4", "prefer-vector-width=512")

/* ---- x86-64-v4: float8 codes of bfloat16 rows in 16-bit lanes -----------
 * The rows pass above widens every bfloat16 to float32, multiplies and
 * narrows in 32-bit lanes: about 20 vector operations per 16 elements,
 * three times the memory floor at 1e8 elements.  Where a block's factor r
 * is a power of two 2**k, x * r only moves a bfloat16's exponent, so one
 * AVX-512BW vector holds a whole block of 32 and the narrowing is done on
 * the bfloat16 bits themselves, y = |x| + (k << 7), in 16-bit lanes:
 *   normal codes (y >= the format's smallest normal): rebias, round the
 *     dropped mantissa bits to nearest even, cap at the largest finite code
 *     (lsc_fp8_from_f32's rule on the same bits);
 *   subnormal codes: the significand (y & 0x7F) | 0x80 of exponent E is
 *     v * 2**(E - 134); in units of the smallest subnormal (2**-9, 2**-16)
 *     that is p / 2**8 with p = v << (E - lo), lo = 117 (e4m3) or 110
 *     (e5m2), rounded to nearest even; below lo (a shift count that wraps
 *     past 15) p is 0, as every value under half the smallest subnormal is;
 *   zero and subnormal x (|x| < 0x80): code 0, with the sign.
 * This is the product rounded once, so the codes are lsc_fp8_from_f32's of
 * float32(x) * r exactly when the block is `plain`: r = 2**k with -126 <= k
 * <= 100 (a subnormal x then scales below half of either format's smallest
 * subnormal, as in float32), the amax finite (no NaN or Inf element) and
 * amax * r below 2**128 (y fits the lanes).  Every other block (NaN or Inf
 * in it, RCEIL's NaN descale, a factor 2**-127, ...) takes lsc_mx_row_codes.
 * Checked for every finite bfloat16 at every such k in both formats, and by
 * the passes' tests at every level. */
LSC_MX_INL __m256i lsc_mx_bf16x32(__m512i b, __m512i k7, int elem)
{
    const int e4 = elem == LSC_CODE_E4M3FN, sh = e4 ? 4 : 5;
    const __m512i one = _mm512_set1_epi16(1);
    const __m512i a = _mm512_and_si512(b, _mm512_set1_epi16(0x7FFF));
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi16(b, 8), _mm512_set1_epi16(0x80));
    const __m512i y = _mm512_add_epi16(a, k7);
    /* normal: lsc_fp8_from_f32's rebias and rounding on 7 mantissa bits */
    const __m512i r = _mm512_sub_epi16(y, _mm512_set1_epi16(e4 ? 120 << 7 : 112 << 7));
    const __m512i odd = _mm512_and_si512(_mm512_srai_epi16(r, sh), one);
    const __m512i half = _mm512_set1_epi16((1 << (sh - 1)) - 1);
    const __m512i normal = _mm512_srai_epi16(_mm512_add_epi16(_mm512_add_epi16(r, half), odd), sh);
    const __m512i capped = _mm512_min_epi16(normal, _mm512_set1_epi16(e4 ? 0x7E : 0x7B));
    /* subnormal: p = v << (E - lo), rounded to nearest even at bit 8 */
    const __m512i cnt = _mm512_sub_epi16(_mm512_srai_epi16(y, 7),
                                         _mm512_set1_epi16(e4 ? 117 : 110));
    const __m512i v = _mm512_ternarylogic_epi32(y, _mm512_set1_epi16(0x7F), _mm512_set1_epi16(0x80),
                                                0xEA);   /* (y & 0x7F) | 0x80 */
    const __m512i p = _mm512_sllv_epi16(v, cnt);
    const __m512i podd = _mm512_and_si512(_mm512_srli_epi16(p, 8), one);
    const __m512i sub = _mm512_srli_epi16(
        _mm512_add_epi16(_mm512_add_epi16(p, _mm512_set1_epi16(127)), podd), 8);
    const __mmask32 is_normal = _mm512_cmpge_epi16_mask(y,
                                                        _mm512_set1_epi16(e4 ? 0x3C80 : 0x3880));
    const __mmask32 is_live = _mm512_cmpge_epu16_mask(a, _mm512_set1_epi16(0x80));
    const __m512i mag = _mm512_maskz_mov_epi16(is_live,
                                               _mm512_mask_blend_epi16(is_normal, sub, capped));
    return _mm512_cvtepi16_epi8(_mm512_or_si512(mag, sign));
}

/* Whether a block with factor r and amax bits m is plain (lsc_mx_bf16x32's
 * condition), and the exponent step of its factor in bfloat16 bits into *k7. */
LSC_MX_INL int lsc_mx_bf16_plain(float r, lsc_u32 m, lsc_i32 *k7)
{
    const lsc_u32 rb = lsc_f32_bits(r);
    const lsc_i32 er = (lsc_i32)(rb >> 23);
    *k7 = (er - 127) * 128;
    return (rb & 0x7FFFFFu) == 0u && er >= 1 && er <= 127 + 100 && m < 0x7F800000u
           && (lsc_i32)(m >> 16) + *k7 <= 0x7F7F;
}

/* The largest of 32 unsigned 16-bit lanes (phminposuw of their complement). */
LSC_MX_INL lsc_u32 lsc_mx_umax16(__m512i a)
{
    const __m256i h = _mm256_max_epu16(_mm512_castsi512_si256(a),
                                       _mm512_extracti64x4_epi64(a, 1));
    const __m128i c = _mm_max_epu16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128i low = _mm_minpos_epu16(_mm_xor_si128(c, _mm_set1_epi16(-1)));
    return 0xFFFFu ^ ((lsc_u32)_mm_cvtsi128_si32(low) & 0xFFFFu);
}

/* A contiguous bfloat16 row of MX blocks of 32, the mode constant: per group
 * of blocks the amaxes (16-bit lanes; the float32 amax bits are m << 16),
 * the scales and factors as lsc_mx_row_group takes them, then each block's
 * codes, by lsc_mx_bf16x32 where the block is plain. */
LSC_MX_INL void lsc_mx_bf16_row_mode(const uint16_t *x, int64_t n, int elem, int mode,
                                     const lsc_mx_rule *k, unsigned char *s, unsigned char *q)
{
    const __m512i mask = _mm512_set1_epi16(0x7FFF);
    const int flags = lsc_mx_flags(mode);
    const int64_t nb = n / 32;
    for (int64_t b0 = 0; b0 < nb; b0 += LSC_MX_GROUP) {
        const int64_t g = nb - b0 < LSC_MX_GROUP ? nb - b0 : LSC_MX_GROUP;
        const uint16_t *xg = x + b0 * 32;
        lsc_u32 m[LSC_MX_GROUP], sc[LSC_MX_GROUP];
        lsc_i32 k7[LSC_MX_GROUP];
        unsigned char plain[LSC_MX_GROUP];
        float r[LSC_MX_GROUP];
        for (int64_t b = 0; b < g; b++)
            m[b] = lsc_mx_umax16(_mm512_and_si512(_mm512_loadu_si512(xg + 32 * b), mask)) << 16;
        lsc_mx_group_scales(m, g, k, elem, mode, sc, r);
        for (int64_t b = 0; b < g; b++) {
            plain[b] = lsc_mx_bf16_plain(r[b], m[b], &k7[b]);
            s[b0 + b] = (unsigned char)sc[b];
        }
        /* the plain blocks in a loop with no call, which keeps its constants
           in registers; then the others */
        for (int64_t b = 0; b < g; b++)
            if (plain[b])
                _mm256_storeu_si256((__m256i *)(q + (b0 + b) * 32),
                                    lsc_mx_bf16x32(_mm512_loadu_si512(xg + 32 * b),
                                                   _mm512_set1_epi16((short)k7[b]), elem));
        for (int64_t b = 0; b < g; b++)
            if (!plain[b])
                lsc_mx_row_codes((const char *)(xg + 32 * b), 32, 2, LSC_CODE_BF16, elem, r[b],
                                 flags, q + (b0 + b) * 32);
    }
}

/* A contiguous bfloat16 view of rows x cols (row stride rs bytes) with MX
 * blocks of 32 along the columns, the float8 codes of each tile (32 rows by
 * up to LSC_MX_TILE columns) as lsc_mx_cols_body makes them, in 16-bit
 * lanes, the tile read row by row: the column amaxes of 32 columns in one
 * vector, the scales and factors across the tile's columns, then where a
 * vector's 32 blocks are all plain its codes by lsc_mx_bf16x32 with a
 * factor per lane (the last, partial vector masked); the others by
 * lsc_mx_cols_codes. */
LSC_MX_INL void lsc_mx_bf16_cols(const char *x, int64_t rows, int64_t cols, int64_t rs, int elem,
                                 const lsc_mx_rule *k, unsigned char *s, unsigned char *q)
{
    enum { NV = LSC_MX_TILE / 32 };
    const __m512i mask = _mm512_set1_epi16(0x7FFF);
    lsc_u32 m[LSC_MX_TILE], sc[LSC_MX_TILE];
    float r[LSC_MX_TILE];
    for (int64_t r0 = 0; r0 < rows; r0 += 32) {
        for (int64_t c0 = 0; c0 < cols; c0 += LSC_MX_TILE) {
            const int64_t w = cols - c0 < LSC_MX_TILE ? cols - c0 : LSC_MX_TILE;
            const int64_t nv = (w + 31) / 32;
            const __mmask32 last = w % 32 ? ((__mmask32)1 << (w % 32)) - 1 : ~(__mmask32)0;
            const char *xt = x + r0 * rs + c0 * 2;
            unsigned char *qt = q + r0 * cols + c0;
            __m512i acc[NV], kv[NV];
            int plain[NV];
            /* the amaxes row by row (each row's 2 * w bytes in order) */
            for (int64_t v = 0; v < nv; v++)
                acc[v] = _mm512_setzero_si512();
            for (int64_t i = 0; i < 32; i++)
                for (int64_t v = 0; v < nv; v++)
                    acc[v] = _mm512_max_epu16(
                        acc[v], _mm512_and_si512(
                                    _mm512_maskz_loadu_epi16(v == nv - 1 ? last : ~(__mmask32)0,
                                                             xt + i * rs + v * 64),
                                    mask));
            for (int64_t v = 0; v < nv; v++) {
                uint16_t t[32];
                _mm512_storeu_si512(t, acc[v]);
                for (int64_t l = 0; l < 32 && v * 32 + l < w; l++)
                    m[v * 32 + l] = (lsc_u32)t[l] << 16;
            }
            lsc_mx_scales_any(m, w, k, elem, sc, r);
            for (int64_t j = 0; j < w; j++)
                s[(r0 / 32) * cols + c0 + j] = (unsigned char)sc[j];
            for (int64_t v = 0; v < nv; v++) {
                int16_t k7[32] = {0};
                plain[v] = 1;
                for (int64_t l = 0; l < 32 && v * 32 + l < w; l++) {
                    lsc_i32 kl;
                    plain[v] &= lsc_mx_bf16_plain(r[v * 32 + l], m[v * 32 + l], &kl);
                    k7[l] = (int16_t)kl;
                }
                kv[v] = _mm512_loadu_si512(k7);
            }
            /* the codes row by row: the plain vectors in 16-bit lanes, then the others */
            for (int64_t i = 0; i < 32; i++)
                for (int64_t v = 0; v < nv; v++)
                    if (plain[v])
                        _mm256_mask_storeu_epi8(
                            qt + i * cols + v * 32, v == nv - 1 ? last : ~(__mmask32)0,
                            lsc_mx_bf16x32(_mm512_maskz_loadu_epi16(
                                               v == nv - 1 ? last : ~(__mmask32)0,
                                               xt + i * rs + v * 64),
                                           kv[v], elem));
            for (int64_t v = 0; v < nv; v++) {
                const int64_t n = w - v * 32 < 32 ? w - v * 32 : 32;
                if (plain[v])
                    continue;
                lsc_mx_cols_codes(xt + v * 64, 32, n, rs, 2, cols, LSC_CODE_BF16, elem, k->mode,
                                  r + v * 32, qt + v * 32);
            }
        }
    }
}

/* x86-64-v4's columns body: float8 codes of bfloat16 with MX blocks of 32
 * in 16-bit lanes (lsc_mx_bf16_cols), everything else as lsc_mx_cols_body. */
LSC_MX_INL void lsc_mx_cols_body_v4(const char *x, int64_t rows, int64_t cols, int64_t rs,
                                    int64_t cs, int code, int elem, const lsc_mx_rule *k,
                                    unsigned char *s, unsigned char *q)
{
    if (code != LSC_CODE_BF16 || cs != 2 || elem == LSC_MX_E2M1 || k->block != 32
        || k->mode == LSC_MX_NVFP4) {
        lsc_mx_cols_body(x, rows, cols, rs, cs, code, elem, k, s, q);
        return;
    }
    lsc_mx_bf16_cols(x, rows, cols, rs, elem, k, s, q);
}

/* x86-64-v4's rows body: float8 codes of contiguous bfloat16 rows with MX
 * blocks of 32 in 16-bit lanes, everything else as lsc_mx_row_body. */
LSC_MX_INL void lsc_mx_row_body_v4(const char *x, int64_t n, int64_t stride, int code, int elem,
                                   const lsc_mx_rule *k, unsigned char *s, unsigned char *q)
{
    const uint16_t *h = (const uint16_t *)x;
    if (code != LSC_CODE_BF16 || stride != 2 || elem == LSC_MX_E2M1 || k->block != 32
        || k->mode == LSC_MX_NVFP4) {
        lsc_mx_row_body(x, n, stride, code, elem, k, s, q);
        return;
    }
    LSC_MX_BY_MODE(k, lsc_mx_bf16_row_mode(h, n, elem, M, k, s, q));
}

LSC_MX_LEVEL(v4, lsc_mx_row_body_v4, lsc_mx_cols_body_v4)
#pragma GCC pop_options
static const lsc_mx_isa *const lsc_mx_isas[LSC_NISAS] = {&lsc_mx_isa_v2, &lsc_mx_isa_v3,
                                                         &lsc_mx_isa_v4};
#else
LSC_MX_LEVEL(baseline, lsc_mx_row_body, lsc_mx_cols_body)
static const lsc_mx_isa *const lsc_mx_isas[LSC_NISAS] = {&lsc_mx_isa_baseline};
#endif

/* Read by every pass, written by lsc_mx_isa_select: relaxed, as lsc_fp8.h's. */
static _Atomic(const lsc_mx_isa *) lsc_mx_isa_active;

static int lsc_mx_isa_select(const char *name)
{
    int k = lsc_isa_find(name);
    if (k < 0)
        return -1;
    atomic_store_explicit(&lsc_mx_isa_active, lsc_mx_isas[k], memory_order_relaxed);
    return 0;
}

static inline const lsc_mx_isa *lsc_mx_isa_get(void)
{
    const lsc_mx_isa *isa = atomic_load_explicit(&lsc_mx_isa_active, memory_order_relaxed);
    if (!isa) {
        lsc_mx_isa_select(NULL);
        isa = atomic_load_explicit(&lsc_mx_isa_active, memory_order_relaxed);
    }
    return isa;
}

static inline int lsc_mx_elem_index(int elem)
{
    return elem == LSC_CODE_E4M3FN ? 0 : elem == LSC_CODE_E5M2 ? 1 : 2;
}

/* Rows [r0, r1) of a rows x cols view (strides rs, cs bytes) quantized with
 * blocks along `axis` (-1 or 0; axis 0: r0 and r1 multiples of the block)
 * into the scales s and codes q laid out for the whole view. */
static void lsc_mx_quantize_rows(const char *x, int64_t r0, int64_t r1, int64_t cols,
                                 int64_t rs, int64_t cs, int code, int axis,
                                 const lsc_mx_rule *k, unsigned char *s, unsigned char *q)
{
    const int width = LSC_MX_WIDTH(code), e = lsc_mx_elem_index(k->elem);
    const int e2 = k->elem == LSC_MX_E2M1;
    const lsc_mx_isa *isa = lsc_mx_isa_get();
    if (r1 <= r0 || cols <= 0)
        return;
    if (axis == 0) {
        const char *xr = x + r0 * rs;
        unsigned char *sr = s + (r0 / k->block) * cols, *qr = q + (e2 ? r0 / 2 : r0) * cols;
        if (cs == width)
            isa->cols[e][code](xr, r1 - r0, cols, rs, k, sr, qr);
        else if (code == LSC_CODE_F32)
            lsc_mx_cols_body(xr, r1 - r0, cols, rs, cs, LSC_CODE_F32, k->elem, k, sr, qr);
        else if (code == LSC_CODE_F16)
            lsc_mx_cols_body(xr, r1 - r0, cols, rs, cs, LSC_CODE_F16, k->elem, k, sr, qr);
        else
            lsc_mx_cols_body(xr, r1 - r0, cols, rs, cs, LSC_CODE_BF16, k->elem, k, sr, qr);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = x + r * rs;
        unsigned char *sr = s + r * (cols / k->block), *qr = q + r * (e2 ? cols / 2 : cols);
        if (cs == width)
            isa->row[e][code](xr, cols, k, sr, qr);
        else if (code == LSC_CODE_F32)
            lsc_mx_row_body(xr, cols, cs, LSC_CODE_F32, k->elem, k, sr, qr);
        else if (code == LSC_CODE_F16)
            lsc_mx_row_body(xr, cols, cs, LSC_CODE_F16, k->elem, k, sr, qr);
        else
            lsc_mx_row_body(xr, cols, cs, LSC_CODE_BF16, k->elem, k, sr, qr);
    }
}

/* ---- one pass as a job of chunks on the package's thread pool ------------
 * The pass is cut in chunks from the work alone (never from the thread
 * count): groups of whole rows of about LSC_MX_CHUNK_ELEMS elements, or,
 * for rows longer than that along axis -1, pieces of one row of a whole
 * number of blocks; each chunk writes only its own scales and codes, so
 * the bytes are the same with any number of threads.  The pool's
 * parallel-for (lsc_pool.h) comes from the caller; a pass smaller than
 * LSC_MX_MT_MIN_ELEMS runs on the caller alone when threads is 0. */
#define LSC_MX_CHUNK_ELEMS 32768
#define LSC_MX_MT_MIN_ELEMS 200000

typedef int (*lsc_mx_for_fn)(int (*fn)(void *ctx, size_t chunk), void *ctx, size_t nchunks,
                             int threads);

typedef struct {
    const char *x;
    int64_t rows, cols, rs, cs;
    int code, axis;
    const lsc_mx_rule *k;
    unsigned char *s, *q;
    int64_t rows_per_chunk;   /* whole rows per chunk, or 0: pieces of rows */
    int64_t piece, pieces;    /* elements per piece, pieces per row */
} lsc_mx_job;

static int lsc_mx_job_chunk(void *ctx, size_t chunk)
{
    const lsc_mx_job *j = (const lsc_mx_job *)ctx;
    const int64_t c = (int64_t)chunk;
    if (j->rows_per_chunk) {
        int64_t r0 = c * j->rows_per_chunk, r1 = r0 + j->rows_per_chunk;
        lsc_mx_quantize_rows(j->x, r0, r1 < j->rows ? r1 : j->rows, j->cols, j->rs, j->cs,
                             j->code, j->axis, j->k, j->s, j->q);
    } else {
        const int64_t r = c / j->pieces, c0 = (c % j->pieces) * j->piece;
        const int64_t n = j->cols - c0 < j->piece ? j->cols - c0 : j->piece;
        const int64_t qw = j->k->elem == LSC_MX_E2M1 ? j->cols / 2 : j->cols;
        lsc_mx_quantize_rows(j->x + r * j->rs + c0 * j->cs, 0, 1, n, 0, j->cs, j->code, -1,
                             j->k, j->s + r * (j->cols / j->k->block) + c0 / j->k->block,
                             j->q + r * qw + (j->k->elem == LSC_MX_E2M1 ? c0 / 2 : c0));
    }
    return 0;
}

/* The pass over a rows x cols view (lsc_mx_quantize_rows's arguments) cut
 * in chunks and run through pool_for on at most `threads` threads (0: by
 * the size, 1: the caller alone). */
static void lsc_mx_job_run(const char *x, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                           int code, int axis, const lsc_mx_rule *k, unsigned char *s,
                           unsigned char *q, lsc_mx_for_fn pool_for, int threads)
{
    lsc_mx_job j = {x, rows, cols, rs, cs, code, axis, k, s, q, 0, 0, 1};
    size_t nchunks;
    if (rows <= 0 || cols <= 0)
        return;
    if (threads == 0)
        threads = rows * cols >= LSC_MX_MT_MIN_ELEMS ? 0 : 1;
    if (axis == 0) {
        int64_t groups = LSC_MX_CHUNK_ELEMS / (cols * k->block);
        j.rows_per_chunk = (groups > 1 ? groups : 1) * k->block;
    } else if (cols <= LSC_MX_CHUNK_ELEMS) {
        j.rows_per_chunk = LSC_MX_CHUNK_ELEMS / cols;
    } else {
        j.piece = LSC_MX_CHUNK_ELEMS / k->block * k->block;
        j.pieces = (cols + j.piece - 1) / j.piece;
    }
    nchunks = j.rows_per_chunk ? (size_t)((rows + j.rows_per_chunk - 1) / j.rows_per_chunk)
                               : (size_t)(rows * j.pieces);
    pool_for(lsc_mx_job_chunk, &j, nchunks, threads);
}

#undef LSC_MX_LEVEL
#undef LSC_MX_ELEM_FNS
#undef LSC_MX_FNS
#undef LSC_MX_ROW
#undef LSC_MX_COL
#undef LSC_MX_BY_MODE
#endif /* the CPU block passes */

#endif
