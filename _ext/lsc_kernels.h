/* lsc_kernels.h: the contiguous kernels, compiled once per ISA level.
 *
 * No include guard on purpose: lsc_scan.h includes this file once per ISA
 * level, with LSC_SFX naming the variant (v2, v3, v4) and a
 * `#pragma GCC target` around it, so each copy is the code an
 * -march=x86-64-vN build would emit for the same loops.  lsc_scan.h picks
 * one table of these functions at load time (runtime CPU dispatch) while the
 * extension itself is built for the portable baseline.  Its parameters
 * (LSC_SFX, LSC_VBYTES, LSC_VTEST and the F16C macros) are #undef'd at the
 * end, ready for the next copy.
 *
 * Every load and store goes through memcpy (unaligned data is well defined).
 * The scans OR `(w & EXP) + EXP_LSB` over a block: the top bit ends up set
 * exactly when some exponent field is all ones (NaN or Inf).
 */
#define LSC_F(name) LSC_CAT(name, LSC_SFX)

/* Is `top` set in any 64-bit lane of the vector q?  One vector test where
 * the ISA has it (a chain of lane extracts cost a third of a 64-element
 * scan); lsc_scan.h defines LSC_VTEST for the x86 levels. */
#ifdef LSC_VTEST
#define LSC_ANY_TOP(q, top) LSC_VTEST(q, top)
#else
#define LSC_ANY_TOP(q, top) LSC_F(any_top_)(q, top)
static inline int LSC_F(any_top_)(uint64_t __attribute__((vector_size(LSC_VBYTES))) q,
                                  uint64_t top)
{
    uint64_t any = 0;
    for (int l = 0; l < LSC_VBYTES / 8; l++)
        any |= q[l];
    return (any & top) != 0;
}
#endif

/* ---- read-only scan, early exit per block ------------------------------- */

/* The scans use vectors of the ISA's width, LSC_VBYTES (wider ones make
 * gcc spill); the tail goes word by word.  Early exit after each block.
 * TOP is the top bit of every word of a 64-bit lane. */
#define LSC_DEFINE_SCAN(NAME, T, TOP)                                             \
static int LSC_F(NAME)(const char *p, lsc_n n, uint64_t em64, uint64_t lsb64)      \
{                                                                                  \
    typedef T vec __attribute__((vector_size(LSC_VBYTES)));                        \
    typedef uint64_t vq __attribute__((vector_size(LSC_VBYTES)));                  \
    const lsc_n lanes = LSC_VBYTES / (lsc_n)sizeof(T);                             \
    const lsc_n block = LSC_BLOCK_BYTES / (lsc_n)sizeof(T);                        \
    const T em = (T)em64, lsb = (T)lsb64;                                          \
    lsc_n i = 0;                                                                   \
    T tail = 0;                                                                    \
    while (n - i >= lanes) {                                                       \
        lsc_n m = n - i < block ? n - i : block;                                   \
        lsc_n end = i + m - m % lanes;                                             \
        vec acc = {0}, acc2 = {0};                                                 \
        vq q;                                                                      \
        /* two vectors a turn: two loads per cycle where the core can */         \
        for (; i + 2 * lanes <= end; i += 2 * lanes) {                             \
            vec w, w2;                                                             \
            memcpy(&w, p + i * (lsc_n)sizeof(T), LSC_VBYTES);                      \
            memcpy(&w2, p + i * (lsc_n)sizeof(T) + LSC_VBYTES, LSC_VBYTES);        \
            acc |= (w & em) + lsb;                                                 \
            acc2 |= (w2 & em) + lsb;                                               \
        }                                                                          \
        for (; i < end; i += lanes) {                                              \
            vec w;                                                                 \
            memcpy(&w, p + i * (lsc_n)sizeof(T), LSC_VBYTES);                      \
            acc |= (w & em) + lsb;                                                 \
        }                                                                          \
        acc |= acc2;                                                               \
        memcpy(&q, &acc, LSC_VBYTES);                                              \
        if (LSC_ANY_TOP(q, TOP))                                                   \
            return 1;                                                              \
    }                                                                              \
    for (; i < n; i++) {                                                           \
        T w;                                                                       \
        memcpy(&w, p + i * (lsc_n)sizeof(T), sizeof(T));                           \
        tail |= (T)((T)(w & em) + lsb);                                            \
    }                                                                              \
    return (int)(tail >> (8 * sizeof(T) - 1));                                     \
}

LSC_DEFINE_SCAN(scan_u8_, uint8_t, 0x8080808080808080ull)
LSC_DEFINE_SCAN(scan_u16_, uint16_t, 0x8000800080008000ull)
LSC_DEFINE_SCAN(scan_u32_, uint32_t, 0x8000000080000000ull)
LSC_DEFINE_SCAN(scan_u64_, uint64_t, 0x8000000000000000ull)
#undef LSC_DEFINE_SCAN

/* ---- fused unscale: multiply in place, report a non-finite input -------- */

/* f32 and f64 in explicit vectors of the ISA's width (the auto-vectorised
 * loop spent a third of a 64-element call in its prologue), tail by words.
 * Unrolled 4 times: at v4 on Zen 4 a 1e7-element float32 call (past L2) took
 * 18% less time, float64 10%; in cache no change. */
