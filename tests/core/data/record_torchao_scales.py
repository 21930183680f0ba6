"""Record torchao's float8 scales into tests/core/data/torchao_scales.npz.

Run in a throwaway virtualenv (torch and torchao are never dependencies of lscore's core):
    python3.11 -m venv /tmp/ao-venv
    /tmp/ao-venv/bin/pip install torch==2.13.0 numpy ml_dtypes torchao==0.18.0
    /tmp/ao-venv/bin/python tests/core/data/record_torchao_scales.py
Every scale comes from torchao 0.18.0's own functions on the CPU:
``torchao.float8.float8_utils.amax_to_scale`` over generated amaxes (a 1-d tensor,
and each amax again as a 0-d tensor: both must agree), ``_round_scale_down_to_power_of_2``
over the float32 neighbourhood of every power of two, and ``tensor_to_scale`` tensorwise
and axiswise on small float32 and bfloat16 tensors with zeros, NaN, Inf and subnormals;
for float8_e4m3fn and float8_e5m2, power-of-two rounding off and on.  Floats are stored
as their bits (uint32; bfloat16 inputs as uint16) so NaNs survive; the test compares
NaNs by value.
"""

import pathlib

import ml_dtypes
import numpy as np
import torch
import torchao
from torchao.float8.config import ScalingGranularity
from torchao.float8.float8_utils import (
    _round_scale_down_to_power_of_2,
    amax_to_scale,
    tensor_to_scale,
)

OUT = pathlib.Path(__file__).with_name("torchao_scales.npz")
FORMATS = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
SEED = 2034


def f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def amaxes(rng):
    """Log-uniform over the positive float32 range, powers of two and their +-1 ulp
    neighbours, the amaxes whose scales land next to a power of two, 0, -0, subnormals,
    the EPS boundary, FLT_MAX, Inf and NaN."""
    out = [rng.integers(1, 0x7F800000, 3000, dtype=np.uint64).astype(np.uint32)]
    p2 = np.arange(0, 255, dtype=np.uint32) << 23  # 0 (== +0) and every normal power of two
    sub = np.uint32(1) << np.arange(23, dtype=np.uint32)  # the subnormal powers of two
    for p in (p2, sub):
        out += [p, p + 1, p - 1]
    for top in (448.0, 57344.0):
        # scales fp8_max / amax next to 2**m: the power-of-two rounding's edge cases
        m = np.arange(-100, 140, dtype=np.float64)
        centre = bits((top / 2.0**m).astype(np.float32)).astype(np.int64)
        out += [(centre + d).astype(np.uint32) for d in range(-3, 4)]
    eps = int(np.float32(1e-12).view(np.uint32))
    out.append(np.arange(eps - 3, eps + 4, dtype=np.uint32))
    special = [0.0, -0.0, 1.0, 3.0, 448.0, 57344.0, float(np.finfo(np.float32).max)]
    out.append(bits(np.array(special, np.float32)))
    out.append(np.array([0x7F800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x00000001], np.uint32))
    out.append(bits(np.array([-1.0, -np.inf], np.float32)))  # torch.clamp gives EPS
    a = np.concatenate(out)
    a = a[(a & 0x7FFFFFFF) <= 0x7FC00000]  # drop the wrapped-around words
    return a


def neighbourhoods():
    """Every float32 within 48 ulps of each power of two (normal and subnormal), positive."""
    p = np.concatenate(
        [np.uint32(1) << np.arange(23, dtype=np.uint32), np.arange(1, 255, dtype=np.uint32) << 23]
    ).astype(np.int64)
    x = (p[:, None] + np.arange(-48, 49)[None, :]).ravel()
    x = np.unique(x[(x > 0) & (x < 0x7F800000)])
    return x.astype(np.uint32)


def tensors(rng):
    """Small [4, 8] tensors: ordinary values, rows with zeros only, subnormals, NaN, +-Inf,
    huge values."""
    cases = []
    for k in range(12):
        t = (rng.standard_normal((4, 8)) * 10.0 ** rng.integers(-6, 6)).astype(np.float32)
        if k % 3 == 1:
            t[1] = 0
        if k % 4 == 2:
            t[2] = f32(rng.integers(1, 0x800000, 8))
        if k in (3, 9):
            t[0, 3] = np.nan
        if k in (5, 9):
            t[3, 1] = np.inf
        if k == 7:
            t[2, 5] = -np.inf
        if k == 8:
            t[1] = np.float32(3e38)
        cases.append(t)
    return np.stack(cases)


def main():
    torch.set_num_threads(1)
    rng = np.random.default_rng(SEED)
    a = amaxes(rng)
    rec = {"amax": a}
    ta = torch.from_numpy(f32(a).copy())
    for name, dt in FORMATS.items():
        for pow2 in (False, True):
            got = amax_to_scale(ta, dt, round_scales_to_power_of_2=pow2)
            assert got.dtype == torch.float32
            got = got.numpy()
            one = np.array(
                [amax_to_scale(torch.tensor(v), dt, pow2).item() for v in f32(a)], np.float32
            )
            assert np.array_equal(got, one, equal_nan=True), (name, pow2)
            rec[f"amax_to_scale_{name}_{int(pow2)}"] = bits(got)
    s = neighbourhoods()
    rec["pow2_in"] = s
    rec["pow2_out"] = bits(_round_scale_down_to_power_of_2(torch.from_numpy(f32(s).copy())))
    t = tensors(rng)
    rec["t_f32"] = bits(t)
    rec["t_bf16"] = t.astype(ml_dtypes.bfloat16).view(np.uint16)
    for src, x in (
        ("f32", torch.from_numpy(t.copy())),
        ("bf16", torch.from_numpy(t.copy()).to(torch.bfloat16)),
    ):
        for name, dt in FORMATS.items():
            for pow2 in (False, True):
                tw = [
                    tensor_to_scale(x[i], dt, round_scales_to_power_of_2=pow2)
                    for i in range(len(t))
                ]
                aw = [
                    tensor_to_scale(
                        x[i],
                        dt,
                        scaling_granularity=ScalingGranularity.AXISWISE,
                        axiswise_dim=-1,
                        round_scales_to_power_of_2=pow2,
                    )
                    for i in range(len(t))
                ]
                rec[f"tensorwise_{src}_{name}_{int(pow2)}"] = bits(torch.stack(tw).float().numpy())
                rec[f"axiswise_{src}_{name}_{int(pow2)}"] = bits(
                    torch.stack(aw).float().numpy()[..., 0]
                )
    rec["versions"] = np.array([torch.__version__, torchao.__version__, ml_dtypes.__version__])
    np.savez_compressed(OUT, **rec)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(a)} amaxes, {len(s)} pow2 inputs)")


if __name__ == "__main__":
    main()
