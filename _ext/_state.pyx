# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Design: CyState owns one lsc_state struct (lsc_state.h) and exposes the
# single transition, update(finite).  It does not validate: lscore/policy.py
# checks every parameter before a CyState is built, and lscore/state.py
# composes it.  The transition's spec is lscore/_reference.py:update; its
# return values are lscore._ext._codes.APPLY, SKIP and FLOOR_ERROR.
from libc.string cimport memcpy, memset

from _lsc_state cimport lsc_state, lsc_update

PARAMS = ("growth_factor", "backoff_factor", "min_scale", "max_scale", "growth_interval",
          "growth_offset", "hysteresis", "precision", "growth_mode", "backoff_mode",
          "min_action", "flags", "tolerance", "floor_scale", "growth_factor_after_overflow")
# overflows_since_backoff is the struct's `overflows` (the fairseq tolerance's numerator)
COUNTERS = ("good_steps", "hysteresis_left", "steps", "skipped", "overflows_since_backoff",
            "since_rescale", "overflow_seen")


cdef class CyState:
    """One loss-scale state machine: parameters, scale and counters in a C struct."""
    cdef lsc_state s
    COUNTERS = COUNTERS

    def __cinit__(self):
        memset(&self.s, 0, sizeof(lsc_state))

    cpdef int update(self, bint finite) noexcept:
        """Advance one step; returns 1 (apply), 0 (skip) or -1 (floor reached, state kept)."""
        return lsc_update(&self.s, finite)

    def set_params(self, dict p):
        s = &self.s
        s.growth_factor = p["growth_factor"]
        s.backoff_factor = p["backoff_factor"]
        s.min_scale = p["min_scale"]
        s.max_scale = p["max_scale"]
        s.growth_interval = p["growth_interval"]
        s.growth_offset = p["growth_offset"]
        s.hysteresis = p["hysteresis"]
        s.precision = p["precision"]
        s.growth_mode = p["growth_mode"]
        s.backoff_mode = p["backoff_mode"]
        s.min_action = p["min_action"]
        s.flags = p["flags"]
        s.tolerance = p["tolerance"]
        s.floor_scale = p["floor_scale"]
        s.growth_factor_after_overflow = p["growth_factor_after_overflow"]

    def get_params(self):
        return {k: getattr(self, "_p_" + k)() for k in PARAMS}

    def _p_growth_factor(self): return self.s.growth_factor
    def _p_backoff_factor(self): return self.s.backoff_factor
    def _p_min_scale(self): return self.s.min_scale
    def _p_max_scale(self): return self.s.max_scale
    def _p_growth_interval(self): return self.s.growth_interval
    def _p_growth_offset(self): return self.s.growth_offset
    def _p_hysteresis(self): return self.s.hysteresis
    def _p_precision(self): return self.s.precision
    def _p_growth_mode(self): return self.s.growth_mode
    def _p_backoff_mode(self): return self.s.backoff_mode
    def _p_min_action(self): return self.s.min_action
    def _p_flags(self): return self.s.flags
    def _p_tolerance(self): return self.s.tolerance
    def _p_floor_scale(self): return self.s.floor_scale
    def _p_growth_factor_after_overflow(self): return self.s.growth_factor_after_overflow

    property scale:
        def __get__(self): return self.s.scale
        def __set__(self, double v): self.s.scale = v

    property next_scale:
        def __get__(self): return self.s.next_scale
        def __set__(self, double v): self.s.next_scale = v

    property good_steps:
        def __get__(self): return self.s.good_steps
        def __set__(self, long long v): self.s.good_steps = v

    property hysteresis_left:
        def __get__(self): return self.s.hysteresis_left
        def __set__(self, long long v): self.s.hysteresis_left = v

    property steps:
        def __get__(self): return self.s.steps
        def __set__(self, long long v): self.s.steps = v

    property skipped:
        def __get__(self): return self.s.skipped
        def __set__(self, long long v): self.s.skipped = v

    property overflows_since_backoff:
        def __get__(self): return self.s.overflows
        def __set__(self, long long v): self.s.overflows = v

    property since_rescale:
        def __get__(self): return self.s.since_rescale
        def __set__(self, long long v): self.s.since_rescale = v

    property overflow_seen:
        def __get__(self): return self.s.overflow_seen
        def __set__(self, long long v): self.s.overflow_seen = v

    def to_bytes(self):
        """The raw lsc_state struct (for the device-side copy of the GPU path)."""
        return (<char *>&self.s)[:sizeof(lsc_state)]

    def from_bytes(self, const unsigned char[::1] raw):
        """Take a raw lsc_state struct written by to_bytes (or by the device)."""
        if raw.shape[0] != sizeof(lsc_state):
            raise ValueError(f"an lsc_state is {sizeof(lsc_state)} bytes, got {raw.shape[0]}")
        memcpy(&self.s, &raw[0], sizeof(lsc_state))

    @staticmethod
    def nbytes():
        return sizeof(lsc_state)

    def copy(self):
        cdef CyState other = CyState.__new__(CyState)
        other.s = self.s
        return other

    def load(self, CyState other):
        """Take every field of `other` (an all-or-nothing state restore)."""
        self.s = other.s

    def __reduce__(self):
        raise TypeError("CyState is not picklable; pickle the lscore object that owns it")
