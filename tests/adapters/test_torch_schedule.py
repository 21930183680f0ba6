"""SkipAwareLR: learning-rate schedules that advance only on applied steps, on the device.

The reference is the synchronous loop a torch user writes today: the same
optimizer with a Python float learning rate, and torch's scheduler stepped when
``not scaler.last_step_skipped``.  Its rate is torch's formula in float64; the
sync-free rate is the closed form in float64 rounded once into a float32 tensor,
so the two agree within one float32 ulp of the reference at every step (half an
ulp for the rounding, the rest for torch's recursive forms, ``lr * gamma`` per
step, which drift from the closed form by a few float64 ulps).

On the CPU torch 2.13 runs SGD and AdamW fused with a tensor learning rate;
``capturable=True`` asserts CUDA (or XLA, XPU, HPU) parameters, so the capturable
mode runs in the ``gpu`` test only.  The device path (torch's kernels, as on
CUDA) runs on CPU tensors through ``GradScaler.torch_kernels``.
"""

from __future__ import annotations

import io
import math
import pickle
import random
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode

from lscore.adapters.torch import GradScaler, SkipAwareLR, schedule

L = torch.optim.lr_scheduler
STEPS = 24
RESUME_AT = 11
LRS = (0.1, 0.03)


@pytest.fixture(autouse=True)
def short_tables(monkeypatch):
    """Rate tables of 4 rows, so that every run outgrows its table, twice or more."""
    monkeypatch.setattr(schedule, "FIRST_ROWS", 4)


def _one_cycle(opt, **kw):
    return L.OneCycleLR(opt, max_lr=[0.2, 0.05], total_steps=STEPS + 2, cycle_momentum=False, **kw)


def _warmup(e):
    """min(1, (e + 1) / 5), in operations that torch's scheduler's int and SkipAwareLR's
    tensor both take (the reference loop calls the same lambda)."""
    a = (e + 1) / 5
    return (a + 1 - abs(a - 1)) / 2


# each covered scheduler of torch.optim.lr_scheduler, built on an optimizer with two groups
SCHEDULERS = {
    "LambdaLR": lambda opt: L.LambdaLR(opt, [lambda e: 0.96**e, _warmup]),
    "StepLR": lambda opt: L.StepLR(opt, step_size=3, gamma=0.5),
    "MultiStepLR": lambda opt: L.MultiStepLR(opt, milestones=[2, 6, 6, 11], gamma=0.3),
    "ConstantLR": lambda opt: L.ConstantLR(opt, factor=0.25, total_iters=4),
    "LinearLR": lambda opt: L.LinearLR(opt, start_factor=0.1, end_factor=0.9, total_iters=7),
    "ExponentialLR": lambda opt: L.ExponentialLR(opt, gamma=0.9),
    "PolynomialLR": lambda opt: L.PolynomialLR(opt, total_iters=12, power=1.7),
    # T_max below the run: the cosine goes on past its minimum, as torch's does
    "CosineAnnealingLR": lambda opt: L.CosineAnnealingLR(opt, T_max=9, eta_min=1e-4),
    "OneCycleLR": _one_cycle,
    "OneCycleLR-3phase-linear": lambda opt: _one_cycle(
        opt, three_phase=True, anneal_strategy="linear", pct_start=0.25
    ),
    "SequentialLR-warmup-cosine": lambda opt: L.SequentialLR(
        opt,
        [L.LinearLR(opt, start_factor=0.1, total_iters=4), L.CosineAnnealingLR(opt, T_max=15)],
        milestones=[4],
    ),
    "SequentialLR-three": lambda opt: L.SequentialLR(
        opt,
        [
            L.ConstantLR(opt, factor=0.5, total_iters=10),
            L.ExponentialLR(opt, gamma=0.8),
            L.LambdaLR(opt, lambda e: 1.0 / (e + 1)),
        ],
        milestones=[3, 9],
    ),
    "SequentialLR-onecycle": lambda opt: L.SequentialLR(
        opt, [L.PolynomialLR(opt, total_iters=3), _one_cycle(opt)], milestones=[2]
    ),
}

