"""The GradScaler front's helpers: torch's policy, the ``policy=`` argument, float16
advice, torch's warning for CUDA missing, autograd dtypes (``enabled="auto"``), nested
outputs scaled per device, and how its methods run inside ``torch.compile``.

``torch_policy`` is torch.amp.GradScaler's policy (the "torch" row of the preset
table) with its four numbers and lscore's clamps; ``is_torch_shape`` says whether a
policy behaves as torch's.  ``starting_state`` turns the constructor's arguments into
the scaler's state machine: ``resolve_policy`` reads what ``GradScaler(policy=...)``
accepts (a preset name, a Policy, a config or state dict, an lscore loss scale) as
a Policy and an optional starting state; ``policy_clash`` words the refusal of
torch-named arguments passed beside it, showing the call to use.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
import warnings
from collections import abc
from typing import Any

import torch

import lscore
import lscore.adapters
from lscore.policy import Policy, scale_bounds
from lscore.presets import table as preset_table
from lscore.state import FORMAT, LossScaleState

# torch.amp.GradScaler's defaults for its four numbers (the "torch" row of the preset table)
TORCH_ARGS = preset_table.TABLE["torch"].args


def torch_policy(
    init_scale: Any = TORCH_ARGS["init_scale"],
    growth_factor: Any = TORCH_ARGS["growth_factor"],
    backoff_factor: Any = TORCH_ARGS["backoff_factor"],
    growth_interval: Any = TORCH_ARGS["growth_interval"],
    *,
    min_scale: Any = None,
    max_scale: Any = None,
    hysteresis: Any = 1,
) -> Policy:
    """The Policy of ``torch.amp.GradScaler``, plus lscore's clamps and hysteresis.

    ``hysteresis`` overflows in a row are needed for one backoff; every finite
    step refills the count (NeMo's rule); 1 is torch's behaviour.  A
    ``min_scale`` above or a ``max_scale`` below ``init_scale`` is refused.
    With the defaults of the keyword arguments it is ``lscore.preset("torch")``'s
    policy.
    """
    p = Policy(
        name="torch",
        **{
            **preset_table.TORCH,
            "init_scale": init_scale,
            "growth_factor": growth_factor,
            "backoff_factor": backoff_factor,
            "growth_interval": growth_interval,
            "hysteresis": hysteresis,
            "min_scale": min_scale,
            "max_scale": max_scale,
        },
    )
    scale_bounds(p.init_scale, p.min_scale, p.max_scale)
    return p


# torch's fields as a validated Policy holds them (the table's, normalised once)
_TORCH_SHAPE = {k: getattr(torch_policy(), k) for k in preset_table.TORCH}


def is_torch_shape(p: Policy) -> bool:
    """True when `p` behaves exactly as torch.amp.GradScaler with p's four numbers (then
    torch's own update kernel can run).  Reads p's fields; builds nothing."""
    return all(getattr(p, k) == v for k, v in _TORCH_SHAPE.items())


FP16_HELP = (
    "The parameters themselves are float16: keep float32 master weights (leave the "
    "model in float32 and compute in float16 under torch.autocast, or keep a float32 "
    "copy for the optimizer), since float16 weights lose small updates.  To unscale "
    "float16 gradients anyway, pass GradScaler(..., allow_fp16_params=True)."
)


def fp16_help(e: ValueError) -> ValueError:
    """torch's refusal of float16 gradients with the advice added to its message.

    torch's sentence comes first, so code that matches the message's start (as
    ``pytest.raises(match=...)`` does) still matches it.
    """
    return ValueError(f"{e} {FP16_HELP}")


# code in these folders is lscore's (lscore and lscore.adapters may be installed apart, in
# an editable install) or torch's (the eager twin torch.compiler.disable wraps around a call)
_NOT_CALLERS = tuple(
    os.path.dirname(path) + os.sep
    for path in (lscore.__file__, lscore.adapters.__file__, torch.__file__)
    if path is not None
)


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointing at the first line outside lscore and torch: the user's call.

    A fixed ``stacklevel`` would count the frames of ``outside_graph``'s wrapper
    and of the method itself, which differ between eager and compiled calls.
    """
    level = 2  # the caller of this function
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_NOT_CALLERS):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def outside_graph(method: Any) -> Any:
    """`method`, run eagerly (under ``torch.compiler.disable``) when called from code
    that ``torch.compile`` traces.

    dynamo cannot trace the scaler's compiled state machine and breaks the graph
    wherever it gives up (five times in one step); a disabled call is one call it
    leaves alone, as it leaves torch's own scaler.  ``torch.compiler.disable``
    imports dynamo (about a second), so the disabled twin is made at the first
    traced call, not at import; eager calls take the plain method.
    """
    disabled = None
    is_compiling = torch.compiler.is_compiling

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if not is_compiling():
            return method(*args, **kwargs)
        if disabled is None:
            disabled = torch.compiler.disable(method)
        return disabled(*args, **kwargs)

    return run


