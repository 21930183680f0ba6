"""adapters/_optim.py: the three LossScaleOptimizer shapes and their loss-scale rules."""

import math
import subprocess
import sys

import numpy as np
import pytest

import lscore
from lscore import _reference as ref
from lscore.adapters._scaling import LossScaling, resolve_loss_scaling, scaling_kwargs_from_config
from lscore.adapters._wrapper import check_inner_optimizer


def test_keras_defaults():
    s = resolve_loss_scaling()
    assert (s.shape, s.dynamic, s.scale) == ("keras", True, 2.0**15)
    assert (s.initial_scale, s.dynamic_growth_steps, s.dynamic_counter) == (2.0**15, 2000, 0)
    assert isinstance(s.initial_scale, float) and isinstance(s.dynamic_growth_steps, int)
    assert s.skip_advances_iterations and s.predictable
    assert s.get_config() == {
        "dynamic": True,
        "initial_scale": 32768.0,
        "dynamic_growth_steps": 2000,
    }


@pytest.mark.parametrize(
    "args, kwargs", [((True,), {}), ((), {"dynamic": True})], ids=["positional-bool", "keyword"]
)
def test_keras_bool_positional_is_dynamic(args, kwargs):
    s = resolve_loss_scaling(*args, initial_scale=4, dynamic_growth_steps=2.0, **kwargs)
    assert (s.shape, s.dynamic, s.scale, s.dynamic_growth_steps) == ("keras", True, 4.0, 2)


def test_keras_fixed():
    s = resolve_loss_scaling(False, initial_scale=0.25)  # tf-keras accepts < 1
    assert (s.shape, s.dynamic, s.scale, s.dynamic_counter) == ("keras", False, 0.25, None)
    assert s.dynamic_growth_steps is None
    assert s.update(False) is True and s.scale == 0.25  # fixed applies NaN steps
    assert s.should_apply(False) is True


def test_keras_dynamic_rule_is_tf_with_multiplier_2():
    """The Keras shape runs lscore's TF2 policy with multiplier 2: compare with the reference."""
    s = resolve_loss_scaling(initial_scale=4, dynamic_growth_steps=2)
    policy = lscore.DynamicLossScale(4, 2, 2.0).state.policy
    rs = ref.RefState.initial(policy)
    rng = np.random.default_rng(3)
    for finite in rng.random(200) < 0.8:
        rs, r = ref.update(rs, bool(finite))
        assert s.should_apply(bool(finite)) == (r == ref.APPLY)
        assert s.update(bool(finite)) == (r == ref.APPLY)
        assert s.scale == rs.scale and s.dynamic_counter == rs.good_steps


_INTERVAL = "must be a positive integer (1, 2, 3, ...), got"


@pytest.mark.parametrize(
    "kwargs, exc, msg",
    [
        (
            {"dynamic": "dynamic"},
            TypeError,
            '"dynamic" argument to LossScaleOptimizer.__init__ must be a bool, '
            "but got: 'dynamic'",
        ),
        ({"dynamic": False}, ValueError, '"initial_scale" must be specified if "dynamic" is False'),
        (
            {"dynamic": False, "initial_scale": 1, "dynamic_growth_steps": 2},
            ValueError,
            '"dynamic_growth_steps" must be None if "dynamic" is False, but got: 2',
        ),
        ({"initial_scale": 0}, ValueError, "initial_scale must be finite and > 0, got 0"),
        ({"initial_scale": math.nan}, ValueError, "initial_scale must be finite and > 0"),
        ({"dynamic": False, "initial_scale": -1.0}, ValueError, "initial_scale must be finite"),
        ({"initial_scale": "x"}, TypeError, "initial_scale must be a real number"),
        ({"dynamic_growth_steps": "x"}, TypeError, "dynamic_growth_steps must be a positive"),
        # tf-keras takes these: 0 and -5 double the scale on every finite step, 2.5 is 2
        ({"dynamic_growth_steps": 0}, ValueError, f"dynamic_growth_steps {_INTERVAL} 0"),
        ({"dynamic_growth_steps": -5}, ValueError, f"dynamic_growth_steps {_INTERVAL} -5"),
        ({"dynamic_growth_steps": 2.5}, ValueError, f"dynamic_growth_steps {_INTERVAL} 2.5"),
        ({"dynamic_growth_steps": True}, TypeError, f"dynamic_growth_steps {_INTERVAL} True"),
    ],
)
def test_keras_errors(kwargs, exc, msg):
    with pytest.raises(exc) as e:
        resolve_loss_scaling(**kwargs)
    assert msg in str(e.value)


