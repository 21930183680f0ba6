"""`lscore bench --suite gpu-tune`: its JSON and verdict, run tiny on the host harness (the
device abstraction bound to NumPy memory and HostBackend), its refusal of a device whose
results differ from the CPU core, and its skip without a GPU."""

import contextlib
import io
import json
import math
import shutil

import numpy as np
import pytest

from lscore import bench, cuda
from lscore import cli as _cli
from lscore.bench import _gpu, _standin, _tune
from lscore.bench._harness import Rows

needs_harness = pytest.mark.skipif(
    shutil.which("g++") is None, reason="g++ is missing: the CUDA host harness cannot be built"
)


def _host_device():
    from helpers import cuda_host

    return _tune.ArrayDevice(lambda dev: cuda_host.HostBackend())


@pytest.fixture(scope="module")
def tune_run(tmp_path_factory):
    """The CLI's gpu-tune, --tiny, with the harness as its device; (JSON, stdout)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is missing: the CUDA host harness cannot be built")
    path = tmp_path_factory.mktemp("bench") / "tune.json"
    mp = pytest.MonkeyPatch()
    mp.setattr(_tune, "default_device", lambda: (_host_device(), None))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            assert (
                _cli.main(
                    ["bench", "--suite", "gpu-tune", "--tiny", "--no-progress", "--json", str(path)]
                )
                == 0
            )
    finally:
        mp.undo()
    return json.loads(path.read_text()), out.getvalue()


def test_json_has_a_timed_row_per_workload_and_configuration(tune_run):
    result, _ = tune_run
    assert result["suite"] == "gpu-tune"
    tune = result["tune"]
    grid = [_tune.label(c) for c in _tune.grid(tiny=True)]
    names = [name for name, *_ in _tune.workloads(tiny=True)]
    assert tune["grid"] == grid and tune["workloads"] == names
    assert tune["default"] == _tune.label(cuda.LaunchConfig()) == grid[0]
    for name in names:
        got = {r["method"]: r for r in result["rows"] if r["group"] == f"gpu-tune {name}"}
        assert set(grid) <= set(got)
        for label in grid:
            row = got[label]
            assert row["median_s"] > 0 and row["bitwise_equal"] is True
            assert cuda.LaunchConfig(**row["config"]) == cuda.LaunchConfig.parse(label)
            assert row["ratios"]["best"] <= 1.0
            assert math.isclose(
                row["ratios"]["default"] * row["median_s"], got[tune["default"]]["median_s"]
            )
        count = next(c for n, c, *_ in _tune.workloads(tiny=True) if n == name)
        assert (_tune.COPY_METHOD in got) == (count == 1)


def test_every_configuration_equals_the_cpu_core(tune_run):
    result, out = tune_run
    assert result["tune"]["mismatches"] == {}
    equal = [t for t in result["targets"] if "bit for bit" in t["target"]]
    assert len(equal) == 1 and equal[0]["measured"] == 1.0 and equal[0]["met"] is True
    assert "NOT EQUAL" not in out


def test_verdict_is_the_smallest_geometric_mean_of_time_over_best(tune_run):
    result, out = tune_run
    tune = result["tune"]
    times = {
        name: {
            r["method"]: r["median_s"]
            for r in result["rows"]
            if r["group"] == f"gpu-tune {name}" and r["method"] in tune["grid"]
        }
        for name in tune["workloads"]
    }
    geo = {
        c: math.exp(np.mean([math.log(ts[c] / min(ts.values())) for ts in times.values()]))
        for c in tune["grid"]
    }
    assert tune["chosen"] == min(geo, key=geo.get)
    assert math.isclose(tune["gain_over_default"], geo[tune["default"]] / geo[tune["chosen"]])
    for name, p in tune["per_workload"].items():
        assert p["best"] == min(times[name], key=times[name].get)
        assert p["default_over_best"] >= 1.0
    if tune["chosen"] == tune["default"]:
        assert tune["env"] is None and "the default is the best choice" in out
    else:
        name, value = tune["env"].split("=", 1)
        assert name == "LSCORE_CUDA_LAUNCH"
        assert cuda.LaunchConfig.parse(value) == cuda.LaunchConfig.parse(tune["chosen"])
        assert f"use it with: {tune['env']}" in out
    big = [t for t in result["targets"] if "copy of the same bytes" in t["target"]]
    assert len(big) == len(_tune.TINY_BIG) and all(t["measured"] > 0 for t in big)


def test_table_prints_every_row_and_the_chosen_configuration(tune_run):
    result, out = tune_run
    assert bench.format_table(result) in out
    assert f"chosen (smallest geometric mean of time / best): {result['tune']['chosen']}" in out


def test_summarize_picks_the_best_compromise_not_a_workload_winner():
    times = {
        "small": {
            "chunk=65536,block=512": 4.0,
            "chunk=4096,block=128": 1.0,
            "chunk=4096,block=256": 1.1,
        },
        "big": {
            "chunk=65536,block=512": 1.0,
            "chunk=4096,block=128": 3.0,
            "chunk=4096,block=256": 1.2,
        },
    }
    torchs = cuda.LaunchConfig(block=512)  # the default these times are measured against
    s = _tune.summarize(times, torchs)
    assert s["per_workload"]["small"]["best"] == "chunk=4096,block=128"
    assert s["per_workload"]["big"]["best"] == "chunk=65536,block=512"
    assert s["chosen"] == "chunk=4096,block=256"
    assert math.isclose(s["chosen_geomean"], math.sqrt(1.1 * 1.2))
    assert math.isclose(s["gain_over_default"], 2.0 / math.sqrt(1.1 * 1.2))
    assert s["env"] == "LSCORE_CUDA_LAUNCH=chunk=4096,block=256"
    assert math.isclose(s["per_workload"]["small"]["default_over_chosen"], 4.0 / 1.1)
    keep = _tune.summarize(
        {"w": {"chunk=65536,block=512": 1.0, "chunk=4096,block=128": 2.0}}, torchs
    )
    assert keep["chosen"] == "chunk=65536,block=512" and keep["env"] is None


def test_a_device_whose_results_differ_is_reported():
    dev = _tune.ArrayDevice(_standin.NullBackend)  # launches nothing: unscale_ is wrong
    opts = bench.Options(tiny=True, progress=False, suite="gpu-tune")
    rows = Rows(0, False)
    targets, tune = _tune.run_tune(opts, rows, np.random.default_rng(0), dev)
    assert set(tune["mismatches"]) == set(tune["workloads"])
    for cs in tune["mismatches"].values():
        assert set(cs) == set(tune["grid"])
        assert all(why.startswith("finite True, the CPU core says False") for why in cs.values())
    equal = next(t for t in targets if "bit for bit" in t["target"])
    assert equal["measured"] == 0.0 and equal["met"] is False
    assert all(r.get("bitwise_equal") is False for r in rows.rows if r["method"] in tune["grid"])
    assert "NOT EQUAL TO THE CPU CORE" in _tune.format_summary(tune)


@needs_harness
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_mismatch_names_the_first_differing_element(dtype):
    class OneUlpOff(_tune.ArrayDevice):
        def read(self, a):
            got = super().read(a)
            if got.size == 5:
                got.view(f"u{got.itemsize}")[2] ^= 1
            return got

    from helpers import cuda_host

    dev = OneUlpOff(lambda d: cuda_host.HostBackend())
    dt = (
        np.dtype(dtype)
        if dtype != "bfloat16"
        else np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    )
    values = _tune.check_values(np.random.default_rng(1), [3, 5, 4], dt)
    arrays = [dev.upload(v) for v in values]
    assert _tune.mismatch(_host_device(), dev.kernels(cuda.LaunchConfig()), arrays, values) is None
    why = _tune.mismatch(dev, dev.kernels(cuda.LaunchConfig()), arrays, values)
    assert why is not None and why.startswith("array 1 element 2: ")
    assert why.endswith("(1 of 5 elements differ)")


def test_gpu_tune_skips_with_a_reason_without_a_gpu(tmp_path, capsys):
    if _gpu.gpu_skip_reason() is not None:
        reason = _gpu.gpu_skip_reason()
    else:
        pytest.skip("a GPU is here: the gpu-tune suite runs for real (pytest -m gpu)")
    path = tmp_path / "tune.json"
    assert (
        _cli.main(["bench", "--suite", "gpu-tune", "--tiny", "--no-progress", "--json", str(path)])
        == 0
    )
    out = json.loads(path.read_text())
    assert out["tune"]["skipped"] == reason
    assert {r["group"] for r in out["rows"]} == {
        f"gpu-tune {n}" for n, *_ in _tune.workloads(tiny=True)
    }
    assert all(r["skipped"] == reason for r in out["rows"])
    assert all(t["measured"] is None for t in out["targets"])
    assert f"gpu-tune: skipped: {reason}" in capsys.readouterr().out


@pytest.mark.gpu
def test_gpu_tune_runs_on_a_gpu_and_every_configuration_is_exact(tmp_path):
    path = tmp_path / "tune.json"
    assert (
        _cli.main(["bench", "--suite", "gpu-tune", "--tiny", "--no-progress", "--json", str(path)])
        == 0
    )
    tune = json.loads(path.read_text())["tune"]
    assert tune["mismatches"] == {} and tune["chosen"] in tune["grid"]


def test_nan_payloads_may_differ_but_nan_against_a_number_may_not():
    class Reads(_tune.ArrayDevice):
        """Returns what it was told the device wrote."""

        def __init__(self, result):
            super().__init__(_standin.NullBackend)
            self.result = result

        def read(self, a):
            return self.result.copy()

    values = [np.array([np.nan, 1.5, 0.75], np.float32)]
    want = _tune.expected(values)
    other_nan = want[0][0].copy()
    other_nan[0] = np.frombuffer(np.uint32(0x7FC00001).tobytes(), np.float32)[0]
    dev = Reads(other_nan)
    kern = dev.kernels(cuda.LaunchConfig())
    arrays = [dev.upload(v) for v in values]
    # NullBackend never marks the flag, so the answer agrees only when the CPU core says finite
    want_found = (want[0], True)
    assert _tune.mismatch(dev, kern, arrays, values, want_found) is None
    number = want[0][0].copy()
    number[0] = 0.0
    why = _tune.mismatch(Reads(number), kern, arrays, values, want_found)
    assert why is not None and why.startswith("array 0 element 0: ")
