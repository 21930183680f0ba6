"""`lscore demo --backend cupy`: the GPU demo's loop on the host harness, and its CPU fallback."""

import json

import numpy as np
import pytest

from helpers.cuda_host import adapter
from helpers.cuda_host.adapter import CountingBackend
from lscore import cli as _cli
from lscore.cli import demo as _demo
from lscore.cli import demo_cupy


def _data(rng, n=256):
    """Digits-shaped data: 64 features in [0, 1], 10 classes that depend on them."""
    x = rng.random((n, 64), dtype=np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int64)
    return x[:192], x[192:], y[:192], y[192:]


def _train(mode, steps=40):
    cfg = _demo.config(steps, seed=0)
    cfg["measure_every"] = 5
    rng = np.random.default_rng(0)
    model0 = _demo.MLP(cfg["sizes"], rng)
    seen = []

    def progress(it, desc):
        for i in it:
            seen.append((CountingBackend.syncs, CountingBackend.uploads))
            yield i

    rec = demo_cupy.train_mode(mode, model0, _data(rng), cfg, np, adapter, progress, _demo.MODES)
    return rec, seen


def test_the_dynamic_mode_reads_nothing_back_and_uploads_nothing():
    """The sync-free loop: from the second step on, no step reads the device or uploads
    to it (the first compiles and plans; the gradients are fixed buffers), and the
    record has everything the table and plot need."""
    rec, seen = _train(_demo.MODES[2])
    assert len(set(seen[1:])) == 1, seen
    assert len(rec["loss"]) == len(rec["scale"]) == 40
    assert rec["scale"][0] == 2.0**15 and rec["final_scale"] is not None
    assert np.isfinite(rec["loss"]).all() and rec["loss"][-1] < rec["loss"][0]
    assert 0 <= rec["underflow_fraction"] <= 1 and rec["skipped"] == len(rec["skipped_at"])


def test_a_skipped_step_is_recorded_where_the_scale_backs_off():
    """A scale that overflows float16 at once: the first steps are skipped, each halving
    the scale, and the record lists exactly those steps."""
    cfg_scale = 2.0**40
    cfg = _demo.config(12, seed=0)
    cfg["initial_scale"] = cfg_scale
    rng = np.random.default_rng(0)
    model0 = _demo.MLP(cfg["sizes"], rng)
    rec = demo_cupy.train_mode(
        _demo.MODES[2], model0, _data(rng), cfg, np, adapter, lambda it, desc: it, _demo.MODES
    )
    assert rec["skipped_at"], rec["scale"]
    for s in rec["skipped_at"]:
        assert s + 1 == len(rec["scale"]) or rec["scale"][s + 1] == rec["scale"][s] / 2
    kept = [s for s in range(11) if s not in rec["skipped_at"]]
    assert all(rec["scale"][s + 1] == rec["scale"][s] for s in kept)


def test_every_mode_trains_and_float16_without_scaling_loses_gradients():
    recs = {m: _train(m, steps=20)[0] for m in _demo.MODES}
    assert recs[_demo.MODES[0]]["underflow_fraction"] is None
    assert recs[_demo.MODES[1]]["final_scale"] is None
    assert recs[_demo.MODES[3]]["final_scale"] == 2.0**10
    assert recs[_demo.MODES[1]]["underflow_fraction"] > recs[_demo.MODES[2]]["underflow_fraction"]
    table = _demo._table(list(recs.values()))
    assert all(m in table for m in _demo.MODES)


def test_without_a_gpu_it_says_so_and_runs_the_cpu_demo(tmp_path, capsys):
    for m in ("sklearn", "matplotlib", "tqdm"):
        pytest.importorskip(m)
    if demo_cupy.gpu_missing() is None:
        pytest.skip("a GPU is here: the CuPy demo runs for real")
    assert _cli.main(["demo", "--backend", "cupy", "--steps", "20", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "needs a CUDA GPU" in out and "running the CPU demo instead" in out
    res = json.loads((tmp_path / "lscore_demo.json").read_text())
    assert [r["mode"] for r in res["results"]] == list(_demo.MODES)
    assert res["config"].get("backend") is None


@pytest.mark.gpu
def test_the_gpu_demo_runs(tmp_path):
    for m in ("sklearn", "matplotlib", "tqdm"):
        pytest.importorskip(m)
    if demo_cupy.gpu_missing() is not None:
        pytest.skip(demo_cupy.gpu_missing())
    assert _cli.main(["demo", "--backend", "cupy", "--steps", "200", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "lscore_demo.json").read_text())
    assert res["config"]["backend"] == "cupy"
    _f32, raw, dyn, _ = res["results"]
    assert raw["underflow_fraction"] > dyn["underflow_fraction"]
