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
 *   LSC_MX_OCP    the OCP rule as the spec authors' reference computes it
 *                 (microsoft/microxcaling mx/mx_ops.py _shared_exponents,
 *                 _quantize_mx): floor(log2(amax)) - emax, an all-zero
 *                 block taking float32's smallest normal in the logarithm,
 *                 e < -127 -> -127, e > 127 (an Inf or NaN amax) -> the
 *                 NaN scale 0xFF.  The floor is exact (the exponent of
 *                 amax); microxcaling's torch.log2 rounds to float32 first,
 *                 so there a maximum within a float32 ulp of the logarithm
 *                 below 2**k takes k.
 * Elements: FLOOR, CEIL and EVEN divide by the scale read as float32 bits
 * code << 23, clamped below to 2**-126 (so a tiny block dequantizes, with
 * code 0 read as 2**-127, to half its value), clamp to +-max and narrow;
 * OCP divides by the exact 2**e (the product with 2**-e, the same real
 * number rounded once; code 0 is 2**-127, no clamp) and clamps to +-max,
 * and every element of a NaN-scale block is the narrowing of float32's
 * NaN 0x7FC00000 (microxcaling's whole block dequantizes to NaN);
 * RCEIL multiplies by torchao's reciprocal (0xFF: the NaN descale, 0xFE:
 * 2**-127, 0: 1, else 2**(127 - c)), TE by its exp2f_rcp (0: 1, else the
 * float32 bits (254 - c) << 23).  float8 elements narrow with lsc_fp8.h's
 * saturating cast, a NaN's sign kept as torch writes it (TE: without).
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

#if !defined(__CUDACC_RTC__)
#include <math.h>
#endif

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

/* float32 -> E2M1 code (low nibble): torchao's _f32_to_floatx_unpacked. */
LSC_FN lsc_u32 lsc_e2m1_from_f32(float f)
{
    lsc_u32 x = lsc_f32_bits(f);
    lsc_u32 sign = (x >> 28) & 8u;
    lsc_u32 a = x & 0x7FFFFFFFu;
    float af = lsc_f32_from_bits(a);
    lsc_u32 code;
    if (af >= 6.0f) {
        code = 7u;
    } else if (af < 1.0f) {
        /* adding 2**22 rounds to a multiple of 0.5 (RNE); the steps are the code */
        code = (lsc_f32_bits(af + 0x1p22f) - (149u << 23)) & 0xFFu;
    } else {
        /* NaN lands here too, as in torchao (its comparisons are false) */
        lsc_u32 odd = (a >> 22) & 1u;
        code = ((a - (126u << 23) + 0x1FFFFFu + odd) >> 22) & 0xFFu;
    }
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
    lsc_u32 x = lsc_f32_bits(val);
    lsc_u32 e = (x >> 23) & 0xFFu, m = x & 0x7FFFFFu;
    if (val != val)
        return 0xFFu;
    if (e == 0xFFu)
        return 0xFEu;
    if (val == 0.0f)
        return 0u;
    x >>= 23;  /* the sign, if any, falls off in the byte */
    if (m > 0u && e != 0xFEu && !(e == 0u && m <= 0x400000u))
        ++x;
    return x & 0xFFu;
}

/* The E8M0 scale code of a block whose amax (>= 0 or NaN) is `amax`. */
LSC_FN lsc_u32 lsc_mx_scale(float amax, int elem, int mode)
{
    lsc_u32 x = lsc_f32_bits(amax);
    lsc_i32 e;
    if (mode == LSC_MX_TE)
        return lsc_mx_te_e8m0(amax * (float)(1.0 / (double)lsc_mx_max(elem)));
    if (mode == LSC_MX_RCEIL) {
        float d = amax / lsc_mx_max(elem);
        float l;
        if (d != d)
            return 0xFFu;
        if (d > 3.40282346638528859812e+38f)
            return 0xFEu;
        /* torch's float32 log2: the logarithm rounded to float32 */
        l = d > 0.0f ? (float)log2((double)d) : -1e30f;
        l = ceilf(l);
        l = l < -127.0f ? -127.0f : l > 127.0f ? 127.0f : l;
        return (lsc_u32)((lsc_i32)l + 127);
    }
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

/* One element x (float32) of a block with scale code s and amax `amax`,
 * scaled and narrowed by the rule of `mode`: its float8 or E2M1 code. */
LSC_FN lsc_u32 lsc_mx_elem(float x, lsc_u32 s, float amax, int elem, int mode)
{
    const float top = lsc_mx_max(elem);
    float y;
    if (mode == LSC_MX_RCEIL) {
        float r = s == 0xFFu ? amax / top : s == 0xFEu ? 0x1p-127f : s == 0u
                  ? 1.0f : lsc_f32_from_bits((254u - s) << 23);
        y = lsc_mx_clamp(lsc_mx_mul(x, r), -top, top);
    } else if (mode == LSC_MX_TE) {
        float r = s == 0u ? 1.0f : lsc_f32_from_bits((lsc_u32)(254 - (lsc_i32)s) << 23);
        y = x * r;
    } else if (mode == LSC_MX_OCP) {
        /* s <= 252 when finite (amax < 2**128, emax >= 2), so 2**(127 - s) is normal */
        y = s == 0xFFu ? lsc_f32_from_bits(0x7FC00000u)
                       : lsc_mx_clamp(x * lsc_f32_from_bits((254u - s) << 23), -top, top);
    } else {
        float d = lsc_f32_from_bits(s << 23);
        d = d < 0x1p-126f ? 0x1p-126f : d;
        y = x / d;
        if (elem != LSC_MX_E2M1)
            y = lsc_mx_clamp(y, -top, top);
    }
    if (elem == LSC_MX_E2M1)
        return lsc_e2m1_from_f32(y);
    return lsc_fp8_from_f32(y, elem, LSC_FP8_SAT | (mode == LSC_MX_TE ? 0 : LSC_FP8_NAN_SIGN));
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

/* One NVFP4 block of n (16) float32 values: its E4M3 scale code, and the
 * n / 2 packed E2M1 bytes into q; has_pts: divide by the per-tensor scale pts. */
LSC_FN lsc_u32 lsc_nvfp4_block(const float *x, long n, int has_pts, float pts, unsigned char *q)
{
    const int flags = LSC_FP8_SAT | LSC_FP8_NAN_SIGN;
    float bs = lsc_mx_amax(x, n) / 6.0f;
    float r;
    lsc_u32 s;
    long i;
    if (has_pts)
        bs = bs / pts;
    s = lsc_fp8_from_f32(lsc_mx_clamp(bs, 0x1p-6f, 448.0f), LSC_CODE_E4M3FN, flags);
    r = has_pts ? (1.0f / pts) / lsc_fp8_to_f32(s, LSC_CODE_E4M3FN)
                : 1.0f / lsc_fp8_to_f32(s, LSC_CODE_E4M3FN);
    for (i = 0; i + 1 < n; i += 2) {
        lsc_u32 lo = lsc_e2m1_from_f32(lsc_mx_clamp(lsc_mx_mul(x[i], r), -6.0f, 6.0f));
        lsc_u32 hi = lsc_e2m1_from_f32(lsc_mx_clamp(lsc_mx_mul(x[i + 1], r), -6.0f, 6.0f));
        q[i / 2] = (unsigned char)(lo | (hi << 4));
    }
    return s;
}

#endif