def test_np_bool_second_argument_must_be_python_bool():
    with pytest.raises(TypeError, match='"dynamic" argument'):
        resolve_loss_scaling(np.True_)


def test_dynamic_given_twice():
    with pytest.raises(TypeError, match="dynamic was given twice"):
        resolve_loss_scaling(True, dynamic=False)


@pytest.mark.parametrize(
    "arg, dynamic, scale",
    [
        ("dynamic", True, 2.0**15),
        (128, False, 128.0),
        (np.float32(8), False, 8.0),
        (lscore.DynamicLossScale(16, 3), True, 16.0),
        ({"class_name": "FixedLossScale", "config": {"loss_scale_value": 2.0}}, False, 2.0),
    ],
    ids=["dynamic", "int", "np-float32", "LossScale", "config-dict"],
)
def test_experimental_shape(arg, dynamic, scale):
    s = resolve_loss_scaling(arg)
    assert (s.shape, s.dynamic, s.scale) == ("experimental", dynamic, scale)
    assert not s.skip_advances_iterations
    assert isinstance(s.loss_scale_object, lscore.LossScale)


def test_experimental_keeps_the_same_loss_scale_object():
    ls = lscore.DynamicLossScale(2, 1)
    s = resolve_loss_scaling(ls)
    assert s.loss_scale_object is ls
    assert s.update(True) is True and ls() == 4.0 and s.scale == 4.0
    assert s.update(False) is False and ls() == 2.0
    assert s.dynamic_counter == 0 and s.dynamic_growth_steps == 1
    assert s.get_config() == {
        "loss_scale": {
            "class_name": "DynamicLossScale",
            "config": {"initial_loss_scale": 2.0, "increment_period": 1, "multiplier": 2.0},
        }
    }


def test_experimental_fixed_applies_nonfinite():
    s = resolve_loss_scaling(1000)
    assert s.update(False) is True and s.scale == 1000.0


def test_experimental_custom_loss_scale_gets_the_grads():
    class Halving(lscore.LossScale):
        def __init__(self):
            self.v, self.seen = 64.0, []

        def __call__(self):
            return self.v

        def update(self, grads):
            self.seen.append(grads)
            ok = lscore.all_finite(grads)
            self.v = self.v if ok else self.v / 2
            return None, ok

        def get_config(self):
            return {}

    ls = Halving()
    s = resolve_loss_scaling(ls)
    assert not s.predictable
    g = [np.array([np.nan], np.float32)]
    assert s.update(False, g) is False and s.scale == 32.0 and ls.seen == [g]
    with pytest.raises(ValueError, match="needs the gradients"):
        s.update(True)


@pytest.mark.parametrize(
    "bad, exc",
    [("Dynamic", ValueError), (0.5, ValueError), ([1], TypeError), (object(), TypeError)],
)
def test_experimental_errors(bad, exc):
    with pytest.raises(exc):
        resolve_loss_scaling(bad)


def test_experimental_refuses_keras_keywords():
    with pytest.raises(TypeError, match="belong to the Keras shape"):
        resolve_loss_scaling("dynamic", initial_scale=4)


@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_tf1_shape(how):
    m = lscore.ExponentialUpdateLossScaleManager(4, 2, decr_every_n_nan_or_inf=1, decr_ratio=0.5)
    s = (
        resolve_loss_scaling(m)
        if how == "positional"
        else resolve_loss_scaling(loss_scale_manager=m)
    )
    assert (s.shape, s.dynamic, s.scale, s.initial_scale, s.dynamic_growth_steps) == (
        "tf1",
        True,
        4.0,
        4.0,
        2,
    )
    assert not s.skip_advances_iterations and s.loss_scale_object is m
    assert s.update(False) is False and s.scale == 2.0
    assert s.update(True) is True and s.dynamic_counter == 1


