"""The CuPy adapter's fused optimizers (_ext/optim.cu through adapters/_fused.py), in CI.

The adapter's classes are bound to NumPy and the host harness
(helpers/cuda_host/adapter.py), so the kernels, the records and plans, the
device step counter and the sync-free bookkeeping run on the CPU exactly
as lscore.adapters.cupy runs them on a GPU.  The reference is
lscore.adapters.numpy: parameters, slots, scale, counters and iterations
must match bit for bit after every step (NaN aside: see ``same``).  The
last test captures a real CUDA graph and needs a GPU.
"""

import ctypes
import re
import shutil
import types
import warnings

import numpy as np
import pytest

from helpers import FLOAT_DTYPES
from lscore import kernels
from lscore.adapters import numpy as lnp
from lscore.adapters._gated import Gated
from lscore.cuda.arrays import ArrayKernels
from lscore.cuda.optim import bias_table

if shutil.which("g++") is None:
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from helpers.cuda_host import adapter
from helpers.cuda_host.adapter import CountingBackend

GRAD_DTYPES = [d for d in FLOAT_DTYPES if d.name in ("float16", "bfloat16", "float32")]


def _bind(**limits):
    """The adapter bound to a harness device of its own, launching within `limits`."""
    return adapter.bind(
        ArrayKernels(np, lambda dev: CountingBackend(), kind=kernels.READ_NUMPY, limits=limits)
    )


# small launch limits: chunk edges, tensors split over launches, many launches
SMALL = _bind(chunk=16, block=4, max_tensors=3, max_blocks=5)
FULL = adapter.bind(adapter.KERNELS)

OPTIMIZERS = {
    "sgd": lambda m: m.SGD(0.1),
    "momentum": lambda m: m.SGD(0.05, momentum=0.9),
    "nesterov": lambda m: m.SGD(0.3, momentum=0.5, nesterov=True),
    "adam": lambda m: m.Adam(0.01),
    "adam_betas": lambda m: m.Adam(0.3, beta_1=0.5, beta_2=0.9, epsilon=1e-3),
    # tf-keras's decoupled weight decay (AdamW) and amsgrad
    "sgd_decay": lambda m: m.SGD(0.05, momentum=0.9, weight_decay=0.1),
    "adamw_amsgrad": lambda m: m.Adam(0.02, beta_2=0.9, amsgrad=True, weight_decay=0.3),
}
SHAPES = {
    "keras_dynamic": dict(initial_scale=16.0, dynamic_growth_steps=3),
    # scale < 1: a finite scaled float16 gradient can overflow once unscaled
    "keras_small_scale": dict(initial_scale=2.0**-6, dynamic_growth_steps=2),
    # not a power of two: the inverse rounds differently in float16 than in float32
    "keras_odd_scale": dict(initial_scale=1000.0, dynamic_growth_steps=4),
    "keras_fixed": dict(dynamic=False, initial_scale=8.0),
    "experimental": dict(loss_scale="dynamic"),
    "tf1": "manager",
}
SYNC_FREE_SHAPES = [k for k in SHAPES if k.startswith("keras")]


def _kwargs(shape):
    kw = SHAPES[shape]
    if kw == "manager":
        import lscore

        return dict(loss_scale_manager=lscore.ExponentialUpdateLossScaleManager(64, 2, 2))
    return dict(kw)


