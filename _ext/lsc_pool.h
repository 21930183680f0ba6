/* lsc_pool.h: the package's one thread pool, a chunked parallel-for, and
 * the scan's jobs on it (a table of buffers through lsc_scan.h, serially or
 * split over the pool).
 *
 * The parallel-for (what other kernels use; see lsc_pool_for below):
 *
 *     typedef int (*lsc_chunk_fn)(void *ctx, size_t chunk);
 *     int lsc_pool_for(lsc_chunk_fn fn, void *ctx, size_t nchunks, int threads);
 *
 * runs fn(ctx, c) once for every chunk c in [0, nchunks), on the calling
 * thread and on helpers that turn up, and returns when every chunk is done.
 * fn must not touch Python and must write only what chunk c owns: its part
 * of the output and its slot of a per-chunk result array in ctx, which the
 * caller combines in chunk order after the call, so the result does not
 * depend on which thread did which chunk, nor on how many there were.  The
 * chunks must be cut from the work alone (never from the thread count).  A
 * nonzero return from fn stops the job: chunks not yet claimed are not run
 * (the scan's early exit); lsc_pool_for then returns 1.  threads: at most
 * this many threads run chunks, the caller included (1: the caller alone,
 * in chunk order; 0: as many as the pool has); the caller decides by its
 * work whether threads pay (the wake-up of a helper costs microseconds).
 * The pool lives in the scan's extension (_scan.pyx); another extension
 * gets this function from it as a capsule (_pool_for.pxd), so there is one
 * set of helper threads in the process.
 *
 * Design: every participant claims the next chunk with one atomic add until
 * none is left.  The caller works from the start, so a helper that is late
 * (asleep, or descheduled because the other core is busy) simply finds
 * fewer chunks or none: nobody waits for a helper that has not started, and
 * the caller waits at the end only for a helper in the middle of one chunk
 * (spinning briefly, then sleeping so the scheduler can run that helper on
 * the caller's core).  An OpenMP parallel region ends with a barrier that
 * waits for its whole team, so when another process holds the second core
 * of a 2-core machine the caller stalls until the scheduler runs the late
 * thread (milliseconds, a scheduler tick or more); this pool's caller never
 * waits for a helper that has not started.  One job runs at a time: a
 * second caller meanwhile (another Python thread, or a chunk function
 * calling lsc_pool_for) runs its chunks serially.  The scan's statistics
 * are kept per chunk and summed in chunk order, so the result has the same
 * bits with any number of threads.  Helpers never touch Python; the GIL is
 * released by the caller.
 */
#ifndef LSC_POOL_H
#define LSC_POOL_H

#include "lsc_scan.h"

#if (defined(__unix__) || defined(__APPLE__)) && !defined(LSC_NO_THREADS) \
        && !defined(__STDC_NO_ATOMICS__)
#define LSC_THREADS 1
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <sched.h>
#include <unistd.h>
#endif

/* Work unit claimed by one thread.  A scan's chunk is 256 KiB; a chunk of
 * an unscale (with or without statistics) is LSC_CHUNK_PS of work, by the
 * cost of its elements (lsc_elem_ps), so an array that costs more per byte
 * is split into more chunks and reaches the pool at fewer bytes.  The chunk
 * size depends on the run and the op only, never on the thread count: the
 * statistics, kept per chunk and summed in chunk order, are a reduction tree
 * of one fixed shape. */
#define LSC_CHUNK_BYTES (256 * 1024)
#define LSC_CHUNK_PS 2000000
#define LSC_MAX_THREADS 8
/* Automatic threading starts at these sizes; below them the wake-up of a
 * helper costs more than it saves (a helper takes a chunk only while the
 * caller has at least one more to do, so a job needs three chunks or more).
 * Measured with `lscore bench`. */
#define LSC_MT_MIN_BYTES_SCAN (2 * 1024 * 1024)
#define LSC_MT_MIN_PS 5000000
/* How long an idle helper polls for the next job before it sleeps, and how
 * long the caller polls for a helper finishing its chunk. */
#define LSC_HELPER_SPIN_NS 50000
#define LSC_CALLER_SPIN_NS 20000

