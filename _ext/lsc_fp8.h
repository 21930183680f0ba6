/* lsc_fp8.h: the one float32 / float16 / bfloat16 <-> float8 conversion
 * (float8_e4m3fn, float8_e5m2), for the C core and the CUDA kernels.
 *
 * Design: a code is the fp8 byte; a format is its dtype code of lsc_codes.h
 * (LSC_CODE_E4M3FN: bias 7, 3 mantissa bits, largest finite 448 = 0x7E, NaN
 * S.1111.111 and no Inf; LSC_CODE_E5M2: bias 15, 2 mantissa bits, largest
 * finite 57344 = 0x7B, Inf 0x7C, NaN 0x7D..0x7F).  Narrowing rounds to
 * nearest even, subnormals included; the flags choose among the rules that
 * exist for what does not fit:
 *   LSC_FP8_SAT       overflow and +-Inf give +-the largest finite code, as
 *                     TransformerEngine's casts do for both formats (CUDA's
 *                     __NV_SATFINITE) and torch >= 2.12's e4m3fn cast does;
 *                     without it e5m2 overflows to +-Inf (torch's plain
 *                     e5m2 cast, ml_dtypes) and e4m3fn to +-NaN (ml_dtypes)
 *   LSC_FP8_NAN_SIGN  a NaN becomes 0x7F with its sign kept (0xFF when
 *                     negative), as torch's casts write it; without it
 *                     always 0x7F, TransformerEngine's word
 *   LSC_FP8_AMAX_NAN  (the casts that also return the input's amax) a NaN
 *                     input makes the amax NaN, as torch.max does; without
 *                     it NaN elements do not enter the amax, as the fmaxf
 *                     reduction of TransformerEngine's kernels leaves it
 * A float16 or bfloat16 input widens to float32 exactly first, so every
 * input goes through the one float32 rule.  The scaled cast multiplies in
 * float32 and rounds, then narrows: q = fp8(float32(x) * scale), the order
 * and the two roundings of TransformerEngine's and torchao's quantize.
 * Widening is exact; a NaN code widens to torch's float32 word (e4m3fn:
 * 0x7FF00000 with the sign; e5m2: the float16 word code << 8, quieted).
 *
 * The scalar functions are written as masks (no branch, no ?: on values)
 * so that the CPU loops calling them vectorise at every ISA level; the CPU
 * kernels below are compiled once per x86-64 level (the levels of
 * lsc_scan.h, picked at load time in the same way), and a strided run
 * calls the very same scalar function element by element, so every path
 * gives the same bits.  On the GPU (fp8.cu) sm_89 and newer narrow with
 * cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32, older devices with the scalar
 * function; see lsc_dev_fp8x2 for how the two agree.
 * The reference for every result is lscore/_reference_fp8.py.
 */
#ifndef LSC_FP8_H
#define LSC_FP8_H

#include "lsc_codes.h"
#include "lsc_half.h"

enum { LSC_FP8_SAT = 1, LSC_FP8_NAN_SIGN = 2, LSC_FP8_AMAX_NAN = 4 };

/* float32 -> fp8 code of format fmt, by the rules of `flags`. */
LSC_FN lsc_u32 lsc_fp8_from_f32(float f, int fmt, int flags)
{
    const int e4 = fmt == LSC_CODE_E4M3FN;
    const lsc_u32 shift = e4 ? 20u : 21u;                   /* 23 - mantissa bits */
    const lsc_u32 rebias = (e4 ? 127u - 7u : 127u - 15u) << 23;
    const lsc_i32 minnorm = e4 ? 0x3C800000 : 0x38800000;   /* 2**-6, 2**-14 */
    const float subgrid = e4 ? 0x1p14f : 0x1p7f;            /* ulp: the smallest subnormal */
    const lsc_u32 limit = (flags & LSC_FP8_SAT) ? (e4 ? 0x7Eu : 0x7Bu) : (e4 ? 0x7Fu : 0x7Cu);
    const lsc_u32 drop = (flags & LSC_FP8_NAN_SIGN) ? 0u : ~0u;
    lsc_u32 x = lsc_f32_bits(f);
    lsc_u32 sign = (x >> 24) & 0x80u;
    lsc_u32 a = x & 0x7FFFFFFFu;
    lsc_i32 ai = (lsc_i32)a;
    /* normal range: rebias the exponent, round the dropped bits (an
       overflowing value rounds past the limit, which caps it; Inf too) */
    lsc_u32 r = a - rebias;
    lsc_u32 normal = (r + ((1u << (shift - 1u)) - 1u) + ((r >> shift) & 1u)) >> shift;
    /* subnormal range: one float add onto a power of two whose ulp is the
       smallest subnormal rounds |f| to a multiple of it (RNE); the count of
       steps, the low bits of the sum, is the code (the smallest normal's
       count included) */
    lsc_u32 sub = lsc_f32_bits(lsc_f32_from_bits(a) + subgrid) - lsc_f32_bits(subgrid);
    lsc_u32 is_nan = -(lsc_u32)(ai > 0x7F800000);
    lsc_u32 is_normal = -(lsc_u32)(ai >= minnorm);
    lsc_u32 capped = normal < limit ? normal : limit;
    lsc_u32 mag = (capped & is_normal) | (sub & ~is_normal);
    /* a NaN is in the normal range and caps at the limit (0x7E, 0x7B, 0x7F
       or 0x7C), all of whose bits 0x7F sets */
    return mag | (0x7Fu & is_nan) | (sign & ~(is_nan & drop));
}