def bits(a):
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def same(a, b) -> bool:
    """Bit for bit, except that any NaN equals any NaN (an applied step with NaN, which
    Keras's fixed scale allows, makes the machine's default NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(bits(a)[~nan], bits(b)[~nan]))


class Pair:
    """The bound adapter's optimizer and the NumPy adapter's on the same inputs."""

    def __init__(self, binding, make, shape, sync_free, sizes, seed):
        _, _, sgd, adam, lso = binding
        self.rng = np.random.default_rng(seed)
        w0 = [self.rng.standard_normal(n).astype(np.float32) for n in sizes]
        self.ours, self.theirs = [w.copy() for w in w0], [w.copy() for w in w0]
        self.gdt = [GRAD_DTYPES[(seed + k) % len(GRAD_DTYPES)] for k in range(len(sizes))]
        # our gradients are written into the same buffers every step (one plan)
        self.gbuf = [np.zeros(n, dt) for n, dt in zip(sizes, self.gdt, strict=True)]
        self.inner_o = make(types.SimpleNamespace(SGD=sgd, Adam=adam))
        self.inner_t = make(lnp)
        self.opt_o = lso(self.inner_o, **_kwargs(shape), sync_free=sync_free)
        self.opt_t = lnp.LossScaleOptimizer(self.inner_t, **_kwargs(shape))
        self.sizes = sizes

    def coefs(self, plant_p=0.25):
        rng = self.rng
        cs = [rng.standard_normal(n) * rng.choice([1e-3, 1.0, 50.0]) for n in self.sizes]
        if rng.random() < 0.1:
            cs[int(rng.integers(0, len(cs)))] *= 2e5  # float16 overflows, scaled or not
        if rng.random() < plant_p:
            k = int(rng.integers(0, len(cs)))
            if cs[k].size:
                cs[k][int(rng.integers(0, cs[k].size))] = rng.choice([np.nan, np.inf, -np.inf])
        return cs

    def step(self, api="minimize", plant_p=0.25):
        cs = self.coefs(plant_p)

        def fn_t(scale):
            return 0.0, [
                (c * np.float32(scale)).astype(dt) for c, dt in zip(cs, self.gdt, strict=True)
            ]

        def fn_o(scale):
            for b, c, dt in zip(self.gbuf, cs, self.gdt, strict=True):
                b[...] = (c * np.float32(scale)).astype(dt)
            return 0.0, self.gbuf

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            if api == "minimize":
                self.opt_o.minimize(fn_o, self.ours)
                got = None
            else:
                got = self.opt_o.apply_gradients(self.opt_o.compute_gradients(fn_o, self.ours))
            want = self.opt_t.apply_gradients(self.opt_t.compute_gradients(fn_t, self.theirs))
        return got, want

    def check(self, ctx):
        for k, (a, b) in enumerate(zip(self.ours, self.theirs, strict=True)):
            assert same(a, b), (ctx, k)
        assert self.opt_o.iterations == self.opt_t.iterations, ctx
        # ours allocates every variable's slots on its first step, the NumPy adapter on
        # its first applied one: until then the NumPy side holds fewer
        for (_v_o, s_o), (_v_t, s_t) in zip(
            self.inner_o._slots.values(), self.inner_t._slots.values(), strict=False
        ):
            assert sorted(s_o) == sorted(s_t), ctx
            for k in s_t:
                assert same(s_o[k], s_t[k]), (ctx, k)

    def check_scale(self, ctx):
        shape_exp = self.opt_t.loss_scaling.shape == "experimental"
        assert shape_exp or self.opt_o.loss_scale == self.opt_t.loss_scale, ctx
        assert self.opt_o.dynamic_counter == self.opt_t.dynamic_counter, ctx


def _launched(binding, name_prefix):
    backend = binding[4]._backend.kernels.device(0).backend
    return sum(1 for n, _, _ in backend.launches if n.startswith(name_prefix))


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("shape", SYNC_FREE_SHAPES)
@pytest.mark.parametrize("binding", [FULL, SMALL], ids=["full", "small"])
def test_sync_free_fused_matches_numpy_adapter_bitwise(opt, shape, binding):
    sizes = [0, 1, 3, 16, 17, 40, 33, 5]
    for seed in range(2):
        p = Pair(binding, OPTIMIZERS[opt], shape, True, sizes, seed)
        skipped = 0
        for k in range(30):
            got, want = p.step("minimize" if k % 3 else "apply")
            skipped += not want
            if got is not None:
                assert bool(got) == want, (seed, k)
            p.check((seed, k))
            if k % 10 == 9:
                p.check_scale((seed, k))
        p.opt_o.sync_state()  # Adam: the device counter back into iterations
        p.check((seed, "synced"))
        assert skipped or shape == "keras_fixed"


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("binding", [FULL, SMALL], ids=["full", "small"])
def test_default_mode_fused_matches_numpy_adapter_bitwise(opt, shape, binding):
    sizes = [2, 0, 19, 16, 1, 48]
    for seed in range(2):
        p = Pair(binding, OPTIMIZERS[opt], shape, False, sizes, seed)
        for k in range(25):
            got, want = p.step("minimize" if k % 2 else "apply")
            if got is not None:
                assert got == want, (seed, k)
            p.check((seed, k))
        p.check_scale((seed, "end"))


@pytest.mark.parametrize("sync_free", [False, True], ids=["default", "sync_free"])
def test_the_fused_optimizers_launch_with_their_own_block_size(sync_free):
    """`opt_block` sizes the fused optimizers' blocks (and their check), `block` the
    scan kernels': each kernel's block size is the one its own setting names, and
    the step is still the NumPy adapter's."""
    split = _bind(chunk=16, block=4, opt_block=8, max_tensors=3)
    for opt in ("momentum", "adam"):
        p = Pair(split, OPTIMIZERS[opt], "keras_dynamic", sync_free, [2, 19, 48, 0, 17], 1)
        for k in range(6):
            got, want = p.step("minimize" if k % 2 else "apply")
            if got is not None:
                assert bool(got) == want, (opt, k)
            p.check((opt, k))
    blocks: dict[str, set] = {}  # kernel (unmangled) -> the block sizes it ran with
    for name, _, block in split[4]._backend.kernels.device(0).backend.launches:
        blocks.setdefault(re.search(r"lsc_[a-z_]+", name).group(), set()).add(block)
    fused = {
        k: v for k, v in blocks.items() if k in ("lsc_mt_sgd", "lsc_mt_adam", "lsc_mt_opt_check")
    }
    scans = {k: v for k, v in blocks.items() if k.startswith("lsc_mt_") and k not in fused}
    assert {"lsc_mt_sgd", "lsc_mt_adam"} <= fused.keys(), blocks
    assert all(v == {8} for v in fused.values()) and all(v == {4} for v in scans.values()), blocks
    assert sync_free or scans, blocks  # the default mode's check is a scan kernel


