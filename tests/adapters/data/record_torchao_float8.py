"""Record torchao 0.18 float8 training outputs into tests/adapters/data/torchao_float8.npz.

Run in a throwaway virtualenv (torchao is never a dependency of lscore):
    python3.11 -m venv /tmp/ao
    /tmp/ao/bin/pip install torch==2.13.0 numpy ml_dtypes torchao==0.18.0
    /tmp/ao/bin/python tests/adapters/data/record_torchao_float8.py
Two parts, all on the CPU:
- ``quant/<case>/...``: torchao's own cast path (``tensor_to_scale`` then
  ``hp_tensor_and_scale_to_float8``), or a given scale for the delayed-style cast, on generated
  float32 and bfloat16 tensors with zeros, subnormals, NaN, +-Inf and values that overflow; the
  input bits, the float32 scale bits and the float8 bytes.
- ``linear/<case>/...``: ``convert_to_float8_training(Sequential(Linear, ReLU, Linear))`` with
  ``emulate=True`` under the tensorwise and rowwise recipes, float32 and bfloat16 models: the
  parameters, input and grad_output given, then the forward output, the input gradient and every
  parameter gradient of one backward.
Floating tensors are stored as their bit patterns (uint32 float32, uint16 bfloat16, uint8 float8).
"""

import dataclasses
import json
import pathlib

import numpy as np
import torch
import torchao
from torchao.float8 import Float8LinearConfig, convert_to_float8_training
from torchao.float8.config import ScalingGranularity
from torchao.float8.float8_training_tensor import GemmInputRole, hp_tensor_and_scale_to_float8
from torchao.float8.float8_utils import tensor_to_scale

OUT = pathlib.Path(__file__).with_name("torchao_float8.npz")
FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
HP = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def bits(t):
    """A tensor's bit pattern as an unsigned NumPy array (float8 -> uint8)."""
    t = t.detach().contiguous()
    if t.dtype in FP8.values():
        return t.view(torch.uint8).numpy().copy()
    raw = t.view(BITS[t.dtype]).numpy()
    return raw.view(np.uint32 if t.dtype == torch.float32 else np.uint16).copy()


