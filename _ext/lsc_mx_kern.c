/* lsc_mx_kern.c: lsc_mx.h's block passes over contiguous input, for one ISA
 * level.
 *
 * Design: setup.py compiles this file once for each level of lsc_isa.h,
 * with that level's target flags and -DLSC_LEVEL=<its name> (v2, v3, v4 on
 * x86-64 with GCC; baseline elsewhere), and links the objects into the _mx
 * extension; each defines the table lsc_mx_isa_<name> that lsc_mx.h picks
 * at run time.  A kernel is one function per element format and input
 * dtype, and its float8 element loop has one copy per narrowing flags (the
 * torch modes' and TE's): what changes the element loop's instructions.
 * The scale rule is a run-time value of lsc_mx_group_scales, the small loop
 * across a group's blocks.  What the passes compute is described at "the
 * CPU block passes" in lsc_mx.h; strided input never reaches this file
 * (lsc_mx.h gathers it). */
#include "lsc_mx.h"

#ifndef LSC_LEVEL
#error "compile with -DLSC_LEVEL=<level name> (setup.py does)"
#endif
#define LSC_MX_CAT2(a, b) a##_##b
#define LSC_MX_CAT(a, b) LSC_MX_CAT2(a, b)
#define LSC_MX_STR2(a) #a
#define LSC_MX_STR(a) LSC_MX_STR2(a)

#if defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define LSC_MX_BF16_LANES 1   /* x86-64-v4: bfloat16 blocks narrowed in 16-bit lanes */
#endif

#define LSC_MX_INL static inline __attribute__((always_inline))
#define LSC_MX_COLD static __attribute__((noinline, cold))

/* The amax of a block whose amax bits are m (a NaN: the quiet NaN). */
LSC_MX_INL float lsc_mx_amax_of(lsc_u32 m)
{
    /* a mask: as a select GCC 12 threads it into the scale rules that
       follow and leaves their loops over blocks scalar for x86-64-v3 */
    const lsc_u32 nan = -(lsc_u32)(m > 0x7F800000u);
    return lsc_f32_from_bits((m & ~nan) | (0x7FC00000u & nan));
}

/* The scale codes (into sc) and factors (into r) of nb blocks whose amax
 * bits are m, by rule `mode` for element format `elem`: the scales, then
 * the factors, each a loop across the blocks, which vectorises the rule
 * (NVFP4's divisions and E4M3 narrowing, MX's exponent arithmetic); one
 * loop of both leaves control flow that stops the vectoriser. */
LSC_MX_INL void lsc_mx_scales_by(const lsc_u32 *restrict m, int64_t nb, const lsc_mx_rule *k,
                                 int elem, int mode, lsc_u32 *restrict sc, float *restrict r)
{
    if (lsc_mx_wide(mode)) {   /* float32 rules: the scale is the factor, its inverse stored */
        const int pow2 = k->pow2;   /* read once, as NVFP4's fields below */
        const double eps = k->eps;
        const float inf_value = k->inf_value;
        for (int64_t b = 0; b < nb; b++)
            r[b] = lsc_bw_scale(lsc_mx_amax_of(m[b]), elem, mode, pow2, eps, inf_value);
        for (int64_t b = 0; b < nb; b++)
            sc[b] = lsc_bw_inv_bits(r[b]);
        return;
    }
    if (mode == LSC_MX_NVFP4) {
        /* the rule's fields read once: a store to sc may alias them (no strict
           aliasing), and a reload a block made the loop scalar */
        const int has_pts = k->has_pts;
        const float pts = k->pts;
        for (int64_t b = 0; b < nb; b++)
            sc[b] = lsc_nvfp4_scale(lsc_mx_amax_of(m[b]), has_pts, pts);
        for (int64_t b = 0; b < nb; b++)
            r[b] = lsc_nvfp4_factor(sc[b], has_pts, pts);
        return;
    }
    for (int64_t b = 0; b < nb; b++)
        sc[b] = lsc_mx_scale(lsc_mx_amax_of(m[b]), elem, mode);
    for (int64_t b = 0; b < nb; b++)
        r[b] = lsc_mx_factor(sc[b], lsc_mx_amax_of(m[b]), elem, mode);
}

/* lsc_mx_scales_by with the rule k->mode, for a constant element format. */
LSC_MX_INL void lsc_mx_scales_of(const lsc_u32 *m, int64_t nb, const lsc_mx_rule *k, int elem,
                                 lsc_u32 *sc, float *r)
{
    switch (k->mode) {
    case LSC_MX_FLOOR: lsc_mx_scales_by(m, nb, k, elem, LSC_MX_FLOOR, sc, r); break;
    case LSC_MX_RCEIL: lsc_mx_scales_by(m, nb, k, elem, LSC_MX_RCEIL, sc, r); break;
    case LSC_MX_TE:
    case LSC_MX_TE | LSC_MX_NEXT:   /* quantizes as v2.18 */
        lsc_mx_scales_by(m, nb, k, elem, LSC_MX_TE, sc, r);
        break;
    case LSC_MX_OCP: lsc_mx_scales_by(m, nb, k, elem, LSC_MX_OCP, sc, r); break;
    case LSC_MX_NVFP4: lsc_mx_scales_by(m, nb, k, elem, LSC_MX_NVFP4, sc, r); break;
    case LSC_MX_TE32: lsc_mx_scales_by(m, nb, k, elem, LSC_MX_TE32, sc, r); break;
    case LSC_MX_AO32: lsc_mx_scales_by(m, nb, k, elem, LSC_MX_AO32, sc, r); break;
    case LSC_MX_FLOOR | LSC_MX_NEXT:
        lsc_mx_scales_by(m, nb, k, elem, LSC_MX_FLOOR | LSC_MX_NEXT, sc, r);
        break;
    case LSC_MX_RCEIL | LSC_MX_NEXT:
        lsc_mx_scales_by(m, nb, k, elem, LSC_MX_RCEIL | LSC_MX_NEXT, sc, r);
        break;
    default: lsc_mx_scales_by(m, nb, k, elem, k->mode, sc, r);   /* CEIL, EVEN (NEXT too) */
    }
}

/* The scales and factors of a group of blocks (lsc_mx_scales_by) by the
 * rule k: the one place the mode and the element format are taken apart,
 * out of line (a group's scales are a few dozen operations beside hundreds
 * of elements), each case a loop with its rule inlined and its constants
 * folded (RCEIL's runs 1.3x slower with the format's largest value a
 * variable). */
static __attribute__((noinline)) void lsc_mx_group_scales(const lsc_u32 *m, int64_t nb,
                                                          const lsc_mx_rule *k, lsc_u32 *sc,
                                                          float *r)
{
    if (k->elem == LSC_CODE_E4M3FN)
        lsc_mx_scales_of(m, nb, k, LSC_CODE_E4M3FN, sc, r);
    else if (k->elem == LSC_CODE_E5M2)
        lsc_mx_scales_of(m, nb, k, LSC_CODE_E5M2, sc, r);
    else
        lsc_mx_scales_of(m, nb, k, LSC_MX_E2M1, sc, r);
}