def _no_elementwise(monkeypatch):
    """The elementwise step (with Gated's copies and restores) must not run."""

    def refuse(*a, **k):
        raise AssertionError("the elementwise path ran")

    monkeypatch.setattr(Gated, "_update_step", refuse)


@pytest.mark.parametrize("opt", ["momentum", "adam"])
def test_sync_free_steps_read_nothing_upload_nothing_copy_nothing(monkeypatch, opt):
    _no_elementwise(monkeypatch)
    p = Pair(FULL, OPTIMIZERS[opt], "keras_dynamic", True, [7, 40, 3], 3)
    p.step()  # the first step plans and uploads
    ngroups = len({dt.name for dt in p.gdt})
    syncs, uploads = CountingBackend.syncs, CountingBackend.uploads
    kind = "lsc_mt_sgd" if opt == "momentum" else "lsc_mt_adam"
    launched, updates = _launched(FULL, kind), _launched(FULL, "lsc_device_update")
    checks = _launched(FULL, "lsc_mt_opt_check")
    scans = _launched(FULL, "lsc_mt_all_finite") + _launched(FULL, "lsc_mt_unscale")
    for _ in range(8):
        p.step()
    assert (CountingBackend.syncs, CountingBackend.uploads) == (syncs, uploads)
    # per step: the fused check and the fused update, one launch per gradient dtype each
    assert _launched(FULL, kind) - launched == 8 * ngroups
    assert _launched(FULL, "lsc_mt_opt_check") - checks == 8 * ngroups
    assert _launched(FULL, "lsc_device_update") - updates == 8
    assert _launched(FULL, "lsc_mt_all_finite") + _launched(FULL, "lsc_mt_unscale") == scans
    p.check("after")


def test_default_mode_minimize_is_fused_with_one_sync_per_step(monkeypatch):
    _no_elementwise(monkeypatch)
    p = Pair(FULL, OPTIMIZERS["adam"], "keras_dynamic", False, [7, 40, 3], 4)
    p.step()
    ngroups = len({dt.name for dt in p.gdt})
    syncs, uploads = CountingBackend.syncs, CountingBackend.uploads
    launched, checks = _launched(FULL, "lsc_mt_adam"), _launched(FULL, "lsc_mt_opt_check")
    applied = 0
    for k in range(8):
        applied += p.step(plant_p=k % 2)[1]
    assert CountingBackend.syncs - syncs == 8 and CountingBackend.uploads == uploads
    # per step a check, and an update when applied, one launch per gradient dtype each
    assert _launched(FULL, "lsc_mt_adam") - launched == applied * ngroups
    assert _launched(FULL, "lsc_mt_opt_check") - checks == 8 * ngroups
    assert 0 < applied < 8
    p.check("after")


