"""The repository explains itself: no tracked file points at notes outside it.

Comments, docs and tests cite public sources (a project's file at a version, a
paper, a URL); a path such as a planning folder beside the checkout means
nothing to someone who cloned the repository.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from helpers import ROOT

# "shared" followed by a slash, not as the tail of a longer name or path (written in two
# parts, so that this file does not match it)
FOLDER = "shared" + "/"
OUTSIDE = re.compile(r"(?<![\w./-])" + FOLDER)


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an sdist or an installed copy)")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [name for name in out.decode().split("\0") if name]


def test_no_tracked_file_refers_outside_the_repository() -> None:
    offenders = []
    for name in _tracked_files():
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the work tree, not yet committed
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a binary file
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize(
    "line,found",
    [
        (f"see {FOLDER}DESIGN.md", True),
        (f"({FOLDER}research/notes.md, section 4)", True),
        (f"`{FOLDER}` holds it", True),
        ("a shared library", False),
        (f"lib/{FOLDER}x.so", False),
        (f"torch_{FOLDER}x", False),
    ],
)
def test_the_pattern_finds_a_reference_and_nothing_else(line: str, found: bool) -> None:
    assert bool(OUTSIDE.search(line)) is found
