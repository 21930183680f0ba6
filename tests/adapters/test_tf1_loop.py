"""TF1's training-loop API on the adapters (issue 17, item 13).

Migrating TF1 code keeps its calls.  NVIDIA's TF1 BERT
(TensorFlow/LanguageModeling/BERT/optimization.py) does::

    loss_scale_manager = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(
        init_loss_scale=2**32, incr_every_n_steps=1000, decr_every_n_nan_or_inf=2,
        decr_ratio=0.5)
    optimizer = tf.contrib.mixed_precision.LossScaleOptimizer(optimizer, loss_scale_manager)
    grads_and_vars = optimizer.compute_gradients(loss, tvars)
    grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
    grads, tvars = list(zip(*grads_and_vars))
    (clipped_grads, _) = tf.clip_by_global_norm(grads, clip_norm=1.0)
    train_op = optimizer.apply_gradients(list(zip(clipped_grads, tvars)),
                                         global_step=global_step)

and simpler TF1 scripts ``optimizer.minimize(loss, global_step=global_step)`` with
``global_step = tf.train.get_or_create_global_step()`` (an int64 variable).  The
tests below make those calls on lscore's optimizers, with the expected values of
TF's contrib tests (tensorflow/contrib/mixed_precision/python/loss_scale_optimizer_test.py
and loss_scale_manager_test.py in TF 1.15).
"""

import warnings

import numpy as np
import pytest

import lscore
from helpers.cuda_host.adapter import CountingBackend
from lscore.adapters import numpy as lnp

try:
    import torch

    from lscore.adapters.torch import LossScaleOptimizer
except ImportError:  # the NumPy and harness tests run without torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


class Variable:
    """A TF-like counter: TF1's global_step is a variable with ``assign_add``."""

    def __init__(self):
        self.value = 0

    def assign_add(self, delta):
        self.value += int(delta)


def _bert_manager():
    return lscore.ExponentialUpdateLossScaleManager(
        init_loss_scale=2**32, incr_every_n_steps=1000, decr_every_n_nan_or_inf=2, decr_ratio=0.5
    )


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


# -- every adapter: apply_gradients(grads_and_vars, global_step=None, name=None) --------------


def test_apply_gradients_advances_global_step_only_when_applied(backend):
    """contrib's test_apply_gradients ([nan, inf, 0.1], fixed manager 1e4, var 1, lr 1 ->
    1, 1, 0.9) with a global_step: TF1 runs the inner apply, which increments it, only
    under ``cond(is_overall_finite, ...)``."""
    (var,) = backend.variables([np.array(1.0, np.float32)])
    opt = backend.LossScaleOptimizer(backend.sgd([var], 1.0), lscore.FixedLossScaleManager(1e4))
    global_step = backend.asarray(np.array(0, np.int64))
    got = []
    for g in (np.nan, np.inf, 0.1):
        grad = backend.asarray(np.array(g, np.float32))
        applied = opt.apply_gradients([(grad, var)], global_step=global_step, name="train")
        got.append(
            (bool(applied), float(backend.to_numpy(var)), int(backend.to_numpy(global_step)))
        )
    assert got == [(False, 1.0, 0), (False, 1.0, 0), (True, np.float32(0.9), 1)]
    assert opt.iterations == 1  # the TF1 shape does not count skipped steps either


@pytest.mark.parametrize("shape", ["keras", "experimental", "tf1"])
def test_global_step_counts_applied_steps_in_every_shape(backend, shape):
    """In the Keras shape ``iterations`` counts skipped steps too (tf-keras); ``global_step``
    is TF1's and counts applied steps only, in every shape."""
    (var,) = backend.variables([np.ones(2, np.float32)])
    arg = {"keras": None, "experimental": "dynamic", "tf1": _bert_manager()}[shape]
    opt = backend.LossScaleOptimizer(backend.sgd([var], 0.1), arg)
    global_step = Variable()
    pattern = [1.0, np.nan, 1.0, np.inf, np.inf, 1.0]
    for g in pattern:
        opt.apply_gradients(
            [(backend.asarray(np.full(2, g, np.float32)), var)], global_step=global_step
        )
    applied = sum(np.isfinite(g) for g in pattern)
    assert global_step.value == applied == 3
    assert opt.iterations == (len(pattern) if shape == "keras" else applied)


