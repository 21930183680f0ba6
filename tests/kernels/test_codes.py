"""_ext/lsc_codes.h is the one definition of the shared numbers; everything else agrees with it.

lscore._ext._codes exports the header's enums.  These tests check that the
Python names built on them (Code, the Policy's parameter block, the state
machine's return values, the device state's layout) agree with the export,
and that the CUDA sources take the numbers from the headers, not restate them.
"""

import os
import re

import numpy as np
import pytest

from helpers import FLOAT8_DTYPES, FLOAT_DTYPES, ROOT
from helpers.standin import HostMemory
from lscore import _reference
from lscore import cuda as _cuda
from lscore import policy as _params
from lscore._ext import _codes
from lscore._ext._state import CyState
from lscore.cuda.device_state import DeviceState
from lscore.dtypes import BY_NAME, Code
from lscore.state import COUNTERS, LossScaleState


def ext_text(name):
    return (ROOT / "_ext" / name).read_text(encoding="utf-8")


def test_code_is_the_compiled_export():
    assert {m.name: m.value for m in Code} == _codes.CODES
    assert len(Code) == _codes.NCODES == len(_codes.WIDTHS)


def test_widths_are_the_itemsizes():
    for dt in FLOAT_DTYPES + FLOAT8_DTYPES:
        assert _codes.WIDTHS[BY_NAME[dt.name]] == dt.itemsize, dt
    assert _codes.WIDTHS[Code.INT] == 0


def test_policy_parameter_block_uses_the_header_values():
    """Policy.c_params maps every enum name and flag to the header's number."""
    for field, names, export in [
        ("precision", _params.PRECISIONS, _codes.PRECISION),
        ("growth_mode", _params.GROWTH_MODES, _codes.GROWTH_MODE),
        ("backoff_mode", _params.BACKOFF_MODES, _codes.BACKOFF_MODE),
    ]:
        assert set(names) == set(export)
        for name in names:
            assert _params.Policy(**{field: name}).c_params()[field] == export[name], name
    for name in _params.MIN_ACTIONS:
        p = _params.Policy(min_scale=1.0, min_action=name)
        assert p.c_params()["min_action"] == _codes.MIN_ACTION[name], name
    f = _codes.FLAGS
    cases = {
        "GUARD_FINITE": dict(guard_finite=True),
        "HAS_MIN": dict(min_scale=1.0),
        "HAS_MAX": dict(max_scale=2.0**20),
        "HYST_SATURATE": dict(hysteresis_saturate=True),
        "APPLY_NONFINITE": dict(apply_nonfinite=True),
        "FTZ": dict(flush_subnormal=True),
        "APPLY_NEXT": dict(apply_next=True),
        "HAS_LATE_GROWTH": dict(growth_factor_after_overflow=2.0),
        **{f"REFILL_{r.upper()}": dict(refill=(r,)) for r in _params.REFILLS},
    }
    assert set(cases) == set(f)
    base = _params.Policy(guard_finite=False, refill=()).c_params()["flags"]
    for name, kwargs in cases.items():
        flags = _params.Policy(**{"guard_finite": False, "refill": (), **kwargs}).c_params()[
            "flags"
        ]
        assert flags & ~base == f[name], name
    assert sorted(f.values()) == [1 << k for k in range(len(f))]


def test_update_returns_the_exported_values():
    assert (_reference.APPLY, _reference.SKIP, _reference.FLOOR_ERROR) == (
        _codes.APPLY,
        _codes.SKIP,
        _codes.FLOOR_ERROR,
    )
    s = LossScaleState(_params.Policy(growth_interval=2))
    cy = s._cy
    assert cy.update(True) == _codes.APPLY and cy.update(False) == _codes.SKIP
    floor = LossScaleState(
        _params.Policy(
            precision="float64",
            backoff_mode="divide",
            min_scale=1.0,
            min_action="raise_at",
            hysteresis=1,
            init_scale=1.0,
        )
    )
    assert floor._cy.update(False) == _codes.FLOOR_ERROR


def test_counters_are_the_compiled_ones():
    assert COUNTERS == CyState.COUNTERS
    assert all(isinstance(getattr(CyState(), k), int) for k in COUNTERS)


def test_device_state_layout_matches_the_header():
    nbytes = CyState.nbytes()
    ds = DeviceState(HostMemory(), nbytes)
    assert ds.flags.size == _codes.NDEVICE_FLAGS and ds.vals.size == _codes.NDEVICE_VALS
    assert ds.found_ptr == ds.flags_ptr + 4 * _codes.DEVICE_FLAGS["found"]
    assert ds.inv_ptr == ds.vals_ptr + 8 * _codes.DEVICE_VALS["inv_scale"]
    ds.flags[:] = np.arange(ds.flags.size)
    ds.vals[:] = np.arange(ds.vals.size)
    assert ds.apply[0] == _codes.DEVICE_FLAGS["apply"]
    assert ds.scale[0] == _codes.DEVICE_VALS["scale"]


@pytest.mark.parametrize("filename", sorted(_cuda.KERNELS))
def test_cuda_sources_restate_no_codes(filename):
    text = ext_text(filename)
    assert re.search(r'^#include "lsc_(codes|state)\.h"$', text, re.M), filename
    code = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    assert not re.search(r"\b(flags|vals)\[\d", code), "index by the LSC_DEV_* names"
    assert not re.search(r"^\s*(#define\s+LSC_|enum\b)", code, re.M), "define in lsc_codes.h"
    assert not re.search(r"0x7C00|0x7F80|0x7F800000|0x7FF0", code, re.I), "use LSC_EXP_*"
    # the self-contained text the loader compiles carries each header once
    inlined = _cuda.source(filename)
    assert inlined.count("#define LSC_CODES_H") == 1


def test_one_half_conversion():
    """The CPU core and scan.cu convert float16/bfloat16 through lsc_half.h alone."""
    definition = re.compile(
        r"\b\w*(?:b?f16_to_f32|f32_to_b?f16)\s*\(\s*"
        r"(?:float|lsc_u16|uint16_t|unsigned short)\s+\w+\s*\)"
    )
    defined = {
        name
        for name in os.listdir(ROOT / "_ext")
        if name.endswith((".h", ".cu")) and definition.search(ext_text(name))
    }
    assert defined == {"lsc_half.h"}
    for name in ("lsc_scan.h", "scan.cu"):
        assert re.search(r'^#include "lsc_half\.h"$', ext_text(name), re.M), name
