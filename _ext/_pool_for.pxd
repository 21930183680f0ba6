# The package's one thread pool, for any extension: the parallel-for of lsc_pool.h (its
# contract heads that header).  The pool lives in _scan, which exports lsc_pool_for as the
# capsule _scan._pool_for; an extension imports it once, at import
# (`cdef lsc_for_fn pool_for = pool_for_import()`), and so runs its chunks on the same
# helper threads as the scan instead of starting threads of its own.
from cpython.pycapsule cimport PyCapsule_Import

# the function types' one home is lsc_job.h
cdef extern from "lsc_job.h" nogil:
    ctypedef int (*lsc_chunk_fn)(void *ctx, size_t chunk) noexcept nogil
    ctypedef int (*lsc_for_fn)(lsc_chunk_fn fn, void *ctx, size_t nchunks,
                               int threads) noexcept nogil


cdef inline lsc_for_fn pool_for_import() except NULL:
    return <lsc_for_fn>PyCapsule_Import(b"lscore._ext._scan._pool_for", 0)
