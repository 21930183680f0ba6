"""Every public name has a docstring and an entry in the API reference (docs/reference/),
and the built site renders that entry.

A public module is one under lscore or lscore.adapters with no underscore in its
dotted name, except the command line (lscore.cli and the suites of `lscore bench`,
lscore.bench: documented as commands). Its
public names are its ``__all__``, or else the names it defines without a leading
underscore. A class or function needs a docstring of its own; a constant needs a
``#:`` doc comment at its assignment (where autodoc reads it). A name counts as in
the reference when an ``auto*`` directive of docs/reference/*.md documents the same
object, under this or another public module.

The built site (``make docs`` runs these with ``LSCORE_DOCS_HTML=docs/_build/html``;
without it they skip): a name is rendered when an element whose id is a dotted name
of the same object sits inside a ``dl.py`` (the entry autodoc writes, with its
signature and docstring sections), and listed when ``objects.inv`` names that object;
a class's entry holds every public member lscore defines for it; no page shows a
directive as text (autodoc's output parsed as Markdown, as MyST does inside an
``{autoclass}`` fence: executablebooks/MyST-Parser#587); the general index links
every Python entry of ``objects.inv``; the copy button copies code blocks without
their prompts.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import re
import types
import zlib
from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import lscore
import lscore.adapters
from helpers import ROOT

REFERENCE = ROOT / "docs" / "reference"
DIRECTIVE = re.compile(r"^\.\. auto(class|function|exception|data):: (\S+)$", re.M)
OPTIONAL = {"lscore.adapters.torch": "torch", "lscore.adapters.cupy": "cupy"}
# the command line's packages, documented as commands (docs/reference/cli.md)
COMMANDS = ("lscore.cli", "lscore.bench")


def public_modules() -> list[str]:
    out = ["lscore"]
    for pkg in (lscore, lscore.adapters):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            parts = info.name.split(".")
            if any(p.startswith("_") for p in parts) or info.name.startswith(COMMANDS):
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


def test_reference_directives_in_eval_rst() -> None:
    """An autodoc directive sits in an ``{eval-rst}`` block: in a MyST ``{autoclass}``
    fence autodoc's output is read as Markdown and the page shows it as text."""
    fenced = [
        f"{page.name}: {line}"
        for page in sorted(REFERENCE.glob("*.md"))
        for line in page.read_text().splitlines()
        if re.match(r"`{3,}\{auto", line)
    ]
    assert not fenced, "write these as `.. autoclass:: name` in an {eval-rst} block: " + str(fenced)


def test_reference_entries_resolve() -> None:
    """Every entry of the reference names an object that exists (no stale entries)."""
    for dotted in reference_entries():
        resolve(dotted)


def test_reference_pages_in_toctree() -> None:
    index = (REFERENCE / "index.md").read_text()
    for page in REFERENCE.glob("*.md"):
        if page.stem != "index":
            assert re.search(rf"^{re.escape(page.stem)}$", index, re.M), page.name


# -- the built site ----------------------------------------------------------------------

SITE = "LSCORE_DOCS_HTML"
#: what a directive looks like where a page shows it as text
RAW_DIRECTIVE = (".. py:", "!! processed by numpydoc !!", ".. rubric::", ":module:")


