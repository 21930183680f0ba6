"""fairseq: its DynamicLossScaler, its options (a whole cfg, args or the scaler's own)."""

from __future__ import annotations

from typing import Any, ClassVar

from lscore.migrate._base import (
    BF16_NEEDS_NO_SCALING,
    MISSING,
    Loaded,
    PeerBase,
    as_dict,
    check_keys,
    read_scale,
    walk_path,
)


class FairseqPeer(PeerBase):
    """fairseq's DynamicLossScaler (fairseq/optim/dynamic_loss_scaler.py).

    FP16Optimizer and MemoryEfficientFP16Optimizer (fairseq/optim/fp16_optimizer.py)
    build it from the ``common`` options of fairseq/dataclass/configs.py
    (--fp16-init-scale 128, --fp16-scale-window None, --fp16-scale-tolerance 0.0,
    --threshold-loss-scale None, --min-loss-scale 1e-4); a window of None becomes
    int(2**14 / data-parallel size / update_freq[0]).  Their state_dict() adds
    "loss_scale" to the inner optimizer's; the trainer saves that under
    "last_optimizer_state", beside "cfg" (or, before fairseq 0.10, "args").
    """

    preset = "fairseq"
    what = "fairseq optimizer state"
    config_keys = (
        "init_scale",
        "scale_factor",
        "scale_window",
        "tolerance",
        "threshold",
        "min_loss_scale",
    )
    options: ClassVar[dict[str, str]] = {
        "fp16_init_scale": "init_scale",
        "fp16_scale_window": "scale_window",
        "fp16_scale_tolerance": "tolerance",
        "threshold_loss_scale": "threshold",
        "min_loss_scale": "min_loss_scale",
    }
    option_defaults: ClassVar[dict[str, float | None]] = {
        "fp16_init_scale": 2**7,
        "fp16_scale_window": None,
        "fp16_scale_tolerance": 0.0,
        "threshold_loss_scale": None,
        "min_loss_scale": 1e-4,
    }
    # other options that decide whether and how fairseq scales the loss
    flags = (
        "fp16",
        "bf16",
        "memory_efficient_fp16",
        "memory_efficient_bf16",
        "amp",
        "fp16_no_flatten_grads",
        "update_freq",
        "distributed_world_size",
        "model_parallel_size",
    )
    state_keys = ("loss_scale",)
    places = (("last_optimizer_state",),)
    config_places = (("cfg",), ("args",))

    def args(self, config: Any, notes: Any) -> Any:
        d = as_dict(config)
        if d is None:
            raise TypeError(f"fairseq config must be a dict, got {type(config).__name__}")
        d = {k.lstrip("-").replace("-", "_") if isinstance(k, str) else k: v for k, v in d.items()}
        if "common" in d:  # a whole fairseq cfg
            opts = dict(as_dict(d["common"]) or {})
            for section, key in (
                ("optimization", "update_freq"),
                ("distributed_training", "distributed_world_size"),
            ):
                found = walk_path(d, (section, key))
                if found is not MISSING:
                    opts[key] = found
        elif not isinstance(config, dict):  # an argparse.Namespace of fairseq's args
            opts = d
        elif set(d) <= set(self.config_keys):
            return dict(d)  # DynamicLossScaler's own arguments
        else:
            opts = check_keys(
                "fairseq config",
                d,
                tuple(self.options)
                + self.flags
                + tuple(k for k in self.config_keys if k not in self.options.values()),
            )
        if opts.get("bf16") or opts.get("memory_efficient_bf16"):
            raise ValueError(
                f"this fairseq run is bf16, for which fairseq builds no loss "
                f"scaler; {BF16_NEEDS_NO_SCALING}"
            )
        if opts.get("amp"):
            raise ValueError(
                "this fairseq run uses --amp, whose AMPOptimizer scales the loss "
                "with torch's GradScaler; migrate it with peer 'torch'"
            )
        if "fp16" in opts and not (opts["fp16"] or opts.get("memory_efficient_fp16")):
            raise ValueError(
                f"fp16 must be true for fairseq to scale the loss, got {opts['fp16']!r}"
            )
        args = {k: opts[k] for k in ("scale_factor",) if k in opts}
        for name, arg in self.options.items():
            args[arg] = opts.get(name, self.option_defaults[name])
        if args["scale_window"] is None:
            args["scale_window"] = self._window(opts, notes)
        return args

    def _window(self, opts: Any, notes: Any) -> int:
        freq = opts.get("update_freq", [1])
        freq = list(freq) if isinstance(freq, (list, tuple)) else [freq]
        if len(freq) > 1:
            raise ValueError(
                "fp16_scale_window must be given explicitly when using a custom "
                f"update_freq schedule, got update_freq={freq!r}"
            )
        world = opts.get("distributed_world_size")
        parallel = int(opts.get("model_parallel_size") or 1)
        dp = int((world or 1) / parallel)
        window = int(2**14 / dp / freq[0])
        if world is None or "update_freq" not in opts:
            notes.append(
                f"fp16_scale_window is None: fairseq sets it to int(2**14 / "
                f"data-parallel size / update_freq[0]); this config does not give "
                f"both, so lscore took a data-parallel size of {dp} and update_freq "
                f"{freq!r}: scale_window={window}"
            )
        else:
            notes.append(
                f"fp16_scale_window is None: lscore took fairseq's int(2**14 / {dp} / "
                f"{freq[0]}) = {window}"
            )
        return window

    def load(self, state: Any, args: Any, notes: Any) -> Any:
        d = as_dict(state)
        if d is not None and "loss_scale" not in d and ("state" in d or "param_groups" in d):
            raise ValueError(
                "this fairseq optimizer state has no 'loss_scale': the run did "
                "not use fairseq's fp16 loss scaler (bf16, --amp or fp32 training)"
            )
        # FP16Optimizer.state_dict(): the inner optimizer's keys plus "loss_scale"
        st = check_keys(self.what, state, ("loss_scale", "state", "param_groups"), ("loss_scale",))
        # fairseq saves no counters: it restarts them on resume, and so does lscore
        return Loaded(read_scale("loss_scale", st["loss_scale"]))

    def dump(self, ls: Any, args: Any) -> Any:
        return {"loss_scale": ls.state.scale}