/* lsc_fp8_from_f32(f, fmt, flags), the rounding done by one float32
 * addition: with E the exponent of |f| clamped to [emin, 16] (emin the
 * format's smallest normal exponent, -6 or -14) and M its mantissa bits,
 * |f| + 2**(E + 23 - M) rounds |f| to a multiple of 2**(E - M) (to nearest
 * even, subnormal codes included), and the sum's bits less the addend's are
 * that multiple: the code's significand, to which (E - emin) << M adds the
 * exponent (a carry from rounding up included).  A value of exponent 16 or
 * more, Inf and NaN give a sum past every finite code, which the cap takes
 * to the limit; a NaN is then replaced.  The same code for every float32
 * bit pattern and both formats (tests/kernels/test_fp8_narrow.py); 17
 * vector operations for 16 elements with the product, where
 * lsc_fp8_from_f32's rounding in integer lanes takes 20 (the MX and
 * blockwise element loops, lsc_mx_kern.c). */
LSC_FN lsc_u32 lsc_fp8_narrow(float f, int fmt, int flags)
{
    const int e4 = fmt == LSC_CODE_E4M3FN;
    const lsc_u32 mb = e4 ? 3u : 2u;
    const lsc_u32 lo = (e4 ? 127u - 6u : 127u - 14u) << 23, hi = (127u + 16u) << 23;
    const lsc_u32 limit = (flags & LSC_FP8_SAT) ? (e4 ? 0x7Eu : 0x7Bu) : (e4 ? 0x7Fu : 0x7Cu);
    const lsc_u32 drop = (flags & LSC_FP8_NAN_SIGN) ? 0u : ~0u;
    const lsc_u32 x = lsc_f32_bits(f), sign = (x >> 24) & 0x80u, a = x & 0x7FFFFFFFu;
    lsc_u32 e = x & 0x7F800000u;
    e = e < lo ? lo : e;
    e = e > hi ? hi : e;
    const lsc_u32 add = e + ((23u - mb) << 23);
    const lsc_u32 sum = lsc_f32_bits(lsc_f32_from_bits(a) + lsc_f32_from_bits(add));
    const lsc_u32 code = sum - add + ((e - lo) >> (23u - mb));
    const lsc_u32 mag = code < limit ? code : limit;
    const lsc_u32 is_nan = -(lsc_u32)((lsc_i32)a > 0x7F800000);
    /* the NaN's word by masks: as a select, GCC 12 if-converts the loop for
       x86-64-v4 (mask registers) but not for -v3, whose loops it then leaves
       scalar (MXFP8 float32 at 1e6 took 2.0 ms, vectorised 0.39 ms) */
    return (mag & ~is_nan) | (0x7Fu & is_nan) | (sign & ~(is_nan & drop));
}

/* fp8 code of format fmt -> float32, exact (NaN: torch's word, see above). */
LSC_FN float lsc_fp8_to_f32(lsc_u32 c, int fmt)
{
    const int e4 = fmt == LSC_CODE_E4M3FN;
    const lsc_u32 shift = e4 ? 20u : 21u;
    const lsc_u32 rebias = (e4 ? 127u - 7u : 127u - 15u) << 23;
    const lsc_i32 minnorm = e4 ? 0x08 : 0x04;
    const float fromsub = e4 ? 0x1p-9f : 0x1p-16f;
    lsc_u32 sign = (c & 0x80u) << 24;
    lsc_i32 m = (lsc_i32)(c & 0x7Fu);
    lsc_u32 normal = ((lsc_u32)m << shift) + rebias;
    /* e4m3fn: only 0x7F is special (NaN); e5m2: 0x7C Inf, above NaN */
    lsc_u32 is_special = -(lsc_u32)(e4 ? m == 0x7F : m >= 0x7C);
    lsc_u32 special = e4 ? normal | 0x7F800000u
                         : 0x7F800000u | (((lsc_u32)m & 3u) << 21) | ((lsc_u32)(m > 0x7C) << 22);
    lsc_u32 sub = lsc_f32_bits((float)m * fromsub);
    lsc_u32 is_normal = -(lsc_u32)(m >= minnorm);
    return lsc_f32_from_bits(sign | (special & is_special) | (normal & is_normal & ~is_special)
                             | (sub & ~is_normal));
}

/* |f| as bits for an amax: a NaN counts as 0 unless flags has
 * LSC_FP8_AMAX_NAN (then it sorts above Inf, and lsc_fp8_amax makes it NaN). */
LSC_FN lsc_u32 lsc_fp8_amax_bits(float f, int flags)
{
    lsc_u32 a = lsc_f32_bits(f) & 0x7FFFFFFFu;
    lsc_u32 keep = (flags & LSC_FP8_AMAX_NAN) ? ~0u : -(lsc_u32)((lsc_i32)a <= 0x7F800000);
    return a & keep;
}

/* The amax whose lsc_fp8_amax_bits maximum is m. */
LSC_FN float lsc_fp8_amax(lsc_u32 m)
{
    return lsc_f32_from_bits(m > 0x7F800000u ? 0x7FC00000u : m);
}

/* ---- the device's conversion ----------------------------------------------
 *
 * sm_89 and newer narrow two floats in one instruction,
 * cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 (d[15:8] from a, d[7:0] from b).  The
 * PTX ISA (the cvt instruction, "Saturation modifiers": .satfinite) defines
 * it for these destination formats as: a NaN input gives "NaN in the
 * specified destination format" (which word is left open), and an input
 * whose absolute value is greater than MAX_NORM gives "sign-preserved
 * MAX_NORM" (+-Inf included); everything else rounds to nearest even (.rn).
 * Finite results are then the scalar rule with LSC_FP8_SAT (a value in
 * (MAX_NORM, MAX_NORM + half an ulp] rounds down to MAX_NORM either way).
 * lsc_fp8_fix makes the rest the rule of `flags`: a NaN input becomes the
 * flags' NaN word whatever the instruction wrote, and without LSC_FP8_SAT an
 * input that rounds past the largest finite value becomes +-Inf (e5m2) or
 * +-NaN (e4m3fn).  Older devices run the scalar rule itself.  The host
 * harness (LSC_DEVICE_EMULATION) runs the instruction as documented, with a
 * NaN word of its own (0x7F, e5m2 0x7E), through the same fix. */

