"""Record torchao's MX and NVFP4 quantization into tests/core/data/torchao_mx.npz.

Run in a throwaway virtualenv (torch and torchao are never dependencies of lscore's core):
    python3.11 -m venv /tmp/ao-mx-venv
    /tmp/ao-mx-venv/bin/pip install torch==2.13.0 numpy ml_dtypes torchao==0.18.0
    /tmp/ao-mx-venv/bin/python tests/core/data/record_torchao_mx.py
Every byte comes from torchao 0.18.0's own functions on the CPU (its eager path):
``torchao.prototype.mx_formats.mx_tensor.to_mx`` (what ``MXTensor.to_mx`` calls) for the
element formats float8_e4m3fn, float8_e5m2 and fp4 E2M1 with block 32, in each
``ScaleCalculationMode`` (FLOOR, CEIL, EVEN, RCEIL), and
``torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize`` (what ``NVFP4Tensor.to_nvfp4``
calls) with block 16, without a per-tensor scale and with the one
``per_tensor_amax_to_scale`` gives each group of 8 blocks (of the amax
``torch.max(torch.abs(g))``, as ``NVFP4Tensor`` takes it).  Each result is also read back by
torchao: ``mx_tensor.to_dtype`` (what ``MXTensor.dequantize`` calls) to float32, bfloat16
and float16, and ``NVFP4Tensor.dequantize`` to float32 and bfloat16.  The blocks are generated
float32 rows, and the same rows rounded to bfloat16: all-zero, NaN, Inf, subnormal, powers
of two and their +-1 ulp neighbours as the block maximum, maxima next to fp8_max * 2**k
(where the scale rules differ), exponents near +-127, and random log-uniform values.
Inputs are stored as their bits (uint32 / uint16) so NaNs survive; outputs as bytes.
"""

import pathlib

import ml_dtypes
import numpy as np
import torch
import torchao
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
from torchao.prototype.mx_formats.nvfp4_tensor import (
    NVFP4Tensor,
    nvfp4_quantize,
    per_tensor_amax_to_scale,
)

OUT = pathlib.Path(__file__).with_name("torchao_mx.npz")
SEED = 3035
ELEMS = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2}
MODES = {m.name.lower(): m for m in ScaleCalculationMode}
TOPS = (448.0, 57344.0, 6.0)
# dequantized outputs: name -> (torch dtype, the unsigned view that keeps their bits)
TARGETS = {
    "f32": (torch.float32, torch.int32, np.uint32),
    "bf16": (torch.bfloat16, torch.int16, np.uint16),
    "f16": (torch.float16, torch.int16, np.uint16),
}


def out_bits(t, target):
    _, signed, unsigned = TARGETS[target]
    return t.contiguous().view(signed).numpy().view(unsigned).copy()


def f32(b):
    return np.asarray(b, np.uint32).view(np.float32)


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def blocks(rng, k):
    """Rows of k float32 values; the row's maximum is the case named in the module doc."""
    rows = []

    def with_max(m, below=True):
        # random values below |m| (log-uniform over 2**-30 of it), m at a random place
        r = rng.uniform(-30, 0, k) if below else rng.uniform(-3, 0, k)
        v = (np.abs(np.float64(m)) * 2.0**r * rng.choice([-1.0, 1.0], k)).astype(np.float32)
        v[rng.integers(k)] = m
        return v

    rows.append(np.zeros(k, np.float32))
    rows.append(-np.zeros(k, np.float32))
    for special in (np.nan, np.inf, -np.inf):
        rows.append(with_max(np.float32(3.0)))
        rows[-1][rng.integers(k)] = special
    rows.append(np.full(k, np.nan, np.float32))
    rows.append(np.full(k, np.inf, np.float32))
    nan_inf = with_max(np.float32(1.0))
    nan_inf[:2] = (np.nan, np.inf)
    rows.append(nan_inf)
    # subnormal maxima, and exponents near +-127
    subnormal = (1, 2, 0x400000, 0x7FFFFF, 0x800000, 0x800001, 0x1000000)
    rows.extend(with_max(f32(b)[()], below=False) for b in subnormal)
    pow2 = [int(np.float32(2.0**e).view(np.uint32)) for e in range(-127, 128, 4)]
    pow2 += [int(np.float32(2.0**e).view(np.uint32)) for e in (-126, 126, 127)]
    centres = [p + d for p in sorted(pow2) for d in (-1, 0, 1)]
    for top in TOPS:
        near = (int(np.float32(top * 2.0**kk).view(np.uint32)) for kk in range(-140, 125, 9))
        centres += [min(c + d, 0x7F7FFFFF) for c in near if 0 < c < 0x7F800000 for d in (-1, 0, 1)]
    rows.extend(with_max(f32(c)[()]) for c in centres)
    rows.append(with_max(np.float32(np.finfo(np.float32).max)))
    for _ in range(30):  # random log-uniform blocks
        e = rng.uniform(-140, 127, k)
        v = (2.0**e * rng.choice([-1.0, 1.0], k)).astype(np.float32)
        rows.append(v)
    return np.stack(rows)