/* The byte every element (E2M1: pair) of a block with the NaN factor r
 * gets, written count times step bytes apart: lsc_mx_code's code of any
 * element times r. */
LSC_MX_COLD void lsc_mx_nan_fill(float r, int elem, int flags, unsigned char *q, int64_t count,
                                 int64_t step)
{
    const lsc_u32 c = lsc_mx_narrow(r, elem, flags);
    const unsigned char v = (unsigned char)(elem == LSC_MX_E2M1 ? c | (c << 4) : c);
    for (int64_t i = 0; i < count; i++)
        q[i * step] = v;
}

LSC_MX_INL float lsc_mx_load(const char *x, int64_t i, int code)
{
    return lsc_fp8_load(x, i, LSC_MX_WIDTH(code), code);
}

/* The amax bits of nb contiguous blocks of `block` elements into m, NaN
 * elements left out with skip (TE's modes; lsc_mx_abs_bits).  bfloat16 in
 * its own 16-bit lanes, twice the elements an instruction: a bfloat16's
 * float32 bits are its word shifted up by 16, whose order and NaN test the
 * word's top 15 bits give. */
LSC_MX_INL void lsc_mx_amaxes(const char *x, int64_t nb, int64_t block, int code, int skip,
                              lsc_u32 *m)
{
    if (code == LSC_CODE_BF16) {
        for (int64_t b = 0; b < nb; b++) {
            const char *xb = x + b * block * 2;
            lsc_u16 mb = 0;
            for (int64_t j = 0; j < block; j++) {
                lsc_u16 h;
                memcpy(&h, xb + 2 * j, 2);
                lsc_u16 a = (lsc_u16)(h & 0x7FFFu);
                /* a mask, not a select (which GCC 12 leaves scalar here) */
                a &= skip ? (lsc_u16) - (int16_t)((int16_t)a <= 0x7F80) : (lsc_u16)0xFFFFu;
                mb = a > mb ? a : mb;
            }
            m[b] = (lsc_u32)mb << 16;
        }
        return;
    }
    for (int64_t b = 0; b < nb; b++) {
        const char *xb = x + b * block * LSC_MX_WIDTH(code);
        lsc_u32 mb = 0;
        for (int64_t j = 0; j < block; j++) {
            lsc_u32 a = lsc_mx_abs_bits(lsc_mx_load(xb, j, code), skip);
            mb = a > mb ? a : mb;
        }
        m[b] = mb;
    }
}

/* Whether the rule's amaxes leave NaN elements out (lsc_mx_skips_nan_mode). */
LSC_MX_INL int lsc_mx_skips_nan(const lsc_mx_rule *k)
{
    return lsc_mx_skips_nan_mode(k->mode);
}

/* A block's scale code or float32 inverse scale bits `sc` stored as scale i. */
LSC_MX_INL void lsc_mx_put_scale(unsigned char *s, int64_t i, lsc_u32 sc, int swidth)
{
    if (swidth == 4)
        memcpy(s + 4 * i, &sc, 4);
    else
        s[i] = (unsigned char)sc;
}

/* torchao's blocks of scale 0 (an Inf amax) rewritten: count elements
 * `step` bytes apart from x, codes `qstep` bytes apart, by lsc_bw_code (0
 * with the element's sign, an Inf one the x86 NaN: 0xFF). */
LSC_MX_COLD void lsc_mx_zero_fix(const char *x, int code, int elem, int64_t count, int64_t step,
                                 unsigned char *q, int64_t qstep)
{
    for (int64_t i = 0; i < count; i++)
        q[i * qstep] = (unsigned char)lsc_bw_code(lsc_mx_load(x + i * step, 0, code), 0.0f, elem,
                                                  LSC_MX_AO32);
}

#ifdef LSC_MX_BF16_LANES
/* The largest lanes of the pairs of lanes of a and b side by side: lane j < 8
 * max(a[2j], a[2j + 1]), lane 8 + j the same of b.  Four of these levels turn
 * 16 vectors into one whose lane i is the largest of vector i. */
LSC_MX_INL __m512i lsc_mx_pairmax(__m512i a, __m512i b)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27,
                                          29, 31);
    return _mm512_max_epu32(_mm512_permutex2var_epi32(a, even, b),
                            _mm512_permutex2var_epi32(a, odd, b));
}

/* The amax bits of 16 contiguous float32 blocks of 32 into m (lsc_mx_amaxes'
 * bits): each block's two vectors max-combined, then the 16 vectors reduced
 * together by lsc_mx_pairmax (15 steps where a horizontal reduction of each
 * took 64; the amaxes were a quarter of the float32 MXFP8 pass). */
LSC_MX_INL void lsc_mx_amaxes_f32x16(const char *x, int skip, lsc_u32 *m)
{
    const __m512i mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    __m512i v[16];
    for (int b = 0; b < 16; b++) {
        __m512i a0 = _mm512_and_si512(_mm512_loadu_si512(x + 128 * b), mask);
        __m512i a1 = _mm512_and_si512(_mm512_loadu_si512(x + 128 * b + 64), mask);
        if (skip) {   /* NaN lanes left out (lsc_mx_abs_bits) */
            a0 = _mm512_maskz_mov_epi32(_mm512_cmple_epu32_mask(a0, inf), a0);
            a1 = _mm512_maskz_mov_epi32(_mm512_cmple_epu32_mask(a1, inf), a1);
        }
        v[b] = _mm512_max_epu32(a0, a1);
    }
    for (int w = 16; w > 1; w /= 2)
        for (int i = 0; i < w / 2; i++)
            v[i] = lsc_mx_pairmax(v[2 * i], v[2 * i + 1]);
    _mm512_storeu_si512(m, v[0]);
}
#endif

/* lsc_mx_amaxes with the common block lengths and skip constants (which
 * unroll and fold the NaN test away); on x86-64-v4 a full group of float32
 * blocks of 32 by lsc_mx_amaxes_f32x16. */
LSC_MX_INL void lsc_mx_amaxes_of(const char *x, int64_t nb, int64_t block, int code, int skip,
                                 lsc_u32 *m)
{
#ifdef LSC_MX_BF16_LANES
    if (code == LSC_CODE_F32 && block == 32 && nb == 16) {
        if (skip)
            lsc_mx_amaxes_f32x16(x, 1, m);
        else
            lsc_mx_amaxes_f32x16(x, 0, m);
        return;
    }
#endif
    if (skip)
        lsc_mx_amaxes(x, nb, block, code, 1, m);
    else if (block == 32)
        lsc_mx_amaxes(x, nb, 32, code, 0, m);
    else if (block == 16)
        lsc_mx_amaxes(x, nb, 16, code, 0, m);
    else if (block == 128)
        lsc_mx_amaxes(x, nb, 128, code, 0, m);
    else
        lsc_mx_amaxes(x, nb, block, code, 0, m);
}