/* The rule of `flags` for value f, from d, the satfinite conversion of f. */
LSC_FN lsc_u32 lsc_fp8_fix(lsc_u32 d, float f, int fmt, int flags)
{
    const int e4 = fmt == LSC_CODE_E4M3FN;
    lsc_u32 x = lsc_f32_bits(f), a = x & 0x7FFFFFFFu, sign = (x >> 24) & 0x80u;
    /* e4m3fn rounds past 448 above 464; e5m2 from 61440 on (a tie, to the even code) */
    lsc_u32 past = e4 ? (a > 0x43E80000u) : (a >= 0x47700000u);
    if (a > 0x7F800000u)
        return 0x7Fu | ((flags & LSC_FP8_NAN_SIGN) ? sign : 0u);
    if (!(flags & LSC_FP8_SAT) && past)
        return (e4 ? 0x7Fu : 0x7Cu) | sign;
    return d & 0xFFu;
}

#if defined(__CUDA_ARCH__) || defined(LSC_DEVICE_EMULATION)
/* Two values' codes, a's in bits 15:8 and b's in 7:0: the instruction where
 * the device has it and hw is set, else the scalar rule. */
static __device__ __forceinline__ lsc_u32 lsc_dev_fp8x2(float a, float b, int fmt, int flags,
                                                        int hw)
{
    if (hw) {
        lsc_u32 d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        unsigned short h;
        if (fmt == LSC_CODE_E4M3FN)
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(a), "f"(b));
        else
            asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(h) : "f"(a), "f"(b));
        d = h;
#elif defined(LSC_DEVICE_EMULATION)
        const lsc_u32 nan = fmt == LSC_CODE_E4M3FN ? 0x7Fu : 0x7Eu;
        const lsc_u32 da = a != a ? nan : lsc_fp8_from_f32(a, fmt, LSC_FP8_SAT);
        const lsc_u32 db = b != b ? nan : lsc_fp8_from_f32(b, fmt, LSC_FP8_SAT);
        d = (da << 8) | db;
#else
        d = (lsc_fp8_from_f32(a, fmt, LSC_FP8_SAT) << 8) | lsc_fp8_from_f32(b, fmt, LSC_FP8_SAT);
#endif
        return (lsc_fp8_fix(d >> 8, a, fmt, flags) << 8) | lsc_fp8_fix(d & 0xFFu, b, fmt, flags);
    }
    return (lsc_fp8_from_f32(a, fmt, flags) << 8) | lsc_fp8_from_f32(b, fmt, flags);
}
#endif

/* ---- the CPU kernels ----------------------------------------------------- */
#if !defined(__CUDACC__) && !defined(LSC_DEVICE_EMULATION)

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lsc_isa.h"
#include "lsc_job.h"

typedef int64_t lsc_fp8_n;

#define LSC_FP8_INL static inline __attribute__((always_inline))

/* Element i of a float32 / float16 / bfloat16 run whose elements are
 * `stride` bytes apart, widened to float32. */
LSC_FP8_INL float lsc_fp8_load(const char *x, lsc_fp8_n i, lsc_fp8_n stride, int code)
{
    if (code == LSC_CODE_F32) {
        float f;
        memcpy(&f, x + i * stride, 4);
        return f;
    } else {
        uint16_t h;
        memcpy(&h, x + i * stride, 2);
        return code == LSC_CODE_F16 ? lsc_f16_to_f32(h) : lsc_bf16_to_f32(h);
    }
}

#ifndef LSC_LEVEL   /* a unit of one ISA level (lsc_mx_kern.c) takes the scalars and the load */

/* The scaled cast of a run: q[i] = fp8(float32(x[i]) * scale); returns the
 * largest lsc_fp8_amax_bits of the inputs.  Inlined into each ISA level's
 * copy (and the strided loop), with code and fmt constants there.  Codes
 * are made as 32-bit words into a buffer of LSC_FP8_CHUNK on the stack and
 * narrowed to bytes by a second loop: in one loop the byte stores made gcc
 * carry four vectors of 32-bit lanes per step, more than the registers hold. */
#define LSC_FP8_CHUNK 512
LSC_FP8_INL uint32_t lsc_fp8_cast_body(const char *x, lsc_fp8_n n, lsc_fp8_n stride, int code,
                                       unsigned char *q, float scale, int fmt, int flags)
{
    uint32_t m = 0;
    uint32_t words[LSC_FP8_CHUNK];
    float wide[LSC_FP8_CHUNK];
    for (lsc_fp8_n at = 0; at < n; at += LSC_FP8_CHUNK) {
        const char *xs = x + at * stride;
        int k = n - at < LSC_FP8_CHUNK ? (int)(n - at) : LSC_FP8_CHUNK;
        if (code != LSC_CODE_F32) {
            /* the amax taken as the half words widen: in the cast loop it made
               gcc spill a vector there (bfloat16 at 1e6: 1.2x the time) */
            for (int i = 0; i < k; i++) {
                float f = lsc_fp8_load(xs, i, stride, code);
                uint32_t a = lsc_fp8_amax_bits(f, flags);
                m = a > m ? a : m;
                wide[i] = f;
            }
            for (int i = 0; i < k; i++)
                words[i] = lsc_fp8_narrow(wide[i] * scale, fmt, flags);
        } else {
            for (int i = 0; i < k; i++) {
                float f = lsc_fp8_load(xs, i, stride, code);
                uint32_t a = lsc_fp8_amax_bits(f, flags);
                m = a > m ? a : m;
                words[i] = lsc_fp8_narrow(f * scale, fmt, flags);
            }
        }
        for (int i = 0; i < k; i++)
            q[at + i] = (unsigned char)words[i];
    }
    return m;
}

