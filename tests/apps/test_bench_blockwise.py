"""`lscore bench --suite fp8`, the blockwise FP8 rows: the tiny run's rows and floors, sizes,
targets, the GPU rows' code on CPU tensors, and that the torch baseline (TE's blockwise rule
in torch ops) writes the bytes lscore's te-blockwise preset writes."""

import json

import numpy as np
import pytest

from lscore import cli
from lscore.bench import _blockwise


class Opts:
    tiny, sizes_given, sizes, use_torch, only = False, True, (4096,), True, ()
    repeat, min_time = 1, 0.0


def test_tiny_run_has_the_blockwise_rows(tmp_path):
    path = tmp_path / "fp8.json"
    argv = ["bench", "--suite", "fp8", "--tiny", "--no-torch", "--no-progress", "--json", str(path)]
    assert cli.main(argv) == 0
    groups = {}
    for r in json.loads(path.read_text())["rows"]:
        groups.setdefault(r["group"], {})[r["method"]] = r
    for dt in _blockwise.DTYPES:
        width = 2 if dt == "bfloat16" else 4
        skipped = groups[f"fp8 blockwise-1x128 {dt} 1e3"]["lscore"]["skipped"]
        assert skipped == "1000 elements are not a whole number of blocks of 128"
        copy = groups[f"fp8 blockwise memcpy {dt} 4096"]["C memcpy"]
        for recipe in _blockwise.RECIPES:
            g = groups[f"fp8 {recipe} {dt} 4096"]
            assert g["lscore"]["median_s"] > 0 and g["lscore out="]["median_s"] > 0
            assert g["torch eager"]["skipped"] == "torch is not installed"
            reads, written = _blockwise.TRAFFIC[recipe]
            assert g["byte floor"]["bytes"] == round((reads * width + written) * 4096)
            want = copy["median_s"] * g["byte floor"]["bytes"] / (2 * width * 4096)
            assert g["byte floor"]["median_s"] == pytest.approx(want)
            assert "floor" in g["lscore out="]["ratios"]
    assert groups["fp8 gpu blockwise"]["lscore"]["skipped"] in (
        "torch is not installed",
        "no CUDA device",
    )


def test_shape_of():
    assert _blockwise.shape_of(10**8) == (15625, 6400)
    assert _blockwise.shape_of(10**7) == (3125, 3200)
    assert _blockwise.shape_of(2**20) == (128, 8192)


def test_targets_name_the_issue_ratios():
    class T:
        tiny, sizes_given, sizes = False, True, (2**20, 10**8)

    rows = [
        {"group": "fp8 blockwise-128x128 float32 1e8", "method": m, "min_s": s, "median_s": s}
        for m, s in (
            ("lscore", 1.0),
            ("lscore out=", 0.7),
            ("torch eager", 12.0),
            ("byte floor", 0.5),
        )
    ]
    found = {t["target"]: t for t in _blockwise.targets(rows, T())}
    assert len(found) == 8  # two recipes, two dtypes, two targets, at 1e8 only
    eager = found["fp8 blockwise-128x128 float32 1e8: torch eager / lscore"]
    assert eager["measured"] == 12.0 and eager["met"] is True
    floor = found["fp8 blockwise-128x128 float32 1e8: lscore out= / byte floor"]
    assert floor["measured"] == pytest.approx(1.4) and floor["met"] is True
    assert found["fp8 blockwise-1x128 bfloat16 1e8: torch eager / lscore"]["measured"] is None


def test_gpu_rows_run_on_any_torch_device():
    pytest.importorskip("torch")
    from lscore.bench._harness import Rows

    rows = Rows(0, False)
    _blockwise.run_gpu(Opts(), rows, np.random.default_rng(0), device="cpu")
    rows.close()
    by = {(r["group"], r["method"]): r for r in rows.rows}
    for name in _blockwise.DTYPES:
        for recipe in _blockwise.RECIPES:
            for method in ("lscore", "torch eager", "byte floor"):
                assert "min_s" in by[f"fp8 gpu {recipe} {name} 4096", method], (recipe, method)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(256, 384), (200, 300)])
def test_torch_baseline_is_lscores_quantize(dtype, shape):
    """TE's rule in torch ops writes the inverse scales and codes lscore writes, NaN, Inf,
    zero and tiny blocks and ragged edges included."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    from lscore.bench._harness import as_tensor, dtype_of
    from lscore.fp8 import quantize_blocks

    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, (shape[0], 1))
    x[0, 3], x[1, 5], x[2, 7] = np.nan, np.inf, -np.inf
    x[3], x[4] = 0, 1e-39
    x = x.astype(np.float32).astype(dtype_of(dtype))
    fns = _blockwise.torch_fns(torch)
    for recipe, role in _blockwise.ROLES.items():
        b = quantize_blocks(x, "te-blockwise", role=role)
        s, q = fns[recipe](as_tensor(torch, x))
        np.testing.assert_array_equal(s.numpy().view(np.uint32), b.scales.view(np.uint32))
        np.testing.assert_array_equal(q.view(torch.uint8).numpy(), b.data.view(np.uint8))