def zero_d(value: Any) -> Any:
    """A 0-d tensor's number (torch's ``fill_`` takes one); other values unchanged."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.dim() != 0:
        raise RuntimeError(
            f"fill_ only supports 0-dimension value tensor but got tensor "
            f"with {value.dim()} dimensions."
        )
    return value.item()


def graph_dtypes(outputs: Any) -> set:
    """The dtypes flowing through the autograd graph behind `outputs` (one walk)."""
    seen, dtypes = set(), set()
    stack = [t.grad_fn for t in tensors(outputs) if t.grad_fn is not None]
    dtypes |= {t.dtype for t in tensors(outputs)}
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for meta in getattr(node, "_input_metadata", ()):
            dtypes.add(meta.dtype)
        stack.extend(f for f, _ in node.next_functions)
    return dtypes


def no_fp16_warning(outputs: Any) -> str | None:
    """``enabled="auto"``'s decision: None when a float16 tensor feeds `outputs` (the loss),
    otherwise the warning of a scaler that disables itself."""
    dtypes = graph_dtypes(outputs)
    if torch.float16 in dtypes:
        return None
    kinds = ", ".join(sorted(str(d).replace("torch.", "") for d in dtypes)) or "none"
    return (
        f"GradScaler(enabled='auto'): no float16 tensor behind the loss "
        f"(dtypes seen: {kinds}); bfloat16 and float32 training need no loss "
        f"scaling, so this scaler is disabled."
    )


def cuda_missing(device: str, enabled: Any) -> bool:
    """Whether an enabled ``"cuda"`` scaler finds no CUDA (nor torch_xla): then it warns,
    as torch's does, and the scaler disables itself."""
    if not (device == "cuda" and enabled):
        return False
    if torch.cuda.is_available() or importlib.util.find_spec("torch_xla"):
        return False
    warn_at_caller("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.")
    return True


def scale_nested(outputs: Any, scale_on: Any) -> Any:
    """`outputs`, nested lists, tuples or iterables of tensors, each times the scale, copied
    once to each device (`scale_on(device)`: the scale tensor, created there the first
    time), as torch's ``scale()`` does with its ``_MultiDeviceReplicator``."""
    per_device: dict = {}

    def apply_scale(val: Any) -> Any:
        if isinstance(val, torch.Tensor):
            s = per_device.get(val.device)
            if s is None:
                s = scale_on(val.device).to(device=val.device, non_blocking=True, copy=True)
                per_device[val.device] = s
            return val * s
        if isinstance(val, abc.Iterable):
            it = map(apply_scale, val)
            if isinstance(val, (list, tuple)):
                return type(val)(it)
            return it
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    return apply_scale(outputs)


def tensors(outputs: Any) -> list:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, abc.Iterable) and not isinstance(outputs, (str, bytes)):
        return [t for x in outputs for t in tensors(x)]
    return []


class ScalerConfigError(ValueError, AssertionError):
    """A bad constructor argument that torch's GradScaler rejects with AssertionError."""


# the defaults of the arguments that policy= replaces (passing another value beside it
# is refused): GradScaler's, which are torch_policy's
_DEFAULTS = {k: p.default for k, p in inspect.signature(torch_policy).parameters.items()}
_FACTORS = ("growth_factor", "backoff_factor", "growth_interval")


