"""`lscore bench --suite fp8`, NVFP4 rows: TransformerEngine v2.18's NVFP4BlockScaling
quantize (the ``te-nvfp4`` preset) against the same recipe in torch ops and the byte floor.

Each group is one quantize of a 2-D bfloat16 array (rows and columns multiples of 16):
"nvfp4-rht" a gradient's columnwise copy (``role="grad", axis=0``: the random Hadamard
transform down each column's blocks of 16, rounded to bfloat16, then stochastic rounding with
lscore's counter-based Philox4x32-10 stream; the costliest), "nvfp4-1x16" an activation
(``role="input"``, rowwise, round to nearest) and "nvfp4-16x16" a weight (``role="weight"``:
one E4M3 scale per 16x16 tile). Each takes the tensor's global amax first (of the transform's
bfloat16 results for "nvfp4-rht"), as TE's recipe does. The baseline is that recipe written out
in torch ops (eager, on the same tensor): the transform as a matmul of the 16x16 matrix
diag(s) * H16 / 4 with the 16-row chunks, the amaxes with NaN left out, S_enc = 2688 / A, the E4M3
block scales, the factors 1 / (sf * S_dec), E2M1 rounding to nearest even or by TE's stochastic
rule, and Philox4x32-10 in int64 ops; a test checks that it writes the bytes lscore writes.

The byte floor is the bytes a two-pass quantize must move, at the bandwidth of a C memcpy of
the input timed in the same turns: the input read twice (the global amax needs a whole pass
before any scale is known; for "nvfp4-rht" that pass transforms the input and the quantize
pass transforms it again rather than storing it), half a byte written per element, and one
scale byte per block of 16 (per 256 elements for the tiles).  The "lscore out=" rows (into
the arrays of an earlier result) are the ones held to it.  Sizes: 2**20 (1024 x 1024), 2**24
and 1e8 (10000 x 10000); 1e7 is no whole number of 16 x 16 tiles.
"""

from __future__ import annotations

import math

import numpy as np

from lscore.bench._fp8 import (
    TINY_SIZES,
    add_floors,
    block_cases,
    block_cpu_rows,
    gpu_block_cases,
    ratio_target,
    synced,
    why_no_cuda,
)
from lscore.bench._harness import Rows, import_torch, size_label

SIZES = (2**20, 2**24, 10**8)
DTYPES = ("bfloat16",)
RECIPES = ("nvfp4-rht", "nvfp4-1x16", "nvfp4-16x16")
#: recipe -> (input reads, bytes written per element: the codes and the E4M3 scales)
TRAFFIC = {
    "nvfp4-rht": (2, 0.5 + 1 / 16),
    "nvfp4-1x16": (2, 0.5 + 1 / 16),
    "nvfp4-16x16": (2, 0.5 + 1 / 256),
}
#: recipe -> the keywords of ``quantize_blocks`` that pick it
OPTIONS = {
    "nvfp4-rht": dict(axis=0, role="grad", seed=1, offset=0),
    "nvfp4-1x16": dict(axis=-1, role="input"),
    "nvfp4-16x16": dict(axis=-1, role="weight"),
}
PRESET = "te-nvfp4"
SIGNS = 0xD7E8  # bit i: the Hadamard transform's sign s_i is -1 (lsc_nvfp4.h LSC_NV4_SIGNS)
_M32 = 0xFFFFFFFF


