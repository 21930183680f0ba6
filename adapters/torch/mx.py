"""Block-scaled (MX, NVFP4) training emulated on any machine: ``nn.Linear`` layers whose three
GEMMs run on block-quantized operands.

Each operand of a GEMM is quantized from its high-precision tensor along the GEMM's reduction
dimension, in blocks of the recipe's size (32 for MX, 16 for NVFP4): the forward's input and
weight along the input features, the backward's output gradient and weight along the output
features (the input gradient) and the output gradient and input along the rows (the weight
gradient). So every block scale of the backward is taken from the tensor in the orientation the
GEMM reads, as TransformerEngine's MXFP8 recipe and torchao's MX emulation both do, not from the
forward's blocks transposed. The operands are dequantized to the input's dtype and multiplied
there: the numerics of an MX GEMM on a CPU or a GPU without block-scaled units. Under the
``torchao-mx-*`` recipes the outputs and gradients are bitwise those of torchao 0.18's
``MXFP8Linear`` with ``kernel_preference=KernelPreference.EMULATED``
(``torchao/prototype/moe_training/mxfp8_linear.py`` and ``mx_formats/mx_tensor.py``, v0.18.0).
Block scaling is current scaling: a layer keeps no scaling state.
"""

from __future__ import annotations

from typing import Any

import torch

import lscore.fp8
from lscore.adapters.torch._linear import EmulatedLinear
from lscore.adapters.torch.quantize import dequantize_blocks, quantize_blocks

__all__ = ["MXLinear"]


def _block_recipe(
    recipe: str | lscore.fp8.BlockRecipe,
) -> lscore.fp8.BlockRecipe:
    found = lscore.fp8.recipe(recipe) if isinstance(recipe, str) else recipe
    if not isinstance(found, lscore.fp8.BlockRecipe):
        raise TypeError(
            f"recipe must be a block recipe name or an lscore.fp8.BlockRecipe, got "
            f"{type(found).__qualname__}"
        )
    return found


def _qdq(t: torch.Tensor, recipe: lscore.fp8.BlockRecipe, role: str) -> torch.Tensor:
    """The 2-D ``t`` quantized as a tensor of `role` ("input", "weight", "grad": the element
    format, and a weight's square tiles under a recipe with ``weight_block``), else in blocks
    along its last axis, and dequantized to its dtype, as the implementation the recipe
    reproduces reads the blocks back (the GEMM operand)."""
    return dequantize_blocks(quantize_blocks(t, recipe, role=role), t.dtype)


def _t(t: torch.Tensor) -> torch.Tensor:
    """``t.T`` stored row-major: the backward's operands are quantized along their other axis."""
    return t.t().contiguous()


class _BlockMatMul(torch.autograd.Function):
    """``x @ weight.T`` with block-quantized operands in the forward and the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, layer: MXLinear) -> torch.Tensor:
        ctx.layer = layer
        # the backward quantizes x and weight along their other axes, from high precision
        ctx.save_for_backward(x, weight)
        r = layer.recipe
        # the second operand of each GEMM is handed over column-major, as torchao's emulation
        # hands it over (a float32 GEMM's rounding can depend on the operands' memory order)
        return torch.mm(_qdq(x, r, "input"), _qdq(weight.to(x.dtype), r, "weight").t())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight = ctx.saved_tensors
        r: lscore.fp8.BlockRecipe = ctx.layer.recipe
        grad = grad.contiguous()
        # grad_input = grad @ weight: reduction over the output features (a weight's tiles
        # are the same in either orientation: TE's columnwise weight is its rowwise one
        # transposed)
        w = weight.to(grad.dtype)
        grad_x = torch.mm(_qdq(grad, r, "grad"), _qdq(_t(w), r, "weight").t())
        # grad_weight = grad.T @ x: reduction over the rows
        grad_w = torch.mm(_qdq(_t(grad), r, "grad"), _qdq(_t(x.to(grad.dtype)), r, "input").t())
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


class MXLinear(EmulatedLinear):
    """An ``nn.Linear`` whose three GEMMs run on block-scaled (MX or NVFP4) operands.

    ``recipe`` is a block recipe (a name of ``lscore.fp8.BLOCK_RECIPES`` or an
    ``lscore.fp8.BlockRecipe``). The forward quantizes the input and the weight to
    ``recipe.element`` in blocks along the input features; the backward quantizes the output
    gradient to ``recipe.grad_element``, and the weight and input to ``recipe.element``, in
    blocks along each GEMM's reduction dimension, each from the high-precision tensor (NVFP4's
    per-tensor scale from each operand's amax); under a recipe with ``weight_block``
    (``te-blockwise``, ``torchao-blockwise``: 128x128) the weight in square tiles instead,
    as both libraries' blockwise FP8 linears quantize it. The casts are
    ``lscore.adapters.torch.quantize.quantize_blocks`` and ``dequantize_blocks`` (the recipe's
    implementation's read-back), and the dequantized operands are multiplied in the input's
    dtype (under autocast, the autocast dtype). Under the ``torchao-mx-*`` recipes the outputs
    and gradients are bitwise those of torchao's ``MXFP8Linear`` emulated on the CPU. Block
    scales are taken from the tensors being cast, so the layer has no scaling state: parameters
    and state dict are ``nn.Linear``'s.
    ``recipe`` None is ``"te-mxfp8"``. A recipe that refuses partial blocks needs
    ``in_features``, ``out_features`` and the input's rows (the product of its leading
    dimensions) to be multiples of ``recipe.block``; a recipe that pads scales a last partial
    block from its own elements. Build one with :func:`convert_to_float8` or
    :meth:`from_linear`.
    """

    DEFAULT_RECIPE = "te-mxfp8"

    def _take_recipe(self, recipe: Any) -> lscore.fp8.BlockRecipe:
        r = _block_recipe(recipe)
        for name in ("in_features", "out_features"):
            self._check_blocks(r, name, getattr(self, name))
        return r

    @staticmethod
    def _check_blocks(r: lscore.fp8.BlockRecipe, name: str, n: int) -> None:
        if r.tail == "refuse" and n % r.block:
            raise ValueError(
                f"MXLinear {name} must be a multiple of the block size {r.block} under recipe "
                f"{r.name!r} (it refuses partial blocks), got {n}"
            )

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        # the weight gradient's blocks run along the rows: refuse before anything runs
        self._check_blocks(self.recipe, "input rows", x.shape[0])
        out: torch.Tensor = _BlockMatMul.apply(x, self.weight, self)
        return out