def starting_state(
    policy: Any, torch_args: tuple, lscore_args: tuple
) -> tuple[LossScaleState, float, tuple]:
    """(state machine, the scale to report before the first scale(), torch's growth
    factor, backoff factor and growth interval) from GradScaler's `policy` and its other
    numeric arguments: `torch_args` torch's four, `lscore_args` min_scale, max_scale and
    hysteresis (torch_policy's order)."""
    given = dict(zip(_DEFAULTS, (*torch_args, *lscore_args), strict=True))
    if given["growth_factor"] <= 1.0:
        raise ScalerConfigError("The growth factor must be > 1.0.")
    if given["backoff_factor"] >= 1.0:
        raise ScalerConfigError("The backoff factor must be < 1.0.")
    v1 = None
    if policy is None:
        p = torch_policy(**given)
        raw = tuple(given[k] for k in ("init_scale", *_FACTORS))
    else:
        clash = {k: v for k, v in given.items() if v != _DEFAULTS[k]}
        if clash:
            raise ValueError(policy_clash(policy, clash))
        p, v1 = resolve_policy(policy)
        raw = tuple(getattr(p, k) for k in ("init_scale", *_FACTORS))
    state = LossScaleState(p)
    if v1 is not None:
        state.load_state_dict(v1)
    return state, state.scale if v1 is not None else raw[0], raw[1:]


def preset_function(name: str) -> Any:
    """``lscore.preset``; ImportError naming the folder when a stray one shadows lscore."""
    preset = getattr(lscore, "preset", None)
    if preset is not None:
        return preset
    where = getattr(lscore, "__file__", None)
    if where is None:  # a folder without __init__.py: Python's namespace package
        folders = ", ".join(map(str, getattr(lscore, "__path__", ())))
        raise ImportError(
            f"policy={name!r} needs lscore.preset, but the module lscore is the "
            f"folder {folders}, not the installed package: a folder named "
            "lscore (without __init__.py) in the current directory or on "
            "sys.path shadows it; rename that folder or run from elsewhere"
        )
    raise ImportError(
        f"policy={name!r} needs lscore.preset, but the module lscore is "
        f"{where}, which does not define it: is another package named lscore "
        "shadowing the installed one?"
    )


def policy_clash(policy: Any, clash: dict) -> str:
    """The error for torch-named arguments passed with ``policy=``, with the call to use."""
    names = ", ".join(clash)
    got = ", ".join(f"{k}={v!r}" for k, v in clash.items())
    head = f"{names} cannot be passed with policy= (policy= sets every parameter), got {got}"
    if isinstance(policy, Policy):
        return f"{head}; use GradScaler(policy=policy.replace({got}))"
    spec = preset_table.TABLE.get(policy) if isinstance(policy, str) else None
    if spec is None:
        return f"{head}; set them in the policy itself"
    peer = {}
    for k in clash:
        own = k if k in spec.args else next((a for a, f in spec.rename.items() if f == k), None)
        if own is None:
            return (
                f"{head}; preset {policy!r} ({spec.peer}) has no argument for {k}: its "
                f"arguments are {', '.join(spec.args)}, passed as "
                f"GradScaler(policy=lscore.preset({policy!r}, ...))"
            )
        peer[own] = clash[k]
    args = "".join(f", {k}={v!r}" for k, v in peer.items())
    args += "".join(
        f", {k}=..." for k, v in spec.args.items() if v is preset_table.REQUIRED and k not in peer
    )
    return (
        f"{head}; a preset takes its peer's own arguments: use "
        f"GradScaler(policy=lscore.preset({policy!r}{args}))"
    )


def resolve_policy(policy: Any) -> tuple[Policy, dict | None]:
    """(Policy, v1 state or None) from what ``policy=`` accepts."""
    if isinstance(policy, Policy):
        return policy, None
    if isinstance(policy, LossScaleState):
        return policy.policy, policy.state_dict()
    if isinstance(policy, str):
        return resolve_policy(preset_function(policy)(policy))
    if isinstance(policy, dict):
        if "format" in policy:
            return LossScaleState.from_state_dict(policy).policy, policy
        return Policy.from_dict(policy), None
    state = getattr(policy, "state", None)  # a LossScale, e.g. lscore.preset(...)
    if isinstance(state, LossScaleState):
        return state.policy, state.state_dict()
    raise TypeError(
        f"policy must be a preset name, an lscore Policy, a config dict or a "
        f"{FORMAT!r} state dict, got {type(policy).__name__}"
    )
