/* lsc_scan.h: non-finite scan, fused unscale and gradient statistics over
 * raw buffers.
 *
 * Design: the kernels see a pointer, an element count, a byte stride, a
 * format code and a byte-order flag; they know nothing of NumPy or of any
 * framework (_ext/_scan.pyx builds the buffer table, lsc_pool.h splits big
 * tables over threads).  Non-finite means an all-ones exponent field, tested
 * on the raw words: (w & EXP) + EXP_LSB carries into the top bit exactly
 * when the exponent is all ones, so an OR-reduction over a block answers
 * "any NaN/Inf here?" without a float compare and vectorises at any SIMD
 * width.  Loads and stores go through memcpy, so unaligned buffers are well
 * defined; float16/bfloat16 values convert through lsc_half.h, as on the GPU.  Contiguous kernels (lsc_kernels.h) are compiled once per x86-64
 * ISA level and one set is picked at load time (lsc_isa_select); strided and
 * byte-swapped runs take the generic loops below.
 * The reference for every result is lscore/_reference.py.
 */
#ifndef LSC_SCAN_H
#define LSC_SCAN_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lsc_codes.h"
#include "lsc_half.h"
#include "lsc_isa.h"

typedef int64_t lsc_n;

/* Elements per early-exit block of the scans: 16 KiB of data. */
#define LSC_BLOCK_BYTES 16384
#define LSC_CAT_(a, b) a##b
#define LSC_CAT(a, b) LSC_CAT_(a, b)
#define LSC_STR_(a) #a
#define LSC_STR(a) LSC_STR_(a)

static inline uint16_t lsc_bswap16(uint16_t x) { return (uint16_t)((x >> 8) | (x << 8)); }
static inline uint32_t lsc_bswap32(uint32_t x) { return __builtin_bswap32(x); }
static inline uint64_t lsc_bswap64(uint64_t x) { return __builtin_bswap64(x); }

/* ---- per-format table -------------------------------------------------- */

/* width in bytes, its index in lsc_isa.scan, exponent mask, its lowest bit */
typedef struct { int width; int widx; uint64_t em; uint64_t lsb; } lsc_format;

static const lsc_format lsc_formats[LSC_NCODES] = {
    [LSC_CODE_INT] = {LSC_WIDTH_INT, 0, 0, 0},
    [LSC_CODE_F16] = {LSC_WIDTH_F16, 1, LSC_EXP_F16, LSC_EXP_LSB_F16},
    [LSC_CODE_BF16] = {LSC_WIDTH_BF16, 1, LSC_EXP_BF16, LSC_EXP_LSB_BF16},
    [LSC_CODE_F32] = {LSC_WIDTH_F32, 2, LSC_EXP_F32, LSC_EXP_LSB_F32},
    [LSC_CODE_F64] = {LSC_WIDTH_F64, 3, LSC_EXP_F64, LSC_EXP_LSB_F64},
    [LSC_CODE_E4M3FN] = {LSC_WIDTH_E4M3FN, 0, LSC_EXP_E4M3FN, LSC_EXP_LSB_E4M3FN},
    [LSC_CODE_E5M2] = {LSC_WIDTH_E5M2, 0, LSC_EXP_E5M2, LSC_EXP_LSB_E5M2},
};

/* ---- statistics -------------------------------------------------------- */

/* What one kernel call gathered: the sum of squares and max |x| as the bits
 * of a float (f16/bf16/f32, widened) or of a double (f64). */
typedef struct { double sumsq; uint64_t maxbits; } lsc_kstats;

/* Statistics of a whole job (or of one chunk of it). */
typedef struct { int found; double sumsq; double maxabs; } lsc_result;

/* One group of 32 values (zeros past the end) into the four lanes of a sum
 * of squares, in the fixed tree the vector kernels of lsc_kernels.h follow:
 * lane k gets ((s[k] + s[k+16]) + (s[k+8] + s[k+24])) + ((s[k+4] + s[k+20])
 * + (s[k+12] + s[k+28])), s[i] = x[i] * x[i]. */
static inline void lsc_group_add(double *lane, const double *x)
{
    double t[16], u[8];
    for (int k = 0; k < 16; k++)
        t[k] = x[k] * x[k] + x[k + 16] * x[k + 16];
    for (int k = 0; k < 8; k++)
        u[k] = t[k] + t[k + 8];
    for (int k = 0; k < 4; k++)
        lane[k] += u[k] + u[k + 4];
}