/* Picoseconds one core spends on an element of a contiguous run under a
 * writing or statistics op: the vector kernels at x86-64-v3 (AVX2, F16C) on
 * an AMD Zen 3 core, data in L2, the best of five runs of 1e5 elements.
 * A wider or newer core takes less; the proportions are what matters for
 * the chunks, and the absolute figures place the threading threshold. */
static inline lsc_n lsc_elem_ps(int code, int op)
{
    const int stats = (op & LSC_OP_STATS) != 0;
    switch (code) {
    case LSC_CODE_F16: return stats ? 309 : 111;
    case LSC_CODE_BF16: return stats ? 285 : 105;
    case LSC_CODE_F32: return stats ? 159 : 68;
    case LSC_CODE_F64: return stats ? 187 : 151;
    default: return 68;
    }
}

/* The work of a run under op, in picoseconds (bytes for a scan). */
static inline lsc_n lsc_run_work(const lsc_run *run, int op)
{
    if (run->code == LSC_CODE_INT || run->n <= 0)
        return 0;
    if (op == LSC_OP_SCAN)
        return run->n * lsc_formats[run->code].width;
    return run->n * lsc_elem_ps(run->code, op);
}

static inline lsc_n lsc_chunk_elems(const lsc_run *run, int op)
{
    if (run->ndim > 1)
        return run->n > 0 ? run->n : 1;
    if (op == LSC_OP_SCAN)
        return LSC_CHUNK_BYTES / lsc_formats[run->code].width;
    /* a multiple of the 32 statistics lanes */
    return (LSC_CHUNK_PS / lsc_elem_ps(run->code, op)) & ~(lsc_n)31;
}

static inline size_t lsc_run_chunks(const lsc_run *run, int op)
{
    lsc_n ce;
    if (run->code == LSC_CODE_INT || run->n <= 0)
        return 0;
    if (run->ndim > 1)
        return 1;
    ce = lsc_chunk_elems(run, op);
    return (size_t)((run->n + ce - 1) / ce);
}

/* Chunk k of a run: elements [lo, hi); its statistics go to *r. */
static int lsc_do_chunk(const lsc_run *run, size_t k, int op, double inv, lsc_result *r)
{
    lsc_n ce = lsc_chunk_elems(run, op), lo = (lsc_n)k * ce;
    lsc_n hi = run->n - lo < ce ? run->n : lo + ce;
    r->sumsq = 0;
    r->maxabs = 0;
    r->found = lsc_do_range(run, lo, hi, op, inv, r);
    return r->found;
}

/* The bytes a run touches: [*lo, *hi). */
static void lsc_run_span(const lsc_run *run, uintptr_t *lo, uintptr_t *hi)
{
    intptr_t a = 0, b = 0;
    if (run->ndim <= 1) {
        intptr_t last = (intptr_t)(run->n - 1) * (intptr_t)run->stride;
        a = last < 0 ? last : 0;
        b = last < 0 ? 0 : last;
    } else {
        for (int k = 0; k < run->ndim; k++) {
            intptr_t last = (intptr_t)(run->shape[k] - 1) * (intptr_t)run->strides[k];
            if (last < 0)
                a += last;
            else
                b += last;
        }
    }
    *lo = (uintptr_t)run->data + (uintptr_t)a;
    *hi = (uintptr_t)run->data + (uintptr_t)b + (uintptr_t)lsc_formats[run->code].width;
}

static int lsc_span_cmp(const void *x, const void *y)
{
    uintptr_t a = ((const uintptr_t *)x)[0], b = ((const uintptr_t *)y)[0];
    return a < b ? -1 : a > b;
}

/* Do two runs share bytes?  (Two views of one buffer in the same call.)
 * Their chunks must then not be written by two threads at once: the caller
 * runs such a job serially, in table order, as the reference does.  Also 1
 * when the check cannot be made (out of memory). */
static int lsc_runs_overlap(const lsc_run *runs, size_t nruns)
{
    uintptr_t *spans;
    size_t m = 0;
    int overlap = 0;
    if (nruns < 2)
        return 0;
    spans = (uintptr_t *)malloc(2 * nruns * sizeof(uintptr_t));
    if (!spans)
        return 1;
    for (size_t i = 0; i < nruns; i++)
        if (runs[i].code != LSC_CODE_INT && runs[i].n > 0) {
            lsc_run_span(&runs[i], &spans[2 * m], &spans[2 * m + 1]);
            m++;
        }
    qsort(spans, m, 2 * sizeof(uintptr_t), lsc_span_cmp);
    for (size_t i = 1, top = 1; i < m && !overlap; i++) {
        overlap = spans[2 * i] < spans[top];      /* starts before the furthest end so far */
        if (spans[2 * i + 1] > spans[top])
            top = 2 * i + 1;
    }
    free(spans);
    return overlap;
}

