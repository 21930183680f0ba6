"""lscore.fp8.block_stats under TransformerEngine's NVFP4 recipe (te-nvfp4), for every role and
orientation (tiles, the Hadamard-transformed copies, stochastic rounding), equals an
element-by-element count from the NumPy reference quantize; torch tensors count alike."""

import math
from collections import Counter

import numpy as np
import pytest

import lscore.fp8 as F
from lscore import _reference_fp8 as ref8
from lscore import _reference_nvfp4 as ref

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16
CASES = [("input", -1), ("input", 0), ("grad", -1), ("grad", 0), ("weight", -1)]


def _input(seed, rows=32, cols=48, specials=True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-20, 20, (rows, 1)))
    x[rng.random((rows, cols)) < 0.1] = 0
    if specials:
        x[rng.integers(rows), rng.integers(cols)] = np.nan
        x[rng.integers(rows), rng.integers(cols)] = -np.inf
    return x.astype(BF16)


def slow_stats(x, role, axis, seed):
    """The twin: the reference's codes of the orientation's rows, each element's scaled
    magnitude float32(|v| * factor) from its block's E4M3 scale, counted one at a time."""
    tile, rht, sr = role == "weight", role != "weight" and axis == 0, role == "grad"
    v = np.asarray(x, np.float32)
    if rht:
        v = ref.from_bf16(ref.hadamard16(v))
    amax = ref.global_amax(v)
    scales, packed = ref.quantize(x, amax, axis=axis, tile=tile, rht=rht, seed=seed if sr else None)
    y = v.T if axis == 0 else v
    packed = packed.T if axis == 0 else packed
    sf = scales.T if axis == 0 else scales
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(y.shape)
    sdec = np.float32(1) / np.float32(ref.senc(amax))
    sfv = ref8.fp8_decode(sf, "float8_e4m3fn").astype(np.float32)
    hist = Counter(math.frexp(float(s))[1] - 1 for s in sfv.ravel() if s != 0)
    sat = flushed = nonzero = 0
    for i, j in np.ndindex(*y.shape):
        e = sfv[i // 16, j // 16] if tile else sfv[i, j // 16]
        with np.errstate(divide="ignore"):  # a zero scale: the largest factor
            factor = min(np.float32(1) / np.float32(e * sdec), np.finfo(np.float32).max)
        a = abs(y[i, j])
        if not math.isfinite(a):
            continue
        scaled = np.float32(np.float32(a) * factor)
        top = codes[i, j] & 7 == 7
        sat += bool(top and (scaled > 6 if sr else scaled >= 7))
        if a != 0:
            nonzero += 1
            flushed += codes[i, j] & 7 == 0
    return dict(hist), sat, flushed, nonzero, amax


@pytest.mark.parametrize("role,axis", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_te_nvfp4_counts_equal_the_twin(role, axis, seed):
    x = _input(seed, specials=seed != 2)
    s = F.block_stats(x, "te-nvfp4", role=role, axis=axis, seed=seed + 10)
    hist, sat, flushed, nonzero, amax = slow_stats(x, role, axis, seed + 10)
    assert (s.exponents, s.saturated, s.flushed, s.nonzero) == (hist, sat, flushed, nonzero)
    assert s.tensor_scale == float(np.float32(amax))
    assert s.tiles == (role == "weight") and s.axis == axis
    # the input's own size and non-finite elements, the transform's spread notwithstanding
    assert s.size == x.size
    assert (s.nan, s.neginf) == ((0, 0) if seed == 2 else (1, 1))


def test_stochastic_rounding_saturates_above_6_and_follows_the_stream():
    """A block whose E4M3 scale rounded down scales its largest element a little past 6:
    rounding to nearest writes 6 without saturating, stochastic rounding clamps it."""
    x = np.zeros((16, 16), np.float32)
    x[1, 0] = 1.0  # the global amax
    x[0, 0] = 0.55  # 0.55 * 448 = 246.4: E4M3 240, so the block scales 0.55 to 6.16
    x = x.astype(BF16)
    rn = F.block_stats(x, F.recipe("te-nvfp4", disable_stochastic_rounding=True), role="grad")
    st = F.block_stats(x, "te-nvfp4", role="grad", seed=3)
    assert (rn.saturated, st.saturated) == (0, 1)
    assert st.saturated == slow_stats(x, "grad", -1, 3)[1]
    with pytest.raises(ValueError, match="seed= is needed"):
        F.block_stats(x, "te-nvfp4", role="grad")


@pytest.mark.parametrize("role,axis", CASES)
def test_torch_tensors_count_as_their_arrays(role, axis):
    torch = pytest.importorskip("torch")
    from lscore.adapters.torch.quantize import block_stats

    x = _input(4)
    t = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    kw = dict(role=role, axis=axis, seed=7)
    assert block_stats(t, "te-nvfp4", **kw) == F.block_stats(x, "te-nvfp4", **kw)
    f = torch.randn(64, 256)
    assert block_stats(f, "te-blockwise", role=role) == F.block_stats(
        f.numpy(), "te-blockwise", role=role
    )
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        block_stats(x, "te-nvfp4", role="input")
