"""Block-scaled formats (MXFP8, MXFP4, NVFP4): recipes as exact presets, quantize and dequantize.

Design: a ``BlockRecipe`` names every choice a block-scaled quantization
makes (element format, block size, scale format, the rule that picks a
block's scale, whose behaviour it reproduces, what happens to a last
partial block); the presets are rows of ``BLOCK_TABLE``, each citing the
public source it follows.  ``quantize_blocks`` checks everything, then
runs the compiled block passes (``lscore.kernels.mx_quantize`` /
``nvfp4_quantize``) over the input where it lies, one pass per
orientation: blocks along the last axis, or (``axis=0``, a 2-D input)
along the first, TransformerEngine's columnwise copy, each orientation
quantized from the high-precision input.  ``dequantize_blocks`` reads the
codes back by the rule of the implementation the recipe reproduces.
CuPy arrays go to ``lscore.cuda.mx``'s kernels, as ``lscore.fp8.quantize``
sends float8 casts to ``lscore.cuda.fp8``.  Only NumPy is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np

from lscore import kernels
from lscore.fp8.checks import (
    block_axis,
    dtype_name,
    exact_fields,
    float_input,
    fp8_dtype,
    out_dtype,
    preset_fields,
)
from lscore.policy import boolean, choice, integer

__all__ = [
    "BLOCK_RECIPES",
    "BLOCK_TABLE",
    "BlockRecipe",
    "BlockScaled",
    "block_recipe",
    "dequantize_blocks",
    "quantize_blocks",
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


@dataclasses.dataclass(frozen=True)
class BlockScaled:
    """A block-scaled tensor: `data` (element codes), `scales` (one per block), `tensor_scale`
    (NVFP4's float32 per-tensor scale, or None), the `recipe`, the `element` format, the
    blocked `axis` (-1: along the last axis; 0: along the first of a 2-D input) and the
    input's `shape`.

    NumPy: `data` is an ml_dtypes float8 array of the input's shape, or for
    E2M1 uint8 holding two codes a byte (the first in the low nibble), paired
    along the blocked axis; `scales` is ml_dtypes float8_e8m0fnu (E8M0) or
    float8_e4m3fn (NVFP4), one per block: the input's shape with the blocked
    axis divided by the block (rounded up with a padded partial block).
    """

    data: Any
    scales: Any
    tensor_scale: Any
    recipe: BlockRecipe
    element: str
    axis: int
    shape: tuple[int, ...]


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


def _device(x: Any) -> Any:
    """lscore.cuda's block kernels over CuPy arrays when x is a device array, else None."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__cuda_array_interface__"):
        return None
    try:  # by name: the CUDA block kernels are an optional part of the build
        mx = importlib.import_module("lscore.cuda.mx")
    except ImportError as e:
        raise TypeError(
            "block-scaled quantization of CuPy arrays needs lscore.cuda.mx's kernels, "
            f"which this build lacks ({e})"
        ) from None
    return mx.cupy_blocks()


def _width(n: int, element: str) -> int:
    """Bytes of element codes for n elements: two E2M1 codes a byte."""
    return (n + 1) // 2 if element == "e2m1" else n


def _tensor_scale(x: np.ndarray) -> np.float32:
    """NVFP4's per-tensor scale: torchao's per_tensor_amax_to_scale of torch.amax(|x|)."""
    return np.float32(kernels.nvfp4_tensor_scale(kernels.fp8_amax(x, True)))


def quantize_blocks(
    x: np.ndarray,
    recipe: Any,
    *,
    axis: int = -1,
    element: str | None = None,
    out: BlockScaled | None = None,
) -> BlockScaled:
    """Quantize x in blocks by `recipe` (a ``BlockRecipe`` or a preset name): a ``BlockScaled``.

    `x` is float32, float16 or bfloat16 (read where it lies); `axis` -1
    blocks along the last axis, 0 along the first axis of a 2-D input (the
    columnwise copy TransformerEngine makes from the same input); `element`
    (default the recipe's ``element``, e.g. its ``grad_element`` for a
    gradient) must be one the recipe allows.  A length along that axis that
    is not a multiple of the block is refused or padded, as the recipe's
    ``tail`` says.  With ``tensor_scale`` the per-tensor scale comes from
    the amax of all of x (NaN if one is NaN).  `out`, the result of an
    earlier call with the same recipe, element, axis and input shape, has
    its scales and data written in place (so that a step allocates
    nothing) and is returned with this call's tensor scale; it needs whole
    blocks and NumPy arrays.  Every check is made before anything is
    computed.  A CuPy array gives CuPy uint8 codes.

    >>> import numpy as np
    >>> from lscore.fp8 import dequantize_blocks, quantize_blocks
    >>> b = quantize_blocks(np.linspace(-3, 3, 32, dtype=np.float32), "ocp-mx")
    >>> b.scales.view(np.uint8), b.data[:4]
    (array([120], dtype=uint8), array([-384, -352, -320, -320], dtype='float8_e4m3fn'))
    >>> dequantize_blocks(b)[:4]
    array([-3.  , -2.75, -2.5 , -2.5 ], dtype=float32)
    """
    r = as_block_recipe(recipe)
    elem = r.element if element is None else r.allows(element)
    dev = _device(x)
    if dev is not None:
        if out is not None:
            raise TypeError("out= takes NumPy arrays; a CuPy input gets new device arrays")
        from lscore.cuda.fp8 import cupy_arrays

        return quantize_on(dev, cupy_arrays(), x, r, elem, axis)
    x = float_input(x)
    cols = block_axis(x, axis)
    n = x.shape[0] if cols else x.shape[-1]
    _check_tail(r, n, axis)
    if out is not None:
        _check_out(out, x, r, elem, 0 if cols else -1)
    pts = _tensor_scale(x) if r.tensor_scale else None
    ax = 0 if cols else -1
    v = x
    tail = -n % r.block
    if tail:  # zero-padded to whole blocks: only the partial block's zeros are added
        pad = list(x.shape)
        pad[ax] = tail
        v = np.concatenate([x, np.zeros(pad, x.dtype)], axis=ax)
    codes = None if out is None else (out.scales.view(np.uint8), out.data.view(np.uint8))
    if r.mode == "nvfp4":
        pf = None if pts is None else float(pts)
        scales, data = kernels.nvfp4_quantize(v, pf, axis=ax, out=codes)
    else:
        scales, data = kernels.mx_quantize(
            v, _KERNEL_ELEMS[elem], r.mode, r.block, axis=ax, out=codes
        )
    if out is not None:
        return dataclasses.replace(out, tensor_scale=pts)
    if tail:
        data = data[: _width(n, elem)] if cols else data[..., : _width(n, elem)]
    return BlockScaled(
        data if elem == "e2m1" else data.view(fp8_dtype(_KERNEL_ELEMS[elem])),
        scales.view(fp8_dtype("float8_e8m0fnu" if r.scale_format == "e8m0" else "float8_e4m3fn")),
        pts,
        r,
        elem,
        0 if cols else -1,
        tuple(x.shape),
    )


def _check_out(out: Any, x: np.ndarray, r: BlockRecipe, elem: str, axis: int) -> None:
    """out can take quantize_blocks(x, r)'s codes in place."""
    if not isinstance(out, BlockScaled):
        raise TypeError(f"out must be an lscore.fp8.BlockScaled, got {type(out).__name__}")
    want = (r, elem, axis, tuple(x.shape))
    got = (out.recipe, out.element, out.axis, tuple(out.shape))
    if got != want:
        raise ValueError(
            "out must come from a call with the same recipe, element, axis and shape: "
            f"out has {got[0].name!r}, {got[1]!r}, axis {got[2]}, shape {got[3]}; "
            f"this call {want[0].name!r}, {want[1]!r}, axis {want[2]}, shape {want[3]}"
        )
    n = x.shape[0] if axis == 0 else x.shape[-1]
    if n % r.block:
        raise ValueError(
            f"out= needs whole blocks of {r.block} along axis {axis}, got {n} "
            "(a padded partial block is written to new arrays)"
        )
    for name in ("scales", "data"):
        a = getattr(out, name)
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"out.{name} must be a writable C-contiguous NumPy array")


