"""The CuPy adapter's logic, run in CI with NumPy standing in for cupy and the host harness
standing in for the GPU (tests/helpers/cuda_host); then the real thing where a GPU exists.

helpers/cuda_host/adapter.py binds the adapter's classes (adapters/_device.py)
to numpy and cuda_host.HostBackend exactly as lscore.adapters.cupy binds them
to cupy and lscore.cuda.CupyBackend.  Tests over ``device_backend`` run on
both bindings (cupy only with a GPU); the others read the harness's counters
and caches.  Expected results come from the NumPy adapter and the CPU core;
all_finite / unscale_ against the CPU core are in test_backends.py.
"""

import shutil
import types
import warnings

import numpy as np
import pytest

import lscore
from helpers.cuda_host.adapter import KERNELS, SGD, Adam, CountingBackend, LossScaleOptimizer
from lscore.adapters import numpy as lnp

harness = pytest.mark.skipif(
    shutil.which("g++") is None, reason="g++ is missing: the CUDA host harness cannot be built"
)


def bits(a):
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def same(a, b) -> bool:
    """Bit for bit, except that any NaN equals any NaN: a step applied with NaN/Inf (Keras's
    fixed scale applies them) makes NaNs whose sign and payload are the machine's, not the
    arithmetic's (x86's default NaN is negative, a GPU's positive)."""
    a, b = np.asarray(a), np.asarray(b)
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(bits(a)[~nan], bits(b)[~nan]))


# ---- all_finite / unscale_ through the adapter's gathering ----------------


def test_errors_change_nothing(device_backend):
    b = device_backend
    good = b.asarray(np.full(4, 2.0, np.float32))
    with pytest.raises(ValueError, match="dense"):
        b.unscale_([good, b.asarray(np.ones((4, 4), np.float32))[:, ::2]], 0.5)
    with pytest.raises(TypeError, match="unsupported array type"):
        b.unscale_([good, [1.0]], 0.5)
    with pytest.raises(TypeError, match="unsupported dtype"):
        b.all_finite([good, b.asarray(np.zeros(3, np.complex64))])
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="inv_scale"):
            b.unscale_([good], bad)
    with pytest.raises(TypeError, match="inv_scale"):
        b.unscale_([good], "0.5")
    assert np.all(b.to_numpy(good) == 2.0)


def _unscaled(arrays, inv):
    """What lscore.unscale_ (the CPU core) makes of copies of `arrays`."""
    want = [a.copy() for a in arrays]
    finite = lscore.unscale_(want, inv)
    return finite, want


def _calls(kern, arrays, inv=0.5):
    """(result, uploads, syncs, launches) of one unscale_ through the harness binding."""
    runner = kern.device(0)
    u, s, n = CountingBackend.uploads, CountingBackend.syncs, len(runner.backend.launches)
    finite = kern.unscale_(arrays, inv)
    return (
        finite,
        CountingBackend.uploads - u,
        CountingBackend.syncs - s,
        len(runner.backend.launches) - n,
    )


@harness
def test_a_cached_call_is_its_launches_and_one_read():
    """Same arrays again: the plan is reused, nothing uploaded, one launch per dtype, one sync."""
    grads = [np.ones(n, np.float32) for n in (3, 70000, 5)] + [np.ones(4, np.float16)]
    table = KERNELS.table
    hits = table.hits
    first = _calls(KERNELS, grads)
    # first sight: planned on the host; the addresses travel in the kernel arguments
    assert first[0] and first[1] == 0 and first[2] == 1
    for k in range(3):
        finite, uploads, syncs, launches = _calls(KERNELS, grads, 2.0 if k % 2 == 0 else 0.5)
        assert finite and uploads == 0 and syncs == 1 and launches == 2
    assert table.hits == hits + 3
    for _ in range(2):
        hits = table.hits
        assert KERNELS.all_finite(grads) and table.hits == hits + 1
    assert all(np.all(g == 1.0) for g in grads)


@harness
def test_a_new_list_of_the_same_arrays_reuses_the_plan():
    grads = [np.full(5, 4.0, np.float32), np.full(3, 4.0, np.float64)]
    KERNELS.unscale_(grads, 0.5)
    hits = KERNELS.table.hits
    assert KERNELS.unscale_(list(grads), 0.5) and KERNELS.unscale_(tuple(grads), 0.5)
    assert KERNELS.unscale_({"a": grads[0], "b": [grads[1]]}, 0.5)
    assert KERNELS.table.hits == hits + 3
    assert all(np.all(g == 0.25) for g in grads)


