"""The remaining peers: apex, apex fp16_utils, Paddle, jmp, ColossalAI, Chainer, MXNet."""

from __future__ import annotations

from typing import Any

from lscore.migrate._base import (
    Loaded,
    PeerBase,
    as_dict,
    check_keys,
    iteration_counters,
    read_count,
    read_scale,
    read_value,
)
from lscore.policy import unjson_float
from lscore.presets import table


class ApexPeer(PeerBase):
    """apex amp (apex/amp/scaler.py); amp.state_dict() is {"loss_scaler<i>": {...}}.

    apex's README saves it under "amp" in a checkpoint, as timm's ApexScaler does;
    Lightning 1.x under "amp_scaling_state" or its ApexMixedPrecisionPlugin's name.
    """

    preset = "apex"
    what = "apex amp state"
    config_keys = (
        "loss_scale",
        "init_scale",
        "scale_factor",
        "scale_window",
        "min_loss_scale",
        "max_loss_scale",
    )
    state_keys = ("loss_scale", "unskipped")
    places = (("amp",), ("amp_scaling_state",), ("ApexMixedPrecisionPlugin",))

    def is_state(self, d: Any) -> Any:
        return super().is_state(d) or any(str(k).startswith("loss_scaler") for k in d)

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        if isinstance(state, dict) and any(str(k).startswith("loss_scaler") for k in state):
            names = sorted(state)
            if len(names) != 1:
                raise ValueError(
                    f"this amp state holds {len(names)} loss scalers "
                    f"({', '.join(names)}); pass one of them, e.g. "
                    f"state[{names[0]!r}]"
                )
            state = state[names[0]]
        st = check_keys("apex loss scaler state", state, self.state_keys, self.state_keys)
        return Loaded(
            read_scale("loss_scale", st["loss_scale"]),
            {"good_steps": read_count("unskipped", st["unskipped"])},
        )

    def dump(self, ls: Any, args: Any) -> Any:
        return {
            "loss_scaler0": {
                "loss_scale": ls.state.scale,
                "unskipped": ls.state.counters()["good_steps"],
            }
        }


class ApexFp16UtilsPeer(PeerBase):
    """apex's legacy fp16_utils (apex/fp16_utils/loss_scaler.py, fp16_optimizer.py).

    FP16_Optimizer.state_dict() pickles the DynamicLossScaler object under
    "loss_scaler"; its attributes are the state.
    """

    preset = "apex_fp16_utils"
    what = "apex fp16_utils DynamicLossScaler state"
    config_keys = ("init_scale", "scale_factor", "scale_window")
    state_keys = ("cur_scale", "cur_iter", "last_overflow_iter", "scale_factor", "scale_window")
    optimizer_keys = (
        "loss_scaler",
        "dynamic_loss_scale",
        "overflow",
        "first_closure_call_this_step",
        "optimizer_state_dict",
        "fp32_from_fp16",
    )

    def is_state(self, d: Any) -> Any:
        return super().is_state(d) or "loss_scaler" in d

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        d = as_dict(state)
        if d is not None and "loss_scaler" in d:
            d = check_keys("apex FP16_Optimizer state", d, self.optimizer_keys, ("loss_scaler",))
            if not read_value("dynamic_loss_scale", d.get("dynamic_loss_scale", True)):
                raise ValueError(
                    "this apex FP16_Optimizer state has a static loss scale; use "
                    "lscore.FixedLossScale"
                )
            state = d["loss_scaler"]
        st = check_keys(
            self.what, state, self.state_keys, ("cur_scale", "cur_iter", "last_overflow_iter")
        )
        for key in ("scale_factor", "scale_window"):
            if key in st:
                args[key] = read_value(key, st[key])
        return iteration_counters(st)

    def dump(self, ls: Any, args: Any) -> Any:
        c = ls.state.counters()
        return {
            "cur_scale": ls.state.scale,
            "cur_iter": c["steps"],
            "last_overflow_iter": c["steps"] - c["good_steps"] - 1,
            "scale_factor": args["scale_factor"],
            "scale_window": args["scale_window"],
        }


