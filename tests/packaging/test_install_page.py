"""The install page's table of extras says what each extra installs: the packages the
installed metadata requires for it, by name."""

from __future__ import annotations

import importlib.metadata
import re

from helpers import ROOT

PAGE = ROOT / "docs" / "getting-started" / "install.md"
# the test and docs extras are the checkout's own; cupy is cuda12's earlier name; the
# cuda rows describe their packages (CuPy, NVRTC and the CUDA headers of one CUDA major)
UNLISTED = {"test", "docs", "cupy"}
DESCRIBED = {"cuda12", "cuda13"}


def _required() -> dict[str, set[str]]:
    extras: dict[str, set[str]] = {}
    for req in importlib.metadata.requires("lscore") or []:
        found = re.search(r"""extra == ["']([\w-]+)["']""", req)
        if found:
            name = re.match(r"[A-Za-z0-9_.-]+", req)
            assert name is not None
            extras.setdefault(found.group(1), set()).add(name.group(0).lower())
    return extras


def _table() -> dict[str, str]:
    row = r"^\| `(?:lscore\[)?([\w-]+)\]?` \| ([^|]+) \|"  # `demo` or `lscore[demo]`
    rows = re.findall(row, PAGE.read_text(encoding="utf-8"), re.M)
    return {extra: brings.strip() for extra, brings in rows}


def test_every_extra_has_a_row() -> None:
    assert set(_table()) == set(_required()) - UNLISTED


def test_each_row_names_its_packages() -> None:
    required = _required()
    wrong = {
        extra: (brings, sorted(required[extra]))
        for extra, brings in _table().items()
        if extra not in DESCRIBED
        and {name.strip().lower() for name in brings.split(",")} != required[extra]
    }
    assert wrong == {}


def test_ml_dtypes_comes_with_every_install() -> None:
    """The FP8 guide and NumPy's bfloat16 need ml_dtypes: a core dependency, so that
    `pip install ".[torch]"` (the README's command) brings it; the `bfloat16` extra stays,
    bringing nothing more, so that older install commands keep working."""
    plain = {
        re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()  # type: ignore[union-attr]
        for req in importlib.metadata.requires("lscore") or []
        if "extra ==" not in req
    }
    assert "ml_dtypes" in plain
    assert _required()["bfloat16"] == {"ml_dtypes"}
