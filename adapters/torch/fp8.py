"""FP8 training emulated on any machine: ``nn.Linear`` layers that quantize their operands.

A converted layer quantizes its input and weight to the recipe's forward format and, in the
backward, its output gradient to the backward format, then multiplies the dequantized operands in
float32 and rounds the product to the input's dtype: the numerics of an FP8 GEMM (operands on the
FP8 grid, a float32 accumulator) on a CPU or a GPU without FP8 units. The operands and the
products are those of torchao's ``Float8Linear`` with ``emulate=True``
(``torchao/float8/float8_linear.py`` and ``float8_ops.py``, v0.18.0): under the
``torchao-tensorwise`` and ``torchao-rowwise`` recipes the outputs and gradients are bitwise
torchao's. Current-scaling recipes take each scale from the tensor being cast; the ``te-delayed``
recipe keeps TransformerEngine's per-layer state and is updated once per step by
:func:`fp8_update`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

import numpy as np
import torch
from torch import nn

import lscore.fp8
from lscore.adapters.torch._linear import EmulatedLinear
from lscore.adapters.torch.mx import MXLinear
from lscore.adapters.torch.quantize import quantize, quantize_current

__all__ = ["DelayedFloat8Linear", "Float8Linear", "convert_to_float8", "fp8_update"]

# the three tensors a layer casts, in the order of a delayed layer's state
_INPUT, _WEIGHT, _GRAD_OUTPUT = 0, 1, 2


def _recipe(recipe: str | lscore.fp8.Recipe) -> lscore.fp8.Recipe:
    r = _any_recipe(recipe)
    if not isinstance(r, lscore.fp8.Recipe):
        raise ValueError(
            f"Float8Linear takes a per-tensor recipe, got the block recipe {r.name!r}; "
            f"use MXLinear or convert_to_float8"
        )
    return r


def _any_recipe(
    recipe: str | lscore.fp8.Recipe | lscore.fp8.BlockRecipe,
) -> lscore.fp8.Recipe | lscore.fp8.BlockRecipe:
    if isinstance(recipe, lscore.fp8.Recipe | lscore.fp8.BlockRecipe):
        return recipe
    if not isinstance(recipe, str):
        raise TypeError(
            f"recipe must be a recipe name or an lscore.fp8.Recipe or lscore.fp8.BlockRecipe, "
            f"got {type(recipe).__qualname__}"
        )
    return lscore.fp8.recipe(recipe)


def _layout(t: torch.Tensor, transposed: bool) -> torch.Tensor:
    """``t`` stored row-major, or column-major when ``transposed``.

    The float32 GEMM's result can depend on its operands' memory order, so each operand is
    handed over in the order torchao's emulation hands it over.
    """
    return t.t().contiguous().t() if transposed else t.contiguous()


class _Float8MatMul(torch.autograd.Function):
    """``x @ weight.T`` with float8 operands in the forward and the backward."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, layer: Float8Linear
    ) -> torch.Tensor:
        ctx.layer = layer
        rows = layer.recipe.granularity == "row"
        fwd = layer.recipe.forward_format
        # torchao scales the input per row and the weight per output feature (a row of weight)
        xq = layer._cast(x, _INPUT, fwd)
        wq = layer._cast(weight, _WEIGHT, fwd)
        if rows:
            # the backward casts these along the other axis, so it needs them unquantized
            ctx.save_for_backward(x, weight)
        else:
            # per tensor the backward's casts are the forward's: keep the float8 operands
            ctx.save_for_backward(*xq, *wq)
        out = torch.mm(_dequant(xq), _dequant(wq).t())
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        layer: Float8Linear = ctx.layer
        bwd = layer.recipe.backward_format
        fwd = layer.recipe.forward_format
        if layer.recipe.granularity == "row":
            x, weight = ctx.saved_tensors
            g_rows = _dequant(layer._cast(grad, _GRAD_OUTPUT, bwd))
            # weight scaled per input feature, grad_output and input per column
            w_cols = _layout(_dequant(layer._cast(weight.t(), _WEIGHT, fwd)).t(), False)
            g_cols = _layout(_dequant(layer._cast(grad.t(), _GRAD_OUTPUT, bwd)), True)
            x_cols = _layout(_dequant(layer._cast(x.t(), _INPUT, fwd)).t(), False)
            grad_x = torch.mm(g_rows, w_cols)
            grad_w = torch.mm(g_cols, x_cols)
        else:
            xd, xs, wd, ws = ctx.saved_tensors
            g = _dequant(layer._cast(grad, _GRAD_OUTPUT, bwd))
            grad_x = torch.mm(g, _dequant((wd, ws)))
            grad_w = torch.mm(g.t(), _dequant((xd, xs)))
        return grad_x.to(grad.dtype), grad_w.to(grad.dtype), None