def test_default_mode_apply_gradients_syncs_once_and_updates_fused(monkeypatch):
    _no_elementwise(monkeypatch)
    w = [np.ones(5, np.float32), np.ones(3, np.float32)]
    opt = adapter.LossScaleOptimizer(adapter.SGD(0.1, momentum=0.9))
    before, launched = CountingBackend.syncs, _launched(FULL, "lsc_mt_sgd")
    for _ in range(4):
        opt.apply_gradients(zip([np.ones(5, np.float32), np.ones(3, np.float16)], w, strict=True))
    assert CountingBackend.syncs - before == 4
    assert _launched(FULL, "lsc_mt_sgd") - launched == 4 * 2  # two gradient dtypes


@pytest.mark.parametrize("sync_free", [False, True])
def test_minimize_drops_none_gradients_on_the_fused_path(monkeypatch, sync_free):
    """Keras's rule through the fused kernels: a None gradient's variable is left as it
    is (with the warning), the others step exactly as the NumPy adapter steps them, and
    all-None is refused."""
    _no_elementwise(monkeypatch)
    ours = [np.full(n, 1.0, np.float32) for n in (5, 3, 4)]
    theirs = [w.copy() for w in ours]
    opt_o = adapter.LossScaleOptimizer(adapter.SGD(0.1, momentum=0.9), sync_free=sync_free)
    opt_t = lnp.LossScaleOptimizer(lnp.SGD(0.1, momentum=0.9))
    launched = _launched(FULL, "lsc_mt_sgd")

    def fn(scale):
        return 0.0, [np.full(5, scale, np.float32), None, np.full(4, scale / 4, np.float16)]

    for _ in range(3):
        with pytest.warns(UserWarning, match="Gradients do not exist"):
            opt_o.minimize(fn, ours)
        with pytest.warns(UserWarning, match="Gradients do not exist"):
            opt_t.minimize(fn, theirs)
    assert _launched(FULL, "lsc_mt_sgd") - launched == 3 * 2  # two gradient dtypes
    assert all(same(a, b) for a, b in zip(ours, theirs, strict=True))
    assert np.all(ours[1] == 1.0)
    with pytest.raises(ValueError, match="No gradients provided for any variable"):
        opt_o.minimize(lambda s: (0.0, [None, None, None]), ours)


def test_other_variable_dtypes_and_clipping_take_the_elementwise_path():
    launched = _launched(FULL, "lsc_mt_sgd")
    w16, w64 = np.ones(4, np.float16), np.ones(4, np.float64)
    adapter.SGD(0.5).apply_gradients([(np.ones(4, np.float16), w16)])
    adapter.SGD(0.5).apply_gradients([(np.ones(4, np.float64), w64)])
    w = np.ones(4, np.float32)
    adapter.SGD(0.5, clipvalue=0.25).apply_gradients([(np.ones(4, np.float32), w)])
    assert _launched(FULL, "lsc_mt_sgd") == launched
    assert np.all(w16 == 0.5) and np.all(w64 == 0.5) and np.all(w == 0.875)
    adapter.SGD(0.5).apply_gradients([(np.ones(4, np.float32), w)])
    assert _launched(FULL, "lsc_mt_sgd") == launched + 1 and np.all(w == 0.375)


@pytest.mark.parametrize("sync_free", [False, True], ids=["default", "sync-free"])
def test_a_gradient_of_another_shape_is_refused_as_the_numpy_adapter_refuses_it(sync_free):
    """Same element count, another shape: the fused kernels could read it, but the
    elementwise rule (a gradient has its variable's shape) decides; nothing is
    launched or changed, and a matching step after it is fused."""
    launched = _launched(FULL, "lsc_mt_sgd")
    ours = [np.ones((2, 3), np.float32), np.ones(4, np.float32)]
    opt = adapter.LossScaleOptimizer(adapter.SGD(0.5), sync_free=sync_free)
    for bad in ((3, 2), (6,), (1, 2, 3)):
        with pytest.raises(ValueError, match="does not match variable shape"):
            opt.minimize(
                lambda s, bad=bad: (0.0, [np.ones(bad, np.float32), np.ones(4, np.float32)]), ours
            )
        assert all(np.all(w == 1.0) for w in ours)
    with pytest.raises(ValueError, match="does not match variable shape"):
        lnp.LossScaleOptimizer(lnp.SGD(0.5)).minimize(
            lambda s: (0.0, [np.ones((3, 2), np.float32), np.ones(4, np.float32)]),
            [w.copy() for w in ours],
        )
    assert _launched(FULL, "lsc_mt_sgd") == launched
    opt.minimize(lambda s: (0.0, [np.full((2, 3), s, np.float32), np.full(4, s, np.float32)]), ours)
    assert _launched(FULL, "lsc_mt_sgd") == launched + 1
    assert all(np.all(w == 0.5) for w in ours)


