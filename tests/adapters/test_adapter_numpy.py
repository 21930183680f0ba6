"""lscore.adapters.numpy.LossScaleOptimizer: the tf-keras and contrib vectors (tf_semantics.md §7).

The vectors every adapter shares (a fixed scale applies non-finite steps,
wrapping twice, the dtype casts of get_scaled_loss / get_unscaled_gradients)
are in test_backends.py, run on NumPy and on every other backend.

Each TF test differentiates a tiny loss; here the same gradients come from a
hand-written backward pass seeded with the loss scale, which is what
``minimize(loss_and_grads_fn, var_list)`` expects.
"""

import warnings

import numpy as np
import pytest

import lscore
from lscore.adapters import numpy as lnp
from lscore.adapters.numpy import SGD, Adam, LossScaleOptimizer


def linear_loss(var, coef):
    """loss = sum(var * coef): the gradient of loss * scale is coef * scale."""

    def fn(scale):
        with np.errstate(invalid="ignore"):
            return float(np.sum(var * coef)), [np.full_like(var, coef) * np.float32(scale)]

    return fn


# -- tf-keras loss_scale_optimizer_test.py ------------------------------------------------


def test_dynamic_update():
    """testDynamicUpdate: I=2, P=1, lr 1, loss var*2; then a NaN loss is skipped."""
    var = np.array([1.0, 2.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0), initial_scale=2, dynamic_growth_steps=1)
    opt.minimize(linear_loss(var, 2.0), [var])
    np.testing.assert_array_equal(var, [-1.0, 0.0])
    assert opt.loss_scale == 4.0
    opt.minimize(linear_loss(var, np.nan), [var])
    np.testing.assert_array_equal(var, [-1.0, 0.0])
    assert opt.loss_scale == 2.0


def test_dynamic_loss_scale():
    """testDynamicLossScale: I=2, P=1, lr 2, loss = var: 5 -> 3 -> 1."""
    var = np.array([5.0], np.float32)
    opt = LossScaleOptimizer(SGD(2.0), initial_scale=2, dynamic_growth_steps=1)
    assert opt.initial_scale == 2.0 and isinstance(opt.initial_scale, float)
    assert opt.dynamic_growth_steps == 1 and isinstance(opt.dynamic_growth_steps, int)
    seen = []

    def fn(scale):
        seen.append(scale)
        return float(var[0]), [np.ones_like(var) * np.float32(scale)]

    opt.minimize(fn, [var])
    np.testing.assert_array_equal(var, [3.0])
    opt.minimize(fn, [var])
    np.testing.assert_array_equal(var, [1.0])
    assert seen == [2.0, 4.0]  # the backprop was seeded with the doubled scale


@pytest.mark.parametrize("clip_type", ["clipnorm", "global_clipnorm", "clipvalue"])
def test_clipping(clip_type):
    """testClipping: clip the unscaled gradient of finite steps; an Inf step is skipped."""
    var = np.array([5.0], np.float32)
    opt = LossScaleOptimizer(SGD(2.0, **{clip_type: 2.0}), initial_scale=2, dynamic_growth_steps=1)
    assert getattr(opt, clip_type) == 2.0
    opt.minimize(linear_loss(var, 4.0), [var])
    np.testing.assert_array_equal(var, [1.0])  # grad 4 clipped to 2: 5 - 2*2
    assert opt.loss_scale == 4.0
    setattr(opt, clip_type, 3.0)  # passed through to the inner optimizer
    assert getattr(opt.inner_optimizer, clip_type) == 3.0
    opt.minimize(linear_loss(var, 4.0), [var])
    np.testing.assert_array_equal(var, [-5.0])  # clipped to 3: 1 - 3*2
    assert opt.loss_scale == 8.0
    opt.minimize(linear_loss(var, np.inf), [var])
    np.testing.assert_array_equal(var, [-5.0])
    assert opt.loss_scale == 4.0


