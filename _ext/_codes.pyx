# cython: language_level=3
# Design: lsc_codes.h is the one definition of the numbers the C core, the
# CUDA kernels and Python share; this module only reads them from the
# header's enums (through _dtypes.pxd and _lsc_state.pxd) into small dicts.
# Python code takes its numbers from here (lscore/dtypes.py: Code) and
# never restates them.
from _dtypes cimport *
from _lsc_state cimport *

cdef extern from "lsc_codes.h":
    enum:
        LSC_OPT_SLOT
        LSC_OPT_NESTEROV
        LSC_OPT_MAXIMIZE
        LSC_OPT_AMSGRAD
        LSC_OPT_CHECK
        LSC_OPT_INV_AS_GRAD
        LSC_NORM_INF
        LSC_NORM_FIRST
        LSC_NORM_LAST
        LSC_META_4K_TENSORS
        LSC_META_4K_BLOCKS
        LSC_META_32K_TENSORS
        LSC_META_32K_BLOCKS
        LSC_SGD_DEPTH
        LSC_ADAM_DEPTH
        LSC_SGD_4K_TENSORS
        LSC_SGD_32K_TENSORS
        LSC_ADAM_4K_TENSORS
        LSC_ADAM_32K_TENSORS

# dtype codes, by the member names of lscore.dtypes.Code
CODES = {"INT": LSC_CODE_INT, "F16": LSC_CODE_F16, "BF16": LSC_CODE_BF16, "F32": LSC_CODE_F32,
         "F64": LSC_CODE_F64, "E4M3FN": LSC_CODE_E4M3FN, "E5M2": LSC_CODE_E5M2}
NCODES = LSC_NCODES
# bytes per element, by code
WIDTHS = {LSC_CODE_INT: LSC_WIDTH_INT, LSC_CODE_F16: LSC_WIDTH_F16,
          LSC_CODE_BF16: LSC_WIDTH_BF16, LSC_CODE_F32: LSC_WIDTH_F32,
          LSC_CODE_F64: LSC_WIDTH_F64, LSC_CODE_E4M3FN: LSC_WIDTH_E4M3FN,
          LSC_CODE_E5M2: LSC_WIDTH_E5M2}
# (exponent field, its lowest bit) of each float code, on the raw words; for e4m3fn,
# which has no Inf, the field is the NaN pattern S.1111.111 less the sign and the bit is 1
EXP = {LSC_CODE_F16: (LSC_EXP_F16, LSC_EXP_LSB_F16),
       LSC_CODE_BF16: (LSC_EXP_BF16, LSC_EXP_LSB_BF16),
       LSC_CODE_F32: (LSC_EXP_F32, LSC_EXP_LSB_F32), LSC_CODE_F64: (LSC_EXP_F64, LSC_EXP_LSB_F64),
       LSC_CODE_E4M3FN: (LSC_EXP_E4M3FN, LSC_EXP_LSB_E4M3FN),
       LSC_CODE_E5M2: (LSC_EXP_E5M2, LSC_EXP_LSB_E5M2)}

# lsc_state's enum fields, by the names lscore.policy.Policy uses for them
PRECISION = {"float32": LSC_PREC_F32, "float32_float64": LSC_PREC_F32_F64,
             "float64": LSC_PREC_F64}
GROWTH_MODE = {"ge": LSC_GROW_GE, "eq": LSC_GROW_EQ, "modulo": LSC_GROW_MODULO,
               "never": LSC_GROW_NEVER}
BACKOFF_MODE = {"multiply": LSC_BACKOFF_MUL, "divide": LSC_BACKOFF_DIV}
MIN_ACTION = {"clamp": LSC_MIN_CLAMP, "raise_at": LSC_MIN_RAISE_AT,
              "raise_below": LSC_MIN_RAISE_BELOW}

# lsc_state.flags bits, by their names in lsc_codes.h without LSC_
FLAGS = {"GUARD_FINITE": LSC_GUARD_FINITE, "HAS_MIN": LSC_HAS_MIN, "HAS_MAX": LSC_HAS_MAX,
         "REFILL_FINITE": LSC_REFILL_FINITE, "REFILL_GROWTH": LSC_REFILL_GROWTH,
         "REFILL_BACKOFF": LSC_REFILL_BACKOFF, "HYST_SATURATE": LSC_HYST_SATURATE,
         "APPLY_NONFINITE": LSC_APPLY_NONFINITE, "FTZ": LSC_FTZ, "APPLY_NEXT": LSC_APPLY_NEXT,
         "HAS_LATE_GROWTH": LSC_HAS_LATE_GROWTH}

# what lsc_update (CyState.update) returns
SKIP = LSC_SKIP
APPLY = LSC_APPLY
FLOOR_ERROR = LSC_FLOOR_ERROR

# the device state of update.cu: uint32 flags, then float64 values, by index
DEVICE_FLAGS = {"found": LSC_DEV_FOUND, "floor": LSC_DEV_FLOOR, "apply": LSC_DEV_APPLY}
NDEVICE_FLAGS = LSC_DEV_NFLAGS
DEVICE_VALS = {"inv_scale": LSC_DEV_INV_SCALE, "scale": LSC_DEV_SCALE}
NDEVICE_VALS = LSC_DEV_NVALS

# bits of the fused optimizer kernels' flags (optim.cu), by their names without LSC_OPT_
OPTIM_FLAGS = {"SLOT": LSC_OPT_SLOT, "NESTEROV": LSC_OPT_NESTEROV, "MAXIMIZE": LSC_OPT_MAXIMIZE,
               "AMSGRAD": LSC_OPT_AMSGRAD, "CHECK": LSC_OPT_CHECK,
               "INV_AS_GRAD": LSC_OPT_INV_AS_GRAD}
# bits of the one-pass norm kernel's flags (scan.cu), by their names without LSC_NORM_
NORM_FLAGS = {"INF": LSC_NORM_INF, "FIRST": LSC_NORM_FIRST, "LAST": LSC_NORM_LAST}
# (tensors, blocks) one multi-tensor kernel argument holds (scan.cu's lsc_meta), by its
# C name: 4 KB of kernel parameters, or 32 KB (CUDA >= 12.1, sm_70+)
META = {"lsc_meta_4k": (LSC_META_4K_TENSORS, LSC_META_4K_BLOCKS),
        "lsc_meta_32k": (LSC_META_32K_TENSORS, LSC_META_32K_BLOCKS)}
# (addresses per tensor, tensors, blocks) one fused optimizer kernel argument holds
# (optim.cu's lsc_opt_meta), by its C name
OPT_META = {"lsc_sgd_meta_4k": (LSC_SGD_DEPTH, LSC_SGD_4K_TENSORS, LSC_META_4K_BLOCKS),
            "lsc_sgd_meta_32k": (LSC_SGD_DEPTH, LSC_SGD_32K_TENSORS, LSC_META_32K_BLOCKS),
            "lsc_adam_meta_4k": (LSC_ADAM_DEPTH, LSC_ADAM_4K_TENSORS, LSC_META_4K_BLOCKS),
            "lsc_adam_meta_32k": (LSC_ADAM_DEPTH, LSC_ADAM_32K_TENSORS, LSC_META_32K_BLOCKS)}
