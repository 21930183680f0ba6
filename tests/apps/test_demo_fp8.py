"""`lscore demo --fp8`: bfloat16 rounding, the FP8 linear layers' casts, and a tiny run that
shows accuracy, the casts' amax and scale history and their saturated elements."""

import json
import re

import numpy as np
import pytest

from lscore import cli as _cli
from lscore.cli.demo import fp8 as demo_fp8
from lscore.cli.demo import run

ml_dtypes = pytest.importorskip("ml_dtypes")


def test_bfloat16_rounds_as_ml_dtypes_does():
    bits = np.arange(0, 2**32, 7919, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), np.float32([3.3895e38, -np.inf, 2**-133])])
    with np.errstate(over="ignore", invalid="ignore"):  # NaN bit patterns warn
        want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(demo_fp8.bfloat16(x), want, equal_nan=True)


@pytest.mark.parametrize("mode", demo_fp8.FP8_MODES[1:])
def test_a_layer_multiplies_what_the_recipe_casts(mode):
    """Each layer's input and weight are the e4m3fn values of the recipe's cast, widened
    back; the delayed scales take the step's amaxes after it."""
    from lscore import fp8
    from lscore.fp8.casting import dequantize, quantize

    layers = demo_fp8.Float8Layers(demo_fp8.RECIPES[mode], 1)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 8)).astype(np.float32) * 900
    w = rng.standard_normal((8, 4)).astype(np.float32)
    layers.start_step()
    qa, qw = layers.cast(0, a, w)
    r = fp8.recipe(demo_fp8.RECIPES[mode])
    for x, got, name in ((a, qa, "layer 1 input"), (w, qw, "layer 1 weight")):
        seen, scale = layers.seen[name]
        assert seen is x
        if r.scaling == "delayed":
            assert scale == 1.0  # the state's first scale
        else:
            assert scale == r.scale_from_amax(np.float32([np.abs(x).max()]), "e4m3fn")[0]
        q, _ = quantize(x, scale, "e4m3fn", saturate=r.saturate, nan_sign=r.nan_sign)
        assert np.array_equal(got, dequantize(q, scale))
    assert (layers.amaxes == [np.abs(a).max(), np.abs(w).max()]).all()
    layers.end_step()
    if r.scaling == "delayed":
        assert layers.delayed.scale[0] == r.scale_from_amax(layers.amaxes[:1], "e4m3fn")[0]


@pytest.mark.slow
def test_tiny_fp8_run(tmp_path, capsys):
    for m in ("threadpoolctl", "matplotlib", "tqdm"):
        pytest.importorskip(m)
    args = ["demo", "--fp8", "--tiny", "--steps", "6", "--out", str(tmp_path)]
    assert _cli.main(args) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "lscore_demo_fp8.json").read_text())
    _, delayed, current = res["results"]
    assert [r["mode"] for r in res["results"]] == list(demo_fp8.FP8_MODES)
    assert [r["recipe"] for r in res["results"]] == [None, "te-delayed", "torchao-tensorwise"]
    for r in (delayed, current):
        assert 0 <= r["saturated_fraction"] <= 1 and 0 <= r["flushed_fraction"] <= 1
        h = r["fp8"]["layer 1 input"]
        assert h["step"][0] == 0 and h["step"][-1] == 5 and len(h["amax"]) == len(h["scale"])
    # delayed scaling starts at scale 1 and follows the amax of the steps before;
    # current scaling takes each tensor's own amax: its largest element lands on 448
    assert delayed["fp8"]["layer 1 input"]["scale"][0] == 1.0
    h = current["fp8"]["layer 1 weight"]
    assert all(
        a * s == pytest.approx(448, rel=1e-6) for a, s in zip(h["amax"], h["scale"], strict=True)
    )
    assert current["saturated_fraction"] == 0
    assert all(r["test_accuracy"] > 0.05 for r in res["results"])
    table = out.split("\n\n")[1].splitlines()
    row = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line) for line in table[2:])}
    assert row[demo_fp8.FP8_MODES[1]][:2] == [
        "te-delayed",
        f"{100 * delayed['test_accuracy']:.1f}%",
    ]
    assert "the casts at the last step" in out and "layer 2 weight" in out
    assert (tmp_path / "lscore_demo_fp8.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "lscore_demo.json").exists()


def test_fp8_refuses_another_backend(capsys):
    for m in ("threadpoolctl", "matplotlib", "tqdm"):
        pytest.importorskip(m)
    assert _cli.main(["demo", "--fp8", "--backend", "torch"]) == 2
    assert "argument --fp8: runs on the numpy backend" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--fp8 runs on the numpy backend, got backend 'cupy'"):
        run(fp8=True, backend="cupy", tiny=True)


@pytest.mark.slow
def test_a_run_leaves_the_callers_blas_threads_as_they_were(tmp_path, capsys):
    """The demo limits BLAS to one thread while it trains and lifts the limit on return, so
    code run after it in the same process (a test of bitwise GEMM results) keeps its
    thread counts."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    for m in ("matplotlib", "tqdm"):
        pytest.importorskip(m)
    before = [p["num_threads"] for p in threadpoolctl.threadpool_info()]
    with threadpoolctl.threadpool_limits(2):
        inside = [p["num_threads"] for p in threadpoolctl.threadpool_info()]
        assert run(steps=2, out=str(tmp_path), tiny=True) == 0
        assert [p["num_threads"] for p in threadpoolctl.threadpool_info()] == inside
    assert [p["num_threads"] for p in threadpoolctl.threadpool_info()] == before
    capsys.readouterr()
