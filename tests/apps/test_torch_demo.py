"""`lscore demo --backend torch`: a tiny run tells the NumPy demo's story in real float16."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("threadpoolctl")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

from helpers.demo_story import check_scale_path, check_story
from lscore import cli as _cli
from lscore.cli import demo as _demo
from lscore.cli.demo import torch_backend as demo_torch


@pytest.mark.slow
def test_tiny_torch_run(tmp_path, capsys, monkeypatch):
    records = []
    real = demo_torch.train
    monkeypatch.setattr(demo_torch, "train", lambda *a: records.append(real(*a)) or records[-1])
    assert (
        _cli.main(["demo", "--backend", "torch", "--tiny", "--steps", "4", "--out", str(tmp_path)])
        == 0
    )
    out = capsys.readouterr().out
    assert "torch.autocast" in out
    for mode in _demo.MODES:
        assert mode in out
    res = json.loads((tmp_path / "lscore_demo.json").read_text())
    assert res["config"]["backend"] == "torch"
    check_story(res)
    check_scale_path(records[2]["scale"], records[2]["skipped_at"])
    assert (tmp_path / "lscore_demo.png").stat().st_size > 10000
