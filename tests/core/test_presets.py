"""Every preset against its peer's rule (tests/helpers/peer_models.py) and the peers'
recorded runs."""

import contextlib
import copy
import json
import math
import pathlib
import pickle

import numpy as np
import pytest

import lscore
from helpers.gen import event_sequence
from helpers.peer_models import F32_MAX, MODELS
from lscore.presets import CLASSES, NAMES

DATA = pathlib.Path(__file__).parent / "data"

# Argument sets chosen to reach growth, backoff, hysteresis, the minimum and the
# maximum (or the float32 limit) within a few dozen steps.
ARGS = {
    "torch": [
        {},
        {"init_scale": 8.0, "growth_interval": 3},
        {"init_scale": 3.0, "growth_factor": 1.1, "backoff_factor": 0.3, "growth_interval": 1},
        {"init_scale": F32_MAX / 2, "growth_interval": 1},
        {"init_scale": 1e-38, "growth_interval": 5},
        {"enabled": False},
    ],
    "nemo": [
        {"init_scale": 16.0, "growth_interval": 2, "hysteresis": 3},
        {"init_scale": 16.0, "growth_interval": 2, "hysteresis": 0},
        {"growth_interval": 1, "hysteresis": 1},
        {"enabled": False},
    ],
    "tf2": [
        {"initial_loss_scale": 4, "increment_period": 2, "multiplier": 3},
        {"initial_loss_scale": 1.5, "increment_period": 1},
        {"initial_loss_scale": F32_MAX / 4, "increment_period": 1},
        {},
    ],
    "keras2": [
        {},
        {"initial_scale": 2, "dynamic_growth_steps": 1},
        {"dynamic": False, "initial_scale": 8},
        {"initial_scale": 0.25, "dynamic_growth_steps": 1},
    ],
    "keras3": [
        {"initial_scale": 2, "dynamic_growth_steps": 2},
        {"initial_scale": 2.0**127, "dynamic_growth_steps": 1},
        {"initial_scale": 2.0**-120, "dynamic_growth_steps": 1},
        {"initial_scale": 4, "dynamic_growth_steps": 3},
    ],
    "tf1": [
        {"init_loss_scale": 4, "incr_every_n_steps": 2, "decr_ratio": 0.5},
        {
            "init_loss_scale": 1.5,
            "incr_every_n_steps": 1,
            "decr_every_n_nan_or_inf": 1,
            "decr_ratio": 0.5,
        },
        {"init_loss_scale": F32_MAX / 4, "incr_every_n_steps": 1, "decr_every_n_nan_or_inf": 3},
    ],
    "apex": [
        {"init_scale": 2.0**30, "scale_window": 3},
        {"init_scale": 1.0, "scale_window": 2, "min_loss_scale": 0.25},
        {"init_scale": 1.0, "scale_window": 1, "min_loss_scale": 0},
        {"init_scale": 4.0, "scale_window": 1, "max_loss_scale": 8.0},
        {"loss_scale": 128.0},
    ],
    "apex_fp16_utils": [
        {"init_scale": 8, "scale_window": 3},
        {"init_scale": 4, "scale_factor": 3.0, "scale_window": 1},
    ],
    "deepspeed": [
        {"init_scale": 8, "scale_window": 3, "min_scale": 1, "delayed_shift": 2},
        {"init_scale": 8, "scale_window": 2, "delayed_shift": 3, "consecutive_hysteresis": True},
        {
            "init_scale": 4,
            "scale_window": 2,
            "min_scale": 0.5,
            "delayed_shift": 1,
            "raise_error_at_min_scale": False,
        },
        {"init_scale": 2, "scale_window": 1, "min_scale": 1, "delayed_shift": 1},
    ],
    "megatron": [
        {"initial_scale": 16, "min_scale": 1, "growth_interval": 3, "hysteresis": 2},
        {
            "initial_scale": 3.0,
            "min_scale": 1e-4,
            "growth_factor": 1.1,
            "backoff_factor": 0.3,
            "growth_interval": 1,
            "hysteresis": 1,
        },
        {"initial_scale": 2.0**127, "growth_interval": 1, "hysteresis": 3},
    ],
    "fairseq": [
        {"init_scale": 8, "scale_window": 3},
        {
            "init_scale": 4,
            "scale_window": 2,
            "tolerance": 0.25,
            "threshold": 0.5,
            "min_loss_scale": 0.1,
        },
        {"init_scale": 2, "scale_window": 2, "min_loss_scale": 0.5},
        {
            "init_scale": 4,
            "scale_factor": 3.0,
            "scale_window": 1,
            "tolerance": 0.5,
            "min_loss_scale": 0.01,
        },
    ],
    "paddle": [
        {"init_loss_scaling": 16, "incr_every_n_steps": 3, "decr_every_n_nan_or_inf": 2},
        {"init_loss_scaling": 3.0, "incr_ratio": 1.1, "decr_ratio": 0.3, "incr_every_n_steps": 1},
        {"init_loss_scaling": 8, "use_dynamic_loss_scaling": False},
        {"enable": False},
    ],
    "jmp": [
        {"loss_scale": 8.0, "period": 3},
        {"loss_scale": 4.0, "period": 1, "factor": 3, "min_loss_scale": 0.5},
        {"loss_scale": 8.0, "counter": 2, "period": 3},
        {"loss_scale": 2.0**127, "period": 1},
    ],
    "colossalai": [
        {"initial_scale": 16, "growth_interval": 3, "hysteresis": 2},
        {
            "initial_scale": 16,
            "min_scale": 2,
            "max_scale": 64,
            "growth_interval": 1,
            "hysteresis": 0,
        },
        {
            "initial_scale": 3.0,
            "growth_factor": 1.1,
            "backoff_factor": 0.3,
            "growth_interval": 2,
            "hysteresis": 1,
        },
    ],
    "chainer": [{"interval": 4}, {"interval": 1}, {"scale": 3.5}],
    "mxnet": [{"loss_scale": 4.0, "max_loss_scale": 16.0, "scale_seq_len": 2}, {}],
}


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or (
        a == b and math.copysign(1, a) == math.copysign(1, b)
    )


