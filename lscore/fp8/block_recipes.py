"""Block-scaled recipes (MXFP8, MXFP4, NVFP4, blockwise FP8) as exact presets.

A ``BlockRecipe`` names every choice a block-scaled quantization makes
(element format, block size, scale format, the rule that picks a block's
scale, whose behaviour it reproduces, what happens to a last partial
block, the square tiles of a weight, the library version it reproduces);
the presets are rows of ``BLOCK_TABLE``, each citing the public source it
follows, and ``block_recipe(name)`` gives them.  ``lscore.fp8.blocks``
quantizes and dequantizes by them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from lscore.fp8 import nvfp4
from lscore.fp8.checks import exact_fields, preset_fields
from lscore.policy import boolean, choice, integer, real

__all__ = [
    "BLOCK_RECIPES",
    "BLOCK_TABLE",
    "ROLES",
    "BlockRecipe",
    "as_block_recipe",
    "block_recipe",
    "element_dtype",
]

#: the roles of a tensor in a training step (``quantize_blocks(..., role=)``)
ROLES = ("input", "weight", "grad")
_F32_MAX = 3.4028234663852886e38

#: element format name -> the kernels' name of it
_KERNEL_ELEMS = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1"}
_ELEMS = tuple(_KERNEL_ELEMS)
_MX = ("e4m3fn", "e5m2", "e2m1")

# What each scale rule (`mode`) fixes: whose behaviour it is, its scale format and block,
# and the element formats its source quantizes with it.
#   ocp    OCP Microscaling Formats v1.0 (section 6.3), exact: the scale exponent of
#          microsoft/microxcaling mx/mx_ops.py _shared_exponents with the floor of log2 taken
#          exactly, elements rounded to nearest even (microxcaling's Python emulation takes
#          log2 in float32 and its default round="nearest" rounds ties away from zero, so
#          it differs in those two places): MXFP8 E4M3
#          and E5M2, MXFP4 E2M1, k = 32 (the spec's one block size)
#   te     NVIDIA/TransformerEngine v2.18 MXFP8 (common/cast/mxfp8/quantize_mxfp8.cuh,
#          common/util/ptx.cuh float_to_e8m0): float8 elements only (TE's 4-bit format is
#          NVFP4), blocks of 32 (MXFP8_BLOCK_SCALING_SIZE, pytorch/constants.py)
#   floor, ceil, even, rceil   pytorch/ao v0.18.0 mx_formats/mx_tensor.py to_mx, the
#          ScaleCalculationMode of config.py: float8 and fp4 elements
#   nvfp4  pytorch/ao v0.18.0 mx_formats/nvfp4_tensor.py nvfp4_quantize: E2M1 elements,
#          E4M3 scales, "NVFP4 requires block_size=16"
#   te-fp32       NVIDIA/TransformerEngine v2.18 Float8BlockScaling: float32 scales
#          fp8_max / amax of compute_scale_from_amax (common/recipe/recipe_common.cuh:14-69),
#          blocks of 128 (pytorch/tensor/float8_blockwise_tensor.py:43-58), E4M3 or E5M2
#   torchao-fp32  pytorch/ao v0.18.0 prototype/blockwise_fp8_training: float32 scales
#          448 / max(amax, eps) (kernels.py:1031-1156, the torch reference functions of its
#          Triton kernels), blocks of 128, E4M3 only (kernels.py:1071)
#   te-nvfp4      NVIDIA/TransformerEngine v2.18 NVFP4BlockScaling: E2M1 elements, E4M3
#          scales of blocks of 16 under a float32 global scale from the tensor's amax
#          (common/cast/nvfp4/core_nvfp4.cuh), lsc_nvfp4.h's rules
# A float32 scale rule also takes power_2_scales (TE's only) and amax_epsilon.
_MODES: dict[str, dict[str, Any]] = {
    "ocp": dict(behaviour="rule", scale_format="e8m0", block=32, elements=_MX),
    "te": dict(behaviour="te", scale_format="e8m0", block=32, elements=("e4m3fn", "e5m2")),
    **{
        m: dict(behaviour="torchao", scale_format="e8m0", block=32, elements=_MX)
        for m in ("floor", "ceil", "even", "rceil")
    },
    "nvfp4": dict(behaviour="torchao", scale_format="e4m3fn", block=16, elements=("e2m1",)),
    "te-fp32": dict(behaviour="te", scale_format="float32", block=128, elements=("e4m3fn", "e5m2")),
    "torchao-fp32": dict(
        behaviour="torchao", scale_format="float32", block=128, elements=("e4m3fn",)
    ),
    "te-nvfp4": dict(behaviour="te", scale_format="e4m3fn", block=16, elements=("e2m1",)),
}

# the libraries and versions the presets reproduce
_TE = "NVIDIA/TransformerEngine v2.18"
_AO = "pytorch/ao v0.18.0"
# te-mxfp8 with weight_block=32: TE's 2-D MXFP8 weights are in no release that the other
# rules are pinned to (NVIDIA/TransformerEngine#2634, after v2.18)
_TE_MXFP8_2D = (
    "NVIDIA/TransformerEngine v2.18, 32x32 weights as commit d8815c4c30b5 (#2634, after "
    "v2.18: MXFP8BlockScaling(enable_2d_quantization=True))"
)
_TE_NVFP4 = (
    "NVIDIA/TransformerEngine v2.18 NVFP4BlockScaling; stochastic rounding by the software "
    "rule of commit fc1fc0e787fc (#3281, after v2.18)"
)

# an MXFP8 recipe: e4m3fn in both directions, E8M0 scales of 32 elements
_MXFP8 = dict(
    element="e4m3fn", grad_element="e4m3fn", block=32, scale_format="e8m0", tensor_scale=False
)
_TORCHAO_MX = dict(_MXFP8, behaviour="torchao", tail="refuse", source=_AO)
# a blockwise FP8 recipe: float32 scales of 1x128 blocks, weights in 128x128 tiles
_BLOCKWISE = dict(
    element="e4m3fn",
    grad_element="e4m3fn",
    block=128,
    scale_format="float32",
    tensor_scale=False,
    weight_block=128,
)

#: every preset: name -> the BlockRecipe fields it fixes (the comment above each cites its source)
BLOCK_TABLE: dict[str, dict[str, Any]] = {
    # The OCP rule: e = floor(log2(amax)) - emax, an all-zero block at float32's smallest
    # normal, e > 127 a NaN scale, e < -127 clamped; elements divided by 2**e exactly and
    # saturated, rounded to nearest even (OCP MX v1.0 section 6.3; the exponent as
    # microsoft/microxcaling mx/mx_ops.py _shared_exponents computes it, its log2 exact).
    # A last partial block is scaled from its own elements: microxcaling pads the axis
    # with zeros to a multiple of the block (mx/mx_ops.py _reshape_to_blocks).  OCP has no
    # training recipe: e4m3fn for both directions, as TransformerEngine's default.
    "ocp-mx": dict(
        _MXFP8,
        mode="ocp",
        behaviour="rule",
        tail="pad",
        source="OCP Microscaling Formats v1.0 (microsoft/microxcaling 7bc41952)",
    ),
    # TransformerEngine v2.18 MXFP8BlockScaling: fp8_format E4M3 by default (HYBRID: e5m2
    # gradients) (common/recipe/__init__.py:337-384); the scale is float_to_e8m0 of amax *
    # (1 / fp8_max), rounded up (common/util/ptx.cuh:386-418), the elements multiplied by
    # exp2f_rcp (common/cast/mxfp8/quantize_mxfp8.cuh:268-293).  A last partial block is
    # scaled from its own elements: the cast kernel sizes its scales DIVUP(cols, 32) and its
    # tile loads fill past the edge with zeros (quantize_mxfp8.cuh:255-262, 608-609), though
    # TE's modules only quantize multiples of 32 (pytorch/tensor/mxfp8_tensor.py:89-97).
    # weight_block=32 (32x32 weight tiles) is TE after v2.18, commit d8815c4c30b5 (#2634):
    # the tile's amax (fmaxf, or __hmax of 16-bit inputs), the same float_to_e8m0, the
    # scale written replicated into the 1x32 rowwise and columnwise layouts
    # (common/cast/mxfp8/quantize_mxfp8.cuh:421-446 at that commit); `source` says so.
    "te-mxfp8": dict(_MXFP8, mode="te", behaviour="te", tail="pad", source=_TE),
    # torchao 0.18 MXTensor.to_mx (mx_formats/mx_tensor.py:214-411, QuantizeTensorToMXKwargs
    # elem_dtype float8_e4m3fn, block_size 32: mx_tensor.py:99-106) in each
    # ScaleCalculationMode (mx_formats/config.py:41-66), read back by to_dtype
    # (mx_tensor.py:414-479); it asserts that the last dimension is a multiple of the block
    # (mx_tensor.py:230-232), so a partial block is refused.  weight_block=32: torchao
    # 0.18's 32x32 scales of 3-D MoE weights (mxfp8_quantize_cuda_3d(scale_block_dim2=32),
    # prototype/moe_training/kernels/mxfp8/quant.py:1413-1486, #4254), whose reference
    # (quant.py:64-133) runs to_mx on each tile's 1024 values; the blocked layout repeats
    # each scale 32 times along K (quant.py:53-61).  Opt-in there: training calls
    # scale_block_dim2=1 (moe_training/mxfp8_grouped_mm.py:637-643).
    "torchao-mx-floor": dict(_TORCHAO_MX, mode="floor"),
    "torchao-mx-ceil": dict(_TORCHAO_MX, mode="ceil"),
    "torchao-mx-even": dict(_TORCHAO_MX, mode="even"),
    "torchao-mx-rceil": dict(_TORCHAO_MX, mode="rceil"),
    # torchao 0.18 NVFP4Tensor.to_nvfp4 with the per-tensor scale per_tensor_amax_to_scale
    # gives (amax / (448 * 6)) (mx_formats/nvfp4_tensor.py:131-196, 756-851): E4M3 scales
    # of blocks of 16, clamped to [2**-6, 448], read back by NVFP4Tensor.dequantize and
    # get_hp_scales (nvfp4_tensor.py:199-258); a last dimension that is not a multiple of
    # 16 is refused ("K dim must be divisible by block_size", nvfp4_tensor.py:801).
    "nvfp4": dict(
        element="e2m1",
        grad_element="e2m1",
        block=16,
        scale_format="e4m3fn",
        mode="nvfp4",
        behaviour="torchao",
        tensor_scale=True,
        tail="refuse",
        source=_AO,
    ),
    # TransformerEngine v2.18 Float8BlockScaling defaults (common/recipe/__init__.py:387-463):
    # fp8_format E4M3 (HYBRID: e5m2 gradients), QParams(power_2_scale=True, amax_epsilon=0)
    # (NVTE_FP8_BLOCK_SCALING_FP32_SCALES unset), 1x128 blocks for inputs and gradients and
    # 128x128 for weights (x/grad_block_scaling_dim 1, w_block_scaling_dim 2).  The scale
    # is compute_scale_from_amax (common/recipe/recipe_common.cuh:14-69): amax below eps
    # taken as eps; Inf, 0 or NaN -> 1; else RN(fp8_max / amax), an Inf quotient -> the
    # input dtype's largest value, the mantissa masked off for power-of-two scales.  Block
    # amaxes skip NaN (fmaxf), the elements are cast RN-satfinite, scale_inv = RN(1 /
    # scale) is stored (common/transpose/quantize_transpose_vector_blockwise.cu:274-316,
    # 367-401; quantize_transpose_square_blockwise.cu:123-189).  A ragged edge is
    # zero-filled (vector_blockwise.cu:216-223), so a partial block is scaled from its
    # own elements; the columnwise copy (axis=0) is quantized from the input, a weight's
    # is the transpose of its tiles (docs/.../fp8_blockwise_scaling.rst:127-133).
    "te-blockwise": dict(
        _BLOCKWISE,
        mode="te-fp32",
        behaviour="te",
        tail="pad",
        power_2_scales=True,
        amax_epsilon=0.0,
        source=_TE,
    ),
    # torchao 0.18 prototype blockwise_fp8_training (linear.py:98-287; the rule of every
    # quantize kernel, kernels.py:481-965, as its torch reference functions compute it,
    # kernels.py:1031-1156): amax = max|x| (NaN propagates) in float64, clamped below to
    # EPS = 1e-12 (kernels.py:32); scale = float32(448 / amax), no power of two; the
    # product clamped to +-448 then cast; 1 / scale stored.  So an Inf in a block gives
    # scale 0 (its elements 0, the Inf ones NaN), a NaN scale NaN.  The 128x1 function
    # (columns, axis=0) clamps the amax in the input's dtype before widening it
    # (kernels.py:1093-1096): its EPS is 1e-12 rounded to that dtype.  E4M3 for inputs,
    # weights and gradients; in/out features multiples of 128 (linear.py:214-287), so a
    # partial block is refused.
    "torchao-blockwise": dict(
        _BLOCKWISE,
        mode="torchao-fp32",
        behaviour="torchao",
        tail="refuse",
        power_2_scales=False,
        amax_epsilon=1e-12,
        source=_AO,
    ),
    # TransformerEngine v2.18 NVFP4BlockScaling (common/recipe/__init__.py:484-605) with its
    # defaults, each switched off by TE's own field (block_recipe's disable_rht,
    # disable_stochastic_rounding, disable_2d_quantization): inputs 1x16 with the random
    # Hadamard transform on the columnwise copy, weights in 16x16 tiles, gradients 1x16
    # rounded stochastically both ways and transformed on the columnwise copy (:589-605).
    # The global scale 2688 / amax over E4M3 block scales and the E2M1 cast of
    # common/cast/nvfp4/core_nvfp4.cuh:40-95, quantize_transpose_nvfp4.cuh:354-364,
    # 467-498, 668-716; decode dequantize_nvfp4.cuh:65-77; the transform's signs
    # pytorch/tensor/nvfp4_tensor.py:49-59.  v2.18 rounds stochastically with
    # cvt.rs.satfinite.e2m1x4.f32 on sm_100/103 only; lscore follows the software rule that
    # commit fc1fc0e787fc (#3281, after v2.18) added for other devices, with lscore's own
    # counter-based draws (lsc_nvfp4.h).  TE requires whole blocks (the last and the
    # flattened first dimension multiples of 16, pytorch/csrc/quantizer.cpp:2748-2752).
    "te-nvfp4": dict(
        element="e2m1",
        grad_element="e2m1",
        block=16,
        scale_format="e4m3fn",
        mode="te-nvfp4",
        behaviour="te",
        tensor_scale=True,
        tail="refuse",
        weight_block=16,
        hadamard=True,
        stochastic_rounding=True,
        source=_TE_NVFP4,
    ),
}

#: the preset names, in BLOCK_TABLE's order
BLOCK_RECIPES = tuple(BLOCK_TABLE)


@dataclasses.dataclass(frozen=True)
class BlockRecipe:
    """One block-scaled quantization recipe: every parameter, validated when the object is made.

    Attributes
    ----------
    name : str
        The preset it came from, or any name of a custom recipe.
    element, grad_element : "e4m3fn" | "e5m2" | "e2m1"
        Element format of the forward tensors (inputs, weights) and of the
        output gradients.
    block : int
        Elements per scale: 32 for the MX formats, 16 for NVFP4, 128 for
        blockwise FP8.
    scale_format : "e8m0" | "e4m3fn" | "float32"
        The block scale's format: a power of two (MX), E4M3 (NVFP4) or the
        float32 inverse scale of blockwise FP8.
    mode : str
        The rule that picks a block's scale: "ocp" (the OCP rule), "te"
        (TransformerEngine's RCEIL), torchao's "floor", "ceil", "even" and
        "rceil", "nvfp4", or the float32 rules "te-fp32" (TE's
        Float8BlockScaling) and "torchao-fp32" (torchao's blockwise FP8).
    behaviour : "rule" | "te" | "torchao"
        Whose results it reproduces, bit for bit: the OCP rule's, or the
        implementation's, departures from the rule included.
    tensor_scale : bool
        NVFP4's float32 per-tensor scale over the block scales: torchao's
        amax / (448 * 6) (mode "nvfp4"), TE's global scale of the tensor's
        amax (mode "te-nvfp4", always).
    tail : "refuse" | "pad"
        A length along the blocked axis that is not a multiple of `block`:
        a ValueError, or a last partial block scaled from its own elements
        (as if padded with zeros).
    weight_block : int | None
        A weight (``role="weight"``) is quantized in square tiles of this
        side, one scale per tile (128 for blockwise FP8, 32 for 2-D MXFP8),
        or None: blocked as the other tensors.  None or `block`.
    power_2_scales : bool
        A float32 scale rounded down to a power of two (TE's mantissa mask);
        only under mode "te-fp32".
    amax_epsilon : float
        The amax floor of a float32 scale rule (TE's epsilon, taken as
        float32; torchao's EPS, float64); 0 under the other modes.
    source : str
        The library and version whose behaviour the recipe reproduces, e.g.
        "NVIDIA/TransformerEngine v2.18" ("" for a custom recipe).
    hadamard : bool
        TE's random Hadamard transform (16 points, its fixed signs) down the
        columns of the columnwise copy of inputs and gradients (``axis=0``,
        bfloat16); only under mode "te-nvfp4".
    stochastic_rounding : bool
        Gradients (``role="grad"``) rounded to E2M1 stochastically, with the
        draws of ``quantize_blocks``' `seed` and `offset`; only under mode
        "te-nvfp4".

    The mode fixes the behaviour, scale format, block and the element
    formats allowed; anything else is a ValueError listing what is allowed.
    Fields after `tail` have defaults, so a dict written before they existed
    still loads (``from_dict``).
    """

    name: str
    element: str
    grad_element: str
    block: int
    scale_format: str
    mode: str
    behaviour: str
    tensor_scale: bool
    tail: str
    weight_block: int | None = None
    power_2_scales: bool = False
    amax_epsilon: float = 0.0
    source: str = ""
    hadamard: bool = False
    stochastic_rounding: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        rule = _MODES[choice("mode", self.mode, tuple(_MODES))]
        object.__setattr__(self, "block", integer("block", self.block, minimum=1))
        object.__setattr__(self, "tensor_scale", boolean("tensor_scale", self.tensor_scale))
        object.__setattr__(self, "power_2_scales", boolean("power_2_scales", self.power_2_scales))
        choice("tail", self.tail, ("refuse", "pad"))
        if not isinstance(self.source, str):
            raise TypeError(f"source must be a string, got {self.source!r}")
        for field in ("behaviour", "scale_format", "block"):
            if getattr(self, field) != rule[field]:
                raise ValueError(
                    f"{field} must be {rule[field]!r} under mode {self.mode!r}, "
                    f"got {getattr(self, field)!r}"
                )
        for field in ("element", "grad_element"):
            self.allows(getattr(self, field), field)
        if self.weight_block is not None:
            wb = integer("weight_block", self.weight_block, minimum=1)
            if wb != self.block:
                raise ValueError(
                    f"weight_block must be None or the block {self.block} (square tiles of "
                    f"the block's side) under mode {self.mode!r}, got {self.weight_block!r}"
                )
            object.__setattr__(self, "weight_block", wb)
        self._check_float32_fields()
        nvfp4.check_fields(self)
        if self.behaviour == "te" and self.mode != "te-nvfp4" and self.element != "e4m3fn":
            raise ValueError(
                f"element must be 'e4m3fn' under mode {self.mode!r} (TE's fp8_format E4M3 or "
                f"HYBRID; pure E5M2 training is not supported), got {self.element!r}"
            )

    def _check_float32_fields(self) -> None:
        """power_2_scales and amax_epsilon: the float32 scale rules' fields."""
        eps = real("amax_epsilon", self.amax_epsilon)
        if not math.isfinite(eps) or eps < 0 or eps > _F32_MAX:
            raise ValueError(f"amax_epsilon must be finite and >= 0, got {self.amax_epsilon!r}")
        object.__setattr__(self, "amax_epsilon", eps)
        if self.scale_format != "float32" and eps != 0:
            raise ValueError(
                f"amax_epsilon must be 0 under mode {self.mode!r} (it is a float32 scale "
                f"rule's field), got {self.amax_epsilon!r}"
            )
        if self.power_2_scales and self.mode != "te-fp32":
            raise ValueError(
                f"power_2_scales must be False under mode {self.mode!r} (power-of-two "
                "float32 scales are TE's, mode 'te-fp32'), got True"
            )

    def allows(self, element: Any, what: str = "element") -> str:
        """`element` if the recipe's mode quantizes to it, else a ValueError listing those."""
        allowed = _MODES[self.mode]["elements"]
        if element not in allowed:
            raise ValueError(
                f"{what} must be one of {', '.join(allowed)} under mode {self.mode!r}, "
                f"got {element!r}"
            )
        return str(element)

    def role_element(self, role: str | None) -> str:
        """The element format of a tensor of `role` ("input", "weight", "grad" or None)."""
        if role is not None and role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of: None, {', '.join(ROLES)}")
        return self.grad_element if role == "grad" else self.element

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-safe."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BlockRecipe:
        """The recipe `to_dict` wrote; an unknown field, or a missing one that has no
        default, is a ValueError."""
        return cls(**exact_fields(cls, d, defaults=True))


def block_recipe(name: str, /, **overrides: Any) -> BlockRecipe:
    """The block preset `name` (one of ``BLOCK_RECIPES``), with fields replaced by `overrides`.

    The TE presets (``te-mxfp8``, ``te-blockwise``) also take
    TransformerEngine's ``fp8_format="E4M3" | "HYBRID"`` (e5m2 gradients);
    ``"E5M2"`` is refused as TE refuses it.  ``te-mxfp8`` with
    ``weight_block=32`` names in its ``source`` the TE commit after v2.18
    that added 32x32 weights.  ``te-nvfp4`` also takes TE's
    ``disable_rht``, ``disable_stochastic_rounding`` and
    ``disable_2d_quantization`` (True turns off ``hadamard``,
    ``stochastic_rounding``, ``weight_block``).
    ``lscore.fp8.recipe`` gives the same for these names.
    """
    if name not in BLOCK_TABLE:
        raise ValueError(
            f"unknown block recipe {name!r}; expected one of: {', '.join(BLOCK_RECIPES)}"
        )
    te = BLOCK_TABLE[name]["behaviour"] == "te" and name != "te-nvfp4"
    overrides = nvfp4.switches(name, overrides)
    defaults = {
        f.name: f.default
        for f in dataclasses.fields(BlockRecipe)
        if f.default is not dataclasses.MISSING
    }
    row = {name: {**BLOCK_TABLE[name], **defaults, **BLOCK_TABLE[name]}}  # all overridable
    fields = preset_fields(name, row, overrides, te, ("element", "grad_element"))
    if name == "te-mxfp8" and fields.get("weight_block") and "source" not in overrides:
        fields["source"] = _TE_MXFP8_2D
    return BlockRecipe(**fields)


def as_block_recipe(recipe: Any) -> BlockRecipe:
    """A BlockRecipe, or the preset of that name."""
    if isinstance(recipe, str):
        return block_recipe(recipe)
    if not isinstance(recipe, BlockRecipe):
        raise TypeError(
            "recipe must be an lscore.fp8.BlockRecipe or a preset name, "
            f"got {type(recipe).__name__}"
        )
    return recipe


def element_dtype(element: str) -> str:
    """The dtype name of an element format's codes: float8_e4m3fn, float8_e5m2 or float4_e2m1."""
    return _KERNEL_ELEMS[element]
