"""Block-scaled formats read back: ``dequantize_blocks`` of a ``BlockScaled``.

Each element times its block's scale in float32, rounded once to the
result's dtype, by the reading of the implementation the recipe
reproduces (``lscore.fp8.blocks`` quantizes).  CuPy codes go to
``lscore.cuda.mx``'s kernels.  Only NumPy is imported.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from lscore import kernels
from lscore.fp8 import nvfp4
from lscore.fp8.block_recipes import BlockRecipe, element_dtype
from lscore.fp8.blocks import BlockScaled, code_width, device_blocks
from lscore.fp8.checks import dtype_name, fp8_dtype, out_dtype

__all__ = ["dequantize_blocks"]


def dequantize_on(dev: Any, b: BlockScaled, dtype: str) -> Any:
    """dequantize_blocks of device codes through `dev`, an ``lscore.cuda.mx.BlockArrays``
    (`dtype` a name): a new array of the codes' framework on their device."""
    r = b.recipe
    if r.mode == "te-nvfp4":  # lscore.cuda.nvfp4's decode on dev's framework
        nv4 = importlib.import_module("lscore.cuda.nvfp4").nvfp4_arrays(dev)
        opts = dict(axis=b.axis, tile=b.tiles, dtype=dtype)
        shape = tuple(b.shape)
        if b.tiles and len(shape) > 2:  # TE's tiles of the leading axes flattened
            y = nv4.dequantize(
                b.scales.reshape(-1, b.scales.shape[-1]),
                b.data.reshape(-1, b.data.shape[-1]),
                float(b.tensor_scale),
                **opts,
            )
            return y.reshape(shape)
        return nv4.dequantize(b.scales, b.data, float(b.tensor_scale), **opts)
    if b.tiles:
        shape = tuple(b.shape)
        y = dev.dequantize(
            b.scales.reshape(-1, b.scales.shape[-1]),
            b.data.reshape(-1, b.data.shape[-1]),
            element_dtype(b.element),
            r.mode,
            r.weight_block,
            tile=True,
            dtype=dtype,
        )
        return y.reshape(shape)
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
    scale = {"e8m0": "float8_e8m0fnu", "e4m3fn": "float8_e4m3fn"}.get(r.scale_format, "")
    s_shape = (*shape[:edge], -(-n // r.block), *shape[edge + 1 :])
    if b.tiles:
        t = r.weight_block or 1
        s_shape = (*shape[:-2], -(-shape[-2] // t), -(-shape[-1] // t))
    want = {
        "data": (elem, "uint8", (*shape[:edge], code_width(n, b.element), *shape[edge + 1 :])),
        "scales": (scale, "uint8", s_shape) if scale else ("float32", "float32", s_shape),
    }
    for name, (dt, raw, sh) in want.items():
        a = getattr(b, name)
        if not isinstance(a, np.ndarray):
            raise TypeError(f"b.{name} must be a NumPy array, got {type(a).__name__}")
        if dtype_name(a.dtype) not in (raw, dt) or a.shape != sh:
            what = dt if dt == raw else f"{dt} or {raw}"
            raise ValueError(f"b.{name} must be {what} of shape {sh}, got {a.dtype} {a.shape}")
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
    r = b.recipe
    if r.scale_format == "float32":  # the inverse scale itself (TE's and torchao's scale_inv)
        s = np.asarray(b.scales)
        return s.T if b.axis == 0 else s
    codes = np.asarray(b.scales).view(np.uint8)
    if b.axis == 0:
        codes = codes.T
    if r.mode == "te-nvfp4":  # TE's (float(sf) * amax) * float32(1 / 2688)
        return nvfp4.decode_scales(codes, b.tensor_scale)
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
    (the element times per-tensor scale times block scale, in float32); TE's
    NVFP4 (dequantize_nvfp4.cuh: the element times ((block scale * amax) *
    float32(1 / 2688)); a transformed columnwise copy gives the transformed
    values); the
    float32 inverse scale of blockwise FP8 (TE's Float8BlockwiseQTensor
    dequantize).  A CuPy ``BlockScaled`` gives a CuPy array.
    """
    if not isinstance(b, BlockScaled):
        raise TypeError(f"b must be an lscore.fp8.BlockScaled, got {type(b).__name__}")
    dname = out_dtype(dtype)
    dev = device_blocks(b.data)
    if dev is not None:
        return dequantize_on(dev, b, dname)
    _check_codes(b)
    elems = _decode_elements(b)
    scales = _block_values(b, dname)
    n, k = elems.shape[-1], b.recipe.block
    if b.tiles:  # each tile's scale over its rows first
        scales = np.repeat(scales, k, axis=-2)[..., : elems.shape[-2], :]
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
