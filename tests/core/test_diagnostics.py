"""lscore.diagnostics: NaN/Inf counts per named tensor on skipped steps, rate-limited logging."""

import json
import logging
import sys
import threading

import numpy as np
import pytest

import lscore
from helpers import FLOAT8_DTYPES, FLOAT_DTYPES
from helpers.gen import make_array, nonfinite_values
from lscore.diagnostics import OverflowMonitor, count_nonfinite, named_arrays


def _numpy_counts(a):
    f = np.asarray(a).astype(np.float64)  # exact for every format here
    return int(np.isnan(f).sum()), int(np.isposinf(f).sum()), int(np.isneginf(f).sum())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + FLOAT8_DTYPES, ids=str)
@pytest.mark.parametrize(
    "layout",
    [
        "contiguous",
        "strided",
        "reversed",
        "transposed",
        "byteswapped",
        "unaligned",
        "zero_d",
        "empty",
    ],
)
def test_counts_match_numpy(dtype, layout):
    rng = np.random.default_rng(5)
    values = nonfinite_values(dtype)
    for trial in range(6):
        bad = [
            (int(rng.integers(0, 64)), values[int(rng.integers(0, len(values)))])
            for _ in range(trial * 3)
        ]
        a = make_array(rng, dtype, 64, layout, bad)
        assert count_nonfinite(a) == _numpy_counts(a), (layout, bad)


def test_counts_on_raw_words_and_huge_arrays():
    a = np.zeros((1 << 20) + 7, np.float16)  # more than one chunk
    a[[3, -1]] = np.inf
    a[(1 << 20) + 2] = -np.inf
    a[5] = np.nan
    assert count_nonfinite(a) == (1, 2, 1)
    assert count_nonfinite(a.view(np.int16), "float16") == (1, 2, 1)
    assert count_nonfinite(np.arange(5)) == (0, 0, 0)
    with pytest.raises(TypeError, match="cannot count NaN/Inf in complex128"):
        count_nonfinite(np.ones(2, complex))
    with pytest.raises(TypeError, match="cannot count NaN/Inf in bfloat16 \\(int32\\)"):
        count_nonfinite(np.ones(2, np.int32), "bfloat16")


def test_named_arrays():
    w, b, c = np.ones(1), np.ones(2), np.ones(3)
    assert [n for n, _ in named_arrays({"layer": {"w": w, "b": b}, "c": c})] == [
        "layer.w",
        "layer.b",
        "c",
    ]
    assert [n for n, _ in named_arrays([("fc.weight", w), ("fc.bias", None), ("x", b)])] == [
        "fc.weight",
        "x",
    ]
    assert [n for n, _ in named_arrays([w, [b, None, c]])] == ["0", "1.0", "1.2"]
    assert named_arrays(None) == [] and named_arrays(w) == [("0", w)]


def _run(monitor, events, scale=65536.0, arrays=None):
    """Drive a DynamicLossScale with `events`; the monitor sees each step."""
    ls = lscore.DynamicLossScale(scale, 1000, 2)
    good = {"w": np.ones(3, np.float32)}
    for step, finite in enumerate(events):
        grads = good if finite else (arrays or {"w": np.array([1, np.nan, -np.inf], np.float32)})
        before = ls()
        _, applied = ls.update(grads)
        monitor.observe(step, applied, before, ls(), lambda g=grads: g)
    return ls


def test_first_burst_is_one_summary_line(caplog):
    caplog.set_level(logging.INFO, logger="lscore")
    m = OverflowMonitor(report=False)
    _run(m, [False] * 12 + [True] * 30)
    lines = [r.getMessage() for r in caplog.records if r.name == "lscore"]
    assert lines == ["first 12 steps skipped while the scale fell from 65536 to 16"]
    assert (m.total_skipped, m.consecutive_skipped, m.last_skipped_step) == (12, 0, 11)


def test_report_names_the_tensors_and_counts():
    m = OverflowMonitor(logger=logging.getLogger("lscore.test.quiet"))
    grads = {
        "enc": {"w": np.array([np.nan, 1, np.nan], np.float16)},
        "dec.b": np.array([np.inf, -np.inf, -np.inf, 2.0]),
        "ok": np.ones(4),
    }
    _run(m, [True, False], arrays=grads)
    rep = m.last_report
    assert rep.step == 1 and rep.scale_before == 65536.0 and rep.scale_after == 32768.0
    assert [(t.name, t.nan, t.posinf, t.neginf, t.size) for t in rep.tensors] == [
        ("enc.w", 2, 0, 0, 3),
        ("dec.b", 0, 1, 2, 4),
    ]
    assert str(rep) == (
        "step 1 skipped (scale 65536 -> 32768): enc.w (2 NaN of 3), dec.b (1 +Inf, 2 -Inf of 4)"
    )