OPTIMIZERS = {
    "SGD-fused": lambda groups: torch.optim.SGD(groups, momentum=0.9, fused=True),
    "AdamW-fused": lambda groups: torch.optim.AdamW(groups, weight_decay=0.01, fused=True),
}


def _patterns(name: str) -> dict[str, list[bool]]:
    """Overflow patterns (True: the step's gradients hold inf): seeded runs of several
    densities, and bursts at the start and across the resume."""
    rng = random.Random(zlib.crc32(name.encode()))
    out = {f"random{p}": [rng.random() < p for _ in range(STEPS)] for p in (0.15, 0.4)}
    out["bursts"] = [i < 3 or RESUME_AT - 2 <= i <= RESUME_AT + 1 for i in range(STEPS)]
    return out


def _groups(params, lr):
    return [{"params": [p], "lr": lr(v)} for p, v in zip(params, LRS, strict=True)]


class Loop:
    """One training loop: two parameter groups, an optimizer, a scaler and a schedule."""

    def __init__(self, optimizer, scheduler, sync_free: bool, device_path: bool, device="cpu"):
        self.params = [torch.nn.Parameter(torch.linspace(-1, 1, n, device=device)) for n in (3, 2)]
        self.weights = [torch.linspace(0.5, 2, n, device=device) for n in (3, 2)]
        self.make = (optimizer, scheduler, sync_free, device_path, device)
        self.build()

    def build(self) -> None:
        optimizer, scheduler, sync_free, device_path, device = self.make
        lr = (lambda v: torch.tensor(v, device=device)) if sync_free else float
        self.opt = optimizer(_groups(self.params, lr))
        self.scaler = GradScaler(device, init_scale=2.0**8, growth_interval=3)
        self.scaler.torch_kernels = device_path
        self.torch_sched = scheduler(self.opt)
        self.sched = SkipAwareLR(self.torch_sched, self.scaler) if sync_free else None

    def step(self, overflow: bool) -> None:
        self.opt.zero_grad()
        g = float("inf") if overflow else 1.0
        loss = sum((p * w * g).sum() for p, w in zip(self.params, self.weights, strict=True))
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        if self.sched is None:
            if not self.scaler.last_step_skipped:
                self.torch_sched.step()
        else:
            self.sched.step()  # does nothing: a torch loop's line, kept

    def rates(self) -> list[float]:
        return [float(g["lr"]) for g in self.opt.param_groups]

    def checkpoint(self) -> bytes:
        buf = io.BytesIO()
        torch.save(
            {
                "opt": self.opt.state_dict(),
                "sched": self.sched.state_dict(),
                "scaler": self.scaler.state_dict(),
            },
            buf,
        )
        return buf.getvalue()

    def resume(self, saved: bytes) -> None:
        """A new optimizer, scaler and schedule, as a restarted run builds them, loaded
        from `saved` (the parameters are the model's, kept)."""
        ckpt = torch.load(io.BytesIO(saved), weights_only=False)
        self.build()
        self.opt.load_state_dict(ckpt["opt"])
        self.sched.load_state_dict(ckpt["sched"])
        self.scaler.load_state_dict(ckpt["scaler"])


def assert_rates(ours: list[float], ref: list[float], where: str) -> None:
    for g, (a, b) in enumerate(zip(ours, ref, strict=True)):
        tol = float(np.spacing(np.float32(abs(b))))
        assert abs(a - b) <= tol, f"{where}, group {g}: {a!r}, torch's {b!r} (tolerance {tol!r})"