def shape_of(n: int) -> tuple[int, int]:
    """(rows, cols) of n elements, both multiples of 16 (n a multiple of 256), as square as
    such a pair allows (1e8: 10000 x 10000)."""
    cols = max(c for c in range(16, math.isqrt(n) + 1, 16) if n % c == 0 and (n // c) % 16 == 0)
    return n // cols, cols


def lscore_fns(x: np.ndarray, reuse: bool = False) -> dict:
    """recipe -> lscore's quantize of x (``quantize_blocks`` by te-nvfp4 and the recipe's
    options), into the arrays of one earlier result when `reuse`."""
    from lscore.fp8 import quantize_blocks

    def by(kw):
        out = quantize_blocks(x, PRESET, **kw) if reuse else None

        def quantize():
            b = quantize_blocks(x, PRESET, **kw, out=out)
            return b.scales, b.data

        return quantize

    return {r: by(kw) for r, kw in OPTIONS.items()}


def torch_fns(torch) -> dict:
    """recipe -> TE's NVFP4 quantize of a 2-D tensor in torch ops: (scale codes, packed
    codes) as uint8 tensors in lscore's layouts, and the global amax."""
    f32 = torch.float32
    hs = [[(-1.0) ** bin(r & c).count("1") for c in range(16)] for r in range(16)]
    sgn = [-0.25 if SIGNS >> i & 1 else 0.25 for i in range(16)]
    # out[j] = sum_i x[i] * s_i * H[i, j] / 4: the transposed matrix multiplies the chunks
    had = [[sgn[i] * hs[i][j] for i in range(16)] for j in range(16)]
    # E2M1 code of 2 * q for the stochastic rule's grid values q
    lut = [0, 1, 2, 3, 4, 0, 5, 0, 6, 0, 0, 0, 7]

    def mulhilo(m, v):  # (high, low) words of the 64-bit product m * v, in int64 ops
        a, b = m * (v & 0xFFFF), m * (v >> 16)
        t = a + ((b & 0xFFFF) << 16)
        return (b >> 16) + (t >> 32), t & _M32

    def philox(sub, seed, offset):  # Philox4x32-10 of the subsequences (int64): 4 words
        x = torch.full_like(sub, offset & _M32)
        y = torch.full_like(sub, offset >> 32)
        z, w = sub & _M32, (sub >> 32) & _M32  # a logical shift of the int64 word
        k0, k1 = seed & _M32, seed >> 32
        for _ in range(10):
            h0, l0 = mulhilo(0xD2511F53, x)
            h1, l1 = mulhilo(0xCD9E8D57, z)
            x, y, z, w = h1 ^ y ^ k0, l1, h0 ^ w ^ k1, l0
            k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
        return x, y, z, w

    def random_bytes(rows, cols, axis, seed, offset, dev):  # each element's byte, (rows, cols)
        r, c = (cols, rows) if axis == 0 else (rows, cols)  # the orientation's rows
        sub = torch.arange(r * c // 16, dtype=torch.int64, device=dev)
        if axis == 0:  # bit 63 of the columnwise copy's subsequences
            sub = sub | torch.tensor(-(2**63), dtype=torch.int64, device=dev)
        words = philox(sub, seed, offset)
        # each word's four low bytes of its little-endian int64, in order
        b = torch.stack(words, -1).view(torch.uint8).reshape(-1, 4, 8)[:, :, :4].reshape(r, c)
        return b.t() if axis == 0 else b

    def e2m1_rn(p):  # to nearest even on the grid, +-6 beyond, NaN +6 (code 7)
        a = p.abs()
        code = (a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75)
        code = code + (a > 2.5) + (a >= 3.5) + (a > 5.0)
        return code, a

    def e2m1_sr(p, rb):  # TE's #3281 rule: t = a + u * step(a), floor to step(t), min 6
        a = p.abs()

        def step(v):
            return torch.where(v >= 4, 2.0, torch.where(v >= 2, 1.0, 0.5)).to(f32)

        t = a + (rb.to(f32) / 256) * step(a)
        st = step(t)
        q = torch.clamp(torch.floor(t / st) * st, max=6.0)
        q = torch.nan_to_num(q, nan=0.0)
        table = torch.tensor(lut, dtype=torch.uint8, device=p.device)
        return table[(q * 2).to(torch.int64)], a

    def quantize(x, axis, tile, rht, seed=None, offset=0):
        rows, cols = x.shape
        dev = x.device
        v = x.float()
        if rht:  # the 16-row chunks of each column times the matrix, rounded to bfloat16
            h = torch.tensor(had, dtype=f32, device=dev)
            v = torch.matmul(h, v.reshape(rows // 16, 16, cols)).reshape(rows, cols)
            v = v.to(torch.bfloat16).float()
        mags = torch.nan_to_num(v.abs(), nan=0.0, posinf=float("inf"))
        amax = mags.amax()
        big = torch.tensor(np.finfo(np.float32).max, dtype=f32, device=dev)
        # a tensor quotient: torch takes a number over a tensor as its reciprocal times it
        senc = torch.tensor(2688.0, dtype=f32, device=dev) / amax
        senc = torch.where(senc < big, senc, big)  # a NaN quotient gives FLT_MAX
        senc = torch.where((amax == 0) | (senc == 0), torch.ones_like(senc), senc)
        sdec = 1.0 / senc
        mult = senc * torch.tensor(1 / 6, dtype=f32, device=dev)
        if tile:
            blocks = mags.reshape(rows // 16, 16, cols // 16, 16).amax((1, 3))
        elif axis == 0:
            blocks = mags.reshape(rows // 16, 16, cols).amax(1)
        else:
            blocks = mags.reshape(rows, cols // 16, 16).amax(2)
        sf = torch.clamp(blocks * mult, max=448.0).to(torch.float8_e4m3fn)
        enc = 1.0 / (sf.float() * sdec)
        enc = torch.where(enc < big, enc, big)
        if tile:
            f = enc.repeat_interleave(16, 0).repeat_interleave(16, 1)
        elif axis == 0:
            f = enc.repeat_interleave(16, 0)
        else:
            f = enc.repeat_interleave(16, 1)
        p = v * f
        if seed is None:
            code, a = e2m1_rn(p)
        else:
            code, a = e2m1_sr(p, random_bytes(rows, cols, axis, seed, offset, dev))
        nan = torch.isnan(a)
        code = torch.where(nan, 7, code | (torch.signbit(p) & ~nan).to(torch.uint8) * 8)
        code = code.to(torch.uint8)
        # axis 0: rows 2p, 2p + 1 of a column in one byte, the first low; else columns
        lo, hi = (code[0::2], code[1::2]) if axis == 0 else (code[:, 0::2], code[:, 1::2])
        packed = lo | (hi << 4)
        return sf.view(torch.uint8), packed, amax

    return {
        "nvfp4-rht": lambda x: quantize(x, 0, False, True, OPTIONS["nvfp4-rht"]["seed"]),
        "nvfp4-1x16": lambda x: quantize(x, -1, False, False),
        "nvfp4-16x16": lambda x: quantize(x, -1, True, False),
    }


def _sizes(opts) -> tuple:
    if opts.tiny:
        return TINY_SIZES
    return tuple(opts.sizes) if opts.sizes_given else SIZES


def run_cpu(opts, rows: Rows, rng) -> None:
    """The CPU rows: every size and recipe (a size that is not a whole number of 16 x 16
    tiles is skipped, with the reason)."""
    cases = block_cases(opts, rows, rng, _sizes(opts), DTYPES, RECIPES, "nvfp4", 256, shape_of)
    block_cpu_rows(opts, rows, cases, lscore_fns, torch_fns, TRAFFIC)


def run_gpu(opts, rows: Rows, rng, device: str = "cuda") -> None:
    """The GPU rows: lscore's CUDA kernels (the torch adapter's ``quantize_blocks`` of a CUDA
    tensor) against the same recipe in torch ops on that tensor, and the byte floor from a
    device-to-device copy timed in the same turns; each call followed by a synchronize.
    One skipped row where there is no device; `device` lets the tests run them on the CPU."""
    torch = import_torch() if opts.use_torch else None
    why = why_no_cuda(torch) if device == "cuda" else None
    if torch is None or why is not None:
        rows.add("fp8 gpu nvfp4", "lscore", skip=why or "torch is not installed", opts=opts)
        return
    from lscore.adapters.torch import quantize as TQ

    t_fns = torch_fns(torch)
    bind = synced(torch, device)
    sizes = _sizes(opts)
    cases = gpu_block_cases(
        opts, rows, torch, device, sizes, DTYPES, RECIPES, "nvfp4", 256, shape_of
    )
    for n, groups, g_copy, x, kw in cases:
        width = x.element_size()
        for r, g in groups.items():
            reads, written = TRAFFIC[r]
            nbytes = round((reads * width + written) * n)
            rows.add(
                g, "lscore", bind(TQ.quantize_blocks, x, PRESET, **OPTIONS[r]), nbytes=nbytes, **kw
            )
            rows.add(g, "torch eager", bind(t_fns[r], x), **kw)
        dst = torch.empty_like(x)
        rows.add(g_copy, "C memcpy", bind(dst.copy_, x), nbytes=2 * width * n, **kw)
        add_floors(rows, groups, g_copy, width, n, TRAFFIC)
        del x, dst


def targets(rows: list[dict], opts) -> list[dict]:
    """Issue 47's speed targets on the CPU rows at 1e8: the RHT quantize of a gradient's
    columnwise copy ("nvfp4-rht", "lscore out=") within 2.5x of the byte floor, and at least
    10x the same recipe in torch ops."""
    out = []
    for n in _sizes(opts):
        if n < 10**8:
            continue
        for name in DTYPES:
            g = f"fp8 nvfp4-rht {name} {size_label(n)}"
            out.append(
                ratio_target(rows, f"{g}: torch eager / lscore", g, "torch eager", 10.0, False)
            )
            out.append(
                ratio_target(
                    rows, f"{g}: lscore out= / byte floor", g, "byte floor", 2.5, True,
                    "lscore out=",
                )
            )  # fmt: skip
    return out