@harness
def test_lists_that_share_their_first_arrays_keep_their_own_plans():
    """Two optimizers over the same gradients (or a walk of gradients then variables)
    alternate every step: each list stays cached instead of evicting the other."""
    grads = [np.full(4, 4.0, np.float32), np.full(6, 4.0, np.float32)]
    a, b = [grads, [np.ones(4, np.float32)]], [grads, [np.ones(4, np.float32)]]
    KERNELS.all_finite(a)
    KERNELS.all_finite(b)
    hits, misses = KERNELS.table.hits, KERNELS.table.misses
    for _ in range(3):
        assert KERNELS.all_finite(a) and KERNELS.all_finite(b)
    assert (KERNELS.table.hits - hits, KERNELS.table.misses - misses) == (6, 0)


@harness
def test_the_same_list_mutated_in_place_is_planned_again():
    grads = [np.full(5, 4.0, np.float32), np.full(3, 4.0, np.float32)]
    KERNELS.unscale_(grads, 0.5)
    old = grads[1]
    grads[1] = np.full(7, 4.0, np.float32)
    misses = KERNELS.table.misses
    grads[0][2] = np.inf
    assert not KERNELS.unscale_(grads, 0.5)
    assert KERNELS.table.misses == misses + 1
    assert np.all(grads[1] == 2.0) and np.all(old == 2.0) and grads[0][0] == 1.0
    grads.append(np.full(2, 4.0, np.float32))  # grown in place
    grads[0][2] = 1.0
    assert KERNELS.unscale_(grads, 0.5) and np.all(grads[2] == 2.0)
    assert KERNELS.table.misses == misses + 2


@harness
def test_new_arrays_upload_nothing_wherever_they_are():
    """Fresh arrays every call (as a backward pass makes them), where the last ones were
    or elsewhere: planned again (new objects), and the addresses travel in the kernel
    arguments, so no call uploads anything or synchronises beyond its one read."""
    base = np.full(64, 4.0, np.float32)
    views = lambda: [base[0:10], base[16:40], base[48:64]]  # noqa: E731 - a one-line local helper
    KERNELS.unscale_(views(), 1.0)
    ups, misses = CountingBackend.uploads, KERNELS.table.misses
    for _ in range(3):
        assert KERNELS.unscale_(views(), 1.0)
    assert (CountingBackend.uploads - ups, KERNELS.table.misses - misses) == (0, 3)
    syncs = CountingBackend.syncs
    assert KERNELS.unscale_([base[1:11], base[16:40], base[48:64]], 1.0)
    assert CountingBackend.uploads == ups and CountingBackend.syncs == syncs + 1


@harness
def test_arrays_freed_and_reallocated_are_planned_again():
    """New arrays (at the old addresses or not), a resized array and a changed dtype:
    the cached plan is never used for them."""
    for step in range(4):
        grads = [np.full(n, 4.0, np.float32) for n in (6, 9, 3)]
        misses = KERNELS.table.misses
        grads[step % 3][-1] = np.nan
        assert not KERNELS.unscale_(grads, 0.5)
        assert KERNELS.table.misses == misses + 1
        _finite, want = _unscaled([np.full(n, 4.0, np.float32) for n in (6, 9, 3)], 0.5)
        assert all(np.array_equal(g[:-1], w[:-1]) for g, w in zip(grads, want, strict=True))
        del grads
    # the same object with a new address, size or dtype (CuPy-shaped arrays, whose fields
    # can be swapped): never the cached plan
    from helpers.standin import XP, DeviceArray
    from lscore.cuda import ArrayKernels

    kern = ArrayKernels(XP, lambda dev: CountingBackend(), array_type=DeviceArray)
    a, other = DeviceArray(np.full(8, 4.0, np.float32)), DeviceArray(np.full(2, 4.0, np.float32))
    kern.unscale_([a, other], 0.5)
    for host in (
        np.full(8, 4.0, np.float32),
        np.full(20, 4.0, np.float32),
        np.full(8, 4.0, np.float64),
    ):
        new = DeviceArray(host)
        misses = kern.table.misses
        a.data, a.size, a.dtype, a.host = new.data, new.size, new.dtype, host
        assert kern.unscale_([a, other], 0.5) and np.all(host == 2.0)
        assert kern.table.misses == misses + 1
    assert np.all(other.host == 4.0 / 16)