def test_dynamic_loss_scale_with_slots():
    """testDynamicLossScaleWithSlots: momentum 1, I=2, P=1."""
    var = np.array([1.0, 2.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0, momentum=1.0), initial_scale=2.0, dynamic_growth_steps=1)
    opt.minimize(linear_loss(var, 1.0), [var])
    np.testing.assert_array_equal(var, [0.0, 1.0])
    assert opt.loss_scale == 4.0
    opt.minimize(linear_loss(var, 1.0), [var])
    np.testing.assert_array_equal(var, [-2.0, -1.0])
    assert opt.loss_scale == 8.0


def test_iterations_incremented():
    """testIterationsIncremented: a skipped step still counts in the Keras shape."""
    var = np.array([5.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0))
    opt.minimize(linear_loss(var, 2.0), [var])
    assert var[0] == 3.0 and opt.iterations == 1
    opt.minimize(linear_loss(var, np.nan), [var])
    assert var[0] == 3.0 and opt.iterations == 2 and opt.inner_optimizer.iterations == 2


@pytest.mark.parametrize(
    "loss_scale", ["dynamic", lscore.FixedLossScaleManager(8)], ids=["tf2.3-experimental", "tf1"]
)
def test_skipped_step_does_not_count_outside_keras_shape(loss_scale):
    var = np.array([5.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0), loss_scale)
    opt.minimize(linear_loss(var, 2.0), [var])
    opt.minimize(linear_loss(var, np.nan), [var])
    assert var[0] == 3.0 and opt.iterations == 1


def test_iterations_setter_and_defaults():
    """testIterations, testDynamicLossScaleDefaultValues, testDynamicAttrsWithFixedLossScale."""
    inner = SGD(2.0)
    opt = LossScaleOptimizer(inner, dynamic=False, initial_scale=10.0)
    opt.iterations = 7
    assert opt.iterations == 7 and inner.iterations == 7
    assert not opt.dynamic and opt.dynamic_counter is None and opt.dynamic_growth_steps is None
    opt = LossScaleOptimizer(SGD())
    assert (opt.initial_scale, opt.dynamic_growth_steps, opt.loss_scale) == (2**15, 2000, 2**15)


def test_checkpoint_counter():
    """testCheckpoint: I=1, P=2, one step -> scale 1, counter 1; momentum slot -1."""
    var = np.array([2.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0, momentum=1.0), initial_scale=1.0, dynamic_growth_steps=2.0)
    opt.minimize(linear_loss(var, 1.0), [var])
    assert var[0] == 1.0 and opt.loss_scale == 1.0 and opt.dynamic_counter == 1
    assert opt.iterations == 1


def test_get_scaled_loss_of_a_python_float():
    """The dtype casts are in test_backends.py (every adapter); a bare float is NumPy's."""
    opt = LossScaleOptimizer(SGD(), dynamic=False, initial_scale=2.0)
    assert opt.get_scaled_loss(5.0) == 10.0
    assert opt.get_scaled_loss(lambda: 5.0)() == 10.0


@pytest.mark.parametrize(
    "make, exc, msg",
    [
        (
            lambda: LossScaleOptimizer(1),
            TypeError,
            '"inner_optimizer" must be an instance of an optimizer with an '
            "apply_gradients(grads_and_vars) method that updates arrays in place, but got: 1.",
        ),
        (
            lambda: LossScaleOptimizer(SGD(), dynamic="dynamic"),
            TypeError,
            '"dynamic" argument to LossScaleOptimizer.__init__ must be a bool, '
            "but got: 'dynamic'",
        ),
        (
            lambda: LossScaleOptimizer(SGD(), dynamic=False),
            ValueError,
            '"initial_scale" must be specified if "dynamic" is False',
        ),
        (
            lambda: LossScaleOptimizer(
                SGD(), dynamic=False, initial_scale=1, dynamic_growth_steps=2
            ),
            ValueError,
            '"dynamic_growth_steps" must be None if "dynamic" is False, but got: 2',
        ),
    ],
    ids=["not-optimizer", "dynamic-not-bool", "fixed-no-scale", "fixed-growth"],
)
def test_tf_keras_errors(make, exc, msg):
    with pytest.raises(exc) as e:
        make()
    assert msg in str(e.value)