/* The whole job on the calling thread. */
static lsc_result lsc_exec_serial(const lsc_run *runs, size_t nruns, int op, double inv)
{
    lsc_result total = {0, 0.0, 0.0}, cr;
    lsc_cascade sums;
    lsc_cascade_init(&sums);
    for (size_t i = 0; i < nruns; i++) {
        const lsc_run *run = &runs[i];
        int found;
        if (run->code == LSC_CODE_INT || run->n <= 0)
            continue;
        if (op & LSC_OP_STATS) {
            /* chunk by chunk, exactly as the threads do, for the same sums */
            for (size_t k = 0, nc = lsc_run_chunks(run, op); k < nc; k++) {
                lsc_do_chunk(run, k, op, inv, &cr);
                lsc_cascade_add(&sums, &cr);
            }
            continue;
        }
        if (run->ndim <= 1 && !run->swapped && run->stride == lsc_formats[run->code].width)
            /* the common case, straight to the kernel (many small arrays) */
            found = lsc_contig(op, run->code, run->data, run->n, inv);
        else
            found = lsc_do_range(run, 0, run->n, op, inv, &cr);
        if (found) {
            total.found = 1;
            if (op == LSC_OP_SCAN)
                return total;
        }
    }
    return (op & LSC_OP_STATS) ? lsc_cascade_end(&sums) : total;
}

/* A chunk's work (see the top of this file): lsc_job.h's lsc_chunk_fn. */
#include "lsc_job.h"

#ifdef LSC_THREADS

/* The job of one lsc_pool_for call (on the caller's stack). */
typedef struct {
    lsc_chunk_fn fn;
    void *ctx;
    size_t nchunks;
    int max_helpers;
    atomic_size_t next;         /* next chunk to claim */
    atomic_int stop;            /* a chunk asked to stop */
    atomic_int seats;           /* helpers that joined */
} lsc_job;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;        /* helpers sleep here between jobs */
    pthread_cond_t done;        /* the caller sleeps here for a late helper */
    int nhelpers;
    _Atomic(lsc_job *) job;
    atomic_uint gen;            /* bumped once per job */
    atomic_int active;          /* helpers between joining and leaving a job */
    atomic_int closed;          /* the current job takes no more helpers */
    atomic_int sleeping;
    atomic_int caller_waiting;
    atomic_int busy;            /* a caller owns the pool */
} lsc_pool;

static lsc_pool *lsc_pool_g;
static atomic_int lsc_pool_state;   /* 0 none, 1 being built, 2 ready, 3 unavailable */
static atomic_size_t lsc_helper_chunks;   /* chunks done by helpers, ever (for tests) */

/* One turn of a polling loop.  Every 16th turn gives the CPU away: when the
 * other core is busy, the thread we wait for may be queued on this very CPU
 * (a helper woken onto the caller's core, or the caller preempted by one). */