class PaddlePeer(PeerBase):
    preset = "paddle"
    what = "Paddle GradScaler state"
    config_keys = (
        "enable",
        "init_loss_scaling",
        "incr_ratio",
        "decr_ratio",
        "incr_every_n_steps",
        "decr_every_n_nan_or_inf",
        "use_dynamic_loss_scaling",
    )
    state_keys = (
        "scale",
        "incr_ratio",
        "decr_ratio",
        "incr_every_n_steps",
        "decr_every_n_nan_or_inf",
        "incr_count",
        "decr_count",
        "use_dynamic_loss_scaling",
    )

    def is_state(self, d: Any) -> Any:
        return True

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        if isinstance(state, dict) and not state:
            raise ValueError(
                "the GradScaler state is empty (it was saved from a disabled GradScaler)"
            )
        st = check_keys(self.what, state, self.state_keys, self.state_keys)
        for key in (
            "incr_ratio",
            "decr_ratio",
            "incr_every_n_steps",
            "decr_every_n_nan_or_inf",
            "use_dynamic_loss_scaling",
        ):
            args[key] = read_value(key, st[key])
        n = read_count("decr_every_n_nan_or_inf", st["decr_every_n_nan_or_inf"], 1)
        decr = read_count("decr_count", st["decr_count"])
        if decr >= n:
            raise ValueError(f"decr_count must be < decr_every_n_nan_or_inf ({n}), got {decr}")
        return Loaded(
            read_scale("scale", st["scale"]),
            {"good_steps": read_count("incr_count", st["incr_count"]), "hysteresis_left": n - decr},
        )

    def dump(self, ls: Any, args: Any) -> Any:
        c = ls.state.counters()
        n = args["decr_every_n_nan_or_inf"]
        return {
            "scale": [ls.state.scale],
            "incr_ratio": args["incr_ratio"],
            "decr_ratio": args["decr_ratio"],
            "incr_every_n_steps": args["incr_every_n_steps"],
            "decr_every_n_nan_or_inf": n,
            "incr_count": c["good_steps"],
            "decr_count": n - c["hysteresis_left"],
            "use_dynamic_loss_scaling": args["use_dynamic_loss_scaling"],
        }


class JmpPeer(PeerBase):
    preset = "jmp"
    config_keys = ("loss_scale", "counter", "period", "factor", "min_loss_scale")

    def args(self, config: Any, notes: Any) -> Any:
        return {k: read_value(k, v) for k, v in super().args(config, notes).items()}

    def is_state(self, d: Any) -> Any:
        return True

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        # jmp's state *is* its fields
        args.update(self.args(state, notes))
        return Loaded()

    def dump(self, ls: Any, args: Any) -> Any:
        return {
            "loss_scale": ls.state.scale,
            "counter": ls.state.counters()["good_steps"],
            "period": args["period"],
            "factor": args["factor"],
            "min_loss_scale": args["min_loss_scale"],
        }


class ColossalAIPeer(PeerBase):
    """ColossalAI's DynamicGradScaler (colossalai/amp/naive_amp/grad_scaler/).

    Its state_dict() holds scale, growth_factor, backoff_factor and hysteresis;
    loading it keeps the loading scaler's counters, which a fresh one has at 0.
    """

    preset = "colossalai"
    what = "ColossalAI DynamicGradScaler state"
    config_keys = tuple(table.TABLE["colossalai"].args)
    state_keys = ("scale", "growth_factor", "backoff_factor", "hysteresis")

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        st = check_keys(self.what, state, self.state_keys, ("scale",))
        for key in self.state_keys[1:]:
            if key in st:
                args[key] = read_value(key, st[key])
        return Loaded(read_scale("scale", st["scale"]))

    def dump(self, ls: Any, args: Any) -> Any:
        return {
            "scale": ls.state.scale,
            "growth_factor": args["growth_factor"],
            "backoff_factor": args["backoff_factor"],
            "hysteresis": args["hysteresis"],
        }