#define LSC_DEFINE_UNSCALE(NAME, T, U, SHIFT, EM, LSB, TOP)                        \
static int LSC_F(NAME)(char *p, lsc_n n, double inv64)                            \
{                                                                                  \
    typedef U uvec __attribute__((vector_size(LSC_VBYTES)));                       \
    typedef T fvec __attribute__((vector_size(LSC_VBYTES)));                       \
    typedef uint64_t vq __attribute__((vector_size(LSC_VBYTES)));                  \
    const lsc_n lanes = LSC_VBYTES / (lsc_n)sizeof(T);                             \
    const T inv = (T)inv64;                                                        \
    uvec acc = {0};                                                                \
    vq q;                                                                          \
    U any = 0;                                                                     \
    lsc_n j = 0;                                                                   \
    _Pragma("GCC unroll 4")                                                        \
    for (; j + lanes <= n; j += lanes) {                                           \
        uvec w;                                                                    \
        fvec f;                                                                    \
        memcpy(&w, p + j * (lsc_n)sizeof(T), LSC_VBYTES);                          \
        acc |= (w & (EM)) + (LSB);                                                 \
        memcpy(&f, &w, LSC_VBYTES);                                                \
        f *= inv;                                                                  \
        memcpy(p + j * (lsc_n)sizeof(T), &f, LSC_VBYTES);                          \
    }                                                                              \
    memcpy(&q, &acc, LSC_VBYTES);                                                  \
    if (LSC_ANY_TOP(q, TOP))                                                       \
        any = (U)1 << (SHIFT);                                                     \
    for (; j < n; j++) {                                                           \
        U w;                                                                       \
        T f;                                                                       \
        memcpy(&w, p + j * (lsc_n)sizeof(T), sizeof(T));                           \
        any |= (w & (EM)) + (LSB);                                                 \
        memcpy(&f, &w, sizeof(T));                                                 \
        f *= inv;                                                                  \
        memcpy(p + j * (lsc_n)sizeof(T), &f, sizeof(T));                           \
    }                                                                              \
    return (int)(any >> (SHIFT));                                                  \
}

LSC_DEFINE_UNSCALE(unscale_f32_, float, uint32_t, 31, LSC_EXP_F32, LSC_EXP_LSB_F32,
                   0x8000000080000000ull)
LSC_DEFINE_UNSCALE(unscale_f64_, double, uint64_t, 63, LSC_EXP_F64, LSC_EXP_LSB_F64,
                   0x8000000000000000ull)
#undef LSC_DEFINE_UNSCALE

/* ---- float16 / bfloat16 in whole vectors -------------------------------- */

/* A step takes LSC_HL 16-bit words, widened to LSC_HL floats (one vector of
 * the ISA's width).  F16C converts float16 where the ISA has it (exact
 * widening; narrowing rounds to nearest even, only its NaN, payload kept, is
 * made the canonical 0x7E00 with the sign).  Elsewhere, and for bfloat16 at
 * every level, the mask formulas of lsc_half.h run on whole vectors: every
 * path gives the bits of the scalar functions (which the strided loops of
 * lsc_scan.h use; a contiguous run's tail is a padded vector group).  AVX-512
 * BF16's VCVTNEPS2BF16 is not used: it flushes subnormal inputs and results
 * to zero. */
#define LSC_HL (LSC_VBYTES / 4)
#define LSC_DL (LSC_VBYTES / 8)
#define LSC_INL static inline __attribute__((always_inline))
/* Lane-wise max of unsigned 16/32-bit and signed 64-bit vectors: one
 * instruction where lsc_scan.h names it (gcc does not find it in the masks). */
#ifndef LSC_MAXU16
#define LSC_MAXU16(a, b) LSC_VMAX_(a, b)
#endif
#ifndef LSC_MAXU16W
#define LSC_MAXU16W(a, b) LSC_VMAX_(a, b)
#endif
#ifndef LSC_MAXU32
#define LSC_MAXU32(a, b) LSC_VMAX_(a, b)
#endif
#ifndef LSC_MAXS64
#define LSC_MAXS64(a, b) LSC_VMAX_(a, b)
#endif
#define LSC_VMAX_(a, b) \
    ({ __typeof__(a) a_ = (a), b_ = (b), gt_ = (__typeof__(a))(b_ > a_); (b_ & gt_) | (a_ & ~gt_); })
typedef uint16_t LSC_F(vw_) __attribute__((vector_size(LSC_VBYTES / 2)));
typedef uint32_t LSC_F(vu_) __attribute__((vector_size(LSC_VBYTES)));
typedef int32_t LSC_F(vi_) __attribute__((vector_size(LSC_VBYTES)));
typedef float LSC_F(vf_) __attribute__((vector_size(LSC_VBYTES)));
typedef float LSC_F(vh_) __attribute__((vector_size(LSC_VBYTES / 2)));
typedef double LSC_F(vd_) __attribute__((vector_size(LSC_VBYTES)));
typedef uint64_t LSC_F(vq_) __attribute__((vector_size(LSC_VBYTES)));
typedef int64_t LSC_F(vl_) __attribute__((vector_size(LSC_VBYTES)));

