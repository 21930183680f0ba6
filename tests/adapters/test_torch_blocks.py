"""Block-scaled quantize and dequantize of torch tensors (lscore.adapters.torch.quantize):
the same bytes and values as lscore.fp8's NumPy path, torch's dtypes for them, torchao
0.18.0's recorded outputs, strided and half-precision tensors read in place."""

import dataclasses
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

import lscore.fp8 as fp8
from lscore.adapters.torch import quantize as TQ

DATA = np.load(pathlib.Path(__file__).parents[1] / "core" / "data" / "torchao_mx.npz")


def generated(rows=64, cols=64, seed=35):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-30, 30, (rows, 1))).astype(
        np.float32
    )
    x[0] = 0.0
    x[1, 3] = np.nan
    x[2, 5] = -np.inf
    x[3, :] = 2.0**-140
    return x


@pytest.mark.parametrize(
    "name, elem",
    [
        ("ocp-mx", "e4m3fn"),
        ("ocp-mx", "e2m1"),
        ("te-mxfp8", "e5m2"),
        ("torchao-mx-floor", "e4m3fn"),
        ("torchao-mx-rceil", "e2m1"),
        ("nvfp4", "e2m1"),
    ],
)
@pytest.mark.parametrize("axis", [-1, 0])
def test_same_bytes_and_values_as_numpy(name, elem, axis):
    x = generated()
    t = fp8.quantize_blocks(x, name, axis=axis, element=elem)
    b = TQ.quantize_blocks(torch.from_numpy(x), name, axis=axis, element=elem)
    fp8_dtypes = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.uint8}
    scale_dtype = torch.float8_e4m3fn if name == "nvfp4" else torch.float8_e8m0fnu
    assert b.data.dtype == fp8_dtypes[elem] and b.scales.dtype == scale_dtype
    assert (b.element, b.axis, b.shape, b.recipe) == (t.element, t.axis, t.shape, t.recipe)
    np.testing.assert_array_equal(b.data.view(torch.uint8).numpy(), t.data.view(np.uint8))
    np.testing.assert_array_equal(b.scales.view(torch.uint8).numpy(), t.scales.view(np.uint8))
    assert (b.tensor_scale is None) == (t.tensor_scale is None)
    targets = (
        (torch.float32, np.float32),
        (torch.bfloat16, ml_dtypes.bfloat16),
        (torch.float16, np.float16),
    )
    for dtype, ndt in targets:
        y = TQ.dequantize_blocks(b, dtype)
        assert y.dtype == dtype and tuple(y.shape) == x.shape
        want = fp8.dequantize_blocks(t, ndt).astype(np.float32)
        np.testing.assert_array_equal(y.float().numpy(), want)


