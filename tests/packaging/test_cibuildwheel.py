"""The release matrix that pyproject's [tool.cibuildwheel] builds: CPython 3.10-3.13 on
manylinux, x86_64 and aarch64, and nothing else (no musllinux, no free-threaded or newer
CPython that cibuildwheel would add by default). Printing the list needs no container."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

import pytest

from helpers import ROOT

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
EXPECTED = sorted(
    f"cp{v.replace('.', '')}-manylinux_{arch}" for v in PYTHONS for arch in ("x86_64", "aarch64")
)


@pytest.mark.parametrize(
    "archs", [[], ["--archs", "x86_64,aarch64"]], ids=["configured-archs", "both-archs"]
)
def test_build_list(archs: list[str]) -> None:
    pytest.importorskip("cibuildwheel", reason="cibuildwheel comes with the test extra")
    command = [sys.executable, "-m", "cibuildwheel", "--print-build-identifiers"]
    r = subprocess.run(
        [*command, "--platform", "linux", *archs, str(ROOT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.split()) == EXPECTED


def test_classifiers_name_the_built_pythons() -> None:
    """The installed metadata's Python classifiers are the versions the matrix builds."""
    classifiers = importlib.metadata.metadata("lscore").get_all("Classifier") or []
    versions = [m.group(1) for c in classifiers if (m := re.search(r":: (3\.\d+)$", c))]
    assert versions == PYTHONS
