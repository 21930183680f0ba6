"""lsc_fp8_narrow, the float8 rounding of the MX and blockwise element loops done by one float32
addition, equals lsc_fp8_from_f32 (the rule every other float8 cast uses, tested against the
reference) at every float32 bit pattern, for both formats, saturating or not and with the NaN's
sign kept or not (each flag bit at both values)."""

import pathlib
import shutil
import subprocess

import pytest

import lscore._ext

EVERY_FLOAT = r"""
#include <stdio.h>
#include "lsc_fp8.h"
#define SWEEP(fmt, flags)                                                        \
    for (unsigned long long w = 0; w <= 0xFFFFFFFFull; ++w) {                    \
        float f = lsc_f32_from_bits((lsc_u32)w);                                 \
        if (lsc_fp8_narrow(f, fmt, flags) != lsc_fp8_from_f32(f, fmt, flags)     \
            && bad++ < 5)                                                        \
            printf("%d %d %08llx\n", fmt, flags, w);                             \
    }
int main(void)
{
    unsigned long bad = 0;
    SWEEP(LSC_CODE_E4M3FN, 0)
    SWEEP(LSC_CODE_E4M3FN, LSC_FP8_SAT | LSC_FP8_NAN_SIGN)
    SWEEP(LSC_CODE_E5M2, 0)
    SWEEP(LSC_CODE_E5M2, LSC_FP8_SAT | LSC_FP8_NAN_SIGN)
    printf("%lu\n", bad);
    return 0;
}
"""


@pytest.mark.slow
def test_narrow_equals_the_cast_at_every_float(tmp_path):
    """4 x 2**32 conversions (a few minutes on one core)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    src, exe = tmp_path / "narrow.c", tmp_path / "narrow"
    src.write_text(EVERY_FLOAT)
    inc = str(pathlib.Path(lscore._ext.__file__).parent)
    cmd = [cc, "-O2", "-ffp-contract=off", "-DLSC_LEVEL=v2", f"-I{inc}", str(src), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    assert subprocess.run([str(exe)], capture_output=True, text=True).stdout == "0\n"
