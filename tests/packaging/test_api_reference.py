"""Every public name has a docstring and an entry in the API reference (docs/reference/).

A public module is one under lscore or lscore.adapters with no underscore in its
dotted name, except the command line (lscore.cli, documented as commands). Its
public names are its ``__all__``, or else the names it defines without a leading
underscore. A class or function needs a docstring of its own; a constant needs a
``#:`` doc comment at its assignment (where autodoc reads it). A name counts as in
the reference when an ``auto*`` directive of docs/reference/*.md documents the same
object, under this or another public module.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import types
from typing import Any

import pytest

import lscore
import lscore.adapters
from helpers import ROOT

REFERENCE = ROOT / "docs" / "reference"
DIRECTIVE = re.compile(r"^```\{auto(class|function|exception|data)\} (\S+)$", re.M)
OPTIONAL = {"lscore.adapters.torch": "torch", "lscore.adapters.cupy": "cupy"}


def public_modules() -> list[str]:
    out = ["lscore"]
    for pkg in (lscore, lscore.adapters):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            parts = info.name.split(".")
            if any(p.startswith("_") for p in parts) or info.name.startswith("lscore.cli"):
                continue
            out.append(info.name)
    return out


def import_public(name: str) -> types.ModuleType:
    for prefix, framework in OPTIONAL.items():
        if name.startswith(prefix):
            pytest.importorskip(framework)
    return importlib.import_module(name)


def public_names(module: types.ModuleType) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        n
        for n, obj in vars(module).items()
        if not n.startswith("_") and getattr(obj, "__module__", None) == module.__name__
    ]


def is_data(obj: Any) -> bool:
    return not (inspect.isclass(obj) or callable(obj) or isinstance(obj, types.ModuleType))


def doc_comment(module: types.ModuleType, name: str) -> bool:
    """Whether `name` is assigned in `module`'s source with a ``#:`` comment before or beside it."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            first, last = node.lineno - 1, node.end_lineno or node.lineno
            if "#:" in lines[last - 1] or (
                first > 0 and lines[first - 1].lstrip().startswith("#:")
            ):
                return True
    return False


def reference_entries() -> dict[str, str]:
    """Dotted name -> directive kind, over every page of the reference."""
    out: dict[str, str] = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for kind, target in DIRECTIVE.findall(page.read_text()):
            assert target not in out, f"{target} is documented twice"
            out[target] = kind
    return out


def resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(import_public(module), name)


@pytest.mark.parametrize("module_name", public_modules())
def test_public_names_documented(module_name: str) -> None:
    module = import_public(module_name)
    entries = reference_entries()
    documented_objects = set()
    documented_data = set()
    for dotted, kind in entries.items():
        if kind == "data":
            documented_data.add(dotted.rpartition(".")[2])
        else:
            try:
                documented_objects.add(id(resolve(dotted)))
            except pytest.skip.Exception:
                continue
    missing_doc, missing_entry = [], []
    for name in public_names(module):
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):
            assert obj.__name__ in public_modules(), f"{module_name}.{name}"
            continue
        if is_data(obj):
            homes = [m for m in entries if m.endswith("." + name) and entries[m] == "data"]
            if not homes:
                missing_entry.append(name)
            elif not any(doc_comment(import_public(h.rpartition(".")[0]), name) for h in homes):
                missing_doc.append(name)
            continue
        if not (obj.__doc__ or "").strip() or (inspect.isclass(obj) and "__doc__" not in vars(obj)):
            missing_doc.append(name)
        if id(obj) not in documented_objects:
            missing_entry.append(name)
    assert not missing_doc, f"{module_name}: no docstring (or #: comment) for {missing_doc}"
    assert not missing_entry, f"{module_name}: not in docs/reference/ {missing_entry}"


def test_reference_entries_resolve() -> None:
    """Every entry of the reference names an object that exists (no stale entries)."""
    for dotted in reference_entries():
        resolve(dotted)


def test_reference_pages_in_toctree() -> None:
    index = (REFERENCE / "index.md").read_text()
    for page in REFERENCE.glob("*.md"):
        if page.stem != "index":
            assert re.search(rf"^{re.escape(page.stem)}$", index, re.M), page.name
