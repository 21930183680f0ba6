"""lscore.fp8.diagnostics: the statistics of a scaled float8 cast equal what the cast produces
(the compiled cast, and a slow element-by-element twin on ml_dtypes), the monitor's history,
table and figure, and bad input."""

import math

import numpy as np
import pytest

from lscore import kernels
from lscore.fp8.diagnostics import Float8Monitor, tensor_stats

ml_dtypes = pytest.importorskip("ml_dtypes")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FP8 = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def slow_stats(x, scale, fmt, amax_nan="ignore"):
    """The obvious twin: each element cast on its own with ml_dtypes (round to nearest
    even; no saturation: e4m3fn overflows to NaN, e5m2 to Inf), then looked at."""
    s = np.float32(scale)
    amax, nan, inf, sat, flushed, nonzero = 0.0, 0, 0, 0, 0, 0
    for v in np.asarray(x).reshape(-1).tolist():
        v = np.float32(v)
        if math.isnan(v):
            nan += 1
            continue
        amax = max(amax, abs(float(v)))
        if math.isinf(v):
            inf += 1
            continue
        with np.errstate(over="ignore"):
            q = float(np.array([v * s], np.float32).astype(FP8[fmt])[0])
        sat += not math.isfinite(q)
        if v != 0:
            nonzero += 1
            flushed += q == 0
    if nan and amax_nan == "propagate":
        amax = math.nan
    return amax, nan, inf, sat, flushed, nonzero


def kernel_stats(x, scale, fmt, amax_nan="ignore"):
    """What the compiled cast writes (non-saturating, so that a clamp shows as Inf or NaN)."""
    a = np.ascontiguousarray(x)
    q = np.empty(a.shape, np.uint8)
    amax = kernels.fp8_cast(
        a, q, scale, "float8_" + fmt, saturate=False, amax_nan=amax_nan == "propagate"
    )
    back = np.empty(a.shape, np.float32)
    kernels.fp8_decode(q, back, "float8_" + fmt)
    xf = a.astype(np.float32)
    finite = np.isfinite(xf)
    live = finite & (xf != 0)
    sat = int(np.count_nonzero(finite & ~np.isfinite(back)))
    return float(amax), sat, int(np.count_nonzero(live & (back == 0))), int(live.sum())


def check(x, scale, fmt, amax_nan="ignore"):
    st_ = tensor_stats(x, scale, fmt, amax_nan=amax_nan)
    amax, nan, inf, sat, flushed, nonzero = slow_stats(x, scale, fmt, amax_nan)
    got = (st_.nan, st_.posinf + st_.neginf, st_.saturated, st_.flushed, st_.nonzero)
    assert got == (nan, inf, sat, flushed, nonzero)
    assert st_.amax == amax or (math.isnan(st_.amax) and math.isnan(amax))
    k_amax, k_sat, k_flushed, k_nonzero = kernel_stats(x, scale, fmt, amax_nan)
    assert (st_.saturated, st_.flushed, st_.nonzero) == (k_sat, k_flushed, k_nonzero)
    assert st_.amax == k_amax or (math.isnan(st_.amax) and math.isnan(k_amax))
    return st_


