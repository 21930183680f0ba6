"""Runs every example of README.md and docs/ as a test (Sybil).

``python`` fences are run, each block as one test: a block with ``>>>`` prompts
is a doctest whose shown output is compared (ELLIPSIS and NORMALIZE_WHITESPACE
on), any other block must run without error. The blocks of one page share a
namespace, in page order, and run in a temporary working directory of their own.
A block preceded by ``<!-- skip: next if(no_gpu, reason="needs a CUDA device") -->`` is skipped
where no CUDA device can run lscore's kernels; ``<!-- skip: next "reason" -->``
skips one always, with its reason (the examples that need a launcher).
Without Sybil installed nothing here is collected (tests/ still runs).

pytest collects these files when they are named on its command line:
``scripts/run_tests.sh`` runs ``pytest tests docs README.md``.
"""

from __future__ import annotations

import doctest
import importlib.util
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sybil import Example

OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def run_block(example: Example) -> str | None:
    """Run one ``python`` block: as a doctest when it has prompts, else as a script.

    A whole block is one example (Sybil's own parser makes each prompt one), so that
    ``skip: next`` skips the block.
    """
    source: str = example.parsed
    if source.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(
            source, example.namespace, example.path, example.path, example.line
        )
        report = io.StringIO()
        runner = doctest.DocTestRunner(verbose=False, optionflags=OPTIONS)
        runner.run(test, out=report.write, clear_globs=False)
        example.namespace.update(test.globs)  # DocTest ran on a copy
        return report.getvalue() or None
    code = compile("\n" * example.line + source, example.path, "exec")
    exec(code, example.namespace)
    return None


def _setup(namespace: dict[str, Any]) -> None:
    from lscore import cuda

    namespace["no_gpu"] = cuda.device_missing() is not None


@pytest.fixture(scope="module")
def _example_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A working directory per page, so that files an example writes stay out of the tree."""
    here = Path.cwd()
    path = tmp_path_factory.mktemp("example")
    os.chdir(path)
    try:
        yield path
    finally:
        os.chdir(here)


def _collector() -> Callable[[Path, Any], Any]:
    from sybil import Sybil
    from sybil.parsers.myst import CodeBlockParser, SkipParser

    def sybil(**where: Any) -> Sybil:
        return Sybil(
            parsers=[CodeBlockParser("python", run_block), SkipParser()],
            setup=_setup,
            fixtures=["_example_dir"],
            **where,
        )

    return (
        sybil(path="docs", patterns=["*.md"], excludes=["_build/*"], name="docs")
        # only the top-level README (tests/fuzz/README.md is a how-to with shell commands)
        + sybil(filenames={"README.md"}, excludes=["*/README.md"], name="readme")
    ).pytest()


def _no_sybil(file_path: Path, parent: Any) -> None:
    """Without Sybil (a venv without the test extra) tests/ runs and the pages are not
    collected; ``make test`` has Sybil, and tests/apps/test_readme.py checks that the
    README's examples are collected."""
    return None


pytest_collect_file = _collector() if importlib.util.find_spec("sybil") else _no_sybil
