# Declarations of lsc_pool.h (the CPU kernels, the package's one thread pool and the
# scan's jobs on it) and lsc_layout.h (buffer extents, overlap and the disjointness proofs)
# for Cython.  The other extensions reach the pool through _pool_for.pxd.
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t

cdef extern from "lsc_pool.h" nogil:
    ctypedef int64_t lsc_n
    ctypedef struct lsc_run:
        char *data
        lsc_n n
        lsc_n stride
        const lsc_n *shape
        const lsc_n *strides
        int ndim
        int code
        int swapped
    ctypedef struct lsc_result:
        int found
        double sumsq
        double maxabs
    ctypedef struct lsc_isa:
        const char *name
    ctypedef struct lsc_format:
        int width
    const lsc_format lsc_formats[]
    enum:
        LSC_OP_SCAN
        LSC_OP_WRITE
        LSC_OP_STATS
    enum:
        LSC_NISAS
    const char *lsc_isa_names[]
    lsc_result lsc_exec(const lsc_run *runs, size_t nruns, lsc_n total_bytes, int op,
                        double inv, int threads)
    int lsc_isa_select(const char *name)
    int lsc_isa_supported(int level)
    const lsc_isa *lsc_isa_get()
    int lsc_contig(int op, int code, char *p, lsc_n n, double inv)
    int lsc_pool_size()
    ctypedef int (*lsc_chunk_fn)(void *ctx, size_t chunk) noexcept nogil
    int lsc_pool_for(lsc_chunk_fn fn, void *ctx, size_t nchunks, int threads)
    lsc_n lsc_elem_ps(int code, int op)
    int lsc_work_threaded(lsc_n work_ps)
    lsc_n lsc_chunk_elems(const lsc_run *run, int op)
    size_t lsc_pool_helper_chunks()
    uint64_t lsc_sum_u64(const char *p, lsc_n n)

cdef extern from "lsc_layout.h" nogil:
    ctypedef struct lsc_order:
        pass
    int lsc_may_overlap(int ndim, const cnp.npy_intp *shape, const cnp.npy_intp *strides,
                        cnp.npy_intp itemsize)
    void lsc_extent(const char *data, int ndim, const cnp.npy_intp *shape,
                    const cnp.npy_intp *strides, cnp.npy_intp itemsize, size_t *lo, size_t *hi)
    void lsc_order_init(lsc_order *o)
    void lsc_order_add(lsc_order *o, size_t lo, size_t hi, int owns)
    int lsc_disjoint(const lsc_order *o, void **objs, Py_ssize_t m, const void *skip)