def sequences(seed):
    rng = np.random.default_rng(seed)
    yield [True] * 40
    yield [False] * 30
    yield [True, False] * 15
    yield [False, False, True, True, True, True] * 6
    for _ in range(6):
        yield event_sequence(rng, 60)


def drive(name, kwargs, events):
    """Run preset and model side by side; stop where fairseq's state stops being defined."""
    ls = lscore.preset(name, **kwargs)
    model = MODELS[name](**kwargs)
    assert same(ls(), model.scale), (name, kwargs, "initial")
    for i, finite in enumerate(events):
        ctx = (name, kwargs, i, events[: i + 1])
        try:
            expected = model.step(finite)
        except FloatingPointError:
            with pytest.raises(lscore.LossScaleFloorError):
                ls.state.update(finite)
            assert same(ls(), model.scale), ctx
            if name == "fairseq":
                return
            continue
        assert ls.state.update(finite) == expected, ctx
        assert same(ls(), model.scale), (ls(), model.scale, ctx)


@pytest.mark.parametrize("name", NAMES)
def test_preset_follows_peer_rule(name):
    for k, kwargs in enumerate(ARGS[name]):
        for events in sequences(1000 + k):
            drive(name, kwargs, events)


def test_every_preset_has_cases():
    assert set(ARGS) == set(NAMES) == set(MODELS)


# ---- the peers' own recorded runs (tests/core/data/record_*.py) ----------------------------


def recorded_cases():
    for path in sorted(DATA.glob("*.json")):
        data = json.loads(path.read_text())
        for i, case in enumerate(data["cases"]):
            yield pytest.param(data["preset"], case, id=f"{path.stem}-{i}")


@pytest.mark.parametrize("name,case", list(recorded_cases()))
def test_recorded_peer_sequence(name, case):
    ls = lscore.preset(name, **case["args"])
    for i, (finite, want) in enumerate(zip(case["events"], case["scales"], strict=True)):
        if want == "raise":
            with pytest.raises(lscore.LossScaleFloorError):
                ls.state.update(finite)
            continue
        ls.state.update(finite)
        assert ls() == want, (case["args"], i, case["events"][: i + 1], ls(), want)


def test_recorded_data_present():
    """The committed recordings cover the peers that install on a CPU machine."""
    got = {json.loads(p.read_text())["preset"] for p in DATA.glob("*.json")}
    assert {"torch", "jmp", "megatron", "deepspeed"} <= got


# ---- TF's and Keras's own published test vectors (research/tf_semantics.md §7) ---------