static inline void lsc_poll_pause(int spins)
{
    if ((spins & 15) == 15) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int64_t lsc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Claim and do chunks until none is left; returns how many were done.  A
 * helper leaves the last chunk to the caller: a helper preempted inside it
 * (the other core busy) would make the caller wait for it. */
static size_t lsc_job_work(lsc_job *j, int helper)
{
    size_t done = 0;
    for (;; done++) {
        size_t c;
        if (atomic_load_explicit(&j->stop, memory_order_relaxed))
            return done;
        if (helper && atomic_load_explicit(&j->next, memory_order_relaxed) + 1 >= j->nchunks)
            return done;
        c = atomic_fetch_add(&j->next, 1);
        if (c >= j->nchunks)
            return done;
        if (j->fn(j->ctx, c))
            atomic_store_explicit(&j->stop, 1, memory_order_relaxed);
    }
}

static unsigned lsc_helper_wait(lsc_pool *P, unsigned seen)
{
    int64_t deadline = lsc_now_ns() + LSC_HELPER_SPIN_NS;
    unsigned g;
    for (int spins = 0; (g = atomic_load(&P->gen)) == seen; spins++) {
        if ((spins & 63) == 63 && lsc_now_ns() > deadline) {
            pthread_mutex_lock(&P->mu);
            atomic_fetch_add(&P->sleeping, 1);
            while ((g = atomic_load(&P->gen)) == seen)
                pthread_cond_wait(&P->wake, &P->mu);
            atomic_fetch_sub(&P->sleeping, 1);
            pthread_mutex_unlock(&P->mu);
            return g;
        }
        lsc_poll_pause(spins);
    }
    return g;
}

static void *lsc_helper_main(void *arg)
{
    lsc_pool *P = (lsc_pool *)arg;
    unsigned seen = atomic_load(&P->gen);
    for (;;) {
        seen = lsc_helper_wait(P, seen);
        /* join, then look: the caller closes, then waits for active == 0,
           so a helper that joins late either sees closed or is waited for */
        atomic_fetch_add(&P->active, 1);
        if (!atomic_load(&P->closed)) {
            lsc_job *j = atomic_load(&P->job);
            if (atomic_fetch_add(&j->seats, 1) < j->max_helpers)
                atomic_fetch_add_explicit(&lsc_helper_chunks, lsc_job_work(j, 1),
                                          memory_order_relaxed);
        }
        if (atomic_fetch_sub(&P->active, 1) == 1 && atomic_load(&P->caller_waiting)) {
            pthread_mutex_lock(&P->mu);
            pthread_cond_broadcast(&P->done);
            pthread_mutex_unlock(&P->mu);
        }
    }
    return NULL;
}

static int lsc_cpu_count(void)
{
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        return CPU_COUNT(&set);
#endif
    {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (int)n : 1;
    }
}

/* A forked child has none of the parent's helpers: start afresh. */
static void lsc_pool_atfork_child(void)
{
    lsc_pool_g = NULL;
    atomic_store(&lsc_pool_state, 0);
}

/* Threads the pool runs (callers included): min(CPUs, LSC_MAX_THREADS),
 * capped by the environment variable LSCORE_NUM_THREADS. */
static int lsc_pool_threads_wanted(void)
{
    int n = lsc_cpu_count();
    const char *env = getenv("LSCORE_NUM_THREADS");
    if (n > LSC_MAX_THREADS)
        n = LSC_MAX_THREADS;
    if (env && *env) {
        int e = atoi(env);
        if (e >= 1 && e < n)
            n = e;
    }
    return n;
}

static lsc_pool *lsc_pool_build(void)
{
    static int atfork_done;
    int n = lsc_pool_threads_wanted() - 1;
    lsc_pool *P;
    pthread_attr_t attr;
    sigset_t all, old;
    if (n < 1)
        return NULL;
    P = (lsc_pool *)calloc(1, sizeof(lsc_pool));
    if (!P)
        return NULL;
    pthread_mutex_init(&P->mu, NULL);
    pthread_cond_init(&P->wake, NULL);
    pthread_cond_init(&P->done, NULL);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* 4 MiB: a kernel's frame is about 34 KB in the normal build, but ASan gives each
     * inlined local its own slot and redzones (lsc_mx_quantize_rows: 350 KB), and a
     * helper whose stack overflows dies with no report (it blocks SIGSEGV, below) */
    pthread_attr_setstacksize(&attr, 4 * 1024 * 1024);
    /* helpers take no signals: Python handles them on the main thread */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, lsc_helper_main, P) != 0)
            break;
        P->nhelpers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, lsc_pool_atfork_child);
        atfork_done = 1;
    }
    /* a pool whose threads failed to start stays allocated and unused:
       a helper that did start holds a pointer to it */
    return P->nhelpers ? P : NULL;
}

/* The pool, built on first use; NULL while another thread builds it or when
 * threads are unavailable (then the call runs serially). */
static lsc_pool *lsc_pool_get(void)
{
    int expected = 0;
    int s = atomic_load(&lsc_pool_state);
    if (s == 2)
        return lsc_pool_g;
    if (s != 0 || !atomic_compare_exchange_strong(&lsc_pool_state, &expected, 1))
        return NULL;
    lsc_pool_g = lsc_pool_build();
    atomic_store(&lsc_pool_state, lsc_pool_g ? 2 : 3);
    return lsc_pool_g;
}