@pytest.mark.parametrize("device_path", [False, True], ids=["core-path", "device-path"])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("sched_name", list(SCHEDULERS))
def test_rates_follow_the_synchronous_loop(sched_name, opt_name, device_path) -> None:
    """Every step's rate is the synchronous loop's, for generated overflow patterns,
    across a checkpoint saved and loaded mid-run."""
    for pattern_name, pattern in _patterns(sched_name + opt_name).items():
        make = (OPTIMIZERS[opt_name], SCHEDULERS[sched_name])
        ref = Loop(*make, sync_free=False, device_path=device_path)
        ours = Loop(*make, sync_free=True, device_path=device_path)
        where = f"{sched_name}, {opt_name}, {pattern_name}"
        assert_rates(ours.rates(), ref.rates(), f"{where}, before the first step")
        for i, overflow in enumerate(pattern):
            if i == RESUME_AT:
                ours.resume(ours.checkpoint())
                assert_rates(ours.rates(), ref.rates(), f"{where}, resumed at step {i}")
            ref.step(overflow)
            ours.step(overflow)
            assert ours.scaler.last_step_skipped == ref.scaler.last_step_skipped == overflow
            assert_rates(ours.rates(), ref.rates(), f"{where}, step {i}")
        applied = pattern.count(False)
        assert ours.sched.last_epoch == ref.torch_sched.last_epoch == applied


