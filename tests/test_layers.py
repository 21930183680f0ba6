"""The package's four rooms and their one-way arrows, read from the source.

kernels (``_ext/``) <- core (``lscore/``) <- adapters (``adapters/``) <-
applications (``lscore/cli/``, ``lscore/__main__``, and ``benchmarks/``, which installs
as ``lscore.bench``).  This test parses every ``.py`` and ``.pyx`` file of the package
and fails on:

- an import pointing up (the core importing an adapter or an application,
  even inside a function; a compiled module importing any Python module of
  the package; an adapter importing an application);
- one framework adapter importing another (``numpy``, ``cupy``, ``torch``);
- a framework (torch, cupy, ...) imported at module level in core or kernels;
- the CUDA layer (``lscore.cuda``) importing the compiled modules other than
  through the core's one door, ``lscore.kernels``;
- an arrow against ``ONE_WAY`` between two core packages: ``lscore.cuda`` importing
  ``lscore.fp8`` (even inside a function), or ``lscore.fp8`` importing ``lscore.cuda``
  at module level (it reaches the kernels only when a device array comes);
- a class docstring glued together from other docstrings (``__doc__ = A.__doc__ +
  ...``): a public class states its own contract, not its bases' private ones;
- a test outside ``tests/apps`` importing the bench application (test doubles
  live in ``tests/helpers``; the bench keeps its own);
- a reach into another module's underscore names: ``from m import _x``,
  importing a private module from outside its own package and room, or
  ``obj._x`` where ``_x`` belongs to another module of the package.

`check_tree` is run on the real tree and on small planted trees, so the
checker itself is shown to catch each kind of violation.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# source folder -> the package it installs as (pyproject's package-dir map)
FOLDERS = {
    "lscore": "lscore",
    "_ext": "lscore._ext",
    "adapters": "lscore.adapters",
    "benchmarks": "lscore.bench",
}
ROOMS = ("kernels", "core", "adapters", "applications")
APPLICATIONS = ("lscore.cli", "lscore.bench", "lscore.__main__")
FRAMEWORK_ADAPTERS = ("numpy", "cupy", "torch")
FRAMEWORKS = (
    "torch",
    "cupy",
    "cupyx",
    "cuda",
    "mpi4py",
    "jax",
    "tensorflow",
    "ml_dtypes",
    "matplotlib",
    "sklearn",
    "tqdm",
)
# core packages that reach the compiled modules through lscore.kernels only
THROUGH_THE_DOOR = ("lscore.cuda",)
# (lower, upper): core packages where `upper` imports `lower` only inside functions and
# `lower` never imports `upper`; what both need lives in a module of lscore beside them
ONE_WAY = (("lscore.cuda", "lscore.fp8"),)
_PYX_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\s+(.+)|c?import\s+([\w.]+))", re.M)
_PYX_DEF = re.compile(r"^(?:c?p?def|cdef class)\s+(?:[\w*]+\s+)*?(_\w+)\s*[(:]", re.M)


def room(module: str) -> str:
    if module == "lscore._ext" or module.startswith("lscore._ext."):
        return "kernels"
    if module.startswith("lscore.adapters"):
        return "adapters"
    if any(_within(module, app) for app in APPLICATIONS):
        return "applications"
    return "core"


def module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    rel = path.relative_to(root)
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    parts[-1] = parts[-1].rsplit(".", 1)[0]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(p for part in parts for p in part.split("."))


def sources(root: pathlib.Path) -> dict[str, pathlib.Path]:
    out = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".pyx") and "__pycache__" not in path.parts:
                out[module_name(root, path)] = path
    return out


def _is_package(path: pathlib.Path) -> bool:
    return path.name.startswith("__init__.")


def _resolve(importer: str, is_pkg: bool, level: int, name: str | None) -> str:
    if not level:
        return name or ""
    base = importer.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


class Module:
    """What one source file imports and which underscore attributes it owns and reads."""

    def __init__(self, name: str, path: pathlib.Path):
        self.name, self.path = name, path
        self.text = path.read_text(encoding="utf-8")
        self.imports: list[
            tuple[str, tuple[str, ...], int, bool]
        ] = []  # (module, names, line, top)
        self.owned: set[str] = set()
        self.reads: list[tuple[str, int]] = []
        self.glued_docs: list[int] = []  # lines of `__doc__ = X.__doc__ + ...` in a class
        if path.suffix == ".pyx":
            self._read_pyx()
        else:
            self._read_py()

    def _read_pyx(self) -> None:
        for m in _PYX_IMPORT.finditer(self.text):
            line = self.text.count("\n", 0, m.start()) + 1
            top = not self.text[m.start() : m.end()].startswith((" ", "\t"))
            if m.group(1):
                names = tuple(n.strip().split(" as ")[0] for n in m.group(2).strip("()").split(","))
                self.imports.append((m.group(1), names, line, top))
            else:
                self.imports.append((m.group(3), (), line, top))
        self.owned.update(_PYX_DEF.findall(self.text))

    def _read_py(self) -> None:
        tree = ast.parse(self.text, str(self.path))
        top_level = {id(n) for node in tree.body for n in _module_level_nodes(node)}
        pkg = _is_package(self.path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.imports.append((a.name, (), node.lineno, id(node) in top_level))
            elif isinstance(node, ast.ImportFrom):
                mod = _resolve(self.name, pkg, node.level, node.module)
                self.imports.append(
                    (mod, tuple(a.name for a in node.names), node.lineno, id(node) in top_level)
                )
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name.startswith("_"):
                    self.owned.add(node.name)
                if isinstance(node, ast.ClassDef):
                    self.glued_docs += [n.lineno for n in node.body if _glued_doc(n)]
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.ctx, ast.Store):
                    self.owned.add(node.attr)
                elif not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    self.reads.append((node.attr, node.lineno))
            elif (
                isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id)
            ):
                self.owned.add(node.id)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _private(node.value)
                and node.value.isidentifier()
            ):
                self.owned.add(node.value)  # __slots__ entries, getattr names


def _glued_doc(node: ast.stmt) -> bool:
    """`__doc__ = <a sum with another object's __doc__ in it>` (a class body statement)."""
    return (
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__doc__" for t in node.targets)
        and isinstance(node.value, ast.BinOp)
        and any(isinstance(n, ast.Attribute) and n.attr == "__doc__" for n in ast.walk(node.value))
    )


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_level_nodes(node):
    """The import statements that run when the module is imported (not inside a def)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        for child in ast.iter_child_nodes(node):
            yield from _module_level_nodes(child)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _behind_the_door(module: str) -> bool:
    return any(_within(module, p) for p in THROUGH_THE_DOOR)


