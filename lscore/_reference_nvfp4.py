"""NumPy-only twin of TransformerEngine v2.18's NVFP4 recipe kernels (lsc_nvfp4.h); slow,
obvious, used only by tests.

Philox4x32-10 in uint64 arithmetic, the two-level scale as the formulas of
TE's kernels read, E2M1 by a nearest-value table, stochastic rounding by its
rule in float64 (exact), the Hadamard transform as butterflies over NumPy
axes, and the quantize of either orientation (1 x 16 blocks, 16 x 16 tiles)
by transposing the input into the orientation's rows, computed otherwise
than the compiled passes so that agreement means something.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lscore._reference_fp8 import f32, fp8_cast, fp8_decode

_MASK = np.uint64(0xFFFFFFFF)
#: TE's fixed signs of the Hadamard transform (pytorch/tensor/nvfp4_tensor.py
#: get_wgrad_sign_vector); bit i of SIGN_MASK is set where SIGNS[i] is -1
SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)
SIGN_MASK = int(sum(1 << i for i, s in enumerate(SIGNS) if s < 0))
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_FLT_MAX = float(np.finfo(np.float32).max)
COLS_BIT = 1 << 63


def philox4x32_10(counter: Any, key: Any) -> np.ndarray:
    """Philox4x32-10 (Random123's, as TE's util/curanddx.hpp writes it) of counters (..., 4)
    under key (k0, k1): uint32 words of the same shape."""
    c = [np.asarray(counter, np.uint64)[..., i] for i in range(4)]
    k0, k1 = np.uint64(int(key[0])), np.uint64(int(key[1]))
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _MASK, (p0 >> np.uint64(32)) ^ c[3] ^ k1,
             p0 & _MASK]  # fmt: skip
        k0 = (k0 + np.uint64(0x9E3779B9)) & _MASK
        k1 = (k1 + np.uint64(0xBB67AE85)) & _MASK
    return np.stack(c, axis=-1).astype(np.uint32)


def random_bytes(rows: int, cols: int, seed: int, offset: int, columnwise: bool) -> np.ndarray:
    """The random byte of each element of a (rows, cols) orientation (row-major, cols a
    multiple of 16): byte i % 16 of the draw with subsequence i // 16 (bit 63 set for the
    columnwise copy) at `offset`, key `seed`."""
    sub = np.arange(rows * cols // 16, dtype=np.uint64) | np.uint64(COLS_BIT if columnwise else 0)
    ctr = np.stack(
        [np.full_like(sub, offset & 0xFFFFFFFF), np.full_like(sub, offset >> 32),
         sub & _MASK, sub >> np.uint64(32)], axis=-1,
    )  # fmt: skip
    words = philox4x32_10(ctr, (seed & 0xFFFFFFFF, seed >> 32))
    return words.view(np.uint8).reshape(rows, cols)  # little-endian: byte j % 4 of word j // 4


def e2m1_satfinite(v: Any) -> np.ndarray:
    """TE's RN E2M1 code of each float32: the nearest grid value (a tie to the even code),
    beyond 6 and Inf +-6, the sign bit kept (zeros too), NaN +6 (0x7)."""
    x = np.asarray(v, np.float32)
    out = []
    for f, b in zip(x.ravel().tolist(), x.view(np.uint32).ravel().tolist(), strict=True):
        if f != f:
            out.append(7)
            continue
        d = np.abs(_E2M1 - min(abs(f), 6.0))
        best = np.flatnonzero(d == d.min())
        code = int(best[0] if len(best) == 1 else best[best % 2 == 0][0])
        out.append(code | ((b >> 28) & 8))
    return np.array(out, np.uint8).reshape(x.shape)


def e2m1_stochastic(v: Any, r: Any) -> np.ndarray:
    """TE's software stochastic rounding (#3281) of each float32 with its random byte."""
    x = np.asarray(v, np.float32)
    rb = np.broadcast_to(np.asarray(r, np.uint8), x.shape)
    out = []
    for f, b, byte in zip(x.ravel().tolist(), x.view(np.uint32).ravel().tolist(),
                          rb.ravel().tolist(), strict=True):  # fmt: skip
        if f != f:
            out.append(7)
            continue
        a = abs(f)

        def step(t: float) -> float:
            return 2.0 if t >= 4 else 1.0 if t >= 2 else 0.5

        t = f32(a + (byte / 256) * step(a))  # one rounding, as the fma's
        q = min(np.floor(t / step(t)) * step(t), 6.0)
        out.append(int(np.flatnonzero(q == _E2M1)[0]) | ((b >> 28) & 8))
    return np.array(out, np.uint8).reshape(x.shape)