@harness
def test_a_cached_plan_reads_what_the_array_type_says_now():
    """The walk reads an array's attributes through descriptors it resolved once per type;
    a type that changes since (a property in place of a slot) is read anew, so the cached
    plan of an array whose size now reads differently is not used."""
    from helpers.standin import XP, DeviceArray
    from lscore.cuda import ArrayKernels

    class Moving(DeviceArray):
        __slots__ = ()

    kern = ArrayKernels(XP, lambda dev: CountingBackend(), array_type=Moving)
    host = np.full(8, 4.0, np.float32)
    a = Moving(host)
    for _ in range(2):
        assert kern.unscale_([a], 0.5)
    misses = kern.table.misses
    Moving.size = property(lambda self: 3)  # the slot's value is still 8
    try:
        assert kern.unscale_([a], 0.5)
        assert kern.table.misses == misses + 1
        assert np.all(host[:3] == 0.5) and np.all(host[3:] == 1.0)
    finally:
        del Moving.size
    assert kern.unscale_([a], 0.5) and np.all(host == [0.25] * 3 + [0.5] * 5)
    assert kern.table.misses == misses + 2


class _GetsetArray(np.ndarray):
    """A CuPy-shaped array whose ``size``, ``dtype``, ``shape`` and ``flags`` are an
    extension type's getset descriptors (NumPy's), as CuPy's fields are Cython's."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data, device_id=0, mem=self)


@harness
def test_getset_attributes_are_read_as_the_array_has_them_now():
    """An array type whose fields are C getset descriptors (as CuPy's): a cached call
    hits, and the same object viewed in place as another dtype (a new size and dtype at
    the same address) is planned again."""
    from lscore.cuda import ArrayKernels

    xp = types.SimpleNamespace(__name__="cupy", ndarray=_GetsetArray)
    kern = ArrayKernels(xp, lambda dev: CountingBackend(), array_type=_GetsetArray)
    a = np.full(4, 4.0, np.float32).view(_GetsetArray).copy()
    assert kern.unscale_([a], 0.5)
    hits, misses = kern.table.hits, kern.table.misses
    assert kern.unscale_([a], 0.5) and kern.table.hits == hits + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        a.dtype = np.float16  # the same object and buffer: 8 float16 words
    want = np.asarray(a).copy()
    lscore.unscale_(want, 0.5)
    assert kern.unscale_([a], 0.5) and kern.table.misses == misses + 1
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), want.view(np.uint16))


class _UnrefArray:
    """A CuPy-shaped array that takes no weak reference (its plans are not kept)."""

    __slots__ = ("data", "dtype", "flags", "host", "shape", "size", "strides")

    def __init__(self, host):
        import types

        self.host, self.size, self.dtype = host, host.size, host.dtype
        self.shape, self.strides = host.shape, host.strides
        self.data = types.SimpleNamespace(ptr=host.ctypes.data, device_id=0, mem=host)
        self.flags = types.SimpleNamespace(c_contiguous=True, f_contiguous=True, owndata=False)


class _FlagsOnlyArray:
    """A CuPy-shaped array without CuPy's ``_c_contiguous`` / ``_f_contiguous`` fields."""

    __slots__ = ("__weakref__", "data", "dtype", "flags", "host", "shape", "size", "strides")

    def __init__(self, host, c, f):
        import types

        self.host, self.size, self.dtype = host, host.size, host.dtype
        self.shape, self.strides = host.shape, host.strides
        self.data = types.SimpleNamespace(ptr=host.ctypes.data, device_id=0, mem=host)
        self.flags = types.SimpleNamespace(c_contiguous=c, f_contiguous=f, owndata=False)


def test_contiguity_comes_from_cupys_fields_else_flags():
    """The walk reads CuPy's ``_c_contiguous`` / ``_f_contiguous`` (no Flags object per
    array) and falls back to ``flags`` for an array type without them."""
    import types

    from helpers.standin import DeviceArray
    from lscore.cuda import ArrayKernels

    xp = types.SimpleNamespace(__name__="cupy", ndarray=DeviceArray)
    kern = ArrayKernels(xp, lambda dev: CountingBackend(), array_type=DeviceArray)
    a = DeviceArray(np.full(8, 4.0, np.float32))
    a._c_contiguous = a._f_contiguous = False  # the fields win over flags
    with pytest.raises(ValueError, match="dense"):
        kern.unscale_([a], 0.5)
    a._f_contiguous = True  # F-contiguous only: dense, and not C-contiguous
    plan = kern.table.plan([a])
    assert plan.write_error is None and not plan.leaf_c_contiguous[0]
    assert kern.unscale_([a], 0.5) and np.all(a.host == 2.0)

    flat = ArrayKernels(xp, lambda dev: CountingBackend(), array_type=_FlagsOnlyArray)
    for c, f, dense in ((True, False, True), (False, True, True), (False, False, False)):
        b = _FlagsOnlyArray(np.full(8, 4.0, np.float32), c, f)
        if not dense:
            with pytest.raises(ValueError, match="dense"):
                flat.unscale_([b], 0.5)
            continue
        assert bool(flat.table.plan([b]).leaf_c_contiguous[0]) == c
        assert flat.unscale_([b], 0.5) and np.all(b.host == 2.0)


def test_plans_compare_shapes_pair_by_pair_and_name_their_one_type():
    """``DevicePlan.same_shapes`` compares each array's shape with the array at its place
    in another plan, read now (the fused optimizers pair gradients with variables this
    way), and ``leaf_type`` is the type every array has, None for several."""
    import types

    from helpers.standin import DeviceArray
    from lscore.cuda import ArrayKernels

    class Sub(DeviceArray):
        __slots__ = ()

    xp = types.SimpleNamespace(__name__="cupy", ndarray=DeviceArray)
    for table in (
        KERNELS.table,  # READ_NUMPY: NumPy's dimensions
        ArrayKernels(xp, lambda dev: CountingBackend(), array_type=DeviceArray).table,
    ):
        wrap = np.asarray if table is KERNELS.table else DeviceArray
        v = [wrap(np.zeros(s, np.float32)) for s in ((2, 3), (6,), (), (1, 4))]
        same = [wrap(np.ones(s, np.float16)) for s in ((2, 3), (6,), (), (1, 4))]
        swapped = [wrap(np.ones(s, np.float32)) for s in ((3, 2), (6,), (), (1, 4))]
        flat = [wrap(np.ones(s, np.float32)) for s in ((2, 3), (6,), (), (4,))]
        vp = table.plan(v)
        assert table.plan(same).same_shapes(vp) is True
        assert table.plan(swapped).same_shapes(vp) is False
        assert table.plan(flat).same_shapes(vp) is False
        assert table.plan(v[:3]).same_shapes(vp) is False  # another length
        assert vp.leaf_type is type(v[0])
    sub = ArrayKernels(xp, lambda dev: CountingBackend(), array_type=DeviceArray).table
    mixed = [DeviceArray(np.zeros(2, np.float32)), Sub(np.zeros(2, np.float32))]
    assert sub.plan(mixed).leaf_type is None
    assert sub.plan(mixed[1:]).leaf_type is Sub
    # a shape changed in place after the plan: read now, not remembered
    v = [np.zeros(6, np.float32)]
    g = [np.ones((2, 3), np.float32)]
    vp, gp = KERNELS.table.plan(v), KERNELS.table.plan(g)
    assert gp.same_shapes(vp) is False
    v[0].shape = (2, 3)
    assert gp.same_shapes(vp) is True
    # arrays without weak references: the plan keeps none, so it cannot tell
    unkept = ArrayKernels(xp, lambda dev: CountingBackend(), array_type=_UnrefArray).table
    a = [_UnrefArray(np.zeros(3, np.float32))]
    assert unkept.plan(a).same_shapes(unkept.plan(a)) is None


@harness
def test_an_array_made_read_only_after_its_plan_is_refused():
    a = np.full(4, 2.0, np.float32)
    KERNELS.unscale_([a], 0.5)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        KERNELS.unscale_([a], 0.5)
    assert KERNELS.all_finite([a]) and np.all(a == 1.0)


def test_bad_input_is_refused_before_any_write(device_backend):
    """Each bad array comes after a good one, which must be left as it was."""
    b = device_backend
    xp = b.xp
    good = b.asarray(np.full(4, 2.0, np.float32))
    base = b.asarray(np.full(8, 2.0, np.float32))
    cases = [
        ([good, good], ValueError, "share memory"),
        ([good, base, base[2:6]], ValueError, "share memory"),
        ([good, b.asarray(np.ones((4, 4), np.float32)).T[::2]], ValueError, "dense"),
        ([good, b.asarray(np.ones(3, np.complex64))], TypeError, "unsupported dtype"),
        (
            [good, np.ones(3, np.float32) if xp is not np else [1.0]],
            TypeError,
            "unsupported array type",
        ),
    ]
    if xp is np:
        ro = np.full(4, 2.0, np.float32)
        ro.flags.writeable = False
        over = np.lib.stride_tricks.as_strided(
            np.full(4, 2.0, np.float32), (4, 4), (0, 4), writeable=True
        )
        cases += [
            ([good, ro], ValueError, "read-only"),
            ([good, over], ValueError, "elements do not overlap"),
        ]
    for arrays, exc, match in cases:
        with pytest.raises(exc, match=match):
            b.unscale_(arrays, 0.5)
        assert np.all(b.to_numpy(good) == 2.0) and np.all(b.to_numpy(base) == 2.0), match


@harness
def test_mixed_frameworks_are_refused():
    from helpers.standin import DeviceArray

    a = np.full(4, 2.0, np.float32)
    with pytest.raises(TypeError, match=r"unsupported array type .*DeviceArray"):
        KERNELS.unscale_([a, DeviceArray(np.ones(3, np.float32))], 0.5)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="unsupported array type torch"):
        KERNELS.unscale_([a, torch.ones(3)], 0.5)
    assert np.all(a == 2.0)


