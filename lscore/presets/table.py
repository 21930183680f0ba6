"""One table: each peer's loss-scale policy as core parameters, and its argument names.

A row names the peer's constructor arguments with the peer's own defaults,
checks each with the validators of ``_spec`` and ``policy`` (the error names the peer's
argument), and maps them onto ``Policy`` fields: plain renames in ``rename``,
fields the peer fixes in ``fixed``, the rest in ``derive``.  ``invert`` is the
way back (Policy -> peer arguments) used by ``lscore.migrate``.  The
pseudocode in ``doc`` becomes the docstring of the preset's class.
"""

from __future__ import annotations

import math
from typing import Any

from lscore.policy import (
    Policy,
    boolean,
    factor_above_one,
    factor_at_least_one,
    fraction,
    real,
)
from lscore.presets._spec import (
    REQUIRED,
    Spec,
    cap,
    dynamic_or_number,
    f32,
    f64,
    int_ge0,
    int_ge1,
    interval,
    non_negative,
    open_fraction,
    optional,
    optional_truthy,
    string,
    zero_or_scale,
)

FIXED_SCALE = {"growth_mode": "never", "apply_nonfinite": True}
# A step skipped by a peer that keeps its scale fixed but still checks (Paddle static).
FIXED_SCALE_SKIPPING = {"growth_mode": "never", "apply_nonfinite": False}

TF_DYNAMIC = dict(
    precision="float32",
    growth_mode="ge",
    backoff_mode="divide",
    min_scale=1.0,
    guard_finite=True,
    refill=("backoff",),
)
# torch.amp.GradScaler's policy, its one definition: every Policy field except the four
# numbers its constructor takes (the "torch" row's args), hysteresis, floor and cap as in
# torch (none).  The "nemo" row and lscore.adapters.torch.GradScaler build on it, and that
# GradScaler runs torch's own update kernel exactly for policies with these values.  At
# hysteresis 1 every refill rule gives torch's scales; "finite" is NeMo's, the rule the
# GradScaler's hysteresis follows.
TORCH = dict(
    hysteresis=1,
    min_scale=None,
    max_scale=None,
    precision="float32_float64",
    growth_mode="eq",
    growth_offset=0,
    backoff_mode="multiply",
    min_action="clamp",
    guard_finite=True,
    refill=("finite",),
    hysteresis_saturate=False,
    apply_nonfinite=False,
    flush_subnormal=False,
    apply_next=False,
    tolerance=0.0,
    floor_scale=None,
    growth_factor_after_overflow=None,
)


def _tf2(a: Any) -> Any:
    return {"backoff_factor": 1.0 / a["multiplier"]}


def _keras2(a: Any) -> Any:
    if not a["dynamic"]:
        if a["initial_scale"] is None:
            raise ValueError('"initial_scale" must be specified if "dynamic" is False')
        if a["dynamic_growth_steps"] is not None:
            raise ValueError(
                '"dynamic_growth_steps" must be None if "dynamic" is False, but '
                f"got: {a['dynamic_growth_steps']}"
            )
        return dict(FIXED_SCALE, init_scale=a["initial_scale"])
    init = 2.0**15 if a["initial_scale"] is None else a["initial_scale"]
    steps = 2000 if a["dynamic_growth_steps"] is None else a["dynamic_growth_steps"]
    return dict(
        TF_DYNAMIC, init_scale=init, growth_interval=steps, growth_factor=2.0, backoff_factor=0.5
    )


def _keras3(a: Any) -> Any:
    if a["dynamic"] is not True:
        raise ValueError(
            "LossScaleOptimizer no longer supports `dynamic=False`. Instead, simply "
            "set `loss_scale_factor` directly on the `inner_optimizer`."
        )
    return {}


def _torch(a: Any) -> Any:
    if not a["enabled"]:
        return dict(FIXED_SCALE, init_scale=1.0)
    return dict(TORCH)


def _nemo(a: Any) -> Any:
    if not a["enabled"]:
        return dict(FIXED_SCALE, init_scale=1.0)
    # hysteresis 0 acts as 1: NeMo's tracker starts at 0 and the first overflow takes it
    # below 0, so every overflow backs off (lscore.migrate keeps NeMo's tracker values)
    return dict(TORCH, hysteresis=max(a["hysteresis"], 1))