def _check_tail(r: BlockRecipe, n: int, axis: int) -> None:
    if n % r.block and r.tail == "refuse":
        raise ValueError(
            f"x's length along axis {axis} must be a multiple of the block {r.block} "
            f"(recipe {r.name!r} refuses a partial block, tail 'refuse'), got {n}"
        )


def quantize_on(dev: Any, arrays: Any, x: Any, r: BlockRecipe, elem: str, axis: int) -> BlockScaled:
    """quantize_blocks of a device array through `dev`, an ``lscore.cuda.mx.BlockArrays``,
    and `arrays`, the ``lscore.cuda.fp8.Float8Arrays`` of the same framework (NVFP4's
    amax): CuPy's here, torch's in the torch adapter."""
    cols = block_axis(x, axis)
    n = x.shape[0] if cols else x.shape[-1]
    _check_tail(r, n, axis)
    if n % r.block:
        raise ValueError(
            f"x's length along axis {axis} must be a multiple of the block {r.block} for a "
            f"CuPy array (a padded partial block is quantized on the host only), got {n}"
        )
    pts = None
    if r.tensor_scale:
        amax = float(arrays.h["to_host"](arrays.amax(x, None, "propagate")))
        pts = np.float32(kernels.nvfp4_tensor_scale(amax))
    kaxis = 0 if cols else -1
    if r.mode == "nvfp4":
        scales, data = dev.quantize(x, "float4_e2m1", "nvfp4", 16, axis=kaxis, pts=pts)
    else:
        scales, data = dev.quantize(x, _KERNEL_ELEMS[elem], r.mode, r.block, axis=kaxis)
    return BlockScaled(data, scales, pts, r, elem, kaxis, tuple(x.shape))


