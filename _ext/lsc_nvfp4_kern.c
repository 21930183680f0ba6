/* lsc_nvfp4_kern.c: lsc_nvfp4_cpu.h's passes over contiguous rows, for one
 * ISA level.
 *
 * Design: setup.py compiles this file once for each level of lsc_isa.h with
 * that level's target flags and -DLSC_LEVEL=<its name>, as lsc_mx_kern.c,
 * and links the objects into the _nvfp4 extension; each defines the table
 * lsc_nv4_isa_<name> that lsc_nvfp4_cpu.h picks at run time.  Every loop
 * runs across the lanes of a group (blocks, columns) with the scalar rules
 * of lsc_nvfp4.h inlined, written with selects so that the compiler
 * vectorises it at the level's width: the Philox rounds across a group's
 * draws, the Hadamard butterflies down the 16 rows of a band's columns (a
 * column per lane, no shuffles), the scales and the codes. */
#include <string.h>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "lsc_nvfp4.h"

#ifndef LSC_LEVEL
#error "compile with -DLSC_LEVEL=<level name> (setup.py does)"
#endif
#define LSC_NV4_CAT2(a, b) a##_##b
#define LSC_NV4_CAT(a, b) LSC_NV4_CAT2(a, b)
#define LSC_NV4_STR2(a) #a
#define LSC_NV4_STR(a) LSC_NV4_STR2(a)
#define LSC_NV4_INL static inline __attribute__((always_inline))

LSC_NV4_INL float lsc_nv4_load(const char *x, int64_t i, int code)
{
    return lsc_fp8_load(x, i, LSC_MX_WIDTH(code), code);
}

/* |v| as bits for a NaN-free amax: a NaN counts as 0 (TE's fmaxf). */
LSC_NV4_INL lsc_u32 lsc_nv4_abs(float v)
{
    const lsc_u32 a = lsc_f32_bits(v) & 0x7FFFFFFFu;
    return a <= 0x7F800000u ? a : 0u;
}

/* lsc_nv4_sr's code of v with the random byte r & 0xFF, in fewer vector
 * operations (the same bits): u * step(abs(v)) is float(r) * 2**(E - 136), E
 * the exponent of abs(v) clamped to 127..129 (the product is exact, as the
 * rule's); and the code of t = abs(v) + u * step(abs(v)) >= 0.5 is read off
 * its exponent e and first mantissa bit m, t >> 22 = 2 * e + m: 1 for
 * [0.5, 1), then 2 * (e - 126) + m (2, 3 for [1, 2); 4, 5 for [2, 4); 6, 7
 * for [4, 8)), 7 beyond (Inf, NaN); 0 below 0.5. */