def test_hyperparameters_pass_through():
    inner = Adam(learning_rate=1.0)
    opt = LossScaleOptimizer(inner)
    opt.learning_rate = 0.005
    assert inner.learning_rate == 0.005 and opt.learning_rate == 0.005
    with pytest.raises(AttributeError):
        opt.beta_1  # noqa: B018 - tf-keras exposes no arbitrary attribute


# -- None gradients ------------------------------------------------------------------------


def test_none_gradients_keras_dropped_with_warning():
    a, b = np.array([1.0], np.float32), np.array([1.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0))
    with pytest.warns(UserWarning, match=r"positions \[0\]"):
        assert opt.apply_gradients([(None, a), (np.array([0.5], np.float32), b)])
    assert a[0] == 1.0 and b[0] == 0.5 and opt.dynamic_counter == 1


def test_none_gradients_tf1_ignored_silently():
    a, b = np.array([1.0], np.float32), np.array([1.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0), loss_scale_manager=lscore.FixedLossScaleManager(8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert opt.apply_gradients([(None, a), (np.array([0.5], np.float32), b)])
    assert a[0] == 1.0 and b[0] == 0.5


@pytest.mark.parametrize(
    "loss_scale",
    [None, "dynamic", lscore.FixedLossScaleManager(8)],
    ids=["keras", "experimental", "tf1"],
)
def test_all_none_gradients_raise_and_change_nothing(loss_scale):
    a = np.array([1.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0), loss_scale)
    before = (opt.loss_scaling.scale, opt.dynamic_counter)
    with pytest.raises(ValueError, match="No gradients provided for any variable"):
        opt.apply_gradients([(None, a)])
    assert opt.iterations == 0 and (opt.loss_scaling.scale, opt.dynamic_counter) == before


def test_failed_inner_apply_leaves_the_scale_unchanged():
    var = np.array([1.0, 2.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0), initial_scale=4, dynamic_growth_steps=1)
    with pytest.raises(ValueError, match="does not match variable shape"):
        opt.apply_gradients([(np.ones(3, np.float32), var)])
    assert opt.loss_scale == 4.0 and opt.dynamic_counter == 0 and opt.iterations == 0


def test_bad_gradient_type_raises_before_any_change():
    var = np.array([1.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0), initial_scale=4, dynamic_growth_steps=1)
    with pytest.raises(TypeError):
        opt.apply_gradients([("x", var)])
    with pytest.raises(TypeError, match="pairs"):
        opt.apply_gradients([var])
    assert opt.loss_scale == 4.0 and var[0] == 1.0


# -- contrib loss_scale_optimizer_test.py --------------------------------------------------


def test_contrib_fixed_manager_skips_nan_and_inf():
    """test_apply_gradients: grads nan, inf, 0.1 on a 0-d var -> 1, 1, 0.9."""
    x = np.array(1.0, np.float32)
    opt = LossScaleOptimizer(SGD(1), lscore.FixedLossScaleManager(1e4))
    out = []
    for g in (np.nan, np.inf, 0.1):
        opt.apply_gradients([(g, x)])
        out.append(float(x))
    np.testing.assert_allclose(out, [1, 1, 0.9], rtol=1e-6)
    assert x.shape == () and opt.iterations == 1


def test_contrib_custom_manager_is_updated():
    """test_apply_gradients_loss_scale_is_updated: +1 on finite, -1 otherwise, from 8."""

    class Simple(lscore.LossScaleManager):
        def __init__(self, v):
            self.v = float(v)

        def get_loss_scale(self):
            return self.v

        def update_loss_scale(self, finite_grads):
            self.v += 1 if finite_grads else -1

    x = np.array(1.0, np.float32)
    lsm = Simple(8)
    opt = LossScaleOptimizer(SGD(1), loss_scale_manager=lsm)
    scales, out = [], []
    for g in (np.nan, np.inf, 0.1):
        opt.apply_gradients([(g, x)])
        scales.append(lsm.v)
        out.append(float(x))
    assert scales == [7, 6, 7] and opt.loss_scale == 7.0
    np.testing.assert_allclose(out, [1, 1, 0.9], rtol=1e-6)


def _fp16_chain(x):
    """loss = f16(x) * 1e4 * 1e-4 * 1e-4; backprop in float16, seeded with the scale."""
    c1, c2, c3 = np.float16(1e4), np.float16(1e-4), np.float16(1e-4)

    def fn(scale):
        loss = x.astype(np.float16) * c1 * c2 * c3
        g = np.float16(scale) * c3 * c2 * c1  # reverse order, as backprop runs
        return loss, [np.asarray(g, np.float16).astype(np.float32)]

    return fn


def test_contrib_compute_gradients_recovers_fp16_gradient():
    x = np.array(1.0, np.float32)
    opt = LossScaleOptimizer(SGD(1), lscore.FixedLossScaleManager(1e4))
    ((g, v),) = opt.compute_gradients(_fp16_chain(x), [x])
    assert v is x and x == 1.0
    np.testing.assert_allclose(g, 1e-4, rtol=1e-6, atol=1e-6)
    # without scaling the same backward pass underflows to 0 (1e-4 * 1e-4 in float16)
    assert _fp16_chain(x)(1.0)[1][0] == 0.0


def test_contrib_minimize_with_loss_scale():
    x = np.array(1.0, np.float32)
    opt = LossScaleOptimizer(SGD(1.0), lscore.FixedLossScaleManager(1e4))
    opt.minimize(_fp16_chain(x), [x])
    np.testing.assert_allclose(x, 1 - 1e-4, rtol=0, atol=1e-6)


def test_compute_gradients_checks_the_function():
    x = np.array(1.0, np.float32)
    opt = LossScaleOptimizer(SGD())
    with pytest.raises(TypeError, match="must be a callable"):
        opt.compute_gradients(1.0, [x])
    with pytest.raises(TypeError, match="must return"):
        opt.compute_gradients(lambda s: [1.0], [x])
    with pytest.raises(ValueError, match="2 gradients for 1 variables"):
        opt.compute_gradients(lambda s: (1.0, [1.0, 2.0]), [x])


# -- experimental (TF <= 2.3) shape ---------------------------------------------------------


def test_experimental_shape_loss_scale_object():
    ls = lscore.DynamicLossScale(4, 1)
    opt = LossScaleOptimizer(SGD(1.0), ls)
    assert opt.loss_scale is ls
    var = np.array([1.0], np.float32)
    opt.minimize(linear_loss(var, 1.0), [var])
    assert ls() == 8.0 and var[0] == 0.0


def test_experimental_fixed_applies_nonfinite():
    var = np.array([1.0], np.float32)
    opt = LossScaleOptimizer(SGD(1.0), 128)
    opt.apply_gradients([(np.array([np.inf], np.float32), var)])
    assert np.isinf(var[0]) and opt.iterations == 1


# -- the protocol: any optimizer with apply_gradients ---------------------------------------


class Plain:
    """An optimizer that meets only the protocol: no iterations, no config."""

    def __init__(self):
        self.calls = 0

    def apply_gradients(self, grads_and_vars):
        self.calls += 1
        for g, v in grads_and_vars:
            v -= g


def test_custom_optimizer_without_iterations():
    var = np.array([1.0], np.float32)
    inner = Plain()
    opt = LossScaleOptimizer(inner, initial_scale=2, dynamic_growth_steps=1)
    opt.minimize(linear_loss(var, 0.5), [var])
    opt.minimize(linear_loss(var, np.nan), [var])
    assert inner.calls == 1 and var[0] == 0.5 and opt.iterations == 2
    with pytest.raises(TypeError, match="has no get_config"):
        opt.get_config()


# -- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: LossScaleOptimizer(SGD(2.0, momentum=0.5), dynamic=False, initial_scale=2),
        lambda: LossScaleOptimizer(SGD(2.0, momentum=0.5), initial_scale=2, dynamic_growth_steps=3),
        lambda: LossScaleOptimizer(Adam(0.5, beta_1=0.8, clipnorm=1.0), "dynamic"),
        lambda: LossScaleOptimizer(SGD(1.0), lscore.DynamicLossScale(2, 3, 4.0)),
        lambda: LossScaleOptimizer(SGD(1.0), lscore.ExponentialUpdateLossScaleManager(2, 3)),
    ],
    ids=["keras-fixed", "keras-dynamic", "experimental-adam", "experimental-multiplier4", "tf1"],
)
def test_config_round_trip(make):
    opt = make()
    cfg = opt.get_config()
    again = LossScaleOptimizer.from_config(cfg)
    assert again.get_config() == cfg
    assert type(again.inner_optimizer) is type(opt.inner_optimizer)
    assert again.loss_scaling.scale == opt.loss_scaling.scale


