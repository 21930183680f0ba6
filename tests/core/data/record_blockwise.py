"""Record blockwise FP8 and 32x32 MXFP8 reference vectors into tests/core/data/.

Run in a throwaway virtualenv (torch and torchao are never dependencies of lscore's core):
    python3.11 -m venv /tmp/ao-venv
    /tmp/ao-venv/bin/pip install torch==2.13.0 numpy ml_dtypes torchao==0.18.0
    /tmp/ao-venv/bin/python tests/core/data/record_blockwise.py [--te-references DIR]

torchao_blockwise.npz, every byte from torchao 0.18.0's own functions on the CPU:
- its blockwise FP8 training prototype's torch reference quantizers
  (torchao/prototype/blockwise_fp8_training/kernels.py: torch_blockwise_scale_act_quant_lhs
  (1x128), torch_blockwise_scale_act_quant_rhs (128x1), torch_blockwise_scale_weight_quant
  (128x128)), the rule its Triton kernels implement.  That module imports triton at its
  top, which has no CPU build here, so the three functions (and EPS, FP8_E4M3_DTYPES) are
  read from the installed kernels.py's syntax tree and run as written;
- the reference of its 32x32 MXFP8 weight scales,
  torchao/prototype/moe_training/kernels/mxfp8/quant.py _mxfp8_quantize_reference_3d
  (scale_block_dim2=32, logical scales), in the RCEIL, FLOOR, CEIL and EVEN modes.
te_blockwise.npz (with --te-references): TransformerEngine v2.18's pure-PyTorch reference
quantizer, tests/pytorch/references/blockwise_quantizer_reference.py and
quantize_scale_calc.py at tag v2.18 (DIR holds those two files in a folder `references`;
they are run from there, never copied into lscore), 1x128 with its columnwise copy and
128x128, E4M3 and E5M2, power-of-two and float32 scales, and its dequantize (to the
input's dtype), on finite
inputs only: that reference takes a NaN into the amax (torch.amax) and gives an Inf amax
scale 0, where TE's kernels (which lscore follows) skip NaN and give scale 1; those cases
are lscore's hand-derived tests (tests/core/test_blockwise_vectors.py).
Inputs are stored as their bits (uint32 / uint16) so NaNs survive; codes as bytes, float32
scales as their bits.
"""

import argparse
import ast
import importlib.util
import pathlib
import sys
import types

import numpy as np
import torch
import torchao

HERE = pathlib.Path(__file__).parent
SEED = 4747
E4M3 = torch.float8_e4m3fn
TORCH_IN = {"f32": torch.float32, "bf16": torch.bfloat16}


def ao_reference():
    """torchao 0.18.0's torch_blockwise_* functions, run from its installed source."""
    path = pathlib.Path(importlib.util.find_spec("torchao").origin).parent
    path = path / "prototype" / "blockwise_fp8_training" / "kernels.py"
    want = {
        "torch_blockwise_scale_act_quant_lhs",
        "torch_blockwise_scale_act_quant_rhs",
        "torch_blockwise_scale_weight_quant",
        "EPS",
        "FP8_E4M3_DTYPES",
    }
    ns = {"torch": torch, "Tuple": tuple, "e4m3_dtype": E4M3}
    for node in ast.parse(path.read_text()).body:
        names = {getattr(node, "name", None)} | {
            t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)
        }
        if names & want:
            exec(compile(ast.Module([node], []), str(path), "exec"), ns)
    assert want <= set(ns), sorted(want - set(ns))
    return ns


def blocks(rng, n, size, specials=True):
    """n blocks of `size` float32 values (rows): random magnitudes over a wide range; maxima
    at fp8_max * 2**k and a float32 ulp beside it (where a scale rounds onto or off a power
    of two); all zeros; amaxes below torchao's EPS and below TE's overflowing quotient;
    subnormals; with `specials` also a NaN, +Inf and -Inf among ordinary values."""
    out = []
    for i in range(n):
        v = rng.standard_normal(size) * 2.0 ** rng.integers(-20, 20)
        kind = i % 12
        if kind == 1:
            k = int(rng.integers(-60, 60))
            top = np.float32(448 * 2.0**k)
            v = v / np.abs(v).max() * top * 0.9
            v[rng.integers(size)] = np.nextafter(top, np.float32(rng.choice([0, np.inf])))
        elif kind == 2:
            v[:] = 0
        elif kind == 3:
            v = v / np.abs(v).max() * 3e-13  # below torchao's EPS = 1e-12
        elif kind == 4:
            v = v / np.abs(v).max() * 1e-38  # TE: 448 / amax overflows float32
        elif kind == 5:
            v = rng.uniform(-1, 1, size) * 1e-40  # subnormal float32
        elif kind == 6:
            v[rng.integers(size)] = 3.0  # a worked example's amax
        elif kind == 7 and specials:
            v[rng.integers(size)] = np.nan
        elif kind == 8 and specials:
            v[rng.integers(size)] = np.inf
        elif kind == 9 and specials:
            v[rng.integers(size)] = -np.inf
        out.append(v)
    return np.array(out).astype(np.float32)


def tensor(x32, dtype):
    return torch.from_numpy(np.ascontiguousarray(x32)).to(TORCH_IN[dtype])