/* The factor r[b] of each of nb blocks of `block` elements spread to its
 * elements, into fr. */
LSC_MX_INL void lsc_mx_spread(const float *r, int64_t nb, int64_t block, float *fr)
{
    for (int64_t b = 0; b < nb; b++)
        for (int64_t j = 0; j < block; j++)
            fr[b * block + j] = r[b];
}

/* The element loops narrow in two steps: the 32-bit codes of up to
 * LSC_MX_PIECE elements into a buffer, then the bytes in a loop of their
 * own.  In one loop GCC 12 narrows every intermediate of lsc_fp8_from_f32
 * to bytes by itself (a pack per mask and value: 1.6x the instructions);
 * the buffer stays in L1, or in registers where the piece is a constant. */
#define LSC_MX_PIECE 128

/* The float8 codes of n contiguous elements times their factors fr, into
 * q: the element loop, inlined with the narrowing flags a constant (the
 * torch modes' or TE's), which folds the NaN-sign masks away; narrowed in
 * two loops (LSC_MX_PIECE: float32 MXFP8 at 1e6 took 1.3x the time with the
 * byte stores in the element loop). */
LSC_MX_INL void lsc_mx_fp8_codes(const char *x, int64_t n, int code, int elem, int flags,
                                 const float *fr, unsigned char *q)
{
    for (int64_t i0 = 0; i0 < n; i0 += LSC_MX_PIECE) {
        const int64_t m = n - i0 < LSC_MX_PIECE ? n - i0 : LSC_MX_PIECE;
        lsc_u32 t[LSC_MX_PIECE];
        for (int64_t i = 0; i < m; i++)
            t[i] = lsc_fp8_narrow(lsc_mx_load(x, i0 + i, code) * fr[i0 + i], elem, flags);
        for (int64_t i = 0; i < m; i++)
            q[i0 + i] = (unsigned char)t[i];
    }
}

/* The float8 codes of n contiguous elements times one factor r, into q: a
 * block of 128 (blockwise FP8) is 8 vectors, so a loop per block runs at the
 * full width with the factor in a register. */
LSC_MX_INL void lsc_mx_fp8_codes_r(const char *x, int64_t n, int code, int elem, int flags,
                                   float r, unsigned char *q)
{
    for (int64_t i0 = 0; i0 < n; i0 += LSC_MX_PIECE) {
        const int64_t m = n - i0 < LSC_MX_PIECE ? n - i0 : LSC_MX_PIECE;
        lsc_u32 t[LSC_MX_PIECE];
        for (int64_t i = 0; i < m; i++)
            t[i] = lsc_fp8_narrow(lsc_mx_load(x, i0 + i, code) * r, elem, flags);
        for (int64_t i = 0; i < m; i++)
            q[i0 + i] = (unsigned char)t[i];
    }
}

/* The codes of nb contiguous blocks of 128, block b times r[b] (lsc_mx_fp8_codes_r). */
LSC_MX_INL void lsc_mx_fp8_blocks128(const char *x, int64_t nb, int code, int elem, int flags,
                                     const float *r, unsigned char *q)
{
    for (int64_t b = 0; b < nb; b++) {
        const char *xb = x + b * 128 * LSC_MX_WIDTH(code);
        if (flags & LSC_FP8_NAN_SIGN)
            lsc_mx_fp8_codes_r(xb, 128, code, elem, LSC_FP8_SAT | LSC_FP8_NAN_SIGN, r[b],
                               q + b * 128);
        else
            lsc_mx_fp8_codes_r(xb, 128, code, elem, LSC_FP8_SAT, r[b], q + b * 128);
    }
}

/* The codes of len contiguous elements times their factors fr (E2M1: packed two a byte,
 * the first in the low nibble), narrowed by `flags`. */
LSC_MX_INL void lsc_mx_spread_codes(const char *xg, int64_t len, int code, int elem, int flags,
                                    const float *fr, unsigned char *qg)
{
    if (elem == LSC_MX_E2M1) {
        /* one code per element first, then the pairs packed: each loop
           vectorises at the full width (reading pairs of elements does not).
           The codes as 32-bit words, as lsc_mx_fp8_codes's: into bytes the
           element loop ran 32 lanes a step and spilled (NVFP4 float32 at 1e6
           on x86-64-v3, in separate runs: 1.16-1.34 ms, with the words
           0.96-1.03 ms) */
        lsc_u32 t[LSC_MX_CHUNK];
        for (int64_t i = 0; i < len; i++)
            t[i] = lsc_e2m1_from_f32(lsc_mx_load(xg, i, code) * fr[i]);
        for (int64_t i = 0; i < len / 2; i++)
            qg[i] = (unsigned char)(t[2 * i] | (t[2 * i + 1] << 4));
    } else if (flags & LSC_FP8_NAN_SIGN) {
        lsc_mx_fp8_codes(xg, len, code, elem, LSC_FP8_SAT | LSC_FP8_NAN_SIGN, fr, qg);
    } else {
        lsc_mx_fp8_codes(xg, len, code, elem, LSC_FP8_SAT, fr, qg);   /* TE's */
    }
}

/* One contiguous row of n elements (a multiple of the block): n / block
 * scale codes into s, the codes into q (E2M1: n / 2 bytes).  Per group of
 * blocks: the amaxes, the scales and factors, then the codes of the whole
 * group in one loop with the factors spread per element (the common block
 * lengths a constant in both, which unrolls), at the full vector width (a
 * loop per block of 32 runs at half of it), narrowed without lsc_mx_code's
 * clamp to +-max, which changes no code (the float8 narrowing saturates, as
 * the MX flags have LSC_FP8_SAT, and E2M1's does itself); then the blocks
 * whose factor is NaN rewritten. */
