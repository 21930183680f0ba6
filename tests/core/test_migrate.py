"""lscore.migrate and `lscore migrate`: peer configs and states in, and back out."""

import json
import pathlib

import numpy as np
import pytest

import lscore
from helpers.gen import event_sequence
from helpers.peer_models import MODELS
from lscore import migrate
from lscore.cli import main as cli

DATA = pathlib.Path(__file__).parent / "data"


def continue_both(ls, model, events, ctx):
    for i, finite in enumerate(events):
        try:
            want = model.step(finite)
        except FloatingPointError:
            with pytest.raises(lscore.LossScaleFloorError):
                ls.state.update(finite)
            continue
        assert ls.state.update(finite) == want, (ctx, i)
        assert ls() == model.scale, (ctx, i, ls(), model.scale)


# The native state of each peer model, in the peer's own checkpoint format.
def torch_state(m):
    return {
        "scale": m.scale,
        "growth_factor": m.g,
        "backoff_factor": m.b,
        "growth_interval": m.n,
        "_growth_tracker": m.tracker,
    }


def deepspeed_state(m):
    return {
        "cur_scale": m.scale,
        "cur_iter": m.it,
        "last_overflow_iter": m.last,
        "scale_factor": 2.0,
        "scale_window": m.w,
        "cur_hysteresis": m.hyst,
    }


def megatron_state(m):
    return {"scale": m.scale, "growth_tracker": m.growth, "hysteresis_tracker": m.left}


RESUME = [
    ("torch", {"init_scale": 8.0, "growth_interval": 3}, None, torch_state),
    (
        "torch",
        {"init_scale": 3.0, "growth_factor": 1.1, "backoff_factor": 0.3, "growth_interval": 2},
        None,
        torch_state,
    ),
    (
        "deepspeed",
        {
            "init_scale": 64.0,
            "scale_window": 3,
            "min_scale": 1.0,
            "delayed_shift": 3,
            "consecutive_hysteresis": False,
            "raise_error_at_min_scale": True,
        },
        {
            "fp16": {
                "enabled": True,
                "initial_scale_power": 6,
                "loss_scale_window": 3,
                "hysteresis": 3,
                "min_loss_scale": 1,
                "raise_error_at_min_scale": True,
            }
        },
        deepspeed_state,
    ),
    # no raise_error_at_min_scale in the ds_config: DynamicLossScaler's default (True) applies
    (
        "deepspeed",
        {
            "init_scale": 16.0,
            "scale_window": 2,
            "min_scale": 0.5,
            "delayed_shift": 2,
            "consecutive_hysteresis": True,
            "raise_error_at_min_scale": True,
        },
        {
            "enabled": True,
            "initial_scale_power": 4,
            "loss_scale_window": 2,
            "hysteresis": 2,
            "min_loss_scale": 0.5,
            "consecutive_hysteresis": True,
        },
        deepspeed_state,
    ),
    (
        "megatron",
        {
            "initial_scale": 2.0**10,
            "min_scale": 1.0,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 3,
            "hysteresis": 2,
        },
        {
            "initial_loss_scale": 2.0**10,
            "min_loss_scale": 1.0,
            "loss_scale_window": 3,
            "hysteresis": 2,
        },
        megatron_state,
    ),
]


@pytest.mark.parametrize(
    "peer,args,config,native", RESUME, ids=[f"{r[0]}-{i}" for i, r in enumerate(RESUME)]
)
def test_resume_mid_run_follows_the_peer(peer, args, config, native):
    """Run the peer's rule, checkpoint it mid-run, resume in lscore: same sequence."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        events = event_sequence(rng, 90)
        cut = int(rng.integers(1, 80))
        model = MODELS[peer](**args)
        try:
            for e in events[:cut]:
                model.step(e)
        except FloatingPointError:
            continue
        ls = migrate.from_peer(
            peer, config=config if config is not None else args, state=native(model)
        )
        continue_both(ls, model, events[cut:], (peer, args, events, cut))


@pytest.mark.parametrize("peer", ["torch", "megatron", "deepspeed"])
def test_resume_recorded(peer):
    """The peer's own state_dict, saved mid-run by tests/core/data/record_<peer>.py."""
    data = json.loads((DATA / f"{peer}.json").read_text())
    assert data["resume"]
    for case in data["resume"]:
        ls = migrate.from_peer(peer, config=case["args"], state=case["state"])
        for i, (e, want) in enumerate(zip(case["events"], case["scales"], strict=True)):
            if want == "raise":
                with pytest.raises(lscore.LossScaleFloorError):
                    ls.state.update(e)
                continue
            ls.state.update(e)
            assert ls() == want, (case["args"], i)
        native = migrate.to_peer(peer, ls)
        last = [x for x in case["scales"] if x != "raise"][-1]
        assert native.get("scale", native.get("cur_scale")) == last


