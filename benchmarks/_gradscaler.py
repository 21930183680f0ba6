"""The CPU suite's GradScaler rows: whole torch GradScaler steps on CPU tensors, lscore's
(``lscore.adapters.torch.GradScaler``, and the core with SGD on NumPy views) against
``torch.amp.GradScaler('cpu')``: a step, ``unscale_`` + ``update`` with fresh ``.grad``
tensors, and a clipped step."""

from __future__ import annotations

import numpy as np

import lscore
from lscore import kernels
from lscore.bench._harness import (
    N_SMALL,
    TORCH_SKIP,
    Rows,
    alternating,
    log_list,
    log_uniform_sizes,
    size_label,
    wanted,
)

# the part of a step that stands for backward(): the scalers' rows include it
GRAD_HARNESS = "assigning new .grad tensors (in every row)"
CLIP_METHODS = (
    "lscore.adapters.torch.GradScaler.unscale_and_clip_",
    "torch GradScaler.unscale_ + clip_grad_norm_(foreach=True)",
)
CLIP_DTYPES = ("float16", "bfloat16", "float32")
NO_ADAPTER = "lscore.adapters.torch is not available"


def torch_adapter() -> type | None:
    """lscore.adapters.torch.GradScaler, or None where it does not import."""
    try:
        from lscore.adapters.torch import GradScaler
    except ImportError:
        return None
    return GradScaler


def _gradscaler_model(torch, sizes):
    params = [torch.nn.Parameter(torch.zeros(int(s))) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape)
    return params, torch.optim.SGD(params, lr=1e-6, foreach=True)


def bench_gradscaler(rows: Rows, opts, torch, rng) -> None:
    """Whole GradScaler steps (unscale_, step, update) on 300 float32 parameters."""
    cases = (
        (f"{N_SMALL} x 64", [64] * N_SMALL),
        (f"{N_SMALL} log-uniform 1e2..1e5", log_uniform_sizes(opts.gs_max)),
    )
    adapter = torch_adapter()
    for label, sizes in cases:
        g = f"GradScaler step, {label}"
        kw = dict(dtype="float32", n=int(np.sum(sizes)), per=N_SMALL, opts=opts)
        methods = (
            "torch.amp.GradScaler('cpu')",
            "lscore core + SGD (numpy views)",
            "lscore.adapters.torch.GradScaler",
        )
        if torch is None:
            for m in methods:
                rows.add(g, m, skip=TORCH_SKIP, **kw)
            continue
        nb = 2 * 4 * int(np.sum(sizes))
        for m in methods:
            if m.startswith("lscore.adapters") and adapter is None:
                rows.add(g, m, skip=NO_ADAPTER, **kw)
                continue
            params, opt = _gradscaler_model(torch, sizes)
            rows.add(g, m, _step_fn(torch, m, params, opt, adapter), nbytes=nb, **kw)


def _step_fn(torch, method, params, opt, adapter):
    """One training step's scaler work; the scale alternates 2.0 / 0.5 (grads never drift)."""
    scales = alternating([2.0, 0.5])
    if method.startswith("lscore core"):
        state = lscore.LossScaleState(lscore.Policy(name="bench", init_scale=2.0))

        def core_step():
            grads = [p.grad.numpy() for p in params]
            finite = kernels.unscale_(grads, 1.0 / state.scale)
            if state.update(finite):
                opt.step()
            state.set_scale(scales())

        return core_step
    cls = adapter if method.startswith("lscore.adapters") else torch.amp.GradScaler
    scaler = cls("cpu", init_scale=2.0, growth_interval=1 << 30)
    scaler.scale(torch.ones(()))

    def step():
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update(scales())

    return step


