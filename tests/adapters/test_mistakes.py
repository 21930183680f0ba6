"""Honest mistakes a new user makes with the adapters: each is refused at once, with what
to do instead, and leaves nothing behind that breaks the correct call that follows."""

import subprocess
import sys

import numpy as np
import pytest


def _inner_class(backend):
    if backend.module is None:  # torch
        import torch

        return torch.optim.Adam
    return backend.module.Adam


def test_an_optimizer_class_is_refused_and_corrupts_nothing(backend):
    """The class, not an instance: refused with what to pass; the next correct call works."""
    cls = _inner_class(backend)
    with pytest.raises(TypeError, match=r"got the class Adam: pass an instance"):
        backend.LossScaleOptimizer(cls, initial_scale=1024.0)
    assert not getattr(cls, "_is_wrapped_by_loss_scale_optimizer", False)
    w = backend.variables([np.ones(3, np.float32)])
    opt = backend.LossScaleOptimizer(backend.adam(w, 1e-3), initial_scale=1024.0)
    assert opt.loss_scale == 1024.0


@pytest.mark.parametrize(
    "steps, exc, msg",
    [
        (0, ValueError, r"dynamic_growth_steps must be a positive integer \(1, 2, 3, ...\), got 0"),
        (-5, ValueError, r"dynamic_growth_steps must be a positive integer .*, got -5"),
        (2.5, ValueError, r"dynamic_growth_steps must be a positive integer .*, got 2.5"),
    ],
)
def test_dynamic_growth_steps_is_an_integer_at_least_one(backend, steps, exc, msg):
    w = backend.variables([np.ones(3, np.float32)])
    with pytest.raises(exc, match=msg):
        backend.LossScaleOptimizer(backend.sgd(w), dynamic_growth_steps=steps)


def test_a_bare_array_as_var_list_is_refused(array_backend):
    b = array_backend
    w = b.asarray(np.ones(3, np.float32))
    opt = b.LossScaleOptimizer(b.module.SGD(0.1), initial_scale=2.0)

    def loss_and_grads(scale):
        return 0.0, [w * 0 + scale]

    with pytest.raises(TypeError, match=r"var_list must be a list of arrays.*pass \[w\]"):
        opt.minimize(loss_and_grads, w)
    opt.minimize(loss_and_grads, [w])  # the list is what it takes
    assert np.all(b.to_numpy(w) == 0.9)


def test_a_bare_tensor_as_var_list_is_refused():
    torch = pytest.importorskip("torch")
    from lscore.adapters.torch import LossScaleOptimizer

    w = torch.ones(3, requires_grad=True)
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1))
    with pytest.raises(TypeError, match=r"var_list must be a list of arrays.*pass \[w\]"):
        opt.minimize(lambda: (w * w).sum(), var_list=w)


def test_float16_variables_are_refused_as_torch_refuses_float16_parameters(array_backend):
    """The torch GradScaler's refusal and advice; ``allow_fp16_params=True`` opts in."""
    b = array_backend
    w16 = b.asarray(np.ones(2, np.float16))
    g = b.asarray(np.full(2, 0.5, np.float16))
    opt = b.LossScaleOptimizer(b.module.SGD(1.0), initial_scale=1.0)
    with pytest.raises(ValueError, match=r"^Attempting to apply gradients to float16 variables"):
        opt.apply_gradients([(g, w16)])
    with pytest.raises(ValueError, match=r"keep float32 master weights.*allow_fp16_params=True"):
        opt.minimize(lambda scale: (0.0, [g]), [w16])
    assert np.all(b.to_numpy(w16) == 1.0) and opt.iterations == 0  # nothing happened
    ok = b.LossScaleOptimizer(b.module.SGD(1.0), initial_scale=1.0, allow_fp16_params=True)
    assert ok.apply_gradients([(g, w16)])
    assert np.all(b.to_numpy(w16) == 0.5)
    with pytest.raises(TypeError, match="allow_fp16_params must be a bool"):
        b.LossScaleOptimizer(b.module.SGD(1.0), allow_fp16_params="yes")