LSC_NV4_INL lsc_u32 lsc_nv4_sr_fast(float v, lsc_u32 r)
{
    const lsc_u32 bits = lsc_f32_bits(v), ab = bits & 0x7FFFFFFFu;
    lsc_u32 e = ab & 0x7F800000u;
    e = e > 0x3F800000u ? e : 0x3F800000u;
    e = e < 0x40800000u ? e : 0x40800000u;
    const float t = lsc_f32_from_bits(ab) + (float)(lsc_i32)(r & 0xFFu) * lsc_f32_from_bits(e - (9u << 23));
    const lsc_u32 tb = lsc_f32_bits(t);
    lsc_i32 c = (lsc_i32)(tb >> 22) - 252;
    c = c > 1 ? c : 1;
    c = c < 7 ? c : 7;
    const lsc_u32 code = (lsc_u32)c & -(lsc_u32)(tb >= 0x3F000000u);
    const lsc_u32 keep = -(lsc_u32)(ab <= 0x7F800000u);   /* a NaN rounds to +6 */
    return code | ((bits >> 28) & 8u & keep);
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the random bytes are read as the bytes of their words (little-endian)"
#endif

/* GCC's vector types of LSC_NV4_LANES lanes, one register of the level
 * (AVX-512: 16, AVX2: 8, SSE and elsewhere: 4).  A band's transform holds 16
 * rows of them, which 16 registers hold at one register a row and not at
 * two (16 lanes on AVX2 spilled: the te-nvfp4 gradient quantize of
 * 2048 x 2048 took 11.2 ms, with 8 lanes 4.5 ms); the Philox state is 4 of
 * them a set. */
#if defined(__AVX512F__)
#define LSC_NV4_LANES 16
#elif defined(__AVX2__)
#define LSC_NV4_LANES 8
#else
#define LSC_NV4_LANES 4
#endif
typedef float lsc_nv4_vf __attribute__((vector_size(4 * LSC_NV4_LANES)));
typedef lsc_u32 lsc_nv4_vu __attribute__((vector_size(4 * LSC_NV4_LANES)));
typedef lsc_i32 lsc_nv4_vi __attribute__((vector_size(4 * LSC_NV4_LANES)));
typedef lsc_u16 lsc_nv4_vh __attribute__((vector_size(2 * LSC_NV4_LANES)));

/* LSC_NV4_LANES / 2 lanes of two words: a 32 x 32 -> 64 bit product per lane
 * of its low word and c (vpmuludq at each x86 level, where GCC's generic
 * product of 64-bit lanes is vpmullq or three multiplies). */
typedef lsc_u64 lsc_nv4_vq __attribute__((vector_size(4 * LSC_NV4_LANES)));

LSC_NV4_INL void lsc_nv4_mul32(lsc_nv4_vq *a, lsc_u32 c)
{
#if defined(__AVX512F__)
    __m512i h;
    memcpy(&h, a, sizeof h);
    h = _mm512_mul_epu32(h, _mm512_set1_epi64((long long)c));
    memcpy(a, &h, sizeof h);
#elif defined(__AVX2__)
    __m256i h;
    memcpy(&h, a, sizeof h);
    h = _mm256_mul_epu32(h, _mm256_set1_epi64x((long long)c));
    memcpy(a, &h, sizeof h);
#elif defined(__SSE2__)
    __m128i h;
    memcpy(&h, a, sizeof h);
    h = _mm_mul_epu32(h, _mm_set1_epi64x((long long)c));
    memcpy(a, &h, sizeof h);
#else
    *a = (*a & 0xFFFFFFFFull) * (lsc_u64)c;
#endif
}

/* The low and high words of c times each lane of x, lane for lane: the
 * even lanes' products and the odd lanes' (shifted down), put back together. */
LSC_NV4_INL void lsc_nv4_mulhilo(const lsc_nv4_vu *x, lsc_u32 c, lsc_nv4_vu *lo,
                                 lsc_nv4_vu *hi)
{
    lsc_nv4_vq pe, po;
    memcpy(&pe, x, sizeof pe);
    po = pe >> 32;
    lsc_nv4_mul32(&pe, c);
    lsc_nv4_mul32(&po, c);
    const lsc_nv4_vq l = (pe & 0xFFFFFFFFull) | (po << 32);
    const lsc_nv4_vq h = (pe >> 32) | (po & 0xFFFFFFFF00000000ull);
    memcpy(lo, &l, sizeof l);
    memcpy(hi, &h, sizeof h);
}

/* The ten rounds of U sets of LSC_NV4_LANES draws, their rounds interleaved
 * (one set's chain of products alone leaves the multiplier idle): the draws
 * sub + (b + l) * stride, l < LSC_NV4_LANES * U, into w as lsc_nv4_draws's. */
#define LSC_NV4_DRAWS_U(U)                                                                   \
    LSC_NV4_INL void lsc_nv4_draws_x##U(lsc_u64 sub, lsc_u64 stride, int64_t n, int64_t b,   \
                                        const lsc_nv4_rule *k, lsc_u32 *w)                    \
    {                                                                                        \
        lsc_u32 lo[LSC_NV4_LANES * U], hi[LSC_NV4_LANES * U];                                \
        for (int l = 0; l < LSC_NV4_LANES * U; l++) {                                        \
            const lsc_u64 sb = sub + (lsc_u64)(b + l) * stride;                              \
            lo[l] = (lsc_u32)sb;                                                             \
            hi[l] = (lsc_u32)(sb >> 32);                                                     \
        }                                                                                    \
        lsc_nv4_vu x[U], y[U], z[U], v[U];                                                   \
        for (int u = 0; u < U; u++) {                                                        \
            x[u] = (lsc_nv4_vu){0} + k->ofs[0];                                              \
            y[u] = (lsc_nv4_vu){0} + k->ofs[1];                                              \
            memcpy(&z[u], lo + LSC_NV4_LANES * u, sizeof z[u]);                              \
            memcpy(&v[u], hi + LSC_NV4_LANES * u, sizeof v[u]);                              \
        }                                                                                    \
        lsc_u32 k0 = k->key[0], k1 = k->key[1];                                              \
        for (int r = 0; r < 10; r++) {                                                       \
            for (int u = 0; u < U; u++) {                                                    \
                lsc_nv4_vu l0, h0, l1, h1;                                                   \
                lsc_nv4_mulhilo(&x[u], 0xD2511F53u, &l0, &h0);                               \
                lsc_nv4_mulhilo(&z[u], 0xCD9E8D57u, &l1, &h1);                               \
                x[u] = h1 ^ y[u] ^ k0;                                                       \
                z[u] = h0 ^ v[u] ^ k1;                                                       \
                y[u] = l1;                                                                   \
                v[u] = l0;                                                                   \
            }                                                                                \
            k0 += 0x9E3779B9u;                                                               \
            k1 += 0xBB67AE85u;                                                               \
        }                                                                                    \
        for (int u = 0; u < U; u++) {                                                        \
            memcpy(w + b + LSC_NV4_LANES * u, &x[u], sizeof x[u]);                           \
            memcpy(w + n + b + LSC_NV4_LANES * u, &y[u], sizeof y[u]);                       \
            memcpy(w + 2 * n + b + LSC_NV4_LANES * u, &z[u], sizeof z[u]);                   \
            memcpy(w + 3 * n + b + LSC_NV4_LANES * u, &v[u], sizeof v[u]);                   \
        }                                                                                    \
    }
