"""Block-scaled formats (MXFP8, MXFP4, NVFP4): quantize and dequantize by a ``BlockRecipe``.

The recipes are ``lscore.fp8.block_recipes``' (re-exported here).
``quantize_blocks`` checks everything, then runs the compiled block passes
(``lscore.kernels.mx_quantize`` / ``nvfp4_quantize``) over the input where
it lies, one pass per orientation: blocks along the last axis, or
(``axis=0``, a 2-D input) along the first, TransformerEngine's columnwise
copy, each orientation quantized from the high-precision input.
``dequantize_blocks`` reads the codes back by the rule of the
implementation the recipe reproduces.  CuPy arrays go to
``lscore.cuda.mx``'s kernels, as ``lscore.fp8.quantize`` sends float8 casts
to ``lscore.cuda.fp8``.  Only NumPy is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np

from lscore import kernels
from lscore.fp8.block_recipes import (
    BLOCK_RECIPES,
    BLOCK_TABLE,
    BlockRecipe,
    as_block_recipe,
    block_recipe,
    element_dtype,
)
from lscore.fp8.checks import block_axis, dtype_name, float_input, fp8_dtype, out_dtype

__all__ = [
    "BLOCK_RECIPES",
    "BLOCK_TABLE",
    "BlockRecipe",
    "BlockScaled",
    "as_block_recipe",
    "block_recipe",
    "dequantize_blocks",
    "element_dtype",
    "quantize_blocks",
]


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


# The NaN torch.max(torch.abs(x)) gives for a tensor of two or more elements with a NaN, by
# x's dtype, as float32 bits: torch's serial CPU reduction combines lanes by an OR with the
# all-ones NaN mask (float32, float16: the sign set), bfloat16's by a float32 maximum.
_TORCH_NAN_MAX = {"float32": 0xFFFFFFFF, "float16": 0xFFC00000, "bfloat16": 0x7FC00000}


def torchao_amax(amax: float, dtype: str, size: int) -> np.float32:
    """The amax torchao's NVFP4 takes, ``torch.max(torch.abs(x))`` on the CPU, from `amax`
    (any NaN where x holds one) of an x of `dtype` (a name) and `size` elements: a NaN is
    ``_TORCH_NAN_MAX``'s by the dtype (one element: x's own NaN, its sign cleared)."""
    a = np.float32(amax)
    if a == a or size == 1:
        return a
    return np.uint32(_TORCH_NAN_MAX[dtype]).view(np.float32)


def _tensor_scale(x: np.ndarray) -> np.float32:
    """NVFP4's per-tensor scale: torchao's per_tensor_amax_to_scale of torch.max(|x|)."""
    if x.size == 1:  # torch.abs of the one element: its bits with the sign cleared
        one = np.abs(x.astype(np.float32).reshape(-1)[:1]).view(np.uint32) & 0x7FFFFFFF
        return np.float32(kernels.nvfp4_tensor_scale(one.view(np.float32)[0]))
    amax = torchao_amax(kernels.fp8_amax(x, True), dtype_name(x.dtype), x.size)
    return np.float32(kernels.nvfp4_tensor_scale(amax))


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
            v, element_dtype(elem), r.mode, r.block, axis=ax, out=codes
        )
    if out is not None:
        return dataclasses.replace(out, tensor_scale=pts)
    if tail:
        data = data[: _width(n, elem)] if cols else data[..., : _width(n, elem)]
    return BlockScaled(
        data if elem == "e2m1" else data.view(fp8_dtype(element_dtype(elem))),
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
        size = int(np.prod(x.shape))
        pts = np.float32(
            kernels.nvfp4_tensor_scale(torchao_amax(amax, arrays.h["view"](x).dtype, size))
        )
    kaxis = 0 if cols else -1
    if r.mode == "nvfp4":
        scales, data = dev.quantize(x, "float4_e2m1", "nvfp4", 16, axis=kaxis, pts=pts)
    else:
        scales, data = dev.quantize(x, element_dtype(elem), r.mode, r.block, axis=kaxis)
    return BlockScaled(data, scales, pts, r, elem, kaxis, tuple(x.shape))


def dequantize_on(dev: Any, b: BlockScaled, dtype: str) -> Any:
    """dequantize_blocks of device codes through `dev`, an ``lscore.cuda.mx.BlockArrays``
    (`dtype` a name): a new array of the codes' framework on their device."""
    r = b.recipe
    return dev.dequantize(
        b.scales,
        b.data,
        element_dtype(b.element),
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
    elem = "uint8" if b.element == "e2m1" else element_dtype(r.allows(b.element, "b.element"))
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
    return codes.view(fp8_dtype(element_dtype(b.element))).astype(np.float32)


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
