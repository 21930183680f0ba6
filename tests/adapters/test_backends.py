"""What every adapter does the same way, written once and run on each backend.

The ``backend`` fixtures (tests/conftest.py, helpers/backends.py) are NumPy,
the CuPy adapter on the host harness, CuPy on a GPU and torch.  The scan is
compared with the CPU core and lscore._reference; the LossScaleOptimizer
behaviours are tf-keras's (tf_semantics.md §7), which every adapter's wrapper
follows whatever array type it holds.
"""

import numpy as np
import pytest

import lscore
from helpers.cuda_host import device_words
from lscore import _reference as ref


def bits(a):
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


# ---- all_finite / unscale_ on nested arrays, against the CPU core ------------------------


def _nested(rng, dtypes, bad):
    arrs = []
    for dt in dtypes:
        for n in (0, 1, 17, 300):
            a = (rng.standard_normal(n) * 50).astype(dt)
            if n and bad and rng.random() < 0.3:
                a[int(rng.integers(0, n))] = rng.choice([np.nan, np.inf, -np.inf])
            arrs.append(a)
    arrs.append(np.arange(5, dtype=np.int16))
    return {"a": arrs[:5], "b": (None, arrs[5:9], [arrs[9:]])}


def _leaves(x):
    return [*x["a"], *x["b"][1], *x["b"][2][0]]


@pytest.mark.parametrize("seed", range(12))
def test_all_finite_and_unscale_match_cpu_core(array_backend, seed):
    b = array_backend
    rng = np.random.default_rng(seed)
    for inv in (0.5, 1 / 1024, 3.0, 1.0, 1 / 3):
        x = _nested(rng, b.float_dtypes, bad=seed % 2 == 0)
        y = _nested(np.random.default_rng(0), b.float_dtypes, bad=False)
        dev = b.tree(x)
        assert b.all_finite(dev) == ref.all_finite(x) == lscore.all_finite(x)
        assert b.all_finite(b.tree(y)) is True
        x["b"][2][0].pop()  # the int16 array: unscale_ refuses integers
        dev = b.tree(x)
        cpu = [a.copy() for a in _leaves(x)]
        want = lscore.unscale_(cpu, inv)
        assert b.unscale_(dev, inv) == want
        for d, h in zip(_leaves(dev), cpu, strict=True):
            got = b.to_numpy(d)
            if b.nan_payload_exact:
                want_bits = device_words(h, written=inv != 1.0) if b.device_nan else bits(h)
                assert np.array_equal(bits(got), want_bits), (inv, h.dtype)
            else:
                same = (bits(got) == bits(h)) | (np.isnan(got) & np.isnan(h))
                assert same.all(), (inv, h.dtype)


def test_empty_input_and_none_are_finite(array_backend):
    b = array_backend
    assert b.all_finite([]) and b.all_finite([None, {}])
    assert b.unscale_([None, b.asarray(np.zeros(0, np.float16))], 0.5)


# ---- LossScaleOptimizer: the tf-keras behaviours every adapter's wrapper shares ---------


def _fixed(backend, scale, learning_rate=1.0):
    variables = backend.variables([np.array([1.0], np.float32)])
    opt = backend.LossScaleOptimizer(
        backend.sgd(variables, learning_rate), dynamic=False, initial_scale=scale
    )
    return opt, variables


def test_keras_fixed_scale_applies_nonfinite_steps(backend):
    """tfk_fixed_applies_nonfinite: a fixed Keras scale does not check the gradients."""
    opt, (var,) = _fixed(backend, 4)
    assert backend.apply(opt, [var], [np.array([0.5], np.float32)]) is True
    assert backend.apply(opt, [var], [np.array([np.nan], np.float32)]) is True
    assert np.isnan(backend.to_numpy(var)[0])
    assert opt.iterations == 2


def test_wrapping_twice_and_nesting_raise(backend):
    (v,) = backend.variables([np.ones(3, np.float32)])
    inner = backend.sgd([v])
    backend.LossScaleOptimizer(inner)
    with pytest.raises(
        ValueError, match=r'"inner_optimizer" is already wrapped by a LossScaleOptimizer\.'
    ):
        backend.LossScaleOptimizer(inner)
    with pytest.raises(TypeError) as e:
        backend.LossScaleOptimizer(backend.LossScaleOptimizer(backend.sgd([v])))
    assert "LossScaleOptimizer cannot wrap another LossScaleOptimizer" in str(e.value)


def test_scaled_loss_casts_the_scale_to_the_loss_dtype(backend):
    opt, _ = _fixed(backend, 2.0)
    assert backend.to_numpy(opt.get_scaled_loss(backend.scalar(5.0, np.float32))) == 10.0
    assert backend.to_numpy(opt.get_scaled_loss(lambda: backend.scalar(5.0, np.float32))()) == 10.0
    half = backend.to_numpy(opt.get_scaled_loss(backend.scalar(5, np.float16)))
    assert half == 10.0 and half.dtype == np.float16
    for scale in (65536, 2.0**17):  # the scale is cast to float16 first: inf
        big, _ = _fixed(backend, scale)
        assert np.isinf(backend.to_numpy(big.get_scaled_loss(backend.scalar(1, np.float16))))
        scaled = big.get_scaled_loss(lambda: backend.scalar(2.0, np.float32))
        assert backend.to_numpy(scaled()) == 2.0 * scale


def test_unscaled_gradients_keep_none_and_dtype_with_float32_reciprocal(backend):
    """testGetUnscaledGradients: None kept, dtype kept; float32 reciprocal arithmetic."""
    opt, _ = _fixed(backend, 2)
    g = opt.get_unscaled_gradients(
        [backend.scalar(3.0, np.float32), None, backend.scalar(-4.0, np.float16)]
    )
    assert backend.to_numpy(g[0]) == 1.5 and g[1] is None
    assert backend.to_numpy(g[2]) == -2.0 and backend.to_numpy(g[2]).dtype == np.float16
    three, _ = _fixed(backend, 3)
    (u,) = three.get_unscaled_gradients([backend.asarray(np.array(5.0, np.float32))])
    u = backend.to_numpy(u)
    assert u == np.float32(1.6666667) and u != np.float32(5) / np.float32(3)
    huge, _ = _fixed(backend, 2**25)
    (z,) = huge.get_unscaled_gradients([backend.asarray(np.array(2.0**15, np.float16))])
    assert backend.to_numpy(z) == 0.0  # 2**-25 rounds to 0 in float16, as in TF
    big, _ = _fixed(backend, 2.0**17)
    out = big.get_unscaled_gradients([backend.asarray(np.array([2.0**17, 3.0], np.float32)), None])
    assert out[1] is None
    assert np.array_equal(backend.to_numpy(out[0]), np.array([1.0, 3.0 / 2**17], np.float32))