def test_overlapping_variables_and_empty_lists_keep_the_sequential_semantics():
    base = np.ones(8, np.float32)
    a, b = base[:6], base[2:]  # overlapping views: updated one after the other
    ref = np.ones(8, np.float32)
    ra, rb = ref[:6], ref[2:]
    launched = _launched(FULL, "lsc_mt_sgd")
    adapter.SGD(0.5).apply_gradients([(np.ones(6, np.float32), a), (np.ones(6, np.float32), b)])
    lnp.SGD(0.5).apply_gradients([(np.ones(6, np.float32), ra), (np.ones(6, np.float32), rb)])
    assert _launched(FULL, "lsc_mt_sgd") == launched and np.array_equal(base, ref)
    ours = adapter.LossScaleOptimizer(adapter.Adam(0.1), sync_free=True)
    theirs = lnp.LossScaleOptimizer(lnp.Adam(0.1))
    ours.apply_gradients([])
    theirs.apply_gradients([])
    assert ours.iterations == theirs.iterations and ours.loss_scale == theirs.loss_scale


def test_a_changed_address_is_packed_again_and_uploads_nothing():
    opt = adapter.SGD(0.5)
    w, g = np.ones(6, np.float32), np.ones(6, np.float32)
    opt.apply_gradients([(g, w)])
    uploads, syncs = CountingBackend.uploads, CountingBackend.syncs
    plans = opt.fused_launcher()._cache  # an LRU shared with other optimizers of the device
    known = list(plans)
    opt.apply_gradients([(g, w)])
    assert list(plans) == known
    opt.apply_gradients([(np.ones(6, np.float32) * 2, w)])  # another gradient buffer
    assert list(plans)[-1] not in known  # a new plan: the new address is in its arguments
    assert (CountingBackend.uploads, CountingBackend.syncs) == (uploads, syncs)
    assert np.all(w == 1.0 - 0.5 - 0.5 - 1.0)


def test_device_step_counter_mirrors_iterations():
    p = Pair(FULL, OPTIMIZERS["adam_betas"], "keras_dynamic", True, [5, 9], 6)
    for _ in range(3):
        p.step()
    # set on the host (a checkpoint restore): the device counter follows, without a sync
    p.inner_o.iterations = p.inner_t.iterations = 40
    syncs = CountingBackend.syncs
    for _ in range(3):
        p.step()
    assert CountingBackend.syncs == syncs
    p.check("after a host write")
    p.inner_o.iterations = -7  # a stale host value: sync_state reads the device's
    p.opt_o.sync_state()
    assert p.inner_o.iterations == p.inner_t.iterations == 43


def test_bias_table_is_the_hosts_own_terms_up_to_saturation():
    opt = adapter.Adam(0.1, beta_1=0.9, beta_2=0.999)
    table, last = bias_table(lambda s: opt._bias_terms(np.float32, s))
    one = np.float32(1)
    for t in list(range(1, 50)) + list(range(last - 50, last + 1)):
        sq, d = opt._bias_terms(np.float32, t)
        assert bits(table[t : t + 1]) == bits(np.array([sq])) and table[last + 1 + t] == d
    sq, d = opt._bias_terms(np.float32, last - 1)
    assert (sq, d) != (one, one)
    for t in (last, last + 1, 10 * last):
        assert opt._bias_terms(np.float32, t) == (one, one)
    with pytest.raises(ValueError, match="beta_2 too close to 1"):
        bias_table(lambda s: adapter.Adam(beta_2=0.9999999)._bias_terms(np.float32, s), limit=1000)


