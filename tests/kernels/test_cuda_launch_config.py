"""LaunchConfig (lscore.cuda.launch): validation, LSCORE_CUDA_LAUNCH, and the plumbing to the
launchers (the tuning grid's configurations on the harness: tests/apps/test_bench_tune_grid.py).
"""

import dataclasses
import shutil

import numpy as np
import pytest

from lscore import cuda, kernels
from lscore.cuda import launch
from lscore.cuda.launch import BLOCK, CHUNK, MAX_BLOCKS, MAX_TENSORS, OPT_BLOCK, MultiTensor
from lscore.dtypes import Code

if shutil.which("g++") is None:
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from helpers import cuda_host


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(launch.ENV, raising=False)


def test_defaults_are_torchs_chunk_and_the_tuned_blocks():
    cfg = cuda.LaunchConfig()
    assert dataclasses.astuple(cfg) == (65536, 1024, 512, 4096, 65535)
    assert dataclasses.astuple(cfg) == (CHUNK, BLOCK, OPT_BLOCK, MAX_TENSORS, MAX_BLOCKS)
    assert cuda.launch_config() == cfg
    r = MultiTensor(cuda_host.HostBackend())
    assert (r.chunk, r.block, r.opt_block, r.max_tensors, r.max_blocks) == (
        65536,
        1024,
        512,
        4096,
        65535,
    )
    # a block given alone sets both (the host harness's small blocks); opt_block its own
    assert (MultiTensor(cuda_host.HostBackend(), block=3).opt_block) == 3
    r = MultiTensor(cuda_host.HostBackend(), block=3, opt_block=5)
    assert (r.block, r.opt_block) == (3, 5)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("chunk", 0, "chunk must be a positive multiple of 8"),
        ("chunk", -8, "chunk must be a positive multiple of 8"),
        ("chunk", 100, "chunk must be a positive multiple of 8.*got 100"),
        ("block", 0, r"block must be a multiple of 32 in \[32, 1024\], got 0"),
        ("block", 100, "block must be a multiple of 32"),
        ("block", 1056, "block must be a multiple of 32"),
        ("opt_block", 16, r"opt_block must be a multiple of 32 in \[32, 1024\], got 16"),
        ("opt_block", 2048, "opt_block must be a multiple of 32"),
        ("max_tensors", 0, "max_tensors must be in"),
        ("max_tensors", 2**32, "max_tensors must be in"),
        ("max_blocks", 0, "max_blocks must be in"),
        ("max_blocks", 2**31, "max_blocks must be in"),
    ],
    ids=lambda x: str(x),
)
def test_bad_values_are_refused(field, value, match):
    with pytest.raises(ValueError, match=match):
        cuda.LaunchConfig(**{field: value})


@pytest.mark.parametrize("value", [512.0, True, "512"], ids=repr)
def test_non_integers_are_refused(value):
    with pytest.raises(TypeError, match=f"block must be an int, got {value!r}"):
        cuda.LaunchConfig(block=value)


def test_limits_of_the_grid_edges_are_accepted():
    cfg = cuda.LaunchConfig(chunk=8, block=1024, max_tensors=2**32 - 1, max_blocks=2**31 - 1)
    assert cfg.block == 1024 and cuda.LaunchConfig(block=32, chunk=np.int64(16)).chunk == 16
    assert type(cuda.LaunchConfig(chunk=np.int64(16)).chunk) is int


def test_parse_changes_only_the_given_settings_and_round_trips():
    cfg = cuda.LaunchConfig.parse(" chunk=16384 , block=256,")
    assert cfg == cuda.LaunchConfig(chunk=16384, block=256)
    assert cfg.max_tensors == MAX_TENSORS
    assert cuda.LaunchConfig.parse("") == cuda.LaunchConfig()
    odd = cuda.LaunchConfig(chunk=4096, block=128, max_tensors=7, max_blocks=9)
    assert cuda.LaunchConfig.parse(str(odd)) == odd
    assert str(odd) == "chunk=4096,block=128,opt_block=512,max_tensors=7,max_blocks=9"
    assert cuda.LaunchConfig.parse("block=64", base=odd) == dataclasses.replace(odd, block=64)


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "chunks=16384",
            "unknown launch setting 'chunks'; expected one of: chunk, block, "
            "opt_block, max_tensors, max_blocks",
        ),
        ("chunk", "launch setting 'chunk' is not key=value"),
        ("chunk=4096,chunk=8192", "launch setting 'chunk' given twice"),
        ("block=big", "launch setting block must be an integer, got 'big'"),
        ("block=2.5e2", "launch setting block must be an integer"),
        ("block=48", "block must be a multiple of 32"),
    ],
    ids=lambda x: x,
)
def test_parse_errors_name_the_bad_setting(text, match):
    with pytest.raises(ValueError, match=match):
        cuda.LaunchConfig.parse(text)