/* The amax pass alone (current scaling's first pass): the largest
 * lsc_fp8_amax_bits of a run.  A plain max reduction, which vectorises
 * without the cast's buffer. */
LSC_FP8_INL uint32_t lsc_fp8_amax_body(const char *x, lsc_fp8_n n, lsc_fp8_n stride, int code,
                                       int flags)
{
    uint32_t m = 0;
    for (lsc_fp8_n i = 0; i < n; i++) {
        uint32_t a = lsc_fp8_amax_bits(lsc_fp8_load(x, i, stride, code), flags);
        m = a > m ? a : m;
    }
    return m;
}

/* Widening of a run of codes into float32 / float16 / bfloat16 words,
 * divided by `scale` in float32 first (dequantize: torchao's
 * `data.to(float32) / scale`; scale 1 leaves every word as it is, NaN
 * words included, since they are quiet). */
LSC_FP8_INL void lsc_fp8_decode_body(const unsigned char *q, lsc_fp8_n n, lsc_fp8_n stride,
                                     int fmt, char *out, int code, float scale)
{
    for (lsc_fp8_n i = 0; i < n; i++) {
        float f = lsc_fp8_to_f32(q[i * stride], fmt) / scale;
        if (code == LSC_CODE_F32) {
            memcpy(out + 4 * i, &f, 4);
        } else {
            uint16_t h = code == LSC_CODE_F16 ? lsc_f32_to_f16(f) : lsc_f32_to_bf16(f);
            memcpy(out + 2 * i, &h, 2);
        }
    }
}

typedef uint32_t (*lsc_fp8_cast_fn)(const char *x, lsc_fp8_n n, unsigned char *q, float scale,
                                    int flags);
typedef void (*lsc_fp8_decode_fn)(const unsigned char *q, lsc_fp8_n n, char *out, float scale);
typedef uint32_t (*lsc_fp8_amax_fn)(const char *x, lsc_fp8_n n, int flags);

/* One ISA level's contiguous kernels: [fmt - LSC_CODE_E4M3FN][input code]. */
typedef struct {
    const char *name;
    lsc_fp8_cast_fn cast[2][LSC_NCODES];
    lsc_fp8_decode_fn decode[2][LSC_NCODES];
    lsc_fp8_amax_fn amax[LSC_NCODES];
} lsc_fp8_isa;

/* The kernels of one level: each a copy of the bodies with its code and
 * format constant, compiled for the target around it. */
#define LSC_FP8_CAST_FN(SFX, NAME, CODE, FMT)                                           \
    static uint32_t lsc_fp8_##NAME##_##SFX(const char *x, lsc_fp8_n n, unsigned char *q, \
                                           float scale, int flags)                      \
    {                                                                                   \
        return LSC_FP8_CAST_IMPL(x, n, (CODE) == LSC_CODE_F32 ? 4 : 2, (CODE), q, scale, \
                                 (FMT), flags);                                         \
    }
/* the contiguous cast's body: lsc_fp8_cast_body, or a level's own (x86-64-v4) */
#define LSC_FP8_CAST_IMPL lsc_fp8_cast_body
#define LSC_FP8_DECODE_FN(SFX, NAME, CODE, FMT)                                              \
    static void lsc_fp8_##NAME##_##SFX(const unsigned char *q, lsc_fp8_n n, char *out,      \
                                       float scale)                                          \
    {                                                                                        \
        lsc_fp8_decode_body(q, n, 1, (FMT), out, (CODE), scale);                             \
    }
#define LSC_FP8_AMAX_FN(SFX, NAME, CODE)                                                     \
    static uint32_t lsc_fp8_##NAME##_##SFX(const char *x, lsc_fp8_n n, int flags)           \
    {                                                                                        \
        return lsc_fp8_amax_body(x, n, (CODE) == LSC_CODE_F32 ? 4 : 2, (CODE), flags);      \
    }