def test_float16_variables_are_refused_in_sync_free_mode():
    """The sync-free elementwise path (float16 variables never take the fused kernels)."""
    from helpers.backends import make

    b = make("cuda_host")
    w16 = b.asarray(np.ones(2, np.float16))
    opt = b.LossScaleOptimizer(b.module.SGD(1.0), initial_scale=1.0, sync_free=True)
    with pytest.raises(ValueError, match="allow_fp16_params=True"):
        opt.apply_gradients([(b.asarray(np.full(2, 0.5, np.float16)), w16)])
    assert np.all(b.to_numpy(w16) == 1.0)


@pytest.mark.parametrize(
    "module, extra",
    [("torch", '".[torch]"'), ("cupy", '".[cuda12]"')],
)
def test_a_missing_framework_names_the_extra(module, extra):
    """Without the framework, the adapter's ImportError says which extra installs it."""
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "try:\n"
        f"    import lscore.adapters.{module}\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert f"lscore.adapters.{module} needs" in out and f"pip install {extra}" in out


def test_integer_gradients_are_refused_before_anything_changes(array_backend):
    """unscale_ multiplies by 1/scale: an int32 gradient cannot take it (torch refuses such
    a gradient too).  Every path refuses it with the dtype named, before any array, the
    scale or the step count changes; all_finite still counts integers as finite."""
    b = array_backend
    f, i = b.asarray(np.full(3, 4.0, np.float32)), b.asarray(np.arange(3, dtype=np.int32))
    assert b.all_finite([f, i])
    with pytest.raises(TypeError, match=r"unscale_ .*array 1 \(in flattened order\) is int32"):
        b.unscale_([f, i], 0.5)
    assert np.all(b.to_numpy(f) == 4.0)
    modes = (False, True) if b.name != "numpy" else (False,)
    for sync_free in modes:
        kw = {"sync_free": True} if sync_free else {}
        w = b.asarray(np.ones(3, np.float32))
        opt = b.LossScaleOptimizer(b.module.SGD(0.1), initial_scale=1024.0, **kw)
        v = b.asarray(np.ones(3, np.float32))
        with pytest.raises(TypeError, match=r"gradient 1 is int32"):
            opt.minimize(lambda scale: (0.0, [f, i]), [w, v])
        with pytest.raises(TypeError, match=r"gradient 1 is int32"):
            opt.apply_gradients([(f, w), (i, v)])
        with pytest.raises(TypeError, match=r"gradient 1 is int32"):
            opt.get_unscaled_gradients([f, i])
        assert np.all(b.to_numpy(w) == 1.0) and np.all(b.to_numpy(f) == 4.0)
        assert opt.iterations == 0 and float(opt.loss_scale) == 1024.0


def test_integer_gradients_are_refused_by_the_torch_adapter():
    """torch's own unscale kernel refuses an integer gradient (NotImplementedError); lscore's
    GradScaler and LossScaleOptimizer refuse it before any gradient is unscaled, with a
    TypeError (still a NotImplementedError) naming the dtype and the parameter."""
    torch = pytest.importorskip("torch")
    from lscore.adapters.torch import GradScaler, LossScaleOptimizer

    def params():
        q = torch.nn.Parameter(torch.ones(2))
        q.grad = torch.full((2,), 4.0)
        p = torch.nn.Parameter(torch.zeros(3, dtype=torch.long), requires_grad=False)
        p.grad = torch.ones(3, dtype=torch.long)
        return q, p

    where = r"param_groups\[0\]\['params'\]\[1\] is torch.int64"
    for torch_kernels in (False, True):
        q, p = params()
        opt = torch.optim.SGD([q, p], lr=0.1)
        scaler = GradScaler("cpu", init_scale=4.0)
        scaler.torch_kernels = torch_kernels
        scaler.scale(torch.ones((), requires_grad=True))
        for call in (scaler.unscale_, scaler.step):
            with pytest.raises(TypeError, match=where) as e:
                call(opt)
            assert isinstance(e.value, NotImplementedError)
        assert torch.equal(q.grad, torch.full((2,), 4.0)) and torch.equal(q, torch.ones(2))
    q, p = params()
    opt = LossScaleOptimizer(torch.optim.SGD([q, p], lr=0.1), initial_scale=4.0)
    with pytest.raises(TypeError, match=where):
        opt.step()
    with pytest.raises(TypeError, match=r"gradient 1 is torch\.int32"):
        opt.get_unscaled_gradients([q.grad, torch.ones(2, dtype=torch.int32)])
    assert torch.equal(q.grad, torch.full((2,), 4.0)) and opt.iterations == 0
