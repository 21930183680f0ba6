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


# the one check of a blocked axis: the block passes of _mx and _nvfp4 both take it
def block_shapes(tuple shape, long block, int axis, bint e2m1):
    """(scales' shape, element codes' shape) of an input of `shape` in blocks of `block`
    along its last axis (axis -1) or the first axis of a 2-D input (axis 0); E2M1 codes two
    a byte.  ValueError when that axis is not a whole number of blocks."""
    if axis == -1:
        if not shape or shape[len(shape) - 1] % block:
            raise ValueError(f"the last axis must be a multiple of {block}, got shape {shape}")
        lead, n = shape[:len(shape) - 1], shape[len(shape) - 1]
        return lead + (n // block,), lead + ((n // 2 if e2m1 else n),)
    if axis == 0:
        if len(shape) != 2:
            raise ValueError(f"axis 0 needs a 2-D input, got shape {shape}")
        if shape[0] % block:
            raise ValueError(f"the first axis must be a multiple of {block}, got shape {shape}")
        return (shape[0] // block, shape[1]), ((shape[0] // 2 if e2m1 else shape[0]), shape[1])
    raise ValueError(f"axis must be -1 or 0, got {axis!r}")