def _one_way(importer: str, hit: str, top: bool) -> list[str]:
    """What an import of `hit` by `importer` breaks of ``ONE_WAY``."""
    problems = []
    for lower, upper in ONE_WAY:
        if _within(importer, lower) and _within(hit, upper):
            problems.append(f"{lower} imports {hit}; {upper} leans on {lower}, never back")
        if top and _within(importer, upper) and _within(hit, lower):
            problems.append(f"{upper} imports {hit} at module level; import it where it is used")
    return problems


def _adapter_of(module: str) -> str | None:
    """The framework adapter a module belongs to (lscore.adapters.torch.scaler -> torch)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[:2] == ["lscore", "adapters"] and parts[2] in FRAMEWORK_ADAPTERS:
        return parts[2]
    return None


def _known(target: str, modules: dict) -> str | None:
    """The package module `target` names (or the module holding it), None if outside."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def check_tree(root: pathlib.Path) -> list[str]:
    """Every violation of the layer rules in the tree at `root`, as readable lines."""
    modules = {name: Module(name, path) for name, path in sources(root).items()}
    owners: dict[str, set[str]] = {}
    for m in modules.values():
        for attr in m.owned:
            owners.setdefault(attr, set()).add(m.name)
    problems = []
    for m in modules.values():
        where = f"{m.path.relative_to(root)}"
        mine = room(m.name)
        for target, names, line, top in m.imports:
            base = target.split(".")[0]
            if base in FRAMEWORKS and top and mine in ("core", "kernels"):
                problems.append(
                    f"{where}:{line}: {mine} imports the framework {base} at module level"
                )
            if base != "lscore":
                continue
            hits = {_known(full, modules) for full in [target] + [f"{target}.{n}" for n in names]}
            for hit in sorted(hits - {None, m.name}):
                theirs = room(hit)
                if mine == "kernels":
                    problems.append(f"{where}:{line}: kernels import the Python module {hit}")
                elif ROOMS.index(theirs) > ROOMS.index(mine):
                    problems.append(f"{where}:{line}: {mine} imports {theirs} ({hit})")
                problems += [f"{where}:{line}: {p}" for p in _one_way(m.name, hit, top)]
                a, b = _adapter_of(m.name), _adapter_of(hit)
                if mine == "adapters" and b is not None and a != b:
                    problems.append(f"{where}:{line}: adapter code imports the {b} adapter ({hit})")
                private = [p for p in hit.split(".") if p.startswith("_")]
                if theirs == "kernels":
                    if mine != "core" or (_behind_the_door(m.name)):
                        problems.append(
                            f"{where}:{line}: {mine} imports the kernels ({hit}); "
                            f"go through lscore.kernels"
                        )
                elif private:
                    pkg = hit[: hit.index("." + private[0])] if hit.index(private[0]) else hit
                    inside = m.name == pkg or m.name.startswith(pkg + ".")
                    if not inside or theirs != mine:
                        problems.append(
                            f"{where}:{line}: imports the private module {hit} "
                            f"from outside its package"
                        )
            problems.extend(
                f"{where}:{line}: imports the private name {n} of {target}"
                for n in names
                if _private(n) and f"{target}.{n}" not in modules
            )
        problems += [
            f"{where}:{line}: a class docstring glued from other docstrings; write its own"
            for line in m.glued_docs
        ]
        for attr, line in m.reads:
            if attr not in m.owned and owners.get(attr):
                problems.append(
                    f"{where}:{line}: reads {attr}, an underscore name of "
                    f"{', '.join(sorted(owners[attr]))}"
                )
    return problems


