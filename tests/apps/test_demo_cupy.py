"""`lscore demo --backend cupy`: the GPU demo's loop on the host harness, and its CPU fallback."""

import json

import numpy as np
import pytest

from helpers.cuda_host import adapter
from helpers.cuda_host.adapter import CountingBackend
from helpers.demo_story import check_scale_path
from lscore import cli as _cli
from lscore.cli import demo as _demo
from lscore.cli.demo import cupy_backend as demo_cupy
from lscore.cli.demo import model, report


def _data(rng, vocab, context, n=3000):
    """Token windows whose next token depends on the ones before it."""
    ids = rng.integers(0, vocab, n).astype(np.int32)
    ids[1::2] = (ids[0::2] * 7 + 3) % vocab
    w = model.windows(ids, context)
    return w[:2500], w[2500:]


def _train(mode, steps=15, **changes):
    """A small model (the host harness runs the kernels slowly) with a large output layer:
    confident from the start, so that float16 flushes many of its logits' gradients."""
    cfg = _demo.config(steps, seed=0, tiny=True)
    small = dict(vocab=100, embed=8, hidden=32, batch_size=64, curve_tokens=200)
    cfg.update({**small, "initial_scale": 2.0**15, "growth_steps": 5, **changes})
    rng = np.random.default_rng(0)
    model0 = model.LM(cfg, rng)
    model0.params[-2] *= 30
    seen = []

    def progress(it, desc):
        for i in it:
            seen.append((CountingBackend.syncs, CountingBackend.uploads))
            yield i

    data = _data(rng, cfg["vocab"], cfg["context"])
    rec = demo_cupy.train_on(np, adapter, mode, model0, data, cfg, progress)
    return rec, seen


def test_the_dynamic_mode_reads_nothing_back_and_uploads_nothing():
    """The sync-free loop: from the second step on, no step reads the device or uploads to
    it through the optimizer (the first
    compiles and plans; the gradients are fixed buffers), and the record has everything
    the table and plot need."""
    rec, seen = _train(_demo.MODES[2])
    assert len(set(seen[1:])) == 1, seen
    assert len(rec["loss"]) == len(rec["scale"]) == 15
    assert rec["scale"][0] == 2.0**15 and rec["final_scale"] is not None
    assert np.isfinite(rec["loss"]).all() and rec["loss"][-1] < rec["loss"][0]
    assert 0 <= rec["underflow_fraction"] <= 1 and rec["skipped"] == len(rec["skipped_at"])
    check_scale_path(rec["scale"], rec["skipped_at"])


def test_a_skipped_step_is_recorded_where_the_scale_backs_off():
    """A scale that overflows float16 at once: the first steps are skipped, each halving
    the scale, and the record lists exactly those steps."""
    rec, _ = _train(_demo.MODES[2], steps=8, initial_scale=2.0**40, growth_steps=1000)
    assert rec["skipped_at"], rec["scale"]
    for s in rec["skipped_at"]:
        assert s + 1 == len(rec["scale"]) or rec["scale"][s + 1] == rec["scale"][s] / 2
    kept = [s for s in range(7) if s not in rec["skipped_at"]]
    assert all(rec["scale"][s + 1] == rec["scale"][s] for s in kept)


def test_every_mode_trains_and_float16_without_scaling_loses_gradients():
    recs = {m: _train(m, steps=5)[0] for m in _demo.MODES}
    f32, raw, dyn = (recs[m] for m in _demo.MODES)
    assert f32["underflow_fraction"] is None and raw["final_scale"] is None
    assert raw["underflow_by_layer"]["logits"] > dyn["underflow_by_layer"]["logits"]
    table = report.table(list(recs.values()))
    assert all(m in table for m in _demo.MODES)


@pytest.mark.slow
def test_without_a_gpu_it_says_so_and_runs_the_cpu_demo(tmp_path, capsys):
    for m in ("threadpoolctl", "matplotlib", "tqdm"):
        pytest.importorskip(m)
    if demo_cupy.gpu_missing() is None:
        pytest.skip("a GPU is here: the CuPy demo runs for real")
    args = ["demo", "--backend", "cupy", "--tiny", "--steps", "2", "--out", str(tmp_path)]
    assert _cli.main(args) == 0
    out = capsys.readouterr().out
    assert "needs a CUDA GPU" in out and "running the CPU demo instead" in out
    res = json.loads((tmp_path / "lscore_demo.json").read_text())
    assert [r["mode"] for r in res["results"]] == list(_demo.MODES)
    assert res["config"].get("backend") is None


@pytest.mark.gpu
def test_the_gpu_demo_tells_the_story(tmp_path):
    for m in ("threadpoolctl", "matplotlib", "tqdm"):
        pytest.importorskip(m)
    if demo_cupy.gpu_missing() is not None:
        pytest.skip(demo_cupy.gpu_missing())
    from helpers.demo_story import check_story

    assert _cli.main(["demo", "--backend", "cupy", "--tiny", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "lscore_demo.json").read_text())
    assert res["config"]["backend"] == "cupy"
    check_story(res)
