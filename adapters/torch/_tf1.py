"""The checks of TF1's training-loop arguments for the torch ``LossScaleOptimizer``:
``global_step`` as a tensor, ``compute_gradients``'s graph options, its ``var_list``
and ``apply_gradients``' pairs, each against the wrapped optimizer's groups."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lscore.adapters._grads import drop_none_gradients, grad_var_pairs, variable_list
from lscore.adapters._wrapper import type_name

# tf.compat.v1.train.Optimizer's values, which TF1 code passes as gate_gradients
GATE_NONE, GATE_OP, GATE_GRAPH = 0, 1, 2


def tensor_counter(global_step: Any) -> Any:
    """In-place ``add(delta)`` for a 0-d integer tensor (TF1's int64 global_step variable)."""
    if not isinstance(global_step, torch.Tensor):
        return None
    dtype = global_step.dtype
    if global_step.dim() != 0 or dtype.is_floating_point or dtype.is_complex or dtype is torch.bool:
        raise TypeError(
            f"global_step must be a 0-d integer tensor, got shape "
            f"{tuple(global_step.shape)} and dtype {dtype}"
        )

    def add(delta: Any) -> None:
        with torch.no_grad():
            global_step.add_(delta)

    return add


def check_graph_options(
    gate_gradients: Any, aggregation_method: Any, colocate_gradients_with_ops: Any
) -> None:
    """TF1's graph-building options of ``compute_gradients``: what they ask for is what
    eager autograd does anyway, except a choice of aggregation, which has none here."""
    if gate_gradients not in (GATE_NONE, GATE_OP, GATE_GRAPH):
        raise ValueError(
            "gate_gradients must be one of: Optimizer.GATE_NONE, "
            f"Optimizer.GATE_OP, Optimizer.GATE_GRAPH.  Not {gate_gradients}"
        )
    if aggregation_method is not None:
        raise ValueError(
            "aggregation_method must be None: torch's autograd sums a "
            "variable's gradient contributions itself and TF's methods only "
            f"schedule that sum in a graph, got {aggregation_method!r}"
        )
    if not isinstance(colocate_gradients_with_ops, (bool, np.bool_)):
        raise TypeError(
            "colocate_gradients_with_ops must be a bool, got "
            f"{type_name(colocate_gradients_with_ops)}"
        )


def trainable(param_groups: list, var_list: Any) -> list:
    """``compute_gradients``' `var_list`, checked; TF1's default is the trainable variables:
    here every parameter of the wrapped optimizer's groups that requires grad."""
    if var_list is None:
        var_list = [p for g in param_groups for p in g["params"] if p.requires_grad]
    var_list = variable_list(var_list)
    if not var_list:
        raise ValueError("No variables to optimize.")
    for i, v in enumerate(var_list):
        if not isinstance(v, torch.Tensor) or not v.requires_grad:
            raise ValueError(
                f"var_list[{i}] must be a tensor that requires grad, got "
                f"{type_name(v)}"
                + ("" if not isinstance(v, torch.Tensor) else " with requires_grad=False")
            )
    return var_list


def step_pairs(grads_and_vars: Any, param_groups: list, *, warn: bool) -> list:
    """The pairs of ``apply_gradients``, checked against the wrapped optimizer's groups;
    None gradients dropped (with a warning when `warn`)."""
    pairs = grad_var_pairs(grads_and_vars)
    if not pairs:
        raise ValueError("No variables provided.")
    params = {id(p) for g in param_groups for p in g["params"]}
    seen = set()
    for i, (g, v) in enumerate(pairs):
        if g is not None and not isinstance(g, torch.Tensor):
            raise TypeError(f"gradient {i} must be a tensor or None, got {type_name(g)}")
        if id(v) not in params:
            # the inner optimizer keeps state and hyperparameters per parameter it holds
            raise ValueError(f"variable {i} is not a parameter of the wrapped optimizer")
        if id(v) in seen:
            raise ValueError(f"variable {i} appears twice in grads_and_vars")
        seen.add(id(v))
    return drop_none_gradients(pairs, warn=warn)
