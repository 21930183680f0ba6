"""How many device launches a sync-free CuPy step makes, counted on the CuPy stand-in.

helpers/cuda_host/cupy_standin.py is ``cupy`` over NumPy and the host harness; it counts
every operation CuPy would launch (ufuncs, copies, fills, lscore's kernels), eager or
recorded in a stream capture.  A sync-free SGD or Adam step over float32 variables with
one gradient dtype is the fused check, the fused update and the scale's update kernel:
three launches, and the same three when captured in a CUDA graph; its host side asks
for the launcher and the hyperparameters once.  Its results are the NumPy adapter's, bit
for bit.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from helpers.cuda_host import compiler, cupy_standin
from lscore.adapters import numpy as lnp

if compiler() is None:  # pragma: no cover
    pytest.skip("no C++ compiler for the host harness", allow_module_level=True)

from helpers.cuda_host import adapter

OPTIMIZERS = {
    "sgd": lambda m: m.SGD(0.1, momentum=0.9),
    "adam": lambda m: m.Adam(0.01),
}
SHAPES = {
    "dynamic": dict(initial_scale=16.0, dynamic_growth_steps=2),
    "fixed": dict(dynamic=False, initial_scale=8.0),
}


@pytest.fixture
def cp(monkeypatch):
    cupy_standin.install(monkeypatch)
    return cupy_standin.cupy


def _launches(step) -> int:
    before = cupy_standin.LAUNCHES.count
    step()
    return cupy_standin.LAUNCHES.count - before


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_sync_free_step_is_three_launches_eager_and_captured(cp, monkeypatch, name, shape):
    from lscore.adapters import cupy as lcp  # the stand-in's adapter

    calls: collections.Counter = collections.Counter()
    for method in ("fused_launcher", "_hyper_values"):
        cls = getattr(lcp, "SGD" if name == "sgd" else "Adam")
        real = getattr(cls, method)
        monkeypatch.setattr(
            cls, method, lambda self, _m=method, _f=real: (calls.update([_m]), _f(self))[1]
        )

    rng = np.random.default_rng(3)
    sizes = [5, 70, 1, 33]
    w0 = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    ours = [cp.asarray(w) for w in w0]
    theirs = [w.copy() for w in w0]
    grads = [cp.zeros(n, cp.float16) for n in sizes]
    opt = lcp.LossScaleOptimizer(OPTIMIZERS[name](lcp), sync_free=True, **SHAPES[shape])
    ref = lnp.LossScaleOptimizer(OPTIMIZERS[name](lnp), **SHAPES[shape])

    # the first step plans, allocates and uploads
    opt.minimize(lambda s: (0.0, grads), ours)
    with np.errstate(all="ignore"):
        ref.minimize(lambda s: (0.0, [np.asarray(g).view(np.ndarray) for g in grads]), theirs)
    for k in range(1, 7):
        for g in grads:
            g[...] = rng.standard_normal(g.size).astype(np.float16)
        if k % 3 == 1 and shape == "dynamic":
            grads[k % len(grads)][0] = np.inf  # a skipped step (a fixed scale applies it)
        host = [np.asarray(g).view(np.ndarray).copy() for g in grads]
        calls.clear()
        assert _launches(lambda: opt.minimize(lambda s: (0.0, grads), ours)) <= 3, k
        assert calls["fused_launcher"] <= 1 and calls["_hyper_values"] == 1, calls
        with np.errstate(all="ignore"):
            ref.minimize(lambda s, host=host: (0.0, host), theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert np.array_equal(np.asarray(a).view(np.uint32), b.view(np.uint32)), k
    assert opt.loss_scale == ref.loss_scale and opt.iterations == ref.iterations

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        recorded = _launches(lambda: opt.minimize(lambda s: (0.0, grads), ours))
        graph = stream.end_capture()
    assert recorded == len(graph._ops) <= 3


# the adapter's classes on NumPy and the harness, at module level as lscore.adapters.cupy
# defines them: pickle finds them by name
class SGD(adapter.SGD):
    pass


class LossScaleOptimizer(adapter.LossScaleOptimizer):
    pass


def test_a_pickled_default_mode_optimizer_restores_and_steps_as_the_original():
    """A pickle names the adapter's class and holds the wrapper's state and its mode's
    flag; the copy is of the same class, takes the same steps and skips the same."""
    import pickle

    rng = np.random.default_rng(4)
    w = [rng.standard_normal(n).astype(np.float32) for n in (3, 40)]
    opt = LossScaleOptimizer(SGD(0.1, momentum=0.9), initial_scale=8.0, dynamic_growth_steps=2)
    grads = [np.ones(3, np.float16), np.ones(40, np.float32)]
    opt.minimize(lambda s: (0.0, grads), w)
    w2, opt2 = pickle.loads(pickle.dumps((w, opt)))
    assert type(opt2) is type(opt) and isinstance(opt2, LossScaleOptimizer)
    assert not opt2.sync_free and repr(opt2) == repr(opt)
    for k in range(4):
        gs = [rng.standard_normal(g.size).astype(g.dtype) for g in grads]
        if k == 1:
            gs[0][0] = np.inf
        for o, ws in ((opt, w), (opt2, w2)):
            o.minimize(lambda s, gs=gs: (0.0, [g.copy() for g in gs]), ws)
        for a, b in zip(w, w2, strict=True):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), k
    assert opt2.loss_scale == opt.loss_scale and opt2.iterations == opt.iterations == 5


def test_a_sync_free_optimizer_refuses_a_pickle_or_copy_and_names_state_dict():
    """Its loss scale and Adam's step counter live on the device (the inner optimizer
    keeps device addresses too): a copy is refused before anything is read, and the
    state_dict it names resumes the run."""
    import copy
    import pickle

    w = [np.ones(3, np.float32)]
    opt = LossScaleOptimizer(SGD(0.1), sync_free=True)
    opt.minimize(lambda s: (0.0, [np.ones(3, np.float32)]), w)
    for dump in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(TypeError, match=r"sync_free=True\) cannot be pickled.*state_dict"):
            dump(opt)
    again = LossScaleOptimizer(SGD(0.1), sync_free=True)
    again.load_state_dict(opt.state_dict())
    assert again.loss_scale == opt.loss_scale and again.iterations == opt.iterations == 1


@pytest.mark.parametrize("sync_free", [False, True])
def test_a_dropped_optimizer_is_freed_at_once_with_its_slots(sync_free):
    """The wrapper and its mode hold no cycle: dropping the last reference frees the
    wrapper and the inner optimizer's slots (device memory on a GPU) at once, not at the
    garbage collector's next full pass."""
    import gc
    import weakref

    w = [np.ones(3, np.float32)]
    opt = LossScaleOptimizer(SGD(0.1, momentum=0.9), sync_free=sync_free)
    opt.minimize(lambda s: (0.0, [np.ones(3, np.float32)]), w)
    opt.apply_gradients([(np.ones(3, np.float32), w[0])])
    slots = [weakref.ref(s) for _, ss in opt.inner_optimizer._slots.values() for s in ss.values()]
    refs = [weakref.ref(opt), weakref.ref(opt.inner_optimizer), *slots]
    assert len(refs) == 3
    enabled = gc.isenabled()
    gc.disable()
    try:
        del opt
        assert all(r() is None for r in refs)
    finally:
        if enabled:
            gc.enable()
