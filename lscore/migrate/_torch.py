"""Peers that write torch GradScaler states: torch itself, Lightning, accelerate, NeMo."""

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
    read_value,
    walk_path,
)
from lscore.policy import F32_MAX

LIGHTNING_SCALER_KEYS = (
    "MixedPrecision",
    "FSDPPrecision",
    "MixedPrecisionPlugin",
    "FSDPMixedPrecisionPlugin",
    "FSDPPrecisionPlugin",
    "NativeMixedPrecisionPlugin",
    "ShardedNativeMixedPrecisionPlugin",
    "FullyShardedNativeMixedPrecisionPlugin",
    "FullyShardedNativeNativeMixedPrecisionPlugin",
    "native_amp_scaling_state",
)
# NeMo 1's Lightning precision plugins (nemo/collections/nlp/parts/nlp_overrides.py)
NEMO_SCALER_KEYS = ("PipelineMixedPrecisionPlugin", "MegatronHalfPrecisionPlugin")


class TorchPeer(PeerBase):
    preset = "torch"
    what = "torch GradScaler state"
    config_keys = (
        "device",
        "init_scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "enabled",
    )
    state_keys = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
    places = tuple((k,) for k in ("scaler", "amp_scaler", "grad_scaler", *LIGHTNING_SCALER_KEYS))

    def is_state(self, d: Any) -> Any:
        return super().is_state(d) or "lscore" in d

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        if isinstance(state, dict) and "lscore" in state:
            raise ValueError(
                "this GradScaler state holds an 'lscore' entry: it was saved by "
                "lscore.adapters.torch.GradScaler; load it with that class"
            )
        if isinstance(state, dict) and not state:
            raise ValueError(
                "the GradScaler state is empty (it was saved from a disabled GradScaler)"
            )
        st = check_keys(self.what, state, self.state_keys, self.state_keys)
        args.update(
            growth_factor=read_value("growth_factor", st["growth_factor"]),
            backoff_factor=read_value("backoff_factor", st["backoff_factor"]),
            growth_interval=read_count("growth_interval", st["growth_interval"], None),
        )
        scale = read_scale("scale", st["scale"])
        args.setdefault("enabled", True)  # a disabled GradScaler saves {} (refused above)
        if "init_scale" not in args and 0 < scale <= F32_MAX:
            # torch's load_state_dict sets _init_scale to the scale it loads
            # (torch/amp/grad_scaler.py), so the scaler resumed from this state
            # holds that value; the state records no init_scale of its own
            args["init_scale"] = scale
            notes.append(
                f"the {self.what} records no init_scale; lscore took the state's scale "
                f"{scale!r}, as torch's load_state_dict does"
            )
        return Loaded(scale, {"good_steps": read_count("_growth_tracker", st["_growth_tracker"])})

    def dump(self, ls: Any, args: Any) -> Any:
        return {
            "scale": ls.state.scale,
            "growth_factor": args["growth_factor"],
            "backoff_factor": args["backoff_factor"],
            "growth_interval": args["growth_interval"],
            "_growth_tracker": ls.state.counters()["good_steps"],
        }


class NemoPeer(TorchPeer):
    """NeMo 1's GradScaler (nemo/collections/nlp/parts/nlp_overrides.py).

    NeMo's trainer builder (nemo/collections/nlp/parts/megatron_trainer_builder.py,
    ``_grad_scaler``) builds it from the model config's ``native_amp_init_scale``
    (default 2**32), ``native_amp_growth_interval`` (1000) and ``hysteresis`` (2), and
    only when ``trainer.precision`` is 16, "16" or "16-mixed".
    """

    preset = "nemo"
    what = "NeMo GradScaler state"
    config_keys = (*TorchPeer.config_keys[1:], "hysteresis")
    model_names: ClassVar[dict[str, str]] = {
        "native_amp_init_scale": "init_scale",
        "native_amp_growth_interval": "growth_interval",
        "hysteresis": "hysteresis",
    }
    builder_defaults: ClassVar[dict[str, float]] = {
        "init_scale": 2.0**32,
        "growth_interval": 1000,
        "hysteresis": 2,
    }
    places = tuple((k,) for k in NEMO_SCALER_KEYS) + TorchPeer.places

    def args(self, config: Any, notes: Any) -> Any:
        d = as_dict(config)
        if d is None:
            raise TypeError(f"nemo config must be a dict, got {type(config).__name__}")
        if "model" in d or "trainer" in d:  # a whole NeMo config
            precision = walk_path(d, ("trainer", "precision"))
            if precision is not MISSING and precision is not None:
                self._check_precision(precision)
            return self._from_model(as_dict(d.get("model", {})) or {}, "model.", notes)
        if not set(d) <= set(self.config_keys) and (
            "native_amp_init_scale" in d or "native_amp_growth_interval" in d
        ):
            return self._from_model(d, "", notes)  # the model section of a NeMo config
        return super().args(config, notes)  # GradScaler's own arguments

    def _check_precision(self, precision: Any) -> None:
        p = str(precision)
        if p in ("bf16", "bf16-mixed", "bf16-true"):
            raise ValueError(
                f"trainer.precision is {precision!r}: NeMo builds no GradScaler "
                f"for it; {BF16_NEEDS_NO_SCALING}"
            )
        if p not in ("16", "16-mixed"):
            raise ValueError(
                f"trainer.precision must be 16 or '16-mixed' for NeMo to scale "
                f"the loss, got {precision!r}"
            )

    def _from_model(self, model: Any, prefix: Any, notes: Any) -> Any:
        args, taken = {}, []
        for name, arg in self.model_names.items():
            if name in model and model[name] is not None:
                args[arg] = model[name]
            else:
                args[arg] = self.builder_defaults[arg]
                taken.append(f"{prefix}{name}={self.builder_defaults[arg]!r}")
        if taken:
            notes.append(
                "the NeMo config leaves "
                + ", ".join(n.split("=")[0] for n in taken)
                + " unset; lscore took the defaults of NeMo's MegatronTrainerBuilder: "
                + ", ".join(taken)
            )
        return args

    def _offset(self, args: Any) -> int:
        # hysteresis 0 acts as 1 (every overflow backs off) with NeMo's tracker one lower
        h = args.get("hysteresis", 1)
        return max(h, 1) - h if isinstance(h, int) else 0

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        st = dict(
            check_keys(
                self.what, state, (*self.state_keys, "_hysteresis_tracker", "_hysterisis_tracker")
            )
        )
        left = st.pop("_hysteresis_tracker", st.pop("_hysterisis_tracker", None))
        loaded = super().load(st, args, notes)
        if left is not None:
            loaded.counters["hysteresis_left"] = read_count(
                "_hysteresis_tracker", left, None
            ) + self._offset(args)
        return loaded

    def dump(self, ls: Any, args: Any) -> Any:
        return {
            **super().dump(ls, args),
            "_hysteresis_tracker": ls.state.counters()["hysteresis_left"] - self._offset(args),
        }