def _dequant(q: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The float32 GEMM operand ``float32(data) / scale`` (a scale per row broadcasts).

    The rule is ``dequantize``'s and the expression torchao's emulation evaluates; it is
    written in torch ops because current scaling makes scales that ``dequantize`` refuses as
    bad input: under torchao's rule an Inf in the tensor gives scale 0 and a NaN scale NaN,
    and the step must still yield the Inf and NaN gradients that a GradScaler then skips.
    """
    data, scale = q
    return data.to(torch.float32) / scale


class Float8Linear(EmulatedLinear):
    """An ``nn.Linear`` whose products run on float8 operands under a current-scaling recipe.

    The forward quantizes the input and the weight to ``recipe.forward_format`` with scales taken
    from them (per tensor, or per row and per output feature under a row-wise recipe), multiplies
    the dequantized operands in float32 and rounds to the input's dtype; the backward quantizes
    the output gradient to ``recipe.backward_format`` and computes the input and weight gradients
    the same way. Under ``"torchao-tensorwise"`` and ``"torchao-rowwise"`` the outputs and
    gradients are bitwise those of torchao's ``Float8Linear`` with ``emulate=True``. ``recipe``
    None is ``"torchao-tensorwise"``. Parameters and state dict are ``nn.Linear``'s. Build one
    with :func:`convert_to_float8` or :meth:`from_linear`; the delayed recipe's layer is
    :class:`DelayedFloat8Linear`.
    """

    DEFAULT_RECIPE = "torchao-tensorwise"

    def _take_recipe(self, recipe: Any) -> lscore.fp8.Recipe:
        self.recipe = _recipe(recipe)
        self._check_recipe()
        return self.recipe

    def _check_recipe(self) -> None:
        if self.recipe.scaling != "current":
            raise ValueError(
                f"Float8Linear takes a current-scaling recipe, got {self.recipe.name!r} "
                f"(scaling {self.recipe.scaling!r}); use DelayedFloat8Linear or convert_to_float8"
            )

    def _cast(self, x: torch.Tensor, role: int, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` quantized to ``fmt`` for the tensor ``role`` (input, weight, grad_output):
        the float8 data and its float32 scale (one per row under a row-wise recipe)."""
        q = quantize_current(x, self.recipe, fmt)
        return q.data, q.scale

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Float8MatMul.apply(x, self.weight, self)
        return out


class DelayedFloat8Linear(Float8Linear):
    """A :class:`Float8Linear` under delayed scaling (``"te-delayed"``), as TransformerEngine.

    The layer keeps an :class:`lscore.fp8.DelayedScaling` of three tensors (input, weight,
    grad_output) in ``fp8_state``. Each cast uses the tensor's current scale and records its amax
    (several casts between two updates, as with micro-batches, accumulate by max); nothing moves
    until :meth:`update_scales` (or :func:`fp8_update` for a whole model) runs the history roll
    and the scale rule, once per optimizer step. So step t's casts use the scales computed from
    the amaxes of steps before t, as TransformerEngine's forward and backward do. The state goes
    in the module's ``state_dict`` (its ``_extra_state``), so a resumed run takes the same next
    step; loading a state of another recipe raises ``ValueError``.
    """

    def _check_recipe(self) -> None:
        r = self.recipe
        if r.scaling != "delayed" or r.granularity != "tensor":
            raise ValueError(
                f"DelayedFloat8Linear takes a per-tensor delayed-scaling recipe, got {r.name!r} "
                f"(scaling {r.scaling!r}, granularity {r.granularity!r})"
            )
        formats = (r.forward_format, r.forward_format, r.backward_format)
        self.fp8_state = lscore.fp8.DelayedScaling(r, 3, formats)

    def _cast(self, x: torch.Tensor, role: int, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.recipe
        scale = torch.tensor(self.fp8_state.scale[role], dtype=torch.float32, device=x.device)
        q, amax = quantize(
            x, scale, fmt, saturate=r.saturate, nan_sign=r.nan_sign, amax_nan=r.amax_nan
        )
        amaxes = np.zeros(3, np.float32)
        amaxes[role] = float(amax)
        self.fp8_state.record(amaxes)
        return q, scale

    def update_scales(self, reducer: Any = None) -> None:
        """Roll the amax history and set the next scales (one update of the delayed state).

        Call it once per optimizer step, after ``optimizer.step()``; ``reducer`` (an
        ``lscore.distributed`` reducer) all-reduces the step's amaxes (MAX) first.
        :func:`fp8_update` does this for a whole model with one reducer call.
        """
        self.fp8_state.update(reducer)

    def get_extra_state(self) -> dict[str, Any]:
        """The delayed state (``fp8_state.state_dict()``), saved as ``_extra_state``."""
        return self.fp8_state.state_dict()

    def __getstate__(self) -> dict[str, Any]:
        # the compiled state does not pickle: copies and pickles carry its state dict
        state = dict(self.__dict__)
        state["fp8_state"] = self.fp8_state.state_dict()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        state["fp8_state"] = lscore.fp8.DelayedScaling.from_state_dict(state["fp8_state"])
        super().__setstate__(state)

    def set_extra_state(self, state: Any) -> None:
        """Load a delayed state saved by :meth:`get_extra_state` (same recipe, or ValueError)."""
        self.fp8_state.load_state_dict(state)


def convert_to_float8(
    model: nn.Module,
    recipe: str | lscore.fp8.Recipe | lscore.fp8.BlockRecipe = "torchao-tensorwise",
    *,
    module_filter: Callable[[nn.Module, str], bool] | None = None,
) -> nn.Module:
    """Swap ``model``'s ``nn.Linear`` layers for float8 ones, in place, and return ``model``.

    As torchao's ``convert_to_float8_training``: each ``nn.Linear`` (``module_filter(module,
    fqn)`` true, when given) becomes a :class:`Float8Linear` (current-scaling recipes), a
    :class:`DelayedFloat8Linear` (``"te-delayed"``) or an :class:`MXLinear` (block recipes,
    such as ``"te-mxfp8"`` and ``"nvfp4"``; a :class:`StochasticMXLinear`, which keeps the
    random stream in its state, under one that rounds gradients stochastically, such as
    ``"te-nvfp4"``) sharing its parameters; a root ``nn.Linear`` is not
    changed and its replacement is returned. ``recipe`` is a name of ``lscore.fp8.RECIPES`` or
    ``lscore.fp8.BLOCK_RECIPES``, an ``lscore.fp8.Recipe`` or an ``lscore.fp8.BlockRecipe``.
    Under a per-tensor recipe any feature sizes are taken: the emulated product needs no
    multiple of 16 (neither does torchao's ``emulate=True``; its ``torch._scaled_mm`` path on a
    GPU does); an empty input is refused, as torchao refuses it. Under a block recipe that
    refuses partial blocks, a layer whose feature sizes are not multiples of the block raises
    ``ValueError`` here, before any layer is swapped.
    """
    r = _any_recipe(recipe)
    cls: type[Float8Linear] | type[MXLinear]
    if isinstance(r, lscore.fp8.BlockRecipe):
        cls = MXLinear
    else:
        cls = DelayedFloat8Linear if r.scaling == "delayed" else Float8Linear

    def wanted(module: nn.Module, fqn: str) -> TypeGuard[nn.Linear]:
        return (
            isinstance(module, nn.Linear)
            and not isinstance(module, Float8Linear | MXLinear)
            and (module_filter is None or module_filter(module, fqn))
        )

    if wanted(model, ""):
        if any(True for _ in model.children()):
            raise ValueError(
                f"convert_to_float8 cannot swap a root nn.Linear with children, got {model!r}"
            )
        return cls.from_linear(model, r)
    swaps = [
        (module, name, child)
        for fqn, module in list(model.named_modules())
        for name, child in list(module.named_children())
        if wanted(child, f"{fqn}.{name}" if fqn else name)
    ]
    # every replacement is built (and its sizes checked) before the first one is set
    new = [cls.from_linear(child, r) for _, _, child in swaps]
    for (module, name, _), layer in zip(swaps, new, strict=True):
        setattr(module, name, layer)
    return model


def fp8_update(model: nn.Module, reducer: Any = None) -> None:
    """Update the delayed scales of every :class:`DelayedFloat8Linear` in ``model``.

    Call it once per step, after ``optimizer.step()`` (with a ``GradScaler``, after
    ``scaler.update()``); current-scaling layers have nothing to update. ``reducer`` (an
    ``lscore.distributed`` reducer) all-reduces (MAX) the step's amaxes of every layer in one
    call, as TransformerEngine reduces a step's amaxes in one collective; the scales are
    bitwise those of each layer's :meth:`~DelayedFloat8Linear.update_scales`.
    """
    states = [m.fp8_state for m in model.modules() if isinstance(m, DelayedFloat8Linear)]
    lscore.fp8.DelayedScaling.update_all(states, reducer)
