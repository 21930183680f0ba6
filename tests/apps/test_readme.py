"""README.md is a front door: short, an example early, the commands it names exist.

The README's examples themselves run, output checked, through conftest.py (Sybil) when
pytest is given ``README.md`` (``make test`` does); these tests check its shape and
that the wiring collects them.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import ROOT

README = ROOT / "README.md"
TEXT = README.read_text()
LINES = TEXT.splitlines()
BLOCKS = re.findall(r"^```python\n(.*?)^```", TEXT, flags=re.S | re.M)


def test_readme_is_short() -> None:
    assert len(LINES) <= 200


def test_first_example_early_and_short() -> None:
    first = next(i for i, line in enumerate(LINES, 1) if line == "```python")
    assert first <= 60
    code = [line for line in BLOCKS[0].splitlines() if line.startswith((">>> ", "... "))]
    assert "GradScaler" in BLOCKS[0]
    assert len(code) <= 15


@pytest.mark.parametrize("block", range(len(BLOCKS)), ids=lambda i: f"block{i}")
def test_example_shows_output(block: int) -> None:
    """Each example is a doctest that prints something (so the reader sees what it does)."""
    lines = BLOCKS[block].splitlines()
    assert lines[0].startswith(">>> ")
    assert any(line and not line.startswith((">>> ", "... ")) for line in lines)


@pytest.mark.parametrize("target", ["demo", "test", "docs"])
def test_make_targets_named_and_defined(target: str) -> None:
    assert f"make {target}" in TEXT
    assert re.search(rf"^{target}:", (ROOT / "Makefile").read_text(), flags=re.M)


def test_links_resolve() -> None:
    links = re.findall(r"\]\(([^)#]+)\)", TEXT)
    local = [link for link in links if "://" not in link]
    assert local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing


def test_examples_collected(tmp_path) -> None:
    """pytest collects the README's examples (conftest.py), not zero of them; from outside
    the checkout, as scripts/run_tests.sh runs the suite."""
    pytest_args = ["--collect-only", "-q", "-p", "no:cacheprovider", "--import-mode=importlib"]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, str(README)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    collected = sum("README.md::" in line for line in r.stdout.splitlines())
    assert collected == len(BLOCKS) + TEXT.count("<!-- skip:")  # a skip line is an item too


def test_wheel_sentence_names_the_manylinux_tag_and_its_glibc() -> None:
    """The wheel installs only where glibc is at least as new as its manylinux tag says:
    the README names the tag the release notes give (docs/development/contributing.md) and
    the glibc it needs, not just "Linux with the same Python version"."""
    notes = (ROOT / "docs" / "development" / "contributing.md").read_text()
    tag = re.search(r"`(manylinux_(\d+)_(\d+))`", notes)
    assert tag is not None
    flat = " ".join(LINES)
    assert f"`{tag.group(1)}`" in flat
    assert f"glibc {tag.group(2)}.{tag.group(3)} or newer" in flat


def test_a_note_says_how_to_copy_the_prompted_examples() -> None:
    """The README's examples are `>>>` sessions; before the first one a note says how to
    paste them (the docs site's copy button strips the prompts, GitHub's does not)."""
    first = TEXT.index("```python")
    before = " ".join(TEXT[:first].split())
    assert "`>>>` and `...`" in before and "copy button leaves out the prompts" in before
