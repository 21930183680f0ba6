/* lsc_scan.h: non-finite scan and fused unscale over raw buffers.
 *
 * Design: the kernels see a pointer, an element count, a byte stride, a
 * format code and a byte-order flag; they know nothing of NumPy or of any
 * framework (_ext/_scan.pyx builds the buffer table).  Non-finite means an
 * all-ones exponent field, tested on the raw words: (w & EXP) + EXP_LSB
 * carries into the top bit exactly when the exponent is all ones, so an
 * OR-reduction over a block answers "any NaN/Inf here?" without a float
 * compare and vectorises at any SIMD width.  Loads and stores go through
 * memcpy, so unaligned buffers are well defined.  Contiguous kernels are
 * compiled twice (baseline and x86-64-v3) and picked at load time.
 * The reference for every result is lscore/_reference.py.
 */
#ifndef LSC_SCAN_H
#define LSC_SCAN_H

#include <stdint.h>
#include <string.h>

typedef int64_t lsc_n;

enum {
    LSC_CODE_INT = 0,   /* integer or bool: always finite, never written */
    LSC_CODE_F16 = 1,
    LSC_CODE_BF16 = 2,
    LSC_CODE_F32 = 3,
    LSC_CODE_F64 = 4,
    LSC_CODE_E4M3FN = 5,
    LSC_CODE_E5M2 = 6,
    LSC_NCODES = 7
};

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__)) \
        && !defined(LSC_NO_DISPATCH) && __GNUC__ >= 12
#define LSC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define LSC_CLONES
#endif

/* Elements per early-exit block: 16 KiB of data. */
#define LSC_BLOCK_BYTES 16384

static inline uint16_t lsc_bswap16(uint16_t x) { return (uint16_t)((x >> 8) | (x << 8)); }
static inline uint32_t lsc_bswap32(uint32_t x) { return __builtin_bswap32(x); }
static inline uint64_t lsc_bswap64(uint64_t x) { return __builtin_bswap64(x); }

static inline float lsc_f32_from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t lsc_f32_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

/* IEEE half -> float, exact. */
static inline float lsc_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t mag = h & 0x7FFFu;
    uint32_t normal = (mag << 13) + ((127u - 15u) << 23);
    uint32_t special = 0x7F800000u | ((mag & 0x3FFu) << 13);
    /* a subnormal half is mag * 2**-24, exact in float */
    uint32_t sub = lsc_f32_bits((float)mag * 0x1p-24f);
    uint32_t bits = mag >= 0x7C00u ? special : (mag >= 0x0400u ? normal : sub);
    return lsc_f32_from_bits(sign | bits);
}

/* float -> IEEE half, round to nearest even; NaN becomes the quiet NaN
 * 0x7E00 with the sign kept, as torch's conversion does. */
static inline uint16_t lsc_f32_to_f16(float f)
{
    uint32_t x = lsc_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7FFFFFFFu;
    /* normal range: rebias the exponent, then round the 13 dropped bits */
    uint32_t r = a - ((127u - 15u) << 23);
    uint32_t normal = (r + 0x0FFFu + ((r >> 13) & 1u)) >> 13;
    /* subnormal range: a float add rounds |f| * 2**24 to an integer (RNE);
       1024 lands exactly on the smallest normal half */
    float y = lsc_f32_from_bits(a) * 0x1p24f + 0x1p23f;
    uint32_t sub = lsc_f32_bits(y) - 0x4B000000u;
    uint32_t h = a > 0x7F800000u ? 0x7E00u
               : a >= 0x477FF000u ? 0x7C00u          /* >= 65520 rounds to inf */
               : a >= 0x38800000u ? normal
               : sub;
    return (uint16_t)(sign | h);
}

static inline float lsc_bf16_to_f32(uint16_t h) { return lsc_f32_from_bits((uint32_t)h << 16); }