/* The four lanes of a call, summed in one fixed order. */
static inline double lsc_lanes_sum(const double *lane)
{
    return (lane[0] + lane[2]) + (lane[1] + lane[3]);
}

static inline double lsc_maxbits_value(int code, uint64_t bits)
{
    double d;
    if (code == LSC_CODE_F64) {
        memcpy(&d, &bits, 8);
        return d;
    }
    return (double)lsc_f32_from_bits((uint32_t)bits);
}

/* max(a, b) where a NaN on either side wins and stays. */
static inline double lsc_max_nan(double a, double b)
{
    if (a != a)
        return a;
    return (b > a || b != b) ? b : a;
}

/* Fold one kernel's statistics into r. */
static inline void lsc_result_add(lsc_result *r, int code, const lsc_kstats *ks)
{
    r->sumsq += ks->sumsq;
    r->maxabs = lsc_max_nan(r->maxabs, lsc_maxbits_value(code, ks->maxbits));
}

/* The chunk results of a job, merged as a binary counter carries: the k-th
 * sum of squares joins the partial sums of the levels whose bits k has set,
 * so n chunks meet in a balanced tree of depth log2(n), one fixed shape for
 * each n (the rounding error grows with log2 of the chunk count, not with
 * the count). */
typedef struct {
    lsc_result r;               /* found and maxabs; sumsq unused until the end */
    double level[64];
    uint64_t count;
} lsc_cascade;

static inline void lsc_cascade_init(lsc_cascade *c)
{
    c->r.found = 0;
    c->r.sumsq = 0.0;
    c->r.maxabs = 0.0;
    c->count = 0;
}

static inline void lsc_cascade_add(lsc_cascade *c, const lsc_result *o)
{
    double x = o->sumsq;
    int l = 0;
    c->r.found |= o->found;
    c->r.maxabs = lsc_max_nan(c->r.maxabs, o->maxabs);
    for (uint64_t k = c->count++; k & 1; k >>= 1)
        x = c->level[l++] + x;
    c->level[l] = x;
}

static inline lsc_result lsc_cascade_end(const lsc_cascade *c)
{
    lsc_result r = c->r;    /* sumsq 0: adding a sum of squares to it is exact */
    for (int l = 0; l < 64; l++)
        if ((c->count >> l) & 1)
            r.sumsq = c->level[l] + r.sumsq;
    return r;
}

/* ---- the ISA levels ---------------------------------------------------- */

typedef int (*lsc_scan_fn)(const char *p, lsc_n n, uint64_t em, uint64_t lsb);
typedef int (*lsc_unscale_fn)(char *p, lsc_n n, double inv);
typedef int (*lsc_stats_fn)(int code, char *p, lsc_n n, double inv, int write, lsc_kstats *ks);

typedef struct {
    const char *name;
    lsc_scan_fn scan[4];                /* by width: 1, 2, 4, 8 bytes */
    lsc_unscale_fn unscale[LSC_NCODES];
    lsc_stats_fn stats;                 /* f16, bf16, f32, f64 */
} lsc_isa;

#ifdef LSC_X86_DISPATCH   /* lsc_isa.h: the levels and their CPU checks */
#include <immintrin.h>

#define LSC_SFX v2
#define LSC_VBYTES 16
#ifdef __SSE4_1__   /* part of x86-64-v2, the build's baseline */
#define LSC_VTEST(q, top) (!_mm_testz_si128((__m128i)(q), _mm_set1_epi64x((long long)(top))))
#endif
/* the low and the high half of a vector of floats, widened to doubles */
#define LSC_MAXU32(a, b) ((__typeof__(a))_mm_max_epu32((__m128i)(a), (__m128i)(b)))
#define LSC_MAXU16W(a, b) ((__typeof__(a))_mm_max_epu16((__m128i)(a), (__m128i)(b)))
#define LSC_PD_LO(f) _mm_cvtps_pd((__m128)(f))
#define LSC_PD_HI(f) _mm_cvtps_pd(_mm_movehl_ps((__m128)(f), (__m128)(f)))
/* signed 64-bit max: a compare (SSE4.2) and a blend */
#define LSC_MAXS64(a, b) ({ __typeof__(a) a_ = (a), b_ = (b); \
    (__typeof__(a))_mm_blendv_pd((__m128d)a_, (__m128d)b_, (__m128d)(b_ > a_)); })