def in_bits(t):
    if t.dtype == torch.float32:
        return t.contiguous().view(torch.int32).numpy().view(np.uint32).copy()
    return t.contiguous().view(torch.int16).numpy().view(np.uint16).copy()


def codes(t):
    return t.contiguous().view(torch.uint8).numpy().copy()


def f32_bits(t):
    return t.to(torch.float32).contiguous().view(torch.int32).numpy().view(np.uint32).copy()


def record_torchao(out):
    ao = ao_reference()
    rng = np.random.default_rng(SEED)
    rows = blocks(rng, 96, 256)  # 1x128: two blocks a row
    cols = blocks(rng, 128, 256).T.copy()  # 128x1: blocks down the columns
    tiles = np.zeros((512, 384), np.float32)  # 128x128: a tile of each kind
    for k, blk in enumerate(blocks(rng, 12, 128 * 128)):
        r, c = divmod(k, 3)
        tiles[128 * r : 128 * r + 128, 128 * c : 128 * c + 128] = blk.reshape(128, 128)
    for dtype in TORCH_IN:
        for name, x32, fn in (
            ("lhs", rows, "torch_blockwise_scale_act_quant_lhs"),
            ("rhs", cols, "torch_blockwise_scale_act_quant_rhs"),
            ("weight", tiles, "torch_blockwise_scale_weight_quant"),
        ):
            x = tensor(x32, dtype)
            y, s = ao[fn](x, 128, E4M3)
            out[f"{dtype}_{name}_x"] = in_bits(x)
            out[f"{dtype}_{name}_data"] = codes(y)
            out[f"{dtype}_{name}_scale_inv"] = f32_bits(s)
    # 32x32 MXFP8 weights: the reference of mxfp8_quantize_cuda_3d(scale_block_dim2=32)
    from torchao.prototype.moe_training.kernels.mxfp8 import quant

    w = blocks(rng, 2 * 96, 64).reshape(2, 96, 64)
    for dtype in TORCH_IN:
        x = tensor(w, dtype)
        out[f"{dtype}_mx32_x"] = in_bits(x)
        for mode in ("rceil", "floor", "ceil", "even"):
            q, s = quant._mxfp8_quantize_reference_3d(
                x,
                block_size=32,
                scale_block_dim1=32,
                scale_block_dim2=32,
                scaling_mode=mode,
                blocked_scale_output=False,
            )
            out[f"{dtype}_mx32_{mode}_data"] = codes(q)
            out[f"{dtype}_mx32_{mode}_scale"] = codes(s)
    out["versions"] = np.array([f"torch {torch.__version__}", f"torchao {torchao.__version__}"])


def record_te(out, references):
    # TE's tests/pytorch/references as the package "references", without editing sys.path
    pkg = types.ModuleType("references")
    pkg.__path__ = [str(pathlib.Path(references) / "references")]
    sys.modules["references"] = pkg
    ref = importlib.import_module("references.blockwise_quantizer_reference")
    BlockwiseQuantizerReference = ref.BlockwiseQuantizerReference

    te = BlockwiseQuantizerReference()
    rng = np.random.default_rng(SEED + 1)
    shapes = {"whole": (256, 256), "ragged": (136, 200)}
    elems = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    for sname, (m, k) in shapes.items():
        x32 = blocks(rng, m, k, specials=False)
        for dtype in TORCH_IN:
            x = tensor(x32, dtype)
            out[f"{sname}_{dtype}_x"] = in_bits(x)
            for ename, qdt in elems.items():
                for pow2 in (True, False):
                    for tile in ((1, 128), (128, 128)):
                        r = te.quantize(
                            x,
                            qdt,
                            return_transpose=True,
                            eps=0.0,
                            pow_2_scales=pow2,
                            quant_tile_shape=tile,
                            munge_scale_shapes=False,
                        )
                        key = f"{sname}_{dtype}_{ename}_{'pow2' if pow2 else 'fp32'}_{tile[0]}"
                        out[f"{key}_data"] = codes(r.data)
                        out[f"{key}_scale_inv"] = f32_bits(r.scale)
                        out[f"{key}_data_t"] = codes(r.data_t)
                        out[f"{key}_scale_inv_t"] = f32_bits(r.scale_t)
                        if ename == "e4m3" and pow2 == (dtype == "bf16"):
                            munged = te.scale_munger.munge_scale_shapes_for_backend(r, tile)
                            y = te.ref_dequantize_rowwise(r.data, tile, munged.scale, x.dtype)
                            out[f"{key}_deq"] = in_bits(y)
    out["versions"] = np.array([f"torch {torch.__version__}", "TransformerEngine v2.18"])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--te-references",
        type=pathlib.Path,
        help="a folder holding TE v2.18's tests/pytorch/references (as `references/`)",
    )
    args = p.parse_args()
    torch.manual_seed(0)
    ao = {}
    record_torchao(ao)
    np.savez_compressed(HERE / "torchao_blockwise.npz", **ao)
    if args.te_references is not None:
        te = {}
        record_te(te, args.te_references)
        np.savez_compressed(HERE / "te_blockwise.npz", **te)


if __name__ == "__main__":
    main()
