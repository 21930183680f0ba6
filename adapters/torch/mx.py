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
Block scaling is current scaling: a layer keeps no scaling state, except the random stream of a
recipe that rounds gradients stochastically (``te-nvfp4``: :class:`StochasticMXLinear`).

Under ``te-nvfp4`` the operands are TransformerEngine v2.18's NVFP4BlockScaling's
(``transformer_engine/common/recipe/__init__.py:584-605``): the forward's input and the output
gradient of the input-gradient GEMM in 1x16 blocks along the rows (the gradient stochastically
rounded), the weight in 16x16 tiles, and the two operands of the weight-gradient GEMM as their
columnwise copies (``axis=0``), each taken through the 16x16 random Hadamard transform along the
rows, whose matrix is orthogonal and so cancels in the product (the gradient's copy also
stochastically rounded).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import torch
from torch import nn

import lscore.fp8
from lscore.adapters.torch._linear import EmulatedLinear
from lscore.adapters.torch.quantize import dequantize_blocks, quantize_blocks

__all__ = ["MXLinear", "StochasticMXLinear"]


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


def _gemm_read(recipe: lscore.fp8.BlockRecipe) -> lscore.fp8.BlockRecipe:
    """The recipe whose read-back is the GEMM's: TransformerEngine's block-scaled GEMMs take
    an E8M0 byte as the format defines it (code 0 2**-127, 0xFF NaN: OCP MX v1.0, PTX's
    .ue8m0), as its dequantize does from #3262 on; v2.18's dequantize kernel alone reads 0
    as +0.0 and 0xFF as +Inf.  The cast is the same at both revisions."""
    if recipe.behaviour != "te" or recipe.scale_format != "e8m0":
        return recipe
    return dataclasses.replace(recipe, revision=tuple(lscore.fp8.REVISIONS["te"])[1])