LSC_MX_INL void lsc_mx_row_body(const char *x, int64_t n, int code, int elem,
                                const lsc_mx_rule *k, unsigned char *s, unsigned char *q)
{
    const int64_t block = k->block, nb = n / block;
    const int64_t width = elem == LSC_MX_E2M1 ? block / 2 : block;
    const int64_t per = LSC_MX_GROUP_ELEMS / block;
    const int64_t G = per < 1 ? 1 : per > LSC_MX_GROUP ? LSC_MX_GROUP : per;
    const int flags = lsc_mx_rule_flags(k), skip = lsc_mx_skips_nan(k);
    for (int64_t b0 = 0; b0 < nb; b0 += G) {
        const int64_t g = nb - b0 < G ? nb - b0 : G, len = g * block;
        const char *xg = x + b0 * block * LSC_MX_WIDTH(code);
        unsigned char *qg = q + b0 * width;
        lsc_u32 m[LSC_MX_GROUP], sc[LSC_MX_GROUP];
        float r[LSC_MX_GROUP], fr[LSC_MX_CHUNK];
        lsc_mx_amaxes_of(xg, g, block, code, skip, m);
        lsc_mx_group_scales(m, g, k, sc, r);
        for (int64_t b = 0; b < g; b++)
            lsc_mx_put_scale(s, b0 + b, sc[b], k->swidth);
        if (block == 128 && elem != LSC_MX_E2M1) {   /* blockwise FP8: a factor a block */
            lsc_mx_fp8_blocks128(xg, g, code, elem, flags, r, qg);
        } else {
            if (block == 32)
                lsc_mx_spread(r, g, 32, fr);
            else if (block == 16)
                lsc_mx_spread(r, g, 16, fr);
            else
                lsc_mx_spread(r, g, block, fr);
            lsc_mx_spread_codes(xg, len, code, elem, flags, fr, qg);
        }
        /* a reduction that vectorises, then the rare blocks (a branch per
           block cost as much as the scales) */
        int rare = 0;
        for (int64_t b = 0; b < g; b++)
            rare |= (r[b] != r[b]) | (r[b] == 0.0f);
        for (int64_t b = 0; rare && b < g; b++) {
            if (r[b] != r[b])
                lsc_mx_nan_fill(r[b], elem, flags, qg + b * width, width, 1);
            else if (r[b] == 0.0f && k->mode == LSC_MX_AO32)
                lsc_mx_zero_fix(xg + b * block * LSC_MX_WIDTH(code), code, elem, block,
                                LSC_MX_WIDTH(code), qg + b * width, 1);
        }
    }
}

/* The codes of a columns tile: `block` rows of w contiguous columns from xt
 * (rows rs bytes apart), column j times its factor fac[j], into q (rows ld
 * bytes apart; E2M1 packs rows 2i and 2i + 1 into one byte, the first in
 * the low nibble).  As lsc_mx_row_body's codes: the product narrowed
 * without the clamp, then the columns whose factor is NaN rewritten. */
LSC_MX_INL void lsc_mx_cols_narrow(const char *xt, int64_t block, int64_t w, int64_t rs,
                                   int64_t ld, int code, int elem, int flags, const float *fac,
                                   unsigned char *q)
{
    if (elem == LSC_MX_E2M1) {
        for (int64_t i = 0; i < block; i += 2) {
            unsigned char *qr = q + (i / 2) * ld;
            const char *xa = xt + i * rs, *xb = xt + (i + 1) * rs;
            for (int64_t j = 0; j < w; j++)
                qr[j] = (unsigned char)(lsc_e2m1_from_f32(lsc_mx_load(xa, j, code) * fac[j])
                                        | (lsc_e2m1_from_f32(lsc_mx_load(xb, j, code) * fac[j])
                                           << 4));
        }
    } else if (flags & LSC_FP8_NAN_SIGN) {
        for (int64_t i = 0; i < block; i++)
            lsc_mx_fp8_codes(xt + i * rs, w, code, elem, LSC_FP8_SAT | LSC_FP8_NAN_SIGN, fac,
                             q + i * ld);
    } else {
        for (int64_t i = 0; i < block; i++)   /* TE's flags */
            lsc_mx_fp8_codes(xt + i * rs, w, code, elem, LSC_FP8_SAT, fac, q + i * ld);
    }
    int any_nan = 0;   /* a reduction that vectorises, then the rare columns */
    for (int64_t j = 0; j < w; j++)
        any_nan |= fac[j] != fac[j];
    for (int64_t j = 0; any_nan && j < w; j++)
        if (fac[j] != fac[j])
            lsc_mx_nan_fill(fac[j], elem, flags, q + j, elem == LSC_MX_E2M1 ? block / 2 : block,
                            ld);
}

/* The column amaxes of a tile of `block` rows by w columns into m (zeroed),
 * read row by row, NaN elements left out with skip (a constant). */
LSC_MX_INL void lsc_mx_col_amaxes(const char *xt, int64_t block, int64_t w, int64_t rs, int code,
                                  int skip, lsc_u32 *m)
{
    for (int64_t i = 0; i < block; i++) {
        for (int64_t j = 0; j < w; j++) {
            lsc_u32 a = lsc_mx_abs_bits(lsc_mx_load(xt + i * rs, j, code), skip);
            m[j] = a > m[j] ? a : m[j];
        }
    }
}

/* A rows x cols view (rows a multiple of the block; rows rs bytes apart,
 * contiguous elements) with blocks along the first axis: (rows / block) x
 * cols scale codes into s, the codes into q (rows x cols; E2M1 (rows / 2) x
 * cols), both with rows ld bytes apart.  Per tile of `block` rows by up to
 * LSC_MX_TILE columns: the column amaxes, row by row; the scales and
 * factors across the columns; then the codes, the tile read again from L1. */
LSC_MX_INL void lsc_mx_cols_body(const char *x, int64_t rows, int64_t cols, int64_t rs,
                                 int64_t ld, int code, int elem, const lsc_mx_rule *k,
                                 unsigned char *s, unsigned char *q)
{
    lsc_u32 m[LSC_MX_TILE], sc[LSC_MX_TILE];
    float fac[LSC_MX_TILE];
    const int64_t block = k->block;
    const int flags = lsc_mx_rule_flags(k), skip = lsc_mx_skips_nan(k);
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
        for (int64_t c0 = 0; c0 < cols; c0 += LSC_MX_TILE) {
            const int64_t w = cols - c0 < LSC_MX_TILE ? cols - c0 : LSC_MX_TILE;
            const char *xt = x + r0 * rs + c0 * LSC_MX_WIDTH(code);
            for (int64_t j = 0; j < w; j++)
                m[j] = 0;
            if (skip)
                lsc_mx_col_amaxes(xt, block, w, rs, code, 1, m);
            else
                lsc_mx_col_amaxes(xt, block, w, rs, code, 0, m);
            lsc_mx_group_scales(m, w, k, sc, fac);
            for (int64_t j = 0; j < w; j++)
                lsc_mx_put_scale(s, (r0 / block) * ld + c0 + j, sc[j], k->swidth);
            unsigned char *qt = q + (elem == LSC_MX_E2M1 ? r0 / 2 : r0) * ld + c0;
            lsc_mx_cols_narrow(xt, block, w, rs, ld, code, elem, flags, fac, qt);
            for (int64_t j = 0; k->mode == LSC_MX_AO32 && j < w; j++)
                if (fac[j] == 0.0f)
                    lsc_mx_zero_fix(xt + j * LSC_MX_WIDTH(code), code, elem, block, rs, qt + j,
                                    ld);
        }
    }
}

