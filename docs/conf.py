"""Sphinx configuration: `make docs` builds the site into docs/_build/html (warnings as errors)."""

from __future__ import annotations

import sys
from pathlib import Path

import lscore

sys.path.insert(0, str(Path(__file__).parent / "_sphinxext"))

project = "lscore"
author = "the lscore authors"
copyright = "the lscore authors"
release = version = lscore.__version__ if hasattr(lscore, "__version__") else "0.1.0"

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx_copybutton",
    "lscore_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# numpydoc renders the docstrings; the member tables come from the reference pages
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# a docstring section numpydoc does not know ("Fields") is reported through Sphinx's logger,
# where -W (make docs) makes it an error; numpydoc's own parser only calls warnings.warn
# (the build went on, and the section's entries rendered with nothing under them)
numpydoc_validation_checks = {"GL06"}
autodoc_member_order = "bysource"
# a class's entry lists every public member a user can reach on it: those without a
# docstring (a dataclass's fields, an enum's members) and those it inherits from lscore's
# private bases; not those of torch's Optimizer, LRScheduler, Module and Linear, int, tuple or the
# built-in exceptions
autodoc_default_options = {
    "undoc-members": True,
    "inherited-members": (
        "object, Optimizer, LRScheduler, Module, Linear, int, tuple, BaseException"
    ),
}
# the page's table of contents names a member without its class
toc_object_entries_show_parents = "hide"
# a signature too long for a line of the page lists one parameter a line (Sphinx counts
# the directive's text, where `Any` is `~typing.Any`: 90 of it fit one line of the page)
maximum_signature_line_length = 90
autodoc_typehints = "signature"
autosummary_generate = False
# a cross-reference to lscore's public names must resolve (`{py:class}` in a guide, a
# type in a signature); one to another project's names or to a private module's (which
# have no entry) is left as text
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!lscore\b).*"), (r"py:.*", r"lscore(\.\w+)*\._.*")]

# the copy button copies what a reader can paste: the code of a `>>>` / `$` example
# without its prompts and without the output the page shows (Pygments' .gp and .go)
copybutton_exclude = ".linenos, .gp, .go"

html_theme = "pydata_sphinx_theme"
html_title = "lscore"
# the figures are drawn into _static at build time (lscore_docs); a clean clone lacks it
(Path(__file__).parent / "_static").mkdir(exist_ok=True)
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
# the left sidebar's "Section Navigation" lists the pages under the current section's top
# page; the pages of these folders hang off the index directly and have no pages under
# them, so it would be an empty box: they show no left sidebar (the header links the
# sections, the right sidebar the page's own headings)
html_sidebars = {
    "getting-started/*": [],
    "guides/*": [],
    "concepts/*": [],
    "development/*": [],
}

# the compiled classes' signatures come from their .pyi stubs (lscore_docs), not from
# a first docstring line
autodoc_docstring_signature = False
# the toctrees list their pages in reading order, then take by glob whatever else a
# folder holds; a glob that finds nothing more is not an error
suppress_warnings = ["toc.empty_glob"]
