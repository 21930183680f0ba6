# Dtype codes and element widths of lsc_codes.h, for the Cython modules.
cdef extern from "lsc_codes.h":
    enum:
        LSC_CODE_INT
        LSC_CODE_F16
        LSC_CODE_BF16
        LSC_CODE_F32
        LSC_CODE_F64
        LSC_CODE_E4M3FN
        LSC_CODE_E5M2
        LSC_NCODES
    enum:
        LSC_WIDTH_INT
        LSC_WIDTH_F16
        LSC_WIDTH_BF16
        LSC_WIDTH_F32
        LSC_WIDTH_F64
        LSC_WIDTH_E4M3FN
        LSC_WIDTH_E5M2
    # exponent field of each float code and its lowest bit (e4m3fn: its NaN pattern)
    const unsigned long long LSC_EXP_F16, LSC_EXP_LSB_F16, LSC_EXP_BF16, LSC_EXP_LSB_BF16
    const unsigned long long LSC_EXP_F32, LSC_EXP_LSB_F32, LSC_EXP_F64, LSC_EXP_LSB_F64
    const unsigned long long LSC_EXP_E4M3FN, LSC_EXP_LSB_E4M3FN, LSC_EXP_E5M2, LSC_EXP_LSB_E5M2


cdef inline int lsc_code_width(int code) noexcept nogil:
    """Bytes per element of `code` (0 for integer and unknown codes)."""
    if code == LSC_CODE_F16:
        return LSC_WIDTH_F16
    if code == LSC_CODE_BF16:
        return LSC_WIDTH_BF16
    if code == LSC_CODE_F32:
        return LSC_WIDTH_F32
    if code == LSC_CODE_F64:
        return LSC_WIDTH_F64
    if code == LSC_CODE_E4M3FN:
        return LSC_WIDTH_E4M3FN
    if code == LSC_CODE_E5M2:
        return LSC_WIDTH_E5M2
    return LSC_WIDTH_INT
