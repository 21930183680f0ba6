"""Every configuration of ``lscore bench --suite gpu-tune``'s grid on the CUDA host harness,
bitwise equal to the CPU core.

The grid's configurations are the real ones (chunks up to 65536, blocks up to 1024); the
arrays are sized around each configuration's chunk, so every chunk edge is crossed with
arrays small enough for the CPU.
"""

import shutil

import numpy as np
import pytest

import lscore
from helpers import FLOAT_DTYPES, bits_equal_or_both_nan
from helpers.gen import nonfinite_values
from lscore import cuda, kernels
from lscore.bench import _tune
from lscore.cuda import launch
from lscore.dtypes import BY_NAME

if shutil.which("g++") is None:
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from helpers import cuda_host


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(launch.ENV, raising=False)


def _case(rng, dt, chunk, *, bad: str | None):
    """Arrays of `dt` around the chunk edges, some starting off the 16-byte alignment, one
    empty; NaN/Inf at the first element of the first array or the last of the last."""
    sizes = [0, 1, launch.VECTOR - 1, chunk - 1, chunk, chunk + 1, 2 * chunk + launch.VECTOR + 1]
    arrays = []
    for k, n in enumerate(sizes):
        offset = (0, 1, 3)[k % 3]  # elements: a misaligned start takes the scalar path
        buf = (rng.standard_normal(n + offset) * 300.0).astype(dt)
        arrays.append(buf[offset:])
    if bad == "first":
        arrays[1][0] = rng.choice(nonfinite_values(dt))
    elif bad == "last":
        arrays[-1][-1] = rng.choice(nonfinite_values(dt))
    return arrays


def _same_as_cpu_core(ak, arrays, inv, what):
    want = [a.copy() for a in arrays]
    want_finite = lscore.unscale_(want, inv)
    assert ak.unscale_(arrays, inv) == want_finite, what
    for i, (got, w) in enumerate(zip(arrays, want, strict=True)):
        assert bits_equal_or_both_nan(got, w), f"{what}: array {i} (size {w.size}) differs"
    return want_finite


@pytest.mark.parametrize("cfg", _tune.grid(), ids=_tune.label)
def test_every_grid_configuration_equals_the_cpu_core(cfg):
    rng = np.random.default_rng(cfg.chunk + cfg.block)
    backend = cuda_host.HostBackend()
    ak = cuda.ArrayKernels(np, lambda dev: backend, kind=kernels.READ_NUMPY, config=cfg)
    for dt in FLOAT_DTYPES:
        for bad in (None, "first", "last"):
            arrays = _case(rng, dt, cfg.chunk, bad=bad)
            finite = _same_as_cpu_core(
                ak,
                arrays,
                float(rng.choice([1 / 3, 0.5, 65536.0])),
                f"{_tune.label(cfg)} {dt} NaN/Inf {bad}",
            )
            assert finite == (bad is None)
    # the configuration is what the kernels ran with: each dtype's largest array fills a
    # chunk, so its launches take the threads a full chunk of that dtype needs
    want = {
        launch.scan_threads(cfg.block, cfg.chunk, cfg.chunk, BY_NAME[dt.name])
        for dt in FLOAT_DTYPES
    }
    assert {block for _, _, block in backend.launches} == want
    assert max(want) == cfg.block or cfg.chunk * 8 < cfg.block * launch.THREAD_BYTES
    assert ak.device(0).chunk == cfg.chunk


@pytest.mark.parametrize("cfg", _tune.grid(), ids=_tune.label)
def test_every_grid_configuration_splits_more_arrays_than_one_launch_holds(cfg):
    rng = np.random.default_rng(7)
    backend = cuda_host.HostBackend()
    ak = cuda.ArrayKernels(np, lambda dev: backend, kind=kernels.READ_NUMPY, config=cfg)
    dt = FLOAT_DTYPES[_tune.grid().index(cfg) % len(FLOAT_DTYPES)]  # each dtype in turn
    arrays = [
        rng.standard_normal(int(n)).astype(dt) for n in rng.integers(1, 6, cfg.max_tensors + 40)
    ]
    for k in range(0, len(arrays), 1000):
        arrays[k] = np.zeros(0, dt)  # empty arrays take no place in a launch
    arrays[-1] = np.array([1.0, np.inf], dt)
    assert _same_as_cpu_core(ak, arrays, 0.5, _tune.label(cfg)) is False
    assert len([fn for fn, _, _ in backend.launches if "unscale" in fn]) >= 2
