"""lscore.adapters.torch.quantize on CPU tensors against torchao's rule written in torch ops
(torchao/float8 v0.18.0: ``to_fp8_saturated(x.float() * scale)``, ``torch.max(|x|)``,
``torch.amax(|x|, -1, keepdim=True)``, ``data.to(float32) / scale``), bitwise; NaN
compared by value where the rules differ (TransformerEngine's 0x7F)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.fp8_inputs import float8_input
from lscore.adapters.torch import quantize as TQ

FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def torch_quantize(x, scale, fmt):
    """torchao's to_fp8_saturated(x.float() * scale)."""
    dt = FP8[fmt]
    m = torch.finfo(dt).max
    return (x.float() * scale).clamp(-m, m).to(dt)


def inputs(seed, shape, dtype, how):
    """helpers.fp8_inputs' input as a torch tensor of `dtype`."""
    return float8_input(seed, shape, str(dtype).removeprefix("torch."), how, torch=True)


def same_bytes(q, want):
    """The same float8 bytes, a NaN compared by value: torch's CPU float16 -> float32
    conversion drops a NaN's sign in its scalar loop (the tail of a vectorised run) and
    keeps it in the vector one, so torch's own sign of a NaN depends on its position."""
    assert q.dtype == want.dtype
    got, ref = q.view(torch.uint8).numpy(), want.view(torch.uint8).numpy()
    nan = q.float().isnan().numpy()
    np.testing.assert_array_equal(nan, want.float().isnan().numpy())
    np.testing.assert_array_equal(got[~nan], ref[~nan])


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    shape=st.sampled_from([(7,), (3, 5), (2, 3, 4), (1, 33)]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    how=st.sampled_from(["contiguous", "step", "transpose"]),
    fmt=st.sampled_from(["e4m3fn", "e5m2"]),
    scale=st.sampled_from([1.0, 3.0, 0.125, 1 / 3, 2.0**-20, 2.0**30]),
)
def test_quantize_equals_torchao_ops(seed, shape, dtype, how, fmt, scale):
    x = inputs(seed, shape, dtype, how)
    s = torch.tensor(scale, dtype=torch.float32)
    q, a = TQ.quantize(x, s, fmt, amax_nan="propagate")
    same_bytes(q, torch_quantize(x, s, fmt))
    want = torch.max(x.abs()).float()
    assert a.dtype == torch.float32 and a.shape == ()
    assert torch.equal(a, want) or (a.isnan() and want.isnan())
    # the NaN-ignoring amax is TransformerEngine's
    mags = x.float().abs()
    assert torch.equal(TQ.amax(x), torch.where(mags.isnan(), 0.0, mags).max())
    # row-wise: one scale per row, keepdim amaxes
    rows = (
        torch.arange(1, 1 + x.shape[:-1].numel(), dtype=torch.float32).reshape((*x.shape[:-1], 1))
        * scale
    )
    q, a = TQ.quantize(x, rows, fmt, axis=-1, amax_nan="propagate")
    same_bytes(q, torch_quantize(x, rows, fmt))
    want = torch.amax(x.abs(), -1, keepdim=True).float()
    assert a.shape == want.shape
    np.testing.assert_array_equal(a.numpy(), want.numpy())
    # dequantize: float32(q) / scale, one rounding to the dtype
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        d = TQ.dequantize(q, rows, dt, axis=-1)
        w = (q.float() / rows).to(dt)
        np.testing.assert_array_equal(d.float().numpy(), w.float().numpy())
    d = TQ.dequantize(q, s)
    np.testing.assert_array_equal(d.numpy(), (q.float() / s).numpy())


def test_te_nan_word_and_unsaturated_e5m2():
    x = torch.tensor([float("-nan"), 1e6, -float("inf"), 2.0])
    q, a = TQ.quantize(x, 1.0, "e5m2", nan_sign=False, saturate=False)
    assert q.view(torch.uint8).tolist() == [0x7F, 0x7C, 0xFC, 0x40]
    assert a.item() == float("inf")
    same_bytes(TQ.quantize(x, 1.0, "e5m2", saturate=False)[0], x.to(torch.float8_e5m2))


def test_out_is_written_in_place():
    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    out = torch.zeros(3, 4, dtype=torch.uint8)
    q, _ = TQ.quantize(x, 4.0, out=out)
    assert q is out
    same_bytes(out.view(torch.float8_e4m3fn), torch_quantize(x, 4.0, "e4m3fn"))
    assert TQ.dequantize(out, 4.0, fmt="e4m3fn").allclose(x, atol=0.07)