def test_apply_gradients_refuses_a_python_int_global_step(backend):
    (var,) = backend.variables([np.ones(1, np.float32)])
    opt = backend.LossScaleOptimizer(backend.sgd([var], 0.1), lscore.FixedLossScaleManager(8))
    grad = backend.asarray(np.ones(1, np.float32))
    for bad in (0, np.int64(0), True):
        with pytest.raises(TypeError, match=r"incremented in place.*0-d integer.*assign_add"):
            opt.apply_gradients([(grad, var)], global_step=bad)
    with pytest.raises(TypeError, match=r"unsupported global_step type builtins.float"):
        opt.apply_gradients([(grad, var)], global_step=0.0)
    with pytest.raises(TypeError, match="global_step must be a 0-d integer"):
        opt.apply_gradients([(grad, var)], global_step=backend.asarray(np.zeros(1, np.int64)))
    with pytest.raises(TypeError, match="global_step must be a 0-d integer"):
        opt.apply_gradients([(grad, var)], global_step=backend.asarray(np.array(0.0)))
    with pytest.raises(TypeError, match=r"name must be a str or None, got builtins.int"):
        opt.apply_gradients([(grad, var)], name=3)
    # each refusal came before the step: nothing moved
    assert np.all(backend.to_numpy(var) == 1.0) and opt.iterations == 0


# -- NumPy: no autodiff -------------------------------------------------------------------


def test_numpy_compute_gradients_of_a_loss_value_says_to_pass_a_callable():
    """TF1 code hands compute_gradients its loss tensor; NumPy cannot differentiate it."""
    w = np.ones(3, np.float32)
    opt = lnp.LossScaleOptimizer(lnp.SGD(0.1), _bert_manager())
    loss = np.sum(w * w)
    with pytest.raises(
        TypeError,
        match=r"numpy has no autodiff.*callable fn\(scale\) -> "
        r"\(loss, grads\).*got numpy.float32",
    ):
        opt.compute_gradients(loss, [w])
    with pytest.raises(TypeError, match="numpy has no autodiff"):
        opt.minimize(loss, [w])
    assert np.all(w == 1.0)


def test_numpy_minimize_and_apply_gradients_advance_a_numpy_global_step():
    w = np.ones(3, np.float32)
    opt = lnp.LossScaleOptimizer(lnp.SGD(0.5), _bert_manager())
    global_step = np.array(0, np.int64)  # updated in place, as a TF variable
    coef = [1.0]

    def loss_and_grads(scale):  # loss = coef * sum(w), backprop seeded with scale
        return coef[0] * np.sum(w), [np.float32(scale) * np.full(3, coef[0], np.float32)]

    opt.minimize(loss_and_grads, [w], global_step=global_step)
    coef[0] = np.inf
    opt.minimize(loss_and_grads, [w], global_step=global_step)
    assert global_step == 1 and np.all(w == 0.5)
    pairs = opt.compute_gradients(lambda s: (0.0, [np.float32(s) * np.ones(3, np.float32)]), [w])
    assert opt.apply_gradients(pairs, global_step=global_step) is True
    assert global_step == 2 and np.all(w == 0.0)


def test_numpy_global_step_must_be_writable_and_refusals_change_nothing():
    w = np.ones(2, np.float32)
    opt = lnp.LossScaleOptimizer(lnp.SGD(0.5), _bert_manager())
    frozen = np.array(0, np.int64)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="global_step is read-only"):
        opt.apply_gradients([(np.ones(2, np.float32), w)], global_step=frozen)
    called = []
    with pytest.raises(TypeError, match="incremented in place"):
        opt.minimize(
            lambda s: called.append(s) or (0.0, [np.ones(2, np.float32)]), [w], global_step=5
        )
    assert not called and np.all(w == 1.0) and opt.loss_scale == 2.0**32


