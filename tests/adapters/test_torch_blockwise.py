"""The torch adapter under the blockwise FP8 presets: quantize_blocks / dequantize_blocks of
CPU tensors by role (float32 scales as a float32 tensor, weight tiles, out=), and MXLinear's
three GEMMs on operands quantized as TransformerEngine's blockwise recipe quantizes them (the
input and the output gradient in 1x128 blocks along each GEMM's reduction dimension, the
weight in 128x128 tiles)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

import lscore.fp8
from lscore.adapters.torch import quantize as TQ
from lscore.adapters.torch.mx import MXLinear


def _bits(t):
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("role", ["input", "grad", "weight"])
def test_tensors_equal_the_numpy_path(dtype, role):
    torch.manual_seed(1)
    x = (torch.randn(256, 384) * 3).to(dtype)
    x[3, 5] = float("nan")
    r = lscore.fp8.recipe("te-blockwise", fp8_format="HYBRID")
    b = TQ.quantize_blocks(x, r, role=role)
    a = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if dtype == torch.bfloat16 else x
    want = lscore.fp8.quantize_blocks(np.asarray(a), r, role=role)
    assert b.scales.dtype == torch.float32 and b.tiles == want.tiles and b.role == role
    assert b.data.dtype == (torch.float8_e5m2 if role == "grad" else torch.float8_e4m3fn)
    np.testing.assert_array_equal(b.scales.numpy(), want.scales)
    np.testing.assert_array_equal(b.data.view(torch.uint8).numpy(), want.data.view(np.uint8))
    y = TQ.dequantize_blocks(b, dtype)
    w = lscore.fp8.dequantize_blocks(
        want, ml_dtypes.bfloat16 if dtype == torch.bfloat16 else np.float32
    )
    np.testing.assert_array_equal(
        _bits(y).numpy(), w.view(np.int16 if y.element_size() == 2 else np.int32)
    )
    out = TQ.quantize_blocks(-x, r, role=role)
    got = TQ.quantize_blocks(x, r, role=role, out=out)
    assert got.scales is out.scales and torch.equal(got.scales, b.scales)
    assert torch.equal(got.data.view(torch.uint8), b.data.view(torch.uint8))


def _qdq(t, r, role):
    """t quantized by lscore.fp8 (NumPy) as a tensor of `role` and read back, float32."""
    b = lscore.fp8.quantize_blocks(t.detach().float().contiguous().numpy(), r, role=role)
    return torch.from_numpy(lscore.fp8.dequantize_blocks(b))


def test_linear_multiplies_operands_quantized_by_role():
    torch.manual_seed(2)
    r = lscore.fp8.recipe("te-blockwise", fp8_format="HYBRID")
    linear = torch.nn.Linear(256, 128)
    layer = MXLinear.from_linear(linear, r)
    x = torch.randn(128, 256, requires_grad=True)
    g = torch.randn(128, 128) * 1e-2
    y = layer(x)
    y.backward(g)
    w, xd = linear.weight.detach(), x.detach()
    want_y = torch.mm(_qdq(xd, r, "input"), _qdq(w, r, "weight").t()) + linear.bias.detach()
    want_gx = torch.mm(_qdq(g, r, "grad"), _qdq(w.t(), r, "weight").t())
    want_gw = torch.mm(_qdq(g.t(), r, "grad"), _qdq(xd.t(), r, "input").t())
    assert torch.equal(y, want_y)
    assert torch.equal(x.grad, want_gx)
    assert torch.equal(linear.weight.grad, want_gw)
    # the weight's tiles: one scale per 128x128, as the same weight transposed has them
    wt = TQ.quantize_blocks(w, r, role="weight")
    assert wt.scales.shape == (1, 2)
    assert torch.equal(
        TQ.quantize_blocks(w.t().contiguous(), r, role="weight").scales, wt.scales.t()
    )