def test_grad_requiring_input_is_read():
    x = torch.randn(8, requires_grad=True)
    q, _ = TQ.quantize(x, 2.0)
    same_bytes(q, torch_quantize(x.detach(), 2.0, "e4m3fn"))


@pytest.mark.parametrize(
    ("kw", "exc", "msg"),
    [
        (dict(x=torch.ones(3, dtype=torch.float64), scale=1.0), TypeError, "float32, float16"),
        (dict(x=torch.ones(3, dtype=torch.int32), scale=1.0), TypeError, "float32, float16"),
        (dict(x=np.ones(3, np.float32), scale=1.0), TypeError, "must be a torch.Tensor"),
        (dict(x=torch.ones(3), scale=1.0, fmt="e3m4"), ValueError, "fmt must be one of"),
        (dict(x=torch.ones(3), scale=torch.tensor(0.0)), ValueError, "positive finite float32"),
        (dict(x=torch.ones(3), scale=torch.tensor(1)), ValueError, "positive finite float32"),
        (dict(x=torch.ones(3), scale=float("nan")), ValueError, "positive finite float32"),
        (dict(x=torch.ones(2, 3), scale=torch.ones(3, 1), axis=-1), ValueError, "per row"),
        (
            dict(x=torch.ones(2, 3), scale=1.0, out=torch.zeros(3, 2, dtype=torch.uint8)),
            ValueError,
            "input's shape",
        ),
        (
            dict(x=torch.ones(2, 3), scale=1.0, out=torch.zeros(2, 3, dtype=torch.float8_e5m2)),
            TypeError,
            "out must be uint8 or torch.float8_e4m3fn",
        ),
        (
            dict(x=torch.ones(2, 3), scale=1.0, out=torch.zeros(3, 2, dtype=torch.uint8).T),
            ValueError,
            "C-contiguous",
        ),
    ],
)
def test_bad_input(kw, exc, msg):
    out = kw.pop("out", torch.full(tuple(kw["x"].shape), 0xAA, dtype=torch.uint8))
    before = out.clone()
    with pytest.raises(exc, match=msg):
        TQ.quantize(**kw, out=out)
    assert torch.equal(out, before)


def test_dequantize_bad_input():
    q = torch.zeros(2, 3, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="fmt must name the format"):
        TQ.dequantize(q.view(torch.uint8), 1.0)
    with pytest.raises(TypeError, match="q must be float8_e4m3fn"):
        TQ.dequantize(torch.zeros(3), 1.0)
    with pytest.raises(TypeError, match=r"dtype must be torch\.float32"):
        TQ.dequantize(q, 1.0, torch.float64)


# ---- quantize_current against torchao's recipe in torch ops -----------------------------------


def torchao_current(x, fmt, rowwise, pow2):
    """torchao/float8 v0.18.0 in torch ops: tensor_to_amax (torch.max / torch.amax keepdim),
    amax_to_scale (float64 division by the amax clamped to EPS 1e-12, float32; rowwise:
    exp2(floor(log2(s)))), then to_fp8_saturated(x.float() * scale)."""
    dt = FP8[fmt]
    a = torch.amax(x.abs(), -1, keepdim=True) if rowwise else torch.max(x.abs())
    a = a.float()
    scale = (torch.finfo(dt).max / torch.clamp(a.double(), min=1e-12)).float()
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return torch_quantize(x, scale, fmt), scale, a


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    shape=st.sampled_from([(7,), (3, 5), (2, 3, 4)]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    how=st.sampled_from(["contiguous", "step", "transpose"]),
    name=st.sampled_from(["torchao-tensorwise", "torchao-rowwise"]),
    fmt=st.sampled_from([None, "e5m2"]),
    clean=st.booleans(),
)
def test_quantize_current_equals_torchao(seed, shape, dtype, how, name, fmt, clean):
    import lscore.fp8

    x = inputs(seed, shape, dtype, how)
    if clean:  # no NaN or Inf: the scales are finite and the bytes are numbers
        x = torch.where(x.isfinite(), x, torch.zeros((), dtype=dtype))
    r = lscore.fp8.recipe(name)
    got = TQ.quantize_current(x, r, fmt)
    f = fmt or r.forward_format
    q, scale, a = torchao_current(x, f, r.granularity == "row", r.power_2_scales)
    assert got.fmt == f and got.scale.shape == scale.shape
    # the scale's float32 bits; a NaN scale (a NaN amax) by value
    nan = scale.isnan()
    np.testing.assert_array_equal(got.scale.isnan().numpy(), nan.numpy())
    np.testing.assert_array_equal(
        got.scale[~nan].view(torch.int32).numpy(), scale[~nan].view(torch.int32).numpy()
    )
    np.testing.assert_array_equal(got.amax.numpy(), a.numpy())
    # bytes, NaN by value (a NaN scale makes every code NaN; the sign follows the product)
    gq, wq = got.data.float(), q.float()
    np.testing.assert_array_equal(gq.isnan().numpy(), wq.isnan().numpy())
    np.testing.assert_array_equal(gq[~gq.isnan()].numpy(), wq[~wq.isnan()].numpy())
    if clean:
        same_bytes(got.data, q)
    np.testing.assert_array_equal(
        got.scale_inv.numpy(), (torch.ones((), dtype=torch.float32) / scale).numpy()
    )


