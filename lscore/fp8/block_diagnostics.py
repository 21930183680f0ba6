"""What a block-scaled quantize (MXFP8, MXFP4, NVFP4, blockwise FP8) does to a tensor:
:func:`block_stats`.

On request, never in the hot path: one ``quantize_blocks`` pass, then what
its output holds beside the input, in chunks of whole blocks: the histogram
of the block scales' exponents, the saturated and flushed elements, the NaN
and Inf scales.  The counts follow the implementation's arithmetic: an
element saturates when its scaled magnitude (``|x| / scale`` for the MX and
NVFP4 scales, ``float32(|x| * scale)`` with the float32 scale the rule
computed for blockwise FP8) rounds above the element format's largest value.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from lscore import kernels
from lscore.diagnostics import count_nonfinite, format_table
from lscore.fp8 import nvfp4
from lscore.fp8.block_recipes import BlockRecipe, element_dtype
from lscore.fp8.blocks import BlockScaled, quantize_blocks
from lscore.fp8.checks import dtype_name, float_input
from lscore.fp8.diagnostics import SATURATE_FROM, Fractions

__all__ = ["BlockStats", "block_stats"]

# element format -> (code of the largest magnitude, mask of a code's magnitude, smallest
# |x / scale| that rounds above the largest value: e4m3fn's 448 wins the tie at 464, e5m2's
# tie at 61440 rounds to Inf, E2M1's 6 loses the tie at 7 to the even 8)
_BLOCK_ELEMENTS = {
    "e4m3fn": (0x7E, 0x7F, SATURATE_FROM["e4m3fn"]),
    "e5m2": (0x7B, 0x7F, SATURATE_FROM["e5m2"]),
    "e2m1": (0x7, 0x7, 7.0),
}
_CHUNK = 1 << 20  # elements per step: bounds the float64 temporaries on huge tensors


@dataclasses.dataclass(frozen=True)
class BlockStats(Fractions):
    """What a block-scaled quantize of one tensor produces.

    ``recipe`` names the recipe, ``element`` its element format ("e4m3fn", "e5m2",
    "e2m1"), ``scale_format`` its block scales' ("e8m0", "e4m3fn" for NVFP4, "float32"
    for blockwise FP8), ``block`` the elements per block (a weight's tile: its side) and
    ``axis`` the axis the blocks run along.  ``size`` is the input's number of elements,
    ``nan``, ``posinf`` and ``neginf`` its non-finite ones.  ``blocks`` is the number of
    blocks; ``exponents`` maps each block scale's exponent (the unbiased E8M0 exponent;
    for NVFP4 the exponent of the E4M3 scale, for blockwise FP8 that of the float32
    inverse scale a code is read back with: floor(log2(scale))) to the number of blocks
    that have it, NaN scales left out and counted in ``nan_scales``, Inf ones in
    ``inf_scales`` (torchao's blockwise rule on a block holding an Inf); ``tensor_scale``
    is NVFP4's float32 per-tensor scale (None without one), by which each block's E4M3
    scale is multiplied (under ``te-nvfp4`` the tensor's amax A, as TE keeps it: a block
    decodes by float(sf) * A / 2688).  ``saturated`` counts the finite elements clamped to
    the element format's largest value (written as that value, and the scaled magnitude rounds above
    it), ``flushed`` the non-zero finite elements written as zero, ``nonzero`` the non-zero
    finite elements, all three in blocks whose scale is not NaN (a NaN scale loses its
    whole block).  ``tiles`` is True for a weight in square tiles.
    """

    recipe: str
    element: str
    scale_format: str
    block: int
    axis: int
    size: int
    nan: int
    posinf: int
    neginf: int
    blocks: int
    exponents: dict[int, int]
    nan_scales: int
    tensor_scale: float | None
    saturated: int
    flushed: int
    nonzero: int
    inf_scales: int = 0
    tiles: bool = False

    def table(self) -> str:
        """A summary line, then the histogram of the scale exponents, a row per exponent."""
        pts = "" if self.tensor_scale is None else f", tensor scale {self.tensor_scale:.4g}"
        shape = f"{self.block}x{self.block} tiles" if self.tiles else f"blocks of {self.block}"
        head = (
            f"{self.recipe}: {self.blocks} {shape} {self.element}, "
            f"{self.scale_format} scales{pts}\n"
            f"saturated {100 * self.saturated_fraction:.2f}% ({self.saturated}), "
            f"flushed {100 * self.flushed_fraction:.2f}% ({self.flushed}), "
            f"NaN {self.nan}, Inf {self.posinf + self.neginf}, NaN scales {self.nan_scales}"
            + (f", Inf scales {self.inf_scales}" if self.inf_scales else "")
        )
        share = self.blocks or 1
        rows = (
            (str(e), str(n), f"{100 * n / share:.2f}%") for e, n in sorted(self.exponents.items())
        )
        return head + "\n" + format_table(("exponent", "blocks", "share"), rows)


def _scale_values(b: BlockScaled) -> np.ndarray:
    """The float64 value of each block scale (NaN for a NaN code), blocks last."""
    r, s = b.recipe, np.asarray(b.scales)
    if r.scale_format == "float32":
        out = s.astype(np.float64)
    elif r.scale_format == "e8m0":
        out = np.asarray(kernels.e8m0_decode(s.view(np.uint8)), np.float64)
    else:
        f = np.empty(s.shape, np.float32)
        kernels.fp8_decode(np.ascontiguousarray(s.view(np.uint8)), f, "float8_e4m3fn")
        out = f.astype(np.float64)
    return out.T if b.axis == 0 else out


def _float32_scales(
    v: np.ndarray, side: int, r: BlockRecipe, element: str, dtype: str, tall: int
) -> np.ndarray:
    """The float32 scale each element of `v` (|x| in float64, whole blocks of `side` along
    its last axis, `tall` rows high) is multiplied by: the rule's scale of its block's
    amax (TE's skips NaN elements, torchao's keeps them)."""
    h, w = v.shape
    pad = np.zeros((-(-h // tall) * tall, -(-w // side) * side))
    pad[:h, :w] = np.where(np.isnan(v), 0.0, v) if r.mode == "te-fp32" else v
    blocks = pad.reshape(-1, tall, pad.shape[1] // side, side).max(axis=(1, 3))
    s = kernels.mx_blockwise_scale(
        blocks.astype(np.float32), element_dtype(element), r.mode,
        r.power_2_scales, r.amax_epsilon, dtype,
    )  # fmt: skip
    return np.repeat(np.repeat(s, tall, axis=0), side, axis=1)[:h, :w]


def block_stats(
    x: Any,
    recipe: Any,
    *,
    axis: int = -1,
    role: str | None = None,
    element: str | None = None,
    seed: int | None = None,
    offset: int = 0,
) -> BlockStats:
    """The statistics of quantizing `x` (a float32, float16 or bfloat16 NumPy or CuPy array)
    with the block recipe `recipe` (a ``BlockRecipe`` or a preset name), blocks along `axis`
    (-1, or 0 for a 2-D `x`), as a tensor of `role` (a weight in square tiles under a recipe
    with ``weight_block``), to `element` (default the role's): see :class:`BlockStats`.

    One ``quantize_blocks`` pass; the counts are read from its output (the scale codes and
    the element codes) beside the input, in chunks of whole blocks.  What the recipe refuses
    (a partial block, an element it does not allow) is refused here.  A CuPy array is copied
    to the host and counted there (the codes are the device kernels' bit for bit); torch
    tensors: ``lscore.adapters.torch.quantize.block_stats``.  Under ``te-nvfp4`` the role's
    rules apply as ``quantize_blocks`` applies them: a gradient is rounded stochastically
    with `seed` and `offset`, and a Hadamard-transformed copy (``axis=0``) is counted by its
    transformed elements, which are what it quantizes (``size`` and the NaN and Inf counts
    stay the input's).
    """
    if hasattr(x, "__cuda_array_interface__") and hasattr(x, "get"):
        x = x.get()  # a CuPy array: the counts read the input beside the codes
    a = float_input(x)
    b = quantize_blocks(a, recipe, axis=axis, role=role, element=element, seed=seed, offset=offset)
    r = b.recipe
    nan, posinf, neginf = count_nonfinite(a)
    size = int(a.size)
    te = r.mode == "te-nvfp4"
    _, rht, sr = nvfp4.options(r, role, b.axis)
    if te and rht:
        # what the copy quantizes: the transform's bfloat16 values (words from the kernel)
        a = kernels.hadamard16(a).view(a.dtype)
    q = b.data.view(np.uint8)
    if b.axis == 0:  # blocks along the first axis: along the last of the transposes
        a, q = a.T, q.T
    top_code, mag, sat_from = _BLOCK_ELEMENTS[b.element]
    if te and sr:  # stochastic rounding clamps every magnitude above 6 to 6
        sat_from = np.nextafter(6.0, np.inf)
    values = _scale_values(b)
    nan_blocks, inf_blocks = np.isnan(values), np.isinf(values)
    exps = np.frexp(values[np.isfinite(values) & (values != 0)])[1] - 1
    found = np.unique(exps, return_counts=True) if exps.size else ((), ())
    if te:  # the element factor TE's kernels multiply by, in float32
        values = nvfp4.encode_factors(values, b.tensor_scale).astype(np.float64)
    elif b.tensor_scale is not None:
        values = values * np.float64(b.tensor_scale)  # exact: 4-bit by 24-bit significands
    side = r.weight_block if b.tiles and r.weight_block else r.block
    tall = side if b.tiles else 1  # rows of a block
    n = a.shape[-1] if a.ndim else 0
    # matrices of m rows: a weight's, in tiles; else one of all the rows
    a3 = a.reshape(-1, a.shape[-2], n) if b.tiles else a.reshape(1, -1, n)
    m = a3.shape[1]
    q3 = q.reshape(a3.shape[0], m, -1)
    s3 = values.reshape(a3.shape[0], -(-m // tall), -1)
    cols = max(_CHUNK // side, 1) * side
    rows = max(_CHUNK // max(min(n, cols), 1) // tall, 1) * tall
    wide, dtype = r.scale_format == "float32", dtype_name(a.dtype)
    saturated = flushed = nonzero = 0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for k in range(a3.shape[0]):
            for i in range(0, m, rows):
                for c in range(0, n, cols):
                    v = np.abs(a3[k, i : i + rows, c : c + cols].astype(np.float64))
                    h, w = v.shape
                    if b.element == "e2m1":  # two codes a byte, the first in the low nibble
                        byte = q3[k, i : i + h, c // 2 : (c + w + 1) // 2]
                        codes = np.stack([byte & 0xF, byte >> 4], axis=-1).reshape(h, -1)
                    else:
                        codes = q3[k, i : i + h, c : c + w]
                    codes = codes[:, :w] & mag
                    blk = s3[k, i // tall : -(-(i + h) // tall), c // side : -(-(c + w) // side)]
                    sc = np.repeat(np.repeat(blk, tall, axis=0)[:h], side, axis=1)[:, :w]
                    if wide:  # the product the kernel rounds: float32(|x| * scale)
                        s32 = _float32_scales(v, side, r, b.element, dtype, tall)
                        scaled = (v.astype(np.float32) * s32.astype(np.float32)).astype(np.float64)
                    elif te:  # float32(|x| * factor), the product TE's kernels round
                        scaled = (v.astype(np.float32) * sc.astype(np.float32)).astype(np.float64)
                    else:
                        scaled = v / sc
                    ok = np.isfinite(v) & ~np.isnan(sc)
                    saturated += int(
                        np.count_nonzero(ok & (codes == top_code) & (scaled >= sat_from))
                    )
                    live = ok & (v != 0)
                    nonzero += int(np.count_nonzero(live))
                    flushed += int(np.count_nonzero(live & (codes == 0)))
    pts = b.tensor_scale
    return BlockStats(
        r.name, b.element, r.scale_format, side, b.axis, size, nan, posinf, neginf,
        int(values.size), {int(e): int(k) for e, k in zip(*found, strict=True)},
        int(np.count_nonzero(nan_blocks)), None if pts is None else float(pts), saturated,
        flushed, nonzero, int(np.count_nonzero(inf_blocks)), b.tiles,
    )  # fmt: skip