def _apex(a: Any) -> Any:
    if a["loss_scale"] != "dynamic":
        return dict(FIXED_SCALE, init_scale=a["loss_scale"])
    # amp clamps the initial scale to the maximum too
    return {
        "init_scale": min(a["init_scale"], a["max_loss_scale"]),
        "max_scale": a["max_loss_scale"],
        "min_scale": a["min_loss_scale"],
    }


def _deepspeed(a: Any) -> Any:
    if a["loss_scale"]:
        # DeepSpeed's static LossScaler: the scale never changes, and the optimizers
        # still check every step and skip one that overflowed
        return dict(FIXED_SCALE_SKIPPING, init_scale=a["loss_scale"])
    return {
        "refill": ("finite",) if a["consecutive_hysteresis"] else ("growth",),
        "min_action": "raise_at" if a["raise_error_at_min_scale"] else "clamp",
    }


def _megatron(a: Any) -> Any:
    if a["min_scale"] > a["initial_scale"]:
        raise ValueError(
            f"min_scale must be <= initial_scale, got {a['min_scale']!r} > {a['initial_scale']!r}"
        )
    return {}


def _fairseq(a: Any) -> Any:
    return {"backoff_factor": 1.0 / a["scale_factor"]}


def _paddle(a: Any) -> Any:
    if not a["enable"]:
        return dict(FIXED_SCALE, init_scale=1.0)
    if not a["use_dynamic_loss_scaling"]:
        return dict(FIXED_SCALE_SKIPPING)
    return {}


def _colossalai(a: Any) -> Any:
    lo, hi, init = a["min_scale"], a["max_scale"], a["initial_scale"]
    if lo is not None and lo > init:
        raise ValueError(f"min_scale must be <= initial_scale, got {lo!r} > {init!r}")
    if hi is not None and hi < init:
        raise ValueError(f"max_scale must be >= initial_scale, got {hi!r} < {init!r}")
    # hysteresis 0 acts as 1: the first overflow already reaches it
    return {"hysteresis": max(a["hysteresis"], 1)}


def _chainer(a: Any) -> Any:
    if a["scale"] is not None:
        return dict(FIXED_SCALE, init_scale=a["scale"])
    return {"growth_factor_after_overflow": math.pow(2.0, 1.0 / a["interval"])}


def _apex_fp16_utils(a: Any) -> Any:
    return {"backoff_factor": 1.0 / a["scale_factor"]}


def _jmp(a: Any) -> Any:
    return {"backoff_factor": 1.0 / a["factor"]}


