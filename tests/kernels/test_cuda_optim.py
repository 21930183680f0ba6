"""The fused optimizer kernels (_ext/optim.cu) on the CPU host harness, against the NumPy adapter.

Each case runs several steps over many float32 master weights with float16,
bfloat16 and float32 gradients (one launch group per gradient dtype), chunk
edges, odd sizes and launches split by small limits.  A step is two-phase as
on the GPU: scan.cu's all_finite marks the flag, then the optimizer kernels
read the *scaled* gradients, unscale them in registers and update, or return
untouched when the flag holds this step's mark.  The reference is
lscore.adapters.numpy's SGD / Adam on the gradients lscore.unscale_ (the CPU
core) unscales; parameters and slots must match bit for bit after every step,
and a step with NaN/Inf planted must leave them bit for bit unchanged.
"""

import shutil

import numpy as np
import pytest

import lscore
from helpers import FLOAT_DTYPES
from helpers.gen import nonfinite_values
from lscore import kernels
from lscore._ext import _codes
from lscore.adapters import numpy as lnp
from lscore.cuda.launch import MultiTensor
from lscore.cuda.loader import METAS, OPT_METAS
from lscore.cuda.optim import FusedLauncher, bias_table
from lscore.dtypes import BY_NAME, Code

if shutil.which("g++") is None:
    pytest.skip("g++ is missing: the CUDA host harness cannot be built", allow_module_level=True)

from helpers import cuda_host

GRAD_DTYPES = [d for d in FLOAT_DTYPES if d.name in ("float16", "bfloat16", "float32")]
# (chunk, block, max_tensors, max_blocks): the last ones force many launches
CONFIGS = [
    (8, 1, 4096, 65535),
    (16, 3, 4096, 65535),
    (64, 32, 3, 5),
    (8, 4, 2, 3),
    (1024, 64, 1, 1),
]
# moderate inverses: no unscaled gradient overflows (an Inf - Inf NaN's bits are the
# CPU's default NaN, not the GPU's); 2**-16 and 1e-5 put float16 results in subnormals
INVS = [1.0, 0.5, 1 / 3, 1e-5, 2.0**-16, float(np.float32(1 / 3000)), 0.75]


@pytest.fixture(scope="module")
def backend():
    return cuda_host.HostBackend()


def _sizes(rng, chunk):
    base = [0, 1, 2, chunk - 1, chunk, chunk + 1, 2 * chunk, 3 * chunk + 5, 7, 31]
    return [int(rng.choice(base)) for _ in range(int(rng.integers(1, 9)))]


def _u(a):
    return a.view(f"u{a.itemsize}").copy()


# the kernels' scalars before `flags`, by optimizer (optim.cu's signatures)
_HEAD = {"sgd": 4, "adam": 6}


def _launch(backend, op, records, sizes, cfg, scalars, hyper=0, *, large=False):
    """Pack the records (one per tensor, D addresses each) into the kernels' arguments and
    launch `op` over them through lscore.cuda.optim.FusedLauncher (`hyper`: the address of
    device hyperparameters, 0 for the values in `scalars`; `large`: 32 KB arguments).
    Returns the launches made."""
    chunk, block, mt, mb = cfg
    runner = MultiTensor(backend, chunk=chunk, block=block, max_tensors=mt, max_blocks=mb)
    runner.meta = METAS[1] if large else METAS[0]
    launcher = FusedLauncher(runner)
    plan = launcher.plan(
        ("test", op),
        op,
        [code for code, _ in records],
        sizes,
        np.array([rec for _, rec in records], np.uint64),
    )
    k = _HEAD[op]
    flags, inv, inv_dev, gate, skip_if = scalars[k : k + 5]
    return launcher.launch(
        op,
        plan,
        scalars[:k],
        flags=int(flags),
        inv=float(inv),
        inv_ptr=int(inv_dev),
        gate_ptr=int(gate),
        skip_if=int(skip_if),
        tail=scalars[k + 5 :],
        hyper_ptr=hyper,
    )