LSC_INL LSC_F(vf_) LSC_F(widen_)(LSC_F(vw_) w)
{
    LSC_F(vu_) x = __builtin_convertvector(w, LSC_F(vu_));
    LSC_F(vf_) f;
#ifdef LSC_F16C_LANES
    {
        LSC_F32V v = LSC_H2F(w);
        (void)x;
        memcpy(&f, &v, sizeof(f));
    }
#else
    {
        LSC_F(vu_) sign = (x & 0x8000u) << 16, mag = x & 0x7FFFu, sub;
        LSC_F(vu_) normal = (mag << 13) + ((127u - 15u) << 23);
        LSC_F(vu_) special = 0x7F800000u | ((mag & 0x3FFu) << 13);
        LSC_F(vu_) is_special = (LSC_F(vu_))((LSC_F(vi_))mag >= 0x7C00);
        LSC_F(vu_) is_normal = (LSC_F(vu_))((LSC_F(vi_))mag >= 0x0400);
        LSC_F(vf_) s = __builtin_convertvector((LSC_F(vi_))mag, LSC_F(vf_)) * 0x1p-24f;
        memcpy(&sub, &s, sizeof(sub));
        x = sign | (special & is_special) | (normal & is_normal & ~is_special)
          | (sub & ~is_normal);
        memcpy(&f, &x, sizeof(f));
    }
#endif
    return f;
}

/* canon: make a NaN the canonical one (0: a NaN result is known not to
 * occur or is fixed afterwards; see run_f16_). */
LSC_INL LSC_F(vw_) LSC_F(narrow_)(LSC_F(vf_) f, int canon)
{
    LSC_F(vu_) x, h;
    memcpy(&x, &f, sizeof(x));
#ifdef LSC_F16C_LANES
    {
        LSC_F(vw_) o, nan;
        LSC_F32V v;
        (void)h;
        memcpy(&v, &f, sizeof(v));
        o = (LSC_F(vw_))LSC_F2H(v);
        if (!canon)
            return o;
        nan = (LSC_F(vw_))((o & 0x7FFF) > 0x7C00);
        return (o & ~nan) | (((o & 0x8000) | 0x7E00) & nan);
    }
#else
    (void)canon;
    {
        LSC_F(vu_) sign = (x >> 16) & 0x8000u, a = x & 0x7FFFFFFFu, sub;
        LSC_F(vi_) ai = (LSC_F(vi_))a;
        LSC_F(vu_) r = a - ((127u - 15u) << 23);
        LSC_F(vu_) normal = (r + 0x0FFFu + ((r >> 13) & 1u)) >> 13;
        LSC_F(vf_) af, y;
        memcpy(&af, &a, sizeof(af));
        y = af * 0x1p24f + 0x1p23f;
        memcpy(&sub, &y, sizeof(sub));
        sub -= 0x4B000000u;
        LSC_F(vu_) is_nan = (LSC_F(vu_))(ai > 0x7F800000);
        LSC_F(vu_) is_inf = (LSC_F(vu_))(ai >= 0x477FF000);
        LSC_F(vu_) is_normal = (LSC_F(vu_))(ai >= 0x38800000);
        h = (0x7E00u & is_nan) | (0x7C00u & is_inf & ~is_nan) | (normal & is_normal & ~is_inf)
          | (sub & ~is_normal);
        return __builtin_convertvector(sign | h, LSC_F(vw_));
    }
#endif
}

/* ---- statistics: the sum of squares by 32-element groups, and max |x| ---- */

/* A call's elements fall in groups of 32 by their index within the call
 * (the last group padded with zeros).  The 32 squares s[0..31] of a group
 * fold in one fixed tree to four sums
 *     v[k] = ((s[k] + s[k+16]) + (s[k+8] + s[k+24]))
 *          + ((s[k+4] + s[k+20]) + (s[k+12] + s[k+28])),    k = 0..3,
 * and v[k] is added to lane k of the call's four lanes (lsc_scan.h's
 * lsc_group_add is the same tree element by element, for strided runs;
 * lsc_lanes_sum ends a call).  Vectors of 2, 4 or 8 doubles follow the
 * tree by adding whole vectors, so every ISA level and every layout gives the
 * same bits.  A group folds in registers before it meets the lanes: one
 * vector of lanes (two at v2) is all the loop carries, where 32 lanes kept
 * apart spilled to the stack at 16 registers.  The squares of float16,
 * bfloat16 and float32 values are exact in double, so there s[k] + s[k+16]
 * is one fused multiply-add where the ISA has it (the same bits as a multiply
 * and an add: the product it keeps unrounded needs no rounding).  max |x| is
 * an integer max over the words with the sign cleared (|x| as bits orders
 * like |x|, and a NaN sorts above Inf), folded per group as well.  It is
 * taken over the inputs, and it is the check too: an input is NaN or Inf
 * exactly when the largest |x| is; rounding is monotonic, so with a finite
 * inverse the largest |x| left is the largest input's, unscaled (stats_
 * takes a non-finite inverse in two passes).  Squares are of the values the
 * call leaves, in the same pass as the multiply. */