def test_arrays_are_read_only_on_skipped_steps():
    calls = []
    m = OverflowMonitor(logger=logging.getLogger("lscore.test.quiet"))
    events = [True, True, False, True, False, False, True]
    for step, finite in enumerate(events):
        m.observe(
            step, finite, 8.0, 8.0 if finite else 4.0, lambda: calls.append(1) or {"g": np.ones(2)}
        )
    assert len(calls) == events.count(False)
    m_off = OverflowMonitor(report=False)
    m_off.observe(0, False, 8.0, 4.0, lambda: calls.append(1))
    assert len(calls) == events.count(False) and m_off.last_report is None


def test_rate_limit_merges_bursts(caplog):
    caplog.set_level(logging.INFO, logger="lscore")
    m = OverflowMonitor(min_interval=100)
    events = [(i % 10) != 9 for i in range(1000)]  # one overflow every 10 steps
    _run(m, events, scale=2.0**100)
    m.flush()
    lines = [r.getMessage() for r in caplog.records if r.name == "lscore"]
    assert m.total_skipped == 100
    assert 1 < len(lines) <= 11
    assert lines[1].startswith("10 steps skipped in steps 19-109 while the scale fell")
    assert "last overflow: w (1 NaN, 1 -Inf of 3)" in lines[1]


def test_endless_burst_reports_at_the_interval(caplog):
    caplog.set_level(logging.INFO, logger="lscore")
    m = OverflowMonitor(min_interval=50, report=False)
    _run(m, [False] * 120, scale=2.0**100)
    lines = [r.getMessage() for r in caplog.records if r.name == "lscore"]
    assert lines == [
        "first 51 steps skipped while the scale fell from 1.2676506e+30 to 5.6294995e+14",
        "51 steps skipped in steps 51-101 while the scale fell from 5.6294995e+14 to 1",
    ]
    assert m.consecutive_skipped == 120 and m.last_skipped_step == 119


def test_state_dict_round_trip_and_validation():
    m = OverflowMonitor(report=False)
    for step in range(5):
        m.observe(step, step != 3, 2.0, 2.0)
    d = m.state_dict()
    assert d == {
        "total_skipped": 1,
        "consecutive_skipped": 0,
        "last_skipped_step": 3,
        "last_report": None,
    }
    n = OverflowMonitor()
    n.load_state_dict(d)
    assert n.state_dict() == d
    with pytest.raises(ValueError, match="total_skipped must be an int >= 0"):
        n.load_state_dict({**d, "total_skipped": -1})
    with pytest.raises(ValueError, match="has the keys"):
        n.load_state_dict({"total_skipped": 1})
    with pytest.raises(ValueError, match="min_interval must be an int >= 0"):
        OverflowMonitor(min_interval=-5)


def test_last_report_survives_a_resume():
    """last_report is in the state dict (JSON-safe): after a resume it is the report of the
    last skipped step, not None until the next skip."""
    m = OverflowMonitor()
    grads = {"w": np.array([1.0, np.nan, -np.inf]), "b": np.ones(2)}
    m.observe(7, False, 2.0**16, float("inf"), grads)
    m.observe(8, True, 2.0**15, 2.0**15)
    d = json.loads(json.dumps(m.state_dict()))
    assert d["last_report"]["scale_after"] == "inf"
    n = OverflowMonitor()
    n.load_state_dict(d)
    assert n.last_report == m.last_report and str(n.last_report) == str(m.last_report)
    assert "w (1 NaN, 1 -Inf of 3)" in str(n.last_report) and n.state_dict() == d
    old = {k: v for k, v in d.items() if k != "last_report"}  # saved before the key existed
    n.load_state_dict(old)
    assert n.last_report is None and n.total_skipped == 1
    bad = {**d, "last_report": {**d["last_report"], "tensors": [{"name": "w"}]}}
    with pytest.raises(ValueError, match=r"last_report\['tensors'\] must be a list"):
        n.load_state_dict(bad)
    assert n.last_report is None


