"""SGD and Adam of lscore.adapters.numpy against hand-computed steps (tf-keras's formulas)."""

import math

import numpy as np
import pytest

from lscore.adapters.numpy import SGD, Adam, LossScaleOptimizer

f32 = np.float32


def test_sgd_plain_step_in_place_0d():
    w = np.array(1.0, f32)
    ref = w
    opt = SGD(learning_rate=0.1)
    assert opt.apply_gradients([(0.5, w)]) == 1
    assert w is ref and w.shape == () and w == f32(0.95)  # 1 - 0.5 * 0.1 in float32


def test_sgd_momentum_keras_docstring_example():
    """tf-keras SGD doc: loss = w**2 / 2, lr 0.1, momentum 0.9: steps 0.1 then 0.18."""
    w = np.array([1.0], np.float32)
    opt = SGD(0.1, momentum=0.9)
    w0 = w.copy()
    opt.apply_gradients([(w.copy(), w)])
    w1 = w.copy()
    opt.apply_gradients([(w.copy(), w)])
    np.testing.assert_allclose(w0 - w1, [0.1], rtol=1e-6)
    np.testing.assert_allclose(w1 - w, [0.18], rtol=1e-6)


def test_sgd_nesterov_by_hand():
    # g = 1 twice, lr 0.1, momentum 0.5:
    # m1 = -0.1;  w1 = 1 + (-0.1 + 0.5*-0.1) = 0.85
    # m2 = -0.1 + 0.5*-0.1 = -0.15;  w2 = 0.85 + (-0.1 + 0.5*-0.15) = 0.675
    w = np.array([1.0], np.float64)
    opt = SGD(0.1, momentum=0.5, nesterov=True)
    opt.apply_gradients([(np.ones(1), w)])
    np.testing.assert_allclose(w, [0.85], rtol=1e-12)
    opt.apply_gradients([(np.ones(1), w)])
    np.testing.assert_allclose(w, [0.675], rtol=1e-12)


def test_sgd_float16_variable_updates_in_float16():
    w = np.array([1.0, 2.0], np.float16)
    SGD(0.5).apply_gradients([(np.array([1.0, 1.0], np.float32), w)])
    assert w.dtype == np.float16 and list(w) == [0.5, 1.5]


def test_adam_first_two_steps_by_hand():
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-7
    w = np.array([1.0, -2.0], np.float64)
    opt = Adam(lr, b1, b2, eps)
    g1, g2 = np.array([0.5, -3.0]), np.array([1.0, 2.0])
    opt.apply_gradients([(g1, w)])
    # step 1: m = 0.1 g, v = 0.001 g^2, alpha = lr sqrt(1 - b2) / (1 - b1)
    m = (1 - b1) * g1
    v = (1 - b2) * g1**2
    w_hand = np.array([1.0, -2.0]) - lr * math.sqrt(1 - b2) / (1 - b1) * m / (np.sqrt(v) + eps)
    np.testing.assert_allclose(w, w_hand, rtol=1e-12)
    opt.apply_gradients([(g2, w)])
    m = m + (g2 - m) * (1 - b1)
    v = v + (g2**2 - v) * (1 - b2)
    w_hand = w_hand - lr * math.sqrt(1 - b2**2) / (1 - b1**2) * m / (np.sqrt(v) + eps)
    np.testing.assert_allclose(w, w_hand, rtol=1e-12)
    assert opt.iterations == 2


def test_adam_epsilon_is_epsilon_hat():
    """With epsilon 1, g = 1, lr 1: Keras's first step is 0.0306534, Algorithm 1's is 0.5."""
    w = np.array([0.0], np.float32)
    Adam(1.0, epsilon=1.0).apply_gradients([(np.ones(1, np.float32), w)])
    # alpha = sqrt(0.001)/0.1 = 0.3162278; step = alpha * 0.1 / (sqrt(0.001) + 1)
    np.testing.assert_allclose(-w, [0.0306534], rtol=1e-5)


