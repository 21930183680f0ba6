"""The .pyi stubs of the compiled modules name exactly what the modules define."""

import ast
import importlib
import inspect

import pytest

from helpers import ROOT

STUBS = sorted((ROOT / "_ext").glob("*.pyi"))


def _stub_names(path):
    """{top-level name: set of member names (classes) or None}."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                n.target.id if isinstance(n, ast.AnnAssign) else n.name
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AnnAssign))
            }
        elif isinstance(node, ast.FunctionDef):
            out[node.name] = None
        elif isinstance(node, ast.AnnAssign):
            out[node.target.id] = None
    return out


def test_every_compiled_module_has_a_stub():
    pyx = {p.stem for p in (ROOT / "_ext").glob("*.pyx")}
    assert pyx == {p.stem for p in STUBS}


@pytest.mark.parametrize("path", STUBS, ids=lambda p: p.name)
def test_stub_matches_the_module(path):
    mod = importlib.import_module(f"lscore._ext.{path.stem}")
    stub = _stub_names(path)
    public = {n for n, v in vars(mod).items() if not n.startswith("_") and not inspect.ismodule(v)}
    assert set(stub) == public, (sorted(set(stub) - public), sorted(public - set(stub)))
    for name, members in stub.items():
        if members is None:
            continue
        cls = getattr(mod, name)
        real = {n for n in dir(cls) if not n.startswith("_")}
        assert members - {"__init__"} == real, (name, sorted(members ^ real))