TABLE: dict[str, Spec] = {
    "tf2": Spec(
        peer="tf.mixed_precision.experimental.DynamicLossScale (TF 2.0-2.3)",
        args={"initial_loss_scale": 2**15, "increment_period": 2000, "multiplier": 2.0},
        checks={
            "initial_loss_scale": f32,
            "increment_period": interval,
            "multiplier": factor_at_least_one,
        },
        rename={
            "initial_loss_scale": "init_scale",
            "increment_period": "growth_interval",
            "multiplier": "growth_factor",
        },
        fixed=TF_DYNAMIC,
        derive=_tf2,
        doc="""TF2's DynamicLossScale, in float32::

        if finite:
            if good_steps + 1 >= increment_period:
                scale = scale * multiplier if that is finite else scale
                good_steps = 0
            else:
                good_steps += 1
        else:
            good_steps = 0
            scale = max(scale / multiplier, 1)
        """,
    ),
    "keras2": Spec(
        peer="tf-keras LossScaleOptimizer (TF 2.4-2.15)",
        args={"dynamic": True, "initial_scale": None, "dynamic_growth_steps": None},
        checks={
            "dynamic": boolean,
            "initial_scale": optional(f32),
            "dynamic_growth_steps": optional(interval),
        },
        rename={},
        fixed={},
        derive=_keras2,
        invert=lambda p: (
            {"dynamic": False, "initial_scale": p.init_scale}
            if p.growth_mode == "never"
            else {"initial_scale": p.init_scale, "dynamic_growth_steps": p.growth_interval}
        ),
        doc="""tf-keras LossScaleOptimizer's loss scale (multiplier fixed at 2), float32::

        dynamic=False: scale = initial_scale forever; every step is applied
        dynamic=True (initial_scale 2**15, dynamic_growth_steps 2000 if None):
            if finite:
                if good_steps + 1 >= dynamic_growth_steps:
                    scale = scale * 2 if that is finite else scale
                    good_steps = 0
                else:
                    good_steps += 1
            else:
                good_steps = 0
                scale = max(scale / 2, 1)
        """,
    ),
    "keras3": Spec(
        peer="keras.optimizers.LossScaleOptimizer (Keras 3)",
        args={
            "initial_scale": 2.0**15,
            "dynamic_growth_steps": 2000,
            "name": None,
            "dynamic": True,
        },
        checks={
            "initial_scale": f32,
            "dynamic_growth_steps": interval,
            "name": optional(string),
            "dynamic": boolean,
        },
        rename={"initial_scale": "init_scale", "dynamic_growth_steps": "growth_interval"},
        fixed=dict(
            precision="float32",
            growth_mode="eq",
            growth_factor=2.0,
            backoff_factor=0.5,
            backoff_mode="multiply",
            guard_finite=False,
            flush_subnormal=True,
        ),
        derive=_keras3,
        doc="""Keras 3's LossScaleOptimizer, in float32 (subnormal results flush to 0 as
        on TF's CPU)::

        if finite:
            if step_counter == dynamic_growth_steps - 1:
                step_counter = 0
                scale = scale * 2                           # no guard: may become inf
            else:
                step_counter += 1
        else:
            step_counter = 0
            scale = scale * 0.5                             # no floor

        Keras 3 checks the *scaled* gradients; pass those to ``update``.  Keras 3 takes a
        ``dynamic_growth_steps`` of 0 or less (and then never grows); lscore refuses it,
        as every growth interval that is not a positive integer.
        """,
    ),
    "tf1": Spec(
        peer="tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager",
        args={
            "init_loss_scale": REQUIRED,
            "incr_every_n_steps": REQUIRED,
            "decr_every_n_nan_or_inf": 2,
            "incr_ratio": 2,
            "decr_ratio": 0.8,
        },
        checks={
            "init_loss_scale": f32,
            "incr_every_n_steps": interval,
            "decr_every_n_nan_or_inf": int_ge1,
            "incr_ratio": factor_at_least_one,
            "decr_ratio": fraction,
        },
        rename={
            "init_loss_scale": "init_scale",
            "incr_every_n_steps": "growth_interval",
            "decr_every_n_nan_or_inf": "hysteresis",
            "incr_ratio": "growth_factor",
            "decr_ratio": "backoff_factor",
        },
        fixed=dict(
            precision="float32",
            growth_mode="ge",
            backoff_mode="multiply",
            min_scale=1.0,
            guard_finite=True,
            refill=("growth", "backoff"),
        ),
        derive=None,
        doc="""TF1's ExponentialUpdateLossScaleManager, in float32::

        if finite:
            if good_steps + 1 >= incr_every_n_steps:
                scale = scale * incr_ratio if that is finite else scale
                good_steps = bad_steps = 0
            else:
                good_steps += 1                   # bad_steps is not reset
        else:
            if bad_steps + 1 >= decr_every_n_nan_or_inf:
                scale = max(1, scale * decr_ratio)
                good_steps = bad_steps = 0
            else:
                bad_steps += 1; good_steps = 0
        """,
    ),
    "torch": Spec(
        peer="torch.amp.GradScaler",
        args={
            "device": "cuda",
            "init_scale": 2.0**16,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 2000,
            "enabled": True,
        },
        checks={
            "device": string,
            "init_scale": f32,
            "growth_factor": factor_above_one,
            "backoff_factor": open_fraction,
            "growth_interval": interval,
            "enabled": boolean,
        },
        rename={
            "init_scale": "init_scale",
            "growth_factor": "growth_factor",
            "backoff_factor": "backoff_factor",
            "growth_interval": "growth_interval",
        },
        fixed={},
        derive=_torch,
        doc="""torch.amp.GradScaler (``_amp_update_scale_``): a float32 scale, each product
        taken in double and rounded to float32::

        if not finite:
            scale = scale * backoff_factor       # no floor: can reach 0
            growth_tracker = 0
        elif growth_tracker + 1 == growth_interval:
            scale = scale * growth_factor if that is finite else scale
            growth_tracker = 0
        else:
            growth_tracker += 1

        enabled=False: scale 1.0, every step applied.  ``device`` is recorded only.
        """,
    ),
    "nemo": Spec(
        peer="NeMo GradScaler (torch GradScaler with hysteresis)",
        args={
            "init_scale": 2.0**16,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 2000,
            "enabled": True,
            "hysteresis": 1,
        },
        checks={
            "init_scale": f32,
            "growth_factor": factor_above_one,
            "backoff_factor": open_fraction,
            "growth_interval": interval,
            "enabled": boolean,
            "hysteresis": int_ge0,
        },
        rename={
            "init_scale": "init_scale",
            "growth_factor": "growth_factor",
            "backoff_factor": "backoff_factor",
            "growth_interval": "growth_interval",
        },
        fixed={},
        derive=_nemo,
        invert=lambda p: {"hysteresis": p.hysteresis},
        doc="""NeMo's GradScaler: torch's rule and arithmetic, plus a hysteresis tracker::

        if not finite:
            hysteresis_tracker -= 1               # keeps going negative
            if hysteresis_tracker <= 0: torch's backoff (scale *= backoff_factor)
            growth_tracker = 0
        else:
            torch's growth rule
            hysteresis_tracker = hysteresis       # every finite step refills it

        hysteresis=0 (which NeMo accepts) backs off on every overflow, as 1 does.
        NeMo's load_state_dict looks for a misspelt key and so restarts the tracker
        at 1; lscore restores the saved tracker.
        """,
    ),
    "apex": Spec(
        peer="apex.amp LossScaler",
        args={
            "loss_scale": "dynamic",
            "init_scale": 2.0**16,
            "scale_factor": 2.0,
            "scale_window": 2000,
            "min_loss_scale": None,
            "max_loss_scale": 2.0**24,
        },
        checks={
            "loss_scale": dynamic_or_number,
            "init_scale": f64,
            "scale_factor": real,
            "scale_window": interval,
            "min_loss_scale": optional_truthy(f64),
            "max_loss_scale": cap,
        },
        rename={"scale_window": "growth_interval"},
        fixed=dict(
            precision="float64",
            growth_mode="eq",
            growth_factor=2.0,
            backoff_factor=0.5,
            backoff_mode="multiply",
            guard_finite=False,
        ),
        derive=_apex,
        doc="""apex amp's LossScaler, in Python floats (``scale_factor`` is accepted and, as
        in apex, ignored)::

        loss_scale a number: the scale stays; every step is applied, NaN included
        loss_scale="dynamic": scale = min(init_scale, max_loss_scale), then
            if not finite:
                scale = scale / 2, at least min_loss_scale when that is truthy
                unskipped = 0
            else:
                unskipped += 1
            if unskipped == scale_window:
                scale = min(max_loss_scale, scale * 2); unskipped = 0
        """,
    ),
    "apex_fp16_utils": Spec(
        peer="apex.fp16_utils DynamicLossScaler",
        args={"init_scale": 2**32, "scale_factor": 2.0, "scale_window": 1000},
        checks={"init_scale": f64, "scale_factor": factor_above_one, "scale_window": interval},
        rename={
            "init_scale": "init_scale",
            "scale_factor": "growth_factor",
            "scale_window": "growth_interval",
        },
        fixed=dict(
            precision="float64",
            growth_mode="modulo",
            growth_offset=0,
            backoff_mode="divide",
            min_scale=1.0,
            guard_finite=False,
        ),
        derive=_apex_fp16_utils,
        doc="""apex's legacy fp16_utils DynamicLossScaler, in Python floats::

        if not finite:
            scale = max(scale / scale_factor, 1)
            last_overflow_iter = iter
        elif (iter - last_overflow_iter) % scale_window == 0:
            scale = scale * scale_factor
        iter += 1
        """,
    ),
    "deepspeed": Spec(
        peer="deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
        args={
            "init_scale": 2.0**16,
            "scale_window": 1000,
            "min_scale": 1.0,
            "delayed_shift": 2,
            "consecutive_hysteresis": False,
            "raise_error_at_min_scale": True,
            "loss_scale": 0.0,
        },
        checks={
            "init_scale": f64,
            "scale_window": interval,
            "min_scale": f64,
            "delayed_shift": int_ge1,
            "consecutive_hysteresis": boolean,
            "raise_error_at_min_scale": boolean,
            "loss_scale": zero_or_scale,
        },
        rename={
            "init_scale": "init_scale",
            "scale_window": "growth_interval",
            "min_scale": "min_scale",
            "delayed_shift": "hysteresis",
        },
        fixed=dict(
            precision="float64",
            growth_mode="modulo",
            growth_offset=1,
            growth_factor=2.0,
            backoff_factor=0.5,
            backoff_mode="divide",
            hysteresis_saturate=True,
            guard_finite=True,
        ),
        derive=_deepspeed,
        doc="""DeepSpeed's DynamicLossScaler, in Python floats (factor fixed at 2; the class
        has no defaults, these are ds_config's); ``loss_scale`` > 0 is a ds_config's static
        fp16.loss_scale instead (DeepSpeed's LossScaler: that scale forever, a step that
        overflowed skipped)::

        if not finite:
            if delayed_shift == 1 or cur_hysteresis == 1:
                if scale == min_scale and raise_error_at_min_scale:
                    raise LossScaleFloorError          # nothing changed
                scale = max(scale / 2, min_scale)
            else:
                cur_hysteresis -= 1
            last_overflow_iter = cur_iter
        else:
            if consecutive_hysteresis: cur_hysteresis = delayed_shift
            stable = cur_iter - last_overflow_iter - 1
            if stable > 0 and stable % scale_window == 0:
                if not consecutive_hysteresis: cur_hysteresis = delayed_shift
                scale = scale * 2
        cur_iter += 1

        DeepSpeed's scale can grow to inf, and the next overflow then crashes it
        (OverflowError formatting int(inf)); lscore refuses a growth to inf instead.
        """,
    ),
    "megatron": Spec(
        peer="megatron.core.optimizer.grad_scaler.DynamicGradScaler",
        args={
            "initial_scale": 2.0**32,
            "min_scale": 1.0,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 1000,
            "hysteresis": 2,
        },
        checks={
            "initial_scale": f32,
            "min_scale": f32,
            "growth_factor": factor_above_one,
            "backoff_factor": open_fraction,
            "growth_interval": interval,
            "hysteresis": int_ge1,
        },
        rename={
            "initial_scale": "init_scale",
            "min_scale": "min_scale",
            "growth_factor": "growth_factor",
            "backoff_factor": "backoff_factor",
            "growth_interval": "growth_interval",
            "hysteresis": "hysteresis",
        },
        fixed=dict(
            precision="float32",
            growth_mode="eq",
            backoff_mode="multiply",
            guard_finite=False,
            refill=("growth",),
        ),
        derive=_megatron,
        doc="""Megatron-core's DynamicGradScaler (no class defaults; these are
        OptimizerConfig's), float32 tensors::

        if not finite:
            growth_tracker = 0
            hysteresis_tracker -= 1              # goes negative; refilled only at growth
            if hysteresis_tracker <= 0:
                scale = max(scale * backoff_factor, min_scale)
        else:
            growth_tracker += 1
            if growth_tracker == growth_interval:
                growth_tracker = 0
                hysteresis_tracker = hysteresis
                scale = scale * growth_factor    # no guard: may become inf
        """,
    ),
    "fairseq": Spec(
        peer="fairseq.optim.dynamic_loss_scaler.DynamicLossScaler",
        args={
            "init_scale": 2.0**15,
            "scale_factor": 2.0,
            "scale_window": 2000,
            "tolerance": 0.0,
            "threshold": None,
            "min_loss_scale": 1e-4,
        },
        checks={
            "init_scale": f64,
            "scale_factor": factor_above_one,
            "scale_window": interval,
            "tolerance": non_negative,
            "threshold": optional(non_negative),
            "min_loss_scale": non_negative,
        },
        rename={
            "init_scale": "init_scale",
            "scale_factor": "growth_factor",
            "scale_window": "growth_interval",
            "tolerance": "tolerance",
            "threshold": "min_scale",
            "min_loss_scale": "floor_scale",
        },
        fixed=dict(
            precision="float64",
            growth_mode="modulo",
            growth_offset=0,
            backoff_mode="divide",
            guard_finite=False,
            min_action="raise_below",
        ),
        derive=_fairseq,
        doc="""fairseq's DynamicLossScaler, in Python floats::

        if not finite:                                   # check_overflow
            last_overflow_iter = iter; overflows += 1
            if overflows / (iter - last_rescale_iter) >= tolerance:
                scale = scale / scale_factor, at least threshold if given
                last_rescale_iter = iter; overflows = 0
            if scale <= min_loss_scale:
                restore the old scale; raise LossScaleFloorError
            iter += 1                                    # the step is skipped
        else:                                            # update
            if (iter - last_overflow_iter) % scale_window == 0:
                scale = scale * scale_factor; last_rescale_iter = iter
            iter += 1

        fairseq raises OverflowError to skip a step; lscore returns should_apply
        False.  After its FloatingPointError fairseq leaves ``iter`` unadvanced, so
        its next clean step doubles the scale and its next overflow divides by zero;
        lscore continues as after any other overflow.
        """,
    ),
    "paddle": Spec(
        peer="paddle.amp.GradScaler (dygraph)",
        args={
            "enable": True,
            "init_loss_scaling": 2.0**16,
            "incr_ratio": 2.0,
            "decr_ratio": 0.5,
            "incr_every_n_steps": 2000,
            "decr_every_n_nan_or_inf": 1,
            "use_dynamic_loss_scaling": True,
        },
        checks={
            "enable": boolean,
            "init_loss_scaling": f32,
            "incr_ratio": factor_above_one,
            "decr_ratio": open_fraction,
            "incr_every_n_steps": interval,
            "decr_every_n_nan_or_inf": int_ge1,
            "use_dynamic_loss_scaling": boolean,
        },
        rename={
            "init_loss_scaling": "init_scale",
            "incr_ratio": "growth_factor",
            "decr_ratio": "backoff_factor",
            "incr_every_n_steps": "growth_interval",
            "decr_every_n_nan_or_inf": "hysteresis",
        },
        fixed=dict(
            precision="float32",
            growth_mode="eq",
            backoff_mode="multiply",
            guard_finite=False,
            refill=("finite", "backoff"),
        ),
        derive=_paddle,
        doc="""Paddle's dygraph GradScaler, float32 tensors::

        if not finite:
            incr_count = 0; decr_count += 1
            if decr_count == decr_every_n_nan_or_inf:
                scale = scale * decr_ratio; decr_count = 0     # no floor
        else:
            decr_count = 0; incr_count += 1
            if incr_count == incr_every_n_steps:
                scale = scale * incr_ratio; incr_count = 0      # no guard

        use_dynamic_loss_scaling=False: the scale stays, non-finite steps are skipped.
        enable=False: scale 1.0, every step applied.
        """,
    ),
    "jmp": Spec(
        peer="jmp.DynamicLossScale",
        args={
            "loss_scale": REQUIRED,
            "counter": 0,
            "period": 2000,
            "factor": 2,
            "min_loss_scale": 1.0,
        },
        checks={
            "loss_scale": f32,
            "counter": int_ge0,
            "period": interval,
            "factor": factor_above_one,
            "min_loss_scale": f32,
        },
        rename={
            "loss_scale": "init_scale",
            "period": "growth_interval",
            "factor": "growth_factor",
            "min_loss_scale": "min_scale",
        },
        fixed=dict(
            precision="float32",
            growth_mode="eq",
            backoff_mode="divide",
            guard_finite=True,
            flush_subnormal=True,
        ),
        derive=_jmp,
        counters=lambda a: {"good_steps": a["counter"]},
        doc="""jmp's DynamicLossScale, float32 arrays (XLA on CPU flushes subnormals)::

        if grads_finite:
            if counter == period - 1:
                loss_scale = loss_scale * factor if that is finite else loss_scale
            counter = (counter + 1) % period
        else:
            counter = 0
            loss_scale = max(min_loss_scale, loss_scale / factor)
        """,
    ),
    "colossalai": Spec(
        peer="colossalai DynamicGradScaler",
        args={
            "initial_scale": 2**16,
            "growth_factor": 2,
            "backoff_factor": 0.5,
            "growth_interval": 1000,
            "min_scale": None,
            "max_scale": None,
            "hysteresis": 2,
            "verbose": False,
        },
        checks={
            "initial_scale": f32,
            "growth_factor": factor_above_one,
            "backoff_factor": open_fraction,
            "growth_interval": interval,
            "min_scale": optional_truthy(f32),
            "max_scale": optional_truthy(f32),
            "hysteresis": int_ge0,
            "verbose": boolean,
        },
        rename={
            "initial_scale": "init_scale",
            "growth_factor": "growth_factor",
            "backoff_factor": "backoff_factor",
            "growth_interval": "growth_interval",
            "min_scale": "min_scale",
            "max_scale": "max_scale",
        },
        fixed=dict(
            precision="float32",
            growth_mode="eq",
            backoff_mode="multiply",
            guard_finite=False,
            refill=("growth",),
        ),
        derive=_colossalai,
        doc="""ColossalAI's DynamicGradScaler, float32 tensors::

        if not finite:
            hysteresis_step += 1; growth_step = 0
            if hysteresis_step >= hysteresis:
                scale = scale * backoff_factor, at least min_scale if truthy
        else:
            growth_step += 1
            if growth_step == growth_interval:
                growth_step = hysteresis_step = 0
                scale = scale * growth_factor, at most max_scale if truthy
        """,
    ),
    "chainer": Spec(
        peer="chainer Optimizer.loss_scaling(interval, scale)",
        args={"interval": 1000, "scale": None},
        checks={"interval": int_ge1, "scale": optional(f64)},
        rename={},
        fixed=dict(
            precision="float64",
            growth_mode="eq",
            growth_interval=1,
            init_scale=1.0,
            growth_factor=2.0,
            backoff_factor=0.5,
            backoff_mode="multiply",
            min_scale=1.0,
            max_scale=65504.0,
            guard_finite=False,
        ),
        derive=_chainer,
        doc="""Chainer's loss scaling, in Python floats::

        scale given: the scale stays; gradients are not checked (every step applied)
        scale=None: scale = 1, then after every step
            m = 0.5 if not finite else (2 ** (1 / interval) if an overflow was ever
                                        seen else 2)
            scale = max(1, min(65504, scale * m))
        """,
    ),
    "mxnet": Spec(
        peer="mxnet.contrib.amp LossScaler",
        args={"loss_scale": 2.0**16, "max_loss_scale": 2.0**24, "scale_seq_len": 2000},
        checks={"loss_scale": f64, "max_loss_scale": f64, "scale_seq_len": interval},
        rename={
            "loss_scale": "init_scale",
            "max_loss_scale": "max_scale",
            "scale_seq_len": "growth_interval",
        },
        fixed=dict(
            precision="float64",
            growth_mode="eq",
            growth_factor=2.0,
            backoff_factor=0.5,
            backoff_mode="multiply",
            guard_finite=False,
            apply_next=True,
        ),
        derive=None,
        doc="""MXNet's contrib.amp LossScaler (no constructor arguments in MXNet; its fixed
        attributes are keywords here), in Python floats; each check first adopts the
        scale computed by the previous one::

        loss_scale = next_loss_scale
        if not finite:
            next_loss_scale = loss_scale / 2; unskipped = 0
        else:
            unskipped += 1
        if unskipped == scale_seq_len:
            unskipped = 0; next_loss_scale = min(max_loss_scale, loss_scale * 2)
        """,
    ),
}

