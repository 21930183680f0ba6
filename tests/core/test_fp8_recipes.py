"""lscore.fp8's recipes: the presets' fields, validation, and the compiled scale rules against
the NumPy twin (generated amaxes), TE's worked values and torchao 0.18's recorded scales."""

import json
import math
import pathlib

import ml_dtypes
import numpy as np
import pytest

import lscore.fp8
from lscore import _reference_fp8 as ref
from lscore import kernels
from lscore.fp8 import RECIPES, Recipe, recipe

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given
from hypothesis import strategies as st

DATA = pathlib.Path(__file__).parent / "data" / "torchao_scales.npz"
F32_MAX = float(np.finfo(np.float32).max)


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def assert_same(got, want, ctx=""):
    """Bitwise equal float32 arrays, NaN compared by value."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, ctx
    nan = np.isnan(got)
    assert np.array_equal(nan, np.isnan(want)), (ctx, got[nan != np.isnan(want)])
    bad = np.flatnonzero(bits(got)[~nan] != bits(want)[~nan])
    assert bad.size == 0, (ctx, got[~nan][bad[:5]], want[~nan][bad[:5]])


# amaxes of every kind: zeros, subnormals, NaN, +-Inf, huge values, powers of two and their
# float32 neighbours, and any float32 bit pattern

POW2 = [2.0**k for k in range(-149, 128)]
SPECIAL = [0.0, -0.0, math.nan, -math.nan, math.inf, -math.inf, F32_MAX, 1e-12, 1e-39, 1e38, 3.0]
amax_value = st.one_of(
    st.sampled_from(SPECIAL),
    st.sampled_from(POW2).flatmap(
        lambda p: st.sampled_from(
            [
                p,
                float(np.nextafter(np.float32(p), np.float32(0))),
                float(np.nextafter(np.float32(p), np.float32(np.inf))),
            ]
        )
    ),
    st.integers(0, 2**32 - 1).map(lambda b: float(np.uint32(b).view(np.float32))),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
)
amax_arrays = st.lists(amax_value, min_size=1, max_size=40).map(lambda v: np.array(v, np.float32))


def twin(r: Recipe, a, fmt):
    rule = ref.fp8_scale_te if r.rule == "te" else ref.fp8_scale_torchao
    return rule(a, r.fp8_max(fmt), r.power_2_scales, r.amax_epsilon)


@given(
    a=amax_arrays,
    name=st.sampled_from(RECIPES),
    fmt=st.sampled_from(["e4m3fn", "e5m2"]),
    pow2=st.booleans(),
    eps=st.sampled_from([0.0, 1e-12, 2.0**-140, 1e-3, 1.0]),
)
def test_compiled_rules_equal_the_twin(a, name, fmt, pow2, eps):
    kw = {"amax_epsilon": eps}
    if name != "te-delayed":  # TE's delayed scales are never rounded to a power of two
        kw["power_2_scales"] = pow2
    r = recipe(name, **kw)
    assert_same(r.scale_from_amax(a, fmt), twin(r, a, fmt), (name, fmt, pow2, eps, a))


# ---- TE's rules on the research's worked values (TE v2.18 recipe_common.cuh:14-49) ----------


def test_te_current_worked_values():
    r = recipe("te-current")
    got = r.scale_from_amax(np.array([3.0, 1.0, 0.0, 1e-39, math.inf, math.nan, 448.0], np.float32))
    assert bits(got)[0] == 0x43155555  # 448 / 3 = 149.33333
    assert got[1:].tolist() == [448.0, 1.0, F32_MAX, 1.0, 1.0, 1.0]
    p = recipe("te-current", power_2_scales=True).scale_from_amax([3.0, 1.0, 0.0, 1e-39])
    assert p.tolist() == [128.0, 256.0, 1.0, 2.0**127]
    # the backward format's maximum, and an epsilon that floors the amax
    assert r.scale_from_amax(1.0, "e5m2") == 57344.0
    assert recipe("te-current", amax_epsilon=2.0).scale_from_amax([0.0, 1.0]).tolist() == [
        224.0,
        224.0,
    ]


def test_torchao_worked_values():
    r = recipe("torchao-tensorwise")
    got = r.scale_from_amax([0.0, 1e-30, 1e-12, 1.0, 3.0, 448.0, 57344.0, math.inf, math.nan])
    assert got[:3].tolist() == [float(np.float32(448 / 1e-12))] * 3
    assert got[3:7].tolist() == [448.0, float(np.float32(448 / 3)), 1.0, 0.0078125]
    assert got[7] == 0.0 and math.isnan(got[8])
    p = recipe("torchao-rowwise").scale_from_amax([0.0, 1.0, 3.0], "e5m2")
    assert p.tolist() == [2.0**55, 32768.0, 16384.0]


def test_torchao_power_of_two_returns_2_to_the_m_just_below_it():
    """torch's float32 log2 rounds up to m for a scale one or two ulps below 2**7, so
    torchao's rounding "down" gives 2**7 there; TE's mantissa mask gives 2**6."""
    below = [float(np.nextafter(np.float32(128.0), np.float32(0)))]
    below.append(float(np.nextafter(np.float32(below[0]), np.float32(0))))
    third = float(np.nextafter(np.float32(below[1]), np.float32(0)))
    # amax 1 and fp8_max = the scale itself: the rule's division is exact
    out = np.empty(1, np.float32)
    for s, want in [(below[0], 128.0), (below[1], 128.0), (third, 64.0), (128.0, 128.0)]:
        kernels.fp8_scale_torchao(np.ones(1, np.float32), out, s, True, 1e-12)
        assert out[0] == want, s
        kernels.fp8_scale_te(np.ones(1, np.float32), out, s, True, 0.0)
        assert out[0] == (128.0 if s == 128.0 else 64.0), s


# ---- torchao 0.18.0's own outputs (tests/core/data/record_torchao_scales.py) ------------------


@pytest.fixture(scope="module")
def recorded():
    return dict(np.load(DATA))


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("pow2", [False, True])
def test_amax_to_scale_equals_torchao(recorded, fmt, pow2):
    a = recorded["amax"].view(np.float32)
    r = recipe("torchao-tensorwise", power_2_scales=pow2)
    want = recorded[f"amax_to_scale_{fmt}_{int(pow2)}"].view(np.float32)
    assert_same(r.scale_from_amax(a, fmt), want, (fmt, pow2))
    assert_same(twin(r, a, fmt), want, ("twin", fmt, pow2))


def test_power_of_two_rounding_equals_torch_near_every_power_of_two(recorded):
    s = recorded["pow2_in"].view(np.float32)
    want = recorded["pow2_out"].view(np.float32)
    got = np.empty_like(s)
    one = np.ones(1, np.float32)
    out = np.empty(1, np.float32)
    for i, v in enumerate(s.tolist()):  # fp8_max = s, amax 1: the scale is s itself
        kernels.fp8_scale_torchao(one, out, v, True, 1e-12)
        got[i] = out[0]
    assert_same(got, want)
    assert_same(np.array([ref.fp8_pow2_down_torch(v) for v in s.tolist()], np.float32), want)


def _amax(x, axis):
    """torch.max(|x|) / torch.amax(|x|, dim): NaN propagates."""
    return np.max(np.abs(x.astype(np.float32)), axis=axis)


@pytest.mark.parametrize("src", ["f32", "bf16"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("pow2", [False, True])
def test_tensor_to_scale_equals_torchao(recorded, src, fmt, pow2):
    """Tensorwise and axiswise (per row) scales of small tensors with zeros, NaN, Inf and
    subnormals, from the NumPy amax of each tensor or row."""
    x = recorded["t_f32"].view(np.float32)
    if src == "bf16":
        x = recorded["t_bf16"].view(ml_dtypes.bfloat16)
    tw = recipe("torchao-tensorwise", power_2_scales=pow2)
    rw = recipe("torchao-rowwise", power_2_scales=pow2)
    got_t = tw.scale_from_amax(_amax(x, (1, 2)), fmt)
    got_r = rw.scale_from_amax(_amax(x, 2), fmt)
    assert_same(got_t, recorded[f"tensorwise_{src}_{fmt}_{int(pow2)}"].view(np.float32))
    assert_same(got_r, recorded[f"axiswise_{src}_{fmt}_{int(pow2)}"].view(np.float32))


# ---- the presets, and validation -------------------------------------------------------------


def test_presets_are_the_libraries_defaults():
    d = recipe("te-delayed")
    assert (d.scaling, d.margin, d.amax_history_len, d.amax_compute_algo) == (
        "delayed",
        0,
        1024,
        "max",
    )
    assert (d.forward_format, d.backward_format) == ("e4m3fn", "e5m2")  # HYBRID
    assert (d.rule, d.amax_nan, d.saturate, d.nan_sign) == ("te", "ignore", True, False)
    c = recipe("te-current")
    assert (c.scaling, c.power_2_scales, c.amax_epsilon, c.backward_format) == (
        "current",
        False,
        0.0,
        "e5m2",
    )
    t = recipe("torchao-tensorwise")
    assert (t.forward_format, t.backward_format, t.power_2_scales) == ("e4m3fn", "e5m2", False)
    assert (t.rule, t.amax_nan, t.nan_sign, t.amax_epsilon) == ("torchao", "propagate", True, 1e-12)
    w = recipe("torchao-rowwise")
    assert (w.granularity, w.backward_format, w.power_2_scales) == ("row", "e4m3fn", True)
    assert recipe("te-delayed", fp8_format="E4M3").backward_format == "e4m3fn"
    assert lscore.fp8.RECIPES == (
        "te-delayed",
        "te-current",
        "torchao-tensorwise",
        "torchao-rowwise",
    )


@pytest.mark.parametrize("name", RECIPES)
def test_to_dict_round_trips_through_json(name):
    r = recipe(name, amax_epsilon=2.0**-30) if name != "te-delayed" else recipe(name, margin=3)
    assert Recipe.from_dict(json.loads(json.dumps(r.to_dict()))) == r


@pytest.mark.parametrize(
    "name, kw, exc, message",
    [
        (
            "nope",
            {},
            ValueError,
            "unknown recipe 'nope'; expected one of: te-delayed, te-current,"
            " torchao-tensorwise, torchao-rowwise",
        ),
        (
            "te-delayed",
            {"history": 3},
            ValueError,
            "unknown recipe field 'history'; expected one of: name, scaling, granularity",
        ),
        ("te-delayed", {"fp8_format": "E5M2"}, ValueError, "pure E5M2 training is not supported"),
        (
            "te-current",
            {"forward_format": "e5m2"},
            ValueError,
            "pure E5M2 training is not supported",
        ),
        (
            "te-current",
            {"forward_format": "e5m2", "backward_format": "e4m3fn"},
            ValueError,
            "forward_format must be 'e4m3fn' under rule 'te'",
        ),
        ("torchao-tensorwise", {"fp8_format": "HYBRID"}, ValueError, "fp8_format is a TE"),
        ("te-delayed", {"margin": -1}, ValueError, "margin must be >= 0, got -1"),
        ("te-delayed", {"margin": 31}, ValueError, "margin must be <= 30"),
        ("te-delayed", {"margin": 1.5}, TypeError, "margin must be an integer, got 1.5"),
        ("te-delayed", {"amax_history_len": 0}, ValueError, "amax_history_len must be >= 1"),
        (
            "te-delayed",
            {"amax_compute_algo": "mean"},
            ValueError,
            "unknown amax_compute_algo 'mean'; expected one of: max, most_recent",
        ),
        ("te-delayed", {"power_2_scales": True}, ValueError, "power_2_scales must be False"),
        ("te-delayed", {"rule": "torchao"}, ValueError, "rule must be 'te' for delayed"),
        ("te-delayed", {"granularity": "row"}, ValueError, "granularity must be 'tensor'"),
        (
            "te-current",
            {"amax_epsilon": -1.0},
            ValueError,
            "amax_epsilon must be finite and >= 0, got -1.0",
        ),
        ("te-current", {"amax_epsilon": math.nan}, ValueError, "amax_epsilon must be finite"),
        ("te-current", {"amax_epsilon": "0"}, TypeError, "amax_epsilon must be a real number"),
        ("te-current", {"saturate": 1}, TypeError, "saturate must be a bool, got 1"),
        (
            "te-current",
            {"forward_format": "float8_e4m3fn"},
            ValueError,
            "unknown forward_format 'float8_e4m3fn'; expected one of: e4m3fn, e5m2",
        ),
        ("torchao-rowwise", {"amax_nan": "drop"}, ValueError, "unknown amax_nan 'drop'"),
        ("te-current", {"name": ""}, ValueError, "name must be a non-empty string"),
    ],
)
def test_bad_fields_are_refused(name, kw, exc, message):
    with pytest.raises(exc) as info:
        recipe(name, **kw)
    assert message in str(info.value)


def test_bad_amaxes_and_formats_are_refused():
    r = recipe("te-current")
    with pytest.raises(TypeError, match="amax must be real numbers, got dtype <U1"):
        r.scale_from_amax(["a"])
    with pytest.raises(ValueError, match="unknown fmt 'e4m3'; expected one of: e4m3fn, e5m2"):
        r.scale_from_amax([1.0], "e4m3")
    with pytest.raises(ValueError, match="a recipe dict must have exactly the fields"):
        Recipe.from_dict({**r.to_dict(), "extra": 1})


def test_scale_from_amax_keeps_the_shape():
    r = recipe("torchao-rowwise")
    a = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]  # float64, strided
    got = r.scale_from_amax(a)
    assert got.shape == (3, 2) and got.dtype == np.float32
    assert_same(got, twin(r, a.astype(np.float32), "e4m3fn"))
    assert r.scale_from_amax(3.0).shape == ()


def test_a_missing_ml_dtypes_says_what_to_install(monkeypatch):
    """ml_dtypes is a dependency; after an install without it (pip --no-deps) the error
    names the package and the command, not a bare ModuleNotFoundError."""
    from lscore.fp8 import checks

    monkeypatch.setitem(__import__("sys").modules, "ml_dtypes", None)
    with pytest.raises(ImportError, match=r"float8_e4m3fn .*`pip install ml_dtypes`"):
        checks.fp8_dtype("float8_e4m3fn")


def test_recipe_is_annotated_and_the_guide_counts_its_presets():
    """recipe() rendered "-> Any" in the reference; the FP8 guide said "one of four
    presets" while an unknown name's error listed eleven."""
    import typing

    from lscore.fp8 import BLOCK_RECIPES, BlockRecipe

    assert typing.get_type_hints(recipe)["return"] == Recipe | BlockRecipe
    n = len(RECIPES) + len(BLOCK_RECIPES)
    with pytest.raises(ValueError) as e:
        recipe("zzz")
    assert len(str(e.value).split("expected one of: ")[1].split(", ")) == n == 14
    guide = (pathlib.Path(__file__).parents[2] / "docs" / "guides" / "fp8.md").read_text()
    assert "gives one of fourteen presets" in guide
