"""`lscore bench` runs on tiny sizes and its JSON has every row (no timed assertions)."""

import json
import math

import numpy as np
import pytest

from lscore import bench
from lscore import cli as _cli
from lscore._ext import _scan
from lscore.bench._harness import Rows


def expected_rows():
    """Every (group, method) the tiny run must report (skipped or not), from the issue's list."""
    rows = set()
    for n in (1000, 4096):
        size = "1e3" if n == 1000 else str(n)
        for dt in ("float16", "bfloat16", "float32", "float64"):
            for m in (
                "lscore",
                "lscore 1 thread",
                "np.isfinite(a).all()",
                "np.sum(a.view(uint64))",
                "C read loop",
            ):
                rows.add((f"all_finite {dt} {size}", m))
            for m in (
                "lscore",
                "lscore 1 thread",
                "lscore stats=True",
                "a *= inv; np.isfinite(a).all()",
                "torch foreach",
                "np.copyto",
                "C memcpy",
            ):
                rows.add((f"unscale_ {dt} {size}", m))
    for m in (
        "lscore all_finite",
        "lscore unscale_",
        "numpy loop isfinite().all()",
        "numpy loop a *= inv; isfinite",
        "torch foreach",
    ):
        rows.add(("300 x 64 float32", m))
    log_list = "300 log-uniform 1e2..1e3"  # --tiny: sizes up to 1e3
    for dt in ("float16", "bfloat16", "float64"):
        for m in ("lscore all_finite", "lscore unscale_", "torch foreach"):
            rows.add((f"300 x 64 {dt}", m))
    for dt in ("float16", "bfloat16", "float32", "float64"):
        for m in ("lscore unscale_", "lscore stats=True", "torch foreach"):
            rows.add((f"unscale_ {dt} {log_list}", m))
    for dt in ("float16", "bfloat16", "float32"):
        for case in ("4096", log_list):
            for m in bench._gradscaler.CLIP_METHODS:
                rows.add((f"unscale_and_clip_ {dt} {case}", m))
    for case in ("300 x 64", "300 log-uniform 1e2..1e5"):
        for m in (
            "torch.amp.GradScaler('cpu')",
            "lscore core + SGD (numpy views)",
            "lscore.adapters.torch.GradScaler",
        ):
            rows.add((f"GradScaler step, {case}", m))
    for m in (
        bench.GRAD_HARNESS,
        "torch.amp.GradScaler('cpu')",
        "lscore.adapters.torch.GradScaler",
    ):
        for count in (300, 1):
            rows.add((f"GradScaler.unscale_ + update, {count} x 64", m))
    for device in ("cpu", "cuda"):
        for count in (300, 2000):
            for call in ("scale", "unscale_", "step", "update", "whole step"):
                for m in ("torch.amp.GradScaler", "lscore.adapters.torch.GradScaler"):
                    rows.add((f"GradScaler device path {device}, {count} x 64 float32: {call}", m))
    rows.add(("NaN at index 0 of 4096 float32", "lscore all_finite"))
    rows.add(("NaN at index 0 of 4096 float32", "np.isfinite(a).all()"))
    rows.add(("DynamicLossScale.update([1 element])", "lscore"))
    rows.add(("import lscore (after numpy)", "subprocess"))
    for m in ("lscore", "lscore 1 thread", "lscore 2 threads"):
        rows.add(("unscale_ float32 4096, other core busy", m))
    auto = _scan.isa()
    for what in ("all_finite", "unscale_"):
        for level in _scan.isa_levels():
            rows.add((f"ISA levels, {what} float32 4096", level))
        rows.add((f"ISA levels, {what} float32 4096", f"auto ({auto})"))
    return rows


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    assert _cli.main(["bench", "--tiny", "--no-progress", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_json_has_every_row(tiny_run):
    got = {(r["group"], r["method"]) for r in tiny_run["rows"]}
    missing = expected_rows() - got
    assert not missing, sorted(missing)


def test_rows_are_timed_or_say_why_not(tiny_run):
    for r in tiny_run["rows"]:
        if "skipped" in r:
            assert r["skipped"], r
            if "torch" in r["method"] or "GradScaler" in r["group"]:
                continue
            assert "ml_dtypes" in r["skipped"], r
            continue
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], r
        assert math.isfinite(r["median_s"]) and r["repeats"] >= 1, r
        if r["bytes"]:
            assert r["gbps"] > 0, r
        for v in r.get("ratios", {}).values():
            assert v > 0, r


def test_ratios_and_targets_present(tiny_run):
    af = next(
        r
        for r in tiny_run["rows"]
        if r["group"] == "all_finite float32 4096" and r["method"] == "lscore"
    )
    assert set(af["ratios"]) == {"numpy", "np.sum", "C read"}
    names = [t["target"] for t in tiny_run["targets"]]
    assert any("NaN at index 0" in n for n in names)
    assert any("DynamicLossScale.update" in n for n in names)
    assert any("import lscore" in n for n in names)
    assert sum("per tensor" in n for n in names) == 2
    clip = [
        r for r in tiny_run["rows"] if "clip" in r["group"] and r["method"].startswith("lscore")
    ]
    assert clip and all("torch" in r["ratios"] for r in clip), clip
    assert tiny_run["machine"]["isa"] == _scan.isa()


def test_gradscaler_device_path_rows(tiny_run):
    """Each call of a step of lscore's GradScaler on torch's kernel path, timed against
    torch.amp.GradScaler's on the CPU (on CUDA too when there is one), with the ratio and
    the step's target at 300 and 2000 tensors."""
    import torch

    from lscore.bench import _scaler

    rows = [r for r in tiny_run["rows"] if r["group"].startswith(_scaler.GROUP)]
    assert len(rows) == 2 * 2 * 5 * 2
    for r in rows:
        count = int(r["group"].split(", ")[1].split(" x ")[0])
        if " cuda, " in r["group"] and not torch.cuda.is_available():
            assert r["skipped"] == "no CUDA device", r
            continue
        assert r["per"] == count and r["per_unit"] == "tensor", r
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], r
        if r["method"] == _scaler.LSCORE_METHOD:
            assert r["ratios"]["torch"] > 0, r
        else:
            assert "ratios" not in r, r
    step = {(r["group"], r["method"]): r for r in rows if r["group"].endswith("whole step")}
    for (g, m), r in step.items():
        if "median_s" in r:  # a whole step is at least its slowest call
            calls = [x for x in rows if x["method"] == m and x["group"].startswith(g[:-10])]
            assert r["max_s"] >= max(x["min_s"] for x in calls if x is not r), r
    targets = [t for t in tiny_run["targets"] if t["target"].startswith(_scaler.GROUP)]
    assert [t["target"].split(", ")[2] for t in targets] == [
        "300 tensors: lscore step host time / torch's",
        "2000 tensors: lscore step host time / torch's",
    ]
    assert all(t["met"] == (t["measured"] <= 1.0) for t in targets), targets