class Page(HTMLParser):
    """A built page: its visible text, links and scripts, the ids inside ``dl.py``
    elements, and its code blocks as (text, classes of the spans around it) pieces."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.entries: set[str] = set()
        self.hrefs: set[str] = set()
        self.scripts: set[str] = set()
        self.text: list[str] = []
        self.blocks: list[list[tuple[str, frozenset[str]]]] = []
        self._dl: list[bool] = []  # the open <dl>s: whether each is a Python entry
        self._spans: list[frozenset[str]] | None = None  # inside a <pre>: its open spans
        self._hidden = 0
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {k: v or "" for k, v in attrs}
        if tag == "dl":
            self._dl.append("py" in attr.get("class", "").split())
        elif tag in ("script", "style"):
            self._hidden += 1
            self.scripts.add(attr.get("src", "").partition("?")[0])
        elif tag == "a" and attr.get("href"):
            self.hrefs.add(attr["href"])
        elif tag == "pre":
            self._spans = []
            self.blocks.append([])
        elif tag == "span" and self._spans is not None:
            self._spans.append(frozenset(attr.get("class", "").split()))
        if any(self._dl) and attr.get("id"):
            self.entries.add(attr["id"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "dl" and self._dl:
            self._dl.pop()
        elif tag in ("script", "style") and self._hidden:
            self._hidden -= 1
        elif tag == "pre":
            self._spans = None
        elif tag == "span" and self._spans:
            self._spans.pop()

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.text.append(data)
        if self._spans is not None:
            self.blocks[-1].append((data, frozenset().union(*self._spans)))


@pytest.fixture(scope="module")
def site() -> Path:
    where = os.environ.get(SITE)
    if not where:
        pytest.skip(f"checks the built site: `make docs` runs it with {SITE} set")
    path = Path(where)
    assert (path / "objects.inv").is_file(), f"{SITE}={where} holds no built site"
    return path


@pytest.fixture(scope="module")
def pages(site: Path) -> dict[str, Page]:
    return {
        str(p.relative_to(site)): Page(p.read_text(encoding="utf-8"))
        for p in sorted(site.rglob("*.html"))
        if p.relative_to(site).parts[0] not in ("_static", "_sources")
    }


def inventory(site: Path) -> dict[str, tuple[str, str]]:
    """``objects.inv`` (format version 2): name -> (``domain:role``, page#anchor)."""
    first, _, _, _, body = (site / "objects.inv").read_bytes().split(b"\n", 4)
    assert first == b"# Sphinx inventory version 2", first
    out = {}
    for line in zlib.decompress(body).decode().splitlines():
        found = re.match(r"(.+?)\s+(\S+)\s+(-?\d+)\s+(\S*)\s+(.*)", line)
        assert found, line
        name, role, _, uri, _ = found.groups()
        out[name] = (role, uri[:-1] + name if uri.endswith("$") else uri)
    return out


def lookup(dotted: str) -> tuple[bool, Any]:
    """(True, the object) a dotted name (a module, then attributes) names, else (False, None)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False, None
            obj = getattr(obj, attr)
        return True, obj
    return False, None


def objects(names: Iterable[str]) -> list[tuple[Any, str]]:
    """(object, last name) of each dotted name that names an object.

    The objects themselves, not their ids: kept alive while compared by identity.
    """
    out = []
    for dotted in names:
        found, obj = lookup(dotted)
        if found:
            out.append((obj, dotted.rpartition(".")[2]))
    return out


def not_named(module_name: str, named: list[tuple[Any, str]]) -> list[str]:
    """The public names of a module whose object is none of `named` (``objects``).

    A constant must also keep its name: two constants may be one small int or string.
    """
    module = import_public(module_name)
    missing = []
    for name in public_names(module):
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):
            continue
        data = is_data(obj)
        if not any(o is obj and (n == name or not data) for o, n in named):
            missing.append(f"{module_name}.{name}")
    return missing


@pytest.fixture(scope="module")
def rendered(pages: dict[str, Page]) -> list[tuple[Any, str]]:
    return objects(set().union(*(p.entries for p in pages.values())))


@pytest.fixture(scope="module")
def listed(site: Path) -> list[tuple[Any, str]]:
    return objects(n for n, (role, _) in inventory(site).items() if role.startswith("py:"))


@pytest.mark.parametrize("module_name", public_modules())
def test_site_renders_public_names(module_name: str, rendered: list[tuple[Any, str]]) -> None:
    missing = not_named(module_name, rendered)
    assert not missing, f"no rendered entry (an id inside a dl.py) in the built site: {missing}"


@pytest.mark.parametrize("module_name", public_modules())
def test_inventory_lists_public_names(module_name: str, listed: list[tuple[Any, str]]) -> None:
    missing = not_named(module_name, listed)
    assert not missing, f"not in objects.inv: {missing}"


def owner(cls: type, name: str) -> str:
    """The module of the class in `cls`'s MRO that defines attribute `name`."""
    return next((k for k in cls.__mro__ if name in vars(k)), object).__module__


def test_site_renders_class_members(pages: dict[str, Page]) -> None:
    """A class's entry lists every public member lscore defines on it or on a base, and
    none that another library defines (torch's Optimizer, int, BaseException, ...)."""
    entries = set().union(*(p.entries for p in pages.values()))
    missing, foreign = [], []
    for dotted in sorted(entries):
        found, cls = lookup(dotted)
        if not (found and inspect.isclass(cls) and cls.__module__.startswith("lscore")):
            continue
        for name in dir(cls):
            ours = owner(cls, name).startswith("lscore")
            if not name.startswith("_") and ours and f"{dotted}.{name}" not in entries:
                missing.append(f"{dotted}.{name}")
        for entry in entries:
            name = entry.removeprefix(dotted + ".")
            member = name != entry and "." not in name and hasattr(cls, name)
            if member and not owner(cls, name).startswith("lscore"):
                foreign.append(entry)
    assert not missing, f"class entries without these members: {missing}"
    assert not foreign, f"class entries with another library's members: {sorted(foreign)}"


def test_copy_button_leaves_out_prompts_and_output(site: Path, pages: dict[str, Page]) -> None:
    """Every page with a code block loads the copy button, which leaves out Pygments'
    prompts (.gp) and shown output (.go); what it copies of a block, the text outside
    those, has no ``>>>`` or ``...`` prompt (one a lexer did not mark)."""
    script = site / "_static" / "copybutton.js"
    assert script.is_file(), "the site has no copy button (sphinx-copybutton)"
    found = re.search(r"let exclude = '([^']*)'", script.read_text())
    assert found, "copybutton.js names no excluded elements"
    excluded = {c.strip().lstrip(".") for c in found.group(1).split(",")}
    assert {"gp", "go"} <= excluded, excluded
    unloaded, pasted = [], []
    for name, page in pages.items():
        if page.blocks and not any(s.endswith("_static/copybutton.js") for s in page.scripts):
            unloaded.append(name)
        for block in page.blocks:
            copied = "".join(text for text, classes in block if not classes & excluded)
            if re.search(r"^(>>>|\.\.\.) ", copied, re.M):
                pasted.append(f"{name}: {copied[:80]!r}")
    assert not unloaded, f"pages with code blocks and no copy button: {unloaded}"
    assert not pasted, "copied with prompts:\n" + "\n".join(pasted)


def test_pages_show_no_directive_text(pages: dict[str, Page]) -> None:
    shown = []
    for name, page in pages.items():
        text = "".join(page.text)
        for raw in RAW_DIRECTIVE:
            at = text.find(raw)
            if at >= 0:
                shown.append(f"{name}: {text[max(at - 30, 0) : at + 60]!r}")
    assert not shown, "pages show directives as text:\n" + "\n".join(shown)


def test_index_links_every_entry(site: Path, pages: dict[str, Page]) -> None:
    python = {n: uri for n, (role, uri) in inventory(site).items() if role.startswith("py:")}
    assert python, "objects.inv lists no Python object"
    linked = pages["genindex.html"].hrefs
    missing = sorted(n for n, uri in python.items() if uri not in linked)
    assert not missing, f"genindex.html links none of {missing}"


def test_docstrings_use_numpydocs_sections_and_the_build_refuses_others() -> None:
    """numpydoc warned "Unknown section Fields in the docstring of Recipe" through Python's
    warnings, so `make docs` (-W) still succeeded and the page listed Recipe's fields with
    nothing under them.  Every reference entry's docstring uses numpydoc's sections only,
    and docs/conf.py has numpydoc report an unknown one (GL06) through Sphinx's logger,
    where -W makes it an error."""
    validate = pytest.importorskip("numpydoc.validate")
    conf = (ROOT / "docs" / "conf.py").read_text()
    checks = re.search(r"^numpydoc_validation_checks = (\{.*?\})", conf, re.M)
    assert checks and "GL06" in ast.literal_eval(checks.group(1))
    unknown = []
    for dotted, kind in reference_entries().items():
        if kind in ("data", "module"):
            continue
        try:
            resolve(dotted)
        except pytest.skip.Exception:
            continue
        errors = validate.validate(dotted)["errors"]
        unknown += [f"{dotted}: {msg[:60]}" for code, msg in errors if code == "GL06"]
    assert not unknown, unknown


def test_pages_without_children_have_no_empty_section_navigation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pydata theme's "Section Navigation" lists the pages under a page's section; a
    page of a folder with no toctree (guides, getting started, ...) showed it empty.
    docs/conf.py's html_sidebars gives every such page no left sidebar."""
    import fnmatch
    import runpy
    import sys

    # conf.py puts docs/_sphinxext on sys.path: undone after the test, so that no checkout
    # folder stays there for the tests after it (tests/packaging/test_installed.py)
    monkeypatch.setattr(sys, "path", list(sys.path))
    conf = runpy.run_path(str(ROOT / "docs" / "conf.py"))
    sidebars = conf.get("html_sidebars", {})
    docs = ROOT / "docs"
    empty = []
    for page in sorted(docs.glob("*/*.md")):
        folder = page.parent
        if any("{toctree}" in p.read_text() for p in folder.glob("*.md")):
            continue  # a section with its own index: its navigation lists its pages
        name = page.relative_to(docs).with_suffix("").as_posix()
        if not any(fnmatch.fnmatch(name, pat) and v == [] for pat, v in sidebars.items()):
            empty.append(name)
    assert not empty, f"pages with an empty Section Navigation: {empty}"
