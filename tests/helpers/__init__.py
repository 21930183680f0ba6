"""Shared test helpers, importable from every test folder as ``helpers``.

``pyproject.toml`` puts ``tests/`` on ``sys.path`` (``[tool.pytest.ini_options]
pythonpath``), so a test imports ``from helpers import FLOAT_DTYPES`` or
``from helpers.gen import make_array``; no test module imports another.

    helpers/__init__.py   paths, dtype lists, bitwise comparison
    helpers/gen.py        seeded generators: arrays, event sequences, policies
    helpers/fp8_inputs.py  the float8 quantize tests' inputs (specials, layouts), NumPy and torch
    helpers/peer_models.py  each peer's update rule as a plain-Python model
    helpers/backends.py   the array/framework backends behind conftest's fixtures
    helpers/cuda_host/    lscore's CUDA kernels compiled with g++ and run on the CPU
      cuda_host/cupy_standin.py  a cupy module over NumPy and the harness (the docs' GPU
                          examples on the CPU: captures recorded and replayed)
    helpers/standin.py    CuPy-shaped arrays on stand-in devices, host memory as device memory
    helpers/dist/         launcher, scenarios and checks of the multi-process tests
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

ROOT = Path(__file__).resolve().parents[2]  # the repository
TESTS = ROOT / "tests"

FLOAT_DTYPES = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)]
if ml_dtypes is not None:
    FLOAT_DTYPES.insert(1, np.dtype(ml_dtypes.bfloat16))
FLOAT8_DTYPES = (
    [np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)]
    if ml_dtypes is not None
    else []
)
INT_DTYPES = [
    np.dtype(t) for t in (np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64)
]


def bits_equal_or_both_nan(a: np.ndarray, b: np.ndarray) -> bool:
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    nan = np.isnan(fa)
    if not np.array_equal(nan, np.isnan(fb)):
        return False
    ua = np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")[~nan.reshape(a.shape)]
    ub = np.ascontiguousarray(b.astype(a.dtype)).view(f"u{a.dtype.itemsize}")[~nan.reshape(a.shape)]
    sw_a = a.dtype.byteorder == ">"
    return np.array_equal(ua, ub) if not sw_a else np.array_equal(fa[~nan], fb[~nan])


def torch_keys(state_dict: dict) -> dict:
    """A GradScaler state dict without the counts lscore adds (``"lscore_counters"``, which
    torch's scaler ignores): what ``torch.amp.GradScaler.state_dict()`` holds."""
    return {k: v for k, v in state_dict.items() if k != "lscore_counters"}


def built_wheel() -> Path | None:
    """The release wheel under test: the one ``LSCORE_WHEEL`` names (cibuildwheel's test
    step), else the one ``make wheel`` left in dist/, else None."""
    named = os.environ.get("LSCORE_WHEEL")
    if named:
        return Path(named)
    found = sorted((ROOT / "dist").glob("lscore-*.whl"))
    assert len(found) <= 1, f"more than one wheel in dist/: {[p.name for p in found]}"
    return found[0] if found else None