#include "lsc_kernels.h"

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define LSC_SFX v3
#define LSC_VBYTES 32
/* F16C: 8 halves <-> 8 floats, rounding to nearest even (immediate 0) */
#define LSC_F16C_LANES 8
#define LSC_F32V __m256
#define LSC_H2F(w) _mm256_cvtph_ps((__m128i)(w))
#define LSC_F2H(f) _mm256_cvtps_ph((f), 0)
#define LSC_VTEST(q, top) \
    (!_mm256_testz_si256((__m256i)(q), _mm256_set1_epi64x((long long)(top))))
#define LSC_MAXU32(a, b) ((__typeof__(a))_mm256_max_epu32((__m256i)(a), (__m256i)(b)))
#define LSC_MAXU16(a, b) ((__typeof__(a))_mm_max_epu16((__m128i)(a), (__m128i)(b)))
#define LSC_MAXU16W(a, b) ((__typeof__(a))_mm256_max_epu16((__m256i)(a), (__m256i)(b)))
#define LSC_PD_LO(f) _mm256_cvtps_pd(_mm256_castps256_ps128((__m256)(f)))
#define LSC_PD_HI(f) _mm256_cvtps_pd(_mm256_extractf128_ps((__m256)(f), 1))
#define LSC_FMA_PD(a, b, c) _mm256_fmadd_pd((__m256d)(a), (__m256d)(b), (__m256d)(c))
#define LSC_MAXS64(a, b) ({ __typeof__(a) a_ = (a), b_ = (b); \
    (__typeof__(a))_mm256_blendv_pd((__m256d)a_, (__m256d)b_, (__m256d)(b_ > a_)); })
#include "lsc_kernels.h"
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4", "prefer-vector-width=512")
#define LSC_SFX v4
#define LSC_VBYTES 64
#define LSC_F16C_LANES 16
#define LSC_F32V __m512
#define LSC_H2F(w) _mm512_cvtph_ps((__m256i)(w))
#define LSC_F2H(f) _mm512_cvtps_ph((f), 0)
#define LSC_VTEST(q, top) \
    (_mm512_test_epi64_mask((__m512i)(q), _mm512_set1_epi64((long long)(top))) != 0)
#define LSC_MAXU32(a, b) ((__typeof__(a))_mm512_max_epu32((__m512i)(a), (__m512i)(b)))
#define LSC_MAXU16(a, b) ((__typeof__(a))_mm256_max_epu16((__m256i)(a), (__m256i)(b)))
#define LSC_MAXU16W(a, b) ((__typeof__(a))_mm512_max_epu16((__m512i)(a), (__m512i)(b)))
#define LSC_MAXS64(a, b) ((__typeof__(a))_mm512_max_epi64((__m512i)(a), (__m512i)(b)))
#define LSC_PD_LO(f) _mm512_cvtps_pd(_mm512_castps512_ps256((__m512)(f)))
#define LSC_PD_HI(f) \
    _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd((__m512)(f)), 1)))
#define LSC_FMA_PD(a, b, c) _mm512_fmadd_pd((__m512d)(a), (__m512d)(b), (__m512d)(c))
#include "lsc_kernels.h"
#pragma GCC pop_options

static const void *const lsc_isas[LSC_NISAS] = {&lsc_isa_v2, &lsc_isa_v3, &lsc_isa_v4};
#else
/* one set, at whatever the compiler flags allow */
#define LSC_SFX baseline
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define LSC_VBYTES 64
#elif defined(__AVX2__)
#define LSC_VBYTES 32
#else
#define LSC_VBYTES 16
#endif
#if defined(__F16C__) && defined(__AVX2__) && !defined(__clang__)
#include <immintrin.h>
#if LSC_VBYTES == 64
#define LSC_F16C_LANES 16
#define LSC_F32V __m512
#define LSC_H2F(w) _mm512_cvtph_ps((__m256i)(w))
#define LSC_F2H(f) _mm512_cvtps_ph((f), 0)
#else
#define LSC_F16C_LANES 8
#define LSC_F32V __m256
#define LSC_H2F(w) _mm256_cvtph_ps((__m128i)(w))
#define LSC_F2H(f) _mm256_cvtps_ph((f), 0)
#endif
#endif
#include "lsc_kernels.h"
static const void *const lsc_isas[LSC_NISAS] = {&lsc_isa_baseline};
#endif

