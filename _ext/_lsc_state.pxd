# Declarations of lsc_state.h for Cython.
from libc.stdint cimport int64_t, uint32_t

cdef extern from "lsc_state.h" nogil:
    ctypedef struct lsc_state:
        double growth_factor
        double backoff_factor
        double min_scale
        double max_scale
        int64_t growth_interval
        int64_t growth_offset
        int64_t hysteresis
        int precision
        int growth_mode
        int backoff_mode
        int min_action
        uint32_t flags
        double scale
        double next_scale
        int64_t good_steps
        int64_t hysteresis_left
        int64_t steps
        int64_t skipped
        double tolerance
        double floor_scale
        double growth_factor_after_overflow
        int64_t overflows
        int64_t since_rescale
        int64_t overflow_seen
    int lsc_update(lsc_state *s, int finite)