class _StreamBackend(CountingBackend):
    """Records the stream of every launch and of the read (CupyBackend takes CuPy's current one)."""

    current = 7

    def __init__(self, device):
        super().__init__()
        self.device = device
        self.events = []

    def stream(self):
        return _StreamBackend.current

    def launch_packed(self, fn, grid, block, params, widths, nparams, stream):
        self.events.append(("launch", self.device, stream))
        super().launch_packed(fn, grid, block, params, widths, nparams, stream)

    def read_word(self, a):
        self.events.append(("read", self.device, self.stream()))
        return super().read_word(a)


@harness
def test_work_goes_to_the_current_stream_of_each_device():
    """Arrays on two devices: each device's launches on its current stream, then one read each."""
    from helpers.standin import XP, DeviceArray
    from lscore.cuda import ArrayKernels

    backends = {}

    def make(dev):
        backends[dev] = _StreamBackend(dev)
        return backends[dev]

    kern = ArrayKernels(XP, make, array_type=DeviceArray)
    host = [
        np.full(5, 4.0, np.float32),
        np.full(3, 4.0, np.float16),
        np.full(6, 4.0, np.float32),
        np.full(2, 4.0, np.float64),
    ]
    arrays = [DeviceArray(h, device=d) for h, d in zip(host, (0, 1, 1, 0), strict=True)]
    for current in (7, 9):
        _StreamBackend.current = current
        for b in backends.values():
            b.events.clear()
        host[2][1] = np.inf if current == 9 else 4.0
        assert kern.unscale_(arrays, 0.5) is (current == 7)
        for dev, b in backends.items():
            kinds = [e[0] for e in b.events]
            assert kinds == ["launch"] * (len(kinds) - 1) + ["read"], kinds
            assert {e[1:] for e in b.events} == {(dev, current)}
    assert [h[0] for h in host] == [1.0, 1.0, 1.0, 1.0]
    assert set(kern.table.plan(arrays).devices) == {0, 1}
    with pytest.raises(ValueError, match="device 1, but the loss scale lives on device 0"):
        kern.check_async(arrays, 0, 0)