/* The n bytes at p + off prefetched, off bytes on: the same row of the next
 * band of tiles, while this band's codes are made from cache.  A band's two
 * passes are a read of memory with little to compute, then a computation
 * from cache: the prefetch lets the second overlap the next band's reads
 * (float32 128x128 tiles at 1e8 elements: 1.25x the rows pass's time
 * without, 1.08x with; bfloat16 1.08x and 1.0x).  In integers: the next band
 * may lie past the input, where a prefetch does not fault. */
LSC_MX_INL void lsc_mx_prefetch_next(const void *p, int64_t off, int64_t n)
{
    for (int64_t l = 0; l < n; l += 64)
        __builtin_prefetch((const void *)((uintptr_t)p + (uintptr_t)(off + l)));
}

/* A band of h <= t rows by w <= LSC_MX_SQ_SPAN columns of square tiles of
 * side t = k->block (rows rs bytes apart, contiguous elements; a partial
 * tile at the right or bottom edge has the elements it has): ceil(w / t)
 * scales into s, float8 codes into q (rows ld bytes apart).  The tile
 * amaxes row by row (each row's w elements read in order), the scales and
 * factors across the tiles, then the codes row by row with the factors
 * spread per element, the band read again from cache (LSC_MX_SQ_SPAN keeps
 * it in L2 or L3; tiles of 128: the next band's rows prefetched meanwhile,
 * lsc_mx_prefetch_next); then the tiles whose factor is NaN, or torchao's 0, rewritten. */
LSC_MX_INL void lsc_mx_tile_body(const char *x, int64_t h, int64_t w, int64_t rs, int64_t ld,
                                 int code, int elem, const lsc_mx_rule *k, unsigned char *s,
                                 unsigned char *q)
{
    const int64_t t = k->block, nt = (w + t - 1) / t, W = LSC_MX_WIDTH(code);
    const int flags = lsc_mx_rule_flags(k), skip = lsc_mx_skips_nan(k);
    lsc_u32 m[LSC_MX_SQ_SPAN / 2], sc[LSC_MX_SQ_SPAN / 2];
    float r[LSC_MX_SQ_SPAN / 2], fr[LSC_MX_SQ_SPAN];
    for (int64_t g = 0; g < nt; g++)
        m[g] = 0;
    for (int64_t i = 0; i < h; i++) {
        const char *row = x + i * rs;
        for (int64_t g = 0; g < nt; g++) {
            const int64_t c0 = g * t, n = w - c0 < t ? w - c0 : t;
            lsc_u32 mb = m[g];
            if (skip) {
                for (int64_t j = 0; j < n; j++) {
                    lsc_u32 a = lsc_mx_abs_bits(lsc_mx_load(row, c0 + j, code), 1);
                    mb = a > mb ? a : mb;
                }
            } else {
                for (int64_t j = 0; j < n; j++) {
                    lsc_u32 a = lsc_mx_abs_bits(lsc_mx_load(row, c0 + j, code), 0);
                    mb = a > mb ? a : mb;
                }
            }
            m[g] = mb;
        }
    }
    lsc_mx_group_scales(m, nt, k, sc, r);
    for (int64_t g = 0; g < nt; g++)
        lsc_mx_put_scale(s, g, sc[g], k->swidth);
    if (t == 128) {   /* a row's tiles: 8 vectors each, one factor */
        for (int64_t i = 0; i < h; i++)
            for (int64_t g = 0; g < nt; g++) {
                const int64_t c0 = g * t, n = w - c0 < t ? w - c0 : t;
                const char *xs = x + i * rs + c0 * W;
                if (flags & LSC_FP8_NAN_SIGN)
                    lsc_mx_fp8_codes_r(xs, n, code, elem, LSC_FP8_SAT | LSC_FP8_NAN_SIGN, r[g],
                                       q + i * ld + c0);
                else
                    lsc_mx_fp8_codes_r(xs, n, code, elem, LSC_FP8_SAT, r[g], q + i * ld + c0);
                lsc_mx_prefetch_next(xs, t * rs, n * W);
            }
    } else {
        for (int64_t c = 0; c < w; c++)
            fr[c] = r[c / t];
        for (int64_t i = 0; i < h; i++)
            lsc_mx_spread_codes(x + i * rs, w, code, elem, flags, fr, q + i * ld);
    }
    for (int64_t g = 0; g < nt; g++) {
        const int64_t c0 = g * t, n = w - c0 < t ? w - c0 : t;
        for (int64_t i = 0; i < h; i++) {
            if (r[g] != r[g])
                lsc_mx_nan_fill(r[g], elem, flags, q + i * ld + c0, n, 1);
            else if (r[g] == 0.0f && k->mode == LSC_MX_AO32)
                lsc_mx_zero_fix(x + i * rs + c0 * W, code, elem, n, W, q + i * ld + c0, 1);
        }
    }
}

#ifdef LSC_MX_BF16_LANES
/* ---- x86-64-v4: float8 codes of bfloat16 in 16-bit lanes ------------------
 * The passes above widen every bfloat16 to float32, multiply and narrow in
 * 32-bit lanes: about 20 vector operations per 16 elements, three times the
 * memory floor at 1e8 elements.  Where a block's factor r is a power of two
 * 2**k, x * r only moves a bfloat16's exponent, so one AVX-512BW vector
 * holds a whole block of 32 and the narrowing is done on the bfloat16 bits
 * themselves, y = |x| + (k << 7), in 16-bit lanes:
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
 * in it, RCEIL's NaN descale, a factor 2**-127, ...) takes the float32
 * path (lsc_mx_bf16_block_codes, lsc_mx_cols_narrow).  Checked for every
 * finite bfloat16 at every such k in both formats, and by the passes'
 * tests at every level. */
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

/* The lanes of a (16-bit magnitudes) with the NaNs zeroed: TE's amax leaves them out. */
LSC_MX_INL __m512i lsc_mx_bf16_no_nan(__m512i a)
{
    return _mm512_maskz_mov_epi16(_mm512_cmple_epu16_mask(a, _mm512_set1_epi16(0x7F80)), a);
}

/* The float8 codes of one bfloat16 block of 32 that is not plain, by the
 * float32 path (out of line: blocks with a NaN or Inf, or extreme factors). */
LSC_MX_COLD void lsc_mx_bf16_block_codes(const uint16_t *x, int elem, int flags, float r,
                                         unsigned char *q)
{
    if (r != r) {
        lsc_mx_nan_fill(r, elem, flags, q, 32, 1);
        return;
    }
    for (int64_t j = 0; j < 32; j++)
        q[j] = (unsigned char)lsc_fp8_from_f32(lsc_bf16_to_f32(x[j]) * r, elem, flags);
}

