"""`lscore bench --suite fp8`, blockwise FP8 rows: TransformerEngine v2.18's Float8BlockScaling
quantize against the same recipe in torch ops and the byte floor.

Each group is one quantize of a 2-D array by the ``te-blockwise`` preset: "blockwise-1x128"
an activation (``role="input"``: float8_e4m3fn elements, a power-of-two float32 scale per
128 along the rows), "blockwise-128x128" a weight (``role="weight"``: one per 128x128
tile).  The baseline is that rule written out in torch ops (eager, on the same tensor): the
block amax with NaN skipped, TE's compute_scale_from_amax (448 / amax, an Inf quotient the
input dtype's largest value, rounded down to a power of two, 1 for an amax that is 0, Inf
or NaN), the product clamped and cast, the inverse scale; a test checks that it writes the
bytes lscore writes.  The byte floor is the bytes the quantize must move (the input read
once; the codes and the float32 scales written) at the bandwidth of a C memcpy of the input
timed in the same turns; the "lscore out=" rows (into the arrays of an earlier result) are
the ones held to it.  Sizes: 2**20 (about 1e6: 1e6 itself is no whole number of blocks of
128), 1e7 and 1e8.
"""

from __future__ import annotations

import numpy as np

from lscore.bench._fp8 import (
    TINY_SIZES,
    add_floors,
    block_cases,
    block_cpu_rows,
    gpu_block_cases,
    ratio_target,
    synced,
    timed,
    why_no_cuda,
)
from lscore.bench._harness import Rows, import_torch, size_label

SIZES = (2**20, 10**7, 10**8)
DTYPES = ("bfloat16", "float32")
RECIPES = ("blockwise-1x128", "blockwise-128x128")
#: recipe -> (input reads, bytes written per element: the codes and the float32 scales)
TRAFFIC = {"blockwise-1x128": (1, 1 + 4 / 128), "blockwise-128x128": (1, 1 + 4 / 128**2)}
#: recipe -> the role of the tensor it quantizes
ROLES = {"blockwise-1x128": "input", "blockwise-128x128": "weight"}
PRESET = "te-blockwise"
E4M3_MAX = 448.0


def shape_of(n: int) -> tuple[int, int]:
    """(rows, cols) of n elements: cols the largest multiple of 128 that divides n and is at
    most 8192 (n a multiple of 128; 1e8: 15625 x 6400)."""
    cols = max(c for c in range(128, min(n, 8192) + 1, 128) if n % c == 0)
    return n // cols, cols


def lscore_fns(x: np.ndarray, reuse: bool = False) -> dict:
    """recipe -> lscore's quantize of x (``quantize_blocks`` by the te-blockwise preset and
    the recipe's role), into the arrays of one earlier result when `reuse`."""
    from lscore.fp8 import quantize_blocks

    def by(role):
        out = quantize_blocks(x, PRESET, role=role) if reuse else None

        def quantize():
            b = quantize_blocks(x, PRESET, role=role, out=out)
            return b.scales, b.data.view(np.uint8)

        return quantize

    return {r: by(role) for r, role in ROLES.items()}