@harness
def test_more_arrays_than_one_launch_holds_through_the_adapter():
    """Tiny launch limits: many launches per call, each array once, NaN/Inf first and last."""
    from lscore.cuda import ArrayKernels

    kern = ArrayKernels(
        np,
        lambda dev: CountingBackend(),
        kind=lscore.kernels.READ_NUMPY,
        limits=dict(chunk=8, block=3, max_tensors=3, max_blocks=4),
    )
    rng = np.random.default_rng(7)
    for trial in range(12):
        dts = [np.float32, np.float16, np.float64]
        arrays = [
            rng.standard_normal(int(rng.integers(0, 30))).astype(dts[k % 3])
            for k in range(int(rng.integers(5, 25)))
        ]
        if trial % 3 == 1 and arrays[0].size:
            arrays[0][0] = np.inf
        if trial % 3 == 2 and arrays[-1].size:
            arrays[-1][-1] = np.nan
        finite, want = _unscaled(arrays, 0.25)
        for _ in range(2):  # first sight, then the cached plan
            got = [a.copy() for a in arrays]
            assert kern.unscale_(got, 0.25) == finite
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(bits(g), bits(w)), trial
        assert kern.all_finite(arrays) == finite
        assert kern.device(0).backend.launches


@harness
def test_the_flag_is_never_reset_between_calls():
    """A non-finite call leaves its mark; the next finite call reads its own mark, not that one."""
    a = np.full(4, 2.0, np.float32)
    b = np.full(4, 2.0, np.float32)
    b[1] = np.nan
    runner = KERNELS.device(0)
    assert not KERNELS.all_finite([a, b])
    launches = len(runner.backend.launches)
    assert KERNELS.all_finite([a]) and KERNELS.unscale_([a], 0.5)
    assert len(runner.backend.launches) == launches + 2  # no reset kernel, no copy
    assert int(runner.flag[0]) != 0  # the old mark is still there