@pytest.mark.parametrize("sync_free", [False, True], ids=["default", "sync_free"])
def test_fused_minimize_advances_global_step_only_on_applied_steps(monkeypatch, sync_free):
    """TF1's global_step through the fused minimize: +1 on an applied step (a device bool
    added on the device in sync-free mode), unchanged on a skipped one; last_step_skipped."""
    _no_elementwise(monkeypatch)
    w = [np.ones(5, np.float32)]
    g = [np.zeros(5, np.float16)]
    opt = adapter.LossScaleOptimizer(
        adapter.Adam(0.1), initial_scale=4.0, dynamic_growth_steps=2, sync_free=sync_free
    )
    global_step = np.array(0, np.int64)
    seen = []
    for k in range(6):
        g[0][...] = np.inf if k in (1, 4) else 0.5
        with np.errstate(all="ignore"):
            opt.minimize(lambda s: (0.0, g), w, global_step=global_step)
        seen.append((bool(opt.last_step_skipped), int(global_step)))
    assert seen == [(False, 1), (True, 1), (False, 2), (False, 3), (True, 3), (False, 4)]
    assert opt.iterations == 6 and opt.loss_scale == 2.0  # 4, 2, 2, 4, 2, 2


@pytest.fixture
def capturing():
    """Pretend the current stream is capturing (the harness refuses reads and uploads)."""
    CountingBackend.capturing = True
    try:
        yield
    finally:
        CountingBackend.capturing = False


def test_a_captured_step_needs_nothing_from_the_host(capturing, monkeypatch):
    CountingBackend.capturing = False
    p = Pair(FULL, OPTIMIZERS["adam"], "keras_dynamic", True, [5, 17, 1], 7)
    p.step()  # the eager warm-up step
    _no_elementwise(monkeypatch)
    CountingBackend.capturing = True
    for _ in range(4):  # the harness runs "captured" steps at once
        p.step()
    CountingBackend.capturing = False
    p.opt_o.sync_state()
    p.check("captured")
    p.check_scale("captured")


def test_what_would_break_a_capture_raises_clearly(capturing):
    CountingBackend.capturing = False
    w = [np.ones(5, np.float32)]
    g = [np.ones(5, np.float16)]
    opt = adapter.LossScaleOptimizer(adapter.Adam(0.1), sync_free=True)
    default = adapter.LossScaleOptimizer(adapter.SGD(0.1))
    opt.minimize(lambda s: (0.0, g), w)
    CountingBackend.capturing = True
    with pytest.raises(RuntimeError, match=r"capturing.*read it after end_capture"):
        opt.loss_scale  # noqa: B018 - reading the property is what raises
    with pytest.raises(RuntimeError, match="capturing"):
        opt.sync_state()
    with pytest.raises(RuntimeError, match="sync_free=True"):
        default.minimize(lambda s: (0.0, g), w)
    with pytest.raises(RuntimeError, match="sync_free=True"):
        default.apply_gradients(zip(g, w, strict=True))
    for fn in (adapter.all_finite, lambda a: adapter.unscale_(a, 0.5)):
        with pytest.raises(RuntimeError, match="capturing"):
            fn(g)
    # a new gradient buffer: its address travels in the kernel arguments, so the capture
    # takes the step (nothing uploaded, nothing read)
    uploads, syncs, before = CountingBackend.uploads, CountingBackend.syncs, w[0].copy()
    opt.minimize(lambda s: (0.0, [np.ones(5, np.float16)]), w)
    assert (CountingBackend.uploads, CountingBackend.syncs) == (uploads, syncs)
    assert not np.array_equal(w[0], before)
    with pytest.raises(RuntimeError, match="eager step"):  # a new variable: its slots
        opt.minimize(lambda s: (0.0, [np.ones(2, np.float16)]), [np.ones(2, np.float32)])
    with pytest.raises(RuntimeError, match="elementwise path"):
        opt.apply_gradients([(np.ones(2), np.ones(2))])  # float64: elementwise
    opt.inner_optimizer.beta_2 = 0.99
    with pytest.raises(RuntimeError, match="bias-correction table"):
        opt.minimize(lambda s: (0.0, g), w)
    CountingBackend.capturing = False
    assert np.all(w[0] != 1.0)


# ---- a live schedule: hyperparameters written between replays --------------------