static lsc_isa_family lsc_scan_family = {lsc_isas};

/* Pick the ISA level by name (lsc_isa_choose). */
static inline int lsc_isa_select(const char *name) { return lsc_isa_choose(&lsc_scan_family, name); }

static inline const lsc_isa *lsc_isa_get(void)
{
    return (const lsc_isa *)lsc_isa_table(&lsc_scan_family);
}

/* ---- generic loops: strided or byte-swapped runs ------------------------ */

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

static inline uint64_t lsc_word_unscale(int code, uint64_t w, double inv)
{
    float inv32 = (float)inv;
    double d;
    switch (code) {
    case LSC_CODE_F16: return lsc_f32_to_f16(lsc_f16_to_f32((uint16_t)w) * inv32);
    case LSC_CODE_BF16: return lsc_f32_to_bf16(lsc_bf16_to_f32((uint16_t)w) * inv32);
    case LSC_CODE_F32: return lsc_f32_bits(lsc_f32_from_bits((uint32_t)w) * inv32);
    default:
        memcpy(&d, &w, 8);
        d *= inv;
        memcpy(&w, &d, 8);
        return w;
    }
}

/* The value of a word widened to double, and its |x| bits as lsc_kstats keeps them. */
static inline double lsc_word_value(int code, uint64_t w, uint64_t *magbits)
{
    double d;
    float f;
    switch (code) {
    case LSC_CODE_F16: f = lsc_f16_to_f32((uint16_t)w); break;
    case LSC_CODE_BF16: f = lsc_bf16_to_f32((uint16_t)w); break;
    case LSC_CODE_F32: f = lsc_f32_from_bits((uint32_t)w); break;
    default:
        *magbits = w & 0x7FFFFFFFFFFFFFFFull;
        memcpy(&d, &w, 8);
        return d;
    }
    *magbits = lsc_f32_bits(f) & 0x7FFFFFFFu;
    return f;
}

/* A contiguous native-order array: any non-finite element?  Early exit. */
static inline int lsc_scan_contig(int code, const char *p, lsc_n n)
{
    const lsc_format *f = &lsc_formats[code];
    return lsc_isa_get()->scan[f->widx](p, n, f->em, f->lsb);
}

/* The same, multiplying every element by inv in place (the whole array, also
 * after a non-finite value). */
static inline int lsc_unscale_contig(int code, char *p, lsc_n n, double inv)
{
    return lsc_isa_get()->unscale[code](p, n, inv);
}

/* One 1-D run: any non-finite element?  Early exit. */
static int lsc_scan_run(int code, int swapped, const char *p, lsc_n n, lsc_n stride)
{
    const lsc_format *f = &lsc_formats[code];
    if (code == LSC_CODE_INT || n <= 0)
        return 0;
    if (!swapped && stride == f->width)
        return lsc_scan_contig(code, p, n);
    for (lsc_n i = 0; i < n; i++)
        if (lsc_word_nonfinite(lsc_load(p + i * stride, f->width, swapped), f))
            return 1;
    return 0;
}

/* One 1-D run: multiply every element by inv in place (write != 0) or only
 * read it, and report whether any input element was non-finite; with ks
 * non-NULL also gather the statistics of the values left in the run.  The
 * generic loop uses the same 32 lanes as the contiguous kernels, so a run
 * gives the same statistics whatever its layout.  Integer runs and float8
 * runs with write set are never passed here. */
