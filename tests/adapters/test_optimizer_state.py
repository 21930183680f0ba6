"""The NumPy and CuPy LossScaleOptimizer's state_dict / load_state_dict: a run checkpointed and
resumed into new objects is bitwise the uninterrupted run, in every constructor shape, around
SGD (momentum) and Adam (m, v, vhat, its step count), sync-free mode included; a state of
another optimizer, shape or format is refused before anything changes."""

import pickle

import numpy as np
import pytest

import lscore
from helpers.backends import make
from lscore.diagnostics import OverflowMonitor

FIRST, TOTAL = 17, 40


def _events():
    """A bad step at 3, then two in a row at 7 and 8, every 11 steps."""
    return [i % 11 not in (3, 7, 8) for i in range(TOTAL)]


def _inner(b, kind):
    m = b.module
    if kind == "adam":
        return m.Adam(0.01)
    if kind == "amsgrad":
        return m.Adam(0.01, amsgrad=True)
    return m.SGD(0.05, momentum=0.9, nesterov=True)


SCALINGS = {
    "keras": lambda: dict(initial_scale=2.0**8, dynamic_growth_steps=3),
    "keras-fixed": lambda: dict(dynamic=False, initial_scale=64.0),
    "experimental": lambda: dict(loss_scale=lscore.DynamicLossScale(2.0**8, 3)),
    "tf1": lambda: dict(loss_scale_manager=lscore.ExponentialUpdateLossScaleManager(2.0**8, 3)),
}


def _make(b, kind, scaling, sync_free=False):
    extra = {"sync_free": True} if sync_free else {}
    opt = b.LossScaleOptimizer(_inner(b, kind), **SCALINGS[scaling](), **extra)
    opt.overflow_monitor = OverflowMonitor()
    host = [np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.zeros(4, np.float32)]
    return opt, [b.asarray(h) for h in host]


def _step(b, opt, vs, i, finite):
    def loss_and_grads(scale):
        g = [(np.sin(b.to_numpy(v) + i) + 0.1).astype(np.float32) * np.float32(scale) for v in vs]
        if not finite:
            g[1][i % 4] = np.inf
        return 0.0, [b.asarray(x) for x in g]

    opt.minimize(loss_and_grads, vs)
    m = opt.overflow_monitor
    skipped = bool(opt.last_step_skipped)
    return (
        float(opt.loss_scale if not isinstance(opt.loss_scale, lscore.LossScale)
              else opt.loss_scale()),
        int(opt.iterations),
        skipped,
        str(m.last_report) if skipped else None,
        [b.to_numpy(v).tobytes() for v in vs],
    )  # fmt: skip


def _resume(b, kind, scaling, sync_free=False):
    evs = _events()
    opt, vs = _make(b, kind, scaling, sync_free)
    full = [_step(b, opt, vs, i, e) for i, e in enumerate(evs)]
    opt, vs = _make(b, kind, scaling, sync_free)
    for i, e in enumerate(evs[:FIRST]):
        _step(b, opt, vs, i, e)
    saved = pickle.dumps(
        {"opt": _host_arrays(opt.state_dict()), "vars": [b.to_numpy(v) for v in vs]}
    )
    ckpt = pickle.loads(saved)
    opt, _ = _make(b, kind, scaling, sync_free)  # new objects, then their states
    vs = [b.asarray(v) for v in ckpt["vars"]]
    opt.load_state_dict(ckpt["opt"])
    rest = [_step(b, opt, vs, FIRST + k, e) for k, e in enumerate(evs[FIRST:])]
    return full[FIRST:], rest


