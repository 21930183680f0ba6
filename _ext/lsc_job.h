/* lsc_job.h: one call's work cut in chunks for the package's thread pool,
 * shared by the float8 casts (lsc_fp8.h) and the MX block passes (lsc_mx.h).
 *
 * Design: the pool and its parallel-for live in the scan's extension
 * (lsc_pool.h, whose contract heads that header); another extension gets
 * lsc_pool_for as an lsc_for_fn pointer once, at import (_pool_for.pxd),
 * and hands it to its job.  A job is `lines` lines of n elements, cut from
 * the shape alone (never from the thread count); each chunk writes only
 * its own output, so the bytes are the same however the chunks are shared
 * out. */
#ifndef LSC_JOB_H
#define LSC_JOB_H

#include <stddef.h>
#include <stdint.h>

/* fn(ctx, chunk): chunk `chunk`'s work; nonzero stops the job */
typedef int (*lsc_chunk_fn)(void *ctx, size_t chunk);
/* the parallel-for, lsc_pool_for: fn over chunks [0, nchunks) on at most
 * `threads` threads (0: all the pool has, 1: the caller alone); 1 when a
 * chunk stopped the job */
typedef int (*lsc_for_fn)(lsc_chunk_fn fn, void *ctx, size_t nchunks, int threads);

/* Elements per chunk: about 30 us of casting on one core, a multiple of the
 * float8 cast's LSC_FP8_CHUNK, so that the parts of a contiguous line begin
 * on cache lines of the codes and two threads never write one line. */
#define LSC_JOB_CHUNK_ELEMS 32768
/* The fewest elements a call runs threaded when the thread count is left to
 * it: six chunks, about 60 us of casting.  Below it a helper woken from
 * sleep comes too late to take a chunk; on a 2-core AMD EPYC under load the
 * bfloat16 cast of 1e5 to 1e6 elements took the same time with one thread
 * and with two (the caller never waits for a helper that has not started),
 * and at 3e6 the best of 100 two-thread runs was 1.47x the one-thread
 * best. */
#define LSC_JOB_MT_MIN_ELEMS 200000

/* How a job's lines are cut: a line longer than a chunk in `parts` parts of
 * `piece` elements (the last one shorter), else `rows` whole lines a chunk. */
typedef struct {
    int64_t parts, piece, rows;
    size_t nchunks;
} lsc_job_cut;

/* The cut of `lines` lines of n elements: a line longer than
 * LSC_JOB_CHUNK_ELEMS in parts of a multiple of `align` elements (align 0:
 * a line is never split), shorter lines as many a chunk as it holds (one at
 * least). */
static inline lsc_job_cut lsc_job_cut_lines(int64_t lines, int64_t n, int64_t align)
{
    lsc_job_cut c;
    if (align > 0 && n > LSC_JOB_CHUNK_ELEMS) {
        c.piece = LSC_JOB_CHUNK_ELEMS / align * align;
        c.parts = (n + c.piece - 1) / c.piece;
        c.rows = 1;
        c.nchunks = (size_t)(lines * c.parts);
    } else {
        c.piece = n;
        c.parts = 1;
        c.rows = n < LSC_JOB_CHUNK_ELEMS ? LSC_JOB_CHUNK_ELEMS / (n > 0 ? n : 1) : 1;
        c.nchunks = (size_t)((lines + c.rows - 1) / c.rows);
    }
    return c;
}

/* The threads a job of `elems` elements asks the pool for: `threads`, and
 * for 0 (by its size) the caller alone below LSC_JOB_MT_MIN_ELEMS. */
static inline int lsc_job_threads(int threads, int64_t elems)
{
    return threads == 0 && elems < LSC_JOB_MT_MIN_ELEMS ? 1 : threads;
}

#endif /* LSC_JOB_H */
