"""One table: each peer's loss-scale policy as core parameters, and its argument names.

The rows are data, in ``table.json`` beside this module (one entry per peer,
citing the peer's source): the peer's constructor arguments with the peer's
own defaults, each with its check (a validator of ``_spec`` or ``policy``, by
name; the error names the peer's argument) and the ``Policy`` field it is
taken as, if any; the fields the peer fixes; and the pseudocode that becomes
the docstring of the preset's class.  The rules no row can hold are code
here: ``derive`` (checked args -> more Policy fields), ``invert`` (Policy ->
peer arguments not renamed, used by ``lscore.migrate``) and ``counters``.
"""

from __future__ import annotations

import importlib.resources
import json
import math
from typing import Any

from lscore import policy as _policy
from lscore.policy import Policy
from lscore.presets import _spec
from lscore.presets._spec import REQUIRED, Spec

_DATA = json.loads(
    importlib.resources.files("lscore.presets").joinpath("table.json").read_text(encoding="utf-8")
)


def _fields(d: dict) -> dict:
    """Policy fields read from JSON: its lists are tuples (``refill``)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


# the Policy fields several rows (and lscore.adapters.torch) share, by name
_SHARED = {name: _fields(fields) for name, fields in _DATA["shared"].items()}
FIXED_SCALE = _SHARED["FIXED_SCALE"]
# A step skipped by a peer that keeps its scale fixed but still checks (Paddle static).
FIXED_SCALE_SKIPPING = _SHARED["FIXED_SCALE_SKIPPING"]
TF_DYNAMIC = _SHARED["TF_DYNAMIC"]
# torch.amp.GradScaler's policy, its one definition: every Policy field except the four
# numbers its constructor takes (the "torch" row's args), hysteresis, floor and cap as in
# torch (none).  The "nemo" row and lscore.adapters.torch.GradScaler build on it, and that
# GradScaler runs torch's own update kernel exactly for policies with these values.  At
# hysteresis 1 every refill rule gives torch's scales; "finite" is NeMo's, the rule the
# GradScaler's hysteresis follows.
TORCH = _SHARED["TORCH"]


def _backoff_by_division(arg: str) -> Any:
    """A peer that divides by its multiplier `arg` on overflow: the backoff factor 1 / it."""
    return lambda a: {"backoff_factor": 1.0 / a[arg]}


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


# the rules of each peer that are code, by preset name
DERIVE = {
    "tf2": _backoff_by_division("multiplier"),
    "keras2": _keras2,
    "keras3": _keras3,
    "torch": _torch,
    "nemo": _nemo,
    "apex": _apex,
    "apex_fp16_utils": _backoff_by_division("scale_factor"),
    "deepspeed": _deepspeed,
    "megatron": _megatron,
    "fairseq": _backoff_by_division("scale_factor"),
    "paddle": _paddle,
    "jmp": _backoff_by_division("factor"),
    "colossalai": _colossalai,
    "chainer": _chainer,
}
INVERT = {
    "keras2": lambda p: (
        {"dynamic": False, "initial_scale": p.init_scale}
        if p.growth_mode == "never"
        else {"initial_scale": p.init_scale, "dynamic_growth_steps": p.growth_interval}
    ),
    "nemo": lambda p: {"hysteresis": p.hysteresis},
}
COUNTERS = {"jmp": lambda a: {"good_steps": a["counter"]}}
# "optional f32": None passes unchecked; "truthy f32": None and 0 pass (disabled)
_WRAPS = {"optional": _spec.optional, "truthy": _spec.optional_truthy}


def _check(name: str) -> Any:
    """The validator a row names: a function of ``_spec`` or ``policy``, maybe wrapped."""
    wrap, _, inner = name.rpartition(" ")
    check = getattr(_spec, inner, None) or getattr(_policy, inner)
    return _WRAPS[wrap](check) if wrap else check


def _row(name: str, row: dict) -> Spec:
    """One preset's Spec from its entry in table.json."""
    args = row["args"]
    fixed = row["fixed"]
    return Spec(
        peer=row["peer"],
        args={a: REQUIRED if d == "<required>" else d for a, d, _, _ in args},
        checks={a: _check(check) for a, _, check, _ in args},
        rename={a: field for a, _, _, field in args if field is not None},
        fixed=_SHARED[fixed] if isinstance(fixed, str) else _fields(fixed),
        derive=DERIVE.get(name),
        doc="\n".join(row["doc"]),
        counters=COUNTERS.get(name),
        invert=INVERT.get(name),
        source=row["source"],
    )


TABLE: dict[str, Spec] = {name: _row(name, row) for name, row in _DATA["presets"].items()}

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