class _Case:
    """Tensors of one case: master weights, their kernel slots, and the reference's copies."""

    def __init__(self, rng, chunk, nslots, sizes=None):
        self.sizes = _sizes(rng, chunk) if sizes is None else sizes
        self.gdt = [GRAD_DTYPES[int(rng.integers(0, len(GRAD_DTYPES)))] for _ in self.sizes]
        self.w = [
            (rng.standard_normal(n) * rng.choice([1e-2, 1.0, 30.0])).astype(np.float32)
            for n in self.sizes
        ]
        self.slots = [[np.zeros(n, np.float32) for _ in range(nslots)] for n in self.sizes]
        self.ref_w = [w.copy() for w in self.w]

    def grads(self, rng, plant):
        gs = []
        for n, dt in zip(self.sizes, self.gdt, strict=True):
            off = int(rng.choice([0, 1, 3]))
            g = (rng.standard_normal(n + off) * rng.choice([1e-3, 1.0, 300.0])).astype(dt)[off:]
            gs.append(g)
        if plant:
            ks = [k for k, n in enumerate(self.sizes) if n]
            if ks:
                k = int(rng.choice(ks))
                g = gs[k]
                g[int(rng.choice([0, g.size - 1, int(rng.integers(0, g.size))]))] = rng.choice(
                    nonfinite_values(g.dtype)
                )
        return gs

    def records(self, gs):
        return [
            (BY_NAME[g.dtype.name], [g.ctypes.data, w.ctypes.data] + [s.ctypes.data for s in slots])
            for g, w, slots in zip(gs, self.w, self.slots, strict=True)
        ]


def _check(backend, gs, cfg, mark, flag):
    """Phase one: scan.cu's all_finite marks `flag` with `mark` on NaN/Inf."""
    chunk, block, mt, mb = cfg
    MultiTensor(backend, chunk=chunk, block=block, max_tensors=mt, max_blocks=mb).run(
        "all_finite",
        [g.ctypes.data for g in gs],
        [g.size for g in gs],
        [BY_NAME[g.dtype.name] for g in gs],
        flag.ctypes.data,
        mark=mark,
    )


def _reference_grads(gs, inv):
    """The gradients the NumPy adapter gets: unscaled by the CPU core; None: skip."""
    out = [g.copy() for g in gs]
    return out if lscore.unscale_(out, inv) else None


def _run_steps(backend, seed, cases, make_opt, launch):
    rng = np.random.default_rng(seed)
    skipped = applied = 0
    for case in range(cases):
        cfg = CONFIGS[case % len(CONFIGS)]
        opt = make_opt(rng)
        slot_names = opt.slot_names
        c = _Case(rng, cfg[0], len(slot_names))
        flag = np.zeros(1, np.uint32)
        for step in range(1, 5):
            gs = c.grads(rng, plant=rng.random() < 0.35)
            inv = float(rng.choice(INVS))
            before = [_u(a) for a in c.w] + [_u(s) for ss in c.slots for s in ss]
            gs_before = [_u(g) for g in gs]
            _check(backend, gs, cfg, step, flag)
            # the inverse by value, or from a device float64 (the by-value 7.0 is then unused)
            buf = np.array([inv], np.float64)
            inv_args = (
                (np.float64(inv), np.uint64(0))
                if rng.random() < 0.5
                else (np.float64(7.0), np.uint64(buf.ctypes.data))
            )
            gate = (np.uint64(flag.ctypes.data), np.uint32(step))
            launch(backend, opt, c, gs, cfg, inv_args + gate)
            ref = _reference_grads(gs, inv)
            ctx = f"seed {seed} case {case} step {step} cfg {cfg} inv {inv} {opt!r} " + str(
                [(g.dtype.name, g.size) for g in gs]
            )
            # the gradients are read, never written
            assert all(np.array_equal(_u(g), b) for g, b in zip(gs, gs_before, strict=True)), ctx
            assert bool(flag[0] == step) == (ref is None), ctx
            if ref is None:
                skipped += 1
                after = [_u(a) for a in c.w] + [_u(s) for ss in c.slots for s in ss]
                assert all(np.array_equal(a, b) for a, b in zip(after, before, strict=True)), ctx
                continue
            applied += 1
            opt.apply_gradients(zip(ref, c.ref_w, strict=True))
            for k, (w, rw) in enumerate(zip(c.w, c.ref_w, strict=True)):
                assert np.array_equal(_u(w), _u(rw)), (ctx, k)
                entry = opt._slots.get(id(rw))
                for name, s in zip(slot_names, c.slots[k], strict=True):
                    want = entry[1][name] if entry and name in entry[1] else np.zeros_like(s)
                    assert np.array_equal(_u(s), _u(want)), (ctx, k, name)
    assert skipped and applied


