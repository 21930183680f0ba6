"""Record torchao's MX quantization after pytorch/ao#4725 into torchao_mx_4725.npz.

torchao has no release with #4725 (commit 5d73a0c10b02539fcb27a8ee86b32f01f1be1854,
"Refine MXFP8 CUDA quantization semantics"); between v0.18.0 and that commit,
torchao/prototype/mx_formats/ changed only in mx_tensor.py (#4725's hunks) and in the GPU
kernels of kernels.py, so torchao 0.18.0 with that one file in its place is the commit's
eager CPU path.  Run in a throwaway virtualenv (torch and torchao are never dependencies of
lscore's core), with the file downloaded beside it:
    python3.11 -m venv /tmp/ao-mx-venv
    /tmp/ao-mx-venv/bin/pip install torch==2.13.0 numpy ml_dtypes torchao==0.18.0
    curl -o /tmp/mx_tensor_4725.py https://raw.githubusercontent.com/pytorch/ao/\
5d73a0c10b02539fcb27a8ee86b32f01f1be1854/torchao/prototype/mx_formats/mx_tensor.py
    /tmp/ao-mx-venv/bin/python tests/core/data/record_torchao_mx_4725.py /tmp/mx_tensor_4725.py
Every byte comes from that file's ``to_mx`` on the CPU, for float8_e4m3fn, float8_e5m2 and
fp4 E2M1 with block 32 in each ``ScaleCalculationMode``; the inputs are torchao_mx.npz's
float32 blocks (record_torchao_mx.py) and blocks aimed at #4725's changes (a maximum next to
fp8_max * 2**k for k at the ends of the E8M0 range, float32's largest values), as float32
and rounded to bfloat16.  The reciprocal of the NaN scale is torch's own (torch >= 2.14
casts float8_e8m0fnu, torch 2.13 takes the fallback), so torch's version does not matter.
"""

import importlib.util
import pathlib
import sys

import numpy as np
import torch
import torchao
from torchao.prototype.mx_formats.config import ScaleCalculationMode

HERE = pathlib.Path(__file__).parent
OUT = HERE / "torchao_mx_4725.npz"
SEED = 4725
ELEMS = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2}


def load_to_mx(path):
    spec = importlib.util.spec_from_file_location("mx_tensor_4725", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.to_mx


def aimed_blocks(rng):
    """Blocks whose maximum sits at (or one float32 ulp beside) top * 2**k."""
    rows = []
    for top in (448.0, 57344.0, 6.0):
        for k in (-139, -130, -128, -127, -126, -20, 0, 20, 100, 118, 119, 120):
            with np.errstate(over="ignore"):
                p = np.float32(top * 2.0**k)
            for c in (np.nextafter(p, np.float32(0)), p, np.nextafter(p, np.float32(np.inf))):
                v = (np.float64(c) * 2.0 ** rng.uniform(-10, 0, 32)).astype(np.float32)
                v[rng.integers(32)] = c
                rows.append(v)
    for m in (np.finfo(np.float32).max, np.float32(3.3e38)):
        v = np.ones(32, np.float32)
        v[3] = m
        rows.append(v)
    return np.stack(rows)


def main():
    to_mx = load_to_mx(sys.argv[1])
    rng = np.random.default_rng(SEED)
    base = np.load(HERE / "torchao_mx.npz")["f32_mx_x"].view(np.float32)
    x32 = np.concatenate([base, aimed_blocks(rng)])
    arrays = {}
    for dname, dtype, signed, unsigned in (
        ("f32", torch.float32, torch.int32, np.uint32),
        ("bf16", torch.bfloat16, torch.int16, np.uint16),
    ):
        x = torch.from_numpy(x32.copy()).to(dtype)
        arrays[f"{dname}_x"] = x.view(signed).numpy().view(unsigned).copy()
        for ename, edt in ELEMS.items():
            for mode in ScaleCalculationMode:
                scale, data = to_mx(x, edt, 32, mode)
                key = f"{dname}_{ename}_{mode.name.lower()}"
                arrays[f"{key}_scale"] = scale.view(torch.uint8).numpy()[:, 0].copy()
                arrays[f"{key}_data"] = data.view(torch.uint8).numpy().copy()
    np.savez_compressed(OUT, **arrays)
    print(f"torch {torch.__version__}, torchao {torchao.__version__} + {sys.argv[1]}")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(x32)} blocks)")


if __name__ == "__main__":
    main()
