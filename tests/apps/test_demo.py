"""`lscore demo`: the hand-written backprop, the float16 emulation, the CLI and a short run."""

import importlib.util
import json

import numpy as np
import pytest

from lscore import cli as _cli
from lscore.cli import demo as _demo


def small_model(seed=0):
    return _demo.MLP([6, 5, 4, 3], np.random.default_rng(seed))


def test_backprop_matches_finite_differences():
    rng = np.random.default_rng(1)
    m = small_model()
    m.params = [p.astype(np.float64) for p in m.params]  # float64: clean differences
    x = rng.random((8, 6))
    y = rng.integers(0, 3, 8)
    _, grads = m.loss_and_grads(x, y, 1.0, half=False)
    for k, p in enumerate(m.params):
        for idx in list(np.ndindex(p.shape))[:4]:
            old = p[idx]
            p[idx] = old + 1e-6
            up = m.loss_and_grads(x, y, 1.0, False)[0]
            p[idx] = old - 1e-6
            down = m.loss_and_grads(x, y, 1.0, False)[0]
            p[idx] = old
            assert grads[k][idx] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-8)


def test_scaled_gradients_are_scale_times_unscaled_in_float32():
    rng = np.random.default_rng(2)
    m = small_model()
    x, y = rng.random((8, 6)).astype(np.float32), rng.integers(0, 3, 8)
    _, g1 = m.loss_and_grads(x, y, 1.0, False)
    _, g8 = m.loss_and_grads(x, y, 8.0, False)
    for a, b in zip(g1, g8, strict=True):
        np.testing.assert_allclose(b, 8 * a, rtol=1e-5, atol=1e-12)


def test_half_rounding_and_underflow_count():
    a = np.array([1e-8, 3e-8, 1e-4, 1.0 + 2**-12, 7e4, -7e4], np.float32)
    h = _demo._half(a)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(h, a.astype(np.float16).astype(np.float32))
    assert h[0] == 0 and h[1] != 0 and np.isinf(h[4]) and h[5] == -np.inf
    lost, total = _demo._underflow([h, None], [a, None])
    assert (lost, total) == (1, 6)


def test_float16_gradients_flush_without_scaling():
    """Tiny logit errors: without scaling the float16 weight gradients lose elements."""
    rng = np.random.default_rng(3)
    m = small_model()
    x = rng.random((64, 6)).astype(np.float32) * 1e-6
    y = rng.integers(0, 3, 64)
    _, g32 = m.loss_and_grads(x, y, 1.0, False)
    _, g16 = m.loss_and_grads(x, y, 1.0, True)
    _, g16s = m.loss_and_grads(x, y, 2.0**12, True)
    lost, _total = _demo._underflow(g16, g32)
    lost_scaled, _ = _demo._underflow(g16s, g32)
    assert lost > 0 and lost_scaled < lost


def test_cli_without_the_demo_extra(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a)
    )
    assert _cli.main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "sklearn" in err and "lscore[demo]" in err


def test_cli_torch_backend_says_what_is_missing(monkeypatch, capsys):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    assert _cli.main(["demo", "--backend", "torch"]) == 2
    assert "lscore[torch]" in capsys.readouterr().err


def test_short_run_writes_table_png_and_json(tmp_path, capsys):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    assert _cli.main(["demo", "--steps", "30", "--seed", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for mode in _demo.MODES:
        assert mode in out
    png = tmp_path / "lscore_demo.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = json.loads((tmp_path / "lscore_demo.json").read_text())
    assert [r["mode"] for r in res["results"]] == list(_demo.MODES)
    assert res["config"]["steps"] == 30 and res["config"]["seed"] == 1
    assert res["results"][0]["underflow_fraction"] is None
    assert 0 <= res["results"][1]["underflow_fraction"] <= 1