# ---- the references: the NumPy adapter, plus the options it lacks -------------
# The kernels' extra options have no NumPy-adapter counterpart yet; these
# subclasses add them in the adapter's own style (float32 arithmetic in the
# order the kernels use), so everything else still runs the adapter's code.
# Weight decay is Keras's decoupled one (_apply_weight_decay, before the
# update: w = w - w * wd * lr); maximize negates the unscaled gradient;
# amsgrad is Keras's (vhat = max(vhat, v) replaces v under the sqrt); dampening
# scales the step into the momentum every step (no undamped first step: optim.cu).


class _RefSGD(lnp.SGD):
    """The adapter's SGD (weight decay included) plus torch's maximize and dampening,
    which tf-keras has not: the kernel's extra options."""

    def __init__(self, *, maximize=False, dampening=0.0, **kw):
        super().__init__(**kw)
        self.maximize, self.dampening = maximize, dampening
        self.slot_names = ["momentum"]

    def _update_step(self, g, v):
        g = -g if self.maximize else g
        if not self.dampening or self.momentum == 0:
            return super()._update_step(g, v)
        self._decay(v)
        t = v.dtype.type  # m = step * (1 - dampening) + m * momentum, every step
        step = -g * t(self._learning_rate)
        m = self._slot(v, "momentum")
        mom = t(self.momentum)
        m[...] = step * t(1 - self.dampening) + m * mom
        v += (step + m * mom) if self.nesterov else m


class _RefAdam(lnp.Adam):
    """The adapter's Adam (weight decay, amsgrad) plus torch's maximize."""

    def __init__(self, *, maximize=False, **kw):
        super().__init__(**kw)
        self.maximize = maximize
        self.slot_names = ["m", "v"] + (["vhat"] if self.amsgrad else [])

    def _update_step(self, g, v):
        return super()._update_step(-g if self.maximize else g, v)


def _alpha(opt):
    t = np.float32
    one, step = t(1), t(opt.iterations + 1)  # alpha as adapters/_arrays.py's Adam
    return (
        t(opt.learning_rate) * np.sqrt(one - t(opt.beta_2) ** step) / (one - t(opt.beta_1) ** step)
    )


SLOT, NESTEROV, MAXIMIZE, AMSGRAD, CHECK, INV_AS_GRAD = (
    _codes.OPTIM_FLAGS[k]
    for k in ("SLOT", "NESTEROV", "MAXIMIZE", "AMSGRAD", "CHECK", "INV_AS_GRAD")
)
NO_COUNTER = (np.uint64(0), np.uint64(0), np.int64(0))  # Adam's bias, count, last


def _sgd_launch(backend, opt, c, gs, cfg, tail):
    flags = (
        (SLOT if opt.momentum != 0 else 0)
        | (NESTEROV if opt.nesterov else 0)
        | (MAXIMIZE if opt.maximize else 0)
    )
    t = np.float32
    _launch(
        backend,
        "sgd",
        c.records(gs),
        c.sizes,
        cfg,
        (
            t(opt.learning_rate),
            t(opt.momentum),
            t(1 - opt.dampening),
            t(opt.weight_decay or 0.0),
            np.int32(flags),
            *tail,
        ),
    )


