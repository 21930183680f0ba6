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

import numpy as np
import torch

import lscore.fp8
from lscore import kernels
from lscore.adapters.torch._linear import EmulatedLinear

__all__ = ["MXLinear"]

_TORCH_FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_KERNEL_ELEM = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1"}


def _block_recipe(recipe: str | lscore.fp8.BlockRecipe) -> lscore.fp8.BlockRecipe:
    if isinstance(recipe, str):
        recipe = lscore.fp8.recipe(recipe)
    if not isinstance(recipe, lscore.fp8.BlockRecipe):
        raise TypeError(
            f"recipe must be a block recipe name or an lscore.fp8.BlockRecipe, got "
            f"{type(recipe).__qualname__}"
        )
    return recipe


def _qdq(t: torch.Tensor, recipe: lscore.fp8.BlockRecipe, element: str) -> torch.Tensor:
    """The 2-D ``t`` quantized in blocks along its last axis and dequantized to its dtype
    (row-major, the GEMM operand)."""
    a = t.detach().to(torch.float32).contiguous().numpy()
    rows, k = a.shape
    tail = -k % recipe.block
    if tail:
        # a last partial block is scaled from its own elements, as if zero-padded
        out = _qdq(torch.nn.functional.pad(t, (0, tail)), recipe, element)
        return out[:, :k].contiguous()
    if recipe.mode == "nvfp4":
        amax = np.float32(np.max(np.abs(a))) if recipe.tensor_scale else None
        pts = None if amax is None else kernels.nvfp4_tensor_scale(float(amax))
        scales, codes = kernels.nvfp4_quantize(a, pts)
        elems = torch.from_numpy(kernels.e2m1_decode(_unpack(codes)))
        block = torch.from_numpy(scales.view(np.uint8).copy()).view(torch.float8_e4m3fn)
        block_f = block.to(torch.float32)
        if pts is not None:
            block_f = torch.tensor(pts, dtype=torch.float32) * block_f
        out = elems.view(rows, -1, 16) * block_f.view(rows, -1, 1)
        return out.view(rows, k).to(t.dtype)
    scales, codes = kernels.mx_quantize(a, _KERNEL_ELEM[element], recipe.mode, recipe.block)
    if element == "e2m1":
        values = torch.from_numpy(kernels.e2m1_decode(_unpack(codes))).to(t.dtype)
    else:
        values = torch.from_numpy(codes).view(_TORCH_FP8[element]).to(t.dtype)
    scale = torch.from_numpy(kernels.e8m0_decode(scales)).to(t.dtype)
    out = values.view(-1, recipe.block) * scale.view(-1, 1)
    return out.view(rows, k)


def _unpack(codes: np.ndarray) -> np.ndarray:
    """Packed E2M1 codes (two a byte, the first in the low nibble) one a byte."""
    return np.stack((codes & 0xF, codes >> 4), axis=-1).reshape(codes.shape[0], -1)


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
        r, elem = layer.recipe, layer.recipe.element
        # the second operand of each GEMM is handed over column-major, as torchao's emulation
        # hands it over (a float32 GEMM's rounding can depend on the operands' memory order)
        return torch.mm(_qdq(x, r, elem), _qdq(weight.to(x.dtype), r, elem).t())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight = ctx.saved_tensors
        r: lscore.fp8.BlockRecipe = ctx.layer.recipe
        elem, gelem = r.element, r.grad_element
        grad = grad.contiguous()
        # grad_input = grad @ weight: reduction over the output features
        w = weight.to(grad.dtype)
        grad_x = torch.mm(_qdq(grad, r, gelem), _qdq(_t(w), r, elem).t())
        # grad_weight = grad.T @ x: reduction over the rows
        grad_w = torch.mm(_qdq(_t(grad), r, gelem), _qdq(_t(x.to(grad.dtype)), r, elem).t())
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


class MXLinear(EmulatedLinear):
    """An ``nn.Linear`` whose three GEMMs run on block-scaled (MX or NVFP4) operands.

    ``recipe`` is a block recipe (a name of ``lscore.fp8.BLOCK_RECIPES`` or an
    ``lscore.fp8.BlockRecipe``). The forward quantizes the input and the weight to
    ``recipe.element`` in blocks along the input features; the backward quantizes the output
    gradient to ``recipe.grad_element``, and the weight and input to ``recipe.element``, in
    blocks along each GEMM's reduction dimension, each from the high-precision tensor. The
    dequantized operands are multiplied in the input's dtype (under autocast, the autocast
    dtype). Under the ``torchao-mx-*`` recipes the outputs and gradients are bitwise those of
    torchao's ``MXFP8Linear`` emulated on the CPU. Block scales are taken from the tensors being
    cast, so the layer has no scaling state: parameters and state dict are ``nn.Linear``'s.
    ``recipe`` None is ``"te-mxfp8"``. A recipe that refuses partial blocks needs
    ``in_features``, ``out_features`` and the input's rows (the product of its leading
    dimensions) to be multiples of ``recipe.block``. Build one with :func:`convert_to_float8` or
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
        if x.device.type != "cpu":
            raise TypeError(f"MXLinear runs on the CPU, got an input on {x.device}")
        # the weight gradient's blocks run along the rows: refuse before anything runs
        self._check_blocks(self.recipe, "input rows", x.shape[0])
        out: torch.Tensor = _BlockMatMul.apply(x, self.weight, self)
        return out
