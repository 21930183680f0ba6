/* lsc_nvfp4_cpu.h: the CPU passes of lsc_nvfp4.h's NVFP4 recipe (included
 * by it on the CPU), one job on the package's thread pool per call.
 *
 * Design: a call quantizes a 2-D view (rows x cols, rows rs bytes apart,
 * contiguous elements; float32, float16 or bfloat16) in one orientation,
 * with the global amax A already known (the Hadamard transform's from
 * lsc_nv4_job_rht's amax pass).  Two passes, as lsc_mx.h's:
 *   rows  (axis -1, blocks of 16 along a row): per group of blocks, the
 *         block amaxes, the scales and factors across the group, the codes
 *         (stochastic: the group's draws first, one per block);
 *   bands (axis 0, TE's columnwise copy, blocks of 16 down a column; or
 *         16 x 16 tiles in either orientation): 16 rows by up to
 *         LSC_NV4_TILE columns into an L1 tile (the Hadamard transform
 *         applied down its columns and rounded to bfloat16), the column
 *         amaxes, the scales (per column, or per tile of 16 columns), the
 *         codes (axis 0: rows 2p and 2p + 1 of a column in one byte, the
 *         first in the low nibble; tiles along axis -1: columns paired).
 * The per-level kernels over contiguous rows are lsc_nvfp4_kern.c's, one
 * translation unit compiled per ISA level (lsc_isa.h), picked at run time;
 * a chunk writes only its own scales and codes and every random draw is a
 * function of the element's place, so the bytes are the same at every
 * level and with any number of threads.  Layouts (uint8, C order): rows:
 * scales (rows, cols / 16), codes (rows, cols / 2); axis 0: scales (rows /
 * 16, cols), codes (rows / 2, cols); tiles: scales (rows / 16, cols / 16)
 * in both orientations, codes as the orientation's. */
#ifndef LSC_NVFP4_CPU_H
#define LSC_NVFP4_CPU_H

#include <stdatomic.h>
#include <stdint.h>

#include "lsc_job.h"

#define LSC_NV4_GROUP 32   /* blocks of a row taken together (512 elements) */
#define LSC_NV4_TILE 256   /* columns of a band's tile */

/* A call's rule: the global amax and what it gives, the orientation and
 * options, and the view's shape (the draws' subsequences need it). */
typedef struct {
    float amax, senc, sdec, mult;
    int axis, tile, rht, sr;
    lsc_u32 key[2], ofs[2];   /* the seed and the offset, low word first */
    int64_t rows, cols;
} lsc_nv4_rule;

/* The rule's derived scales (S_enc, S_dec, mult) from its amax. */
static inline void lsc_nv4_prepare(lsc_nv4_rule *k)
{
    k->senc = lsc_nv4_senc(k->amax);
    k->sdec = 1.0f / k->senc;
    k->mult = lsc_nv4_mult(k->senc);
}

/* One contiguous row piece of n elements (a multiple of 16) whose first
 * block has subsequence `sub`: n / 16 scales into s, n / 2 bytes into q. */
typedef void (*lsc_nv4_row_fn)(const char *x, int64_t n, const lsc_nv4_rule *k, lsc_u64 sub,
                               unsigned char *s, unsigned char *q);
/* The w columns from column c0 of band `band` (x: its first row at c0, rows
 * rs bytes apart) into the scales s and codes q of the whole view. */
typedef void (*lsc_nv4_band_fn)(const char *x, int64_t w, int64_t rs, const lsc_nv4_rule *k,
                                int64_t band, int64_t c0, unsigned char *s, unsigned char *q);
/* The Hadamard transform of a bfloat16 band's w columns (rows rs bytes
 * apart) into out (rows ldo words apart; NULL: none); the amax bits of
 * its bfloat16 results, NaN left out. */
typedef lsc_u32 (*lsc_nv4_rht_fn)(const char *x, int64_t w, int64_t rs, lsc_u16 *out,
                                  int64_t ldo);

/* One ISA level's kernels, by input code. */
typedef struct {
    const char *name;
    lsc_nv4_row_fn row[LSC_NCODES];
    lsc_nv4_band_fn band[LSC_NCODES];
    lsc_nv4_rht_fn rht;
} lsc_nv4_isa;

#ifndef LSC_LEVEL   /* the extension's own unit: the levels' tables and the jobs */

#ifdef LSC_X86_DISPATCH
LSC_ISA_TABLE extern const lsc_nv4_isa lsc_nv4_isa_v2, lsc_nv4_isa_v3, lsc_nv4_isa_v4;
static const void *const lsc_nv4_isas[LSC_NISAS] = {&lsc_nv4_isa_v2, &lsc_nv4_isa_v3,
                                                    &lsc_nv4_isa_v4};
#else
LSC_ISA_TABLE extern const lsc_nv4_isa lsc_nv4_isa_baseline;
static const void *const lsc_nv4_isas[LSC_NISAS] = {&lsc_nv4_isa_baseline};
#endif
static lsc_isa_family lsc_nv4_family = {lsc_nv4_isas};

