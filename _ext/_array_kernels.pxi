# The preamble of the modules that hand NumPy arrays to a family of C kernels run on the
# package's thread pool (_fp8.pyx, _mx.pyx): NumPy's C API, the dtype codes, NumPy's
# float16 and user dtype numbers (an input's dtype code), and the pool's parallel-for.
cimport numpy as cnp
from libc.stdint cimport int64_t, uint32_t

from _dtypes cimport *
from _pool_for cimport lsc_for_fn, pool_for_import

cnp.import_array()

cdef extern from "numpy/ndarraytypes.h":
    enum:
        NPY_HALF
        NPY_USERDEF

# the package's one thread pool (lsc_pool.h's parallel-for, exported by _scan)
cdef lsc_for_fn pool_for = pool_for_import()