# -- CuPy adapter's sync-free mode: the flag is added on the device ---------------------------


def test_sync_free_global_step_is_advanced_on_the_device_without_a_sync(device_backend):
    """sync_free=True: apply_gradients returns a device bool; global_step (a 0-d device
    integer) is incremented by it on the device, so skipped steps leave it alone and no
    step reads the device (the harness counts reads; on a GPU the values are checked)."""
    b = device_backend
    w = b.asarray(np.ones(2, np.float32))
    opt = b.LossScaleOptimizer(b.module.SGD(0.5), sync_free=True)
    global_step = b.asarray(np.array(0, np.int64))
    before = CountingBackend.syncs
    for g in (1.0, np.nan, 1.0, np.inf):
        ones = b.asarray(np.ones(2, np.float32))
        grads = opt.get_unscaled_gradients([opt.get_scaled_loss(b.scalar(g, np.float32)) * ones])
        opt.apply_gradients([(grads[0], w)], global_step=global_step)
    assert CountingBackend.syncs == before
    assert int(b.to_numpy(global_step)) == 2 and np.all(b.to_numpy(w) == 0.0)
    assert opt.iterations == 4
    with pytest.raises(TypeError, match="incremented in place"):
        opt.apply_gradients([(b.asarray(np.ones(2, np.float32)), w)], global_step=1)
    assert int(b.to_numpy(global_step)) == 2 and np.all(b.to_numpy(w) == 0.0)


# -- torch: compute_gradients / apply_gradients / minimize on a loss tensor -------------------


@needs_torch
def test_torch_compute_gradients_recovers_a_float16_gradient():
    """contrib's test: with a fixed 1e4 manager compute_gradients returns the true
    float16 gradient 1e-4, which underflows to 0 unscaled; ``.grad`` is untouched."""
    x = torch.nn.Parameter(torch.tensor(1.0))
    c1, c2, c3 = (torch.tensor(c, dtype=torch.float16) for c in (1e4, 1e-4, 1e-4))

    def loss():
        return x.half() * c1 * c2 * c3

    for scale, want in ((1e4, 1e-4), (1.0, 0.0)):
        opt = LossScaleOptimizer(
            torch.optim.SGD([x], lr=1.0), loss_scale_manager=lscore.FixedLossScaleManager(scale)
        )
        ((g, v),) = opt.compute_gradients(loss(), [x])
        assert v is x and x.grad is None
        assert g.item() == pytest.approx(want, rel=1e-3, abs=0.0)


@needs_torch
def test_torch_bert_loop_matches_plain_torch_bitwise():
    """NVIDIA BERT's calls (compute_gradients(loss, tvars), drop None, clip by global norm,
    apply_gradients(..., global_step=global_step)) with its manager (2**32, a power of two,
    so scaling is exact in float32) give the parameters of a plain torch loop, bit for bit;
    the step with NaN in the loss is skipped and global_step does not count it."""
    model, ref = _model(), _model()
    frozen = torch.nn.Parameter(torch.ones(1))  # trainable, unreached by the loss: None grad
    opt = LossScaleOptimizer(
        torch.optim.Adam([*model.parameters(), frozen], lr=1e-2), _bert_manager()
    )
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    global_step = torch.zeros((), dtype=torch.int64)
    tvars = [*model.parameters(), frozen]
    for step in range(6):
        x, y = _batch(step)
        if step == 3:
            x = x.clone()
            x[0, 0] = float("nan")
        loss = torch.nn.functional.mse_loss(model(x), y)
        grads_and_vars = opt.compute_gradients(loss, tvars)
        assert grads_and_vars[-1] == (None, frozen)
        grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
        grads, tvars_with_grads = list(zip(*grads_and_vars, strict=True))
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        clipped = [g * (1.0 / max(norm.item(), 1.0)) for g in grads]
        applied = opt.apply_gradients(
            list(zip(clipped, tvars_with_grads, strict=True)), global_step=global_step
        )
        assert applied is (step != 3)
        if applied:
            ref_opt.zero_grad()
            torch.nn.functional.mse_loss(ref(x), y).backward()
            ref_grads = [p.grad for p in ref.parameters()]
            ref_norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in ref_grads])
            )
            for g in ref_grads:
                g.mul_(1.0 / max(ref_norm.item(), 1.0))
            ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    assert global_step.item() == 5 and opt.iterations == 5
    assert frozen.item() == 1.0 and opt.loss_scale == 2.0**32
    assert all(p.grad is None for p in tvars)