static inline int lsc_nv4_isa_select(const char *name)
{
    return lsc_isa_choose(&lsc_nv4_family, name);
}

static inline const lsc_nv4_isa *lsc_nv4_isa_get(void)
{
    return (const lsc_nv4_isa *)lsc_isa_table(&lsc_nv4_family);
}

enum { LSC_NV4_JOB_ROWS = 0, LSC_NV4_JOB_BANDS = 1, LSC_NV4_JOB_RHT = 2 };

/* A job: `kind`, the view, the rule (ROWS, BANDS) or the transform's
 * output (RHT: out, NULL for the amax alone), and the cut of its lines
 * (rows, or bands of 16 rows). */
typedef struct {
    int kind, code;
    const char *x;
    int64_t rows, cols, rs;
    const lsc_nv4_rule *k;
    unsigned char *s, *q;
    lsc_u16 *out;
    _Atomic lsc_u32 amax;
    lsc_job_cut cut;
} lsc_nv4_job;

static void lsc_nv4_job_amax(lsc_nv4_job *j, lsc_u32 m)
{
    lsc_u32 old = atomic_load_explicit(&j->amax, memory_order_relaxed);
    while (m > old && !atomic_compare_exchange_weak(&j->amax, &old, m)) {
    }
}

static int lsc_nv4_job_chunk(void *ctx, size_t chunk)
{
    lsc_nv4_job *j = (lsc_nv4_job *)ctx;
    const lsc_nv4_isa *isa = lsc_nv4_isa_get();
    const int64_t c = (int64_t)chunk, width = LSC_MX_WIDTH(j->code);
    const int64_t parts = j->cut.parts, nlines = j->kind == LSC_NV4_JOB_ROWS ? j->rows
                                                                              : j->rows / 16;
    /* a line (row or band) range, or a piece of one line: columns [c0, c1) */
    int64_t l0 = c * j->cut.rows, l1 = l0 + j->cut.rows, c0 = 0, c1 = j->cols;
    if (parts > 1) {
        const int64_t per = j->kind == LSC_NV4_JOB_ROWS ? j->cut.piece : j->cut.piece / 16;
        l0 = c / parts;
        l1 = l0 + 1;
        c0 = (c % parts) * per;
        c1 = c0 + per < j->cols ? c0 + per : j->cols;
    }
    l1 = l1 < nlines ? l1 : nlines;
    for (int64_t l = l0; l < l1; l++) {
        if (j->kind == LSC_NV4_JOB_ROWS) {
            const lsc_u64 sub = (lsc_u64)(l * (j->cols / 16) + c0 / 16);
            isa->row[j->code](j->x + l * j->rs + c0 * width, c1 - c0, j->k, sub,
                              j->s + l * (j->cols / 16) + c0 / 16,
                              j->q + l * (j->cols / 2) + c0 / 2);
        } else if (j->kind == LSC_NV4_JOB_BANDS) {
            isa->band[j->code](j->x + 16 * l * j->rs + c0 * width, c1 - c0, j->rs, j->k, l, c0,
                               j->s, j->q);
        } else {
            lsc_u16 *o = j->out ? j->out + 16 * l * j->cols + c0 : NULL;
            lsc_nv4_job_amax(j, isa->rht(j->x + 16 * l * j->rs + c0 * 2, c1 - c0, j->rs, o,
                                         j->cols));
        }
    }
    return 0;
}

/* Run a job of `kind` over the rows x cols view x (rows rs bytes apart;
 * BANDS and RHT: rows a multiple of 16; ROWS and tiles: cols a multiple of
 * 16) on at most `threads` threads (0: by the size); RHT returns the amax
 * bits of the transform, NaN left out. */
static lsc_u32 lsc_nv4_job_run(int kind, const char *x, int64_t rows, int64_t cols, int64_t rs,
                               int code, const lsc_nv4_rule *k, unsigned char *s,
                               unsigned char *q, lsc_u16 *out, lsc_for_fn pool_for, int threads)
{
    lsc_nv4_job j;
    j.kind = kind;
    j.code = code;
    j.x = x;
    j.rows = rows;
    j.cols = cols;
    j.rs = rs;
    j.k = k;
    j.s = s;
    j.q = q;
    j.out = out;
    atomic_init(&j.amax, 0u);
    if (rows <= 0 || cols <= 0)
        return 0u;
    /* rows: pieces of whole blocks; bands: 16 rows of pieces of 16 columns */
    j.cut = kind == LSC_NV4_JOB_ROWS ? lsc_job_cut_lines(rows, cols, 16)
                                     : lsc_job_cut_lines(rows / 16, 16 * cols, 256);
    pool_for(lsc_nv4_job_chunk, &j, j.cut.nchunks, lsc_job_threads(threads, rows * cols));
    return atomic_load(&j.amax);
}

#endif /* LSC_LEVEL */
#endif /* LSC_NVFP4_CPU_H */