#: every preset name, sorted
NAMES = tuple(sorted(TABLE))


def resolve(name: object, kwargs: dict) -> tuple[Spec, dict]:
    """The spec of `name` and its checked arguments, defaults filled in."""
    if not isinstance(name, str) or name not in TABLE:
        raise ValueError(f"unknown preset {name!r}; expected one of: {', '.join(NAMES)}")
    spec = TABLE[name]
    unknown = [k for k in kwargs if k not in spec.args]
    if unknown:
        raise TypeError(
            f"preset {name!r} ({spec.peer}) got an unexpected argument "
            f"{unknown[0]!r}; its arguments are: {', '.join(spec.args)}"
        )
    args = {**spec.args, **kwargs}
    missing = [k for k, v in args.items() if v is REQUIRED]
    if missing:
        raise TypeError(
            f"preset {name!r} ({spec.peer}) is missing the required argument"
            f"{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}"
        )
    return spec, {k: spec.checks[k](k, v) for k, v in args.items()}


def policy(name: str, args: dict) -> Policy:
    """The Policy of preset `name` for checked arguments `args`."""
    spec = TABLE[name]
    fields = dict(spec.fixed)
    fields.update({spec.rename[k]: v for k, v in args.items() if k in spec.rename})
    if spec.derive is not None:
        fields.update(spec.derive(args))
    if fields.get("growth_mode") == "never":
        fields = {
            k: v
            for k, v in fields.items()
            if k in ("init_scale", "growth_mode", "apply_nonfinite", "precision")
        }
        fields.setdefault("init_scale", args.get(_init_arg(spec)))
    return Policy(name=name, **fields)


def _init_arg(spec: Spec) -> str | None:
    return next((k for k, v in spec.rename.items() if v == "init_scale"), None)


def initial_counters(name: str, args: dict) -> dict:
    """The counters preset `name` starts with for its arguments `args` (empty if none)."""
    spec = TABLE[name]
    return spec.counters(args) if spec.counters is not None else {}