def test_the_environment_variable_chooses_the_process_configuration(monkeypatch):
    monkeypatch.setenv("LSCORE_CUDA_LAUNCH", "chunk=16384,block=256")
    assert cuda.launch_config() == cuda.LaunchConfig(chunk=16384, block=256)
    runner = MultiTensor(cuda_host.HostBackend())
    assert (runner.chunk, runner.block) == (16384, 256)
    ak = cuda.ArrayKernels(np, lambda dev: cuda_host.HostBackend(), kind=kernels.READ_NUMPY)
    assert (ak.device(0).chunk, ak.device(0).block) == (16384, 256)


def test_a_bad_environment_variable_fails_with_its_name(monkeypatch):
    monkeypatch.setenv("LSCORE_CUDA_LAUNCH", "chunk=16384,block=100")
    with pytest.raises(
        ValueError,
        match=r"LSCORE_CUDA_LAUNCH='chunk=16384,block=100': "
        r"block must be a multiple of 32",
    ):
        MultiTensor(cuda_host.HostBackend())


def test_array_kernels_config_beats_the_environment_and_limits_beat_config(monkeypatch):
    monkeypatch.setenv("LSCORE_CUDA_LAUNCH", "chunk=16384")
    cfg = cuda.LaunchConfig(chunk=4096, block=128, max_tensors=5)
    ak = cuda.ArrayKernels(
        np, lambda dev: cuda_host.HostBackend(), kind=kernels.READ_NUMPY, config=cfg
    )
    runner = ak.device(0)
    assert (runner.chunk, runner.block, runner.max_tensors) == (4096, 128, 5)
    small = cuda.ArrayKernels(
        np,
        lambda dev: cuda_host.HostBackend(),
        kind=kernels.READ_NUMPY,
        config=cfg,
        limits=dict(chunk=16, block=3),
    )
    assert (small.device(0).chunk, small.device(0).block, small.device(0).max_tensors) == (16, 3, 5)


@pytest.mark.parametrize(
    "largest, code, want",
    [
        (64, Code.F32, 128),  # tiny arrays: the floor
        (0, Code.F16, 128),
        (4096, Code.F16, 128),  # 8 KB over 64 bytes a thread
        (4096, Code.F32, 256),
        (4096, Code.F64, 512),
        (3000, Code.F32, 192),  # 188 threads of work, rounded up to a warp
        (10**6, Code.F32, 1024),  # past a chunk: the block
        (10**6, Code.F16, 1024),
    ],
)
def test_a_scan_launch_runs_the_threads_its_largest_block_needs(largest, code, want):
    assert launch.scan_threads(1024, 65536, largest, code) == want
    # never more than the block, and a block under the floor is kept (the harness's)
    assert launch.scan_threads(256, 65536, largest, code) == min(want, 256)
    assert launch.scan_threads(4, 16, largest, code) == 4


def test_launches_over_small_arrays_run_fewer_threads_norm_included():
    backend = cuda_host.HostBackend()
    ak = cuda.ArrayKernels(np, lambda dev: backend, kind=kernels.READ_NUMPY)
    small = [np.full(n, 2.0, np.float32) for n in (64, 3, 100)]
    assert ak.unscale_(small, 0.5) and ak.unscale_and_norm(small, 0.5)[0]
    assert {b for _, _, b in backend.launches} == {128}
    backend.launches.clear()
    big = [*small, np.ones(70000, np.float32)]  # a full chunk of float32: the block
    assert ak.unscale_(big, 0.5) and ak.unscale_and_norm(big, 0.5)[0]
    assert {b for _, _, b in backend.launches} == {1024}
    assert np.array_equal(small[0], np.full(64, 2.0 * 0.5**4, np.float32))  # four unscales