def record_mx(x):
    out = {}
    for ename, edt in ELEMS.items():
        for mname, mode in MODES.items():
            scale, data = to_mx(x, edt, 32, mode)
            out[f"{ename}_{mname}_scale"] = scale.view(torch.uint8).numpy().copy()
            out[f"{ename}_{mname}_data"] = data.view(torch.uint8).numpy().copy()
            for target, (dtype, _, _) in TARGETS.items():
                deq = to_dtype(data, scale, edt, 32, dtype)
                out[f"{ename}_{mname}_deq_{target}"] = out_bits(deq, target)
    return out


def record_nvfp4(x):
    out = {}
    scale, data = nvfp4_quantize(x, 16, None)
    out["nvfp4_scale"] = scale.view(torch.uint8).numpy().copy()
    out["nvfp4_data"] = data.view(torch.uint8).numpy().copy()
    t = NVFP4Tensor.to_nvfp4(x.contiguous(), 16)
    for target in ("f32", "bf16"):
        out[f"nvfp4_deq_{target}"] = out_bits(t.dequantize(TARGETS[target][0]), target)
    deqs = {"f32": [], "bf16": []}
    groups = x.reshape(-1, 8, 16)
    pts, sc, da = [], [], []
    for g in groups:
        # the amax as torchao's NVFP4Tensor takes it (nvfp4_tensor.py:606), in g's dtype;
        # 128 elements: torch's serial CPU reduction whatever its thread count
        p = per_tensor_amax_to_scale(torch.max(torch.abs(g)))
        s, d = nvfp4_quantize(g.contiguous(), 16, p)
        pts.append(p.item())
        sc.append(s.view(torch.uint8).numpy().copy())
        da.append(d.view(torch.uint8).numpy().copy())
        t = NVFP4Tensor.to_nvfp4(g.contiguous(), 16, p)
        for target, got in deqs.items():
            got.append(out_bits(t.dequantize(TARGETS[target][0]), target))
    out["nvfp4_pts"] = np.array(pts, np.float32).view(np.uint32)
    out["nvfp4_pts_scale"] = np.concatenate(sc)
    out["nvfp4_pts_data"] = np.concatenate(da)
    for target, got in deqs.items():
        out[f"nvfp4_pts_deq_{target}"] = np.concatenate(got)
    return out


def main():
    rng = np.random.default_rng(SEED)
    arrays = {}
    for dname, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        x32 = blocks(rng, 32)
        x = torch.from_numpy(x32).to(dtype)
        arrays[f"{dname}_mx_x"] = x.view(torch.int32 if dname == "f32" else torch.int16).numpy()
        arrays[f"{dname}_mx_x"] = arrays[f"{dname}_mx_x"].view(
            np.uint32 if dname == "f32" else np.uint16
        )
        arrays.update({f"{dname}_{k}": v for k, v in record_mx(x).items()})
        x16 = blocks(rng, 16)
        x16 = x16[: len(x16) // 8 * 8]
        x = torch.from_numpy(x16).to(dtype)
        arrays[f"{dname}_nv_x"] = (
            x.view(torch.int32 if dname == "f32" else torch.int16)
            .numpy()
            .view(np.uint32 if dname == "f32" else np.uint16)
        )
        arrays.update({f"{dname}_{k}": v for k, v in record_nvfp4(x).items()})
    np.savez_compressed(OUT, **arrays)
    print(
        f"torch {torch.__version__}, torchao {torchao.__version__}, "
        f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}"
    )
    for k, v in arrays.items():
        print(f"{k}: {v.dtype} {v.shape}")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