#define LSC_NV (32 / LSC_DL)
typedef double LSC_F(v4_) __attribute__((vector_size(32)));

/* Lane-wise in place: M[0] = the max of M[0..cnt-1] (cnt a power of two). */
#define LSC_MAX_TREE(M, cnt, MAX)                                                  \
    for (int m_ = (cnt); m_ > 1; m_ /= 2)                                          \
        for (int i_ = 0; i_ < m_ / 2; i_++)                                        \
            (M)[i_] = MAX((M)[i_], (M)[i_ + m_ / 2])

/* Runs GROUP (an expression of the char pointer Q) over the groups of 32
 * elements of WIDTH bytes at P; the last N mod 32 elements are one more
 * group, in a buffer padded with zeros (finite, nothing to a sum or a max)
 * and written back when WRITE, so a tail takes the same vector code. */
#define LSC_GROUPS(P, N, WIDTH, WRITE, Q, GROUP)                                     \
    do {                                                                           \
        lsc_n j_ = 0;                                                              \
        for (; j_ + 32 <= (N); j_ += 32) {                                         \
            char *Q = (P) + (WIDTH) * j_;                                          \
            GROUP;                                                                 \
        }                                                                          \
        if (j_ < (N)) {                                                            \
            char pad_[32 * 8] __attribute__((aligned(64))) = {0};                  \
            char *Q = pad_;                                                        \
            memcpy(pad_, (P) + (WIDTH) * j_, (size_t)(WIDTH) * (size_t)((N) - j_)); \
            GROUP;                                                                 \
            if (WRITE)                                                             \
                memcpy((P) + (WIDTH) * j_, pad_, (size_t)(WIDTH) * (size_t)((N) - j_)); \
        }                                                                          \
    } while (0)

/* a * a + b * b lane-wise; exact: both squares are exact in double */
LSC_INL LSC_F(vd_) LSC_F(sq2_)(LSC_F(vd_) a, LSC_F(vd_) b, int exact)
{
#ifdef LSC_FMA_PD
    if (exact)
        return (LSC_F(vd_))LSC_FMA_PD(b, b, a * a);
#endif
    (void)exact;
    return a * a + b * b;
}

/* The tree's levels over x[0..2m-1]: x[i]^2 + x[i+m]^2, then halves added
 * while more than four values remain; the four into *four. */
LSC_INL void LSC_F(fold_)(const LSC_F(vd_) *x, int m, int exact, LSC_F(v4_) *four)
{
    LSC_F(vd_) t[LSC_NV / 2];
    LSC_F(v4_) hi;
    for (int i = 0; i < m; i++)
        t[i] = LSC_F(sq2_)(x[i], x[i + m], exact);
    for (; m > 1 && m * LSC_DL > 4; m /= 2)
        for (int i = 0; i < m / 2; i++)
            t[i] += t[i + m / 2];
    memcpy(four, t, sizeof(*four));
    if (LSC_DL == 8) {
        memcpy(&hi, (const char *)t + sizeof(hi), sizeof(hi));
        *four += hi;
    }
}

/* The four sums of the group x[0..LSC_NV-1] (32 values, in order), added to *acc. */
LSC_INL void LSC_F(group_)(const LSC_F(vd_) *x, int exact, LSC_F(v4_) *acc)
{
    LSC_F(v4_) four;
    LSC_F(fold_)(x, LSC_NV / 2, exact, &four);
    *acc += four;
}

/* A vector of floats widened to two of doubles, x[0] (low half) and x[1]. */
LSC_INL void LSC_F(pd2_)(LSC_F(vf_) f, LSC_F(vd_) *x)
{
#ifdef LSC_PD_LO
    x[0] = (LSC_F(vd_))LSC_PD_LO(f);
    x[1] = (LSC_F(vd_))LSC_PD_HI(f);
#else
    LSC_F(vh_) lo, hi;
    memcpy(&lo, &f, sizeof(lo));
    memcpy(&hi, (const char *)&f + sizeof(lo), sizeof(hi));
    x[0] = __builtin_convertvector(lo, LSC_F(vd_));
    x[1] = __builtin_convertvector(hi, LSC_F(vd_));
#endif
}

/* The four sums of a group of 32 floats f[0..32/LSC_HL-1], widened exactly, added to *acc. */
LSC_INL void LSC_F(group_f_)(const LSC_F(vf_) *f, LSC_F(v4_) *acc)
{
    LSC_F(vd_) x[LSC_NV];
    for (int k = 0; k < 32 / LSC_HL; k++)
        LSC_F(pd2_)(f[k], &x[2 * k]);
    LSC_F(group_)(x, 1, acc);
}

/* The call's sum of squares, from its four lanes. */
LSC_INL double LSC_F(sumsq_)(const LSC_F(v4_) *acc)
{
    double lane[4];
    memcpy(lane, acc, sizeof(lane));
    return lsc_lanes_sum(lane);
}

/* One step of LSC_HL float16 words at q: multiply and store (write); with
 * stats, the values left (*fo) and the inputs' magnitude bits (*mo), and no
 * check (the max is the check); without, returns the check bits. */