/* A contiguous bfloat16 row of MX blocks of 32: per group of blocks the
 * amaxes (16-bit lanes; the float32 amax bits are m << 16; TE's modes leave
 * NaN lanes out, and a block is plain only when its largest lane, NaN
 * included, is finite), the scales and factors as lsc_mx_row_body takes
 * them, then each block's codes, by lsc_mx_bf16x32 where the block is plain. */
LSC_MX_INL void lsc_mx_bf16_row(const char *xc, int64_t n, int elem, const lsc_mx_rule *k,
                                unsigned char *s, unsigned char *q)
{
    const uint16_t *x = (const uint16_t *)xc;
    const __m512i mask = _mm512_set1_epi16(0x7FFF);
    const int flags = lsc_mx_rule_flags(k), skip = lsc_mx_skips_nan(k);
    const int64_t nb = n / 32;
    for (int64_t b0 = 0; b0 < nb; b0 += LSC_MX_GROUP) {
        const int64_t g = nb - b0 < LSC_MX_GROUP ? nb - b0 : LSC_MX_GROUP;
        const uint16_t *xg = x + b0 * 32;
        lsc_u32 m[LSC_MX_GROUP], raw[LSC_MX_GROUP], sc[LSC_MX_GROUP];
        lsc_i32 k7[LSC_MX_GROUP];
        unsigned char plain[LSC_MX_GROUP];
        float r[LSC_MX_GROUP];
        for (int64_t b = 0; b < g; b++) {
            const __m512i a = _mm512_and_si512(_mm512_loadu_si512(xg + 32 * b), mask);
            raw[b] = lsc_mx_umax16(a) << 16;
            m[b] = skip ? lsc_mx_umax16(lsc_mx_bf16_no_nan(a)) << 16 : raw[b];
        }
        lsc_mx_group_scales(m, g, k, sc, r);
        for (int64_t b = 0; b < g; b++) {
            plain[b] = (unsigned char)lsc_mx_bf16_plain(r[b], raw[b], &k7[b]);
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
                lsc_mx_bf16_block_codes(xg + 32 * b, elem, flags, r[b], q + (b0 + b) * 32);
    }
}

/* A bfloat16 view of rows x cols (rows rs bytes apart, contiguous elements)
 * with MX blocks of 32 along the columns, the float8 codes of each tile (32
 * rows by up to LSC_MX_TILE columns) as lsc_mx_cols_body makes them, in
 * 16-bit lanes, the tile read row by row: the column amaxes of 32 columns in
 * one vector, the scales and factors across the tile's columns, then where a
 * vector's 32 blocks are all plain its codes by lsc_mx_bf16x32 with a factor
 * per lane (the last, partial vector masked); the others by
 * lsc_mx_cols_narrow. */
LSC_MX_INL void lsc_mx_bf16_cols(const char *x, int64_t rows, int64_t cols, int64_t rs,
                                 int64_t ld, int elem, const lsc_mx_rule *k, unsigned char *s,
                                 unsigned char *q)
{
    enum { NV = LSC_MX_TILE / 32 };
    const __m512i mask = _mm512_set1_epi16(0x7FFF);
    const int flags = lsc_mx_rule_flags(k), skip = lsc_mx_skips_nan(k);
    lsc_u32 m[LSC_MX_TILE], raw[LSC_MX_TILE], sc[LSC_MX_TILE];
    float r[LSC_MX_TILE];
    for (int64_t r0 = 0; r0 < rows; r0 += 32) {
        for (int64_t c0 = 0; c0 < cols; c0 += LSC_MX_TILE) {
            const int64_t w = cols - c0 < LSC_MX_TILE ? cols - c0 : LSC_MX_TILE;
            const int64_t nv = (w + 31) / 32;
            const __mmask32 last = w % 32 ? ((__mmask32)1 << (w % 32)) - 1 : ~(__mmask32)0;
            const char *xt = x + r0 * rs + c0 * 2;
            unsigned char *qt = q + r0 * ld + c0;
            __m512i acc[NV], accn[NV], kv[NV];
            int plain[NV];
            /* the amaxes row by row (each row's 2 * w bytes in order); TE's
               modes leave NaN lanes out (accn), plain asks all lanes finite */
            for (int64_t v = 0; v < nv; v++)
                acc[v] = accn[v] = _mm512_setzero_si512();
            for (int64_t i = 0; i < 32; i++)
                for (int64_t v = 0; v < nv; v++) {
                    const __m512i a = _mm512_and_si512(
                        _mm512_maskz_loadu_epi16(v == nv - 1 ? last : ~(__mmask32)0,
                                                 xt + i * rs + v * 64),
                        mask);
                    acc[v] = _mm512_max_epu16(acc[v], a);
                    if (skip)
                        accn[v] = _mm512_max_epu16(accn[v], lsc_mx_bf16_no_nan(a));
                }
            for (int64_t v = 0; v < nv; v++) {
                uint16_t t[32], tn[32];
                _mm512_storeu_si512(t, acc[v]);
                _mm512_storeu_si512(tn, skip ? accn[v] : acc[v]);
                for (int64_t l = 0; l < 32 && v * 32 + l < w; l++) {
                    raw[v * 32 + l] = (lsc_u32)t[l] << 16;
                    m[v * 32 + l] = (lsc_u32)tn[l] << 16;
                }
            }
            lsc_mx_group_scales(m, w, k, sc, r);
            for (int64_t j = 0; j < w; j++)
                s[(r0 / 32) * ld + c0 + j] = (unsigned char)sc[j];
            for (int64_t v = 0; v < nv; v++) {
                int16_t k7[32] = {0};
                plain[v] = 1;
                for (int64_t l = 0; l < 32 && v * 32 + l < w; l++) {
                    lsc_i32 kl;
                    plain[v] &= lsc_mx_bf16_plain(r[v * 32 + l], raw[v * 32 + l], &kl);
                    k7[l] = (int16_t)kl;
                }
                kv[v] = _mm512_loadu_si512(k7);
            }
            /* the codes row by row: the plain vectors in 16-bit lanes, then the others */
            for (int64_t i = 0; i < 32; i++)
                for (int64_t v = 0; v < nv; v++)
                    if (plain[v])
                        _mm256_mask_storeu_epi8(
                            qt + i * ld + v * 32, v == nv - 1 ? last : ~(__mmask32)0,
                            lsc_mx_bf16x32(_mm512_maskz_loadu_epi16(
                                               v == nv - 1 ? last : ~(__mmask32)0,
                                               xt + i * rs + v * 64),
                                           kv[v], elem));
            for (int64_t v = 0; v < nv; v++) {
                const int64_t n = w - v * 32 < 32 ? w - v * 32 : 32;
                if (!plain[v])
                    lsc_mx_cols_narrow(xt + v * 64, 32, n, rs, ld, LSC_CODE_BF16, elem, flags,
                                       r + v * 32, qt + v * 32);
            }
        }
    }
}

/* ---- x86-64-v4: TE's blockwise FP8 of bfloat16 in 16-bit lanes -------------
 * TE's power-of-two scales (te-fp32 with pow2) make every factor a power of
 * two, so a segment of up to 128 elements (a block of a row, or a row of a
 * 128x128 tile) narrows by lsc_mx_bf16x32 where it is plain (its scale's
 * exponent step fits, no Inf and no NaN in it: TE's amax skips NaN
 * elements, so a NaN is looked for beside the amax); the others take the
 * float32 path (lsc_mx_bf16_seg_cold), which gives the same codes. */

/* The amax bits (as float32's: m << 16) of n <= 128 bfloat16 values, NaN
 * skipped (TE's fmaxf), and into *nan whether one is NaN. */
LSC_MX_INL lsc_u32 lsc_mx_bf16_amax_n(const uint16_t *x, int64_t n, int *nan)
{
    const __m512i mask = _mm512_set1_epi16(0x7FFF), inf = _mm512_set1_epi16(0x7F80);
    __m512i skip = _mm512_setzero_si512(), raw = _mm512_setzero_si512();
    for (int64_t v = 0; v * 32 < n; v++) {
        const __mmask32 mk = n - 32 * v >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << (n - 32 * v)) - 1;
        const __m512i a = _mm512_and_si512(_mm512_maskz_loadu_epi16(mk, x + 32 * v), mask);
        raw = _mm512_max_epu16(raw, a);
        skip = _mm512_max_epu16(skip, _mm512_maskz_mov_epi16(_mm512_cmple_epu16_mask(a, inf), a));
    }
    *nan = lsc_mx_umax16(raw) > 0x7F80u;
    return lsc_mx_umax16(skip) << 16;
}