class Recorder:
    """Records the harness's kernel launches with a copy of their parameter values, as
    cuLaunchKernel copies them into a captured graph, and replays them unchanged."""

    def __init__(self, monkeypatch):
        from helpers.cuda_host import HostBackend

        self.launch = HostBackend.launch_packed
        self.recorded: list[tuple] = []
        self.on = False

        def record(backend, fn, grid, block, params, widths, n, stream):
            if self.on:
                sizes = np.frombuffer((ctypes.c_int64 * n).from_address(widths), np.int64)
                addrs = np.frombuffer((ctypes.c_uint64 * n).from_address(params), np.uint64)
                values = [
                    ctypes.string_at(int(a), int(w)) for a, w in zip(addrs, sizes, strict=True)
                ]
                bufs = [np.frombuffer(v, np.uint8).copy() for v in values]
                copy = np.array([b.ctypes.data for b in bufs], np.uint64)
                own = sizes.copy()
                self.recorded.append((backend, fn, grid, block, copy, own, bufs, stream))
            self.launch(backend, fn, grid, block, params, widths, n, stream)

        monkeypatch.setattr(HostBackend, "launch_packed", record)

    def replay(self):
        for backend, fn, grid, block, params, widths, _bufs, stream in self.recorded:
            self.launch(
                backend,
                fn,
                grid,
                block,
                params.ctypes.data,
                widths.ctypes.data,
                len(widths),
                stream,
            )


SCHEDULES = {
    "momentum": (lambda m: m.SGD(0.05, momentum=0.9, weight_decay=0.01), "momentum"),
    "nesterov": (lambda m: m.SGD(0.3, momentum=0.5, nesterov=True), "weight_decay"),
    "adam": (lambda m: m.Adam(0.01, beta_1=0.8, weight_decay=0.02), "epsilon"),
}


@pytest.mark.parametrize("opt", list(SCHEDULES))
def test_a_replayed_step_takes_the_learning_rate_set_between_replays(monkeypatch, opt):
    """One eager step, one captured (the harness runs it as it records its launches),
    then replays of those very launches, with the learning rate (and once another live
    hyperparameter) set between replays: the parameters and slots match eager NumPy steps
    given those values, bit for bit, and nothing is uploaded once captured."""
    make, other = SCHEDULES[opt]
    _no_elementwise(monkeypatch)
    rec = Recorder(monkeypatch)
    rng = np.random.default_rng(5)
    sizes, dts = [5, 33, 1, 70], [np.float16, np.float32, np.float16, np.float32]
    w0 = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    ours, theirs = [w.copy() for w in w0], [w.copy() for w in w0]
    grads = [np.zeros(n, dt) for n, dt in zip(sizes, dts, strict=True)]
    opt_o = adapter.LossScaleOptimizer(
        make(adapter), dynamic=False, initial_scale=8.0, sync_free=True
    )
    opt_t = lnp.LossScaleOptimizer(make(lnp), dynamic=False, initial_scale=8.0)
    lrs = [0.1, 0.02, 0.3, 0.0125, 0.2, 0.07, 0.5]
    for step, lr in enumerate(lrs):
        for g in grads:
            g[...] = rng.standard_normal(g.size).astype(g.dtype)
        for o in (opt_o, opt_t):
            o.learning_rate = lr  # through the wrapper to the inner optimizer
            if step == 4:
                setattr(o.inner_optimizer, other, 0.25)
        with np.errstate(all="ignore"):
            opt_t.apply_gradients(zip([g.copy() for g in grads], theirs, strict=True))
        if step < 2:
            CountingBackend.capturing = rec.on = step == 1
            try:
                opt_o.apply_gradients(zip(grads, ours, strict=True))
            finally:
                CountingBackend.capturing = rec.on = False
            uploads = CountingBackend.uploads
        else:
            rec.replay()
            if opt == "adam":  # the captured step's one non-kernel op: its counter's increment
                np.add(opt_o._mode._count, 1, out=opt_o._mode._count)
        for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert same(a, b), (step, k)
        slots_o = [s for _, ss in opt_o.inner_optimizer._slots.values() for s in ss.values()]
        slots_t = [s for _, ss in opt_t.inner_optimizer._slots.values() for s in ss.values()]
        assert len(slots_o) == len(slots_t) > 0
        for k, (a, b) in enumerate(zip(slots_o, slots_t, strict=True)):
            assert same(a, b), (step, "slot", k)
    assert rec.recorded and CountingBackend.uploads == uploads


