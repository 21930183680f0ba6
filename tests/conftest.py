"""Shared test setup: the backend fixtures, the hypothesis profile, the `gpu` marker.

Shared code lives in the ``helpers`` package (tests/helpers), not here.

Backend fixtures (helpers/backends.py): a behaviour every adapter shares is
written once and runs on each backend; a backend that cannot run here skips.

    backend         numpy, cuda_host, cupy (gpu), torch
    array_backend   numpy, cuda_host, cupy (gpu): all_finite / unscale_ on nested arrays
    device_backend  cuda_host, cupy (gpu): lscore.adapters.cupy's code
"""

import os

import pytest

from helpers import backends

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        max_examples=300,
        deadline=None,
        derandomize=False,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", max_examples=100, deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")
except ImportError:  # pragma: no cover
    pass


def _params(names):
    return [pytest.param(n, marks=pytest.mark.gpu) if n == "cupy" else n for n in names]


@pytest.fixture(params=_params(backends.NAMES))
def backend(request):
    return backends.make(request.param)


@pytest.fixture(params=_params(backends.ARRAY_NAMES))
def array_backend(request):
    return backends.make(request.param)


@pytest.fixture(params=_params(backends.DEVICE_NAMES))
def device_backend(request):
    return backends.make(request.param)


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items) or _have_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA device (neither cupy nor torch sees one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _have_gpu() -> bool:
    try:
        import cupy

        if cupy.cuda.is_available():
            return True
    except Exception:
        pass
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False
