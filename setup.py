"""Extension list of lscore's compiled core, and the long description; the rest of the
metadata lives in pyproject.toml."""

import os
import platform
import re
import sys
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# x86-64-v2 is the portable baseline; faster kernels are picked at run time
# (#pragma GCC target copies in _ext/lsc_scan.h).  No -ffast-math: the state machine and
# the unscale must round exactly as the peers do.  LSCORE_OPT sets the optimisation level
# (-O3 by default; -O1 builds in a fraction of the time where the CPU kernels' speed does
# not matter, as in scripts/gpu_check.sh on a short GPU lease).
OPT = os.environ.get("LSCORE_OPT", "-O3")
if not re.fullmatch(r"-O[0-3s]", OPT):
    raise SystemExit(f"LSCORE_OPT must be -O0, -O1, -O2, -O3 or -Os, got {OPT!r}")
FLAGS = [OPT, "-fno-strict-aliasing", "-ffp-contract=off"]
if platform.machine() in ("x86_64", "AMD64"):
    FLAGS.append("-march=x86-64-v2")


def ext(name):
    return Extension(
        f"lscore._ext.{name}",
        [f"_ext/{name}.pyx"],
        include_dirs=["_ext", numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=FLAGS,
    )


def long_description():
    """README.md with its links to docs/ pages made absolute, against the documentation site
    that pyproject.toml's [project.urls] names: an index page has no docs/ folder beside it.
    A relative link to anything but a docs/ page has no address there and fails the build."""
    urls = tomllib.loads(Path("pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]
    base = urls["Documentation"].rstrip("/") + "/"

    def absolute(match):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:|#", target):  # a URL, or an anchor of the page itself
            return match.group(0)
        page = re.fullmatch(r"docs/([^#]+)\.md(#.*)?", target)
        if page is None:
            raise SystemExit(
                f"README.md links to {target!r}, which has no address on the documentation "
                "site; link a docs/ page or an absolute URL"
            )
        return f"]({base}{page.group(1)}.html{page.group(2) or ''})"

    return re.sub(r"\]\(([^)\s]+)\)", absolute, Path("README.md").read_text(encoding="utf-8"))


setup(
    ext_modules=cythonize(
        [
            ext("_mx"),  # the longest compile (minutes under the sanitizers) starts first
            ext("_codes"),
            ext("_state"),
            ext("_scan"),
            ext("_walk"),
            ext("_pack"),
            ext("_grads"),
            ext("_fp8"),
            ext("_fp8_scale"),
        ],
        include_path=["_ext"],
        compiler_directives={"language_level": 3},
        nthreads=os.cpu_count() or 1,
    ),
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
    long_description=long_description(),
    long_description_content_type="text/markdown",
)