TF_VECTORS = [
    ("tf2", {"initial_loss_scale": 1, "increment_period": 2}, "TTTTTT", [1, 2, 2, 4, 4, 8]),
    ("tf2", {"initial_loss_scale": 16, "increment_period": 2}, "FFFFFF", [8, 4, 2, 1, 1, 1]),
    (
        "tf2",
        {"initial_loss_scale": 4, "increment_period": 2, "multiplier": 3},
        "TTFTT",
        [4, 12, 4, 4, 12],
    ),
    (
        "tf2",
        {"initial_loss_scale": 4, "increment_period": 2},
        "FTTTFTFTTTF",
        [2, 2, 4, 4, 2, 2, 1, 1, 2, 2, 1],
    ),
    (
        "tf1",
        {"init_loss_scale": 16, "incr_every_n_steps": 2, "decr_ratio": 0.5},
        "FFFFFFFFFF",
        [16, 8, 8, 4, 4, 2, 2, 1, 1, 1],
    ),
    (
        "tf1",
        {"init_loss_scale": 1, "incr_every_n_steps": 2, "decr_ratio": 0.5},
        "TTTFTF",
        [1, 2, 2, 2, 2, 1],
    ),
    (
        "tf1",
        {"init_loss_scale": 4, "incr_every_n_steps": 2, "decr_ratio": 0.5},
        "FFTTTFTFTTTF",
        [4, 2, 2, 4, 4, 4, 4, 2, 2, 4, 4, 4],
    ),
    ("keras3", {"initial_scale": 400}, "FFFF", [200, 100, 50, 25]),
    (
        "keras3",
        {"initial_scale": 2, "dynamic_growth_steps": 2},
        "TTTTTTTT",
        [2, 4, 4, 8, 8, 16, 16, 32],
    ),
]


@pytest.mark.parametrize("name,kwargs,events,scales", TF_VECTORS)
def test_tf_published_vectors(name, kwargs, events, scales):
    ls = lscore.preset(name, **kwargs)
    got = []
    for e in events:
        ls.state.update(e == "T")
        got.append(ls())
    assert got == scales


# ---- the public surface -------------------------------------------------------------


def test_unknown_name_lists_names():
    with pytest.raises(ValueError, match="unknown preset 'tf3'; expected one of: apex, "):
        lscore.preset("tf3")


def test_unknown_argument_names_it():
    with pytest.raises(TypeError, match="'scale_factor'"):
        lscore.preset("deepspeed", scale_factor=2.0)
    with pytest.raises(TypeError, match="'growth_factor'"):
        lscore.preset("keras3", growth_factor=2.0)


def test_missing_required_argument():
    with pytest.raises(TypeError, match="'loss_scale'"):
        lscore.preset("jmp")


