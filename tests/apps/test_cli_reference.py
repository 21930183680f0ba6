"""docs/reference/cli.md shows each command's `--help` exactly as the program prints it."""

from __future__ import annotations

import argparse
import re

import pytest

from helpers import ROOT
from lscore.cli import build_parser

PAGE = ROOT / "docs" / "reference" / "cli.md"


def _shown() -> dict[str, str]:
    """Each `## `lscore ...`` heading of the page with the text block under it."""
    found = re.findall(r"^## `(lscore[^`]*)`\n\n```text\n(.*?)\n```", PAGE.read_text(), re.S | re.M)
    return dict(found)


def _printed() -> dict[str, str]:
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    parsers = {"lscore": top, **{f"lscore {n}": p for n, p in sub.choices.items()}}
    return {title: p.format_help().rstrip() for title, p in parsers.items()}


def test_the_page_shows_every_commands_help_as_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # argparse fills to the terminal's width
    shown, printed = _shown(), _printed()
    assert list(shown) == list(printed)
    for title, text in printed.items():
        assert shown[title] == text, f"docs/reference/cli.md, {title}: the page shows\n" + (
            f"{shown[title]}\n\nand `{title} --help` prints\n{text}"
        )


def test_the_readme_names_the_commands_and_links_the_page() -> None:
    readme = (ROOT / "README.md").read_text()
    for command in ("lscore demo", "lscore bench", "lscore migrate"):
        assert f"`{command}`" in readme, command
    assert "(docs/reference/cli.md)" in readme
