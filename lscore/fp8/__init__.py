"""FP8 scaling: TransformerEngine's and torchao's recipes as exact parameter sets.

``recipe(name, **overrides)`` gives a ``Recipe`` (one of ``RECIPES``, or a
custom parameter set); ``Recipe.scale_from_amax`` is its compiled
current-scaling rule; ``DelayedScaling`` is TransformerEngine's
delayed-scaling state of n tensors.  ``amax``, ``quantize`` (one pass: the
cast with a given scale and the input's amax), ``quantize_current`` (amax,
the recipe's scale, the cast; a ``Float8``) and ``dequantize``, per tensor or
per row, for NumPy and CuPy arrays.  ``tensor_stats`` and ``Float8Monitor``
report what a scaled float8 cast does to each tensor (amax, scale, saturated
and flushed elements).  Block-scaled formats (MXFP8, MXFP4, NVFP4, blockwise FP8): a
``BlockRecipe`` (one of ``BLOCK_RECIPES``, also from ``recipe``),
``quantize_blocks`` (a ``BlockScaled``) and ``dequantize_blocks``;
``block_stats`` reports what a block-scaled quantize does to a tensor (the
scale exponents' histogram, saturated and flushed elements, NaN scales).
Only NumPy is imported.
"""

from lscore.fp8.block_dequant import dequantize_blocks
from lscore.fp8.block_diagnostics import BlockStats, block_stats
from lscore.fp8.blocks import BLOCK_RECIPES, BlockRecipe, BlockScaled, quantize_blocks
from lscore.fp8.casting import Float8, amax, dequantize, quantize, quantize_current
from lscore.fp8.delayed import DelayedScaling
from lscore.fp8.diagnostics import Float8Monitor, Float8Stats, tensor_stats
from lscore.fp8.recipes import FP8_MAX, RECIPES, Recipe, recipe

# re-bound so that their doc comments reach the API reference
#: the preset recipe names: "te-delayed", "te-current", "torchao-tensorwise", "torchao-rowwise"
RECIPES = RECIPES
#: the block-scaled preset names: "ocp-mx", "te-mxfp8", "torchao-mx-floor", "torchao-mx-ceil",
#: "torchao-mx-even", "torchao-mx-rceil", "nvfp4", "te-blockwise", "torchao-blockwise"
BLOCK_RECIPES = BLOCK_RECIPES
#: the largest finite value of each float8 format: {"e4m3fn": 448.0, "e5m2": 57344.0}
FP8_MAX = FP8_MAX

__all__ = [
    "BLOCK_RECIPES",
    "FP8_MAX",
    "RECIPES",
    "BlockRecipe",
    "BlockScaled",
    "BlockStats",
    "DelayedScaling",
    "Float8",
    "Float8Monitor",
    "Float8Stats",
    "Recipe",
    "amax",
    "block_stats",
    "dequantize",
    "dequantize_blocks",
    "quantize",
    "quantize_blocks",
    "quantize_current",
    "recipe",
    "tensor_stats",
]
