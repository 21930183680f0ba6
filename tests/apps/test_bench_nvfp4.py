"""`lscore bench --suite fp8`, the NVFP4 rows (TE's te-nvfp4 preset): the tiny run's rows and
floors, shapes, targets, the GPU rows' code on CPU tensors, and that the torch baseline (TE's
NVFP4 recipe in torch ops: the Hadamard transform as a matmul, Philox4x32-10 in int64 ops)
writes the bytes lscore writes."""

import json

import numpy as np
import pytest

from lscore import cli
from lscore.bench import _nvfp4


class Opts:
    tiny, sizes_given, sizes, use_torch, only = False, True, (4096,), True, ()
    repeat, min_time = 1, 0.0


def test_tiny_run_has_the_nvfp4_rows(tmp_path):
    path = tmp_path / "fp8.json"
    argv = ["bench", "--suite", "fp8", "--tiny", "--no-torch", "--no-progress", "--only",
            "nvfp4", "--json", str(path)]  # fmt: skip
    assert cli.main(argv) == 0
    groups = {}
    for r in json.loads(path.read_text())["rows"]:
        groups.setdefault(r["group"], {})[r["method"]] = r
    skipped = groups["fp8 nvfp4-rht bfloat16 1e3"]["lscore"]["skipped"]
    assert skipped == "1000 elements are not a whole number of blocks of 256"
    copy = groups["fp8 nvfp4 memcpy bfloat16 4096"]["C memcpy"]
    for recipe in _nvfp4.RECIPES:
        g = groups[f"fp8 {recipe} bfloat16 4096"]
        assert g["lscore"]["median_s"] > 0 and g["lscore out="]["median_s"] > 0
        assert g["torch eager"]["skipped"] == "torch is not installed"
        reads, written = _nvfp4.TRAFFIC[recipe]
        assert g["byte floor"]["bytes"] == round((reads * 2 + written) * 4096)
        want = copy["median_s"] * g["byte floor"]["bytes"] / (2 * 2 * 4096)
        assert g["byte floor"]["median_s"] == pytest.approx(want)
        assert "floor" in g["lscore out="]["ratios"]
    assert groups["fp8 gpu nvfp4"]["lscore"]["skipped"] in (
        "torch is not installed",
        "no CUDA device",
    )


def test_shape_of():
    assert _nvfp4.shape_of(10**8) == (10000, 10000)
    assert _nvfp4.shape_of(2**24) == (4096, 4096)
    assert _nvfp4.shape_of(4096) == (64, 64)
    assert _nvfp4.shape_of(16 * 48) == (48, 16)


def test_targets_name_the_issue_ratios():
    class T:
        tiny, sizes_given, sizes = False, True, (2**20, 10**8)

    rows = [
        {"group": "fp8 nvfp4-rht bfloat16 1e8", "method": m, "min_s": s, "median_s": s}
        for m, s in (
            ("lscore", 1.0),
            ("lscore out=", 0.9),
            ("torch eager", 9.0),
            ("byte floor", 0.4),
        )
    ]
    found = {t["target"]: t for t in _nvfp4.targets(rows, T())}
    assert len(found) == 2  # the RHT group at 1e8 only
    eager = found["fp8 nvfp4-rht bfloat16 1e8: torch eager / lscore"]
    assert eager["measured"] == 9.0 and eager["met"] is False
    floor = found["fp8 nvfp4-rht bfloat16 1e8: lscore out= / byte floor"]
    assert floor["measured"] == pytest.approx(2.25) and floor["met"] is True


def test_gpu_rows_run_on_any_torch_device():
    pytest.importorskip("torch")
    from lscore.bench._harness import Rows

    rows = Rows(0, False)
    _nvfp4.run_gpu(Opts(), rows, np.random.default_rng(0), device="cpu")
    rows.close()
    by = {(r["group"], r["method"]): r for r in rows.rows}
    for recipe in _nvfp4.RECIPES:
        for method in ("lscore", "torch eager", "byte floor"):
            assert "min_s" in by[f"fp8 gpu {recipe} bfloat16 4096", method], (recipe, method)


def _input(shape, rng, dtype, specials):
    """bfloat16 values whose magnitudes in any 16 lie within 2**10 of each other (where the
    matmul's float32 sums, like the butterflies', are exact), a zero block, and with
    `specials` NaN and Inf (the global amax then Inf)."""
    x = rng.choice([-1.0, 1.0], shape) * (1 + rng.random(shape)) * 2.0 ** rng.integers(-5, 5, shape)
    x *= 2.0 ** rng.integers(-20, 20, (1, shape[1]))  # columns far apart: blocks of 16 rows
    x[16:32, 9] = 0
    if specials:
        x[0, 3], x[17, 5], x[20, 7] = np.nan, np.inf, -np.inf
        x[2, 11], x[5, 11] = np.inf, -np.inf  # an Inf - Inf in the transform: NaN results
    return x.astype(np.float32).astype(dtype)


@pytest.mark.parametrize("specials", [False, True])
@pytest.mark.parametrize("shape", [(64, 48), (32, 160)])
def test_torch_baseline_is_lscores_quantize(shape, specials):
    """TE's recipe in torch ops writes the scale codes, packed codes and amax lscore's
    te-nvfp4 preset writes, for each recipe of the rows (stochastic rounding included)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    from lscore.bench._harness import as_tensor, dtype_of
    from lscore.fp8 import quantize_blocks

    x = _input(shape, np.random.default_rng(3), dtype_of("bfloat16"), specials)
    fns = _nvfp4.torch_fns(torch)
    for recipe, kw in _nvfp4.OPTIONS.items():
        b = quantize_blocks(x, "te-nvfp4", **kw)
        s, q, amax = fns[recipe](as_tensor(torch, x))
        np.testing.assert_array_equal(s.numpy(), np.asarray(b.scales).view(np.uint8), recipe)
        np.testing.assert_array_equal(q.numpy(), np.asarray(b.data).view(np.uint8), recipe)
        assert np.float32(amax.item()) == b.tensor_scale, recipe
