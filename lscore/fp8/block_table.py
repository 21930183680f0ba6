"""The block-scaled presets as data: each scale rule's fixed fields (``MODES``) and each
preset's fields (``BLOCK_TABLE``), every row citing the lines of the library and the
revision it reproduces.  ``lscore.fp8.block_recipes`` reads them."""

from __future__ import annotations

from typing import Any

from lscore.fp8 import revisions

__all__ = ["BLOCK_RECIPES", "BLOCK_TABLE", "KERNEL_ELEMS", "MODES", "TE_MXFP8_2D"]

#: element format name -> the kernels' name of it
KERNEL_ELEMS = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1"}
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
# `next`: the kernels' mode of the rule at its library's next revision (REVISIONS), where
# that revision changed it: TE #3262 its MXFP8 dequantize (ptx::exp2f), torchao #4725 its
# MX scales and products (lscore.kernels.mx_scale lists the rules).
#: scale rule (``mode``) -> the fields it fixes: behaviour, scale format, block, elements
MODES: dict[str, dict[str, Any]] = {
    "ocp": dict(behaviour="rule", scale_format="e8m0", block=32, elements=_MX),
    "te": dict(
        behaviour="te", scale_format="e8m0", block=32, elements=("e4m3fn", "e5m2"), next="te-3262"
    ),
    **{
        m: dict(behaviour="torchao", scale_format="e8m0", block=32, elements=_MX, next=f"{m}-4725")
        for m in ("floor", "ceil", "even", "rceil")
    },
    "nvfp4": dict(behaviour="torchao", scale_format="e4m3fn", block=16, elements=("e2m1",)),
    "te-fp32": dict(behaviour="te", scale_format="float32", block=128, elements=("e4m3fn", "e5m2")),
    "torchao-fp32": dict(
        behaviour="torchao", scale_format="float32", block=128, elements=("e4m3fn",)
    ),
    "te-nvfp4": dict(behaviour="te", scale_format="e4m3fn", block=16, elements=("e2m1",)),
}

# the libraries and versions the presets reproduce (lscore.fp8.revisions)
_TE, _AO, _OCP = revisions.TE, revisions.AO, revisions.OCP

# te-mxfp8 with weight_block=32: TE's 2-D MXFP8 weights are in no release that the other
# rules are pinned to (NVIDIA/TransformerEngine#2634, after v2.18 and after #3262)
#: what ``source`` adds for te-mxfp8 with ``weight_block=32`` (after v2.18)
TE_MXFP8_2D = (
    ", 32x32 weights as commit d8815c4c30b5 (#2634, after v2.18: "
    "MXFP8BlockScaling(enable_2d_quantization=True))"
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
        source=_OCP,
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
    # The block amax leaves NaN elements out (fmaxf, __hmax, max.xorsign.abs from 0:
    # quantize_mxfp8.cuh:211-363).  TE v2.18's dequantize reads scale byte 0 as +0.0 and
    # 0xFF as +Inf (ptx::exp2f, common/util/ptx.cuh:382-384; dequantize_mxfp8.cuh:175-195);
    # revision="4ff5fdfed0c1" (#3262) reads them as 2**-127 and NaN.
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
    # revision="5d73a0c10b02" (#4725, mx_tensor.py:111-159, 185-225, 351-373 at that
    # commit): a non-finite amax gives the NaN scale (EVEN: once rounded), RCEIL's code is
    # the bit rule of amax * float32(1 / max) without saturation, and the elements are
    # multiplied by the E8M0 reciprocal (code 0: 2**127) with no clamp before the cast.
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