def _host_arrays(d):
    """The state with every array on the host, as a checkpoint file holds it."""
    if isinstance(d, dict):
        return {k: _host_arrays(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_host_arrays(v) for v in d]
    get = getattr(d, "get", None)
    return d.get() if callable(get) and not isinstance(d, np.ndarray) else d


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("kind", ["adam", "amsgrad", "sgd"])
@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_resume_is_bitwise_the_uninterrupted_run(array_backend, kind, scaling):
    expected, got = _resume(array_backend, kind, scaling)
    assert got == expected
    # the resumed part skips steps too (a fixed Keras scale applies them, NaN and all)
    assert any(step[2] for step in got) == (scaling != "keras-fixed")


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_sync_free_resume_is_bitwise_the_uninterrupted_run(kind):
    """The state on the device (scale, counters, Adam's step counter) goes out and back in."""
    expected, got = _resume(make("cuda_host"), kind, "keras", sync_free=True)
    assert got == expected


def test_the_state_is_json_safe_but_for_the_slot_arrays():
    import json

    b = make("numpy")
    opt, vs = _make(b, "adam", "keras")
    _step(b, opt, vs, 0, True)
    d = opt.state_dict()
    slots = d["optimizer"].pop("slots")
    json.dumps(d, allow_nan=False)
    assert d["format"] == "lscore.optimizer/1" and d["iterations"] == 1
    assert [sorted(s) for s in slots] == [["m", "v"], ["m", "v"]]
    assert all(isinstance(a, np.ndarray) for s in slots for a in s.values())


def _trained(b, kind="adam", scaling="keras"):
    opt, vs = _make(b, kind, scaling)
    for i in range(5):
        _step(b, opt, vs, i, i != 3)
    return opt, vs


@pytest.mark.parametrize(
    "change, exc, msg",
    [
        (lambda d: {**d, "format": "lscore.state/1"}, ValueError, "a loss scale's state"),
        (lambda d: {"param_groups": [], "state": {}}, ValueError, "a torch optimizer's"),
        (lambda d: {**d, "shape": "tf1"}, ValueError, "'tf1' shape"),
        (lambda d: {**d, "loss_scale": None}, ValueError, "fixed vs dynamic"),
        (lambda d: {**d, "extra": 1}, ValueError, "unknown \\['extra'\\]"),
        (lambda d: {**d, "iterations": -1}, ValueError, "iterations must be >= 0"),
        (  # another growth interval: the loss scale's load refuses it, the slots stay
            lambda d: {
                **d,
                "loss_scale": {
                    **d["loss_scale"],
                    "policy": {**d["loss_scale"]["policy"], "growth_interval": 9},
                },
            },
            ValueError,
            "saved by a different policy",
        ),
        (  # the slots refused after the scale was loaded: the scale is put back
            lambda d: {**d, "optimizer": {**d["optimizer"], "slots": []}},
            ValueError,
            "the slots of 0 variables",
        ),
        (
            lambda d: {**d, "optimizer": {**d["optimizer"], "class_name": "SGD"}},
            ValueError,
            "saved around 'SGD'; this LossScaleOptimizer wraps 'Adam'",
        ),
        (
            lambda d: {
                **d,
                "optimizer": {**d["optimizer"], "slots": d["optimizer"]["slots"][::-1]},
            },
            ValueError,
            "pass the variables in the order",
        ),
    ],
)
def test_a_state_of_another_kind_is_refused_and_changes_nothing(change, exc, msg):
    b = make("numpy")
    opt, _ = _trained(b)
    d = opt.state_dict()
    with pytest.raises(exc, match=msg):
        opt.load_state_dict(change(d))
    after = opt.state_dict()
    assert pickle.dumps(after) == pickle.dumps(d)


def test_slots_that_do_not_fit_the_variables_are_refused_at_the_first_step():
    """A new optimizer binds the loaded slots to its variables in the order they come."""
    b = make("numpy")
    opt, vs = _trained(b)
    d = opt.state_dict()
    fresh, _ = _make(b, "adam", "keras")
    fresh.load_state_dict(d)
    wrong = [np.zeros(4, np.float32), np.zeros((3, 4), np.float32)]  # the order swapped
    with pytest.raises(ValueError, match="pass the variables in the order"):
        fresh.apply_gradients(
            zip([np.ones(4, np.float32), np.ones((3, 4), np.float32)], wrong, strict=True)
        )
    assert all(np.all(w == 0) for w in wrong)  # nothing was updated
    fresh.apply_gradients(
        zip([np.ones((3, 4), np.float32), np.ones(4, np.float32)], vs, strict=True)
    )


def test_a_state_without_format_is_refused():
    b = make("numpy")
    opt, _ = _trained(b)
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        opt.load_state_dict([1, 2])
    with pytest.raises(ValueError, match="unknown optimizer state format None"):
        opt.load_state_dict({"iterations": 3})