@pytest.mark.parametrize(
    "name,kwargs,message",
    [
        ("torch", {"growth_factor": 1.0}, "growth_factor must be finite and > 1, got 1.0"),
        ("deepspeed", {"scale_window": 0}, "scale_window must be a positive integer"),
        (
            "megatron",
            {"min_scale": 8.0, "initial_scale": 4.0},
            "min_scale must be <= initial_scale",
        ),
        ("keras2", {"dynamic": False}, '"initial_scale" must be specified'),
        ("keras3", {"dynamic": False}, "no longer supports `dynamic=False`"),
        ("apex", {"loss_scale": "static"}, "loss_scale must be 'dynamic' or a number"),
    ],
)
def test_bad_arguments_name_the_peer_argument(name, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        lscore.preset(name, **kwargs)


def test_floor_error_is_floating_point_error():
    assert issubclass(lscore.LossScaleFloorError, FloatingPointError)
    ls = lscore.preset("deepspeed", init_scale=1.0, min_scale=1.0, delayed_shift=1)
    before = ls.state_dict()
    with pytest.raises(FloatingPointError):
        ls.update([np.array([np.inf])])
    assert ls.state_dict() == before


@pytest.mark.parametrize("name", NAMES)
def test_config_round_trip_and_docstring(name):
    kwargs = ARGS[name][0]
    ls = lscore.preset(name, **kwargs)
    cfg = ls.get_config()
    assert cfg["preset"] == name and all(cfg[k] == v for k, v in kwargs.items())
    for other in (type(ls).from_config(cfg), lscore.preset(**cfg)):
        assert type(other) is type(ls) and other.get_config() == cfg
        assert other.policy == ls.policy
    assert "::" in type(ls).__doc__ and name in type(ls).__doc__
    assert CLASSES[name] is type(ls)


@pytest.mark.parametrize("name", NAMES)
def test_state_v1_round_trip(name):
    kwargs = ARGS[name][0]
    ls = lscore.preset(name, **kwargs)
    for finite in [True, True, False, True, False, False, True] * 3:
        with contextlib.suppress(lscore.LossScaleFloorError):
            ls.state.update(finite)
    d = ls.state_dict()
    text = json.dumps(d, allow_nan=False)
    assert d["format"] == "lscore.state/1" and d["policy"]["name"] == name
    fresh = lscore.preset(name, **kwargs)  # loaded before its first use
    fresh.load_state_dict(json.loads(text))
    assert fresh.state_dict() == d
    rebuilt = lscore.presets.PresetLossScale.from_state_dict(json.loads(text))
    assert rebuilt.state_dict() == d and type(rebuilt) is type(ls)
    for clone in (copy.deepcopy(ls), pickle.loads(pickle.dumps(ls))):
        assert clone.state_dict() == d
    events = [True, False, True, True, True, False, True] * 4
    for e in events:
        for obj in (ls, fresh):
            with contextlib.suppress(lscore.LossScaleFloorError):
                obj.state.update(e)
    assert fresh.state_dict() == ls.state_dict()


def test_state_errors_name_the_problem():
    ls = lscore.preset("torch")
    d = ls.state_dict()
    with pytest.raises(ValueError, match=r"unknown keys .*'extra'"):
        ls.load_state_dict({**d, "extra": 1})
    with pytest.raises(ValueError, match=r"lscore.state/2.*understands: lscore.state/1"):
        ls.load_state_dict({**d, "format": "lscore.state/2"})
    with pytest.raises(ValueError, match="unknown counters: 'bogus'"):
        ls.load_state_dict({**d, "counters": {**d["counters"], "bogus": 1}})
    with pytest.raises(ValueError, match="different policy"):
        ls.load_state_dict(lscore.preset("megatron").state_dict())
    assert ls.state_dict() == d


def test_infinite_scale_is_json_safe():
    ls = lscore.preset("keras3", initial_scale=2.0**127, dynamic_growth_steps=1)
    ls.state.update(True)
    assert ls() == math.inf
    d = ls.state_dict()
    assert d["scale"] == "inf"
    other = lscore.preset("keras3", initial_scale=2.0**127, dynamic_growth_steps=1)
    other.load_state_dict(json.loads(json.dumps(d, allow_nan=False)))
    assert other() == math.inf
    apex = lscore.preset("apex", max_loss_scale=math.inf)
    assert (
        json.loads(json.dumps(apex.state_dict(), allow_nan=False))["policy"]["max_scale"] == "inf"
    )


@pytest.mark.parametrize(
    "obj",
    [
        lambda: lscore.DynamicLossScale(4, 2),
        lambda: lscore.FixedLossScale(8),
        lambda: lscore.ExponentialUpdateLossScaleManager(4, 2),
        lambda: lscore.FixedLossScaleManager(8),
    ],
    ids=["dynamic", "fixed", "tf1", "tf1_fixed"],
)
def test_state_v1_on_tf_shaped_objects(obj):
    a = obj()
    step = getattr(a, "update", None)
    for finite in [True, False, True, True, False]:
        if step is not None:
            a.update([np.array([1.0 if finite else np.nan])])
        else:
            a.update_loss_scale(finite)
    d = a.state_dict()
    b = obj()
    b.load_state_dict(json.loads(json.dumps(d, allow_nan=False)))
    assert b.state_dict() == d and d["counters"]["steps"] == 5
    assert "config" in d


def test_update_takes_gradients():
    ls = lscore.preset("torch", init_scale=8.0)
    assert ls.update([np.ones(3, np.float16), None]) == (None, True)
    assert ls.update({"w": np.array([1.0, np.nan])}) == (None, False)
    assert ls() == 4.0


def test_torch_is_nemo_without_hysteresis():
    """torch's policy is one definition: NeMo's GradScaler at hysteresis 1 is torch's, field
    for field, and its counters after an overflow are NeMo's tracker values."""
    torch, nemo = lscore.preset("torch", init_scale=8.0), lscore.preset("nemo", init_scale=8.0)
    assert torch.policy == nemo.policy.replace(name="torch")
    for finite in [True, False, True, False, False, True]:
        torch.state.update(finite)
        nemo.state.update(finite)
        assert torch.counters() == nemo.counters()
    assert torch.counters()["hysteresis_left"] == 1 and torch() == 1.0