LSC_INL LSC_F(vw_) LSC_F(step16_)(char *q, float inv, int canon, int write, int stats,
                                  LSC_F(vf_) *fo, LSC_F(vw_) *mo)
{
    LSC_F(vw_) w, o;
    LSC_F(vf_) f;
    memcpy(&w, q, sizeof(w));
    f = LSC_F(widen_)(w);
    if (write) {
        o = LSC_F(narrow_)(f * inv, canon);
        memcpy(q, &o, sizeof(o));
        if (stats) {
            f = LSC_F(widen_)(o);
#ifdef LSC_F16C_LANES
            /* whole: gcc would convert the low half again for its own use,
               and the conversion unit is what this loop waits on */
            __asm__("" : "+x"(f));
#endif
        }
    }
    if (stats) {
        *fo = f;
        *mo = w & 0x7FFF;
        return (LSC_F(vw_)){0};
    }
    return (w & LSC_EXP_F16) + LSC_EXP_LSB_F16;
}

/* One group of 32 float16 words at q: check, multiply and store (write),
 * statistics into *acc and *vm (stats), the check bits into *vacc. */
LSC_INL void LSC_F(group16_)(char *q, float inv, int canon, int write, int stats,
                             LSC_F(v4_) *acc, LSC_F(vw_) *vm, LSC_F(vw_) *vacc)
{
    LSC_F(vf_) f[32 / LSC_HL];
    LSC_F(vw_) o[32 / LSC_HL];
#pragma GCC unroll 8
    for (int k = 0; k < 32 / LSC_HL; k++)
        *vacc |= LSC_F(step16_)(q + 2 * k * LSC_HL, inv, canon, write, stats, &f[k], &o[k]);
    if (stats) {
        LSC_F(group_f_)(f, acc);
        LSC_MAX_TREE(o, 32 / LSC_HL, LSC_MAXU16);
        *vm = LSC_MAXU16(*vm, o[0]);
    }
}

/* float16 over a contiguous run: unscale (write), statistics (ks non-NULL),
 * or both.  Returns whether an input was non-finite.  Groups of 32; the last
 * n mod 32 elements are a group too, in a buffer padded with zeros (finite,
 * and nothing to a sum or a max), so the tail takes the same vector code as
 * the rest rather than the C conversions element by element. */
LSC_INL int LSC_F(run16_)(char *p, lsc_n n, double inv64, int canon, int write, lsc_kstats *ks)
{
    const float inv = (float)inv64;
    const int stats = ks != NULL;
    LSC_F(v4_) acc = {0};
    LSC_F(vw_) vacc = {0}, vm = {0};
    uint16_t any = 0, m = 0;
    LSC_GROUPS(p, n, 2, write, q, LSC_F(group16_)(q, inv, canon, write, stats, &acc, &vm, &vacc));
    {
        uint64_t q[sizeof(vacc) / 8], qa = 0;
        memcpy(q, &vacc, sizeof(q));
        for (size_t l = 0; l < sizeof(q) / 8; l++)
            qa |= q[l];
        if (qa & 0x8000800080008000ull)
            any = 0x8000;
        for (int l = 0; l < LSC_HL; l++)
            m = vm[l] > m ? vm[l] : m;
    }
    if (stats) {
        /* the largest input: the check, and (unscaled) the largest value left */
        float top = lsc_f16_to_f32(m);
        any = m >= LSC_EXP_F16 ? 0x8000 : 0;
        if (write)
            top = lsc_f16_to_f32((uint16_t)(lsc_f32_to_f16(top * inv) & 0x7FFF));
        ks->sumsq = LSC_F(sumsq_)(&acc);
        ks->maxbits = lsc_f32_bits(top);
    }
    return any >> 15;
}

/* float16.  Through F16C with inv finite and non-zero, a NaN result comes
 * only from a NaN input: the vector loop then leaves F16C's NaNs (payload
 * kept) as they are, and only when the check found a non-finite input does
 * a second pass make them the canonical 0x7E00 with the sign. */
LSC_INL int LSC_F(run_f16_)(char *p, lsc_n n, double inv, int write, lsc_kstats *ks)
{
#ifdef LSC_F16C_LANES
    const float inv32 = (float)inv;
    if (write && inv32 != 0 && inv32 - inv32 == 0) {
        int found = LSC_F(run16_)(p, n, inv, 0, 1, ks);
        if (found)
            for (lsc_n j = 0; j < n; j++) {
                uint16_t w;
                memcpy(&w, p + 2 * j, 2);
                if ((w & 0x7FFF) > 0x7C00) {
                    w = (uint16_t)((w & 0x8000) | 0x7E00);
                    memcpy(p + 2 * j, &w, 2);
                }
            }
        return found;
    }
#endif
    return write ? LSC_F(run16_)(p, n, inv, 1, 1, ks) : LSC_F(run16_)(p, n, inv, 1, 0, ks);
}

static int LSC_F(unscale_f16_)(char *p, lsc_n n, double inv)
{
    return LSC_F(run_f16_)(p, n, inv, 1, NULL);
}

