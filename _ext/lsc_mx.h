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
 *                 software path of cvt.rp.satfinite.ue8m0x2.f32).  The
 *                 block amax leaves NaN elements out, as TE's fmaxf, __hmax
 *                 and max.xorsign.abs reductions from 0 do
 *                 (common/cast/mxfp8/quantize_mxfp8.cuh:211-363 at v2.18;
 *                 PTX max without .NaN returns the input that is not NaN):
 *                 a block with a NaN gets the scale of its other elements
 *                 and the NaN element alone the NaN code, an all-NaN block
 *                 the scale 0.
 * The next revision of a library, where it changed a rule: mode |
 * LSC_MX_NEXT (the pinned revisions are TE v2.18 and torchao v0.18.0):
 *   LSC_MX_TE | NEXT   TE main at 4ff5fdfed0c1 (#3262): quantizes as
 *                 LSC_MX_TE; only its dequantize reads codes otherwise
 *                 (lsc_mx_te_exp2f).
 *   LSC_MX_FLOOR, CEIL, EVEN | NEXT   pytorch/ao main at 5d73a0c10b02
 *                 (#4725, torchao/prototype/mx_formats/mx_tensor.py to_mx):
 *                 the same exponents, but a non-finite amax (EVEN: after
 *                 its rounding) gets 0xFF ("No-saturation E8M0 conversion
 *                 maps both NaN and Inf to 0xff"), and the elements are
 *                 multiplied by the E8M0 reciprocal (lsc_mx_e8m0_rcp).
 *   LSC_MX_RCEIL | NEXT   the same commit's _to_mx_rceil: descale = amax *
 *                 float32(1 / max) (TE's), its code by _f32_to_e8m0_rceil's
 *                 bits: biased exponent + 1 where the mantissa is non-zero
 *                 (exponent 0: above 0x400000), no saturation (0xFE rounds
 *                 up to 0xFF), NaN and Inf 0xFF; the elements times the
 *                 E8M0 reciprocal, with no clamp before the cast.
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
 * NaN, 0xFE: 2**-127, else the float32 bits (254 - c) << 23, 2**127 for 0),
 * torchao's NEXT modes by the reciprocal's E8M0 code 254 - c read back
 * (_e8m0_scale_to_reciprocal_fp32: 0xFF NaN, 0xFE 2**-127, 0 2**127).
 * float8 elements narrow with lsc_fp8.h's saturating cast, a NaN's sign
 * kept as torch writes it (TE: without); on x86-64-v4, bfloat16 blocks
 * whose factor is a power of two narrow in 16-bit lanes, to the same codes
 * (lsc_mx_bf16x32).
 * Float32 scale rules (blockwise FP8: one float32 scale per block, the
 * inverse scale stored; lsc_bw_*):
 *   LSC_MX_TE32   NVIDIA/TransformerEngine v2.18 Float8BlockScaling: the
 *                 block amax skips NaN elements (fmaxf from 0), scale =
 *                 compute_scale_from_amax (lsc_fp8_scale.h
 *                 lsc_fp8_scale_te_inf: eps, Inf / 0 / NaN -> 1, an Inf
 *                 quotient the input dtype's largest value, pow2 the
 *                 mantissa masked), elements x * scale cast RN-satfinite
 *                 (a NaN 0x7F); common/recipe/recipe_common.cuh:14-69,
 *                 common/transpose/quantize_transpose_vector_blockwise.cu
 *                 :274-316, quantize_transpose_square_blockwise.cu:123-189.
 *   LSC_MX_AO32   pytorch/ao v0.18.0 blockwise FP8 training (prototype/
 *                 blockwise_fp8_training/kernels.py:1031-1156): the amax NaN
 *                 when an element is, scale = float32(448 / max(amax, eps))
 *                 in float64 (lsc_fp8_scale_torchao), elements x * scale
 *                 clamped and cast keeping a NaN's sign; a NaN scale makes
 *                 every element its NaN (0x7F), an Inf amax the scale 0 and
 *                 each Inf element Inf * 0, the NaN an x86 CPU writes
 *                 (0xFFC00000, so 0xFF): torch's on the CPU, written so on
 *                 any machine.
 *   Both store scale_inv = 1 / scale rounded to float32 (a NaN as the quiet
 *   NaN 0x7FC00000), the value a code is multiplied by to read it back.
 * NVFP4 (ao torchao/prototype/mx_formats/nvfp4_tensor.py nvfp4_quantize):
 * block scale amax / 6 (divided by the per-tensor scale when there is
 * one), clamped to [2**-6, 448] and narrowed to E4M3; elements times
 * 1 / that scale (with a per-tensor scale pts: (1 / pts) / scale), clamped
 * to +-6, narrowed to E2M1.  The per-tensor scale is amax / (448 * 6)
 * (ao nvfp4_tensor.py per_tensor_amax_to_scale).  The amax of a block is
 * NaN when an element is, the positive quiet NaN 0x7FC00000 (torch.amax),
 * except under TE's modes (above).
 * The reference for every result is lscore/_reference_mx.py (mx_*).
 */
#ifndef LSC_MX_H
#define LSC_MX_H

#include "lsc_fp8.h"
#include "lsc_fp8_scale.h"

enum { LSC_MX_FLOOR = 0, LSC_MX_CEIL = 1, LSC_MX_EVEN = 2, LSC_MX_RCEIL = 3, LSC_MX_TE = 4,
       LSC_MX_OCP = 5, LSC_MX_TE32 = 6, LSC_MX_AO32 = 7, LSC_MX_NEXT = 8 };
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

/* Whether mode is TransformerEngine's rule (either revision): its block
 * amax leaves NaN elements out, and its elements narrow without a NaN's sign. */
LSC_FN int lsc_mx_is_te(int mode)
{
    return (mode & ~LSC_MX_NEXT) == LSC_MX_TE;
}

/* Whether mode's block amaxes leave NaN elements out: TE's (fmaxf, __hmax,
 * max.xorsign.abs from 0), at every revision and with float32 scales. */
LSC_FN int lsc_mx_skips_nan_mode(int mode)
{
    return lsc_mx_is_te(mode) || mode == LSC_MX_TE32;
}

/* |x| as the bits a block amax compares (a NaN above every number), or with
 * skip_nan (TE's modes) 0 for a NaN: left out of the largest.  A mask, not a
 * select: with ?: gcc made TE's amax loops scalar (cmov per element, 65% of
 * TE's float32 MXFP8 pass at 1e6). */
LSC_FN lsc_u32 lsc_mx_abs_bits(float x, int skip_nan)
{
    const lsc_u32 a = lsc_f32_bits(x) & 0x7FFFFFFFu;
    /* a signed compare (a < 2**31): one instruction in AVX2's lanes, which
       compare unsigned words in two (a min and an equality) */
    return a & (skip_nan ? -(lsc_u32)((lsc_i32)a <= 0x7F800000) : ~0u);
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
    const lsc_u32 sub = -(lsc_u32)(x < LSC_EXP_LSB_F32);
    const lsc_i32 k = (lsc_i32)(((lsc_u32)-127 & sub) | (((x >> 23) - 127u) & ~sub));
    const lsc_u32 mant = (((x - 0x00400000u) << 1) & sub) | (x & 0x7FFFFFu & ~sub);
    const lsc_i32 a = k < 0 ? -k : k;
    /* floor(log2(a)) of 1 <= a <= 127 (0 for a = 0), from the float
       exponent of a | 1 (a = 128 is Inf or NaN, whose code is set below);
       the spacing above k (k > 0) or below |k| (k < 0): half a power of
       two less there.  Masks, no bool arithmetic: GCC 12 gives a bool sum
       byte lanes and leaves the loop over blocks scalar */
    const lsc_i32 j = (lsc_i32)(lsc_f32_bits((float)((a | 1) & 127)) >> 23) - 127;
    const lsc_u32 half = -(lsc_u32)(k < 0) & -(lsc_u32)(a == (1 << j));
    const lsc_i32 e = 24 - j + (lsc_i32)(half & 1u);
    /* k, or k + 1 where the mantissa is non-zero and k is 0 or the mantissa
       is above the spacing's threshold */
    const lsc_u32 up = -(lsc_u32)(mant != 0u)
                       & (-(lsc_u32)(k == 0) | -(lsc_u32)(mant > (22u >> (e - 18))));
    const lsc_i32 c = k + (lsc_i32)(up & 1u);
    lsc_u32 code = (lsc_u32)((c > 127 ? 127 : c) + 127);
    /* masks, not returns or nested selects, so that a loop over blocks
       vectorises at every level (GCC 12 left the nested selects scalar for
       x86-64-v3): below 2**-127 (the ceiling -127 or less) -> 0, Inf ->
       0xFE, NaN -> 0xFF */
    const lsc_u32 tiny = -(lsc_u32)(x < 0x00400000u), inf = -(lsc_u32)(x >= LSC_EXP_F32);
    const lsc_u32 nan = -(lsc_u32)(d != d);
    code &= ~tiny;
    code = (code & ~inf) | (0xFEu & inf);
    return (code & ~nan) | (0xFFu & nan);
}

/* torchao's _f32_to_e8m0_rceil after #4725 of a descale d >= 0: its biased
 * exponent, + 1 where the mantissa is non-zero (a subnormal: above 0x400000,
 * code 0 being 2**-127), with no saturation (0xFE rounds up to 0xFF); NaN
 * and Inf 0xFF. */
LSC_FN lsc_u32 lsc_mx_ao_e8m0(float d)
{
    const lsc_u32 x = lsc_f32_bits(d), e = (x >> 23) & 0xFFu, m = x & 0x7FFFFFu;
    const lsc_u32 up = e == 0u ? m > 0x400000u : m != 0u;
    return e == 0xFFu ? 0xFFu : e + up;
}

/* The E8M0 scale code of a block whose amax (>= 0 or NaN) is `amax`. */
LSC_FN lsc_u32 lsc_mx_scale(float amax, int elem, int mode)
{
    lsc_u32 x = lsc_f32_bits(amax);
    lsc_i32 e;
    const int base = mode & ~LSC_MX_NEXT;
    if (base == LSC_MX_TE)
        return lsc_mx_te_e8m0(amax * (float)(1.0 / (double)lsc_mx_max(elem)));
    if (mode == LSC_MX_RCEIL)
        return lsc_mx_rceil(amax, elem);
    if (mode == (LSC_MX_RCEIL | LSC_MX_NEXT))
        return lsc_mx_ao_e8m0(amax * (float)(1.0 / (double)lsc_mx_max(elem)));
    const lsc_u32 nan = -(lsc_u32)(amax != amax);
    if (mode == LSC_MX_OCP) {
        if (nan)
            return 0xFFu;
        /* zero and subnormal amaxes: floor(log2) <= -126, so e <= -128 -> -127 */
        if (x >= 0x7F800000u)
            return 0xFFu;
        e = (lsc_i32)(x >> 23) - 127 - lsc_mx_emax(elem);
        return (lsc_u32)((e < -127 ? -127 : e) + 127);
    }
    if (base == LSC_MX_EVEN)
        x = (x + (1u << (23 - lsc_mx_mbits(elem) - 1))) & 0xFF800000u;
    e = (lsc_i32)((x >> 23) & 0xFFu) - 127 - lsc_mx_emax(elem);
    if (base == LSC_MX_CEIL)
        e += (x & 0x7FFFFFu) != 0u;
    e = e < -127 ? -127 : e;
    e = e > 128 ? 128 : e;
    /* torchao after #4725: a non-finite amax (EVEN: once rounded) is the NaN
       scale.  NaN and that rule by masks, not returns or nested selects: the
       loop over blocks then vectorises for x86-64-v3 too (GCC 12) */
    const lsc_u32 ff = nan | ((mode & LSC_MX_NEXT) ? -(lsc_u32)(x >= 0x7F800000u) : 0u);
    return ((lsc_u32)(e + 127) & ~ff) | (0xFFu & ff);
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
    /* a NaN passes, as torch.clamp.  Masks, as lsc_fp8.h's scalars: with
       selects GCC 12 threads the branches into the narrowing that follows
       (lsc_nvfp4_scale) and leaves the loops over blocks scalar on x86-64-v3 */
    const lsc_u32 below = -(lsc_u32)(v < lo), above = -(lsc_u32)(v > hi);
    return lsc_f32_from_bits((lsc_f32_bits(lo) & below) | (lsc_f32_bits(hi) & above)
                             | (lsc_f32_bits(v) & ~(below | above)));
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

/* torchao's _e8m0_scale_to_reciprocal_fp32 after #4725: the E8M0 code
 * 254 - s (mod 256) read back, 2**(127 - s) (2**127 for code 0), 2**-127 for
 * 0xFE; for 0xFF torch's NaN 0x7F800001, which the product with an element
 * quiets: its word 0x7FC00001 here, the one every element of the block gets. */
LSC_FN float lsc_mx_e8m0_rcp(lsc_u32 s)
{
    return s == 0xFFu ? lsc_f32_from_bits(0x7FC00001u)
         : s == 0xFEu ? 0x1p-127f : lsc_f32_from_bits((254u - s) << 23);
}

/* TransformerEngine's MXFP8 dequantize factor of scale code c (ptx::exp2f,
 * common/cast/mxfp8/dequantize_mxfp8.cuh:175-195 at v2.18): in v2.18 the
 * float32 bits c << 23, so code 0 is +0.0 and 0xFF +Inf; after #3262 (next)
 * code 0 is 2**-127 and 0xFF the NaN 0x7FFFFFFF. */
LSC_FN float lsc_mx_te_exp2f(lsc_u32 c, int next)
{
    c &= 0xFFu;
    if (next && c == 0xFFu)
        return lsc_f32_from_bits(0x7FFFFFFFu);
    return next && c == 0u ? 0x1p-127f : lsc_f32_from_bits(c << 23);
}

LSC_FN float lsc_mx_factor(lsc_u32 s, float amax, int elem, int mode)
{
    if (mode == LSC_MX_RCEIL) {
        /* 0xFF: amax / max; 0xFE: 2**-127; 0: 1; else 2**(127 - s).  Masks,
           not nested selects, which GCC 12 leaves scalar for x86-64-v3 */
        const lsc_u32 ff = -(lsc_u32)(s == 0xFFu), fe = -(lsc_u32)(s == 0xFEu);
        const lsc_u32 zero = -(lsc_u32)(s == 0u);
        lsc_u32 v = ((254u - s) << 23) & ~(ff | fe | zero);
        v |= (0x00400000u & fe) | (0x3F800000u & zero);
        v = (v & ~ff) | (lsc_f32_bits(amax / lsc_mx_max(elem)) & ff);
        return lsc_f32_from_bits(v);
    }
    if (lsc_mx_is_te(mode))
        return lsc_mx_te_rcp(s);
    if (mode & LSC_MX_NEXT)
        return lsc_mx_e8m0_rcp(s);
    if (mode == LSC_MX_OCP)
        return s == 0xFFu ? lsc_f32_from_bits(0x7FC00000u) : lsc_f32_from_bits((254u - s) << 23);
    {
        /* d = 2**(s - 127), at least 2**-126 (s = 0 is the only smaller one),
           by a mask: the select left the loop over blocks scalar (GCC 12,
           x86-64-v3) */
        const lsc_u32 zero = -(lsc_u32)(s == 0u);
        return 1.0f / lsc_f32_from_bits(((s << 23) & ~zero) | (0x00800000u & zero));
    }
}

/* The narrowing flags of an element under `mode`: saturating, a NaN's sign
 * kept as torch writes it (TE: without). */
LSC_FN int lsc_mx_flags(int mode)
{
    return LSC_FP8_SAT | (lsc_mx_skips_nan_mode(mode) ? 0 : LSC_FP8_NAN_SIGN);
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

/* The amax of a block of n float32 values under `mode`: lsc_mx_amax, or
 * for TE's modes the largest |x| of the elements that are not NaN (0 for
 * none). */
LSC_FN float lsc_mx_amax_by(const float *x, long n, int mode)
{
    lsc_u32 m = 0u;
    long i;
    if (!lsc_mx_is_te(mode))
        return lsc_mx_amax(x, n);
    for (i = 0; i < n; ++i) {
        lsc_u32 a = lsc_mx_abs_bits(x[i], 1);
        m = a > m ? a : m;
    }
    return lsc_f32_from_bits(m);
}

/* One MX block of n (32) float32 values: its scale code, and its n element
 * codes into q (E2M1: n / 2 bytes, low nibble first). */
LSC_FN lsc_u32 lsc_mx_block(const float *x, long n, int elem, int mode, unsigned char *q)
{
    float amax = lsc_mx_amax_by(x, n, mode);
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


/* ---- float32 scale rules (blockwise FP8) -------------------------------- */

/* Whether `mode` is a float32 scale rule (4-byte scales). */
LSC_FN int lsc_mx_wide(int mode)
{
    return mode == LSC_MX_TE32 || mode == LSC_MX_AO32;
}

/* The largest |x| bits of n float32 values, NaN elements skipped (TE's
 * fmaxf from 0); lsc_mx_amax keeps them (torch.amax). */
LSC_FN float lsc_bw_amax_skip(const float *x, long n)
{
    lsc_u32 m = 0u;
    long i;
    for (i = 0; i < n; ++i) {
        lsc_u32 a = lsc_f32_bits(x[i]) & 0x7FFFFFFFu;
        m = a > m && a <= 0x7F800000u ? a : m;
    }
    return lsc_f32_from_bits(m);
}

/* TE's scale for an Inf quotient, the largest finite value of the input
 * dtype code (TE:transformer_engine/common/common.h:706-716 TypeExtrema). */
LSC_FN float lsc_bw_inf_value(int code)
{
    return code == LSC_CODE_F16 ? 65504.0f
         : code == LSC_CODE_BF16 ? 0x1.FEp127f : 3.40282346638528859812e+38f;
}

/* The scale of a block whose amax is `amax` under float32 rule `mode`:
 * TE's with its float32 eps and inf_value (the input dtype's largest
 * value), torchao's with its float64 eps (no power of two). */
LSC_FN float lsc_bw_scale(float amax, int elem, int mode, int pow2, double eps,
                          float inf_value)
{
    if (mode == LSC_MX_TE32)
        return lsc_fp8_scale_te_inf(amax, lsc_mx_max(elem), pow2, (float)eps, inf_value);
    return lsc_fp8_scale_torchao(amax, (double)lsc_mx_max(elem), 0, eps);
}

/* The stored inverse scale of a scale, as float32 bits: 1 / scale rounded
 * to nearest (0: Inf), a NaN the quiet NaN 0x7FC00000. */
LSC_FN lsc_u32 lsc_bw_inv_bits(float scale)
{
    const float inv = 1.0f / scale;
    return inv != inv ? 0x7FC00000u : lsc_f32_bits(inv);
}

/* One element x times the scale r, narrowed by float32 rule `mode`: a NaN
 * r makes it r (torchao's NaN scale), Inf * 0 is the x86 NaN 0xFFC00000
 * (torchao's Inf block on the CPU); TE's flags drop a NaN's sign. */
LSC_FN lsc_u32 lsc_bw_code(float x, float r, int elem, int mode)
{
    float p = x * r;
    if (r != r)
        p = r;
    else if (p != p && x == x)
        p = lsc_f32_from_bits(0xFFC00000u);
    return lsc_fp8_from_f32(p, elem, lsc_mx_flags(mode));
}

/* One float32-scale block of n float32 values: the stored inverse scale's
 * bits, and the n element codes into q. */
LSC_FN lsc_u32 lsc_bw_block(const float *x, long n, int elem, int mode, int pow2, double eps,
                            float inf_value, unsigned char *q)
{
    const float amax = mode == LSC_MX_TE32 ? lsc_bw_amax_skip(x, n) : lsc_mx_amax(x, n);
    const float r = lsc_bw_scale(amax, elem, mode, pow2, eps, inf_value);
    long i;
    for (i = 0; i < n; ++i)
        q[i] = (unsigned char)lsc_bw_code(x[i], r, elem, mode);
    return lsc_bw_inv_bits(r);
}


/* ---- the CPU block passes ----------------------------------------------- */
#if !defined(__CUDACC__) && !defined(LSC_DEVICE_EMULATION)

/* One fused pass per orientation over a 2-D float32 / float16 / bfloat16
 * view read in place: each block's amax and its codes come from the same
 * read of the input (a group of blocks, or a tile of block rows, stays in
 * L1 between the two steps).  Rows (axis -1): blocks run along a row, a
 * group of up to LSC_MX_GROUP blocks at a time: each block's amax, then the
 * scales and factors of the group (lsc_mx_group_scales), then the group's
 * codes in one loop with the factors spread per element.  Columns (axis 0,
 * TransformerEngine's columnwise): a tile of `block` rows by up to
 * LSC_MX_TILE columns, the column amaxes accumulated row by row (sequential
 * reads along each row), the scales and factors, then the tile read again
 * for the codes; E2M1 codes pack the two rows of a pair into one byte, the
 * first in the low nibble.  Tiles (a weight's square blocks of side t, one
 * scale per t x t tile): a band of t rows cut in chunks of columns, each
 * chunk's tile amaxes accumulated row by row, the scales and factors, then
 * the chunk read again for the codes, row by row; a partial tile at the
 * edges is scaled from the elements it has (as if zero-padded).  Float32
 * scale rules write 4-byte scales (k->swidth), TE's skips NaN elements in
 * the amax, and torchao's blocks whose scale is 0 (an Inf amax) are
 * rewritten out of line by lsc_bw_code.
 * What is compiled when: the kernels over contiguous input are compiled
 * once per x86-64 level (lsc_isa.h), one function per element format and
 * input dtype, its float8 element loop once per narrowing flags: the only
 * things that change the element loop's instructions (lsc_mx_kern.c); the
 * scale rule (the mode) is a run-time value of the small loop across a
 * group's blocks.  NaN-factor blocks are rewritten out of line, and strided
 * input is gathered into a buffer and sent through the contiguous kernels,
 * so every level and stride gives the bits of
 * lsc_mx_block / lsc_nvfp4_block / lsc_bw_block. */

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "lsc_job.h"

/* a block pass's rule: element format (a float8 code or LSC_MX_E2M1), the
 * MX mode, a float32 rule or LSC_MX_NVFP4, NVFP4's per-tensor scale, the
 * block length (a tile's side for the tile pass); a float32 rule's power
 * of two, amax floor and Inf-quotient scale (the input dtype's largest
 * value), and the bytes of a scale (4 for a float32 rule, else 1) */
enum { LSC_MX_NVFP4 = 16 };
typedef struct {
    int elem;
    int mode;
    int has_pts;
    float pts;
    int64_t block;
    int pow2;
    double eps;
    float inf_value;
    int swidth;
} lsc_mx_rule;

#define LSC_MX_CHUNK 1024   /* the largest block; the elements of a rows group at most */
#define LSC_MX_TILE 256     /* columns of a columns tile */
#define LSC_MX_SQ_SPAN 8192   /* the most columns of a chunk of a square-tile band */
#define LSC_MX_SQ_BANDS 8     /* bands from which a chunk is a whole band (lsc_mx_tile_run) */
#define LSC_MX_GROUP 16     /* blocks of a row whose scales are taken together */
#define LSC_MX_GROUP_ELEMS 512   /* ... as long as they hold no more elements than this */
#define LSC_MX_WIDTH(CODE) ((CODE) == LSC_CODE_F32 ? 4 : 2)

/* The narrowing flags of a rule's elements: saturating, a NaN's sign kept
 * as torch writes it (TE: without; NVFP4's E2M1 has no flags). */
static inline int lsc_mx_rule_flags(const lsc_mx_rule *k)
{
    return k->mode == LSC_MX_NVFP4 ? 0 : lsc_mx_flags(k->mode);
}

/* x: contiguous rows of n elements, or a rows x cols view whose rows are rs
 * bytes apart and whose elements are contiguous; the scales s and codes q
 * of the columns pass have rows ld bytes apart. */
typedef void (*lsc_mx_row_fn)(const char *x, int64_t n, const lsc_mx_rule *k, unsigned char *s,
                              unsigned char *q);
typedef void (*lsc_mx_cols_fn)(const char *x, int64_t rows, int64_t cols, int64_t rs,
                               int64_t ld, const lsc_mx_rule *k, unsigned char *s,
                               unsigned char *q);
/* tiles: a band of rows <= t rows of cols columns (rows rs bytes apart,
 * contiguous elements), its ceil(cols / t) scales into s, its codes into q
 * (rows ld bytes apart) */
typedef void (*lsc_mx_tile_fn)(const char *x, int64_t rows, int64_t cols, int64_t rs,
                               int64_t ld, const lsc_mx_rule *k, unsigned char *s,
                               unsigned char *q);

/* One ISA level's passes over contiguous input: [element index][input code]
 * (tiles: float8 elements only). */
typedef struct {
    const char *name;
    lsc_mx_row_fn row[3][LSC_NCODES];
    lsc_mx_cols_fn cols[3][LSC_NCODES];
    lsc_mx_tile_fn tile[2][LSC_NCODES];
} lsc_mx_isa;

static inline int lsc_mx_elem_index(int elem)
{
    return elem == LSC_CODE_E4M3FN ? 0 : elem == LSC_CODE_E5M2 ? 1 : 2;
}

#ifndef LSC_LEVEL   /* the extension's own unit: the levels' tables, and the passes over any view */

/* The levels' tables, one per lsc_isa.h level in its order, each defined by
 * lsc_mx_kern.c compiled for that level. */
#ifdef LSC_X86_DISPATCH
LSC_ISA_TABLE extern const lsc_mx_isa lsc_mx_isa_v2, lsc_mx_isa_v3, lsc_mx_isa_v4;
static const void *const lsc_mx_isas[LSC_NISAS] = {&lsc_mx_isa_v2, &lsc_mx_isa_v3,
                                                   &lsc_mx_isa_v4};
#else
LSC_ISA_TABLE extern const lsc_mx_isa lsc_mx_isa_baseline;
static const void *const lsc_mx_isas[LSC_NISAS] = {&lsc_mx_isa_baseline};
#endif
static lsc_isa_family lsc_mx_family = {lsc_mx_isas};

static inline int lsc_mx_isa_select(const char *name) { return lsc_isa_choose(&lsc_mx_family, name); }

static inline const lsc_mx_isa *lsc_mx_isa_get(void)
{
    return (const lsc_mx_isa *)lsc_isa_table(&lsc_mx_family);
}

/* Elements a strided pass gathers into a contiguous buffer at a time (a
 * multiple of every block length up to LSC_MX_CHUNK). */
#define LSC_MX_GATHER 4096

/* n elements of `width` bytes, `stride` bytes apart, copied contiguous. */
static void lsc_mx_gather(char *dst, const char *src, int64_t n, int64_t stride, int width)
{
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * width, src + i * stride, (size_t)width);
}

/* Rows [r0, r1) of a rows x cols view (strides rs, cs bytes) quantized with
 * blocks along `axis` (-1 or 0; axis 0: r0 and r1 multiples of the block)
 * into the scales s and codes q laid out for the whole view.  Strided input
 * (cs not the element width) is gathered into a buffer, a whole number of
 * blocks (axis 0: `block` rows of a few columns) at a time, and sent
 * through the same contiguous kernels. */
static void lsc_mx_quantize_rows(const char *x, int64_t r0, int64_t r1, int64_t cols,
                                 int64_t rs, int64_t cs, int code, int axis,
                                 const lsc_mx_rule *k, unsigned char *s, unsigned char *q)
{
    const int width = LSC_MX_WIDTH(code), e = lsc_mx_elem_index(k->elem);
    const int e2 = k->elem == LSC_MX_E2M1;
    const int64_t block = k->block, sw = k->swidth;
    const lsc_mx_isa *isa = lsc_mx_isa_get();
    char buf[LSC_MX_GATHER * 4];
    if (r1 <= r0 || cols <= 0)
        return;
    if (axis == 0) {
        const lsc_mx_cols_fn fn = isa->cols[e][code];
        const int64_t wg = LSC_MX_GATHER / block;
        if (cs == width) {
            fn(x + r0 * rs, r1 - r0, cols, rs, cols, k, s + (r0 / block) * cols * sw,
               q + (e2 ? r0 / 2 : r0) * cols);
            return;
        }
        for (int64_t r = r0; r < r1; r += block) {
            for (int64_t c0 = 0; c0 < cols; c0 += wg) {
                const int64_t w = cols - c0 < wg ? cols - c0 : wg;
                for (int64_t i = 0; i < block; i++)
                    lsc_mx_gather(buf + i * w * width, x + (r + i) * rs + c0 * cs, w, cs, width);
                fn(buf, block, w, w * width, cols, k, s + ((r / block) * cols + c0) * sw,
                   q + (e2 ? r / 2 : r) * cols + c0);
            }
        }
        return;
    }
    for (int64_t r = r0, piece = LSC_MX_GATHER / block * block; r < r1; r++) {
        const lsc_mx_row_fn fn = isa->row[e][code];
        const char *xr = x + r * rs;
        unsigned char *sr = s + r * (cols / block) * sw, *qr = q + r * (e2 ? cols / 2 : cols);
        if (cs == width) {
            fn(xr, cols, k, sr, qr);
            continue;
        }
        for (int64_t c0 = 0; c0 < cols; c0 += piece) {
            const int64_t n = cols - c0 < piece ? cols - c0 : piece;
            lsc_mx_gather(buf, xr + c0 * cs, n, cs, width);
            fn(buf, n, k, sr + c0 / block * sw, qr + (e2 ? c0 / 2 : c0));
        }
    }
}

/* ---- one pass as a job of chunks on the package's thread pool ------------
 * The pass is cut in chunks from the work alone (lsc_job.h): groups of
 * whole rows of about LSC_JOB_CHUNK_ELEMS elements, or, for rows longer
 * than that along axis -1, pieces of one row of a whole number of blocks;
 * along axis 0 the lines are bands of `block` rows, never split.  Each
 * chunk writes only its own scales and codes, so the bytes are the same
 * with any number of threads. */
typedef struct {
    const char *x;
    int64_t rows, cols, rs, cs;
    int code, axis;
    const lsc_mx_rule *k;
    unsigned char *s, *q;
    lsc_job_cut cut;   /* of the rows (axis -1) or of the bands (axis 0) */
} lsc_mx_job;

static int lsc_mx_job_chunk(void *ctx, size_t chunk)
{
    const lsc_mx_job *j = (const lsc_mx_job *)ctx;
    const int64_t c = (int64_t)chunk;
    if (j->cut.parts == 1) {
        const int64_t rows = j->axis == 0 ? j->cut.rows * j->k->block : j->cut.rows;
        const int64_t r0 = c * rows, r1 = r0 + rows;
        lsc_mx_quantize_rows(j->x, r0, r1 < j->rows ? r1 : j->rows, j->cols, j->rs, j->cs,
                             j->code, j->axis, j->k, j->s, j->q);
    } else {
        const int64_t r = c / j->cut.parts, c0 = (c % j->cut.parts) * j->cut.piece;
        const int64_t n = j->cols - c0 < j->cut.piece ? j->cols - c0 : j->cut.piece;
        const int64_t qw = j->k->elem == LSC_MX_E2M1 ? j->cols / 2 : j->cols;
        const int64_t sw = j->k->swidth;
        lsc_mx_quantize_rows(j->x + r * j->rs + c0 * j->cs, 0, 1, n, 0, j->cs, j->code, -1,
                             j->k, j->s + (r * (j->cols / j->k->block) + c0 / j->k->block) * sw,
                             j->q + r * qw + (j->k->elem == LSC_MX_E2M1 ? c0 / 2 : c0));
    }
    return 0;
}

/* The pass over a rows x cols view (lsc_mx_quantize_rows's arguments) cut
 * in chunks and run through pool_for on at most `threads` threads (0: by
 * the size, 1: the caller alone). */
static inline void lsc_mx_job_run(const char *x, int64_t rows, int64_t cols, int64_t rs,
                                  int64_t cs, int code, int axis, const lsc_mx_rule *k,
                                  unsigned char *s, unsigned char *q, lsc_for_fn pool_for,
                                  int threads)
{
    lsc_mx_job j = {x, rows, cols, rs, cs, code, axis, k, s, q, {0, 0, 0, 0}};
    if (rows <= 0 || cols <= 0)
        return;
    j.cut = axis == 0 ? lsc_job_cut_lines(rows / k->block, cols * k->block, 0)
                      : lsc_job_cut_lines(rows, cols, k->block);
    pool_for(lsc_mx_job_chunk, &j, j.cut.nchunks, lsc_job_threads(threads, rows * cols));
}

/* ---- square tiles as a job ------------------------------------------------
 * A rows x cols view (rows rs bytes apart, contiguous elements) in tiles of
 * side t = k->block: chunks of one band of t rows (the last one shorter) by
 * `span` columns (a multiple of t), each writing only its own scales (rows
 * of ceil(cols / t)) and codes (rows of cols), so the bytes are the same
 * with any number of threads. */
typedef struct {
    const char *x;
    int64_t rows, cols, rs, span, per_band;
    int code;
    const lsc_mx_rule *k;
    unsigned char *s, *q;
} lsc_mx_tile_job;

static int lsc_mx_tile_chunk(void *ctx, size_t chunk)
{
    const lsc_mx_tile_job *j = (const lsc_mx_tile_job *)ctx;
    const int64_t t = j->k->block, band = (int64_t)chunk / j->per_band;
    const int64_t c0 = ((int64_t)chunk % j->per_band) * j->span, r0 = band * t;
    const int64_t h = j->rows - r0 < t ? j->rows - r0 : t;
    const int64_t w = j->cols - c0 < j->span ? j->cols - c0 : j->span;
    const int64_t sld = (j->cols + t - 1) / t;
    const lsc_mx_tile_fn fn = lsc_mx_isa_get()->tile[lsc_mx_elem_index(j->k->elem)][j->code];
    fn(j->x + r0 * j->rs + c0 * LSC_MX_WIDTH(j->code), h, w, j->rs, j->cols, j->k,
       j->s + (band * sld + c0 / t) * j->k->swidth, j->q + r0 * j->cols + c0);
    return 0;
}

/* The tile pass over a rows x cols view on at most `threads` threads (0: by
 * the size): ceil(rows / t) x ceil(cols / t) scales into s, rows x cols
 * float8 codes into q, both C-contiguous. */
static void lsc_mx_tile_run(const char *x, int64_t rows, int64_t cols, int64_t rs, int code,
                            const lsc_mx_rule *k, unsigned char *s, unsigned char *q,
                            lsc_for_fn pool_for, int threads)
{
    lsc_mx_tile_job j = {x, rows, cols, rs, 0, 0, code, k, s, q};
    const int64_t t = k->block, bands = (rows + t - 1) / t;
    /* whole tiles, at most LSC_MX_SQ_SPAN columns (the tile body's buffers;
       t <= LSC_MX_CHUNK).  With LSC_MX_SQ_BANDS bands or more a chunk is a
       whole band, cut in the fewest equal pieces that fit: the band of a
       contiguous view is one stretch of memory, read twice (the second time
       from L2 or L3), which took 0.6x the time of chunks of 1024 columns at
       1e8 elements, 6400 or 16384 columns, float32 or bfloat16 (AMD EPYC, one
       thread).  Fewer bands (a small input) are cut in chunks of about 4 *
       LSC_JOB_CHUNK_ELEMS elements, which the pool's threads share. */
    const int64_t most = LSC_MX_SQ_SPAN / t * t, want = LSC_JOB_CHUNK_ELEMS * 4 / t / t * t;
    const int64_t pieces = (cols + most - 1) / most, even = (cols + pieces - 1) / pieces;
    if (rows <= 0 || cols <= 0)
        return;
    if (bands >= LSC_MX_SQ_BANDS)
        j.span = (even + t - 1) / t * t;
    else
        j.span = want < t ? t : want > most ? most : want;
    j.per_band = (cols + j.span - 1) / j.span;
    pool_for(lsc_mx_tile_chunk, &j, (size_t)(bands * j.per_band),
             lsc_job_threads(threads, rows * cols));
}

#endif /* LSC_LEVEL */
#endif /* the CPU block passes */

#endif