# ---- LossScaleOptimizer: default mode against the NumPy adapter ----------------------

SHAPES = {
    "keras_dynamic": dict(initial_scale=8.0, dynamic_growth_steps=2),
    "keras_fixed": dict(dynamic=False, initial_scale=16.0),
    "experimental": dict(loss_scale="dynamic"),
    "tf1": dict(loss_scale_manager="exp"),
}


def _kwargs(shape):
    kw = dict(SHAPES[shape])
    if kw.get("loss_scale_manager") == "exp":
        kw["loss_scale_manager"] = lscore.ExponentialUpdateLossScaleManager(64, 2, 2)
    return kw


def _run_pair(backend, shape, make_opt, steps, seed, sync_free=False, dtype=np.float32):
    rng = np.random.default_rng(seed)
    w0 = [rng.standard_normal(n).astype(dtype) for n in (3, 40, 1)]
    ours, theirs = backend.variables(w0), [w.copy() for w in w0]
    inner_o, inner_t = make_opt(backend.module), make_opt(lnp)
    f16 = {"allow_fp16_params": True}  # float16 variables: the elementwise path
    opt_o = backend.LossScaleOptimizer(inner_o, **_kwargs(shape), sync_free=sync_free, **f16)
    opt_t = lnp.LossScaleOptimizer(inner_t, **_kwargs(shape), **f16)
    xp = backend.xp
    for step in range(steps):
        coef = [rng.standard_normal(w.shape).astype(dtype) for w in w0]
        if rng.random() < 0.3:
            coef[int(rng.integers(0, 3))][0] = rng.choice([np.nan, np.inf])
        coef_o = [backend.asarray(c) for c in coef]

        def fn_for(xp, coef):
            return lambda scale: (0.0, [c * xp.asarray(scale, dtype) for c in coef])

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            pairs_o = opt_o.compute_gradients(fn_for(xp, coef_o), ours)
            pairs_t = opt_t.compute_gradients(fn_for(np, coef), theirs)
            got = opt_o.apply_gradients(pairs_o)
            want = opt_t.apply_gradients(pairs_t)
        assert bool(got) == want, (shape, step)
        for a, b in zip(ours, theirs, strict=True):
            assert same(backend.to_numpy(a), b), (shape, step)
        assert opt_o.iterations == opt_t.iterations
    assert opt_o.loss_scale == opt_t.loss_scale or shape == "experimental"
    assert opt_o.dynamic_counter == opt_t.dynamic_counter
    return inner_o, inner_t


def _sgd(module):
    return module.SGD(0.1, momentum=0.9)


def _adam(module):
    return module.Adam(0.01)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("make", [_sgd, _adam], ids=["sgd", "adam"])
def test_default_mode_matches_numpy_adapter(device_backend, shape, make):
    for seed in range(3):
        _run_pair(device_backend, shape, make, 25, seed)


@harness
def test_default_mode_syncs_once_per_step():
    w = [np.ones(5, np.float32), np.ones(3, np.float16)]
    opt = LossScaleOptimizer(SGD(0.1), allow_fp16_params=True)
    before = CountingBackend.syncs
    for _ in range(4):
        opt.apply_gradients(zip([np.ones(5, np.float32), np.ones(3, np.float16)], w, strict=True))
    assert CountingBackend.syncs - before == 4


# ---- sync-free mode --------------------------------------------------------------