class HostReads(TorchDispatchMode):
    """Counts reads of tensor values on the host: ``aten._local_scalar_dense`` (``.item()``,
    ``bool()``, ``float()``, ``int()``, ``__index__``) and copies to another device, through
    the dispatcher; ``tolist``, ``numpy``, ``cpu`` and ``__array__``, which read a CPU
    tensor without a dispatch, through the patched methods."""

    PATCHED = ("tolist", "numpy", "cpu", "__array__")

    def __init__(self, monkeypatch) -> None:
        super().__init__()
        self.reads: list[str] = []
        for name in self.PATCHED:
            original = getattr(torch.Tensor, name)

            def counted(t, *args, _name=name, _original=original, **kwargs):
                self.reads.append(_name)
                return _original(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads.append(str(func))
        elif func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            src = args[1] if func is torch.ops.aten.copy_.default else args[0]
            dst = args[0].device if func is torch.ops.aten.copy_.default else kwargs.get("device")
            if dst is not None and torch.device(dst) != src.device:
                self.reads.append(f"{func} {src.device} -> {dst}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("sched_name", list(SCHEDULERS))
def test_the_step_reads_nothing_on_the_host(sched_name, opt_name, monkeypatch) -> None:
    """On the device path (torch's kernels, as on CUDA) with a fused optimizer, a whole
    step (scale, backward, step, update, which advances the schedule) reads no tensor on
    the host, skipped or applied."""
    loop = Loop(OPTIMIZERS[opt_name], SCHEDULERS[sched_name], sync_free=True, device_path=True)
    counter = HostReads(monkeypatch)
    with counter:
        for overflow in (False, True, True, False, False):
            loop.step(overflow)
    monkeypatch.undo()
    assert counter.reads == []
    assert loop.sched.last_epoch == 3


def test_the_host_read_counter_sees_last_step_skipped(monkeypatch) -> None:
    """The counter above is not blind: ``last_step_skipped`` on the device path is a read
    (the synchronisation its docstring names), and so are ``float()`` and ``tolist()``."""
    loop = Loop(OPTIMIZERS["SGD-fused"], SCHEDULERS["StepLR"], sync_free=True, device_path=True)
    loop.step(False)
    counter = HostReads(monkeypatch)
    with counter:
        assert loop.scaler.last_step_skipped is False
        float(loop.opt.param_groups[0]["lr"])
        loop.opt.param_groups[0]["lr"].tolist()
    monkeypatch.undo()
    assert counter.reads == [str(torch.ops.aten._local_scalar_dense.default)] * 2 + ["tolist"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "opt_name, sync_free_step",
    [("SGD-fused", True), ("AdamW-fused", True), ("AdamW-capturable", False)],
)
@pytest.mark.parametrize("sched_name", list(SCHEDULERS))
def test_cuda_rates_without_synchronisation(sched_name, opt_name, sync_free_step) -> None:
    """On CUDA: the rates are the synchronous loop's, and with a fused optimizer the whole
    step runs under ``torch.cuda.set_sync_debug_mode("error")``.  A capturable optimizer
    takes the tensor rate too, but ``GradScaler.step()`` reads the found-inf flag to decide
    whether to call it (as torch's does), so its step is not checked for syncs."""
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    optimizers = {
        **OPTIMIZERS,
        "AdamW-capturable": lambda groups: torch.optim.AdamW(groups, capturable=True),
    }
    make = (optimizers[opt_name], SCHEDULERS[sched_name])
    ref = Loop(*make, sync_free=False, device_path=True, device="cuda")
    ours = Loop(*make, sync_free=True, device_path=True, device="cuda")
    for i, overflow in enumerate(_patterns(sched_name)["random0.4"]):
        ref.step(overflow)
        if sync_free_step:
            torch.cuda.set_sync_debug_mode("error")
        try:
            ours.step(overflow)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert_rates(ours.rates(), ref.rates(), f"{sched_name}, {opt_name}, step {i}")


# ---- the surface ---------------------------------------------------------------------


def _opt(lr=None):
    p = torch.nn.Parameter(torch.ones(2))
    return torch.optim.SGD([p], lr=torch.tensor(0.1) if lr is None else lr, fused=True)


def _train(sched, scaler, opt, pattern):
    p = opt.param_groups[0]["params"][0]
    rates = []
    for overflow in pattern:
        opt.zero_grad()
        scaler.scale((p * (math.inf if overflow else 1.0)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        rates.append(float(opt.param_groups[0]["lr"]))
    return rates


class _OwnStepLR(L.StepLR):
    def get_lr(self):
        return [g["lr"] * 2 for g in self.optimizer.param_groups]


@pytest.mark.parametrize(
    "build, why",
    [
        (lambda o: L.ReduceLROnPlateau(o), "the metric passed to step()"),
        (lambda o: L.CyclicLR(o, 0.01, 0.1, cycle_momentum=False), "scale_fn"),
        (lambda o: L.CosineAnnealingWarmRestarts(o, 5), "the epoch passed to step()"),
        (lambda o: L.ChainedScheduler([L.StepLR(o, 2)]), "running product"),
        (lambda o: L.MultiplicativeLR(o, lambda e: 0.9), "running product"),
        (lambda o: _OwnStepLR(o, 2), "Python code on the current rate"),
        (
            lambda o: L.SequentialLR(
                o, [L.StepLR(o, 2), L.SequentialLR(o, [L.StepLR(o, 3)], [])], [3]
            ),
            "nested SequentialLR",
        ),
    ],
    ids=["plateau", "cyclic", "warm-restarts", "chained", "multiplicative", "subclass", "nested"],
)
def test_an_unsupported_scheduler_is_refused_with_the_reason(build, why) -> None:
    scaler = GradScaler("cpu")
    with pytest.raises(TypeError) as e:
        SkipAwareLR(build(_opt()), scaler)
    msg = str(e.value)
    assert msg.startswith("unsupported scheduler ") and why in msg, msg
    assert "LambdaLR, StepLR, MultiStepLR" in msg and "SequentialLR of these" in msg, msg
    assert "`not scaler.last_step_skipped`" in msg, msg
    assert scaler._schedules == ()


def test_a_float_learning_rate_is_refused() -> None:
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['lr'\] must be a one-element tensor"):
        SkipAwareLR(L.StepLR(_opt(lr=0.1), 2), GradScaler("cpu"))


def test_torchs_scaler_is_refused() -> None:
    with pytest.raises(TypeError, match=r"scaler must be an lscore\.adapters\.torch\.GradScaler"):
        SkipAwareLR(L.StepLR(_opt(), 2), torch.amp.GradScaler("cpu"))


def test_a_lambda_that_reads_the_count_on_the_host_is_refused() -> None:
    with pytest.raises(ValueError, match=r"lr_lambda\[0\] must be written in elementwise"):
        SkipAwareLR(L.LambdaLR(_opt(), lambda e: min(1.0, (e + 1) / 5)), GradScaler("cpu"))


def test_a_lambda_that_is_not_elementwise_is_refused() -> None:
    """The rates are tabulated for many counts at once: a reduction over the counts
    would give every count the same rate."""
    with pytest.raises(ValueError, match=r"lr_lambda\[0\] must work elementwise"):
        SkipAwareLR(
            L.LambdaLR(_opt(), lambda e: 0.9 ** torch.as_tensor(e).max()), GradScaler("cpu")
        )


def test_one_cycle_with_momentum_cycling_is_refused() -> None:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=torch.tensor(0.1), fused=True)
    with pytest.raises(ValueError, match="OneCycleLR's cycle_momentum must be False"):
        SkipAwareLR(L.OneCycleLR(opt, 0.1, total_steps=10), GradScaler("cpu"))


def test_a_constant_lambda_and_a_disabled_scaler() -> None:
    """A disabled scaler applies every step, so the schedule advances every step."""
    opt = _opt()
    scaler = GradScaler("cpu", enabled=False)
    sched = SkipAwareLR(L.LambdaLR(opt, [lambda e: 0.5]), scaler)
    assert _train(sched, scaler, opt, [False] * 3) == [np.float32(0.05)] * 3
    opt = _opt()
    sched = SkipAwareLR(L.StepLR(opt, 1, 0.5), scaler)
    _train(sched, scaler, opt, [False] * 3)
    assert sched.last_epoch == 3


def test_update_with_new_scale_advances_as_last_step_skipped_says() -> None:
    opt = _opt()
    scaler = GradScaler("cpu")
    sched = SkipAwareLR(L.ExponentialLR(opt, 0.5), scaler)
    p = opt.param_groups[0]["params"][0]
    for overflow in (True, False):
        opt.zero_grad()
        scaler.scale((p * (math.inf if overflow else 1.0)).sum()).backward()
        scaler.step(opt)
        scaler.update(new_scale=1024.0)
    assert sched.last_epoch == 1
    scaler.update(new_scale=512.0)  # no step recorded: not skipped
    assert sched.last_epoch == 2 and not scaler.last_step_skipped


def test_state_dict_step_epoch_and_get_last_lr() -> None:
    opt = _opt()
    scaler = GradScaler("cpu")
    sched = SkipAwareLR(L.StepLR(opt, 2, 0.5), scaler)
    assert isinstance(sched, L.LRScheduler)  # what Lightning and accelerate check
    _train(sched, scaler, opt, [False, True, False, False])
    assert sched.state_dict() == {"scheduler": "StepLR", "last_epoch": 3}
    sched.step()
    assert sched.last_epoch == 3 and float(opt.param_groups[0]["lr"]) == np.float32(0.05)
    sched.step(6)  # torch's deprecated form: jump to a count
    (last,) = sched.get_last_lr()
    assert float(last) == np.float32(0.0125) and last is not opt.param_groups[0]["lr"]
    sched.load_state_dict({"scheduler": "StepLR", "last_epoch": 1})
    assert float(opt.param_groups[0]["lr"]) == np.float32(0.1)
    with pytest.raises(ValueError, match=r"state_dict\['scheduler'\] must be 'StepLR'"):
        sched.load_state_dict({"scheduler": "LinearLR", "last_epoch": 1})
    with pytest.raises(ValueError, match="state_dict must have the keys"):
        sched.load_state_dict({"last_epoch": 1})
    with pytest.raises(ValueError, match="last_epoch must be >= 0, got -1"):
        sched.load_state_dict({"scheduler": "StepLR", "last_epoch": -1})


def test_a_scaler_with_a_schedule_pickles_without_it() -> None:
    """A schedule holds its optimizer (and a LambdaLR a lambda, which cannot be pickled):
    the scaler's pickle leaves it out; a rebuilt SkipAwareLR attaches itself again."""
    opt = _opt()
    scaler = GradScaler("cpu")
    SkipAwareLR(L.LambdaLR(opt, lambda e: 0.9**e), scaler)
    _train(None, scaler, opt, [False, True])
    clone = pickle.loads(pickle.dumps(scaler))
    assert clone._schedules == () and len(scaler._schedules) == 1
    assert clone.get_scale() == scaler.get_scale()