@needs_torch
def test_torch_minimize_with_global_step():
    """``train_op = optimizer.minimize(loss, global_step=global_step)`` with the contrib
    optimizer: the same parameters as a plain torch SGD loop; a NaN loss is skipped and
    not counted."""
    model, ref = _model(1), _model(1)
    opt = LossScaleOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), _bert_manager()
    )
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    global_step = torch.zeros((), dtype=torch.int64)
    results = []
    for step in range(5):
        x, y = _batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step == 2:
            loss = loss * float("inf")
        results.append(opt.minimize(loss, global_step=global_step, name="train"))
        if step != 2:
            ref_opt.zero_grad()
            torch.nn.functional.mse_loss(ref(x), y).backward()
            ref_opt.step()
    assert results == [True, True, False, True, True] and global_step.item() == 4
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    # two infinite steps in a row back the scale off (decr_every_n_nan_or_inf=2)
    for _ in range(2):
        opt.minimize(
            torch.nn.functional.mse_loss(model(x), y) * float("nan"), global_step=global_step
        )
    assert opt.loss_scale == 2.0**31 and global_step.item() == 4


@needs_torch
def test_torch_apply_gradients_is_a_step_for_state_dict_hooks_and_schedulers():
    """The same events through apply_gradients and through step() leave the same
    parameters, optimizer state, scale, iterations and scheduler position."""
    a, b = _model(2), _model(2)
    opts = [
        LossScaleOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), "dynamic")
        for m in (a, b)
    ]
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in opts]
    hook_calls = []
    opts[0].register_step_post_hook(lambda *args: hook_calls.append(1))
    for step in range(5):
        x, y = _batch(step)
        bad = float("nan") if step == 1 else 1.0
        pairs = opts[0].compute_gradients(torch.nn.functional.mse_loss(a(x), y) * bad)
        opts[0].apply_gradients(pairs)
        opts[1].zero_grad()
        opts[1].get_scaled_loss(torch.nn.functional.mse_loss(b(x), y) * bad).backward()
        opts[1].step()
        assert opts[0].last_step_skipped == opts[1].last_step_skipped == (step == 1)
        for s in scheds:
            s.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    sa, sb = (o.state_dict() for o in opts)
    assert sa["loss_scale"] == sb["loss_scale"] and sa["param_groups"] == sb["param_groups"]
    for k in sb["state"]:
        assert torch.equal(sa["state"][k]["momentum_buffer"], sb["state"][k]["momentum_buffer"])
    assert opts[0].loss_scale() == opts[1].loss_scale() and len(hook_calls) == 5
    restored = LossScaleOptimizer(
        torch.optim.SGD(_model(2).parameters(), lr=0.1, momentum=0.9), "dynamic"
    )
    restored.load_state_dict(sa)
    assert restored.state_dict()["loss_scale"] == sa["loss_scale"]


@needs_torch
def test_torch_apply_gradients_moves_only_the_given_variables():
    """TF1 updates the variables in grads_and_vars; the others keep their values, and
    every ``.grad`` is as it was before the call."""
    a = torch.nn.Parameter(torch.ones(2))
    b = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([a, b], lr=0.5), lscore.FixedLossScaleManager(4))
    b.grad = torch.full((2,), 3.0)
    stale = b.grad
    assert opt.apply_gradients([(torch.ones(2), a)]) is True
    assert torch.equal(a, torch.full((2,), 0.5)) and torch.equal(b, torch.ones(2))
    assert a.grad is None and b.grad is stale