@pytest.mark.parametrize(
    "peer,state",
    [
        (
            "torch",
            {
                "scale": 1024.0,
                "growth_factor": 2.0,
                "backoff_factor": 0.5,
                "growth_interval": 100,
                "_growth_tracker": 17,
            },
        ),
        (
            "nemo",
            {
                "scale": 1024.0,
                "growth_factor": 2.0,
                "backoff_factor": 0.5,
                "growth_interval": 100,
                "_growth_tracker": 17,
                "_hysteresis_tracker": 2,
            },
        ),
        ("megatron", {"scale": 512.0, "growth_tracker": 3, "hysteresis_tracker": -2}),
        (
            "deepspeed",
            {
                "cur_scale": 256.0,
                "cur_iter": 40,
                "last_overflow_iter": 31,
                "cur_hysteresis": 1,
                "scale_factor": 2.0,
                "scale_window": 1000,
                "min_scale": 1.0,
                "delayed_shift": 2,
                "consecutive_hysteresis": False,
                "raise_error_at_min_scale": True,
                "dynamic": True,
            },
        ),
        ("apex", {"loss_scaler0": {"loss_scale": 4096.0, "unskipped": 12}}),
        (
            "paddle",
            {
                "scale": [2048.0],
                "incr_ratio": 2.0,
                "decr_ratio": 0.5,
                "incr_every_n_steps": 100,
                "decr_every_n_nan_or_inf": 2,
                "incr_count": 5,
                "decr_count": 1,
                "use_dynamic_loss_scaling": True,
            },
        ),
        (
            "jmp",
            {
                "loss_scale": 1024.0,
                "counter": 9,
                "period": 2000,
                "factor": 2,
                "min_loss_scale": 1.0,
            },
        ),
        ("keras2", {"current_loss_scale": 64.0, "good_steps": 3}),
        ("keras3", {"dynamic_scale": 64.0, "step_counter": 3}),
        ("tf2", {"current_loss_scale": 64.0, "good_steps": 3}),
        ("tf1", {"loss_scale": 64.0, "good_steps": 3, "bad_steps": 1}),
        ("fairseq", {"loss_scale": 128.0}),
    ],
)
def test_state_round_trip(peer, state):
    config = {"init_loss_scale": 1.0, "incr_every_n_steps": 10} if peer == "tf1" else None
    ls = migrate.from_peer(peer, config=config, state=state)
    assert migrate.to_peer(peer, ls) == state
    again = json.loads(json.dumps(ls.state_dict(), allow_nan=False))
    assert lscore.presets.PresetLossScale.from_state_dict(again).state_dict() == ls.state_dict()


def test_tensor_and_numpy_values_are_read():
    ls = migrate.from_peer(
        "megatron",
        state={
            "scale": np.array([512.0], np.float32),
            "growth_tracker": np.int64(3),
            "hysteresis_tracker": 2,
        },
    )
    assert ls() == 512.0 and ls.counters()["good_steps"] == 3


def test_config_conversions():
    ls = migrate.from_peer(
        "deepspeed",
        {
            "train_batch_size": 8,
            "fp16": {
                "enabled": True,
                "initial_scale_power": 12,
                "loss_scale_window": 500,
                "hysteresis": 4,
                "min_loss_scale": 2,
            },
        },
    )
    assert ls() == 4096.0 and ls.get_config()["delayed_shift"] == 4
    assert migrate.peer_config("deepspeed", ls)["fp16"]["initial_scale_power"] == 12
    k = migrate.from_peer(
        "keras2",
        {
            "inner_optimizer": {"class_name": "SGD"},
            "dynamic": True,
            "initial_scale": 1024.0,
            "dynamic_growth_steps": 10,
        },
    )
    assert k() == 1024.0 and k.policy.growth_interval == 10
    old = migrate.from_peer(
        "keras2",
        {
            "optimizer": {},
            "loss_scale": {
                "class_name": "DynamicLossScale",
                "config": {"initial_loss_scale": 8.0, "increment_period": 3, "multiplier": 2.0},
            },
        },
    )
    assert old() == 8.0 and old.policy.growth_interval == 3
    assert migrate.peer_config("torch", lscore.preset("nemo"))["init_scale"] == 65536.0
    assert migrate.to_peer("keras2", lscore.DynamicLossScale(8, 2)) == {
        "current_loss_scale": 8.0,
        "good_steps": 0,
    }


@pytest.mark.parametrize(
    "peer,config,state,message",
    [
        ("torch", None, {"scale": 1.0}, "missing: 'growth_factor'"),
        (
            "torch",
            None,
            {
                "scale": 1.0,
                "growth_factor": 2.0,
                "backoff_factor": 0.5,
                "growth_interval": 10,
                "_growth_tracker": 0,
                "bogus": 1,
            },
            "unknown keys in torch GradScaler state: 'bogus'",
        ),
        ("torch", None, {}, "empty"),
        (
            "deepspeed",
            {"fp16": {"enabled": True, "loss_scale_windw": 10}},
            None,
            "unknown keys in ds_config fp16 section: 'loss_scale_windw'",
        ),
        (
            "deepspeed",
            {"fp16": {"enabled": True, "loss_scale": -5}},
            None,
            r"fp16.loss_scale must be 0 \(dynamic scaling\) or a finite number > 0 "
            r"\(a static scale\), got -5",
        ),
        ("deepspeed", {"fp16": {"enabled": False}}, None, "not enabled"),
        (
            "apex",
            None,
            {
                "loss_scaler0": {"loss_scale": 1.0, "unskipped": 0},
                "loss_scaler1": {"loss_scale": 1.0, "unskipped": 0},
            },
            "2 loss scalers",
        ),
        ("caffe", None, None, "unknown peer 'caffe'"),
    ],
)
def test_errors_name_the_problem(peer, config, state, message):
    with pytest.raises((ValueError, TypeError), match=message):
        migrate.from_peer(peer, config=config, state=state)


def test_to_peer_refuses_a_policy_the_peer_cannot_hold():
    with pytest.raises(ValueError, match=r"cannot be held by torch; it differs in: .*hysteresis"):
        migrate.to_peer("torch", lscore.preset("megatron"))


# ---- the command line ------------------------------------------------------------------


def test_cli_from_deepspeed_config(tmp_path, capsys):
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(
        json.dumps({"fp16": {"enabled": True, "initial_scale_power": 10, "hysteresis": 2}})
    )
    assert cli(["migrate", "--from", "deepspeed", str(cfg)]) == 0
    out = capsys.readouterr().out
    config = json.loads(out.split("# lscore config\n")[1].split("\n#")[0])
    assert config["preset"] == "deepspeed" and config["init_scale"] == 1024.0
    snippet = out.split("# Python\n")[1]
    env = {}
    exec(snippet, env)
    assert env["loss_scale"].get_config() == config


