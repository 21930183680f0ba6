"""DeepSpeed: its loss scalers, the ds_config and whole (ZeRO) checkpoints."""

from __future__ import annotations

import json
import math
from typing import Any

from lscore.migrate._base import (
    BF16_NEEDS_NO_SCALING,
    Loaded,
    PeerBase,
    as_dict,
    check_keys,
    is_auto,
    iteration_counters,
    read_count,
    read_value,
)
from lscore.presets import table

# DeepSpeedFP16Config (deepspeed/runtime/precision_config.py): the fp16 section's keys and
# defaults.  Its model forbids any other key (DeepSpeedConfigModel: extra="forbid") and
# drops "auto" values before validating them (DeepSpeedConfigModel.__init__), so an
# "auto" the Hugging Face Trainer did not fill takes these defaults.
DS_FP16_DEFAULTS = {
    "enabled": False,
    "auto_cast": False,
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "consecutive_hysteresis": False,
    "min_loss_scale": 1,
    "fp16_master_weights_and_grads": False,
}


# the preset's check of loss_scale: 0 (dynamic scaling) or a static scale > 0
zero_or_scale = table.TABLE["deepspeed"].checks["loss_scale"]


def _json(v: object) -> str:
    """A ds_config value as JSON spells it (false, not False)."""
    return json.dumps(v)


