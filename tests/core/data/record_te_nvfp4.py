"""Record TransformerEngine v2.18's pure-PyTorch NVFP4 reference into tests/core/data/te_nvfp4.npz.

TE's reference quantizer, transformer_engine/pytorch/custom_recipes/quantization_ref_nvfp4.py
at tag v2.18 (commit 27486e03cfc1fa41f6932dcecdc47c71c47eac3e), imports only torch and
three TE modules: custom_recipes/utils.py and custom_recipes/quantization.py (torch only,
loaded from the checkout as they are) and pytorch/quantized_tensor.py, whose two base
classes (Quantizer, QuantizedTensorStorage) this script replaces by stand-ins holding what
the reference reads (rowwise_usage, columnwise_usage); nothing of TE's compiled library is
loaded.  Run in a throwaway virtualenv (torch is never a dependency of lscore's core):
    git clone --depth 1 --branch v2.18 https://github.com/NVIDIA/TransformerEngine /tmp/te
    python3.11 -m venv /tmp/te-venv && /tmp/te-venv/bin/pip install torch==2.13.0 numpy
    /tmp/te-venv/bin/python tests/core/data/record_te_nvfp4.py /tmp/te
Recorded with NVFP4QuantizerRef(dtype=E2M1, rowwise=True, columnwise=True, pow_2_scales=False)
on the CPU, for each input: the 1 x 16 quantizer (with_rht=False), the 16 x 16 one (weights),
and the 1 x 16 one with the Hadamard transform and TE's sign vector (with_rht=True,
with_random_sign_mask=True; bfloat16 inputs only, as TE's kernels take): its data, scale,
data_t, scale_t (E4M3 and E2M1 bytes), global_amax_row and global_amax_col.  Inputs are
float32 and bfloat16 (64, 128) tensors of random normal values times per-row powers of two
(2**-30 .. 2**30), with all-zero rows, ties of the E2M1 grid, the same with +-Inf (the
tensor amax Inf), and an all-zero tensor;
no NaN and no -0.0, where the reference's amax (torch.max: NaN) and cast_to_fp4x2 (NaN and
-0.0 -> code 0) differ from TE's kernels (NaN left out of the amax; cvt.rn.satfinite: NaN
-> 0x7, -0.0 -> 0x8): the reference's cast of those is recorded too (ref_cast_*).  Inputs
are stored as their bits (uint32 / uint16).
"""

import pathlib
import sys
import types

import numpy as np
import torch

OUT = pathlib.Path(__file__).with_name("te_nvfp4.npz")
SEED = 4718
TE_COMMIT = "27486e03cfc1fa41f6932dcecdc47c71c47eac3e"


def load_reference(te: pathlib.Path) -> types.ModuleType:
    """quantization_ref_nvfp4 from a TE checkout, with quantized_tensor's base classes
    stood in (the rest of TE is never imported)."""
    recipes = te / "transformer_engine" / "pytorch" / "custom_recipes"
    qt = types.ModuleType("transformer_engine.pytorch.quantized_tensor")

    class QuantizedTensorStorage:  # the reference's NVFP4TensorRef dataclass derives from it
        pass

    class Quantizer:  # quantized_tensor.py:254-258, what the reference reads of it
        def __init__(self, *, rowwise: bool, columnwise: bool) -> None:
            self.rowwise_usage = rowwise
            self.columnwise_usage = columnwise
            self.internal = False

    qt.QuantizedTensorStorage = QuantizedTensorStorage
    qt.Quantizer = Quantizer
    for name, path in (
        ("transformer_engine", te / "transformer_engine"),
        ("transformer_engine.pytorch", te / "transformer_engine" / "pytorch"),
        ("transformer_engine.pytorch.custom_recipes", recipes),
    ):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(path)]  # a package whose __init__ is not run
        sys.modules[name] = pkg
    sys.modules[qt.__name__] = qt
    import importlib

    return importlib.import_module(
        "transformer_engine.pytorch.custom_recipes.quantization_ref_nvfp4"
    )


def inputs(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((64, 128)) * 2.0 ** rng.integers(-30, 31, (64, 1))
    x[3] = 0.0  # an all-zero row: zero blocks
    x[10, 5], x[11, 40] = np.inf, -np.inf  # Inf: the tensor amax, the block scale 448
    # ties of the grid (0.25, 0.75, ..., 5) once a block's max is 6 (scale 1 at amax 6)
    x[20, :16] = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -5, 0.1, 4.9, 3, -2, 1, 0.5]
    x = x.astype(np.float32)
    x[x == 0] = 0.0  # no -0.0
    return x


def record(ref: types.ModuleType, name: str, x: torch.Tensor, out: dict) -> None:
    e2m1 = ref.utils.Fp4Formats.E2M1
    kinds = {"1x16": ((1, 16), False), "16x16": ((16, 16), False)}
    if x.dtype == torch.bfloat16:
        kinds["rht"] = ((1, 16), True)
    for kind, (tile, rht) in kinds.items():
        q = ref.NVFP4QuantizerRef(
            dtype=e2m1, rowwise=True, columnwise=True, quant_tile_shape=tile, with_rht=rht
        )
        t = q.quantize(x)
        key = f"{name}_{kind}"
        for field in ("data", "scale", "data_t", "scale_t"):
            out[f"{key}_{field}"] = getattr(t, field).contiguous().view(torch.uint8).numpy().copy()
        for field in ("global_amax_row", "global_amax_col"):
            out[f"{key}_{field}"] = getattr(t, field).numpy().astype(np.float32).view(np.uint32)


def main() -> None:
    te = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/te")
    ref = load_reference(te)
    rng = np.random.default_rng(SEED)
    out: dict[str, np.ndarray] = {}
    x = inputs(rng)
    finite = np.where(np.isinf(x), np.float32(3.0), x)  # a finite tensor amax
    for name, dtype, v in (
        ("f32", torch.float32, finite),
        ("bf16", torch.bfloat16, finite),
        ("f32inf", torch.float32, x),
        ("bf16inf", torch.bfloat16, x),
    ):
        t = torch.from_numpy(v).to(dtype)
        word = torch.int32 if dtype == torch.float32 else torch.int16
        out[f"{name}_x"] = t.view(word).numpy().copy()
        record(ref, name, t, out)
    zeros = torch.zeros(32, 64, dtype=torch.bfloat16)
    out["zero_x"] = zeros.view(torch.int16).numpy().copy()
    record(ref, "zero", zeros, out)
    # the reference's cast of what it casts otherwise than TE's kernels: NaN and -0.0
    specials = torch.tensor([[float("nan"), -0.0, -float("nan"), 0.0]])
    out["ref_cast_x"] = specials.view(torch.int32).numpy().copy()
    out["ref_cast_codes"] = ref.cast_to_fp4x2(specials).numpy().copy()
    out["versions"] = np.array([f"torch {torch.__version__}", f"TE {TE_COMMIT}"])
    np.savez_compressed(OUT, **out)
    for k, v in out.items():
        print(f"{k}: {v.dtype} {v.shape}")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