def test_counters_exact_across_threads():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        m = OverflowMonitor(report=False, logger=logging.getLogger("lscore.test.quiet"))

        def work():
            for i in range(3000):
                m.observe(i, i % 3 != 0, 2.0, 1.0)

        threads = [threading.Thread(target=work) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert m.total_skipped == 6 * 1000


def test_names_by_identity():
    w, b = np.ones(2), np.ones(3)
    m = OverflowMonitor(names=[("fc.weight", w), ("fc.bias", b)])
    assert m.name_of(w, "?") == "fc.weight" and m.name_of(np.ones(2), "p3") == "p3"


def test_monitor_pickles():
    import pickle

    m = OverflowMonitor(min_interval=7)
    m.observe(0, False, 4.0, 2.0, {"w": np.array([np.nan])})
    n = pickle.loads(pickle.dumps(m))
    assert n.state_dict() == m.state_dict() and n.min_interval == 7
    assert n.logger is logging.getLogger("lscore")


# ---- the adapters' hooks: reports name parameters, computed on skipped steps only -------


def test_adapter_optimizer_reports_named_variables(backend, caplog):
    """Every adapter's LossScaleOptimizer (NumPy, CuPy, torch) names the culprit."""
    caplog.set_level(logging.INFO, logger="lscore")
    w, b = backend.variables([np.ones(3, np.float32), np.zeros(2, np.float32)])
    opt = backend.LossScaleOptimizer(backend.sgd([w, b], 0.1), initial_scale=8.0)
    opt.overflow_monitor = OverflowMonitor(names=[("dense.w", w), ("dense.b", b)])
    backend.apply(opt, [w, b], [np.ones(3, np.float32), np.array([np.inf, 1], np.float32)])
    backend.apply(opt, [w, b], [np.ones(3, np.float32), np.ones(2, np.float32)])
    m = opt.overflow_monitor
    assert (m.total_skipped, m.last_skipped_step) == (1, 0)
    assert [(t.name, t.posinf) for t in m.last_report.tensors] == [("dense.b", 1)]
    assert [r.getMessage() for r in caplog.records if r.name == "lscore"] == [
        "first 1 step skipped while the scale fell from 8 to 4; last overflow: "
        "dense.b (1 +Inf of 2)"
    ]


def test_torch_adapters_report_named_parameters():
    torch = pytest.importorskip("torch")
    from lscore.adapters.torch import GradScaler, LossScaleOptimizer

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    for kind in ("scaler", "lso"):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon = OverflowMonitor(
            names=model.named_parameters(), logger=logging.getLogger("lscore.test.quiet")
        )
        if kind == "lso":
            opt = LossScaleOptimizer(opt, initial_scale=16.0)
            opt.overflow_monitor = mon
        else:
            scaler = GradScaler("cpu", init_scale=16.0)
            scaler.overflow_monitor = mon
        for i in range(3):
            opt.zero_grad()
            x = torch.ones(1, 3)
            x[0, 0] = float("nan") if i == 1 else 1.0
            loss = model(x).sum()
            if kind == "lso":
                opt.get_scaled_loss(loss).backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        assert (mon.total_skipped, mon.last_skipped_step) == (1, 1), kind
        rep = mon.last_report
        assert rep.scale_before == 16.0 and rep.scale_after == 8.0
        # the NaN in x[0, 0] reaches column 0 of the first weight and the second
        # weight (through the hidden layer); the biases' gradients stay finite
        assert [(t.name, t.nan) for t in rep.tensors] == [("0.weight", 2), ("1.weight", 2)], kind


def test_every_scale_object_has_counters():
    """The diagnostics guide reads "the scale objects' counters()": DynamicLossScale,
    FixedLossScale and the TF1 manager have them too, the state machine's counts."""
    import lscore

    for ls in (lscore.DynamicLossScale(), lscore.FixedLossScale(8.0)):
        for g in (np.inf, 1.0):
            ls.update([np.array([g], np.float32)])
        c = ls.counters()
        assert c == ls.state_dict()["counters"] and c["steps"] == 2
    assert lscore.DynamicLossScale().counters()["steps"] == 0
    m = lscore.ExponentialUpdateLossScaleManager(2.0**15, 10)
    m.update_loss_scale(False)
    assert m.counters()["skipped"] == 1
