"""Shared test setup: dtype lists, hypothesis profile, the `gpu` marker."""
import os

import numpy as np
import pytest

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("ci", max_examples=300, deadline=None, derandomize=False,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("dev", max_examples=100, deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")
except ImportError:  # pragma: no cover
    pass

FLOAT_DTYPES = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)]
if ml_dtypes is not None:
    FLOAT_DTYPES.insert(1, np.dtype(ml_dtypes.bfloat16))
FLOAT8_DTYPES = ([np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)]
                 if ml_dtypes is not None else [])
INT_DTYPES = [np.dtype(t) for t in (np.bool_, np.int8, np.uint8, np.int16, np.int32,
                                    np.int64, np.uint64)]


def pytest_collection_modifyitems(config, items):
    gpu = _have_gpu()
    if gpu:
        return
    skip = pytest.mark.skip(reason="no CUDA device (cupy.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _have_gpu() -> bool:
    try:
        import cupy
        return bool(cupy.cuda.is_available())
    except Exception:
        return False
