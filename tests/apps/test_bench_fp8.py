"""`lscore bench --suite fp8`: its rows (per tensor and block-scaled), and that the torch
baselines compute what lscore does."""

import json

import numpy as np
import pytest

from lscore import cli
from lscore.bench import _fp8, _mx


def test_tiny_run_has_every_row(tmp_path):
    path = tmp_path / "fp8.json"
    argv = ["bench", "--suite", "fp8", "--tiny", "--no-torch", "--no-progress", "--json", str(path)]
    assert cli.main(argv) == 0
    out = json.loads(path.read_text())
    groups = {}
    for r in out["rows"]:
        groups.setdefault(r["group"], {})[r["method"]] = r
    for n in ("1e3", "4096"):
        for dt in _fp8.DTYPES:
            for recipe in _fp8.RECIPES:
                g = groups[f"fp8 {recipe} {dt} {n}"]
                assert g["lscore"]["median_s"] > 0
                assert g["torch eager"]["skipped"] == "torch is not installed"
                floor = g["byte floor"]
                # the floor is the memcpy's time scaled to the bytes the recipe moves
                copy = groups[f"fp8 memcpy {dt} {n}"]["C memcpy"]
                width = 2 if dt == "bfloat16" else 4
                reads = 1 if recipe == "delayed" else 2
                want = copy["median_s"] * (reads * width + 1) / (2 * width)
                assert floor["median_s"] == pytest.approx(want)
                assert "floor" in g["lscore"]["ratios"]
        for dt in _mx.DTYPES:  # the block-scaled rows (no 1e3: not a whole number of blocks)
            width = 2 if dt == "bfloat16" else 4
            if n == "1e3":
                assert "not a whole number" in groups[f"fp8 nvfp4 {dt} 1e3"]["lscore"]["skipped"]
                continue
            copy = groups[f"fp8 mx memcpy {dt} {n}"]["C memcpy"]
            for recipe in _mx.RECIPES:
                g = groups[f"fp8 {recipe} {dt} {n}"]
                assert g["lscore"]["median_s"] > 0
                assert g["torch eager"]["skipped"] == "torch is not installed"
                reads, written = _mx.TRAFFIC[recipe]
                assert g["byte floor"]["bytes"] == round((reads * width + written) * int(n))
                want = copy["median_s"] * g["byte floor"]["bytes"] / (2 * width * int(n))
                assert g["byte floor"]["median_s"] == pytest.approx(want)
                assert "floor" in g["lscore"]["ratios"]
                down = g.get("lscore out= axis 0")
                assert (down is None) == (recipe == "nvfp4")
                if down is not None:  # the columns pass, held to the same floor
                    assert down["median_s"] > 0 and "floor" in down["ratios"]
            assert groups[f"fp8 mxfp8-rceil {dt} {n}"]["lscore te"]["median_s"] > 0
    gpu = groups["fp8 gpu"]["lscore"]
    assert gpu["skipped"] in ("torch is not installed", "no CUDA device")