def test_adam_counts_skipped_keras_steps():
    """Under the Keras shape a skipped step advances iterations, so Adam's t is 2 next."""
    w = np.array([0.0], np.float64)
    opt = LossScaleOptimizer(Adam(0.1, epsilon=0.0), initial_scale=1, dynamic_growth_steps=1)
    opt.apply_gradients([(np.array([np.nan]), w)])
    opt.apply_gradients([(np.array([2.0]), w)])
    # t = 2, m = 0.1*2, v = 0.001*4: step = 0.1*sqrt(1-0.999**2)/(1-0.81) * 0.2/sqrt(0.004)
    hand = 0.1 * math.sqrt(1 - 0.999**2) / (1 - 0.9**2) * 0.2 / math.sqrt(0.004)
    np.testing.assert_allclose(-w, [hand], rtol=1e-12)


@pytest.mark.parametrize(
    "kw, expected",
    [
        ({"clipnorm": 1.0}, [[0.6, 0.8], [1.0]]),  # each array on its own
        ({"global_clipnorm": 1.0}, [[3 / 13, 4 / 13], [12 / 13]]),  # ||(3, 4, 12)|| = 13
        ({"clipvalue": 2.0}, [[2.0, 2.0], [2.0]]),
        ({"clipnorm": 0.0}, [[3.0, 4.0], [12.0]]),  # 0 disables, as in Keras
    ],
    ids=["clipnorm", "global_clipnorm", "clipvalue", "clipnorm-0"],
)
def test_clipping_by_hand(kw, expected):
    a, b = np.zeros(2), np.zeros(1)
    SGD(1.0, **kw).apply_gradients([(np.array([3.0, 4.0]), a), (np.array([12.0]), b)])
    np.testing.assert_allclose(-a, expected[0], rtol=1e-12)
    np.testing.assert_allclose(-b, expected[1], rtol=1e-12)


def test_clipnorm_priority_and_exclusion():
    with pytest.raises(ValueError, match="At most one of `clipnorm` and `global_clipnorm`"):
        SGD(clipnorm=1.0, global_clipnorm=1.0)
    opt = SGD(clipnorm=1.0)
    with pytest.raises(ValueError, match="At most one"):
        opt.global_clipnorm = 2.0
    a = np.zeros(2)
    SGD(1.0, clipnorm=1.0, clipvalue=0.1).apply_gradients([(np.array([3.0, 4.0]), a)])
    np.testing.assert_allclose(-a, [0.6, 0.8])  # clipnorm wins, as in tf-keras


def test_global_clipnorm_zero_gradients():
    a = np.zeros(2)
    SGD(1.0, global_clipnorm=1.0).apply_gradients([(np.zeros(2), a)])
    assert list(a) == [0.0, 0.0]


def test_empty_none_and_all_none():
    opt = SGD(1.0)
    assert opt.apply_gradients([]) == 0  # no-op, iterations unchanged
    a, b = np.ones(1), np.ones(1)
    with pytest.warns(UserWarning, match="Gradients do not exist"):
        opt.apply_gradients([(None, a), (np.ones(1), b)])
    assert a[0] == 1.0 and b[0] == 0.0
    with pytest.raises(ValueError, match="No gradients provided for any variable"):
        opt.apply_gradients([(None, a)])


@pytest.mark.parametrize(
    "var, grad, exc, msg",
    [
        (1.0, 1.0, TypeError, "variables must be numpy.ndarray"),
        (np.float32(1.0), 1.0, TypeError, "variables must be numpy.ndarray"),
        (np.ones(2, np.int32), np.ones(2), TypeError, "floating dtype"),
        (np.ones(2), np.ones(3), ValueError, "does not match variable shape"),
    ],
    ids=["python-float", "numpy-scalar", "int-array", "shape"],
)
def test_variable_errors(var, grad, exc, msg):
    with pytest.raises(exc, match=msg):
        SGD().apply_gradients([(grad, var)])


def test_all_pairs_checked_before_any_update():
    a = np.ones(2)
    ro = np.ones(2)
    ro.flags.writeable = False
    opt = SGD(1.0, momentum=0.5)
    with pytest.raises(ValueError, match="read-only"):
        opt.apply_gradients([(np.ones(2), a), (np.ones(2), ro)])
    assert list(a) == [1.0, 1.0] and opt.iterations == 0


