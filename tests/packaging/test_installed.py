"""The suite tests the installed package when the runner says so (``LSCORE_TEST_INSTALLED=1``:
``make test`` and cibuildwheel's test step, through scripts/run_tests.sh): lscore, its compiled
modules and its adapters come from site-packages, and no folder of the checkout but tests/
is on sys.path. Without the variable (``make test-dev``, an editable install) these skip."""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import ROOT, TESTS

pytestmark = pytest.mark.skipif(
    os.environ.get("LSCORE_TEST_INSTALLED") != "1",
    reason="LSCORE_TEST_INSTALLED=1 is unset: not a run against the installed package",
)

SITE = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
# lscore.bench: benchmarks/ of the checkout, installed so that `lscore bench` runs
MODULES = ["lscore", "lscore.adapters", "lscore.adapters.torch", "lscore.bench", "lscore._ext"] + [
    f"lscore._ext.{name}"
    for name in ("_codes", "_state", "_scan", "_walk", "_grads", "_fp8", "_fp8_scale", "_mx")
]


def installed(path: str | None) -> bool:
    return path is not None and any(Path(path).resolve().is_relative_to(s) for s in SITE)


@pytest.mark.parametrize("name", MODULES)
def test_module_comes_from_site_packages(name: str) -> None:
    if name == "lscore.adapters.torch":
        pytest.importorskip("torch")
    module = importlib.import_module(name)
    assert installed(module.__file__), f"{name} from {module.__file__}, not from {SITE}"


def test_no_checkout_folder_but_tests_on_sys_path() -> None:
    root, env = ROOT.resolve(), Path(sys.prefix).resolve()
    on_path = {Path(p or os.getcwd()).resolve() for p in sys.path}
    # the virtualenv may sit inside the checkout (.venv-test): its folders are the installed side
    inside = {p for p in on_path if p.is_relative_to(root) and not p.is_relative_to(env)}
    assert inside <= {TESTS.resolve()}, sorted(map(str, inside))


def test_not_an_editable_install() -> None:
    """An editable install maps lscore onto the checkout through a finder on sys.meta_path."""
    finders = [str(getattr(f, "__module__", "")) for f in sys.meta_path]
    assert not any("__editable__" in name for name in finders), finders