def check_tests(tests: pathlib.Path) -> list[str]:
    """Every test module outside tests/apps that imports the bench application."""
    problems = []
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests)
        if rel.parts[0] == "apps":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            if any(n == "lscore.bench" or n.startswith("lscore.bench.") for n in names):
                problems.append(
                    f"tests/{rel.as_posix()}:{node.lineno}: imports the bench "
                    f"application; take test doubles from tests/helpers"
                )
    return problems


def test_tests_do_not_import_the_bench():
    problems = check_tests(ROOT / "tests")
    assert not problems, "\n".join(problems)


def test_the_bench_check_catches_an_import(tmp_path):
    (tmp_path / "apps").mkdir()
    (tmp_path / "adapters").mkdir()
    (tmp_path / "apps" / "test_bench.py").write_text("from lscore.bench import _gpu\n")
    (tmp_path / "adapters" / "test_x.py").write_text(
        "def test():\n    from lscore.bench._gpu import StandInArray\n"
    )
    (tmp_path / "adapters" / "test_y.py").write_text("import lscore.bench._gpu\n")
    assert check_tests(tmp_path) == [
        "tests/adapters/test_x.py:2: imports the bench application; take test doubles from "
        "tests/helpers",
        "tests/adapters/test_y.py:1: imports the bench application; take test doubles from "
        "tests/helpers",
    ]


def test_the_package_keeps_its_layers():
    problems = check_tree(ROOT)
    assert not problems, "layer violations:\n" + "\n".join(problems)


def test_every_source_file_is_in_a_room():
    names = sources(ROOT)
    assert {room(n) for n in names} == set(ROOMS)
    assert "lscore._ext._scan" in names and "lscore.adapters.numpy" in names


def _plant(tmp_path, files: dict[str, str]) -> list[str]:
    base = {
        "lscore/__init__.py": "",
        "lscore/state.py": "class S:\n    def __init__(self):\n        self._cy = 1\n",
        "_ext/__init__.py": "",
        "_ext/_scan.pyx": "def _bench_copy(a):\n    pass\n",
        "adapters/__init__.py": "",
        "adapters/numpy.py": "import lscore\n",
        "adapters/_optim.py": "",
        "lscore/_dtypes.py": "",
        "lscore/cli/__init__.py": "from lscore.adapters import numpy\n",
    }
    for rel, text in {**base, **files}.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return check_tree(tmp_path)