static int lsc_unscale_run(int code, int swapped, char *p, lsc_n n, lsc_n stride, double inv,
                           int write, lsc_kstats *ks)
{
    const lsc_format *f = &lsc_formats[code];
    double lane[4] = {0}, group[32] = {0};
    uint64_t mx = 0;
    int found = 0;
    if (ks) {
        ks->sumsq = 0;
        ks->maxbits = 0;
    }
    if (code == LSC_CODE_INT || n <= 0)
        return 0;
    if (!swapped && stride == f->width) {
        if (ks)
            return lsc_isa_get()->stats(code, p, n, inv, write, ks);
        if (write)
            return lsc_unscale_contig(code, p, n, inv);
        return lsc_scan_run(code, 0, p, n, stride);
    }
    for (lsc_n i = 0; i < n; i++) {
        char *q = p + i * stride;
        uint64_t w = lsc_load(q, f->width, swapped), m;
        found |= lsc_word_nonfinite(w, f);
        if (write) {
            w = lsc_word_unscale(code, w, inv);
            lsc_store(q, f->width, swapped, w);
        }
        if (ks) {
            group[i & 31] = lsc_word_value(code, w, &m);
            mx = m > mx ? m : mx;
            if ((i & 31) == 31 || i == n - 1) {
                for (lsc_n k = (i & 31) + 1; k < 32; k++)
                    group[k] = 0;
                lsc_group_add(lane, group);
            }
        }
    }
    if (ks) {
        ks->sumsq = lsc_lanes_sum(lane);
        ks->maxbits = mx;
    }
    return found;
}

/* ---- runs: what the table holds ----------------------------------------- */

/* One array: a 1-D run of n elements `stride` bytes apart, or (ndim > 1) an
 * N-d strided block walked as 1-D runs along its last axis. */
typedef struct {
    char *data;
    lsc_n n;
    lsc_n stride;
    const lsc_n *shape;      /* ndim > 1 only */
    const lsc_n *strides;    /* ndim > 1 only */
    int ndim;
    int code;
    int swapped;
} lsc_run;

/* What a job does: scan (early exit), or check + write and/or statistics. */
enum { LSC_OP_SCAN = 0, LSC_OP_WRITE = 1, LSC_OP_STATS = 2 };

/* A contiguous native-order buffer through the kernel of op (LSC_OP_SCAN or
 * LSC_OP_WRITE, no statistics): the found flag. */
static inline int lsc_contig(int op, int code, char *p, lsc_n n, double inv)
{
    return op == LSC_OP_SCAN ? lsc_scan_contig(code, p, n) : lsc_unscale_contig(code, p, n, inv);
}

/* Elements [lo, hi) of a 1-D run, or the whole of an N-d run.  Returns the
 * found flag; statistics (op & LSC_OP_STATS) are folded into r. */
static int lsc_do_range(const lsc_run *run, lsc_n lo, lsc_n hi, int op, double inv, lsc_result *r)
{
    const int write = op & LSC_OP_WRITE, stats = op & LSC_OP_STATS;
    lsc_kstats ks;
    int found = 0;
    if (run->ndim <= 1) {
        char *p = run->data + lo * run->stride;
        if (op == LSC_OP_SCAN)
            return lsc_scan_run(run->code, run->swapped, p, hi - lo, run->stride);
        found = lsc_unscale_run(run->code, run->swapped, p, hi - lo, run->stride, inv, write,
                                stats ? &ks : NULL);
        if (stats)
            lsc_result_add(r, run->code, &ks);
        return found;
    }
    /* N-d: odometer over every axis but the last */
    {
        int nd = run->ndim;
        lsc_n idx[64];
        for (int k = 0; k < nd; k++) {
            if (run->shape[k] <= 0)
                return 0;
            idx[k] = 0;
        }
        for (;;) {
            lsc_run row = *run;
            row.ndim = 1;
            row.n = run->shape[nd - 1];
            row.stride = run->strides[nd - 1];
            for (int k = 0; k < nd - 1; k++)
                row.data += idx[k] * run->strides[k];
            if (lsc_do_range(&row, 0, row.n, op, inv, r)) {
                if (op == LSC_OP_SCAN)
                    return 1;
                found = 1;
            }
            int k = nd - 2;
            while (k >= 0) {
                if (++idx[k] < run->shape[k])
                    break;
                idx[k] = 0;
                k--;
            }
            if (k < 0)
                return found;
        }
    }
}

/* The bandwidth reference of `lscore bench`: a plain streaming read. */
static uint64_t lsc_sum_u64(const char *p, lsc_n n)
{
    uint64_t s = 0;
    for (lsc_n i = 0; i < n; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        s += w;
    }
    return s;
}

#endif /* LSC_SCAN_H */