@pytest.mark.parametrize(
    "make, exc, msg",
    [
        (lambda: SGD(momentum=1.5), ValueError, "momentum must be in [0, 1], got 1.5"),
        (lambda: SGD(nesterov="yes"), TypeError, "nesterov must be a bool"),
        (lambda: SGD(learning_rate="x"), TypeError, "learning_rate must be a real number"),
        (lambda: SGD(learning_rate=math.inf), ValueError, "learning_rate must be finite"),
        (lambda: Adam(beta_1=1.0), ValueError, "beta_1 must be in [0, 1), got 1.0"),
        (lambda: Adam(epsilon=-1), ValueError, "epsilon must be finite and >= 0"),
        (lambda: SGD(clipvalue=-1), ValueError, "clipvalue must be None or a finite number >= 0"),
        (lambda: Adam(weight_decay=-0.1), ValueError, "weight_decay must be None or a finite"),
        (lambda: Adam(amsgrad=1), TypeError, "amsgrad must be a bool, got 1"),
    ],
    ids=[
        "momentum",
        "nesterov",
        "lr-type",
        "lr-inf",
        "beta_1",
        "epsilon",
        "clipvalue",
        "weight_decay",
        "amsgrad",
    ],
)
def test_argument_errors(make, exc, msg):
    with pytest.raises(exc) as e:
        make()
    assert msg in str(e.value)


def test_slots_follow_the_variable_object():
    a = np.zeros(1)
    opt = SGD(1.0, momentum=1.0)
    for _ in range(2):
        opt.apply_gradients([(np.ones(1), a)])
    assert a[0] == -3.0  # momentum 1: steps 1, then 2
    b = np.zeros(1)  # a fresh array gets a fresh momentum slot
    opt.apply_gradients([(np.ones(1), b)])
    assert b[0] == -1.0


def test_weight_decay_is_keras_decoupled_decay_before_the_step():
    """tf-keras's _apply_weight_decay: w -= w * wd * lr, then the optimizer's own step."""
    w = np.array([2.0, -4.0])
    SGD(0.1, weight_decay=0.5).apply_gradients([(np.array([1.0, 1.0]), w)])
    np.testing.assert_array_equal(w, np.array([2.0, -4.0]) * (1 - 0.5 * 0.1) - 0.1)
    w, g = np.array([1.0, -2.0]), np.array([0.5, -3.0])
    Adam(0.01, weight_decay=0.2).apply_gradients([(g, w)])
    plain = np.array([1.0, -2.0]) * (1 - 0.2 * 0.01)
    Adam(0.01).apply_gradients([(g, plain)])
    np.testing.assert_array_equal(w, plain)


def test_amsgrad_keeps_the_largest_second_moment():
    """After a large gradient then a small one, amsgrad divides by the larger v (vhat)."""
    lr, b1, b2, eps = 0.1, 0.9, 0.5, 1e-7
    w, plain = np.zeros(1), np.zeros(1)
    ams, opt = Adam(lr, b1, b2, eps, amsgrad=True), Adam(lr, b1, b2, eps)
    for g in (10.0, 0.1):
        ams.apply_gradients([(np.array([g]), w)])
        opt.apply_gradients([(np.array([g]), plain)])
    m = (1 - b1) * 10.0
    v = (1 - b2) * 100.0
    m2, v2 = m + (0.1 - m) * (1 - b1), v + (0.01 - v) * (1 - b2)
    first = -lr * math.sqrt(1 - b2) / (1 - b1) * m / (math.sqrt(v) + eps)
    alpha2 = lr * math.sqrt(1 - b2**2) / (1 - b1**2)
    np.testing.assert_allclose(w, first - alpha2 * m2 / (math.sqrt(max(v, v2)) + eps), rtol=1e-12)
    assert v2 < v and abs(w[0] - plain[0]) > 1e-3


def test_config_round_trip():
    for opt in (
        SGD(0.5, 0.9, True, clipvalue=1.0, weight_decay=0.1),
        Adam(0.01, 0.8, 0.99, 1e-6, True, clipnorm=2.0, weight_decay=0.004),
    ):
        again = type(opt).from_config(opt.get_config())
        assert again.get_config() == opt.get_config()