def to_bf16(v: Any) -> np.ndarray:
    """float32 -> bfloat16 words, to nearest even, NaN 0x7FFF."""
    w = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
    r = ((w + np.uint64(0x7FFF) + ((w >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)) & (
        np.uint64(0xFFFF)
    )
    nan = np.isnan(np.asarray(v, np.float32))
    return np.where(nan, 0x7FFF, r).astype(np.uint16)


def from_bf16(w: Any) -> np.ndarray:
    return (np.asarray(w, np.uint32) << 16).view(np.float32)


def hadamard16(x: Any) -> np.ndarray:
    """The transform down the columns of a 2-D float32 array of bfloat16 values (rows a
    multiple of 16): its bfloat16 words.  x * 0.25 * s, then the stages h = 1, 2, 4, 8
    (a + b, a - b in float32), then bfloat16."""
    v = np.asarray(x, np.float32)
    rows, cols = v.shape
    with np.errstate(over="ignore", invalid="ignore"):
        y = (v.reshape(rows // 16, 16, cols) * (SIGNS * np.float32(0.25))[None, :, None]).astype(
            np.float32
        )
        for h in (1, 2, 4, 8):
            pairs = y.reshape(rows // 16, 16 // (2 * h), 2, h, cols)
            a, b = pairs[:, :, 0], pairs[:, :, 1]
            y = np.stack([a + b, a - b], axis=2).astype(np.float32).reshape(rows // 16, 16, cols)
    return to_bf16(y.reshape(rows, cols))


def hadamard16_exact(x: Any) -> np.ndarray:
    """The transform as the exact sum rounded once (float64 products and sums, exact while
    the 16 magnitudes lie within 2**12 of each other): bfloat16 words."""
    v = np.asarray(x, np.float64)
    rows, cols = v.shape
    h = np.array([[(-1) ** bin(r & c).count("1") for c in range(16)] for r in range(16)])
    m = SIGNS[:, None].astype(np.float64) * h * 0.25
    y = np.einsum("bic,ij->bjc", v.reshape(rows // 16, 16, cols), m).reshape(rows, cols)
    return to_bf16(y.astype(np.float32))


def senc(amax: float) -> float:
    """S_enc of a global amax (core_nvfp4.cuh): 2688 / A, at most FLT_MAX, 1 for A = 0 or
    S_enc = 0."""
    a = f32(amax)
    if a != a:
        return _FLT_MAX
    s = f32(2688.0 / a) if a else np.inf
    s = min(s, _FLT_MAX)
    return 1.0 if a == 0 or s == 0 else s


def _nan_free_amax(v: np.ndarray, axis: Any = None) -> np.ndarray:
    a = np.abs(np.where(np.isnan(v), 0, v))
    return a.max(axis=axis).astype(np.float32)


def global_amax(x: Any, rht: bool = False) -> float:
    """TE's global amax, NaN left out: of x, or of the transform's bfloat16 values."""
    v = np.asarray(x, np.float32)
    if rht:
        v = from_bf16(hadamard16(v))
    return float(_nan_free_amax(v)) if v.size else 0.0


def _scales(amax_b: np.ndarray, amax: float) -> tuple[np.ndarray, np.ndarray]:
    """(E4M3 codes, element factors) of block amaxes under the global amax."""
    s = senc(amax)
    mult = f32(f32(s) * (np.float32(1) / np.float32(6)))
    with np.errstate(over="ignore"):
        m = (amax_b.astype(np.float64) * mult).astype(np.float32)
    sf = fp8_cast(m, 1.0, "float8_e4m3fn", saturate=True, nan_sign=False)[0]
    sdec = f32(1.0 / f32(s))
    with np.errstate(divide="ignore", over="ignore"):
        enc = 1.0 / (fp8_decode(sf, "float8_e4m3fn").astype(np.float32) * np.float32(sdec))
    return sf, np.minimum(enc.astype(np.float32), np.float32(_FLT_MAX))


def quantize(
    x: Any,
    amax: float | None = None,
    *,
    axis: int = -1,
    tile: bool = False,
    rht: bool = False,
    seed: int | None = None,
    offset: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Reference for lscore._ext._nvfp4.quantize: (scale codes, packed codes) of a 2-D x
    (float32 values) in the layout of lsc_nvfp4_cpu.h; amax None: TE's global amax."""
    v = np.asarray(x, np.float32)
    if rht:
        v = from_bf16(hadamard16(v))
    if amax is None:
        amax = global_amax(v)
    y = np.ascontiguousarray(v.T if axis == 0 else v)  # the orientation's rows
    rows, cols = y.shape
    blocks = y.reshape(rows, cols // 16, 16)
    if tile:
        amax_b = _nan_free_amax(y.reshape(rows // 16, 16, cols // 16, 16), (1, 3))
        sf, enc = _scales(amax_b, amax)
        f = np.repeat(np.repeat(enc, 16, 0), 16, 1)
        scales = sf.T if axis == 0 else sf
    else:
        sf, enc = _scales(_nan_free_amax(blocks, 2), amax)
        f = np.repeat(enc, 16, 1)
        scales = sf.T if axis == 0 else sf
    with np.errstate(over="ignore", invalid="ignore"):
        p = (y * f).astype(np.float32)
    if seed is None:
        c = e2m1_satfinite(p)
    else:
        c = e2m1_stochastic(p, random_bytes(rows, cols, seed, offset, axis == 0))
    packed = (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(scales), np.ascontiguousarray(packed.T if axis == 0 else packed)


def decode(
    scales: Any, codes: Any, amax: float, *, axis: int = -1, tile: bool = False
) -> np.ndarray:
    """The float32 values of quantize's codes: e2m1 * ((float(sf) * A) * float32(1 / 2688))."""
    c = np.asarray(codes, np.uint8)
    q = c.T if axis == 0 else c
    nib = np.stack([q & 0xF, q >> 4], axis=-1).reshape(q.shape[0], -1).astype(np.int64)
    e = np.where(nib & 8, -_E2M1[nib & 7], _E2M1[nib & 7])
    sf = np.asarray(scales).view(np.uint8)
    s = sf.T if axis == 0 else sf
    with np.errstate(over="ignore", invalid="ignore"):
        d = fp8_decode(s, "float8_e4m3fn").astype(np.float32) * np.float32(amax)
        d = (d.astype(np.float32) * (np.float32(1) / np.float32(2688))).astype(np.float32)
        d = np.repeat(np.repeat(d, 16, 0), 16, 1) if tile else np.repeat(d, 16, 1)
        y = (e.astype(np.float32) * d).astype(np.float32)
    return np.ascontiguousarray(y.T if axis == 0 else y)