/* The job on the pool P (owned by this caller): returns 1 when a chunk
 * stopped it. */
static int lsc_pool_run(lsc_pool *P, lsc_chunk_fn fn, void *ctx, size_t nchunks, int threads)
{
    lsc_job j;
    int64_t deadline;
    j.fn = fn;
    j.ctx = ctx;
    j.nchunks = nchunks;
    j.max_helpers = threads > 0 && threads - 1 < P->nhelpers ? threads - 1 : P->nhelpers;
    atomic_init(&j.next, 0);
    atomic_init(&j.stop, 0);
    atomic_init(&j.seats, 0);
    atomic_store(&P->job, &j);
    atomic_store(&P->closed, 0);
    atomic_fetch_add(&P->gen, 1);
    if (atomic_load(&P->sleeping) > 0) {
        pthread_mutex_lock(&P->mu);
        pthread_cond_broadcast(&P->wake);
        pthread_mutex_unlock(&P->mu);
    }
    lsc_job_work(&j, 0);
    atomic_store(&P->closed, 1);
    /* wait for helpers still inside a chunk */
    deadline = lsc_now_ns() + LSC_CALLER_SPIN_NS;
    for (int spins = 0; atomic_load(&P->active) > 0; spins++) {
        if ((spins & 63) == 63 && lsc_now_ns() > deadline) {
            pthread_mutex_lock(&P->mu);
            atomic_store(&P->caller_waiting, 1);
            while (atomic_load(&P->active) > 0)
                pthread_cond_wait(&P->done, &P->mu);
            atomic_store(&P->caller_waiting, 0);
            pthread_mutex_unlock(&P->mu);
            break;
        }
        lsc_poll_pause(spins);
    }
    return atomic_load(&j.stop);
}

#endif /* LSC_THREADS */

/* Chunks helpers have done since the start (tests check the pool works). */
static size_t lsc_pool_helper_chunks(void)
{
#ifdef LSC_THREADS
    return atomic_load(&lsc_helper_chunks);
#else
    return 0;
#endif
}

/* The size of the pool (callers included); 1 where threads are unavailable. */
static int lsc_pool_size(void)
{
#ifdef LSC_THREADS
    return lsc_pool_threads_wanted();
#else
    return 1;
#endif
}

/* fn(ctx, c) for every chunk c of [0, nchunks): the contract at the top of
 * this file.  A job of fewer than three chunks runs on the caller alone (a
 * helper takes a chunk only while the caller has another one to do), as
 * does every job where threads are unavailable or the pool is taken. */
static int lsc_pool_for(lsc_chunk_fn fn, void *ctx, size_t nchunks, int threads)
{
#ifdef LSC_THREADS
    if (threads != 1 && nchunks >= 3) {
        lsc_pool *P = lsc_pool_get();
        int expected = 0;
        if (P && atomic_compare_exchange_strong(&P->busy, &expected, 1)) {
            int stopped = lsc_pool_run(P, fn, ctx, nchunks, threads);
            atomic_store(&P->busy, 0);
            return stopped;
        }
    }
#else
    (void)threads;
#endif
    for (size_t c = 0; c < nchunks; c++)
        if (fn(ctx, c))
            return 1;
    return 0;
}

#ifdef LSC_THREADS

/* A scan job on the pool: the runs cut into chunks (lsc_run_chunks), one
 * result per chunk for the statistics. */
typedef struct {
    const lsc_run *runs;
    size_t nruns;
    const size_t *first;        /* first[i]: first chunk of run i; first[nruns] = nchunks */
    size_t base;                /* the job's chunk c is the pool's chunk c - base */
    int op;
    double inv;
    lsc_result *chunk_res;      /* one per chunk, for statistics */
    atomic_int found;
} lsc_scan_job;

/* Chunk c - base of the job (an lsc_chunk_fn): stops a scan that found a
 * non-finite element. */