def bench_torch_small(rows: Rows, opts, torch, rng) -> None:
    """GradScaler.unscale_ + update on 300 parameters of 64 elements, and on
    one: the fixed cost per torch tensor of the whole path (.grad, dtype,
    device, strides, data pointer), with fresh gradient tensors every step as
    after torch's default zero_grad(set_to_none=True).  The 1-tensor rows give
    the per-step part, so the targets can take the per-tensor part alone."""
    methods = (GRAD_HARNESS, "torch.amp.GradScaler('cpu')", "lscore.adapters.torch.GradScaler")
    adapter = torch_adapter()
    for count in (N_SMALL, 1):
        g = f"GradScaler.unscale_ + update, {count} x 64"
        kw = dict(dtype="float32", n=64 * count, per=count, opts=opts)
        if torch is None:
            for m in methods:
                rows.add(g, m, skip=TORCH_SKIP, **kw)
            continue
        grads = [[torch.randn(64) for _ in range(count)] for _ in range(2)]
        for m in methods:
            if m.startswith("lscore") and adapter is None:
                rows.add(g, m, skip=NO_ADAPTER, **kw)
                continue
            rows.add(
                g,
                m,
                _torch_small_step(torch, m, grads, adapter),
                nbytes=0 if m == GRAD_HARNESS else 2 * 4 * 64 * count,
                **kw,
            )
        rows.flush()


def _torch_small_step(torch, method, grads, adapter):
    """One step of `method` on its own parameters, given new .grad tensors first."""
    params = [torch.nn.Parameter(torch.zeros(64)) for _ in grads[0]]
    opt = torch.optim.SGD(params, lr=1e-6)
    turn = alternating([0, 1])

    def new_grads():
        for p, g in zip(params, grads[turn()], strict=True):  # new .grad objects each step
            p.grad = g

    if method == GRAD_HARNESS:
        return new_grads
    scaler = (adapter if method.startswith("lscore") else torch.amp.GradScaler)(
        "cpu", init_scale=1.0, growth_interval=1 << 30
    )
    scaler.scale(torch.ones(()))

    def step():
        new_grads()
        scaler.unscale_(opt)
        scaler.update()

    return step


# the part of a step that stands for backward(): the scalers' rows include it


def bench_clip(rows: Rows, opts, torch, rng) -> None:
    """A clipped step's scaler work: lscore's one pass against torch's unscale_ and
    clip_grad_norm_(params, 1.0, foreach=True) on the same CPU tensors, then update()
    in both, for one big tensor (the sizes from 1e7 up) and the 300-tensor list."""
    big = [n for n in opts.sizes if n >= 10**7] or list(opts.sizes[-1:])
    cases = [*((size_label(n), [n]) for n in big), log_list(opts)]
    adapter = torch_adapter()
    for label, sizes in cases:
        for name in CLIP_DTYPES:
            g = f"unscale_and_clip_ {name} {label}"
            kw = dict(dtype=name, n=int(np.sum(sizes)), per=len(sizes), opts=opts)
            if not wanted(opts, g):
                continue
            if torch is None or adapter is None:
                why = TORCH_SKIP if torch is None else NO_ADAPTER
                for m in CLIP_METHODS:
                    rows.add(g, m, skip=why, **kw)
                continue
            dt = getattr(torch, name)
            nb = 2 * 2 * dt.itemsize * int(np.sum(sizes))  # unscale and clip: two passes in torch
            for m in CLIP_METHODS:
                step, note = _clip_step(torch, m, sizes, dt, adapter)
                rows.add(g, m, step, nbytes=nb, **({"note": note} if note else {}), **kw)
            rows.flush()


def _clip_step(torch, method, sizes, dt, adapter):
    """One clipped step of `method` on its own parameters (scale alternating 2.0 / 0.5)."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(int(s), dtype=dt)) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(dt)
    opt = torch.optim.SGD(params, lr=1e-6)
    scales = alternating([2.0, 0.5])
    fp16 = dt == torch.float16
    if method == CLIP_METHODS[0]:
        scaler = adapter("cpu", init_scale=2.0, growth_interval=1 << 30, allow_fp16_params=fp16)
        scaler.scale(torch.ones(()))

        def step():
            scaler.unscale_and_clip_(opt, 1.0)
            scaler.update(scales())

        return step, None
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0, growth_interval=1 << 30)
    scaler.scale(torch.ones(()))
    if not fp16:

        def step():
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            scaler.update(scales())

        return step, None
    # torch's GradScaler refuses float16 gradients; run the kernel its unscale_ runs
    grads = [p.grad for p in params]
    found = torch.zeros(1)

    def step_fp16():
        inv = torch.full((1,), 1.0 / scaler.get_scale())
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        found.item()
        scaler.update(scales())

    return step_fp16, "float16: GradScaler refuses it, so its foreach kernel is called directly"
