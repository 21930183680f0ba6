"""`lscore demo`: the float16 rounding, the hand-written backprop, the data, the CLI and the
story a short run tells (float16 flushes gradients without scaling; the dynamic scale grows,
overflows, skips and backs off)."""

import importlib.util
import json
import re

import numpy as np
import pytest

from helpers.demo_story import check_scale_path, check_story
from lscore import cli as _cli
from lscore.cli import demo as _demo
from lscore.cli.demo import model, numpy_backend

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given
from hypothesis import strategies as st


def _cast(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(
        np.array_equal(a.view(np.uint32), b.view(np.uint32))
        or (
            np.array_equal(a, b, equal_nan=True)
            and np.array_equal(np.signbit(a[a == 0]), np.signbit(b[b == 0]))
        )
    )


def test_half_matches_numpy_cast_across_float32_bit_patterns():
    """Every 9973rd float32 bit pattern (all exponents, both signs, subnormals, inf, NaN)
    rounds to the value NumPy's float16 cast gives (zero's sign aside)."""
    bits = np.arange(0, 2**32, 9973, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    got, want = model._half(x), _cast(x)
    assert np.array_equal(got, want, equal_nan=True)
    # ties around the float16 boundaries, overflow and the smallest subnormal
    edges = np.array(
        [65504, 65519.99, 65520, -65520, 2**-14, 2**-25, 2**-25 * 1.0001, 3 * 2**-25, 1 + 2**-11],
        np.float32,
    )
    assert np.array_equal(model._half(edges), _cast(edges))


@given(st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=64))
def test_half_matches_numpy_cast_on_generated_values(values):
    x = np.array(values, np.float32)
    assert np.array_equal(model._half(x), _cast(x), equal_nan=True)


def small_cfg(layers=2):
    cfg = _demo.config(tiny=True)
    cfg.update(vocab=7, context=3, embed=2, hidden=5, layers=layers)
    return cfg


def test_backprop_matches_finite_differences():
    rng = np.random.default_rng(1)
    m = model.LM(small_cfg(), rng)
    m.params = [p.astype(np.float64) for p in m.params]  # float64: clean differences
    ids = rng.integers(0, 7, (8, 3))
    y = rng.integers(0, 7, (8, 2))
    y[0] = 4  # a word twice among the next tokens: its target is still 1
    _, grads, _ = m.loss_and_grads(ids, y, 1.0, half=False)
    for k, p in enumerate(m.params):
        for idx in list(np.ndindex(p.shape))[:6]:
            old = p[idx]
            p[idx] = old + 1e-6
            up = m.loss_and_grads(ids, y, 1.0, False)[0]
            p[idx] = old - 1e-6
            down = m.loss_and_grads(ids, y, 1.0, False)[0]
            p[idx] = old
            assert grads[k][idx] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-8)


def test_scaled_gradients_are_scale_times_unscaled_in_float32():
    rng = np.random.default_rng(2)
    m = model.LM(small_cfg(), rng)
    ids, y = rng.integers(0, 7, (8, 3)), rng.integers(0, 7, (8, 2))
    _, g1, d1 = m.loss_and_grads(ids, y, 1.0, False)
    _, g8, d8 = m.loss_and_grads(ids, y, 8.0, False)
    np.testing.assert_allclose(d8, 8 * d1, rtol=1e-5, atol=1e-12)
    for a, b in zip(g1, g8, strict=True):
        np.testing.assert_allclose(b, 8 * a, rtol=1e-5, atol=1e-12)


def test_the_loss_is_binary_cross_entropy_over_batch_and_vocabulary():
    rng = np.random.default_rng(4)
    m = model.LM(small_cfg(), rng)
    ids, y = rng.integers(0, 7, (5, 3)), rng.integers(0, 7, (5, 2))
    loss, _, _ = m.loss_and_grads(ids, y, 1.0, False)
    z = m.forward(ids, False)[0].astype(np.float64)
    t = np.zeros_like(z)
    for i, row in enumerate(y):
        t[i, row] = 1
    want = np.mean(np.logaddexp(0, z) - z * t)
    assert loss == pytest.approx(want, rel=1e-5)


@pytest.mark.slow
def test_float16_flushes_the_logits_gradient_and_scaling_keeps_it():
    """Binary cross-entropy averaged over 2**25 elements (the demo's batch x vocabulary):
    every logit's gradient is at most 2**-25, so float16 flushes all of them; a scale of
    2**16 keeps nearly all."""
    cfg = _demo.config(tiny=True)
    rng = np.random.default_rng(3)
    m = model.LM(cfg, rng)
    n = 2**25 // cfg["vocab"]
    ids = rng.integers(0, cfg["vocab"], (n, cfg["context"]))
    y = rng.integers(0, cfg["vocab"], (n, cfg["ahead"]))
    _, g32, d32 = m.loss_and_grads(ids, y, 1.0, False)
    _, g16, d16 = m.loss_and_grads(ids, y, 1.0, True)
    _, g32s, d32s = m.loss_and_grads(ids, y, 2.0**16, False)
    _, g16s, d16s = m.loss_and_grads(ids, y, 2.0**16, True)
    raw = model.flushed(d16, g16, d32, g32)
    scaled = model.flushed(d16s, g16s, d32s, g32s)
    assert raw.shape == (len(model.layer_names(len(m.params))), 2)
    assert (raw[:, 0] == raw[:, 1]).all() and raw[0, 1] == d32.size  # all flushed
    assert scaled[0, 0] < raw[0, 0] // 100
    assert (raw[:, 1] == scaled[:, 1]).all()