def read_attributes(what: Any, state: Any, keys: Any, required: Any) -> Any:
    """A peer object's attributes (or a dict of them): only `keys` are read from an object."""
    if isinstance(state, dict):
        return check_keys(what, state, keys, required)
    d = as_dict(state)
    if d is None:
        raise TypeError(f"{what} must be a dict or the peer's object, got {type(state).__name__}")
    return check_keys(what, {k: d[k] for k in keys if k in d}, keys, required)


class ChainerPeer(PeerBase):
    """Chainer's Optimizer loss scaling (chainer/optimizer.py).

    Optimizer.serialize saves no loss-scale state; it lives in the optimizer's
    attributes ``_loss_scale`` and ``_loss_scaling_isnan_ever``, read from the
    optimizer object (or a dict of them).
    """

    preset = "chainer"
    what = "chainer optimizer loss-scale attributes"
    config_keys = ("interval", "scale")
    state_keys = (
        "_loss_scale",
        "_loss_scaling_isnan_ever",
        "_loss_scaling_is_dynamic",
        "_loss_scaling_multiplier",
        "_loss_scale_max",
    )

    def is_state(self, d: Any) -> Any:
        return True

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        st = read_attributes(self.what, state, self.state_keys, ("_loss_scale",))
        if st.get("_loss_scaling_is_dynamic") is False:
            raise ValueError(
                "this chainer optimizer has a static loss scale "
                f"({st['_loss_scale']!r}); use lscore.FixedLossScale"
            )
        seen = read_value("_loss_scaling_isnan_ever", st.get("_loss_scaling_isnan_ever", False))
        return Loaded(
            read_scale("_loss_scale", st["_loss_scale"]), {"overflow_seen": int(bool(seen))}
        )

    def dump(self, ls: Any, args: Any) -> Any:
        return {
            "_loss_scale": ls.state.scale,
            "_loss_scaling_isnan_ever": bool(ls.state.counters()["overflow_seen"]),
        }


class MXNetPeer(PeerBase):
    """MXNet's contrib.amp LossScaler (python/mxnet/contrib/amp/loss_scaler.py).

    It has no state_dict: its attributes are the state, read from the object
    (``trainer._amp_loss_scaler``) or a dict of them.
    """

    preset = "mxnet"
    what = "MXNet LossScaler attributes"
    config_keys = tuple(table.TABLE["mxnet"].args)
    state_keys = (
        "_loss_scale",
        "_next_loss_scale",
        "_max_loss_scale",
        "_scale_seq_len",
        "_unskipped",
    )

    def is_state(self, d: Any) -> Any:
        return True

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        st = read_attributes(self.what, state, self.state_keys, ("_loss_scale", "_unskipped"))
        if "_max_loss_scale" in st:
            args["max_loss_scale"] = read_value("_max_loss_scale", st["_max_loss_scale"])
        if "_scale_seq_len" in st:
            args["scale_seq_len"] = read_value("_scale_seq_len", st["_scale_seq_len"])
        scale = read_scale("_loss_scale", st["_loss_scale"])
        return Loaded(
            scale,
            {"good_steps": read_count("_unskipped", st["_unskipped"])},
            read_scale("_next_loss_scale", st.get("_next_loss_scale", scale)),
        )

    def dump(self, ls: Any, args: Any) -> Any:
        return {
            "_loss_scale": ls.state.scale,
            "_next_loss_scale": unjson_float(ls.state_dict().get("next_scale", ls.state.scale)),
            "_max_loss_scale": args["max_loss_scale"],
            "_scale_seq_len": args["scale_seq_len"],
            "_unskipped": ls.state.counters()["good_steps"],
        }
