"""Block-scaled formats (MXFP8, MXFP4, NVFP4, blockwise FP8): quantize and dequantize by a
``BlockRecipe``.

The recipes are ``lscore.fp8.block_recipes``' (re-exported here).
``quantize_blocks`` checks everything, then runs the compiled block passes
(``lscore.kernels.mx_quantize`` / ``nvfp4_quantize``) over the input where
it lies, one pass per orientation: blocks along the last axis, or
(``axis=0``, a 2-D input) along the first, TransformerEngine's columnwise
copy, each orientation quantized from the high-precision input; a weight
(``role="weight"``) of a recipe with ``weight_block`` in square tiles of
its last two axes.
``lscore.fp8.block_dequant.dequantize_blocks`` reads the codes back.  CuPy arrays go to
``lscore.cuda.mx``'s kernels, as ``lscore.fp8.quantize`` sends float8 casts
to ``lscore.cuda.fp8``.  Only NumPy is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np

from lscore import kernels
from lscore.fp8 import nvfp4
from lscore.fp8.block_recipes import (
    BLOCK_RECIPES,
    BLOCK_TABLE,
    BlockRecipe,
    as_block_recipe,
    block_recipe,
    element_dtype,
)
from lscore.fp8.checks import block_axis, dtype_name, float_input, fp8_dtype

__all__ = [
    "BLOCK_RECIPES",
    "BLOCK_TABLE",
    "BlockRecipe",
    "BlockScaled",
    "as_block_recipe",
    "block_recipe",
    "element_dtype",
    "quantize_blocks",
]


@dataclasses.dataclass(frozen=True)
class BlockScaled:
    """A block-scaled tensor: `data` (element codes), `scales` (one per block), `tensor_scale`
    (NVFP4's float32 per-tensor scale, or None), the `recipe`, the `element` format, the
    blocked `axis` (-1: along the last axis; 0: along the first of a 2-D input), the
    input's `shape` and its `role` ("input", "weight", "grad" or None).

    NumPy: `data` is an ml_dtypes float8 array of the input's shape, or for
    E2M1 uint8 holding two codes a byte (the first in the low nibble), paired
    along the blocked axis (tiles: the last axis); `scales` is ml_dtypes
    float8_e8m0fnu (E8M0), float8_e4m3fn (NVFP4) or float32 (blockwise FP8:
    the inverse scale a code is multiplied by), one per block: the input's
    shape with the blocked axis divided by the block, or for tiles (``tiles``
    is True: a weight of a recipe with ``weight_block``) each of the last two
    axes divided by the tile's side (rounded up where a partial block is
    padded).
    """

    data: Any
    scales: Any
    tensor_scale: Any
    recipe: BlockRecipe
    element: str
    axis: int
    shape: tuple[int, ...]
    role: str | None = None

    @property
    def tiles(self) -> bool:
        """Whether the blocks are square tiles of the last two axes (a recipe's weight_block)."""
        return self.role == "weight" and self.recipe.weight_block is not None


def device_blocks(x: Any) -> Any:
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


def code_width(n: int, element: str) -> int:
    """Bytes of element codes for n elements: two E2M1 codes a byte."""
    return (n + 1) // 2 if element == "e2m1" else n


def quantize_blocks(
    x: np.ndarray,
    recipe: Any,
    *,
    axis: int = -1,
    role: str | None = None,
    element: str | None = None,
    out: BlockScaled | None = None,
    seed: int | None = None,
    offset: int = 0,
) -> BlockScaled:
    """Quantize x in blocks by `recipe` (a ``BlockRecipe`` or a preset name): a ``BlockScaled``.

    `x` is float32, float16 or bfloat16 (read where it lies); `axis` -1
    blocks along the last axis, 0 along the first axis of a 2-D input (the
    columnwise copy TransformerEngine makes from the same input).  `role`
    ("input", "weight", "grad"; None as "input") picks the element format
    (the recipe's ``grad_element`` for "grad", else its ``element``) and,
    for "weight" under a recipe with ``weight_block``, square tiles of that
    side over the last two axes of x (at least 2-D), one scale per tile,
    the same tiles for either axis (TE's columnwise weight is the transpose
    of its rowwise one).  `element`, when given, overrides the role's; it
    must be one the recipe allows.  A length along a blocked axis that is
    not a multiple of the block is refused or padded, as the recipe's
    ``tail`` says.  With ``tensor_scale`` the per-tensor scale comes from
    the amax of all of x (NaN if one is NaN).  `out`, the result of an
    earlier call with the same recipe, element, axis, role and input shape,
    has its scales and data written in place (so that a step allocates
    nothing) and is returned with this call's tensor scale; it needs whole
    blocks and NumPy arrays.  Every check is made before anything is
    computed.  A CuPy array gives CuPy uint8 codes.  Under TE's NVFP4
    recipe (``te-nvfp4``) the role also picks the Hadamard transform and
    stochastic rounding (``lscore.fp8.nvfp4``), `seed` and `offset`
    (integers 0 .. 2**64 - 1) give the draws of stochastic rounding (a
    gradient under it needs `seed`; elsewhere they are not used), and
    ``tensor_scale`` holds the tensor's amax as TE keeps it.

    >>> import numpy as np
    >>> from lscore.fp8 import dequantize_blocks, quantize_blocks
    >>> b = quantize_blocks(np.linspace(-3, 3, 32, dtype=np.float32), "ocp-mx")
    >>> b.scales.view(np.uint8), b.data[:4]
    (array([120], dtype=uint8), array([-384, -352, -320, -320], dtype='float8_e4m3fn'))
    >>> dequantize_blocks(b)[:4]
    array([-3.  , -2.75, -2.5 , -2.5 ], dtype=float32)
    """
    r = as_block_recipe(recipe)
    elem = r.role_element(role)
    if element is not None:
        elem = r.allows(element)
    if r.mode == "te-nvfp4" and isinstance(x, np.ndarray):
        return nvfp4.quantize_blocks_te(x, r, elem, axis, role, seed, offset, out)
    dev = device_blocks(x)
    if dev is not None:
        if out is not None:
            raise TypeError("out= takes NumPy arrays; a CuPy input gets new device arrays")
        from lscore.cuda.fp8 import cupy_arrays

        return quantize_on(dev, cupy_arrays(), x, r, elem, axis, role, seed, offset)
    x = float_input(x)
    cols = block_axis(x, axis)
    tiles = role == "weight" and r.weight_block is not None
    if tiles:
        check_tiles(r, x.shape)
        ax = -1
    else:
        n = x.shape[0] if cols else x.shape[-1]
        check_tail(r, n, axis)
        ax = 0 if cols else -1
    if out is not None:
        check_out(out, x, r, elem, ax, role)
    pts = nvfp4.torchao_tensor_scale(x) if r.tensor_scale else None
    codes = None if out is None else (raw(out.scales), out.data.view(np.uint8))
    if tiles:
        scales, data = _quantize_tiles(x, r, elem, codes)
    else:
        scales, data = _quantize_lines(x, r, elem, ax, pts, codes)
    if out is not None:
        if pts is None and out.tensor_scale is None:
            return out  # the same fields: no new dataclass (a few us a call)
        return dataclasses.replace(out, tensor_scale=pts)
    return BlockScaled(
        data if elem == "e2m1" else data.view(fp8_dtype(element_dtype(elem))),
        scale_view(scales, r),
        pts,
        r,
        elem,
        ax,
        tuple(x.shape),
        role,
    )


def raw(scales: np.ndarray) -> np.ndarray:
    """Scale codes as the kernels write them: uint8, or float32 for float32 scales."""
    return scales if scales.dtype == np.float32 else scales.view(np.uint8)


def scale_view(scales: np.ndarray, r: BlockRecipe) -> np.ndarray:
    """The kernels' scale codes as the recipe's scale dtype (float32 stays float32)."""
    if r.scale_format == "float32":
        return scales
    return scales.view(fp8_dtype("float8_e8m0fnu" if r.scale_format == "e8m0" else "float8_e4m3fn"))


def _kernel_args(r: BlockRecipe, dtype: str = "float32", cols: bool = False) -> dict[str, Any]:
    """The float32 scale rules' arguments of the block kernels for an input of `dtype` (a
    name), blocked down its columns (`cols`) or not.  torchao's 128x1 function clamps the
    amax in the input's dtype (its 1x128 and 128x128 ones in float64), so down the
    columns its epsilon is rounded to that dtype first."""
    if r.scale_format != "float32":
        return {}
    eps = r.amax_epsilon
    if cols and r.mode == "torchao-fp32":
        eps = float(np.asarray(eps).astype(fp8_dtype("bfloat16") if dtype == "bfloat16" else dtype))
    return {"pow2": r.power_2_scales, "eps": eps}


def _quantize_lines(
    x: np.ndarray, r: BlockRecipe, elem: str, ax: int, pts: Any, codes: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(scales, codes) of blocks along axis `ax` (-1 or 0), a partial block zero-padded."""
    n = x.shape[ax]
    v = x
    tail = -n % r.block
    if tail:  # zero-padded to whole blocks: only the partial block's zeros are added
        pad = list(x.shape)
        pad[ax] = tail
        v = np.concatenate([x, np.zeros(pad, x.dtype)], axis=ax)
    if r.mode == "nvfp4":
        pf = None if pts is None else float(pts)
        scales, data = kernels.nvfp4_quantize(v, pf, axis=ax, out=codes)
    else:
        scales, data = kernels.mx_quantize(
            v, element_dtype(elem), r.kernel_mode, r.block, axis=ax, out=codes,
            **_kernel_args(r, dtype_name(x.dtype), ax == 0),
        )  # fmt: skip
    if tail and codes is None:
        data = data[: code_width(n, elem)] if ax == 0 else data[..., : code_width(n, elem)]
    return scales, data


def _quantize_tiles(
    x: np.ndarray, r: BlockRecipe, elem: str, codes: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(scales, codes) of the square tiles of x's last two axes, matrix by matrix."""
    t = r.weight_block or r.block
    *lead, m, k = x.shape
    sshape = (*lead, -(-m // t), -(-k // t))
    if codes is None:
        scales = np.empty(sshape, np.float32 if r.scale_format == "float32" else np.uint8)
        data = np.empty((*lead, m, code_width(k, elem)), np.uint8)
    else:
        scales, data = codes
    x3 = x.reshape(-1, m, k) if lead else x[None]
    s3, d3 = scales.reshape(-1, *sshape[-2:]), data.reshape(-1, m, data.shape[-1])
    for i in range(x3.shape[0]):
        kernels.mx_quantize(
            x3[i], element_dtype(elem), r.kernel_mode, t, tile=True, out=(s3[i], d3[i]),
            **_kernel_args(r),
        )  # fmt: skip
    return scales, data


def check_tiles(r: BlockRecipe, shape: tuple[int, ...]) -> None:
    """x can be quantized in r's weight tiles: at least 2-D, whole tiles unless padded."""
    t = r.weight_block or r.block
    if len(shape) < 2:
        raise ValueError(
            f"a weight in {t}x{t} tiles (recipe {r.name!r}, weight_block {t}) must have at "
            f"least 2 dimensions, got shape {shape}"
        )
    if r.tail == "refuse" and (shape[-1] % t or shape[-2] % t):
        raise ValueError(
            f"a weight's last two lengths must be multiples of the tile {t} (recipe "
            f"{r.name!r} refuses a partial tile, tail 'refuse'), got shape {shape}"
        )


def check_out(
    out: Any, x: np.ndarray, r: BlockRecipe, elem: str, axis: int, role: str | None
) -> None:
    """out can take quantize_blocks(x, r)'s codes in place."""
    if not isinstance(out, BlockScaled):
        raise TypeError(f"out must be an lscore.fp8.BlockScaled, got {type(out).__name__}")
    want = (r, elem, axis, tuple(x.shape), role)
    got = (out.recipe, out.element, out.axis, tuple(out.shape), out.role)
    if got != want:
        raise ValueError(
            "out must come from a call with the same recipe, element, axis, role and shape: "
            f"out has {got[0].name!r}, {got[1]!r}, axis {got[2]}, role {got[4]!r}, "
            f"shape {got[3]}; this call {want[0].name!r}, {want[1]!r}, axis {want[2]}, "
            f"role {want[4]!r}, shape {want[3]}"
        )
    n = x.shape[0] if axis == 0 else x.shape[-1]
    if n % r.block and not out.tiles:
        raise ValueError(
            f"out= needs whole blocks of {r.block} along axis {axis}, got {n} "
            "(a padded partial block is written to new arrays)"
        )
    for name in ("scales", "data"):
        a = getattr(out, name)
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"out.{name} must be a writable C-contiguous NumPy array")


def check_tail(r: BlockRecipe, n: int, axis: int) -> None:
    if n % r.block and r.tail == "refuse":
        raise ValueError(
            f"x's length along axis {axis} must be a multiple of the block {r.block} "
            f"(recipe {r.name!r} refuses a partial block, tail 'refuse'), got {n}"
        )


def quantize_on(
    dev: Any,
    arrays: Any,
    x: Any,
    r: BlockRecipe,
    elem: str,
    axis: int,
    role: str | None = None,
    seed: int | None = None,
    offset: int = 0,
) -> BlockScaled:
    """quantize_blocks of a device array through `dev`, an ``lscore.cuda.mx.BlockArrays``,
    and `arrays`, the ``lscore.cuda.fp8.Float8Arrays`` of the same framework (NVFP4's
    amax): CuPy's here, torch's in the torch adapter (``te-nvfp4``: lscore.cuda.nvfp4's
    kernels on `arrays`' framework, `dev` unused).  Tiles of a weight of more than two
    dimensions need whole tiles along its second-to-last axis (the matrices stacked)."""
    if r.mode == "te-nvfp4":
        return nvfp4.quantize_blocks_te(x, r, elem, axis, role, seed, offset, None, arrays)
    cols = block_axis(x, axis)
    if role == "weight" and r.weight_block is not None:
        check_tiles(r, tuple(x.shape))
        t, shape = r.weight_block, tuple(x.shape)
        if len(shape) > 2 and shape[-2] % t:
            raise ValueError(
                f"a device weight of {len(shape)} dimensions in {t}x{t} tiles needs its "
                f"second-to-last length a multiple of {t}, got shape {shape}"
            )
        flat = x.reshape(-1, shape[-1])
        scales, data = dev.quantize(
            flat, element_dtype(elem), r.kernel_mode, t, tile=True, **_kernel_args(r)
        )
        scales = scales.reshape(*shape[:-2], -(-shape[-2] // t), -(-shape[-1] // t))
        data = data.reshape(*shape[:-1], data.shape[-1])
        return BlockScaled(data, scales, None, r, elem, -1, shape, role)
    n = x.shape[0] if cols else x.shape[-1]
    check_tail(r, n, axis)
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
            kernels.nvfp4_tensor_scale(
                float(nvfp4.torchao_amax(amax, arrays.h["view"](x).dtype, size))
            )
        )
    kaxis = 0 if cols else -1
    if r.mode == "nvfp4":
        scales, data = dev.quantize(x, "float4_e2m1", "nvfp4", 16, axis=kaxis, pts=pts)
    else:
        scales, data = dev.quantize(
            x, element_dtype(elem), r.kernel_mode, r.block, axis=kaxis,
            **_kernel_args(r, dev.h["view"](x).dtype, cols),
        )  # fmt: skip
    return BlockScaled(data, scales, pts, r, elem, kaxis, tuple(x.shape), role)