@needs_torch
def test_torch_compute_gradients_options():
    """A callable loss (TF1 eager), grad_loss (the seed), a non-scalar loss (summed, as
    TF does), TF1's gate constants, and var_list defaulting to the trainable parameters."""
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    fixed = torch.nn.Parameter(torch.tensor([5.0]), requires_grad=False)
    opt = LossScaleOptimizer(
        torch.optim.SGD([w, fixed], lr=0.1), lscore.FixedLossScaleManager(1024)
    )
    ((g, v),) = opt.compute_gradients(
        lambda: (w * w).sum(), gate_gradients=opt.GATE_NONE, colocate_gradients_with_ops=True
    )
    assert v is w and torch.equal(g, torch.tensor([2.0, 4.0]))
    ((g, _),) = opt.compute_gradients(
        (w * w).sum(), [w], opt.GATE_GRAPH, grad_loss=torch.tensor(3.0)
    )
    assert torch.equal(g, torch.tensor([6.0, 12.0]))
    ((g, _),) = opt.compute_gradients(w * w, [w])
    assert torch.equal(g, torch.tensor([2.0, 4.0]))


@needs_torch
def test_torch_refusals_name_the_problem_and_change_nothing():
    w = torch.nn.Parameter(torch.ones(2))
    other = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.5), _bert_manager())
    global_step = torch.zeros((), dtype=torch.int64)
    loss = (w * w).sum()
    with pytest.raises(ValueError, match=r"gate_gradients must be one of.*Not 3"):
        opt.compute_gradients(loss, gate_gradients=3)
    with pytest.raises(ValueError, match="aggregation_method must be None"):
        opt.minimize(loss, aggregation_method=2)
    with pytest.raises(TypeError, match="colocate_gradients_with_ops must be a bool"):
        opt.compute_gradients(loss, colocate_gradients_with_ops="yes")
    with pytest.raises(ValueError, match=r"var_list\[0\] must be a tensor that requires grad"):
        opt.compute_gradients(loss, [torch.ones(2)])
    with pytest.raises(TypeError, match="loss must be a tensor"):
        opt.compute_gradients(1.0, [w])
    with pytest.raises(TypeError, match=r"incremented in place.*torch.Tensor"):
        opt.minimize(loss, global_step=0)
    with pytest.raises(TypeError, match=r"global_step must be a 0-d integer tensor.*float32"):
        opt.minimize(loss, global_step=torch.zeros(()))
    with pytest.raises(ValueError, match=r"No variables provided\."):
        opt.apply_gradients([], global_step=global_step)
    with pytest.raises(ValueError, match="No gradients provided for any variable"):
        opt.apply_gradients([(None, w)], global_step=global_step)
    with pytest.raises(ValueError, match="variable 0 is not a parameter of the wrapped"):
        opt.apply_gradients([(torch.ones(2), other)], global_step=global_step)
    with pytest.raises(ValueError, match="variable 1 appears twice"):  # counted with Nones
        opt.apply_gradients([(None, w), (torch.ones(2), w)], global_step=global_step)
    with pytest.raises(TypeError, match="gradient 1 must be a tensor or None, got numpy"):
        opt.apply_gradients([(None, w), (np.ones(2), w)], global_step=global_step)
    with pytest.raises(RuntimeError, match="size"):  # torch's own check of the grad's shape
        opt.apply_gradients([(torch.ones(3), w)], global_step=global_step)
    w.grad = torch.zeros(2)
    opt.unscale_()
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has been called"):
        opt.apply_gradients([(torch.ones(2), w)], global_step=global_step)
    assert torch.equal(w, torch.ones(2)) and global_step.item() == 0
    assert opt.iterations == 0 and opt.loss_scale == 2.0**32
    assert torch.equal(w.grad, torch.zeros(2))


@needs_torch
def test_torch_none_gradients_warn_in_the_keras_shape_only():
    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    for arg, warns in ((None, True), (_bert_manager(), False)):
        opt = LossScaleOptimizer(torch.optim.SGD([a, b], lr=1.0), arg)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.apply_gradients([(None, a), (torch.ones(1), b)])
        assert bool(caught) is warns