LSC_NV4_DRAWS_U(1)
LSC_NV4_DRAWS_U(2)

/* The draws of the n subsequences sub + b * stride: word k of draw b at
 * w[k * n + b] (a lane a draw, so that the rounds and the byte reads
 * vectorise): two sets of LSC_NV4_LANES draws at a time through their ten
 * rounds in registers (two sets' state is 8 vectors; on AVX2 the
 * temporaries spill a little, and one set alone was not measurably
 * faster), then one set, the rest one by one. */
LSC_NV4_INL void lsc_nv4_draws(lsc_u64 sub, lsc_u64 stride, int64_t n, const lsc_nv4_rule *k,
                               lsc_u32 *w)
{
    int64_t b = 0;
    for (; b + 2 * LSC_NV4_LANES <= n; b += 2 * LSC_NV4_LANES)
        lsc_nv4_draws_x2(sub, stride, n, b, k, w);
    for (; b + LSC_NV4_LANES <= n; b += LSC_NV4_LANES)
        lsc_nv4_draws_x1(sub, stride, n, b, k, w);
    for (; b < n; b++) {
        const lsc_u64 sb = sub + (lsc_u64)b * stride;
        lsc_u32 x = k->ofs[0], y = k->ofs[1], z = (lsc_u32)sb, v = (lsc_u32)(sb >> 32);
        lsc_u32 k0 = k->key[0], k1 = k->key[1];
        for (int r = 0; r < 10; r++) {
            const lsc_u64 p0 = (lsc_u64)0xD2511F53u * x, p1 = (lsc_u64)0xCD9E8D57u * z;
            x = (lsc_u32)(p1 >> 32) ^ y ^ k0;
            z = (lsc_u32)(p0 >> 32) ^ v ^ k1;
            y = (lsc_u32)p1;
            v = (lsc_u32)p0;
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        w[b] = x;
        w[n + b] = y;
        w[2 * n + b] = z;
        w[3 * n + b] = v;
    }
}

/* One contiguous row piece: per group of LSC_NV4_GROUP blocks the values,
 * the block amaxes, the scales and factors, the codes, then the pairs. */
LSC_NV4_INL void lsc_nv4_row_body(const char *x, int64_t n, int code, const lsc_nv4_rule *k,
                                  lsc_u64 sub, unsigned char *s, unsigned char *q)
{
    enum { G = LSC_NV4_GROUP };
    const int64_t nb = n / 16;
    for (int64_t b0 = 0; b0 < nb; b0 += G) {
        const int64_t g = nb - b0 < G ? nb - b0 : G, len = 16 * g;
        const char *xg = x + b0 * 16 * LSC_MX_WIDTH(code);
        float v[16 * G], f[16 * G];
        lsc_u32 m[G], sf[G], w[4 * G], words[4 * G];
        lsc_u32 t[16 * G];   /* the codes as words: as bytes the loop spilled on AVX2 */
        const float mult = k->mult, sdec = k->sdec;   /* stores to s may alias *k */
        for (int64_t i = 0; i < len; i++)
            v[i] = lsc_nv4_load(xg, i, code);
        for (int64_t b = 0; b < g; b++) {
            lsc_u32 mb = 0;
            for (int64_t j = 0; j < 16; j++) {
                const lsc_u32 a = lsc_nv4_abs(v[16 * b + j]);
                mb = a > mb ? a : mb;
            }
            m[b] = mb;
        }
        for (int64_t b = 0; b < g; b++)
            sf[b] = lsc_nv4_sf(lsc_f32_from_bits(m[b]), mult);
        for (int64_t b = 0; b < g; b++) {
            const float e = lsc_nv4_enc(sf[b], sdec);
            s[b0 + b] = (unsigned char)sf[b];
            for (int64_t j = 0; j < 16; j++)
                f[16 * b + j] = e;
        }
        if (k->sr) {   /* draw b's 16 bytes in order for block b's elements */
            const unsigned char *rb = (const unsigned char *)words;
            lsc_nv4_draws(sub + (lsc_u64)b0, 1, g, k, w);
            for (int64_t b = 0; b < g; b++)
                for (int64_t j = 0; j < 4; j++)
                    words[4 * b + j] = w[j * g + b];
            for (int64_t i = 0; i < len; i++)
                t[i] = lsc_nv4_sr_fast(v[i] * f[i], rb[i]);
        } else {
            for (int64_t i = 0; i < len; i++)
                t[i] = lsc_nv4_rn(v[i] * f[i]);
        }
        for (int64_t i = 0; i < len / 2; i++)
            q[8 * b0 + i] = (unsigned char)(t[2 * i] | (t[2 * i + 1] << 4));
    }
}

/* ---- the Hadamard transform, LSC_NV4_LANES columns at a time ---------------
 * In the vector types: the 16 rows of LSC_NV4_LANES columns are transformed in
 * registers (the signs, the four butterfly stages, the rounding to bfloat16 as
 * lsc_nv4_bf16 rounds, the column amaxes) and stored once, where a loop per
 * step over the L1 tile took eight passes over it. */

/* The transform of LSC_NV4_LANES bfloat16 columns (row i at x + i * rs) into v (rows
 * LSC_NV4_TILE apart, float32 of the bfloat16 results; a NaN is a NaN there,
 * whose payload the codes and the amax do not read: lsc_nv4_bf16's 0x7FFF is
 * rht_out's), their amax bits, NaN left out, into m.  The rounding adds to
 * the float32 bits: a NaN here comes from a bfloat16 NaN or is the default
 * NaN, both with their low 16 bits clear, so it stays a NaN. */
LSC_NV4_INL void lsc_nv4_rht_lanes(const char *x, int64_t rs, float *v, lsc_u32 *m)
{
    lsc_nv4_vf r[16];
    for (int i = 0; i < 16; i++) {
        lsc_nv4_vh h;
        memcpy(&h, x + i * rs, sizeof h);
        const lsc_nv4_vu u = __builtin_convertvector(h, lsc_nv4_vu) << 16;
        memcpy(&r[i], &u, sizeof u);
        r[i] *= lsc_nv4_sign(i);
    }
#pragma GCC unroll 4
    for (int h = 1; h < 16; h *= 2)
#pragma GCC unroll 8
        for (int i = 0; i < 16; i += 2 * h)
#pragma GCC unroll 8
            for (int j = i; j < i + h; j++) {
                const lsc_nv4_vf p = r[j], q = r[j + h];
                r[j] = p + q;
                r[j + h] = p - q;
            }
    lsc_nv4_vf mf = {0};
    for (int i = 0; i < 16; i++) {
        lsc_nv4_vu xb;
        memcpy(&xb, &r[i], sizeof xb);
        const lsc_nv4_vu wide = (xb + 0x7FFFu + ((xb >> 16) & 1u)) & 0xFFFF0000u;
        const lsc_nv4_vu ab = wide & 0x7FFFFFFFu;
        lsc_nv4_vf af;
        memcpy(&af, &ab, sizeof af);
        memcpy(v + i * LSC_NV4_TILE, &wide, sizeof wide);
        /* a float compare: a NaN is never the greater, and so is left out */
        mf = (lsc_nv4_vf)(((lsc_nv4_vi)af & (af > mf)) | ((lsc_nv4_vi)mf & ~(af > mf)));
    }
    memcpy(m, &mf, sizeof mf);
}

/* The amax of the transform of the lanes r[i] = x_i * s_i / 4 (NaN left out)
 * folded into *mf, without the results themselves and unrounded: the last
 * stage's pair p + q, p - q has the larger magnitude float32(abs(p) + abs(q))
 * (one of the two is that sum, the other's magnitude is not above it, and
 * float32 rounding is monotonic), NaN where either is; rounding to bfloat16
 * is monotonic too, so the amax of the rounded results is this amax rounded
 * once (lsc_nv4_rht_amax).  About half the work of lsc_nv4_rht_lanes. */
LSC_NV4_INL void lsc_nv4_rht_amax_of(lsc_nv4_vf r[16], lsc_nv4_vf *mf)
{
#pragma GCC unroll 3
    for (int h = 1; h < 8; h *= 2)
#pragma GCC unroll 8
        for (int i = 0; i < 16; i += 2 * h)
#pragma GCC unroll 4
            for (int j = i; j < i + h; j++) {
                const lsc_nv4_vf p = r[j], q = r[j + h];
                r[j] = p + q;
                r[j + h] = p - q;
            }
    lsc_nv4_vf m = *mf;
    for (int j = 0; j < 8; j++) {
        lsc_nv4_vu pb, qb;
        memcpy(&pb, &r[j], sizeof pb);
        memcpy(&qb, &r[j + 8], sizeof qb);
        pb &= 0x7FFFFFFFu;
        qb &= 0x7FFFFFFFu;
        lsc_nv4_vf p, q;
        memcpy(&p, &pb, sizeof p);
        memcpy(&q, &qb, sizeof q);
        const lsc_nv4_vf sum = p + q;
        /* a float compare: a NaN is never the greater, and so is left out */
        m = (lsc_nv4_vf)(((lsc_nv4_vi)sum & (sum > m)) | ((lsc_nv4_vi)m & ~(sum > m)));
    }
    *mf = m;
}

/* lsc_nv4_rht_amax_of LSC_NV4_LANES bfloat16 columns (row i at x + i * rs), a
 * column a lane. */
LSC_NV4_INL void lsc_nv4_rht_amax1(const char *x, int64_t rs, lsc_nv4_vf *mf)
{
    lsc_nv4_vf r[16];
    for (int i = 0; i < 16; i++) {
        lsc_nv4_vh h;
        memcpy(&h, x + i * rs, sizeof h);
        const lsc_nv4_vu u = __builtin_convertvector(h, lsc_nv4_vu) << 16;
        memcpy(&r[i], &u, sizeof u);
        r[i] *= lsc_nv4_sign(i);
    }
    lsc_nv4_rht_amax_of(r, mf);
}

/* lsc_nv4_rht_amax_of 2 * LSC_NV4_LANES bfloat16 columns, the even and the odd
 * ones a lane each (the amax is one for the whole band, whichever lane holds a
 * column): a word of two columns widens each by a shift or a mask. */
LSC_NV4_INL void lsc_nv4_rht_amax2(const char *x, int64_t rs, lsc_nv4_vf *mf)
{
    lsc_nv4_vf e[16], o[16];
    for (int i = 0; i < 16; i++) {
        lsc_nv4_vu u, lo, hi;
        memcpy(&u, x + i * rs, sizeof u);
        lo = u << 16;
        hi = u & 0xFFFF0000u;
        memcpy(&e[i], &lo, sizeof lo);
        memcpy(&o[i], &hi, sizeof hi);
        e[i] *= lsc_nv4_sign(i);
        o[i] *= lsc_nv4_sign(i);
    }
    lsc_nv4_rht_amax_of(e, mf);
    lsc_nv4_rht_amax_of(o, mf);
}

/* The amax bits of the transform of a bfloat16 band's w columns, rounded to
 * bfloat16 (NaN left out; a last partial group of LSC_NV4_LANES columns
 * through a zero-padded copy). */
LSC_NV4_INL lsc_u32 lsc_nv4_rht_amax(const char *x, int64_t w, int64_t rs)
{
    enum { L = LSC_NV4_LANES };
    lsc_nv4_vf mf = {0};
    int64_t j = 0;
    for (; j + 2 * L <= w; j += 2 * L)
        lsc_nv4_rht_amax2(x + 2 * j, rs, &mf);
    for (; j + L <= w; j += L)
        lsc_nv4_rht_amax1(x + 2 * j, rs, &mf);
    if (j < w) {
        lsc_u16 pad[16 * L] = {0};
        for (int64_t i = 0; i < 16; i++)
            memcpy(pad + L * i, x + i * rs + 2 * j, (size_t)(2 * (w - j)));
        lsc_nv4_rht_amax1((const char *)pad, 2 * L, &mf);
    }
    lsc_u32 m = 0;
    for (int i = 0; i < L; i++) {
        const lsc_u32 b = lsc_f32_bits(mf[i]);
        m = b > m ? b : m;
    }
    return ((m + 0x7FFFu + ((m >> 16) & 1u)) >> 16) << 16;   /* lsc_nv4_bf16's: finite m */
}

/* A band's tile: 16 rows of w <= LSC_NV4_TILE columns into v (rows
 * LSC_NV4_TILE apart) and their column amaxes (NaN left out) into m, with
 * the Hadamard transform down each column, rounded to bfloat16, when rht
 * (the input is then bfloat16; a last partial group of LSC_NV4_LANES columns
 * goes through a zero-padded copy). */
LSC_NV4_INL void lsc_nv4_tile(const char *x, int64_t w, int64_t rs, int code, int rht, float *v,
                              lsc_u32 *m)
{
    if (rht) {
        enum { L = LSC_NV4_LANES };
        for (int64_t j = 0; j < w; j += L) {
            if (w - j >= L) {
                lsc_nv4_rht_lanes(x + 2 * j, rs, v + j, m + j);
                continue;
            }
            lsc_u16 pad[16 * L] = {0};
            float pv[16 * LSC_NV4_TILE];
            lsc_u32 pm[L];
            for (int64_t i = 0; i < 16; i++)
                memcpy(pad + L * i, x + i * rs + 2 * j, (size_t)(2 * (w - j)));
            lsc_nv4_rht_lanes((const char *)pad, 2 * L, pv, pm);
            for (int64_t i = 0; i < 16; i++)
                memcpy(v + i * LSC_NV4_TILE + j, pv + i * LSC_NV4_TILE, (size_t)(4 * (w - j)));
            memcpy(m + j, pm, (size_t)(4 * (w - j)));
        }
        return;
    }
    for (int64_t i = 0; i < 16; i++)
        for (int64_t j = 0; j < w; j++)
            v[i * LSC_NV4_TILE + j] = lsc_nv4_load(x + i * rs, j, code);
    for (int64_t j = 0; j < w; j++)
        m[j] = 0;
    for (int64_t i = 0; i < 16; i++)
        for (int64_t j = 0; j < w; j++) {
            const lsc_u32 a = lsc_nv4_abs(v[i * LSC_NV4_TILE + j]);
            m[j] = a > m[j] ? a : m[j];
        }
}

/* A band's columns [c0, c0 + wtot): tile by tile, the values, the column
 * (or 16 x 16 tile) amaxes, the scales and factors, the codes. */
LSC_NV4_INL void lsc_nv4_band_body(const char *x, int64_t wtot, int64_t rs, int code,
                                   const lsc_nv4_rule *k, int64_t band, int64_t c0,
                                   unsigned char *s, unsigned char *q)
{
    float v[16 * LSC_NV4_TILE];
    const int64_t cols = k->cols;
    const float mult = k->mult, sdec = k->sdec;   /* stores to s may alias *k */
    for (int64_t cc = 0; cc < wtot; cc += LSC_NV4_TILE) {
        const int64_t w = wtot - cc < LSC_NV4_TILE ? wtot - cc : LSC_NV4_TILE, c = c0 + cc;
        lsc_u32 m[LSC_NV4_TILE], sf[LSC_NV4_TILE], wd[4 * LSC_NV4_TILE];
        float f[LSC_NV4_TILE];
        lsc_nv4_tile(x + cc * LSC_MX_WIDTH(code), w, rs, code, k->rht, v, m);
        if (k->tile) {   /* one amax, scale and factor per 16 columns */
            for (int64_t t = 0; t < w / 16; t++) {
                lsc_u32 mt = 0;
                for (int64_t j = 0; j < 16; j++)
                    mt = m[16 * t + j] > mt ? m[16 * t + j] : mt;
                sf[t] = lsc_nv4_sf(lsc_f32_from_bits(mt), mult);
                s[band * (cols / 16) + c / 16 + t] = (unsigned char)sf[t];
            }
            for (int64_t j = 0; j < w; j++)
                f[j] = lsc_nv4_enc(sf[j / 16], sdec);
        } else {
            for (int64_t j = 0; j < w; j++)
                sf[j] = lsc_nv4_sf(lsc_f32_from_bits(m[j]), mult);
            for (int64_t j = 0; j < w; j++) {
                f[j] = lsc_nv4_enc(sf[j], sdec);
                s[band * cols + c + j] = (unsigned char)sf[j];
            }
        }
        if (k->axis == -1) {   /* tiles, rowwise: each row's columns paired */
            for (int64_t i = 0; i < 16; i++) {
                unsigned char *qr = q + (16 * band + i) * (cols / 2) + c / 2;
                const float *vr = v + i * LSC_NV4_TILE;
                for (int64_t j = 0; j < w / 2; j++)
                    qr[j] = (unsigned char)(lsc_nv4_rn(vr[2 * j] * f[2 * j])
                                            | (lsc_nv4_rn(vr[2 * j + 1] * f[2 * j + 1]) << 4));
            }
            continue;
        }
        if (k->sr)   /* column c's block in the transpose: subsequence c * rows / 16 + band */
            lsc_nv4_draws((lsc_u64)(c * (k->rows / 16) + band) | LSC_NV4_COLS_BIT,
                          (lsc_u64)(k->rows / 16), w, k, wd);
        /* each pair of rows' bytes through 32-bit words, as in lsc_mx_kern.c:
           with byte stores in the loop GCC runs it 32 lanes a step, which
           spills on AVX2 */
        lsc_u32 pw[LSC_NV4_TILE];
        for (int64_t p = 0; p < 8; p++) {
            unsigned char *qr = q + (8 * band + p) * cols + c;
            const float *va = v + 2 * p * LSC_NV4_TILE, *vb = va + LSC_NV4_TILE;
            if (k->sr) {   /* rows 2p, 2p + 1: bytes 2p % 4, 2p % 4 + 1 of word 2p / 4 */
                const lsc_u32 *wp = wd + (p / 2) * w, sh = (lsc_u32)(16 * (p % 2));
                for (int64_t j = 0; j < w; j++)
                    pw[j] = lsc_nv4_sr_fast(va[j] * f[j], wp[j] >> sh)
                            | (lsc_nv4_sr_fast(vb[j] * f[j], wp[j] >> (sh + 8)) << 4);
            } else {
                for (int64_t j = 0; j < w; j++)
                    pw[j] = lsc_nv4_rn(va[j] * f[j]) | (lsc_nv4_rn(vb[j] * f[j]) << 4);
            }
            for (int64_t j = 0; j < w; j++)
                qr[j] = (unsigned char)pw[j];
        }
    }
}

/* The Hadamard transform of a bfloat16 band's w columns, tile by tile, into
 * out (rows ldo words apart) when given (else lsc_nv4_rht_amax's shortcut);
 * the amax bits of the results. */
static lsc_u32 lsc_nv4_rht_body(const char *x, int64_t wtot, int64_t rs, lsc_u16 *out,
                                int64_t ldo)
{
    float v[16 * LSC_NV4_TILE];
    lsc_u32 amax = 0;
    if (!out)
        return lsc_nv4_rht_amax(x, wtot, rs);
    for (int64_t cc = 0; cc < wtot; cc += LSC_NV4_TILE) {
        const int64_t w = wtot - cc < LSC_NV4_TILE ? wtot - cc : LSC_NV4_TILE;
        lsc_u32 m[LSC_NV4_TILE];
        lsc_nv4_tile(x + cc * 2, w, rs, LSC_CODE_BF16, 1, v, m);
        for (int64_t j = 0; j < w; j++)
            amax = m[j] > amax ? m[j] : amax;
        for (int64_t i = 0; i < 16; i++)   /* lsc_nv4_bf16's words, NaN 0x7FFF */
            for (int64_t j = 0; j < w; j++)
                out[i * ldo + cc + j] = lsc_nv4_bf16(v[i * LSC_NV4_TILE + j]);
    }
    return amax;
}

/* ---- the level's kernels and its table --------------------------------- */

#define LSC_NV4_FNS(NAME, CODE)                                                              \
    __attribute__((flatten)) static void lsc_nv4_r_##NAME(const char *x, int64_t n,           \
                                                           const lsc_nv4_rule *k, lsc_u64 sub, \
                                                           unsigned char *s, unsigned char *q) \
    {                                                                                        \
        lsc_nv4_row_body(x, n, (CODE), k, sub, s, q);                                        \
    }                                                                                        \
    __attribute__((flatten)) static void lsc_nv4_b_##NAME(                                  \
        const char *x, int64_t w, int64_t rs, const lsc_nv4_rule *k, int64_t band, int64_t c0, \
        unsigned char *s, unsigned char *q)                                                  \
    {                                                                                        \
        lsc_nv4_band_body(x, w, rs, (CODE), k, band, c0, s, q);                              \
    }

LSC_NV4_FNS(f32, LSC_CODE_F32)
LSC_NV4_FNS(f16, LSC_CODE_F16)
LSC_NV4_FNS(bf16, LSC_CODE_BF16)

LSC_ISA_TABLE const lsc_nv4_isa LSC_NV4_CAT(lsc_nv4_isa, LSC_LEVEL) = {
    LSC_NV4_STR(LSC_LEVEL),
    {0, lsc_nv4_r_f16, lsc_nv4_r_bf16, lsc_nv4_r_f32, 0, 0, 0},
    {0, lsc_nv4_b_f16, lsc_nv4_b_bf16, lsc_nv4_b_f32, 0, 0, 0},
    lsc_nv4_rht_body,
};