#define LSC_FP8_LEVEL(SFX)                                                              \
    LSC_FP8_CAST_FN(SFX, e4_f32, LSC_CODE_F32, LSC_CODE_E4M3FN)                         \
    LSC_FP8_CAST_FN(SFX, e4_f16, LSC_CODE_F16, LSC_CODE_E4M3FN)                         \
    LSC_FP8_CAST_FN(SFX, e4_bf16, LSC_CODE_BF16, LSC_CODE_E4M3FN)                       \
    LSC_FP8_CAST_FN(SFX, e5_f32, LSC_CODE_F32, LSC_CODE_E5M2)                           \
    LSC_FP8_CAST_FN(SFX, e5_f16, LSC_CODE_F16, LSC_CODE_E5M2)                           \
    LSC_FP8_CAST_FN(SFX, e5_bf16, LSC_CODE_BF16, LSC_CODE_E5M2)                         \
    LSC_FP8_DECODE_FN(SFX, de4_f32, LSC_CODE_F32, LSC_CODE_E4M3FN)                      \
    LSC_FP8_DECODE_FN(SFX, de4_f16, LSC_CODE_F16, LSC_CODE_E4M3FN)                      \
    LSC_FP8_DECODE_FN(SFX, de4_bf16, LSC_CODE_BF16, LSC_CODE_E4M3FN)                    \
    LSC_FP8_DECODE_FN(SFX, de5_f32, LSC_CODE_F32, LSC_CODE_E5M2)                        \
    LSC_FP8_DECODE_FN(SFX, de5_f16, LSC_CODE_F16, LSC_CODE_E5M2)                        \
    LSC_FP8_DECODE_FN(SFX, de5_bf16, LSC_CODE_BF16, LSC_CODE_E5M2)                      \
    LSC_FP8_AMAX_FN(SFX, am_f32, LSC_CODE_F32)                                          \
    LSC_FP8_AMAX_FN(SFX, am_f16, LSC_CODE_F16)                                          \
    LSC_FP8_AMAX_FN(SFX, am_bf16, LSC_CODE_BF16)                                        \
    static const lsc_fp8_isa lsc_fp8_isa_##SFX = {                                      \
        #SFX,                                                                           \
        {{0, lsc_fp8_e4_f16_##SFX, lsc_fp8_e4_bf16_##SFX, lsc_fp8_e4_f32_##SFX, 0, 0, 0}, \
         {0, lsc_fp8_e5_f16_##SFX, lsc_fp8_e5_bf16_##SFX, lsc_fp8_e5_f32_##SFX, 0, 0, 0}}, \
        {{0, lsc_fp8_de4_f16_##SFX, lsc_fp8_de4_bf16_##SFX, lsc_fp8_de4_f32_##SFX, 0, 0, 0}, \
         {0, lsc_fp8_de5_f16_##SFX, lsc_fp8_de5_bf16_##SFX, lsc_fp8_de5_f32_##SFX, 0, 0, 0}}, \
        {0, lsc_fp8_am_f16_##SFX, lsc_fp8_am_bf16_##SFX, lsc_fp8_am_f32_##SFX, 0, 0, 0},   \
    };

/* The levels and their CPU checks are lsc_isa.h's: the x86-64-v2 baseline
 * the extension is built for, and -v3 / -v4 copies under `#pragma GCC
 * target`. */
#ifdef LSC_X86_DISPATCH
LSC_FP8_LEVEL(v2)
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
LSC_FP8_LEVEL(v3)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4", "prefer-vector-width=512")
#include <immintrin.h>
/* ---- x86-64-v4: the scaled cast of float32 and bfloat16 in 16-bit lanes ---
 * lsc_fp8_cast_body narrows in 32-bit lanes: about 26 vector operations per
 * 16 elements, which bound the cast at mid sizes (1e6 elements fit in
 * cache).  Here each product p = float32(x) * scale (the same float32
 * multiply) is first rounded to odd at 16 bits: its top 16 bits (a
 * bfloat16 word) with the lowest set when any of the 16 dropped bits is.
 * Rounding to odd keeps what rounding to nearest even at a coarser place
 * needs (the sticky bit below it: Boldo and Melquiond, "When double
 * rounding is odd", 2005) as long as that place is at least two bits
 * above, and both formats keep at most 3 of the word's 7 mantissa bits, so
 * the codes narrowed from the words are lsc_fp8_from_f32's of p exactly:
 * 32 lanes a vector, about 19 operations per 16 elements.  A NaN stays a
 * NaN (its word is above 0x7F80: the sticky bit sets a mantissa bit), Inf
 * stays Inf, and a finite p never reaches 0x7F80 (its top bits are
 * truncated).  The word's narrowing is lsc_fp8_from_f32's rule on the same
 * bits (lsc_mx_kern.c's lsc_mx_bf16x32 with no exponent step): rebias,
 * round to nearest even, cap at the flags' limit; below the smallest
 * normal the significand (w & 0x7F) | 0x80 of exponent E shifted left by E
 * - lo (lo 117 for e4m3fn, 110 for e5m2; a count that wraps past 15 gives
 * 0, as every value under half the smallest subnormal rounds to) and
 * rounded to nearest even at bit 8.  Equal to the 32-bit lanes for every
 * float32 (scale 1) in both formats, with all the flags and with none (and
 * tests/kernels/test_fp8_casts.py checks every level). */
static inline __attribute__((always_inline)) __m256i lsc_fp8_word_codes(__m512i w, int fmt,
                                                                         int flags)
{
    const int e4 = fmt == LSC_CODE_E4M3FN, sh = e4 ? 4 : 5;
    const short limit = (flags & LSC_FP8_SAT) ? (e4 ? 0x7E : 0x7B) : (e4 ? 0x7F : 0x7C);
    const __m512i one = _mm512_set1_epi16(1);
    const __m512i a = _mm512_and_si512(w, _mm512_set1_epi16(0x7FFF));
    __m512i sign = _mm512_and_si512(_mm512_srli_epi16(w, 8), _mm512_set1_epi16(0x80));
    /* normal: rebias, round the dropped mantissa bits to nearest even, cap */
    const __m512i r = _mm512_sub_epi16(a, _mm512_set1_epi16(e4 ? 120 << 7 : 112 << 7));
    const __m512i odd = _mm512_and_si512(_mm512_srai_epi16(r, sh), one);
    const __m512i half = _mm512_set1_epi16((short)((1 << (sh - 1)) - 1));
    const __m512i normal = _mm512_srai_epi16(_mm512_add_epi16(_mm512_add_epi16(r, half), odd), sh);
    const __m512i capped = _mm512_min_epi16(normal, _mm512_set1_epi16(limit));
    /* subnormal: the significand shifted to units of 2**-8 of the smallest
       subnormal, rounded to nearest even at bit 8 */
    const __m512i cnt = _mm512_sub_epi16(_mm512_srli_epi16(a, 7),
                                         _mm512_set1_epi16(e4 ? 117 : 110));
    const __m512i v = _mm512_ternarylogic_epi32(a, _mm512_set1_epi16(0x7F), _mm512_set1_epi16(0x80),
                                                0xEA);   /* (a & 0x7F) | 0x80 */
    const __m512i p = _mm512_sllv_epi16(v, cnt);
    const __m512i podd = _mm512_and_si512(_mm512_srli_epi16(p, 8), one);
    const __m512i sub = _mm512_srli_epi16(
        _mm512_add_epi16(_mm512_add_epi16(p, _mm512_set1_epi16(127)), podd), 8);
    const __mmask32 is_normal = _mm512_cmpge_epi16_mask(a, _mm512_set1_epi16(e4 ? 0x3C80 : 0x3880));
    const __mmask32 is_nan = _mm512_cmpgt_epu16_mask(a, _mm512_set1_epi16(0x7F80));
    __m512i mag = _mm512_mask_blend_epi16(is_normal, sub, capped);
    mag = _mm512_mask_mov_epi16(mag, is_nan, _mm512_set1_epi16(0x7F));
    if (!(flags & LSC_FP8_NAN_SIGN))
        sign = _mm512_maskz_mov_epi16(~is_nan, sign);
    return _mm512_cvtepi16_epi8(_mm512_or_si512(mag, sign));
}

/* 16 products of float32 f and the scale s, each rounded to odd at 16 bits, in the low
 * halves of 32-bit lanes. */
static inline __attribute__((always_inline)) __m512i lsc_fp8_odd16(__m512 f, __m512 s)
{
    const __m512i p = _mm512_castps_si512(_mm512_mul_ps(f, s));
    const __m512i t = _mm512_srli_epi32(p, 16);
    return _mm512_mask_or_epi32(t, _mm512_test_epi32_mask(p, _mm512_set1_epi32(0xFFFF)), t,
                                _mm512_set1_epi32(1));
}

/* lsc_fp8_amax_bits of 16 float32 lanes, max-combined into acc. */
static inline __attribute__((always_inline)) __m512i lsc_fp8_amax16(__m512i acc, __m512 f,
                                                                    int flags)
{
    __m512i a = _mm512_and_si512(_mm512_castps_si512(f), _mm512_set1_epi32(0x7FFFFFFF));
    if (!(flags & LSC_FP8_AMAX_NAN))
        a = _mm512_maskz_mov_epi32(_mm512_cmple_epu32_mask(a, _mm512_set1_epi32(0x7F800000)), a);
    return _mm512_max_epu32(acc, a);
}

/* lsc_fp8_cast_body of a contiguous float32 or bfloat16 run (float16: the body itself), 32
 * elements a step in 16-bit lanes, the rest by the body. */
static inline __attribute__((always_inline)) uint32_t
lsc_fp8_cast_v4(const char *x, lsc_fp8_n n, lsc_fp8_n stride, int code, unsigned char *q,
                float scale, int fmt, int flags)
{
    if (code == LSC_CODE_F16)
        return lsc_fp8_cast_body(x, n, stride, code, q, scale, fmt, flags);
    const __m512 s = _mm512_set1_ps(scale);
    const __m512i lows = _mm512_setr_epi32(0x00020000, 0x00060004, 0x000A0008, 0x000E000C,
                                           0x00120010, 0x00160014, 0x001A0018, 0x001E001C,
                                           0x00220020, 0x00260024, 0x002A0028, 0x002E002C,
                                           0x00320030, 0x00360034, 0x003A0038, 0x003E003C);
    __m512i acc = _mm512_setzero_si512(), acc16 = _mm512_setzero_si512();
    lsc_fp8_n i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 f0, f1;
        if (code == LSC_CODE_F32) {
            f0 = _mm512_loadu_ps(x + 4 * i);
            f1 = _mm512_loadu_ps(x + 4 * i + 64);
            acc = lsc_fp8_amax16(lsc_fp8_amax16(acc, f0, flags), f1, flags);
        } else {
            /* a bfloat16's amax bits are its word's << 16: the amax in 16-bit lanes */
            const __m512i h = _mm512_loadu_si512(x + 2 * i);
            __m512i a = _mm512_and_si512(h, _mm512_set1_epi16(0x7FFF));
            if (!(flags & LSC_FP8_AMAX_NAN))
                a = _mm512_maskz_mov_epi16(_mm512_cmple_epu16_mask(a, _mm512_set1_epi16(0x7F80)),
                                           a);
            acc16 = _mm512_max_epu16(acc16, a);
            f0 = _mm512_castsi512_ps(
                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
            f1 = _mm512_castsi512_ps(
                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
        }
        /* the low words of both: the 32 rounded products in order */
        const __m512i w = _mm512_permutex2var_epi16(lsc_fp8_odd16(f0, s), lows,
                                                    lsc_fp8_odd16(f1, s));
        _mm256_storeu_si256((__m256i *)(q + i), lsc_fp8_word_codes(w, fmt, flags));
    }
    /* the 16-bit lanes' largest word, as amax bits */
    acc = _mm512_max_epu32(acc, _mm512_slli_epi32(_mm512_max_epu32(
                                    _mm512_and_si512(acc16, _mm512_set1_epi32(0xFFFF)),
                                    _mm512_srli_epi32(acc16, 16)), 16));
    uint32_t m = _mm512_reduce_max_epu32(acc);
    if (i < n) {
        const uint32_t t = lsc_fp8_cast_body(x + i * stride, n - i, stride, code, q + i, scale,
                                             fmt, flags);
        m = t > m ? t : m;
    }
    return m;
}
#undef LSC_FP8_CAST_IMPL
#define LSC_FP8_CAST_IMPL lsc_fp8_cast_v4
LSC_FP8_LEVEL(v4)
#undef LSC_FP8_CAST_IMPL
#define LSC_FP8_CAST_IMPL lsc_fp8_cast_body
#pragma GCC pop_options
static const void *const lsc_fp8_isas[LSC_NISAS] = {&lsc_fp8_isa_v2, &lsc_fp8_isa_v3,
                                                    &lsc_fp8_isa_v4};
#else
LSC_FP8_LEVEL(baseline)
static const void *const lsc_fp8_isas[LSC_NISAS] = {&lsc_fp8_isa_baseline};
#endif
static lsc_isa_family lsc_fp8_family = {lsc_fp8_isas};

/* Pick the level by name (lsc_isa_choose). */
static inline int lsc_fp8_isa_select(const char *name) { return lsc_isa_choose(&lsc_fp8_family, name); }

static inline const lsc_fp8_isa *lsc_fp8_isa_get(void)
{
    return (const lsc_fp8_isa *)lsc_isa_table(&lsc_fp8_family);
}

/* The scaled cast of one 1-D run of n inputs `stride` bytes apart (native
 * byte order) into n contiguous codes: the level's kernel for a contiguous
 * run, the scalar functions for any other.  Returns the run's amax bits. */
static uint32_t lsc_fp8_cast_run(const char *x, lsc_fp8_n n, lsc_fp8_n stride, int code,
                                 unsigned char *q, float scale, int fmt, int flags)
{
    int width = code == LSC_CODE_F32 ? 4 : 2;
    if (n <= 0)
        return 0;
    if (stride == width)
        return lsc_fp8_isa_get()->cast[fmt - LSC_CODE_E4M3FN][code](x, n, q, scale, flags);
    if (code == LSC_CODE_F32)
        return lsc_fp8_cast_body(x, n, stride, LSC_CODE_F32, q, scale, fmt, flags);
    if (code == LSC_CODE_F16)
        return lsc_fp8_cast_body(x, n, stride, LSC_CODE_F16, q, scale, fmt, flags);
    return lsc_fp8_cast_body(x, n, stride, LSC_CODE_BF16, q, scale, fmt, flags);
}

/* The amax bits of one 1-D run (lsc_fp8_cast_run's, without the cast). */
static uint32_t lsc_fp8_amax_run(const char *x, lsc_fp8_n n, lsc_fp8_n stride, int code,
                                 int flags)
{
    int width = code == LSC_CODE_F32 ? 4 : 2;
    if (n <= 0)
        return 0;
    if (stride == width)
        return lsc_fp8_isa_get()->amax[code](x, n, flags);
    if (code == LSC_CODE_F32)
        return lsc_fp8_amax_body(x, n, stride, LSC_CODE_F32, flags);
    if (code == LSC_CODE_F16)
        return lsc_fp8_amax_body(x, n, stride, LSC_CODE_F16, flags);
    return lsc_fp8_amax_body(x, n, stride, LSC_CODE_BF16, flags);
}

/* n codes `stride` bytes apart widened into n contiguous words of `code`,
 * each divided by `scale` in float32 before it narrows. */
static void lsc_fp8_decode_run(const unsigned char *q, lsc_fp8_n n, lsc_fp8_n stride, int fmt,
                               char *out, int code, float scale)
{
    if (n <= 0)
        return;
    if (stride == 1) {
        lsc_fp8_isa_get()->decode[fmt - LSC_CODE_E4M3FN][code](q, n, out, scale);
        return;
    }
    if (code == LSC_CODE_F32)
        lsc_fp8_decode_body(q, n, stride, fmt, out, LSC_CODE_F32, scale);
    else if (code == LSC_CODE_F16)
        lsc_fp8_decode_body(q, n, stride, fmt, out, LSC_CODE_F16, scale);
    else
        lsc_fp8_decode_body(q, n, stride, fmt, out, LSC_CODE_BF16, scale);
}

/* ---- jobs: one call's work in chunks, for the package's thread pool -------
 *
 * A job is a cast, an amax pass or a decode over `lines` lines of n
 * elements `stride` bytes apart (the last axis of an N-d strided array,
 * whose other axes are the lines, in C order; a C-contiguous array read as
 * one tensor is one line), into a C-contiguous output.  It is cut into
 * chunks of about LSC_JOB_CHUNK_ELEMS elements: a longer line into `parts`
 * parts, shorter lines `rows` whole lines at a time.  The cut depends on the
 * shape alone, and every element's code depends on that element alone, so
 * the bytes are the same however the chunks are shared out.  Each chunk
 * writes its own output and the amax bits of its elements into its slot of
 * `bits`; lsc_fp8_job_run then folds the slots in chunk order (a line's
 * parts max-combined into its amax), and since the amax is a maximum of
 * bit patterns (lsc_fp8_amax_bits: NaN sorts above Inf or counts as 0 by
 * the flags) the result is the same bits with one thread or many.
 * lsc_fp8_job_run runs the chunks through lsc_pool.h's parallel-for, passed
 * in by the caller: the pool lives in the scan's extension, one per
 * process.  The cut and its constants are lsc_job.h's. */

/* Chunk slots on the stack; a larger job allocates its own. */
#define LSC_FP8_LOCAL_CHUNKS 64

enum { LSC_FP8_JOB_CAST, LSC_FP8_JOB_AMAX, LSC_FP8_JOB_DECODE };

typedef struct {
    int kind;                   /* LSC_FP8_JOB_CAST, _AMAX or _DECODE */
    const char *src;            /* element 0 of line 0 (codes for a decode) */
    int outer;                  /* the axes before the last, walked as lines */
    const intptr_t *shape;      /* their extents and byte strides */
    const intptr_t *strides;
    lsc_fp8_n n, stride, lines; /* elements per line, their byte stride, lines */
    char *dst;                  /* the C-contiguous output: codes, or a decode's words */
    int code, fmt, flags;       /* float code of the input (of the output for a decode) */
    float scale;                /* the scale, or (scales) one per line */
    const float *scales;
    float *amaxes;              /* one amax per line, or NULL */
    lsc_job_cut cut;            /* a chunk is part of a line (parts > 1) or `rows` lines */
    uint32_t *bits;             /* each chunk's amax bits */
} lsc_fp8_job;

/* The first element of line `line`. */
static inline const char *lsc_fp8_line_start(const lsc_fp8_job *j, lsc_fp8_n line)
{
    const char *p = j->src;
    for (int k = j->outer - 1; k > 0; k--) {
        p += (line % j->shape[k]) * j->strides[k];
        line /= j->shape[k];
    }
    return j->outer > 0 ? p + line * j->strides[0] : p;
}

/* Chunk c: its output, a whole line's amax into amaxes (rows), and the amax
 * bits of its elements. */
static uint32_t lsc_fp8_job_do(const lsc_fp8_job *j, size_t c)
{
    const int width = j->code == LSC_CODE_F32 ? 4 : 2;
    lsc_fp8_n line, last, lo, hi;
    uint32_t m = 0;
    if (j->cut.parts > 1) {
        line = (lsc_fp8_n)c / j->cut.parts;
        last = line + 1;
        lo = ((lsc_fp8_n)c % j->cut.parts) * j->cut.piece;
        hi = j->n - lo < j->cut.piece ? j->n : lo + j->cut.piece;
    } else {
        line = (lsc_fp8_n)c * j->cut.rows;
        last = j->lines - line < j->cut.rows ? j->lines : line + j->cut.rows;
        lo = 0;
        hi = j->n;
    }
    for (; line < last; line++) {
        const char *p = lsc_fp8_line_start(j, line) + lo * j->stride;
        lsc_fp8_n at = line * j->n + lo;
        float scale = j->scales ? j->scales[line] : j->scale;
        uint32_t b = 0;
        if (j->kind == LSC_FP8_JOB_CAST)
            b = lsc_fp8_cast_run(p, hi - lo, j->stride, j->code, (unsigned char *)j->dst + at,
                                 scale, j->fmt, j->flags);
        else if (j->kind == LSC_FP8_JOB_AMAX)
            b = lsc_fp8_amax_run(p, hi - lo, j->stride, j->code, j->flags);
        else
            lsc_fp8_decode_run((const unsigned char *)p, hi - lo, j->stride, j->fmt,
                               j->dst + at * width, j->code, scale);
        if (j->amaxes && j->cut.parts == 1)
            j->amaxes[line] = lsc_fp8_amax(b);
        m = b > m ? b : m;
    }
    return m;
}

/* lsc_fp8_job_do as the pool's chunk function. */
static int lsc_fp8_job_chunk(void *ctx, size_t c)
{
    lsc_fp8_job *j = (lsc_fp8_job *)ctx;
    j->bits[c] = lsc_fp8_job_do(j, c);
    return 0;
}

/* Run job j (cut here) through pool_for on at most `threads` threads (0:
 * by its size, serial below LSC_JOB_MT_MIN_ELEMS; 1: serial); *amax gets
 * the amax bits of all its elements, and a line split in parts its amax in
 * amaxes.  Returns 0, or -1 when out of memory (nothing written then).
 * Inline: the other includers of this header (the MX kernels) run no job. */
static inline int lsc_fp8_job_run(lsc_fp8_job *j, lsc_for_fn pool_for, int threads,
                                  uint32_t *amax)
{
    uint32_t local[LSC_FP8_LOCAL_CHUNKS], all = 0, line = 0;
    j->cut = lsc_job_cut_lines(j->lines, j->n, 1);
    const size_t nchunks = j->cut.nchunks, parts = (size_t)j->cut.parts;
    j->bits = nchunks <= LSC_FP8_LOCAL_CHUNKS ? local
                                              : (uint32_t *)malloc(nchunks * sizeof(uint32_t));
    if (!j->bits)
        return -1;
    pool_for(lsc_fp8_job_chunk, j, nchunks, lsc_job_threads(threads, j->n * j->lines));
    for (size_t c = 0; c < nchunks; c++) {
        uint32_t b = j->bits[c];
        all = b > all ? b : all;
        if (parts > 1 && j->amaxes) {
            line = b > line ? b : line;
            if (c % parts == parts - 1) {
                j->amaxes[c / parts] = lsc_fp8_amax(line);
                line = 0;
            }
        }
    }
    if (j->bits != local)
        free(j->bits);
    j->bits = NULL;
    *amax = all;
    return 0;
}

#undef LSC_FP8_LEVEL
#undef LSC_FP8_CAST_FN
#undef LSC_FP8_CAST_IMPL
#undef LSC_FP8_DECODE_FN
#undef LSC_FP8_AMAX_FN
#endif /* LSC_LEVEL */
#endif /* the CPU kernels */

#endif /* LSC_FP8_H */