def special_input(rng, shape, dtype, kind):
    """A seeded tensor with the values a cast must get right, per ``kind``."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, shape))
    flat = x.reshape(-1)
    n = flat.size
    idx = rng.permutation(n)
    flat[idx[: n // 10]] = 0.0
    flat[idx[n // 10 : n // 10 + 3]] = -0.0
    tiny = 1e-40 if dtype == torch.float32 else 5e-39  # float32 / bfloat16 subnormals
    flat[idx[n // 5 : n // 5 + 4]] = tiny * np.array([1, -1, 3, -7])
    if kind == "nan":
        flat[idx[-1]] = np.nan
    elif kind == "nan_neg":
        flat[idx[-1]] = -np.nan
    elif kind == "inf":
        flat[idx[-1]] = np.inf
        flat[idx[-2]] = -np.inf
    elif kind == "zeros":
        flat[:] = 0.0
    elif kind == "tiny":
        flat[:] = flat * 1e-30
    elif kind == "rows":
        # row 0 a NaN, row 1 an Inf, row 2 all zero, row 3 subnormal only, row 4 huge
        flat = x.reshape(shape[0], -1)
        flat[0, 1] = np.nan
        flat[1, 2] = -np.inf
        flat[2, :] = 0.0
        flat[3, :] = tiny * rng.standard_normal(flat.shape[1])
        flat[4, :] *= 1e30
    return torch.tensor(x, dtype=torch.float64).to(dtype)


CASE_FIELDS = ("dtype", "fmt", "kind", "granularity", "axis", "power_2_scales", "given_scale")


def store(arrays, meta, n, x, scale, q, case):
    """Add quantize case ``n``: its bits under ``quant/<n>/`` and its description in meta."""
    key = f"quant/{n}"
    arrays[f"{key}/x"] = bits(x)
    arrays[f"{key}/scale"] = bits(scale)
    arrays[f"{key}/q"] = bits(q)
    meta["quant"].append({"key": key, **dict(zip(CASE_FIELDS, case, strict=True))})
    return n + 1


def record_quant(rng, arrays, meta):
    """torchao's scale and cast on generated tensors."""
    n = 0
    for hp_name, hp in HP.items():
        for fmt_name, fmt in FP8.items():
            for kind in ("plain", "nan", "nan_neg", "inf", "zeros", "tiny", "rows"):
                for gran, axis, pow2 in (
                    ("tensor", None, False),
                    ("tensor", None, True),
                    ("row", -1, True),
                    ("row", 0, True),
                ):
                    x = special_input(rng, (8, 24), hp, kind)
                    g = (
                        ScalingGranularity.TENSORWISE
                        if gran == "tensor"
                        else ScalingGranularity.AXISWISE
                    )
                    scale = tensor_to_scale(
                        x,
                        fmt,
                        scaling_granularity=g,
                        axiswise_dim=axis,
                        round_scales_to_power_of_2=pow2,
                    )
                    q = hp_tensor_and_scale_to_float8(
                        x, scale, fmt, None, GemmInputRole.INPUT, axis
                    )._data
                    case = (hp_name, fmt_name, kind, gran, axis, pow2, False)
                    n = store(arrays, meta, n, x, scale, q, case)
            # the delayed-style cast: a given scale, so that values overflow the format
            for kind in ("plain", "nan_neg", "inf"):
                for s in (1.0, 2.0**20, 0.37, 3.0e5):
                    x = special_input(rng, (8, 24), hp, kind)
                    scale = torch.tensor(s, dtype=torch.float32)
                    q = hp_tensor_and_scale_to_float8(x, scale, fmt)._data
                    case = (hp_name, fmt_name, kind, "tensor", None, False, True)
                    n = store(arrays, meta, n, x, scale, q, case)


def record_linear(arrays, meta):
    """One forward and backward of a converted two-layer model, per recipe and dtype."""
    n = 0
    for recipe in ("tensorwise", "rowwise"):
        for hp_name, hp in HP.items():
            for shape in ((2, 5, 32), (7, 32)):
                torch.manual_seed(1000 + n)
                model = torch.nn.Sequential(
                    torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 16)
                ).to(hp)
                params = {k: v.detach().clone() for k, v in model.state_dict().items()}
                config = dataclasses.replace(
                    Float8LinearConfig.from_recipe_name(recipe), emulate=True
                )
                convert_to_float8_training(model, config=config)
                x = (torch.randn(shape) * 3).to(hp).requires_grad_(True)
                y = model(x)
                grad_out = (torch.randn(y.shape) * 1e-3).to(hp)
                y.backward(grad_out)
                key = f"linear/{n}"
                for k, v in params.items():
                    arrays[f"{key}/param/{k}"] = bits(v)
                    arrays[f"{key}/grad/{k}"] = bits(dict(model.named_parameters())[k].grad)
                arrays[f"{key}/x"] = bits(x)
                arrays[f"{key}/grad_out"] = bits(grad_out)
                arrays[f"{key}/y"] = bits(y)
                arrays[f"{key}/grad_x"] = bits(x.grad)
                meta["linear"].append(
                    {
                        "key": key,
                        "recipe": recipe,
                        "dtype": hp_name,
                        "shape": list(shape),
                        "params": list(params),
                    }
                )
                n += 1


def main():
    rng = np.random.default_rng(2034)
    arrays = {}
    meta = {
        "peer": f"torchao {torchao.__version__}, torch {torch.__version__}",
        "quant": [],
        "linear": [],
    }
    record_quant(rng, arrays, meta)
    record_linear(arrays, meta)
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(OUT, **arrays)
    print(
        f"wrote {OUT}: {len(meta['quant'])} quantize cases, {len(meta['linear'])} linear cases,"
        f" {OUT.stat().st_size} bytes ({meta['peer']})"
    )


if __name__ == "__main__":
    main()