/* Plain bfloat16 unscale word by word, any inverse (gcc vectorises it at
 * every level: zero-extend, shift, multiply, round, make a NaN canonical,
 * pack).  Returns whether an input was non-finite. */
LSC_INL int LSC_F(bf16_words_)(char *p, lsc_n n, float inv)
{
    uint16_t acc = 0;
    for (lsc_n j = 0; j < n; j++) {
        uint16_t w;
        memcpy(&w, p + 2 * j, 2);
        acc |= (uint16_t)((w & LSC_EXP_BF16) + LSC_EXP_LSB_BF16);
        w = lsc_f32_to_bf16(lsc_bf16_to_f32(w) * inv);
        memcpy(p + 2 * j, &w, 2);
    }
    return acc >> 15;
}

/* Two lanes of bfloat16 values as floats (lo, hi: a value in the top half,
 * zeros below), each multiplied by inv and rounded to nearest even in place:
 * the top halves are the results (the low halves are left as the rounding
 * leaves them).  No NaN may come in (its rounding could carry it into Inf or
 * -0). */
LSC_INL void LSC_F(bf16_mul2_)(LSC_F(vu_) *lo, LSC_F(vu_) *hi, float inv)
{
    LSC_F(vf_) a, b;
    memcpy(&a, lo, sizeof(a));
    memcpy(&b, hi, sizeof(b));
    a *= inv;
    b *= inv;
    memcpy(lo, &a, sizeof(a));
    memcpy(hi, &b, sizeof(b));
    *lo += 0x7FFFu + ((*lo >> 16) & 1u);
    *hi += 0x7FFFu + ((*hi >> 16) & 1u);
}

/* Plain bfloat16 unscale.  A 32-bit lane holds two words, and each is a
 * float in place with no conversion: the high word masked (w & 0xFFFF0000),
 * the low one shifted up (w << 16).  Both are multiplied, rounded to nearest
 * even in place and put back together with a mask and a shift: no widening
 * or packing shuffles.  With a finite, non-zero inverse a NaN result comes
 * only from a NaN input, so each vector is checked before it is written and
 * the rare one holding a NaN or Inf goes word by word (whose rounding makes a
 * NaN canonical, where rounding it as a number could carry it into Inf or
 * -0); the others round with no eye for NaNs. */
static int LSC_F(unscale_bf16_)(char *p, lsc_n n, double inv64)
{
    const float inv = (float)inv64;
    const lsc_n step = LSC_VBYTES / 2;
    int any = 0;
    lsc_n j = 0;
    if (!(inv != 0 && inv - inv == 0))
        return LSC_F(bf16_words_)(p, n, inv);
    for (; j + step <= n; j += step) {
        LSC_F(vu_) w, lo, hi;
        LSC_F(vq_) q;
        memcpy(&w, p + 2 * j, sizeof(w));
        /* both words' checks at once: no carry crosses from the low one */
        lo = (w & 0x7F807F80u) + 0x00800080u;
        memcpy(&q, &lo, sizeof(q));
        if (LSC_ANY_TOP(q, 0x8000800080008000ull)) {
            any |= LSC_F(bf16_words_)(p + 2 * j, step, inv);
            continue;
        }
        lo = w << 16;
        hi = w & 0xFFFF0000u;
        LSC_F(bf16_mul2_)(&lo, &hi, inv);
        w = (hi & 0xFFFF0000u) | (lo >> 16);
        memcpy(p + 2 * j, &w, sizeof(w));
    }
    return LSC_F(bf16_words_)(p + 2 * j, n - j, inv) | any;
}

/* bfloat16 with statistics, two words to a 32-bit lane as unscale_bf16_
 * takes them.  A lane's low words are the group's even elements and its high
 * words the odd ones, so the tree's pairs (k, k+16) and (k, k+8) are still
 * lane for lane, and only its last level folds within a vector: the four
 * lanes come out as lanes 0 and 2 from the even elements, 1 and 3 from the
 * odd, the same sums of the same values as the tree of group_.  write: with
 * a finite inverse (stats_ reads an infinite or NaN one's results in a second
 * pass), where a finite input gives no NaN.  A group holding a NaN or Inf
 * goes word by word, and its squares are added in any order: they make the
 * sum Inf or NaN whatever the order. */
typedef double LSC_F(v2d_) __attribute__((vector_size(16)));

/* The 16 values of one parity of a group, in order: their two lane sums. */
LSC_INL LSC_F(v2d_) LSC_F(parity_)(const LSC_F(vd_) *x)
{
    LSC_F(v4_) four;
    LSC_F(v2d_) lo, hi;
    LSC_F(fold_)(x, LSC_NV / 4, 1, &four);
    memcpy(&lo, &four, sizeof(lo));
    memcpy(&hi, (const char *)&four + sizeof(lo), sizeof(hi));
    return lo + hi;
}

typedef uint16_t LSC_F(vw2_) __attribute__((vector_size(LSC_VBYTES)));

/* One group of 32 bfloat16 words at q: multiply and store (write), the two
 * parities' lane sums into *even and *odd, max |x| of the inputs into *vm;
 * a group holding a NaN or Inf word by word, its squares into *extra. */
