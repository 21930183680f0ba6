"""`lscore bench --suite fp8`, the block-scaled rows (the tiny run's rows are checked in
test_bench_fp8): sizes, targets, and that the torch baseline (torchao 0.18.0's eager ops
written out) writes the bytes torchao recorded and lscore's torchao presets write."""

import pathlib

import numpy as np
import pytest

from lscore.bench import _mx

DATA = pathlib.Path(__file__).parents[1] / "core" / "data" / "torchao_mx.npz"


def test_a_size_that_is_not_whole_blocks_is_skipped():
    class Opts:
        tiny, sizes_given, sizes, use_torch, only = False, True, (1000,), False, ()

    from lscore.bench._harness import Rows

    rows = Rows(0, False)
    _mx.run_cpu(Opts(), rows, np.random.default_rng(0))
    assert {r["skipped"] for r in rows.rows} == {
        "1000 elements are not a whole number of blocks of 32"
    }
    assert len(rows.rows) == len(_mx.RECIPES) * len(_mx.DTYPES)


def test_shape_of():
    assert _mx.shape_of(10**6) == (250, 4000)
    assert _mx.shape_of(10**8) == (25000, 4000)
    assert _mx.shape_of(1024) == (1, 1024)


def test_targets_name_the_issue_ratios():
    class Opts:
        tiny, sizes_given, sizes = False, True, (10**7, 10**8)

    rows = [
        {"group": "fp8 mxfp8-floor float32 1e8", "method": m, "min_s": s, "median_s": s}
        for m, s in (
            ("lscore", 1.0),
            ("lscore out=", 0.8),
            ("torch eager", 12.0),
            ("byte floor", 0.4),
        )
    ]
    rows.append(dict(rows[1], method="lscore out= axis 0", min_s=0.9, median_s=0.9))
    found = {t["target"]: t for t in _mx.targets(rows, Opts())}
    assert len(found) == 12  # two recipes, two dtypes, three targets, at 1e8 only
    eager = found["fp8 mxfp8-floor float32 1e8: torch eager / lscore"]
    assert eager["measured"] == 12.0 and eager["met"] is True
    floor = found["fp8 mxfp8-floor float32 1e8: lscore out= / byte floor"]  # into given arrays
    assert floor["measured"] == 2.0 and floor["met"] is True
    down = found["fp8 mxfp8-floor float32 1e8: lscore out= axis 0 / byte floor"]  # the columns
    assert down["measured"] == pytest.approx(2.25) and down["met"] is False
    assert found["fp8 mxfp8-rceil bfloat16 1e8: torch eager / lscore"]["measured"] is None


def test_mid_size_targets_hold_the_out_rows_to_twice_the_floor():
    class Opts:
        tiny, sizes_given, sizes = False, True, (10**6,)

    rows = [
        {"group": "fp8 mxfp8-rceil bfloat16 1e6", "method": m, "min_s": s, "median_s": s}
        for m, s in (("lscore", 3.0), ("lscore out=", 1.0), ("byte floor", 0.4))
    ]
    found = {t["target"]: t for t in _mx.targets(rows, Opts())}
    assert len(found) == 8  # two recipes, two dtypes, the two out= rows, at 1e6
    out = found["fp8 mxfp8-rceil bfloat16 1e6: lscore out= / byte floor"]
    assert out["measured"] == 2.5 and out["required"] == 2.0 and out["met"] is False
    assert found["fp8 mxfp8-rceil bfloat16 1e6: lscore out= axis 0 / byte floor"]["met"] is None


def test_gpu_targets_only_where_a_device_timed_the_rows():
    class Opts:
        tiny, sizes_given, sizes = False, True, (10**8,)

    rows = [
        {"group": "fp8 gpu mxfp8-rceil bfloat16 1e8", "method": m, "min_s": s, "median_s": s}
        for m, s in (("lscore", 1.4e-4), ("byte floor", 1e-4))
    ]
    rows.append({"group": "fp8 gpu mxfp8-floor bfloat16 1e8", "method": "lscore", "skipped": "x"})
    gpu = [t for t in _mx.targets(rows, Opts()) if "gpu" in t["target"]]
    assert [t["target"] for t in gpu] == ["fp8 gpu mxfp8-rceil bfloat16 1e8: lscore / byte floor"]
    assert gpu[0]["measured"] == pytest.approx(1.4) and gpu[0]["met"] is True