@pytest.mark.parametrize("shape", ["keras_dynamic", "keras_fixed"])
@pytest.mark.parametrize("make", [_sgd, _adam], ids=["sgd", "adam"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_sync_free_matches_numpy_adapter(device_backend, shape, make, dtype):
    b = device_backend
    for seed in range(3):
        inner_o, inner_t = _run_pair(b, shape, make, 30, seed, sync_free=True, dtype=dtype)
        for (_v_o, slots_o), (_v_t, slots_t) in zip(
            inner_o._slots.values(), inner_t._slots.values(), strict=True
        ):
            for k in slots_t:
                assert same(b.to_numpy(slots_o[k]), slots_t[k]), k


def test_sync_free_adam_skips_an_inf_step_like_numpy_adapter(device_backend):
    b = device_backend
    w_host = np.ones(8, np.float32)
    (w_dev,) = b.variables([w_host])
    opt_d = b.LossScaleOptimizer(
        b.module.Adam(0.01), initial_scale=4.0, dynamic_growth_steps=2, sync_free=True
    )
    opt_h = lnp.LossScaleOptimizer(lnp.Adam(0.01), initial_scale=4.0, dynamic_growth_steps=2)
    with np.errstate(invalid="ignore"):  # a gated step computes, then drops, NaN
        for k in range(10):
            g = np.full(8, np.inf if k == 3 else 0.5, np.float32)
            opt_d.apply_gradients([(b.asarray(g), w_dev)])
            opt_h.apply_gradients([(g, w_host)])
    assert np.array_equal(b.to_numpy(w_dev), w_host)
    assert opt_d.loss_scale == opt_h.loss_scale


@harness
def test_sync_free_steps_do_not_read_the_device():
    w = [np.ones(5, np.float32), np.ones(2, np.float64)]
    opt = LossScaleOptimizer(Adam(0.1), sync_free=True)
    before = CountingBackend.syncs
    results = []
    for k in range(6):
        g = [np.full(5, 1.0 if k != 2 else np.nan, np.float32), np.ones(2, np.float64)]
        results.append(opt.apply_gradients(zip(opt.get_unscaled_gradients(g), w, strict=True)))
        opt.get_scaled_loss(np.float32(2.0))
    assert CountingBackend.syncs == before
    assert [bool(r) for r in results] == [True, True, False, True, True, True]
    assert opt.loss_scale == 2.0**15 / 2 and CountingBackend.syncs == before + 1
    assert opt.iterations == 6  # Keras: a skipped step still counts


@harness
def test_sync_free_failed_call_changes_nothing():
    w = np.ones(3, np.float32)
    opt = LossScaleOptimizer(SGD(0.1), sync_free=True)
    raw = opt._mode._dev.read()[0]
    with pytest.raises(ValueError, match="shape"):
        opt.apply_gradients([(np.full(4, np.nan, np.float32), w)])
    got_raw, flags, _ = opt._mode._dev.read()
    assert got_raw == raw and flags[0] == 0 and np.all(w == 1.0)


@harness
def test_sync_free_floor_error_is_raised_on_read():
    opt = LossScaleOptimizer(SGD(0.1), sync_free=True)
    opt._mode._dev.flags[1] = 1  # as update.cu sets it when a policy gives up at its minimum
    with pytest.raises(lscore.LossScaleFloorError, match="minimum"):
        opt.sync_state()
    opt.sync_state()  # raised once, then cleared


@harness
def test_sync_free_argument_errors():
    with pytest.raises(TypeError, match="sync_free must be a bool"):
        LossScaleOptimizer(SGD(0.1), sync_free=1)
    with pytest.raises(ValueError, match="Keras shape"):
        LossScaleOptimizer(SGD(0.1), "dynamic", sync_free=True)
    with pytest.raises(TypeError, match="SGD or Adam"):
        LossScaleOptimizer(lnp.SGD(0.1), sync_free=True)


@harness
def test_gated_step_restores_new_slots_to_zero():
    w = np.ones(3, np.float32)
    opt = SGD(0.5, momentum=0.9)
    opt._gate = np.asarray(False)
    opt.apply_gradients([(np.full(3, np.nan, np.float32), w)])
    opt._gate = None
    slot = next(iter(opt._slots.values()))[1]["momentum"]
    assert np.all(w == 1.0) and np.all(slot == 0.0) and opt.iterations == 1