def _qdq(
    t: torch.Tensor,
    recipe: lscore.fp8.BlockRecipe,
    role: str,
    axis: int = -1,
    stream: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The 2-D ``t`` quantized as a tensor of `role` ("input", "weight", "grad": the element
    format, and a weight's square tiles under a recipe with ``weight_block``), else in blocks
    along `axis`, and dequantized to its dtype, as the GEMMs of the implementation the recipe
    reproduces read the blocks (``_gemm_read``); `stream`: the (seed, offset) of a gradient's
    stochastic rounding."""
    seed, offset = (None, 0) if stream is None or role != "grad" else stream
    q = quantize_blocks(t, _gemm_read(recipe), axis=axis, role=role, seed=seed, offset=offset)
    return dequantize_blocks(q, t.dtype)


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
    def backward(
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight = ctx.saved_tensors
        layer: MXLinear = ctx.layer
        r = layer.recipe
        # one draw of the layer's random stream per backward: both copies of the gradient
        # take it (their draws differ by the columnwise bit of the counter)
        stream = layer.next_stream()
        grad = grad.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            # grad_input = grad @ weight: reduction over the output features (a weight's tiles
            # are the same in either orientation: TE's columnwise weight is its rowwise one
            # transposed)
            w = _qdq(_t(weight.to(grad.dtype)), r, "weight")
            grad_x = torch.mm(_qdq(grad, r, "grad", stream=stream), w.t()).to(x.dtype)
        if ctx.needs_input_grad[1]:
            # grad_weight = grad.T @ x: reduction over the rows
            xg = x.to(grad.dtype)
            if r.mode == "te-nvfp4":
                # TE's columnwise copies, quantized along the rows (Hadamard-transformed
                # alike, so the transform cancels in the product)
                g0 = _qdq(grad, r, "grad", axis=0, stream=stream)
                grad_w = torch.mm(g0.t(), _qdq(xg, r, "input", axis=0))
            else:
                grad_w = torch.mm(_qdq(_t(grad), r, "grad"), _qdq(_t(xg), r, "input").t())
            grad_w = grad_w.to(weight.dtype)
        return grad_x, grad_w, None


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
    ``lscore.adapters.torch.quantize.quantize_blocks`` and ``dequantize_blocks`` (as the
    GEMMs of the recipe's implementation read the blocks: TransformerEngine's take E8M0 byte 0
    as 2**-127 at every revision), and the dequantized operands are multiplied in the input's
    dtype (under autocast, the autocast dtype). Under the ``torchao-mx-*`` recipes the outputs
    and gradients are bitwise those of torchao's ``MXFP8Linear`` emulated on the CPU; under
    ``te-nvfp4`` the weight gradient's operands are TE's Hadamard-transformed columnwise
    copies (the module docstring). Block scales are taken from the tensors being cast, so the
    layer has no scaling state: parameters and state dict are ``nn.Linear``'s (under a recipe
    that rounds gradients stochastically, this class builds a :class:`StochasticMXLinear`,
    whose random stream is its state).
    ``recipe`` None is ``"te-mxfp8"``. A recipe that refuses partial blocks needs
    ``in_features``, ``out_features`` and the input's rows (the product of its leading
    dimensions) to be multiples of ``recipe.block``; a recipe that pads scales a last partial
    block from its own elements. Build one with :func:`convert_to_float8` or
    :meth:`from_linear`.
    """

    DEFAULT_RECIPE = "te-mxfp8"

    def __new__(cls, *args: Any, recipe: Any = None, **kwargs: Any) -> Any:
        # a recipe that rounds gradients stochastically makes the layer that keeps its stream
        if cls is MXLinear and recipe is not None and _block_recipe(recipe).stochastic_rounding:
            cls = StochasticMXLinear
        return super().__new__(cls)

    def next_stream(self) -> tuple[int, int] | None:
        """The (seed, offset) of the next backward's stochastic rounding: None, this layer's
        recipe rounds to nearest."""
        return None

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
        r = self.recipe
        self._check_blocks(r, "input rows", x.shape[0])
        wgrad = torch.is_grad_enabled() and self.weight.requires_grad
        if r.hadamard and wgrad and x.dtype != torch.bfloat16:
            raise TypeError(
                f"{type(self).__name__} input must be bfloat16 under recipe {r.name!r}: the "
                f"weight gradient's operands take the Hadamard transform, which TE v2.18 takes "
                f"of bfloat16 only; got {x.dtype} (run the model under torch.autocast with "
                f"dtype=torch.bfloat16, or use a recipe with hadamard=False)"
            )
        out: torch.Tensor = _BlockMatMul.apply(x, self.weight, self)
        return out


class StochasticMXLinear(MXLinear):
    """An :class:`MXLinear` under a recipe that rounds gradients stochastically
    (``"te-nvfp4"``, its default), with the random stream that rounding reads.

    The stream is lscore's counter-based one (``lscore.fp8.quantize_blocks``'s `seed` and
    `offset`: Philox4x32-10 keyed by the seed, the offset in the counter): each backward reads
    the draw at ``(seed, offset)`` for both copies of the output gradient and then advances
    ``offset`` by one. ``seed`` (an integer from 0 to 2**64 - 1) is drawn from torch's
    default CPU generator when not given, so ``torch.manual_seed`` fixes it, and every layer
    of a model gets its own. Seed and offset are the layer's state: they go in the module's
    ``state_dict`` (its ``_extra_state``) and in copies and pickles, so a resumed run rounds
    as the uninterrupted one did and continues bitwise. ``MXLinear(..., recipe=...)`` with
    such a recipe builds this class.
    """

    DEFAULT_RECIPE = "te-nvfp4"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        recipe: Any = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, device, dtype, recipe=recipe)
        if not self.recipe.stochastic_rounding:
            raise ValueError(
                f"StochasticMXLinear takes a recipe that rounds gradients stochastically, got "
                f"{self.recipe.name!r} (use MXLinear)"
            )
        if seed is None:
            # explicit device: from_linear builds layers under torch.device("meta")
            seed = int(torch.empty((), dtype=torch.int64, device="cpu").random_())
        self.seed = _word(seed, "seed")
        self.offset = 0

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Any = None, *, seed: int | None = None) -> Any:
        """A layer that shares ``linear``'s weight and bias, its stream at `seed` (None: drawn
        from torch's default generator) and offset 0."""
        new = super().from_linear(linear, recipe)
        if seed is not None:
            new.seed = _word(seed, "seed")
        return new

    def next_stream(self) -> tuple[int, int]:
        """The (seed, offset) of this backward's stochastic rounding; the offset advances."""
        stream = (self.seed, self.offset)
        self.offset = (self.offset + 1) % 2**64
        return stream

    def get_extra_state(self) -> dict[str, Any]:
        """The random stream, ``{"seed": ..., "offset": ...}``, saved as ``_extra_state``."""
        return {"seed": self.seed, "offset": self.offset}

    def set_extra_state(self, state: Any) -> None:
        """Load a stream saved by :meth:`get_extra_state` (ValueError for anything else)."""
        if not isinstance(state, dict) or set(state) != {"seed", "offset"}:
            raise ValueError(
                f"StochasticMXLinear state must be a dict of 'seed' and 'offset', got {state!r}"
            )
        self.seed = _word(state["seed"], "seed")
        self.offset = _word(state["offset"], "offset")

    def extra_repr(self) -> str:
        """``MXLinear``'s description and the stream's seed and offset."""
        return f"{super().extra_repr()}, seed={self.seed}, offset={self.offset}"


def _word(v: Any, what: str) -> int:
    n = int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else -1
    if not 0 <= n < 2**64:
        raise ValueError(f"{what} must be an integer from 0 to 2**64 - 1, got {v!r}")
    return n