def test_cli_reads_a_ds_config_without_an_fp16_section(tmp_path, capsys):
    """Its top-level keys are not fp16 keys: without an fp16 section DeepSpeed leaves fp16
    disabled and scales nothing, which the error says (it reported 'unknown keys in
    ds_config fp16 section: 'train_batch_size'')."""
    cfg = tmp_path / "ds_config.json"
    top = {"train_batch_size": 32, "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}}
    cfg.write_text(json.dumps(top))
    assert cli(["migrate", "--from", "deepspeed", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "fp16 section" in err and "no loss scaling" in err
    assert "train_batch_size" not in err and "unknown keys" not in err
    with pytest.raises(ValueError, match=r"has no fp16 section, so DeepSpeed leaves fp16"):
        migrate.from_peer("deepspeed", config=top)
    # with the section beside the top-level keys, only the section's keys are checked
    cfg.write_text(json.dumps({**top, "fp16": {"enabled": True, "initial_scale_power": 8}}))
    assert cli(["migrate", "--from", "deepspeed", str(cfg)]) == 0
    assert '"init_scale": 256.0' in capsys.readouterr().out


def test_cli_state_and_back(tmp_path, capsys):
    state = tmp_path / "scaler.json"
    state.write_text(
        json.dumps(
            {
                "scale": 512.0,
                "growth_factor": 2.0,
                "backoff_factor": 0.5,
                "growth_interval": 100,
                "_growth_tracker": 4,
            }
        )
    )
    out_file = tmp_path / "lscore_state.json"
    assert cli(["migrate", "--from", "torch", "--state", str(state), "--out", str(out_file)]) == 0
    v1 = json.loads(out_file.read_text())
    assert v1["format"] == "lscore.state/1" and v1["scale"] == 512.0
    capsys.readouterr()
    assert cli(["migrate", "--to", "nemo", str(out_file)]) == 0
    back = json.loads(capsys.readouterr().out.split("# nemo state\n")[1].split("\n#")[0])
    assert back["_growth_tracker"] == 4 and back["scale"] == 512.0


def test_cli_errors_are_clear(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"fp16": {"enabled": True, "hysterisis": 2}}))
    assert cli(["migrate", "--from", "deepspeed", str(bad)]) == 2
    assert "unknown keys in ds_config fp16 section: 'hysterisis'" in capsys.readouterr().err
    notjson = tmp_path / "x.bin"
    notjson.write_bytes(b"\x00\x01garbage")
    assert cli(["migrate", "--from", "torch", "--state", str(notjson)]) == 2
    assert "x.bin" in capsys.readouterr().err


# ---- issue 17, items 8-12: migrating real configs and checkpoints -------------------------


def _events(seed, n=80):
    return event_sequence(np.random.default_rng(seed), n)


def test_deepspeed_raise_error_at_min_scale_takes_deepspeeds_default():
    """A ds_config never carries raise_error_at_min_scale, so DeepSpeed raises at the minimum.

    deepspeedai/DeepSpeed deepspeed/runtime/precision_config.py: DeepSpeedFP16Config has no
    such field and dynamic_loss_scale_args() passes init_scale, scale_window, delayed_shift,
    consecutive_hysteresis and min_scale only; deepspeed/runtime/fp16/loss_scaler.py:
    CreateLossScaler -> DynamicLossScaler(raise_error_at_min_scale=True by default), which
    raises "Current loss scale already at minimum" (checked in every tag v0.9.0 .. v0.19.5).
    """
    ls = migrate.from_peer(
        "deepspeed",
        {
            "fp16": {
                "enabled": True,
                "initial_scale_power": 1,
                "hysteresis": 1,
                "loss_scale_window": 5,
            }
        },
    )
    assert ls.args["raise_error_at_min_scale"] is True
    dynamic_args = {k: v for k, v in ls.args.items() if k != "loss_scale"}
    model = MODELS["deepspeed"](**dynamic_args)
    continue_both(ls, model, [False] * 4, "deepspeed to the minimum")
    with pytest.raises(lscore.LossScaleFloorError):
        ls.state.update(False)


# The Hugging Face Trainer's ds_config template (transformers docs, main_classes/deepspeed):
# "auto" values are filled by HfTrainerDeepSpeedConfig.trainer_config_process
# (transformers/integrations/deepspeed.py: fill_match("fp16.enabled", args.fp16 ...));
# DeepSpeedConfigModel.__init__ (deepspeed/runtime/config_utils.py) drops any "auto" left.
HF_DS_CONFIG = {
    "fp16": {
        "enabled": "auto",
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": "auto"},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def test_deepspeed_hf_auto_config_takes_deepspeeds_defaults_and_says_so(tmp_path, capsys):
    m = migrate.convert("deepspeed", HF_DS_CONFIG)
    assert m.loss_scale.args == {
        "init_scale": 65536.0,
        "scale_window": 1000,
        "min_scale": 1,
        "delayed_shift": 2,
        "consecutive_hysteresis": False,
        "raise_error_at_min_scale": True,
        "loss_scale": 0.0,
    }
    assert any('fp16.enabled is "auto"' in n for n in m.notes)
    auto = {
        **HF_DS_CONFIG,
        "fp16": {
            "enabled": True,
            "loss_scale": "auto",
            "loss_scale_window": "auto",
            "hysteresis": "auto",
        },
    }
    with pytest.warns(migrate.MigrationNote, match="fp16.loss_scale_window=1000") as w:
        ls = migrate.from_peer("deepspeed", auto)
    assert "fp16.hysteresis=2" in str(w[0].message) and "fp16.loss_scale=0" in str(w[0].message)
    assert ls.args["scale_window"] == 1000 and ls.args["delayed_shift"] == 2
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(json.dumps(HF_DS_CONFIG))
    assert cli(["migrate", "--from", "deepspeed", str(cfg)]) == 0
    assert '# note: fp16.enabled is "auto"' in capsys.readouterr().out


@pytest.mark.parametrize(
    "config",
    [
        {"bf16": {"enabled": True}},
        {"fp16": {"enabled": "auto"}, "bf16": {"enabled": True}},
        {"bfloat16": {"enabled": True}, "fp16": {"enabled": False}},
    ],
)
def test_deepspeed_bf16_config_says_bf16_needs_no_loss_scaling(config):
    with pytest.raises(ValueError, match="bf16 needs no loss scaling"):
        migrate.from_peer("deepspeed", config)


# DeepSpeedFP16Config's fields (deepspeed/runtime/precision_config.py, model_config
# extra="forbid" in config_utils.DeepSpeedConfigModel): any other key fails validation.
DS_FP16_SCHEMA = {
    "enabled",
    "auto_cast",
    "loss_scale",
    "initial_scale_power",
    "loss_scale_window",
    "hysteresis",
    "consecutive_hysteresis",
    "min_loss_scale",
    "fp16_master_weights_and_grads",
}


def test_to_deepspeed_writes_only_keys_deepspeeds_fp16_schema_accepts(tmp_path, capsys):
    ls = lscore.preset(
        "deepspeed", init_scale=2.0**12, scale_window=500, min_scale=2, delayed_shift=3
    )
    section = migrate.peer_config("deepspeed", ls)["fp16"]
    assert set(section) <= DS_FP16_SCHEMA
    assert isinstance(section["min_loss_scale"], int)  # an int field in DeepSpeed
    assert migrate.from_peer("deepspeed", {"fp16": section}).args == ls.args
    for bad, message in [
        (dict(raise_error_at_min_scale=False), "raise_error_at_min_scale"),
        (dict(min_scale=0.5), "min_scale must be an integer"),
    ]:
        other = lscore.preset("deepspeed", **{**ls.args, **bad})
        with pytest.raises(ValueError, match=message):
            migrate.peer_config("deepspeed", other)
    f = tmp_path / "ls.json"
    f.write_text(json.dumps(ls.get_config()))
    assert cli(["migrate", "--to", "deepspeed", str(f)]) == 0
    out = capsys.readouterr().out
    printed = json.loads(out.split("# deepspeed config\n")[1].split("\n#")[0])
    assert set(printed["fp16"]) <= DS_FP16_SCHEMA


def test_deepspeed_fp16_optimizer_state_follows_its_update():
    """DeepSpeed's FP16_Optimizer (fp16 without ZeRO) saves every key below and updates
    the scale without hysteresis and without raising at the minimum.

    deepspeed/runtime/fp16/fused_optimizer.py: state_dict() writes dynamic_loss_scale,
    cur_scale, cur_iter, last_overflow_iter, scale_factor, scale_window,
    optimizer_state_dict, fp32_groups_flat, clip_grad (unfused_optimizer.py: fp32_groups);
    _update_scale: overflow -> max(scale / 2, min_loss_scale), last_overflow_iter = cur_iter;
    else grow x2 when (cur_iter - last_overflow_iter - 1) > 0 and a multiple of the window.
    The model below is that rule; DeepSpeed's DynamicLossScaler with delayed_shift=1 and
    raise_error_at_min_scale=False is the same rule.
    """
    model = MODELS["deepspeed"](
        init_scale=16.0,
        scale_window=3,
        min_scale=1.0,
        delayed_shift=1,
        raise_error_at_min_scale=False,
    )
    events = _events(11)
    for e in events[:30]:
        model.step(e)
    state = {
        "dynamic_loss_scale": True,
        "cur_scale": model.scale,
        "cur_iter": model.it,
        "last_overflow_iter": model.last,
        "scale_factor": 2.0,
        "scale_window": 3,
        "optimizer_state_dict": {"state": {}, "param_groups": []},
        "fp32_groups_flat": [],
        "clip_grad": 1.0,
    }
    config = {
        "fp16": {
            "enabled": True,
            "initial_scale_power": 4,
            "loss_scale_window": 3,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    }
    m = migrate.convert(
        "deepspeed", config, {"module": {}, "optimizer": state, "ds_version": "0.19.8"}
    )
    assert m.state_at == "checkpoint['optimizer']"
    assert any("FP16_Optimizer" in n for n in m.notes)
    continue_both(m.loss_scale, model, events[30:], "FP16_Optimizer")


class _FakeModules:
    """Classes living in modules that are not installed, for torch.save to pickle."""

    def __init__(self, *names):
        import sys
        import types

        self.sys, self.names = sys, []
        for name in names:
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                mod = ".".join(parts[:i])
                if mod not in sys.modules:
                    sys.modules[mod] = types.ModuleType(mod)
                    self.names.append(mod)

    def put(self, cls, module):
        cls.__module__, cls.__qualname__ = module, cls.__name__
        setattr(self.sys.modules[module], cls.__name__, cls)
        return cls

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for name in self.names:
            del self.sys.modules[name]


def _cli_migrate(peer, path, tmp_path, capsys):
    """`lscore migrate --from peer --state path --out ...`: (stdout, the lscore object)."""
    out_file = tmp_path / "lscore.json"
    assert cli(["migrate", "--from", peer, "--state", str(path), "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    return out, lscore.presets.PresetLossScale.from_state_dict(json.loads(out_file.read_text()))


def test_deepspeed_zero_checkpoint_with_its_pickled_scaler(tmp_path, capsys):
    """A ZeRO run's *_optim_states.pt, read with torch.load(weights_only=True).

    deepspeed/runtime/engine.py _save_zero_checkpoint: {"optimizer_state_dict":
    optimizer.state_dict(), "ds_config", "ds_version"}; zero/stage_1_and_2.py state_dict():
    loss_scaler (the DynamicLossScaler object itself), dynamic_loss_scale, overflow,
    clip_grad, base_optimizer_state, single_partition_of_fp32_groups, zero_stage,
    group_paddings, partition_count, ds_version, param_slice_mappings.  The scaler's
    attributes are DynamicLossScaler.__init__'s (fp16/loss_scaler.py), every one here.
    """
    torch = pytest.importorskip("torch")
    args = {
        "init_scale": 2.0**40,
        "scale_window": 3,
        "min_scale": 1.0,
        "delayed_shift": 2,
        "consecutive_hysteresis": False,
        "raise_error_at_min_scale": True,
    }
    model = MODELS["deepspeed"](**args)
    events = _events(12)
    for e in events[:25]:
        model.step(e)
    with _FakeModules("deepspeed.runtime.fp16.loss_scaler") as fake:

        class DynamicLossScaler:
            pass

        fake.put(DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler")
        scaler = DynamicLossScaler()
        scaler.__dict__.update(
            cur_scale=model.scale,
            dynamic=True,
            cur_iter=model.it,
            last_overflow_iter=model.last,
            scale_factor=2.0,
            scale_window=3,
            min_scale=1.0,
            delayed_shift=2,
            cur_hysteresis=model.hyst,
            consecutive_hysteresis=False,
            raise_error_at_min_scale=True,
            dtype=torch.float16,
        )
        zero = {
            "loss_scaler": scaler,
            "dynamic_loss_scale": True,
            "overflow": False,
            "clip_grad": 1.0,
            "base_optimizer_state": {"state": {}, "param_groups": []},
            "single_partition_of_fp32_groups": [torch.zeros(4)],
            "zero_stage": 2,
            "group_paddings": [0],
            "partition_count": [1],
            "ds_version": "0.19.8",
            "param_slice_mappings": [{}],
        }
        path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
        torch.save(
            {
                "optimizer_state_dict": zero,
                "ds_version": "0.19.8",
                "ds_config": {
                    "train_batch_size": 8,
                    "fp16": {
                        "enabled": True,
                        "initial_scale_power": 40,
                        "loss_scale_window": 3,
                        "hysteresis": 2,
                        "min_loss_scale": 1,
                    },
                },
            },
            path,
        )
    out, ls = _cli_migrate("deepspeed", path, tmp_path, capsys)
    assert "checkpoint['optimizer_state_dict']['loss_scaler']" in out
    assert "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler were read as plain data" in out
    continue_both(ls, model, events[25:], "ZeRO checkpoint")


def test_deepspeed_model_states_file_of_a_zero_run_points_to_the_optim_states():
    with pytest.raises(ValueError, match="optim_states"):
        migrate.from_peer(
            "deepspeed", state={"module": {}, "optimizer": None, "ds_version": "0.19.8"}
        )


# ---- NeMo ---------------------------------------------------------------------------------

# NVIDIA/NeMo examples/nlp/language_modeling/conf/megatron_gpt_config.yaml (an excerpt):
# the model section's loss-scale keys among many others; the builder
# (nemo/collections/nlp/parts/megatron_trainer_builder.py, _grad_scaler and _plugins) makes
# GradScaler(init_scale=native_amp_init_scale, growth_interval=native_amp_growth_interval,
# hysteresis=hysteresis) only for trainer.precision 16 / "16" / "16-mixed".
NEMO_CONFIG = {
    "trainer": {"devices": 1, "num_nodes": 1, "precision": 16, "max_steps": 100000},
    "model": {
        "micro_batch_size": 4,
        "global_batch_size": 8,
        "native_amp_init_scale": 2**32,
        "native_amp_growth_interval": 1000,
        "hysteresis": 2,
        "fp32_residual_connection": False,
        "fp16_lm_cross_entropy": False,
        "megatron_amp_O2": True,
    },
}


def test_nemo_config_names_are_read():
    ls = migrate.from_peer("nemo", NEMO_CONFIG)
    assert ls.args["init_scale"] == 2.0**32 and ls.args["growth_interval"] == 1000
    assert ls.args["hysteresis"] == 2
    assert migrate.from_peer("nemo", NEMO_CONFIG["model"]).args == ls.args
    m = migrate.convert(
        "nemo", {"trainer": {"precision": "16-mixed"}, "model": {"native_amp_init_scale": 1024}}
    )
    assert m.loss_scale.args["growth_interval"] == 1000 and m.loss_scale.args["hysteresis"] == 2
    assert any("model.native_amp_growth_interval=1000" in n for n in m.notes)
    with pytest.raises(ValueError, match="bf16 needs no loss scaling"):
        migrate.from_peer("nemo", {**NEMO_CONFIG, "trainer": {"precision": "bf16"}})


def test_nemo_hysteresis_zero_backs_off_on_every_overflow_and_keeps_nemos_tracker():
    """NeMo's GradScaler(hysteresis=0): the tracker starts at 0, each overflow takes it to
    <= 0, so every overflow backs off (nlp_overrides.py GradScaler.update, Python branch);
    each clean step refills it to 0.  The state keeps NeMo's tracker values."""
    args = {"init_scale": 64.0, "growth_interval": 2, "hysteresis": 0}
    ls = migrate.from_peer("nemo", args)
    model = MODELS["nemo"](**args)
    events = _events(13)
    continue_both(ls, model, events[:40], "nemo hysteresis=0")
    native = migrate.to_peer("nemo", ls)
    assert native["_hysteresis_tracker"] == model.left
    again = migrate.from_peer("nemo", args, native)
    continue_both(again, model, events[40:], "nemo hysteresis=0 resumed")


# ---- fairseq ------------------------------------------------------------------------------


# facebookresearch/fairseq fairseq/dataclass/configs.py CommonConfig: fp16_init_scale 2**7,
# fp16_scale_window None, fp16_scale_tolerance 0.0, min_loss_scale 1e-4,
# threshold_loss_scale None; fairseq/optim/fp16_optimizer.py builds
# DynamicLossScaler(init_scale=fp16_init_scale, scale_window=..., tolerance=
# fp16_scale_tolerance, threshold=threshold_loss_scale, min_loss_scale=min_loss_scale),
# a window of None being int(2**14 / data-parallel size / update_freq[0]).
def test_fairseq_option_names_are_read():
    opts = {
        "fp16": True,
        "fp16_init_scale": 8,
        "fp16_scale_window": 3,
        "fp16_scale_tolerance": 0.25,
        "min_loss_scale": 0.01,
        "threshold_loss_scale": 0.5,
    }
    ls = migrate.from_peer("fairseq", opts)
    want = {
        "init_scale": 8,
        "scale_window": 3,
        "tolerance": 0.25,
        "min_loss_scale": 0.01,
        "threshold": 0.5,
    }
    assert {k: ls.args[k] for k in want} == want
    dashed = {"--" + k.replace("_", "-"): v for k, v in opts.items()}
    assert migrate.from_peer("fairseq", dashed).args == ls.args
    model = MODELS["fairseq"](**want)
    continue_both(ls, model, _events(14), "fairseq options")
    cfg = {
        "common": {"fp16": True, "fp16_init_scale": 128, "log_interval": 100, "seed": 1},
        "optimization": {"update_freq": [2], "lr": [0.25]},
        "distributed_training": {"distributed_world_size": 8},
    }
    m = migrate.convert("fairseq", cfg)
    assert m.loss_scale.args["scale_window"] == 2**14 // 8 // 2
    assert any("scale_window" in n for n in m.notes)
    with pytest.raises(ValueError, match="bf16 needs no loss scaling"):
        migrate.from_peer("fairseq", {"common": {"bf16": True}})
    with pytest.raises(ValueError, match="unknown keys in fairseq config: 'fp16_init_scal'"):
        migrate.from_peer("fairseq", {"fp16_init_scal": 128})


def test_fairseq_whole_checkpoint():
    """fairseq/trainer.py state_dict(): "args", "cfg", "model", "criterion",
    "optimizer_history", "task_state", "extra_state", "last_optimizer_state" (the
    FP16Optimizer's state_dict, with "loss_scale")."""
    ckpt = {
        "args": None,
        "cfg": {
            "common": {"fp16": True, "fp16_scale_window": 64},
            "optimization": {"update_freq": [1]},
        },
        "model": {},
        "criterion": {},
        "optimizer_history": [],
        "task_state": {},
        "extra_state": {},
        "last_optimizer_state": {"state": {}, "param_groups": [], "loss_scale": 32.0},
    }
    m = migrate.convert("fairseq", state=ckpt)
    assert m.state_at == "checkpoint['last_optimizer_state']"
    assert m.config_at == "checkpoint['cfg']" and m.loss_scale.args["scale_window"] == 64
    assert m.loss_scale() == 32.0


# ---- whole checkpoints --------------------------------------------------------------------


def _steps_of_torch_scaler(torch, scaler, events):
    """Drive a real torch.amp.GradScaler("cpu") through `events` (False: an inf gradient)."""
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.0)
    scales = []
    for finite in events:
        opt.zero_grad()
        scaler.scale((w * (1.0 if finite else float("inf"))).sum()).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return opt


def test_plain_torch_checkpoint_resumes_as_torch_does(tmp_path, capsys):
    """torchvision's references/classification/train.py saves {"model", "optimizer",
    "lr_scheduler", "epoch", "args", "scaler": scaler.state_dict()}; the scaler here is
    torch's own, run on the CPU, and its continuation is compared with lscore's."""
    torch = pytest.importorskip("torch")
    events = _events(21, 60)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    opt = _steps_of_torch_scaler(torch, scaler, events[:30])
    path = tmp_path / "checkpoint.pth"
    torch.save(
        {
            "model": {"w": torch.ones(2)},
            "optimizer": opt.state_dict(),
            "lr_scheduler": {},
            "epoch": 3,
            "scaler": scaler.state_dict(),
        },
        path,
    )
    out, ls = _cli_migrate("torch", path, tmp_path, capsys)
    assert "checkpoint['scaler']" in out
    for finite in events[30:]:
        _steps_of_torch_scaler(torch, scaler, [finite])
        ls.state.update(finite)
        assert ls() == scaler.get_scale()


@pytest.mark.parametrize(
    "tool,place", [("lightning", "checkpoint['MixedPrecision']"), ("accelerate", None)]
)
def test_recorded_lightning_and_accelerate_checkpoints(tool, place):
    """Files saved by Lightning 2.6 (Trainer.save_checkpoint, the MixedPrecision plugin's
    state under its class name) and accelerate 1.15 (save_state's scaler.pt) in fp16 on the
    CPU; tests/core/data/record_checkpoints.py made them."""
    pytest.importorskip("torch")
    from lscore.cli.migrate_cmd import load_checkpoint

    folder = DATA / "checkpoints"
    record = json.loads((folder / "checkpoints.json").read_text())[tool]
    data, _inert = load_checkpoint(str(folder / record["file"]))
    m = migrate.convert("torch", state=data)
    assert m.state_at == place
    assert migrate.to_peer("torch", m.loss_scale) == record["scaler"]


def _megatron_checkpoint(torch, fake, grad_scaler, bf16=False):
    """megatron/training/checkpointing.py's state_dict: args (an argparse.Namespace holding
    enums such as megatron.core.transformer.enums.AttnBackend), checkpoint_version,
    iteration, model, optimizer (optimizer.py state_dict(): "optimizer", "grad_scaler",
    "fp32_from_fp16_params"), opt_param_scheduler, rng_state."""
    import argparse
    import enum

    class AttnBackend(enum.Enum):
        flash = 1
        auto = 5

    fake.put(AttnBackend, "megatron.core.transformer.enums")
    args = argparse.Namespace(
        fp16=not bf16,
        bf16=bf16,
        loss_scale=None,
        initial_loss_scale=2.0**32,
        min_loss_scale=1.0,
        loss_scale_window=3,
        hysteresis=2,
        lr=1e-4,
        attention_backend=AttnBackend.auto,
        params_dtype=torch.float16,
    )
    optimizer = {
        "optimizer": {"state": {}, "param_groups": [{"lr": 1e-4, "params": [0]}]},
        "fp32_from_fp16_params": [[torch.ones(2)]],
    }
    if grad_scaler is not None:
        optimizer["grad_scaler"] = grad_scaler
    return {
        "args": args,
        "checkpoint_version": 3.0,
        "iteration": 40,
        "model": {"weight": torch.ones(2)},
        "optimizer": optimizer,
        "opt_param_scheduler": {"max_lr": 1e-4},
        "rng_state": [{"random_rng_state": 1}],
    }


def test_megatron_checkpoint_finds_grad_scaler_and_args(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    model = MODELS["megatron"](
        initial_scale=2.0**32, min_scale=1.0, growth_interval=3, hysteresis=2
    )
    events = _events(22, 90)
    for e in events[:40]:
        model.step(e)
    path = tmp_path / "model_optim_rng.pt"
    with _FakeModules("megatron.core.transformer.enums") as fake:
        torch.save(
            _megatron_checkpoint(
                torch,
                fake,
                {
                    "scale": torch.tensor([model.scale]),
                    "growth_tracker": model.growth,
                    "hysteresis_tracker": model.left,
                },
            ),
            path,
        )
    out, ls = _cli_migrate("megatron", path, tmp_path, capsys)
    assert "checkpoint['optimizer']['grad_scaler']" in out
    assert "the megatron config was read from checkpoint['args']" in out
    assert ls.args["growth_interval"] == 3
    continue_both(ls, model, events[40:], "megatron checkpoint")
    bf16 = tmp_path / "bf16.pt"
    with _FakeModules("megatron.core.transformer.enums") as fake:
        torch.save(_megatron_checkpoint(torch, fake, None, bf16=True), bf16)
    assert cli(["migrate", "--from", "megatron", "--state", str(bf16)]) == 2
    assert "has no 'grad_scaler'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "peer,looked_for",
    [
        (
            "torch",
            [
                "checkpoint['scaler']",
                "checkpoint['MixedPrecision']",
                "checkpoint['native_amp_scaling_state']",
            ],
        ),
        (
            "nemo",
            [
                "checkpoint['PipelineMixedPrecisionPlugin']",
                "checkpoint['MegatronHalfPrecisionPlugin']",
            ],
        ),
        ("megatron", ["checkpoint['optimizer']['grad_scaler']"]),
        ("deepspeed", ["checkpoint['optimizer']", "checkpoint['optimizer_state_dict']"]),
        ("apex", ["checkpoint['amp']"]),
        ("fairseq", ["checkpoint['last_optimizer_state']"]),
    ],
)
def test_checkpoint_without_scaler_lists_where_it_looked(peer, looked_for):
    ckpt = {"model": {}, "epoch": 3}
    with pytest.raises(ValueError, match=r"found no .* in this checkpoint; looked for") as e:
        migrate.from_peer(peer, state=ckpt)
    for place in looked_for:
        assert place in str(e.value)
    assert "'epoch', 'model'" in str(e.value)


# ---- every preset is a peer ---------------------------------------------------------------

PEER_CASES = {
    "colossalai": (
        {"initial_scale": 16, "growth_interval": 2, "hysteresis": 2},
        {"scale": 64.0, "growth_factor": 2, "backoff_factor": 0.5, "hysteresis": 3},
    ),
    "chainer": ({"interval": 4}, {"_loss_scale": 8.0, "_loss_scaling_isnan_ever": True}),
    "mxnet": (
        {"scale_seq_len": 3},
        {
            "_loss_scale": 8.0,
            "_next_loss_scale": 16.0,
            "_max_loss_scale": 2.0**24,
            "_scale_seq_len": 3,
            "_unskipped": 0,
        },
    ),
    "apex_fp16_utils": (
        {"init_scale": 8, "scale_window": 3},
        {
            "cur_scale": 32.0,
            "cur_iter": 9,
            "last_overflow_iter": 4,
            "scale_factor": 2.0,
            "scale_window": 3,
        },
    ),
}


@pytest.mark.parametrize("name", lscore.presets.NAMES)
def test_every_preset_name_is_accepted_by_every_peer_entry_point(name, tmp_path, capsys):
    assert name in migrate.PEERS
    args = (
        {"loss_scale": 8.0}
        if name == "jmp"
        else {"init_loss_scale": 8.0, "incr_every_n_steps": 3}
        if name == "tf1"
        else {}
    )
    ls = migrate.from_peer(name, args or None)
    assert ls.name == name
    native = migrate.to_peer(name, ls)
    config = migrate.peer_config(name, ls)
    assert isinstance(native, dict) and isinstance(config, dict)
    f = tmp_path / "ls.json"
    f.write_text(json.dumps(ls.state_dict()))
    assert cli(["migrate", "--to", name, str(f)]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("name", sorted(PEER_CASES))
def test_new_peers_state_round_trip_and_continue(name):
    """colossalai: DynamicGradScaler.state_dict() (scale, growth_factor, backoff_factor,
    hysteresis; colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py); chainer: the
    optimizer's _loss_scale/_loss_scaling_isnan_ever (chainer/optimizer.py saves none);
    mxnet: LossScaler's attributes (python/mxnet/amp/loss_scaler.py); apex fp16_utils:
    DynamicLossScaler's attributes (apex/fp16_utils/loss_scaler.py)."""
    config, state = PEER_CASES[name]
    ls = migrate.from_peer(name, config, state)
    assert migrate.to_peer(name, ls) == state
    model = MODELS[name](**ls.args)
    model.scale = ls()
    for attr, value in {
        "colossalai": {},
        "chainer": {"ever": True},
        "mxnet": {"next": 16.0},
        "apex_fp16_utils": {"it": 9, "last": 4},
    }[name].items():
        setattr(model, attr, value)
    continue_both(ls, model, _events(23, 40), name)


# ---- DeepSpeed's static scale, bad values, and files that hold no object -------------------


def test_deepspeed_static_loss_scale_converts_to_a_fixed_scale_that_skips_overflows():
    """fp16.loss_scale > 0 selects DeepSpeed's LossScaler: the scale never changes, and
    FP16_Optimizer and ZeRO still check every step and skip one that overflowed."""
    ls = migrate.from_peer("deepspeed", {"fp16": {"enabled": True, "loss_scale": 128}})
    assert ls() == 128.0
    for finite in (False, True, False, True, True):
        _, applied = ls.update([1.0 if finite else float("inf")])
        assert applied is finite and ls() == 128.0
    assert ls.counters()["skipped"] == 2
    assert migrate.to_peer("deepspeed", ls) == {"cur_scale": 128.0, "dynamic": False}
    assert migrate.peer_config("deepspeed", ls) == {"fp16": {"enabled": True, "loss_scale": 128.0}}


@pytest.mark.parametrize(
    "state",
    [
        {"cur_scale": 64.0, "dynamic": False},  # ZeRO's pickled LossScaler
        {"cur_scale": 64.0, "dynamic_loss_scale": False, "cur_iter": 9, "optimizer_state_dict": {}},
    ],
    ids=["LossScaler", "FP16_Optimizer"],
)
def test_deepspeed_static_scaler_state_converts(state):
    ls = migrate.from_peer("deepspeed", state=state)
    assert ls() == 64.0 and ls.args["loss_scale"] == 64.0
    ls.update([float("inf")])
    assert ls() == 64.0


def test_deepspeed_loss_scale_0_is_dynamic_and_half_a_static_scale():
    """DeepSpeedFP16Config: 0 means dynamic scaling; any finite value > 0 is a static scale,
    0.5 included (FixedLossScale's TF rule, >= 1, is not DeepSpeed's)."""
    dynamic = migrate.from_peer("deepspeed", {"fp16": {"enabled": True, "loss_scale": 0}})
    assert dynamic() == 65536.0 and dynamic.policy.growth_mode == "modulo"
    half = migrate.from_peer("deepspeed", {"fp16": {"enabled": True, "loss_scale": 0.5}})
    assert half() == 0.5 and half.policy.growth_mode == "never"


@pytest.mark.parametrize(
    "value,error",
    [
        (-5, ValueError),
        (-0.5, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        ("abc", TypeError),
        (True, TypeError),
        (None, TypeError),
        ([128], TypeError),
    ],
    ids=repr,
)
def test_deepspeed_bad_loss_scale_is_refused_with_the_rule(value, error):
    """Each message states what DeepSpeed accepts, never an lscore call that would raise."""
    with pytest.raises(error, match=r"^fp16\.loss_scale must be ") as e:
        migrate.from_peer("deepspeed", {"fp16": {"enabled": True, "loss_scale": value}})
    assert "FixedLossScale" not in str(e.value)


def test_cli_converts_a_static_ds_config(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"fp16": {"enabled": True, "loss_scale": 128}}))
    assert cli(["migrate", "--from", "deepspeed", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["loss_scale"] == 128.0


@pytest.mark.parametrize(
    "text,kind",
    [("null", "null"), ("[1, 2]", "array"), ('"fp16"', "string"), ("3", "number")],
)
@pytest.mark.parametrize("where", ["config", "state"])
def test_cli_refuses_a_file_that_holds_no_json_object(tmp_path, capsys, text, kind, where):
    path = tmp_path / "in.json"
    path.write_text(text)
    argv = ["migrate", "--from", "deepspeed"]
    argv += [str(path)] if where == "config" else ["--state", str(path)]
    assert cli(argv) == 2
    got = capsys.readouterr()
    assert got.out == ""
    assert got.err == f"lscore migrate: error: {path} holds a JSON {kind}; expected a JSON object\n"


def test_cli_to_peer_takes_the_lscore_state_as_file_or_state(tmp_path, capsys):
    ls = lscore.preset("deepspeed", init_scale=2.0**10)
    ls.update([float("inf")])
    ls.update([float("inf")])
    path = tmp_path / "lscore_state.json"
    path.write_text(json.dumps(ls.state_dict()))
    outs = []
    for argv in (["--state", str(path)], [str(path)]):
        assert cli(["migrate", "--to", "deepspeed", *argv, "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1] and outs[0]["state"]["cur_scale"] == 512.0
    config = tmp_path / "config.json"
    config.write_text(json.dumps(ls.get_config()))
    for argv, message in (
        ([str(path), "--state", str(path)], "--to needs one FILE"),
        (["--state", str(config)], "is not an lscore state"),
    ):
        assert cli(["migrate", "--to", "deepspeed", *argv]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("peer", ["torch", "mxnet"])
@pytest.mark.parametrize("value", [float("nan"), float("-inf"), float("inf")], ids=str)
def test_a_non_finite_migrated_scale_survives_or_is_refused_by_name(monkeypatch, peer, value):
    # Every peer reader refuses NaN and -inf itself (read_scale); what reaches the v1 state
    # past a reader must still be encoded as it is, never as "inf": NaN stays loadable,
    # -inf is refused naming it.
    reader = type(migrate._peer(peer))
    monkeypatch.setattr(reader, "load", lambda self, state, args, notes: migrate.Loaded(value))
    if value == float("-inf"):
        with pytest.raises(ValueError, match="got '-inf'"):
            migrate.convert(peer, state={})
        return
    ls = migrate.convert(peer, state={}).loss_scale
    d = ls.state_dict()
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert np.isnan(ls()) if np.isnan(value) else ls() == value
    if "next_scale" in d:
        assert d["next_scale"] == d["scale"]
