"""What every backend's `lscore demo` run must show (the NumPy, torch and CuPy demos' tests)."""

import itertools

from lscore.cli import demo as _demo


def check_story(res: dict) -> None:
    """What any backend's run must show: the JSON's shape, float16 flushing gradients
    without scaling, and a dynamic scale that grew, overflowed, skipped and backed off."""
    f32, raw, dyn = res["results"]
    assert [r["mode"] for r in res["results"]] == list(_demo.MODES)
    for r in res["results"]:
        assert set(r) >= {"mode", "test_accuracy", "skipped_at", "final_scale"}
        assert 0 <= r["test_accuracy"] <= 1
    assert f32["underflow_fraction"] is None and f32["final_scale"] is None
    assert raw["skipped_at"] == [] and raw["final_scale"] is None
    assert raw["underflow_by_layer"]["logits"] > 0.02
    assert dyn["underflow_by_layer"]["logits"] < raw["underflow_by_layer"]["logits"] / 10
    assert dyn["skipped_at"] and dyn["skipped"] == len(dyn["skipped_at"])


def check_scale_path(scale: list, skipped_at: list) -> None:
    assert max(scale) > scale[0]  # it grew
    for s in skipped_at:  # each skip halved the scale
        assert s + 1 == len(scale) or scale[s + 1] == scale[s] / 2
    assert all(
        b in (a, 2 * a) for i, (a, b) in enumerate(itertools.pairwise(scale)) if i not in skipped_at
    )