def dequantize_on(dev: Any, b: BlockScaled, dtype: str) -> Any:
    """dequantize_blocks of device codes through `dev`, an ``lscore.cuda.mx.BlockArrays``
    (`dtype` a name): a new array of the codes' framework on their device."""
    r = b.recipe
    return dev.dequantize(
        b.scales,
        b.data,
        _KERNEL_ELEMS[b.element],
        r.mode,
        r.block,
        axis=b.axis,
        pts=b.tensor_scale,
        dtype=dtype,
    )


def _check_codes(b: BlockScaled) -> None:
    """b's arrays are NumPy codes of the shapes its recipe, axis and input shape give."""
    r = b.recipe
    if not isinstance(r, BlockRecipe):
        raise TypeError(f"b.recipe must be an lscore.fp8.BlockRecipe, got {type(r).__name__}")
    shape = tuple(b.shape)
    n = shape[0] if b.axis == 0 else shape[-1]
    edge = 0 if b.axis == 0 else len(shape) - 1
    elem = "uint8" if b.element == "e2m1" else _KERNEL_ELEMS[r.allows(b.element, "b.element")]
    scale = "float8_e8m0fnu" if r.scale_format == "e8m0" else "float8_e4m3fn"
    want = {
        "data": (elem, (*shape[:edge], _width(n, b.element), *shape[edge + 1 :])),
        "scales": (scale, (*shape[:edge], -(-n // r.block), *shape[edge + 1 :])),
    }
    for name, (dt, sh) in want.items():
        a = getattr(b, name)
        if not isinstance(a, np.ndarray):
            raise TypeError(f"b.{name} must be a NumPy array, got {type(a).__name__}")
        if dtype_name(a.dtype) not in ("uint8", dt) or a.shape != sh:
            raise ValueError(
                f"b.{name} must be {dt} or uint8 of shape {sh}, got {a.dtype} {a.shape}"
            )
    if r.tensor_scale != (b.tensor_scale is not None):
        raise ValueError(
            f"b.tensor_scale must be {'a float32' if r.tensor_scale else 'None'} under recipe "
            f"{r.name!r}, got {b.tensor_scale!r}"
        )


def _decode_elements(b: BlockScaled) -> np.ndarray:
    """The elements' float32 values, along the blocked axis as the last axis."""
    codes = np.asarray(b.data).view(np.uint8)
    if b.axis == 0:
        codes = codes.T
    if b.element == "e2m1":
        pairs = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1)
        n = b.shape[0] if b.axis == 0 else b.shape[-1]
        return kernels.e2m1_decode(pairs[..., :n])
    return codes.view(fp8_dtype(_KERNEL_ELEMS[b.element])).astype(np.float32)


def _block_values(b: BlockScaled, dtype: str) -> np.ndarray:
    """Each block scale as the recipe's implementation multiplies by it, float32 (blocks last)."""
    codes = np.asarray(b.scales).view(np.uint8)
    if b.axis == 0:
        codes = codes.T
    r = b.recipe
    if r.scale_format == "e4m3fn":  # torchao's get_hp_scales: pts * float32(scale)
        s = codes.view(fp8_dtype("float8_e4m3fn")).astype(np.float32)
        if b.tensor_scale is not None:
            s = (np.float32(b.tensor_scale) * s).astype(np.float32)
        return s
    # 2**(c - 127), 0xFF NaN: the format's reading, torchao's get_fp_scale and TE's
    # ptx::exp2f as NVIDIA/TransformerEngine#3262 corrected it (v2.18's shifted the byte into
    # the exponent field: code 0 read as 0, 0xFF as Inf); TE's dequantize_mxfp8.cuh then
    # rounds the float32 product once to the output dtype, as the OCP rule does
    s = kernels.e8m0_decode(codes)
    if r.behaviour == "torchao" and dtype == "float16":
        # torchao's to_dtype multiplies in the target dtype: 2**k overflows float16 above
        # 2**15 and flushes below 2**-24
        with np.errstate(over="ignore"):
            s = s.astype(np.float16).astype(np.float32)
    return s


def dequantize_blocks(b: BlockScaled, dtype: Any = np.float32) -> np.ndarray:
    """The values `b` holds, as the implementation its recipe reproduces reads them back.

    Each element times its block's scale in float32, rounded once to
    `dtype` (float32, float16 or bfloat16): the OCP rule's ``2**(c - 127)``
    (0xFF NaN) for ``rule`` and ``te`` recipes; torchao's ``to_dtype`` for
    its MX presets (the scale cast to `dtype` first, so a float16 result
    overflows where the scale is above 2**15); torchao's NVFP4 ``dequantize``
    (the element times per-tensor scale times block scale, in float32).  A
    CuPy ``BlockScaled`` gives a CuPy array.
    """
    if not isinstance(b, BlockScaled):
        raise TypeError(f"b must be an lscore.fp8.BlockScaled, got {type(b).__name__}")
    dname = out_dtype(dtype)
    dev = _device(b.data)
    if dev is not None:
        return dequantize_on(dev, b, dname)
    _check_codes(b)
    elems = _decode_elements(b)
    scales = _block_values(b, dname)
    n, k = elems.shape[-1], b.recipe.block
    with np.errstate(over="ignore", invalid="ignore"):
        if n % k:  # a padded partial block: its scale repeated over the elements it has
            y = elems * np.repeat(scales, k, axis=-1)[..., :n]
        else:
            y = (elems.reshape(*scales.shape, k) * scales[..., None]).reshape(elems.shape)
    if b.axis == 0:
        y = y.T
    if dname == "float32":
        return np.ascontiguousarray(y)
    with np.errstate(over="ignore"):  # beyond the format's largest value: Inf, as a cast gives
        return np.ascontiguousarray(y.astype(fp8_dtype(dname) if dname == "bfloat16" else dname))