def test_gpu_rows_run_on_any_torch_device():
    """The GPU rows' code, run on CPU tensors: every recipe and dtype times lscore, torchao's
    eager path and the copy, and each group gets its byte floor."""
    pytest.importorskip("torch")

    class Opts:
        tiny, sizes_given, sizes, use_torch, only = False, True, (4096,), True, ()
        repeat, min_time = 1, 0.0

    from lscore.bench._harness import Rows

    rows = Rows(0, False)
    _mx.run_gpu(Opts(), rows, np.random.default_rng(0), device="cpu")
    rows.close()
    by = {(r["group"], r["method"]): r for r in rows.rows}
    for name in _mx.DTYPES:
        for recipe in _mx.RECIPES:
            g = f"fp8 gpu {recipe} {name} 4096"
            for method in ("lscore", "torch eager", "byte floor"):
                assert "min_s" in by[g, method], (g, method)
        assert "min_s" in by[f"fp8 gpu mxfp8-rceil {name} 4096", "lscore te"]


def test_gpu_rows_are_one_skipped_row_without_a_device():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")

    class Opts:
        tiny, sizes_given, sizes, use_torch, only = False, True, (4096,), True, ()

    from lscore.bench._harness import Rows

    rows = Rows(0, False)
    _mx.run_gpu(Opts(), rows, np.random.default_rng(0))
    assert [(r["method"], r["skipped"]) for r in rows.rows] == [("lscore", "no CUDA device")]


def _bytes(torch, t):
    return t.contiguous().view(torch.uint8).numpy().reshape(-1)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_torch_baseline_writes_torchaos_recorded_bytes(dtype):
    torch = pytest.importorskip("torch")
    data = np.load(DATA)
    bits = data[f"{dtype}_mx_x"]
    x = torch.from_numpy(bits.view(np.int32 if dtype == "f32" else np.int16))
    x = x.view(torch.float32 if dtype == "f32" else torch.bfloat16)
    fns = _mx.torch_fns(torch)
    for mode in ("floor", "rceil"):
        s, q = fns[f"mxfp8-{mode}"](x)
        np.testing.assert_array_equal(
            _bytes(torch, s), data[f"{dtype}_e4m3fn_{mode}_scale"].reshape(-1)
        )
        np.testing.assert_array_equal(
            _bytes(torch, q), data[f"{dtype}_e4m3fn_{mode}_data"].reshape(-1)
        )
    bits = data[f"{dtype}_nv_x"]
    x = torch.from_numpy(bits.view(np.int32 if dtype == "f32" else np.int16))
    x = x.view(torch.float32 if dtype == "f32" else torch.bfloat16)
    for g in range(x.shape[0] // 8):  # the recording's tensor scale: each group of 8 blocks
        s, q = fns["nvfp4"](x[g * 8 : (g + 1) * 8].contiguous())
        rows = slice(g * 8, (g + 1) * 8)
        np.testing.assert_array_equal(
            _bytes(torch, s), data[f"{dtype}_nvfp4_pts_scale"][rows].reshape(-1)
        )
        np.testing.assert_array_equal(
            _bytes(torch, q), data[f"{dtype}_nvfp4_pts_data"][rows].reshape(-1)
        )


@pytest.mark.parametrize("name", _mx.DTYPES)
def test_torch_baseline_equals_lscores_torchao_presets(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    from lscore.bench._harness import as_tensor, dtype_of

    rng = np.random.default_rng(35)
    x = (rng.standard_normal(64 * 32) * 2.0 ** rng.integers(-40, 40, 64 * 32)).astype(np.float32)
    x[:32] = 0
    x[40] = np.inf
    x[100] = -(2.0**-130)
    x = x.astype(dtype_of(name)).reshape(_mx.shape_of(x.size))
    t = as_tensor(torch, x)
    t_fns = _mx.torch_fns(torch)
    l_fns = (_mx.lscore_fns(x), _mx.lscore_fns(x, reuse=True))  # new arrays, and out=
    for _ in range(2):
        for recipe in _mx.RECIPES:
            ts, tq = t_fns[recipe](t)
            for fns in l_fns:
                ls, lq = fns[recipe]()
                np.testing.assert_array_equal(_bytes(torch, ts), ls.reshape(-1))
                np.testing.assert_array_equal(_bytes(torch, tq), lq.reshape(-1))
        x.reshape(-1)[7] = np.nan  # a NaN block: scale 0xFF, and NVFP4's tensor scale NaN