def test_torch_baselines_are_lscores_quantize():
    """The eager torch rows compute the bytes (and amax, scale) lscore's rows compute."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    from lscore.bench._harness import as_tensor, dtype_of

    rng = np.random.default_rng(1)
    t_delayed, t_current = _fp8.torch_fns(torch)
    for name in _fp8.DTYPES:
        x = (rng.standard_normal(5000) * 300).astype(np.float32).astype(dtype_of(name))
        x[7] = np.nan
        l_delayed, l_current = _fp8.lscore_fns(x)
        t = as_tensor(torch, x)
        q, a = l_delayed()
        tq, ta = t_delayed(t, torch.tensor(_fp8.SCALE))
        np.testing.assert_array_equal(q, tq.view(torch.uint8).numpy())
        assert np.isnan(a) and ta.isnan()
        x[7] = 1.5
        q, _ = l_current()
        tq, ts = t_current(t)
        np.testing.assert_array_equal(q, tq.view(torch.uint8).numpy())
        assert _fp8._scale_from_amax(np.abs(x.astype(np.float32)).max()) == ts.item()


def test_targets_name_the_issue_ratios():
    class Opts:
        tiny, sizes_given, sizes = False, True, (10**8,)

    rows = [
        {"group": "fp8 delayed float32 1e8", "method": m, "min_s": s, "median_s": s}
        for m, s in (
            ("lscore", 1.0),
            ("torch eager", 30.0),
            ("torch.compile", 1.2),
            ("byte floor", 0.8),
        )
    ]
    found = {t["target"]: t for t in _fp8.targets(rows, Opts())}
    assert found["fp8 delayed float32 1e8: torch eager / lscore"]["met"] is True
    assert found["fp8 delayed float32 1e8: torch.compile / lscore"]["met"] is False
    floor = found["fp8 delayed float32 1e8: lscore / byte floor"]
    assert floor["measured"] == 1.25 and floor["met"] is True
    assert found["fp8 current bfloat16 1e8: torch eager / lscore"]["measured"] is None


def test_mid_size_targets_hold_both_recipes_to_twice_the_floor():
    class Opts:
        tiny, sizes_given, sizes = False, True, (10**6,)

    rows = [
        {"group": f"fp8 {r} float32 1e6", "method": m, "min_s": s, "median_s": s}
        for r, ls in (("delayed", 1.0), ("current", 2.0))
        for m, s in (("lscore", ls), ("byte floor", 0.6))
    ]
    found = {t["target"]: t for t in _fp8.targets(rows, Opts())}
    delayed = found["fp8 delayed float32 1e6: lscore / byte floor"]
    assert delayed["required"] == 2.0 and delayed["met"] is True
    current = found["fp8 current float32 1e6: lscore / byte floor"]
    assert current["measured"] == pytest.approx(2 / 0.6) and current["met"] is False
    assert found["fp8 delayed bfloat16 1e6: lscore / byte floor"]["measured"] is None


def test_gpu_targets_only_where_a_device_timed_the_rows():
    class Opts:
        tiny, sizes_given, sizes = False, True, (10**7, 10**8)

    rows = [
        {"group": g, "method": m, "min_s": s, "median_s": s}
        for g, m, s in (
            ("fp8 gpu current bfloat16 1e8", "lscore", 1.2e-4),
            ("fp8 gpu current bfloat16 1e8", "byte floor", 1e-4),
            ("fp8 gpu delayed float32 1e7", "lscore", 2e-5),
            ("fp8 gpu delayed float32 1e7", "torch.compile", 5e-5),
        )
    ]
    found = {t["target"]: t for t in _fp8.targets(rows, Opts()) if "gpu" in t["target"]}
    assert sorted(found) == [
        "fp8 gpu current bfloat16 1e8: lscore / byte floor",
        "fp8 gpu delayed float32 1e7: torch.compile / lscore",
    ]
    floor = found["fp8 gpu current bfloat16 1e8: lscore / byte floor"]
    assert floor["measured"] == pytest.approx(1.2) and floor["met"] is True
    compiled = found["fp8 gpu delayed float32 1e7: torch.compile / lscore"]
    assert compiled["measured"] == pytest.approx(2.5) and compiled["met"] is False


def test_only_skips_the_set_up_of_groups_it_leaves_out(monkeypatch):
    """--only drops a group's rows and never builds what they would time (the 1e8 arrays,
    the lscore functions, torch.compile of the baselines)."""

    class Opts:
        tiny, sizes_given, sizes, use_torch, only = False, True, (10**8,), True, ("gpu",)
        repeat, min_time = 1, 0.0

    def refuse(*a, **kw):
        raise AssertionError("set up a group --only left out")

    from lscore.bench._harness import Rows

    monkeypatch.setattr(_fp8, "lscore_fns", refuse)
    monkeypatch.setattr(_mx, "lscore_fns", refuse)
    monkeypatch.setattr(_fp8, "_compiled", refuse)
    rows = Rows(0, False, ("gpu",))
    _fp8.run_cpu(Opts(), rows, np.random.default_rng(0))
    _mx.run_cpu(Opts(), rows, np.random.default_rng(0))
    assert rows.rows == []
    assert rows.wanted("fp8 gpu delayed float32 1e8") and not rows.wanted("fp8 delayed float32 1e8")
    assert Rows(0, False).wanted("anything")