def _adam_launch(backend, opt, c, gs, cfg, tail):
    t = np.float32
    flags = (MAXIMIZE if opt.maximize else 0) | (AMSGRAD if opt.amsgrad else 0)
    _launch(
        backend,
        "adam",
        c.records(gs),
        c.sizes,
        cfg,
        (
            t(_alpha(opt)),
            t(1 - opt.beta_1),
            t(1 - opt.beta_2),
            t(opt.epsilon),
            t(opt.learning_rate),
            t(opt.weight_decay or 0.0),
            np.int32(flags),
            *tail,
            *NO_COUNTER,
        ),
    )


@pytest.mark.parametrize("seed", range(4))
def test_sgd_matches_numpy_adapter_bitwise(backend, seed):
    """momentum (none, tiny, usual) and nesterov: lscore.adapters.numpy.SGD itself."""

    def make(rng):
        return _RefSGD(
            learning_rate=float(rng.choice([0.01, 0.1, 1e-3, 3.0])),
            momentum=float(rng.choice([0.0, 0.9, 0.5, 0.99, 1e-45])),
            nesterov=bool(rng.random() < 0.5),
        )

    _run_steps(backend, 100 + seed, 25, make, _sgd_launch)


@pytest.mark.parametrize("seed", range(4))
def test_adam_matches_numpy_adapter_bitwise(backend, seed):
    """bias correction (through alpha): lscore.adapters.numpy.Adam itself."""

    def make(rng):
        return _RefAdam(
            learning_rate=float(rng.choice([1e-3, 0.01, 0.3])),
            beta_1=float(rng.choice([0.9, 0.0, 0.5])),
            beta_2=float(rng.choice([0.999, 0.9, 0.99])),
            epsilon=float(rng.choice([1e-7, 1e-3, 1e-8])),
        )

    _run_steps(backend, 200 + seed, 25, make, _adam_launch)


@pytest.mark.parametrize("seed", range(3))
def test_sgd_weight_decay_dampening_and_maximize_bitwise(backend, seed):
    def make(rng):
        return _RefSGD(
            learning_rate=float(rng.choice([0.01, 0.1, 3.0])),
            momentum=float(rng.choice([0.0, 0.9])),
            dampening=float(rng.choice([0.0, 0.1, 0.5])),
            nesterov=bool(rng.random() < 0.5),
            weight_decay=float(rng.choice([0.0, 1e-2, 0.3])),
            maximize=bool(rng.random() < 0.5),
        )

    _run_steps(backend, 300 + seed, 20, make, _sgd_launch)


@pytest.mark.parametrize("seed", range(3))
def test_adamw_amsgrad_and_maximize_bitwise(backend, seed):
    def make(rng):
        return _RefAdam(
            learning_rate=float(rng.choice([1e-3, 0.01, 0.3])),
            beta_1=float(rng.choice([0.9, 0.5])),
            beta_2=float(rng.choice([0.999, 0.9])),
            epsilon=float(rng.choice([1e-7, 1e-3])),
            weight_decay=float(rng.choice([0.0, 4e-3, 0.1])),
            maximize=bool(rng.random() < 0.5),
            amsgrad=bool(rng.random() < 0.6),
        )

    _run_steps(backend, 400 + seed, 20, make, _adam_launch)