def test_the_test_text_is_other_modules():
    train, test = model.tokens()
    assert len(train) > 9 * len(test) / 2 > 0
    assert "def" in train and "def" in test
    w = model.windows(np.arange(10, dtype=np.int32), 4)
    assert w.shape == (6, 5) and (w[:, -1] == np.arange(4, 10)).all()
    w = model.windows(np.arange(10, dtype=np.int32), 4, 3)
    assert w.shape == (4, 7) and (w[:, 4:] == np.arange(4, 8)[:, None] + np.arange(3)).all()


def test_accuracy_counts_the_top_word_among_the_next_tokens():
    m = model.LM(small_cfg(layers=1), np.random.default_rng(5))
    w = np.random.default_rng(6).integers(0, 7, (40, 5))
    top = np.argmax(m.forward(w[:, :3], False)[0], axis=1)
    want = np.mean([t in row for t, row in zip(top, w[:, 3:], strict=True)])
    assert m.accuracy(w, False) == want


def test_without_the_standard_library_source_it_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(model.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    with pytest.raises(RuntimeError, match=r"too few \.py files"):
        model.tokens()


def test_cli_without_the_demo_extra(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "threadpoolctl" else real(name, *a),
    )
    assert _cli.main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "threadpoolctl" in err and 'pip install ".[demo]"' in err


def test_cli_torch_backend_says_what_is_missing(monkeypatch, capsys):
    pytest.importorskip("threadpoolctl")
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    assert _cli.main(["demo", "--backend", "torch"]) == 2
    assert 'pip install ".[torch]"' in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_run_tells_the_story(tmp_path, capsys, monkeypatch):
    pytest.importorskip("threadpoolctl")
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    records = []
    real = numpy_backend.train
    monkeypatch.setattr(numpy_backend, "train", lambda *a: records.append(real(*a)) or records[-1])
    assert _cli.main(["demo", "--tiny", "--seed", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for mode in _demo.MODES:
        assert mode in out
    assert "overflowed and were skipped" in out
    png = tmp_path / "lscore_demo.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = json.loads((tmp_path / "lscore_demo.json").read_text())
    assert res["config"]["steps"] == 8 and res["config"]["seed"] == 1
    check_story(res)
    check_scale_path(records[2]["scale"], records[2]["skipped_at"])
    # the table makes the case: float16 learns with the dynamic scale and not without
    f32, raw, dyn = res["results"]
    assert dyn["test_accuracy"] > raw["test_accuracy"] + 0.05
    assert dyn["test_accuracy"] > f32["test_accuracy"] / 2
    table = out.split("\n\n")[1].splitlines()
    row = {line[:24].strip(): line[24:].split() for line in table[2:]}
    assert row[_demo.MODES[2]][0] == f"{100 * dyn['test_accuracy']:.1f}%"
    assert row[_demo.MODES[1]][0] == f"{100 * raw['test_accuracy']:.1f}%"


def _no_training(monkeypatch):
    monkeypatch.setattr(model, "load_data", lambda cfg: pytest.fail("the demo started its work"))


@pytest.mark.parametrize("where", ["/proc/lscore-nope", "a regular file"])
def test_demo_refuses_an_out_it_cannot_write_before_any_work(tmp_path, capsys, monkeypatch, where):
    for m in ("threadpoolctl", "matplotlib", "tqdm"):
        pytest.importorskip(m)
    _no_training(monkeypatch)
    if where == "a regular file":
        where = str(tmp_path / "results")
        (tmp_path / "results").write_text("mine")
    assert _cli.main(["demo", "--tiny", "--out", where]) == 2
    got = capsys.readouterr()
    assert got.out == ""
    lines = got.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lscore demo: error: argument --out: ")
    assert where in lines[0]


def test_demo_refuses_an_output_name_taken_by_a_folder(tmp_path, monkeypatch):
    _no_training(monkeypatch)
    (tmp_path / "lscore_demo.json").mkdir()
    with pytest.raises(ValueError, match=r"lscore_demo\.json is a folder"):
        _demo.run(tiny=True, out=str(tmp_path))


def test_the_printed_description_is_plain_text():
    """The console showed the docstring's reST marks (``torch.nn.Embedding``, *emulated*)."""
    from lscore.cli.demo import cupy_backend, fp8, numpy_backend, torch_backend

    for module in (numpy_backend, fp8, torch_backend, cupy_backend):
        text = module.DESCRIPTION
        assert "``" not in text and "*emulated*" not in text, module.__name__
        assert re.search(r"(?<![\w*])\*\w", text) is None, module.__name__
    assert "2**-25" in numpy_backend.DESCRIPTION  # a power keeps its stars
    assert "initialised as torch.nn.Embedding and" in numpy_backend.DESCRIPTION