def test_tf1_fixed_manager_skips_nonfinite():
    s = resolve_loss_scaling(lscore.FixedLossScaleManager(1e4))
    assert not s.dynamic and s.should_apply(False) is False
    assert s.update(False) is False and s.update(True) is True and s.scale == 1e4


def test_tf1_errors():
    m = lscore.FixedLossScaleManager(8)
    with pytest.raises(TypeError, match="not both"):
        resolve_loss_scaling(m, loss_scale_manager=m)
    with pytest.raises(TypeError, match="must be an lscore LossScaleManager"):
        resolve_loss_scaling(loss_scale_manager=8)
    with pytest.raises(TypeError, match="belong to the Keras shape"):
        resolve_loss_scaling(m, dynamic=False)


@pytest.mark.parametrize(
    "make",
    [
        lambda: resolve_loss_scaling(),
        lambda: resolve_loss_scaling(False, initial_scale=3),
        lambda: resolve_loss_scaling(initial_scale=8, dynamic_growth_steps=5),
        lambda: resolve_loss_scaling("dynamic"),
        lambda: resolve_loss_scaling(lscore.DynamicLossScale(4, 7, 3.0)),
        lambda: resolve_loss_scaling(64),
        lambda: resolve_loss_scaling(lscore.FixedLossScaleManager(1e4)),
        lambda: resolve_loss_scaling(
            lscore.ExponentialUpdateLossScaleManager(
                1024, 7, decr_every_n_nan_or_inf=3, incr_ratio=3, decr_ratio=0.25
            )
        ),
    ],
    ids=[
        "keras",
        "keras-fixed",
        "keras-args",
        "exp-dynamic",
        "exp-multiplier3",
        "exp-fixed",
        "tf1-fixed",
        "tf1-exponential",
    ],
)
def test_config_round_trip(make):
    s = make()
    cfg = s.get_config()
    t = resolve_loss_scaling(**scaling_kwargs_from_config(cfg))
    assert t.get_config() == cfg
    assert (t.shape, t.dynamic, t.scale) == (s.shape, s.dynamic, s.scale)


def test_custom_manager_has_no_config():
    class M(lscore.LossScaleManager):
        def get_loss_scale(self):
            return 8.0

        def update_loss_scale(self, finite_grads):
            pass

    with pytest.raises(TypeError, match="M has no config"):
        resolve_loss_scaling(M()).get_config()


def test_check_inner_optimizer_messages():
    class Wrapper:
        pass

    def is_opt(o):
        return callable(getattr(o, "apply_gradients", None))

    with pytest.raises(
        TypeError, match=r'"inner_optimizer" must be an instance of an optimizer, but got: 1\.'
    ):
        check_inner_optimizer(1, Wrapper, expected="an optimizer", is_optimizer=is_opt)

    class W2(Wrapper):
        def apply_gradients(self, gv):
            pass

    with pytest.raises(TypeError, match="LossScaleOptimizer cannot wrap another"):
        check_inner_optimizer(W2(), Wrapper, expected="x", is_optimizer=is_opt)

    class Opt:
        _is_wrapped_by_loss_scale_optimizer = True

        def apply_gradients(self, gv):
            pass

    with pytest.raises(ValueError, match='"inner_optimizer" is already wrapped'):
        check_inner_optimizer(Opt(), Wrapper, expected="x", is_optimizer=is_opt)


def test_shared_adapter_modules_import_no_framework():
    """The torch and CuPy adapters import the package's own modules (``lscore.adapters._*``):
    they must not pull in a framework themselves."""
    code = (
        "import importlib, pkgutil, sys, lscore.adapters as a\n"
        "shared = [m.name for m in pkgutil.iter_modules(a.__path__) if m.name[0] == '_']\n"
        "assert {'_optim', '_scaling', '_arrays', '_grads', '_fused'} <= set(shared), shared\n"
        "for name in shared: importlib.import_module('lscore.adapters.' + name)\n"
        "print(sorted(m for m in ('torch', 'cupy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert LossScaling.__module__ == "lscore.adapters._scaling"