@pytest.mark.parametrize(
    "gate, skip_if, applied",
    [(None, 0, True), (0, 0, False), (1, 0, True), (5, 5, False), (4, 5, True)],
)
def test_gate_word(backend, gate, skip_if, applied):
    """No gate: always applied; else skipped when *gate == skip_if (a scan mark, or 0 for
    update.cu's flags[LSC_DEV_APPLY])."""
    cfg = (8, 2, 4096, 65535)
    for op, nslots in (("sgd", 1), ("adam", 2)):
        g = np.full(21, 2.0, np.float16)
        w = np.ones(21, np.float32)
        slots = [np.zeros(21, np.float32) for _ in range(nslots)]
        word = np.array([0 if gate is None else gate], np.uint32)
        rec = [(Code.F16, [g.ctypes.data, w.ctypes.data] + [s.ctypes.data for s in slots])]
        t = np.float32
        head = (
            (t(0.5), t(0.0), t(1.0), t(0.0), np.int32(0))
            if op == "sgd"
            else (t(0.5), t(0.1), t(0.001), t(1e-7), t(0.5), t(0.0), np.int32(0))
        )
        _launch(
            backend,
            op,
            rec,
            [21],
            cfg,
            (
                *head,
                np.float64(0.5),
                np.uint64(0),
                np.uint64(0 if gate is None else word.ctypes.data),
                np.uint32(skip_if),
                *(NO_COUNTER if op == "adam" else ()),
            ),
        )
        assert np.all(w != 1.0) if applied else np.all(w == 1.0), op
        if op == "sgd":
            assert np.all(w == 0.5) or not applied  # 1 + -(2 * 0.5) * 0.5


