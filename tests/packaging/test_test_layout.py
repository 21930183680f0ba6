"""The test suite's own layout: folders by layer, shared code only in tests/helpers.

No test module imports another test module or conftest, and none edits
sys.path: shared code is the ``helpers`` package (pyproject's pytest
``pythonpath``) and shared setup is conftest's fixtures.
"""

import ast

import pytest

from helpers import TESTS

LAYERS = {"core", "kernels", "adapters", "distributed", "apps", "packaging"}


def _python_files():
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(TESTS)
        if rel.parts[0] != "fuzz":  # atheris targets, run on their own
            yield rel, path


def test_test_modules_sit_in_a_layer_folder():
    stray = [
        str(rel)
        for rel, _ in _python_files()
        if rel.name.startswith("test_")
        and rel.parts[0] not in LAYERS
        and str(rel) != "test_layers.py"
    ]
    assert stray == []


def test_no_module_imports_a_test_module_or_edits_sys_path():
    offenders = []
    for rel, path in _python_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top.startswith("test_") or top == "conftest":
                    offenders.append((str(rel), node.lineno, name))
            if _edits_sys_path(node, parents):
                offenders.append((str(rel), node.lineno, "sys.path"))
    assert offenders == []


def _edits_sys_path(node, parents):
    """``sys.path`` assigned, deleted, or reached through a method or an assigned item
    (``sys.path.insert(...)``, ``sys.path[0] = ...``); reading it is no edit."""
    if not (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ):
        return False
    parent = parents.get(node)
    return (
        isinstance(node.ctx, ast.Store | ast.Del)
        or isinstance(parent, ast.Attribute)
        or (isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store | ast.Del))
    )


@pytest.mark.parametrize(
    "code,edits",
    [
        ("sys.path.insert(0, 'x')", True),
        ("sys.path[0] = 'x'", True),
        ("sys.path = []", True),
        ("sys.path += ['x']", True),
        ("del sys.path[0]", True),
        ("entries = list(sys.path)", False),
        ("first = sys.path[0]", False),
    ],
)
def test_a_sys_path_edit_is_told_from_a_read(code, edits):
    tree = ast.parse(code)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    assert any(_edits_sys_path(node, parents) for node in ast.walk(tree)) == edits