static int lsc_scan_chunk(void *ctx, size_t k)
{
    lsc_scan_job *j = (lsc_scan_job *)ctx;
    size_t c = k + j->base;
    /* the run holding chunk c: the last i with first[i] <= c */
    size_t lo = 0, hi = j->nruns;
    lsc_result r;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (j->first[mid] <= c)
            lo = mid;
        else
            hi = mid;
    }
    lsc_do_chunk(&j->runs[lo], c - j->first[lo], j->op, j->inv, &r);
    if (j->chunk_res)
        j->chunk_res[c] = r;
    if (!r.found)
        return 0;
    atomic_store_explicit(&j->found, 1, memory_order_relaxed);
    return j->op == LSC_OP_SCAN;
}

static lsc_result lsc_exec_pool(const lsc_run *runs, size_t nruns, int op, double inv,
                                int threads)
{
    lsc_result total = {0, 0.0, 0.0};
    size_t *first = (size_t *)malloc((nruns + 1) * sizeof(size_t));
    size_t nchunks;
    lsc_scan_job j;
    if (!first)
        return lsc_exec_serial(runs, nruns, op, inv);
    first[0] = 0;
    for (size_t i = 0; i < nruns; i++)
        first[i + 1] = first[i] + lsc_run_chunks(&runs[i], op);
    nchunks = first[nruns];
    j.runs = runs;
    j.nruns = nruns;
    j.first = first;
    j.base = 0;
    j.op = op;
    j.inv = inv;
    j.chunk_res = NULL;
    atomic_init(&j.found, 0);
    if (op & LSC_OP_STATS) {
        j.chunk_res = (lsc_result *)malloc((nchunks ? nchunks : 1) * sizeof(lsc_result));
        if (!j.chunk_res) {
            free(first);
            return lsc_exec_serial(runs, nruns, op, inv);
        }
    }
    /* a scan looks at its first chunk alone: a NaN up front (the common
       overflow) is answered without waking anybody */
    if (op == LSC_OP_SCAN && nchunks && lsc_scan_chunk(&j, 0)) {
        free(first);
        total.found = 1;
        return total;
    }
    j.base = op == LSC_OP_SCAN ? 1 : 0;
    lsc_pool_for(lsc_scan_chunk, &j, nchunks - j.base, threads);
    total.found = atomic_load(&j.found);
    if (j.chunk_res) {
        lsc_cascade sums;
        lsc_cascade_init(&sums);
        for (size_t c = 0; c < nchunks; c++)
            lsc_cascade_add(&sums, &j.chunk_res[c]);
        free(j.chunk_res);
        sums.r.found |= total.found;
        total = lsc_cascade_end(&sums);
    }
    free(first);
    return total;
}

#endif /* LSC_THREADS */

/* Run `op` over the runs.  threads: 0 picks by the work (serial below
 * LSC_MT_MIN_BYTES_SCAN or LSC_MT_MIN_PS), 1 is serial, k uses at most k
 * threads. */
static lsc_result lsc_exec(const lsc_run *runs, size_t nruns, lsc_n total_bytes, int op,
                           double inv, int threads)
{
#ifdef LSC_THREADS
    lsc_n work = 0;
    size_t nchunks = 0;
    (void)total_bytes;
    for (size_t i = 0; i < nruns; i++) {
        work += lsc_run_work(&runs[i], op);
        if (nchunks < 3)
            nchunks += lsc_run_chunks(&runs[i], op);
    }
    if (threads == 0)
        threads = work >= (op == LSC_OP_SCAN ? LSC_MT_MIN_BYTES_SCAN : LSC_MT_MIN_PS)
                      ? LSC_MAX_THREADS : 1;
    if (threads > 1 && nchunks >= 3
            && !((op & LSC_OP_WRITE) && lsc_runs_overlap(runs, nruns))) {
        if (lsc_pool_get())
            return lsc_exec_pool(runs, nruns, op, inv, threads);
    }
#else
    (void)total_bytes;
    (void)threads;
#endif
    return lsc_exec_serial(runs, nruns, op, inv);
}

/* Whether a writing op of this work (lsc_elem_ps summed) runs threaded when
 * the thread count is left to lsc_exec. */
static inline int lsc_work_threaded(lsc_n work_ps)
{
#ifdef LSC_THREADS
    return work_ps >= LSC_MT_MIN_PS;
#else
    (void)work_ps;
    return 0;
#endif
}

#endif /* LSC_POOL_H */