@pytest.mark.parametrize("large", [False, True], ids=["4KB", "32KB"])
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_more_arrays_than_one_argument_holds(backend, kind, large):
    """A list longer than one kernel argument holds (lsc_codes.h's capacities, whatever the
    runner's own limit) is split over full launches, and every parameter and slot still
    equals the NumPy adapter's bit for bit, NaN-free or skipped."""
    _, cap, _ = kernels.OPT_META[OPT_METAS[kind][int(large)]]
    rng = np.random.default_rng(700 + large)
    n = 2 * cap + 7
    opt = (
        _RefSGD(learning_rate=0.1, momentum=0.9)
        if kind == "sgd"
        else _RefAdam(learning_rate=0.01, amsgrad=True)
    )
    c = _Case(rng, 8, len(opt.slot_names), sizes=[int(k) for k in rng.integers(1, 20, n)])
    c.gdt = [GRAD_DTYPES[0]] * n  # one group: its launches are counted
    cfg = (8, 4, 4096, 65535)
    flag = np.zeros(1, np.uint32)
    for step, plant in enumerate([False, True, False], start=1):
        gs = c.grads(rng, plant)
        _check(backend, gs, cfg, step, flag)
        head = (
            (np.float32(0.1), np.float32(0.9), np.float32(1), np.float32(0))
            if kind == "sgd"
            else (
                np.float32(_alpha(opt)),
                np.float32(1 - opt.beta_1),
                np.float32(1 - opt.beta_2),
                np.float32(opt.epsilon),
                np.float32(0.01),
                np.float32(0),
            )
        )
        flags = SLOT if kind == "sgd" else AMSGRAD
        call = (np.float64(0.5), np.uint64(0), np.uint64(flag.ctypes.data), np.uint32(step))
        tail = NO_COUNTER if kind == "adam" else ()
        launches = _launch(
            backend,
            kind,
            c.records(gs),
            c.sizes,
            cfg,
            (*head, np.int32(flags), *call, *tail),
            large=large,
        )
        assert launches == -(-n // cap)
        ref = _reference_grads(gs, 0.5)
        assert (ref is None) == plant and bool(flag[0] == step) == plant
        if ref is not None:
            opt.apply_gradients(zip(ref, c.ref_w, strict=True))
        for k, (w, rw) in enumerate(zip(c.w, c.ref_w, strict=True)):
            assert np.array_equal(_u(w), _u(rw)), (kind, step, k)
            entry = opt._slots.get(id(rw))
            for name, sl in zip(opt.slot_names, c.slots[k], strict=True):
                want = entry[1][name] if entry and name in entry[1] else np.zeros_like(sl)
                assert np.array_equal(_u(sl), _u(want)), (kind, step, k, name)


# ---- the check launch, the inverse in the gradient's dtype, the device step counter ----


def _as_grad_unscaled(gs, inv):
    """What the NumPy adapter's get_unscaled_gradients makes: g * inv cast to g's dtype."""
    with np.errstate(all="ignore"):
        return [g * g.dtype.type(inv) for g in gs]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("as_grad", [False, True], ids=["float_inv", "inv_as_grad"])
def test_check_launch_marks_unscaled_nonfinite_and_writes_nothing(backend, seed, as_grad):
    """LSC_OPT_CHECK: the flag is set exactly when an *unscaled* gradient is NaN/Inf (a
    finite float16 gradient times 2**10 can overflow), and no parameter or slot moves."""
    rng = np.random.default_rng(500 + seed)
    for case in range(20):
        cfg = CONFIGS[case % len(CONFIGS)]
        c = _Case(rng, cfg[0], 2)
        gs = c.grads(rng, plant=rng.random() < 0.3)
        inv = float(rng.choice([*INVS, 2.0**10, 1000.0]))
        flags = CHECK | (INV_AS_GRAD if as_grad else 0)
        before = [_u(a) for a in c.w] + [_u(s) for ss in c.slots for s in ss]
        flag = np.zeros(1, np.uint32)
        for op, head in (
            (
                "sgd",
                (
                    np.float32(0.5),
                    np.float32(0.9),
                    np.float32(1),
                    np.float32(0),
                    np.int32(flags | SLOT),
                ),
            ),
            (
                "adam",
                (
                    np.float32(0.1),
                    np.float32(0.1),
                    np.float32(0.001),
                    np.float32(1e-7),
                    np.float32(0.1),
                    np.float32(0),
                    np.int32(flags),
                ),
            ),
        ):
            flag[0] = 0
            tail = NO_COUNTER if op == "adam" else ()
            depth = 3 if op == "sgd" else 4  # SGD's record: {grad, param, momentum}
            _launch(
                backend,
                op,
                [(code, rec[:depth]) for code, rec in c.records(gs)],
                c.sizes,
                cfg,
                (
                    *head,
                    np.float64(inv),
                    np.uint64(0),
                    np.uint64(flag.ctypes.data),
                    np.uint32(9),
                    *tail,
                ),
            )
            if as_grad:
                finite = all(
                    np.isfinite(u.astype(np.float32)).all() for u in _as_grad_unscaled(gs, inv)
                )
            else:  # the core's unscale_, checked on its outputs
                out = [g.copy() for g in gs]
                lscore.unscale_(out, inv)
                finite = lscore.all_finite(out)
            assert flag[0] == (0 if finite else 9), (seed, case, op, inv)
            after = [_u(a) for a in c.w] + [_u(s) for ss in c.slots for s in ss]
            assert all(np.array_equal(a, b) for a, b in zip(after, before, strict=True))


# (gradient dtype, a gradient, the float32 inverse whose product with it is the first one
# that rounds to Inf in that dtype): 65520 for float16, 0x1.ffp127 for bfloat16, 2**128 for float32
_EDGES = [
    ("float16", 2.0**15, 65520 / 2.0**15),
    ("bfloat16", 2.0**127, 1 + 255 / 256),
    ("float32", 2.0**127, 2.0),
]


@pytest.mark.parametrize("dtype, g, inv", _EDGES, ids=[e[0] for e in _EDGES])
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_check_launch_at_the_overflow_edge(backend, kind, dtype, g, inv):
    """The check compares the largest product with the last float32 that rounds to a finite
    value: an inverse one float32 step below the edge passes, the edge is an overflow, as
    the core's unscale_ says, wherever the element sits (vector body, head or tail)."""
    dt = next(d for d in GRAD_DTYPES if d.name == dtype)
    below = float(np.nextafter(np.float32(inv), np.float32(0)))
    for where in (0, 1, 18, 38):
        for x, want_bad in ((below, False), (inv, True)):
            grad = np.zeros(40, dt)[1:] if where == 1 else np.zeros(39, dt)
            grad[min(where, grad.size - 1)] = -g
            out = grad.copy()
            lscore.unscale_([out], x)
            assert lscore.all_finite([out]) != want_bad  # the core agrees with the edge
            w = np.ones(39, np.float32)
            slots = [np.zeros(39, np.float32) for _ in range(1 if kind == "sgd" else 2)]
            rec = [grad.ctypes.data, w.ctypes.data, *(a.ctypes.data for a in slots)]
            flag = np.zeros(1, np.uint32)
            head = (np.float32(0.5),) * _HEAD[kind]
            _launch(
                backend,
                kind,
                [(BY_NAME[dtype], rec)],
                [grad.size],
                (8, 4, 4096, 65535),
                (
                    *head,
                    np.int32(CHECK),
                    np.float64(x),
                    np.uint64(0),
                    np.uint64(flag.ctypes.data),
                    np.uint32(3),
                    *(NO_COUNTER if kind == "adam" else ()),
                ),
            )
            assert flag[0] == (3 if want_bad else 0), (where, x)
            assert np.all(w == 1.0)


@pytest.mark.parametrize("seed", range(2))
def test_inverse_in_the_gradient_dtype_matches_the_numpy_adapters_unscaling(backend, seed):
    """LSC_OPT_INV_AS_GRAD: the update equals the NumPy adapter's SGD on g * dtype(inv),
    where dtype(inv) differs from float32(inv) (1/1000 in float16, 2**-25 rounds to 0)."""
    rng = np.random.default_rng(600 + seed)
    opt = lnp.SGD(0.1, momentum=0.9)
    c = _Case(rng, 16, 1)
    c.sizes = [17, 1, 40, 16, 3, 33]
    c.gdt = [GRAD_DTYPES[k % len(GRAD_DTYPES)] for k in range(len(c.sizes))]
    c.w = [np.ones(n, np.float32) for n in c.sizes]
    c.ref_w = [w.copy() for w in c.w]
    c.slots = [[np.zeros(n, np.float32)] for n in c.sizes]
    cfg = CONFIGS[1]
    for step, inv in enumerate([float(np.float32(1 / 1000)), 2.0**-25, 0.75, 1 / 3]):
        gs = c.grads(rng, plant=False)
        _launch(
            backend,
            "sgd",
            c.records(gs),
            c.sizes,
            cfg,
            (
                np.float32(0.1),
                np.float32(0.9),
                np.float32(1),
                np.float32(0),
                np.int32(SLOT | INV_AS_GRAD),
                np.float64(inv),
                np.uint64(0),
                np.uint64(0),
                np.uint32(0),
            ),
        )
        opt.apply_gradients(zip(_as_grad_unscaled(gs, inv), c.ref_w, strict=True))
        for k, (w, rw) in enumerate(zip(c.w, c.ref_w, strict=True)):
            assert np.array_equal(_u(w), _u(rw)), (seed, step, k)


def test_adam_device_counter_reads_the_bias_table(backend):
    """With `count`, alpha = (lr * sq[t]) / d[t] for t = *count + 1 capped at the table's
    last step: the NumPy adapter's alpha at every step, through saturation and beyond
    (alpha by value, 1e9, is then unused)."""
    make = lambda: lnp.Adam(0.3, beta_1=0.5, beta_2=0.9)  # noqa: E731
    table, last = bias_table(lambda s: make()._bias_terms(np.float32, s))
    rng = np.random.default_rng(8)
    count = np.zeros(1, np.int64)
    for it in list(range(12)) + list(range(last - 3, last + 4)) + [10 * last]:
        c = _Case(rng, 8, 2)
        gs = c.grads(rng, plant=False)
        count[0] = it
        _launch(
            backend,
            "adam",
            c.records(gs),
            c.sizes,
            CONFIGS[0],
            (
                np.float32(1e9),
                np.float32(0.5),
                np.float32(1 - 0.9),
                np.float32(1e-7),
                np.float32(0.3),
                np.float32(0),
                np.int32(0),
                np.float64(1.0),
                np.uint64(0),
                np.uint64(0),
                np.uint32(0),
                np.uint64(table.ctypes.data),
                np.uint64(count.ctypes.data),
                np.int64(last),
            ),
        )
        ref = make()
        ref.iterations = it
        ref.apply_gradients(zip([g.astype(np.float32) for g in gs], c.ref_w, strict=True))
        assert count[0] == it  # the kernel reads the counter; the adapter advances it
        for k, (w, rw) in enumerate(zip(c.w, c.ref_w, strict=True)):
            assert np.array_equal(_u(w), _u(rw)), (it, k)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_replayed_step_reads_the_hyperparameters_written_between_replays(backend, kind):
    """A step's launches packed once with ``hyper_ptr`` and replayed unchanged (what a
    captured CUDA graph does), the schedule writing each step's lr into the device array
    between replays, equal eager steps given that lr by value, bit for bit (Adam: alpha
    from that lr and the device step counter's bias table)."""
    rng = np.random.default_rng(31)
    lrs = [0.1, 0.05, 0.3, 0.0125, 0.2]
    sizes = [5, 64, 1, 130, 0, 33]
    nslots = 1 if kind == "sgd" else 2
    gdt = [GRAD_DTYPES[k % len(GRAD_DTYPES)] for k in range(len(sizes))]
    w0 = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    live = [
        (w.copy(), [np.zeros(n, np.float32) for _ in range(nslots)])
        for w, n in zip(w0, sizes, strict=True)
    ]
    eager = [
        (w.copy(), [np.zeros(n, np.float32) for _ in range(nslots)])
        for w, n in zip(w0, sizes, strict=True)
    ]
    grads = [np.zeros(n, dt) for n, dt in zip(sizes, gdt, strict=True)]
    count = np.zeros(1, np.int64)
    adam = lnp.Adam(0.1, beta_1=0.8, beta_2=0.95)
    table, last = bias_table(lambda s: adam._bias_terms(np.float32, s))
    t = np.float32
    if kind == "sgd":
        flags, tail = SLOT | NESTEROV, ()
        hyper = np.array([lrs[0], 0.9, 1.0, 0.01], np.float32)

        def head(lr):
            return (t(lr), t(0.9), t(1.0), t(0.01))
    else:
        flags = 0
        tail = (np.uint64(table.ctypes.data), np.uint64(count.ctypes.data), np.int64(last))
        hyper = np.array([lrs[0], 1 - 0.8, 1 - 0.95, 1e-7, 0.0, 0.0], np.float32)

        def head(lr):
            return (t(0), t(1 - 0.8), t(1 - 0.95), t(1e-7), t(lr), t(0.0))

    def launcher_for(state):
        launcher = FusedLauncher(MultiTensor(backend, chunk=16, block=4, max_tensors=3))
        records = [
            [g.ctypes.data, w.ctypes.data, *(x.ctypes.data for x in sl)]
            for g, (w, sl) in zip(grads, state, strict=True)
        ]
        codes = [BY_NAME[g.dtype.name] for g in grads]
        sizes = [g.size for g in grads]
        return launcher, launcher.plan(("key", kind), kind, codes, sizes, records)

    live_l, live_plan = launcher_for(live)
    eager_l, eager_plan = launcher_for(eager)
    # "capture": the first step's launches, packed with the device hyperparameters
    for g in grads:
        g[...] = rng.standard_normal(g.size).astype(g.dtype)
    live_l.launch(kind, live_plan, head(999.0), flags=flags, tail=tail, hyper_ptr=hyper.ctypes.data)
    (recorded,) = [packed[0] for packed in live_plan.packed.values()]
    for step, lr in enumerate(lrs):
        if step:
            for g in grads:
                g[...] = rng.standard_normal(g.size).astype(g.dtype)
            count[0] = step
            hyper[0] = lr  # the schedule, between replays
            live_l.runner.enqueue(recorded)  # the replay: the same arguments
        eager_l.launch(kind, eager_plan, head(lr), flags=flags, tail=tail)
        for k, ((lw, ls), (ew, es)) in enumerate(zip(live, eager, strict=True)):
            assert np.array_equal(_u(lw), _u(ew)), (kind, step, k)
            for a, b in zip(ls, es, strict=True):
                assert np.array_equal(_u(a), _u(b)), (kind, step, k)
    assert any(not np.array_equal(w, lw) for w, (lw, _) in zip(w0, live, strict=True))
