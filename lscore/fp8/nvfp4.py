"""The NVFP4 recipes' tensor-level rules: torchao's per-tensor amax, and TransformerEngine
v2.18's NVFP4 recipe (mode "te-nvfp4"): its fields, and what a tensor of each role gets.

torchao 0.18.0's NVFP4 takes its tensor amax as ``torch.max(torch.abs(x))``
(mx_formats/nvfp4_tensor.py:606), whose NaN on the CPU is a word of the
input's dtype (``torchao_amax``).  ``lscore.fp8.block_recipes`` checks a
recipe's NVFP4 fields here and takes TE's switches (``disable_rht``, ...);
``lscore.fp8.blocks.quantize_blocks`` quantizes a ``te-nvfp4`` tensor here:
its global amax (NaN left out; of the Hadamard transform's bfloat16 results
for a transformed columnwise copy), then ``lscore.kernels.nvfp4_te_quantize``
(``lscore.cuda.nvfp4`` for a device array) with the role's options (TE's
NVFP4BlockScaling, common/recipe/__init__.py:584-605):

========  ========================  ======================  ================
role      Hadamard transform        stochastic rounding     16x16 tiles
========  ========================  ======================  ================
input     ``axis=0`` (columnwise)   no                      no
weight    no                        no                      ``weight_block``
grad      ``axis=0`` (columnwise)   both orientations       no
========  ========================  ======================  ================

each where the recipe's field (``hadamard``, ``stochastic_rounding``,
``weight_block``) is on.  Only NumPy is imported here.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np

from lscore import kernels
from lscore.policy import boolean

__all__ = [
    "check_fields",
    "decode_scales",
    "encode_factors",
    "options",
    "quantize_blocks_te",
    "switches",
    "torchao_amax",
    "torchao_tensor_scale",
]

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


def torchao_tensor_scale(x: np.ndarray) -> np.float32:
    """NVFP4's per-tensor scale: torchao's per_tensor_amax_to_scale of
    ``torch.max(torch.abs(x))``."""
    if x.size == 1:  # torch.abs of the one element: its bits with the sign cleared
        one = np.abs(x.astype(np.float32).reshape(-1)[:1]).view(np.uint32) & 0x7FFFFFFF
        return np.float32(kernels.nvfp4_tensor_scale(float(one.view(np.float32)[0])))
    amax = torchao_amax(kernels.fp8_amax(x, True), x.dtype.name, x.size)
    return np.float32(kernels.nvfp4_tensor_scale(float(amax)))


# TE's NVFP4BlockScaling switches (common/recipe/__init__.py:484-605) -> the field each
# turns off and its value when off
_SWITCHES = {
    "disable_rht": ("hadamard", False),
    "disable_stochastic_rounding": ("stochastic_rounding", False),
    "disable_2d_quantization": ("weight_block", None),
}


def check_fields(r: Any) -> None:
    """A BlockRecipe's NVFP4 fields: tensor_scale (True under te-nvfp4, torchao's NVFP4's
    option), hadamard and stochastic_rounding (te-nvfp4's), whole blocks under te-nvfp4."""
    for field in ("hadamard", "stochastic_rounding"):
        object.__setattr__(r, field, boolean(field, getattr(r, field)))
        if getattr(r, field) and r.mode != "te-nvfp4":
            raise ValueError(
                f"{field} must be False under mode {r.mode!r} (it is TE's NVFP4 recipe's, mode "
                "'te-nvfp4'), got True"
            )
    if r.mode == "te-nvfp4" and (not r.tensor_scale or r.tail != "refuse"):
        raise ValueError(
            "tensor_scale must be True and tail 'refuse' under mode 'te-nvfp4' (TE's NVFP4 "
            "scales by the tensor's amax and takes whole blocks of 16), got "
            f"tensor_scale={r.tensor_scale!r}, tail={r.tail!r}"
        )
    if r.tensor_scale and r.mode not in ("nvfp4", "te-nvfp4"):
        raise ValueError(
            f"tensor_scale must be False under mode {r.mode!r} (a per-tensor scale is "
            "NVFP4's), got True"
        )


def switches(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` of preset `name` with TE's NVFP4BlockScaling switches (disable_rht, ...)
    turned into the fields they switch off, and its forced fp8_format "E4M3" taken; a
    switch beside its field, or given to another preset, is refused."""
    out = dict(overrides)
    if name == "te-nvfp4" and "fp8_format" in out and out.pop("fp8_format") != "E4M3":
        raise ValueError(
            "fp8_format must be 'E4M3' for te-nvfp4 (NVFP4BlockScaling forces its E4M3 block "
            f"scales), got {overrides['fp8_format']!r}"
        )
    for switch, (field, off) in _SWITCHES.items():
        if switch not in out:
            continue
        if name != "te-nvfp4":
            raise ValueError(f"{switch} is the te-nvfp4 preset's field, and {name!r} is not it")
        if field in out:
            raise ValueError(f"give {switch} or {field}, not both")
        if boolean(switch, out.pop(switch)):
            out[field] = off
    return out


def options(r: Any, role: str | None, axis: int) -> tuple[bool, bool, bool]:
    """(tiles, Hadamard transform, stochastic rounding) of a tensor of `role` quantized
    along `axis` (-1 rowwise, 0 the columnwise copy) under recipe r."""
    tiles = role == "weight" and r.weight_block is not None
    rht = r.hadamard and axis == 0 and role != "weight"
    return tiles, rht, r.stochastic_rounding and role == "grad"


def _word(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < 2**64:
        raise ValueError(f"{what} must be an integer from 0 to 2**64 - 1, got {v!r}")
    return int(v)


def decode_scales(codes: np.ndarray, amax: Any) -> np.ndarray:
    """Each block's decode scale, float32: (float(sf) * A) * float32(1 / 2688)."""
    return kernels.nvfp4_te_decode_scale(codes, float(np.float32(amax)))


def encode_factors(values: np.ndarray, amax: Any) -> np.ndarray:
    """Each block's element factor, float32, from its E4M3 scale's `values` (float32) under
    the global amax: min(1 / (float(sf) * S_dec), FLT_MAX), each step rounded to float32,
    as the kernels multiply a block's elements by it before the E2M1 rounding."""
    sdec = np.float32(kernels.nvfp4_te_scales(float(np.float32(amax)))[1])
    with np.errstate(divide="ignore", over="ignore"):
        e = np.float32(1) / (np.asarray(values, np.float32) * sdec)
    return np.minimum(e, np.finfo(np.float32).max)


def quantize_blocks_te(
    x: Any,
    r: Any,
    elem: str,
    axis: int,
    role: str | None,
    seed: Any,
    offset: Any,
    out: Any = None,
    arrays: Any = None,
) -> Any:
    """``lscore.fp8.quantize_blocks`` under TE's NVFP4 recipe r: a ``BlockScaled`` (tiles
    along the last axis, the tensor's amax as its tensor_scale) of a NumPy x, or, given
    `arrays` (an arrays class of its framework, ``lscore.cuda.fp8.Float8Arrays``: the amax
    and the hooks of ``lscore.cuda.nvfp4``'s kernels), of a device x.  A tiled weight of
    more than two dimensions is quantized as TE does, its leading axes flattened."""
    from lscore.fp8.blocks import (  # the module that calls this one
        BlockScaled,
        check_out,
        check_tail,
        check_tiles,
        raw,
        scale_view,
    )
    from lscore.fp8.checks import block_axis, float_input

    if arrays is None:
        x = float_input(x)
    cols = block_axis(x, axis)
    tiles, rht, sr = options(r, role, 0 if cols else -1)
    if tiles:
        check_tiles(r, tuple(x.shape))
    else:
        check_tail(r, x.shape[0] if cols else x.shape[-1], axis)
    ax = 0 if cols and not tiles else -1
    if out is not None:
        check_out(out, x, r, elem, ax, role)
    if sr and seed is None:
        raise ValueError(
            f"seed= is needed: recipe {r.name!r} rounds gradients stochastically "
            "(stochastic_rounding=True); pass seed= (and offset=, a new one for each "
            "quantize), or use stochastic_rounding=False (disable_stochastic_rounding=True)"
        )
    opts: dict[str, Any] = dict(
        axis=ax,
        tile=tiles,
        rht=rht,
        seed=_word(seed, "seed") if sr else None,
        offset=_word(offset, "offset"),
    )
    shape = tuple(x.shape)
    flat = x.reshape(-1, shape[-1]) if tiles and len(shape) > 2 else x
    if arrays is None:
        if rht and x.dtype.name != "bfloat16":
            raise ValueError(
                "x must be bfloat16 for the Hadamard transform of te-nvfp4's columnwise copy "
                f"(TE v2.18 takes it of bfloat16 only), got {x.dtype.name}; cast x, or use "
                "hadamard=False (disable_rht=True)"
            )
        amax = kernels.hadamard16_amax(flat) if rht else kernels.fp8_amax(flat)
        codes = None if out is None else (raw(out.scales), out.data.view(np.uint8))
        s, q = kernels.nvfp4_te_quantize(flat, amax, **opts, out=codes)
        if out is not None:
            return dataclasses.replace(out, tensor_scale=np.float32(amax))
        s = scale_view(s, r)
    else:
        dev = importlib.import_module("lscore.cuda.nvfp4").nvfp4_arrays(arrays)
        if rht:
            amax = dev.rht_amax(flat)
        else:
            amax = float(arrays.h["to_host"](arrays.amax(flat, None, "ignore")))
        s, q = dev.quantize(flat, amax, **opts)
    if tiles and len(shape) > 2:
        s = s.reshape(*shape[:-2], shape[-2] // 16, shape[-1] // 16)
        q = q.reshape(*shape[:-1], shape[-1] // 2)
    return BlockScaled(q, s, np.float32(amax), r, elem, ax, shape, role)
