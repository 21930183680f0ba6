"""The GPU examples of the README and the docs, run on the CPU through the CuPy stand-in.

Every block that the pages below skip without a GPU (``<!-- skip: next if(no_gpu ...)
-->``) runs here alone, in a namespace of its own (it must work pasted into a fresh
session), with ``cupy`` and ``lscore.adapters.cupy`` replaced by
helpers/cuda_host/cupy_standin.py:
lscore's kernels run on the host harness, bit for bit as on a GPU, and a stream capture
refuses what CuPy refuses, a matrix product above all.  What the page shows must be
what the block prints here.  (kernel-cache.md's GPU block is not among them: it compiles
with NVRTC for the driver's architectures, which needs a GPU.)
"""

from __future__ import annotations

import doctest
import io
import re

import numpy as np
import pytest

from helpers import ROOT
from helpers.cuda_host import compiler, cupy_standin

if compiler() is None:  # pragma: no cover
    pytest.skip("no C++ compiler for the host harness", allow_module_level=True)

PAGES = (
    "README.md",
    "docs/getting-started/quickstart.md",
    "docs/guides/numpy-cupy.md",
    "docs/guides/gpu-kernels.md",
    "docs/guides/performance.md",
)
GPU_BLOCK = re.compile(r"^<!-- skip: next if\(no_gpu[^\n]*-->\n```python\n(.*?)^```", re.S | re.M)
# the doctest options of docs/conftest.py, which runs these blocks where a GPU is present
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def gpu_blocks() -> list:
    """(page, line of the block's first line, source) of every GPU block of PAGES."""
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        found += [
            (page, text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in GPU_BLOCK.finditer(text)
        ]
    return found


BLOCKS = gpu_blocks()


@pytest.fixture
def cp(monkeypatch):
    """``import cupy`` gives the stand-in for this test; its default stream is current."""
    cupy_standin.install(monkeypatch)
    return cupy_standin.cupy


def test_each_page_has_gpu_blocks():
    assert {page for page, _, _ in BLOCKS} == set(PAGES)


@pytest.mark.parametrize("page, line, source", BLOCKS, ids=[f"{p}:{n}" for p, n, _ in BLOCKS])
def test_a_gpu_block_prints_what_its_page_shows(cp, page, line, source):
    test = doctest.DocTestParser().get_doctest(source, {}, page, page, line - 1)
    report = io.StringIO()
    runner = doctest.DocTestRunner(verbose=False, optionflags=OPTIONS)
    runner.run(test, out=report.write)
    assert runner.failures == 0, report.getvalue()
    assert not cp.cuda.get_current_stream().is_capturing()


def test_a_matrix_product_while_capturing_raises_as_cupy_does(cp):
    a = cp.ones((4, 4), cp.float32)
    out = cp.zeros((4, 4), cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        eager = a @ a  # outside a capture cuBLAS runs
        stream.begin_capture()
        for product in (lambda: a @ a, lambda: cp.matmul(a, a, out=out), lambda: cp.dot(a, a)):
            with pytest.raises(NotImplementedError, match=r"^calling cuBLAS API during stream"):
                product()
        stream.end_capture()
    assert float(eager[0, 0]) == 4.0 and float(out[0, 0]) == 0.0


def test_a_capture_records_and_a_replay_runs_what_it_recorded(cp):
    """Nothing runs while capturing; each replay reads the buffers as they are then;
    reading the device while capturing is refused."""
    a, out = cp.asarray(np.arange(4, dtype=np.float32)), cp.zeros(4, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        cp.multiply(a, 3, out=out)
        made = (a + 1).astype(cp.float16)  # allocated by the capture, written by replays
        for read in (lambda: float(out[0]), out.get, stream.synchronize):
            with pytest.raises(RuntimeError, match="capturing"):
                read()
        for upload in (lambda: cp.asarray(np.ones(2)), lambda: out.__setitem__(0, np.ones(1))):
            with pytest.raises(RuntimeError, match="H2D"):
                upload()
        out[3] = 5.0  # a fill: recorded, the scalar kept by value
        graph = stream.end_capture()
    assert out.tolist() == [0, 0, 0, 0] and np.isnan(made.get()).all()
    graph.launch(stream)
    assert out.tolist() == [0, 3, 6, 5] and made.tolist() == [1, 2, 3, 4]
    a[...] = cp.full(4, 10.0, cp.float32)
    graph.launch(stream)
    assert out.tolist() == [30, 30, 30, 5] and made.tolist() == [11] * 4


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_replays_of_a_captured_step_match_eager_steps_bitwise(cp, name):
    """A sync-free step captured on the stand-in and replayed gives, step by step, the bits
    of the same steps run eagerly: the kernels' launches and the adapter's array
    operations are recorded with the values they must keep, overflowing steps included."""
    from lscore.adapters import cupy as lcp

    rng = np.random.default_rng(3)
    feeds = [rng.standard_normal(40).astype(np.float32) * 50 for _ in range(8)]
    feeds[3][7] = np.inf

    def run(captured):
        w, grad = cp.zeros(40, cp.float32), cp.zeros(40, cp.float16)
        opt = lcp.LossScaleOptimizer(
            getattr(lcp, name)(0.01), initial_scale=2.0**4, dynamic_growth_steps=2, sync_free=True
        )
        fn = lambda scale: (None, [grad])  # noqa: E731 - the step's whole backward pass
        stream = cp.cuda.Stream(non_blocking=True)
        seen = []
        with stream:
            for k, feed in enumerate(feeds):
                grad[...] = opt.get_scaled_loss(cp.asarray(feed)).astype(cp.float16)
                if not captured or k == 0:
                    opt.minimize(fn, [w])
                else:
                    if k == 1:
                        stream.begin_capture()
                        opt.minimize(fn, [w])
                        graph = stream.end_capture()
                    graph.launch(stream)
                seen.append(w.get().view(np.uint32))
        opt.sync_state()
        return seen, opt.loss_scale, opt.dynamic_counter

    eager, replayed = run(False), run(True)
    for k, (a, b) in enumerate(zip(eager[0], replayed[0], strict=True)):
        assert np.array_equal(a, b), k
    assert eager[1:] == replayed[1:]


def test_a_captured_step_whose_backward_pass_multiplies_matrices_fails(cp):
    """Capturing ``minimize`` over a backward pass with a matrix product fails at capture,
    here as on a GPU: the recipe the guide gives keeps that pass out of the graph."""
    from lscore.adapters import cupy as lcp

    x, w = cp.ones((8, 4), cp.float32), cp.zeros(4, cp.float32)
    err, grad = cp.zeros(8, cp.float32), cp.zeros(4, cp.float16)

    def loss_and_grads(scale):
        cp.matmul(x, w, out=err)
        cp.matmul(x.T, (err * scale).astype(cp.float16), out=grad)
        return None, [grad]

    opt = lcp.LossScaleOptimizer(lcp.SGD(0.1), sync_free=True)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        opt.minimize(loss_and_grads, [w])  # eager: cuBLAS runs
        stream.begin_capture()
        with pytest.raises(NotImplementedError, match="cuBLAS"):
            opt.minimize(loss_and_grads, [w])
