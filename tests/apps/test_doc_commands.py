"""Every `lscore ...` command that README.md and docs/ show in a shell block runs as written.

`lscore migrate` commands run for real, in a folder holding the files they name
(FILES says what each is). `lscore demo` and `lscore bench` commands are parsed and
their arguments checked as the program checks them before any work; running them in
full takes minutes (test_demo.py and test_bench.py run them with --tiny).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

import lscore
from helpers import ROOT
from lscore import bench as bench_cmd
from lscore.cli import build_parser, demo, main

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [p for p in PAGES if "_build" not in p.parts]
SHELL_BLOCK = re.compile(r"^```(?:bash|console|shell|sh)\n(.*?)^```", re.S | re.M)


def _commands() -> list[tuple[str, list[str]]]:
    """(page:line, argv after `lscore`) of each command line in a shell block."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in SHELL_BLOCK.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            for i, line in enumerate(block.group(1).splitlines()):
                words = shlex.split(line.removeprefix("$ "), comments=True)
                if words and Path(words[0]).name == "lscore":
                    found.append((f"{page.relative_to(ROOT)}:{first + i}", words[1:]))
    return found


def _ds_config(path: Path) -> None:
    path.write_text(json.dumps({"fp16": {"enabled": True, "initial_scale_power": 12}}))


def _checkpoint(path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, path)


def _lscore_state(path: Path) -> None:
    path.write_text(json.dumps(lscore.preset("deepspeed", init_scale=2.0**12).state_dict()))


# the files the shown commands name, each as a user would have it
FILES: dict[str, Callable[[Path], None]] = {
    "ds_config.json": _ds_config,
    "checkpoint.pt": _checkpoint,
    "lscore_state.json": _lscore_state,
}
COMMANDS = _commands()


def test_the_pages_show_each_command() -> None:
    shown = {argv[0] for _, argv in COMMANDS if argv}
    assert {"demo", "bench", "migrate"} <= shown


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[f"{w} {' '.join(a)}" for w, a in COMMANDS])
def test_shown_command_runs_as_written(
    where: str,
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(argv)  # a usage error exits here, status 2
    if args.command == "migrate":
        for word in argv:
            if word.endswith((".json", ".pt")) and word != args.out:
                assert word in FILES, f"{where}: no file {word} in FILES for this test"
                FILES[word](tmp_path / word)
        status = main(argv)
        assert status == 0, (where, capsys.readouterr().err)
    elif args.command == "demo":
        demo.check_out(args.out)
    else:
        bench_cmd.Options(
            full=args.full, tiny=args.tiny, sizes=args.sizes, suite=args.suite, only=args.only or ()
        )