@pytest.mark.parametrize("mode", ["floor", "ceil", "even", "rceil"])
def test_torchao_presets_equal_torchao(mode):
    x = torch.from_numpy(DATA["bf16_mx_x"].view(np.int16).copy()).view(torch.bfloat16)
    b = TQ.quantize_blocks(x, f"torchao-mx-{mode}")
    np.testing.assert_array_equal(
        b.scales.view(torch.uint8).numpy(), DATA[f"bf16_e4m3fn_{mode}_scale"]
    )
    np.testing.assert_array_equal(
        b.data.view(torch.uint8).numpy(), DATA[f"bf16_e4m3fn_{mode}_data"]
    )
    y = TQ.dequantize_blocks(b, torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    want = DATA[f"bf16_e4m3fn_{mode}_deq_bf16"]
    nan = np.isnan(want.view(ml_dtypes.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(np.isnan(y.view(ml_dtypes.bfloat16).astype(np.float32)), nan)
    np.testing.assert_array_equal(y[~nan], want[~nan])


@pytest.mark.parametrize(
    "role, axis", [("input", -1), ("input", 0), ("weight", -1), ("grad", -1), ("grad", 0)]
)
def test_te_nvfp4_roles_as_numpy(role, axis):
    """TE's NVFP4 recipe (bfloat16: the Hadamard transform's input) takes role, seed and
    offset: the NumPy path's codes, amax and values."""
    x = generated().astype(ml_dtypes.bfloat16)
    x[~np.isfinite(x.astype(np.float32))] = 1.0
    t = fp8.quantize_blocks(x, "te-nvfp4", role=role, axis=axis, seed=3, offset=8)
    tx = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    b = TQ.quantize_blocks(tx, "te-nvfp4", role=role, axis=axis, seed=3, offset=8)
    assert b.data.dtype == torch.uint8 and b.scales.dtype == torch.float8_e4m3fn
    assert (b.axis, b.role, b.tiles, b.tensor_scale) == (t.axis, t.role, t.tiles, t.tensor_scale)
    np.testing.assert_array_equal(b.data.numpy(), t.data)
    np.testing.assert_array_equal(b.scales.view(torch.uint8).numpy(), t.scales.view(np.uint8))
    y = TQ.dequantize_blocks(b, torch.float32)
    np.testing.assert_array_equal(y.numpy(), fp8.dequantize_blocks(t))


def test_strided_and_half_tensors_read_in_place():
    x = torch.from_numpy(generated())
    want = TQ.quantize_blocks(x.contiguous(), "te-mxfp8")
    wide = torch.zeros(x.shape[0], 2 * x.shape[1])
    wide[:, ::2] = x
    got = TQ.quantize_blocks(wide[:, ::2], "te-mxfp8")
    assert torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))
    h = x.clamp(-6e4, 6e4).half()
    a = TQ.quantize_blocks(h, "te-mxfp8")
    w = TQ.quantize_blocks(h.float(), "te-mxfp8")
    assert torch.equal(a.data.view(torch.uint8), w.data.view(torch.uint8))
    assert torch.equal(a.scales.view(torch.uint8), w.scales.view(torch.uint8))


def test_bad_input():
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got ndarray"):
        TQ.quantize_blocks(np.zeros(32, np.float32), "te-mxfp8")
    with pytest.raises(TypeError, match=r"x must be float32, float16 or bfloat16, got torch.int32"):
        TQ.quantize_blocks(torch.zeros(32, dtype=torch.int32), "te-mxfp8")
    with pytest.raises(ValueError, match="multiple of the block 32"):
        TQ.quantize_blocks(torch.zeros(2, 40), "torchao-mx-floor")
    b = TQ.quantize_blocks(torch.zeros(2, 32), "te-mxfp8")
    with pytest.raises(TypeError, match=r"dtype must be torch.float32, float16 or bfloat16"):
        TQ.dequantize_blocks(b, torch.float64)
    with pytest.raises(TypeError, match=r"b.data must be a torch.Tensor, got ndarray"):
        TQ.dequantize_blocks(fp8.quantize_blocks(np.zeros((2, 32), np.float32), "te-mxfp8"))


@pytest.mark.parametrize("name", ["torchao-mx-rceil", "nvfp4"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_out_is_written_in_place(name, axis):
    x, y = generated(), generated(seed=36)
    out = TQ.quantize_blocks(torch.from_numpy(x), name, axis=axis)
    storage = (out.data.data_ptr(), out.scales.data_ptr())
    got = TQ.quantize_blocks(torch.from_numpy(y), name, axis=axis, out=out)
    want = TQ.quantize_blocks(torch.from_numpy(y), name, axis=axis)
    assert (got.data.data_ptr(), got.scales.data_ptr()) == storage
    assert torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))
    assert torch.equal(got.scales.view(torch.uint8), want.scales.view(torch.uint8))
    assert got.data.dtype == want.data.dtype and got.scales.dtype == want.scales.dtype
    if name == "nvfp4":  # NaN here (the input holds one), compared by its bits
        assert np.float32(got.tensor_scale).tobytes() == np.float32(want.tensor_scale).tobytes()
    else:
        assert got.tensor_scale is None


def test_out_refused_before_writing():
    x = torch.from_numpy(generated())
    out = TQ.quantize_blocks(x, "te-mxfp8")
    before = (out.data.view(torch.uint8).clone(), out.scales.view(torch.uint8).clone())
    y = torch.from_numpy(generated(seed=36))
    with pytest.raises(TypeError, match=r"out must be an lscore.fp8.BlockScaled, got dict"):
        TQ.quantize_blocks(y, "te-mxfp8", out={})
    with pytest.raises(ValueError, match=r"out must come from a call with the same recipe"):
        TQ.quantize_blocks(y, "ocp-mx", out=out)
    with pytest.raises(ValueError, match=r"out must come from a call with the same recipe"):
        TQ.quantize_blocks(y, "te-mxfp8", axis=0, out=out)
    bad = dataclasses.replace(out, data=out.data.t())
    with pytest.raises(ValueError, match=r"out.data must be a C-contiguous tensor"):
        TQ.quantize_blocks(y, "te-mxfp8", out=bad)
    with pytest.raises(TypeError, match=r"out.scales must be a torch.Tensor, got ndarray"):
        TQ.quantize_blocks(y, "te-mxfp8", out=dataclasses.replace(out, scales=np.zeros(2)))
    assert torch.equal(out.data.view(torch.uint8), before[0])
    assert torch.equal(out.scales.view(torch.uint8), before[1])


def test_cuda_tensors_need_the_cuda_block_kernels(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "lscore.cuda.mx", None)  # as a build without them
    with pytest.raises(TypeError, match=r"needs lscore.cuda.mx's kernels, which this build lacks"):
        TQ._require_cuda_blocks()


@pytest.mark.gpu
@pytest.mark.parametrize("name", fp8.BLOCK_RECIPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("axis", [-1, 0])
def test_cuda_tensors_give_the_cpu_tensors_bytes_and_values(name, dtype, axis):
    """A CUDA tensor of each dtype (bfloat16, which CuPy cannot hold, included) read in
    place by the block kernels: the CPU tensor's codes, and its values back in each dtype."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = torch.from_numpy(generated(64, 64)).to(dtype)
    r = fp8.recipe(name)
    if r.mode == "te-nvfp4" and dtype != torch.bfloat16:  # TE transforms bfloat16 only
        r = fp8.recipe(name, disable_rht=True)
    ref = TQ.quantize_blocks(x, r, axis=axis)
    got = TQ.quantize_blocks(x.cuda(), r, axis=axis)
    assert got.data.device.type == got.scales.device.type == "cuda"
    assert (got.data.dtype, got.scales.dtype) == (ref.data.dtype, ref.scales.dtype)
    assert torch.equal(got.data.cpu().view(torch.uint8), ref.data.view(torch.uint8))
    assert torch.equal(got.scales.cpu().view(torch.uint8), ref.scales.view(torch.uint8))
    assert (got.tensor_scale is None) == (ref.tensor_scale is None)
    if ref.tensor_scale is not None:  # NaN here (the input holds one), compared by its bits
        assert np.float32(got.tensor_scale).tobytes() == np.float32(ref.tensor_scale).tobytes()
    for out in (torch.float32, torch.float16, torch.bfloat16):
        y = TQ.dequantize_blocks(got, out)
        assert y.device.type == "cuda" and y.dtype == out
        want = TQ.dequantize_blocks(ref, out)  # a NaN compared by value: its payload may differ
        torch.testing.assert_close(y.cpu(), want, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match=r"b.scales must be on b.data's device cuda"):
        TQ.dequantize_blocks(dataclasses.replace(got, scales=got.scales.cpu()))


@pytest.mark.gpu
@pytest.mark.parametrize("role,axis", [("input", 0), ("grad", -1), ("grad", 0), ("weight", -1)])
def test_block_stats_of_device_arrays_equal_the_host_ones(role, axis):
    """A CUDA tensor and a CuPy array count as their host copies (te-nvfp4, every role)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = torch.from_numpy(generated(64, 64)).to(torch.bfloat16)
    kw = dict(role=role, axis=axis, seed=5, offset=2)
    want = TQ.block_stats(x, "te-nvfp4", **kw)
    assert TQ.block_stats(x.cuda(), "te-nvfp4", **kw) == want
    cupy = pytest.importorskip("cupy")
    f = torch.from_numpy(generated(64, 64))
    assert fp8.block_stats(cupy.asarray(f.numpy()), "te-mxfp8") == fp8.block_stats(
        f.numpy(), "te-mxfp8"
    )
