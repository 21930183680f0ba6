"""`make lint` and the pre-commit hooks run the same tool versions."""

import re

from helpers import ROOT


def _makefile_pin(tool: str) -> str:
    deps = re.search(r"^LINT_DEPS = (.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert deps is not None, "the Makefile sets no LINT_DEPS"
    pins = dict(d.split("==") for d in deps.group(1).split() if "==" in d)
    return pins[tool]


def test_pre_commit_ruff_is_the_lint_ruff():
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    rev = re.search(r"repo: https://github.com/astral-sh/ruff-pre-commit\n\s+rev: v(\S+)", config)
    assert rev is not None, "no ruff-pre-commit repo in .pre-commit-config.yaml"
    assert rev.group(1) == _makefile_pin("ruff")


def test_pre_commit_mypy_runs_the_lint_venv():
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    assert "entry: make --no-print-directory typecheck" in config
    assert f"mypy=={_makefile_pin('mypy')}" in config
