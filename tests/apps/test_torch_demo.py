"""`lscore demo --backend torch`: a short run trains all four modes and writes its outputs."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

from lscore import cli as _cli
from lscore.cli import demo as _demo


def test_short_torch_run(tmp_path, capsys):
    assert (
        _cli.main(
            ["demo", "--backend", "torch", "--steps", "40", "--seed", "2", "--out", str(tmp_path)]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "torch.autocast" in out
    for mode in _demo.MODES:
        assert mode in out
    res = json.loads((tmp_path / "lscore_demo.json").read_text())
    recs = {r["mode"]: r for r in res["results"]}
    assert res["config"]["backend"] == "torch"
    assert recs[_demo.MODES[0]]["underflow_fraction"] is None
    # float16 without scaling loses gradient elements that loss scaling keeps
    assert recs[_demo.MODES[1]]["underflow_fraction"] > recs[_demo.MODES[2]]["underflow_fraction"]
    assert recs[_demo.MODES[2]]["final_scale"] >= 2.0**15
    assert (tmp_path / "lscore_demo.png").stat().st_size > 10000
