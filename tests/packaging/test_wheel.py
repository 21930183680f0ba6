"""The release wheel, as a package index reads it: a manylinux tag, stripped extension
modules, classifiers, project URLs, and a long description whose links work off the checkout.

The wheel is the one ``make wheel`` leaves in dist/, or the one ``LSCORE_WHEEL`` names
(cibuildwheel's test step). Without either these skip, except in a run against the installed
package (``LSCORE_TEST_INSTALLED=1``), which always has one to check.
"""

from __future__ import annotations

import email.parser
import os
import re
import struct
import zipfile
from pathlib import Path

import pytest

from helpers import ROOT, built_wheel

LINK = re.compile(r"\]\(([^)\s]+)\)")


WHEEL = built_wheel()
needs_wheel = pytest.mark.skipif(
    WHEEL is None and os.environ.get("LSCORE_TEST_INSTALLED") != "1",
    reason="no wheel in dist/ (`make wheel` builds one) and LSCORE_WHEEL is unset",
)


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    assert WHEEL is not None, "a run against the installed package has no wheel to check"
    return zipfile.ZipFile(WHEEL)


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if re.fullmatch(rf"lscore-[^/]+\.dist-info/{name}", n)]
    return wheel.read(path).decode()


@pytest.fixture(scope="module")
def metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    return email.parser.Parser().parsestr(_dist_info(wheel, "METADATA"))


def section_names(elf: bytes) -> list[str]:
    """The section names of a 64-bit ELF file (an extension module)."""
    assert elf[:4] == b"\x7fELF" and elf[4] == 2, "not a 64-bit ELF file"
    order = "<" if elf[5] == 1 else ">"
    (shoff,) = struct.unpack_from(order + "Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", elf, 0x3A)

    def header(i: int) -> tuple[int, ...]:
        return struct.unpack_from(order + "IIQQQQIIQQ", elf, shoff + i * shentsize)

    names_at, names_size = header(shstrndx)[4:6]
    names = elf[names_at : names_at + names_size]
    return [names[h[0] : names.index(b"\0", h[0])].decode() for h in map(header, range(shnum))]


@needs_wheel
def test_manylinux_tag(wheel: zipfile.ZipFile) -> None:
    """An index refuses a ``linux_*`` wheel; auditwheel's repair gives it a manylinux tag."""
    assert WHEEL is not None
    platforms = WHEEL.name.removesuffix(".whl").split("-")[-1].split(".")
    manylinux = r"manylinux_\d+_\d+_(x86_64|aarch64)|manylinux\w+"  # PEP 600, or a legacy alias
    assert all(re.fullmatch(manylinux, p) for p in platforms), platforms
    tags = re.findall(r"^Tag: (.*)$", _dist_info(wheel, "WHEEL"), flags=re.M)
    assert tags and all(re.search(r"-manylinux", t) for t in tags), tags


@needs_wheel
def test_extension_modules_stripped(wheel: zipfile.ZipFile) -> None:
    """No debug information and no static symbol table: the dynamic symbols are all an
    extension module needs (the compiled core's modules weigh about a sixth as much)."""
    modules = [n for n in wheel.namelist() if n.endswith(".so")]
    built = sorted(re.findall(r'ext\("(\w+)"\)', (ROOT / "setup.py").read_text()))
    assert sorted(Path(n).name.split(".")[0] for n in modules) == built, modules
    for name in modules:
        sections = section_names(wheel.read(name))
        kept = [s for s in sections if s.startswith(".debug") or s == ".symtab"]
        assert ".dynsym" in sections and not kept, f"{name} keeps {kept}"


@needs_wheel
def test_classifiers_and_urls(metadata: email.message.Message) -> None:
    """Every classifier one an index knows (the Python versions: test_cibuildwheel.py)."""
    classifiers = metadata.get_all("Classifier") or []
    assert classifiers and metadata["Requires-Python"] == ">=3.10"
    trove = pytest.importorskip("trove_classifiers")
    assert [c for c in classifiers if c not in trove.classifiers] == []
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    assert re.fullmatch(r"https://[^/]+/.*/", urls["Documentation"]), urls


@needs_wheel
def test_long_description_links_are_absolute(metadata: email.message.Message) -> None:
    """The README as an index shows it: each link to a docs/ page points into the
    documentation site, at the page Sphinx builds from that file; nothing else changed."""
    assert metadata["Description-Content-Type"].startswith("text/markdown")
    description = metadata.get_payload()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert LINK.sub("](...)", description) == LINK.sub("](...)", readme), (
        "the long description is not README.md (a wheel built before the README's last edit?)"
    )
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    docs = urls["Documentation"]
    for link, target in zip(LINK.findall(readme), LINK.findall(description), strict=True):
        if "://" in link:
            assert target == link
            continue
        page = target.removeprefix(docs).split("#")[0]
        assert target.startswith(docs) and page.endswith(".html"), target
        assert (ROOT / "docs" / page).with_suffix(".md").is_file(), target


@needs_wheel
def test_sdist_beside_the_wheel() -> None:
    """`make wheel` builds the wheel from the sdist it leaves beside it."""
    if os.environ.get("LSCORE_WHEEL"):
        pytest.skip("a wheel named by LSCORE_WHEEL comes without an sdist")
    assert WHEEL is not None
    version = WHEEL.name.split("-")[1]
    assert (WHEEL.parent / f"lscore-{version}.tar.gz").is_file()


def test_readme_links_have_addresses() -> None:
    """Each relative link of the README is a docs/ page, the only kind the long description
    can point at (setup.py fails the build on any other); no wheel needed."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    relative = [t for t in LINK.findall(readme) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]
    assert relative
    assert [t for t in relative if not re.fullmatch(r"docs/[^#]+\.md(#.*)?", t)] == []