LSC_INL void LSC_F(group_bf16_)(char *q, float inv, int write, LSC_F(vw2_) *vm,
                                LSC_F(v2d_) *even, LSC_F(v2d_) *odd, double *extra)
{
    enum { G = 64 / LSC_VBYTES };   /* vectors to a group of 32 words */
    LSC_F(vu_) w[G];
    LSC_F(vd_) xe[LSC_NV / 2], xo[LSC_NV / 2];
    LSC_F(vq_) t;
    LSC_F(vw2_) a[G];
#pragma GCC unroll 4
    for (int k = 0; k < G; k++) {
        memcpy(&w[k], q + k * LSC_VBYTES, sizeof(w[k]));
        memcpy(&a[k], &w[k], sizeof(a[k]));
        a[k] &= 0x7FFF;
    }
    LSC_MAX_TREE(a, G, LSC_MAXU16W);
    *vm = LSC_MAXU16W(*vm, a[0]);
    a[0] += 0x0080;     /* a NaN or Inf carries into the word's top bit */
    memcpy(&t, &a[0], sizeof(t));
    if (LSC_ANY_TOP(t, 0x8000800080008000ull)) {
        if (write)
            LSC_F(bf16_words_)(q, 32, inv);
        for (int k = 0; k < 32; k++) {
            uint16_t h;
            double v;
            memcpy(&h, q + 2 * k, 2);
            v = lsc_bf16_to_f32(h);
            *extra += v * v;
        }
        return;
    }
#pragma GCC unroll 4
    for (int k = 0; k < G; k++) {
        LSC_F(vu_) lo = w[k] << 16, hi = w[k] & 0xFFFF0000u;
        LSC_F(vf_) fl, fh;
        if (write) {
            LSC_F(bf16_mul2_)(&lo, &hi, inv);
            lo &= 0xFFFF0000u;
            hi &= 0xFFFF0000u;
            w[k] = hi | (lo >> 16);
            memcpy(q + k * LSC_VBYTES, &w[k], sizeof(w[k]));
        }
        memcpy(&fl, &lo, sizeof(fl));
        memcpy(&fh, &hi, sizeof(fh));
        LSC_F(pd2_)(fl, &xe[2 * k]);
        LSC_F(pd2_)(fh, &xo[2 * k]);
    }
    *even += LSC_F(parity_)(xe);
    *odd += LSC_F(parity_)(xo);
}

LSC_INL int LSC_F(stats_bf16_)(char *p, lsc_n n, double inv64, int write, lsc_kstats *ks)
{
    const float inv = (float)inv64;
    LSC_F(v2d_) even = {0}, odd = {0};
    LSC_F(vw2_) vm = {0};
    double lane[4], extra = 0;
    uint16_t m = 0;
    LSC_GROUPS(p, n, 2, write, q, LSC_F(group_bf16_)(q, inv, write, &vm, &even, &odd, &extra));
    for (int l = 0; l < LSC_VBYTES / 2; l++)
        m = vm[l] > m ? vm[l] : m;
    lane[0] = even[0];
    lane[1] = odd[0];
    lane[2] = even[1];
    lane[3] = odd[1];
    {
        /* the largest input: the check, and (unscaled) the largest value left */
        float top = lsc_bf16_to_f32(m);
        if (write)
            top = lsc_bf16_to_f32((uint16_t)(lsc_f32_to_bf16(top * inv) & 0x7FFF));
        ks->sumsq = lsc_lanes_sum(lane) + extra;
        ks->maxbits = lsc_f32_bits(top);
    }
    return m >= LSC_EXP_BF16;
}

/* float32 / float64 with statistics, in the same pass and the same shape
 * (plain unscale is LSC_DEFINE_UNSCALE above: no lanes to keep): groups of
 * 32, the tail a group padded with zeros. */
LSC_INL void LSC_F(group32_)(char *q, float inv, int write, LSC_F(v4_) *acc, LSC_F(vu_) *vm)
{
    LSC_F(vf_) f[32 / LSC_HL];
    LSC_F(vu_) x[32 / LSC_HL];
#pragma GCC unroll 8
    for (int k = 0; k < 32 / LSC_HL; k++) {
        char *at = q + 4 * k * LSC_HL;
        memcpy(&x[k], at, sizeof(x[k]));
        memcpy(&f[k], &x[k], sizeof(x[k]));
        x[k] &= 0x7FFFFFFFu;
        if (write) {
            f[k] *= inv;
            memcpy(at, &f[k], sizeof(f[k]));
        }
    }
    LSC_F(group_f_)(f, acc);
    LSC_MAX_TREE(x, 32 / LSC_HL, LSC_MAXU32);
    *vm = LSC_MAXU32(*vm, x[0]);
}