class DeepSpeedPeer(PeerBase):
    """DeepSpeed's DynamicLossScaler (deepspeed/runtime/fp16/loss_scaler.py).

    The engine builds it from ``DeepSpeedFP16Config.dynamic_loss_scale_args()``,
    which holds init_scale, scale_window, delayed_shift, consecutive_hysteresis and
    min_scale but never ``raise_error_at_min_scale``: the class default, True,
    applies.  No DeepSpeed release reads that key from a ds_config; some forks do,
    so lscore accepts it there.
    """

    preset = "deepspeed"
    what = "DeepSpeed loss scaler state"
    fp16_keys = (*DS_FP16_DEFAULTS, "raise_error_at_min_scale")
    # DynamicLossScaler's attributes (ZeRO pickles the object itself)
    scaler_keys = (
        "cur_scale",
        "cur_iter",
        "last_overflow_iter",
        "scale_factor",
        "scale_window",
        "min_scale",
        "delayed_shift",
        "cur_hysteresis",
        "consecutive_hysteresis",
        "raise_error_at_min_scale",
        "dynamic",
        "dtype",
    )
    # FP16_Optimizer / FP16_UnfusedOptimizer.state_dict() (deepspeed/runtime/fp16/)
    fp16_optimizer_keys = (
        "dynamic_loss_scale",
        "cur_scale",
        "cur_iter",
        "last_overflow_iter",
        "scale_factor",
        "scale_window",
        "optimizer_state_dict",
        "fp32_groups_flat",
        "fp32_groups",
        "clip_grad",
    )
    state_keys = (*scaler_keys, "loss_scaler", "dynamic_loss_scale")
    # engine._save_checkpoint: mp_rank_*_model_states.pt holds the optimizer's state_dict
    # under "optimizer" (None under ZeRO); engine._save_zero_checkpoint:
    # *_optim_states.pt holds it under "optimizer_state_dict"
    places = (("optimizer",), ("optimizer_state_dict",))
    config_places = (("ds_config",),)

    def args(self, config: Any, notes: Any) -> Any:
        """A ds_config, its "fp16" section, or DynamicLossScaler's arguments."""
        if not isinstance(config, dict):
            raise TypeError(f"ds_config must be a dict, got {type(config).__name__}")
        if config and set(config) <= set(table.TABLE["deepspeed"].args):
            return {"loss_scale": 0.0, **config}  # DynamicLossScaler's own arguments
        # the fp16 section itself, or a whole ds_config: one without an fp16 or bf16 section
        # holds none of the section's keys (train_batch_size, optimizer, ...)
        section = not ({"fp16", "bf16", "bfloat16"} & set(config)) and (
            not config or bool(set(config) & set(self.fp16_keys))
        )
        if not section and "fp16" not in config:
            bf16 = config.get("bf16", config.get("bfloat16"))
            if not (isinstance(bf16, dict) and bf16.get("enabled") is True):
                raise ValueError(
                    "this ds_config has no fp16 section, so DeepSpeed leaves fp16 "
                    "disabled (its default) and does no loss scaling: there is no loss "
                    'scale to migrate; an fp16 run has "fp16": {"enabled": true, ...}'
                )
        whole = not section
        fp16 = config.get("fp16", {}) if whole else config
        fp16 = check_keys("ds_config fp16 section", fp16, self.fp16_keys)
        bf16 = config.get("bf16", config.get("bfloat16", {})) if whole else {}
        bf16_on = isinstance(bf16, dict) and bf16.get("enabled") is True
        enabled = fp16.get("enabled", False)
        if is_auto(enabled):
            if bf16_on:
                enabled = False
            else:
                notes.append(
                    'fp16.enabled is "auto": the Hugging Face Trainer sets it from '
                    "its fp16 flag; lscore takes it as true"
                )
                enabled = True
        if enabled is True and bf16_on:
            raise ValueError(
                "this ds_config enables both fp16 and bf16; DeepSpeed refuses "
                "that, and only an fp16 run has a loss scale"
            )
        if enabled is not True:
            if bf16_on:
                raise ValueError(
                    f"this ds_config enables bf16 (bf16.enabled is true), for "
                    f"which DeepSpeed keeps a fixed scale of 1.0; "
                    f"{BF16_NEEDS_NO_SCALING}"
                )
            raise ValueError(
                f"fp16.enabled must be true for DeepSpeed to scale the loss, got "
                f"{fp16.get('enabled', False)!r} (fp16 is not enabled in this "
                f"ds_config, so DeepSpeed does no loss scaling)"
            )
        autos = [k for k, v in fp16.items() if k != "enabled" and is_auto(v)]
        if autos:
            notes.append(
                'DeepSpeed drops "auto" values it is given and uses its defaults; '
                "lscore took "
                + ", ".join(
                    f"fp16.{k}={_json(DS_FP16_DEFAULTS[k])}" for k in autos if k in DS_FP16_DEFAULTS
                )
            )
            fp16 = {k: v for k, v in fp16.items() if not is_auto(v)}
        static = zero_or_scale("fp16.loss_scale", fp16.get("loss_scale", 0))
        if static:
            # DeepSpeed's LossScaler: the other keys configure the dynamic scaler only
            return {**table.TABLE["deepspeed"].args, "loss_scale": static}
        unset = [
            k
            for k in (
                "initial_scale_power",
                "loss_scale_window",
                "min_loss_scale",
                "hysteresis",
                "consecutive_hysteresis",
            )
            if k not in fp16 and k not in autos
        ]
        if unset:
            notes.append(
                "the ds_config's fp16 section leaves "
                + ", ".join(unset)
                + " unset; lscore took DeepSpeed's defaults: "
                + ", ".join(f"fp16.{k}={_json(DS_FP16_DEFAULTS[k])}" for k in unset)
            )
        if "raise_error_at_min_scale" not in fp16:
            notes.append(
                "DeepSpeed's engine does not pass raise_error_at_min_scale to its "
                "DynamicLossScaler; lscore took that class's default, true (training "
                "stops with an error when an overflow comes at the minimum scale)"
            )
        power = fp16.get("initial_scale_power", DS_FP16_DEFAULTS["initial_scale_power"])
        return {
            "init_scale": 2.0 ** read_count("initial_scale_power", power, None),
            "scale_window": fp16.get("loss_scale_window", 1000),
            "min_scale": fp16.get("min_loss_scale", 1),
            "delayed_shift": fp16.get("hysteresis", 2),
            "consecutive_hysteresis": fp16.get("consecutive_hysteresis", False),
            # DynamicLossScaler's default: the engine never passes it
            "raise_error_at_min_scale": fp16.get("raise_error_at_min_scale", True),
            "loss_scale": 0.0,
        }

    def locate(self, checkpoint: Any) -> Any:
        state, path = super().locate(checkpoint)
        d = as_dict(state)
        if path == ("optimizer",) and state is None:
            raise ValueError(
                "checkpoint['optimizer'] is None: this is the model-states file "
                "of a ZeRO run; DeepSpeed keeps the loss scaler in the "
                "*_optim_states.pt files beside it (optimizer_state_dict)"
            )
        if d is not None and "loss_scaler" in d:
            # a ZeRO optimizer's state_dict (stage_1_and_2.py, stage3.py): the pickled scaler
            path = (path or ()) + ("loss_scaler",)
            state = d["loss_scaler"]
        return state, path

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        d = as_dict(state)
        if d is not None and (
            "optimizer_state_dict" in d
            or "fp32_groups_flat" in d
            or "fp32_groups" in d
            or "dynamic_loss_scale" in d
        ):
            return self._load_fp16_optimizer(d, args, notes)
        st = check_keys(self.what, state, self.scaler_keys, ("cur_scale",))
        if st.get("dynamic", True) is False or "cur_iter" not in st:
            # LossScaler, for a static fp16.loss_scale (and a scale of 1.0 for bf16 and
            # fp32): the scaler DeepSpeed restores, whatever the ds_config says
            return self._load_static(read_value("cur_scale", st["cur_scale"]), args)
        args["loss_scale"] = 0.0
        check_keys(self.what, st, self.scaler_keys, ("cur_scale", "cur_iter", "last_overflow_iter"))
        self._check_factor(st)
        for key in (
            "scale_window",
            "min_scale",
            "delayed_shift",
            "consecutive_hysteresis",
            "raise_error_at_min_scale",
        ):
            if key in st:
                args[key] = read_value(key, st[key])
        loaded = iteration_counters(st)
        # old checkpoints lack cur_hysteresis; DeepSpeed then restarts it at delayed_shift
        loaded.counters["hysteresis_left"] = read_count(
            "cur_hysteresis", st.get("cur_hysteresis", args.get("delayed_shift", 2)), 1
        )
        return loaded

    def _load_fp16_optimizer(self, d: Any, args: Any, notes: Any) -> Any:
        st = check_keys(
            "DeepSpeed FP16_Optimizer state", d, self.fp16_optimizer_keys, ("cur_scale", "cur_iter")
        )
        if not read_value("dynamic_loss_scale", st.get("dynamic_loss_scale", True)):
            return self._load_static(read_value("cur_scale", st["cur_scale"]), args)
        args["loss_scale"] = 0.0
        check_keys(
            "DeepSpeed FP16_Optimizer state",
            d,
            self.fp16_optimizer_keys,
            ("cur_scale", "cur_iter", "last_overflow_iter"),
        )
        self._check_factor(st)
        if "scale_window" in st:
            args["scale_window"] = read_count("scale_window", st["scale_window"], 1)
        # FP16_Optimizer._update_scale (fused_optimizer.py, unfused_optimizer.py) has no
        # hysteresis and never raises at the minimum, whatever the ds_config says
        changed = [
            f"{k}={v!r}"
            for k, v in (("delayed_shift", 1), ("raise_error_at_min_scale", False))
            if args.get(k) != v
        ]
        args.update(delayed_shift=1, raise_error_at_min_scale=False)
        if changed:
            notes.append(
                "this state was saved by DeepSpeed's FP16_Optimizer (fp16 without "
                "ZeRO), whose update has no hysteresis and never raises at the "
                "minimum scale; lscore took " + ", ".join(changed)
            )
        return iteration_counters(st)

    def _load_static(self, scale: Any, args: Any) -> Loaded:
        """A static scaler's state: its scale is the whole of it."""
        args.update(table.TABLE["deepspeed"].args)
        args["loss_scale"] = zero_or_scale("cur_scale", scale)
        if not args["loss_scale"]:
            raise ValueError(
                f"cur_scale of a static DeepSpeed loss scaler must be > 0, got {scale!r}"
            )
        return Loaded()

    def _check_factor(self, st: Any) -> None:
        if read_value("scale_factor", st.get("scale_factor", 2.0)) != 2.0:
            raise ValueError(
                f"scale_factor must be 2 (DeepSpeed fixes it), got {st['scale_factor']!r}"
            )

    def dump(self, ls: Any, args: Any) -> Any:
        if args["loss_scale"]:
            return {"cur_scale": ls.state.scale, "dynamic": False}  # LossScaler's attributes
        c = ls.state.counters()
        return {
            "cur_scale": ls.state.scale,
            "cur_iter": c["steps"],
            "last_overflow_iter": c["steps"] - c["good_steps"] - 1,
            "cur_hysteresis": c["hysteresis_left"],
            "scale_factor": 2.0,
            "scale_window": args["scale_window"],
            "min_scale": args["min_scale"],
            "delayed_shift": args["delayed_shift"],
            "consecutive_hysteresis": args["consecutive_hysteresis"],
            "raise_error_at_min_scale": args["raise_error_at_min_scale"],
            "dynamic": True,
        }

    def config(self, args: Any) -> Any:
        """A ds_config "fp16" section with only the keys DeepSpeedFP16Config accepts."""
        if args["loss_scale"]:
            return {"fp16": {"enabled": True, "loss_scale": args["loss_scale"]}}
        power = math.log2(args["init_scale"])
        if not power.is_integer():
            raise ValueError(
                f"init_scale must be a power of 2 for fp16.initial_scale_power to "
                f"express it, got {args['init_scale']!r}"
            )
        if not args["raise_error_at_min_scale"]:
            raise ValueError(
                "raise_error_at_min_scale must be true for a ds_config to express "
                "it, got False (DeepSpeed's fp16 section has no such key, and its "
                "DynamicLossScaler raises at the minimum scale)"
            )
        if not float(args["min_scale"]).is_integer():
            raise ValueError(
                f"min_scale must be an integer for fp16.min_loss_scale (an int in "
                f"DeepSpeedFP16Config) to express it, got {args['min_scale']!r}"
            )
        return {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,
                "initial_scale_power": int(power),
                "loss_scale_window": args["scale_window"],
                "hysteresis": args["delayed_shift"],
                "consecutive_hysteresis": args["consecutive_hysteresis"],
                "min_loss_scale": int(args["min_scale"]),
            }
        }
