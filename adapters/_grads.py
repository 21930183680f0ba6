"""The gradient lists the array wrappers take, checked as tf-keras and torch check them.

``grads_and_vars`` as (gradient, variable) pairs, Keras's rule for None gradients,
the float16-variable and integer-gradient refusals, and the checked call of a
``loss_and_grads_fn(scale) -> (loss, grads)``.  The NumPy and CuPy wrappers (both
modes) and the torch wrapper's TF1 methods read them; nothing here knows an array type.
"""

from __future__ import annotations

import itertools
import operator
import warnings
from typing import Any

from lscore.adapters._wrapper import type_name
from lscore.scan import is_integer_dtype, not_float_error


def grad_var_pairs(grads_and_vars: Any) -> list:
    """``grads_and_vars`` as a list of (gradient, variable) tuples; TypeError if malformed."""
    pairs = []
    for item in grads_and_vars:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"grads_and_vars must hold (gradient, variable) pairs, got {item!r}")
        pairs.append((item[0], item[1]))
    return pairs


def drop_none_gradients(pairs: list, *, warn: bool) -> list:
    """Keras's rule: (None, var) pairs are dropped; if every gradient is None, ValueError."""
    kept = [(g, v) for g, v in pairs if g is not None]
    if pairs and not kept:
        raise ValueError(
            f"No gradients provided for any variable: all {len(pairs)} gradients are None"
        )
    if warn and len(kept) < len(pairs):
        missing = [i for i, (g, _) in enumerate(pairs) if g is None]
        warnings.warn(
            f"Gradients do not exist for variables at positions {missing} when "
            "minimizing the loss; those variables are left unchanged",
            stacklevel=3,
        )
    return kept


def unzip(pairs: list) -> tuple[list, list]:
    """([gradient, ...], [variable, ...]) of (gradient, variable) pairs."""
    return [g for g, _ in pairs], [v for _, v in pairs]


def without_none(grads: list, variables: list, *, warn: bool) -> tuple[list, list]:
    """(gradients, variables) without the pairs whose gradient is None (Keras's rule)."""
    if not any(map(operator.is_, grads, itertools.repeat(None))):
        return grads, variables  # the common step: nothing to drop, no pairs built
    pairs = list(zip(grads, variables, strict=True))
    return unzip(drop_none_gradients(pairs, warn=warn))


def variable_list(var_list: Any) -> list:
    """``list(var_list)``; a single array (anything with a ``shape``) is a TypeError, as
    iterating it would give its rows, not one variable."""
    if hasattr(var_list, "shape"):
        raise TypeError(
            f"var_list must be a list of arrays, got a single {type_name(var_list)}: "
            "pass [w] for one variable"
        )
    return list(var_list)


FP16_VARIABLES = (
    "Attempting to apply gradients to float16 variables. The variables themselves are "
    "float16: keep float32 master weights (keep the variables in float32 and compute in "
    "float16 from a float16 copy), since float16 weights lose small updates.  To update "
    "float16 variables anyway, pass LossScaleOptimizer(..., allow_fp16_params=True)."
)


def check_variable_dtypes(variables: Any, allow_fp16: bool) -> None:
    """The torch GradScaler's refusal of float16 parameters, for array variables: a
    ValueError with the same advice unless `allow_fp16` (``allow_fp16_params=True``)."""
    if allow_fp16:
        return
    # the distinct dtypes in one pass (a set), then one test per dtype: a step's cost
    # stays about one attribute read per variable
    for dt in {getattr(v, "dtype", None) for v in variables}:
        if getattr(dt, "kind", None) == "f" and getattr(dt, "itemsize", None) == 2:
            raise ValueError(FP16_VARIABLES)


def check_gradient_dtypes(grads: list) -> None:
    """Integer and bool gradients are refused before anything changes (TypeError naming
    the dtype): the scale cannot be divided out of them, and a cast would drop the step."""
    for dt in {getattr(g, "dtype", None) for g in grads}:
        if getattr(dt, "kind", "f") != "f" and is_integer_dtype(dt):
            i = next(i for i, g in enumerate(grads) if getattr(g, "dtype", None) == dt)
            raise not_float_error("LossScaleOptimizer", f"gradient {i}", dt)


def loss_and_grads(loss_and_grads_fn: Any, var_list: Any, scale: Any, xp: Any) -> Any:
    """(loss, scaled grads, var_list) from ``loss_and_grads_fn(scale)``, checked; `xp` is
    the array module, named when a loss value comes instead of a function."""
    if not callable(loss_and_grads_fn):
        # TF1 code passes its loss tensor here; without autodiff there is nothing to
        # differentiate it with
        raise TypeError(
            f"{xp.__name__} has no autodiff, so a loss value cannot be "
            "differentiated here: loss_and_grads_fn must be a callable "
            "fn(scale) -> (loss, grads) that runs your backward pass seeded "
            f"with scale, got {type_name(loss_and_grads_fn)}"
        )
    var_list = variable_list(var_list)
    out = loss_and_grads_fn(scale)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"loss_and_grads_fn(scale) must return (loss, grads), got {type_name(out)}")
    loss, grads = out[0], list(out[1])
    if len(grads) != len(var_list):
        raise ValueError(
            f"loss_and_grads_fn returned {len(grads)} gradients for {len(var_list)} variables"
        )
    check_gradient_dtypes(grads)
    return loss, grads, var_list