# the edges of both formats' rounding: 464 (e4m3fn's tie, which stays 448) and the value
# above it, 61440 (e5m2's tie, which goes to Inf), half the smallest subnormals (ties to 0)
EDGES = [
    464.0,
    float(np.nextafter(np.float32(464), np.float32(1e9))),
    448.0,
    61440.0,
    float(np.nextafter(np.float32(61440), np.float32(0))),
    57344.0,
    2.0**-10,
    float(np.nextafter(np.float32(2.0**-10), np.float32(1))),
    2.0**-17,
    float(np.nextafter(np.float32(2.0**-17), np.float32(1))),
    0.0,
    -0.0,
    1e-45,
    3e38,
    math.inf,
    -math.inf,
    math.nan,
]


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_rounding_edges_count_as_the_cast_rounds_them(fmt, sign):
    x = np.array([sign * e for e in EDGES], np.float32)
    s = check(x, 1.0, fmt)
    assert s.nan == 1 and s.posinf + s.neginf == 2
    # 3e38 and the values above each format's tie saturate; 464 (e4m3fn) does not
    assert s.saturated == {"e4m3fn": 5, "e5m2": 2}[fmt]


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("amax_nan", ["ignore", "propagate"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_generated_tensors_match_the_cast_and_the_twin(fmt, dtype, amax_nan, data):
    x = data.draw(
        hnp.arrays(
            np.float32, hnp.array_shapes(max_dims=2, max_side=40), elements=st.floats(width=32)
        )
    )
    with np.errstate(over="ignore"):  # float16 and bfloat16 inputs: large values become Inf
        x = x.astype(DTYPES[dtype])
    scale = data.draw(
        st.sampled_from([1.0, 2.0**-7, 2.0**12, 448 / 3.7, 0.3])
        | st.floats(2.0**-100, 2.0**100, width=32)
    )
    check(x, scale, fmt, amax_nan)


def test_a_tensor_larger_than_one_block_is_counted_whole(monkeypatch):
    from lscore.fp8 import diagnostics

    monkeypatch.setattr(diagnostics, "_CHUNK", 7)
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32) * 300
    x[[3, 50]] = [np.nan, np.inf]
    check(x, 2.0, "e4m3fn")
    check(x[::-3], 2.0**-9, "e5m2")


def test_fractions_and_an_empty_tensor():
    s = tensor_stats(np.array([1000.0, 1.0, 0.0, 1e-9], np.float32), 1.0)
    assert (s.saturated, s.flushed, s.nonzero, s.size) == (1, 1, 3, 4)
    assert s.saturated_fraction == 0.25 and s.flushed_fraction == 1 / 3
    e = tensor_stats(np.zeros(0, np.float32), 1.0, "e5m2")
    assert (e.amax, e.saturated_fraction, e.flushed_fraction) == (0.0, 0.0, 0.0)


def test_the_monitor_keeps_history_and_prints_the_step():
    mon = Float8Monitor()
    rng = np.random.default_rng(1)
    for step in range(3):
        w = rng.standard_normal(64).astype(np.float32) * (step + 1)
        g = rng.standard_normal(64).astype(np.float32) * 1e-6
        mon.observe(step, {"w": (w, 448 / 4.0), "grad": (g, 2.0**10, "e5m2")})
    h = mon.history("w")
    assert h["step"].tolist() == [0, 1, 2] and h["scale"].tolist() == [112.0] * 3
    assert mon.names == ["w", "grad"]
    assert [r.fmt for r in mon.records[:2]] == ["e4m3fn", "e5m2"]
    lines = mon.table().splitlines()
    assert lines[0].split() == [
        "tensor",
        "format",
        "amax",
        "scale",
        "saturated",
        "flushed",
        "NaN",
        "Inf",
    ]
    last = mon.records[-2:]
    assert [line.split()[0] for line in lines[2:]] == [r.name for r in last]
    assert lines[2].split()[4] == f"{100 * last[0].saturated_fraction:.2f}%"
    assert len(mon.table(0).splitlines()) == 4 and len(mon.table(7).splitlines()) == 2


def test_the_figure_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    mon = Float8Monitor()
    for step in range(4):
        mon.observe(step, {"x": (np.full(8, step + 1.0, np.float32), 2.0**step)})
    mon.plot(str(tmp_path / "h.png"))
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: tensor_stats(np.ones(2), 1.0),
            "x must be float32, float16 or bfloat16, got float64",
        ),
        (
            lambda: tensor_stats(np.ones(2, np.float32), 0.0),
            "scale must be a positive finite float32, got 0.0",
        ),
        (
            lambda: tensor_stats(np.ones(2, np.float32), 1e39),
            "scale must be a positive finite float32, got 1e\\+39",
        ),
        (
            lambda: tensor_stats(np.ones(2, np.float32), np.ones(2)),
            "scale must be one number per tensor",
        ),
        (
            lambda: tensor_stats(np.ones(2, np.float32), 1.0, "e3m4"),
            "fmt must be one of e4m3fn, e5m2",
        ),
        (
            lambda: tensor_stats(np.ones(2, np.float32), 1.0, amax_nan="max"),
            "amax_nan must be 'ignore' or 'propagate', got 'max'",
        ),
        (lambda: Float8Monitor().observe(0, [np.ones(2)]), "tensors must map names to"),
        (
            lambda: Float8Monitor().observe(0, {"x": np.ones(2)}),
            r"tensors\['x'\] must be \(array, scale\[, fmt\]\)",
        ),
        (lambda: Float8Monitor().history("x"), "name must be a tensor observed"),
    ],
)
def test_bad_input_says_what_was_expected(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()