def test_table_prints_every_row(tiny_run):
    text = bench.format_table(tiny_run)
    assert text.count("\n| ") >= len(tiny_run["rows"]) + len(tiny_run["targets"])


def test_rows_of_a_group_are_timed_in_turns():
    """flush() takes the timings of the queued rows round-robin, each after its `before`."""
    log = []
    opts = bench.Options(tiny=True, progress=False)
    rows = Rows(2, False)
    rows.add("g", "one", lambda: log.append("1"), before=lambda: log.append("A"), opts=opts)
    rows.add("g", "two", lambda: log.append("2"), before=lambda: log.append("B"), opts=opts)
    rows.add("g", "skipped", skip="why not", opts=opts)
    assert log == [] and [r["method"] for r in rows.rows] == ["one", "two", "skipped"]
    rows.flush()
    befores = [x for x in log if x in "AB"]
    assert befores == ["A", "B"] + ["A", "B"] * opts.repeat  # calibration, then turns
    for r in rows.rows[:2]:
        assert r["repeats"] == opts.repeat and 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
    assert rows.rows[2]["skipped"] == "why not"


# ---- --suite gpu-host / gpu ------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_host_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "gpu_host.json"
    assert (
        _cli.main(["bench", "--suite", "gpu-host", "--tiny", "--no-progress", "--json", str(path)])
        == 0
    )
    return json.loads(path.read_text())


