# Dtype codes shared by the compiled core; lscore/_dtypes.py mirrors them.
cdef extern from "lsc_scan.h":
    enum:
        LSC_CODE_INT
        LSC_CODE_F16
        LSC_CODE_BF16
        LSC_CODE_F32
        LSC_CODE_F64
        LSC_CODE_E4M3FN
        LSC_CODE_E5M2
        LSC_NCODES
