"""lscore.adapters.cupy's unscale_and_norm / unscale_and_clip_: the harness binding in CI,
the real adapter where a GPU exists.

Over ``device_backend`` the same checks run on NumPy + the host harness
(helpers/cuda_host/adapter.py) and on cupy (gpu): unscaled values bit for bit
the CPU core's, the norm a float64 NumPy reference's (2-norm within 1e-12
relative, inf-norm exact) and the same bits call after call, the clip torch's
formula.  The harness-only tests count what a call costs: its launches and
one read, nothing uploaded once the plan is cached, every launch on the
current stream, the clip enqueued before that read.  The kernels' generated
cases are in tests/kernels/test_cuda_norm.py.
"""

import math
import shutil
from typing import ClassVar

import numpy as np
import pytest

import lscore
from helpers.cuda_host import device_words
from helpers.cuda_host.adapter import CountingBackend

harness = pytest.mark.skipif(
    shutil.which("g++") is None, reason="g++ is missing: the CUDA host harness cannot be built"
)


def bits(a):
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def _hosts(b, seed, bad=None):
    rng = np.random.default_rng(seed)
    hosts = [  # the dtypes in turn, as many as there are sizes (the list may be longer)
        (rng.standard_normal(n) * 40).astype(dt)
        for n, dt in zip((70000, 3, 0, 1025, 17, 4096), b.float_dtypes * 2, strict=False)
    ]
    if bad is not None:
        hosts[0][0] = bad
        hosts[-1][-1] = bad
    return hosts


def _norm64(hosts, inf_norm):
    x = np.concatenate([h.astype(np.float64).ravel() for h in hosts])
    return float(np.abs(x).max()) if inf_norm else float(np.sqrt(np.sum(x * x)))


@pytest.mark.parametrize("norm_type", [2.0, "inf"], ids=["l2", "inf"])
@pytest.mark.parametrize("seed", [0, 1])
def test_norm_matches_cpu_core_and_reference(device_backend, seed, norm_type):
    b = device_backend
    inf_norm = norm_type == "inf"
    hosts = _hosts(b, seed)
    want = [h.copy() for h in hosts]
    lscore.unscale_(want, 2.0**-7)
    arrays = [b.asarray(h) for h in hosts]
    finite, norm = b.module.unscale_and_norm(arrays, 2.0**-7, norm_type)
    assert finite
    for a, w in zip(arrays, want, strict=True):
        assert np.array_equal(bits(b.to_numpy(a)), bits(w))
    ref = _norm64(want, inf_norm)
    assert norm == ref if inf_norm else math.isclose(norm, ref, rel_tol=1e-12)
    # inv_scale 1 writes nothing: the same arrays again give the same bits
    again = {b.module.unscale_and_norm(arrays, 1.0, norm_type)[1] for _ in range(3)}
    assert again == {norm}


@pytest.mark.parametrize("norm_type", [2.0, float("inf")], ids=["l2", "inf"])
@pytest.mark.parametrize("ratio", [0.3, 2.0])
def test_clip_is_torchs_formula(device_backend, norm_type, ratio):
    b = device_backend
    hosts = _hosts(b, 3)
    unscaled = [h.copy() for h in hosts]
    lscore.unscale_(unscaled, 0.5)
    max_norm = ratio * _norm64(unscaled, norm_type == math.inf)
    arrays = [b.asarray(h) for h in hosts]
    finite, norm = b.module.unscale_and_clip_(arrays, 0.5, max_norm, norm_type)
    coef = min(1.0, max_norm / (norm + 1e-6))
    assert finite and (coef < 1.0) == (ratio < 1.0)
    for a, u in zip(arrays, unscaled, strict=True):
        want = u.astype(np.float32) * np.float32(coef) if u.dtype != np.float64 else u * coef
        assert np.array_equal(bits(b.to_numpy(a)), bits(want.astype(u.dtype)))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nonfinite_step_is_reported_and_not_clipped(device_backend, bad):
    b = device_backend
    hosts = _hosts(b, 4, bad)
    want = [h.copy() for h in hosts]
    lscore.unscale_(want, 0.25)
    arrays = [b.asarray(h) for h in hosts]
    finite, norm = b.module.unscale_and_clip_(arrays, 0.25, 1e-3)
    assert not finite and not math.isfinite(norm) and math.isnan(norm) == np.isnan(bad)
    for a, w in zip(arrays, want, strict=True):
        # a float16/bfloat16 NaN as the GPU's conversion instruction leaves it
        assert np.array_equal(bits(b.to_numpy(a)), device_words(w))


