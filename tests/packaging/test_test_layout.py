"""The test suite's own layout: folders by layer, shared code only in tests/helpers.

No test module imports another test module or conftest, and none edits
sys.path: shared code is the ``helpers`` package (pyproject's pytest
``pythonpath``) and shared setup is conftest's fixtures.
"""

import ast

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
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                offenders.append((str(rel), node.lineno, "sys.path"))
    assert offenders == []
