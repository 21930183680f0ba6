"""Megatron-LM: its DynamicGradScaler, its arguments and whole checkpoints."""

from __future__ import annotations

from typing import Any, ClassVar

from lscore.migrate._base import (
    BF16_NEEDS_NO_SCALING,
    MISSING,
    Loaded,
    PeerBase,
    as_dict,
    check_keys,
    read_count,
    read_scale,
    same_value,
    top_keys,
    walk_path,
)


class MegatronPeer(PeerBase):
    """Megatron-core's DynamicGradScaler (megatron/core/optimizer/grad_scaler.py).

    The optimizer's state_dict keeps the scaler's under "grad_scaler"
    (optimizer.py, distrib_optimizer.py; a ChainedOptimizer of several saves a list
    of such dicts); megatron/training/checkpointing.py saves that under "optimizer"
    and the run's arguments (an argparse.Namespace) under "args".
    """

    preset = "megatron"
    what = "Megatron grad_scaler state"
    config_keys = (
        "initial_scale",
        "min_scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "hysteresis",
    )
    # OptimizerConfig's (and the training arguments') names for the same arguments
    optimizer_config: ClassVar[dict[str, str]] = {
        "initial_loss_scale": "initial_scale",
        "min_loss_scale": "min_scale",
        "loss_scale_window": "growth_interval",
        "hysteresis": "hysteresis",
    }
    state_keys = ("scale", "growth_tracker", "hysteresis_tracker")
    places = (("optimizer", "grad_scaler"), ("grad_scaler",))
    config_places = (("args",),)

    def args(self, config: Any, notes: Any) -> Any:
        d = as_dict(config)
        if d is None:
            raise TypeError(f"megatron config must be a dict, got {type(config).__name__}")
        if not isinstance(config, dict) or "fp16" in d or "bf16" in d:
            # Megatron's arguments or a whole OptimizerConfig: read the loss-scale fields
            if d.get("loss_scale") is None and not d.get("fp16", True):
                if d.get("bf16"):
                    raise ValueError(
                        f"this Megatron run is bf16 without a loss_scale, for "
                        f"which Megatron builds no grad scaler; "
                        f"{BF16_NEEDS_NO_SCALING}"
                    )
                raise ValueError(
                    "fp16 must be true for Megatron to scale the loss, got False "
                    "(this run uses no grad scaler)"
                )
            d = {k: d[k] for k in (*self.optimizer_config, "loss_scale") if k in d}
        config = check_keys(
            "megatron config", d, self.config_keys + tuple(self.optimizer_config) + ("loss_scale",)
        )
        if config.get("loss_scale") is not None:
            raise ValueError(
                f"loss_scale {config['loss_scale']!r} selects Megatron's "
                f"ConstantGradScaler; use lscore.FixedLossScale"
            )
        return {self.optimizer_config.get(k, k): v for k, v in config.items() if k != "loss_scale"}

    def locate(self, checkpoint: Any) -> Any:
        d = as_dict(checkpoint)
        opt = walk_path(d, ("optimizer",)) if d is not None else MISSING
        if isinstance(opt, (list, tuple)):
            # a ChainedOptimizer's state_dict: one dict per chained optimizer
            found = [o.get("grad_scaler") for o in opt if isinstance(o, dict)]
            if not found or any(f is None for f in found):
                raise ValueError(self.not_found(d))
            if any(not same_value(f, found[0]) for f in found[1:]):
                raise ValueError(
                    f"checkpoint['optimizer'] holds {len(found)} optimizers with "
                    f"different grad_scaler states; pass one of them, e.g. "
                    f"checkpoint['optimizer'][0]['grad_scaler']"
                )
            return found[0], ("optimizer", 0, "grad_scaler")
        if (
            d is not None
            and not self.is_state(d)
            and opt is not MISSING
            and "grad_scaler" not in d
            and walk_path(opt, ("grad_scaler",)) is MISSING
        ):
            raise ValueError(
                "checkpoint['optimizer'] has no 'grad_scaler': the run used no "
                "grad scaler (bf16 or fp32 training), so there is no loss scale "
                "to migrate; its optimizer keys are: " + top_keys(as_dict(opt) or {})
            )
        return super().locate(checkpoint)

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        if isinstance(state, dict) and "grad_scaler" in state:
            state = state["grad_scaler"]  # the optimizer state_dict's entry
        if isinstance(state, dict) and not state:
            raise ValueError(
                "the Megatron grad_scaler state is empty: it was saved by a "
                "ConstantGradScaler (a static loss_scale); use "
                "lscore.FixedLossScale"
            )
        st = check_keys(self.what, state, self.state_keys, self.state_keys)
        return Loaded(
            read_scale("scale", st["scale"]),
            {
                "good_steps": read_count("growth_tracker", st["growth_tracker"]),
                "hysteresis_left": read_count("hysteresis_tracker", st["hysteresis_tracker"], None),
            },
        )

    def dump(self, ls: Any, args: Any) -> Any:
        c = ls.state.counters()
        return {
            "scale": ls.state.scale,
            "growth_tracker": c["good_steps"],
            "hysteresis_tracker": c["hysteresis_left"],
        }