def test_refusals_write_nothing(device_backend):
    b = device_backend
    a = b.asarray(np.full(4, 2.0, np.float32))
    with pytest.raises(ValueError, match="norm_type must be 2 or inf"):
        b.module.unscale_and_norm([a], 0.5, 1.0)
    with pytest.raises(ValueError, match="max_norm"):
        b.module.unscale_and_clip_([a], 0.5, 0.0)
    with pytest.raises(ValueError, match="dense"):
        b.module.unscale_and_clip_([a, b.asarray(np.ones((4, 4), np.float32))[:, ::2]], 0.5, 1.0)
    assert np.all(b.to_numpy(a) == 2.0)


def _kernels(backend_cls):
    from lscore import cuda, kernels

    return cuda.ArrayKernels(
        np,
        lambda dev: backend_cls(),
        kind=kernels.READ_NUMPY,
        limits=dict(chunk=64, block=8, max_tensors=3, max_blocks=4),
    )


@harness
@pytest.mark.parametrize("op", ["norm", "clip"])
def test_a_cached_call_is_its_launches_and_one_read(op):
    """The first call allocates the device's flag and norm buffer (its two uploads, whatever the
    arrays); later ones upload nothing and read the device once; the clip is enqueued
    before that read."""
    kern = _kernels(CountingBackend)
    grads = [np.full(n, 3.0, np.float32) for n in (300, 5, 64)] + [np.full(9, 3.0, np.float16)]

    def call():
        u, s = CountingBackend.uploads, CountingBackend.syncs
        if op == "norm":
            out = kern.unscale_and_norm(grads, 1.0)
        else:
            out = kern.unscale_and_clip_(grads, 1.0, 1.0)
        return out, CountingBackend.uploads - u, CountingBackend.syncs - s

    (finite, norm), uploads, syncs = call()
    assert finite and norm == math.sqrt(9.0 * 378) and uploads == 2 and syncs == 1
    launches = kern.device(0).backend.launches
    for _k in range(3):
        del launches[:]
        (finite, _), uploads, syncs = call()
        assert finite and uploads == 0 and syncs == 1
        names = [n for n, _, _ in launches]
        # the norm's launches fold on the device (no other launch), then the clip's
        norms = [i for i, n in enumerate(names) if n.startswith("lsc_mt_unscale_norm")]
        clips = [i for i, n in enumerate(names) if n.startswith("lsc_mt_clip")]
        assert norms == list(range(len(norms))) and len(names) == len(norms) + len(clips)
        assert bool(clips) == (op == "clip")
    if op == "clip":
        assert all(np.allclose(g, 1.0 / math.sqrt(378), rtol=1e-3) for g in grads)


@harness
def test_every_launch_goes_to_the_current_stream():
    class Streams(CountingBackend):
        current = 5
        seen: ClassVar[list] = []

        def stream(self):
            return Streams.current

        def launch_packed(self, fn, grid, block, params, widths, nparams, stream):
            Streams.seen.append(stream)
            super().launch_packed(fn, grid, block, params, widths, nparams, stream)

    kern = _kernels(Streams)
    grads = [np.full(100, 2.0, np.float64), np.full(7, 2.0, np.float16)]
    for current in (5, 11):
        Streams.current = current
        del Streams.seen[:]
        kern.unscale_and_clip_(grads, 0.5, 0.1)
        assert set(Streams.seen) == {current} and len(Streams.seen) >= 4


@harness
def test_arrays_on_two_devices_combine_their_norms():
    """One norm over both devices (their totals folded on the host), one coefficient for all."""
    from helpers.standin import XP, DeviceArray
    from lscore.cuda import ArrayKernels

    kern = ArrayKernels(
        XP,
        lambda dev: CountingBackend(),
        array_type=DeviceArray,
        limits=dict(chunk=16, block=4),
    )
    rng = np.random.default_rng(9)
    hosts = [
        rng.standard_normal(n).astype(dt)
        for n, dt in ((50, np.float32), (3, np.float16), (33, np.float64), (8, np.float32))
    ]
    unscaled = [h.copy() for h in hosts]
    lscore.unscale_(unscaled, 0.5)
    arrays = [DeviceArray(h, device=d) for h, d in zip(hosts, (0, 1, 1, 0), strict=True)]
    for norm_type in (2.0, "inf"):
        ref = _norm64(unscaled, norm_type == "inf")
        copies = [h.copy() for h in hosts]
        finite, norm = kern.unscale_and_norm(
            [DeviceArray(c, device=a.data.device_id) for c, a in zip(copies, arrays, strict=True)],
            0.5,
            norm_type,
        )
        assert finite and math.isclose(norm, ref, rel_tol=1e-12)
    finite, norm = kern.unscale_and_clip_(arrays, 0.5, 1.0)
    coef = 1.0 / (norm + 1e-6)
    assert finite and set(kern.table.plan(arrays).devices) == {0, 1}
    for h, u in zip(hosts, unscaled, strict=True):
        want = u.astype(np.float32) * np.float32(coef) if u.dtype != np.float64 else u * coef
        assert np.array_equal(bits(h), bits(want.astype(u.dtype)))
