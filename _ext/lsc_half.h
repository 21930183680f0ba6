/* lsc_half.h: the one float16 / bfloat16 <-> float32 conversion, for the C
 * core and the CUDA kernels.
 *
 * Design: scalar conversions of 16-bit words.  Widening is exact; narrowing
 * rounds to nearest even, and a NaN becomes the quiet NaN 0x7E00 with its
 * sign kept (float16) or 0x7FC0 (bfloat16), as torch's conversions do.  The
 * CPU core (lsc_scan.h, lsc_kernels.h) and the GPU kernels (scan.cu) call
 * these same functions, so both round alike bit for bit; the CPU kernels
 * convert whole vectors with F16C where the ISA has it and use these for the
 * rest.  Selects are written as masks so that the CPU loops calling them
 * vectorise (a ?: chain kept gcc 12 scalar).  Bit casts are the CUDA
 * intrinsics in device code (NVRTC has no toolkit headers, so no memcpy)
 * and memcpy elsewhere (well defined in C, and the compiler's plain move).
 */
#ifndef LSC_HALF_H
#define LSC_HALF_H

#include "lsc_codes.h"

#if defined(__CUDA_ARCH__)
LSC_FN float lsc_f32_from_bits(lsc_u32 w) { return __uint_as_float(w); }
LSC_FN lsc_u32 lsc_f32_bits(float f) { return __float_as_uint(f); }
#else
#include <string.h>
LSC_FN float lsc_f32_from_bits(lsc_u32 w) { float f; memcpy(&f, &w, 4); return f; }
LSC_FN lsc_u32 lsc_f32_bits(float f) { lsc_u32 w; memcpy(&w, &f, 4); return w; }
#endif

/* The C conversions: the CPU core's, and the host harness's (NVRTC builds
 * the device's below instead, so it never sees these unused). */
#if !defined(__CUDACC_RTC__)

/* IEEE half -> float, exact. */
LSC_FN float lsc_f16_to_f32(lsc_u16 h)
{
    lsc_u32 sign = (lsc_u32)(h & 0x8000u) << 16;
    lsc_i32 mag = h & 0x7FFF;
    lsc_u32 normal = ((lsc_u32)mag << 13) + ((127u - 15u) << 23);
    lsc_u32 special = 0x7F800000u | (((lsc_u32)mag & 0x3FFu) << 13);
    /* a subnormal half is mag * 2**-24, exact in float */
    lsc_u32 sub = lsc_f32_bits((float)mag * 0x1p-24f);
    lsc_u32 is_special = -(lsc_u32)(mag >= 0x7C00), is_normal = -(lsc_u32)(mag >= 0x0400);
    lsc_u32 bits = (special & is_special) | (normal & is_normal & ~is_special) | (sub & ~is_normal);
    return lsc_f32_from_bits(sign | bits);
}

/* float -> IEEE half, round to nearest even; NaN becomes 0x7E00 with the sign kept. */
LSC_FN lsc_u16 lsc_f32_to_f16(float f)
{
    lsc_u32 x = lsc_f32_bits(f);
    lsc_u32 sign = (x >> 16) & 0x8000u;
    lsc_u32 a = x & 0x7FFFFFFFu;
    lsc_i32 ai = (lsc_i32)a;
    /* normal range: rebias the exponent, then round the 13 dropped bits */
    lsc_u32 r = a - ((127u - 15u) << 23);
    lsc_u32 normal = (r + 0x0FFFu + ((r >> 13) & 1u)) >> 13;
    /* subnormal range: a float add rounds |f| * 2**24 (exact) to an integer
       (RNE); 1024 lands exactly on the smallest normal half */
    float y = lsc_f32_from_bits(a) * 0x1p24f + 0x1p23f;
    lsc_u32 sub = lsc_f32_bits(y) - 0x4B000000u;
    lsc_u32 is_nan = -(lsc_u32)(ai > 0x7F800000);
    lsc_u32 is_inf = -(lsc_u32)(ai >= 0x477FF000);      /* >= 65520 rounds to inf */
    lsc_u32 is_normal = -(lsc_u32)(ai >= 0x38800000);
    lsc_u32 h = (0x7E00u & is_nan) | (0x7C00u & is_inf & ~is_nan)
              | (normal & is_normal & ~is_inf) | (sub & ~is_normal);
    return (lsc_u16)(sign | h);
}

