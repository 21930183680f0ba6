"""Block-scaled recipes (MXFP8, MXFP4, NVFP4, blockwise FP8) as exact presets.

A ``BlockRecipe`` names every choice a block-scaled quantization makes
(element format, block size, scale format, the rule that picks a block's
scale, whose behaviour it reproduces, what happens to a last partial
block, the square tiles of a weight, the library revision it reproduces);
the presets are rows of ``BLOCK_TABLE``, each citing the public source it
follows, and ``block_recipe(name)`` gives them.  A preset reproduces its
library's pinned release (TransformerEngine v2.18, torchao v0.18.0); where
the library's next revision changed a rule, the ``revision`` field selects
it (``lscore.fp8.revisions.REVISIONS``).  ``lscore.fp8.blocks``
quantizes and dequantizes by them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from lscore.fp8 import nvfp4, revisions
from lscore.fp8.block_table import (
    BLOCK_RECIPES,
    BLOCK_TABLE,
    KERNEL_ELEMS,
    MODES,
    TE_MXFP8_2D,
)
from lscore.fp8.checks import exact_fields, preset_fields
from lscore.fp8.revisions import REVISIONS
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
    revision : str
        The revision of the behaviour's library it reproduces, one of
        ``REVISIONS[behaviour]``: the pinned release ("v2.18", "v0.18.0";
        "v1.0" for the OCP rule; "" takes it), or the next revision where
        the library changed a rule of the mode ("4ff5fdfed0c1" for TE's
        "te", "5d73a0c10b02" for torchao's MX modes).  ``kernel_mode`` is the
        kernels' name of the rule at that revision.

    The mode fixes the behaviour, scale format, block and the element
    formats allowed; anything else is a ValueError listing what is allowed.
    Fields after `tail` have defaults, so a dict written before they existed
    still loads (``from_dict``); `source` describes the others and is not
    compared.
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
    source: str = dataclasses.field(default="", compare=False)
    hadamard: bool = False
    stochastic_rounding: bool = False
    revision: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        rule = MODES[choice("mode", self.mode, tuple(MODES))]
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
        rev = revisions.check_revision(self.revision, self.behaviour, self.mode, "next" in rule)
        object.__setattr__(self, "revision", rev)
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

    @property
    def kernel_mode(self) -> str:
        """The block kernels' name of the scale rule at ``revision``: `mode` at the pinned
        release, else the next revision's ("te-3262", "floor-4725", ... "rceil-4725")."""
        if self.revision == revisions.pinned(self.behaviour):
            return self.mode
        return str(MODES[self.mode]["next"])

    def allows(self, element: Any, what: str = "element") -> str:
        """`element` if the recipe's mode quantizes to it, else a ValueError listing those."""
        allowed = MODES[self.mode]["elements"]
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
    ``"E5M2"`` is refused as TE refuses it.  ``revision=`` (one of
    ``REVISIONS``) selects the library's next revision where it changed a
    rule, and the ``source`` names it; ``te-mxfp8`` with ``weight_block=32``
    names in its ``source`` the TE commit after v2.18 that added 32x32
    weights.  ``te-nvfp4`` also takes TE's ``disable_rht``,
    ``disable_stochastic_rounding`` and ``disable_2d_quantization`` (True
    turns off ``hadamard``, ``stochastic_rounding``, ``weight_block``).
    ``lscore.fp8.recipe`` gives the same for these names.

    >>> import lscore.fp8 as fp8
    >>> r = fp8.recipe("torchao-mx-rceil", revision="5d73a0c10b02")
    >>> r.source, r.kernel_mode
    ('pytorch/ao main at 5d73a0c10b02 (#4725)', 'rceil-4725')
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
    if "source" not in overrides:
        revision = fields.get("revision") or revisions.pinned(fields["behaviour"])
        if revision != revisions.pinned(fields["behaviour"]):
            fields["source"] = REVISIONS[fields["behaviour"]].get(revision, fields["source"])
        if fields["mode"] == "te" and fields.get("weight_block"):
            fields["source"] += TE_MXFP8_2D
    return BlockRecipe(**fields)


#: preset name -> its BlockRecipe (frozen), built once: a quantize by name paid 20 us for it
_NAMED: dict[str, BlockRecipe] = {}


def as_block_recipe(recipe: Any) -> BlockRecipe:
    """A BlockRecipe, or the preset of that name."""
    if isinstance(recipe, str):
        named = _NAMED.get(recipe)
        if named is None:  # an unknown name raises here and is not kept
            named = _NAMED[recipe] = block_recipe(recipe)
        return named
    if not isinstance(recipe, BlockRecipe):
        raise TypeError(
            "recipe must be an lscore.fp8.BlockRecipe or a preset name, "
            f"got {type(recipe).__name__}"
        )
    return recipe


def element_dtype(element: str) -> str:
    """The dtype name of an element format's codes: float8_e4m3fn, float8_e5m2 or float4_e2m1."""
    return KERNEL_ELEMS[element]