def test_gpu_host_targets_carry_unit_cached_measured_required_met(gpu_host_run):
    from lscore.bench import _gpu_step, _harness

    assert gpu_host_run["suite"] == "gpu-host"
    targets = gpu_host_run["targets"]
    workloads = {t["workload"] for t in targets}
    assert workloads == {name for name, *_ in _harness.TINY_WORKLOADS}
    kinds = {(t["unit"], t["cached"], t.get("case")) for t in targets}
    assert kinds == {
        ("us_per_array", True, None),
        ("us_per_call", True, None),
        ("us_per_array", False, None),
        ("us_per_array", False, "new_addresses"),
    }
    for t in targets:
        if t.get("case") == "new_addresses":
            # addresses in the kernel arguments: nothing uploaded, nothing synchronised
            assert t["uploads"] == 0 and t["syncs"] == 0, t
            assert t["required"] == 1.0 and t["met"] == (t["measured"] <= 1.0), t
            continue
        assert t["measured"] >= 0 and t["met"] == (t["measured"] <= t["required"]), t
        assert (
            t["required"]
            == {
                ("us_per_array", True): 0.2,
                ("us_per_call", True): 15.0,
                ("us_per_array", False): 2.0,
            }[(t["unit"], t["cached"])]
        )
    new = [t for t in targets if t.get("case") == "new_addresses"]
    steps = {
        f"{m} {name} step" for m in _gpu_step.LSCORE_METHODS[:2] for name in _gpu_step.OPTIMIZERS
    }
    assert {t["workload"] for t in new} == workloads and {t["op"] for t in new} == {
        "unscale_",
        "all_finite",
    } | steps
    # each workload: the two calls and the four fused steps over arrays at new addresses
    assert len(new) == len(workloads) * (2 + len(steps))
    for r in gpu_host_run["rows"]:
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], r
    assert bench.format_table(gpu_host_run).count("\n| ") >= len(gpu_host_run["rows"])


def test_gpu_host_times_whole_fused_steps(gpu_host_run):
    """Both optimizers in both modes on every workload, each a fused step."""
    from lscore.bench import _gpu_step, _harness

    steps = {
        (r["group"], r["method"])
        for r in gpu_host_run["rows"]
        if r["group"].startswith("gpu-host step")
    }
    assert steps == {
        (f"gpu-host step {o} {w}", f"{m} step, {case}")
        for w, *_ in _harness.TINY_WORKLOADS
        for o in _gpu_step.OPTIMIZERS
        for m in _gpu_step.LSCORE_METHODS[:2]
        for case in ("cached", "gradients at new addresses")
    }


def test_the_null_adapter_steps_through_the_fused_launches_only():
    """gpu-host's step rows time the fused path: a cached sync-free step is its launches
    (check, update, per dtype group; the scale update), no elementwise work, no read."""
    from lscore.bench import _gpu_step, _standin

    dev = _gpu_step.StepDevice(np, _standin.null_adapter(), lambda: None, None)
    grads = [np.ones(n, dt) for n, dt in ((5, np.float16), (70, np.float32), (3, np.float16))]
    step, params = _gpu_step.lscore_step(
        dev, "Adam", grads, [np.ones(g.size, np.float32) for g in grads], True
    )
    step()
    backend = dev.adapter.SGD._backend.kernels.device(0).backend
    launches, syncs = backend.launches, backend.syncs
    step()
    assert (backend.launches - launches, backend.syncs - syncs) == (2 * 2 + 1, 0)
    assert all((p == 1).all() for p in params)  # NullBackend launches do nothing


def test_gpu_host_times_the_adapters_path_with_only_the_launch_replaced():
    """The bench's binding, run on the host harness instead of the null device, computes
    what the CPU core computes: the timed path is the real one up to the launch."""
    harness = pytest.importorskip("helpers.cuda_host")
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("g++ is missing")
    import numpy as np

    import lscore
    from lscore.bench import _standin

    kern = _standin.standin_kernels(lambda dev: harness.HostBackend())
    lists = _standin.HostLists([5, 70000, 3], "float32", 1)
    arrays = lists.make(0)
    arrays[1].host[7] = np.inf
    want = [a.host.copy() for a in arrays]
    assert kern.unscale_(arrays, 0.5) is lscore.unscale_(want, 0.5) is False
    assert all(np.array_equal(a.host, w) for a, w in zip(arrays, want, strict=True))
    null = _standin.standin_kernels()
    assert null.unscale_(arrays, 0.5) and null.device(0).backend.syncs == 1