LSC_FN float lsc_bf16_to_f32(lsc_u16 h) { return lsc_f32_from_bits((lsc_u32)h << 16); }

/* float -> bfloat16, round to nearest even; NaN becomes 0x7FC0. */
LSC_FN lsc_u16 lsc_f32_to_bf16(float f)
{
    lsc_u32 x = lsc_f32_bits(f);
    lsc_u32 r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    return (lsc_u16)((x & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : r);
}

#endif /* the C conversions */

/* ---- the device's conversion instructions -------------------------------
 *
 * Kernels convert with the GPU's own instructions (inline PTX; no toolkit
 * header needed): cvt.f32.f16 widens a half exactly, cvt.rn.f16.f32 and
 * (sm_80+) cvt.rn.bf16.f32 narrow with round to nearest even, and a bfloat16
 * widens by a shift (cvt.f64.f16 widens a half to double in one step).  Finite results equal the C conversions above bit for
 * bit.  A NaN narrows to the instruction's canonical NaN, 0x7FFF, sign
 * dropped (the C conversions keep the sign and give 0x7E00 / 0x7FC0): these
 * are the instructions torch's CUDA kernels use (c10::Half / c10::BFloat16
 * in device code), so a NaN left by an unscale is the word torch's CUDA
 * unscale leaves.  Before sm_80 the bfloat16 narrowing is the C rounding
 * with the same canonical NaN, so every architecture writes the same words.
 * Outside NVRTC (the host test harness, LSC_DEVICE_EMULATION) the same
 * results come from the C conversions and that NaN. */
#define LSC_DEV_NAN16 0x7FFFu

#if defined(__CUDA_ARCH__)
static __device__ __forceinline__ float lsc_dev_f16_to_f32(lsc_u16 h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
static __device__ __forceinline__ double lsc_dev_f16_to_f64(lsc_u16 h)
{
    double d;
    asm("cvt.f64.f16 %0, %1;" : "=d"(d) : "h"(h));
    return d;
}
static __device__ __forceinline__ lsc_u16 lsc_dev_f32_to_f16(float f)
{
    lsc_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
static __device__ __forceinline__ lsc_u16 lsc_dev_f32_to_bf16(float f)
{
#if __CUDA_ARCH__ >= 800
    lsc_u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    lsc_u32 x = lsc_f32_bits(f);    /* round to nearest even, as lsc_f32_to_bf16 */
    return f != f ? (lsc_u16)LSC_DEV_NAN16 : (lsc_u16)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
#endif
}
#elif defined(LSC_DEVICE_EMULATION)
static inline float lsc_dev_f16_to_f32(lsc_u16 h) { return lsc_f16_to_f32(h); }
static inline double lsc_dev_f16_to_f64(lsc_u16 h) { return (double)lsc_f16_to_f32(h); }
static inline lsc_u16 lsc_dev_f32_to_f16(float f)
{
    return f != f ? (lsc_u16)LSC_DEV_NAN16 : lsc_f32_to_f16(f);
}
static inline lsc_u16 lsc_dev_f32_to_bf16(float f)
{
    return f != f ? (lsc_u16)LSC_DEV_NAN16 : lsc_f32_to_bf16(f);
}
#endif
#if defined(__CUDA_ARCH__) || defined(LSC_DEVICE_EMULATION)
static __device__ __forceinline__ float lsc_dev_bf16_to_f32(lsc_u16 h)
{
    return lsc_f32_from_bits((lsc_u32)h << 16);
}
static __device__ __forceinline__ double lsc_dev_bf16_to_f64(lsc_u16 h)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    double d;
    asm("cvt.f64.bf16 %0, %1;" : "=d"(d) : "h"(h));
    return d;
#else
    return (double)lsc_dev_bf16_to_f32(h);
#endif
}
#endif

#endif /* LSC_HALF_H */