/* The float8 codes of a segment that is not plain, by the float32 path (TE's flags). */
LSC_MX_COLD void lsc_mx_bf16_seg_cold(const uint16_t *x, int64_t n, int elem, float r,
                                      unsigned char *q)
{
    lsc_mx_fp8_codes_r((const char *)x, n, LSC_CODE_BF16, elem, LSC_FP8_SAT, r, q);
}

/* The float8 codes of n <= 128 bfloat16 values of a plain segment, whose factor's exponent
 * step is k7 (lsc_mx_bf16_plain): whole vectors for a whole segment (masked stores of
 * narrowed lanes are slow: 1.4x the time of the tile pass in cache), else masked. */
LSC_MX_INL void lsc_mx_bf16_seg_plain(const uint16_t *x, int64_t n, int elem, lsc_i32 k7,
                                      unsigned char *q)
{
    const __m512i kv = _mm512_set1_epi16((short)k7);
    if (n == 128) {
        for (int64_t v = 0; v < 4; v++)
            _mm256_storeu_si256((__m256i *)(q + 32 * v),
                                lsc_mx_bf16x32(_mm512_loadu_si512(x + 32 * v), kv, elem));
        return;
    }
    for (int64_t v = 0; v * 32 < n; v++) {
        const __mmask32 mk = n - 32 * v >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << (n - 32 * v)) - 1;
        _mm256_mask_storeu_epi8(q + 32 * v, mk,
                                lsc_mx_bf16x32(_mm512_maskz_loadu_epi16(mk, x + 32 * v), kv, elem));
    }
}

/* The float8 codes of n <= 128 bfloat16 values times the power of two r (amax bits m,
 * `nan`: one is NaN): in 16-bit lanes where plain, else by the float32 path. */
LSC_MX_INL void lsc_mx_bf16_seg(const uint16_t *x, int64_t n, int elem, float r, lsc_u32 m,
                                int nan, unsigned char *q)
{
    lsc_i32 k7;
    if (nan || !lsc_mx_bf16_plain(r, m, &k7))
        lsc_mx_bf16_seg_cold(x, n, elem, r, q);
    else
        lsc_mx_bf16_seg_plain(x, n, elem, k7, q);
}

/* A contiguous bfloat16 row of blocks of 128 under TE's power-of-two rule: per group of
 * blocks the amaxes, the scales and factors (lsc_mx_group_scales), then each block's
 * codes (lsc_mx_bf16_seg). */
LSC_MX_INL void lsc_mx_bf16_row128(const char *xc, int64_t n, int elem, const lsc_mx_rule *k,
                                   unsigned char *s, unsigned char *q)
{
    const uint16_t *x = (const uint16_t *)xc;
    const int64_t nb = n / 128;
    for (int64_t b0 = 0; b0 < nb; b0 += LSC_MX_GROUP) {
        const int64_t g = nb - b0 < LSC_MX_GROUP ? nb - b0 : LSC_MX_GROUP;
        lsc_u32 m[LSC_MX_GROUP], sc[LSC_MX_GROUP];
        float r[LSC_MX_GROUP];
        int nan[LSC_MX_GROUP];
        for (int64_t b = 0; b < g; b++)
            m[b] = lsc_mx_bf16_amax_n(x + (b0 + b) * 128, 128, &nan[b]);
        lsc_mx_group_scales(m, g, k, sc, r);
        for (int64_t b = 0; b < g; b++) {
            lsc_mx_put_scale(s, b0 + b, sc[b], 4);
            lsc_mx_bf16_seg(x + (b0 + b) * 128, 128, elem, r[b], m[b], nan[b], q + (b0 + b) * 128);
        }
    }
}

/* A band of h <= 128 bfloat16 rows by w <= LSC_MX_SQ_SPAN columns of 128x128 tiles under
 * TE's power-of-two rule (lsc_mx_tile_body's layout): each tile's amax and NaN over its
 * rows, the scales and factors, then each row's segments: in 16-bit lanes where the tile
 * is plain (lsc_mx_bf16_seg_plain), else by the float32 path, the next band's row
 * prefetched (lsc_mx_prefetch_next). */