/* float -> bfloat16, round to nearest even; NaN becomes 0x7FC0 (torch's choice). */
static inline uint16_t lsc_f32_to_bf16(float f)
{
    uint32_t x = lsc_f32_bits(f);
    uint32_t r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    return (uint16_t)((x & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : r);
}

/* ---- read-only scan, contiguous, native byte order -------------------- */

#define LSC_DEFINE_SCAN(NAME, T, TOPSHIFT)                                        \
LSC_CLONES static int NAME(const char *p, lsc_n n, T em, T lsb)                    \
{                                                                                  \
    const lsc_n block = LSC_BLOCK_BYTES / (lsc_n)sizeof(T);                        \
    for (lsc_n i = 0; i < n; i += block) {                                         \
        lsc_n m = n - i < block ? n - i : block;                                   \
        const char *q = p + i * (lsc_n)sizeof(T);                                  \
        T acc = 0;                                                                 \
        for (lsc_n j = 0; j < m; j++) {                                            \
            T w;                                                                   \
            memcpy(&w, q + j * (lsc_n)sizeof(T), sizeof(T));                       \
            acc |= (T)((T)(w & em) + lsb);                                         \
        }                                                                          \
        if (acc >> TOPSHIFT)                                                       \
            return 1;                                                              \
    }                                                                              \
    return 0;                                                                      \
}

LSC_DEFINE_SCAN(lsc_scan_u8, uint8_t, 7)
LSC_DEFINE_SCAN(lsc_scan_u16, uint16_t, 15)
LSC_DEFINE_SCAN(lsc_scan_u32, uint32_t, 31)
LSC_DEFINE_SCAN(lsc_scan_u64, uint64_t, 63)

/* ---- fused unscale, contiguous, native byte order ---------------------- */

LSC_CLONES static int lsc_unscale_f32(char *p, lsc_n n, float inv)
{
    uint32_t acc = 0;
    for (lsc_n j = 0; j < n; j++) {
        uint32_t w;
        memcpy(&w, p + 4 * j, 4);
        acc |= (w & 0x7F800000u) + 0x00800000u;
        float f = lsc_f32_from_bits(w) * inv;
        memcpy(p + 4 * j, &f, 4);
    }
    return (int)(acc >> 31);
}

LSC_CLONES static int lsc_unscale_f64(char *p, lsc_n n, double inv)
{
    uint64_t acc = 0;
    for (lsc_n j = 0; j < n; j++) {
        uint64_t w;
        double d;
        memcpy(&w, p + 8 * j, 8);
        acc |= (w & 0x7FF0000000000000ull) + 0x0010000000000000ull;
        memcpy(&d, &w, 8);
        d *= inv;
        memcpy(p + 8 * j, &d, 8);
    }
    return (int)(acc >> 63);
}

LSC_CLONES static int lsc_unscale_f16(char *p, lsc_n n, float inv)
{
    uint16_t acc = 0;
    for (lsc_n j = 0; j < n; j++) {
        uint16_t w;
        memcpy(&w, p + 2 * j, 2);
        acc |= (uint16_t)((w & 0x7C00u) + 0x0400u);
        w = lsc_f32_to_f16(lsc_f16_to_f32(w) * inv);
        memcpy(p + 2 * j, &w, 2);
    }
    return acc >> 15;
}

LSC_CLONES static int lsc_unscale_bf16(char *p, lsc_n n, float inv)
{
    uint16_t acc = 0;
    for (lsc_n j = 0; j < n; j++) {
        uint16_t w;
        memcpy(&w, p + 2 * j, 2);
        acc |= (uint16_t)((w & 0x7F80u) + 0x0080u);
        w = lsc_f32_to_bf16(lsc_bf16_to_f32(w) * inv);
        memcpy(p + 2 * j, &w, 2);
    }
    return acc >> 15;
}

/* ---- per-format table -------------------------------------------------- */

typedef struct { int width; uint64_t em; uint64_t lsb; } lsc_format;

static const lsc_format lsc_formats[LSC_NCODES] = {
    {0, 0, 0},                                              /* int */
    {2, 0x7C00u, 0x0400u},                                  /* f16 */
    {2, 0x7F80u, 0x0080u},                                  /* bf16 */
    {4, 0x7F800000u, 0x00800000u},                          /* f32 */
    {8, 0x7FF0000000000000ull, 0x0010000000000000ull},      /* f64 */
    {1, 0x7Fu, 0x01u},                                      /* e4m3fn: NaN is S.1111.111, no Inf */
    {1, 0x7Cu, 0x04u},                                      /* e5m2 */
};

/* Load one element as an unsigned word in native order. */
static inline uint64_t lsc_load(const char *p, int width, int swapped)
{
    switch (width) {
    case 1: return (uint8_t)*p;
    case 2: { uint16_t w; memcpy(&w, p, 2); return swapped ? lsc_bswap16(w) : w; }
    case 4: { uint32_t w; memcpy(&w, p, 4); return swapped ? lsc_bswap32(w) : w; }
    default: { uint64_t w; memcpy(&w, p, 8); return swapped ? lsc_bswap64(w) : w; }
    }
}

static inline void lsc_store(char *p, int width, int swapped, uint64_t v)
{
    switch (width) {
    case 1: *p = (char)(uint8_t)v; break;
    case 2: { uint16_t w = (uint16_t)v; if (swapped) w = lsc_bswap16(w); memcpy(p, &w, 2); break; }
    case 4: { uint32_t w = (uint32_t)v; if (swapped) w = lsc_bswap32(w); memcpy(p, &w, 4); break; }
    default: { uint64_t w = v; if (swapped) w = lsc_bswap64(w); memcpy(p, &w, 8); break; }
    }
}

static inline int lsc_word_nonfinite(uint64_t w, const lsc_format *f)
{
    uint64_t top = 1ull << (8 * f->width - 1);
    return (((w & f->em) + f->lsb) & top) != 0;
}

/* One 1-D run: any non-finite element?  Early exit. */
static int lsc_scan_run(int code, int swapped, const char *p, lsc_n n, lsc_n stride)
{
    const lsc_format *f = &lsc_formats[code];
    if (code == LSC_CODE_INT || n <= 0)
        return 0;
    if (!swapped && stride == f->width) {
        switch (f->width) {
        case 1: return lsc_scan_u8(p, n, (uint8_t)f->em, (uint8_t)f->lsb);
        case 2: return lsc_scan_u16(p, n, (uint16_t)f->em, (uint16_t)f->lsb);
        case 4: return lsc_scan_u32(p, n, (uint32_t)f->em, (uint32_t)f->lsb);
        default: return lsc_scan_u64(p, n, f->em, f->lsb);
        }
    }
    for (lsc_n i = 0; i < n; i++)
        if (lsc_word_nonfinite(lsc_load(p + i * stride, f->width, swapped), f))
            return 1;
    return 0;
}

/* One 1-D run: multiply every element by inv in place; report whether any
 * input element was non-finite.  Integer runs are never reached here. */
static int lsc_unscale_run(int code, int swapped, char *p, lsc_n n, lsc_n stride, double inv)
{
    const lsc_format *f = &lsc_formats[code];
    float inv32 = (float)inv;
    int found = 0;
    if (code == LSC_CODE_INT || n <= 0)
        return 0;
    if (!swapped && stride == f->width) {
        switch (code) {
        case LSC_CODE_F16: return lsc_unscale_f16(p, n, inv32);
        case LSC_CODE_BF16: return lsc_unscale_bf16(p, n, inv32);
        case LSC_CODE_F32: return lsc_unscale_f32(p, n, inv32);
        case LSC_CODE_F64: return lsc_unscale_f64(p, n, inv);
        default: break;
        }
    }
    for (lsc_n i = 0; i < n; i++) {
        char *q = p + i * stride;
        uint64_t w = lsc_load(q, f->width, swapped);
        found |= lsc_word_nonfinite(w, f);
        switch (code) {
        case LSC_CODE_F16:
            w = lsc_f32_to_f16(lsc_f16_to_f32((uint16_t)w) * inv32);
            break;
        case LSC_CODE_BF16:
            w = lsc_f32_to_bf16(lsc_bf16_to_f32((uint16_t)w) * inv32);
            break;
        case LSC_CODE_F32:
            w = lsc_f32_bits(lsc_f32_from_bits((uint32_t)w) * inv32);
            break;
        default: {
            double d;
            memcpy(&d, &w, 8);
            d *= inv;
            memcpy(&w, &d, 8);
            break;
        }
        }
        lsc_store(q, f->width, swapped, w);
    }
    return found;
}

/* An N-d strided array, walked as 1-D runs along its last axis.  With
 * write == 0 it stops at the first non-finite run. */
static int lsc_walk_nd(int code, int swapped, char *data, int ndim,
                       const lsc_n *shape, const lsc_n *strides, int write, double inv)
{
    lsc_n idx[64];
    int found = 0;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] <= 0)
            return 0;
        idx[k] = 0;
    }
    for (;;) {
        char *p = data;
        for (int k = 0; k < ndim - 1; k++)
            p += idx[k] * strides[k];
        if (write)
            found |= lsc_unscale_run(code, swapped, p, shape[ndim - 1], strides[ndim - 1], inv);
        else if (lsc_scan_run(code, swapped, p, shape[ndim - 1], strides[ndim - 1]))
            return 1;
        int k = ndim - 2;
        while (k >= 0) {
            if (++idx[k] < shape[k])
                break;
            idx[k] = 0;
            k--;
        }
        if (k < 0)
            return found;
    }
}

#endif /* LSC_SCAN_H */