def test_get_config_dynamic_then_use():
    """testGetConfigDynamic: I=2, P=3, one step after from_config -> var 3, counter 1."""
    opt = LossScaleOptimizer(SGD(2.0, momentum=0.5), initial_scale=2, dynamic_growth_steps=3)
    cfg = opt.get_config()
    assert set(cfg) == {"inner_optimizer", "dynamic", "initial_scale", "dynamic_growth_steps"}
    opt = LossScaleOptimizer.from_config(cfg)
    var = np.array([5.0], np.float32)
    opt.minimize(linear_loss(var, 1.0), [var])
    assert var[0] == 3.0 and opt.dynamic_counter == 1 and opt.learning_rate == 2.0


def test_from_config_custom_objects():
    class MySGD(SGD):
        pass

    cfg = LossScaleOptimizer(MySGD(2.0)).get_config()
    with pytest.raises(ValueError, match="custom_objects"):
        LossScaleOptimizer.from_config(cfg)
    opt = LossScaleOptimizer.from_config(cfg, custom_objects={"MySGD": MySGD})
    assert type(opt.inner_optimizer) is MySGD


def test_module_exports():
    for name in lnp.__all__:
        assert hasattr(lnp, name), name
    assert lnp.all_finite is lscore.all_finite and lnp.DynamicLossScale is lscore.DynamicLossScale


def test_the_tf1_preset_is_accepted_as_loss_scale_manager():
    """lscore.preset("tf1", ...) is a LossScaleManager: the wrapper takes it as TF1 code
    takes ExponentialUpdateLossScaleManager, with the same steps and the same config."""

    def run(manager):
        v = np.ones(3, np.float32)
        opt = LossScaleOptimizer(SGD(0.5), loss_scale_manager=manager)
        for k in range(12):
            g = np.full(3, np.inf if k % 5 == 4 else 0.25, np.float32) * opt.loss_scale
            opt.apply_gradients([(g, v)])
        return v, opt.loss_scale, opt.get_config()

    p = lscore.preset("tf1", init_loss_scale=8.0, incr_every_n_steps=2, decr_ratio=0.5)
    got = run(p)
    want = run(lscore.ExponentialUpdateLossScaleManager(8.0, 2, decr_ratio=0.5))
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1] == p.get_loss_scale() and got[2] == want[2]
    again = LossScaleOptimizer.from_config(got[2])
    assert again.loss_scale == 8.0