LSC_MX_INL void lsc_mx_bf16_tile128(const char *xc, int64_t h, int64_t w, int64_t rs,
                                    int64_t ld, int elem, const lsc_mx_rule *k,
                                    unsigned char *s, unsigned char *q)
{
    enum { NT = LSC_MX_SQ_SPAN / 128 };
    const int64_t nt = (w + 127) / 128;
    lsc_u32 m[NT] = {0}, sc[NT];
    float r[NT];
    int nan[NT] = {0}, plain[NT];
    lsc_i32 k7[NT];
    for (int64_t i = 0; i < h; i++) {
        const uint16_t *row = (const uint16_t *)(xc + i * rs);
        for (int64_t g = 0; g < nt; g++) {
            int nn;
            const int64_t c0 = g * 128, n = w - c0 < 128 ? w - c0 : 128;
            const lsc_u32 mm = lsc_mx_bf16_amax_n(row + c0, n, &nn);
            m[g] = mm > m[g] ? mm : m[g];
            nan[g] |= nn;
        }
    }
    lsc_mx_group_scales(m, nt, k, sc, r);
    for (int64_t g = 0; g < nt; g++) {
        lsc_mx_put_scale(s, g, sc[g], 4);
        plain[g] = !nan[g] && lsc_mx_bf16_plain(r[g], m[g], &k7[g]);
    }
    for (int64_t i = 0; i < h; i++) {
        const uint16_t *row = (const uint16_t *)(xc + i * rs);
        for (int64_t g = 0; g < nt; g++) {
            const int64_t c0 = g * 128, n = w - c0 < 128 ? w - c0 : 128;
            if (plain[g])
                lsc_mx_bf16_seg_plain(row + c0, n, elem, k7[g], q + i * ld + c0);
            else
                lsc_mx_bf16_seg_cold(row + c0, n, elem, r[g], q + i * ld + c0);
            lsc_mx_prefetch_next(row + c0, 128 * rs, 2 * n);
        }
    }
}
#endif /* LSC_MX_BF16_LANES */

/* ---- the level's kernels and its table --------------------------------- */

/* Whether the 16-bit-lane paths take a bfloat16 pass: float8 elements (so
 * not NVFP4) in MX blocks of 32. */
#ifdef LSC_MX_BF16_LANES
/* ... and TE's blockwise FP8 with power-of-two scales, blocks or tiles of 128 */
#define LSC_MX_BF16_BW(CODE, ELEM, k) \
    ((CODE) == LSC_CODE_BF16 && (int)(ELEM) != (int)LSC_MX_E2M1 && (k)->block == 128 \
     && (k)->mode == LSC_MX_TE32 && (k)->pow2)
#define LSC_MX_BF16_PASS(CODE, ELEM, k) \
    ((CODE) == LSC_CODE_BF16 && (int)(ELEM) != (int)LSC_MX_E2M1 && (k)->block == 32 \
     && !lsc_mx_wide((k)->mode))
#else
#define LSC_MX_BF16_PASS(CODE, ELEM, k) 0
#define LSC_MX_BF16_BW(CODE, ELEM, k) 0
#endif

#define LSC_MX_FNS(NAME, CODE, ELEM)                                                        \
    __attribute__((flatten)) static void lsc_mx_r_##NAME(                                 \
        const char *x, int64_t n, const lsc_mx_rule *k, unsigned char *s, unsigned char *q) \
    {                                                                                       \
        if (LSC_MX_BF16_BW(CODE, ELEM, k))                                                  \
            LSC_MX_BF16_CALL(lsc_mx_bf16_row128(x, n, (ELEM), k, s, q));                    \
        else if (LSC_MX_BF16_PASS(CODE, ELEM, k))                                           \
            LSC_MX_BF16_CALL(lsc_mx_bf16_row(x, n, (ELEM), k, s, q));                       \
        else                                                                                \
            lsc_mx_row_body(x, n, (CODE), (ELEM), k, s, q);                                 \
    }                                                                                       \
    __attribute__((flatten)) static void lsc_mx_c_##NAME(                                 \
        const char *x, int64_t rows, int64_t cols, int64_t rs, int64_t ld,                  \
        const lsc_mx_rule *k, unsigned char *s, unsigned char *q)                           \
    {                                                                                       \
        if (LSC_MX_BF16_PASS(CODE, ELEM, k))                                                \
            LSC_MX_BF16_CALL(lsc_mx_bf16_cols(x, rows, cols, rs, ld, (ELEM), k, s, q));     \
        else                                                                                \
            lsc_mx_cols_body(x, rows, cols, rs, ld, (CODE), (ELEM), k, s, q);               \
    }
#ifdef LSC_MX_BF16_LANES
#define LSC_MX_BF16_CALL(CALL) CALL
#else
#define LSC_MX_BF16_CALL(CALL) (void)0
#endif
#define LSC_MX_ELEM_FNS(E, ELEM)                                                            \
    LSC_MX_FNS(E##_f32, LSC_CODE_F32, ELEM)                                                 \
    LSC_MX_FNS(E##_f16, LSC_CODE_F16, ELEM)                                                 \
    LSC_MX_FNS(E##_bf16, LSC_CODE_BF16, ELEM)
#define LSC_MX_ROW(E) {0, lsc_mx_r_##E##_f16, lsc_mx_r_##E##_bf16, lsc_mx_r_##E##_f32, 0, 0, 0}
#define LSC_MX_COL(E) {0, lsc_mx_c_##E##_f16, lsc_mx_c_##E##_bf16, lsc_mx_c_##E##_f32, 0, 0, 0}
#define LSC_MX_TILE_FN(NAME, CODE, ELEM)                                                    \
    __attribute__((flatten)) static void lsc_mx_t_##NAME(                                 \
        const char *x, int64_t rows, int64_t cols, int64_t rs, int64_t ld,                  \
        const lsc_mx_rule *k, unsigned char *s, unsigned char *q)                           \
    {                                                                                       \
        if (LSC_MX_BF16_BW(CODE, ELEM, k))                                                  \
            LSC_MX_BF16_CALL(lsc_mx_bf16_tile128(x, rows, cols, rs, ld, (ELEM), k, s, q));  \
        else                                                                                \
            lsc_mx_tile_body(x, rows, cols, rs, ld, (CODE), (ELEM), k, s, q);               \
    }
#define LSC_MX_TILE_FNS(E, ELEM)                                                            \
    LSC_MX_TILE_FN(E##_f32, LSC_CODE_F32, ELEM)                                             \
    LSC_MX_TILE_FN(E##_f16, LSC_CODE_F16, ELEM)                                             \
    LSC_MX_TILE_FN(E##_bf16, LSC_CODE_BF16, ELEM)
#define LSC_MX_TIL(E) {0, lsc_mx_t_##E##_f16, lsc_mx_t_##E##_bf16, lsc_mx_t_##E##_f32, 0, 0, 0}

LSC_MX_ELEM_FNS(e4, LSC_CODE_E4M3FN)
LSC_MX_ELEM_FNS(e5, LSC_CODE_E5M2)
LSC_MX_ELEM_FNS(e2, LSC_MX_E2M1)
LSC_MX_TILE_FNS(e4, LSC_CODE_E4M3FN)
LSC_MX_TILE_FNS(e5, LSC_CODE_E5M2)

LSC_ISA_TABLE const lsc_mx_isa LSC_MX_CAT(lsc_mx_isa, LSC_LEVEL) = {
    LSC_MX_STR(LSC_LEVEL),
    {LSC_MX_ROW(e4), LSC_MX_ROW(e5), LSC_MX_ROW(e2)},
    {LSC_MX_COL(e4), LSC_MX_COL(e5), LSC_MX_COL(e2)},
    {LSC_MX_TIL(e4), LSC_MX_TIL(e5)},
};