def test_setting_a_hyperparameter_while_capturing_raises_clearly(capturing):
    CountingBackend.capturing = False
    w, g = [np.ones(5, np.float32)], [np.ones(5, np.float16)]
    opt = adapter.LossScaleOptimizer(adapter.SGD(0.1, momentum=0.5), sync_free=True)
    opt.learning_rate = 0.2  # no device copy yet: nothing to write
    opt.minimize(lambda s: (0.0, g), w)
    CountingBackend.capturing = True
    for name in ("learning_rate", "momentum", "weight_decay"):
        with pytest.raises(RuntimeError, match=f"setting {name}.*capturing.*between replays"):
            setattr(opt.inner_optimizer, name, 0.3)
    assert opt.learning_rate == 0.2 and opt.inner_optimizer.momentum == 0.5
    opt.minimize(lambda s: (0.0, g), w)  # unchanged values: the capture writes nothing
    CountingBackend.capturing = False
    opt.learning_rate = 0.3  # between replays: allowed


# ---- a real CUDA graph (GPU only) -----------------------------------------------


def _gpu_run(cp, lcp, make, host_coefs, captured):
    """101 sync-free steps over float16/float32 gradients, eagerly or as one eager step
    then 100 replays of a captured one, the learning rate set before each; returns every
    array and counter on the host."""
    w = [cp.asarray(np.linspace(-1, 1, n, dtype=np.float32)) for n in (1, 3, 1000, 70001)]
    dts = [np.float16, np.float32, np.float16, np.float32]
    coef = [cp.zeros(x.size, np.float32) for x in w]
    grads = [cp.zeros(x.size, dt) for x, dt in zip(w, dts, strict=True)]
    opt = lcp.LossScaleOptimizer(
        make(lcp), initial_scale=2.0**4, dynamic_growth_steps=3, sync_free=True
    )

    def loss_and_grads(scale):  # no allocation: a captured step may not allocate
        for c, g in zip(coef, grads, strict=True):
            cp.multiply(c, scale, out=g)
        return None, grads

    cp.cuda.Device().synchronize()  # the arrays above were made on the legacy stream
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for k, cs in enumerate(host_coefs):
            for c, h in zip(coef, cs, strict=True):
                c.set(h, stream=stream)
            # a live schedule: written on the replay stream, outside the capture
            opt.learning_rate = (0.05, 0.01, 0.03, 0.002, 0.08)[k % 5]
            if not captured or k == 0:
                opt.minimize(loss_and_grads, w)
            else:
                if k == 1:
                    stream.synchronize()
                    stream.begin_capture()
                    opt.minimize(loss_and_grads, w)
                    graph = stream.end_capture()
                graph.launch(stream)
        stream.synchronize()
    opt.sync_state()
    slots = [s.get() for _, ss in opt.inner_optimizer._slots.values() for s in ss.values()]
    return [x.get() for x in w], slots, opt.loss_scale, opt.dynamic_counter, opt.iterations


@pytest.mark.gpu
@pytest.mark.parametrize("make", [OPTIMIZERS["momentum"], OPTIMIZERS["adam"]], ids=["sgd", "adam"])
def test_a_captured_step_replays_bitwise_like_eager_steps(make):
    cp = pytest.importorskip("cupy")
    from lscore.adapters import cupy as lcp

    rng = np.random.default_rng(11)
    host = []
    for k in range(101):
        cs = [(rng.standard_normal(n) * 10.0).astype(np.float32) for n in (1, 3, 1000, 70001)]
        if k % 9 == 4:
            cs[k % 4][k % cs[k % 4].size] = [np.nan, np.inf, -np.inf][k % 3]
        host.append(cs)
    eager = _gpu_run(cp, lcp, make, host, captured=False)
    graph = _gpu_run(cp, lcp, make, host, captured=True)
    for a, b in zip(eager[0] + eager[1], graph[0] + graph[1], strict=True):
        assert np.array_equal(bits(a), bits(b))
    assert eager[2:4] == graph[2:4]
    if "Adam" in type(make(lcp)).__name__:
        assert eager[4] == graph[4] == 101  # the device step counter, read back
