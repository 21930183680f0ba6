"""TensorFlow and Keras peers: TF2 LossScale, tf-keras 2 and Keras 3 optimizers, TF1 managers."""

from __future__ import annotations

from typing import Any, ClassVar

from lscore.migrate._base import Loaded, PeerBase, check_keys, read_count, read_scale


class KerasPeer(PeerBase):
    variables = ("current_loss_scale", "good_steps")
    aliases: ClassVar[dict[str, str]] = {
        "loss_scale": "current_loss_scale",
        "dynamic_counter": "good_steps",
    }

    def is_state(self, d: Any) -> Any:
        return True

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        st = check_keys(f"{self.preset} variables", state, self.variables + tuple(self.aliases))
        st = {self.aliases.get(k, k): v for k, v in st.items()}
        missing = [k for k in self.variables if k not in st]
        if missing:
            raise ValueError(
                f"{self.preset} variables are missing: {', '.join(map(repr, missing))}"
            )
        scale_key, counter_key = self.variables
        return Loaded(
            read_scale(scale_key, st[scale_key]),
            {"good_steps": read_count(counter_key, st[counter_key])},
        )

    def dump(self, ls: Any, args: Any) -> Any:
        scale_key, counter_key = self.variables
        return {scale_key: ls.state.scale, counter_key: ls.state.counters()["good_steps"]}


class TF2Peer(KerasPeer):
    preset = "tf2"
    config_keys = ("initial_loss_scale", "increment_period", "multiplier")


class Keras2Peer(KerasPeer):
    preset = "keras2"
    config_keys = ("dynamic", "initial_scale", "dynamic_growth_steps")
    ignored_config_keys = ("inner_optimizer", "name")

    def args(self, config: Any, notes: Any) -> Any:
        if isinstance(config, dict) and "loss_scale" in config:
            # the TF <= 2.3 experimental format: {"optimizer", "loss_scale": {...}}
            check_keys("keras2 config", config, ("optimizer", "loss_scale"))
            ls = check_keys(
                "loss_scale",
                config["loss_scale"],
                ("class_name", "config"),
                ("class_name", "config"),
            )
            if ls["class_name"] == "FixedLossScale":
                return {"dynamic": False, "initial_scale": ls["config"]["loss_scale_value"]}
            if ls["class_name"] != "DynamicLossScale":
                raise ValueError(f"unknown loss scale class {ls['class_name']!r}")
            c = check_keys("DynamicLossScale config", ls["config"], TF2Peer.config_keys)
            if c.get("multiplier", 2.0) != 2:
                raise ValueError(
                    "Cannot deserialize LossScaleOptimizer with a DynamicLossScale "
                    "whose multiplier is not 2; use preset 'tf2' instead"
                )
            return {
                "initial_scale": c.get("initial_loss_scale", 2**15),
                "dynamic_growth_steps": c.get("increment_period", 2000),
            }
        return super().args(config, notes)


class Keras3Peer(KerasPeer):
    preset = "keras3"
    config_keys = ("initial_scale", "dynamic_growth_steps", "name")
    ignored_config_keys = ("inner_optimizer",)
    variables = ("dynamic_scale", "step_counter")
    aliases: ClassVar[dict[str, str]] = {}


class TF1Peer(PeerBase):
    preset = "tf1"
    config_keys = (
        "init_loss_scale",
        "incr_every_n_steps",
        "decr_every_n_nan_or_inf",
        "incr_ratio",
        "decr_ratio",
    )
    variables = ("loss_scale", "good_steps", "bad_steps")

    def is_state(self, d: Any) -> Any:
        return True

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        st = check_keys("tf1 variables", state, self.variables, self.variables)
        n = args.get("decr_every_n_nan_or_inf", 2)
        bad = read_count("bad_steps", st["bad_steps"])
        if bad >= n:
            raise ValueError(f"bad_steps must be < decr_every_n_nan_or_inf ({n}), got {bad}")
        return Loaded(
            read_scale("loss_scale", st["loss_scale"]),
            {"good_steps": read_count("good_steps", st["good_steps"]), "hysteresis_left": n - bad},
        )

    def dump(self, ls: Any, args: Any) -> Any:
        c = ls.state.counters()
        return {
            "loss_scale": ls.state.scale,
            "good_steps": c["good_steps"],
            "bad_steps": args["decr_every_n_nan_or_inf"] - c["hysteresis_left"],
        }
