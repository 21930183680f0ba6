"""Block-scaled recipes (MXFP8, MXFP4, NVFP4) as exact presets: ``block_recipe(name)``.

A ``BlockRecipe`` names every choice a block-scaled quantization makes
(element format, block size, scale format, the rule that picks a block's
scale, whose behaviour it reproduces, what happens to a last partial
block); the presets are rows of ``BLOCK_TABLE``, each citing the public
source it follows.  ``lscore.fp8.blocks`` quantizes and dequantizes by them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lscore.fp8.checks import exact_fields, preset_fields
from lscore.policy import boolean, choice, integer

__all__ = [
    "BLOCK_RECIPES",
    "BLOCK_TABLE",
    "BlockRecipe",
    "as_block_recipe",
    "block_recipe",
    "element_dtype",
]

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
_MODES: dict[str, dict[str, Any]] = {
    "ocp": dict(behaviour="rule", scale_format="e8m0", block=32, elements=_MX),
    "te": dict(behaviour="te", scale_format="e8m0", block=32, elements=("e4m3fn", "e5m2")),
    **{
        m: dict(behaviour="torchao", scale_format="e8m0", block=32, elements=_MX)
        for m in ("floor", "ceil", "even", "rceil")
    },
    "nvfp4": dict(behaviour="torchao", scale_format="e4m3fn", block=16, elements=("e2m1",)),
}

# an MXFP8 recipe: e4m3fn in both directions, E8M0 scales of 32 elements
_MXFP8 = dict(
    element="e4m3fn", grad_element="e4m3fn", block=32, scale_format="e8m0", tensor_scale=False
)
_TORCHAO_MX = dict(_MXFP8, behaviour="torchao", tail="refuse")

#: every preset: name -> the BlockRecipe fields it fixes (the comment above each cites its source)
BLOCK_TABLE: dict[str, dict[str, Any]] = {
    # The OCP rule: e = floor(log2(amax)) - emax, an all-zero block at float32's smallest
    # normal, e > 127 a NaN scale, e < -127 clamped; elements divided by 2**e exactly and
    # saturated, rounded to nearest even (OCP MX v1.0 section 6.3; the exponent as
    # microsoft/microxcaling mx/mx_ops.py _shared_exponents computes it, its log2 exact).
    # A last partial block is scaled from its own elements: microxcaling pads the axis
    # with zeros to a multiple of the block (mx/mx_ops.py _reshape_to_blocks).  OCP has no
    # training recipe: e4m3fn for both directions, as TransformerEngine's default.
    "ocp-mx": dict(_MXFP8, mode="ocp", behaviour="rule", tail="pad"),
    # TransformerEngine v2.18 MXFP8BlockScaling: fp8_format E4M3 by default (HYBRID: e5m2
    # gradients) (common/recipe/__init__.py:337-384); the scale is float_to_e8m0 of amax *
    # (1 / fp8_max), rounded up (common/util/ptx.cuh:386-418), the elements multiplied by
    # exp2f_rcp (common/cast/mxfp8/quantize_mxfp8.cuh:268-293).  A last partial block is
    # scaled from its own elements: the cast kernel sizes its scales DIVUP(cols, 32) and its
    # tile loads fill past the edge with zeros (quantize_mxfp8.cuh:255-262, 608-609), though
    # TE's modules only quantize multiples of 32 (pytorch/tensor/mxfp8_tensor.py:89-97).
    "te-mxfp8": dict(_MXFP8, mode="te", behaviour="te", tail="pad"),
    # torchao 0.18 MXTensor.to_mx (mx_formats/mx_tensor.py:214-411, QuantizeTensorToMXKwargs
    # elem_dtype float8_e4m3fn, block_size 32: mx_tensor.py:99-106) in each
    # ScaleCalculationMode (mx_formats/config.py:41-66), read back by to_dtype
    # (mx_tensor.py:414-479); it asserts that the last dimension is a multiple of the block
    # (mx_tensor.py:230-232), so a partial block is refused.
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
        Elements per scale: 32 for the MX formats, 16 for NVFP4.
    scale_format : "e8m0" | "e4m3fn"
        The block scale's format: a power of two (MX) or E4M3 (NVFP4).
    mode : str
        The rule that picks a block's scale: "ocp" (the OCP rule), "te"
        (TransformerEngine's RCEIL), torchao's "floor", "ceil", "even" and
        "rceil", or "nvfp4".
    behaviour : "rule" | "te" | "torchao"
        Whose results it reproduces, bit for bit: the OCP rule's, or the
        implementation's, departures from the rule included.
    tensor_scale : bool
        NVFP4's float32 per-tensor scale (amax / (448 * 6)) over the block
        scales.
    tail : "refuse" | "pad"
        A length along the blocked axis that is not a multiple of `block`:
        a ValueError, or a last partial block scaled from its own elements
        (as if padded with zeros).

    The mode fixes the behaviour, scale format, block and the element
    formats allowed; anything else is a ValueError listing what is allowed.
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

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        rule = _MODES[choice("mode", self.mode, tuple(_MODES))]
        object.__setattr__(self, "block", integer("block", self.block, minimum=1))
        object.__setattr__(self, "tensor_scale", boolean("tensor_scale", self.tensor_scale))
        choice("tail", self.tail, ("refuse", "pad"))
        for field in ("behaviour", "scale_format", "block"):
            if getattr(self, field) != rule[field]:
                raise ValueError(
                    f"{field} must be {rule[field]!r} under mode {self.mode!r}, "
                    f"got {getattr(self, field)!r}"
                )
        for field in ("element", "grad_element"):
            self.allows(getattr(self, field), field)
        if self.tensor_scale and self.mode != "nvfp4":
            raise ValueError(
                f"tensor_scale must be False under mode {self.mode!r} (a per-tensor scale is "
                "NVFP4's), got True"
            )
        if self.behaviour == "te" and self.element != "e4m3fn":
            raise ValueError(
                "element must be 'e4m3fn' under mode 'te' (TE's fp8_format E4M3 or HYBRID; "
                f"pure E5M2 training is not supported), got {self.element!r}"
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

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-safe."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BlockRecipe:
        """The recipe `to_dict` wrote; a missing or unknown field is a ValueError."""
        return cls(**exact_fields(cls, d))


def block_recipe(name: str, /, **overrides: Any) -> BlockRecipe:
    """The block preset `name` (one of ``BLOCK_RECIPES``), with fields replaced by `overrides`.

    ``te-mxfp8`` also takes TransformerEngine's ``fp8_format="E4M3" |
    "HYBRID"`` (e5m2 gradients); ``"E5M2"`` is refused as TE refuses it.
    ``lscore.fp8.recipe`` gives the same for these names.
    """
    if name not in BLOCK_TABLE:
        raise ValueError(
            f"unknown block recipe {name!r}; expected one of: {', '.join(BLOCK_RECIPES)}"
        )
    te = BLOCK_TABLE[name]["behaviour"] == "te"
    fields = preset_fields(name, BLOCK_TABLE, overrides, te, ("element", "grad_element"))
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
