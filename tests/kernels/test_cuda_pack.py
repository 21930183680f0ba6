"""The argument blocks of packed launches: the scan launches ``MultiTensor.prepare`` packs, one
launch ``MultiTensor.pack`` packs and the fused optimizer's launches all lay out their
``void*[]`` and byte widths as ``lscore.cuda.launch.argument_widths`` says (the struct, the
chunk, the per-call parameters), and a block built either way runs the same on the host
harness."""

import ctypes
import shutil

import numpy as np
import pytest

from lscore import kernels
from lscore.cuda.launch import MultiTensor, argument_widths
from lscore.cuda.loader import kernel_name
from lscore.cuda.optim import FusedLauncher
from lscore.dtypes import Code

if shutil.which("g++") is None:
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from helpers import cuda_host

# scan.cu's per-call parameters after the struct and the chunk, in bytes
SCAN_CALL = {"unscale": [8, 8, 8, 4], "all_finite": [8, 4]}  # inv, inv_dev, found, mark


def _words(entry):
    """(void*[] as uint64, widths as int64) of a packed entry, read from its addresses."""
    _, _, _, params, widths, n = entry
    p = np.frombuffer((ctypes.c_uint64 * n).from_address(params), np.uint64).copy()
    w = np.frombuffer((ctypes.c_int64 * n).from_address(widths), np.int64).copy()
    return p, w


def _meta_size(nt, nb, depth=1):
    # u64 ptr[depth][nt]; i64 size[nt]; i32 chunk_of[nb]; u16 tensor_of[nb] (no padding)
    return 8 * depth * nt + 8 * nt + 4 * nb + 2 * nb


@pytest.fixture(scope="module")
def backend():
    return cuda_host.HostBackend()


def test_argument_widths_are_the_struct_the_chunk_and_the_call_parameters():
    w = argument_widths(3680, [8, 4])
    assert w.dtype == np.int64 and w.tolist() == [3680, 8, 8, 4]
    assert argument_widths(56, []).tolist() == [56, 8]


@pytest.mark.parametrize("op", ["all_finite", "unscale"])
def test_a_scan_launch_and_the_same_launch_packed_alone_carry_identical_blocks(backend, op):
    """Each launch ``prepare`` packed (its void*[] a row of kernels.launch_params) equals, word
    for word, the block ``MultiTensor.pack`` builds for the same struct and call words, and
    both launches find the same NaN."""
    runner = MultiTensor(backend, chunk=8, block=4, max_tensors=2, max_blocks=3)
    arrays = [np.ones(n, np.float32) for n in (5, 17, 9, 1)]
    arrays[2][4] = np.nan
    prepared = runner.prepare(
        [(Code.F32, [a.ctypes.data for a in arrays], [a.size for a in arrays])]
    )
    entries = prepared.ops[op]
    assert len(entries) == prepared.count > 1
    size = _meta_size(*kernels.META[runner.meta])
    keep: list = []
    alone = []
    for entry in entries:
        params, widths = _words(entry)
        assert widths.tolist() == [size, 8, *SCAN_CALL[op]]
        assert params[1] == params[0] + size
        call = list(zip(params[2:].tolist(), widths[2:].tolist(), strict=True))
        name = kernel_name(op, Code.F32, runner.meta)
        packed = runner.pack(keep, name, entry[1], entry[2], int(params[0]), call)
        assert packed[:3] == entry[:3] and packed[5] == entry[5]
        got = _words(packed)
        np.testing.assert_array_equal(got[0], params)
        np.testing.assert_array_equal(got[1], widths)
        alone.append(packed)
    assert runner.found(runner.launch(op, prepared))
    prepared.ops[op] = alone
    assert runner.found(runner.launch(op, prepared))
    arrays[2][4] = 1.0
    assert not runner.found(runner.launch(op, prepared))


@pytest.mark.parametrize("kind, head", [("sgd", 4), ("adam", 6)])
def test_the_fused_launches_carry_the_struct_the_chunk_and_their_signature(backend, kind, head):
    """The fused optimizer's launches: launch k's void*[] points at row k of the plan's
    arguments (its struct, then its chunk) and its widths are ``argument_widths`` of the
    struct and the call's scalars, the layout of the scan launches above; the step runs."""
    runner = MultiTensor(backend, chunk=8, block=4, max_tensors=2, max_blocks=3)
    launcher = FusedLauncher(runner)
    depth = 3 if kind == "sgd" else 5
    sizes = [5, 17, 9]
    tensors = [[np.full(n, 0.25, np.float32) for _ in range(depth)] for n in sizes]
    records = [[a.ctypes.data for a in t] for t in tensors]
    before = [t[1].copy() for t in tensors]
    plan = launcher.plan(("t", kind), kind, [int(Code.F32)] * 3, sizes, records)
    assert plan.launches > 1
    scalars = tuple(np.float32(0.5) for _ in range(head))
    tail = (np.uint64(0), np.uint64(0), np.int64(1)) if kind == "adam" else ()
    assert launcher.launch(kind, plan, scalars, flags=0, tail=tail) == plan.launches
    ((entries, _fmt),) = plan.packed.values()
    nt, nb = kernels.OPT_META[plan.meta][1:]
    size = _meta_size(nt, nb, depth)
    # head's float32s; flags, inv, inv_ptr, gate_ptr, skip_if; Adam's tail; hyper_ptr
    call = [4] * head + [4, 8, 8, 8, 4] + ([8, 8, 8] if kind == "adam" else []) + [8]
    row = plan.arguments.shape[1]
    for k, entry in enumerate(entries):
        params, widths = _words(entry)
        assert widths.tolist() == argument_widths(size, call).tolist()
        assert params[0] == plan.arguments.ctypes.data + k * row
        assert params[1] == params[0] + size
    assert all((t[1] != b).all() for t, b in zip(tensors, before, strict=True))