def test_quantize_current_te_rule():
    """TE's current scaling: NaN elements do not enter the amax, an Inf amax gives scale 1,
    NaN is 0x7F whatever its sign, e5m2 saturates."""
    import lscore.fp8

    x = torch.tensor([-float("nan"), 3.0, -1e6, 0.5])
    r = lscore.fp8.recipe("te-current")
    got = TQ.quantize_current(x, r, "e5m2")
    assert got.amax.item() == 1e6
    assert got.scale.item() == np.float32(57344 / np.float32(1e6))
    assert got.data.view(torch.uint8)[0].item() == 0x7F and got.data.view(torch.uint8)[2] == 0xFB
    inf = TQ.quantize_current(torch.tensor([float("inf"), 2.0]), r)
    assert inf.scale.item() == 1.0 and inf.data.view(torch.uint8).tolist() == [0x7E, 0x40]
    with pytest.raises(TypeError, match=r"recipe must be an lscore\.fp8\.Recipe"):
        TQ.quantize_current(x, "te-current")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("how", ["contiguous", "step", "transpose"])
@pytest.mark.parametrize("per_row", [False, True], ids=["tensor", "row"])
def test_cuda_tensors_give_the_cpu_codes_and_amax(dtype, how, per_row):
    """fp8.cu on the device against the CPU kernels, per tensor and per row: contiguous
    tensors of every length (the 16-byte path and its tail of 0..7 elements), a tensor one
    element past an aligned address (the element path), strided views; each format with
    TE's and torch's saturation and NaN rules, the amax ignoring or propagating NaN."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    shapes = [(3, 5), (2, 8), (64, 77), (5, 4096)] if how != "contiguous" else []
    tensors = [inputs(1, s, dtype, how) for s in shapes]
    if how == "contiguous":
        flat = inputs(2, (1, 40000), dtype, how).reshape(-1)
        tensors += [flat[:n] for n in (1, 7, 8, 9, 4096, 4103, 40000)] + [flat[1:4097]]
        tensors += [inputs(3, (64, 77), dtype, how), inputs(4, (7, 2048), dtype, how)]
    axis = -1 if per_row else None
    for x in tensors:
        if per_row and x.dim() < 2:
            x = x.reshape(1, -1)
        xc = x.cuda()
        for nan in ("ignore", "propagate"):
            torch.testing.assert_close(
                TQ.amax(xc, axis, nan).cpu(),
                TQ.amax(x, axis, nan),
                rtol=0,
                atol=0,
                equal_nan=True,
            )
        rows = x.reshape(-1, x.shape[-1]).shape[0] if per_row else 1
        scale = (torch.arange(rows, dtype=torch.float32) % 3 + 1) * 0.375
        scale = scale.reshape(-1, 1) if per_row else scale.reshape(())
        for fmt, saturate, nan_sign, amax_nan in (
            ("e4m3fn", True, True, "ignore"),
            ("e5m2", False, False, "propagate"),
            ("e5m2", True, True, "propagate"),
        ):
            kw = dict(axis=axis, saturate=saturate, nan_sign=nan_sign, amax_nan=amax_nan)
            q, a = TQ.quantize(xc, scale.cuda(), fmt, **kw)
            want_q, want_a = TQ.quantize(x, scale, fmt, **kw)
            assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8)), (x.shape, fmt)
            torch.testing.assert_close(a.cpu(), want_a, rtol=0, atol=0, equal_nan=True)