def test_gpu_suite_skips_with_a_reason_without_a_gpu(tmp_path):
    from lscore.bench import _gpu

    if _gpu.gpu_skip_reason() is None:
        pytest.skip("a GPU is here: the gpu suite runs for real (pytest -m gpu)")
    path = tmp_path / "gpu.json"
    assert (
        _cli.main(["bench", "--suite", "gpu", "--tiny", "--no-progress", "--json", str(path)]) == 0
    )
    out = json.loads(path.read_text())
    assert out["rows"] and all("no CUDA device" in r["skipped"] for r in out["rows"])
    from lscore.bench import _gpu_step

    assert {r["method"] for r in out["rows"]} == set(_gpu.GPU_METHODS) | set(_gpu_step.STEP_METHODS)
    assert all(t["met"] is None and t["measured"] is None for t in out["targets"])


@pytest.mark.slow
def test_gpu_step_rows_run_on_the_host_harness():
    """The whole-step rows' code (lscore's modes, torch's foreach and fused, the floor) runs
    end to end on NumPy arrays with the CPU host harness standing in for the GPU, and each
    lscore mode trains its parameters as lscore's NumPy adapter does."""
    pytest.importorskip("torch")
    from helpers.cuda_host import adapter
    from lscore.bench import _gpu_step
    from lscore.bench._harness import Rows
    from lscore.bench._report import add_ratios, format_table

    dev = _gpu_step.StepDevice(
        np, adapter, lambda: None, "cpu", no_capture="graph capture needs CuPy on a GPU"
    )
    opts = bench.Options(tiny=True, progress=False, suite="gpu")
    rows = Rows(0, False)
    targets = _gpu_step.run_steps(dev, opts, rows, np.random.default_rng(0))
    add_ratios(rows.rows)
    groups = {r["group"] for r in rows.rows}
    assert len(groups) == len(_gpu_step.TINY_STEP_WORKLOADS) * len(_gpu_step.OPTIMIZERS)
    for g in groups:
        got = {r["method"]: r for r in rows.rows if r["group"] == g}
        assert set(got) == set(_gpu_step.STEP_METHODS)
        assert got[_gpu_step.LSCORE_METHODS[2]]["skipped"] == dev.no_capture
        for m in _gpu_step.LSCORE_METHODS[:2] + _gpu_step.TORCH_METHODS + (_gpu_step.FLOOR,):
            assert got[m]["median_s"] > 0, (g, m)
        assert "torch fused" in got[_gpu_step.LSCORE_METHODS[1]]["ratios"]
    assert all(
        "step" in line
        for line in format_table({"rows": rows.rows, "targets": targets}).splitlines()
        if "/step)" in line
    )
    measured = [t for t in targets if t["measured"] is not None]
    assert {t["unit"] for t in targets} == {"time ratio"}
    assert len(measured) == len(groups) * 2 + len(_gpu_step.TINY_STEP_WORKLOADS)
    assert all(t["met"] == (t["measured"] <= t["required"]) for t in measured)


def test_gpu_step_rows_lscore_steps_follow_the_numpy_adapter():
    """A bench step (minimize over given scaled gradients) is a real training step: after
    three of them, parameters equal lscore.adapters.numpy's on the same gradients."""
    from helpers.cuda_host import adapter
    from lscore.adapters import numpy as lnp
    from lscore.bench import _gpu_step

    dev = _gpu_step.StepDevice(np, adapter, lambda: None, None)
    rng = np.random.default_rng(1)
    params0 = [rng.standard_normal(n, dtype=np.float32) for n in (3, 70, 1)]
    grads = [
        (rng.standard_normal(p.size, dtype=np.float32) * 30).astype(np.float16) for p in params0
    ]
    for name in _gpu_step.OPTIMIZERS:
        for sync_free in (False, True):
            step, params = _gpu_step.lscore_step(dev, name, grads, params0, sync_free)
            ref = [p.copy() for p in params0]
            opt = lnp.LossScaleOptimizer(
                _gpu_step.inner_optimizer(lnp, name), initial_scale=_gpu_step.INIT_SCALE
            )
            for _ in range(3):
                step()
                opt.minimize(lambda s: (0.0, grads), ref)
            for a, b in zip(params, ref, strict=True):
                np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