LSC_INL int LSC_F(stats32_)(char *p, lsc_n n, double inv64, int write, lsc_kstats *ks)
{
    const float inv = (float)inv64;
    LSC_F(v4_) acc = {0};
    LSC_F(vu_) vm = {0};
    uint32_t m = 0;
    float top;
    LSC_GROUPS(p, n, 4, write, q, LSC_F(group32_)(q, inv, write, &acc, &vm));
    for (int l = 0; l < LSC_HL; l++)
        m = vm[l] > m ? vm[l] : m;
    top = lsc_f32_from_bits(m);
    if (write)
        top *= inv;
    ks->sumsq = LSC_F(sumsq_)(&acc);
    ks->maxbits = lsc_f32_bits(top) & 0x7FFFFFFFu;
    return m >= LSC_EXP_F32;
}

LSC_INL void LSC_F(group64_)(char *q, double inv, int write, LSC_F(v4_) *acc, LSC_F(vl_) *vm)
{
    LSC_F(vd_) d[LSC_NV];
    LSC_F(vl_) x[LSC_NV];
#pragma GCC unroll 16
    for (int k = 0; k < LSC_NV; k++) {
        char *at = q + 8 * k * LSC_DL;
        memcpy(&x[k], at, sizeof(x[k]));
        memcpy(&d[k], &x[k], sizeof(x[k]));
        x[k] &= 0x7FFFFFFFFFFFFFFFll;
        if (write) {
            d[k] *= inv;
            memcpy(at, &d[k], sizeof(d[k]));
        }
    }
    LSC_F(group_)(d, 0, acc);
    LSC_MAX_TREE(x, LSC_NV, LSC_MAXS64);
    *vm = LSC_MAXS64(*vm, x[0]);
}

LSC_INL int LSC_F(stats64_)(char *p, lsc_n n, double inv, int write, lsc_kstats *ks)
{
    LSC_F(v4_) acc = {0};
    LSC_F(vl_) vm = {0};
    double top;
    int64_t m = 0;
    uint64_t bits;
    LSC_GROUPS(p, n, 8, write, q, LSC_F(group64_)(q, inv, write, &acc, &vm));
    for (int l = 0; l < LSC_DL; l++)
        m = vm[l] > m ? vm[l] : m;
    memcpy(&top, &m, 8);
    if (write)
        top *= inv;
    memcpy(&bits, &top, 8);
    ks->sumsq = LSC_F(sumsq_)(&acc);
    ks->maxbits = bits & 0x7FFFFFFFFFFFFFFFull;
    return (uint64_t)m >= LSC_EXP_F64;
}

/* Unscale (write != 0) or only read a contiguous run, and gather the
 * statistics of the values it holds afterwards, in one pass.  Returns
 * whether an input was non-finite. */
static int LSC_F(stats_)(int code, char *p, lsc_n n, double inv, int write, lsc_kstats *ks)
{
    const double inv_used = code == LSC_CODE_F64 ? inv : (double)(float)inv;
    /* ks is never NULL here: the inlined loops then carry no test of it */
    if (!ks)
        __builtin_unreachable();
    if (write && inv_used - inv_used != 0) {
        /* an infinite or NaN inverse: the largest value left need not be the
           largest input's (0 * Inf), so the statistics read what it left */
        int found = code == LSC_CODE_F16    ? LSC_F(unscale_f16_)(p, n, inv)
                    : code == LSC_CODE_BF16 ? LSC_F(unscale_bf16_)(p, n, inv)
                    : code == LSC_CODE_F32  ? LSC_F(unscale_f32_)(p, n, inv)
                                            : LSC_F(unscale_f64_)(p, n, inv);
        LSC_F(stats_)(code, p, n, 1.0, 0, ks);
        return found;
    }
    switch (code) {
    case LSC_CODE_F16:
        return LSC_F(run_f16_)(p, n, inv, write, ks);
    case LSC_CODE_BF16:
        return LSC_F(stats_bf16_)(p, n, inv, write, ks);
    case LSC_CODE_F32:
        return write ? LSC_F(stats32_)(p, n, inv, 1, ks) : LSC_F(stats32_)(p, n, inv, 0, ks);
    default:
        return write ? LSC_F(stats64_)(p, n, inv, 1, ks) : LSC_F(stats64_)(p, n, inv, 0, ks);
    }
}

#undef LSC_HL
#undef LSC_DL
#undef LSC_NV
#undef LSC_MAX_TREE
#undef LSC_GROUPS
#undef LSC_INL

static const lsc_isa LSC_F(lsc_isa_) = {
    LSC_STR(LSC_SFX),
    {LSC_F(scan_u8_), LSC_F(scan_u16_), LSC_F(scan_u32_), LSC_F(scan_u64_)},
    {0, LSC_F(unscale_f16_), LSC_F(unscale_bf16_), LSC_F(unscale_f32_), LSC_F(unscale_f64_), 0, 0},
    LSC_F(stats_),
};

/* this copy is done: its parameters are free for the next one */
#undef LSC_F
#undef LSC_ANY_TOP
#undef LSC_VTEST
#undef LSC_F16C_LANES
#undef LSC_F32V
#undef LSC_H2F
#undef LSC_F2H
#undef LSC_PD_LO
#undef LSC_PD_HI
#undef LSC_FMA_PD
#undef LSC_MAXU16
#undef LSC_MAXU32
#undef LSC_MAXU16W
#undef LSC_MAXS64
#undef LSC_VBYTES
#undef LSC_SFX