def torch_fns(torch) -> dict:
    """recipe -> TE's blockwise quantize of a 2-D tensor in torch ops: (inverse scales,
    codes), blocks of 128 along the rows or 128x128 tiles (a partial block or tile
    zero-padded, as TE's kernels load it)."""

    def scale_of(amax, x_dtype):  # recipe_common.cuh compute_scale_from_amax, eps 0, pow2
        scale = E4M3_MAX / amax
        scale = torch.where(torch.isinf(scale), torch.finfo(x_dtype).max, scale)
        _, exp = torch.frexp(scale)
        scale = torch.ldexp(torch.ones_like(scale), exp - 1)  # the mantissa masked off
        unit = (amax == 0) | torch.isinf(amax) | torch.isnan(amax)
        return torch.where(unit, torch.ones_like(scale), scale)

    def quantize(x, tiles):
        m, k = x.shape
        t = 128
        pm, pk = -m % t if tiles else 0, -k % t
        xp = torch.nn.functional.pad(x, (0, pk, 0, pm)) if pm or pk else x
        if tiles:
            blocks = xp.reshape(xp.shape[0] // t, t, xp.shape[1] // t, t).transpose(1, 2)
            blocks = blocks.reshape(xp.shape[0] // t, xp.shape[1] // t, t * t)
        else:
            blocks = xp.reshape(m, -1, t)
        mags = blocks.abs().float()
        amax = torch.nan_to_num(mags, nan=0.0, posinf=float("inf")).amax(-1)  # fmaxf skips NaN
        scale = scale_of(amax, x.dtype)
        q = (blocks.float() * scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
        q = q.to(torch.float8_e4m3fn)
        if tiles:
            q = q.reshape(xp.shape[0] // t, xp.shape[1] // t, t, t).transpose(1, 2)
        q = q.reshape(xp.shape)[:m, :k]
        return torch.reciprocal(scale), q

    return {
        "blockwise-1x128": lambda x: quantize(x, False),
        "blockwise-128x128": lambda x: quantize(x, True),
    }


def _sizes(opts) -> tuple:
    if opts.tiny:
        return TINY_SIZES
    return tuple(opts.sizes) if opts.sizes_given else SIZES


def run_cpu(opts, rows: Rows, rng) -> None:
    """The CPU rows: every size, dtype and recipe (a size that is not a whole number of
    blocks of 128 is skipped, with the reason)."""
    cases = block_cases(opts, rows, rng, _sizes(opts), DTYPES, RECIPES, "blockwise", 128, shape_of)
    block_cpu_rows(opts, rows, cases, lscore_fns, torch_fns, TRAFFIC)


def run_gpu(opts, rows: Rows, rng, device: str = "cuda") -> None:
    """The GPU rows: lscore's CUDA kernels (the torch adapter's ``quantize_blocks`` of a CUDA
    tensor) against the same rule in torch ops on that tensor, and the byte floor from a
    device-to-device copy timed in the same turns; each call followed by a synchronize.
    One skipped row where there is no device; `device` lets the tests run them on the CPU."""
    torch = import_torch() if opts.use_torch else None
    why = why_no_cuda(torch) if device == "cuda" else None
    if torch is None or why is not None:
        rows.add("fp8 gpu blockwise", "lscore", skip=why or "torch is not installed", opts=opts)
        return
    from lscore.adapters.torch import quantize as TQ

    t_fns = torch_fns(torch)

    bind = synced(torch, device)
    sizes = _sizes(opts)
    cases = gpu_block_cases(
        opts, rows, torch, device, sizes, DTYPES, RECIPES, "blockwise", 128, shape_of
    )
    for n, groups, g_copy, x, kw in cases:
        width = x.element_size()
        for r, g in groups.items():
            reads, written = TRAFFIC[r]
            nbytes = round((reads * width + written) * n)
            q = bind(TQ.quantize_blocks, x, PRESET, role=ROLES[r])
            rows.add(g, "lscore", q, nbytes=nbytes, **kw)
            rows.add(g, "torch eager", bind(t_fns[r], x), **kw)
        dst = torch.empty_like(x)
        rows.add(g_copy, "C memcpy", bind(dst.copy_, x), nbytes=2 * width * n, **kw)
        add_floors(rows, groups, g_copy, width, n, TRAFFIC)
        del x, dst


def targets(rows: list[dict], opts) -> list[dict]:
    """Issue 47's speed targets: on the CPU rows, blockwise quantize within 1.5x of the byte
    floor at 1e8 ("lscore out=") and at least 10x the same recipe in torch ops; on the GPU
    rows (where a device timed them), within 1.5x of the byte floor at 1e8."""
    out = []
    for n in _sizes(opts):
        if n < 10**8:
            continue
        for name in DTYPES:
            for recipe in RECIPES:
                g = f"fp8 {recipe} {name} {size_label(n)}"
                out.append(
                    ratio_target(rows, f"{g}: torch eager / lscore", g, "torch eager", 10.0, False)
                )
                out.append(
                    ratio_target(
                        rows, f"{g}: lscore out= / byte floor", g, "byte floor", 1.5, True,
                        "lscore out=",
                    )
                )  # fmt: skip
                g = f"fp8 gpu {recipe} {name} {size_label(n)}"
                if timed(rows, g, "lscore"):
                    name_ = f"{g}: lscore / byte floor"
                    out.append(ratio_target(rows, name_, g, "byte floor", 1.5, True))
    return out