def test_a_clean_planted_tree_passes(tmp_path):
    assert _plant(tmp_path, {}) == []


@pytest.mark.parametrize(
    "files, expected",
    [
        (
            {"lscore/scan.py": "def f():\n    from lscore.adapters import numpy\n"},
            "core imports adapters",
        ),
        ({"lscore/scan.py": "from lscore.cli import main\n"}, "core imports applications"),
        ({"adapters/numpy.py": "from lscore.cli import main\n"}, "adapters imports applications"),
        (
            {"benchmarks/__init__.py": "", "lscore/scan.py": "def f():\n    import lscore.bench\n"},
            "core imports applications (lscore.bench)",
        ),
        ({"_ext/_state.pyx": "from lscore import state\n"}, "kernels import the Python module"),
        (
            {"adapters/cupy.py": "from lscore.adapters import numpy\n"},
            "adapter code imports the numpy adapter",
        ),
        ({"lscore/scan.py": "import torch\n"}, "imports the framework torch at module level"),
        ({"_ext/_state.pyx": "import cupy\n"}, "imports the framework cupy at module level"),
        (
            {"lscore/scan.py": "from lscore._ext._scan import _bench_copy\n"},
            "imports the private name _bench_copy",
        ),
        (
            {"adapters/numpy.py": "from lscore._ext import _scan\n"},
            "adapters imports the kernels (lscore._ext._scan)",
        ),
        (
            {
                "lscore/cuda/__init__.py": "",
                "lscore/cuda/state.py": "from lscore._ext import _scan\n",
            },
            "core imports the kernels (lscore._ext._scan); go through lscore.kernels",
        ),
        (
            {
                "adapters/cupy.py": "import lscore\nclass SGD(A):\n"
                "    __doc__ = A.__doc__ + B.__doc__\n"
            },
            "adapters/cupy.py:3: a class docstring glued from other docstrings",
        ),
        (
            {"adapters/numpy.py": "from lscore import _dtypes\n"},
            "imports the private module lscore._dtypes from outside",
        ),
        (
            {"lscore/managers.py": "def f(state):\n    return state._cy\n"},
            "reads _cy, an underscore name of lscore.state",
        ),
        (
            {
                "lscore/fp8/__init__.py": "",
                "lscore/fp8/checks.py": "",
                "lscore/cuda/__init__.py": "",
                "lscore/cuda/fp8.py": "def f():\n    from lscore.fp8.checks import nan_rule\n",
            },
            "lscore.cuda imports lscore.fp8.checks; lscore.fp8 leans on lscore.cuda, never back",
        ),
        (
            {
                "lscore/fp8/__init__.py": "",
                "lscore/cuda/__init__.py": "",
                "lscore/fp8/casting.py": "from lscore.cuda import fp8\n",
            },
            "lscore.fp8 imports lscore.cuda at module level",
        ),
    ],
    ids=[
        "core->adapter in a function",
        "core->app",
        "adapter->app",
        "core->bench",
        "kernels->python",
        "adapter->adapter",
        "framework in core",
        "framework in kernels",
        "private name",
        "kernels from an adapter",
        "kernels from lscore.cuda",
        "glued docstring",
        "private module",
        "private attribute",
        "fp8 from lscore.cuda",
        "lscore.cuda from fp8 at module level",
    ],
)
def test_the_checker_catches_a_planted_violation(tmp_path, files, expected):
    problems = _plant(tmp_path, files)
    assert any(expected in p for p in problems), problems


def test_fp8_may_import_lscore_cuda_inside_a_function(tmp_path):
    files = {
        "lscore/fp8/__init__.py": "",
        "lscore/cuda/__init__.py": "",
        "lscore/cuda/fp8.py": "",
        "lscore/fp8/casting.py": "def f():\n    from lscore.cuda.fp8 import cupy_arrays\n",
    }
    assert _plant(tmp_path, files) == []


def test_a_framework_imported_inside_a_function_is_allowed_in_the_core(tmp_path):
    assert _plant(tmp_path, {"lscore/distributed.py": "def f():\n    import torch\n"}) == []
